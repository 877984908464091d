"""Bad input of every kind — a malformed document, an impossible size, arrays of the wrong kind, a wrong argument,
a closed pipe — is one clear typed error (one line and exit status 2 from the command line), never a traceback, a
silent wrong answer or minutes of growing memory; a bug is exit status 3."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import spatialc
from spatialc import inputs as spatial_inputs
from spatialc.arguments import MAX_TENSOR_ELEMS
from spatialc.cli import main
from spatialc.errors import IllFormedError, PlanError, ProgramError, SpatialError
from spatialc.frontend import bias
from spatialc.inputs import InexactInputWarning, InputError, TensorSpec, check_inputs
from spatialc.interp import errors as interp_errors
from spatialc.interp import evaluate as interp_evaluate
from spatialc.interp.errors import EvalError, TooLarge
from spatialc.ir import serde
from spatialc.ir.nodes import ComputeStage, DType
from spatialc.ir.ops import MAX_EXPR_DEPTH, Apply, Arg, BlockShape, Map
from spatialc.ir.serde import MAX_DEPTH, SerdeError
from spatialc.passes import tile
from spatialc.passes.place import place
from spatialc.runtime import launch
from spatialc.target import target

from .stand_in import StandInDevice  # (its kernel does nothing: the checks come first)

CURRENT = f'"version": {serde.VERSION}'  # what a document spatialc writes now says


@pytest.fixture(scope="module")
def program():
    return spatialc.build(spatialc.gemm(40, 30, 20, "int8"), "sm_86")


@pytest.fixture(scope="module")
def text(program):
    return spatialc.to_json(program)


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def refused_in_one_line(capsys, *argv, says=""):
    status, _, err = run_cli(capsys, *argv)
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and says in err, err
    return err


# ---- 1. documents that are not ours ------------------------------------------------------------------------------


def _loop(doc):
    """The first Loop op of the document's schedule, and its path."""
    for i, prog in enumerate(doc["program"]["schedule"]["programs"]):
        for j, op in enumerate(prog["ops"]):
            if op["type"] == "Loop":
                return op, f"program.schedule.programs[{i}].ops[{j}]"
    raise AssertionError("no loop")


@pytest.mark.parametrize("tag", [["Fifo"], {}, {"type": "Fifo"}, 7, None, True])
@pytest.mark.parametrize(
    "where",
    [
        lambda d: (d["program"]["buffers"][0]["kind"], "program.buffers[0].kind"),
        lambda d: (d["program"], "program"),
        lambda d: (d["program"]["tensors"][1], "program.tensors[1]"),
        _loop,
    ],
)
def test_a_type_tag_that_is_no_string_is_a_serde_error_naming_its_path(text, tag, where):
    doc = json.loads(text)
    node, path = where(doc)
    node["type"] = tag
    with pytest.raises(SerdeError) as e:
        serde.from_json(json.dumps(doc))
    assert str(e.value).startswith(path + ".type: expected"), str(e.value)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda t: "[" * 100_000, "nest more than"),
        (lambda t: t[: t.index('"program":') + 10] + "[" * 100_000, "nest more than"),
        (lambda t: t.replace(CURRENT, '"version": ' + "9" * 5000), "digits"),
        (lambda t: re.sub(r'"depth_pages": \d+', '"depth_pages": ' + "9" * 5000, t, count=1), "digits"),
        (lambda t: re.sub(r'"depth_pages": \d+', '"depth_pages": ' + "9" * 40, t, count=1), "integer of at most 64"),
        (lambda t: t.replace(CURRENT, '"version": true'), "version true"),
        (lambda t: t.replace(CURRENT, '"version": [[[[1]]]]'), "version a list of 1"),
        (lambda t: t.replace('"tensors": [', '"tensors": [5, ', 1), "program.tensors[0]: expected a Tensor object"),
        (lambda t: t.replace('"tile": {"type": "Tile", "rows": 16, "cols": 16}', '"tile": [16, 16]'), "program.tile: "),
        (lambda t: '{"format": "spatialc.program", "version": 1, "program": []}', "program: expected"),
        (lambda t: b"\xff\xfe\x00", "not JSON text"),
        (lambda t: b'{"format": "spatialc.program", "\xff": 1}', "byte 32 is not valid utf-8"),
        (lambda t: 12, "JSON text, not int"),
    ],
)
def test_a_malformed_document_is_one_serde_error(text, make, says):
    with pytest.raises(SerdeError) as e:
        spatialc.from_json(make(text))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_loops_nested_past_the_limit_are_refused_with_their_path(text):
    doc = json.loads(text)
    loop, _ = _loop(doc)
    inner = copy.deepcopy(loop)
    for _ in range(MAX_DEPTH):
        inner = {**copy.deepcopy(loop), "body": [inner]}
    loop["body"] = [inner]
    with pytest.raises(SerdeError, match=rf"\.body\[0\]\.body\[0\]: objects and lists nest more than {MAX_DEPTH} deep"):
        spatialc.from_json(json.dumps(doc))


def test_a_formula_as_deep_as_rule_1_takes_is_saved_and_read_and_a_deeper_document_is_refused():
    # A Map's formula nests two objects and lists an op: rule 1 takes 64 ops deep, which the program's own 32 levels
    # could not hold, so a formula has nesting of its own (serde.EXPR_NESTING).
    from spatialc.ir.ops import MAX_EXPR_DEPTH, Apply, Arg, Map

    expr = Arg(0)
    for _ in range(MAX_EXPR_DEPTH - 1):
        expr = Apply("neg", (expr,))
    p = spatialc.build(spatialc.gemm(16, 16, 16, "bf16", epilogue=[Map(expr)]), "sm_90")
    text = spatialc.to_json(p)
    assert spatialc.from_json(text) == p
    deeper = text.replace(
        '{"type": "Arg", "index": 0}',
        '{"type": "Apply", "op": "neg", "args": [' * 40 + '{"type": "Arg", "index": 0}' + "]}" * 40,
    )
    with pytest.raises(SerdeError, match="nest more than"):
        spatialc.from_json(deeper)


def _as_version_6(data):
    """Today's document as version 6 wrote it: each Map the frontend makes written as the op it was then."""
    if isinstance(data, list):
        return [_as_version_6(v) for v in data]
    if not isinstance(data, dict):
        return data
    data = {k: _as_version_6(v) for k, v in data.items()}
    if data.get("type") != "Map":
        return data
    name, args = data["expr"]["op"], data["expr"]["args"]
    if len(args) == 1:
        return {"type": "Relu"} if name == "relu" else {"type": "Activation", "name": name.replace("gelu_tanh", "gelu")}
    if args[1]["type"] == "Lit":
        return {"type": "Scalar", "op": name, "value": args[1]["value"]}
    return {"type": "Bias", **{k: args[1][k] for k in ("tensor", "at", "width")}}


@pytest.fixture(scope="module")
def version_6():
    """A program whose epilogue has each old op, and its document as version 6 wrote it."""
    epilogue = [bias(), spatialc.relu(), spatialc.scalar("mul", 0.3), spatialc.activation("gelu_tanh")]
    p = spatialc.build(spatialc.gemm(40, 30, 20, "fp16", epilogue=epilogue), "sm_86")
    doc = json.loads(spatialc.to_json(p))
    return p, {**doc, "version": 6, "program": _as_version_6(doc["program"])}


def test_a_version_6_document_reads_as_the_program_built_today(version_6):
    p, doc = version_6
    assert '"Relu"' in json.dumps(doc) and '"Map"' not in json.dumps(doc)
    assert spatialc.from_json(json.dumps(doc)) == p


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('"op": "mul"', '"op": "pow"', 'found "Scalar"'),  # version 6 had add, mul, max and min
        ('"name": "gelu"', '"name": "exp"', 'found "Activation"'),  # and gelu, silu, sigmoid and tanh
    ],
)
def test_a_version_6_op_that_version_did_not_have_is_one_serde_error(version_6, old, new, says):
    # They loaded as the table's pow and exp Maps, and verified: a meaning the document never had.
    _, doc = version_6
    text = json.dumps(doc)
    assert old in text
    with pytest.raises(SerdeError) as e:
        spatialc.from_json(text.replace(old, new, 1))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_version_6_document_nested_past_the_limit_is_one_serde_error():
    # Its old ops were rewritten by a recursion without a limit: 900 nested lists, which json reads, raised
    # RecursionError.
    deep: object = 0
    for _ in range(900):
        deep = [deep]
    doc = {"format": "spatialc.program", "version": 6, "program": {"type": "SpatialProgram", "stages": deep}}
    with pytest.raises(SerdeError) as e:
        spatialc.from_json(json.dumps(doc))
    assert "\n" not in str(e.value), str(e.value)


def test_a_number_past_float64_is_one_serde_error():
    # A constant of 400 digits (which json reads as an int) raised OverflowError from float().
    p = spatialc.build(spatialc.gemm(16, 16, 16, "fp16", epilogue=[spatialc.scalar("add", 1.5)]), "sm_86")
    text = spatialc.to_json(p)
    assert '"value": 1.5' in text
    with pytest.raises(SerdeError, match=r"\.expr\.args\[1\]\.value: expected a number within float64's range"):
        spatialc.from_json(text.replace('"value": 1.5', '"value": ' + "9" * 400))


def test_bytes_in_any_json_encoding_are_read(text, program):
    assert spatialc.from_json(text.encode()) == program
    assert spatialc.from_json(bytearray(text.encode("utf-16"))) == program


HUGE, DEEP = "@huge@", "@deep@"
NASTY = [[], {}, ["Fifo"], {"type": ["Fifo"]}, {"type": {}}, None, True, -1, 0, 2**70, 1.5, "x", "y" * 3000]
NASTY += [[[[[]]]], {"type": "Loop"}, [1, 2, 3, 4, 5], HUGE, DEEP]


def _places(doc):
    """Every (container, key) of the document."""
    found, stack = [], [doc]
    while stack:
        x = stack.pop()
        for k, v in x.items() if isinstance(x, dict) else enumerate(x):
            found.append((x, k))
            if isinstance(v, dict | list):
                stack.append(v)
    return found


def _mutated(text: str, rng: random.Random) -> str:
    doc = json.loads(text)
    for _ in range(rng.randint(1, 3)):
        parent, key = rng.choice(_places(doc))
        if isinstance(parent, dict) and rng.random() < 0.15:
            parent[rng.choice(["zz", key + "_"])] = parent.pop(key)  # a renamed field
        elif isinstance(parent, dict) and rng.random() < 0.1:
            del parent[key]
        else:
            parent[key] = copy.deepcopy(rng.choice(NASTY))
    out = json.dumps(doc)
    return out.replace(json.dumps(HUGE), "9" * 5000).replace(json.dumps(DEEP), "[" * 50_000 + "]" * 50_000)


def test_fuzzed_documents_raise_nothing_but_spatial_errors(text):
    rng = random.Random(20240531)
    kinds = set()
    for i in range(400):
        bad = _mutated(text, rng)
        for read in (serde.from_json, spatialc.from_json):
            try:
                read(bad)
            except SpatialError as e:
                kinds.add(type(e).__name__)
                assert "\n" not in str(e) or not isinstance(e, SerdeError), str(e)
            except Exception as e:  # anything else is a bug: name the document that found it
                pytest.fail(f"mutation {i}: {type(e).__name__}: {e}\n{bad[:3000]}")
    assert "SerdeError" in kinds


@pytest.mark.parametrize("command", ["show", "verify"])
@pytest.mark.parametrize(
    ("content", "says"),
    [
        (lambda t: t.replace('"type": "Fifo"', '"type": ["Fifo"]', 1), "program.buffers[0].kind.type: expected"),
        (lambda t: t.replace('"type": "Fifo"', '"type": {}', 1), "program.buffers[0].kind.type: expected"),
        (lambda t: "[" * 100_000, "nest more than"),
        (lambda t: t.replace(CURRENT, '"version": ' + "9" * 5000), "digits"),
    ],
)
def test_show_and_verify_refuse_malformed_files_in_one_line(capsys, tmp_path, text, command, content, says):
    path = tmp_path / "p.json"
    path.write_text(content(text))
    refused_in_one_line(capsys, command, str(path), says=says)


def test_show_refuses_a_binary_file_in_one_line(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b"\x00\xff\xfe" * 100)
    refused_in_one_line(capsys, "show", str(path), says="not a text file")


def test_the_command_refuses_a_malformed_file_from_a_shell(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text.replace('"type": "Fifo"', '"type": ["Fifo"]', 1))
    res = subprocess.run([sys.executable, "-m", "spatialc", "verify", str(path)], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "program.buffers[0].kind.type" in res.stderr


def _nested(depth):
    expr = Apply("neg", (Arg(0),))
    for _ in range(depth - 1):
        expr = Apply("neg", (expr,))
    return Map(expr)


def test_a_formula_nested_past_the_limit_is_refused_not_walked_by_recursion():
    # 255 nested ops (fewer nodes than rule 1's 256) raised RecursionError from verify's type check, and 5000 from
    # spatialc.gemm's own check of the epilogue: every reader of a formula recurses.
    with pytest.raises(ProgramError, match=f"nested more than {MAX_EXPR_DEPTH} deep"):
        spatialc.gemm(16, 16, 16, "fp16", epilogue=[_nested(5000)])
    p = spatialc.build(spatialc.gemm(16, 16, 16, "fp16", epilogue=[_nested(MAX_EXPR_DEPTH)]), "sm_86")
    ones = {"A": np.ones((16, 16)), "B": np.ones((16, 16))}
    assert spatialc.evaluate(p, ones)[0, 0] == 16.0 and "v = " in spatialc.lower(p).program_cu
    for depth in (MAX_EXPR_DEPTH + 1, 255, 5000):
        stages = [
            dataclasses.replace(s, kind=ComputeStage(_nested(depth))) if s.name == "map0" else s for s in p.stages
        ]
        with pytest.raises(IllFormedError, match=r"stages\[3\]\.kind\.op\.expr: an elementwise expression of ops") as e:
            spatialc.verify(p.evolve(stages=tuple(stages)))
        assert "own types" not in str(e.value)  # a fault of size: no advice to hold the IR's types


# ---- 2. sizes refused before anything is allocated ----------------------------------------------------------------


def test_a_gemm_past_the_tensor_cap_is_refused_at_once():
    t0 = time.perf_counter()
    with pytest.raises(ProgramError, match=r"A would be 1000000000000x32 = 32000000000000 elements.*2\^34"):
        spatialc.build(spatialc.gemm(10**12, 32, 32))
    assert time.perf_counter() - t0 < 0.5
    assert spatialc.gemm(2**17, 2**17, 16).tensor_named("C").elems == (2**17, 2**17)  # 2^34 elements: taken
    assert MAX_TENSOR_ELEMS == 2**34


def test_the_command_refuses_a_gemm_past_the_cap_in_one_line(capsys):
    t0 = time.perf_counter()
    refused_in_one_line(capsys, "gemm", "1000000000000", "32", "32", says="at most 2^34")
    assert time.perf_counter() - t0 < 0.5


def test_the_tile_pass_refuses_more_items_than_verify_allows_before_placing_them():
    prog = spatialc.gemm(2**16, 2**17, 16)  # 4096 x 8192 tiles of C
    t0 = time.perf_counter()
    with pytest.raises(PlanError, match=r"grid of 4096x8192 items of 1x1 tiles has 33554432 items.* 16777216 are"):
        spatialc.build(prog, "sm_90", block=(1, 1, 1), sub_blocks=(1, 1))
    assert time.perf_counter() - t0 < 1.0
    # Unforced, the planner offers only plans within the cap.
    found = tile.candidates(prog.evolve(target="sm_90"), target("sm_90"))
    assert found and all(c.plan.items <= tile.MAX_ITEMS for c in found)


def test_place_refuses_a_plan_of_too_many_items_before_listing_them():
    sm90 = target("sm_90")
    prog = spatialc.gemm(2**16, 2**17, 16).evolve(target="sm_90")
    huge = tile.apply_plan(prog, tile.make_plan(BlockShape(1, 1, 1), (1, 1), 2, 4096, 8192, 1))
    t0 = time.perf_counter()
    with pytest.raises(PlanError, match="place cannot list this plan's items"):
        place(huge, sm90)
    assert time.perf_counter() - t0 < 1.0


def test_evaluate_refuses_stores_past_physical_memory_before_allocating(program):
    a, b = np.ones((40, 20)), np.ones((20, 30))
    giant = [dataclasses.replace(t, tiles=(10**6, 10**6)) if t.name == "C" else t for t in program.tensors]
    t0 = time.perf_counter()
    with pytest.raises(TooLarge, match=r"needs \d+ bytes \(.* GiB: C's store .*\); the interpreter takes at most \d+"):
        spatialc.evaluate(program.evolve(tensors=tuple(giant)), {"A": a, "B": b})
    assert time.perf_counter() - t0 < 1.0
    assert issubclass(TooLarge, EvalError) and issubclass(TooLarge, SpatialError)


def test_the_memory_estimate_counts_each_store_in_its_type_and_all_the_run_holds(program, monkeypatch):
    """int8 A and B nothing writes are stored as int8, C (written) as float64; the estimate adds the rest."""
    tiles = {t.name: t.tiles[0] * t.tiles[1] * 16 * 16 for t in program.tensors}
    assert interp_evaluate.store_bytes(program) == tiles["A"] + tiles["B"] + tiles["C"] * 8
    a, b = np.ones((40, 20)), np.ones((20, 30))
    need = sum(interp_evaluate.memory_ledger(program, inputs={"A": a, "B": b}).values())
    monkeypatch.setattr(interp_evaluate, "physical_memory", lambda: need - 1)
    with pytest.raises(TooLarge, match=f"needs {need} bytes"):
        spatialc.evaluate(program, {"A": a, "B": b})
    monkeypatch.setattr(interp_evaluate, "physical_memory", lambda: need)
    assert (spatialc.evaluate(program, {"A": a, "B": b}) == 20).all()


def readers_ending_with(program, op):
    """`program` with `op` appended to every reader's program."""
    from spatialc.ir.nodes import Schedule

    programs = tuple(
        dataclasses.replace(q, ops=(*q.ops, op)) if q.engine.value == "reader" else q for q in program.schedule.programs
    )
    return program.evolve(schedule=Schedule(programs))


@pytest.mark.parametrize("nested", [1, 3])
def test_evaluate_refuses_a_program_that_would_run_too_many_ops_before_running(program, nested):
    """A loop of 2³¹ − 1 no-ops appended to each reader verifies in milliseconds (and its kernel runs in a second);
    the interpreter would spin for minutes — three nested, forever. Refused at once."""
    from spatialc.ir.ids import LoopVar
    from spatialc.ir.ops import Const, Loop, ReadBarrier

    spin = (ReadBarrier(),)
    for v in range(nested):
        spin = (Loop(LoopVar(9 + v), Const(2**31 - 1), spin),)
    spin = spin[0]
    slow = spatialc.verify(readers_ending_with(program, spin))
    t0 = time.perf_counter()
    with pytest.raises(TooLarge, match=r"runs more than 2.68e\+08 ops \(loop trips included\)"):
        spatialc.evaluate(slow, {"A": np.ones((40, 20)), "B": np.ones((20, 30))})
    assert time.perf_counter() - t0 < 1.0
    assert interp_evaluate.run_steps(program) < 1000  # the program as built: a few hundred ops


@pytest.mark.parametrize("depth", [2**28, 2**62, 2**70])
def test_evaluate_refuses_rings_deeper_than_it_keeps_before_allocating(program, depth):
    """A verified ring depth of 2²⁸ pages allocated gigabytes slot by slot; 2⁶² and 2⁷⁰ escaped as MemoryError and
    OverflowError."""
    ring = program.buffers[0]
    deep = dataclasses.replace(ring, kind=dataclasses.replace(ring.kind, depth_pages=depth))
    q = program.evolve(buffers=(deep, *program.buffers[1:]))
    t0 = time.perf_counter()
    with pytest.raises(TooLarge, match=r"keeps more than 16777216 ring page slots"):
        spatialc.evaluate(q, {"A": np.ones((40, 20)), "B": np.ones((20, 30))})
    assert time.perf_counter() - t0 < 1.0


def test_physical_memory_is_known_here_or_none():
    have = interp_evaluate.physical_memory()
    assert have is None or have > 2**20


# ---- 3. one input check for evaluate, emulate and run ------------------------------------------------------------


@pytest.fixture(scope="module")
def with_bias():
    p = spatialc.build(spatialc.gemm(16, 16, 16, "int8", epilogue=[bias()]), "sm_86")
    return p, spatialc.lower(p)


def _three_ways(p, art):
    """evaluate, emulate and run, each taking a dict of inputs."""

    def run(ins):
        params = {k: v for k, v in ins.items() if k not in ("A", "B")}
        return launch.run_with(StandInDevice(), art, ins.get("A"), ins.get("B"), **params)

    return {
        "evaluate": lambda ins: spatialc.evaluate(p, ins),
        "emulate": lambda ins: spatialc.emulate(art, ins),
        "run": run,
    }


ONES = np.ones((16, 16), dtype=np.int8)


@pytest.mark.parametrize("way", ["evaluate", "emulate", "run"])
@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ({"A": ONES, "B": ONES, "bias": np.full(16, 2**40)}, r"bias is int32 but holds values outside"),
        ({"A": ONES, "B": ONES, "bias": np.full(16, 1.5)}, r"bias is int32 but holds values that are not whole"),
        ({"A": ONES, "B": ONES, "bias": np.full(16, np.nan)}, r"bias is int32 but holds values that are not whole"),
        ({"A": ONES, "B": ONES, "bias": np.full(16, np.inf)}, r"bias is int32 but holds values outside"),
        ({"A": ONES * 0.5, "B": ONES, "bias": np.zeros(16)}, r"A is int8 but holds values that are not whole"),
        ({"A": ONES, "B": ONES[:8], "bias": np.zeros(16)}, r"tensor B: expected shape \(16, 16\), got \(8, 16\)"),
        ({"A": ONES, "B": ONES, "bias": np.zeros(15)}, r"tensor bias: expected 16 values, got 15"),
        ({"A": ONES, "B": ONES, "bias": np.zeros(16), "scale": 2}, "no input or parameter tensor named scale"),
        ({"A": ONES, "B": ONES}, "needs tensor bias"),
        ({"A": ONES, "B": ONES, "bias": np.array(["x"] * 16)}, "tensor bias: expected numbers"),
        ({"A": ONES, "B": ONES, "bias": np.zeros(16, dtype=complex)}, "tensor bias: expected numbers"),
    ],
)
def test_bad_inputs_are_the_same_input_error_everywhere(with_bias, way, inputs, says):
    with pytest.raises(InputError, match=says):
        _three_ways(*with_bias)[way](inputs)


@pytest.mark.parametrize("way", ["evaluate", "emulate"])
def test_ragged_lists_and_non_mappings_are_input_errors(with_bias, way):
    call = _three_ways(*with_bias)[way]
    with pytest.raises(InputError, match="tensor A: cannot read a list as an array"):
        call({"A": [[1, 2], [3]], "B": ONES, "bias": np.zeros(16)})
    with pytest.raises(InputError, match="inputs are a mapping"):
        call([ONES, ONES])


def test_input_error_is_one_type_wherever_it_is_imported_from():
    assert interp_errors.InputError is InputError is spatialc.InputError
    assert issubclass(InputError, SpatialError) and issubclass(InputError, ValueError)


def test_lists_and_any_real_numpy_dtype_are_taken(with_bias):
    p, _ = with_bias
    rng = np.random.default_rng(1)
    a, b, c = rng.integers(-100, 100, (16, 16)), rng.integers(-100, 100, (16, 16)), rng.integers(-1000, 1000, 16)
    want = spatialc.evaluate(p, {"A": a, "B": b, "bias": c})
    for conv in (lambda x: x.tolist(), lambda x: x.astype(np.int16), lambda x: x.astype(np.float32)):
        np.testing.assert_array_equal(spatialc.evaluate(p, {"A": conv(a), "B": conv(b), "bias": conv(c)}), want)


def _bf16_program():
    return spatialc.build(spatialc.gemm(16, 16, 32, "bf16"), "sm_90")


def _bf16_values(rng, shape):
    return spatial_inputs.round_bf16(rng.standard_normal(shape)).astype(np.float32)


def test_ml_dtypes_bfloat16_arrays_are_read_exactly():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    p, rng = _bf16_program(), np.random.default_rng(2)
    a, b = _bf16_values(rng, (16, 32)), _bf16_values(rng, (32, 16))
    want = spatialc.evaluate(p, {"A": a, "B": b})
    got = spatialc.evaluate(p, {"A": a.astype(ml_dtypes.bfloat16), "B": b.astype(ml_dtypes.bfloat16)})
    np.testing.assert_array_equal(got, want)
    assert np.dtype(ml_dtypes.bfloat16).kind == "V"  # why the check reads its kind, not only "f"


def test_torch_tensors_including_bf16_are_read_exactly():
    torch = pytest.importorskip("torch")
    p, rng = _bf16_program(), np.random.default_rng(3)
    a, b = _bf16_values(rng, (16, 32)), _bf16_values(rng, (32, 16))
    want = spatialc.evaluate(p, {"A": a, "B": b})
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        ins = {"A": torch.from_numpy(a).to(dtype), "B": torch.from_numpy(b).to(dtype)}
        np.testing.assert_array_equal(spatialc.evaluate(p, ins), want)


class FakeTorchTensor:
    """What the input check asks of a torch tensor (detach, dtype size, float, cpu, numpy), without torch: the
    path runs even where torch is not installed. Holds bf16 values that numpy cannot hold as bf16."""

    def __init__(self, values, size=2):
        self.values, self.size, self.floated = values, size, False

    def detach(self):
        return self

    def is_floating_point(self):
        return True

    def element_size(self):
        return self.size

    def float(self):
        self.floated = True
        return FakeTorchTensor(self.values.astype(np.float32), 4)

    def cpu(self):
        return self

    def numpy(self):
        assert self.size >= 4, "numpy cannot take a 2-byte torch float"
        return self.values


FakeTorchTensor.__module__ = "torch"


def test_a_torch_half_tensor_goes_through_float32():
    values = np.array([[1.5, -2.0]], dtype=np.float32)
    t = FakeTorchTensor(values)
    np.testing.assert_array_equal(spatial_inputs.host_array("A", t), values)
    assert t.floated


def test_torch_and_ml_dtypes_are_not_imported_with_spatialc():
    code = (
        "import sys, spatialc, spatialc.inputs, spatialc.interp.evaluate, spatialc.runtime.emulate,"
        " spatialc.runtime.launch; print(sorted(m for m in ('torch', 'ml_dtypes', 'cupy') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(spatial_inputs, "_WARNED", set())


def test_rounded_bf16_inputs_warn_once_with_the_largest_rounding(fresh_warnings):
    p = _bf16_program()
    a = np.full((16, 32), 1 + 2**-9)  # bf16 keeps 7 bits after the point: 1 + 2^-9 rounds to 1
    b = np.ones((32, 16))
    with pytest.warns(InexactInputWarning, match=r"bf16 inputs .* rounded .* by at most 0\.00195; said once"):
        c = spatialc.evaluate(p, {"A": a, "B": b})
    assert (c == 32).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spatialc.evaluate(p, {"A": a, "B": b})  # once per process and precision: no second warning
    fp16 = spatialc.build(spatialc.gemm(16, 16, 32, "fp16"), "sm_90")
    with pytest.warns(InexactInputWarning, match="fp16 inputs"):
        spatialc.evaluate(fp16, {"A": np.full((16, 32), 0.1), "B": b})


def test_exact_inputs_do_not_warn(fresh_warnings):
    rng = np.random.default_rng(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spatialc.evaluate(_bf16_program(), {"A": _bf16_values(rng, (16, 32)), "B": _bf16_values(rng, (32, 16))})
    assert not spatial_inputs._WARNED


def test_overflowing_inputs_say_they_became_infinite(fresh_warnings):
    spec = [TensorSpec("A", "input", (1, 2), DType.FP16)]
    with pytest.warns(InexactInputWarning, match="beyond its range became infinite"):
        out = check_inputs("p", spec, {"A": np.array([1e6, 1.0])})
    assert np.isinf(out["A"][0, 0])


def test_the_gpu_launcher_checks_and_warns_on_the_device_side(with_bias, fresh_warnings):
    _, art = with_bias
    device = StandInDevice()
    with pytest.raises(InputError, match="bias is int32 but holds values that are not whole"):
        launch.run_with(device, art, ONES, ONES, bias=np.full(16, 0.5))
    bf16 = spatialc.lower(_bf16_program())
    with pytest.warns(InexactInputWarning, match="bf16 inputs"):
        launch.run_with(device, bf16, np.full((16, 32), 0.1), np.ones((32, 16)))


# ---- 4. arguments of the wrong kind ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (
            lambda p, art: spatialc.evaluate(None, {"A": ONES}),
            "evaluate takes a SpatialProgram (from spatialc.build), not None",
        ),
        (lambda p, art: spatialc.lower(None), "lower takes a SpatialProgram (from spatialc.build), not None"),
        (lambda p, art: spatialc.to_json("p"), "to_json takes a SpatialProgram, not a str"),
        (
            lambda p, art: spatialc.emulate(p, {"A": ONES}),
            "emulate takes the artifact of spatialc.lower(program), not a SpatialProgram",
        ),
        (
            lambda p, art: spatialc.emulate([1, 2], {"A": ONES}),
            "emulate takes the artifact of spatialc.lower(program), not a list",
        ),
        (
            lambda p, art: spatialc.run(p, ONES, ONES),
            "run takes the artifact of spatialc.lower(program), not a SpatialProgram",
        ),
    ],
)
def test_a_wrong_argument_is_one_program_error(with_bias, call, says):
    with pytest.raises(ProgramError) as e:
        call(*with_bias)
    assert str(e.value) == says


# ---- 5. the command line: seeds, bugs, closed pipes -------------------------------------------------------------


def test_a_negative_seed_is_one_line(capsys):
    refused_in_one_line(capsys, "gemm", "64", "64", "64", "--seed", "-1", says="expected a whole number ≥ 0")


def test_a_bug_is_exit_status_3_in_one_line(capsys, monkeypatch):
    def broken(args):
        raise KeyError("stage 7")

    monkeypatch.setattr("spatialc.cli.commands.cmd_show", broken)
    status, _, err = run_cli(capsys, "show", "p.json")
    assert status == 3
    assert err == "spatialc: internal error: KeyError: 'stage 7' (re-run with --traceback to see where)\n"
    with pytest.raises(KeyError, match="stage 7"):
        main(["--traceback", "show", "p.json"])


def test_traceback_is_documented_in_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--traceback" in out and "3 an internal error" in out


def test_bad_input_stays_exit_status_2_with_traceback(capsys):
    status, _, err = run_cli(capsys, "--traceback", "gemm", "0", "4", "4")
    assert status == 2 and "m must be a whole number" in err


def test_a_closed_stdout_ends_quietly(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spatialc", "show", str(path), "--sites", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader goes away before the command writes (as `| head` does after its lines)
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141 and err == b""


def test_piping_into_head_prints_its_lines_and_nothing_else(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(spatialc.to_json(spatialc.build(spatialc.gemm(512, 512, 64), "sm_86", block=(1, 1, 1), sites=64)))
    cmd = f"set -o pipefail; '{sys.executable}' -m spatialc show '{path}' --sites 64 | head -n 2"
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert res.stdout.count("\n") == 2 and res.stderr == "" and res.returncode in (0, 141), res


def test_the_command_refuses_an_evaluation_past_memory_before_making_inputs(capsys, monkeypatch):
    monkeypatch.setattr(interp_evaluate, "physical_memory", lambda: 2**30)
    too_early = lambda *a: pytest.fail("inputs made before the check")  # noqa: E731
    monkeypatch.setattr("spatialc.cli.commands.random_inputs", too_early)
    for mode in ("sampled", "full"):
        err = refused_in_one_line(
            capsys, "gemm", "20000", "20000", "64", "--check", mode, says="; this machine has 1073741824 bytes"
        )
        assert "C's store" in err and "--check none" in err


def test_the_default_where_no_check_fits_is_none_and_the_check_line_says_what_a_check_needs(capsys, monkeypatch):
    monkeypatch.setattr(interp_evaluate, "physical_memory", lambda: 2**30)
    made = []
    monkeypatch.setattr("spatialc.cli.commands.random_inputs", lambda p, seed, sample, operands: made.append(operands))
    status, out, err = run_cli(capsys, "gemm", "20000", "20000", "64")
    assert status == 0, err
    check = next(line for line in out.splitlines() if line.lstrip().startswith("check"))
    assert "none (the default where no check fits: checking gemm_20000x20000x64_int8 needs" in check, check
    assert "C's store" in check and "this machine has 1073741824 bytes" in check
    assert made == [False]  # no operand was made: nothing would multiply them


@pytest.mark.parametrize(
    ("field", "entries", "words"),
    [
        ("sites", lambda d: d["placement"]["items_of_site"] + [[i, []] for i in range(2, 70_000)], "70000 sites"),
        ("semaphores", lambda d: [{"type": "Semaphore", "id": i, "name": f"s{i}"} for i in range(5000)], "5000 sema"),
    ],
)
def test_a_document_larger_than_any_program_is_refused_before_it_is_decoded(program, field, entries, words):
    """A placement of a million empty sites took a minute to decode and type-check before verify refused it (and
    the CLI caps --sites at 65,536): refused at once, by count."""
    doc = json.loads(spatialc.to_json(program))
    key = "items_of_site" if field == "sites" else "semaphores"
    (doc["program"]["placement"] if field == "sites" else doc["program"])[key] = entries(doc["program"])
    text = json.dumps(doc)
    t0 = time.process_time()  # this process's CPU, not the wall clock a loaded machine stretches (CI saw 3.2 s)
    with pytest.raises(SerdeError, match=rf"{words}\w*; a spatialc program has at most"):
        spatialc.from_json(text)
    assert time.process_time() - t0 < 2.0


def test_a_placement_of_a_negative_band_is_ill_formed(program):
    from spatialc.errors import IllFormedError

    q = program.evolve(placement=dataclasses.replace(program.placement, band=-5))
    with pytest.raises(
        IllFormedError, match="a placement of band -5: a grouped placement's rows a band, 0 to 16777216"
    ):
        spatialc.verify(q)


def test_a_placement_kind_no_rule_has_is_a_label_and_its_items_run_as_listed(program):
    """The kind names the rule a placement follows; any other is a label (a hand placement's "strided"): the work
    list is passed as listed, never redistributed by a rule the items do not follow."""
    q = spatialc.verify(program.evolve(placement=dataclasses.replace(program.placement, kind="bogus")))
    art = spatialc.lower(q)
    assert art.launch.placement == "listed" and art.launch.work and art.launch.per_sm == 0


def test_more_sites_than_any_build_takes_are_ill_formed_in_python_too(program):
    from spatialc.errors import IllFormedError
    from spatialc.ir.ids import Site

    listed = program.placement.items_of_site + tuple((Site(i), ()) for i in range(2, 70_000))
    q = program.evolve(placement=dataclasses.replace(program.placement, items_of_site=listed))
    with pytest.raises(IllFormedError, match="a placement of 70000 sites; at most 65536"):
        spatialc.verify(q)


def test_a_loop_count_of_more_digits_than_python_prints_is_refused_in_one_line(program):
    """2²⁰⁰⁰⁰ has more digits than Python turns into a string by default (a ValueError from the message itself):
    the count is named by its size."""
    from spatialc.errors import IllFormedError
    from spatialc.ir.ids import LoopVar
    from spatialc.ir.ops import Const, Loop, ReadBarrier

    spin = Loop(LoopVar(9), Const(2**20000), (ReadBarrier(),))
    with pytest.raises(IllFormedError, match=r"Loop lv9 < \(huge\): .* not a number of 20001 bits$"):
        spatialc.verify(readers_ending_with(program, spin))

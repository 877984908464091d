"""Map programs of several outputs (`spatialc.elementwise({name: expr, …})`), and of maps reading other maps: RoPE's
two halves, each its own map of the four inputs the reader fills once an item; a program whose maps share an
intermediate ring. The interpreter, the numpy reference and the tolerance agree, per output; verify — and rule 8
alone — refuses two outputs exchanged, a map reading another map's ring, an output stored twice."""

from __future__ import annotations

import dataclasses
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.errors import ProgramError, SemanticError, StrongerCheckNeeded, VerifyError
from spatialc.ir.nodes import DType, Engine, TensorRole
from spatialc.ir.ops import Apply, Arg, Compute, Lit, ReadTiles, WriteTiles, walk
from spatialc.ir.ops import Precision as P
from spatialc.numerics.reference import reference
from spatialc.passes.maps import block_resources
from spatialc.passes.verify import verify
from spatialc.rows import _Builder
from spatialc.target import target

from ..rewrite import edit, map_ops

M, N = 40, 70
NAMES = ("x1", "x2", "cos", "sin")


def rope(precision="bf16", **kw):
    x1, x2, c, s = ew.inputs(4)
    halves = {"out1": x1 * c - x2 * s, "out2": x2 * c + x1 * s}
    return spatialc.build(spatialc.elementwise(halves, M, N, precision, names=NAMES), **kw)


def rope_inputs(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((M, N)).astype(np.float32) for k in NAMES}


def quiet_evaluate(p, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        return spatialc.evaluate(p, inputs)


def engine_ops(p, engine):
    return next(q.ops for q in p.schedule.programs if q.engine == engine and q.ops)


def test_rope_reads_each_input_once_an_item_and_stores_both_halves():
    p = rope(sites=3)
    reads = [op.tensor for op in walk(engine_ops(p, Engine.READER)) if isinstance(op, ReadTiles)]
    assert sorted(p.tensor(t).name for t in reads) == sorted(NAMES)
    maps = [op for op in walk(engine_ops(p, Engine.COMPUTE)) if isinstance(op, Compute)]
    assert len(maps) == 2
    written = [p.tensor(op.tensor).name for op in walk(engine_ops(p, Engine.WRITER)) if isinstance(op, WriteTiles)]
    assert written == ["out1", "out2"]


def test_rope_is_numpys_rotation_per_output():
    p = rope(sites=3)
    x = rope_inputs()
    got = quiet_evaluate(p, x)
    v = {k: x[k].astype(ml_dtypes.bfloat16).astype(np.float64) for k in NAMES}
    want = {
        "out1": v["x1"] * v["cos"] - v["x2"] * v["sin"],
        "out2": v["x2"] * v["cos"] + v["x1"] * v["sin"],
    }
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    ref = reference(p, x)
    assert set(ref) == {"out1", "out2"} and all(np.array_equal(got[k], ref[k]) for k in ref)
    ok, how = spatialc.tolerance(p).check(got, x)
    assert ok and "out1:" in how and "out2:" in how, how
    bad = dict(got, out2=got["out1"])  # the halves exchanged: out2 is not within its own bound
    assert not spatialc.tolerance(p).check(bad, x)[0]


def test_an_int8_program_of_two_outputs_is_exact():
    a, b = ew.inputs(2)
    p = spatialc.build(spatialc.elementwise({"s": a + b, "d": a - b + ew.col("bias")}, 33, 50, "int8"), sites=2)
    rng = np.random.default_rng(3)
    x = {"x0": rng.integers(-128, 128, (33, 50)), "x1": rng.integers(-128, 128, (33, 50))}
    x["bias"] = rng.integers(-500, 500, (1, 50))
    got = spatialc.evaluate(p, x)
    assert np.array_equal(got["s"], x["x0"] + x["x1"])
    assert np.array_equal(got["d"], x["x0"] - x["x1"] + x["bias"])
    assert spatialc.tolerance(p).check(got, x)[0]


def test_one_output_in_a_dict_is_the_program_of_one_expression():
    x, g = ew.inputs(2)
    e = ew.silu(g) * x
    assert spatialc.to_json(spatialc.elementwise({"out": e}, M, N)) == spatialc.to_json(spatialc.elementwise(e, M, N))


def test_the_planner_counts_every_maps_ring():
    one = spatialc.build(spatialc.elementwise(ew.inputs(4)[0] * ew.inputs(4)[1], M, N, names=("a", "b")))
    two = rope()
    sizes = [block_resources(p, target("sm_90"), 4, 2, 2, 2)[0] for p in (one, two)]
    assert sizes[1] > sizes[0]  # RoPE's two rings of results, not one


def shared_program():
    """h = x + r (a ring no write stores), y1 = 2h, y2 = h − r: h's and r's rings each read by two maps."""
    b = _Builder(M, N, P.FP16)
    x = b.tensor("x", TensorRole.INPUT, (M, N), DType.FP16)
    r = b.tensor("r", TensorRole.INPUT, (M, N), DType.FP16)
    y1 = b.tensor("y1", TensorRole.OUTPUT, (M, N), DType.FLOAT32)
    y2 = b.tensor("y2", TensorRole.OUTPUT, (M, N), DType.FLOAT32)
    xr, rr = b.read(x, "x"), b.read(r, "r")
    h = b.map("h", Apply("add", (Arg(0), Arg(1))), (xr, rr))
    b.write(b.map("twice", Apply("mul", (Arg(0), Lit(2.0))), (h,)), y1, "write_y1")
    b.write(b.map("less", Apply("sub", (Arg(0), Arg(1))), (h, rr)), y2, "write_y2")
    return spatialc.build(b.program("shared", "sm_90"), sites=2)


def test_maps_of_a_shared_intermediate_ring():
    p = shared_program()
    rng = np.random.default_rng(4)
    x = {k: rng.standard_normal((M, N)).astype(np.float16) for k in ("x", "r")}
    got = quiet_evaluate(p, x)
    h = x["x"].astype(np.float32) + x["r"].astype(np.float32)
    np.testing.assert_array_equal(got["y1"], 2 * h)
    np.testing.assert_array_equal(got["y2"], h - x["r"].astype(np.float32))
    assert spatialc.tolerance(p).check(got, x)[0]


def _compute_ins(p, out_name, ins_names):
    """The compute engine's map into `out_name`'s ring reading the rings `ins_names` instead."""
    ring = {b.name: b.id for b in p.buffers}

    def f(op):
        if isinstance(op, Compute) and op.outs == (ring[out_name],):
            return (dataclasses.replace(op, ins=tuple(ring[n] for n in ins_names)),)
        return None

    return edit(p, Engine.COMPUTE, lambda ops: map_ops(ops, f))


def _writes(p, f):
    return edit(p, Engine.WRITER, lambda ops: map_ops(ops, lambda op: f(p, op) if isinstance(op, WriteTiles) else None))


def _exchanged(p, op):
    other = {"out1": "out2", "out2": "out1"}[p.tensor(op.tensor).name]
    return (dataclasses.replace(op, tensor=next(t.id for t in p.tensors if t.name == other)),)


def _twice(p, op):
    out1 = next(t.id for t in p.tensors if t.name == "out1")
    return (dataclasses.replace(op, tensor=out1),)


EDITS = {
    "the two outputs exchanged": (lambda p: _writes(p, _exchanged), "but the stages send it through out1_ring"),
    "a map reading another map's ring": (
        lambda p: _compute_ins(p, "out2_ring", ("x1_ring", "out1_ring", "cos_ring", "sin_ring")),
        "it reads x1_ring, out1_ring, cos_ring, sin_ring into out2_ring",
    ),
    "out1 stored twice, out2 never": (lambda p: _writes(p, _twice), "out2_ring -> out1"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_each_edit_of_rope_is_refused_by_verify_and_by_rule_8_alone(name):
    from spatialc.ir.index import ProgramIndex
    from spatialc.passes.verify.facts import Programs
    from spatialc.passes.verify.semantics import check_semantics

    change, words = EDITS[name]
    q = change(rope(sites=2))
    with pytest.raises(VerifyError):
        verify(q)
    index, programs = ProgramIndex.of(q), Programs(q)
    programs.gather(index)
    with pytest.raises((SemanticError, StrongerCheckNeeded)) as info:
        check_semantics(index, programs)
    assert words in str(info.value)


def test_a_second_write_of_one_output_is_refused_by_rule_8():
    """Two write stages of out1 (out2 written by none): each output is written by one."""
    p = spatialc.elementwise({"out1": ew.inputs(1)[0] * 2, "out2": ew.inputs(1)[0] * 3}, M, N)
    stages = tuple(
        dataclasses.replace(s, kind=dataclasses.replace(s.kind, tensor=p.stages[-2].kind.tensor))
        if s.name == "write_out2"
        else s
        for s in p.stages
    )
    with pytest.raises(VerifyError, match="both write out1"):
        spatialc.build(dataclasses.replace(p, stages=stages), sites=1)


@pytest.mark.parametrize(
    "outputs, words",
    [
        ({}, "at least one output"),
        ({"out1": 2}, "for output 'out1'"),
        ({"x0": ew.inputs(1)[0]}, "need names of their own"),
        ({"1st": ew.inputs(1)[0]}, "names each output by an identifier"),
    ],
)
def test_outputs_named_wrongly_are_refused_in_words(outputs, words):
    with pytest.raises(ProgramError, match=words):
        spatialc.elementwise(outputs, M, N)


def test_a_map_program_whose_write_stores_a_read_is_refused_by_the_planner():
    b = _Builder(M, N, P.FP16)
    x = b.tensor("x", TensorRole.INPUT, (M, N), DType.FP16)
    y = b.tensor("y", TensorRole.OUTPUT, (M, N), DType.FLOAT32)
    b.write(b.read(x, "x"), y)
    with pytest.raises(ProgramError, match="a copy of a tensor is the map x of its own"):
        spatialc.build(b.program("copy", "sm_90"))


def test_the_cli_builds_outputs_written_as_assignments(capsys, tmp_path):
    from ..cli.test_cli import run_cli

    path = tmp_path / "rope.json"
    text = "out1 = x1 * cos - x2 * sin; out2 = x2 * cos + x1 * sin"
    status, out, err = run_cli(capsys, "elementwise", text, "40", "70", "--json", str(path))
    assert status == 0, err
    assert "inputs x1, cos, x2, sin" in out and "OK, out1: max |error|" in out and "out2: max |error|" in out
    p = spatialc.from_json(path.read_text())
    assert [t.name for t in p.tensors if t.role == TensorRole.OUTPUT] == ["out1", "out2"]


@pytest.mark.parametrize(
    "text, words",
    [
        ("out1 = x * 2; out1 = x", "output out1 is assigned twice"),
        ("out1 = x * 2; x + 1", "'x + 1' is no output"),
        ("a, b = x, x", "is no output"),
    ],
)
def test_the_cli_refuses_outputs_written_wrongly_in_one_line(capsys, text, words):
    from ..cli.test_cli import run_cli

    status, _, err = run_cli(capsys, "elementwise", text, "40", "70")
    assert status == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_random_edits_of_map_programs_of_several_outputs_are_refused_or_harmless():
    """The mutation suite's random edits (tests/mutants.py) of RoPE and of maps sharing a ring: each is refused by
    verify, or verified and its result the reference's, output by output (runs of 3 × 1,500 edits found no hole)."""
    from .. import mutants

    tally = mutants.run(40, 5, {"rope": lambda: rope(sites=3), "shared": shared_program})
    assert not tally.holes, tally.holes[:3]
    assert tally.counts["refused"] > 0 and tally.counts["same"] > 0


def _two_maps(wire):
    """x read, a map a = 2x, and the rest as `wire(builder, x's ring, a's ring, y1, y2)` makes it."""
    b = _Builder(M, N, P.FP16)
    x = b.tensor("x", TensorRole.INPUT, (M, N), DType.FP16)
    y1 = b.tensor("y1", TensorRole.OUTPUT, (M, N), DType.FLOAT32)
    y2 = b.tensor("y2", TensorRole.OUTPUT, (M, N), DType.FLOAT32)
    xr = b.read(x, "x")
    a = b.map("a", Apply("mul", (Arg(0), Lit(2.0))), (xr,))
    wire(b, xr, a, y1, y2)
    return b.program("two", "sm_90")


@pytest.mark.parametrize(
    "wire, words",
    [
        (lambda b, xr, a, y1, y2: (b.map("dead", Arg(0), (xr,)), b.write(a, y1, "w1")), "fills dead_ring, which no"),
        (
            lambda b, xr, a, y1, y2: (b.write(a, y1, "w1"), b.write(b.map("c", Arg(0), (a,)), y2, "w2")),
            "feeds write stage w1 and stage c",
        ),
    ],
    ids=["a map no stage reads", "a written ring another map reads"],
)
def test_the_planner_refuses_what_no_map_schedule_can_run(wire, words):
    with pytest.raises(ProgramError, match=words):
        spatialc.build(_two_maps(wire))

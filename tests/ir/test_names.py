"""A saved program never runs code: hostile names at every sink (issue: "A saved program must never run code").

Names are refused where a program comes in (the JSON reader, verify's rule 1, the lang builder, evaluate), and every
printer that writes one into generated text escapes it as well. Each sink gets a name that would run code or
reach a path if pasted as it is; each test shows it refused, or written as inert text, and the payload never run.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import json
import shutil

import numpy as np
import pytest

import spatialc
from spatialc import lang
from spatialc.errors import IllFormedError, ProgramError
from spatialc.interp.errors import EvalError
from spatialc.ir.names import MAX_NAME, name_fault, names_fault, plain
from spatialc.ir.serde import SerdeError
from spatialc.lang.lines import LangError
from spatialc.lang.source import python_source
from spatialc.lower.artifact import operand_files
from spatialc.lower.cuda.forms import lower as lower_form

FLAG = "_spatialc_hostile_name_ran"
# Each ends whatever it is pasted into (a # or // comment, a "string", a path) and then runs or includes something.
PAYLOADS = (
    f"A\n__import__('builtins').{FLAG} = 1\n#",
    f'A")\n__import__("builtins").{FLAG} = 1\n#',
    'A\n#include "/etc/passwd"\n//',
    "A\\",  # a // comment ending in a backslash continues onto the next line
    '"); system("touch pwned"); ("',
    "../../evil",
    "/tmp/evil",
    "A%s%s%n",
    "A\u2028B",
    "",
    "x" * (MAX_NAME + 1),
    "1A",
    "A B",
)


@pytest.fixture(autouse=True)
def never_ran():
    yield
    assert not hasattr(builtins, FLAG), "a name ran as code"


def gemm(prec="int8"):
    return spatialc.build(spatialc.gemm(32, 32, 32, prec, epilogue=[spatialc.bias()]), "sm_86")


def renamed(p, what: str, name: str, index: int = 0):
    """`p` with the `index`-th tensor / stage / buffer / semaphore (or the program itself) named `name`."""
    if what == "program":
        return p.evolve(name=name)
    field = {"tensor": "tensors", "stage": "stages", "buffer": "buffers", "semaphore": "semaphores"}[what]
    items = list(getattr(p, field))
    items[index] = dataclasses.replace(items[index], name=name)
    return p.evolve(**{field: tuple(items)})


@pytest.mark.parametrize("name", PAYLOADS, ids=range(len(PAYLOADS)))
def test_every_hostile_name_is_refused_by_the_rule(name):
    assert name_fault("tensor", name) is not None
    assert plain(name) == "" or plain(name).isprintable()
    for bad in "\n\r\"'\\%{}?/":
        assert bad not in plain(name)


@pytest.mark.parametrize("what", ["program", "tensor", "stage", "buffer"])
@pytest.mark.parametrize("name", PAYLOADS[:5], ids=range(5))
def test_a_saved_file_with_a_hostile_name_is_refused_on_reading_and_by_verify(what, name):
    p = renamed(gemm(), what, name)
    doc = spatialc.to_json(p)
    with pytest.raises(SerdeError, match="not identifier-like"):
        spatialc.from_json(doc)
    with pytest.raises(IllFormedError, match="not identifier-like"):
        spatialc.verify(p)
    with pytest.raises(IllFormedError):
        spatialc.lower(p.evolve(verified=True))  # the mark is never trusted: verified again, refused


def test_names_repeated_within_a_kind_are_refused_and_across_kinds_allowed():
    p = gemm()
    for what in ("tensor", "stage", "buffer"):
        field = {"tensor": "tensors", "stage": "stages", "buffer": "buffers"}[what]
        first = getattr(p, field)[0].name
        twice = renamed(p, what, first, 1)
        assert names_fault(twice) == f"two {what}s are named {first!r}: names are unique within their kind"
        with pytest.raises(IllFormedError, match=f"two {what}s are named"):
            spatialc.verify(twice)
    # A tensor and a buffer may share a name: they are looked up apart.
    same = renamed(p, "buffer", p.tensors[0].name)
    assert spatialc.verify(same).verified


def test_two_inputs_of_one_name_no_longer_compute_a_times_a():
    p = gemm("int8")
    twice = renamed(p, "tensor", "A", 1)  # B called A: it would be fed A's values
    with pytest.raises(IllFormedError, match="two tensors are named 'A'"):
        spatialc.verify(twice)
    rng = np.random.default_rng(0)
    ins = {"A": rng.integers(-3, 3, (32, 32)), "bias": rng.integers(-3, 3, 32)}
    with pytest.raises(EvalError, match="two tensors are named 'A'"):
        spatialc.evaluate(twice, ins)


def test_an_input_named_like_the_output_is_a_clear_refusal_not_a_value_error():
    p = renamed(gemm(), "tensor", "C", 0)
    with pytest.raises(IllFormedError, match="two tensors are named 'C'"):
        spatialc.verify(p)


@pytest.mark.parametrize("name", PAYLOADS[:4], ids=range(4))
def test_the_interpreter_writes_a_hostile_name_as_inert_comment_text(name, monkeypatch):
    """evaluate refuses the name; the code generator under it never lets one end its comment either."""
    from spatialc.interp import codegen
    from spatialc.interp import evaluate as ev
    from spatialc.interp.machine import Machine

    p = renamed(gemm(), "buffer", name)  # a ring's name: in the comment above each of its ops
    ins = {"A": np.ones((32, 32)), "B": np.ones((32, 32)), "bias": np.ones(32)}
    with pytest.raises(EvalError, match="not identifier-like"):
        spatialc.evaluate(p, ins)
    sources: list[str] = []

    def keep(source, *args, **kwargs):
        sources.append(source)
        return compile(source, *args, **kwargs)

    monkeypatch.setattr(codegen, "compile", keep, raising=False)
    stores, params = ev.load_inputs(p, ins)  # below evaluate's check: the generator on its own
    m = Machine(p, stores, params, False)
    ev.run(m.engines(), m)
    assert sources, "no engine was compiled"
    for source in sources:
        assert [type(n).__name__ for n in ast.parse(source).body] == ["FunctionDef"]  # nothing beside the engine
        assert name not in source


@pytest.mark.parametrize("name", PAYLOADS[:5], ids=range(5))
def test_the_cuda_printers_write_a_hostile_name_as_inert_text(name):
    """Below verify (which refuses the name), each form's printers still write names only through `plain`: the
    texts printed with a hostile name are those printed with a benign one, the name replaced by its plain text —
    it stands only where a name stands (comments, messages), and ends none of them."""
    target = spatialc.target("sm_86")
    base = gemm()
    bias = next(i for i, t in enumerate(base.tensors) if t.role.value == "parameter")
    for form in ("persistent", "general"):
        for what, index in (("program", 0), ("tensor", bias)):
            benign = lower_form(renamed(base, what, "QQNAME", index).evolve(verified=True), target, form)
            hostile = lower_form(renamed(base, what, name, index).evolve(verified=True), target, form)
            for text in ("program_cu", "bench_cu", "kernel_cu"):
                assert getattr(hostile, text) == getattr(benign, text).replace("QQNAME", plain(name))
            assert "QQNAME" in benign.program_cu


def test_operand_files_come_from_positions_never_from_names():
    assert operand_files(["input", "input", "output", "parameter"]) == ("a.txt", "b.txt", None, "p3.txt")
    assert operand_files(["parameter", "input", "workspace"]) == ("p0.txt", "a.txt", None)
    assert operand_files(["input"] * 28)[-2:] == ("in27.txt", "in28.txt")
    p = gemm()
    a = spatialc.lower(p)
    assert 'spatialc_read("p3.txt", h3)' in a.program_cu and "bias.txt" not in a.program_cu
    assert "// Reads a.txt (A), b.txt (B), p3.txt (bias)" in a.program_cu


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/escape.txt", ".hidden", "a/b.txt", "a\nb", ""])
def test_the_emulation_writes_no_file_outside_its_folder(name, tmp_path):
    from spatialc.runtime.emulate import run_program

    with pytest.raises(ProgramError, match="a plain file name"):
        run_program(tmp_path / "no-such-binary", {name: "1\n"}, 1)


def test_show_python_prints_names_as_data_and_its_script_runs_no_payload():
    p = gemm()
    for name in PAYLOADS[:2]:
        source = python_source(renamed(p, "program", name))
        tree = ast.parse(source)  # still one docstring, imports, the program function and the main guard
        kinds = [type(n).__name__ for n in tree.body]
        assert kinds == ["Expr", "ImportFrom", "ImportFrom", "ImportFrom", "FunctionDef", "If"], kinds
        with pytest.raises(LangError, match="not identifier-like"):
            exec(compile(source, "<show --python>", "exec"), {"__name__": "printed"})  # the decorator refuses it
    # An ordinary program still prints the same source, and it traces back to the program.
    source = python_source(p)
    namespace: dict = {"__name__": "printed"}
    exec(compile(source, "<show --python>", "exec"), namespace)
    assert spatialc.to_json(namespace["program"]()) == spatialc.to_json(p)


def test_the_lang_builder_refuses_a_hostile_name_at_the_users_line():
    @lang.program(target="sm_86", precision="int8")
    def prog(p):
        p.input("A\nimport os", 32, 32)

    with pytest.raises(LangError, match=r"test_names\.py:\d+: tensor name .* is not identifier-like"):
        prog()
    with pytest.raises(LangError, match="program name"):
        lang.program(name="x; y")


def test_a_document_with_a_hostile_placement_kind_is_refused():
    doc = json.loads(spatialc.to_json(gemm()))
    doc["program"]["placement"]["kind"] = "contiguous\nimport os"
    with pytest.raises(SerdeError, match="placement kind"):
        spatialc.from_json(json.dumps(doc))


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_a_parameter_named_like_an_operand_file_is_bound_by_position_in_the_emulation():
    """A bias called `a` was written to a.txt over A (32 of 32 elements wrong); files now come from positions."""
    p = renamed(gemm("int8"), "tensor", "a", 3)
    assert p.tensors[3].role.value == "parameter"
    p = spatialc.verify(p)
    rng = np.random.default_rng(1)
    ins = {"A": rng.integers(-5, 5, (32, 32)), "B": rng.integers(-5, 5, (32, 32)), "a": rng.integers(-50, 50, 32)}
    want = spatialc.evaluate(p, ins)
    assert np.array_equal(want, ins["A"] @ ins["B"] + ins["a"])
    assert np.array_equal(spatialc.emulate(spatialc.lower(p), ins), want)


def test_a_generated_name_past_the_limit_is_cut_with_a_hash_and_still_builds():
    import spatialc
    from spatialc.ir.names import MAX_NAME

    epi = [spatialc.row_scale(), spatialc.col_scale(), spatialc.bias(), spatialc.relu(), spatialc.residual()]
    long = spatialc.gemm(512, 512, 512, "fp16", epilogue=[*epi, spatialc.gate()])  # 65 characters spelled out
    other = spatialc.gemm(512, 512, 512, "fp16", epilogue=[*epi, spatialc.gate(), spatialc.relu()])
    assert len(long.name) == MAX_NAME and long.name.startswith("gemm_512x512x512_fp16_row_scale_col_scale")
    assert long.name != other.name and len(other.name) == MAX_NAME
    assert spatialc.gemm(512, 512, 512, "fp16", epilogue=epi).name.endswith("_relu_residual")  # short: as before
    assert spatialc.build(long, "sm_90").verified

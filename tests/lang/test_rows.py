"""Maps and row reductions written in spatialc.lang: softmax, RMSNorm and an elementwise program by hand, equal to
what the frontend builds, proved by rule 8, run by the interpreter against numpy, and refused at the user's lines
where they are wrong."""

from __future__ import annotations

import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc import ew, lang
from spatialc.errors import SpatialError

from .test_lang import example, line_of

HERE = Path(__file__).resolve()
EPS = 1e-6


def rms_by_hand(p: lang.Builder, m: int = 48, n: int = 200, ill: str = ""):
    """out = x · rsqrt(Σx²/n + eps) · weight, bands of one tile row read 4 tiles a page, three bands over two sites:
    what `spatialc.rmsnorm(48, 200)` builds with block=(1, 4, 1), sites=2 — with a fault where `ill` asks."""
    rows_t, cols_t = -(-m // 16), 16  # 13 tile columns of values, padded to 4 pages of 4
    x = p.input("x", m, n, tiles=(rows_t, cols_t))
    p.parameter("weight", 1, n, tiles=(1, cols_t))
    out = p.output("out", m, n, tiles=(rows_t, cols_t))
    x0 = p.ring("x0_ring", depth=2, tiles=4)
    sumsq = p.ring("row_sumsq_ring", depth=1, tiles=1, kind="interm")
    x1 = p.ring("x1_ring", depth=2, tiles=4)
    scaled = p.ring("scale_ring", depth=2, tiles=4, kind="interm")
    acc = p.accumulator("row_sumsq_acc", tiles=1)
    p.read("read_x0", x, x0)
    row_sumsq = p.reduce("row_sumsq", "mean" if ill == "op" else "sumsq", x0, sumsq)
    p.read("read_x1", x, x1)
    w = ew.col("x" if ill == "col" else "weight")
    scale = p.map("scale", lambda v, s: v * ew.rsqrt(s / float(n) + EPS) * w, [x1, sumsq], scaled)
    p.write("write_out", scaled, out)
    p.plan(block=(1, 16, 4), grid=(rows_t, 1), k_tiles=cols_t, depth=2)
    p.place([[0, 1], [2]], kind="contiguous")

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for ring in (x0, x1):
                for k in e.range(4, "k"):
                    with ring.reserve() as page:
                        page.read(x, cols_t * item.y + 4 * k, 1, 4)

    @p.compute
    def compute(e: lang.Engine):
        for _ in e.items():
            if ill != "unacquired":
                acc.acquire()
            for k in e.range(4, "k"):
                page = x0.wait()
                if ill == "popped":
                    page.pop()
                acc.reduce(row_sumsq, page, at=0 if ill == "skips" else 4 * k, width=4)  # the reduce
                if ill != "popped":
                    page.pop()
            if ill == "early":
                s = sumsq.wait()
            with sumsq.reserve() as page:
                acc.pack(page)
            acc.release()
            s = sumsq.wait()
            for k in e.range(4, "k"):
                with (x0 if ill == "ring" else x1).wait() as v, scaled.reserve() as page:
                    e.map(scale, [v, s], page, at=0 if ill == "column" else 4 * k, width=4)  # the map
            s.pop()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            for k in e.range(4, "k"):
                with scaled.wait() as page:
                    page.write(out, cols_t * item.y + 4 * k, 1, 4)


rmsnorm = lang.program(target="sm_90", precision="bf16", name="rmsnorm_48x200_bf16")(rms_by_hand)


@lang.program(target="sm_90", precision="bf16", name="elementwise_40x96_bf16")
def swiglu(p: lang.Builder):
    """out = silu(gate) · x over 40 × 96 values, items of 1 × 2 tiles on two sites: what spatialc.elementwise builds."""
    x = p.input("x", 40, 96)
    gate = p.input("gate", 40, 96)
    out = p.output("out", 40, 96)
    x_ring, gate_ring = p.ring("x_ring", depth=2, tiles=2), p.ring("gate_ring", depth=2, tiles=2)
    out_ring = p.ring("out_ring", depth=2, tiles=2, kind="interm")
    p.read("read_x", x, x_ring)
    p.read("read_gate", gate, gate_ring)
    xs, gs = ew.inputs(2)
    gated = p.map("map", ew.silu(gs) * xs, [x_ring, gate_ring], out_ring)  # an ew expression: input i the i-th ring
    p.write("write_out", out_ring, out)
    p.plan(block=(1, 2, 1), grid=(3, 3), k_tiles=1, depth=2)
    p.place([[0, 1, 2, 3, 4], [5, 6, 7, 8]], kind="contiguous")

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for tensor, ring in ((x, x_ring), (gate, gate_ring)):
                with ring.reserve() as page:
                    page.read(tensor, 6 * item.y + 2 * item.x, 1, 2)

    @p.compute
    def compute(e: lang.Engine):
        for item in e.items():
            a, g = x_ring.wait(), gate_ring.wait()
            with out_ring.reserve() as page:
                e.map(gated, [a, g], page, at=2 * item.x, width=2)
            a.pop()
            g.pop()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with out_ring.wait() as page:
                page.write(out, 6 * item.y + 2 * item.x, 1, 2)


def evaluated(program, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)  # normal values are not bf16 values
        out = spatialc.evaluate(program, inputs)
        ok, how = spatialc.tolerance(program).check(out, inputs)
    assert ok, how
    return out


def bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float64)


def test_the_softmax_written_by_hand_is_the_built_one_and_numpys():
    traced = example("lang_softmax").softmax()
    built = spatialc.build(spatialc.softmax(64, 128, "bf16"), "sm_90", block=(2, 4, 1), sites=2)
    assert traced.verified and traced == built
    x = 3 * np.random.default_rng(0).standard_normal((64, 128))
    e = np.exp(bf16(x) - bf16(x).max(axis=1, keepdims=True))
    assert np.allclose(evaluated(traced, {"x": x}), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=0)


def test_the_softmax_example_runs_as_a_script(capsys):
    import runpy

    from .test_lang import EXAMPLES

    runpy.run_path(str(EXAMPLES / "lang_softmax.py"), run_name="__main__")
    assert "softmax_64x128_bf16: verified; the interpreter's softmax is numpy's within" in capsys.readouterr().out


def test_the_rmsnorm_written_by_hand_with_padded_rows_is_the_built_one_and_numpys():
    traced = rmsnorm()
    built = spatialc.build(spatialc.rmsnorm(48, 200, "bf16", eps=EPS), "sm_90", block=(1, 4, 1), sites=2)
    assert traced.verified and traced == built
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((48, 200)), rng.standard_normal(200)
    want = bf16(x) / np.sqrt((bf16(x) ** 2).mean(axis=1, keepdims=True) + EPS) * w.astype(np.float32)
    assert np.allclose(evaluated(traced, {"x": x, "weight": w}), want, rtol=1e-5, atol=1e-6)


def test_an_elementwise_program_written_by_hand_is_the_built_one_and_numpys():
    xs, gs = ew.inputs(2)
    built = spatialc.build(
        spatialc.elementwise(ew.silu(gs) * xs, 40, 96, names=("x", "gate")), "sm_90", block=(1, 2, 1), sites=2
    )
    assert swiglu() == built
    rng = np.random.default_rng(2)
    x, g = rng.standard_normal((40, 96)), rng.standard_normal((40, 96))
    want = bf16(g) / (1 + np.exp(-bf16(g))) * bf16(x)
    assert np.allclose(evaluated(swiglu(), {"x": x, "gate": g}), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("ill", "statement", "says"),
    [
        ("op", 'p.reduce("row_sumsq", "mean"', "op 'mean' is none of max, min, sum, sumsq, absmax"),
        (
            "ring",
            "# the map",
            "stage scale maps pages of x1_ring, row_sumsq_ring into scale_ring; these are of x0_ring",
        ),
        ("popped", "# the reduce", "reduce a page of x0_ring after its pop"),
        ("unacquired", "# the reduce", "a reduce into row_sumsq_acc before its acquire()"),
        ("early", "s = sumsq.wait()", "a wait for row_sumsq_ring's row vector before this engine packs it"),
        (
            "col",
            'scale = p.map("scale"',
            "ew.col('x') is a parameter tensor of one row (p.parameter), not input tensor x",
        ),
    ],
)
def test_a_map_or_reduction_written_wrong_is_refused_at_the_users_line(ill, statement, says):
    with pytest.raises(lang.LangError) as caught:
        rmsnorm.trace(ill=ill)  # type: ignore[attr-defined]
    line = line_of(HERE, statement, after="def rms_by_hand")
    assert (caught.value.file, caught.value.line) == (str(HERE), line), str(caught.value)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("ill", "statement"),
    [("skips", "# the reduce"), ("column", "# the map")],  # one column page reduced four times; weight's first page
)
def test_rule_8_refuses_a_reduction_or_a_column_vector_at_the_wrong_column_at_the_users_line(ill, statement):
    with pytest.raises(SpatialError) as caught:
        rmsnorm(ill=ill)
    line = line_of(HERE, statement, after="def rms_by_hand")
    assert f"{HERE}:{line}: site 0 compute:" in str(caught.value), str(caught.value)  # beside the write it reaches


@pytest.mark.parametrize(
    ("which", "statement", "says"),
    [
        ("operands", "# an op given two operands", "map m: ew.exp takes 1 operand(s), not 2"),
        ("names", "# a name too many", "map m's function takes one value for each of the 1 ring(s) it reads"),
    ],
)
def test_a_map_function_written_wrong_is_refused_at_its_line(which, statement, says):
    def bad(p: lang.Builder):
        x = p.input("x", 16, 16)
        a, b = p.ring("a", depth=2, tiles=1), p.ring("b", depth=2, tiles=1)
        p.read("read_x", x, a)
        if which == "operands":
            p.map("m", lambda v: ew.exp(v, v), a, b)  # an op given two operands
        p.map("m", lambda v, w: v * w, a, b)  # a name too many

    with pytest.raises(lang.LangError) as caught:
        lang.trace(bad)
    line = line_of(HERE, statement, after="def bad(p: lang.Builder):")
    assert caught.value.line == line and says in str(caught.value), str(caught.value)


def test_show_python_prints_a_row_program_that_traces_back_and_refuses_a_reduction_no_stage_declares(tmp_path, capsys):
    import dataclasses

    from spatialc.cli import main
    from spatialc.ir.nodes import Engine
    from spatialc.ir.ops import Compute, RowReduce

    from ..rewrite import replace

    program = spatialc.build(spatialc.rmsnorm(48, 200, "bf16"), "sm_90")
    saved = tmp_path / "rms.json"
    saved.write_text(spatialc.to_json(program))
    assert main(["show", "--python", str(saved)]) == 0
    source = capsys.readouterr().out
    assert "p.reduce(" in source and "ew.rsqrt(" in source and ".reduce(row_sumsq, " in source
    scope: dict[str, object] = {}
    exec(compile(source, "<shown>", "exec"), scope)
    assert scope["program"]() == program  # type: ignore[operator]

    # A reduction whose op differs from its stage's (what rule 8 refuses) has no form: e.map and acc.reduce make
    # what their stage declares.
    def to_min(op):
        if not (isinstance(op, Compute) and isinstance(op.op, RowReduce)):
            return None
        return (dataclasses.replace(op, op=dataclasses.replace(op.op, op="min")),)

    odd = replace(program, Engine.COMPUTE, to_min)
    path = tmp_path / "odd.json"
    path.write_text(spatialc.to_json(odd))
    assert main(["show", "--python", str(path)]) == 2  # verified first: rule 8 refuses it, in one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "where stage row_sumsq declares row sumsq" in err
    from spatialc.lang import LangError
    from spatialc.lang.source import python_source

    with pytest.raises(LangError, match="a row reduction no p.reduce stage declares has no form in spatialc.lang"):
        python_source(odd)  # and the printer itself, handed it unverified, refuses it by name


def random_formula(rng: np.random.Generator, depth: int, inputs: int, vectors: tuple[bool, ...]):
    """A formula of the table's ops over `inputs` rings (a row vector where `vectors` says), literals of either sign."""
    from spatialc.ir.ops import Apply, Arg, Lit, RowArg
    from spatialc.numerics.elementwise import OPS

    if depth == 0 or rng.random() < 0.2:
        i = int(rng.integers(0, inputs + 1))
        if i == inputs:
            return Lit(float(rng.choice([-2.5, -0.0, 0.0, 0.5, 3.0])))
        return RowArg(i) if vectors[i] else Arg(i)
    op = OPS[str(rng.choice(sorted(OPS)))]
    params = tuple(float(v) for v in rng.choice([-1.0, 0.25, 2.0], len(op.params)))
    return Apply(op.name, tuple(random_formula(rng, depth - 1, inputs, vectors) for _ in range(op.arity)), params)


def test_a_formula_printed_as_ew_source_reads_back_to_itself():
    from spatialc.lang.maps import as_rows, ew_source

    rng = np.random.default_rng(3)
    vectors = (False, True, False)
    for _ in range(400):
        expr = random_formula(rng, 4, 3, vectors)
        source = ew_source(expr, ["a", "m", "b"], vectors, lambda c: None)
        value = eval(f"lambda a, m, b: {source}", {"ew": ew})(*ew.inputs(3))  # noqa: S307 (the printer's own text)
        back = as_rows(value.node, vectors) if isinstance(value, ew.Value) else None
        assert back == expr, source


def test_a_row_vector_prints_as_ew_row_and_a_column_vector_as_ew_col():
    """A per-row scale (`Col` along ROW) is `ew.row`, a column vector `ew.col`: each reads back as its own axis."""
    from spatialc.ir.ids import TensorId
    from spatialc.ir.ops import Apply, Arg, Col, VecAxis
    from spatialc.lang.maps import ew_source

    def named(c):
        return "s"

    assert ew_source(Apply("mul", (Arg(0), Col(TensorId(3)))), ["x"], (False,), named) == 'x * ew.col("s")'
    row = Apply("mul", (Arg(0), Col(TensorId(3), axis=VecAxis.ROW)))
    assert ew_source(row, ["x"], (False,), named) == 'x * ew.row("s")'
    assert ew.resolved(ew.x(0) * ew.row("s"), lambda name: TensorId(3)) == row


def test_layernorm_prints_as_ew_formulas_whose_lang_source_builds_it_again():
    """A map of row vectors alone (mean = Σx / n) fills a row vector: a later map reads it by row (x − mean), in the
    printed source and when the source runs as a lang program — before, both took it for a page of values."""
    import types

    from spatialc.lang.source import python_source

    p = spatialc.build(spatialc.layernorm(40, 70, "bf16"), "sm_90")
    src = python_source(p)
    assert "Map(" not in src and 'p.map("centre", lambda x1, mean: x1 - mean' in src
    module = types.ModuleType("layernorm_by_hand")
    exec(compile(src, "layernorm_by_hand.py", "exec"), module.__dict__)
    assert module.program() == p


def test_a_number_raised_to_an_expression_is_written_and_printed_as_python_writes_it():
    """`2.0 ** x` is ew's pow(2, x) (Value.__rpow__), and the printer writes it back so: the two read the same."""
    from spatialc.ir.ops import Apply, Arg, Lit
    from spatialc.lang.maps import ew_source

    (x,) = ew.inputs(1)
    assert (2.0**x).node == Apply("pow", (Lit(2.0), Arg(0))) and (x**2.0).node == Apply("pow", (Arg(0), Lit(2.0)))
    text = ew_source(Apply("pow", (Lit(2.0), Arg(0))), ["x"], (False,), lambda c: None)
    assert text == "2.0 ** x" and eval(text, {"ew": ew, "x": x}).node == (2.0**x).node


def test_printed_source_names_no_variable_after_a_python_builtin():
    """A stage named map (an elementwise program's) or sum would be a variable hiding Python's own: it gets a
    trailing underscore, and the module still builds the program."""
    import ast
    import builtins
    import types

    from spatialc.lang.source import python_source

    x, g = ew.inputs(2)
    for p in (
        spatialc.build(spatialc.elementwise(ew.silu(g) * x, 64, 96, "bf16"), "sm_90"),
        spatialc.build(spatialc.layernorm(40, 70, "bf16"), "sm_90"),
    ):
        src = python_source(p)
        bound = {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        assert not bound & set(dir(builtins)), bound & set(dir(builtins))
        module = types.ModuleType("printed")
        exec(compile(src, "printed.py", "exec"), module.__dict__)
        assert module.program() == p

"""Column reductions written in spatialc.lang (`p.col_reduce`, folded page by page by `acc.reduce(stage, page, row=…,
width=…)`): a column sum and a column absmax by hand, equal to what spatialc.col_reduce builds and to numpy; the
programs spatialc.col_reduce builds printed by `spatialc show --python` as lang source that traces back to them; and
the misuses refused at the user's line."""

from __future__ import annotations

import dataclasses
import types
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc import lang
from spatialc.errors import SpatialError

from .test_lang import line_of

HERE = Path(__file__).resolve()
M, N = 40, 70  # 3 tile rows, padded to 2 pages of 2; 5 tile columns, padded to 3 bands of 2


def col_by_hand(p: lang.Builder, op: str = "sum", ill: str = ""):
    """out[0, j] = `op` over column j of x (40 × 70): bands of 2 tile columns walked down in pages of 2 × 2 tiles,
    three bands over two sites — what `spatialc.col_reduce(40, 70, op)` builds with block=(2, 2, 1), sites=2; with a
    fault where `ill` asks."""
    x = p.input("x", M, N, tiles=(4, 6))
    out = p.output("out", 1, N, tiles=(1, 6))
    folded = p.ring(f"col_{op}_ring", depth=1, tiles=2, kind="interm")
    pages = p.ring("x0_ring", depth=2, tiles=4)
    acc = p.accumulator(f"col_{op}_acc", tiles=2)
    p.read("read_x0", x, pages)
    rows = 48 if ill == "rows" else None
    reduced = p.col_reduce(f"col_{op}", "median" if ill == "op" else op, pages, folded, rows=rows)  # the stage
    p.write("write_out", folded, out)
    p.plan(block=(4, 2, 2), grid=(1, 3), k_tiles=4, depth=2)
    p.place([[0, 1], [2]], kind="contiguous")

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for k in e.range(2, "k"):
                with pages.reserve() as page:
                    page.read(x, 12 * k + 2 * item.x, 2, 2)

    @p.compute
    def compute(e: lang.Engine):
        for _ in e.items():
            acc.acquire()
            for k in e.range(2, "k"):
                with pages.wait() as page:
                    if ill == "at":
                        acc.reduce(reduced, page, at=2 * k, width=2)  # a row reduction's placement
                    acc.reduce(reduced, page, row=0 if ill == "skips" else 2 * k, width=2)  # the reduce
            if ill == "early":
                folded.wait()  # the early wait
            with folded.reserve() as page:
                acc.pack(page)
            acc.release()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with folded.wait() as page:
                page.write(out, 2 * item.x, 1, 2)


col_sum = lang.program(target="sm_90", precision="bf16", name="col_sum_40x70_bf16")(col_by_hand)
col_absmax = lang.program(target="sm_90", precision="bf16", name="col_absmax_40x70_bf16")(col_by_hand)


def bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float64)


def evaluated(program, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)  # normal values are not bf16 values
        got = spatialc.evaluate(program, inputs)
        ok, how = spatialc.tolerance(program).check(got, inputs)
    assert ok, how
    return got


def built(op: str) -> spatialc.SpatialProgram:
    return spatialc.build(spatialc.col_reduce(M, N, op, "bf16"), "sm_90", block=(2, 2, 1), sites=2)


def test_a_column_sum_written_by_hand_is_the_built_one_and_numpys():
    traced = col_sum(op="sum")
    assert traced.verified and traced == built("sum")
    x = np.random.default_rng(0).standard_normal((M, N))
    got = evaluated(traced, {"x": x})
    assert got.shape == (1, N) and np.allclose(got, bf16(x).sum(axis=0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_a_column_absmax_written_by_hand_is_the_built_one_and_numpys():
    traced = col_absmax(op="absmax")
    assert traced.verified and traced == built("absmax")
    x = 3 * np.random.default_rng(1).standard_normal((M, N))
    got = evaluated(traced, {"x": x})
    assert got.shape == (1, N) and np.array_equal(got, np.abs(bf16(x)).max(axis=0, keepdims=True))


@pytest.mark.parametrize(
    ("ill", "statement", "says"),
    [
        ("op", "# the stage", "column reduction col_sum: op 'median' is none of max, min, sum, sumsq, absmax"),
        ("rows", "# the stage", "column reduction col_sum of 48 rows: the columns of x, which read_x0 reads into"),
        ("at", "# a row reduction's placement", "stage col_sum reduces columns: its page is placed by its first tile"),
        ("early", "# the early wait", "a wait for col_sum_ring's column vector before this engine packs it"),
    ],
)
def test_a_column_reduction_written_wrong_is_refused_at_the_users_line(ill, statement, says):
    with pytest.raises(lang.LangError) as caught:
        col_sum.trace(ill=ill)  # type: ignore[attr-defined]
    line = line_of(HERE, statement, after="def col_by_hand")
    assert (caught.value.file, caught.value.line) == (str(HERE), line), str(caught.value)
    assert says in str(caught.value)


def test_rule_8_refuses_a_column_reduction_of_one_page_at_the_users_line():
    """Every page reduced as if it were the band's first (row=0): the rows it would leave out as padding are not the
    tensor's, and rule 8 names the reduce's line."""
    with pytest.raises(SpatialError) as caught:
        col_sum(ill="skips")
    line = line_of(HERE, "# the reduce", after="def col_by_hand")
    assert f"{HERE}:{line}: site 0 compute:" in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("which", "statement", "says"),
    [
        ("row vector", "# of a row vector", "column reduction c of r_ring, a row vector (one value a row"),
        ("no read", "# of no read", "column reduction c: say the column's height in elements (rows=…)"),
        ("compute", "# as an elementwise op", "c folds columns into an accumulator: acc.reduce(…)"),
    ],
)
def test_a_column_reduction_of_a_row_vector_or_of_no_read_is_refused_at_its_line(which, statement, says):
    def bad(p: lang.Builder):
        x = p.input("x", 32, 32)
        a, r, c = p.ring("a", depth=2, tiles=2), p.ring("r_ring", depth=1, tiles=1), p.ring("c_ring", depth=1, tiles=2)
        p.read("read_x", x, a)
        p.reduce("r", "sum", a, r)
        if which == "row vector":
            p.col_reduce("c", "sum", r, c)  # of a row vector
        if which == "no read":
            p.col_reduce("c", "sum", c, r)  # of no read
        stage = p.col_reduce("c", "sum", a, c)
        p.place([[0]])

        @p.compute
        def compute(e: lang.Engine):
            e.compute(stage, a.wait(), c.reserve())  # as an elementwise op

    with pytest.raises(lang.LangError) as caught:
        lang.trace(bad)
    line = line_of(HERE, statement, after="def bad(p: lang.Builder):")
    assert caught.value.line == line and says in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("shape", "op", "precision", "form"),
    [
        ((40, 70), "sum", "bf16", "general"),
        ((40, 70), "mean", "bf16", "persistent"),
        ((100, 300), "absmax", "fp16", "general"),
        ((17, 33), "sumsq", "fp32", "persistent"),
        ((64, 48), "min", "bf16", "general"),
        ((130, 20), "max", "bf16", "persistent"),
    ],
)
def test_show_python_prints_a_column_program_as_source_that_traces_back(shape, op, precision, form, tmp_path, capsys):
    from spatialc.cli import main

    program = spatialc.build(spatialc.col_reduce(*shape, op, precision), "sm_90", sites=2, form=form)
    saved = tmp_path / "p.json"
    saved.write_text(spatialc.to_json(program))
    assert main(["show", "--python", str(saved)]) == 0
    source = capsys.readouterr().out
    assert "p.col_reduce(" in source and ".reduce(col_" in source and ", row=" in source
    module = types.ModuleType("shown")
    exec(compile(source, "shown.py", "exec"), module.__dict__)
    assert module.program() == program


def test_show_python_refuses_a_column_reduction_no_stage_declares():
    """A scheduled column reduction whose op differs from its stage's (what rule 8 refuses) has no form: acc.reduce
    makes what its stage declares."""
    from spatialc.ir.nodes import Engine
    from spatialc.ir.ops import ColReduce, Compute
    from spatialc.lang.source import python_source

    from ..rewrite import replace

    def to_max(op):
        if not (isinstance(op, Compute) and isinstance(op.op, ColReduce)):
            return None
        return (dataclasses.replace(op, op=dataclasses.replace(op.op, op="max")),)

    odd = replace(built("sum"), Engine.COMPUTE, to_max)
    with pytest.raises(lang.LangError, match="a column reduction no p.col_reduce stage declares has no form"):
        python_source(odd)

"""Programs that reduce columns (`spatialc.col_reduce`: x.sum(0), x.amax(0), dbias = dY.sum(0)): built, verified
(rule 8 proves each column band's row pages reduced exactly once, with the declared op, and its vector written at the
band's own columns), run exactly by the interpreter, equal to numpy, and refused where an edit makes them wrong.

Each planted fault is shown twice, as tests/passes/test_rows.py shows a row program's: rule 8 refuses it, naming what
is wrong, and the interpreter, running the edited program anyway, computes something other than the reference."""

from __future__ import annotations

import dataclasses
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.errors import PlanError, ProgramError, VerifyError
from spatialc.ir.ids import LV_ITEM_X, LV_K
from spatialc.ir.nodes import Engine, SpatialProgram
from spatialc.ir.ops import ColReduce, Compute, Loop, ReadTiles, TileAddr, WriteTiles, walk
from spatialc.numerics import reductions
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from ..rewrite import replace

R, C, W = Engine.READER, Engine.COMPUTE, Engine.WRITER
DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
NUMPY = {
    "sum": lambda v: v.sum(axis=0),
    "mean": lambda v: v.sum(axis=0) / v.shape[0],
    "max": lambda v: v.max(axis=0),
    "min": lambda v: v.min(axis=0),
    "absmax": lambda v: np.abs(v).max(axis=0),
    "sumsq": lambda v: (v * v).sum(axis=0),
}


def run(p: SpatialProgram, x: dict) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        return spatialc.evaluate(p, x)


def x_for(m: int, n: int, seed: int = 0, shift: float = 0.0) -> np.ndarray:
    return (3.0 * np.random.default_rng(seed).standard_normal((m, n)) + shift).astype(np.float32)


@pytest.mark.parametrize(
    "m, n, opts",
    [(100, 70, {}), (40, 200, {"block": (2, 1, 1), "sites": 3}), (1, 1, {}), (300, 33, {"block": (8, 2, 1)})],
)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "absmax", "sumsq"])
def test_a_column_reduction_verifies_and_the_interpreter_equals_the_reference_and_numpy(m, n, opts, op):
    """Negative inputs (shift −20): a max that took in a padding row's zero would be 0, not the column's max."""
    p = spatialc.build(spatialc.col_reduce(m, n, op, "bf16"), "sm_90", **opts)
    assert p.verified and p.output_tensor().elems == (1, n)
    x = x_for(m, n, shift=-20.0 if op in ("max", "sum") else 0.0)
    got = run(p, {"x": x})
    assert got.shape == (1, n) and got.dtype == np.float32
    assert np.array_equal(got, reference(p, {"x": x}))  # the interpreter is the reference, bit for bit
    v = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_allclose(got[0], NUMPY[op](v), rtol=2e-6, atol=1e-6)
    ok, _ = spatialc.tolerance(p, kernel=True).check(got, {"x": x})
    assert ok


def test_the_reductions_mean_the_row_reductions_of_the_transpose():
    x = np.random.default_rng(1).standard_normal((37, 5))
    for name in reductions.REDUCTIONS:
        got = reductions.reduce_cols(name, x, False)
        assert got.shape == (1, 5)
        assert np.array_equal(got, reductions.reduce_rows(name, x.T, False).T)
    value, err = reductions.reduce_cols_bound("sum", x, np.zeros(x.shape))
    assert value.shape == err.shape == (1, 5) and (err > 0).all()


def test_the_plan_bands_columns_the_whole_height():
    p = spatialc.build(spatialc.col_reduce(1000, 300, "sum", "fp16"), "sm_90", block=(4, 2, 1), sites=5)
    plan = p.plan
    assert (plan.block.ibw, plan.block.osw, plan.grid) == (4, 2, (1, 10))  # 19 tile columns in bands of 2
    assert plan.k_tiles == plan.block.osh == 64  # 63 tile rows, in whole pages of 4
    assert p.tensor(p.output_tensor().id).tiles == (1, 20)


def test_what_a_column_program_cannot_take_is_refused_in_one_line():
    with pytest.raises(ProgramError, match="a column reduction is one of sum, mean, max, min, absmax, sumsq"):
        spatialc.col_reduce(10, 10, "logsumexp")
    with pytest.raises(ProgramError, match="float arithmetic"):
        spatialc.col_reduce(10, 10, "sum", "int8")
    with pytest.raises(ProgramError, match="has no matmul"):
        spatialc.build(spatialc.col_reduce(10, 10), "sm_90", split_k=2)
    with pytest.raises(PlanError, match="must be ≥ 1"):
        spatialc.build(spatialc.col_reduce(10, 10), "sm_90", block=(0, 1, 1))


def test_a_saved_column_program_loads_verified_and_an_old_document_still_loads():
    p = spatialc.build(spatialc.col_reduce(40, 70, "max", "fp16"), "sm_90", sites=2)
    q = spatialc.from_json(spatialc.to_json(p))
    assert q == p and q.verified
    g = spatialc.build(spatialc.row_reduce(40, 70, "max", "fp16"), "sm_90")
    assert spatialc.from_json(spatialc.to_json(g)) == g


# ---- rule 8 against an attacker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cm() -> SpatialProgram:
    """the column max of 40 × 200 values: bands of one tile column, walked down 3 tile rows in pages of 1 (the last
    8 rows padding), 13 bands on 3 sites (an ITEM loop)."""
    return spatialc.build(spatialc.col_reduce(40, 200, "max", "bf16"), "sm_90", block=(1, 1, 1), sites=3)


def refused(p: SpatialProgram, *words: str, shift: float = -20.0) -> VerifyError:
    """Rule 8 (or an earlier rule) refuses `p`, naming `words`; and the interpreter, running it anyway, does not give
    the reference."""
    with pytest.raises(VerifyError) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    x = {"x": x_for(*p.tensors[0].elems, shift=shift)}
    assert not np.array_equal(run(p, x), reference(p, x))
    return info.value


def _k_loop(op) -> bool:
    return isinstance(op, Loop) and op.var == LV_K


def _without(at: TileAddr, var) -> TileAddr:
    return TileAddr(at.base, tuple((v, s) for v, s in at.steps if v != var))


def test_the_program_as_built_verifies(cm):
    assert verify(cm.evolve(verified=False)).verified


def test_a_row_page_skipped_is_refused(cm):
    """The reader and the reduction both stop a page short: every ring still balances, so only rule 8 tells that the
    last tile row of each column is never reduced."""
    short = cm
    for engine in (R, C):
        short = replace(
            short,
            engine,
            lambda op: (
                (dataclasses.replace(op, count=dataclasses.replace(op.count, n=op.count.n - 1)),)
                if _k_loop(op)
                else None
            ),
        )
    refused(short, "cover 2 tile rows of x's 3", shift=20.0)


def test_a_row_page_repeated_is_refused(cm):
    """Every page of the band is its first: read in bounds, the rings balanced, the ColReduce told the same rows."""

    def again(op):
        if isinstance(op, ReadTiles):
            return (dataclasses.replace(op, at=_without(op.at, LV_K)),)
        if isinstance(op, Compute) and isinstance(op.op, ColReduce):
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, at=_without(op.op.at, LV_K))),)
        return None

    refused(replace(replace(cm, R, again), C, again), "reduced twice", "exactly once", shift=20.0)


def test_a_reduction_told_other_rows_than_its_page_holds_is_refused(cm):
    """The reduction thinks every page is the first: the last page's padding rows would then count."""

    def first_rows(op):
        if isinstance(op, Compute) and isinstance(op.op, ColReduce):
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, at=_without(op.op.at, LV_K))),)
        return None

    refused(replace(cm, C, first_rows), "the padding rows it leaves out")


def test_a_bands_vector_written_at_another_bands_columns_is_refused(cm):
    def shifted(op):
        if isinstance(op, WriteTiles):
            return (dataclasses.replace(op, at=TileAddr(12, tuple((v, s) for v, s in op.at.steps if v != LV_ITEM_X))),)
        return None

    refused(replace(cm, W, shifted), "written at its own columns")


def test_a_max_reduced_as_a_sum_is_refused(cm):
    def summed(op):
        if isinstance(op, Compute) and isinstance(op.op, ColReduce):
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, op="sum")),)
        return None

    refused(replace(cm, C, summed), "declares a column max of 40 rows", "runs a column sum")


def test_a_reduction_of_fewer_rows_than_the_columns_hold_is_refused(cm):
    def short(op):
        if isinstance(op, Compute) and isinstance(op.op, ColReduce):
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, rows=39)),)
        return None

    refused(replace(cm, C, short), "runs a column max of 39", shift=20.0)


def test_a_site_without_a_band_verifies_and_one_that_writes_is_refused():
    """Two bands on three sites: the third site idle, and the program verifies. Its writer given a band's write is
    refused (by rule 2 here: its item coordinates name no item; rule 8 refuses any write of a site without a band)."""
    p = spatialc.build(spatialc.col_reduce(40, 200, "sum", "bf16"), "sm_90", block=(1, 8, 1), sites=3)
    assert dict(p.placement.items_of_site)[2] == () and p.verified
    store = next(op for q in p.schedule.programs if q.engine == W for op in walk(q.ops) if isinstance(op, WriteTiles))
    progs = tuple(
        dataclasses.replace(q, ops=(store,)) if q.engine == W and int(q.site) == 2 else q for q in p.schedule.programs
    )
    with pytest.raises(VerifyError, match="site 2 writer"):
        verify(p.evolve(schedule=dataclasses.replace(p.schedule, programs=progs), verified=False))


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_a_column_sum_of_fp16_or_float32_values_is_the_reference_and_numpys(precision):
    """float32 is the precision of programs with no matmul: a column program is one."""
    p = spatialc.build(spatialc.col_reduce(70, 40, "sum", precision), "sm_90", block=(2, 1, 1), sites=2)
    x = x_for(70, 40)
    got = run(p, {"x": x})
    assert np.array_equal(got, reference(p, {"x": x}))
    v = x.astype(np.float16 if precision == "fp16" else np.float32).astype(np.float64)
    np.testing.assert_allclose(got[0], v.sum(axis=0), rtol=2e-6, atol=1e-6)


def test_the_kernel_bound_says_where_a_columns_float32_sum_may_overflow():
    """Σx² of 100 values of 1e19 is 1e40: past float32's range in a kernel's float32 sum, said once by column; the
    interpreter's bound (an exact sum rounded once) says nothing."""
    p = spatialc.build(spatialc.col_reduce(100, 70, "sumsq", "fp32"), "sm_90")
    x = {"x": np.full((100, 70), 1e19, np.float32)}
    got = run(p, x)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert spatialc.tolerance(p, kernel=True).check(got, x)[0]
    assert any("70 of the 70 columns have a column sum" in str(w.message) for w in said)
    assert reductions.past_range_cols("sumsq", x["x"], 0.0).shape == (1, 70)


def test_random_edits_of_a_saved_column_program_are_refused_or_still_exact():
    """tests/mutants.py's edits of the saved document (ops swapped, dropped, repeated; counts, addresses and fields
    changed): each is refused by verify, or, accepted, still computes the reference (a run of 1,200 found no hole)."""
    from .. import mutants

    programs = {
        "col max": lambda: spatialc.build(
            spatialc.col_reduce(40, 200, "max", "bf16"), "sm_90", block=(1, 1, 1), sites=3
        ),
        "col mean": lambda: spatialc.build(spatialc.col_reduce(70, 50, "mean", "fp16"), "sm_90", block=(2, 2, 1)),
    }
    tally = mutants.run(edits_per_program=120, seed=3, programs=programs)
    assert tally.counts["hole"] == 0, tally.holes[:3]
    assert tally.counts["refused"] > 150  # the edits bite: most are refused

"""Programs that reduce rows (issue 31): softmax and RMSNorm as reads, row reductions and maps — built, verified
(rule 8 proves each reduction covers every column of its row exactly once, with the declared op, and each map reads
the vector of its own rows), run exactly by the interpreter, and refused where an edit makes them wrong.

Each planted fault below is shown twice: rule 8 refuses it, naming what is wrong, and the interpreter, which runs
the edited program anyway, computes something other than the reference — so the rule refuses what is wrong, and the
interpreter is not fooled by it either."""

from __future__ import annotations

import dataclasses
import math
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.errors import PlanError, ProgramError, VerifyError
from spatialc.ir.ids import LV_ITEM_Y, LV_K
from spatialc.ir.nodes import ComputeStage, Engine, SpatialProgram
from spatialc.ir.ops import AcquireAcc, Apply, Arg, Compute, Loop, Map, ReadTiles, RowArg, RowReduce, TileAddr, walk
from spatialc.lower.errors import Unsupported
from spatialc.numerics import elementwise, reductions
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from ..rewrite import edit, replace

R, C, W = Engine.READER, Engine.COMPUTE, Engine.WRITER


def inputs_for(p: SpatialProgram, seed: int = 0, scale: float = 3.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role.value == "input":
            out[t.name] = (scale * rng.standard_normal(t.elems)).astype(np.float32)
        elif t.role.value == "parameter":
            out[t.name] = rng.standard_normal(t.elems[1]).astype(np.float32)
    return out


def run(p: SpatialProgram, x: dict) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        return spatialc.evaluate(p, x)


def numpy_softmax(x: np.ndarray, dtype) -> np.ndarray:
    v = x.astype(dtype).astype(np.float64)
    e = np.exp(v - v.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def numpy_rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float, dtype) -> np.ndarray:
    v = x.astype(dtype).astype(np.float64)
    y = v / np.sqrt((v * v).mean(axis=1, keepdims=True) + eps)
    return y if w is None else y * w.astype(np.float64)


DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
SHAPES = [(40, 200, {"block": (1, 4, 1), "sites": 2}), (33, 50, {}), (1, 1, {}), (100, 1000, {"depth": 3})]


@pytest.mark.parametrize("m, n, opts", SHAPES)
@pytest.mark.parametrize("prec", ["bf16", "fp16"])
def test_softmax_verifies_and_the_interpreter_equals_the_reference_and_numpy(m, n, opts, prec):
    p = spatialc.build(spatialc.softmax(m, n, prec), "sm_90", **opts)
    assert p.verified
    x = inputs_for(p)
    c = run(p, x)
    assert c.shape == (m, n) and c.dtype == np.float32
    assert np.array_equal(c, reference(p, x))  # the interpreter is the reference, bit for bit
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    np.testing.assert_allclose(c, numpy_softmax(x["x"], DTYPES[prec]), rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(c.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("m, n, opts", SHAPES)
@pytest.mark.parametrize("weight", [True, False])
def test_rmsnorm_verifies_and_the_interpreter_equals_the_reference_and_numpy(m, n, opts, weight):
    p = spatialc.build(spatialc.rmsnorm(m, n, "bf16", eps=1e-5, weight=weight, out="bf16"), "sm_90", **opts)
    x = inputs_for(p)
    c = run(p, x)
    assert np.array_equal(c, reference(p, x))
    assert np.array_equal(c, c.astype(ml_dtypes.bfloat16).astype(c.dtype))  # bf16 values, as the output holds
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    want = numpy_rmsnorm(x["x"], x.get("weight"), 1e-5, ml_dtypes.bfloat16)
    np.testing.assert_allclose(c.astype(np.float64), want, rtol=2**-7, atol=1e-30)


def test_a_float32_sum_in_any_order_meets_the_kernel_bound_and_a_wrong_one_does_not():
    """The bound a kernel's result is held to: a row sum taken in float32 page by page, in another order, and the
    result a kernel would compute from it, pass; the same result one part in 10^3 off somewhere fails."""
    p = spatialc.build(spatialc.rmsnorm(64, 4000, "fp16", weight=False), "sm_90")
    x = inputs_for(p, scale=100.0)
    v = x["x"].astype(np.float16).astype(np.float32)
    rng = np.random.default_rng(1)
    order = rng.permutation(v.shape[1])
    sums = np.zeros((v.shape[0],), np.float32)
    for j in order:  # one float32 addition at a time, in an order of its own
        sums = (sums + v[:, j] * v[:, j]).astype(np.float32)
    scale = (1.0 / np.sqrt(sums.astype(np.float64) / 4000 + 1e-6)).astype(np.float32)
    kernel_like = (v * scale[:, None]).astype(np.float32)
    t = spatialc.tolerance(p, kernel=True)
    ok, how = t.check(kernel_like, x)
    assert ok, how
    bad = kernel_like.copy()
    bad[5, 17] *= 1 + 1e-3  # the sum's bound: about n · 2^-24 relative, 2.4e-4 here once through the rsqrt
    assert not t.check(bad, x)[0]


def test_the_reductions_are_their_definitions():
    x = np.array([[1.0, -3.0, 2.0], [0.5, 0.25, -0.125]])
    assert reductions.reduce_rows("max", x, False).tolist() == [[2.0], [0.5]]
    assert reductions.reduce_rows("min", x, False).tolist() == [[-3.0], [-0.125]]
    assert reductions.reduce_rows("absmax", x, False).tolist() == [[3.0], [0.5]]
    assert reductions.reduce_rows("sumsq", x, False).tolist() == [[14.0], [0.328125]]
    # A sum exactly rounded: 1 + 2^-30 − 1 is 2^-30, which a float32 sum in that order would lose.
    assert reductions.reduce_rows("sum", np.array([[1.0, 2.0**-30, -1.0]]), False).tolist() == [[2.0**-30]]
    assert np.isnan(reductions.reduce_rows("max", np.array([[1.0, np.nan]]), False)).all()
    assert reductions.reduce_rows("max", np.zeros((2, 0)), False).tolist() == [[-math.inf]] * 2
    with pytest.raises(elementwise.ElementwiseError, match="the reductions are max, min, sum, sumsq, absmax"):
        reductions.reduce_rows("mean", x, False)


def test_the_plan_bands_rows_and_fits_its_rings():
    p = spatialc.build(spatialc.softmax(4096, 4096, "bf16"), "sm_90")
    plan = p.plan
    assert plan.grid == (256, 1) and plan.k_tiles == 256 and plan.block.osw == plan.k_tiles
    forced = spatialc.build(spatialc.softmax(64, 300, "bf16"), "sm_90", block=(2, 4, 1))
    assert (forced.plan.block.osh, forced.plan.block.ibw, forced.plan.k_steps) == (2, 4, 5)


def test_what_a_row_program_cannot_take_is_refused_in_one_line():
    with pytest.raises(ProgramError, match="use fp16 or bf16"):
        spatialc.softmax(64, 64, "int8")
    with pytest.raises(ProgramError, match="eps is a finite number"):
        spatialc.rmsnorm(64, 64, eps=float("nan"))
    with pytest.raises(ProgramError, match="output is one of"):
        spatialc.softmax(64, 64, out="int32")
    base = spatialc.softmax(64, 64)
    for kwargs, words in (
        ({"split_k": 2}, "this program has no matmul"),
        ({"form": "sm90a"}, "general and the persistent forms only"),
        ({"block": (1, 1, 2)}, r"\(rows, columns, 1\) of tiles"),
    ):
        with pytest.raises(ProgramError, match=words):
            spatialc.build(base, "sm_90", **kwargs)
    with pytest.raises(PlanError, match="must be ≥ 1"):
        spatialc.build(base, "sm_90", block=(0, 2, 1))
    with pytest.raises(PlanError, match="force a smaller block or depth"):
        spatialc.build(base, "sm_90", block=(64, 64, 1))


def test_the_general_and_the_persistent_form_print_a_row_reduction():
    """(tests/lower/test_general_rows.py and test_persistent_pages.py run their kernels.)"""
    p = spatialc.build(spatialc.softmax(64, 64), "sm_90")
    assert spatialc.lower(p).budget.form == spatialc.lower(p, form="general").budget.form == "general"
    assert spatialc.lower(p, form="persistent").budget.form == "persistent"
    with pytest.raises(Unsupported, match="sm_90a only"):
        spatialc.lower(p, form="sm90a")


def test_a_saved_row_program_loads_verified():
    p = spatialc.build(spatialc.rmsnorm(40, 70, "fp16"), "sm_90", sites=2)
    q = spatialc.from_json(spatialc.to_json(p))
    assert q == p and q.verified


# ---- rule 8 against an attacker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sm() -> SpatialProgram:
    """softmax over 40 rows of 200 values (13 tiles a row, the last ragged): bands of one tile row read 4 tiles a
    page (4 pages a row, the last 3 tiles of padding), three bands on two sites (an ITEM loop)."""
    return spatialc.build(spatialc.softmax(40, 200, "bf16"), "sm_90", block=(1, 4, 1), sites=2)


def refused(p: SpatialProgram, *words: str, wrong: bool = True, shift: float = 0.0) -> VerifyError:
    """Rule 8 (or an earlier rule) refuses `p`, naming `words`; and the interpreter, running it anyway, does not
    give the reference (where `wrong`)."""
    with pytest.raises(VerifyError) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    if wrong:
        x = {k: v + shift if k == "x" else v for k, v in inputs_for(p).items()}
        assert not np.array_equal(run(p, x), reference(p, x))
    return info.value


def pass_of(ring_name: str, p: SpatialProgram):
    """A predicate: the K loop of the pass that reads (reader) or reduces (compute) `ring_name`."""
    ring = next(b.id for b in p.buffers if b.name == ring_name)

    def holds(op) -> bool:
        return (
            isinstance(op, Loop)
            and op.var == LV_K
            and any(
                (isinstance(x, ReadTiles) and x.into == ring)
                or (isinstance(x, Compute) and isinstance(x.op, RowReduce) and x.ins == (ring,))
                for x in walk(op.body)
            )
        )

    return holds


def test_the_schedules_reduction_op_other_than_its_stages_is_refused(sm):
    def summed(op):
        if isinstance(op, Compute) and isinstance(op.op, RowReduce) and op.op.op == "max":
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, op="sum")),)
        return None

    refused(replace(sm, C, summed), "schedule op row sum of 200 columns", "where stage row_max declares row max")


def test_a_reduction_that_masks_other_columns_than_the_rows_is_refused(sm):
    def narrow(op):
        if isinstance(op, Compute) and isinstance(op.op, RowReduce):
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, cols=190)),)
        return None

    refused(replace(sm, C, narrow), "where stage row_max declares row max of 200 columns")
    # The stage too: what the stages declare is then wrong about C's rows.
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(dataclasses.replace(s.kind.op, cols=190)))
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce)
        else s
        for s in sm.stages
    )
    said = "reduces rows of 190 values, but out's rows hold 200"
    refused(replace(sm.evolve(stages=stages), C, narrow), said, wrong=False)  # the reference refuses it too


def test_a_reduction_that_skips_its_last_page_is_refused(sm):
    """The reader and the reduction of the max's pass both stop a page short: every ring still balances, so only
    rule 8 can tell that tile columns 12 and up are never reduced."""
    short = sm
    for engine in (R, C):
        short = replace(
            short,
            engine,
            lambda op: (
                (dataclasses.replace(op, count=dataclasses.replace(op.count, n=op.count.n - 1)),)
                if pass_of("x0_ring", sm)(op)
                else None
            ),
        )
    refused(short, "row max reduces tile columns 0..11 (12 tiles) of the row", "need tile columns 0..12")


def test_a_reduction_that_reads_its_first_page_again_and_again_is_refused(sm):
    def again(op):
        if isinstance(op, ReadTiles) and op.into == ring:
            return (dataclasses.replace(op, at=_without(op.at, LV_K)),)
        if isinstance(op, Compute) and isinstance(op.op, RowReduce) and op.ins == (ring,):
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, at=_without(op.op.at, LV_K))),)
        return None

    ring = next(b.id for b in sm.buffers if b.name == "x0_ring")
    refused(
        replace(replace(sm, R, again), C, again), "row max reduces tile columns 0..3 (16 tiles)", "each exactly once"
    )


def test_a_reduction_told_other_columns_than_its_page_holds_is_refused(sm):
    def first_columns(op):
        if isinstance(op, Compute) and isinstance(op.op, RowReduce) and op.op.op == "max":
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, at=_without(op.op.at, LV_K))),)
        return None

    # Negative rows: the max of a page of padding (zeros) then shows in the interpreter's result.
    e = refused(replace(sm, C, first_columns), "maps x tile", "not its own", shift=-20.0)
    assert e.related  # the read whose tile it is, named


def test_a_reduction_of_another_bands_rows_is_refused(sm):
    """Every item's max is taken over band 0's rows: in bounds, the rings balanced — only rule 8 tells."""

    def band_zero(op):
        if isinstance(op, ReadTiles) and op.into == ring:
            return (dataclasses.replace(op, at=_without(op.at, LV_ITEM_Y)),)
        return None

    ring = next(b.id for b in sm.buffers if b.name == "x0_ring")
    refused(replace(sm, R, band_zero), "maps x tile (0, ", "not its own")


def test_an_accumulator_zeroed_at_every_page_is_refused(sm):
    """The max's accumulator acquired (zeroed) inside its pass's loop: the vector is the last page's max."""
    acc = next(b.id for b in sm.buffers if b.name == "row_max_acc")
    holds = pass_of("x0_ring", sm)

    def inside(ops):
        out = []
        for op in ops:
            if isinstance(op, Loop) and holds(op):
                out.append(dataclasses.replace(op, body=(AcquireAcc(acc), *op.body)))
            elif isinstance(op, Loop):
                out.append(dataclasses.replace(op, body=inside(op.body)))
            elif op != AcquireAcc(acc):
                out.append(op)
        return tuple(out)

    refused(edit(sm, C, inside), "row_max_acc was zeroed inside a loop that has ended")


def test_a_map_that_reads_a_row_vector_element_by_element_is_refused(sm):
    exps = Apply("exp", (Apply("sub", (Arg(0), Arg(1))),))  # x − max, the max read as a page of values

    def flat(s):
        if s.name == "exp":
            return dataclasses.replace(s, kind=ComputeStage(Map(exps)))
        return s

    refused(
        sm.evolve(stages=tuple(map(flat, sm.stages))), "reads row_max_ring, stage row_max's row vector", wrong=False
    )


def test_a_map_that_reads_the_other_reductions_vector_is_refused(sm):
    """normalise divides by the max instead of the sum — in the schedule only."""

    def crossed(op):
        if isinstance(op, Compute) and isinstance(op.op, Map) and len(op.ins) == 3:
            return (dataclasses.replace(op, ins=(op.ins[0], op.ins[1], op.ins[1])),)
        return None

    refused(replace(sm, C, crossed), wrong=False)  # a ring read twice: the flow rules refuse it first


def test_a_row_vector_read_as_rows_of_another_width_is_refused(sm):
    def wider(op):
        if isinstance(op, Compute) and isinstance(op.op, Map):
            return (dataclasses.replace(op, op=Map(_row_width(op.op.expr, 1))),)
        return None

    refused(replace(sm, C, wider), "row vector", wrong=False)


def _row_width(expr, width):
    if isinstance(expr, RowArg):
        return RowArg(expr.index, width)
    if isinstance(expr, Apply):
        return Apply(expr.op, tuple(_row_width(a, width) for a in expr.args), expr.params)
    return expr


def _without(at: TileAddr, var) -> TileAddr:
    return TileAddr(at.base, tuple((v, s) for v, s in at.steps if v != var))


def test_the_cli_checks_softmax_and_rmsnorm_and_prints_their_kernel(capsys, tmp_path):
    from spatialc.cli import main

    assert main(["softmax", "100", "300"]) == 0
    out = capsys.readouterr().out
    assert "plan      rows: bands of" in out and "check     interpreter vs numpy reference: OK" in out
    assert "kernel    general form: each engine on its own warps" in out
    saved = tmp_path / "rms.json"
    assert main(["rmsnorm", "64", "100", "--eps", "1e-5", "--no-weight", "--json", str(saved)]) == 0
    capsys.readouterr()
    assert main(["softmax", "64", "64", "--emit", str(tmp_path / "k")]) == 0
    assert "emitted" in capsys.readouterr().out and (tmp_path / "k" / "kernel.cu").exists()
    assert main(["softmax", "64", "64", "--precision", "int8"]) == 2
    assert "use fp16 or bf16" in capsys.readouterr().err


def test_the_example_builds_verifies_and_matches_numpy(capsys):
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).parents[2] / "examples" / "rows.py"), run_name="__main__")
    assert capsys.readouterr().out.count("verified, OK against its bound") == 5

"""The tolerance's bounds, computed fast, are the bounds computed before (issue 31, a large softmax's check).

The interval bound of each op, the row reductions' exact sums and the row program's stages were made faster — a point
box evaluated once, the wheres that change nothing skipped, a row summed by numpy where that sum is provably exact,
the stages LayerNorm's outputs share computed once. Nothing here may change a value: the functions as they were
before (kept below as the oracle, verbatim but for their names) give the same reference and the same bound, element
for element, on random inputs of several programs — maps, row programs, a GEMM epilogue — poles, zeros and
non-finite values among them."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import spatialc
from spatialc import ew
from spatialc.ir.ops import Apply, Arg, Col, Lit, RowArg
from spatialc.numerics import elementwise as E
from spatialc.numerics import epilogue, intervals, reductions, reference

# ---- the oracle: the functions as they were before ------------------------------------------------------------


def old_image(op, boxes, params, integer):
    f = op.i64 if integer else op.f64
    if op.name == "where":
        (clo, chi), (alo, ahi), (blo, bhi) = boxes
        sure = (clo > 0) | (chi < 0)
        never = (clo == 0) & (chi == 0)
        lo = np.where(sure, alo, np.where(never, blo, np.minimum(alo, blo)))
        hi = np.where(sure, ahi, np.where(never, bhi, np.maximum(ahi, bhi)))
        return lo, hi
    if op.comparison:
        holds, fails = intervals._decided(op.name, *boxes[0], *boxes[1])
        return np.where(holds, 1, 0), np.where(fails, 0, 1)
    if op.arity == 1:
        ((lo, hi),) = boxes
        points = [[lo], [hi]] + [[intervals._inside(t, lo, hi)] for t in op.turns]
    else:
        points = [[]]
        for lo, hi in boxes:
            points = [[*c, x] for c in points for x in (lo, hi)]
    with np.errstate(all="ignore"):
        values = [np.asarray(f(*p, *params)) for p in points]
    lo_v = hi_v = values[0]
    for v in values[1:]:
        lo_v, hi_v = np.minimum(lo_v, v), np.maximum(hi_v, v)
    if integer:
        return lo_v, hi_v
    unbounded = ~np.isfinite(lo_v) | ~np.isfinite(hi_v) | intervals._crosses_pole(op, boxes)
    return np.where(unbounded, -np.inf, lo_v), np.where(unbounded, np.inf, hi_v)


def old_bounded(expr, pages, col=None):
    match expr:
        case Arg(i):
            x, e = pages[i]
            return np.asarray(x, np.float64), np.asarray(e, np.float64)
        case RowArg(i):
            x, e = pages[i]
            return E.row_values(np.asarray(x, np.float64)), E.row_values(np.asarray(e, np.float64))
        case Lit(v):
            return np.float64(np.float32(v)), np.float64(0.0)
        case Col():
            return np.asarray(col(expr), np.float32).astype(np.float64), np.float64(0.0)
        case Apply(name, args, params):
            op = E.op_named(name)
            parts = [old_bounded(a, pages, col) for a in args]
            with np.errstate(all="ignore"):
                value = np.asarray(op.f64(*(x for x, _ in parts), *params))
                y = value.astype(np.float32).astype(np.float64)
                lo, hi = old_image(op, [(x - e, x + e) for x, e in parts], params, integer=False)
                spread = np.maximum(hi - y, y - lo)
                largest = max((np.abs(x) for x, _ in parts), key=lambda a: float(np.max(a, initial=0.0)))
                e = spread + (1 + op.ulps) * E.EPS32 * np.abs(y) + op.tail * (largest + spread)
                if not all(np.all(np.isfinite(x)) for x, _ in parts):  # (a rule added after: exact infinities)
                    e = intervals._exact_infinities(op, parts, value, y, e)
            if op.comparison:
                e = np.where(hi > lo, 1.0, 0.0)
            return y, np.where(np.isnan(e), np.inf, e)
    raise AssertionError(expr)


def old_reduce_rows(name, values, integer):
    r = reductions.reduction_named(name)
    x = np.asarray(values, np.int64 if integer else np.float64)
    if x.shape[1] == 0:
        out = np.full((x.shape[0], 1), r.identity)
        return out.astype(np.int64) if integer and math.isfinite(r.identity) else out
    y = r.pre(x)
    if r.combine == "max":
        out = np.max(y, axis=1, keepdims=True)
    elif r.combine == "min":
        out = np.min(y, axis=1, keepdims=True)
    elif integer:
        out = np.sum(y, axis=1, keepdims=True, dtype=np.int64)
    else:
        out = np.array([[reductions._exact_sum(row)] for row in y.tolist()]) if y.size else np.zeros((x.shape[0], 1))
    return out if integer else out.astype(np.float32)


def old_row_stages(p, decl, inputs, bounds=False, done=None):
    from spatialc.ir.index import ProgramIndex
    from spatialc.ir.nodes import ReadStage
    from spatialc.ir.ops import RowReduce

    index = ProgramIndex.of(p)
    col = reference.column_values(p, inputs)
    done = {}
    for stage in decl.producer.values():
        if isinstance(stage.kind, ReadStage):
            x = np.asarray(epilogue.start(reference.tensor_operand(p, stage.kind.tensor, inputs), False), np.float64)
            done[index.ring(stage.outs[0])] = (x, np.zeros(1))
    for stage in decl.chain:
        pages = [done[index.ring(b)] for b in stage.ins]
        op = stage.kind.op
        if isinstance(op, RowReduce):
            x, e = pages[0]
            value = reductions.reduce_rows(op.op, x, False)
            err = reductions.reduce_bound(op.op, x, e)[1] if bounds else None
        else:
            value = epilogue.mapped(op.expr, [x for x, _ in pages], False, col)
            err = intervals.bounded(op.expr, pages, reference._rows_of(col))[1] if bounds else None
        done[index.ring(stage.outs[0])] = (np.asarray(value, np.float64), err)
    return done[decl.last]


# ---- the programs and their inputs ------------------------------------------------------------------------------

x, g, z = ew.inputs(3)
PROGRAMS = {
    "softmax": lambda: spatialc.softmax(40, 200),
    "rmsnorm": lambda: spatialc.rmsnorm(33, 70),
    "layernorm": lambda: spatialc.layernorm(20, 90),
    "library ops": lambda: spatialc.elementwise(
        ew.gelu(x) * ew.exp(g) + ew.tanh(x) / ew.sigmoid(g) - ew.silu(x * ew.row("s")) + ew.col("b"), 37, 50, "fp16"
    ),
    "poles and domains": lambda: spatialc.elementwise(
        ew.sqrt(x) + ew.log(abs(g)) + ew.recip(x - g) + ew.rsqrt(x * g) + ew.pow(abs(x), g) + x / z, 30, 40, "bf16"
    ),
    "where and comparisons": lambda: spatialc.elementwise(
        ew.where(x > g, ew.clamp(x, lo=-1, hi=1), ew.leaky_relu(g, alpha=0.1)) + (x <= 0.5) + ew.eq(x, g), 25, 33
    ),
    "a gemm epilogue": lambda: spatialc.gemm(
        48, 40, 64, "bf16", epilogue=[spatialc.row_scale(), spatialc.activation("gelu_tanh"), spatialc.bias()]
    ),
}


def inputs_for(p, seed: int, wild: bool) -> dict[str, np.ndarray]:
    """Normal values times 3, a tenth exact zeros; `wild`: a few huge, tiny, infinite and NaN values too."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role.value in ("input", "parameter"):
            v = rng.standard_normal(t.elems) * 3
            v[rng.random(t.elems) < 0.1] = 0.0
            if wild:
                for value in (1e30, -3e38, 1e-40, np.inf, -np.inf, np.nan):
                    v[tuple(rng.integers(0, s) for s in t.elems)] = value
            out[t.name] = v.astype(np.float32)
    return out


def both(p, inputs, monkeypatch) -> tuple[Any, Any]:
    tol = spatialc.tolerance(spatialc.build(p, "sm_90"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new = tol._against(inputs)
        with monkeypatch.context() as m:
            m.setattr(intervals, "bounded", old_bounded)
            m.setattr(intervals, "image", old_image)
            m.setattr(reductions, "reduce_rows", old_reduce_rows)
            m.setattr(reference, "row_stages", old_row_stages)
            old = tol._against(inputs)
    return new, old


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("wild", [False, True], ids=["normal", "wild"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_reference_and_the_bound_are_those_computed_before(name, wild, monkeypatch):
    p = PROGRAMS[name]()
    for seed in range(3):
        (ref, bound), (old_ref, old_bound) = both(p, inputs_for(p, seed, wild), monkeypatch)
        assert same(ref, old_ref), (name, seed)
        assert same(bound, old_bound), (name, seed)


def test_the_oracle_is_not_the_code_under_test(monkeypatch):
    """The comparison above can fail: the oracle's bound, made one rounding looser, is told apart."""

    def looser(expr, pages, col=None, memo=None):
        y, e = old_bounded(expr, pages, col)
        return y, e + E.EPS32 * np.abs(y)

    p = PROGRAMS["softmax"]()
    tol = spatialc.tolerance(spatialc.build(p, "sm_90"))
    vals = inputs_for(p, 0, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new = tol.bound(vals)
        with monkeypatch.context() as m:
            m.setattr(intervals, "bounded", looser)
            assert not same(new, tol.bound(vals))


# ---- the exact row sum -----------------------------------------------------------------------------------------


def rows_to_sum(rng) -> np.ndarray:
    """Rows numpy's sum adds exactly and rows it does not: float32 values of one scale and of scales 2^100 apart,
    cancelling pairs, subnormals, a row of zeros and of negative zeros, values past float32, NaN and infinities."""
    n = 64
    rows = [
        rng.standard_normal(n).astype(np.float32),
        (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32),
        np.r_[np.float32(2.0**100), np.float32(1.0), -np.float32(2.0**100), np.ones(n - 3, np.float32)],
        (rng.integers(1, 2**10, n) * 2.0**-149).astype(np.float32),  # subnormal float32 values
        np.zeros(n, np.float32),
        np.full(n, -0.0, np.float32),
        np.r_[np.float32(3e38), np.float32(3e38), np.zeros(n - 2, np.float32)],
        np.r_[np.float32(np.nan), np.ones(n - 1, np.float32)],
        np.r_[np.float32(np.inf), np.float32(-np.inf), np.ones(n - 2, np.float32)],
    ]
    x = np.stack(rows + [np.zeros(n)]).astype(np.float64)
    x[-1, :5] = [1e-310, -1e-315, 2.5e-320, 1.0, 1e300]  # float64 subnormals beside 1 and 2^997
    x[1, 5] += 2.0**-40  # a value that is no float32: its row summed by fsum
    return x


@pytest.mark.parametrize("name", ["sum", "sumsq"])
def test_the_exact_row_sum_is_fsums_on_every_kind_of_row(name, monkeypatch):
    x = rows_to_sum(np.random.default_rng(0))
    with np.errstate(all="ignore"):
        want = old_reduce_rows(name, x, False)
    slow: list[int] = []
    with monkeypatch.context() as m:  # which rows fsum adds: those the float64 sum's error bound leaves open
        m.setattr(reductions, "_exact_sum", lambda row, fsum=reductions._exact_sum: slow.append(len(row)) or fsum(row))
        got = reductions.reduce_rows(name, x, False)
    # by fsum: the rows with a NaN or infinities, a zero or float32-overflowing result, 2^100's cancellation (sum),
    # subnormals squared to zero (sumsq); the two rows of ordinary values are decided by the bound
    assert len(slow) == (7 if name == "sum" else 8)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    rng = np.random.default_rng(1)
    for width in (1, 2, 7, 300, 5000):  # rows of one scale each, of many scales, and cancelling ones
        scale = np.exp2(rng.integers(-30, 30, (6, 1)) + rng.integers(-20, 20, (6, width)) * (rng.random((6, 1)) < 0.5))
        y = (rng.standard_normal((6, width)) * scale).astype(np.float32)
        y[0] = np.r_[y[0, : (width + 1) // 2], -y[0, : width // 2]][:width]
        with np.errstate(all="ignore"):
            assert np.array_equal(reductions.reduce_rows(name, y, False), old_reduce_rows(name, y, False)), width


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(1, 40)),
        elements=st.floats(-1e300, 1e300, allow_nan=False, allow_subnormal=True)
        | st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0**-1074, 2.0**100]),
    )
)
def test_the_exact_row_sum_is_fsums_on_any_finite_float64_values(values):
    with np.errstate(all="ignore"):  # (a sum past float32's range is inf, as fsum's rounded to float32 is)
        want = np.array([[math.fsum(row)] for row in values.tolist()]).astype(np.float32)
        got = reductions.reduce_rows("sum", values, False)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))

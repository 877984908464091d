"""Row programs of several outputs of pages, or none: fused add + RMSNorm (`rmsnorm(residual=True)`: out and
residual_out) whose last pass shares h = x + residual between its two maps, and `row_reduce` (an m × 1 vector alone).
The schedule reads what it must and no more; verify refuses a shared page popped before its last reader, or a map
reading another ring than its stage's."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.errors import ProgramError, SpatialError
from spatialc.ir.ids import LV_K
from spatialc.ir.nodes import DType, TensorRole
from spatialc.ir.ops import Apply, Arg, Compute, Loop, Map, Pop, Precision, ReadTiles, RowArg, walk
from spatialc.passes.verify import verify
from spatialc.rows import _Builder


def fused(**kw):
    return spatialc.build(spatialc.rmsnorm(40, 70, residual=True, **kw), block=(1, 2, 1), sites=2)


def engine(p, name):
    return next(q for q in p.schedule.programs if q.engine.value == name)


def k_loops(ops):
    return [op for op in walk(ops) if isinstance(op, Loop) and op.var == LV_K]


def test_the_last_pass_reads_x_and_residual_once_and_adds_them_once():
    p = fused()
    reads = [sum(isinstance(op, ReadTiles) for op in loop.body) for loop in k_loops(engine(p, "reader").ops)]
    assert reads == [2, 2]  # x and residual for the sum of squares, then once more for both outputs
    last = k_loops(engine(p, "compute").ops)[-1]
    adds = [op for op in last.body if isinstance(op, Compute) and op.op == Map(Apply("add", (Arg(0), Arg(1))))]
    assert len(adds) == 1
    writes = k_loops(engine(p, "writer").ops)
    assert len(writes) == 1 and sum(op.__class__.__name__ == "WriteTiles" for op in writes[0].body) == 2


def test_fused_add_rmsnorm_is_the_sum_normalised_and_the_sum():
    p = fused(eps=1e-5)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 70)).astype(np.float32)
    r = rng.standard_normal((40, 70)).astype(np.float32)
    w = rng.standard_normal(70).astype(np.float32)
    xb, rb = x.astype(ml_dtypes.bfloat16), r.astype(ml_dtypes.bfloat16)
    got = spatialc.evaluate(p, {"x": xb, "residual": rb, "weight": w})
    h = xb.astype(np.float64) + rb.astype(np.float64)
    want = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got["out"], want, rtol=2e-5, atol=1e-5)
    # stored in x's type: bf16 values (given as float32 arrays, as every bf16 output is)
    np.testing.assert_array_equal(
        got["residual_out"], h.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    )


def _mutated(p, f):
    programs = tuple(
        dataclasses.replace(q, ops=f(q.ops)) if q.engine.value == "compute" else q for q in p.schedule.programs
    )
    return p.evolve(schedule=dataclasses.replace(p.schedule, programs=programs))


def _in_last_pass(ops, f):
    """`ops` with the body of the compute engine's last K loop rewritten by `f`."""
    last = k_loops(ops)[-1]

    def go(ops):
        out = []
        for op in ops:
            if op is last:
                op = dataclasses.replace(op, body=tuple(f(list(op.body))))
            elif isinstance(op, Loop):
                op = dataclasses.replace(op, body=go(op.body))
            out.append(op)
        return tuple(out)

    return go(ops)


def test_a_shared_page_popped_before_its_last_reader_is_refused():
    p = fused()
    h = next(b.id for b in p.buffers if b.name == "add1_ring")

    def early(body):
        body = [op for op in body if not (isinstance(op, Pop) and op.buf == h)]
        first = next(i for i, op in enumerate(body) if isinstance(op, Compute) and h in op.ins)
        return [*body[: first + 1], Pop(h), *body[first + 1 :]]

    with pytest.raises(SpatialError, match="reads a page of add1_ring it has not waited for"):
        verify(_mutated(p, lambda ops: _in_last_pass(ops, early)))


def test_the_copy_of_another_ring_is_refused():
    """residual_out's copy map reading x's page (popped already) rather than x + residual's."""
    p = fused()
    names = {b.name: b.id for b in p.buffers}

    def of_x(body):
        copy = names["residual_copy_ring"]
        return [
            dataclasses.replace(op, ins=(names["x1_ring"],)) if isinstance(op, Compute) and op.outs == (copy,) else op
            for op in body
        ]

    with pytest.raises(SpatialError):
        verify(_mutated(p, lambda ops: _in_last_pass(ops, of_x)))


def test_a_ring_shared_by_a_reduction_and_a_map_of_the_last_pass_is_refused():
    """The sum of squares and the output's map reading one ring: two passes cannot share its pages."""
    b = _Builder(33, 50, Precision.BF16)
    x = b.tensor("x", TensorRole.INPUT, (33, 50), DType.BF16)
    y = b.tensor("out", TensorRole.OUTPUT, (33, 50), DType.FLOAT32)
    ring = b.read(x, "x0")
    total = b.reduce("row_sum", "sum", ring)
    b.write(b.map("shift", Apply("sub", (Arg(0), RowArg(1))), (ring, total)), y)
    with pytest.raises(ProgramError, match="feeds stages row_sum and shift; .* but maps of the last pass"):
        spatialc.build(b.program("shared", "sm_90"))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "absmax", "sumsq"])
def test_a_row_reduction_writes_one_value_a_row_and_nothing_else(op):
    p = spatialc.build(spatialc.row_reduce(40, 70, op), block=(1, 2, 1), sites=2)
    assert [t.elems for t in p.tensors if t.role == TensorRole.OUTPUT] == [(40, 1)]
    assert len(k_loops(engine(p, "reader").ops)) == 1 and not k_loops(engine(p, "writer").ops)
    x = np.random.default_rng(2).standard_normal((40, 70)).astype(np.float32)
    x[3, 5] = -40.0  # absmax and max differ; min is it
    xb = x.astype(ml_dtypes.bfloat16)
    v = xb.astype(np.float64)
    want = {
        "sum": v.sum(1),
        "mean": v.sum(1) / 70,
        "max": v.max(1),
        "min": v.min(1),
        "absmax": np.abs(v).max(1),
        "sumsq": (v * v).sum(1),
    }[op]
    got = spatialc.evaluate(p, {"x": xb})
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-6, atol=1e-6)


def test_an_unknown_row_reduction_is_refused_in_words():
    with pytest.raises(
        ProgramError, match="a row reduction is one of sum, mean, max, min, absmax, sumsq, logsumexp, not .avg."
    ):
        spatialc.row_reduce(4, 16, "avg")


def test_a_map_of_row_vectors_and_a_column_vector_alone_is_refused_in_words():
    """Σx · w[col] reads no page of values: it was taken for a row vector and written as one (an (m, n) output laid
    out as m × 1: rule 1's tile grid), or failed rule 4's page bounds; row_shape says what is missing."""
    from spatialc.ir.ops import Col

    b = _Builder(33, 50, Precision.BF16)
    x = b.tensor("x", TensorRole.INPUT, (33, 50), DType.BF16)
    w = b.tensor("w", TensorRole.PARAMETER, (1, 50), DType.FLOAT32)
    y = b.tensor("out", TensorRole.OUTPUT, (33, 50), DType.FLOAT32)
    total = b.reduce("row_sum", "sum", b.read(x, "x0"))
    b.write(b.map("bcast", Apply("mul", (RowArg(0), Col(w))), (total,)), y)
    with pytest.raises(ProgramError, match="map stage bcast reads row vectors and a column vector but no page"):
        spatialc.build(b.program("bcast", "sm_90"))

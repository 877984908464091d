"""The interpreter runs an attention program's schedule — the online recurrence, op by op — and its O and LSE equal
the declared function's (`numerics.attention.softmax_attention`, the reference) within the stated bound; a schedule
with a planted fault does not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spatialc
from spatialc.inputs import InputError
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import Compute, Map, MatmulTiles, RowArg, ScaleAcc
from spatialc.numerics.reference import reference
from spatialc.numerics.tolerance import tolerance
from spatialc.passes.attention import apply_attention_plan, place_attention, plan_attention, schedule_attention
from spatialc.target import target
from tests.rewrite import replace

from .qkv import inputs


def scheduled(*shape: int, block: tuple[int, int] | None = None, **kw) -> spatialc.ir.nodes.SpatialProgram:
    """The attention program planned, placed and scheduled — not verified: the interpreter runs what the ops say, and
    the tests below plant faults no verifier would pass."""
    t = target("sm_90")
    p = spatialc.attention(*shape, **kw).evolve(target=t.name)
    return schedule_attention(place_attention(apply_attention_plan(p, plan_attention(p, t, block, None)), t))


CASES = [
    # (batch, heads, seq_q, seq_kv, head_dim), options, forced block (query tile rows, key tile rows)
    ((1, 2, 40, 72, 32), {"causal": True}, None),
    ((1, 2, 40, 72, 64), {"out": "bf16"}, None),
    ((2, 4, 40, 72, 32), {"kv_heads": 2, "causal": True, "precision": "fp16"}, None),
    ((1, 4, 40, 72, 64), {"kv_heads": 1, "precision": "fp16", "out": "fp16"}, (2, 1)),
    ((1, 1, 64, 64, 32), {"causal": True}, (1, 1)),
    ((2, 2, 17, 50, 24), {"kv_heads": 1, "causal": True, "scale": 0.3}, (2, 3)),
]


@pytest.mark.parametrize(("shape", "options", "block"), CASES)
def test_the_interpreter_equals_the_reference_within_the_bound(shape, options, block):
    p = scheduled(*shape, block=block, **options)
    given = inputs(*shape, options.get("kv_heads"))
    out = spatialc.evaluate(p, given)
    ref = reference(p, given)
    b, h, sq, _, d = shape
    assert set(out) == {"o", "lse"}
    assert out["o"].shape == ((b * h, sq, d) if b * h > 1 else (sq, d))
    assert out["lse"].shape == ((b * h, sq, 1) if b * h > 1 else (sq, 1))
    assert out["o"].dtype == (np.float16 if options.get("out") == "fp16" else np.float32)
    assert out["lse"].dtype == np.float32
    ok, how = tolerance(p).check(out, given)
    assert ok, how
    # The bound is no formality: O's error is P's rounding to the operand type, a good part of what it allows.
    bound = tolerance(p).bound(given)
    used = np.max(np.abs(out["o"].astype(np.float64) - ref["o"]) / bound["o"])
    assert 0.05 < used <= 1.0
    kernel = tolerance(p, kernel=True).bound(given)  # a kernel's float32 sums: a looser bound, never a tighter one
    assert all(np.all(kernel[n] >= bound[n]) for n in bound)


def test_four_dimensional_and_grouped_inputs_are_the_same_program():
    shape = (2, 2, 40, 72, 32)
    p = scheduled(*shape, kv_heads=1, causal=True)
    given = inputs(*shape, kv_heads=1)
    grouped = {name: x.reshape(-1, *x.shape[2:]) for name, x in given.items()}
    a, b = spatialc.evaluate(p, given), spatialc.evaluate(p, grouped)
    assert all(np.array_equal(a[n], b[n]) for n in ("o", "lse"))
    with pytest.raises(InputError, match=r"\(batch, heads, 40, 32\) with batch·heads = 4"):
        spatialc.evaluate(p, {**given, "q": given["q"].reshape(4, 1, 1, 40, 32)})


def test_one_head_takes_its_arrays_with_or_without_the_leading_axes():
    p = scheduled(1, 1, 40, 72, 32)
    given = inputs(1, 1, 40, 72, 32)
    a = spatialc.evaluate(p, given)
    b = spatialc.evaluate(p, {name: x[0, 0] for name, x in given.items()})
    assert np.array_equal(a["o"], b["o"]) and a["o"].shape == (40, 32)


def test_masked_scores_leave_no_trace():
    """A causal row reads only its keys: changing a key past the diagonal (and V's row of it) changes nothing."""
    shape = (1, 1, 40, 72, 32)
    p = scheduled(*shape, causal=True)
    given = inputs(*shape)
    later = {n: x.copy() for n, x in given.items()}
    later["k"][0, 0, 71] = 50.0  # key 71 is kept for query row 39 only (71 ≤ 39 + 32)
    later["v"][0, 0, 71] = -50.0
    a, b = spatialc.evaluate(p, given), spatialc.evaluate(p, later)
    assert np.array_equal(a["o"][:39], b["o"][:39]) and np.array_equal(a["lse"][:39], b["lse"][:39])
    assert not np.allclose(a["o"][39], b["o"][39])


def _compute_ops(p):
    """The first site's compute program, op by op."""
    return list(spatialc.ir.ops.walk(next(q for q in p.schedule.programs if q.engine == Engine.COMPUTE).ops))


def _named(p, name):
    return next(b.id for b in p.buffers if b.name == name)


def _without_rescale_of(name):
    def fault(p):
        acc = _named(p, name)
        rescale = lambda op: isinstance(op, Compute) and op == Compute(ScaleAcc(), op.ins, acc=acc)  # noqa: E731
        return replace(p, Engine.COMPUTE, lambda op: () if rescale(op) else None)

    fault.__name__ = f"no_rescale_of_{name}"
    return fault


def _stale_max_in_p(p):
    """P = exp(X − m_old): the max before this block's, in place of the max after it."""
    pp, m_old, m_new = _named(p, "p_ring"), _named(p, "m_old_ring"), _named(p, "m_new_ring")
    pop_old = spatialc.ir.ops.Pop(m_old)  # m_old stays published until P has read it: its Pop moves after P's

    def f(op):
        if isinstance(op, Compute) and op.outs == (pp,):
            return (dataclasses.replace(op, ins=(op.ins[0], m_old)),)
        if op == pop_old:
            return ()
        if op == spatialc.ir.ops.Pop(m_new):
            return (op, pop_old)
        return None

    return replace(p, Engine.COMPUTE, f)


def _v_of_another_head(p):
    """Every query head's P·V reads the first KV head's V, while its S reads its own head's K."""
    reads = [op for q in p.schedule.programs if q.engine == Engine.READER for op in spatialc.ir.ops.walk(q.ops)]
    tv = next(op for op in reads if isinstance(op, spatialc.ir.ops.ReadTiles) and op.into == _named(p, "v_ring"))
    steps = tuple(step for step in tv.at.steps if step[0] != spatialc.ir.ids.LV_ITEM_X)
    first = dataclasses.replace(tv, at=dataclasses.replace(tv.at, steps=steps))
    return replace(p, Engine.READER, lambda op: (first,) if op == tv else None)


@pytest.mark.parametrize(
    "fault", [_without_rescale_of("o_acc"), _without_rescale_of("l_acc"), _stale_max_in_p, _v_of_another_head]
)
def test_a_planted_fault_in_the_schedule_makes_the_result_differ(fault):
    """The interpreter is trusted because it fails here: each fault is one the recurrence must not have."""
    shape = (1, 2, 40, 72, 32)
    p = scheduled(*shape, block=(1, 1), causal=True)
    given = inputs(*shape)
    assert tolerance(p).check(spatialc.evaluate(p, given), given)[0]
    bad = fault(p)
    assert bad != p
    ok, _ = tolerance(p).check(spatialc.evaluate(bad, given), given)
    assert not ok


def test_the_schedule_holds_what_the_faults_take_out():
    p = scheduled(1, 2, 40, 72, 32)
    ops = _compute_ops(p)
    assert sum(isinstance(op, Compute) and isinstance(op.op, ScaleAcc) for op in ops) == 2
    assert any(isinstance(op, Compute) and isinstance(op.op, MatmulTiles) and op.op.transpose_b for op in ops)
    assert any(isinstance(op, Compute) and isinstance(op.op, Map) and RowArg(1, 4) in _leaves(op.op.expr) for op in ops)


def _leaves(expr):
    args = getattr(expr, "args", None)
    return [expr] if args is None else [leaf for a in args for leaf in _leaves(a)]


def test_a_sample_of_rows_is_refused_by_name():
    p = scheduled(1, 1, 40, 72, 32)
    with pytest.raises(spatialc.ProgramError, match="is attention"):
        spatialc.evaluate(p, inputs(1, 1, 40, 72, 32), rows=[0, 1])


def test_the_recorded_run_is_the_same_run():
    p = scheduled(1, 2, 40, 72, 32, causal=True)
    given = inputs(1, 2, 40, 72, 32)
    out, trace = spatialc.evaluate(p, given, trace=True)
    assert trace.spans and all(np.array_equal(out[n], spatialc.evaluate(p, given)[n]) for n in out)


def test_scores_past_float32s_range_are_said_and_counted_in_the_check(monkeypatch):
    """bf16 holds float32's exponents, so Q and K of 2^64 make scores past float32's range: the interpreter, holding
    S in float32 as a kernel does, gives NaN where the float64 reference is finite. The check failed saying
    "max |error| 0" for both outputs (the max left the NaN errors out) and nothing of the range; now it counts them,
    says where the bound does not hold, and a RangeWarning says so once (as a GEMM kernel's sums past the range)."""
    from spatialc.numerics import tolerance as accuracy

    monkeypatch.setattr(accuracy, "_RANGE_WARNED", [])
    p = scheduled(1, 1, 16, 16, 16)
    given = {**inputs(1, 1, 16, 16, 16), "q": np.full((16, 16), 2.0**64), "k": np.full((16, 16), 2.0**64)}
    out = spatialc.evaluate(p, given)
    assert np.isnan(out["o"]).all() and np.isfinite(reference(p, given)["o"]).all()
    with pytest.warns(accuracy.RangeWarning, match=r"16 of the 16 query rows have \|Q\|·\|K\|ᵀ.* first at LSE\[0\]"):
        ok, how = tolerance(p).check(out, given)
    assert not ok
    assert "o: max |error| 0; 256 of 256 elements NaN where the reference is not; 256 of the elements outside" in how
    assert "lse: max |error| 0; 16 of 16 elements NaN where the reference is not; 16 of the elements outside" in how
    with pytest.raises(InputError, match=r"query rows .* \(strict: scale the inputs down\)$"):
        spatialc.tolerance(p, strict=True).check(out, given)


def test_the_reference_and_the_bound_hold_a_piece_of_the_scores_at_a_time(monkeypatch):
    """The check held every head's seq_q × seq_kv scores at once, in four or five float64 arrays: 8 GiB for
    `spatialc attention 1 16 4096 4096 128`, whose default full check the CLI counts at under 2 GiB (its ledger
    counts O's size), 18 GiB at 6144. Now a piece of rows at a time (`numerics.attention.pieces`), the same values."""
    import tracemalloc

    from spatialc.numerics import attention

    shape = (1, 2, 400, 512, 16)
    p = scheduled(*shape, kv_heads=1, causal=True)
    given = inputs(*shape, kv_heads=1)
    whole = tolerance(p, kernel=True).against(given)
    monkeypatch.setattr(attention, "SCORES_AT_ONCE", 1 << 13, raising=False)  # a piece: 16 rows of one head
    tracemalloc.start()
    try:
        pieced = tolerance(p, kernel=True).against(given)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for i in (0, 1):  # (the reference and the bound; the sums' order may differ with the shapes BLAS is given)
        assert all(np.allclose(whole[i][n], pieced[i][n], rtol=1e-12, atol=0) for n in ("o", "lse"))
    assert peak < 400 * 512 * 8  # less than one head's scores in one float64 array

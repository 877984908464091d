"""The identity rule 8 rests on (docs/verification.md, "Attention"): the online recurrence — block by block, in order,
each block once, m and l from −∞ and 0, the same m′ in P and in α, O = acc / l and LSE = m + log l at the end — equals
softmax attention computed directly, whatever the shapes, the blocks, the mask and the grouping of heads."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from spatialc.numerics.attention import keep, online_attention, softmax_attention


@st.composite
def problems(draw):
    """Random Q, K, V (float64, any values), a scale, a mask and the blocks the keys are cut into."""
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    seq_kv = draw(st.integers(1, 40))
    causal = draw(st.booleans())
    seq_q = draw(st.integers(1, seq_kv if causal else 40))  # causal: every query row keeps a key
    dim = draw(st.integers(1, 9))
    cuts = draw(st.sets(st.integers(1, seq_kv - 1), max_size=6)) if seq_kv > 1 else set()
    seed = draw(st.integers(0, 2**32 - 1))
    spread = draw(st.sampled_from([0.1, 1.0, 8.0, 30.0]))  # 30: scores far apart, exp(s − m) underflows for most
    rng = np.random.default_rng(seed)
    q = spread * rng.standard_normal((kv_heads * group, seq_q, dim))
    k = rng.standard_normal((kv_heads, seq_kv, dim))
    v = rng.standard_normal((kv_heads, seq_kv, dim))
    scale = draw(st.floats(0.05, 2.0))
    return q, k, v, scale, causal, group, (0, *sorted(cuts), seq_kv)


@settings(max_examples=300, deadline=None)
@given(problems())
def test_the_recurrence_equals_softmax_attention(problem):
    q, k, v, scale, causal, group, bounds = problem
    o, lse = online_attention(q, k, v, scale, causal, group, bounds=bounds)
    o_ref, lse_ref = softmax_attention(q, k, v, scale, causal, group)
    # Equal as real numbers (the argument of docs/verification.md); in float64 each within a few units of rounding.
    assert np.allclose(o, o_ref, rtol=1e-12, atol=1e-12 * np.abs(v).max())
    assert np.allclose(lse, lse_ref, rtol=1e-13, atol=1e-13)


def test_the_recurrence_without_a_rescale_is_not_softmax_attention():
    """The property test can fail: leave α out of acc′ and the blocks' weights no longer agree."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 8, 4)) * s for s in (4.0, 1.0, 1.0))
    o_ref, _ = softmax_attention(q, k, v, 1.0)
    s = 1.0 * q @ k.transpose(0, 2, 1)
    m = np.full((1, 8, 1), -np.inf)
    l, acc = np.zeros((1, 8, 1)), np.zeros((1, 8, 4))  # noqa: E741
    for lo, hi in ((0, 3), (3, 8)):
        m_new = np.maximum(m, s[:, :, lo:hi].max(axis=2, keepdims=True))
        p = np.exp(s[:, :, lo:hi] - m_new)
        l, acc, m = np.exp(m - m_new) * l + p.sum(axis=2, keepdims=True), acc + p @ v[:, lo:hi], m_new  # noqa: E741
    assert not np.allclose(acc / l, o_ref, rtol=1e-6)


def test_the_mask_is_aligned_bottom_right():
    assert keep(2, 4, True).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert keep(3, 3, False).all()


def test_a_query_head_reads_its_groups_kv_head():
    """Head h of a grouped-query attention reads KV head h // group: each head's result is the one-head attention of
    its own KV head, computed apart."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((6, 5, 3))
    k, v = rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 7, 3))
    o, lse = softmax_attention(q, k, v, 0.5, True, group=3)
    for h in range(6):
        alone = softmax_attention(q[h : h + 1], k[h // 3 : h // 3 + 1], v[h // 3 : h // 3 + 1], 0.5, True)
        assert np.array_equal(o[h], alone[0][0]) and np.array_equal(lse[h], alone[1][0])


def test_the_reference_is_the_formula_written_out():
    """One row by hand with math: softmax(scale · q·Kᵀ over the kept keys) · V and log Σ exp."""
    import math

    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((1, 3, 2)), rng.standard_normal((1, 5, 2)), rng.standard_normal((1, 5, 2))
    o, lse = softmax_attention(q, k, v, 0.7, True)
    r = 0  # query row 0 keeps keys c ≤ 0 + 5 − 3 = 2
    s = [0.7 * sum(q[0, r, j] * k[0, c, j] for j in range(2)) for c in range(3)]
    total = sum(math.exp(x) for x in s)
    expect = [sum(math.exp(s[c]) * v[0, c, j] for c in range(3)) / total for j in range(2)]
    assert np.allclose(o[0, r], expect, rtol=1e-14) and math.isclose(lse[0, r, 0], math.log(total), rel_tol=1e-14)

"""Attention inputs the tests share: Q, K and V drawn so that the running max moves between KV blocks."""

from __future__ import annotations

import numpy as np


def inputs(batch: int, heads: int, seq_q: int, seq_kv: int, dim: int, kv_heads: int | None = None, seed: int = 0):
    """Q, K and V as (batch, heads, seq, dim) arrays, their scores spread enough that the running max moves between
    blocks."""
    rng = np.random.default_rng(seed)
    kvh = heads if kv_heads is None else kv_heads
    return {
        "q": 2 * rng.standard_normal((batch, heads, seq_q, dim)),
        "k": rng.standard_normal((batch, kvh, seq_kv, dim)),
        "v": rng.standard_normal((batch, kvh, seq_kv, dim)),
    }

"""Attention on the CPU: the reference interpreter at (4 heads, 2048, 128) against numpy computing softmax attention
directly, and build + verify (rules 1–8) at seq 16384, head_dim 128.

numpy computes O = softmax(scale · Q·Kᵀ) · V (and the row log-sum-exp) head by head in float64 on the same
bf16-rounded inputs; the interpreter runs the scheduled online recurrence block by block. Each pair is timed in the
same run, interleaved: the median of RUNS (env RUNS, default 3) and the best. Build + verify is timed against a
named baseline in the same run: building the 4096³ bf16 GEMM.
Goals (issue 32): the interpreter within 3× of numpy at (4 heads, 2048, 128); build + verify at seq 16384 under
100 ms.

Usage: python bench/attention_speed.py [heads seq head_dim]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

import numpy as np

import spatialc
from spatialc.numerics.rounding import round_bf16

RUNS = int(os.environ.get("RUNS", 3))


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool) -> tuple:
    """(O, LSE) of (heads, seq, dim) float64 arrays, head by head."""
    s = np.einsum("hqd,hkd->hqk", q, k) * scale
    if causal:
        n_q, n_k = s.shape[1:]
        s = np.where(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q), s, -np.inf)
    m = s.max(axis=2, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(axis=2, keepdims=True)
    return (e / total) @ v, (m + np.log(total))[..., 0]


def timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def interpreter(heads: int, seq: int, dim: int, causal: bool) -> None:
    p = spatialc.build(spatialc.attention(1, heads, seq, seq, dim, causal=causal), "sm_90")
    rng = np.random.default_rng(0)
    qkv = {n: round_bf16(rng.normal(size=(1, heads, seq, dim)).astype(np.float32)) for n in ("q", "k", "v")}
    as64 = {n: a.reshape(heads, seq, dim).astype(np.float64) for n, a in qkv.items()}
    scale = 1.0 / np.sqrt(dim)
    ours, theirs = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        for _ in range(RUNS):
            ours.append(timed(lambda: spatialc.evaluate(p, qkv)))
            theirs.append(timed(lambda: numpy_attention(as64["q"], as64["k"], as64["v"], scale, causal)))
    got = spatialc.evaluate(p, qkv)
    o, lse = numpy_attention(as64["q"], as64["k"], as64["v"], scale, causal)
    err = float(np.abs(np.asarray(got["o"], np.float64).reshape(o.shape) - o).max())
    mine, base = statistics.median(ours), statistics.median(theirs)
    print(
        f"interpreter {'causal' if causal else 'full  '} {heads}x{seq}x{dim}: {mine * 1e3:7.0f} ms (best"
        f" {min(ours) * 1e3:.0f}), numpy {base * 1e3:6.0f} ms (best {min(theirs) * 1e3:.0f}): {mine / base:4.1f}×"
        f" (best {min(ours) / min(theirs):.1f}×); max |O − numpy| {err:.2e}"
    )


def build(seq: int, dim: int) -> None:
    for causal in (False, True):
        made = spatialc.attention(1, 16, seq, seq, dim, causal=causal)
        ours = [timed(lambda: spatialc.build(made, "sm_90")) for _ in range(RUNS)]  # noqa: B023
        gemm = spatialc.gemm(4096, 4096, 4096, "bf16")
        base = [timed(lambda: spatialc.build(gemm, "sm_90")) for _ in range(RUNS)]  # noqa: B023
        print(
            f"build + verify attention 1x16x{seq}x{dim}{' causal' if causal else ''}:"
            f" {statistics.median(ours) * 1e3:6.1f} ms (best {min(ours) * 1e3:.1f});"
            f" the 4096³ bf16 GEMM {statistics.median(base) * 1e3:6.1f} ms (best {min(base) * 1e3:.1f})"
        )


def main() -> None:
    heads, seq, dim = (int(v) for v in sys.argv[1:4]) if len(sys.argv) >= 4 else (4, 2048, 128)
    build(16384, 128)
    for causal in (False, True):
        interpreter(heads, seq, dim, causal)


if __name__ == "__main__":
    main()

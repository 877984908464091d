"""The reference interpreter on row reductions at 4096 × 4096 — softmax and RMSNorm, and beside them LayerNorm, the
online softmax, fused add + RMSNorm, a row absmax, the online log-softmax and the row log-sum-exp — against numpy
computing the same function, and build + verify at 8192 × 8192.

numpy computes each on the same bf16-rounded float32 inputs, in float64 (the interpreter's ops are float64 rounded
once to float32, its sums exactly rounded), each pair timed in the same run, interleaved: the median of RUNS (env
RUNS, default 3), and the best of them (on a loaded machine, the nearest to the unloaded time). The interpreter's time
is everything `spatialc.evaluate` does: the inputs checked (rounded to bf16) and into tiled storage, the engines run
with flow control (each band of rows read once a reduction and once for the output), each page reduced or mapped,
the output.
Goals (issue 31): the interpreter within 2× of numpy; build + verify at 8192 × 8192 under 100 ms.

Usage: python bench/rows_speed.py [m n [program ...]]  (programs: softmax rmsnorm layernorm online fused absmax
log_softmax logsumexp; default all)
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

RUNS = int(os.environ.get("RUNS", 3))  # more on a loaded machine: the best of many is the unloaded time
EPS = 1e-6


def numpy_softmax(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def numpy_rmsnorm(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    return (x / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS) * v["weight"]).astype(np.float32)


def numpy_layernorm(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    centred = x - mean
    rstd = 1.0 / np.sqrt((centred * centred).mean(axis=1, keepdims=True) + EPS)
    return (centred * rstd * v["weight"] + v["bias"]).astype(np.float32)


def numpy_fused_add_rmsnorm(v: dict[str, np.ndarray]) -> np.ndarray:
    return numpy_rmsnorm({"x": v["x"].astype(np.float64) + v["residual"], "weight": v["weight"]})


def numpy_log_softmax(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    shifted = x - x.max(axis=1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(np.float32)


def numpy_logsumexp(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    peak = x.max(axis=1, keepdims=True)
    return (peak + np.log(np.exp(x - peak).sum(axis=1, keepdims=True))).astype(np.float32)


def numpy_absmax(v: dict[str, np.ndarray]) -> np.ndarray:
    return np.abs(v["x"]).max(axis=1, keepdims=True)


PROGRAMS = {
    "softmax": (lambda m, n: spatialc.softmax(m, n), numpy_softmax),
    "rmsnorm": (lambda m, n: spatialc.rmsnorm(m, n, eps=EPS), numpy_rmsnorm),
    # Reported beside the goal's two: LayerNorm (three outputs, `out` compared) and the online softmax (two passes)
    "layernorm": (lambda m, n: spatialc.layernorm(m, n, eps=EPS), numpy_layernorm),
    "online": (lambda m, n: spatialc.softmax(m, n, online=True), numpy_softmax),
    # fused add + RMSNorm (`out` compared; its last pass computes x + residual twice) and a row absmax (no output of
    # pages: one pass, an m × 1 vector)
    "fused": (lambda m, n: spatialc.rmsnorm(m, n, eps=EPS, residual=True), numpy_fused_add_rmsnorm),
    "absmax": (lambda m, n: spatialc.row_reduce(m, n, "absmax"), numpy_absmax),
    "log_softmax": (lambda m, n: spatialc.log_softmax(m, n, online=True), numpy_log_softmax),
    # the row log-sum-exp (`row_reduce`): the online pass alone, an m × 1 vector out
    "logsumexp": (lambda m, n: spatialc.row_reduce(m, n, "logsumexp"), numpy_logsumexp),
}


def main() -> None:
    m, n = (int(v) for v in sys.argv[1:3]) if len(sys.argv) >= 3 else (4096, 4096)
    chosen = {k: v for k, v in PROGRAMS.items() if k in sys.argv[3:] or len(sys.argv) <= 3}
    rng = np.random.default_rng(0)
    for name, (make, numpy_of) in chosen.items():
        p = spatialc.build(make(m, n), "sm_90")
        inputs = {"x": rng.normal(size=(m, n)).astype(np.float32)}
        if name == "fused":
            inputs["residual"] = rng.normal(size=(m, n)).astype(np.float32)
        if name in ("rmsnorm", "layernorm", "fused"):
            inputs["weight"] = rng.normal(size=n).astype(np.float32)
        if name == "layernorm":
            inputs["bias"] = rng.normal(size=n).astype(np.float32)
        rounded = ("x", "residual")  # the bf16 operands; the weights and biases are float32 parameters
        values = {k: round_bf16(v).astype(np.float32) if k in rounded else v for k, v in inputs.items()}
        interp, plain = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", spatialc.InexactInputWarning)
            for _ in range(RUNS):
                t0 = time.perf_counter()
                out = spatialc.evaluate(p, inputs)
                t1 = time.perf_counter()
                out = out["out"] if isinstance(out, dict) else out
                want = numpy_of(values)
                t2 = time.perf_counter()
                interp.append(t1 - t0)
                plain.append(t2 - t1)
        # (LayerNorm's terms are O(1) and its bias cancels them near zero; each op is rounded to float32 on the way)
        atol = 1e-5 if name == "layernorm" else 1e-7
        assert np.allclose(out, want, rtol=1e-5, atol=atol), f"{name}: the interpreter disagrees with numpy"
        ti, tn = statistics.median(interp), statistics.median(plain)
        plan = p.plan
        print(
            f"{name:9s} {m}x{n} bf16: interpreter {ti * 1e3:7.1f} ms   numpy {tn * 1e3:7.1f} ms   ratio"
            f" {ti / tn:5.2f}x  (median of {RUNS}; best {min(interp) * 1e3:.1f} / {min(plain) * 1e3:.1f} ms ="
            f" {min(interp) / min(plain):.2f}x; {plan.grid[0]} bands of {plan.block.osh} tile rows, pages of"
            f" {plan.block.ibw} tiles)"
        )
    for name, (make, _) in chosen.items():
        big = make(8192, 8192)
        spatialc.build(big, "sm_90")  # warm: the first build imports and fills caches
        times = []
        for _ in range(RUNS):
            t0 = time.process_time()
            spatialc.build(big, "sm_90")
            times.append(time.process_time() - t0)
        print(f"build + verify {name} at 8192x8192: {statistics.median(times) * 1e3:.1f} ms of CPU (median of {RUNS})")


if __name__ == "__main__":
    main()

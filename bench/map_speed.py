"""The reference interpreter on elementwise programs at 4096 × 4096, against numpy computing the same formula, and
build + verify at 8192 × 8192.

Three maps, bf16: SwiGLU's gate silu(g) · x, a residual add with a bias x + r + b, and a clipped leaky ReLU. numpy
computes the same formula on the same (bf16-rounded) float32 inputs, in float64 then rounded to float32 as the
interpreter's table does; each pair is timed in the same run, interleaved: the median of RUNS (env RUNS, default 5),
and the best of them. The interpreter's time is everything `spatialc.evaluate` does: the inputs checked (rounded to
bf16) and into tiled storage, the engines run with flow control, each page mapped, the output. Goals (issue 31): the
interpreter within 2× of numpy; build + verify of a map at 8192 × 8192 under 100 ms.

Usage: python bench/map_speed.py [m n]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

import numpy as np

import spatialc
from spatialc import ew
from spatialc.numerics.rounding import round_bf16

RUNS = int(os.environ.get("RUNS", 5))  # more on a loaded machine: the best of many is the unloaded time


def formulas():
    x, g = ew.inputs(2)
    return {
        "silu(g) * x": (ew.silu(g) * x, lambda v: (v[1] / (1.0 + np.exp(-v[1]))).astype(np.float32) * v[0]),
        "x + r + b": (x + g + ew.col("b"), lambda v: (v[0] + v[1]) + v[2]),
        "clamp(leaky(x))": (
            ew.clamp(ew.where(x > 0, x, 0.01 * x), lo=-6.0, hi=6.0),
            lambda v: np.clip(np.where(v[0] > 0, v[0], 0.01 * v[0].astype(np.float64)), -6.0, 6.0).astype(np.float32),
        ),
    }


def main() -> None:
    m, n = (int(v) for v in sys.argv[1:3]) if len(sys.argv) >= 3 else (4096, 4096)
    rng = np.random.default_rng(0)
    for name, (expr, numpy_of) in formulas().items():
        p = spatialc.build(spatialc.elementwise(expr, m, n, "bf16"), "sm_90")
        inputs = {t.name: rng.normal(size=t.elems).astype(np.float32) for t in p.tensors if t.role.value != "output"}
        values = [
            round_bf16(inputs[t.name]).astype(np.float32) if t.role.value == "input" else inputs[t.name]
            for t in p.tensors
            if t.role.value != "output"
        ]
        interp, plain = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", spatialc.InexactInputWarning)
            for _ in range(RUNS):
                t0 = time.perf_counter()
                out = spatialc.evaluate(p, inputs)
                t1 = time.perf_counter()
                want = numpy_of(values)
                t2 = time.perf_counter()
                interp.append(t1 - t0)
                plain.append(t2 - t1)
        assert np.allclose(out, want, rtol=1e-6, atol=1e-6), f"{name}: the interpreter disagrees with numpy"
        ti, tn = statistics.median(interp), statistics.median(plain)
        print(
            f"{name:16s} {m}x{n} bf16: interpreter {ti * 1e3:7.1f} ms   numpy {tn * 1e3:7.1f} ms   ratio"
            f" {ti / tn:5.2f}x  (median of {RUNS}; best {min(interp) * 1e3:.1f} / {min(plain) * 1e3:.1f} ms ="
            f" {min(interp) / min(plain):.2f}x; {p.plan.items} items of {p.plan.item_tiles} tiles)"
        )
    big = spatialc.elementwise(formulas()["silu(g) * x"][0], 8192, 8192, "bf16")
    spatialc.build(big, "sm_90")  # warm: the first build imports and fills caches
    times = []
    for _ in range(RUNS):
        t0 = time.process_time()
        spatialc.build(big, "sm_90")
        times.append(time.process_time() - t0)
    print(f"build + verify silu(g) * x at 8192x8192: {statistics.median(times) * 1e3:.1f} ms of CPU (median of {RUNS})")


if __name__ == "__main__":
    main()

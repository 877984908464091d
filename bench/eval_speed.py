"""How long the reference interpreter takes on a 1024³ int8 GEMM, against numpy's float64 `a @ b`.

Both are measured in the same run on the same inputs, median of 5 each, interleaved so that a noisy neighbour
slows both alike. The program is built for sm_90 with the default plan (what `spatialc.build` picks); the
interpreter's time covers everything `spatialc.evaluate` does (loading the inputs into tiled storage, compiling
the engine programs, running them with flow control, the arithmetic, the output). numpy's operands are float64
copies made before timing. The goal is a ratio of at most 3.
Usage: python bench/eval_speed.py [m n k]
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import spatialc

RUNS = 5


def main() -> None:
    m, n, k = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (1024, 1024, 1024)
    program = spatialc.build(spatialc.gemm(m, n, k, "int8"), "sm_90")
    plan = program.plan
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    interp, blas = [], []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        c = spatialc.evaluate(program, {"A": a, "B": b})
        t1 = time.perf_counter()
        ref = a64 @ b64
        t2 = time.perf_counter()
        interp.append(t1 - t0)
        blas.append(t2 - t1)
    assert np.array_equal(c, ref.astype(np.int64)), "the interpreter disagrees with numpy"
    ti, tn = statistics.median(interp), statistics.median(blas)
    sites = len(program.placement.items_of_site)
    print(
        f"gemm {m}x{n}x{k} int8 sm_90, block {plan.block.osh}x{plan.block.osw}x{plan.block.ibw}"
        f" sub-blocks {plan.sub_blocks[0]}x{plan.sub_blocks[1]} grid {plan.grid[0]}x{plan.grid[1]}, {sites} sites"
    )
    print(
        f"interpreter {ti * 1e3:8.1f} ms   numpy float64 a @ b {tn * 1e3:8.1f} ms   ratio {ti / tn:.2f}x"
        f"  (median of {RUNS})"
    )


if __name__ == "__main__":
    main()

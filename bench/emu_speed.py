"""How long the host emulation takes to run one 256³ int8 GEMM on 8 sites (sm_86: 4 compute warps), in each form.

    python bench/emu_speed.py [runs]

Compiles once (not timed), then prints the median over `runs` (default 5) of a whole `spatialc.emulate` call
(input files, the run, parsing C) in each mode, for the persistent kernel (4 warps, 128 threads a block) and its
general form (4 compute warps, a reader and a writer warp: 192 threads), checking every result against the
reference interpreter.
Baseline, measured in the same run: the reference interpreter (`spatialc.evaluate`) on the same program and
inputs, median of the same number of runs; the ratio says what running the real kernel text costs over the IR.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import spatialc
from spatialc.runtime.emulate import MODES, compile_program


def main(runs: int = 5) -> None:
    program = spatialc.build(spatialc.gemm(256, 256, 256, "int8"), "sm_86", sites=8)
    artifact = spatialc.lower(program)
    rng = np.random.default_rng(0)
    x = {
        "A": rng.integers(-128, 128, (256, 256)).astype(np.int8),
        "B": rng.integers(-128, 128, (256, 256)).astype(np.int8),
    }
    ref = spatialc.evaluate(program, x)
    base = []
    for _ in range(runs):
        t0 = time.perf_counter()
        spatialc.evaluate(program, x)
        base.append(time.perf_counter() - t0)
    interp = statistics.median(base)
    print(f"256x256x256 int8, sm_86, plan {program.plan.block}, sub-blocks {program.plan.sub_blocks}")
    for art in (artifact, artifact.general):
        print(f"{art.budget.form} form: {art.launch.grid} sites x {art.launch.block} threads")
        _modes(art, x, ref, interp, runs)


def _modes(artifact, x, ref, interp: float, runs: int) -> None:
    for mode in MODES:
        t0 = time.perf_counter()
        compile_program(artifact.program_cu, mode)
        built = time.perf_counter() - t0
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            c = spatialc.emulate(artifact, x, mode=mode)
            times.append(time.perf_counter() - t0)
            assert np.array_equal(c, ref), "the emulation disagrees with the interpreter"
        med = statistics.median(times)
        print(
            f"{mode:5}: median {med:.2f} s over {runs} runs "
            f"(min {min(times):.2f}, max {max(times):.2f}; compile or cache hit {built:.1f} s); "
            f"interpreter {interp * 1e3:.0f} ms, ratio {med / interp:.0f}x"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

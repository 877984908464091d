"""How long the host emulation takes to run a kernel, wall-clock and in CPU seconds of the emulated process.

    python bench/emu_speed.py [runs]

Three kernels, each compiled once (not timed), then the median over `runs` (default 5) of a whole `spatialc.emulate`
call (input files, the run, parsing the outputs) in each copy-landing mode, checked against the reference
interpreter:
- a 256³ int8 GEMM on 8 sites, sm_86: the persistent kernel (128 threads a block) and its general form (192);
- a bf16 softmax of 1024 rows of 1000 (sm_90, the general form: warp shuffles for each row's max and sum);
- bf16 attention, 1 × 2 heads × 128 × 128 × 64, in the sm_90a form (a TMA producer, wgmma consumers, mbarriers).
The CPU seconds are the emulated process's own (user + system, from the children's resource usage), which load on
the machine beside it changes less than the wall-clock time.
Baseline, measured in the same run: the reference interpreter (`spatialc.evaluate`) on the same program and
inputs, median of the same number of runs; the ratio says what running the real kernel text costs over the IR.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import numpy as np

import spatialc
from spatialc.cli.report import random_inputs
from spatialc.runtime.emulate import MODES, compile_program


def main(runs: int = 5) -> None:
    gemm = spatialc.build(spatialc.gemm(256, 256, 256, "int8"), "sm_86", sites=8)
    rng = np.random.default_rng(0)
    x = {
        "A": rng.integers(-128, 128, (256, 256)).astype(np.int8),
        "B": rng.integers(-128, 128, (256, 256)).astype(np.int8),
    }
    artifact = spatialc.lower(gemm)
    _kernels("256x256x256 int8 GEMM, sm_86", gemm, x, (artifact, artifact.general), runs)
    softmax = spatialc.build(spatialc.softmax(1024, 1000, "bf16"), "sm_90")
    _kernels("softmax 1024 x 1000 bf16, sm_90", softmax, random_inputs(softmax, 0), (spatialc.lower(softmax),), runs)
    attention = spatialc.build(spatialc.attention(1, 2, 128, 128, 64), "sm_90a")
    art = spatialc.lower(attention)
    _kernels("attention 1x2x128x128x64 bf16, sm_90a", attention, random_inputs(attention, 0), (art,), runs)


def _kernels(title: str, program, x: dict, artifacts: tuple, runs: int) -> None:
    ref = spatialc.evaluate(program, x)
    base = []
    for _ in range(runs):
        t0 = time.perf_counter()
        spatialc.evaluate(program, x)
        base.append(time.perf_counter() - t0)
    interp = statistics.median(base)
    print(title)
    for art in artifacts:
        print(f"  {art.budget.form} form: {art.launch.grid} sites x {art.launch.block} threads")
        _modes(art, x, ref, interp, runs)


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _close(got, want) -> bool:
    """Within bf16's rounding of each other (a check that the run did the work; the tests hold the exact bounds)."""
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
    return np.allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=2e-2, atol=2e-2)


def _modes(artifact, x, ref, interp: float, runs: int) -> None:
    for mode in MODES:
        t0 = time.perf_counter()
        compile_program(artifact.program_cu, mode)
        built = time.perf_counter() - t0
        walls, cpus = [], []
        for _ in range(runs):
            c0, t0 = _children_cpu(), time.perf_counter()
            got = spatialc.emulate(artifact, x, mode=mode)
            walls.append(time.perf_counter() - t0)
            cpus.append(_children_cpu() - c0)
            assert _close(got, ref), "the emulation disagrees with the interpreter"
        med = statistics.median(walls)
        print(
            f"    {mode:5}: median {med:.2f} s (min {min(walls):.2f}, max {max(walls):.2f}), the emulated process "
            f"{statistics.median(cpus):.2f} CPU-s; compile or cache hit {built:.1f} s; "
            f"interpreter {interp * 1e3:.0f} ms, ratio {med / interp:.0f}x"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

"""How long `spatialc.build` takes (tile → place → schedule → verify), against building the unplanned program; and
build + lower, the whole way from a GEMM to its CUDA, against the issue's goal (issue 35, point 9: ≤ 25 ms).

Baseline: `spatialc.gemm(...)` alone (making the IR), measured in the same run. CPU time (`time.process_time`), median
of 7, the first call of each kind made once beforehand (imports; the planner's table of block resources, which every
GEMM of a precision and form shares — `first build` is a fresh process's first build of that kind, for comparison).
Split-K programs (many sites that wait on each other, each checked across sites by rules 7 and 8) against the same
GEMM built unsplit; multicast builds (rule 7's run with vector clocks, step by step) against the same GEMM in the
general form.
Usage: python bench/build_speed.py [runs]      (runs: default 7)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import spatialc

GOAL_MS = 25.0  # build + lower of 8192³, CPU time (issue 35, point 9)
SIZES = [(1024, 1024, 1024, "int8"), (1024, 1024, 1024, "fp16"), (8192, 8192, 8192, "fp16"), (8192, 8192, 8192, "int8")]


def median_time(fn, runs: int = 7) -> float:
    """The median CPU time (seconds, `time.process_time`) of `runs` calls of `fn`."""
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def first_build(m: int, n: int, k: int, prec: str, target: str) -> float:
    """The CPU time of a fresh process's first build of this GEMM (its imports done beforehand), in seconds."""
    code = (
        f"import time, spatialc; g = spatialc.gemm({m}, {n}, {k}, {prec!r});"
        " spatialc.build(spatialc.gemm(64, 64, 64), 'sm_80');"
        f" t = time.process_time(); spatialc.build(g, {target!r}); print(time.process_time() - t)"
    )
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def build_then_lower(m: int, n: int, k: int, prec: str, target: str, runs: int) -> tuple[float, float]:
    """Median CPU times (seconds) of `build` and of `lower` of the program just built, as a user calls them."""
    builds, lowers = [], []
    for _ in range(runs):
        t0 = time.process_time()
        p = spatialc.build(spatialc.gemm(m, n, k, prec), target)
        t1 = time.process_time()
        spatialc.lower(p)
        lowers.append(time.process_time() - t1)
        builds.append(t1 - t0)
    return statistics.median(builds), statistics.median(lowers)


def build_and_lower(runs: int) -> None:
    """Build, lower and their sum for each size on sm_90 and sm_90a, against GOAL_MS."""
    for target in ("sm_90", "sm_90a"):
        for m, n, k, prec in SIZES:
            spatialc.lower(spatialc.build(spatialc.gemm(m, n, k, prec), target))
            build, lower = build_then_lower(m, n, k, prec, target, runs)
            total = (build + lower) * 1e3
            mark = "within" if total <= GOAL_MS else "OVER"
            first = first_build(m, n, k, prec, target) * 1e3
            print(
                f"build + lower {m}x{n}x{k} {prec} {target}: {build * 1e3:5.1f} + {lower * 1e3:5.1f} = {total:5.1f} ms"
                f"  ({mark} the {GOAL_MS:.0f} ms goal; first build in a process {first:.1f} ms)"
            )


def main(runs: int = 7) -> None:
    build_and_lower(runs)
    for m, n, k, prec in SIZES:
        spatialc.build(spatialc.gemm(m, n, k, prec), "sm_90")
        base = median_time(lambda m=m, n=n, k=k, prec=prec: spatialc.gemm(m, n, k, prec), runs)
        full = median_time(lambda m=m, n=n, k=k, prec=prec: spatialc.build(spatialc.gemm(m, n, k, prec), "sm_90"), runs)
        print(
            f"build {m}x{n}x{k} {prec} sm_90: {full * 1e3:8.1f} ms  (gemm() alone {base * 1e3:.2f} ms,"
            f" ratio {full / base:.0f}x)"
        )
    for m, n, k, prec in [(128, 128, 65536, "bf16"), (512, 512, 32768, "int8")]:
        g = spatialc.gemm(m, n, k, prec)
        split = spatialc.build(g, "sm_90")
        plain = median_time(lambda g=g: spatialc.build(g, "sm_90", split_k=1), runs)
        full = median_time(lambda g=g: spatialc.build(g, "sm_90"), runs)
        sites = len(split.placement.items_of_site)
        print(
            f"build {m}x{n}x{k} {prec} sm_90 split-K {split.placement.splits} ({sites} sites): {full * 1e3:8.1f} ms"
            f"  (unsplit {plain * 1e3:.1f} ms, ratio {full / plain:.0f}x)"
        )
    for m, n, k, prec, group in [(4096, 4096, 4096, "fp16", (2, 1)), (4096, 4096, 4096, "fp16", (2, 2))]:
        g = spatialc.gemm(m, n, k, prec)
        plain = median_time(lambda g=g: spatialc.build(g, "sm_90", form="general"), runs)
        full = median_time(lambda g=g, group=group: spatialc.build(g, "sm_90", multicast=group), runs)
        print(
            f"build {m}x{n}x{k} {prec} sm_90 multicast {group[0]}x{group[1]}: {full * 1e3:8.1f} ms"
            f"  (no groups {plain * 1e3:.1f} ms, ratio {full / plain:.0f}x)"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)

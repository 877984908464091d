"""How long `spatialc.build` takes (tile → place → schedule → verify), against building the unplanned program.

Baseline: `spatialc.gemm(...)` alone (making the IR), measured in the same run. Median of 5. Split-K programs (many
sites that wait on each other, each checked across sites by rules 7 and 8) against the same GEMM built unsplit;
multicast builds (rule 7's run with vector clocks, step by step) against the same GEMM in the general form.
Usage: python bench/build_speed.py
"""

from __future__ import annotations

import statistics
import time

import spatialc


def median_time(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    for m, n, k, prec in [(1024, 1024, 1024, "int8"), (8192, 8192, 8192, "fp16"), (8192, 8192, 8192, "int8")]:
        base = median_time(lambda m=m, n=n, k=k, prec=prec: spatialc.gemm(m, n, k, prec))
        full = median_time(lambda m=m, n=n, k=k, prec=prec: spatialc.build(spatialc.gemm(m, n, k, prec), "sm_90"))
        print(
            f"build {m}x{n}x{k} {prec} sm_90: {full * 1e3:8.1f} ms  (gemm() alone {base * 1e3:.2f} ms,"
            f" ratio {full / base:.0f}x)"
        )
    for m, n, k, prec in [(128, 128, 65536, "bf16"), (512, 512, 32768, "int8")]:
        g = spatialc.gemm(m, n, k, prec)
        split = spatialc.build(g, "sm_90")
        plain = median_time(lambda g=g: spatialc.build(g, "sm_90", split_k=1))
        full = median_time(lambda g=g: spatialc.build(g, "sm_90"))
        sites = len(split.placement.items_of_site)
        print(
            f"build {m}x{n}x{k} {prec} sm_90 split-K {split.placement.splits} ({sites} sites): {full * 1e3:8.1f} ms"
            f"  (unsplit {plain * 1e3:.1f} ms, ratio {full / plain:.0f}x)"
        )
    for m, n, k, prec, group in [(4096, 4096, 4096, "fp16", (2, 1)), (4096, 4096, 4096, "fp16", (2, 2))]:
        g = spatialc.gemm(m, n, k, prec)
        plain = median_time(lambda g=g: spatialc.build(g, "sm_90", form="general"))
        full = median_time(lambda g=g, group=group: spatialc.build(g, "sm_90", multicast=group))
        print(
            f"build {m}x{n}x{k} {prec} sm_90 multicast {group[0]}x{group[1]}: {full * 1e3:8.1f} ms"
            f"  (no groups {plain * 1e3:.1f} ms, ratio {full / plain:.0f}x)"
        )


if __name__ == "__main__":
    main()

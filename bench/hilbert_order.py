"""Grouped bands against Hilbert order for the sm_90a form's plans of the GPU check's square rows: the A and B strips a
wave of sites reads, and the bytes a model of the L2 lets through from memory. No GPU: a prediction's arithmetic
(bench/README.md, "Prediction for Hilbert order"; issue 36, section 2 item 4).

A wave is `sites` consecutive items of the order (dealt round-robin, site s runs items s, s + sites, …, so the
sites run one wave at a time while items take equal time). Its strips: the rows of items it touches, each an A
strip of 128 rows × K, and the columns, each a B strip of 256 × K. The L2 model: least recently used, L2_BYTES,
the sites of a wave in lock step over the K panels of the plan's step (each step reads, once for the wave, the
panel of K of each of its A rows and B columns) — what reaches the L2 from memory is each miss's panel. Real L2s
(two partitions, hashing, prefetch) differ; the model compares the two orders, it does not time them.

Usage: python bench/hilbert_order.py [N ...]  (default 4096 8192), each for bf16 and int8 (fp16 reads as bf16)
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import spatialc
from spatialc.ir.worklist import grid_order
from spatialc.lower.cuda.sm90a.plan import L2_BYTES
from spatialc.passes.footprint import OPERAND_BYTES
from spatialc.passes.place import wave_bytes

MIB = 2**20


def from_memory(order: list[int], nx: int, sites: int, strip: tuple[int, int], steps: int) -> int:
    """Bytes the LRU model reads from memory: each wave's steps in lock step, each step a panel of each strip."""
    panel_a, panel_b = strip[0] // steps, strip[1] // steps
    cache: OrderedDict[tuple[str, int, int], int] = OrderedDict()
    held = missed = 0
    for t in range(0, len(order), sites):
        wave = order[t : t + sites]
        rows, cols = sorted({i // nx for i in wave}), sorted({i % nx for i in wave})
        for k in range(steps):
            for key, size in [(("a", r, k), panel_a) for r in rows] + [(("b", c, k), panel_b) for c in cols]:
                if key in cache:
                    cache.move_to_end(key)
                    continue
                missed += size
                cache[key] = size
                held += size
                while held > L2_BYTES:
                    held -= cache.popitem(last=False)[1]
    return missed


def row(n: int, precision: str) -> str:
    p = spatialc.build(spatialc.gemm(n, n, n, precision), "sm_90a")
    plan, pl = p.plan, p.placement
    sites, (ny, nx), (h, w) = len(pl.items_of_site), plan.placed, plan.placed_tiles
    k = plan.k_tiles * 16 * OPERAND_BYTES[p.precision]
    strip = (h * 16 * k, w * 16 * k)
    steps = plan.k_steps
    least = (ny * strip[0] + nx * strip[1]) / MIB  # every strip read once
    cells = []
    for kind, band in (("grouped", pl.band), ("hilbert", 0)):
        wave = wave_bytes(plan, p.precision, sites, kind, band) / MIB
        read = from_memory(grid_order(kind, plan.placed, band), nx, sites, strip, steps) / MIB
        cells += [f"{wave:.1f}", f"{read:,.0f}"]
    return (
        f"| {precision} {n}³ | {ny} × {nx} items of {h * 16} × {w * 16}, {sites} sites, bands of {pl.band} | "
        f"{' | '.join(cells)} | {least:,.0f} |"
    )


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [4096, 8192]
    print(f"L2 {L2_BYTES // MIB} MiB; MiB a wave reads (mean over the waves) and MiB from memory in the LRU model")
    print("| row | plan | grouped: a wave | grouped: from memory | hilbert: a wave | hilbert: from memory | least |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        for precision in ("bf16", "int8"):
            print(row(n, precision))


if __name__ == "__main__":
    main(sys.argv[1:])

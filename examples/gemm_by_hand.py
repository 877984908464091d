"""The standard GEMM, written by hand: C = A @ B on one site, 2 items of 32 × 64 outputs, K in one step of 64.

It declares what `spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90", sites=1)` builds, op for op
(tests/lang/test_lang.py checks they are equal), so it is also a reading of what the compiler's passes produce:
a reader that fills A's and B's rings, a compute engine that multiplies their pages into an accumulator and packs
it into C's ring, a writer that stores C's pages.

    python examples/gemm_by_hand.py      # verifies it, runs it in the interpreter against numpy
"""

from __future__ import annotations

import numpy as np

import spatialc
from spatialc import lang


@lang.program(target="sm_90", precision="bf16", name="gemm_64x64x64_bf16")
def gemm(p: lang.Builder, m: int = 64, n: int = 64, k: int = 64):
    # The tensors, in 16 × 16 tiles.
    A = p.input("A", m, k)
    B = p.input("B", k, n)
    C = p.output("C", m, n)

    # Rings (pages of tiles between two engines) and the accumulator. A's and B's pages are swizzled, as the
    # tensor cores' fragment loads read them.
    a_ring = p.ring("A_ring", depth=2, tiles=2 * 4, layout="swizzled")
    b_ring = p.ring("B_ring", depth=2, tiles=4 * 4, layout="swizzled")
    acc = p.accumulator("acc", tiles=2 * 4)
    c_ring = p.ring("C_ring", depth=2, tiles=2 * 4)

    # What the program computes: verify proves the engines below compute exactly this.
    p.read("read_A", A, a_ring)
    p.read("read_B", B, b_ring)
    mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4))
    p.write("write_C", c_ring, C)

    # Items of 2 × 4 output tiles, K reduced 4 tiles a step; every item on site 0, row by row (the grouped
    # placement rule's order with bands of one row, which lets a launch spread them over a device's sites).
    grid = (m // 32, n // 64)
    p.plan(block=(2, 4, 4), grid=grid, k_tiles=k // 16, depth=2)
    p.place([list(range(grid[0] * grid[1]))], kind="grouped", band=1)

    # The engines, each a function of its site run as the program is traced.
    engines(p, mm, A, B, C, a_ring, b_ring, acc, c_ring, n=n, k=k)


def engines(p: lang.Builder, mm, A, B, C, a_ring, b_ring, acc, c_ring, *, n: int, k: int, b_read=None, dequant=None):
    """The reader, compute and writer engines of this GEMM. (A W4A16 GEMM, tests/w4a16/test_w4_lang.py, has the
    same three: its reader fills `b_read` from B, and `dequant(e, kk, item)` turns that page into B's `b_ring` at
    the start of each K step of the compute engine.)"""
    b_in = b_read or b_ring  # the ring the reader fills from B
    steps = k // 64
    a_cols, b_cols, c_cols = k // 16, n // 16, n // 16  # tiles a row of each tensor: a tile (r, c) is r · cols + c

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for kk in e.range(steps, "k"):
                with a_ring.reserve() as page:
                    page.read(A, 2 * a_cols * item.y + 4 * kk, 2, 4)
                with b_in.reserve() as page:
                    page.read(B, 4 * b_cols * kk + 4 * item.x, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        for item in e.items():
            acc.acquire()
            for kk in e.range(steps, "k"):
                if dequant:
                    dequant(e, kk, item)
                # The explicit forms: a `with` over both would free B's page first (Python leaves them inward out).
                a, b = a_ring.wait(), b_ring.wait()
                acc.matmul(mm, a, b)
                a.pop()
                b.pop()
            with c_ring.reserve() as page:
                acc.pack(page)
            acc.release()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with c_ring.wait() as page:
                page.write(C, 2 * c_cols * item.y + 4 * item.x, 2, 4)


if __name__ == "__main__":
    program = gemm()
    rng = np.random.default_rng(0)
    x = {"A": rng.integers(-4, 5, (64, 64)).astype(np.float32), "B": rng.integers(-4, 5, (64, 64)).astype(np.float32)}
    c = spatialc.evaluate(program, x)
    print(f"{program.name}: verified; the interpreter's C equals numpy's: {np.array_equal(c, x['A'] @ x['B'])}")

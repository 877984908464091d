"""A producer-consumer pipeline that deadlocks because a ring is one page too shallow — and the error it gets.

The reader fills A's ring with all four K steps of an item before it reads any of B; the compute engine needs A's
and B's page of the same step together. With A's ring four pages deep the reader can run ahead by all four; with
three it waits for a free page of A while the compute engine waits for B's first page, which the reader has not
read yet: neither can move. `verify` finds it (rule 7) before anything runs, and names the line of each op the
engines are blocked at.

    python examples/shallow_ring.py      # the deep ring verifies; the shallow one is refused at its lines
"""

from __future__ import annotations

import spatialc
from spatialc import lang

STEPS = 4  # K steps of 64: K = 256


@lang.program(target="sm_90", precision="bf16")
def pipeline(p: lang.Builder, a_depth: int = STEPS):
    A = p.input("A", 32, 64 * STEPS)
    B = p.input("B", 64 * STEPS, 64)
    C = p.output("C", 32, 64)
    a_ring = p.ring("A_ring", depth=a_depth, tiles=2 * 4, layout="swizzled")
    b_ring = p.ring("B_ring", depth=2, tiles=4 * 4, layout="swizzled")
    acc = p.accumulator("acc", tiles=2 * 4)
    c_ring = p.ring("C_ring", depth=2, tiles=2 * 4)
    p.read("read_A", A, a_ring)
    p.read("read_B", B, b_ring)
    mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4))
    p.write("write_C", c_ring, C)
    p.plan(block=(2, 4, 4), grid=(1, 1), k_tiles=4 * STEPS, depth=2)
    p.place([[0]])

    @p.reader
    def read(e: lang.Engine):
        item = e.item
        for k in e.range(STEPS, "k"):  # every A page of the item first …
            with a_ring.reserve() as page:
                page.read(A, 8 * item.y + 4 * k, 2, 4)
        for k in e.range(STEPS, "k"):  # … then every B page
            with b_ring.reserve() as page:
                page.read(B, 16 * k + 4 * item.x, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        acc.acquire()
        for _ in e.range(STEPS, "k"):
            a, b = a_ring.wait(), b_ring.wait()
            acc.matmul(mm, a, b)
            a.pop()
            b.pop()
        with c_ring.reserve() as page:
            acc.pack(page)
        acc.release()

    @p.writer
    def write(e: lang.Engine):
        with c_ring.wait() as page:
            page.write(C, 8 * e.item.y + 4 * e.item.x, 2, 4)


if __name__ == "__main__":
    pipeline(a_depth=STEPS)
    print(f"A's ring {STEPS} pages deep: verified")
    try:
        pipeline(a_depth=STEPS - 1)
    except spatialc.DeadlockError as e:
        print(f"A's ring {STEPS - 1} pages deep: {e}")

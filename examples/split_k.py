"""Split-K with a semaphore reduction: one item of C (32 × 64 outputs) whose K of 256 is split over two sites.

Site 1 reduces the second half of K, stores its partial sums to a workspace in global memory, makes them visible
(`write_barrier`) and raises site 0's `partials`. Site 0 reduces the first half, waits for `partials`, reads the
workspace back and adds it to its accumulator before it writes C. `spatialc.build(spatialc.gemm(32, 64, 256,
"bf16"), "sm_90", split_k=2, block=(2, 4, 4), depth=2)` builds the same program, op for op (tests/lang/test_lang.py);
verify proves the hand-over and rule 8 that C is the whole sum, each half once.

    python examples/split_k.py
"""

from __future__ import annotations

import numpy as np

import spatialc
from spatialc import lang

M, N, K, SPLITS = 32, 64, 256, 2


@lang.program(target="sm_90", precision="bf16")
def split_k(p: lang.Builder):
    A = p.input("A", M, K)
    B = p.input("B", K, N)
    C = p.output("C", M, N)
    partials = p.workspace("partials", M, N)  # site 1's sums, on their way to site 0
    a_ring = p.ring("A_ring", depth=2, tiles=2 * 4, layout="swizzled")
    b_ring = p.ring("B_ring", depth=2, tiles=4 * 4, layout="swizzled")
    acc = p.accumulator("acc", tiles=2 * 4)
    c_ring = p.ring("C_ring", depth=2, tiles=2 * 4)
    out_ring = p.ring("partial_out", depth=1, tiles=2 * 4)
    in_ring = p.ring("partial_in", depth=1, tiles=2 * 4)
    ready = p.semaphore("partials", number=0)
    p.read("read_A", A, a_ring)
    p.read("read_B", B, b_ring)
    mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4), partial=out_ring)
    p.write("write_C", c_ring, C)
    p.write("write_partials", out_ring, partials)
    p.read("read_partials", partials, in_ring)
    p.add_partials("add_partials", in_ring)
    p.plan(block=(2, 4, 4), grid=(1, 1), k_tiles=K // 16, depth=2)
    p.place([[0], [0]], kind="split", splits=SPLITS)  # item 0 on both sites
    steps = K // 64 // SPLITS  # K steps of 64 each site reduces
    a_cols, b_cols, c_cols = K // 16, N // 16, N // 16

    @p.reader
    def read(e: lang.Engine):
        item, half = e.item, e.site * steps  # the site's first K step (compile-time)
        for k in e.range(steps, "k"):
            with a_ring.reserve() as page:
                page.read(A, 2 * a_cols * item.y + 4 * (half + k), 2, 4)
            with b_ring.reserve() as page:
                page.read(B, 4 * b_cols * (half + k) + 4 * item.x, 4, 4)
        if e.site == 0:  # the owner reads the other half's sums once they are there
            e.sem_wait(ready, 1)
            with in_ring.reserve() as page:
                page.read(partials, 2 * c_cols * item.y + 4 * item.x, 2, 4)

    @p.compute
    def multiply(e: lang.Engine):
        acc.acquire()
        for _ in e.range(steps, "k"):
            a, b = a_ring.wait(), b_ring.wait()
            acc.matmul(mm, a, b)
            a.pop()
            b.pop()
        if e.site == 0:
            with in_ring.wait() as page:
                acc.add(page)
        with (c_ring if e.site == 0 else out_ring).reserve() as page:
            acc.pack(page)
        acc.release()

    @p.writer
    def write(e: lang.Engine):
        item = e.item
        if e.site == 0:
            with c_ring.wait() as page:
                page.write(C, 2 * c_cols * item.y + 4 * item.x, 2, 4)
        else:
            with out_ring.wait() as page:
                page.write(partials, 2 * c_cols * item.y + 4 * item.x, 2, 4)
            e.write_barrier()  # the sums are visible before the raise
            e.sem_inc(ready, 0)


if __name__ == "__main__":
    program = split_k()
    rng = np.random.default_rng(0)
    x = {"A": rng.integers(-4, 5, (M, K)), "B": rng.integers(-4, 5, (K, N))}
    x = {name: a.astype(np.float32) for name, a in x.items()}
    c = spatialc.evaluate(program, x)
    print(f"{program.name}: verified; the interpreter's C equals numpy's: {np.array_equal(c, x['A'] @ x['B'])}")

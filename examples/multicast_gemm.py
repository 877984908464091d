"""A multicast GEMM in the manner of TT-Metal's 2D multicast matmul: two sites compute the two column halves of C,
both need the same rows of A, and only the first site reads them — it sends each A page to its neighbour.

The handshake, per K step, on A's ring (the one the group shares):
- the receiver reserves its page, then raises the sender's `a_ready` (its page is free to be written);
- the sender reads the page, waits until `a_ready` reached 1 (and resets it), sends the page into the receiver's
  reserved page and sets the receiver's `a_valid`;
- the receiver waits for `a_valid` (and resets it), then publishes the page to its own compute engine.

Each site reads its own B. `spatialc.build(spatialc.gemm(32, 128, 64 * steps, "bf16"), "sm_90", multicast=(1, 2),
block=(2, 4, 4), depth=2)` builds the same program, op for op (tests/lang/test_lang.py); verify proves the handshake
free of races and deadlocks for every interleaving, and rule 8 follows each received page back to the sender's.
On sm_90 the general form runs the pair as a thread-block cluster; on sm_90a, with the pages multicast by TMA.

    python examples/multicast_gemm.py
"""

from __future__ import annotations

import numpy as np

import spatialc
from spatialc import lang


@lang.program(target="sm_90", precision="bf16")
def multicast_gemm(p: lang.Builder, steps: int = 1, receiver_ready: bool = True):
    """`steps` K steps of 64; `receiver_ready` False leaves out the receiver's raise of `a_ready` (the deadlock
    verify then reports, at the sender's wait)."""
    m, n, k = 32, 128, 64 * steps
    A = p.input("A", m, k)
    B = p.input("B", k, n)
    C = p.output("C", m, n)
    a_ring = p.ring("A_ring", depth=2, tiles=2 * 4, layout="swizzled")
    b_ring = p.ring("B_ring", depth=2, tiles=4 * 4, layout="swizzled")
    acc = p.accumulator("acc", tiles=2 * 4)
    c_ring = p.ring("C_ring", depth=2, tiles=2 * 4)
    a_ready, a_valid = p.semaphore("a_ready"), p.semaphore("a_valid")
    p.semaphore("b_ready"), p.semaphore("b_valid")  # (B is not shared here: the build declares them anyway)
    p.read("read_A", A, a_ring)
    p.read("read_B", B, b_ring)
    mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4))
    p.write("write_C", c_ring, C)
    p.plan(block=(2, 4, 4), grid=(1, 2), k_tiles=k // 16, depth=2)
    p.place([[0], [1]], kind="multicast", multicast=(1, 2))  # item 0 on site 0, item 1 on site 1
    row = p.group([0, 1])  # the group row that shares A's pages; site 0 sends
    a_cols, b_cols, c_cols = k // 16, n // 16, n // 16

    @p.reader
    def read(e: lang.Engine):
        item = e.item
        for kk in e.range(steps, "k"):
            page = a_ring.reserve()
            if e.site == 0:  # compile-time: the sender's program and the receiver's differ
                page.read(A, 2 * a_cols * item.y + 4 * kk, 2, 4)
                e.sem_wait(a_ready, 1)
                e.sem_set(a_ready, 0)
                e.read_barrier()
                page.send(row)
                e.set_valid(a_valid, row)
            else:
                if receiver_ready:
                    e.sem_inc(a_ready, 0)
                e.sem_wait(a_valid, 1)
                e.sem_set(a_valid, 0)
            page.push()
            with b_ring.reserve() as b:
                b.read(B, 4 * b_cols * kk + 4 * item.x, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        acc.acquire()
        for _ in e.range(steps, "k"):
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
            page.write(C, 2 * c_cols * e.item.y + 4 * e.item.x, 2, 4)


if __name__ == "__main__":
    program = multicast_gemm(steps=2)
    rng = np.random.default_rng(0)
    x = {"A": rng.integers(-4, 5, (32, 128)), "B": rng.integers(-4, 5, (128, 128))}
    x = {name: a.astype(np.float32) for name, a in x.items()}
    c = spatialc.evaluate(program, x)
    print(f"{program.name}: verified; the interpreter's C equals numpy's: {np.array_equal(c, x['A'] @ x['B'])}")

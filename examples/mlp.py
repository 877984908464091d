"""A two-layer MLP on one site: Y = gelu(X @ W1) @ W2, two matmul stages through an intermediate ring.

X is 64 × 64, W1 64 × 128 (the hidden width), W2 128 × 64. Each item is 32 × 64 outputs of Y. The compute engine
walks the hidden width in steps of 64: it reduces X's row strip against a 64-wide column strip of W1 into `acc1`,
packs it, applies gelu into `hidden` — a ring whose pages the same engine reads back as the second matmul's A
operand — and multiplies that page by W2's matching 64-row strip into `acc2`, which after the last step holds the
item's block of Y. The hidden activations never leave the site.

The second matmul multiplies bf16 tiles, as the tensor cores do: the gelu page is rounded to bf16 (nearest even)
where the matmul reads it — the rounding the numpy reference (`spatialc.numerics.reference`) applies too.
verify's rule 8 proves the engines compute exactly the declared Y: each hidden tile is gelu of the whole sum over K
of its X and W1 tiles, and each tile of Y the whole sum over the hidden width of the right hidden and W2 tiles.

    python examples/mlp.py      # verifies it, runs it in the interpreter against numpy
"""

from __future__ import annotations

import numpy as np

import spatialc
from spatialc import lang
from spatialc.ir.ops import Activation

M, K, H, N = 64, 64, 128, 64


@lang.program(target="sm_90", precision="bf16")
def mlp(p: lang.Builder):
    X = p.input("X", M, K)
    W1 = p.input("W1", K, H)
    W2 = p.input("W2", H, N)
    Y = p.output("Y", M, N)

    x_ring = p.ring("X_ring", depth=2, tiles=2 * 4, layout="swizzled")
    w1_ring = p.ring("W1_ring", depth=2, tiles=4 * 4, layout="swizzled")
    w2_ring = p.ring("W2_ring", depth=2, tiles=4 * 4, layout="swizzled")
    acc1 = p.accumulator("acc1", tiles=2 * 4)  # a 32 × 64 strip of X @ W1
    acc2 = p.accumulator("acc2", tiles=2 * 4)  # the item's 32 × 64 block of Y
    sums = p.ring("sums", depth=1, tiles=2 * 4, kind="interm")  # acc1, packed
    hidden = p.ring("hidden", depth=1, tiles=2 * 4, kind="interm")  # gelu of it: the second matmul's A
    y_ring = p.ring("Y_ring", depth=2, tiles=2 * 4)

    p.read("read_X", X, x_ring)
    p.read("read_W1", W1, w1_ring)
    p.read("read_W2", W2, w2_ring)
    layer1 = p.matmul("layer1", x_ring, w1_ring, sums, block=(2, 4, 4))
    p.elementwise("gelu", Activation("gelu_tanh"), sums, hidden)
    layer2 = p.matmul("layer2", hidden, w2_ring, y_ring, block=(2, 4, 4))
    p.write("write_Y", y_ring, Y)

    grid = (M // 32, N // 64)
    p.plan(block=(2, 4, 4), grid=grid, k_tiles=H // 16, depth=2)
    p.place([list(range(grid[0] * grid[1]))])
    x_cols, w1_cols, w2_cols, y_cols = K // 16, H // 16, N // 16, N // 16
    h_steps, k_steps = H // 64, K // 64

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for h in e.range(h_steps, "h"):
                for kk in e.range(k_steps, "k"):
                    with x_ring.reserve() as page:
                        page.read(X, 2 * x_cols * item.y + 4 * kk, 2, 4)
                    with w1_ring.reserve() as page:
                        page.read(W1, 4 * w1_cols * kk + 4 * h, 4, 4)
                with w2_ring.reserve() as page:
                    page.read(W2, 4 * w2_cols * h + 4 * item.x, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        for _ in e.items():
            acc2.acquire()
            for _ in e.range(h_steps, "h"):
                acc1.acquire()
                for _ in e.range(k_steps, "k"):
                    x, w1 = x_ring.wait(), w1_ring.wait()
                    acc1.matmul(layer1, x, w1)
                    x.pop()
                    w1.pop()
                with sums.reserve() as page:
                    acc1.pack(page)
                acc1.release()
                with sums.wait() as s, hidden.reserve() as g:
                    e.compute(Activation("gelu_tanh"), s, g)
                g, w2 = hidden.wait(), w2_ring.wait()
                acc2.matmul(layer2, g, w2)
                g.pop()
                w2.pop()
            with y_ring.reserve() as page:
                acc2.pack(page)
            acc2.release()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with y_ring.wait() as page:
                page.write(Y, 2 * y_cols * item.y + 4 * item.x, 2, 4)


def numpy_mlp(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """What the program declares, in numpy: the hidden layer in float32, rounded to bf16 for the second matmul."""
    from spatialc.numerics.epilogue import apply, start

    hidden = apply(Activation("gelu_tanh"), start(x.astype(np.float64) @ w1, False), False, None)
    return (spatialc.inputs.round_bf16(hidden).astype(np.float64) @ w2).astype(np.float32)


if __name__ == "__main__":
    program = mlp()
    rng = np.random.default_rng(0)
    x = rng.integers(-4, 5, (M, K)) / 4
    w1, w2 = rng.integers(-4, 5, (K, H)) / 4, rng.integers(-4, 5, (H, N)) / 4
    y = spatialc.evaluate(program, {"X": x, "W1": w1, "W2": w2})
    same = np.array_equal(y, numpy_mlp(x, w1, w2))
    print(f"{program.name}: verified; the interpreter's Y equals numpy's: {same}")

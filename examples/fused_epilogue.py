"""A GEMM whose epilogue reads more than its accumulator: a quantised layer's per-token and per-channel scales, a
bias and a residual connection, fused into the one kernel.

    C = (A @ B) · s_tok[row] · s_ch[col] + bias[col] + residual

`spatialc.row_scale()` is a parameter tensor of M values (one per row of C), `col_scale()` one of N values (one per
column), `residual()` an input tensor of C's shape that the reader streams in beside A and B, a block of it for each
output block, at that block's own address. Verify's rule 8 proves each tile of C is that formula of its own tiles —
the scale of its own rows and columns, the residual tile at its own place — and the interpreter computes it, compared
here with numpy. The persistent CUDA kernel prints it: its fused store applies the scales and the bias to the
accumulators and adds the residual's tile from the ring the reader fills, before the ring's page is freed.

    python examples/fused_epilogue.py            # builds, verifies, checks and prints the CUDA form it takes
"""

from __future__ import annotations

import numpy as np

import spatialc

M, N, K = 200, 176, 256  # M not a multiple of the block: the last items' rows (and their scales) are padding


def main() -> None:
    epilogue = [spatialc.row_scale("s_tok"), spatialc.col_scale("s_ch"), spatialc.bias(), spatialc.residual()]
    p = spatialc.build(spatialc.gemm(M, N, K, "bf16", epilogue=epilogue), "sm_90")
    rng = np.random.default_rng(0)
    # Values bf16 holds exactly (small integers and halves), so numpy's float64 formula is the reference bit for bit.
    x = {
        "A": rng.integers(-4, 5, (M, K)) * 0.5,
        "B": rng.integers(-4, 5, (K, N)) * 0.5,
        "s_tok": rng.integers(1, 5, M) * 0.25,
        "s_ch": rng.integers(1, 5, N) * 0.5,
        "bias": rng.integers(-8, 9, N) * 1.0,
        "residual": rng.integers(-8, 9, (M, N)) * 1.0,
    }
    c = spatialc.evaluate(p, x)
    want = (x["A"] @ x["B"]) * x["s_tok"][:, None] * x["s_ch"][None, :] + x["bias"] + x["residual"]
    ok, how = spatialc.tolerance(p).check(c, x)
    print(f"{p.name}: {p.plan.grid[0]}x{p.plan.grid[1]} items, verified; {'OK' if ok else 'WRONG'} ({how})")
    assert ok and np.array_equal(c, want.astype(np.float32))
    art = spatialc.lower(p, "sm_90")
    print(f"CUDA: the {art.budget.form} form — {art.notes[-1] if art.notes else 'its own choice'}")


if __name__ == "__main__":
    main()

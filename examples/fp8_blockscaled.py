"""A block-scaled e4m3 GEMM, DeepGEMM's layout: one scale per row of A and 128 of K ("1x128"), one per 128 of K and
128 columns of B ("128x128").

    C = Σ_g (A_g @ B_g) · scale_a[i, g] · scale_b[g, j // 128]      over each 128 of K

It quantises float32 A and B block by block (each block's largest magnitude to e4m3's 448), builds, verifies and
interprets the program, checks the interpreter against numpy's float64 product of the unquantised matrices (within
e4m3's rounding), and, where g++ is at hand, runs the printed sm_89 kernel through the host emulation within the
kernel's bound (`spatialc.tolerance(p, kernel=True)`: numerics.md, "Block-scaled 8-bit float GEMMs").

    python examples/fp8_blockscaled.py
"""

from __future__ import annotations

import shutil

import ml_dtypes
import numpy as np

import spatialc

M, N, K, GROUP = 96, 256, 512, 128
E4M3_MAX = 448.0


def quantised(x: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """x as e4m3 values and one float32 scale per block of rows × cols: x ≈ values · scale."""
    r, c = x.shape[0] // rows, x.shape[1] // cols
    blocks = np.abs(x).reshape(r, rows, c, cols).max(axis=(1, 3))
    scale = (blocks / E4M3_MAX).astype(np.float32)
    spread = np.repeat(np.repeat(scale, rows, axis=0), cols, axis=1)
    return (x / spread).astype(ml_dtypes.float8_e4m3fn), scale


def main() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    a[:, :GROUP] *= 50  # groups of very different magnitudes: what per-group scales are for
    qa, sa = quantised(a, 1, GROUP)  # "1x128": (M, K / 128)
    qb, sb = quantised(b, GROUP, GROUP)  # "128x128": (K / 128, N / 128)

    p = spatialc.build(spatialc.gemm(M, N, K, "e4m3", scales=("1x128", "128x128")), "sm_89")
    inputs = {"A": qa, "B": qb, "scale_a": sa, "scale_b": sb}
    c = spatialc.evaluate(p, inputs)
    exact = a @ b
    print(f"{p.name}: verified; interpreter vs float64 A @ B: {np.abs(c - exact).max() / np.abs(exact).max():.2e}")
    print("  (of C's largest: e4m3 keeps 3 fraction bits of each A and B value)")
    ok, how = spatialc.tolerance(p).check(c, inputs)
    print(f"  interpreter vs the block-scaled reference: {'OK' if ok else 'WRONG'}, {how}")
    if shutil.which("g++"):
        art = spatialc.lower(p)
        ok, how = spatialc.tolerance(p, kernel=True).check(spatialc.emulate(art, inputs), inputs)
        print(f"  {art.budget.form} kernel, emulated: {'OK' if ok else 'WRONG'}, {how}")


if __name__ == "__main__":
    main()

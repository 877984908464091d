"""Kernels that reduce rows: the softmax and the RMS norm an LLM's layers run around their GEMMs.

Each is written in the IR's own terms — reads of x, row reductions (each row's max, its sum, its sum of squares)
and maps that read a row's value back (x − max) — and planned as bands of rows, read once a reduction and once for
the output. verify proves every reduction covers each column of its row exactly once, with its declared op, and
each map reads its own rows' value; the interpreter runs it, compared here with numpy. The general CUDA form prints
its kernel (`spatialc.lower(p)`; `spatialc.emulate` runs it on the CPU, `spatialc.run` on a GPU).

    python examples/rows.py      # builds, verifies and checks both
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

import spatialc

M, N = 300, 1000  # rows of 1000 values: not a multiple of 16, so each row's last tile is padded (and masked)
EPS = 1e-6


def numpy_of(name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The same functions with numpy alone, in float64 on the bf16-rounded x."""
    if name == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS) * w


def main() -> None:
    rng = np.random.default_rng(0)
    x = 3 * rng.standard_normal((M, N))
    w = rng.standard_normal(N)
    for name, program in (("softmax", spatialc.softmax(M, N)), ("rmsnorm", spatialc.rmsnorm(M, N, eps=EPS))):
        p = spatialc.build(program, "sm_90")
        inputs = {"x": x, "weight": w} if name == "rmsnorm" else {"x": x}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", spatialc.InexactInputWarning)  # normal values are not bf16 values
            out = spatialc.evaluate(p, inputs)
            ok, how = spatialc.tolerance(p, kernel=True).check(out, inputs)
        want = numpy_of(name, x.astype(ml_dtypes.bfloat16).astype(np.float64), w)
        err = float(np.max(np.abs(out - want) / np.maximum(np.abs(want), 1e-30)))
        plan = p.plan
        art = spatialc.lower(p)
        print(
            f"{name}: {M}x{N} bf16, bands of {plan.block.osh} tile row(s) read {plan.block.ibw} tiles a page on"
            f" {len(p.placement.items_of_site)} sites; verified, {'OK' if ok else 'MISMATCH'} against its bound;"
            f" largest relative difference from numpy {err:.1e}; kernel: the {art.budget.form} form,"
            f" {art.launch.block} threads a block"
        )
        if not ok or err > 1e-5:
            raise SystemExit(f"{name}: {how}")


if __name__ == "__main__":
    main()

"""Kernels that reduce rows: the softmax, the RMS norm (alone, and fused with the residual add before it) and the layer
norm an LLM's layers run around their GEMMs, and a row reduction of its own (each row's max |x|, an fp8 quantiser's
per-token scale).

Each is written in the IR's own terms — reads of x, row reductions (each row's max, its sum, its sum of squares)
and maps that read a row's value back (x − max) — and planned as bands of rows, read once a reduction and once for
the output. verify proves every reduction covers each column of its row exactly once, with its declared op, and
each map reads its own rows' value; the interpreter runs it, compared here with numpy. A row program writes any
number of outputs, which `evaluate` gives by name: the layer norm three, as torch's native_layer_norm (out, and each
row's mean and rstd, m × 1); the fused add + RMSNorm two, as vLLM's fused_add_rms_norm (out, and residual_out = x +
residual in x's type) — each of its two passes reads x and residual and adds them, the last once for both; the row
absmax one m × 1 output and nothing of the rows' shape. The general CUDA form prints each kernel
(`spatialc.lower(p)`; `spatialc.emulate` runs it on the CPU, `spatialc.run` on a GPU, each output by name).

    python examples/rows.py      # builds, verifies and checks all five
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

import spatialc

M, N = 300, 1000  # rows of 1000 values: not a multiple of 16, so each row's last tile is padded (and masked)
EPS = 1e-6
LN_EPS = 1e-5  # torch's layer norm's default


def bf16(a: np.ndarray) -> np.ndarray:
    """`a` rounded to bf16, as float64."""
    return a.astype(ml_dtypes.bfloat16).astype(np.float64)


def numpy_of(
    name: str, x: np.ndarray, r: np.ndarray, w: np.ndarray, b: np.ndarray
) -> np.ndarray | dict[str, np.ndarray]:
    """The same functions with numpy alone, in float64 on the bf16-rounded x and r (the layer norm's as torch computes
    it: the variance in two passes; the fused add's h = x + r in float32, as vLLM's kernel adds)."""
    if name == "fused_add_rmsnorm":
        h = (x + r).astype(np.float32).astype(np.float64)
        return {"out": h / np.sqrt((h * h).mean(axis=1, keepdims=True) + EPS) * w, "residual_out": bf16(h)}
    if name == "row_absmax":
        return np.abs(x).max(axis=1, keepdims=True)
    if name == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if name == "layernorm":
        mean = x.mean(axis=1, keepdims=True)
        rstd = 1 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + LN_EPS)
        return {"out": (x - mean) * rstd * w + b, "mean": mean, "rstd": rstd}
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS) * w


def largest_difference(out, want, floor: float = 1e-30) -> float:
    """The largest relative difference, over every output where there are several (a layer norm's out relative to
    at least 1: w · x̂ + b cancels to values near 0, where float32's rounding of its terms is all that is left)."""
    if isinstance(want, dict):
        return max(largest_difference(out[k], want[k], 1.0) for k in want)
    return float(np.max(np.abs(out - want) / np.maximum(np.abs(want), floor)))


def main() -> None:
    rng = np.random.default_rng(0)
    x, r = 3 * rng.standard_normal((M, N)), rng.standard_normal((M, N))
    w, b = rng.standard_normal(N), rng.standard_normal(N)
    programs = (
        ("softmax", spatialc.softmax(M, N)),
        ("rmsnorm", spatialc.rmsnorm(M, N, eps=EPS)),
        ("layernorm", spatialc.layernorm(M, N, eps=LN_EPS)),
        ("fused_add_rmsnorm", spatialc.rmsnorm(M, N, eps=EPS, residual=True)),  # outputs out and residual_out
        ("row_absmax", spatialc.row_reduce(M, N, "absmax")),  # out: M x 1, float32
    )
    given = {
        "softmax": {"x": x},
        "rmsnorm": {"x": x, "weight": w},
        "layernorm": {"x": x, "weight": w, "bias": b},
        "fused_add_rmsnorm": {"x": x, "residual": r, "weight": w},
        "row_absmax": {"x": x},
    }
    for name, program in programs:
        p = spatialc.build(program, "sm_90")
        inputs = given[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", spatialc.InexactInputWarning)  # normal values are not bf16 values
            out = spatialc.evaluate(p, inputs)
            ok, how = spatialc.tolerance(p, kernel=True).check(out, inputs)
        want = numpy_of(name, bf16(x), bf16(r), w, b)
        err = largest_difference(out, want)
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

"""Kernels with no matmul: the elementwise maps an LLM's layers run between their GEMMs.

Each is one formula of the elementwise table (`spatialc.ew`: every op defined once — its meaning, its C, its error
bound), applied to the same element of each input. spatialc plans it (blocks of tiles streamed through a ring per
input), verify proves that each output tile is the formula of the same tile of every input — the right tensor, the
right tile, each column vector at its own column — and the interpreter runs it, compared here with numpy.

A kernel may write several outputs, each its own formula of the same inputs, read once: rotary embedding (RoPE)
rotates each pair of halves, out1 = x1·cos − x2·sin and out2 = x2·cos + x1·sin, in one kernel (`rope` below).

    python examples/elementwise.py      # builds, verifies and checks three of them, and RoPE
"""

from __future__ import annotations

import warnings

import numpy as np

import spatialc
from spatialc import ew

M, N = 256, 688  # a slice of an MLP's hidden layer: N not a multiple of 16, so the last tiles are padded

x, gate, residual = ew.inputs(3)
KERNELS = {
    # SwiGLU's gate: silu(gate) · x, the two halves of an up-projection.
    "swiglu": (ew.silu(gate) * x, ("x", "gate")),
    # A residual add with a bias: x + residual + b, b one value per column.
    "residual": (x + ew.x(1) + ew.col("b"), ("x", "residual")),
    # A clipped leaky ReLU: where and clamp, written with operators.
    "leaky": (ew.clamp(ew.where(x > 0, x, 0.01 * x), lo=-6.0, hi=6.0), ("x",)),
}


def numpy_of(name: str, v: dict[str, np.ndarray]) -> np.ndarray:
    """The same formulas, written with numpy alone (float64 on the bf16-rounded inputs)."""
    if name == "swiglu":
        g = v["gate"]
        return g / (1.0 + np.exp(-g)) * v["x"]
    if name == "residual":
        return v["x"] + v["residual"] + v["b"]
    return np.clip(np.where(v["x"] > 0, v["x"], 0.01 * v["x"]), -6.0, 6.0)


def main() -> None:
    rng = np.random.default_rng(0)
    for name, (expr, names) in KERNELS.items():
        p = spatialc.build(spatialc.elementwise(expr, M, N, "bf16", names=names), "sm_90")
        inputs = {t.name: rng.normal(size=t.elems) for t in p.tensors if t.role.value in ("input", "parameter")}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", spatialc.InexactInputWarning)  # normal values are not bf16 values
            out = spatialc.evaluate(p, inputs)
        rounded = {k: v if k == "b" else spatialc.numerics.rounding.round_bf16(v) for k, v in inputs.items()}
        want = numpy_of(name, rounded)
        err = float(np.max(np.abs(out - want)) / np.max(np.abs(want)))  # float32 rounding: ~6e-8 of the largest
        ok, how = spatialc.tolerance(p).check(out, inputs)
        print(
            f"{name:9s} {p.plan.grid[0]}x{p.plan.grid[1]} items of {p.plan.item_tiles} tiles: verified,"
            f" {'OK' if ok else 'WRONG'} ({how}); against numpy's own formula, largest difference {err:.1e} of"
            " the largest value"
        )
        assert ok and err < 1e-6


def rope() -> None:
    """RoPE's rotation of the two halves of each head's vector, x1 and x2 (separate tensors, as a model splits them),
    by cos and sin of each position's angles (tensors of the same shape): two outputs, one kernel."""
    x1, x2, cos, sin = ew.inputs(4)
    halves = {"out1": x1 * cos - x2 * sin, "out2": x2 * cos + x1 * sin}
    p = spatialc.build(spatialc.elementwise(halves, M, N, "bf16", names=("x1", "x2", "cos", "sin")), "sm_90")
    rng = np.random.default_rng(1)
    angles = rng.uniform(0, 2 * np.pi, (M, N))
    inputs = {
        "x1": rng.normal(size=(M, N)),
        "x2": rng.normal(size=(M, N)),
        "cos": np.cos(angles),
        "sin": np.sin(angles),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        out = spatialc.evaluate(p, inputs)
    v = {k: spatialc.numerics.rounding.round_bf16(a) for k, a in inputs.items()}
    want = {"out1": v["x1"] * v["cos"] - v["x2"] * v["sin"], "out2": v["x2"] * v["cos"] + v["x1"] * v["sin"]}
    err = max(float(np.max(np.abs(out[k] - want[k])) / np.max(np.abs(want[k]))) for k in want)
    ok, how = spatialc.tolerance(p).check(out, inputs)
    print(f"rope      two outputs, one kernel: verified, {'OK' if ok else 'WRONG'} ({how}); against numpy, {err:.1e}")
    assert ok and err < 1e-6


if __name__ == "__main__":
    main()
    rope()

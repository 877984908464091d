"""Inputs of W4A16 programs for the tests: exact ones (small integers and powers of two: every sum exact, so a
result equals the reference bit for bit in any order) and real-valued ones."""

from __future__ import annotations

import numpy as np

import spatialc
from spatialc.ir.nodes import DType, TensorRole
from spatialc.numerics import w4

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def w4_program(m: int, n: int, k: int, fmt: str = "int4", prec: str = "bf16", **kw) -> spatialc.SpatialProgram:
    target = kw.pop("target", "sm_90")
    build = {x: kw.pop(x) for x in ("block", "sites", "depth", "placement", "sub_blocks", "split_k", "form") if x in kw}
    return spatialc.build(spatialc.gemm(m, n, k, prec, weights=fmt, **kw), target, **build)


def weights_of(p: spatialc.SpatialProgram, rng: np.random.Generator) -> np.ndarray:
    b = p.tensor_named("B")
    k, n = b.elems
    if b.dtype == DType.E2M1:
        return E2M1[rng.integers(0, 8, (k, n))] * rng.choice([-1, 1], (k, n))
    lo, hi = w4.FOUR_BIT_RANGE[b.dtype]
    return rng.integers(lo, hi + 1, (k, n)).astype(np.float64)


def w4_inputs(p: spatialc.SpatialProgram, seed: int = 0, exact: bool = True, packed: bool = True) -> dict:
    """A, B (packed bytes where `packed`), scale, zeros and any epilogue tensors of `p`."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for t in p.tensors:
        if t.role in (TensorRole.OUTPUT, TensorRole.WORKSPACE):
            continue
        if t.name == "B":
            q = weights_of(p, rng)
            fmt = {DType.INT4: "int4", DType.UINT4: "uint4", DType.E2M1: "mxfp4"}[t.dtype]
            out["B"] = w4.pack_int4(q, fmt) if packed else q
        elif t.name == "scale":
            e = rng.integers(-4, 2, t.elems)
            out["scale"] = 2.0**e if exact or t.dtype == DType.E8M0 else rng.uniform(0.002, 0.05, t.elems)
        elif t.name == "zeros":
            lo, hi = w4.FOUR_BIT_RANGE[t.dtype]
            out["zeros"] = rng.integers(lo, hi + 1, t.elems)
        elif t.role == TensorRole.INPUT:
            out[t.name] = rng.integers(-3, 4, t.elems).astype(np.float32) if exact else rng.standard_normal(t.elems)
        else:
            out[t.name] = rng.integers(-3, 4, t.elems[0] * t.elems[1]).astype(np.float32)
    return out

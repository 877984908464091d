"""Block-scaled 8-bit float GEMMs for the tests: programs and their inputs (scales of the tensors' own shapes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import spatialc
from spatialc.ir.nodes import DType, SpatialProgram
from spatialc.numerics.blockscale import program_scales

FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def scaled(
    m: int, n: int, k: int, scales=("1x128", "128x128"), prec: str = "e4m3", target: str = "sm_89", **kw
) -> SpatialProgram:
    """`spatialc.gemm(m, n, k, prec, scales=scales)` built for `target` (keywords to build)."""
    epilogue = kw.pop("epilogue", ())
    return spatialc.build(spatialc.gemm(m, n, k, prec, scales=scales, epilogue=list(epilogue)), target, **kw)


def inputs_of(p: SpatialProgram, seed: int = 0, spread: float = 4.0) -> dict[str, np.ndarray]:
    """A and B of the operand type (normal values), each scale a power of two times a float32 value in
    [1, 2): scales that differ from group to group, row to row and column to column by up to 2^±`spread` (an MX
    program's: the powers of two alone, float8_e8m0fnu arrays)."""
    rng = np.random.default_rng(seed)
    fmt = FORMATS[p.precision.value]
    a, b = (p.tensor(t).elems for t in _operands(p))
    out = {"A": rng.normal(size=a).astype(fmt), "B": rng.normal(size=b).astype(fmt)}
    scales = program_scales(p)
    assert scales is not None
    for s in (scales.a, scales.b):
        t = p.tensor(s.tensor)
        size = t.elems
        powers = np.exp2(rng.integers(-spread, spread + 1, size=size))
        if t.dtype == DType.E8M0:  # MX's scales: the powers of two alone, as float8_e8m0fnu
            out[t.name] = powers.astype(ml_dtypes.float8_e8m0fnu)
            continue
        out[t.name] = (rng.uniform(1, 2, size=size) * powers).astype(np.float32)
    return out


def _operands(p: SpatialProgram):
    names = {t.name: t.id for t in p.tensors}
    return names["A"], names["B"]


def naive(p: SpatialProgram, ins: dict[str, np.ndarray], step: int = 128) -> np.ndarray:
    """Σ over each `step` of K (128; OCP MX's 32) of (A_g @ B_g) · sa · sb, each scale looked up element by element
    from its layout, in float64: written apart from numerics.blockscale, from the layouts' definition."""
    scales = program_scales(p)
    assert scales is not None
    a, b = (np.asarray(ins[x], np.float64) for x in ("A", "B"))
    sa, sb = (np.asarray(ins[p.tensor(s.tensor).name], np.float64) for s in (scales.a, scales.b))
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n))
    for k0 in range(0, k, step):
        part = a[:, k0 : k0 + step] @ b[k0 : k0 + step]
        for i in range(m):
            for j in range(n):
                s_a = sa[i // scales.a.outer, k0 // scales.a.k]
                s_b = sb[k0 // scales.b.k, j // scales.b.outer]
                out[i, j] += part[i, j] * (s_a * s_b)
    return out

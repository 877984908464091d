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


# Scale codes at float8_e8m0fnu's ends (issue 46): sa · sb = 2^(ca + cb − 254) past float32's range where each
# promoted partial sum is not. Each regime's A, B and codes, for a program whose K is 8 groups of 32.
EXTREME = ("overflow", "underflow", "mixed")


def extreme_inputs(p: SpatialProgram, regime: str, seed: int = 0) -> dict[str, np.ndarray]:
    """An MX program's inputs with e8m0 codes at 0, 1, 253 and 254, whose C lies in float32's normal range:
    "overflow": tiny A and B (below 2^-6), A's codes 254 and B's 128, 129 (sa · sb up to 2^130), a group of a row of
    A and of a column of B all zero (0 · inf in a float32 product of the scales); "underflow": A and B in
    [384, 448], A's codes 0 and B's 104 (sa · sb = 2^-150, 0 in float32; C 2^-125 or more);
    "mixed": even rows of A and columns of B tiny, odd ones large, A's codes 253, 254 on the tiny rows and 0, 1 on
    the large, B's 128, 129 and 100, 101 — products of scales from 2^-154 to 2^129, random signs."""
    rng = np.random.default_rng(seed)
    fmt, e8m0 = FORMATS[p.precision.value], ml_dtypes.float8_e8m0fnu
    (m, k), (_, n) = (p.tensor(t).elems for t in _operands(p))
    g = k // 32

    def tiny(*shape):
        return rng.choice([-1, 1], shape) * rng.uniform(2.0**-9, 2.0**-6, shape)

    def large(*shape, sign=True):  # (positive: |C| at least 2.7 times float32's smallest normal under "underflow")
        return rng.choice([-1, 1], shape) * rng.uniform(64, 448, shape) if sign else rng.uniform(384, 448, shape)

    def codes(lo, hi, shape):
        return rng.integers(lo, hi + 1, shape)

    if regime == "overflow":
        a, b, ca, cb = tiny(m, k), tiny(k, n), codes(254, 254, (m, g)), codes(128, 129, (g, n))
        a[1, 32:64] = 0
        b[64:96, 2] = 0
    elif regime == "underflow":
        a, b, ca, cb = large(m, k, sign=False), large(k, n, sign=False), codes(0, 0, (m, g)), codes(104, 104, (g, n))
    else:
        a, b = (
            np.where(np.arange(m)[:, None] % 2, large(m, k), tiny(m, k)),
            np.where(np.arange(n)[None, :] % 2, large(k, n), tiny(k, n)),
        )
        ca = np.where(np.arange(m)[:, None] % 2, codes(0, 1, (m, g)), codes(253, 254, (m, g)))
        cb = np.where(np.arange(n)[None, :] % 2, codes(100, 101, (g, n)), codes(128, 129, (g, n)))
    out = {"A": a.astype(fmt), "B": b.astype(fmt)}
    for name, c in (("scale_a", ca), ("scale_b", cb)):
        out[name] = np.exp2(c.astype(np.float64) - 127).astype(e8m0)
    return out

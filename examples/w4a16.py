"""A decode step with 4-bit weights (W4A16): y = x @ dequant(W) for one row of activations, in three formats.

W is 4096 × 1024 weights of GPTQ's int4 (a bf16 scale and an int4 zero point per group of 128 rows and column),
uint4 with float32 scales, and mxfp4 (float4_e2m1fn with an e8m0 scale per 32 rows). Each is packed two a byte
along K by `spatialc.pack_int4` — byte (i, j) holds W[2i, j] in its low nibble, W[2i + 1, j] in its high one — and
handed to the program as those bytes. The program reads the packed pages, dequantises each into a bf16 page
(its own stage, `dequant_B`: scale · (q − zero) at the element's group and column, rounded once to bf16), and
multiplies; verify's rule 8 proves every scale and zero point is read at its own group and column. The interpreter's
result is compared with the numpy reference (numerics/w4.py's definition of the dequant).

    python examples/w4a16.py
"""

from __future__ import annotations

import warnings

import numpy as np

import spatialc
from spatialc.numerics.reference import reference

K, N = 4096, 1024
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def inputs(p: spatialc.SpatialProgram, fmt: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One row of activations, the packed weights, their scales (and zero points)."""
    scale = p.tensor_named("scale")
    if fmt == "mxfp4":
        w = E2M1[rng.integers(0, 8, (K, N))] * rng.choice([-1, 1], (K, N))
        s = 2.0 ** rng.integers(-6, -2, scale.elems)
    else:
        lo, hi = (-8, 7) if fmt == "int4" else (0, 15)
        w = rng.integers(lo, hi + 1, (K, N))
        s = rng.uniform(0.002, 0.02, scale.elems)
    x = {"A": rng.standard_normal((1, K)), "B": spatialc.pack_int4(w, fmt), "scale": s}
    if fmt == "int4":
        x["zeros"] = rng.integers(-8, 8, scale.elems)
    return x


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    asks = {"int4": {"zeros": True}, "uint4": {"scale_type": "float32"}, "mxfp4": {}}
    for fmt, kw in asks.items():
        p = spatialc.build(spatialc.gemm(1, N, K, "bf16", weights=fmt, **kw), "sm_90")
        x = inputs(p, fmt, rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # x and the bf16 scales are rounded to bf16 on the way in, as documented
            y = spatialc.evaluate(p, x)
            same = np.array_equal(y, reference(p, x))
        print(f"{p.name}: verified; y[0, :3] = {y[0, :3]}, equal to the reference: {same}")

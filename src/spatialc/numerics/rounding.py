"""Numerics of the oracle: operands rounded once to their element type, products summed in float64.

int8: every product is at most 128·128 = 2^14 in magnitude and float64 holds every integer below 2^53, so a
reduction over K < 2^39 elements is exact whatever order BLAS sums it in (`INT8_EXACT_K`).
fp16 / bf16: the given values are rounded to the operand type with round-to-nearest-even, once, straight from
float64 (no double rounding through float32); products of such values are exact in float64, and the sum is
rounded only by float64 addition before the result is returned in the output's element type.
e4m3 / e5m2: the same, rounded by ml_dtypes' cast (`narrow.round_fp8`); their products (4 and 3 significant bits)
are exact in float32 already. A computed operand (a page a matmul reads that an earlier stage computed) is rounded
with saturation — past the largest value, ±448 or ±57344, not NaN or ±inf — as a GPU's only float32 → fp8
conversion (cvt.rn.satfinite) does.
"""

from __future__ import annotations

import numpy as np

from ..inputs import FP8_MAX, INT_RANGE, operand_values
from ..interp.errors import NumericError
from ..ir.nodes import FP8, DType
from .narrow import BF16_MAX, round_bf16, round_fp8, round_fp16

# The operand rounding (numerics.narrow) and the input checks (spatialc.inputs), shared with the emulation and the GPU
# launch, are re-exported here, where the interpreter's numerics are stated.
__all__ = [
    "BF16_MAX",
    "INT8_EXACT_K",
    "computed_operand",
    "operand_values",
    "output_values",
    "round_bf16",
    "round_fp16",
]

INT8_EXACT_K = 2**53 // 2**14  # longest int8 reduction float64 sums exactly


def computed_operand(x: np.ndarray, precision: str) -> np.ndarray:
    """Computed values (a packed accumulator, an elementwise stage's) as a matmul multiplies them, in float64: as the
    float32 the kernel holds, rounded to bf16 / fp16 / e4m3 / e5m2 with round-to-nearest-even (the last two
    saturating: `saturated_fp8`); int8 values (a requant's) as they are. The interpreter, the reference, the
    tolerance and verify's padding check all round so."""
    match precision:
        case "bf16":
            return round_bf16(np.asarray(x, np.float32))
        case "fp16":
            return round_fp16(np.asarray(x, np.float32))
    if precision in FP8:
        return saturated_fp8(np.asarray(x, np.float32), DType(precision))
    return np.asarray(x, np.float64)


def saturated_fp8(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Values rounded to the 8-bit float `dtype` (nearest even) with saturation, as float64: what rounds past the
    largest value (±inf too) becomes ±largest; NaN stays NaN (cvt.rn.satfinite's rule)."""
    top = FP8_MAX[dtype]
    return round_fp8(np.clip(x, -top, top), dtype)


def output_values(name: str, x: np.ndarray, dtype: DType) -> np.ndarray:
    """The float64 result in the output tensor's element type (bf16 is returned rounded, as float32)."""
    match dtype:
        case DType.INT8 | DType.INT32 | DType.INT64:
            lo, hi = INT_RANGE[dtype]
            if x.size and (x.min() < lo or x.max() > hi):
                raise NumericError(f"output {name}: a value overflows {dtype.value}")
            return x.astype(np.int64 if dtype == DType.INT64 else np.int32 if dtype == DType.INT32 else np.int8)
        case DType.FLOAT32:
            return x.astype(np.float32)
        case DType.FP16:
            with np.errstate(over="ignore"):
                return x.astype(np.float16)
        case DType.BF16:
            return round_bf16(x).astype(np.float32)
    raise NumericError(f"output {name}: element type {dtype} is not one the interpreter writes")

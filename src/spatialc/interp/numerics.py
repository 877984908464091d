"""Numerics of the oracle: operands rounded once to their element type, products summed in float64.

int8: every product is at most 128·128 = 2^14 in magnitude and float64 holds every integer below 2^53, so a
reduction over K < 2^39 elements is exact whatever order BLAS sums it in (`INT8_EXACT_K`).
fp16 / bf16: the given values are rounded to the operand type with round-to-nearest-even, once, straight from
float64 (no double rounding through float32); products of such values are exact in float64, and the sum is
rounded only by float64 addition before the result is returned in the output's element type.
"""

from __future__ import annotations

import numpy as np

from ..ir.nodes import DType
from .errors import InputError, NumericError

INT8_EXACT_K = 2**53 // 2**14  # longest int8 reduction float64 sums exactly
BF16_MAX = (2.0 - 2.0**-7) * 2.0**127
BF16_MIN_EXP = -126  # below 2^-126 bf16 is subnormal: the spacing stays 2^(-126-7)
BF16_MANT_BITS = 7

_INT_RANGE = {DType.INT8: (-128, 127), DType.INT32: (-(2**31), 2**31 - 1), DType.INT64: (-(2**63), 2**63 - 1)}


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float64 → the nearest bfloat16 value (ties to even) as float64; overflow → ±inf, nan stays nan."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0.0)
    _, e = np.frexp(xf)  # |x| in [2^(e-1), 2^e)
    # Scaling by the power of two that makes the bf16 spacing 1 is exact, so np.rint (ties to even) rounds the
    # float64 value once — exactly what rounding its bits would do, subnormals included.
    q = np.maximum(e - 1, BF16_MIN_EXP) - BF16_MANT_BITS
    r = np.ldexp(np.rint(np.ldexp(xf, -q)), q)
    r = np.where(np.abs(r) > BF16_MAX, np.copysign(np.inf, xf), r)
    return np.where(finite, r, x)


def round_fp16(x: np.ndarray) -> np.ndarray:
    """float64 → the nearest float16 value (ties to even) as float64; numpy's cast rounds from float64 directly."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def operand_values(name: str, values: np.ndarray, dtype: DType) -> np.ndarray:
    """An array whose values, read as float64, are exactly what a tensor of `dtype` holds; or InputError.

    Integer arrays that fit are returned as they are (the store's float64 assignment is the only copy)."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        raise InputError(f"tensor {name}: expected numbers, got an array of {arr.dtype}")
    match dtype:
        case DType.FP16:
            return round_fp16(arr)
        case DType.BF16:
            return round_bf16(arr)
        case DType.FLOAT32:
            return arr.astype(np.float32)
        case DType.INT8 | DType.INT32 | DType.INT64:
            return _integers(name, arr, dtype)
    raise InputError(f"tensor {name}: element type {dtype} is not one the interpreter reads")


def _integers(name: str, arr: np.ndarray, dtype: DType) -> np.ndarray:
    lo, hi = _INT_RANGE[dtype]
    if arr.dtype.kind == "f" and not np.array_equal(arr, np.trunc(arr)):
        raise InputError(f"tensor {name} is {dtype.value} but holds values that are not whole numbers")
    fits = arr.dtype.kind in "iu" and np.iinfo(arr.dtype).min >= lo and np.iinfo(arr.dtype).max <= hi
    if arr.size and not fits and (arr.min() < lo or arr.max() > hi):
        raise InputError(f"tensor {name} is {dtype.value} but holds values outside {lo}..{hi}")
    if dtype == DType.INT64 and arr.size and max(abs(int(arr.min())), abs(int(arr.max()))) >= 2**53:
        raise InputError(f"tensor {name}: values beyond 2^53 are not exact in the interpreter's float64")
    return arr


def output_values(name: str, x: np.ndarray, dtype: DType) -> np.ndarray:
    """The float64 result in the output tensor's element type (bf16 is returned rounded, as float32)."""
    match dtype:
        case DType.INT8 | DType.INT32 | DType.INT64:
            lo, hi = _INT_RANGE[dtype]
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

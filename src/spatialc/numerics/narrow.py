"""Rounding to the narrow float types — bf16, fp16, e4m3, e5m2 — to nearest even, once, straight from float64.

The one rounding every part of spatialc rounds inputs and operands with (`inputs.operand_values`, the interpreter's
`numerics.rounding`, the W4A16 scales). bf16 and fp16 are rounded on the values' own bits (a float32 array's on
float32's, the same values bit for bit); the 8-bit floats by ml_dtypes' cast, imported only when one is rounded.
Large arrays are rounded a chunk at a time, so that the temporaries stay a few MiB.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.nodes import DType

FLOAT32_MAX = (2.0 - 2.0**-23) * 2.0**127  # 3.4028234663852886e38: the largest finite float32
BF16_MAX = (2.0 - 2.0**-7) * 2.0**127
BF16_MIN_EXP = -126  # below 2^-126 bf16 is subnormal: the spacing stays 2^(-126-7)
BF16_MANT_BITS = 7
FP8_NAMES = {DType.E4M3: "float8_e4m3fn", DType.E5M2: "float8_e5m2"}  # ml_dtypes' (and torch's) names


def round_fp8(x: Any, dtype: DType) -> np.ndarray:
    """float64 (or float32) → the nearest value of the 8-bit float `dtype` (ties to even), as float64: ml_dtypes'
    cast, which rounds once from the value given (no double rounding through float32). Past the largest value
    e5m2 gives ±inf; e4m3fn NaN (check_values refuses such an input first); NaN stays NaN."""
    import ml_dtypes

    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x).astype(getattr(ml_dtypes, FP8_NAMES[dtype])).astype(np.float64)


def round_e4m3(x: Any) -> np.ndarray:
    """`round_fp8` to e4m3 (float8_e4m3fn)."""
    return round_fp8(x, DType.E4M3)


def round_e5m2(x: Any) -> np.ndarray:
    """`round_fp8` to e5m2 (float8_e5m2)."""
    return round_fp8(x, DType.E5M2)


def round_bf16(x: Any) -> np.ndarray:
    """float64 → the nearest bfloat16 value (ties to even) as float64; overflow → ±inf, nan stays nan. A float32
    array is rounded on its own bits (`_round_bf16_f32`), a third of the work, to the same values bit for bit."""
    x = np.asarray(x)
    if x.dtype == np.float32:  # rounded on float32's bits, then widened exactly
        return _round_bf16_f32(x).astype(np.float64)
    if x.size > ROUND_CHUNK:
        return _by_chunks(_round_bf16, x, np.empty(x.shape))
    return _round_bf16(x)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # a float64 value near its own largest rounds up past it: inf, as it should
        return _round_bf16_core(np.asarray(x, dtype=np.float64))


def _round_kept(u: np.ndarray, dropped: int, out: np.ndarray | None = None) -> np.ndarray:
    """The one rounding to nearest even on an IEEE float's bits `u` (uint32 or uint64; a new array, or `out`, an array
    of u's shape and type that is not u): add half an ulp of what is kept less one, plus the kept last bit, then clear
    the `dropped` low bits. A carry into the exponent is the rounding up it should be; NaN, and what rounds past the
    format's largest value, are the caller's."""
    one = u.dtype.type(1)
    r = np.right_shift(u, u.dtype.type(dropped), out=out)
    r &= one
    r += u
    r += u.dtype.type((1 << (dropped - 1)) - 1)
    r &= ~u.dtype.type((1 << dropped) - 1)
    return r


F32_DROPPED_BITS = 23 - BF16_MANT_BITS  # bf16 is float32's top 16 bits: the same exponent range and subnormals
_F32_ABS = np.uint32(0x7FFFFFFF)
_F32_INF_BITS = np.uint32(0x7F800000)
_F32_QUIET = np.uint32(0x00400000)


def _round_bf16_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values → the nearest bf16 value, as float32: `_round_kept` on float32's bits, where bf16's
    subnormals are float32's and a carry past bf16's largest lands exactly on inf's bits. Rounding the float32 value
    is rounding the float64 one, which holds it exactly; a NaN stays the NaN float64 made of it (quieted, its payload
    kept). A new array, the shape of `x`; or `out`, a contiguous float32 array of x's size, written in place."""
    f = np.ascontiguousarray(x).reshape(-1)
    u = f.view(np.uint32)
    r = _round_kept(u, F32_DROPPED_BITS, None if out is None else out.reshape(-1).view(np.uint32))
    if f.size and np.isnan(f.max()):  # (a max meets every NaN: one pass, no mask, where there is none)
        nan = (u & _F32_ABS) > _F32_INF_BITS
        r[nan] = u[nan] | _F32_QUIET
    return r.view(np.float32).reshape(np.shape(x))


DROPPED_BITS = 52 - BF16_MANT_BITS  # float64's fraction bits that bf16 does not keep
_SIGN = np.uint64(1 << 63)
_ABS = np.uint64((1 << 63) - 1)
_INF_BITS = np.uint64(0x7FF << 52)
_BF16_MAX_BITS = np.array(BF16_MAX).view(np.uint64)[()]
_BF16_MIN_NORMAL_BITS = np.array(2.0**BF16_MIN_EXP).view(np.uint64)[()]


def _round_bf16_core(x: np.ndarray) -> np.ndarray:
    """Ties to even on float64's bits where bf16 is normal (`_round_kept`); past BF16_MAX, ±inf; NaN and ±inf as
    they are; results below bf16's least normal by `_round_bf16_scaled`."""
    shape = np.shape(x)
    u = np.ascontiguousarray(x).reshape(-1).view(np.uint64)
    mag = u & _ABS
    r = _round_kept(u, DROPPED_BITS)
    over = (r & _ABS) > _BF16_MAX_BITS
    if over.any():
        r[over] = (u[over] & _SIGN) | _INF_BITS
    odd = (mag >= _INF_BITS) | (mag < _BF16_MIN_NORMAL_BITS)  # NaN, ±inf, zero and bf16's subnormals
    if odd.any():
        r[odd] = _round_bf16_scaled(u[odd].view(np.float64)).view(np.uint64)
    return r.view(np.float64).reshape(shape)


def _round_bf16_scaled(x: np.ndarray) -> np.ndarray:
    """The same rounding by scaling each value to bf16's spacing: slower, and the definition the bits agree with."""
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0.0)
    _, e = np.frexp(xf)  # |x| in [2^(e-1), 2^e)
    # Scaling by the power of two that makes the bf16 spacing 1 is exact, so np.rint (ties to even) rounds the
    # float64 value once — exactly what rounding its bits would do, subnormals included.
    q = np.maximum(e - 1, BF16_MIN_EXP) - BF16_MANT_BITS
    r = np.ldexp(np.rint(np.ldexp(xf, -q)), q)
    r = np.where(np.abs(r) > BF16_MAX, np.copysign(np.inf, xf), r)
    return np.where(finite, r, x)


def round_fp16(x: Any) -> np.ndarray:
    """float64 → the nearest float16 value (ties to even) as float64; numpy's cast rounds from float64 directly (its
    float16 conversions are software, ~2 ns a value: a float32 array is rounded on its bits, `_round_fp16_f32`)."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return _round_fp16_f32(x).astype(np.float64)
    if x.size > ROUND_CHUNK:
        return _by_chunks(round_fp16, x, np.empty(x.shape))
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


F16_DROPPED_BITS = 23 - 10  # float32's fraction bits that a normal fp16 does not keep
_F32_SIGN = np.uint32(0x80000000)
_F16_MAX_BITS = np.float32(65504.0).view(np.uint32)
_F16_MIN_NORMAL_BITS = np.float32(2.0**-14).view(np.uint32)
_F16_SUBNORMAL_SHIFT = np.float32(0.75)  # float32's spacing in [0.5, 1) is 2^-24, fp16's subnormals' spacing
_F16_NAN_KEPT = ~np.uint32((1 << F16_DROPPED_BITS) - 1)


def _round_fp16_f32(x: np.ndarray) -> np.ndarray:
    """float32 values → the nearest fp16 value (ties to even), as float32: `_round_kept` on float32's bits where
    fp16 is normal, ±inf past fp16's largest; below 2^-14 one float32 addition of 0.75 rounds to fp16's subnormal
    spacing, 2^-24 (ties to even: 0.75 is an even multiple of it), and its subtraction is exact; a NaN quieted with
    the payload fp16 keeps, as the cast through float64 and float16 gave. A new array, the shape of `x`."""
    f = np.ascontiguousarray(x).reshape(-1)
    u = f.view(np.uint32)
    r = _round_kept(u, F16_DROPPED_BITS)
    mag = u & _F32_ABS
    over = (r & _F32_ABS) > _F16_MAX_BITS  # also ±inf, and NaNs, put right below
    if over.any():
        r[over] = (u[over] & _F32_SIGN) | _F32_INF_BITS
    small = mag < _F16_MIN_NORMAL_BITS
    if small.any():
        tiny = f[small]
        r[small] = np.copysign((tiny + _F16_SUBNORMAL_SHIFT) - _F16_SUBNORMAL_SHIFT, tiny).view(np.uint32)
    nan = mag > _F32_INF_BITS
    if nan.any():
        r[nan] = (u[nan] | _F32_QUIET) & _F16_NAN_KEPT
    return r.view(np.float32).reshape(np.shape(x))


# The same rounding, a float32 array's (an 8-bit float's cast from float32 is as exact as from float64)
_ON_FLOAT32 = {round_bf16: _round_bf16_f32, round_fp16: _round_fp16_f32, round_e4m3: round_e4m3, round_e5m2: round_e5m2}


def as_float32(arr: np.ndarray, rnd: Any) -> np.ndarray:
    """`arr` rounded by `rnd` (to bf16, fp16, e4m3 or e5m2) as float32, which holds each such value exactly: `arr`
    itself where it is a float32 array of such values already (no copy), else a new array made a chunk at a time (a
    float32 array's on its own bits, the same values)."""
    if arr.dtype == np.float32:
        rnd = _ON_FLOAT32[rnd]
        if all(_holds(rnd, part) for part in chunks(arr.reshape(-1))):
            return arr
        if rnd is _round_bf16_f32:  # each chunk's bits rounded straight into the result: no temporaries
            out = np.empty(arr.shape, np.float32)
            for part, into in zip(chunks(arr.reshape(-1)), chunks(out.reshape(-1)), strict=True):
                _round_bf16_f32(part, into)
            return out
    return _by_chunks(rnd, arr, np.empty(arr.shape, np.float32))


def _holds(rnd: Any, part: np.ndarray) -> bool:
    """Whether the float32 values `part` round to themselves: for bf16 (float32's top 16 bits, subnormals and
    infinities alike) whether their low 16 bits are zero, NaNs aside."""
    if rnd is _round_bf16_f32:
        for piece in (part[:HOLDS_HEAD], part):  # (an input of other values mostly shows it in its first few)
            low = (piece.view(np.uint32) & 0xFFFF) != 0
            if low.any() and not np.isnan(piece[low]).all():
                return False
        return True
    return np.array_equal(rnd(part), part, equal_nan=True)


HOLDS_HEAD = 1024  # values `_holds` looks at first


ROUND_CHUNK = 1 << 20  # elements rounded at once: the rounding's float64 temporaries stay a few MiB


def chunks(flat: np.ndarray) -> Any:
    """`flat` (one dimension) in pieces of ROUND_CHUNK elements."""
    return (flat[i : i + ROUND_CHUNK] for i in range(0, flat.size, ROUND_CHUNK))


def _by_chunks(fn: Any, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[...] = fn(x), a block of leading rows at a time, so that fn's temporaries stay within ROUND_CHUNK
    elements whatever the size of x (a view, strided or not: nothing is copied whole)."""
    if x.size <= ROUND_CHUNK or x.ndim == 0:
        out[...] = fn(x)
    elif x.ndim == 1:
        for i in range(0, x.size, ROUND_CHUNK):
            out[i : i + ROUND_CHUNK] = fn(x[i : i + ROUND_CHUNK])
    elif x[0].size > ROUND_CHUNK:  # one leading row is more than a chunk: each row's own rows (x[i : i + 1] would be x)
        for i in range(x.shape[0]):
            _by_chunks(fn, x[i], out[i])
    else:
        per = ROUND_CHUNK // max(1, x[0].size)
        for i in range(0, x.shape[0], per):
            _by_chunks(fn, x[i : i + per], out[i : i + per])
    return out

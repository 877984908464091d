"""Fixed-point requantisation, bit-exact everywhere (interpreter, CUDA kernel, host emulation).

The scheme is TFLite's and gemmlowp's:

    multiplier, shift = quantize_multiplier(scale)   # scale ≈ multiplier · 2^(shift − 31), multiplier in [2^30, 2^31)
    y = clamp(MultiplyByQuantizedMultiplier(x, multiplier, shift) + zero_point, −128, 127)

    MultiplyByQuantizedMultiplier(x, M, s) = RoundingDivideByPOT(SRDHM(x · 2^max(s, 0), M), max(−s, 0))
    SRDHM(a, b)  = saturating rounding doubling high multiply: (a·b + nudge) / 2^31 truncated toward zero,
                   nudge = 2^30 if a·b ≥ 0 else 1 − 2^30; SRDHM(−2^31, −2^31) = 2^31 − 1
    RoundingDivideByPOT(x, e) = (x >> e) + (1 if (x & (2^e − 1)) > ((2^e − 1) >> 1) + (1 if x < 0 else 0) else 0)
                   (an arithmetic shift: rounds to nearest, ties away from zero)

Where spatialc differs from a literal int32 implementation it says so: the epilogue's integer arithmetic before
requantisation is exact (64-bit), and requantisation saturates its input to int32 first, and saturates
x · 2^left_shift to int32, where the C++ original would overflow.
"""

from __future__ import annotations

import math

import numpy as np

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class QuantError(ValueError):
    """A scale that cannot be represented as a positive Q31 multiplier and shift."""


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """(multiplier, shift) with scale = multiplier · 2^(shift − 31), multiplier in [2^30, 2^31) (0, 0 for 0)."""
    if not math.isfinite(scale) or scale < 0:
        raise QuantError(f"requant scale must be a finite number ≥ 0, not {scale!r}")
    if scale == 0:
        return 0, 0
    mantissa, exponent = math.frexp(scale)  # scale = mantissa · 2^exponent, mantissa in [0.5, 1)
    q = math.floor(mantissa * (1 << 31) + 0.5)  # half away from zero, as TFLite's std::round (mantissa > 0)
    if q == 1 << 31:
        q //= 2
        exponent += 1
    if exponent < -31:  # too small to matter: every input rounds to zero
        return 0, 0
    if exponent > 30:
        raise QuantError(f"requant scale {scale!r} is too large (at most 2^30)")
    return q, exponent


def _srdhm(a: np.ndarray, b: int) -> np.ndarray:
    ab = a.astype(np.int64) * np.int64(b)
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    total = ab + nudge
    # Division truncating toward zero, as C++'s int64 division does (numpy's // floors).
    q = np.where(total >= 0, total // (1 << 31), -((-total) // (1 << 31)))
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    return np.where(overflow, INT32_MAX, q).astype(np.int64)


def _rounding_divide_by_pot(x: np.ndarray, exponent: int) -> np.ndarray:
    if exponent == 0:
        return x
    mask = np.int64((1 << exponent) - 1)
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0).astype(np.int64)
    return (x >> exponent) + (remainder > threshold).astype(np.int64)


def requantize(x: np.ndarray, multiplier: int, shift: int, zero_point: int) -> np.ndarray:
    """int8 values of the integer array `x` under (multiplier, shift, zero_point), as the module docstring says."""
    v = np.clip(np.asarray(x, dtype=np.int64), INT32_MIN, INT32_MAX)
    left, right = max(shift, 0), max(-shift, 0)
    v = np.clip(v << left, INT32_MIN, INT32_MAX)
    v = _rounding_divide_by_pot(_srdhm(v, multiplier), right)
    return np.clip(v + zero_point, -128, 127).astype(np.int8)

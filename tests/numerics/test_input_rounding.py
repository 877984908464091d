"""The inputs' rounding to bf16 / fp16 on float32's bits (`narrow._round_bf16_f32`, `narrow._round_fp16_f32`) gives,
bit for bit, what the float64 rounding it replaced gave (kept below as the oracle, as it was in a428103): on every
float32 exponent, sign and NaN payload, on each side of every tie, at the overflow to ±inf and through the subnormals
— as `round_bf16` / `round_fp16`'s float64 results, as `operand_values`' float32 arrays, and in the
`InexactInputWarning` a rounding gives."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from spatialc import inputs
from spatialc.inputs import InexactInputWarning, operand_values, round_bf16, round_fp16, warn_if_rounded
from spatialc.ir.nodes import DType
from spatialc.numerics import narrow

# ---- the oracle: the float64 rounding of a428103, unchanged -------------------------------------------------------

CHUNK = 1 << 20
BF16_MAX = (2.0 - 2.0**-7) * 2.0**127
DROPPED = 52 - 7
HALF_LESS_ONE = np.uint64((1 << (DROPPED - 1)) - 1)
KEPT = np.uint64(~((1 << DROPPED) - 1) & (2**64 - 1))
SIGN, ABS, INF_BITS = np.uint64(1 << 63), np.uint64((1 << 63) - 1), np.uint64(0x7FF << 52)
MAX_BITS = np.array(BF16_MAX).view(np.uint64)[()]
MIN_NORMAL_BITS = np.array(2.0**-126).view(np.uint64)[()]


def old_by_chunks(fn: Any, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    if x.size <= CHUNK or x.ndim == 0:
        out[...] = fn(x)
    elif x.ndim == 1:
        for i in range(0, x.size, CHUNK):
            out[i : i + CHUNK] = fn(x[i : i + CHUNK])
    else:
        per = max(1, CHUNK // max(1, x[0].size))
        for i in range(0, x.shape[0], per):
            old_by_chunks(fn, x[i : i + per], out[i : i + per])
    return out


def old_round_bf16(x: Any) -> np.ndarray:
    x = np.asarray(x)
    if x.size > CHUNK:
        return old_by_chunks(old_round_bf16_one, x, np.empty(x.shape))
    return old_round_bf16_one(x)


def old_round_bf16_one(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.float64)
        shape = np.shape(x)
        u = np.ascontiguousarray(x).reshape(-1).view(np.uint64)
        mag = u & ABS
        r = (u >> np.uint64(DROPPED)) & np.uint64(1)
        r += u
        r += HALF_LESS_ONE
        r &= KEPT
        over = (r & ABS) > MAX_BITS
        if over.any():
            r[over] = (u[over] & SIGN) | INF_BITS
        odd = (mag >= INF_BITS) | (mag < MIN_NORMAL_BITS)
        if odd.any():
            r[odd] = old_round_bf16_scaled(u[odd].view(np.float64)).view(np.uint64)
        return r.view(np.float64).reshape(shape)


def old_round_bf16_scaled(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0.0)
    _, e = np.frexp(xf)
    q = np.maximum(e - 1, -126) - 7
    r = np.ldexp(np.rint(np.ldexp(xf, -q)), q)
    r = np.where(np.abs(r) > BF16_MAX, np.copysign(np.inf, xf), r)
    return np.where(finite, r, x)


def old_round_fp16(x: Any) -> np.ndarray:
    x = np.asarray(x)
    if x.size > CHUNK:
        return old_by_chunks(old_round_fp16, x, np.empty(x.shape))
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def old_operand_values(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """a428103's `operand_values` of a float array for fp16 / bf16 (its `_as_float32` and `_holds`)."""
    if dtype == DType.FP16 and arr.dtype == np.float16:
        return arr
    rnd = old_round_fp16 if dtype == DType.FP16 else old_round_bf16
    flat = arr.reshape(-1)
    parts = [flat[i : i + CHUNK] for i in range(0, flat.size, CHUNK)]

    def holds(part: np.ndarray) -> bool:
        if rnd is old_round_bf16:
            low = (part.view(np.uint32) & 0xFFFF) != 0
            return not low.any() or bool(np.isnan(part[low]).all())
        return np.array_equal(rnd(part), part, equal_nan=True)

    if arr.dtype == np.float32 and all(holds(p) for p in parts):
        return arr
    return old_by_chunks(rnd, arr, np.empty(arr.shape, np.float32))


# ---- the float32 bit patterns compared ----------------------------------------------------------------------------


def every_top_half(lows: list[int], top_bits: int) -> np.ndarray:
    """Every float32 whose top `top_bits` bits are anything and whose other bits are one of `lows`: each sign,
    exponent and kept fraction (NaN payloads in the kept bits included) with each kind of dropped part."""
    tops = np.arange(1 << top_bits, dtype=np.uint64) << np.uint64(32 - top_bits)
    return (tops[:, None] | np.array(lows, np.uint64)[None, :]).reshape(-1).astype(np.uint32).view(np.float32)


# the dropped 16 bits of bf16: exact, just above, just below, on and past the tie
BF16_PATTERNS = every_top_half([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], 16)
# the dropped 13 bits of a normal fp16 likewise, and fp16's subnormals: every multiple of 2^-26 below 2^-13 (exact
# values, ties, quarters), and the float32s on either side of each
_TINY = np.arange(1 << 13, dtype=np.float32) * np.float32(2.0**-26)
_TINY = np.concatenate([_TINY, np.nextafter(_TINY, np.float32(0)), np.nextafter(_TINY, np.float32(1))])
FP16_PATTERNS = np.concatenate(
    [every_top_half([0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF], 19), _TINY, -_TINY, np.float32([65504, 65519.996, 65520])]
)
# zeros, float32 subnormals (rounding up into the normals), ties either way, bf16's largest and the overflow past it,
# ±inf, NaNs whose payload lies in the dropped bits only (the one a plain rounding makes inf), fp16's largest, its
# overflow, its smallest subnormal's ties
_SPECIAL_HEX = """00000000 80000000 00000001 0000FFFF 00008000 00018000 007FFFFF 007F8000 00800000
    3F808000 3F818000 3F807FFF 3F808001 7F7F0000 7F7F7FFF 7F7F8000 7F7E8000 7F7FFFFF
    7F800000 7F800001 7F80FFFF 7F810000 7FBFFFFF 7FC00000 7FC00001 7FFFFFFF
    477FE000 477FEFFF 477FF000 33800000 33000000 33400000 33C00000 38800000 387FE000"""
SPECIALS = np.array([int(h, 16) for h in _SPECIAL_HEX.split()], np.uint32)
SPECIALS = np.concatenate([SPECIALS, SPECIALS | np.uint32(1 << 31)]).view(np.float32)


def random_patterns(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


ROUNDINGS = {"bf16": (round_bf16, old_round_bf16, DType.BF16), "fp16": (round_fp16, old_round_fp16, DType.FP16)}


@pytest.mark.parametrize("precision", ROUNDINGS)
def test_float32_rounding_is_the_float64_one_bit_for_bit(precision: str) -> None:
    new, old, dtype = ROUNDINGS[precision]
    special = BF16_PATTERNS if precision == "bf16" else FP16_PATTERNS
    drawn = random_patterns(3 << 19, seed=5)  # 1.5 M: every exponent, NaN payloads, more than one chunk
    # a chunk of finite values (its NaN fix skipped), then one whose only NaNs are the specials' (0x7F800001 …)
    finite_first = np.random.default_rng(7).normal(size=3 << 19).astype(np.float32)
    finite_first[-len(SPECIALS) :] = SPECIALS
    for x in (SPECIALS, special, drawn, drawn.reshape(1024, -1)[:, 3::2], SPECIALS[7], finite_first):
        with np.errstate(all="ignore"):
            got, want = new(x), old(x)
            got32, want32 = operand_values("x", x, dtype), old_operand_values(x, dtype)
        assert got.dtype == want.dtype == np.float64 and got.shape == want.shape
        assert bits(got) == bits(want)  # NaN payloads and signs included
        assert got32.dtype == want32.dtype == np.float32 and got32.shape == want32.shape
        assert bits(got32) == bits(want32)


@pytest.mark.parametrize("precision", ROUNDINGS)
def test_float32_values_of_the_precision_are_taken_as_they_are(precision: str) -> None:
    new, old, dtype = ROUNDINGS[precision]
    with np.errstate(all="ignore"):
        exact = old(random_patterns(1 << 21, seed=6)).astype(np.float32).reshape(2048, -1)
        assert operand_values("x", exact, dtype) is exact is old_operand_values(exact, dtype)
        exact[-1, -1] = np.float32(1 + 2**-12)  # one value in the second chunk that rounds: a rounded copy
        got = operand_values("x", exact, dtype)
    assert got is not exact and bits(got) == bits(old_operand_values(exact, dtype))


@pytest.mark.parametrize("precision", ROUNDINGS)
def test_float64_and_other_inputs_round_as_before(precision: str) -> None:
    new, old, dtype = ROUNDINGS[precision]
    doubles = np.random.default_rng(8).integers(0, 2**64, 300_000, dtype=np.uint64).view(np.float64)
    for x in (doubles, SPECIALS.astype(np.float16), np.arange(-300, 300, dtype=np.int32), 1.00390625):
        with np.errstate(all="ignore"):
            assert bits(new(x)) == bits(old(x))


@pytest.mark.parametrize("precision", ROUNDINGS)
@pytest.mark.parametrize("case", ["rounded", "overflow", "exact"])
def test_the_inexact_input_warning_is_the_same(precision: str, case: str, monkeypatch: Any) -> None:
    _, old, dtype = ROUNDINGS[precision]
    x = random_patterns(1 << 16, seed=9).reshape(256, 256)
    x = {
        "rounded": np.where(np.isfinite(x), x, 1.5),
        "overflow": np.float32([[1.0, 3.4e38, -65520.0, np.nan]]),
        "exact": old(x).astype(np.float32),
    }[case]

    def said(values: np.ndarray) -> list[str]:
        monkeypatch.setattr(inputs, "_WARNED", set())
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warn_if_rounded(dtype, x, values)
        return [f"{w.category.__name__}: {w.message}" for w in seen]

    with np.errstate(all="ignore"):
        got, want = said(operand_values("x", x, dtype)), said(old_operand_values(x, dtype))
    assert got == want
    assert bool(got) == (case != "exact") and all(InexactInputWarning.__name__ in w for w in got)


def test_the_comparison_finds_a_rounding_that_ties_away_from_zero_or_lets_a_nan_become_inf() -> None:
    """Planted faults, each of which the comparisons above must see."""

    def away(x: np.ndarray) -> np.ndarray:  # the kept last bit forgotten: ties round up
        u = x.view(np.uint32) + np.uint32(0x8000)
        return (u & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)

    def no_nan_check(x: np.ndarray) -> np.ndarray:  # the rounding alone: 0x7F800001 becomes inf
        return narrow._round_kept(x.view(np.uint32), 16).view(np.float32).astype(np.float64)

    with np.errstate(all="ignore"):
        for planted in (away, no_nan_check):
            assert bits(planted(BF16_PATTERNS)) != bits(old_round_bf16(BF16_PATTERNS))
            assert bits(planted(SPECIALS)) != bits(old_round_bf16(SPECIALS))
    with np.errstate(all="ignore"):  # fp16's subnormals rounded as its normals are: 13 bits dropped
        normal_only = narrow._round_kept(FP16_PATTERNS.view(np.uint32), 13).view(np.float32).astype(np.float64)
        assert bits(normal_only) != bits(old_round_fp16(FP16_PATTERNS))


@pytest.mark.parametrize("precision", ROUNDINGS)
def test_an_array_whose_leading_row_is_more_than_a_chunk_is_rounded(precision: str, monkeypatch: Any) -> None:
    """A float64 array whose first index holds more than a chunk (attention's K of 4112 × 256 a head, as
    (heads, seq, dim)) recursed without end: its piece of one leading row was itself. Each row's rows now."""
    new, _, dtype = ROUNDINGS[precision]
    monkeypatch.setattr(narrow, "ROUND_CHUNK", 64)
    x = np.random.default_rng(3).normal(size=(2, 3, 40))  # leading rows of 120 elements, their rows 40
    want = new(x.reshape(-1)).reshape(x.shape)  # (one dimension: chunked by slices)
    assert bits(new(x)) == bits(want)
    assert bits(operand_values("x", x, dtype)) == bits(want.astype(np.float32))

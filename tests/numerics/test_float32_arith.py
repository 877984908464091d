"""The table's +, −, ×, ÷ and √ run as float32 ufuncs (`elementwise.CORRECTLY_ROUNDED`): on every float32 bit pattern
drawn — NaNs with any payload, ±inf, subnormals, signed zeros, a broadcast operand — they give the float64 result
rounded once to float32, bit for bit, which is what each op means."""

from __future__ import annotations

import numpy as np
import pytest

from spatialc.numerics.elementwise import CORRECTLY_ROUNDED

SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, 1.2e-38], np.float32)


def bit_patterns(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[rng.integers(0, n, size=n // 16)] = rng.choice(SPECIAL, size=n // 16)
    return x


def once_rounded(f: np.ufunc, *xs: np.ndarray) -> np.ndarray:
    """f in float64 of the float32 operands, rounded once to float32."""
    return np.asarray(f(*(x.astype(np.float64) for x in xs))).astype(np.float32)


@pytest.mark.parametrize("f", sorted(CORRECTLY_ROUNDED, key=lambda f: f.__name__), ids=lambda f: f.__name__)
def test_float32_ufunc_is_the_float64_result_rounded_once(f: np.ufunc) -> None:
    rng = np.random.default_rng(7)
    a, b = bit_patterns(rng, 1 << 18), bit_patterns(rng, 1 << 18)
    with np.errstate(all="ignore"):
        cases = [(a,)] if f.nin == 1 else [(a, b), (a.reshape(512, 512), b.reshape(512, 512)[:, :1])]
        for args in cases:
            got, want = f(*args), once_rounded(f, *args)
            assert got.dtype == np.float32 and got.tobytes() == want.tobytes()

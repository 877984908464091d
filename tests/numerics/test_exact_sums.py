"""A float row sum is math.fsum's exactly rounded sum, rounded to float32 (`reduce_rows`): the vectorised form, which
decides most rows from a float64 sum and its error bound, must give fsum's answer bit for bit on every row — ties at
a float32 midpoint, cancellation, huge and tiny magnitudes, signed zeros, NaN and ±inf included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spatialc.numerics.reductions import reduce_rows


def by_fsum(rows: np.ndarray, square: bool = False) -> np.ndarray:
    """Each row's exactly rounded float64 sum by math.fsum (NaN where +inf meets -inf), rounded to float32."""

    def one(row: list[float]) -> float:
        try:
            return math.fsum(v * v for v in row) if square else math.fsum(row)
        except ValueError:
            return math.nan

    with np.errstate(over="ignore"):
        return np.array([[one(r)] for r in np.asarray(rows, np.float64).tolist()]).astype(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def near_midpoints(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Rows whose exact sum is a float32 midpoint, or a hair either side of one (2^-80 relative, or 1e-300)."""
    out = []
    for _ in range(rows):
        f = np.float32(rng.normal() * 10.0 ** rng.integers(-30, 30))
        up = np.nextafter(f, np.float32(np.inf))
        mid = (float(f) + float(up)) / 2
        hair = rng.choice([0.0, 1e-300, -1e-300, 2.0**-80 * abs(float(f)), -(2.0**-80) * abs(float(f))])
        out.append([mid - float(f) * 0.25, float(f) * 0.25, hair, 0.0])
    return np.array(out)


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_row_sums_are_fsums(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cases = [
        rng.normal(size=(30, 200)),
        np.exp(rng.normal(size=(30, 200)) * 3).astype(np.float32).astype(np.float64),
        rng.normal(size=(30, 50)) * 10.0 ** rng.integers(-300, 300, size=(30, 50)),
        near_midpoints(rng, 200),
        rng.choice([0.0, -0.0, 5e-324, -5e-324, 1e-45, 2.0**-150, -(2.0**-150)], size=(30, 40)),
        np.concatenate([np.full((5, 1), 1e308), np.full((5, 1), -1e308), rng.normal(size=(5, 9))], axis=1),
    ]
    specials = rng.normal(size=(30, 60))
    specials.reshape(-1)[rng.integers(0, specials.size, size=12)] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38] * 2
    cases.append(specials)
    for values in cases:
        with np.errstate(over="ignore", invalid="ignore"):  # (as the interpreter runs: ±inf and NaN are values)
            assert same_bits(reduce_rows("sum", values, False), by_fsum(values))
            narrow = values.astype(np.float32)  # a float32 page is summed as it is, each value exactly
            assert same_bits(reduce_rows("sum", narrow, False), by_fsum(narrow))
            assert same_bits(reduce_rows("sumsq", narrow, False), by_fsum(narrow, square=True))


def test_a_nan_in_one_row_leaves_another_rows_cancellation_to_fsum() -> None:
    rows = np.array([[2.0**100, 1.0, -(2.0**100), 1.0], [np.nan, 1.0, 2.0, 3.0]])  # numpy sums the first to 1, not 2
    with np.errstate(invalid="ignore"):
        assert same_bits(reduce_rows("sum", rows, False), by_fsum(rows))


def test_a_sum_that_overflows_float32_is_inf_and_one_past_float64_says_so() -> None:
    big = np.full((2, 4), 3e38, np.float32)
    with np.errstate(over="ignore"):
        assert np.isinf(reduce_rows("sum", big, False)).all()
    with pytest.raises(OverflowError):  # fsum's own word for it, as before the vectorised form
        reduce_rows("sum", np.full((1, 3), 1.7e308), False)

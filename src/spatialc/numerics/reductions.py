"""Row reductions (max, min, sum, sumsq, absmax), defined once: meaning, identity, C and error bound.

Each combines its values by an op of the elementwise table (`numerics.elementwise`); the interpreter, the reference,
the tolerance and the printers read `REDUCTIONS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cexpr import c_float
from .elementwise import EPS32, OPS, ElementwiseError

F32_MAX = float(np.finfo(np.float32).max)  # a float32 sum at or past it is ±inf (or NaN)


@dataclass(frozen=True)
class Reduction:
    """A row reduction: each row's elements through `pre` (|x|, x²), then combined by `combine` from `identity`.

    Float programs: sum and sumsq are the exactly rounded sum of the (float64) values (math.fsum), rounded once to
    float32; max, min and absmax are exact. A kernel sums in float32 in its own order, within `n` float32 units of
    the sum of magnitudes (the classical bound; `reduce_bound`); its max, min and absmax are exact. NaN propagates
    through each, and a sum that meets +inf and -inf is NaN. Integer programs: exact int64 (sumsq too), max and min
    as they are.

    `pre_op` and `combine` name ops of the elementwise table (None: `pre` is the value itself), whose C a kernel
    prints for them (`c_pre`, `c_combine`)."""

    name: str
    identity: float
    combine: str  # the table's add, max or min
    pre: Callable[[Any], Any]
    pre_op: str | None = None
    integer: bool = True

    def c_pre(self, x: str) -> str:
        """`pre` of the float C value `x`, as the table's op spells it in a float program."""
        return x if self.pre_op is None else OPS[self.pre_op].c.format(x)

    def c_combine(self, a: str, b: str) -> str:
        """Two float C values combined, as the table's add, max or min spells it (max and min let NaN through as
        numpy's maximum and minimum do)."""
        return OPS[self.combine].c.format(a, b)

    @property
    def c_identity(self) -> str:
        """`identity` as a float C constant (±INFINITY, from <cmath>, for max and min)."""
        if math.isinf(self.identity):
            return "INFINITY" if self.identity > 0 else "(-INFINITY)"
        return c_float(self.identity)


REDUCTIONS: dict[str, Reduction] = {
    r.name: r
    for r in (
        Reduction("max", -math.inf, "max", lambda v: v),
        Reduction("min", math.inf, "min", lambda v: v),
        Reduction("sum", 0.0, "add", lambda v: v),
        Reduction("sumsq", 0.0, "add", lambda v: v * v, "square"),
        Reduction("absmax", 0.0, "max", np.abs, "abs"),
    )
}


def reduction_named(name: str) -> Reduction:
    """The reduction `name`, or ElementwiseError naming those there are."""
    found = REDUCTIONS.get(name)
    if found is None:
        raise ElementwiseError(f"no row reduction {name!r}: the reductions are {', '.join(REDUCTIONS)}")
    return found


def reduce_rows(name: str, values: Any, integer: bool) -> Any:
    """Each row of `values` (rows × columns: the row's elements, padding left out) reduced by `name`, as a column
    (rows × 1): exact int64 in an integer program; in a float one the float64 reduction rounded once to float32."""
    r = reduction_named(name)
    if not integer and r.name != "sumsq" and np.asarray(values).dtype == np.float32:
        x = np.asarray(values)  # max, min, |x| and a float64 sum take float32 values as they are: no float64 copy
    else:
        x = np.asarray(values, np.int64 if integer else np.float64)
    if x.shape[1] == 0:
        out = np.full((x.shape[0], 1), r.identity)
        return out.astype(np.int64) if integer and math.isfinite(r.identity) else out
    y = r.pre(x)
    if r.combine == "max":
        out = np.max(y, axis=1, keepdims=True)
    elif r.combine == "min":
        out = np.min(y, axis=1, keepdims=True)
    elif integer:
        out = np.sum(y, axis=1, keepdims=True, dtype=np.int64)
    else:  # exactly rounded, so that no order of summing can make two correct runs differ
        return _exact_sums32(y, nonneg=r.name == "sumsq")
    return out if integer else out.astype(np.float32)


def _exact_sums32(y: Any, nonneg: bool = False) -> Any:
    """Each row of `y` (float64, or float32: its values exactly) summed exactly, rounded once to float64 (`_exact_sum`)
    and then to float32, as a column — vectorised where it is decided without `fsum`.

    numpy's float64 sum `s` of a row lies within γ·Σ|y| of the exact sum S, whatever its order (γ = (n−1)·2⁻⁵³ /
    (1 − (n−1)·2⁻⁵³), Higham, Accuracy and Stability, §4.2): `err` bounds that twice over, plus four float64 ulps of
    s for the rounding of the test itself and for S's own rounding to float64. When [s − err, s + err] lies strictly
    between the two float32 midpoints around f = float32(s), S and fsum's float64 rounding of it lie there too (the
    midpoints are float64 numbers, and rounding is monotone), so float32(fsum) = f. Every other row — a bound that
    straddles a midpoint, a zero (its sign), NaN, ±inf, magnitudes near overflow — is summed by `_exact_sum`. Where
    no value is negative (`nonneg`: squares; or found so), Σ|y| is S, which s bounds within the same factor 2."""
    rows, n = y.shape
    if n == 0 or rows == 0:
        return np.zeros((rows, 1), np.float32)
    with np.errstate(all="ignore"):  # NaN, ±inf and float32 overflow go to `_exact_sum`, which says what they are
        s = np.sum(y, axis=1, dtype=np.float64)
        # Σ|y| is s's own bound where no value is negative; a NaN anywhere makes the min NaN, and then every row's
        # magnitudes are summed (a NaN in one row says nothing of the signs in another).
        a = s if nonneg or np.min(y) >= 0 else np.sum(np.abs(y), axis=1, dtype=np.float64)
        f = s.astype(np.float32)
        err = (n * 2.0**-52) * a + 2.0**-50 * np.abs(s) + 2.0**-1070
        below = (f.astype(np.float64) + np.nextafter(f, np.float32(-np.inf)).astype(np.float64)) * 0.5
        above = (f.astype(np.float64) + np.nextafter(f, np.float32(np.inf)).astype(np.float64)) * 0.5
        decided = (a < 2.0**1000) & (f != 0) & (np.abs(f) < np.finfo(np.float32).max)
        decided &= (s - err > below) & (s + err < above)
    out: np.ndarray = np.asarray(f)
    for r in np.flatnonzero(~decided).tolist():
        out[r] = _exact_sum(y[r].astype(np.float64).tolist())
    return out.reshape(rows, 1)


def _exact_sum(values: list[float]) -> float:
    """`values` summed exactly and rounded once (math.fsum), infinities as IEEE adds them in any order: NaN where
    +inf and -inf meet, which fsum raises ValueError for instead."""
    try:
        return math.fsum(values)
    except ValueError:
        return math.nan


def reduce_bound(name: str, values: Any, errors: Any) -> tuple[Any, Any]:
    """A float reduction's value (`reduce_rows`) and how far a kernel's may lie from it when each element may lie
    its error away: the spread of the exact reduction over the elements' boxes, plus, for a sum, the float32 sum's
    own rounding (`n` units of the sum of magnitudes) and one rounding of the result."""
    r = reduction_named(name)
    x, e = np.asarray(values, np.float64), np.broadcast_to(np.asarray(errors, np.float64), np.shape(values))
    y = np.asarray(reduce_rows(name, x, False), np.float64)
    n = x.shape[1]
    if r.combine in ("max", "min"):  # |max(a) − max(b)| ≤ max|a − b|, through |x| too
        spread = np.max(e, axis=1, keepdims=True) if n else np.zeros_like(y)
        return y, spread
    magnitude = _magnitude(r, x, e)
    spread = np.sum(e, axis=1, keepdims=True) if r.name == "sum" else magnitude - np.sum(x * x, axis=1, keepdims=True)
    return y, np.abs(spread) + (n + 2) * EPS32 * magnitude


def _magnitude(r: Reduction, x: Any, e: Any) -> Any:
    """A sum's Σ(|x| + e), a sum of squares' Σ(|x| + e)²: what its float32 sum's rounding is measured in, each row."""
    grown = (np.abs(x) + e) if r.name == "sum" else (np.abs(x) + e) ** 2
    return np.sum(grown, axis=1, keepdims=True)


def past_range(name: str, values: Any, errors: Any) -> Any:
    """The rows (a column of booleans) where a kernel's float32 sum of finite values may overflow, to ±inf or to NaN
    where partial sums of both signs do, while the exact sum does not: its magnitude (`_magnitude`), with the sum's
    own rounding, at float32's largest value or past it. Never for max, min and absmax, which round nothing."""
    r = reduction_named(name)
    x, e = np.asarray(values, np.float64), np.broadcast_to(np.asarray(errors, np.float64), np.shape(values))
    if r.combine != "add":
        return np.zeros((x.shape[0], 1), dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):  # an infinite magnitude is a non-finite input's, said already
        magnitude = _magnitude(r, x, e)
        return np.isfinite(magnitude) & (magnitude * (1 + (x.shape[1] + 2) * EPS32) >= F32_MAX)


def reduce_cols(name: str, values: Any, integer: bool) -> Any:
    """Each column of `values` (rows × columns: the column's elements, padding left out) reduced by `name`, as a row
    (1 × columns): the reduction of each row of the transpose (`reduce_rows`), so that a column means exactly what a
    row does."""
    return np.asarray(reduce_rows(name, np.asarray(values).T, integer)).T


def reduce_cols_bound(name: str, values: Any, errors: Any) -> tuple[Any, Any]:
    """`reduce_bound` of each column of `values`: the bound of each row of the transpose, as a row (1 × columns)."""
    x = np.asarray(values)
    e = np.broadcast_to(np.asarray(errors, np.float64), x.shape)
    value, err = reduce_bound(name, x.T, e.T)
    return np.asarray(value).T, np.asarray(err).T


def past_range_cols(name: str, values: Any, errors: Any) -> Any:
    """`past_range` of each column of `values`: the columns (a row of booleans) where a kernel's float32 sum down
    the column may overflow."""
    x = np.asarray(values)
    e = np.broadcast_to(np.asarray(errors, np.float64), x.shape)
    return np.asarray(past_range(name, x.T, e.T)).T

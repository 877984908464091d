"""Intervals of elementwise expressions: integer ranges and float error bounds.

`image` bounds one op of the table (`numerics.elementwise`) over the box of its operands' bounds; `int_range` and
`int_peak` bound an integer program's formula exactly (verify refuses one that could leave int64); `bounded` gives a
float program's value and how far a kernel's may lie from it (the tolerance composes it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.ops import Apply, Arg, Col, Expr, Lit, Pos, RowArg, arg_indices
from .elementwise import EPS32, ElementwiseError, ElementwiseOp, op_named, row_values, whole


def image(
    op: ElementwiseOp, boxes: Sequence[tuple[Any, Any]], params: tuple[float, ...], integer: bool, point: Any = None
) -> tuple:
    """Bounds (lo, hi) of `op` over the box of its operands' bounds (each a (lo, hi) pair of arrays, or of Python
    ints in an integer program): where the op's value can lie when each operand lies in its range. An op whose
    value over the box is not bounded (a pole, a domain edge) gives (−inf, inf).

    A range given as one object twice (`lo is hi`: an exact operand) is one point, evaluated once; `point`, where
    every range is one, is the op's value there, computed already. Both only save work: the corners and turning
    points left out are copies of the one kept, and the least and greatest of copies are the value itself."""
    f = op.i64 if integer else op.f64
    assert f is not None
    if op.name == "where":
        (clo, chi), (alo, ahi), (blo, bhi) = boxes
        sure = (clo > 0) | (chi < 0)
        never = (clo == 0) & (chi == 0)
        lo = np.where(sure, alo, np.where(never, blo, np.minimum(alo, blo)))
        hi = np.where(sure, ahi, np.where(never, bhi, np.maximum(ahi, bhi)))
        return lo, hi
    if op.name == "mask":  # x where the condition holds, −∞ where it surely fails, either where it may
        (clo, chi), (alo, ahi) = boxes
        sure, never = (clo > 0) | (chi < 0), (clo == 0) & (chi == 0)
        return np.where(sure, alo, -np.inf), np.where(never, -np.inf, ahi)
    if op.comparison:
        holds, fails = _decided(op.name, *boxes[0], *boxes[1])
        return np.where(holds, 1, 0), np.where(fails, 0, 1)
    points: list[list[Any]]
    if op.arity == 1:
        ((lo, hi),) = boxes
        points = [[lo]] if lo is hi else [[lo], [hi]] + [[_inside(t, lo, hi)] for t in op.turns]
    else:
        points = [list(c) for c in _corners(boxes)]
    with np.errstate(all="ignore"):
        if point is not None and len(points) == 1:
            values = [np.asarray(point)]
        else:
            values = [np.asarray(f(*p, *params)) for p in points]
    lo_v = values[0]
    hi_v = values[0]
    for v in values[1:]:
        lo_v, hi_v = np.minimum(lo_v, v), np.maximum(hi_v, v)
    if integer:
        return lo_v, hi_v
    pole = _crosses_pole(op, boxes)
    if not np.any(pole) and _all_finite(lo_v) and _all_finite(hi_v):  # nothing unbounded: the wheres keep all
        return lo_v, hi_v
    unbounded = ~np.isfinite(lo_v) | ~np.isfinite(hi_v) | pole
    return np.where(unbounded, -np.inf, lo_v), np.where(unbounded, np.inf, hi_v)


def _all_finite(x: Any) -> bool:
    """Whether every element of `x` is finite, in one pass: a sum is finite only where every term is (an infinity
    or a NaN carries into it), and a sum that overflows says no, which only costs the caller its slow path."""
    with np.errstate(all="ignore"):
        return bool(np.isfinite(np.sum(x)))


def _decided(name: str, alo: Any, ahi: Any, blo: Any, bhi: Any) -> tuple[Any, Any]:
    """Where comparison `name` of a value in [alo, ahi] with one in [blo, bhi] surely holds, and where it surely
    fails (elsewhere the boxes leave it open)."""
    apart = (ahi < blo) | (alo > bhi)
    same = (alo == ahi) & (blo == bhi) & (alo == blo)
    return {
        "lt": (ahi < blo, alo >= bhi),
        "le": (ahi <= blo, alo > bhi),
        "gt": (alo > bhi, ahi <= blo),
        "ge": (alo >= bhi, ahi < blo),
        "eq": (same, apart),
        "ne": (apart, same),
    }[name]


def _inside(t: float, lo: Any, hi: Any) -> Any:
    """The turning point t where it lies in [lo, hi], else lo (which the bound evaluates anyway)."""
    return np.where((lo < t) & (t < hi), t, lo)


def _corners(boxes: Sequence[tuple[Any, Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for lo, hi in boxes:
        out = [(*c, x) for c in out for x in ((lo,) if lo is hi else (lo, hi))]  # a point: one corner, not two
    return out


# Points where an op's value runs off to infinity or its domain ends: a box that holds one (strictly inside) has no
# bound from its corners. A box that reaches a domain edge gives a NaN or an infinity at a corner, caught by itself.
_POLES = {
    "recip": (0, 0.0),
    "rsqrt": (0, 0.0),
    "log": (0, 0.0),
    "log2": (0, 0.0),
    "sqrt": (0, 0.0),
    "div": (1, 0.0),
    "pow": (0, 0.0),
}


def _crosses_pole(op: ElementwiseOp, boxes: Sequence[tuple[Any, Any]]) -> Any:
    pole = _POLES.get(op.name)
    if pole is None:
        return False
    which, at = pole
    lo, hi = boxes[which]
    if op.name == "pow":  # x^y is monotone in each of x > 0 and y; a base at or below 0 is bounded only at one y
        elo, ehi = boxes[1]
        return (lo <= 0) & (elo != ehi)
    return (lo <= at) & (at <= hi) if op.name in ("div", "recip") else lo < at


def _exact_infinities(op: ElementwiseOp, parts: list[tuple[Any, Any]], value: Any, y: Any, e: Any) -> Any:
    """`e` where an operand is infinite, but at the elements whose operands are all exact: there every kernel applies
    the op to these very values, so an infinite result (−∞ − m: a masked score of a softmax) is that infinity and a
    finite one (exp(−∞) = 0) lies within its rounding and ulps — no wider, or a row of −∞ would let any value by."""
    exactly = functools.reduce(np.logical_and, [np.asarray(err) == 0 for _, err in parts])
    rounding = (1 + op.ulps) * EPS32 * np.abs(y)
    e = np.where(exactly & np.isinf(value), 0.0, e)
    return np.where(exactly & np.isfinite(value) & np.isnan(e), rounding, e)


def int_range(expr: Expr, pages: Sequence[tuple[int, int]], col: Callable[[Col], tuple[int, int]]) -> tuple[int, int]:
    """The least and greatest value `expr` can take in an integer program when input page i lies in `pages[i]` and
    column vector c in `col(c)` — exact, in Python integers."""
    match expr:
        case Arg(i) | RowArg(i):
            return pages[i]
        case Lit(v):
            return whole(v), whole(v)
        case Col():
            return col(expr)
        case Apply(name, args, params):
            op = op_named(name)
            if op.i64 is None:
                raise ElementwiseError(f"{op.name} is float arithmetic; an integer program computes exact integers")
            boxes = [tuple(np.array([b], dtype=object) for b in int_range(a, pages, col)) for a in args]
            lo, hi = image(op, boxes, params, integer=True)
            return int(np.asarray(lo, dtype=object)[0]), int(np.asarray(hi, dtype=object)[0])
    raise ElementwiseError(f"{expr!r} is no elementwise expression")


def int_peak(expr: Expr, pages: Sequence[tuple[int, int]], col: Callable[[Col], tuple[int, int]]) -> int:
    """The greatest magnitude any value `expr` computes on the way can take in an integer program — each op's
    result bounded as `int_range` bounds it, the whole formula's included: every one of them is a `long long` of
    the kernel and an exact int64 of the interpreter, not only the last (clamp(x·x·x, −10, 10) has a small range
    and a cube inside it)."""
    lo, hi = int_range(expr, pages, col)
    inner = [int_peak(a, pages, col) for a in expr.args] if isinstance(expr, Apply) else []
    return max(-lo, hi, *inner)


def bounded(
    expr: Expr, pages: Sequence[tuple[Any, Any]], col: Callable[[Col], Any] | None = None, memo: dict | None = None
) -> tuple[Any, Any]:
    """(value, error) of `expr` in a float program: the value as the interpreter computes it from the input pages'
    values, and a bound on how far a kernel's may lie from it when each input page's own value may lie its error
    away (pages[i] = (values, errors)). Each op adds the spread of its exact value over the box of its operands'
    bounds, one float32 rounding, its own `ulps` and its `tail`.

    `memo`, shared by the maps of one program on one set of inputs (the same vectors, the same page arrays while it
    lives), keeps each op's result by its formula and the pages it reads: softmax's normalise recomputes its exp
    stage's formula, on the same pages, as its kernel does; the bound of it is the same, and is computed once."""
    match expr:
        case Arg(i):
            x, e = pages[i]
            return np.asarray(x, np.float64), np.asarray(e, np.float64)
        case RowArg(i):
            x, e = pages[i]
            return row_values(np.asarray(x, np.float64)), row_values(np.asarray(e, np.float64))
        case Lit(v):
            return np.float64(np.float32(v)), np.float64(0.0)
        case Col() | Pos():  # a broadcast vector's value or a position: exact, as the kernel reads it
            assert col is not None
            return np.asarray(col(expr), np.float32).astype(np.float64), np.float64(0.0)
        case Apply(name, args, params):
            key = None
            if memo is not None:
                key = (expr, tuple((id(pages[i][0]), id(pages[i][1])) for i in arg_indices(expr)))
                if key in memo:
                    return memo[key]  # type: ignore[no-any-return]
            op = op_named(name)
            parts = [bounded(a, pages, col, memo) for a in args]
            exact = [not np.any(e) for _, e in parts]  # an operand with no error: its box is one point
            with np.errstate(all="ignore"):
                value = np.asarray(op.f64(*(x for x, _ in parts), *params))
                y = value.astype(np.float32).astype(np.float64)
                boxes = [(x, x) if ok else (x - e, x + e) for (x, e), ok in zip(parts, exact, strict=True)]
                lo, hi = image(op, boxes, params, integer=False, point=value if all(exact) else None)
                spread = np.maximum(hi - y, y - lo)
                e = spread + (1 + op.ulps) * EPS32 * np.abs(y)
                if op.tail or not all(_all_finite(x) for x, _ in parts):  # (0 · an infinite operand is NaN: kept)
                    largest = max((np.abs(x) for x, _ in parts), key=lambda a: float(np.max(a, initial=0.0)))
                    e = e + op.tail * (largest + spread)
                    e = _exact_infinities(op, parts, value, y, e)
            if op.comparison:  # a 0 or a 1: exact where the operands' boxes decide it, else either
                e = np.where(hi > lo, 1.0, 0.0)
            if op.name == "mask":  # a score surely masked is −∞ in every kernel: exact
                e = np.where((lo == -np.inf) & (hi == -np.inf), 0.0, e)
            if np.isnan(np.sum(e)):  # (a sum is NaN where a term is: the where only where one is)
                e = np.where(np.isnan(e), np.inf, e)
            if key is not None and memo is not None:
                memo[key] = (y, e)
            return y, e
    raise ElementwiseError(f"{expr!r} is no elementwise expression")

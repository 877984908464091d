"""Every elementwise op, defined once: its exact meaning, its C, its error bound and its integer range.

This table is the only place an elementwise op is defined. The interpreter and the numpy reference compute with its
`f64` / `i64`, verify states formulas and integer bounds with it, the tolerance composes its bounds, and every
printer spells an op with its `c` / `c_int` — the same text the host emulation compiles. Adding an op is adding one
entry (and, where its C is more than an expression, one function in `lower/cuda/common/elementwise.cuh`).

The meaning, one rule for every op:
- **Float programs** (fp16 / bf16 operands, float32 values): each op is computed in float64 from its float32
  operands and rounded once to float32. For the ops built from +, −, ×, ÷ and √ the kernel does exactly that (the
  float32 intrinsics, or double arithmetic rounded once: either is correctly rounded), so kernel and interpreter
  agree bit for bit (`ulps` 0). The ops that call a library function (exp, log, tanh, erf, pow) compute in double
  with CUDA's (or the host's) library, within 2 double ulps of numpy's, then round: at most one float32 ulp apart
  (`ulps` 1), equal except near a tie. Op parameters (leaky_relu's α, clamp's bounds) are float64 constants of
  the formula; a literal operand (`Lit`) is a value like any other, a float32.
- **Integer programs** (int8 operands): values are exact int64 integers. Only the ops with an `i64` meaning apply;
  `int_range` bounds their results, and verify refuses a formula that could leave int64.

A comparison yields 1 or 0 (a float32 or an int64 like any value); `where(c, a, b)` takes a where c is not 0.
NaN goes through max, min, relu and clamp as numpy's maximum / minimum let it, and compares false.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.ops import Apply, Arg, Col, Expr, Lit, Pos, RowArg, VecAxis, arg_indices

EPS32 = 2.0**-23  # one float32 ulp at 1.0
GELU_C = 0.7978845608028654  # sqrt(2 / pi), as PyTorch's tanh-form gelu writes it
GELU_TAIL = 2.0**-50  # absolute error relative to |x| where a gelu's 1 + tanh / 1 + erf cancels (see `tail`)


@dataclass(frozen=True)
class ElementwiseOp:
    """One op of the table.

    `f64(*args, *params)` is its meaning on float64 arrays; `c` its C for float programs, an expression over the
    float operands `{0}`, `{1}`, … and the parameters `{p0}`, `{p1}`, … (double literals); `ulps` how far the
    kernel's float32 result may lie from `f64`'s rounded to float32, in float32 ulps of the result; `tail` an
    absolute error, relative to the largest operand, where the formula cancels. `i64` / `c_int` are the same for
    integer programs (None: float programs only). `turns` are the points inside which a unary op is not monotone:
    the interval bound evaluates it there too. `transcendental`: it calls a library function (the persistent
    kernel's fused store, which applies its chain in float32 registers without those helpers, leaves it to the
    general form)."""

    name: str
    arity: int
    f64: Callable[..., Any]
    c: str
    params: tuple[str, ...] = ()
    ulps: float = 0.0
    tail: float = 0.0
    i64: Callable[..., Any] | None = None
    c_int: str | None = None
    turns: tuple[float, ...] = ()
    transcendental: bool = False
    comparison: bool = False

    @property
    def integer(self) -> bool:
        """Whether integer programs may use it."""
        return self.i64 is not None


def _unary_f(name: str, f: Callable[..., Any], **kw: Any) -> ElementwiseOp:
    return ElementwiseOp(name, 1, f, f"spatialc_{name}({{0}})", **kw)


def _binary_f(name: str, f: Callable[..., Any], **kw: Any) -> ElementwiseOp:
    return ElementwiseOp(name, 2, f, f"spatialc_{name}({{0}}, {{1}})", **kw)


def _gelu_tanh(v: Any) -> Any:
    return 0.5 * v * (1.0 + np.tanh(GELU_C * (v + 0.044715 * (v * v * v))))


SQRT1_2 = 0.7071067811865475  # 1 / sqrt(2) as a double: the same literal the C spells
_erf = np.frompyfunc(math.erf, 1, 1)


def _gelu_erf(v: Any) -> Any:
    return 0.5 * v * (1.0 + np.asarray(_erf(v * SQRT1_2), np.float64))


def _cmp(f: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda a, b: np.asarray(f(a, b)).astype(np.asarray(a).dtype if np.asarray(a).dtype != object else object)


def _where(c: Any, a: Any, b: Any) -> Any:
    return np.where(np.asarray(c) != 0, a, b)


def _mask(c: Any, a: Any) -> Any:
    return np.where(np.asarray(c) != 0, a, -np.inf)


def _square(v: Any) -> Any:
    return v * v


def _relu(v: Any) -> Any:
    return np.maximum(v, 0)


_OPS: list[ElementwiseOp] = [
    # ---- unary -------------------------------------------------------------------------------------------------
    ElementwiseOp("neg", 1, np.negative, "(-{0})", i64=np.negative, c_int="(-{0})"),
    ElementwiseOp("abs", 1, np.abs, "spatialc_abs({0})", i64=np.abs, c_int="({0} < 0 ? -{0} : {0})", turns=(0.0,)),
    _unary_f("exp", np.exp, ulps=1, transcendental=True),
    _unary_f("exp2", np.exp2, ulps=1, transcendental=True),
    _unary_f("log", np.log, ulps=1, transcendental=True),
    _unary_f("log2", np.log2, ulps=1, transcendental=True),
    _unary_f("sqrt", np.sqrt),
    _unary_f("rsqrt", lambda v: 1.0 / np.sqrt(v)),
    _unary_f("recip", lambda v: 1.0 / v),
    _unary_f("sigmoid", lambda v: 1.0 / (1.0 + np.exp(-v)), ulps=1, transcendental=True),
    _unary_f("tanh", np.tanh, ulps=1, transcendental=True),
    _unary_f("gelu", _gelu_erf, ulps=1, tail=GELU_TAIL, turns=(-0.7517915246935645,), transcendental=True),
    _unary_f("gelu_tanh", _gelu_tanh, ulps=1, tail=GELU_TAIL, turns=(-0.7524614220710163,), transcendental=True),
    _unary_f("silu", lambda v: v / (1.0 + np.exp(-v)), ulps=1, turns=(-1.2784645427610738,), transcendental=True),
    ElementwiseOp("relu", 1, _relu, "spatialc_relu({0})", i64=_relu, c_int="({0} > 0 ? {0} : 0LL)"),
    ElementwiseOp(
        "leaky_relu",
        1,
        lambda v, a: np.where(v > 0, v, a * v),
        "spatialc_leaky_relu({0}, {p0})",
        params=("alpha",),
        turns=(0.0,),
    ),
    ElementwiseOp(
        "clamp",
        1,
        lambda v, lo, hi: np.minimum(np.maximum(v, lo), hi),
        "spatialc_clamp({0}, {p0}, {p1})",
        params=("lo", "hi"),
        i64=lambda v, lo, hi: np.minimum(np.maximum(v, int(lo)), int(hi)),
        c_int="({0} < {p0} ? {p0} : {0} > {p1} ? {p1} : {0})",
    ),
    ElementwiseOp("square", 1, _square, "spatialc_fmul({0}, {0})", i64=_square, c_int="({0} * {0})", turns=(0.0,)),
    # ---- binary ------------------------------------------------------------------------------------------------
    ElementwiseOp("add", 2, np.add, "spatialc_fadd({0}, {1})", i64=np.add, c_int="({0} + {1})"),
    ElementwiseOp("sub", 2, np.subtract, "spatialc_fsub({0}, {1})", i64=np.subtract, c_int="({0} - {1})"),
    ElementwiseOp("mul", 2, np.multiply, "spatialc_fmul({0}, {1})", i64=np.multiply, c_int="({0} * {1})"),
    _binary_f("div", np.divide),
    ElementwiseOp("max", 2, np.maximum, "spatialc_max({0}, {1})", i64=np.maximum, c_int="({0} > {1} ? {0} : {1})"),
    ElementwiseOp("min", 2, np.minimum, "spatialc_min({0}, {1})", i64=np.minimum, c_int="({0} < {1} ? {0} : {1})"),
    _binary_f("pow", np.power, ulps=1, transcendental=True),
    # ---- comparisons and where ---------------------------------------------------------------------------------
    ElementwiseOp(
        "lt",
        2,
        _cmp(np.less),
        "({0} < {1} ? 1.0f : 0.0f)",
        i64=_cmp(np.less),
        c_int="({0} < {1} ? 1LL : 0LL)",
        comparison=True,
    ),
    ElementwiseOp(
        "le",
        2,
        _cmp(np.less_equal),
        "({0} <= {1} ? 1.0f : 0.0f)",
        i64=_cmp(np.less_equal),
        c_int="({0} <= {1} ? 1LL : 0LL)",
        comparison=True,
    ),
    ElementwiseOp(
        "gt",
        2,
        _cmp(np.greater),
        "({0} > {1} ? 1.0f : 0.0f)",
        i64=_cmp(np.greater),
        c_int="({0} > {1} ? 1LL : 0LL)",
        comparison=True,
    ),
    ElementwiseOp(
        "ge",
        2,
        _cmp(np.greater_equal),
        "({0} >= {1} ? 1.0f : 0.0f)",
        i64=_cmp(np.greater_equal),
        c_int="({0} >= {1} ? 1LL : 0LL)",
        comparison=True,
    ),
    ElementwiseOp(
        "eq",
        2,
        _cmp(np.equal),
        "({0} == {1} ? 1.0f : 0.0f)",
        i64=_cmp(np.equal),
        c_int="({0} == {1} ? 1LL : 0LL)",
        comparison=True,
    ),
    ElementwiseOp(
        "ne",
        2,
        _cmp(np.not_equal),
        "({0} != {1} ? 1.0f : 0.0f)",
        i64=_cmp(np.not_equal),
        c_int="({0} != {1} ? 1LL : 0LL)",
        comparison=True,
    ),
    ElementwiseOp("where", 3, _where, "({0} != 0.0f ? {1} : {2})", i64=_where, c_int="({0} != 0 ? {1} : {2})"),
    # mask(c, x): x where c holds, −∞ elsewhere — a score a softmax leaves out (a constant −∞ is not a literal:
    # constants are finite). Float programs only.
    ElementwiseOp("mask", 2, _mask, "({0} != 0.0f ? {1} : -INFINITY)"),
]

OPS: dict[str, ElementwiseOp] = {op.name: op for op in _OPS}


class ElementwiseError(ValueError):
    """An expression the table cannot compute as stated: an unknown op, a float op in an integer program, an
    integer value beyond exact int64 arithmetic."""


EXACT_LIMIT = 2.0**62  # integer values must stay well inside int64: beyond this they may have wrapped


def op_named(name: str) -> ElementwiseOp:
    """The table's entry for `name`, or ElementwiseError naming the ops there are."""
    found = OPS.get(name)
    if found is None:
        raise ElementwiseError(f"no elementwise op {name!r}: the ops are {', '.join(OPS)}")
    return found


# ---- values ---------------------------------------------------------------------------------------------------


def evaluate(
    expr: Expr, pages: Sequence[Any], integer: bool, col: Callable[[Col], Any] | None = None, out: Any = None
) -> Any:
    """`expr` on the input `pages` (float32 or int64 arrays of one shape); `col(c)` gives column vector c's values
    as a row that broadcasts over the pages' rows. Float ops: float64 of the float32 operands, rounded once to
    float32; integer ops: exact int64 (ElementwiseError past ±2^62). `out` (a float program's: a float32 array of the
    result's shape) receives the result — the last op writes it there, the same values — and is returned."""
    if out is not None:
        if not integer and isinstance(expr, Apply):
            entry = OPS.get(expr.op)
            f = entry.f64 if entry is not None else None
            if isinstance(f, np.ufunc) and not expr.params and f.nin == len(expr.args) and f.nout == 1:
                xs32 = [np.asarray(evaluate(a, pages, integer, col), np.float32) for a in expr.args]
                if np.broadcast_shapes(*(x.shape for x in xs32)) == out.shape:
                    with np.errstate(all="ignore"):  # (as below: float32 ufuncs, or float64 loops cast back)
                        return f(*xs32, out=out) if f in CORRECTLY_ROUNDED else f(*xs32, out=out, dtype=np.float64)
        out[...] = evaluate(expr, pages, integer, col)
        return out
    match expr:
        case Arg(i):
            return pages[i]
        case RowArg(i):
            return row_values(pages[i])
        case Lit(v):
            return np.int64(_whole(v)) if integer else np.float32(v)
        case Col() | Pos():  # a broadcast vector's values, or an element's position (its row or column index)
            if col is None:
                what = "a column vector" if isinstance(expr, Col) else "an element's position"
                raise ElementwiseError(f"an expression reads {what}, and none was given")
            values = np.asarray(col(expr))
            return values.astype(np.int64) if integer else values.astype(np.float32)
        case Apply(name, args, params):
            op = op_named(name)
            xs = [evaluate(a, pages, integer, col) for a in args]
            if integer:
                return _exact_int(op, xs, params)
            with np.errstate(all="ignore"):
                f = op.f64
                if f in CORRECTLY_ROUNDED and not params:
                    return np.asarray(f(*(np.asarray(x, np.float32) for x in xs)))
                if isinstance(f, np.ufunc) and not params and f.nin == len(xs) and f.nout == 1:
                    # The same float64 op of the float32 operands, rounded once to float32: the ufunc casts its
                    # operands up and its result down a buffer at a time, with no float64 copy of the page.
                    xs32 = [np.asarray(x, np.float32) for x in xs]
                    return f(
                        *xs32, out=np.empty(np.broadcast_shapes(*(x.shape for x in xs32)), np.float32), dtype=np.float64
                    )
                return np.asarray(op.f64(*(np.asarray(x, np.float32).astype(np.float64) for x in xs), *params)).astype(
                    np.float32
                )
    raise ElementwiseError(f"{expr!r} is no elementwise expression")


# +, −, ×, ÷ and √ of float32 operands computed in float32 are their float64 results rounded once to float32, bit for
# bit: float64's 53 bits are at least 2·24 + 2, which makes the double rounding innocuous (Figueroa, "When is double
# rounding innocuous?", 1995) — the same fact that gives these ops `ulps` 0 against the kernels. NaN and ±inf come out
# alike too (IEEE's rules, and a NaN's payload survives float32 → float64 → float32). So `evaluate` runs them as the
# float32 ufuncs, the cheapest way to their defined value.
CORRECTLY_ROUNDED = frozenset({np.add, np.subtract, np.multiply, np.divide, np.sqrt})


def _whole(v: float) -> int:
    if v != v or abs(v) >= EXACT_LIMIT or v != int(v):
        raise ElementwiseError(f"the constant {v!r} is no integer an integer program's exact arithmetic holds")
    return int(v)


def _exact_int(op: ElementwiseOp, xs: list[Any], params: tuple[float, ...]) -> Any:
    if op.i64 is None:
        raise ElementwiseError(f"{op.name} is float arithmetic; an integer program computes exact integers")
    result = np.asarray(op.i64(*(np.asarray(x, np.int64) for x in xs), *params)).astype(np.int64)
    with np.errstate(all="ignore"):
        estimate = np.asarray(op.i64(*(np.asarray(x, np.float64) for x in xs), *params), np.float64)
    if estimate.size and float(np.abs(estimate).max()) >= EXACT_LIMIT:
        raise ElementwiseError(
            f"{op.name} takes an integer value beyond ±2^62: the int64 arithmetic would no longer be exact"
        )
    return result


# ---- intervals: integer ranges and float error bounds ---------------------------------------------------------


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


def int_range(expr: Expr, pages: Sequence[tuple[int, int]], col: Callable[[Col], tuple[int, int]]) -> tuple[int, int]:
    """The least and greatest value `expr` can take in an integer program when input page i lies in `pages[i]` and
    column vector c in `col(c)` — exact, in Python integers."""
    match expr:
        case Arg(i) | RowArg(i):
            return pages[i]
        case Lit(v):
            return _whole(v), _whole(v)
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


# ---- C ----------------------------------------------------------------------------------------------------------


def c_float(x: float) -> str:
    """The float32 nearest `x` as a float literal that reads back to exactly that float32."""
    text = np.format_float_scientific(np.float32(x), unique=True, trim="-")
    return f"{text}f" if not text.startswith("-") else f"({text}f)"


def c_double(x: float) -> str:
    """`x` as a C double literal that is exactly it (a hexadecimal float)."""
    if x != x or x in (math.inf, -math.inf):
        raise ElementwiseError(f"the parameter {x!r} has no C literal: give a finite number")
    return f"({float(x).hex()})"


def c_long(n: int) -> str:
    """An int64 literal, parenthesised when negative (the most negative has no literal of its own)."""
    if n == -(2**63):
        return "(-9223372036854775807LL - 1)"
    return f"{n}LL" if n >= 0 else f"({n}LL)"


def c_position(node: Pos, at: str, tile: str, el: str, side: int = 16) -> str:
    """The C of position `node` (`ir.ops.Pos`) of element `el` (row-major in its tile, `side` × `side`) of page tile
    `tile` — the page rows of `node.width` tiles whose first tile row (ROW) or column (COL) is `at` — as an int:
    (at + tile / width) · side + el / side for a row, (at + tile mod width) · side + el mod side for a column. The
    interpreter's positions (`interp.support`) are these indices."""
    if node.axis == VecAxis.ROW:
        return f"(({at}) + ({tile}) / {node.width}) * {side} + ({el}) / {side}"
    return f"(({at}) + ({tile}) % {node.width}) * {side} + ({el}) % {side}"


def c_expr(
    expr: Expr,
    integer: bool,
    page: Callable[[int], str],
    col: Callable[[Col], str],
    row: Callable[[int], str] | None = None,
    pos: Callable[[Pos], str] | None = None,
) -> str:
    """`expr` as one C expression over the input pages' values (`page(i)`, a float or a long long), the row vectors'
    (`row(i)`: page i's value of the element's row), the column vectors' (`col(c)`) and the element's positions
    (`pos(node)`: `c_position`'s int): the statements every form prints, and the host emulation compiles."""
    match expr:
        case Arg(i):
            return page(i)
        case RowArg(i):
            if row is None:
                raise ElementwiseError("the printer reads no row vector, and the expression names one")
            return row(i)
        case Lit(v):
            return c_long(_whole(v)) if integer else c_float(v)
        case Col():
            return f"(long long){col(expr)}" if integer else col(expr)
        case Pos():
            if pos is None:
                raise ElementwiseError("the printer reads no element position, and the expression names one")
            return f"(long long)({pos(expr)})" if integer else f"(float)({pos(expr)})"
        case Apply(name, args, params):
            op = op_named(name)
            text = op.c_int if integer else op.c
            if text is None:
                raise ElementwiseError(f"{op.name} is float arithmetic; an integer program computes exact integers")
            operands = {str(i): c_expr(a, integer, page, col, row, pos) for i, a in enumerate(args)}
            consts = {f"p{i}": c_long(_whole(p)) if integer else c_double(p) for i, p in enumerate(params)}
            return text.format(*(operands[str(i)] for i in range(len(args))), **consts)
    raise ElementwiseError(f"{expr!r} is no elementwise expression")


def c_leaves(expr: Expr, integer: bool) -> int:
    """How many leaves (an input page's value, a constant, a column vector's value) `c_expr` prints for `expr`: an op
    whose C names an operand more than once (square; in an integer program relu, abs, clamp, max, min) prints that
    operand's whole text each time, so nesting such ops multiplies the text — abs nested 40 deep, 41 nodes, would
    print 3^40 leaves."""
    match expr:
        case Apply(name, args):
            op = op_named(name)
            text = (op.c_int if integer else op.c) or ""
            return sum(text.count(f"{{{i}}}") * c_leaves(a, integer) for i, a in enumerate(args))
    return 1


def row_values(page: Any) -> Any:
    """A row vector's values as a column that broadcasts over a page's columns: its first column (a row vector holds
    each row's value in every column)."""
    x = np.asarray(page)
    return x[..., :1] if x.ndim >= 2 else x


# ---- row reductions ---------------------------------------------------------------------------------------------


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
    grown = (np.abs(x) + e) if r.name == "sum" else (np.abs(x) + e) ** 2
    magnitude = np.sum(grown, axis=1, keepdims=True)
    spread = np.sum(e, axis=1, keepdims=True) if r.name == "sum" else magnitude - np.sum(x * x, axis=1, keepdims=True)
    return y, np.abs(spread) + (n + 2) * EPS32 * magnitude


def transcendental(expr: Expr) -> bool:
    """Whether `expr` calls a library function (exp, log, tanh, erf, pow) anywhere."""
    match expr:
        case Apply(name, args):
            return op_named(name).transcendental or any(transcendental(a) for a in args)
    return False

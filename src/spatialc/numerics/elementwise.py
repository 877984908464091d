"""Every elementwise op, defined once: its exact meaning, its C, its error bound and its integer range.

This table is the only place an elementwise op is defined. The interpreter and the numpy reference compute with its
`f64` / `i64`, verify states formulas and integer bounds with it, the tolerance composes its bounds, and every
printer spells an op with its `c` / `c_int` — the same text the host emulation compiles. Adding an op is adding one
entry (and, where its C is more than an expression, one function in `lower/cuda/common/elementwise.cuh`).

Beside the table: `evaluate` here gives an expression's values; `intervals` its integer range and float error bound,
`cexpr` its C, and `reductions` the row reductions, each combining by an op of this table.

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

from ..ir.ops import Apply, Arg, Col, Expr, Lit, Pos, RowArg

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
            return np.int64(whole(v)) if integer else np.float32(v)
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


def whole(v: float) -> int:
    """`v` as an int, or ElementwiseError where it is no integer an integer program's exact arithmetic holds."""
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


def row_values(page: Any) -> Any:
    """A row vector's values as a column that broadcasts over a page's columns: its first column (a row vector holds
    each row's value in every column)."""
    x = np.asarray(page)
    return x[..., :1] if x.ndim >= 2 else x


def transcendental(expr: Expr) -> bool:
    """Whether `expr` calls a library function (exp, log, tanh, erf, pow) anywhere."""
    match expr:
        case Apply(name, args):
            return op_named(name).transcendental or any(transcendental(a) for a in args)
    return False

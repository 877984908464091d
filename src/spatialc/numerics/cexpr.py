"""The C of an elementwise expression: the statements every form prints, and the host emulation compiles.

Each op is spelled by its table entry's `c` / `c_int` (`numerics.elementwise`); the literals here read back to exactly
the values the interpreter computes with.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ir.ops import Apply, Arg, Col, Expr, Lit, Pos, RowArg, VecAxis
from .elementwise import ElementwiseError, op_named, whole


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
            return c_long(whole(v)) if integer else c_float(v)
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
            consts = {f"p{i}": c_long(whole(p)) if integer else c_double(p) for i, p in enumerate(params)}
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

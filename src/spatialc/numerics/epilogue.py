"""What an epilogue op does to a block of values: the one definition the interpreter and the numpy reference share.

An epilogue op is a `Map` — an expression of the elementwise table (`numerics.elementwise`, where each op's meaning,
C and error bound are stated) over the page it reads, constants and column vectors (a bias) — or a requantisation
to int8 (`numerics.quant.requantize`).

Integer programs (int8 operands): values are exact integers (int64); a column vector holds int32 values, constants
are whole numbers. Float programs (fp16/bf16): the float32 accumulator, each op computed in float64 from its float32
operands and rounded once to float32, as the kernel does it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.errors import SpatialError
from ..ir.ops import Col, ComputeOp, Expr, Map, Requant, VecAxis, arg_indices
from . import elementwise, intervals
from .elementwise import EXACT_LIMIT, ElementwiseError
from .quant import requantize

__all__ = ["EXACT_LIMIT", "EpilogueError", "apply", "dot_range", "integer_peak", "integer_range", "mapped", "start"]

INT32_RANGE = (-(2**31), 2**31 - 1)  # what an integer program's column vector (a bias) holds


class EpilogueError(SpatialError, ValueError):
    """An op that is not an elementwise epilogue op, or an integer result beyond what int64 holds exactly."""


def dot_range(k: int) -> tuple[int, int]:
    """The least and greatest K-long int8 dot product: K·(−128)·127 and K·(−128)·(−128)."""
    return -k * 128 * 127, k * 128 * 128


INT8_RANGE = (-128, 127)  # what a page read from an int8 tensor holds (a residual's, a map program's inputs)


def _pages(expr: Expr, lo: int, hi: int) -> list[tuple[int, int]]:
    """The ranges of the pages an integer op reads: the first's lo..hi (the value before it), the others' int8 (a
    tensor an epilogue stage reads beside it, a residual; a map program's inputs are int8 all)."""
    return [(lo, hi)] + [INT8_RANGE] * max(arg_indices(expr), default=0)


def integer_range(op: ComputeOp, lo: int, hi: int) -> tuple[int, int] | None:
    """The range of an integer epilogue op's result on values in lo..hi of the page before it, any further page it
    reads holding int8 values (a residual) — or a map program's int8 inputs (a column or row vector holds any int32,
    requant saturates to int8) — or None for an op that is none of them (or computes in floats)."""
    match op:
        case Map(expr):
            pages = _pages(expr, lo, hi)
            try:
                return intervals.int_range(expr, pages, lambda c: INT32_RANGE)
            except ElementwiseError:
                return None
        case Requant():
            return -128, 127
    return None


def integer_peak(op: ComputeOp, lo: int, hi: int) -> int:
    """The greatest magnitude of any value an integer epilogue op computes on values in lo..hi, those inside a Map's
    formula included (`intervals.int_peak`); for an op `integer_range` bounds (call it first)."""
    match op:
        case Map(expr):
            pages = _pages(expr, lo, hi)
            return intervals.int_peak(expr, pages, lambda c: INT32_RANGE)
    return max(-lo, hi)


def start(acc: np.ndarray, integer: bool) -> np.ndarray:
    """The accumulator as the epilogue sees it: int64 for integer programs, float32 otherwise."""
    return np.asarray(acc).astype(np.int64 if integer else np.float32)


ColValues = Callable[[Col], Any] | np.ndarray | None


def apply(op: ComputeOp, x: np.ndarray, integer: bool, col: ColValues = None) -> np.ndarray:
    """`op` on values `x` (from `start` or an earlier op). `col(c)` gives column vector c's value of each column of
    `x` (an array: the same row for every column vector)."""
    match op:
        case Map(expr):
            values = col if callable(col) or col is None else (lambda c, row=col: row)
            try:
                return elementwise.evaluate(expr, [x], integer, _as_row(values))
            except ElementwiseError as e:
                raise EpilogueError(str(e)) from None
        case Requant(multiplier, shift, zero_point):
            return requantize(x, multiplier, shift, zero_point)
    raise EpilogueError(f"{op!r} is not an elementwise epilogue op")


def mapped(expr: Expr, pages: list[Any], integer: bool, col: Callable[[Col], Any] | None = None) -> Any:
    """A Map's expression on its input pages (each from `start`): `elementwise.evaluate`, its refusals an
    EpilogueError."""
    try:
        return elementwise.evaluate(expr, pages, integer, _as_row(col))
    except ElementwiseError as e:
        raise EpilogueError(str(e)) from None


def _as_row(col: Callable[[Col], Any] | None) -> Callable[[Col], Any] | None:
    """Column vectors as rows that broadcast over a block's rows; row vectors (one value per row) as columns that
    broadcast over its columns."""
    if col is None:
        return None
    return lambda c: np.asarray(col(c)).reshape((-1, 1) if c.axis == VecAxis.ROW else (1, -1))

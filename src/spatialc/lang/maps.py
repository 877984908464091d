"""Maps and reductions in the embedded language: a map stage's formula from an `ew` expression (or a function of
its input pages' values), the row width a row reduction masks at and the column height a column reduction does, and a
formula as `ew` source (`show --python`).

A map reads the front pages of its rings: a ring a row reduction fills is a row vector (`RowArg`: each element its
row's value), any other ring a page of values (`Arg`); `ew.col(name)` is the parameter tensor `name`, one value per
column (`Col`), and `ew.row(name)` one of one value per row (`Col` along ROW). The same rules read a formula back into
`ew` source, so a printed map traces to the same formula. `ew.row_index()` and `ew.col_index()` (`Pos`) are an
element's row and column, placed as a row and a column vector are.

A map no stage declares (`e.map(lambda x, m: …, pages, page)`: a step of a declared stage the engines expand, as
attention's) reads as row vectors the rings the builder has seen filled with them: a reduction's, a row
accumulator's packed (`Builder.row_vectors`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import ew
from ..errors import ProgramError
from ..ir.ids import BufferId, TensorId
from ..ir.nodes import ComputeStage, ReadStage, Tensor, TensorRole
from ..ir.ops import (
    REDUCE_OPS,
    Apply,
    Arg,
    Col,
    ColReduce,
    Expr,
    Lit,
    Map,
    Pos,
    RowArg,
    RowReduce,
    TileAddr,
    VecAxis,
)
from ..numerics.elementwise import OPS
from .lines import refuse

if TYPE_CHECKING:
    from .builder import Builder
    from .handles import RingRef


def vector_rings(b: Builder) -> set[BufferId]:
    """The rings the stages declared so far fill with row vectors: the outputs of row reductions, and of maps that
    read row vectors alone (LayerNorm's mean = Σx / n: one value a row, as the planner takes it)."""
    vectors: set[BufferId] = set()
    for s in b.stages:  # in declaration order: a map's rings are declared before it
        if not isinstance(s.kind, ComputeStage):
            continue
        op = s.kind.op
        if isinstance(op, RowReduce) or (isinstance(op, Map) and s.ins and all(x in vectors for x in s.ins)):
            vectors.update(s.outs)
    return vectors


def formula(b: Builder, name: str, expr: Any, ins: Sequence[RingRef], vectors: set[BufferId] | None = None) -> Expr:
    """Map stage `name`'s formula: `expr` (an ew expression over `ew.inputs(len(ins))`, or a function given one value
    per ring of `ins`), each input a row vector where its ring is one of `vectors` (by default: a reduction's), each
    column or row vector a parameter."""
    if callable(expr) and not isinstance(expr, ew.Value):
        try:
            inspect.signature(expr).bind(*ins)
        except TypeError:
            raise refuse(f"map {name}'s function takes one value for each of the {len(ins)} ring(s) it reads") from None
        except ValueError:  # a callable with no signature Python can read: called as it is
            pass
        try:
            expr = expr(*ew.inputs(len(ins)))
        except ProgramError as e:  # an ew op given the wrong operands: at the line of the map
            raise refuse(f"map {name}: {e}") from None
        except (TypeError, AttributeError, ArithmeticError, RecursionError) as e:  # Python's own, from the function
            raise refuse(f"map {name}'s function raised {type(e).__name__} ({str(e)[:120]}): {ew.ALLOWED}") from None
    if not isinstance(expr, ew.Value):
        raise refuse(
            f"map {name}'s formula is an ew expression or a function of its pages' values (lambda x, m: ew.exp(x - m)),"
            f" not {type(expr).__name__}"
        )
    try:
        ew.check_size(expr)  # before anything walks it as the tree the IR stores
        named = ew.vector_names(expr)
    except ProgramError as e:
        raise refuse(f"map {name}: {e}") from None
    tensors = {c: column(b, name, c, axis) for c, axis in named.items()}  # refused here: at the user's line of the map
    resolved = ew.resolved(expr, tensors.__getitem__)
    vectors = vector_rings(b) if vectors is None else vectors
    shapes = tuple(r.id in vectors for r in ins)
    try:
        return as_rows(resolved, shapes)
    except IndexError as e:
        raise refuse(f"map {name} reads {e} of its {len(ins)} ring(s)") from None


def _leaves_replaced(expr: Expr, leaf: Callable[[Expr], Expr]) -> Expr:
    """`expr` with each node that is not an Apply replaced by leaf(node), each distinct node walked once (a part the
    formula uses twice is one object, and stays one)."""
    done: dict[int, Expr] = {}

    def walk(node: Expr) -> Expr:
        out = done.get(id(node))
        if out is not None:
            return out
        match node:
            case Apply(op, args, params):
                out = Apply(op, tuple(walk(a) for a in args), params)
            case _:
                out = leaf(node)
        done[id(node)] = out
        return out

    return walk(expr)


def as_rows(expr: Expr, vectors: tuple[bool, ...]) -> Expr:
    """`expr` with each input i a row vector (`RowArg(i)`) where `vectors[i]`; IndexError naming an input past them."""

    def leaf(node: Expr) -> Expr:
        if not isinstance(node, Arg):
            return node
        if not 0 <= node.index < len(vectors):
            raise IndexError(f"input {node.index}")
        return RowArg(node.index) if vectors[node.index] else node

    return _leaves_replaced(expr, leaf)


def with_positions(expr: Expr, f: Callable[[Pos], Pos]) -> Expr:
    """`expr` with every position (`ew.row_index()`, `ew.col_index()`) q replaced by f(q)."""
    return _leaves_replaced(expr, lambda node: f(node) if isinstance(node, Pos) else node)


def column(b: Builder, stage: str, name: str, axis: VecAxis = VecAxis.COL) -> TensorId:
    """The parameter tensor `ew.col(name)` names (one row of values, one a column), or `ew.row(name)` (one column of
    values, one a row)."""
    t = next((t for t in b.tensors if t.name == name), None)
    row = axis == VecAxis.ROW
    if t is None or t.role != TensorRole.PARAMETER or t.elems[1 if row else 0] != 1:
        what = "no tensor" if t is None else f"{t.role.value} tensor {t.name} of {t.elems[0]} x {t.elems[1]}"
        shape = "one column" if row else "one row"
        raise refuse(
            f"map {stage}: ew.{axis.value}({name!r}) is a parameter tensor of {shape} (p.parameter), not {what}"
        )
    return t.id


def reduced_cols(b: Builder, name: str, src: RingRef) -> int:
    """The row width a reduction of `src` masks at, when not given: the columns of the tensor its values come from
    (through the maps that fill it, by their first page)."""
    producer = {x: s for s in b.stages for x in s.outs}
    ring = src.id
    for _ in range(len(b.stages)):
        s = producer.get(ring)
        if s is None:
            break
        if isinstance(s.kind, ReadStage):
            t: Tensor = b.tensors[int(s.kind.tensor)]
            return t.elems[1]
        vectors = vector_rings(b)
        pages = [x for x in s.ins if x not in vectors]
        if not pages:
            break
        ring = pages[0]
    raise refuse(f"row reduction {name}: say the row's width in elements (cols=…); no read of a tensor fills its ring")


def reduce_op(name: str, op: Any, cols: int) -> RowReduce:
    """Stage `name`'s reduction: one of REDUCE_OPS over rows `cols` elements wide."""
    if op not in REDUCE_OPS:
        raise refuse(f"row reduction {name}: op {op!r} is none of {', '.join(REDUCE_OPS)}")
    return RowReduce(op, cols)


def col_rings(b: Builder) -> set[BufferId]:
    """The rings the stages declared so far fill with column vectors: the outputs of column reductions (a map reads
    one as a page of values: each column's value is in every row of it)."""
    return {
        x for s in b.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, ColReduce) for x in s.outs
    }


def reduced_rows(b: Builder, name: str, src: RingRef, rows: int | None) -> int:
    """The column height a column reduction of `src` masks at: the rows of the tensor a read declared before it
    reads into `src`. `rows`, where given, must be those — a reduction covers each column's values and no padding,
    as verify's rule 8 holds it to — and is needed where no read fills `src`."""
    read = next((s for s in b.stages if isinstance(s.kind, ReadStage) and src.id in s.outs), None)
    if read is None:
        if rows is None:
            raise refuse(
                f"column reduction {name}: say the column's height in elements (rows=…); no read fills its ring"
            )
        return rows
    t: Tensor = b.tensors[int(read.kind.tensor)]  # type: ignore[union-attr]
    if rows is not None and rows != t.elems[0]:
        raise refuse(
            f"column reduction {name} of {rows} rows: the columns of {t.name}, which {read.name} reads into"
            f" {src.name}, hold {t.elems[0]} values (a reduction covers each column's values and no padding; leave"
            " rows= out)"
        )
    return t.elems[0]


def col_reduce_op(name: str, op: Any, rows: int) -> ColReduce:
    """Stage `name`'s column reduction: one of REDUCE_OPS down columns `rows` elements high."""
    if op not in REDUCE_OPS:
        mean = " (a mean is a sum and a map of it, x / rows, as spatialc.col_reduce builds it)" if op == "mean" else ""
        raise refuse(f"column reduction {name}: op {op!r} is none of {', '.join(REDUCE_OPS)}{mean}")
    return ColReduce(op, rows)


# ---- a formula as ew source ----------------------------------------------------------------------------------

# Python's binding of each operator ew spells (higher binds tighter): an operand is parenthesised only where Python
# would read it otherwise.
OPERATORS = {"add": ("+", 2), "sub": ("-", 2), "mul": ("*", 3), "div": ("/", 3), "pow": ("**", 5)}
COMPARISONS = {"lt": ("<", 1), "le": ("<=", 1), "gt": (">", 1), "ge": (">=", 1)}  # an expression on the left only
UNARY, ATOM = 4, 9


def ew_source(expr: Expr, args: Sequence[str], vectors: tuple[bool, ...], col_name: Callable[[Col], str | None]) -> str:
    """`expr` as ew source over the names `args` of its inputs, or ValueError where `formula` would not read that
    source back to `expr` (an input the wrong kind for its ring, a column vector placed, an op not in the table)."""
    text = _source(expr, args, vectors, col_name)[0]
    return f"ew.value({text})" if isinstance(expr, Lit) else text  # a constant map: an expression, not a number


def _source(expr: Expr, args: Sequence[str], vectors: tuple[bool, ...], col_name) -> tuple[str, int]:
    """`expr`'s source and how tightly it binds."""
    match expr:
        case Arg(i) if 0 <= i < len(args) and not vectors[i]:
            return args[i], ATOM
        case RowArg(i, 1) if 0 <= i < len(args) and vectors[i]:
            return args[i], ATOM
        case Lit(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            return repr(float(v)), ATOM if math.copysign(1.0, v) > 0 else UNARY
        case Col(_, TileAddr(0, ()), 1, axis) if (name := col_name(expr)) is not None:
            return f'ew.{VecAxis(axis).value}("{name}")', ATOM
        case Pos(axis, TileAddr(0, ()), 1):
            return f"ew.{VecAxis(axis).value}_index()", ATOM
        case Apply(op, parts, params) if op in OPS and len(parts) == OPS[op].arity:
            spec = OPS[op]
            if len(params) != len(spec.params) or not all(math.isfinite(p) for p in params):
                raise ValueError(f"op {op}'s parameters")
            texts = [_source(a, args, vectors, col_name) for a in parts]
            values = [not isinstance(a, Lit) for a in parts]
            symbol, bind = OPERATORS.get(op) or COMPARISONS.get(op) or ("", 0)
            if symbol and (values[0] or (any(values) and op in OPERATORS)):
                # a ** b ** c is a ** (b ** c), and -x ** 2 is -(x ** 2); a < b < c is a chain, not two comparisons
                left, right = {5: (ATOM, UNARY), 1: (2, 2)}.get(bind, (bind, bind + 1))
                return f"{_wrap(texts[0], left)} {symbol} {_wrap(texts[1], right)}", bind
            if op == "neg" and values[0]:
                return f"-{_wrap(texts[0], UNARY)}", UNARY
            named = [f"{p}={v!r}" for p, v in zip(spec.params, params, strict=True)]
            return f"ew.{op}({', '.join([*(t for t, _ in texts), *named])})", ATOM
    raise ValueError(f"{type(expr).__name__} has no ew form here")


def _wrap(part: tuple[str, int], least: int) -> str:
    """An operand's source, parenthesised where it binds less tightly than `least`."""
    text, bind = part
    return text if bind >= least else f"({text})"

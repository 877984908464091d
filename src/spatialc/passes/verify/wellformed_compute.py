"""verify's rule 1 on compute ops: what a stage's or an engine's compute op, and an elementwise expression, may be
(the ops of the table, with their arity and parameters; constants the program's values hold)."""

from __future__ import annotations

import math

from ...ir.nodes import Tile
from ...ir.ops import (
    ACTIVATION_NAMES,
    MATMUL_PRECISIONS,
    MAX_EXPR_NODES,
    NO_FP32_MATMUL,
    REDUCE_OPS,
    Apply,
    Arg,
    Col,
    ColReduce,
    ComputeOp,
    Expr,
    Lit,
    Map,
    MatmulTiles,
    Precision,
    Requant,
    RowArg,
    RowReduce,
    expr_size_fault,
)
from ...numerics.elementwise import EXACT_LIMIT, OPS
from .limits import FLOAT32_MAX, MAX_ITEM_SIDE, MAX_REDUCE_COLS, REQUANT_MULTIPLIER, REQUANT_SHIFT, REQUANT_ZERO_POINT


def compute_fault(op: ComputeOp, precision: Precision, tile: Tile) -> str | None:
    """Why compute op `op` of a `precision` program of `tile`s cannot run, or None."""
    match op:
        case Map(expr):
            return expr_fault(expr, precision)
        case Requant(multiplier, shift, zero_point):
            for what, v, (lo, hi) in (
                ("multiplier", multiplier, REQUANT_MULTIPLIER),
                ("shift", shift, REQUANT_SHIFT),
                ("zero point", zero_point, REQUANT_ZERO_POINT),
            ):
                if not lo <= v <= hi:
                    return f"a requant {what} lies in [{lo}, {hi}], not {v}"
        case RowReduce(name, n, _, width):
            if name not in REDUCE_OPS:
                return f"no row reduction {name!r}: the reductions are {', '.join(REDUCE_OPS)}"
            if not 1 <= n <= MAX_REDUCE_COLS or not 1 <= width <= MAX_ITEM_SIDE:
                return (
                    f"a row reduction reduces 1 to {MAX_REDUCE_COLS} columns in pages 1 to {MAX_ITEM_SIDE} tiles wide,"
                    f" not {n} columns in pages {width} wide"
                )
        case ColReduce(name, m, _, width):
            if name not in REDUCE_OPS:
                return f"no column reduction {name!r}: the reductions are {', '.join(REDUCE_OPS)}"
            if not 1 <= m <= MAX_REDUCE_COLS or not 1 <= width <= MAX_ITEM_SIDE:
                return (
                    f"a column reduction reduces 1 to {MAX_REDUCE_COLS} rows in pages 1 to {MAX_ITEM_SIDE} tiles wide,"
                    f" not {m} rows in pages {width} wide"
                )
        case MatmulTiles(block, sub_blocks, operand):
            if operand not in MATMUL_PRECISIONS:
                return NO_FP32_MATMUL
            if min(block.osh, block.osw, block.ibw, *sub_blocks) < 1:
                return (
                    f"a tile matmul's block ({block.osh}x{block.osw}x{block.ibw}) and sub-blocks"
                    f" ({sub_blocks[0]}x{sub_blocks[1]}) must be ≥ 1"
                )
            if tile.rows != tile.cols:  # a product of two tiles is a tile only where they are square
                return f"a tile matmul multiplies square tiles, not {tile.rows}x{tile.cols}"
    return None


def expr_fault(expr: Expr, precision: Precision) -> str | None:
    """Why an elementwise expression of a `precision` program cannot run, or None: no more nodes, nor ops nested
    deeper, than `ir.ops.expr_size_fault` allows, ops the table has, with their arity and parameters, constants the
    program's values hold, integer ops in an integer program."""
    too_large = expr_size_fault(expr)
    if too_large is not None:
        return too_large
    nodes = list(_expr_nodes(expr, MAX_EXPR_NODES + 1))
    integer = precision == Precision.INT8
    for node in nodes:
        match node:
            case Apply(name, args, params):
                op = OPS.get(name)
                if op is None:
                    return f"elementwise op {name!r} is none of the table's ({', '.join(OPS)})"
                if len(args) != op.arity or len(params) != len(op.params):
                    want = f"{op.arity} operand(s)" + (f" and parameters {', '.join(op.params)}" if op.params else "")
                    return f"{name} takes {want}, not {len(args)} and {len(params)} parameter(s)"
                if any(not math.isfinite(v) for v in params):
                    return f"{name}'s parameters must be finite numbers, not {list(params)}"
                if integer and not op.integer:
                    what = f"activation {name}" if name in ACTIVATION_NAMES else name
                    return f"{what} is float arithmetic; an int8 program's epilogue is integer arithmetic"
                if integer and any(v != int(v) or abs(v) >= EXACT_LIMIT for v in params):
                    return f"an int8 program's {name} takes whole-number parameters within ±2^62, not {list(params)}"
                if name == "clamp" and params[0] > params[1]:
                    return f"clamp's bounds are in order, lo ≤ hi, not {params[0]!r} > {params[1]!r}"
            case Lit(value):
                if not math.isfinite(value):
                    return f"an elementwise constant must be a finite number, not {value!r}"
                if integer and (value != int(value) or abs(value) >= EXACT_LIMIT):
                    return (
                        f"an int8 program's epilogue is integer arithmetic, exact: a constant needs a whole number"
                        f" within ±2^62, not {value!r}"
                    )
                if not integer and abs(value) > FLOAT32_MAX:
                    return (
                        f"a {precision.value} program's epilogue is float32: the constant {value!r} is beyond float32"
                    )
            case Arg(i) if i < 0:
                return f"an expression reads input page {i}"
            case RowArg(i, width) if i < 0 or width < 1:
                return f"an expression reads row vector {i} against pages {width} tiles wide"
            case Col(_, _, width) if width < 1:
                return f"a column vector is at least 1 tile wide, not {width}"
    return None


def _expr_nodes(expr: Expr, limit: int):
    """The nodes of `expr`, depth first, at most `limit` of them."""
    stack, seen = [expr], 0
    while stack and seen < limit:
        node = stack.pop()
        seen += 1
        yield node
        if isinstance(node, Apply):
            stack.extend(reversed(node.args))

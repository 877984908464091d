"""Elementwise programs: `elementwise(expr, m, n)` builds the unplanned program out = expr(x0, x1, …), element by
element, of an `ew` expression over input tensors, constants and row or column vectors (no matmul)."""

from __future__ import annotations

import math
from typing import Any

from .arguments import OUTPUT_CHOICES, TILE, _check_map, _dim, check_elems, out_named, precision_of
from .errors import ProgramError
from .ir import ops
from .ir.ids import BufferId, StageId, TensorId
from .ir.nodes import (
    Buffer,
    ComputeStage,
    DType,
    Engine,
    Fifo,
    Interm,
    ReadStage,
    SpatialProgram,
    Stage,
    Tensor,
    TensorRole,
    WriteStage,
    accumulator_dtype,
)
from .ir.ops import Map, Precision, VecAxis

MAX_NAMES = 16  # the input names `elementwise` takes (ew.MAX_INPUTS)


def elementwise(
    expr: Any,
    m: int,
    n: int,
    precision: str | Precision = "bf16",
    *,
    names: tuple[str, ...] | list[str] | None = None,
    target: str = "sm_90",
    out: str | None = None,
) -> SpatialProgram:
    """The program out[m×n] = expr(x0, x1, …) element by element, before tiling: `expr` is an `ew` expression over
    the input tensors (`ew.inputs(k)`), constants, column vectors (`ew.col(name)`, a parameter tensor of n values, one
    per column) and row vectors (`ew.row(name)`, m values, one per row: a per-token scale). The inputs hold values
    of `precision` (int8, fp16, bf16, e4m3, e5m2, or fp32: float32 data taken as it is), named by `names` (x0, x1, …
    by default); the output `out`, float32 by default (fp16 or bf16 rounded to nearest even; int32 or int64, the
    default, in an int8 program).

    `expr` may instead be a dict of outputs, name → ew expression (`{"out1": x1 * c - x2 * s, "out2": x2 * c + x1 *
    s}`: RoPE's two halves): one output tensor each, in the dict's order, each of `out`'s type and its own map of
    the inputs it reads, all in one kernel that reads each input once an item."""
    from . import ew

    exprs = _outputs(expr)
    m, n = _dim("m", m), _dim("n", n)
    check_elems("each input and output", m, n)
    prec = precision_of(precision)
    used = _inputs_read(exprs)
    count = len(used)
    names = tuple(names) if names is not None else tuple(f"x{i}" for i in range(count))
    vectors = _vectors(exprs)
    _check_names(names, count, list(vectors), list(exprs))
    choices = OUTPUT_CHOICES["int8" if prec == Precision.INT8 else "float"]
    out = out_named(out)
    if out is not None and out not in choices:
        raise ProgramError(f"a {prec.value} elementwise program's output is one of {', '.join(choices)}, not {out!r}")
    out_dtype = DType(out) if out is not None else DType.INT64 if prec == Precision.INT8 else DType.FLOAT32
    tiles = (math.ceil(m / TILE.rows), math.ceil(n / TILE.cols))
    tensors = [
        Tensor(TensorId(i), name, TensorRole.INPUT, (m, n), tiles, DType(prec.value)) for i, name in enumerate(names)
    ]
    for name, axis in vectors.items():  # a row vector is one column of m values, a column vector one row of n
        tid = TensorId(len(tensors))
        shape, grid = ((m, 1), (tiles[0], 1)) if axis == VecAxis.ROW else ((1, n), (1, tiles[1]))
        tensors.append(Tensor(tid, name, TensorRole.PARAMETER, shape, grid, accumulator_dtype(prec)))
    ids = {t.name: t.id for t in tensors}
    buffers = [Buffer(BufferId(i), f"{name}_ring", Fifo(1, 1)) for i, name in enumerate(names)]
    stages = [
        Stage(StageId(i), f"read_{name}", ReadStage(TensorId(i)), Engine.READER, outs=(BufferId(i),))
        for i, name in enumerate(names)
    ]
    alone = len(exprs) == 1  # one output: its stages named as ever (map, write_out)
    writes = []
    for name, e in exprs.items():
        t_out, ring = TensorId(len(tensors)), BufferId(len(buffers))
        tensors.append(Tensor(t_out, name, TensorRole.OUTPUT, (m, n), tiles, out_dtype))
        buffers.append(Buffer(ring, f"{name}_ring", Interm(1, 1)))
        resolved = ew.resolved(e, ids.__getitem__)
        reads = sorted(set(ops.arg_indices(resolved)))  # the inputs this output's map reads: its pages, in order
        map_op = Map(_renumbered(resolved, {i: k for k, i in enumerate(reads)}))
        _check_map(map_op, prec, inputs=len(reads))
        ins = tuple(BufferId(i) for i in reads)
        stage = "map" if alone else f"map_{name}"
        stages.append(Stage(StageId(len(stages)), stage, ComputeStage(map_op), Engine.COMPUTE, ins=ins, outs=(ring,)))
        writes.append((f"write_{name}", WriteStage(t_out), ring))
    for stage, kind, ring in writes:
        stages.append(Stage(StageId(len(stages)), stage, kind, Engine.WRITER, ins=(ring,)))
    name = f"elementwise_{m}x{n}_{prec.value}"
    return SpatialProgram(name, target, TILE, prec, tuple(tensors), tuple(stages), tuple(buffers))


def _outputs(expr: Any) -> dict[str, Any]:
    """`expr` as outputs by name: one ew expression is the output `out`; a dict names each (at least one)."""
    from . import ew

    exprs = dict(expr) if isinstance(expr, dict) else {"out": expr}
    if not exprs:
        raise ProgramError("elementwise takes a dict of at least one output, name → ew expression; this one is empty")
    for name, e in exprs.items():
        if not isinstance(e, ew.Value):
            what = "" if not isinstance(expr, dict) else f" for output {name!r}"
            raise ProgramError(f"elementwise takes an ew expression (spatialc.ew){what}, not {e!r}")
    return exprs


def _inputs_read(exprs: dict[str, Any]) -> list[int]:
    """The input indices the outputs' formulas read together: 0 … k−1, each at least once, or ProgramError — as
    each output's formula reads at least one (its map is of input pages; a map of none has no page to fill)."""
    from . import ew

    used: set[int] = set()
    for name, e in exprs.items():
        resolved = ew.resolved(e, lambda c: TensorId(0))
        if ops.positions(resolved):  # an engine written by hand places them (spatialc.lang's e.map); not this planner
            raise ProgramError(
                "ew.row_index() and ew.col_index() are read where a hand-written engine places its pages"
                " (spatialc.lang's e.map); spatialc.elementwise does not place them"
            )
        read = set(ops.arg_indices(resolved))
        if not read:  # (constants and vectors alone: no tensor whose elements the formula is of)
            which = "this formula" if len(exprs) == 1 else f"output {name}'s formula"
            raise ProgramError(
                f"an elementwise program maps at least one input tensor (ew.inputs) into each output; {which} reads"
                " none, only constants or vectors"
            )
        used |= read
    count = 1 + max(used, default=-1)
    if used != set(range(count)):
        raise ProgramError(
            f"an elementwise program reads inputs 0 … k−1, each at least once; this one reads {sorted(used)}"
        )
    return sorted(used)


def _vectors(exprs: dict[str, Any]) -> dict[str, VecAxis]:
    """The named vectors the outputs' formulas read, each with its axis, in order of first use."""
    from . import ew

    out: dict[str, VecAxis] = {}
    for e in exprs.values():
        for name, axis in ew.vector_names(e).items():
            if out.setdefault(name, axis) != axis:
                raise ProgramError(f"{name!r} is read both as a column vector (col) and as a row vector (row)")
    return out


def _renumbered(expr: ops.Expr, new: dict[int, int]) -> ops.Expr:
    """`expr` with each page read x_i read as x_new[i] (an output's map reads only the inputs it names)."""
    match expr:
        case ops.Arg(i):
            return ops.Arg(new[i])
        case ops.Apply(op, args, params):
            return ops.Apply(op, tuple(_renumbered(a, new) for a in args), params)
    return expr


def _check_names(names: tuple[str, ...], count: int, cols: list[str], outs: list[str]) -> None:
    if len(names) != count:
        raise ProgramError(f"the formula reads {count} input(s), and {len(names)} names were given for them: {names!r}")
    if not all(isinstance(v, str) and v.isidentifier() for v in names):
        raise ProgramError(f"an elementwise program of {count} input(s) names each by an identifier, not {names!r}")
    if not all(isinstance(v, str) and v.isidentifier() for v in outs):
        raise ProgramError(f"an elementwise program names each output by an identifier, not {outs!r}")
    read = sorted({v for v in names if v.lower() in {o.lower() for o in outs}})
    if read and len(outs) > 1:  # `b = a + x1` where a is an output: an output is no input
        raise ProgramError(
            f"output {read[0]} is read by a formula as an input: an output is no input of the program — write its"
            f" formula out where another output reads it, or name the input otherwise"
        )
    taken = [v.lower() for v in (*names, *cols, *outs)]
    if len(set(taken)) != len(taken):
        what = "the output out" if outs == ["out"] else f"outputs {outs}"
        raise ProgramError(
            f"the inputs {list(names)}, vectors {cols} and {what} need names of their own (compared without case)"
        )

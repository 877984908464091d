"""Elementwise programs: `elementwise(expr, m, n)` builds the unplanned program out = expr(x0, x1, …), element by
element, of an `ew` expression over input tensors, constants and row or column vectors (no matmul)."""

from __future__ import annotations

import math
from typing import Any

from .arguments import OUTPUT_CHOICES, TILE, _check_map, _check_size, _dim, out_named, precision_of
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
    default, in an int8 program)."""
    from . import ew

    if not isinstance(expr, ew.Value):
        raise ProgramError(f"elementwise takes an ew expression (spatialc.ew), not {expr!r}")
    m, n = _dim("m", m), _dim("n", n)
    _check_size(m, n, 1)
    prec = precision_of(precision)
    resolved = ew.resolved(expr, lambda c: TensorId(0))
    if ops.positions(resolved):  # an engine written by hand places them (spatialc.lang's e.map); the map planner not
        raise ProgramError(
            "ew.row_index() and ew.col_index() are read where a hand-written engine places its pages (spatialc.lang's"
            " e.map); spatialc.elementwise does not place them"
        )
    used = set(ops.arg_indices(resolved))
    count = 1 + max(used, default=-1)
    if count == 0:  # (constants and vectors alone: no tensor whose elements the formula is of)
        raise ProgramError(
            "an elementwise program maps at least one input tensor (ew.inputs); this formula reads none, only"
            " constants or vectors"
        )
    if used != set(range(count)):
        raise ProgramError(
            f"an elementwise program reads inputs 0 … k−1, each at least once; this one reads {sorted(used)}"
        )
    names = tuple(names) if names is not None else tuple(f"x{i}" for i in range(count))
    vectors = ew.vector_names(expr)
    cols = list(vectors)
    _check_names(names, count, cols)
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
    t_out = TensorId(len(tensors))
    tensors.append(Tensor(t_out, "out", TensorRole.OUTPUT, (m, n), tiles, out_dtype))
    map_op = Map(ew.resolved(expr, ids.__getitem__))
    _check_map(map_op, prec, inputs=count)
    buffers = [Buffer(BufferId(i), f"{name}_ring", Fifo(1, 1)) for i, name in enumerate(names)]
    out_ring = BufferId(len(buffers))
    buffers.append(Buffer(out_ring, "out_ring", Interm(1, 1)))
    stages = [
        Stage(StageId(i), f"read_{name}", ReadStage(TensorId(i)), Engine.READER, outs=(BufferId(i),))
        for i, name in enumerate(names)
    ]
    ins = tuple(BufferId(i) for i in range(count))
    stages.append(Stage(StageId(count), "map", ComputeStage(map_op), Engine.COMPUTE, ins=ins, outs=(out_ring,)))
    stages.append(Stage(StageId(count + 1), "write_out", WriteStage(t_out), Engine.WRITER, ins=(out_ring,)))
    name = f"elementwise_{m}x{n}_{prec.value}"
    return SpatialProgram(name, target, TILE, prec, tuple(tensors), tuple(stages), tuple(buffers))


def _check_names(names: tuple[str, ...], count: int, cols: list[str]) -> None:
    if len(names) != count:
        raise ProgramError(f"the formula reads {count} input(s), and {len(names)} names were given for them: {names!r}")
    if not all(isinstance(v, str) and v.isidentifier() for v in names):
        raise ProgramError(f"an elementwise program of {count} input(s) names each by an identifier, not {names!r}")
    taken = [v.lower() for v in (*names, *cols, "out")]
    if len(set(taken)) != len(taken):
        raise ProgramError(
            f"the inputs {list(names)}, vectors {cols} and the output out need names of their own (compared"
            " without case)"
        )

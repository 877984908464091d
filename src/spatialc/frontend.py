"""Describing programs: `gemm(m, n, k, precision)` builds the unplanned spatial program of C = A @ B."""

from __future__ import annotations

import math

from .errors import ProgramError
from .ir.ids import BufferId, StageId, TensorId
from .ir.nodes import (
    Accumulator,
    Buffer,
    ComputeStage,
    DType,
    Engine,
    Fifo,
    ReadStage,
    SpatialProgram,
    Stage,
    Tensor,
    TensorRole,
    Tile,
    WriteStage,
)
from .ir.ops import BlockShape, MatmulTiles, Precision

TILE = Tile(16, 16)
OUTPUT_DTYPE = {Precision.INT8: DType.INT64, Precision.FP16: DType.FLOAT32, Precision.BF16: DType.FLOAT32}

# Buffer ids of a GEMM program: the operand rings, the accumulator and the output ring.
BUF_A, BUF_B, BUF_ACC, BUF_C = BufferId(0), BufferId(1), BufferId(2), BufferId(3)
T_A, T_B, T_C = TensorId(0), TensorId(1), TensorId(2)


def precision_of(name: str | Precision) -> Precision:
    """`int8`, `fp16` or `bf16` as a Precision."""
    try:
        return Precision(name)
    except ValueError:
        raise ProgramError(f"unknown precision {name!r}; use one of int8, fp16, bf16") from None


def _dim(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ProgramError(f"{name} must be a whole number ≥ 1, not {v!r}")
    return v


def gemm(m: int, n: int, k: int, precision: str | Precision = "int8", *, target: str = "sm_90") -> SpatialProgram:
    """The program C[m×n] = A[m×k] @ B[k×n], before tiling (ring sizes are the tile pass's to choose)."""
    m, n, k = _dim("m", m), _dim("n", n), _dim("k", k)
    prec = precision_of(precision)
    op_dtype = DType(prec.value)

    def tensor(tid: TensorId, name: str, role: TensorRole, rows: int, cols: int, dtype: DType) -> Tensor:
        return Tensor(tid, name, role, (rows, cols), (math.ceil(rows / TILE.rows), math.ceil(cols / TILE.cols)), dtype)

    tensors = (
        tensor(T_A, "A", TensorRole.INPUT, m, k, op_dtype),
        tensor(T_B, "B", TensorRole.INPUT, k, n, op_dtype),
        tensor(T_C, "C", TensorRole.OUTPUT, m, n, OUTPUT_DTYPE[prec]),
    )
    buffers = (
        Buffer(BUF_A, "A_ring", Fifo(1, 1)),
        Buffer(BUF_B, "B_ring", Fifo(1, 1)),
        Buffer(BUF_ACC, "acc", Accumulator(1)),
        Buffer(BUF_C, "C_ring", Fifo(1, 1)),
    )
    stages = (
        Stage(StageId(0), "read_A", ReadStage(T_A), Engine.READER, outs=(BUF_A,)),
        Stage(StageId(1), "read_B", ReadStage(T_B), Engine.READER, outs=(BUF_B,)),
        Stage(StageId(2), "matmul", ComputeStage(MatmulTiles(BlockShape(1, 1, 1), (1, 1), prec)), Engine.COMPUTE,
              ins=(BUF_A, BUF_B), outs=(BUF_C,)),
        Stage(StageId(3), "write_C", WriteStage(T_C), Engine.WRITER, ins=(BUF_C,)),
    )
    return SpatialProgram(f"gemm_{m}x{n}x{k}_{prec.value}", target, TILE, prec, tensors, stages, buffers)

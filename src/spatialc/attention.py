"""Attention as a spatial program (issue 32): O = softmax(scale · Q·Kᵀ + mask) · V, and the log-sum-exp of each row.

    p = spatialc.build(spatialc.attention(2, 16, 4096, 4096, 128, causal=True), "sm_90")
    out = spatialc.evaluate(p, {"q": q, "k": k, "v": v})   # {"o": …, "lse": …}; q is (batch, heads, seq_q, dim)

The program declares one stage, `attention(Q, K, V)` (`ir.ops.Attention`: its scale, its mask, which KV head each
query head reads), between the reads of Q, K and V and the writes of O and LSE. The planner (`passes/attention.py`)
expands it into FlashAttention's online recurrence over KV blocks — S = Q·Kᵀ, a running row max m and sum l, the
output accumulator rescaled by α = exp(m − m′) before each P·V — and rule 8 proves the schedule runs exactly that
recurrence, which equals the declared softmax (docs/verification.md).

Tensors are stored a head after another: Q, O and LSE hold batch·heads groups of seq_q rows, K and V batch·kv_heads
groups of seq_kv rows (arrays come as (batch, heads, seq, dim), or (batch·heads, seq, dim)).
"""

from __future__ import annotations

import math

from .arguments import MAX_TENSOR_ELEMS, OUTPUT_CHOICES, TILE, _dim, matmul_precision_of, out_named
from .errors import ProgramError, clipped
from .ir.ids import BufferId, StageId, TensorId
from .ir.nodes import (
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
    WriteStage,
)
from .ir.ops import Attention, Precision
from .numerics.attention import FLOAT32_HOLDS, keyless, valid_scale

MAX_HEAD_DIM = 256  # FlashAttention's largest: beyond it a band of Q and a block of K and V no longer fit a site


def attention(
    batch: int,
    heads: int,
    seq_q: int,
    seq_kv: int,
    head_dim: int,
    *,
    kv_heads: int | None = None,
    causal: bool = False,
    scale: float | None = None,
    precision: str | Precision = "bf16",
    target: str = "sm_90",
    out: str | None = None,
) -> SpatialProgram:
    """The program of scaled dot-product attention, before tiling: for each batch and query head h,
    O = softmax(scale · Q·Kᵀ + mask) · V with K and V of KV head h // (heads / kv_heads) (grouped-query attention
    where kv_heads < heads), and LSE = log Σ_c exp(scale · Q·Kᵀ + mask) along each query row (the second output,
    float32, as FlashAttention's backward pass reads it). `scale` defaults to 1/√head_dim; `causal` masks key c for
    query r where c > r + seq_kv − seq_q (aligned bottom right, as FlashAttention's and torch's causal_lower_right;
    SDPA's is_causal aligns it top left). Q, K and V are `precision` (bf16 or fp16); O is float32 unless `out` says
    bf16 or fp16."""
    b, h, sq, skv, d = (
        _dim("batch", batch),
        _dim("heads", heads),
        _dim("seq_q", seq_q),
        _dim("seq_kv", seq_kv),
        _dim("head_dim", head_dim),
    )
    kvh = h if kv_heads is None else _dim("kv_heads", kv_heads)
    if h % kvh:
        raise ProgramError(f"heads ({h}) must be a multiple of kv_heads ({kvh}): each KV head serves as many heads")
    if d > MAX_HEAD_DIM:
        raise ProgramError(f"head_dim is at most {MAX_HEAD_DIM}, not {d}")
    if not isinstance(causal, bool):
        raise ProgramError(f"causal is True or False, not {causal!r}")
    why = keyless(sq, skv, causal)
    if why is not None:
        raise ProgramError(why)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if not valid_scale(scale):
        raise ProgramError(f"scale is a finite number > 0, not {clipped(repr(scale))} ({FLOAT32_HOLDS})")
    prec = matmul_precision_of(precision, "attention")
    if prec not in (Precision.BF16, Precision.FP16):
        raise ProgramError(f"attention's operands are bf16 or fp16 (its softmax is float arithmetic), not {prec.value}")
    choices = OUTPUT_CHOICES["float"]
    out = out_named(out)
    if out is not None and out not in choices:
        raise ProgramError(f"attention's output is one of {', '.join(choices)}, not {out!r}")
    out_dtype = DType(out) if out is not None else DType.FLOAT32
    for name, groups, rows in (("q", b * h, sq), ("k", b * kvh, skv)):
        if groups * rows * d > MAX_TENSOR_ELEMS:
            raise ProgramError(
                f"{name} would be {groups}x{rows}x{d} = {groups * rows * d} elements; spatialc takes tensors of at"
                f" most 2^34 = {MAX_TENSOR_ELEMS} elements"
            )
    op_dtype = DType(prec.value)

    def tensor(tid: int, name: str, role: TensorRole, groups: int, rows: int, cols: int, dtype: DType) -> Tensor:
        tiles = (groups * math.ceil(rows / TILE.rows), math.ceil(cols / TILE.cols))
        return Tensor(TensorId(tid), name, role, (rows, cols), tiles, dtype, groups=groups)

    tensors = (
        tensor(0, "q", TensorRole.INPUT, b * h, sq, d, op_dtype),
        tensor(1, "k", TensorRole.INPUT, b * kvh, skv, d, op_dtype),
        tensor(2, "v", TensorRole.INPUT, b * kvh, skv, d, op_dtype),
        tensor(3, "o", TensorRole.OUTPUT, b * h, sq, d, out_dtype),
        tensor(4, "lse", TensorRole.OUTPUT, b * h, sq, 1, DType.FLOAT32),
    )
    rings = ("q_ring", "k_ring", "v_ring", "o_ring", "lse_ring")
    buffers = tuple(Buffer(BufferId(i), name, Fifo(1, 1)) for i, name in enumerate(rings))
    q, k, v, o, lse = (BufferId(i) for i in range(5))
    op = Attention(float(scale), sq, skv, h // kvh, causal)
    stages = (
        Stage(StageId(0), "read_q", ReadStage(TensorId(0)), Engine.READER, outs=(q,)),
        Stage(StageId(1), "read_k", ReadStage(TensorId(1)), Engine.READER, outs=(k,)),
        Stage(StageId(2), "read_v", ReadStage(TensorId(2)), Engine.READER, outs=(v,)),
        Stage(StageId(3), "attention", ComputeStage(op), Engine.COMPUTE, ins=(q, k, v), outs=(o, lse)),
        Stage(StageId(4), "write_o", WriteStage(TensorId(3)), Engine.WRITER, ins=(o,)),
        Stage(StageId(5), "write_lse", WriteStage(TensorId(4)), Engine.WRITER, ins=(lse,)),
    )
    name = f"attention_{b}x{h}x{sq}x{skv}x{d}_{prec.value}" + ("_causal" if causal else "")
    if kvh != h:
        name += f"_kv{kvh}"
    return SpatialProgram(name, target, TILE, prec, tensors, stages, buffers)

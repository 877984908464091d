"""Describing a W4A16 GEMM: `gemm(m, n, k, "bf16", weights="int4", group=128, zeros=True)` builds the unplanned
program of C = epilogue(A @ dequant(B)), B stored as 4-bit weights (numerics/w4.py: formats, packing, dequant).

The program's stages: read_A; read_B into `Bq_ring` (pages of packed weights); `dequant_B`, a Dequant from
`Bq_ring` into `B_ring` (pages of bf16 / fp16 operands); the matmul of A_ring by B_ring; the epilogue; write_C.
Its tensors beyond A, B, C (and the epilogue's): `scale`, (K / group) × N values of the scale type (bf16, fp16 or
float32; e8m0 for mxfp4), and with `zeros` the zero points `zeros`, (K / group) × N values of the weight type.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from .errors import ProgramError
from .ir.ids import BufferId, StageId, TensorId
from .ir.names import fitted_name
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
)
from .ir.ops import Dequant, Precision, WeightFormat
from .numerics.w4 import MX_GROUP, WEIGHT_FORMATS

SCALE = "scale"
ZEROS = "zeros"
W4_PRECISIONS = (Precision.BF16, Precision.FP16)  # the operand types a 4-bit weight is dequantised to
SCALE_TYPES = ("bf16", "fp16", "float32")  # of int4 / uint4 scales; mxfp4's are e8m0


class WeightError(ProgramError):
    """A W4A16 request that cannot be built as asked: a format, group, shape or scale type out of what it takes."""


def check_request(
    precision: Precision, weights: object, group: object, zeros: object, scale: object, k: int
) -> tuple[WeightFormat, int, DType]:
    """(format, group, scale type) of a W4A16 request, or WeightError naming the one thing wrong."""
    if not isinstance(weights, str) or weights.lower() not in WEIGHT_FORMATS:
        raise WeightError(f"unknown weights {weights!r}; use one of {', '.join(WEIGHT_FORMATS)} (or None: B as A is)")
    fmt = WeightFormat(weights.lower())
    if precision not in W4_PRECISIONS:
        raise WeightError(f"4-bit weights are dequantised to bf16 or fp16; precision {precision.value} takes none")
    if not isinstance(zeros, bool):
        raise WeightError(f"zeros is True or False, not {zeros!r}")
    if fmt == WeightFormat.MXFP4:
        group = MX_GROUP if group is None else group
        if group != MX_GROUP or zeros or scale not in (None, "e8m0"):
            raise WeightError(
                f"mxfp4 weights have an e8m0 scale per {MX_GROUP} values of K and no zero point; got group={group!r},"
                f" zeros={zeros}, scale={scale!r}"
            )
        scale_type = DType.E8M0
    else:
        scale = precision.value if scale is None else scale
        if scale not in SCALE_TYPES:
            raise WeightError(f"an {fmt.value} scale is one of {', '.join(SCALE_TYPES)}, not {scale!r}")
        scale_type = DType(scale)
    group = 128 if group is None else group
    if isinstance(group, bool) or not isinstance(group, numbers.Integral) or group < 16 or group % 16:
        raise WeightError(f"group is a whole number of rows of K, a multiple of 16 (the tile), not {group!r}")
    group = int(group)
    if k % group:
        raise WeightError(f"K = {k} is not a multiple of the group ({group}): each group of K has its own scale")
    return fmt, group, scale_type


def with_weights(
    plain: SpatialProgram, precision: Precision, weights: object, group: object, zeros: object, scale: object
) -> SpatialProgram:
    """The W4A16 program of `plain`, a GEMM built by `frontend._gemm` (B read straight into the matmul's ring): B
    holds 4-bit weights, read into a ring of their own, dequantised into the matmul's B ring."""
    from .frontend import BUF_B, T_B

    k, n = plain.tensor(T_B).elems
    fmt, group, scale_type = check_request(precision, weights, group, zeros, scale, k)
    groups_k = k // group
    tiles = (math.ceil(groups_k / plain.tile.rows), math.ceil(n / plain.tile.cols))
    t_scale = TensorId(len(plain.tensors))
    tensors = [dataclasses.replace(t, dtype=WEIGHT_FORMATS[fmt.value]) if t.id == T_B else t for t in plain.tensors]
    tensors.append(Tensor(t_scale, SCALE, TensorRole.PARAMETER, (groups_k, n), tiles, scale_type))
    t_zero = None
    if zeros:
        t_zero = TensorId(len(tensors))
        tensors.append(Tensor(t_zero, ZEROS, TensorRole.PARAMETER, (groups_k, n), tiles, WEIGHT_FORMATS[fmt.value]))
    taken = {t.name.lower() for t in plain.tensors}
    if SCALE in taken or ZEROS in taken:
        raise WeightError(
            f"a W4A16 GEMM's scales and zero points are the tensors {SCALE!r} and {ZEROS!r}; name the"
            " epilogue's tensors otherwise"
        )
    bq = BufferId(len(plain.buffers))
    buffers = [
        dataclasses.replace(b, kind=Interm(b.kind.depth_pages, b.kind.page_tiles))
        if b.id == BUF_B and isinstance(b.kind, Fifo)
        else b
        for b in plain.buffers
    ]
    buffers.append(Buffer(bq, "Bq_ring", Fifo(1, 1)))
    op = Dequant(fmt, precision, group, t_scale, t_zero)
    stages: list[Stage] = []
    for s in plain.stages:
        if isinstance(s.kind, ReadStage) and s.kind.tensor == T_B:
            stages.append(dataclasses.replace(s, outs=(bq,)))
            stages.append(Stage(StageId(0), "dequant_B", ComputeStage(op), Engine.COMPUTE, ins=(bq,), outs=(BUF_B,)))
        else:
            stages.append(s)
    stages = [dataclasses.replace(s, id=StageId(i)) for i, s in enumerate(stages)]
    name = fitted_name(plain.name.replace(f"_{precision.value}", f"_{precision.value}_w{fmt.value}g{group}", 1))
    return plain.evolve(name=name, tensors=tuple(tensors), buffers=tuple(buffers), stages=tuple(stages))


def dequant_stage(p: SpatialProgram) -> Stage | None:
    """The program's dequant prologue, where it has one (a W4A16 GEMM)."""
    return next((s for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Dequant)), None)

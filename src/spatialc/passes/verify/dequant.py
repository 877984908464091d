"""Rule 8 on a W4A16 GEMM's dequant prologue: what the stages declare the dequantised operand to be.

A matmul's operand may be a ring filled by a Dequant stage from a ring that a read of 4-bit weights fills: the
operand is then dequant(W) — each element scale[g, j] · (q − zero[g, j]) of W's element q at (k, j), g = k //
group, rounded as `numerics.w4.dequant` states. `declared` records it as a computed operand with the one-stage
chain (dequant) and no matmul behind it. The declaration must be one the kernel and the interpreter compute: the
weights' element type is the format the op names (int4 / uint4 / e2m1 for mxfp4: signed is not unsigned), the
scales are (K / group) × N values of bf16, fp16 or float32 (e8m0 for mxfp4), the zero points, where there are any,
(K / group) × N values of the weights' own type, and the op dequantises to the program's operand type.

What the schedule does with it is proved with the rest of rule 8 (verify/engine.py, verify/semantics.py): the page
a dequant fills holds, at each tile, its op of the tile of the page it read, its scales and zero points read at the
tile row and column its `rows` and `cols` say — and the proof at the write requires that tile row and column to be
the very k-tile and column of W that the operand tile is (a scale of another group, or a zero point of another
column, is refused there), and the page read to hold W's tile (k, column) itself.

Rule 6 does not check a dequant's scale and zero-point reads as it checks a bias's (their tile row is the page's
divided by the group, not an affine form): they stay inside their tensors because rule 8 holds each to a weights
tile's own group and column and `dequant_operand` requires the scale and zero tensors to cover the weights' padded
grid; the interpreter refuses a read outside them (AddressError) in a program not verified.
Rule 6 does hold the page a dequant fills to at least the tiles of the packed page it reads (`bounds.py`'s
`_check_dequant_page`): the dequant converts all of that page, and rule 8 follows the page's value, not its room.
"""

from __future__ import annotations

import math

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import BufferId
from ...ir.index import ProgramIndex
from ...ir.nodes import DType, ReadStage, Stage, Tensor
from ...ir.ops import Dequant, WeightFormat
from ...numerics.w4 import MX_GROUP, WEIGHT_FORMATS

SCALE_TYPES = {
    WeightFormat.INT4: (DType.BF16, DType.FP16, DType.FLOAT32),
    WeightFormat.UINT4: (DType.BF16, DType.FP16, DType.FLOAT32),
    WeightFormat.MXFP4: (DType.E8M0,),
}


def dequant_operand(index: ProgramIndex, producer: dict[BufferId, Stage], dq: Stage, mm: Stage, which: str) -> Tensor:
    """The weights tensor that matmul stage `mm`'s operand `which`, filled by the dequant stage `dq`, dequantises;
    SemanticError where the declaration is not one a W4A16 GEMM computes, StrongerCheckNeeded where it is not the
    one shape the rule follows (the weights operand B, its page read from a tensor)."""
    p = index.p
    op = dq.kind.op  # type: ignore[union-attr]
    assert isinstance(op, Dequant)
    if which != "B" or len(dq.ins) != 1 or len(dq.outs) != 1:
        raise StrongerCheckNeeded(
            f"the stages: stage {dq.name} dequantises matmul stage {mm.name}'s operand {which}; the semantic rule"
            " follows a dequant of the weights B, one ring read into one"
        )
    read = producer.get(index.ring(dq.ins[0]))
    if read is None or not isinstance(read.kind, ReadStage):
        raise StrongerCheckNeeded(
            f"the stages: stage {dq.name} dequantises {index.name(dq.ins[0])}, which no read of a tensor fills"
        )
    w = index.tensors[read.kind.tensor]
    if not op.low_first:
        raise SemanticError(
            f"stage {dq.name} unpacks each byte high nibble first, but {w.name}'s bytes hold row 2i in the low"
            " nibble and row 2i + 1 in the high one (numerics/w4.py)"
        )
    if op.operand != p.precision:
        raise SemanticError(f"stage {dq.name} dequantises to {op.operand.value} in a {p.precision.value} program")
    if w.dtype != WEIGHT_FORMATS[op.weights.value]:
        raise SemanticError(
            f"stage {dq.name} dequantises {op.weights.value} weights, but {w.name} holds {w.dtype.value} values"
        )
    if w.groups != 1:
        raise StrongerCheckNeeded(f"the stages: {w.name} is a grouped tensor; the rule follows one matrix of weights")
    k, n = w.elems
    if op.weights == WeightFormat.MXFP4 and (op.group != MX_GROUP or op.zero is not None):
        raise SemanticError(f"stage {dq.name}: mxfp4 has a scale per {MX_GROUP} of K and no zero point")
    if op.group < 1 or op.group % p.tile.rows or k % op.group:
        raise SemanticError(
            f"stage {dq.name} takes a scale per {op.group} rows of {w.name}'s {k}: a group is a whole number of"
            f" {p.tile.rows}-row tiles, and K a whole number of groups"
        )
    want = (k // op.group, n)
    for role, tid, types in (("scales", op.scale, SCALE_TYPES[op.weights]), ("zero points", op.zero, (w.dtype,))):
        if tid is None:
            continue
        t = index.tensors[tid]
        if t.elems != want or t.dtype not in types or t.groups != 1:
            raise SemanticError(
                f"stage {dq.name} reads {t.name} ({t.elems[0]}x{t.elems[1]} {t.dtype.value}) as the {role} of"
                f" {w.name}: one per group of {op.group} rows and column, {want[0]}x{want[1]} values of"
                f" {' or '.join(x.value for x in types)}"
            )
        rows_t = math.ceil(math.ceil(w.tiles[0] * p.tile.rows / op.group) / p.tile.rows)
        if t.tiles[0] < rows_t or t.tiles[1] < w.tiles[1]:
            raise SemanticError(
                f"{t.name}'s {t.tiles[0]}x{t.tiles[1]} tiles do not cover the groups and columns of {w.name}'s"
                f" {w.tiles[0]}x{w.tiles[1]} tiles (padded, its groups' values are zero)"
            )
    return w

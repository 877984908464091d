"""Planning a W4A16 GEMM: the plain GEMM's passes, then its dequant prologue put back in (a pure function each).

A W4A16 program (`spatialc.weights`) is the GEMM of A by dequant(B). Its plan, placement and schedule are the
plain GEMM's — the one whose B ring the read fills directly with bf16 / fp16 tiles — so `build_w4` runs the
ordinary passes on that program (`plain_of`) and then `with_dequant` restores the W4A16 stages and tensors and
rewrites the schedule:

    reader : … Reserve Bq; ReadTiles B → Bq; Push Bq …                  (the packed weights' page of the K step)
    compute: … Wait Bq; Reserve B; Compute dequant Bq → B; Push B; Pop Bq; Wait B; … matmul … Pop B …

The dequant's page lies where the read's did: its tile rows are the K step's (rows), its tile columns the item's
(cols), `width` tiles a page row. The scales and zero points are padded, like B, to whole tiles of the plan's K
and N (their padding is zero: a padded weight dequantises to zero). verify then proves the result like any GEMM,
rule 8 following B's page back through the dequant to the read (verify/declared.py, verify/engine.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

from ..errors import ProgramError
from ..ir.ids import LV_ITEM_X, BufferId
from ..ir.nodes import Buffer, ComputeStage, DType, Fifo, Interm, PageLayout, ReadStage, SpatialProgram
from ..ir.ops import ChoreoOp, Compute, Dequant, Loop, MatmulTiles, Pop, Push, ReadTiles, Reserve, TileAddr, Wait
from ..target import SpatialTarget
from ..weights import dequant_stage

W4_FORMS = ("auto", "general")


def is_w4_program(p: SpatialProgram) -> bool:
    """Whether `p` dequantises 4-bit weights (a W4A16 GEMM)."""
    return dequant_stage(p) is not None


def plain_of(p: SpatialProgram) -> SpatialProgram:
    """The plain GEMM a W4A16 program plans as: B of the operand type read straight into the matmul's B ring, no
    dequant stage, no scale or zero tensors."""
    dq = dequant_stage(p)
    assert dq is not None and isinstance(dq.kind, ComputeStage) and isinstance(dq.kind.op, Dequant)
    op = dq.kind.op
    (bq,), (b_ring,) = dq.ins, dq.outs
    read = next(s for s in p.stages if isinstance(s.kind, ReadStage) and bq in s.outs)
    gone = {op.scale, op.zero}
    tensors = tuple(
        dataclasses.replace(t, dtype=DType(p.precision.value)) if t.id == read.kind.tensor else t  # type: ignore[union-attr]
        for t in p.tensors
        if t.id not in gone
    )
    buffers = tuple(
        dataclasses.replace(b, kind=Fifo(b.kind.depth_pages, b.kind.page_tiles)) if b.id == b_ring else b  # type: ignore[union-attr]
        for b in p.buffers
        if b.id != bq
    )
    stages = tuple(dataclasses.replace(s, outs=(b_ring,)) if s is read else s for s in p.stages if s is not dq)
    return p.evolve(tensors=tensors, buffers=buffers, stages=stages)


def build_w4(
    program: SpatialProgram,
    target: SpatialTarget,
    run: Callable[[SpatialProgram, str], SpatialProgram],
    form: str,
    split_k: int | None,
    multicast: tuple[int, int] | None,
) -> SpatialProgram:
    """The planned, scheduled W4A16 program (unverified): `run(plain, form)` plans and schedules the plain GEMM
    (pipeline's passes with everything else as asked), `with_dequant` puts the prologue back."""
    if form not in W4_FORMS:
        raise ProgramError(
            f"a W4A16 GEMM (4-bit weights) is printed by the general form only; form={form!r} cannot take it: use"
            " form='general' or 'auto' (--form general)"
        )
    if split_k not in (None, 1) or multicast not in (None, (1, 1)):
        raise ProgramError("a W4A16 GEMM is not split over K nor multicast (yet); leave split_k and multicast unset")
    return with_dequant(run(plain_of(program), "general"), program)


def with_dequant(planned: SpatialProgram, program: SpatialProgram) -> SpatialProgram:
    """`program`'s stages, B and scale tensors on `planned`'s plan, placement and schedule (see the module)."""
    dq = dequant_stage(program)
    assert dq is not None and planned.plan is not None and planned.schedule is not None
    op: Dequant = dq.kind.op  # type: ignore[union-attr, assignment]
    (bq,), (b_ring,) = dq.ins, dq.outs
    read = next(s for s in program.stages if isinstance(s.kind, ReadStage) and bq in s.outs)
    t_b = read.kind.tensor  # type: ignore[union-attr]
    plain_b = planned.tensor(t_b)
    k_rows = planned.plan.k_tiles * planned.tile.rows
    groups_t = math.ceil(math.ceil(k_rows / op.group) / planned.tile.rows)
    tensors = [
        dataclasses.replace(t, dtype=program.tensor(t_b).dtype, order=plain_b.order) if t.id == t_b else t
        for t in planned.tensors
    ]
    for tid in (op.scale, op.zero):
        if tid is not None:
            tensors.append(dataclasses.replace(program.tensor(tid), tiles=(groups_t, plain_b.tiles[1])))
    ring = planned.buffer(b_ring).kind
    assert isinstance(ring, Fifo)
    buffers = [
        dataclasses.replace(b, kind=Interm(ring.depth_pages, ring.page_tiles, ring.layout)) if b.id == b_ring else b
        for b in planned.buffers
    ]
    buffers.append(Buffer(bq, "Bq_ring", Fifo(ring.depth_pages, ring.page_tiles, PageLayout.ROW)))
    planned_mm = next(
        s for s in planned.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles)
    )
    stages = tuple(
        planned_mm if isinstance(s.kind, ComputeStage) and s.name == planned_mm.name else s for s in program.stages
    )
    first = next(o for prog in planned.schedule.programs for o in _walk(prog.ops) if _reads(o, t_b))
    assert isinstance(first, ReadTiles)
    placed = _placed(op, first.at, plain_b.tiles[1], first.block_w)
    programs = tuple(
        dataclasses.replace(
            prog, ops=_rewritten(prog.ops, bq, b_ring, placed, any(_reads(o, t_b) for o in _walk(prog.ops)))
        )
        for prog in planned.schedule.programs
    )
    schedule = dataclasses.replace(planned.schedule, programs=programs)
    out = planned.evolve(tensors=tuple(tensors), buffers=tuple(buffers), stages=stages, schedule=schedule)
    return out.evolve(name=program.name)


def _reads(o: ChoreoOp, t_b: object) -> bool:
    return isinstance(o, ReadTiles) and o.tensor == t_b


def _walk(ops: tuple[ChoreoOp, ...]) -> Iterator[ChoreoOp]:
    for o in ops:
        yield o
        if isinstance(o, Loop):
            yield from _walk(o.body)


def _rewritten(
    ops: tuple[ChoreoOp, ...], bq: BufferId, b_ring: BufferId, placed: Dequant, reader: bool
) -> tuple[ChoreoOp, ...]:
    """An engine's ops: the reader's B pages into `bq`; elsewhere, before each wait for a B page, that page
    dequantised from `bq`."""
    out: list[ChoreoOp] = []
    for o in ops:
        match o:
            case Loop():
                out.append(dataclasses.replace(o, body=_rewritten(o.body, bq, b_ring, placed, reader)))
            case ReadTiles() if reader and o.into == b_ring:
                out.append(dataclasses.replace(o, into=bq))
            case Reserve(buf) | Push(buf) if reader and buf == b_ring:
                out.append(dataclasses.replace(o, buf=bq))
            case Wait(buf) if not reader and buf == b_ring:
                out += [Wait(bq), Reserve(b_ring), Compute(placed, (bq,), (b_ring,)), Push(b_ring), Pop(bq), o]
            case _:
                out.append(o)
    return tuple(out)


def _placed(op: Dequant, at: TileAddr, b_cols: int, width: int) -> Dequant:
    """The dequant at the place of B's read at `at` (a flat tile index of B's grid, `b_cols` tiles wide): its tile
    rows from the K step's terms, its tile columns from the item's."""
    row_base, col_base = divmod(at.base, b_cols)
    rows, cols = [], []
    for var, stride in at.steps:
        if var == LV_ITEM_X:
            cols.append((var, stride))
        elif stride % b_cols:
            raise ProgramError(
                f"B's read steps {stride} tiles with a loop, not whole rows of its {b_cols} tile columns"
            )
        else:
            rows.append((var, stride // b_cols))
    return dataclasses.replace(
        op, rows=TileAddr(row_base, tuple(rows)), cols=TileAddr(col_base, tuple(cols)), width=width
    )

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
from ..ir.ids import LV_ITEM_X, BufferId, StageId, TensorId
from ..ir.nodes import Buffer, ComputeStage, DType, Fifo, Interm, PageLayout, ReadStage, SpatialProgram, Stage
from ..ir.ops import ChoreoOp, Compute, Dequant, Loop, Pop, Push, ReadTiles, Reserve, TileAddr, Wait
from ..target import SpatialTarget
from ..weights import dequant_stage
from .footprint import check_form
from .tile import DEQUANT_PROLOGUE

W4_FORMS = ("auto", "general", "persistent", "sm90a")  # auto prints the general form (bench/README.md)


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
    if form not in W4_FORMS:  # every form prints it: what is left is no form (check_form's one line)
        check_form(form)
    if multicast not in (None, (1, 1)):
        raise ProgramError(
            "a W4A16 GEMM is not multicast (yet): its packed pages would cross sites; leave multicast unset"
        )
    token = DEQUANT_PROLOGUE.set(True)  # the planner prices the prologue's dequant work (tile.dequant_cost)
    try:
        # The sm_90a form's plan lays A and B out in panels (the consumers dequantise into B's: sm90a/dequant.py).
        planned = run(plain_of(program), form if form in ("persistent", "sm90a") else "general")
    finally:
        DEQUANT_PROLOGUE.reset(token)
    return with_dequant(planned, program)


def with_dequant(planned: SpatialProgram, program: SpatialProgram) -> SpatialProgram:
    """`planned` (the plain GEMM's plan, placement and schedule — split-K's stages, rings and workspace among them)
    with `program`'s weights, scales and zero points and its dequant prologue put in (see the module). The ring of
    packed pages and the scale and zero tensors take ids after `planned`'s own."""
    dq = dequant_stage(program)
    assert dq is not None and planned.plan is not None and planned.schedule is not None
    declared: Dequant = dq.kind.op  # type: ignore[union-attr, assignment]
    (b_ring,) = dq.outs
    read = next(s for s in program.stages if isinstance(s.kind, ReadStage) and dq.ins[0] in s.outs)
    t_b = read.kind.tensor  # type: ignore[union-attr]
    plain_b = planned.tensor(t_b)
    k_rows = planned.plan.k_tiles * planned.tile.rows
    groups_t = math.ceil(math.ceil(k_rows / declared.group) / planned.tile.rows)
    tensors = [
        dataclasses.replace(t, dtype=program.tensor(t_b).dtype, order=plain_b.order) if t.id == t_b else t
        for t in planned.tensors
    ]
    renamed: dict[TensorId, TensorId] = {}
    for tid in (declared.scale, declared.zero):
        if tid is not None:
            renamed[tid] = TensorId(max(t.id for t in tensors) + 1)
            grid = (groups_t, plain_b.tiles[1])
            tensors.append(dataclasses.replace(program.tensor(tid), id=renamed[tid], tiles=grid))
    op = dataclasses.replace(
        declared, scale=renamed[declared.scale], zero=None if declared.zero is None else renamed[declared.zero]
    )
    ring = planned.buffer(b_ring).kind
    assert isinstance(ring, Fifo)
    bq = BufferId(max(b.id for b in planned.buffers) + 1)
    buffers = [
        dataclasses.replace(b, kind=Interm(ring.depth_pages, ring.page_tiles, ring.layout)) if b.id == b_ring else b
        for b in planned.buffers
    ]
    buffers.append(Buffer(bq, "Bq_ring", Fifo(ring.depth_pages, ring.page_tiles, PageLayout.ROW)))
    stages: list[Stage] = []
    for s in planned.stages:
        if isinstance(s.kind, ReadStage) and s.kind.tensor == t_b:
            stages.append(dataclasses.replace(s, outs=(bq,)))
            stages.append(dataclasses.replace(dq, kind=ComputeStage(op), ins=(bq,)))
        else:
            stages.append(s)
    stages = [dataclasses.replace(s, id=StageId(i)) for i, s in enumerate(stages)]
    placed = {  # each site's dequant at the place of its own reads of B (split-K's sites read other K steps)
        prog.site: _placed(op, o.at, plain_b.tiles[1], o.block_w)
        for prog in planned.schedule.programs
        for o in _walk(prog.ops)
        if isinstance(o, ReadTiles) and o.tensor == t_b
    }
    programs = tuple(
        dataclasses.replace(
            prog,
            ops=_rewritten(
                prog.ops, bq, b_ring, placed.get(prog.site, op), any(_reads(o, t_b) for o in _walk(prog.ops))
            ),
        )
        for prog in planned.schedule.programs
    )
    schedule = dataclasses.replace(planned.schedule, programs=programs)
    out = planned.evolve(tensors=tuple(tensors), buffers=tuple(buffers), stages=tuple(stages), schedule=schedule)
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

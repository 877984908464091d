"""Programs that reduce columns (`spatialc.col_reduce`: x.sum(0), dbias): their plan, placement and schedule.

An item is a band of bw tile columns, the whole height of x; it is walked down the rows in pages of bh × bw tiles
(the K loop over the band's row pages), each folded into a column accumulator of one value a column (bw tiles), then
packed at the band's end as a column vector — a page of one tile row, each column's value in every row — which a map
may take on (the mean: Σ / m) and the writer stores into the 1 × n output at the band's columns. The plan is a GEMM
plan read so: a block of the whole height by bw tile columns, reduced bh tile rows a step (`BlockShape(mi·bh, bw,
bh)`, K = the column's tiles), one item a band (`grid (1, nx)`). The padding rows (past m) are left out of each
reduction by the op itself (`ColReduce.rows`).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import PlanError, ProgramError
from ..ir.ids import LV_ITEM_X, LV_K, BufferId
from ..ir.nodes import (
    Accumulator,
    Buffer,
    ComputeStage,
    Fifo,
    Interm,
    Plan,
    ReadStage,
    SpatialProgram,
    Stage,
    TensorRole,
    WriteStage,
)
from ..ir.ops import (
    AcquireAcc,
    BlockShape,
    ChoreoOp,
    ColReduce,
    Compute,
    Const,
    Loop,
    Map,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    TileAddr,
    Wait,
    WriteTiles,
    arg_indices,
    cols,
    row_args,
)
from ..target import SpatialTarget
from .maps import ITEM_OVERHEAD, SITES_PER_UNIT, place_map, scheduled
from .rows import VALUE_BYTES, cheapest_block


def is_col_program(p: SpatialProgram) -> bool:
    """Whether `p` reduces columns: a program `spatialc.col_reduce` makes, planned here."""
    return any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, ColReduce) for s in p.stages)


@dataclasses.dataclass(frozen=True, slots=True)
class ColShape:
    """A column program's parts: the read of x into `ring`, the reduction folding it into `vector`, the maps of that
    vector alone after it (the mean), in order, and the write of the last vector."""

    read: Stage
    reduce: Stage
    maps: tuple[Stage, ...]
    write: Stage


def col_shape(p: SpatialProgram) -> ColShape:
    """The program's stages as a column program, or ProgramError saying what one is: one read, one column reduction
    of its ring, maps of the reduction's vector alone each of the one before (Arg 0, no row or column vectors), and
    one write of the last."""
    said = (
        "a column program is one read, one column reduction of it, maps of the reduced vector alone (x0, element by"
        " element), and one write of the last"
    )
    reads = [s for s in p.stages if isinstance(s.kind, ReadStage)]
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage)]
    computes = [s for s in p.stages if isinstance(s.kind, ComputeStage)]
    reduces = [s for s in computes if isinstance(s.kind.op, ColReduce)]  # type: ignore[union-attr]
    if len(reads) != 1 or len(writes) != 1 or len(reduces) != 1 or len(reads[0].outs) != 1:
        raise ProgramError(said)
    red = reduces[0]
    if red.ins != reads[0].outs or len(red.outs) != 1:
        raise ProgramError(said)
    maps: list[Stage] = []
    ring = red.outs[0]
    rest = [s for s in computes if s is not red]
    while rest:
        nxt = [s for s in rest if s.ins == (ring,)]
        if len(nxt) != 1 or not _vector_map(nxt[0]):
            raise ProgramError(said)
        maps.append(nxt[0])
        rest.remove(nxt[0])
        ring = nxt[0].outs[0]
    if writes[0].ins != (ring,):
        raise ProgramError(said)
    return ColShape(reads[0], red, tuple(maps), writes[0])


def _vector_map(s: Stage) -> bool:
    """A map of one page element by element, nothing else read (Σ / m)."""
    op = s.kind.op  # type: ignore[union-attr]
    if not isinstance(op, Map) or len(s.ins) != 1 or len(s.outs) != 1:
        return False
    return set(arg_indices(op.expr)) <= {0} and not row_args(op.expr) and not cols(op.expr)


def _cost(bh: int, bw: int, m_t: int, n_t: int, sites: int) -> float:
    """The busiest site's time in tiles streamed: its bands (whole waves), each band's pages."""
    bands = math.ceil(n_t / bw)
    pages = math.ceil(m_t / bh)
    return math.ceil(bands / sites) * (pages * (bh * bw + ITEM_OVERHEAD))


def ring_bytes(p: SpatialProgram, bh: int, bw: int, depth: int) -> int:
    """Shared memory of a site's rings: `depth` pages of bh × bw tiles for the read ring, one page of bw tiles for
    each column vector."""
    shape = col_shape(p)
    (x,) = shape.read.outs
    rings = [b for b in p.buffers if isinstance(b.kind, Fifo | Interm)]
    pages = sum(depth * bh * bw if b.id == x else bw for b in rings)
    return pages * p.tile.elems * VALUE_BYTES


def plan_cols(p: SpatialProgram, target: SpatialTarget, block: tuple[int, int] | None, depth: int | None) -> Plan:
    """Bands of bw tile columns walked down in pages bh tiles high: the cheapest by `_cost` whose rings fit a site's
    shared memory (or the block forced), two pages a ring unless forced."""
    shape = col_shape(p)
    m_t, n_t = p.tensor(shape.read.kind.tensor).tiles  # type: ignore[union-attr]
    d = 2 if depth is None else depth
    sites = target.units * SITES_PER_UNIT
    fh, fw = block if block is not None else (1, 1)
    if min(fh, fw, d) < 1:
        raise PlanError(f"a column program's block ({fh}x{fw} tiles) and depth ({d}) must be ≥ 1")
    bh, bw = cheapest_block(
        "a column program",
        target,
        block,
        d,
        lambda bh, bw: ring_bytes(p, bh, bw, d),
        lambda bh, bw: (_cost(bh, bw, m_t, n_t, sites), -bh, bw),
    )
    mi = math.ceil(m_t / bh)
    return Plan(BlockShape(mi * bh, bw, bh), (1, 1), (1, math.ceil(n_t / bw)), mi * bh, d)


def apply_col_plan(p: SpatialProgram, plan: Plan) -> SpatialProgram:
    """Rings sized by the plan (column vectors one page of bw tiles), one accumulator of bw tiles, x padded to whole
    pages and bands and the 1 × n output to whole bands of one tile row."""
    shape = col_shape(p)
    bh, bw = plan.block.ibw, plan.block.osw
    rows_t, cols_t = plan.k_tiles, plan.grid[1] * bw
    (x,) = shape.read.outs
    buffers = []
    for b in p.buffers:
        if isinstance(b.kind, Fifo | Interm):
            depth, tiles = (plan.depth, bh * bw) if b.id == x else (1, bw)
            b = dataclasses.replace(b, kind=dataclasses.replace(b.kind, depth_pages=depth, page_tiles=tiles))
        buffers.append(b)
    buffers.append(Buffer(BufferId(len(buffers)), f"{shape.reduce.name}_acc", Accumulator(bw)))
    tensors = []
    for t in p.tensors:
        if t.role == TensorRole.INPUT:
            t = dataclasses.replace(t, tiles=(rows_t, cols_t))
        elif t.role == TensorRole.OUTPUT:
            t = dataclasses.replace(t, tiles=(1, cols_t))
        tensors.append(t)
    return p.evolve(plans=(plan,), buffers=tuple(buffers), tensors=tuple(tensors))


def place_cols(
    p: SpatialProgram, target: SpatialTarget, sites: int | None = None, placement: str | None = None
) -> SpatialProgram:
    """Bands over sites as a map's items go (`maps.place_map`)."""
    return place_map(p, target, sites, placement)


def col_bodies(p: SpatialProgram) -> dict[str, tuple[ChoreoOp, ...]]:
    """Each engine's per-band body: the reader reads the band's pages down the rows, the compute engine folds each
    into the column accumulator, packs it, runs the maps of the vector; the writer stores the last vector at the
    band's columns of the output's one tile row."""
    plan = p.plan
    assert plan is not None
    shape = col_shape(p)
    bh, bw, mi = plan.block.ibw, plan.block.osw, plan.k_steps
    x = p.tensor(shape.read.kind.tensor)  # type: ignore[union-attr]
    (ring,) = shape.read.outs
    at = TileAddr(0, ((LV_K, bh * x.tiles[1]), (LV_ITEM_X, bw)))
    reader: tuple[ChoreoOp, ...] = (
        Loop(LV_K, Const(mi), (Reserve(ring), ReadTiles(x.id, at, bh, bw, x.tiles[1], 1, ring), Push(ring))),
    )
    acc = next(b.id for b in p.buffers if b.name == f"{shape.reduce.name}_acc")
    op = shape.reduce.kind.op  # type: ignore[union-attr]
    reduce = Compute(dataclasses.replace(op, at=TileAddr(0, ((LV_K, bh),)), width=bw), (ring,), acc=acc)
    (vector,) = shape.reduce.outs
    compute: list[ChoreoOp] = [
        AcquireAcc(acc),
        Loop(LV_K, Const(mi), (Wait(ring), reduce, Pop(ring))),
        *(Reserve(vector), PackAcc(acc, vector, bw), Push(vector), ReleaseAcc(acc)),
    ]
    for m in shape.maps:
        (src,), (out,) = m.ins, m.outs
        compute += [Wait(src), Reserve(out), Compute(m.kind.op, (src,), (out,)), Push(out), Pop(src)]  # type: ignore[union-attr]
    (last,) = shape.write.ins
    y = p.tensor(shape.write.kind.tensor)  # type: ignore[union-attr]
    store = WriteTiles(last, y.id, TileAddr(0, ((LV_ITEM_X, bw),)), 1, bw, y.tiles[1], 1)
    writer: tuple[ChoreoOp, ...] = (Wait(last), store, Pop(last))
    return {"reader": reader, "compute": tuple(compute), "writer": writer}


def schedule_cols(p: SpatialProgram) -> SpatialProgram:
    """Each site's engines run the per-band bodies over their bands."""
    return scheduled(p, col_bodies(p))


__all__ = ["apply_col_plan", "col_shape", "is_col_program", "place_cols", "plan_cols", "schedule_cols"]

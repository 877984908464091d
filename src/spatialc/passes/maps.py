"""Programs with no matmul: elementwise maps of tensors (issue 31). Their own tile, place and schedule.

A map program reads any number of input tensors of one shape, applies one `Map` to the same element of each, and
writes one output of that shape. An item is a block of bh × bw output tiles; the reader fills one page of each
input's ring per item, the compute engine maps the pages into a page of the output's ring, the writer stores it.
Memory-bound: the plan is chosen for pages large enough to stream and items enough to fill the machine.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import PlanError, ProgramError
from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y
from ..ir.nodes import (
    ComputeStage,
    EngineProgram,
    Fifo,
    Interm,
    Placement,
    Plan,
    ReadStage,
    Schedule,
    SpatialProgram,
    Stage,
    TensorRole,
    WriteStage,
)
from ..ir.ops import (
    Attention,
    BlockShape,
    ChoreoOp,
    Col,
    ColReduce,
    Compute,
    Const,
    Loop,
    Map,
    MatmulTiles,
    Pop,
    Push,
    ReadTiles,
    Reserve,
    RowReduce,
    TileAddr,
    VecAxis,
    Wait,
    WriteTiles,
    cols,
    with_cols,
)
from ..target import SpatialTarget
from .place import check_sites, split
from .verify.limits import MAX_ITEMS

SIDES = (1, 2, 4, 8)
DEPTHS = (2, 3)
ITEM_OVERHEAD = 2.0  # an item's fixed cost (waits, the loop, address arithmetic) in tiles of streaming
BAND_PLACEMENTS = ("contiguous", "round_robin")  # the placements `place_map` takes
SITES_PER_UNIT = 2  # blocks of a map kernel an SM runs at once: two hide each other's waits on global memory


def is_map_program(p: SpatialProgram) -> bool:
    """Whether `p` has no tile matmul and reduces no rows: an elementwise program, planned here (a row program is
    `passes/rows.py`'s). An attention declaration is two matmuls and a softmax before the planner expands it, so
    it is none."""
    return not any(
        isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles | RowReduce | ColReduce | Attention)
        for s in p.stages
    )


@dataclasses.dataclass(frozen=True, slots=True)
class MapShape:
    """What a map program is made of: its reads (stage, tensor), its one map stage, its write."""

    reads: tuple[Stage, ...]
    map: Stage
    write: Stage


def map_shape(p: SpatialProgram) -> MapShape:
    """The program's reads, map and write, or ProgramError saying what a map program is."""
    reads = tuple(s for s in p.stages if isinstance(s.kind, ReadStage))
    maps = [s for s in p.stages if isinstance(s.kind, ComputeStage)]
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage)]
    if len(maps) != 1 or not isinstance(maps[0].kind.op, Map) or len(writes) != 1:  # type: ignore[union-attr]
        raise ProgramError(
            "a program without a matmul is planned as one map: reads of tensors, one elementwise stage of them, one"
            f" write; this one has {len(maps)} compute stage(s) and {len(writes)} write(s)"
        )
    (m,), (w,) = maps, writes
    by_ring = {s.outs[0]: s for s in reads if len(s.outs) == 1}
    if tuple(by_ring.get(b) for b in m.ins) != tuple(reads) or len(w.ins) != 1 or w.ins[0] != m.outs[0]:
        raise ProgramError(
            f"map stage {m.name} must read each read stage's ring, in order, and its one ring be the one written"
        )
    return MapShape(reads, m, w)


def _cost(bh: int, bw: int, m_t: int, n_t: int, sites: int) -> float:
    """Time in tiles streamed by the busiest site: its items (whole waves over the sites), each its tiles and its
    fixed cost."""
    items = math.ceil(m_t / bh) * math.ceil(n_t / bw)
    return math.ceil(items / sites) * (bh * bw + ITEM_OVERHEAD)


def block_resources(
    p: SpatialProgram, target: SpatialTarget, inputs: int, bh: int, bw: int, depth: int
) -> tuple[int, int]:
    """(shared memory bytes, blocks resident per SM — 0 when one does not fit) of a map site of bh × bw-tile items
    and `depth`-page rings, as the general form, which prints it, lays the block out (`lower.cuda.general.kernel.
    map_resources`: each input's ring of its element type, the output's of the map's values, their barriers); 8-bit
    float inputs as int8's (`footprint.sized_as`), whose pages of results are int64 — more than float32 needs."""
    from ..lower.cuda.general import kernel as general
    from .footprint import sized_as

    one_item = Plan(BlockShape(bh, bw, 1), (1, 1), (1, 1), 1, depth)
    return general.map_resources(target, one_item, sized_as(p.precision), inputs)


def plan_map(
    p: SpatialProgram, target: SpatialTarget, block: tuple[int, int] | None = None, depth: int | None = None
) -> Plan:
    """The plan of a map program: blocks of bh × bw tiles (the cheapest by `_cost` whose block fits an SM, or the
    one forced), two pages a ring unless forced."""
    shape = map_shape(p)
    out = p.tensor(shape.write.kind.tensor)  # type: ignore[union-attr]
    m_t, n_t = out.tiles
    inputs = len(shape.reads)
    depths = (depth,) if depth is not None else DEPTHS[:1]
    sides = [(block[0], block[1])] if block is not None else [(h, w) for h in SIDES for w in SIDES]
    sites = target.units * SITES_PER_UNIT
    best: tuple[float, int, int, int] | None = None
    for bh, bw in sides:
        for d in depths:
            if min(bh, bw, d) < 1:
                raise PlanError(f"a map's block ({bh}x{bw} tiles) and depth ({d}) must be ≥ 1")
            if block_resources(p, target, inputs, bh, bw, d)[1] == 0:
                continue
            key = (_cost(bh, bw, m_t, n_t, sites), -bh * bw, bh, d)
            if best is None or key < best:
                best = key
    if best is None:
        bh, bw = min(sides, key=lambda s: s[0] * s[1])
        need = block_resources(p, target, inputs, bh, bw, min(depths))[0]
        raise PlanError(
            f"no map block fits {target.name}'s {target.smem_per_site_max} bytes of shared memory a site (the"
            f" smallest tried, {bh}x{bw} tiles {min(depths)} deep, needs {need}); force a smaller block or depth"
        )
    _, neg_area, bh, d = best
    bw = -neg_area // bh
    grid = (math.ceil(m_t / bh), math.ceil(n_t / bw))
    plan = Plan(BlockShape(bh, bw, 1), (1, 1), grid, 1, d)
    if plan.items > MAX_ITEMS:
        raise PlanError(f"a map of {plan.items} items is more than the {MAX_ITEMS} a program may hold")
    return plan


def apply_map_plan(p: SpatialProgram, plan: Plan) -> SpatialProgram:
    """Rings sized by `plan` (one page a block), the map's column vectors over whole blocks of columns and row
    vectors over whole blocks of rows, tensors padded to whole blocks."""
    bh, bw = plan.item_tiles
    rows_t, cols_t = plan.grid[0] * bh, plan.grid[1] * bw
    buffers = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, depth_pages=plan.depth, page_tiles=bh * bw))
        if isinstance(b.kind, Fifo | Interm)
        else b
        for b in p.buffers
    )
    shape = map_shape(p)
    data = {s.kind.tensor for s in (*shape.reads, shape.write)}  # type: ignore[union-attr]
    axes = {c.tensor: c.axis for c in cols(shape.map.kind.op.expr)}  # type: ignore[union-attr]
    tensors = []
    for t in p.tensors:
        if t.id in data:
            t = dataclasses.replace(t, tiles=(rows_t, cols_t))
        elif t.role == TensorRole.PARAMETER and t.id in axes:  # a row vector: one column of tiles; a column one row
            t = dataclasses.replace(t, tiles=(rows_t, 1) if axes[t.id] == VecAxis.ROW else (1, cols_t))
        tensors.append(t)
    return p.evolve(plans=(plan,), buffers=buffers, tensors=tuple(tensors))


def place_map(
    p: SpatialProgram, target: SpatialTarget, sites: int | None = None, placement: str | None = None
) -> SpatialProgram:
    """Items over sites: by default as many sites as the target keeps resident (SMs × SITES_PER_UNIT), at most one
    an item, items in contiguous runs (a map reads nothing twice: no band does better)."""
    plan = p.plan
    assert plan is not None
    if sites is None:
        sites = max(1, min(plan.items, target.units * SITES_PER_UNIT))
    check_sites(sites)
    kind = placement or "contiguous"
    if kind not in BAND_PLACEMENTS:  # grouped orders a GEMM's items for reuse of A and B strips: nothing to reuse
        raise ProgramError(f"a program with no matmul places its items contiguous or round_robin, not {kind!r}")
    return p.evolve(placement=Placement(split(plan.items, sites, kind, plan.placed, 0), (), kind, 0))


def map_bodies(p: SpatialProgram) -> dict[str, tuple[ChoreoOp, ...]]:
    """Each engine's per-item body: the reader fills one page of each input ring, the compute engine maps them into
    the output ring's page, the writer stores it."""
    plan = p.plan
    assert plan is not None
    shape = map_shape(p)
    bh, bw = plan.item_tiles
    reader: list[ChoreoOp] = []
    for s in shape.reads:
        t = p.tensor(s.kind.tensor)  # type: ignore[union-attr]
        at = TileAddr(0, ((LV_ITEM_Y, bh * t.tiles[1]), (LV_ITEM_X, bw)))
        (ring,) = s.outs
        reader += [Reserve(ring), ReadTiles(t.id, at, bh, bw, t.tiles[1], 1, ring), Push(ring)]
    ins, (out,) = shape.map.ins, shape.map.outs
    op = shape.map.kind.op  # type: ignore[union-attr]
    assert isinstance(op, Map)
    op = Map(with_cols(op.expr, lambda c: _at_item(c, bh, bw)))
    compute: tuple[ChoreoOp, ...] = (
        *(Wait(b) for b in ins),
        Reserve(out),
        Compute(op, ins, (out,)),
        Push(out),
        *(Pop(b) for b in ins),
    )
    t = p.tensor(shape.write.kind.tensor)  # type: ignore[union-attr]
    at_out = TileAddr(0, ((LV_ITEM_Y, bh * t.tiles[1]), (LV_ITEM_X, bw)))
    writer = (Wait(out), WriteTiles(out, t.id, at_out, bh, bw, t.tiles[1], 1), Pop(out))
    return {"reader": tuple(reader), "compute": compute, "writer": writer}


def _at_item(c: Col, bh: int, bw: int) -> Col:
    """Vector `c` addressed from the item's position, on pages of rows `bw` tiles wide: a column vector from the
    item's first output column (tile column item_x · bw), a row vector from its first output row (tile row
    item_y · bh)."""
    if c.axis == VecAxis.ROW:
        return Col(c.tensor, TileAddr(0, ((LV_ITEM_Y, bh),)), bw, VecAxis.ROW)
    return Col(c.tensor, TileAddr(0, ((LV_ITEM_X, bw),)), bw)


def schedule_map(p: SpatialProgram) -> SpatialProgram:
    """Each site's engines run the per-item bodies over their items."""
    return scheduled(p, map_bodies(p))


def scheduled(p: SpatialProgram, bodies: dict[str, tuple[ChoreoOp, ...]]) -> SpatialProgram:
    """`p` with each site's engines running `bodies` (each engine's per-item body, by engine name) over the site's
    items: a map's, and a row program's bands (`passes/rows.py`)."""
    from ..ir.nodes import Engine

    assert p.placement is not None
    item_loop = any(len(items) > 1 for _, items in p.placement.items_of_site)
    wrapped: dict[int, dict[str, tuple[ChoreoOp, ...]]] = {}  # one op list for every site of a count: shared
    programs = []
    for site, items in p.placement.items_of_site:
        n = len(items)
        if n not in wrapped:
            wrapped[n] = {e: _over_items(body, n, item_loop) for e, body in bodies.items()}
        for engine in (Engine.READER, Engine.COMPUTE, Engine.WRITER):
            programs.append(EngineProgram(site, engine, wrapped[n][engine.value]))
    return p.evolve(schedule=Schedule(tuple(programs)))


def _over_items(body: tuple[ChoreoOp, ...], n: int, item_loop: bool) -> tuple[ChoreoOp, ...]:
    """`body` once an item: in an ITEM loop of n where any site runs several, else once (or not, with none)."""
    if item_loop:
        return (Loop(LV_ITEM, Const(n), body),)
    return body if n else ()

"""Programs with no matmul: elementwise maps of tensors (issue 31). Their own tile, place and schedule.

A map program reads any number of input tensors of one shape, applies `Map`s to the same element of each — each map
of inputs' pages and other maps' — and writes any number of outputs of that shape, each one map's pages (RoPE's two
halves). An item is a block of bh × bw output tiles; the reader fills one page of each input's ring per item, the
compute engine runs the maps in order, each into a page of its ring, the writer stores each output's page.
Memory-bound: the plan is chosen for pages large enough to stream and items enough to fill the machine.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import PlanError, ProgramError
from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, StageId
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
    """What a map program is made of: its reads (stage, tensor), its maps — each after the maps whose rings it reads
    — and its writes, each of one map's pages."""

    reads: tuple[Stage, ...]
    maps: tuple[Stage, ...]
    writes: tuple[Stage, ...]

    @property
    def pages(self) -> tuple[Stage, ...]:
        """The stages of the item's pages of values: the reads, then the maps (each fills one ring)."""
        return (*self.reads, *self.maps)


def map_shape(p: SpatialProgram) -> MapShape:
    """The program's reads, maps and writes, or ProgramError saying what a map program is: each read fills one ring,
    each map one ring of its values from reads' and other maps' rings (a ring any number of maps read, shared within
    the item), each write stores one map's ring, which nothing else reads, and every map's ring is read."""
    reads = tuple(s for s in p.stages if isinstance(s.kind, ReadStage))
    computes = tuple(s for s in p.stages if isinstance(s.kind, ComputeStage))
    writes = tuple(s for s in p.stages if isinstance(s.kind, WriteStage))
    if not reads or not writes or any(not isinstance(s.kind.op, Map) or len(s.outs) != 1 for s in computes):  # type: ignore[union-attr]
        raise ProgramError(
            "a program without a matmul is planned as maps: reads of tensors, elementwise stages of them (each"
            f" filling one ring), writes of their rings; this one has {len(reads)} read(s), {len(computes)} compute"
            f" stage(s) and {len(writes)} write(s)"
        )
    names = {b.id: b.name for b in p.buffers}
    producer = {b: s for s in p.stages for b in s.outs}
    readers: dict[BufferId, list[Stage]] = {}
    for s in p.stages:
        for b in s.ins:
            if b not in producer:
                raise ProgramError(f"stage {s.name} reads {names.get(b, f'ring {int(b)}')}, which no stage fills")
            readers.setdefault(b, []).append(s)
    for s in (*reads, *computes):
        if len(s.outs) != 1:
            raise ProgramError(f"stage {s.name} fills {len(s.outs)} rings; a read or a map of a map program fills one")
        if not readers.get(s.outs[0]):  # (its pages would never be popped: the engines would wait forever)
            raise ProgramError(f"stage {s.name} fills {names[s.outs[0]]}, which no stage reads")
    for w in writes:
        f = producer[w.ins[0]] if len(w.ins) == 1 else None
        if f is None or not isinstance(f.kind, ComputeStage):
            raise ProgramError(
                f"write stage {w.name} stores no map's ring; a map program's output is a map's pages (a copy of a"
                " tensor is the map x of its own)"
            )
        if len(readers[w.ins[0]]) > 1:
            other = next(s for s in readers[w.ins[0]] if s is not w)
            raise ProgramError(
                f"{names[w.ins[0]]} feeds write stage {w.name} and stage {other.name}; the writer pops the ring it"
                " stores, so another stage reads a copy (a map x of its own)"
            )
    return MapShape(reads, in_order(computes, producer), writes)


def in_order(computes: tuple[Stage, ...], producer: dict[BufferId, Stage]) -> tuple[Stage, ...]:
    """`computes`, each after the compute stages whose rings it reads (ProgramError where they form a cycle)."""
    ordered: dict[StageId, Stage] = {}

    def visit(s: Stage, path: frozenset[StageId]) -> None:
        if s.id in path:
            raise ProgramError(f"stage {s.name} reads what it computes: the stages form a cycle")
        if s.id in ordered:
            return
        for b in s.ins:
            if isinstance(producer[b].kind, ComputeStage):
                visit(producer[b], path | {s.id})
        ordered[s.id] = s

    for s in computes:
        visit(s, frozenset())
    return tuple(ordered.values())


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
    map_resources`: each of the `inputs` rings of its element type, each map's ring — an output's or one another map
    reads — of the map's values, their barriers); 8-bit float inputs as int8's (`footprint.sized_as`), whose pages
    of results are int64 — more than float32 needs."""
    from ..lower.cuda.general import kernel as general
    from .footprint import sized_as

    one_item = Plan(BlockShape(bh, bw, 1), (1, 1), (1, 1), 1, depth)
    values = sum(isinstance(s.kind, ComputeStage) for s in p.stages)
    return general.map_resources(target, one_item, sized_as(p.precision), inputs, values)


def plan_map(
    p: SpatialProgram, target: SpatialTarget, block: tuple[int, int] | None = None, depth: int | None = None
) -> Plan:
    """The plan of a map program: blocks of bh × bw tiles (the cheapest by `_cost` whose block fits an SM, or the
    one forced), two pages a ring unless forced."""
    shape = map_shape(p)
    out = p.tensor(shape.writes[0].kind.tensor)  # type: ignore[union-attr]  # (every output has the inputs' shape)
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
        if block_resources(p, target, inputs, 1, 1, 1)[1] == 0:  # (no block or depth forced would fit)
            fix = (
                f"even 1x1 tiles 1 deep does not fit its {len(shape.pages)} rings: map fewer inputs into fewer outputs"
            )
        else:
            fix = "force a smaller block or depth"
        raise PlanError(
            f"no map block fits {target.name}'s {target.smem_per_site_max} bytes of shared memory a site (the"
            f" smallest tried, {bh}x{bw} tiles {min(depths)} deep, needs {need}); {fix}"
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
    data = {s.kind.tensor for s in (*shape.reads, *shape.writes)}  # type: ignore[union-attr]
    axes = {c.tensor: c.axis for s in shape.maps for c in cols(s.kind.op.expr)}  # type: ignore[union-attr]
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
    """Each engine's per-item body: the reader fills one page of each input ring; the compute engine runs the maps in
    order, each into its ring's page — a ring waited for before the first map that reads it and popped after the
    last; the writer stores each output's page."""
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
    last = {b: s.id for s in shape.maps for b in s.ins}  # the last map that reads each ring
    compute: list[ChoreoOp] = []
    waited: set[BufferId] = set()
    for s in shape.maps:
        op = s.kind.op  # type: ignore[union-attr]
        assert isinstance(op, Map)
        (out,) = s.outs
        compute += [Wait(b) for b in dict.fromkeys(s.ins) if b not in waited]
        waited.update(s.ins)
        compute += [Reserve(out), Compute(Map(with_cols(op.expr, lambda c: _at_item(c, bh, bw))), s.ins, (out,))]
        compute += [Push(out), *(Pop(b) for b in dict.fromkeys(s.ins) if last[b] == s.id)]
    writer: list[ChoreoOp] = []
    for w in shape.writes:
        t = p.tensor(w.kind.tensor)  # type: ignore[union-attr]
        at_out = TileAddr(0, ((LV_ITEM_Y, bh * t.tiles[1]), (LV_ITEM_X, bw)))
        (ring,) = w.ins
        writer += [Wait(ring), WriteTiles(ring, t.id, at_out, bh, bw, t.tiles[1], 1), Pop(ring)]
    return {"reader": tuple(reader), "compute": tuple(compute), "writer": tuple(writer)}


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

"""schedule: the standard GEMM choreography (DESIGN §2), one program per engine per site.

    reader : Loop ITEM { Loop K { Reserve A; ReadTiles A; Push A; Reserve B; ReadTiles B; Push B } }
    compute: Loop ITEM { AcquireAcc; Loop K { Wait A; Wait B; Compute Matmul; Pop A; Pop B }
                         Reserve C; PackAcc C; Push C; ReleaseAcc
                         [for each epilogue stage E_i: Wait E_i-1; Reserve E_i; Compute op; Push E_i; Pop E_i-1]
                         [Pop R for each page R a stage read beside the chain's] }
    writer : Loop ITEM { Wait last; WriteTiles last; Pop last }

An epilogue stage that reads a second tensor of C's shape (a residual, a gate) reads it from a ring of its own: the
reader fills one page of it an item, the item's block of that tensor at C's own address, after the item's K loop;
the stage waits for that page beside the chain's, and the page is popped once the chain's last page is pushed.

The epilogue stages run on the compute engine, after the accumulator is packed, one Interm ring each (DESIGN §2).

Every site gets the same op bodies; only the ITEM loop's count (the site's number of items) differs. When no site
holds more than one item the ITEM loop is left out: a site's only item is then implicit, and a site with no item
gets empty programs.
"""

from __future__ import annotations

import dataclasses
from functools import partial

from ..errors import PlanError
from ..frontend import SIZES
from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LV_K, LV_ROW, BufferId, ItemId, Site, TensorId
from ..ir.nodes import (
    Accumulator,
    ComputeStage,
    Engine,
    EngineProgram,
    ReadStage,
    Schedule,
    SpatialProgram,
    TensorRole,
    WriteStage,
)
from ..ir.ops import (
    AcquireAcc,
    AddPartial,
    ChoreoOp,
    Col,
    Compute,
    Const,
    Loop,
    Map,
    MatmulTiles,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    SemInc,
    SemWait,
    TileAddr,
    Trip,
    VecAxis,
    Wait,
    WriteBarrier,
    WriteTiles,
    cols,
    rewrite,
    ring_of,
    walk,
    with_cols,
)
from .footprint import epilogue_reads, matmul_stage
from .multicast import SEM_A_READY, SEM_A_VALID, SEM_B_READY, SEM_B_VALID, roles, share
from .split import SEM_PARTIALS, SPLIT_TAIL, owner_of, partial_rings, split_of, split_ranges, tail_slot


def engine_bodies(p: SpatialProgram, k_first: int = 0, k_steps: int | None = None) -> dict[str, tuple[ChoreoOp, ...]]:
    """The per-item body of each engine's program, reducing K steps k_first … k_first + k_steps − 1 (all of K by
    default; split-K gives each site of an item its own run of them)."""
    plan = p.plan
    if plan is None or p.placement is None:
        raise PlanError("schedule needs a tiled, placed program")
    mm = matmul_stage(p)
    a_buf, b_buf = mm.ins
    c_buf = mm.outs[0]  # (a split program's matmul also fills partial_out)
    acc = next(b.id for b in p.buffers if isinstance(b.kind, Accumulator))
    reads = {s.outs[0]: s.kind.tensor for s in p.stages if isinstance(s.kind, ReadStage)}
    out_id = p.output_tensor().id  # type: ignore[union-attr]
    write = next(s for s in p.stages if isinstance(s.kind, WriteStage) and s.kind.tensor == out_id)
    ta, tb, tc = p.tensor(reads[a_buf]), p.tensor(reads[b_buf]), p.tensor(write.kind.tensor)  # type: ignore[union-attr]
    h, w = plan.item_tiles
    ibw = plan.block.ibw
    a_cols, b_cols, c_cols = ta.tiles[1], tb.tiles[1], tc.tiles[1]
    k0 = k_first * ibw  # the first k-tile
    read_a = ReadTiles(ta.id, TileAddr(k0, ((LV_ITEM_Y, h * a_cols), (LV_K, ibw))), h, ibw, a_cols, 1, a_buf)
    read_b = ReadTiles(tb.id, TileAddr(k0 * b_cols, ((LV_K, ibw * b_cols), (LV_ITEM_X, w))), ibw, w, b_cols, 1, b_buf)
    k_loop = Const(plan.k_steps if k_steps is None else k_steps)
    reader: tuple[ChoreoOp, ...] = (
        Loop(LV_K, k_loop, (Reserve(a_buf), read_a, Push(a_buf), Reserve(b_buf), read_b, Push(b_buf))),
    )
    compute = (
        AcquireAcc(acc),
        Loop(
            LV_K,
            k_loop,
            (
                Wait(a_buf),
                Wait(b_buf),
                Compute(placed_scales(mm.kind.op, h, w, k0, ibw), (a_buf, b_buf), acc=acc),  # type: ignore[arg-type]
                Pop(a_buf),
                Pop(b_buf),
            ),
        ),
        Reserve(c_buf),
        PackAcc(acc, c_buf, h * w),
        Push(c_buf),
        ReleaseAcc(acc),
    )
    epilogue, last = _epilogue_ops(p, c_buf, h, w)
    out_at = TileAddr(0, ((LV_ITEM_Y, h * c_cols), (LV_ITEM_X, w)))  # the item's block of C
    for ring, tensor in _epilogue_read_rings(p):  # a residual: its block at C's, once the item's K loop is read
        t = p.tensor(tensor)
        at = TileAddr(0, ((LV_ITEM_Y, h * t.tiles[1]), (LV_ITEM_X, w)))
        reader += (Reserve(ring), ReadTiles(t.id, at, h, w, t.tiles[1], 1, ring), Push(ring))
    write_c = WriteTiles(last, tc.id, out_at, h, w, c_cols, 1)
    writer = (Wait(last), write_c, Pop(last))
    if plan.groups > 1:
        return _grouped(p, read_a, read_b, write_c, reader, compute + epilogue, writer)
    return {"reader": reader, "compute": compute + epilogue, "writer": writer}


def placed_scales(op: MatmulTiles, h: int, w: int, k0: int, ibw: int) -> MatmulTiles:
    """A block-scaled matmul with where its step is: the item's first tile row and column, the step's first K tile."""
    if op.scales is None:
        return op
    rows, cols = TileAddr(0, ((LV_ITEM_Y, h),)), TileAddr(0, ((LV_ITEM_X, w),))
    k = TileAddr(k0, ((LV_K, ibw),))
    return dataclasses.replace(op, scales=dataclasses.replace(op.scales, rows=rows, cols=cols, k=k))


def _grouped(p: SpatialProgram, read_a, read_b, write_c, reader, compute, writer) -> dict[str, tuple[ChoreoOp, ...]]:
    """A grouped GEMM's bodies: an item is a strip of one group (item_y) and one column of blocks (item_x); each
    engine loops over the group's row blocks, as many as its row count fills — ceil(sizes[item_y] / rows a block),
    read at run time — and A's and C's rows past the count are neither read nor written."""
    plan = p.plan
    assert plan is not None
    h, _ = plan.item_tiles
    ny = plan.grid[0]
    sizes = p.tensor_named(SIZES)
    rows = Trip(sizes.id, 0, ny, h * p.tile.rows, ((LV_ITEM_Y, 1),))

    def strip(op: ReadTiles | WriteTiles, cols: int) -> ReadTiles | WriteTiles:  # group item_y, row block `row`
        steps = tuple((v, s * ny if v == LV_ITEM_Y else s) for v, s in op.at.steps) + ((LV_ROW, h * cols),)
        return dataclasses.replace(op, at=TileAddr(op.at.base, steps), rows_from=sizes.id)

    b_rows = read_b.at  # B: group item_y's K tiles
    read_b = dataclasses.replace(
        read_b, at=TileAddr(b_rows.base, (*b_rows.steps, (LV_ITEM_Y, plan.k_tiles * read_b.stride_h)))
    )
    a_cols = read_a.stride_h
    reader = _swap(
        reader,
        {
            id(x): y
            for x, y in ((_find(reader, ReadTiles, 0), strip(read_a, a_cols)), (_find(reader, ReadTiles, 1), read_b))
        },
    )
    writer = _swap(writer, {id(_find(writer, WriteTiles, 0)): strip(write_c, write_c.stride_h)})
    compute = rewrite(compute, partial(_group_scales, h=h))
    return {
        e: (Loop(LV_ROW, rows, body),) for e, body in (("reader", reader), ("compute", compute), ("writer", writer))
    }


def _group_scales(op: ChoreoOp, h: int) -> ChoreoOp:
    """A grouped block-scaled step's scales: group item_y's (its scale tensors' own matrix), at row block `row`."""
    if not isinstance(op, Compute) or not isinstance(op.op, MatmulTiles) or op.op.scales is None:
        return op
    rows, group = TileAddr(0, ((LV_ROW, h),)), TileAddr(0, ((LV_ITEM_Y, 1),))
    scales = dataclasses.replace(op.op.scales, rows=rows, group=group)
    return dataclasses.replace(op, op=dataclasses.replace(op.op, scales=scales))


def _find(ops, kind, n: int):
    """The n-th op of `kind` in `ops` (loops included)."""
    return [op for op in walk(ops) if isinstance(op, kind)][n]


def _swap(ops: tuple[ChoreoOp, ...], new: dict[int, ChoreoOp]) -> tuple[ChoreoOp, ...]:
    """`ops` with each op whose id is in `new` replaced."""
    return rewrite(ops, lambda op: new.get(id(op), op))


def _epilogue_ops(p: SpatialProgram, first: BufferId, h: int, w: int) -> tuple[tuple[ChoreoOp, ...], BufferId]:
    """The compute engine's ops for the chain of epilogue stages that starts at ring `first`, and its last ring. A
    stage that reads more rings (a residual's) waits for their pages with the chain's; they are popped after the
    chain's last page is pushed, so that a kernel applying the whole chain at once where that page would be stored
    (the sm_90a form's fused store) reads them while they are still its own."""
    reads = {s.outs[0] for s in p.stages if isinstance(s.kind, ReadStage) and len(s.outs) == 1}
    by_input = {
        s.ins[0]: s
        for s in p.stages
        if isinstance(s.kind, ComputeStage)
        and s.ins
        and all(b in reads for b in s.ins[1:])
        and len(s.outs) == 1
        and not isinstance(s.kind.op, MatmulTiles)
    }
    ops: list[ChoreoOp] = []
    beside: list[ChoreoOp] = []  # the Pops of the pages read beside the chain's, after its last Push
    cur = first
    while cur in by_input:
        stage = by_input[cur]
        op = stage.kind.op  # type: ignore[union-attr]
        if isinstance(op, Map) and cols(op.expr):
            # The page's first column is the item's first output column: tile column item_x · w of each column
            # vector (a bias row); its first row the item's first output row: tile row item_y · h of a row vector.
            op = Map(with_cols(op.expr, partial(_at_item, h=h, w=w)))
        (out,) = stage.outs
        ins = stage.ins
        ops += [*(Wait(b) for b in ins), Reserve(out), Compute(op, ins, (out,)), Push(out), Pop(ins[0])]
        beside += [Pop(b) for b in ins[1:]]
        cur = out
    return (*ops, *beside), cur


def _epilogue_read_rings(p: SpatialProgram) -> list[tuple[BufferId, TensorId]]:
    """(ring, tensor) of each tensor an epilogue stage reads beside the chain's value (a residual, a gate)."""
    wanted = set(epilogue_reads(p))
    return [
        (s.outs[0], s.kind.tensor)
        for s in p.stages
        if isinstance(s.kind, ReadStage) and s.kind.tensor in wanted and len(s.outs) == 1
    ]


def _at_item(c: Col, h: int, w: int) -> Col:
    if c.axis == VecAxis.ROW:
        return dataclasses.replace(c, at=TileAddr(0, ((LV_ITEM_Y, h),)), width=w)
    return dataclasses.replace(c, at=TileAddr(0, ((LV_ITEM_X, w),)), width=w)


def split_bodies(p: SpatialProgram, site: Site) -> dict[str, tuple[ChoreoOp, ...]]:
    """Split-K (`passes/split.py`): the programs of the site that reduces split s of its item. The owner (s = 0)
    waits for the others' partials, adds them in split order and runs the epilogue; any other site leaves its
    partial sum in the workspace and raises the owner's semaphore once the write is visible."""
    placement, out = p.placement, p.output_tensor()
    assert placement is not None and out is not None and p.plan is not None
    h, w = p.plan.item_tiles
    rows, cols = out.tiles

    def slot(j: int) -> TileAddr:  # contributor j's block of the item in the workspace
        return TileAddr((j - 1) * rows * cols, ((LV_ITEM_Y, h * cols), (LV_ITEM_X, w)))

    return _split_item(p, split_of(placement, site), placement.splits, owner_of(placement, site), slot, cols)


def _split_item(
    p: SpatialProgram, s: int, splits: int, owner: Site, slot, stride: int
) -> dict[str, tuple[ChoreoOp, ...]]:
    """The programs of split `s` of `splits` of an item (the site's only one, or the one its ITEM loop is on):
    `slot(j)` is where contributor j's partial sum lies in the workspace, `stride` its tiles a block row, `owner`
    the site that adds them up."""
    plan = p.plan
    assert plan is not None
    first, steps = split_ranges(plan.k_steps, splits)[s]
    bodies = dict(engine_bodies(p, first, steps))
    rings = partial_rings(p)
    assert rings is not None
    p_out, p_in = rings
    work = next(t for t in p.tensors if t.role == TensorRole.WORKSPACE)
    h, w = plan.item_tiles
    compute = bodies["compute"]
    k_at = next(i for i, op in enumerate(compute) if isinstance(op, Loop) and op.var == LV_K)  # the K loop
    acc = next(b.id for b in p.buffers if isinstance(b.kind, Accumulator))
    if s == 0:
        reads: list[ChoreoOp] = [SemWait(SEM_PARTIALS, splits - 1)] if splits > 1 else []
        adds: list[ChoreoOp] = []
        for j in range(1, splits):
            reads += [Reserve(p_in), ReadTiles(work.id, slot(j), h, w, stride, 1, p_in), Push(p_in)]
            adds += [Wait(p_in), Compute(AddPartial(), (p_in,), acc=acc), Pop(p_in)]
        bodies["reader"] = bodies["reader"] + tuple(reads)
        bodies["compute"] = compute[: k_at + 1] + tuple(adds) + compute[k_at + 1 :]
        return bodies
    # A contributor runs no epilogue: its reader fills no ring of a tensor the epilogue reads (a residual's).
    epilogue_rings = {ring for ring, _ in _epilogue_read_rings(p)}
    bodies["reader"] = tuple(op for op in bodies["reader"] if ring_of(op) not in epilogue_rings)
    bodies["compute"] = (
        *compute[: k_at + 1],
        Reserve(p_out),
        PackAcc(acc, p_out, h * w),
        Push(p_out),
        ReleaseAcc(acc),
    )
    bodies["writer"] = (
        Wait(p_out),
        WriteTiles(p_out, work.id, slot(s), h, w, stride, 1),
        Pop(p_out),
        WriteBarrier(),
        SemInc(SEM_PARTIALS, owner, 1),
    )
    return bodies


def split_tail_programs(p: SpatialProgram) -> tuple[EngineProgram, ...]:
    """A split tail (`passes/split.split_tail_placement`): each site's ITEM loop over its whole items, then — on a
    site that holds a split of a tail item, its last — an ITEM loop over that one item (`first`: its place in the
    site's list) running the split's programs, whose partial sums meet in the tail's slots (`split.tail_slot`)."""
    placement, plan = p.placement, p.plan
    assert placement is not None and plan is not None
    splits, tail = placement.splits, placement.tail
    whole = plan.items - tail
    slot = partial(tail_slot, plan, splits, tail)
    stride = plan.item_tiles[1]
    bodies = engine_bodies(p)
    holders: dict[ItemId, list[Site]] = {}
    for site, items in placement.items_of_site:
        if items and int(items[-1]) >= whole:
            holders.setdefault(items[-1], []).append(site)
    owned = _split_item(p, 0, splits, Site(0), slot, stride)  # the same for every owner: it names no site
    programs = []
    for site, items in placement.items_of_site:
        split = bool(items) and int(items[-1]) >= whole
        n = len(items) - split
        mine = {e: (Loop(LV_ITEM, Const(n), body),) if n else () for e, body in bodies.items()}
        if split:
            sites = holders[items[-1]]
            s = sites.index(site)
            ops = _split_item(p, s, splits, sites[0], slot, stride) if s else owned
            mine = {e: (*mine[e], Loop(LV_ITEM, Const(1), ops[e], first=n)) for e in mine}
        for engine in (Engine.READER, Engine.COMPUTE, Engine.WRITER):
            programs.append(EngineProgram(site, engine, mine[engine.value]))
    return tuple(programs)


def multicast_reader(p: SpatialProgram, site: Site, reader: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    """The reader of a site of a multicast group (`passes/multicast.py`): its A page shared over its group row,
    its B page over its group column."""
    assert p.placement is not None
    row, col = roles(p.placement, site)
    read_a, read_b = [op for op in walk(reader) if isinstance(op, ReadTiles)][:2]  # (then a residual's, unshared)

    def step(op: ChoreoOp) -> ChoreoOp:
        if not (isinstance(op, Loop) and op.var == LV_K):
            return op
        body = share(op.body, read_a, row, site, SEM_A_READY, SEM_A_VALID)
        return dataclasses.replace(op, body=share(body, read_b, col, site, SEM_B_READY, SEM_B_VALID))

    return tuple(step(op) for op in reader)


def schedule(p: SpatialProgram) -> SpatialProgram:
    """The program with the standard GEMM schedule (split-K's where the placement splits items, the multicast
    handshake where it groups sites)."""
    assert p.placement is not None
    if p.placement.kind == SPLIT_TAIL:
        return p.evolve(schedule=Schedule(split_tail_programs(p)))
    if p.placement.splits > 1:
        programs = []
        for site, items in p.placement.items_of_site:
            bodies = split_bodies(p, site) if items else {e.value: () for e in Engine}
            for engine in (Engine.READER, Engine.COMPUTE, Engine.WRITER):
                programs.append(EngineProgram(site, engine, bodies[engine.value]))
        return p.evolve(schedule=Schedule(tuple(programs)))
    bodies = engine_bodies(p)
    item_loop = any(len(items) > 1 for _, items in p.placement.items_of_site)
    wrapped: dict[int, dict[str, tuple[ChoreoOp, ...]]] = {}
    programs = []
    for site, items in p.placement.items_of_site:
        n = len(items)
        if n not in wrapped:
            if item_loop:
                wrapped[n] = {e: (Loop(LV_ITEM, Const(n), body),) for e, body in bodies.items()}
            else:
                wrapped[n] = {e: (body if n else ()) for e, body in bodies.items()}
        mine = dict(wrapped[n])
        if p.placement.multicast != (1, 1) and n:
            reader = multicast_reader(p, site, bodies["reader"])
            mine["reader"] = (Loop(LV_ITEM, Const(n), reader),) if item_loop else reader
        for engine in (Engine.READER, Engine.COMPUTE, Engine.WRITER):
            programs.append(EngineProgram(site, engine, mine[engine.value]))
    return p.evolve(schedule=Schedule(tuple(programs)))

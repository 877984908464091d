"""Programs that reduce rows (`spatialc.rows`: softmax, RMSNorm): their plan, placement and schedule.

An item is a band of bh tile rows, the whole width of the rows; it is walked in pages of bh × bw tiles, one pass
over its pages for each row reduction and one for the outputs of pages, if any (fused add + RMSNorm writes two, a
row sum none — its output a row vector): a pass reads the rows' pages again (each read stage is
one pass's), maps them where a map stands before the reduction, and folds them into a row accumulator, packed at the
pass's end as a row vector that later passes read whole (`RowArg`). The plan is a GEMM plan read so: a block of bh
rows by the row's width, reduced bw tile columns a step (`BlockShape(bh, nj·bw, bw)`, K = the row's tiles), one item
a band (`grid (ny, 1)`).

An online softmax (`spatialc.softmax(…, online=True)`: one read feeding both a row max and the exp map beside it,
`online_pair`) runs its max and its sum of exp in one pass, page by page from m = −∞, l = 0: m_old = m; m ⊕= rowmax(x);
α = exp(m_old − m_new); P = exp(x − m_new); l ·= α (`ScaleAcc`); l ⊕= rowsum(P) — three row-vector rings of its own
(`ONLINE_RINGS`) — and rule 8 holds that pass to `verify/recurrence.running` (`verify/online.py`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from ..errors import PlanError, ProgramError
from ..ir.ids import LV_ITEM_Y, LV_K, BufferId, StageId
from ..ir.nodes import (
    Accumulator,
    Buffer,
    ComputeStage,
    Engine,
    Fifo,
    Interm,
    Plan,
    ReadStage,
    SpatialProgram,
    Stage,
    Tensor,
    TensorRole,
    WriteStage,
)
from ..ir.ops import (
    AcquireAcc,
    Apply,
    Arg,
    BlockShape,
    ChoreoOp,
    Col,
    Compute,
    Const,
    Expr,
    Lit,
    Loop,
    Map,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    RowArg,
    RowReduce,
    ScaleAcc,
    TileAddr,
    VecAxis,
    Wait,
    WriteTiles,
    cols,
    with_cols,
    with_row_args,
)
from ..numerics.narrow import FLOAT32_MAX
from ..target import SpatialTarget
from .maps import ITEM_OVERHEAD, SIDES, SITES_PER_UNIT, in_order, place_map, scheduled

VALUE_BYTES = 4  # a page element as the general form's rings hold it at most (a float32 value)


def is_row_program(p: SpatialProgram) -> bool:
    """Whether `p` reduces rows: a program `spatialc.rows` makes, planned here."""
    return any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce) for s in p.stages)


@dataclasses.dataclass(frozen=True, slots=True)
class RowShape:
    """A row program's parts: its compute stages (reductions and maps), each after the stages whose rings it reads;
    its writes — `pages` those of pages of values (the rows' own shape: fused add + RMSNorm's out and the sum it
    normalised; none in a program of row vectors alone), the others of row vectors (one value a row); which stage
    fills each ring; and the row vectors: the rings the reductions fill, and those of the maps of row vectors alone
    (`vector_maps`: rstd = rsqrt(Σ/n + eps), run once a band)."""

    computes: tuple[Stage, ...]
    pages: tuple[Stage, ...]  # the writes of pages of values, each of the rows' shape (none: row vectors alone)
    producer: dict[BufferId, Stage]
    vectors: frozenset[BufferId]
    writes: tuple[Stage, ...] = ()
    vector_maps: frozenset[StageId] = frozenset()
    online: tuple[Stage, Stage, Stage] | None = None  # an online softmax's max, exp map and sum (`online_pair`)
    last: frozenset[StageId] = frozenset()  # the maps of the last pass (`_last_pass_maps`), which may share rings

    @property
    def written_vectors(self) -> frozenset[BufferId]:
        """The row vectors a write stage empties (the writer's to pop, not the compute engine's)."""
        return frozenset(w.ins[0] for w in self.writes if w not in self.pages)

    @property
    def finals(self) -> frozenset[StageId]:
        """The maps whose pages a write stores: they run together in the band's last pass."""
        return frozenset(self.producer[w.ins[0]].id for w in self.pages)


def row_shape(p: SpatialProgram) -> RowShape:
    """The program's stages as a row program, or ProgramError saying what one is: reads, row reductions and maps,
    and writes — of maps' pages (any number, all in the band's last pass) and of row vectors (any number, each as it
    is packed); each ring of values feeding one stage (a pass reads its tensor again), a row vector any number — but
    one a write empties, that write alone."""
    writes = tuple(s for s in p.stages if isinstance(s.kind, WriteStage))
    computes = tuple(s for s in p.stages if isinstance(s.kind, ComputeStage))
    if not writes or any(not isinstance(s.kind.op, RowReduce | Map) for s in computes):  # type: ignore[union-attr]
        raise ProgramError("a row program holds reads, row reductions and maps, and its writes")
    if not any(isinstance(s.kind, ReadStage) for s in p.stages):
        raise ProgramError("a row program reads the rows it reduces: no stage here reads a tensor")
    for s in p.stages:
        _check_stage(s)
    producer = {b: s for s in p.stages for b in s.outs}
    names = {b.id: b.name for b in p.buffers}
    readers: dict[BufferId, list[Stage]] = {}
    for s in p.stages:
        for b in s.ins:
            if b not in producer:
                raise ProgramError(f"stage {s.name} reads {names.get(b, f'ring {int(b)}')}, which no stage fills")
            readers.setdefault(b, []).append(s)
    ordered = in_order(computes, producer)
    vectors = set(b for s in computes if isinstance(s.kind.op, RowReduce) for b in s.outs)  # type: ignore[union-attr]
    vector_maps: set[StageId] = set()
    for s in ordered:  # a map of row vectors alone is a row vector (its inputs are ordered before it)
        op = s.kind.op  # type: ignore[union-attr]
        if isinstance(op, Map) and s.ins and all(b in vectors for b in s.ins) and not _args(op.expr):
            if cols(op.expr):
                raise ProgramError(
                    f"map stage {s.name} reads row vectors and a column vector but no page of values: a row"
                    " program's page follows a ring of values (read x, or a map of it, beside the vectors)"
                )
            vectors.update(s.outs)
            vector_maps.add(s.id)
    online = online_pair(ordered, producer, readers)
    last = _last_pass_maps(writes, vectors, producer)
    for b, stages in readers.items():
        written = [s for s in stages if isinstance(s.kind, WriteStage)]
        shared = all(s.id in last for s in stages) or (online is not None and b == online[0].ins[0])
        if b not in vectors and len(stages) > 1 and not shared:
            raise ProgramError(
                f"{names.get(b, f'ring {int(b)}')} feeds stages {stages[0].name} and {stages[1].name}; in a row"
                " program a ring of values feeds one stage — but maps of the last pass, which share its pages: each"
                " other pass over a row reads its tensor again, with a read stage of its own"
            )
        if written and len(stages) > 1:
            other = next(s for s in stages if s is not written[0])
            raise ProgramError(
                f"{names.get(b, f'ring {int(b)}')} feeds write stage {written[0].name} and stage {other.name}; the"
                " writer pops a row vector it writes, so the stages that read it read a copy (a map x[row] of its own)"
            )
    pages = tuple(w for w in writes if w.ins and w.ins[0] not in vectors)
    for w in pages:
        f = producer[w.ins[0]]
        if not isinstance(f.kind, ComputeStage):
            raise ProgramError(
                f"write stage {w.name} stores the pages read stage {f.name} reads; in a row program an output of"
                " pages is a map's (a copy of a tensor is the map x of its own)"
            )
    return RowShape(
        ordered, pages, producer, frozenset(vectors), writes, frozenset(vector_maps), online, frozenset(last)
    )


def _last_pass_maps(writes: tuple[Stage, ...], vectors: set[BufferId], producer: dict[BufferId, Stage]) -> set[StageId]:
    """The maps that run in the band's last pass: those whose pages a write stores, and the maps of pages before
    them (x + residual, which fused add + RMSNorm both normalises and stores)."""
    found: set[StageId] = set()
    todo = [producer[w.ins[0]] for w in writes if len(w.ins) == 1 and w.ins[0] not in vectors and w.ins[0] in producer]
    while todo:
        s = todo.pop()
        if not isinstance(s.kind, ComputeStage) or not isinstance(s.kind.op, Map) or s.id in found:
            continue
        found.add(s.id)
        todo += [producer[b] for b in s.ins if b not in vectors and b in producer]
    return found


def _check_stage(s: Stage) -> None:
    """ProgramError where a stage's rings are not a row program's: a read fills one ring, a write empties one, a row
    reduction reads one and fills one, a map reads one or more and fills one (a schedule moves one page of each)."""
    if isinstance(s.kind, ReadStage):
        want, ok = "fills one ring", not s.ins and len(s.outs) == 1
    elif isinstance(s.kind, WriteStage):
        want, ok = "empties one ring", len(s.ins) == 1 and not s.outs
    elif isinstance(s.kind.op, RowReduce):  # type: ignore[union-attr]
        want, ok = "reads one ring and fills one", len(s.ins) == 1 and len(s.outs) == 1
    else:
        want, ok = "reads one ring or more and fills one", len(s.ins) >= 1 and len(s.outs) == 1
    if not ok:
        raise ProgramError(
            f"stage {s.name} reads {len(s.ins)} ring(s) and fills {len(s.outs)}; in a row program a"
            f" {_kind_word(s)} {want}"
        )


def _kind_word(s: Stage) -> str:
    """What a row program's stage is, in a word or two."""
    if isinstance(s.kind, ReadStage | WriteStage):
        return "read" if isinstance(s.kind, ReadStage) else "write"
    return "row reduction" if isinstance(s.kind.op, RowReduce) else "map"  # type: ignore[union-attr]


def scheduled_shape(p: SpatialProgram) -> RowShape:
    """`row_shape`, or ProgramError where `row_bodies` cannot schedule it: each stage on the engine its schedule
    gives it (reads on the reader, reductions and maps on the compute engine, writes on the writer), and no row
    reduction of a row vector (a pass folds pages of values). A program written with `spatialc.lang` schedules its own
    stages, and verify holds it to them."""
    shape = row_shape(p)
    names = {b.id: b.name for b in p.buffers}
    for s in p.stages:
        engine = {ReadStage: Engine.READER, WriteStage: Engine.WRITER}.get(type(s.kind), Engine.COMPUTE)
        if s.engine != engine:
            raise ProgramError(
                f"stage {s.name} runs on the {s.engine.value}; a row program's {_kind_word(s)} runs on the"
                f" {engine.value} (spatialc.lang writes a schedule of other engines)"
            )
    for s in shape.computes:
        if isinstance(s.kind.op, RowReduce) and s.ins[0] in shape.vectors:  # type: ignore[union-attr]
            raise ProgramError(
                f"stage {s.name} reduces {names.get(s.ins[0], f'ring {int(s.ins[0])}')}, a row vector (one value a"
                " row); a row reduction folds pages of the rows' values (a value of a row vector is its own reduction)"
            )
    return shape


ONLINE_EXP = Map(Apply("exp", (Apply("sub", (Arg(0), RowArg(1))),)))  # E = exp(x − M), the online pair's map


def floored(m: Expr) -> Expr:
    """The running max m as the pass's exp reads it: max(m, float32's lowest), m itself wherever it is finite — a
    row's pages of −∞ before its first finite value give α and P of 0, not exp(−∞ + ∞) = NaN (`recurrence.running`)."""
    return Apply("max", (m, Lit(-FLOAT32_MAX)))


# α = exp(m_old − m_new) and P = exp(x − m_new), the pass's own maps (rule 8 holds them to `recurrence.running`)
ONLINE_RESCALE = Map(Apply("exp", (Apply("sub", (RowArg(0), floored(RowArg(1)))),)))
ONLINE_P = Map(Apply("exp", (Apply("sub", (Arg(0), floored(RowArg(1)))),)))


def online_pair(
    ordered: tuple[Stage, ...], producer: dict[BufferId, Stage], readers: dict[BufferId, list[Stage]]
) -> tuple[Stage, Stage, Stage] | None:
    """The stages of an online softmax's one pass over a row, or None: a row max M of a ring of values that feeds M
    and one map E = exp(x − M) of the same ring beside M's vector — nothing else — and a row sum S of E, which alone
    reads E's ring. One read of each page then serves both reductions, the max and the sum kept running (`row_bodies`:
    the sum rescaled by exp(m_old − m_new) as the max grows)."""
    for e in ordered:
        op = e.kind.op  # type: ignore[union-attr]
        if not isinstance(op, Map) or len(e.ins) != 2 or len(e.outs) != 1 or not _same_map(op, ONLINE_EXP):
            continue
        ring, vector = e.ins
        m = producer.get(vector)
        if m is None or m.ins != (ring,) or not isinstance(m.kind, ComputeStage):
            continue
        if not isinstance(m.kind.op, RowReduce) or m.kind.op.op != "max":
            continue
        if {s.id for s in readers.get(ring, [])} != {m.id, e.id} or not isinstance(producer[ring].kind, ReadStage):
            continue
        sums = readers.get(e.outs[0], [])
        if len(sums) != 1 or not isinstance(sums[0].kind, ComputeStage):
            continue
        s, want = sums[0], m.kind.op.cols
        reduce = s.kind.op  # type: ignore[union-attr]
        if isinstance(reduce, RowReduce) and reduce.op == "sum" and reduce.cols == want:
            return m, e, s
    return None


def _same_map(op: Map, want: Map) -> bool:
    """`op` is `want` but for the width its row vectors are read at."""
    return with_row_args(op.expr, 1) == with_row_args(want.expr, 1)


def _args(expr: object) -> bool:
    """Whether `expr` reads a page element by element (an Arg)."""
    if isinstance(expr, Arg):
        return True
    return isinstance(expr, Apply) and any(_args(a) for a in expr.args)


def _cost(bh: int, bw: int, m_t: int, n_t: int, passes: int, sites: int) -> float:
    """The busiest site's time in tiles streamed: its bands (whole waves), each pass over each band's pages."""
    bands = math.ceil(m_t / bh)
    pages = math.ceil(n_t / bw)
    return math.ceil(bands / sites) * (passes * pages * (bh * bw + ITEM_OVERHEAD))


def ring_bytes(p: SpatialProgram, bh: int, bw: int, depth: int) -> int:
    """Shared memory of a site's rings: `depth` pages of bh × bw tiles for each read and map ring, one page of bh
    tiles for each row vector."""
    shape = row_shape(p)
    rings = [b for b in p.buffers if isinstance(b.kind, Fifo | Interm) and b.name not in ONLINE_RINGS]
    pages = sum(bh if b.id in shape.vectors else depth * bh * bw for b in rings)
    if shape.online is not None:  # the running max before and after a page, and the rescale α: a vector each
        pages += len(ONLINE_RINGS) * bh
    return pages * p.tile.elems * VALUE_BYTES


ONLINE_RINGS = ("m_old_ring", "m_new_ring", "alpha_ring")  # an online pass's own rings, one page of bh tiles each


def rows_tensor(p: SpatialProgram) -> Tensor:
    """The first tensor the program reads: its rows are the program's (every read and every output of pages has its
    shape; a written row vector is m × 1)."""
    return p.tensor(next(s.kind.tensor for s in p.stages if isinstance(s.kind, ReadStage)))  # type: ignore[union-attr]


def cheapest_block(
    what: str,
    target: SpatialTarget,
    block: tuple[int, int] | None,
    depth: int,
    need: Callable[[int, int], int],
    key: Callable[[int, int], tuple],
) -> tuple[int, int]:
    """The (bh, bw) of the least `key` whose rings (`need` bytes) fit a site's shared memory, over SIDES × SIDES or
    the `block` forced; PlanError where none fits, saying what a forced block's rings take."""
    best: tuple[tuple, int, int] | None = None
    for bh, bw in [block] if block is not None else [(h, w) for h in SIDES for w in SIDES]:
        took = need(bh, bw)
        if took > target.smem_per_site_max and block is not None:  # the block forced: say what it takes
            raise PlanError(
                f"{what}'s rings of {bh}x{bw}-tile pages, {depth} a ring, take {took} bytes a site, more than"
                f" {target.name}'s {target.smem_per_site_max}; force a smaller block or depth"
            )
        if took <= target.smem_per_site_max and (best is None or key(bh, bw) < best[0]):
            best = (key(bh, bw), bh, bw)
    if best is None:
        raise PlanError(
            f"no block of {what} fits {target.name}'s {target.smem_per_site_max} bytes of shared memory a site;"
            " force a smaller block or depth"
        )
    return best[1], best[2]


def plan_rows(p: SpatialProgram, target: SpatialTarget, block: tuple[int, int] | None, depth: int | None) -> Plan:
    """Bands of bh tile rows walked in pages bw tiles wide: the cheapest by `_cost` whose rings fit a site's shared
    memory (or the block forced), two pages a ring unless forced."""
    shape = scheduled_shape(p)
    m_t, n_t = rows_tensor(p).tiles
    passes = bool(shape.pages) + sum(isinstance(s.kind.op, RowReduce) for s in shape.computes)  # type: ignore[union-attr]
    passes -= shape.online is not None  # the max and the sum of one pass
    d = 2 if depth is None else depth
    if d < 1:
        raise PlanError(f"a row program's depth (pages a ring) must be ≥ 1, not {d}")
    sites = target.units * SITES_PER_UNIT
    if block is not None and min(block) < 1:
        raise PlanError(f"a row program's block ({block[0]}x{block[1]} tiles) must be ≥ 1 tile each way")
    bh, bw = cheapest_block(
        "a row program",
        target,
        block,
        d,
        lambda bh, bw: ring_bytes(p, bh, bw, d),
        lambda bh, bw: (_cost(bh, bw, m_t, n_t, passes, sites), -bw, bh),
    )
    nj = math.ceil(n_t / bw)
    return Plan(BlockShape(bh, nj * bw, bw), (1, 1), (math.ceil(m_t / bh), 1), nj * bw, d)


def apply_row_plan(p: SpatialProgram, plan: Plan) -> SpatialProgram:
    """Rings sized by the plan (row vectors one page of bh tiles), one accumulator of bh tiles a reduction, tensors
    padded to whole bands and pages (a written row vector's tensor, m × 1, to whole bands of one tile column)."""
    shape = row_shape(p)
    bh, bw = plan.block.osh, plan.block.ibw
    rows_t, cols_t = plan.grid[0] * bh, plan.k_tiles
    buffers = []
    for b in p.buffers:
        if isinstance(b.kind, Fifo | Interm):
            depth, tiles = (1, bh) if b.id in shape.vectors else (plan.depth, bh * bw)
            b = dataclasses.replace(b, kind=dataclasses.replace(b.kind, depth_pages=depth, page_tiles=tiles))
        buffers.append(b)
    for s in shape.computes:
        if isinstance(s.kind.op, RowReduce):  # type: ignore[union-attr]
            buffers.append(Buffer(BufferId(len(buffers)), f"{s.name}_acc", Accumulator(bh)))
    if shape.online is not None and not any(b.name in ONLINE_RINGS for b in p.buffers):
        buffers += [Buffer(BufferId(len(buffers) + i), name, Interm(1, bh)) for i, name in enumerate(ONLINE_RINGS)]
    vector_outs = {w.kind.tensor for w in shape.writes if w not in shape.pages}  # type: ignore[union-attr]
    per_row = {c.tensor for c in _vectors(shape) if c.axis == VecAxis.ROW}  # parameters read one value a row
    tensors = []
    for t in p.tensors:
        if t.id in vector_outs:  # one value a row: a tile column, each row's value in every column (as RowArg's)
            t = dataclasses.replace(t, tiles=(rows_t, 1))
        elif t.role in (TensorRole.INPUT, TensorRole.OUTPUT):
            t = dataclasses.replace(t, tiles=(rows_t, cols_t))
        elif t.id in per_row:  # one column of tiles, over whole bands
            t = dataclasses.replace(t, tiles=(rows_t, 1))
        elif t.role == TensorRole.PARAMETER and t.elems[0] == 1:
            t = dataclasses.replace(t, tiles=(1, cols_t))
        tensors.append(t)
    return p.evolve(plans=(plan,), buffers=tuple(buffers), tensors=tuple(tensors))


def _vectors(shape: RowShape) -> list[Col]:
    """The broadcast vectors the program's maps read from parameter tensors."""
    return [c for s in shape.computes if isinstance(s.kind.op, Map) for c in cols(s.kind.op.expr)]  # type: ignore[union-attr]


def place_rows(
    p: SpatialProgram, target: SpatialTarget, sites: int | None = None, placement: str | None = None
) -> SpatialProgram:
    """Bands over sites as a map's items go (`maps.place_map`): by default as many sites as the target keeps
    resident, at most one a band, contiguous or round-robin."""
    return place_map(p, target, sites, placement)


def row_bodies(p: SpatialProgram) -> dict[str, tuple[ChoreoOp, ...]]:
    """Each engine's per-band body: a pass over the band's pages for each reduction, each after the passes whose
    vectors it reads, then one for the outputs of pages (where the program has any), a page of each at a time; a
    pass reads its tensors' pages and runs the maps before it. A map of row vectors alone runs once, between the
    passes, as soon as its vectors are packed; the writer stores each written vector, and the outputs' pages, in the
    order the compute engine fills them."""
    plan = p.plan
    assert plan is not None
    shape = scheduled_shape(p)
    bh, bw, nj = plan.block.osh, plan.block.ibw, plan.k_steps
    col_at = TileAddr(0, ((LV_K, bw),))  # the page's first tile column of the row
    row_at = TileAddr(0, ((LV_ITEM_Y, bh),))  # the band's first tile row: where a row vector (ew.row) is read
    accs = {s.id: b.id for s in shape.computes for b in p.buffers if b.name == f"{s.name}_acc"}
    named = {b.name: b.id for b in p.buffers}
    written = {w.ins[0]: w for w in shape.writes}
    reader: list[ChoreoOp] = []
    compute: list[ChoreoOp] = []
    writer: list[ChoreoOp] = []
    packed: list[BufferId] = []
    last_final = next((s.id for s in reversed(shape.computes) if s.id in shape.finals), None)

    def read_loop(rings: list[BufferId]) -> None:
        body: list[ChoreoOp] = []
        for ring in rings:
            t = p.tensor(shape.producer[ring].kind.tensor)  # type: ignore[union-attr]
            at = TileAddr(0, ((LV_ITEM_Y, bh * t.tiles[1]), (LV_K, bw)))
            body += [Reserve(ring), ReadTiles(t.id, at, bh, bw, t.tiles[1], 1, ring), Push(ring)]
        if body:
            reader.append(Loop(LV_K, Const(nj), tuple(body)))

    def feeding(s: Stage) -> tuple[list[Stage], list[BufferId]]:
        """The maps a pass runs for `s` (each after those it reads) and the rings of tensors it reads for them."""
        maps: list[Stage] = []
        reads: list[BufferId] = []
        for b in s.ins:
            f = shape.producer[b]
            if b in shape.vectors:
                continue
            if isinstance(f.kind, ReadStage):
                reads.append(b)
            else:
                inner_maps, inner_reads = feeding(f)
                maps += [*inner_maps, f]
                reads += inner_reads
        return maps, reads

    def map_ops(s: Stage) -> list[ChoreoOp]:
        op = s.kind.op  # type: ignore[union-attr]
        assert isinstance(op, Map)

        def place(c: Col) -> Col:
            return Col(c.tensor, row_at if c.axis == VecAxis.ROW else col_at, bw, c.axis)

        placed = Map(with_row_args(with_cols(op.expr, place), bw))
        pages = [b for b in s.ins if b not in shape.vectors]
        (out,) = s.outs
        return [*(Wait(b) for b in pages), Reserve(out), Compute(placed, s.ins, (out,)), Push(out), *map(Pop, pages)]

    def filled(vector: BufferId) -> None:
        """A row vector just pushed: the compute engine waits for it (the maps after it read it), or the writer
        stores it into its tensor, a tile a row of the band."""
        if vector not in written:
            compute.append(Wait(vector))
            packed.append(vector)
            return
        t = p.tensor(written[vector].kind.tensor)  # type: ignore[union-attr]
        at = TileAddr(0, ((LV_ITEM_Y, bh * t.tiles[1]),))
        writer.extend((Wait(vector), WriteTiles(vector, t.id, at, bh, 1, t.tiles[1], 1), Pop(vector)))

    def online(m: Stage, e: Stage, s: Stage) -> None:
        """The max and the sum of one pass, the running max m and sum l updated page by page as FlashAttention's
        are: m_old = m; m ⊕= rowmax(x); α = exp(m_old − m_new); P = exp(x − m_new); l ·= α; l ⊕= rowsum(P)."""
        (x,), (p_ring,) = m.ins, e.outs
        m_acc, l_acc = accs[m.id], accs[s.id]
        m_old, m_new, alpha = (named[n] for n in ONLINE_RINGS)
        read_loop([x])
        exp = Map(with_row_args(ONLINE_P.expr, bw))
        body: tuple[ChoreoOp, ...] = (
            Wait(x),
            *(Reserve(m_old), PackAcc(m_acc, m_old, bh), Push(m_old)),
            Compute(dataclasses.replace(m.kind.op, at=col_at, width=bw), (x,), acc=m_acc),  # type: ignore[union-attr]
            *(Reserve(m_new), PackAcc(m_acc, m_new, bh), Push(m_new)),
            *(Wait(m_old), Wait(m_new), Reserve(alpha), Compute(ONLINE_RESCALE, (m_old, m_new), (alpha,)), Push(alpha)),
            *(Pop(m_old), Reserve(p_ring), Compute(exp, (x, m_new), (p_ring,)), Push(p_ring), Pop(x), Pop(m_new)),
            *(Wait(alpha), Wait(p_ring), Compute(ScaleAcc(), (alpha,), acc=l_acc)),
            Compute(dataclasses.replace(s.kind.op, at=col_at, width=bw), (p_ring,), acc=l_acc),  # type: ignore[union-attr]
            *(Pop(alpha), Pop(p_ring)),
        )
        compute.extend((AcquireAcc(m_acc), AcquireAcc(l_acc), Loop(LV_K, Const(nj), body)))
        for stage, acc in ((m, m_acc), (s, l_acc)):
            (out,) = stage.outs
            compute.extend((Reserve(out), PackAcc(acc, out, bh), Push(out), ReleaseAcc(acc)))
        for stage in (m, s):
            filled(stage.outs[0])

    def last_pass() -> None:
        """The pass of the outputs of pages: the maps of each, a page of each at a time, stored as they are filled. A
        ring two of its maps read is waited for before the first and popped after the last."""
        maps: list[Stage] = []
        reads: list[BufferId] = []
        for w in shape.pages:
            last = shape.producer[w.ins[0]]
            more_maps, more_reads = feeding(last)
            maps += [f for f in (*more_maps, last) if f not in maps]
            reads += [b for b in more_reads if b not in reads]
        pages = {f.id: [b for b in f.ins if b not in shape.vectors] for f in maps}
        final = {b: f.id for f in maps for b in pages[f.id]}  # the last map that reads each ring
        body: list[ChoreoOp] = []
        waited: set[BufferId] = set()
        for f in maps:
            ops = map_ops(f)
            body += [Wait(b) for b in pages[f.id] if b not in waited]
            waited.update(pages[f.id])
            body += [op for op in ops if not isinstance(op, Wait | Pop)]
            body += [Pop(b) for b in pages[f.id] if final[b] == f.id]
        stores: list[ChoreoOp] = []
        for w in shape.pages:
            t = p.tensor(w.kind.tensor)  # type: ignore[union-attr]
            at_out = TileAddr(0, ((LV_ITEM_Y, bh * t.tiles[1]), (LV_K, bw)))
            (ring,) = w.ins
            stores += [Wait(ring), WriteTiles(ring, t.id, at_out, bh, bw, t.tiles[1], 1), Pop(ring)]
        read_loop(reads)
        compute.append(Loop(LV_K, Const(nj), tuple(body)))
        writer.append(Loop(LV_K, Const(nj), tuple(stores)))

    for s in shape.computes:
        op = s.kind.op  # type: ignore[union-attr]
        if s.id in shape.finals and s.id == last_final:
            last_pass()
            continue
        if shape.online is not None and s in shape.online:
            if s is shape.online[0]:
                online(*shape.online)
            continue
        if s.id in shape.vector_maps:  # once a band, of the vectors packed before it
            (out,) = s.outs
            compute += [Reserve(out), Compute(op, s.ins, (out,)), Push(out)]
            filled(out)
            continue
        if isinstance(op, Map):
            continue  # a map runs inside the pass of the reduction it feeds, or in the last pass with the writes
        maps, reads = feeding(s)
        read_loop(reads)
        body: list[ChoreoOp] = [x for f in maps for x in map_ops(f)]
        (src,) = s.ins
        acc, (out,) = accs[s.id], s.outs
        reduce = Compute(dataclasses.replace(op, at=col_at, width=bw), (src,), acc=acc)
        compute.append(AcquireAcc(acc))
        compute.append(Loop(LV_K, Const(nj), (*body, Wait(src), reduce, Pop(src))))
        compute += [Reserve(out), PackAcc(acc, out, bh), Push(out), ReleaseAcc(acc)]
        filled(out)
    compute += [Pop(v) for v in packed]
    return {"reader": tuple(reader), "compute": tuple(compute), "writer": tuple(writer)}


def schedule_rows(p: SpatialProgram) -> SpatialProgram:
    """Each site's engines run the per-band bodies over their bands."""
    return scheduled(p, row_bodies(p))

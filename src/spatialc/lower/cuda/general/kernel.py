"""The general CUDA form: one block per site, every engine program on warps of its own, the rings handed over at run
time through a full and an empty mbarrier per slot.

Nothing is serialised or proved about an order here: each engine runs its own program, loops and all, as the IR
says, and blocks where the IR's engine would block — `Reserve` on the slot's empty barrier, `Wait` on its full
barrier. That the program cannot deadlock and never overfills a ring is rule 7 of `verify`, proved on exactly these
semantics, so the form needs no proof of its own. The tile printers (`common/tiles.py`), the epilogue statements,
the host programs and the census are shared with the persistent form (`common/`); only the flow control and the warp
roles are this module's (with `common/registers.py`'s rings kept in registers, attention's).
What the form refuses is `checks.py`'s; the compute warps' fragments and register estimates are `fragments.py`'s.

Each ring slot's barriers:

- full, completed by every thread of the producing engine: `Push` arrives on it — for a ring filled by `ReadTiles`
  through `cp.async.mbarrier.arrive.noinc`, so the arrival happens when the thread's copies have landed; for a page
  a multicast sender copies into a receiver, by the sender's threads from the peer block (`clusters.py`);
- empty, completed by every thread of the consuming engine: `Pop` arrives on it after the engine's last read.

An engine keeps a counter per ring op kind (reserved, pushed, waited, popped); the counter's slot is count mod depth
and its phase parity (count / depth) mod 2. A producer waits for the empty phase of the previous round (parity
flipped: the first round passes on a fresh barrier), a consumer for the full phase of this round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ....ir.nodes import Engine, Plan, SpatialProgram
from ....ir.ops import (
    AcquireAcc,
    ChoreoOp,
    ComputeOp,
    Pop,
    Precision,
    Push,
    walk,
)
from ....ir.traffic import global_read_bytes
from ....numerics.blockscale import program_scales
from ....passes.attention import is_attention_program
from ....passes.cols import is_col_program
from ....passes.maps import is_map_program
from ....passes.rows import is_row_program
from ....passes.split import workspace_bytes
from ....target import WARP, SpatialTarget
from ...artifact import Budget, CudaArtifact
from ...errors import TooBig, Unsupported
from ..common import epilogue
from ..common.barrier_ids import check_barrier_ids, engine_barriers
from ..common.blockscale import SCALED_FRAGMENTS
from ..common.clusters import Multicast, check_cluster, multicast
from ..common.cols import ColAccumulators, checked_cols, col_accumulators
from ..common.dequant import DEQUANT_IN, packed_rings
from ..common.handover import clusters, sync_words
from ..common.host import assemble
from ..common.launch import launch_for
from ..common.program import all_ops, checked_attention, checked_layers, checked_map, checked_rows, out_c_type
from ..common.registers import register_rings
from ..common.rings import (
    ALIGN,
    MMA_TYPES,
    TILE_ELEMS,
    MmaTypes,
    Ring,
    Rings,
    aligned,
    epilogue_rings,
    epit_bytes,
    ring_table,
    scheduled_rings,
)
from ..common.rows import RowAccumulators, row_accumulators, row_registers
from ..common.sites import SiteClass, relative_groups, site_classes
from ..common.tiles import Fragments
from .checks import refuse
from .fragments import (
    accumulator_layers,
    attention_lanes,
    fragments_and_rows,
    fragments_of,
    held_registers,
    held_tiles,
    row_templates,
    scores_registers,
)
from .printer import KERNEL_NAME, kernel_text, printed

BARRIER_BYTES = 8  # one mbarrier object
SIDE_WARPS = 1  # warps of an engine other than the compute engine (reader, writer)


@dataclass(frozen=True, slots=True)
class Role:
    """One engine's warps: `first_warp` … `first_warp + warps - 1`, and its program in each site class (the same
    order as `GeneralKernel.classes`; () where that class's sites do not run the engine)."""

    engine: Engine
    first_warp: int
    warps: int
    programs: tuple[tuple[ChoreoOp, ...], ...]

    @property
    def threads(self) -> int:
        return self.warps * WARP

    def walk(self):
        """Every op of every class's program."""
        for ops in self.programs:
            yield from walk(ops)


@dataclass(frozen=True, slots=True)
class GeneralKernel:
    """Everything the printer reads, decided before a line is printed."""

    program: SpatialProgram
    plan: Plan
    types: MmaTypes
    out_type: str
    rings: Rings
    lane_grid: tuple[int, int] | None
    lanes: int  # the compute engine's warps: the accumulator lanes (0: a map program's kernel, which holds none)
    perw: int  # accumulator fragments a compute warp holds (of the one accumulator; see `layers`)
    roles: tuple[Role, ...]
    full_count: dict[int, int]  # ring → arrivals that complete a full phase (the producer's threads)
    empty_count: dict[int, int]  # ring → arrivals that complete an empty phase (the consumer's threads)
    offsets: dict[str, int]  # region name (ring_3, full_3, empty_3) → byte offset in the dynamic block
    dyn_bytes: int
    barrier_bytes: int
    blocks_per_sm: int
    integer: bool
    stages: tuple[ComputeOp, ...]  # the page-to-page compute ops, in order (every matmul's chain; a map program's map)
    classes: tuple[SiteClass, ...]  # the sites with items, by the programs they run
    sites: int  # the grid: every site runs, in blockIdx order
    words: dict[tuple[str, int], int]  # ("group" | "sem", id) → its first word in spatialc_sync (one per site)
    members: dict[int, tuple[int, ...]]  # group of a Barrier → its sites
    sync: tuple[int, ...]  # the initial value of every word of spatialc_sync (() when the kernel takes none)
    trip_error: int  # the word of spatialc_sync flagging a trip count out of its bound, the count after it (-1: none)
    relative: bool = False  # the classes' SemInc sites are offsets from the site running them (`site_classes`)
    cluster: int = 1  # sites per thread-block cluster (multicast groups, `clusters`); 1: none
    groups: tuple[tuple[int, ...], ...] = ()  # relative classes' multicast groups: offsets from the site, by id
    multicast: Multicast | None = None  # the multicast handshake, on the clusters' barriers (clusters.py)
    # Each accumulator's fragments by template, where the compute warps hold several (an MLP's layers); empty where
    # they hold one: the plan's block, `lane_grid` and `perw`, in accf[PERW].
    layers: dict[int, Fragments] = field(default_factory=dict)
    rows: RowAccumulators | None = None  # a row program's accumulators (rows.py), which its compute warps hold
    # The rings the compute warps keep in registers (registers.py), by template: the fragment layer whose layout
    # each holds, or None for a row vector. Not in `rings.rings`: they have no page and no barriers.
    in_registers: dict[int, int | None] = field(default_factory=dict)
    # Where a W4A16 GEMM's weights are dequantised (common/dequant.py): "registers", straight into the matmul's B
    # fragments from the packed page, or "shared", into a B operand page the matmul loads as any.
    dequant: str = "registers"
    cols: ColAccumulators | None = None  # a column program's accumulators (cols.py), which its compute warps hold

    @property
    def cooperative(self) -> bool:
        """Whether sites hand over to each other (barriers, semaphores) across clusters: every one must be resident
        at once. Sites that wait only on their own cluster's are co-scheduled by the hardware."""
        return bool(self.words) and self.cluster == 1

    @property
    def threads(self) -> int:
        return sum(r.threads for r in self.roles)

    @property
    def score_tiles(self) -> int:
        """The tiles of a page of scores (a band by a block of keys) whose values the compute warps hold in registers
        (attention's register path: X's and P's), 0 where they hold none."""
        return self.plan.block.osh * self.plan.block.ibw if self.in_registers else 0

    def registers(self, target: SpatialTarget) -> int:
        """The estimate of a thread's registers: the accumulators' (`SpatialTarget.registers_per_thread`), a row
        program's kernel's own (`rows.BASE_REGISTERS`), or where the compute warps hold both (attention) the
        fragments' and the row shares' together (`held_registers`)."""
        if self.cols is not None:
            return min(self.cols.registers, target.regs_per_thread_max)
        if self.rows is not None and not self.accumulates:
            return min(self.rows.registers, target.regs_per_thread_max)
        if self.rows is not None:
            held = held_registers(target, self.acc_tiles, self.rows, self.lanes, self.score_tiles)
            return min(held, target.regs_per_thread_max)
        return target.registers_per_thread(self.acc_tiles)

    @property
    def accumulates(self) -> bool:
        """Whether the kernel multiplies: its compute warps hold accumulator fragments and it inlines the tensor-core
        layer. A map program's kernel (no matmul) has neither: its engines only move and map pages; a row program's
        compute warps hold row accumulators (`rows`), no fragments; attention's hold both."""
        return self.lanes > 0 and self.cols is None and (self.rows is None or bool(self.layers))

    @property
    def fragments(self) -> tuple[Fragments, ...]:
        """Every accumulator the compute warps hold: each layer's, or the one of the plan's block in accf[PERW]
        (none in a map program's kernel)."""
        if not self.accumulates:
            return ()
        return tuple(self.layers.values()) or (Fragments(self.plan, self.lane_grid, self.perw, "accf", "PERW"),)

    @property
    def acc_tiles(self) -> int:
        """Accumulator tiles the compute warps hold at once: every accumulator's (they may all be live), a
        block-scaled step's partials counted (`SCALED_FRAGMENTS`)."""
        scaled = SCALED_FRAGMENTS if program_scales(self.program) is not None else 1
        return scaled * held_tiles(self.plan, self.layers) if self.accumulates else 0


# ---- resources -------------------------------------------------------------------------------------------------


def roles_of(classes: tuple[SiteClass, ...], lanes: int) -> tuple[Role, ...]:
    """The compute engine (the one holding the accumulators) on warps 0 … lanes − 1, every other engine with a
    program in some site class on SIDE_WARPS warps after it, in the schedule's order."""
    engines: list[Engine] = []
    for c in classes:
        engines += [e for e, ops in c.engines if ops and e not in engines]
    programs = {e: tuple(dict(c.engines).get(e, ()) for c in classes) for e in engines}
    holds = [e for e in engines if any(isinstance(op, AcquireAcc) for ops in programs[e] for op in walk(ops))]
    first = holds[0] if holds else None
    roles, warp = [], 0
    for engine in sorted(engines, key=lambda e: e != first):
        n = lanes if engine == first else SIDE_WARPS
        roles.append(Role(engine, warp, n, programs[engine]))
        warp += n
    return tuple(roles)


def _ring_ends(p: SpatialProgram, rings: Rings, roles: tuple[Role, ...]) -> tuple[dict[int, Role], dict[int, Role]]:
    """The role that pushes each ring and the role that pops it (verify's rule 3: one of each per site)."""
    prod: dict[int, Role] = {}
    cons: dict[int, Role] = {}
    for role in roles:
        for op in role.walk():
            if isinstance(op, Push | Pop):
                ends = prod if isinstance(op, Push) else cons
                r = rings.template[op.buf]
                if ends.setdefault(r, role) is not role:
                    raise Unsupported(
                        f"ring {rings.names.get(r, r)} {'pushed' if ends is prod else 'popped'} by two engines",
                        "each ring slot's barrier counts one engine's threads",
                    )
    return prod, cons


def layout(
    rings: dict[int, Ring], ring_align: int = ALIGN, barrier_align: int = ALIGN, ready: tuple[int, ...] = ()
) -> tuple[dict[str, int], int, int]:
    """The dynamic block: every ring (by id), each starting on `ring_align` bytes, then each ring's full and empty
    barriers (and a `ready` one for the rings named there: the sm_90a form's multicast stages), each array on
    `barrier_align`; (region name → offset, total bytes, barrier bytes). By default every region starts on 32 bytes,
    as cp.async and the fragment loads want (the sm_90a form's swizzled stages want 1024)."""

    def up(n: int, to: int) -> int:
        return -(-n // to) * to

    offsets: dict[str, int] = {}
    off = 0
    for rid in sorted(rings):
        off = up(off, ring_align)
        offsets[f"ring_{rid}"] = off
        off += rings[rid].bytes
    start = off = up(off, barrier_align)
    for rid in sorted(rings):
        for kind in ("full", "empty", "ready") if rid in ready else ("full", "empty"):
            offsets[f"{kind}_{rid}"] = off
            off += up(rings[rid].depth * BARRIER_BYTES, barrier_align)
    return offsets, off, off - start


def plan_resources(target: SpatialTarget, plan: Plan, precision: Precision, stages: int = 0) -> tuple[int, int]:
    """What one block of the general form for `plan` costs, as the tile planner asks: (shared memory bytes, blocks
    resident per SM — 0 when one does not fit) for the standard schedule's rings (A and B `depth` deep, the output
    and each of the epilogue's `stages` two deep) and engines (the compute warps, a reader and a writer warp)."""
    types = MMA_TYPES[precision]
    h, w = plan.item_tiles
    ibw, out = plan.block.ibw, min(plan.depth, 2)
    epit = epit_bytes(precision == Precision.INT8)
    shapes = [(plan.depth, h * ibw, types.operand_bytes), (plan.depth, ibw * w, types.operand_bytes)]
    shapes += [(out, h * w, types.acc_bytes)] + [(out, h * w, epit)] * stages
    rings = {i: Ring(i, f"ring{i}", d, tiles * TILE_ELEMS, "", size) for i, (d, tiles, size) in enumerate(shapes)}
    smem = layout(rings)[1]
    warps = target.accumulator_lanes + 2 * SIDE_WARPS
    return smem, target.resident_sites_per_unit(smem, plan.block.osh, plan.block.osw, plan.sub_blocks, warps)


def map_resources(
    target: SpatialTarget, plan: Plan, precision: Precision, inputs: int, values: int = 1
) -> tuple[int, int]:
    """What one block of the general form costs for a map program of `inputs` input tensors and `values` maps, as
    the map planner asks (`passes.maps.plan_map`): (shared memory bytes, blocks resident per SM — 0 when one does
    not fit) for its rings, `plan.depth` pages of the item's tiles — each input's of its element type, each map's
    (an output's, or one another map reads) of the map's values (EPIT) — with their barriers, and its engines, a
    warp each (`make_kernel` lays out the same)."""
    h, w = plan.item_tiles
    sizes = [MMA_TYPES[precision].operand_bytes] * inputs + [epit_bytes(precision == Precision.INT8)] * values
    rings = {i: Ring(i, f"ring{i}", plan.depth, h * w * TILE_ELEMS, "", size) for i, size in enumerate(sizes)}
    smem = layout(rings)[1]
    return smem, target.resident_sites_per_unit(smem, 0, 1, (1, 1), 3 * SIDE_WARPS)


def attention_resources(target: SpatialTarget, plan: Plan, precision: Precision) -> tuple[int, int]:
    """What one block of the general form costs for an attention's plan, as its planner asks
    (`passes.attention.plan_attention`): (shared memory bytes, blocks resident per SM — 0 when one does not fit) for
    the rings `make_kernel` lays out for attention's schedule — Q's band once, K's and V's blocks `plan.depth` deep, in
    the operand type; O's and LSE's pages, float32 (`rings.scheduled_rings`); the recurrence's own in registers
    (registers.py) — with their barriers, and its warps: the compute warps (`attention_lanes`), a reader's and a
    writer's, and the registers `held_registers` estimates."""
    bh, dt, bw = plan.block.osh, plan.block.osw, plan.block.ibw
    size = MMA_TYPES[precision].operand_bytes
    shapes = [(1, bh * dt, size), (plan.depth, bw * dt, size), (plan.depth, bw * dt, size), (1, bh * dt, 4)]
    shapes += [(1, bh, 4)]  # the recurrence's own rings live in the compute warps' registers (registers.py)
    rings = {i: Ring(i, f"ring{i}", d, tiles * TILE_ELEMS, "", n) for i, (d, tiles, n) in enumerate(shapes)}
    smem = layout(rings)[1]
    lanes = attention_lanes(target, bh)
    rows = row_registers(2 * 2 * (bh // lanes), bh * bw)  # the running max and sum, two rows a tile row of the warp's
    held = fragments_and_rows(target, bh * bw + bh * dt, rows, lanes) + scores_registers(bh * bw, lanes)
    regs = min(held, target.regs_per_thread_max)
    return smem, target.resident_sites_per_unit(smem, bh * bw + bh * dt, 1, (1, 1), lanes + 2 * SIDE_WARPS, regs)


def page_stages(p: SpatialProgram) -> tuple[MmaTypes, bool, tuple[ComputeOp, ...]]:
    """The kernel's operand types (a map program's or a row program's: its inputs'), whether it is int8 (exact `long
    long` values), and the compute ops its engines apply page to page: every matmul's epilogue chain, in stage order
    (`checked_layers`), a map program's maps (`checked_map`), or a row program's reductions and maps
    (`checked_rows`) — each checked as those say."""
    if is_attention_program(p):
        types, maps = checked_attention(p)
        return types, False, maps
    if is_col_program(p):
        types, stages = checked_cols(p)
        return types, False, tuple(s.kind.op for s in stages)  # type: ignore[union-attr]
    if is_row_program(p):
        types, stages = checked_rows(p)
        return types, False, tuple(s.kind.op for s in stages)  # type: ignore[union-attr]
    if is_map_program(p):
        types, integer, map_stages = checked_map(p)
        return types, integer, tuple(s.kind.op for s in map_stages)  # type: ignore[union-attr]
    types, integer, layers = checked_layers(p, epilogue.ELEMENTWISE_OPS)
    return types, integer, tuple(s.kind.op for _, chain in layers for s in chain)  # type: ignore[union-attr]


def make_kernel(p: SpatialProgram, target: SpatialTarget, fit: bool = True) -> GeneralKernel:
    """Check what the general form needs and lay out its block; `fit` False leaves the shared-memory check to a
    form that lays the block out again (the sm_90a form's fused output keeps fewer rings). A map program's block is
    the same engines, rings and barriers without accumulators: every engine on one warp of its own. A row program's
    is a map program's whose compute engine runs on the accumulator lanes and holds row accumulators in them."""
    refuse(p)
    plan = p.plans[0]
    types, integer, stages = page_stages(p)
    attention = is_attention_program(p)
    # row (or column) accumulators alone; attention's compute warps hold fragments beside them
    reduces = is_row_program(p) or is_col_program(p)
    lanes = 0 if is_map_program(p) and not attention else target.accumulator_lanes
    if attention:
        lanes = attention_lanes(target, plan.block.osh)
    if is_col_program(p):  # a thread a column of the band: no more warps than its columns fill
        lanes = min(lanes, -(-plan.block.osw * p.tile.cols // WARP))
    one = fragments_of(plan, target)  # the plan's block: the accumulator of a one-matmul program
    lane_grid, perw = (one.lane_grid, one.perw) if lanes and not reduces else (None, 0)
    by_rows = row_templates(p) if reduces or attention else frozenset()
    accumulators = {} if reduces else accumulator_layers(p, target, plan, by_rows, lanes if attention else 0)
    if attention:  # its stages do not say what its recurrence's rings hold: the schedule does
        rings = scheduled_rings(p, types, all_ops(p), by_rows)
    else:
        rings = packed_rings(p, epilogue_rings(p, ring_table(p, types, ()), integer))
    rows = row_accumulators(p, plan, rings, lanes) if by_rows else None
    cols = col_accumulators(p, plan, rings, lanes) if reduces and not by_rows else None
    in_registers: dict[int, int | None] = {}
    if attention and rows is not None:
        in_registers = held_rings(p, rings, by_rows, accumulators)
    if in_registers:  # the row accumulators in the fragments' quads: two rows of each of the warp's tile rows
        assert rows is not None
        shares = 2 * (plan.block.osh // lanes)
        registers = row_registers(shares * len(rows.reductions), plan.block.osh * plan.block.ibw)
        rows = dataclasses.replace(rows, per_warp=shares, registers=registers)
        rings = dataclasses.replace(rings, rings={r: v for r, v in rings.rings.items() if r not in in_registers})
    classes, relative = site_classes(p, relative_sems=True)
    cluster = clusters(p, target)
    mc = multicast(p, rings.template) if cluster > 1 else None
    roles = roles_of(classes, lanes)
    check_barrier_ids(engine_barriers(r.engine for r in roles))
    prod, cons = _ring_ends(p, rings, roles)
    if mc is not None:
        check_cluster(cluster)
    offsets, off, barrier_bytes = layout(rings.rings, ready=mc.rings if mc is not None else ())
    threads = sum(r.threads for r in roles)
    if threads > 1024:
        raise TooBig(f"threads of one block of the general form on {target.name}", threads, 1024, "use fewer lanes")
    # The registers hold every accumulator tile at once; only their number matters, so they go in as one column. A
    # row program's kernel has its own estimate.
    held = held_tiles(plan, accumulators) if lanes and not reduces else 0
    held *= SCALED_FRAGMENTS if program_scales(p) is not None else 1  # a block-scaled step's partials beside them
    regs = min(rows.registers, target.regs_per_thread_max) if rows is not None else None
    regs = min(cols.registers, target.regs_per_thread_max) if cols is not None else regs
    if rows is not None and held:
        scores = plan.block.osh * plan.block.ibw if in_registers else 0
        regs = min(held_registers(target, held, rows, lanes, scores), target.regs_per_thread_max)
    per_sm = target.resident_sites_per_unit(off, held, 1, (1, 1), threads // WARP, regs)
    if per_sm == 0 and fit:
        raise TooBig(
            f"shared memory of one block of the general form on {target.name} (rings and their barriers)",
            off,
            target.smem_per_site_max,
            "choose a smaller block, fewer sub-blocks or shallower rings",
        )
    out_type = out_c_type(p, "the general form", mixed=attention or reduces)  # LSE, mean, rstd: float32 whatever O is
    missing = [r for r in rings.rings if r not in prod or r not in cons]
    if missing:
        raise Unsupported(f"ring {rings.rings[missing[0]].name} without a producer and a consumer", "verify says why")
    return GeneralKernel(
        p,
        plan,
        types,
        out_type,
        rings,
        lane_grid,
        lanes,
        perw,
        roles,
        {r: prod[r].threads for r in rings.rings},
        {r: cons[r].threads for r in rings.rings},
        offsets,
        off,
        barrier_bytes,
        per_sm,
        integer,
        stages,
        classes,
        *sync_words(p, handshake(mc)),
        relative,
        cluster,
        relative_groups(p),
        mc,
        accumulators,
        rows,
        in_registers,
        cols=cols,
    )


def held_rings(
    p: SpatialProgram, rings: Rings, rows: frozenset[int], layers: dict[int, Fragments]
) -> dict[int, int | None]:
    """The rings the compute engine keeps in registers (`registers.register_rings`), where every site's compute
    program keeps the same ones (sites of 15 and of 16 items run programs that differ in their ITEM loop's count
    alone)."""
    programs = {prog.ops for prog in p.schedule.programs if prog.engine == Engine.COMPUTE}  # type: ignore[union-attr]
    depth = {r: ring.depth for r, ring in rings.rings.items()}
    held = [register_rings(list(walk(ops)), rings, depth, rows, layers) for ops in programs]
    return held[0] if held and all(h == held[0] for h in held) else {}


def handshake(mc: Multicast | None) -> frozenset[int]:
    """The semaphores a multicast handshake's barriers stand for: no word of global memory holds them."""
    return frozenset() if mc is None else frozenset(mc.ready) | frozenset(mc.valid)


def budget_of(k: GeneralKernel, target: SpatialTarget) -> Budget:
    ring_bytes = sum(aligned(r.bytes) for r in k.rings.rings.values())
    return Budget(
        ring_bytes,
        k.dyn_bytes > target.smem_static_max,
        True,
        k.dyn_bytes,
        0,
        k.registers(target),
        k.blocks_per_sm,
        k.threads,
        tuple((r.name, r.bytes) for r in sorted(k.rings.rings.values(), key=lambda r: r.id)),
        (),
        "general",
        tuple((role.engine.value, role.warps) for role in k.roles),
        k.barrier_bytes,
        layouts=tuple((r.name, r.layout.value) for r in sorted(k.rings.rings.values(), key=lambda r: r.id)),
        workspace_bytes=workspace_bytes(k.program),
        global_read_bytes=global_read_bytes(k.program),
    )


def lower(program: SpatialProgram, target: SpatialTarget, dequant: str = "registers") -> CudaArtifact:
    """The general-form CUDA artifact of a verified program, or a typed error saying what it cannot print yet.
    `dequant`: where a W4A16 GEMM's weights are dequantised ("registers", or "shared": the B operand page)."""
    if dequant not in DEQUANT_IN:
        raise ValueError(f"dequant is one of {', '.join(DEQUANT_IN)}, not {dequant!r}")
    k = dataclasses.replace(make_kernel(program, target), dequant=dequant)
    opt_in = k.dyn_bytes > target.smem_static_max
    fixed = len(k.classes) > 1  # the sites run different programs: exactly these sites run
    launch = launch_for(
        program,
        target,
        KERNEL_NAME,
        k.types,
        k.threads,
        k.dyn_bytes,
        opt_in,
        k.blocks_per_sm,
        k.sync,
        fixed or k.cooperative or k.cluster > 1,
        k.cooperative,
        k.trip_error,
        k.cluster,
    )
    programs = tuple(ops for role in k.roles for ops in printed(role))
    return assemble(program, target.name, kernel_text(k), programs, launch, budget_of(k, target))

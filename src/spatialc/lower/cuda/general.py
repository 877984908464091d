"""The general CUDA form: one block per site, every engine program on warps of its own, the rings handed over at run
time through a full and an empty mbarrier per slot.

Nothing is serialised or proved about an order here: each engine runs its own program, loops and all, as the IR
says, and blocks where the IR's engine would block — `Reserve` on the slot's empty barrier, `Wait` on its full
barrier. That the program cannot deadlock and never overfills a ring is rule 7 of `verify`, proved on exactly these
semantics, so the form needs no proof of its own. The tile printers (`tiles.py`), the epilogue statements, the host
programs and the census are the persistent form's; only the flow control and the warp roles are this module's.

Each ring slot's barriers:

- full, completed by every thread of the producing engine: `Push` arrives on it — for a ring filled by `ReadTiles`
  through `cp.async.mbarrier.arrive.noinc`, so the arrival happens when the thread's copies have landed;
- empty, completed by every thread of the consuming engine: `Pop` arrives on it after the engine's last read.

An engine keeps a counter per ring op kind (reserved, pushed, waited, popped); the counter's slot is count mod depth
and its phase parity (count / depth) mod 2. A producer waits for the empty phase of the previous round (parity
flipped: the first round passes on a fresh barrier), a consumer for the full phase of this round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ...inputs import row_limits
from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, LoopVar, loop_var_name
from ...ir.nodes import ComputeStage, DType, Engine, Plan, SpatialProgram, TensorRole
from ...ir.ops import (
    AcquireAcc,
    AddPartial,
    Barrier,
    Bias,
    ChoreoOp,
    Compute,
    ComputeOp,
    Flush,
    Loop,
    MatmulTiles,
    McastSend,
    PackAcc,
    Pop,
    Precision,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    SemSet,
    TileAddr,
    Trip,
    Wait,
    WriteBarrier,
    walk,
)
from ...ir.printer import addr_text, compute_text
from ...ir.traffic import global_read_bytes
from ...passes.split import workspace_bytes
from ...target import WARP, SpatialTarget
from ..artifact import Budget, CudaArtifact
from ..census import marker
from ..errors import TooBig, Unsupported
from . import epilogue
from .cwriter import C_TYPES, CHECK_MACRO, INCLUDES, RING_MACROS, Writer, addr_expr, inlined_lines, site_prologue
from .handover import HandoverPrinter, clusters, sync_words
from .host import assemble
from .program import (
    SiteClass,
    all_ops,
    check_printable,
    checked_layers,
    fragments_per_warp,
    launch_for,
    relative_groups,
    site_classes,
)
from .rings import ALIGN, MMA_TYPES, TILE_ELEMS, MmaTypes, Ring, Rings, aligned, ring_table
from .tiles import Fragments, TilePrinter, tensor_core_lines

KERNEL_NAME = "spatialc_general"
# Plain reads and writes of page elements (the writer's, and the epilogue stages'), so that the emulation, which
# defines its own, can check them for races as it checks cp.async landings and fragment loads; and plain stores to
# global memory other sites read in the same launch (split-K's workspace), which the emulation keeps invisible at
# device scope until the storing thread (or one that crossed a barrier with it) releases them.
PAGE_MACROS = """#ifndef SPATIALC_PAGE_LD
#define SPATIALC_PAGE_LD(p) (*(p))
#define SPATIALC_PAGE_ST(p, v) (*(p) = (v))
#endif
#ifndef SPATIALC_GLOBAL_ST
#define SPATIALC_GLOBAL_ST(p, v) (*(p) = (v))
#endif"""
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
    lanes: int  # the compute engine's warps: the accumulator lanes
    perw: int  # accumulator fragments a compute warp holds (of the one accumulator; see `layers`)
    roles: tuple[Role, ...]
    full_count: dict[int, int]  # ring → arrivals that complete a full phase (the producer's threads)
    empty_count: dict[int, int]  # ring → arrivals that complete an empty phase (the consumer's threads)
    offsets: dict[str, int]  # region name (ring_3, full_3, empty_3) → byte offset in the dynamic block
    dyn_bytes: int
    barrier_bytes: int
    blocks_per_sm: int
    integer: bool
    stages: tuple[ComputeOp, ...]  # the epilogue's compute ops, in order (every matmul's chain, in stage order)
    classes: tuple[SiteClass, ...]  # the sites with items, by the programs they run
    sites: int  # the grid: every site runs, in blockIdx order
    words: dict[tuple[str, int], int]  # ("group" | "sem", id) → its first word in spatialc_sync (one per site)
    members: dict[int, tuple[int, ...]]  # group of a Barrier → its sites
    sync: tuple[int, ...]  # the initial value of every word of spatialc_sync (() when the kernel takes none)
    trip_error: int  # the word of spatialc_sync flagging a trip count out of its bound, the count after it (-1: none)
    relative: bool = False  # the classes' SemInc sites are offsets from the site running them (`site_classes`)
    cluster: int = 1  # sites per thread-block cluster (multicast groups, `clusters`); 1: none
    groups: tuple[tuple[int, ...], ...] = ()  # relative classes' multicast groups: offsets from the site, by id
    # Each accumulator's fragments by template, where the compute warps hold several (an MLP's layers); empty where
    # they hold one: the plan's block, `lane_grid` and `perw`, in accf[PERW].
    layers: dict[int, Fragments] = field(default_factory=dict)

    @property
    def cooperative(self) -> bool:
        """Whether sites hand over to each other (barriers, semaphores) across clusters: every one must be resident
        at once. Sites that wait only on their own cluster's are co-scheduled by the hardware."""
        return bool(self.words) and self.cluster == 1

    @property
    def threads(self) -> int:
        return sum(r.threads for r in self.roles)

    @property
    def fragments(self) -> tuple[Fragments, ...]:
        """Every accumulator the compute warps hold: each layer's, or the one of the plan's block in accf[PERW]."""
        return tuple(self.layers.values()) or (Fragments(self.plan, self.lane_grid, self.perw, "accf", "PERW"),)

    @property
    def acc_tiles(self) -> int:
        """Accumulator tiles the compute warps hold at once: every accumulator's (they may all be live)."""
        return held_tiles(self.plan, self.layers)


# ---- what the general form takes ----------------------------------------------------------------------------


def refuse(p: SpatialProgram) -> None:
    """Raise the first reason the general form cannot print `p` yet."""
    check_printable(p)
    ops = all_ops(p)
    for prog in p.schedule.programs:  # type: ignore[union-attr]
        check_waits(p, prog.ops)
    by_site = p.schedule.by_site()  # type: ignore[union-attr]
    for prog in p.schedule.programs:  # type: ignore[union-attr]
        for other in by_site[prog.site]:
            shared = {op.group for op in walk(prog.ops) if isinstance(op, Barrier)} & {
                op.group for op in walk(other.ops) if isinstance(op, Barrier)
            }
            if other.engine != prog.engine and shared:
                raise Unsupported(
                    f"a barrier of group {int(min(shared))} crossed by two engines of site {int(prog.site)}",
                    "its arrival count is the site's, kept by one engine",
                )
    if len(p.plans) > 1:
        raise Unsupported(f"a program with {len(p.plans)} plans", "the general form prints one block shape so far")
    for op in ops:
        if isinstance(op, Loop) and isinstance(op.count, Trip):
            t = p.tensor(op.count.tensor)
            if t.role != TensorRole.PARAMETER or t.dtype != DType.INT32:
                raise Unsupported(f"a loop count read from {t.name}", "trip counts are read from an int32 parameter")
            if not 0 <= op.count.index < t.elems[0] * t.elems[1]:
                raise Unsupported(
                    f"a loop count read from element {op.count.index} of {t.name}", "it has no such element"
                )
    if p.tile.rows != 16 or p.tile.cols != 16:
        raise Unsupported(f"tiles of {p.tile.rows}x{p.tile.cols}", "MMA fragments are 16x16; tile the program 16x16")
    for op in ops:
        if isinstance(op, Reserve | Push | Wait | Pop) and op.pages != 1:
            raise Unsupported(
                f"{type(op).__name__} of {op.pages} pages on {p.buffer(op.buf).name}",
                "a ring slot of the general form is one page with its own barriers",
            )
        if isinstance(op, Compute) and op.acc_reload is not None:
            raise Unsupported("an accumulator spill (acc_reload)", "accumulators never leave the registers")
        if isinstance(op, PackAcc) and op.accumulate:
            raise Unsupported("an accumulating PackAcc", "accumulator fragments are stored, never added to a page")


def check_waits(p: SpatialProgram, ops: tuple[ChoreoOp, ...]) -> None:
    """Refuse a Wait on a ring whose page the engine already holds (waited for, not yet popped), in program order.
    In the IR such a wait finds the page it holds and passes; the general form counts waits, so it would wait for
    the next page instead (and deadlock)."""
    held: dict[BufferId, int] = {}
    for op in walk(ops):
        if isinstance(op, Wait):
            if held.get(op.buf, 0):
                raise Unsupported(
                    f"a second Wait on {p.buffer(op.buf).name} while the engine holds its page",
                    "the general form waits for the next page at each Wait: pop the page before waiting again",
                )
            held[op.buf] = op.pages
        elif isinstance(op, Pop):
            held[op.buf] = max(0, held.get(op.buf, 0) - op.pages)


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


def epit_bytes(integer: bool) -> int:
    """Bytes of one value of an epilogue stage's ring (EPIT): long long in an integer program, float otherwise."""
    return 8 if integer else 4


def epilogue_rings(p: SpatialProgram, rings: Rings, integer: bool) -> Rings:
    """The rings an elementwise stage fills hold its values: int64 (EPIT) in an integer program, whose bias may
    leave int32, float32 in a float one — except a page a matmul reads, which holds its operands (`ring_table`)."""
    elementwise = {
        rings.template[b]
        for s in p.stages
        if isinstance(s.kind, ComputeStage) and not isinstance(s.kind.op, MatmulTiles)
        for b in s.outs
    }
    table = {
        r: dataclasses.replace(ring, c_type="EPIT", elem_bytes=epit_bytes(integer))
        if r in elementwise and ring.c_type == "ACCT"
        else ring
        for r, ring in rings.rings.items()
    }
    return dataclasses.replace(rings, rings=table)


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


def accumulator_of(op: ChoreoOp) -> BufferId | None:
    """The accumulator `op` zeroes, adds into, packs or lets go; None for an op that touches none."""
    match op:
        case AcquireAcc(buf) | ReleaseAcc(buf):
            return buf
        case PackAcc(acc=acc) | Compute(acc=acc):
            return acc
    return None


def accumulator_layers(p: SpatialProgram, target: SpatialTarget, plan: Plan) -> dict[int, Fragments]:
    """Each accumulator's fragments by template where the program has several (`GeneralKernel.layers`): the block
    and sub-blocks of the matmul whose Compute ops add into it, the compute warps split over that block as over the
    plan's — and {} where it has one."""
    served: dict[int, MatmulTiles] = {}
    accs: set[int] = set()
    for op in all_ops(p):
        acc = accumulator_of(op)
        if acc is None:
            continue
        t = int(p.buffer(acc).ring)
        accs.add(t)
        if isinstance(op, Compute) and isinstance(op.op, MatmulTiles):
            mm = served.setdefault(t, op.op)
            if (mm.block, mm.sub_blocks) != (op.op.block, op.op.sub_blocks):
                raise Unsupported(
                    f"accumulator {p.buffer(acc).name} added into by matmuls of two block shapes",
                    "an accumulator's fragments have its matmul's shape",
                )
    if len(accs) < 2:
        return {}
    layers = {}
    for t in sorted(accs):
        serves = served.get(t)
        shaped = dataclasses.replace(plan, block=serves.block, sub_blocks=serves.sub_blocks) if serves else plan
        layers[t] = fragments_of(shaped, target, f"accf_{t}", f"PERW_{t}")
    return layers


def fragments_of(plan: Plan, target: SpatialTarget, name: str = "accf", count: str = "PERW") -> Fragments:
    """The fragments of an accumulator of `plan`'s block: the compute warps laid over it, the tiles each holds."""
    grid = target.accumulator_lane_grid(plan.block.osh, plan.block.osw)
    return Fragments(plan, grid, fragments_per_warp(plan, target.accumulator_lanes, grid), name, count)


def held_tiles(plan: Plan, layers: dict[int, Fragments]) -> int:
    """Accumulator tiles the compute warps hold at once: every layer's, or the plan's item."""
    h, w = plan.item_tiles
    return sum(f.tiles for f in layers.values()) if layers else h * w


def make_kernel(p: SpatialProgram, target: SpatialTarget, fit: bool = True) -> GeneralKernel:
    """Check what the general form needs and lay out its block; `fit` False leaves the shared-memory check to a
    form that lays the block out again (the sm_90a form's fused output keeps fewer rings)."""
    refuse(p)
    plan = p.plans[0]
    types, integer, layers = checked_layers(p, epilogue.ELEMENTWISE_OPS)
    lanes = target.accumulator_lanes
    one = fragments_of(plan, target)  # the plan's block: the accumulator of a one-matmul program
    lane_grid, perw = one.lane_grid, one.perw
    accumulators = accumulator_layers(p, target, plan)
    rings = epilogue_rings(p, ring_table(p, types, ()), integer)
    classes, relative = site_classes(p, relative_sems=True)
    cluster = clusters(p, target)
    roles = roles_of(classes, lanes)
    prod, cons = _ring_ends(p, rings, roles)
    offsets, off, barrier_bytes = layout(rings.rings)
    threads = sum(r.threads for r in roles)
    if threads > 1024:
        raise TooBig(f"threads of one block of the general form on {target.name}", threads, 1024, "use fewer lanes")
    # The registers hold every accumulator tile at once; only their number matters, so they go in as one column.
    per_sm = target.resident_sites_per_unit(off, held_tiles(plan, accumulators), 1, (1, 1), threads // WARP)
    if per_sm == 0 and fit:
        raise TooBig(
            f"shared memory of one block of the general form on {target.name} (rings and their barriers)",
            off,
            target.smem_per_site_max,
            "choose a smaller block, fewer sub-blocks or shallower rings",
        )
    out = p.output_tensor()
    assert out is not None
    missing = [r for r in rings.rings if r not in prod or r not in cons]
    if missing:
        raise Unsupported(f"ring {rings.rings[missing[0]].name} without a producer and a consumer", "verify says why")
    return GeneralKernel(
        p,
        plan,
        types,
        C_TYPES[out.dtype],
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
        tuple(s.kind.op for _, chain in layers for s in chain),  # type: ignore[union-attr]
        classes,
        *sync_words(p),
        relative,
        cluster,
        relative_groups(p),
        accumulators,
    )


# ---- printing --------------------------------------------------------------------------------------------------


class EnginePrinter(HandoverPrinter, TilePrinter):
    """Prints one engine's program on its own warps: its ops in order, its loops as its own `for`s."""

    counts_sends = True  # each multicast ring's sends are counted (the receiver's page is the send's number)

    def __init__(self, k: GeneralKernel, role: Role, w: Writer):
        super().__init__(k.plan, k.rings, k.lane_grid, w, tid="etid", nthreads=str(role.threads))
        self.k = k
        self.role = role
        self.bar_id = 1 + k.roles.index(role)  # the engine's named barrier (0 is __syncthreads)
        self.fills: frozenset[int] = frozenset()  # rings the program being printed fills by cp.async
        self.after: ChoreoOp | None = None  # the op after the one being printed, in its own body (None: the last)

    def read_slot(self, r: int) -> str:
        return f"(pop_{r} % DEPTH_{r})"

    def full_wait(self, r: int) -> str:
        """The device function a Wait on ring `r`'s full barrier calls."""
        return "spatialc_mbar_wait"

    def load(self, pointer: str, element: str) -> str:
        """Page elements are read through SPATIALC_PAGE_LD, which the emulation's race check sees."""
        return f"SPATIALC_PAGE_LD({pointer})"

    def write_slot(self, r: int) -> str:
        return f"((rsv_{r} - 1) % DEPTH_{r})"

    def counters(self) -> None:
        """One counter per kept ring and op kind the engine uses, so that none is unused (a ring a fused store
        replaced has none)."""
        kinds = {Reserve: "rsv", Push: "psh", Wait: "wt", Pop: "pop"}
        used: dict[int, set[str]] = {}
        for op in self.role.walk():
            if isinstance(op, Reserve | Push | Wait | Pop) and not self.k.rings.is_fused(op.buf):
                used.setdefault(self.k.rings.template[op.buf], set()).add(kinds[type(op)])
        for r in sorted(used):
            names = [f"{n}_{r} = 0" for n in ("rsv", "psh", "wt", "pop") if n in used[r]]
            self.w.line(f"unsigned {', '.join(names)};")
        sent = {self.k.rings.template[op.buf] for op in self.role.walk() if isinstance(op, McastSend)}
        for r in sorted(sent) if self.counts_sends else ():
            self.w.line(f"unsigned snd_{r} = 0;  // pages of ring {r} multicast so far")
        for g in sorted({int(op.group) for op in self.role.walk() if isinstance(op, Barrier)}):
            self.w.line(f"int crossed_{g} = 0;  // this site's crossings of group {g}'s barrier (the first thread's)")

    def ops(self, ops: tuple[ChoreoOp, ...], env: dict[LoopVar, str]) -> None:
        before: ChoreoOp | None = None
        for i, op in enumerate(ops):
            self.after = ops[i + 1] if i + 1 < len(ops) else None
            if isinstance(op, SemSet):
                self.reset(op, before)
            else:
                with self.holding(self.layer(op)):
                    self.op(op, env)
            before = op

    def layer(self, op: ChoreoOp) -> Fragments | None:
        """The fragments of the accumulator `op` touches, where the compute warps hold several; else None."""
        acc = accumulator_of(op)
        return None if acc is None or not self.k.layers else self.k.layers[self.k.rings.template[acc]]

    def op(self, op: ChoreoOp, env: dict[LoopVar, str]) -> None:
        mark = marker(op)
        match op:
            case Loop(var, Trip() as trip, body):
                # Every thread of the engine reads the count itself: they all run the loop as often.
                v = loop_var_name(var)
                t = self.k.program.tensor(trip.tensor)
                error = f"spatialc_sync + {self.k.trip_error}"
                with self.w.block():
                    if trip.steps:  # the element follows the item: its tiled place worked out here
                        self.w.line(f"const int e_{v} = {addr_expr(TileAddr(trip.index, trip.steps), env)};")
                        at = self.element(t, f"e_{v}")
                        shown = f"{t.name}[{addr_text(TileAddr(trip.index, trip.steps))}]"
                    else:
                        row, col = divmod(trip.index, t.elems[1])
                        at = str(((row // 16) * t.tiles[1] + col // 16) * TILE_ELEMS + (row % 16) * 16 + col % 16)
                        shown = f"{t.name}[{trip.index}]"
                    if trip.per > 1:  # a row count: at most the rows it counts (`inputs.row_limits`)
                        limit = row_limits(self.k.program).get(t.name, trip.per * trip.bound)
                        read = f"t{int(trip.tensor)}[{at}], {trip.per}, {trip.bound}, {limit}, {error}"
                        self.w.line(f"const int trip_{v} = spatialc_trip_per({read});  // ceil({shown} / {trip.per})")
                    else:
                        read = f"t{int(trip.tensor)}[{at}], {trip.bound}, {error}"
                        self.w.line(f"const int trip_{v} = spatialc_trip({read});  // {shown}")
                    with self.w.block(f"for (int {v} = 0; {v} < trip_{v}; ++{v})", mark):
                        self.ops(body, env | {var: v})
            case Loop(var, count, body):
                v = loop_var_name(var)
                bound = "n_items" if var == LV_ITEM else str(count.n)  # type: ignore[union-attr]
                with self.w.block(f"for (int {v} = 0; {v} < {bound}; ++{v})", mark):
                    inner = env | {var: v}
                    if var == LV_ITEM:
                        self.item_header(f"ITEM_LIST[item_off + {v}]")
                        inner |= {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
                    self.ops(body, inner)
            case Reserve(buf):
                r = self.kept(buf).id
                self.w.line(
                    f"spatialc_mbar_wait(&empty_{r}[rsv_{r} % DEPTH_{r}], ((rsv_{r} / DEPTH_{r}) & 1) ^ 1); ++rsv_{r};",
                    mark,
                )
            case Push(buf):
                r = self.kept(buf).id
                # A page this engine's cp.asyncs fill is published when they land; any other (a multicast
                # receiver's, copied in by another site and waited for) at once.
                arrive = "spatialc_cp_async_arrive" if r in self.fills else "spatialc_mbar_arrive"
                self.w.line(f"{arrive}(&full_{r}[psh_{r} % DEPTH_{r}]); ++psh_{r};", mark)
            case Wait(buf):
                r = self.kept(buf).id
                wait = self.full_wait(r)
                self.w.line(f"{wait}(&full_{r}[wt_{r} % DEPTH_{r}], (wt_{r} / DEPTH_{r}) & 1); ++wt_{r};", mark)
            case Pop(buf):
                r = self.kept(buf).id
                self.w.line(f"spatialc_mbar_arrive(&empty_{r}[pop_{r} % DEPTH_{r}]); ++pop_{r};", mark)
            case WriteBarrier() | Flush():
                # Each thread's global writes are visible at device scope before any later signal of its engine.
                self.w.line("__threadfence();", mark)
            case _ if self.handover(op, mark):
                pass
            case _ if self.common(op, env, mark, "ordered by the ring barriers"):
                pass
            case Compute(op=AddPartial(), ins=(src,)):
                self.add_partial(self.kept(src), mark)
            case Compute(op=stage, ins=(src,), outs=(dst,)):
                self.elementwise(op, stage, self.kept(src), self.kept(dst), env, mark)
            case PackAcc(to=buf):
                self.pack(self.kept(buf), mark)
            case _:
                raise Unsupported(f"a {type(op).__name__} op", "the general form has no image for it yet")

    @staticmethod
    def element(t, flat: str) -> str:
        """Where element `flat` (row-major) of tensor `t` lies in its tiled buffer, as a C expression."""
        cols = t.elems[1]
        row, col = f"({flat} / {cols})", f"({flat} % {cols})"
        return f"(({row} / 16) * {t.tiles[1]} + {col} / 16) * {TILE_ELEMS} + ({row} % 16) * 16 + {col} % 16"

    def engine_sync(self) -> str:
        """The engine's threads meet (its named barrier)."""
        return f"spatialc_engine_sync({self.bar_id}, {self.role.threads});"

    def elementwise(self, op: Compute, stage, src: Ring, dst: Ring, env: dict[LoopVar, str], mark: str) -> None:
        """An epilogue stage page to page: each thread of the engine a strided share of the elements."""
        if not isinstance(stage, epilogue.ELEMENTWISE_OPS):
            raise Unsupported(f"a {compute_text(stage, self.k.program)} stage", "the general form has no image for it")
        n = src.page
        value = "long long" if self.k.integer else "float"
        bias = ""
        if isinstance(stage, Bias):
            at = addr_expr(stage.at, env)
            lead = f"{at} + " if at != "0" else ""
            bias = f"(long long)({lead}tl % {stage.width}) * {TILE_ELEMS} + el % 16"
        with self.w.block("", mark), self.w.block(f"for (int e = etid; e < {n}; e += {self.nthreads})"):
            if bias:
                self.w.line(f"const int tl = e / {TILE_ELEMS}, el = e % {TILE_ELEMS};")
            self.w.line(f"{value} v = SPATIALC_PAGE_LD(ring_{src.id} + {self.read_slot(src.id)} * PAGE_{src.id} + e);")
            self.w.line(epilogue.statement(stage, self.k.integer, bias))
            # A page a matmul reads holds operands: the value converted to their type (float32 rounded to nearest
            # even, `MmaTypes.to_operand`), as the interpreter rounds a computed operand page where a matmul reads it.
            value = f"{self.k.types.to_operand}(v)" if dst.c_type == "OPT" else "(EPIT)v"
            self.w.line(f"SPATIALC_PAGE_ST(ring_{dst.id} + {self.write_slot(dst.id)} * PAGE_{dst.id} + e, {value});")


def preamble(k: GeneralKernel) -> list[str]:
    p = k.program
    lines = [
        f"// {p.name}: the general CUDA form printed by spatialc from the spatial IR; each block is one site, each"
        " engine runs on warps of its own and the rings hand pages over through mbarriers."
    ]
    lines += [f"#include <{h}>" for h in INCLUDES]
    lines += ["", RING_MACROS, PAGE_MACROS, CHECK_MACRO, "", *inlined_lines("general_mbarrier.cuh"), ""]
    lines += [*tensor_core_lines(k.rings, k.types), ""]
    epit = "long long" if k.integer else "float"
    lines += [f"typedef {k.types.operand} OPT;", f"typedef {k.types.acc} ACCT;", f"typedef {k.out_type} OUT_T;"]
    lines += [f"typedef {epit} EPIT;"]
    if k.stages:
        lines += ["", *epilogue.helpers(k.stages).rstrip("\n").split("\n"), ""]
    lines += [f"#define NTHREAD {k.threads}", f"#define NWARP {k.lanes}"]
    lines += [f"#define {f.count} {f.perw}" for f in k.fragments]
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        lines += [f"#define DEPTH_{rid} {ring.depth}u", f"#define PAGE_{rid} {ring.page}"]
        lines += [f"#define FULL_COUNT_{rid} {k.full_count[rid]}", f"#define EMPTY_COUNT_{rid} {k.empty_count[rid]}"]
    lines += [f"#define SMEM_OFF_{name.upper()} {off}" for name, off in k.offsets.items()]
    lines.append(f"#define DYN_SMEM {k.dyn_bytes}")
    return lines + [""]


def kernel_text(k: GeneralKernel) -> str:
    """The kernel source (`kernel_cu`) of the general form."""
    w = Writer()
    for line in preamble(k):
        w.line(line)
    params = ", ".join(
        [f"{_param_head(k, t)}* __restrict__ t{int(t.id)}" for t in k.program.tensors]
        + ["const int* __restrict__ spatialc_work"]
        + (["int* __restrict__ spatialc_sync"] if k.sync else [])
    )
    class_table(k, w)
    # Multicast groups are thread-block clusters of `cluster` consecutive sites (the emulation runs each at once).
    dims = f" __cluster_dims__({k.cluster}, 1, 1)" if k.cluster > 1 else ""
    w.line(f'extern "C" __global__ __launch_bounds__(NTHREAD, {k.blocks_per_sm}){dims} void {KERNEL_NAME}({params})')
    with w.block():
        site_prologue(w)
        w.line("extern __shared__ __align__(32) char spatialc_dyn_smem[];")
        declare_rings(k, w)
        with w.block("if (tid == 0)"):
            init_barriers(k, w)
        w.line("__syncthreads();  // the barriers are initialised before any engine uses them")
        for i, role in enumerate(k.roles):
            last = role.first_warp + role.warps
            head = f"{'if' if i == 0 else 'else if'} (warp < {last})"
            with w.block(head, f"// {role.engine.value}: warps {role.first_warp}-{last - 1}"):
                _engine(k, role, w)
    if k.cluster > 1:
        w.line(f"SPATIALC_CLUSTER_KERNEL({KERNEL_NAME}, {k.cluster})")
    return w.text()


def class_table(k: GeneralKernel, w: Writer) -> None:
    """Where sites run different programs: each site's class (-1: no items, it returns at once)."""
    if len(k.classes) > 1:
        cls = {s: i for i, c in enumerate(k.classes) for s in c.sites}
        table = ", ".join(str(cls.get(s, -1)) for s in range(k.sites))
        w.line(f"__device__ const int spatialc_site_class[{k.sites}] = {{{table}}};")


def by_class(k: GeneralKernel, role: Role, w: Writer, body) -> None:
    """`body(ops)` for the one program every site runs on `role`, else for each class's under a test of the site's
    class."""
    if len(printed(role)) == 1:
        body(role.programs[0])
        return
    first = True
    for i, (c, ops) in enumerate(zip(k.classes, role.programs, strict=True)):
        if not ops:
            continue
        sites = ", ".join(map(str, c.sites))
        with w.block(f"{'if' if first else 'else if'} (spatialc_site_class[site] == {i})", f"// sites {sites}"):
            body(ops)
        first = False


def declare_rings(k: GeneralKernel, w: Writer) -> None:
    """Each ring's pages and its full and empty barriers, in the dynamic block at their offsets."""
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        w.line(
            f"SPATIALC_DYNAMIC_RING({ring.c_type}, ring_{rid}, spatialc_dyn_smem, SMEM_OFF_RING_{rid}, "
            f"DEPTH_{rid}, PAGE_{rid});"
        )
        for kind in ("full", "empty"):
            w.line(
                f"SPATIALC_DYNAMIC_RING(unsigned long long, {kind}_{rid}, spatialc_dyn_smem, "
                f"SMEM_OFF_{kind.upper()}_{rid}, DEPTH_{rid}, 1);"
            )


def init_barriers(k: GeneralKernel, w: Writer) -> None:
    """Every slot's barriers initialised with their arrival counts (by one thread)."""
    for rid in sorted(k.rings.rings):
        with w.block(f"for (unsigned s = 0; s < DEPTH_{rid}; ++s)"):
            w.line(f"spatialc_mbar_init(&full_{rid}[s], FULL_COUNT_{rid});")
            w.line(f"spatialc_mbar_init(&empty_{rid}[s], EMPTY_COUNT_{rid});")


def _param_type(k: GeneralKernel, t) -> str:
    return "OPT" if t.role == TensorRole.INPUT else C_TYPES[t.dtype]


def _param_head(k: GeneralKernel, t) -> str:
    """A tensor parameter's pointer type: the output and workspaces are written, the others read."""
    if t.role == TensorRole.OUTPUT:
        return "OUT_T"
    if t.role == TensorRole.WORKSPACE:
        return "ACCT"
    return "const " + _param_type(k, t)


def _engine(k: GeneralKernel, role: Role, w: Writer) -> None:
    """One engine's branch: its thread index, counters, accumulators, and its program — the site's class's, where
    sites run different programs."""
    w.line(f"const int etid = tid - {role.first_warp * WARP};")
    w.line("(void)etid;")
    printer = EnginePrinter(k, role, w)
    printer.workspace = frozenset(int(t.id) for t in k.program.tensors if t.role == TensorRole.WORKSPACE)
    printer.tensors = {int(t.id): t for t in k.program.tensors}
    printer.counters()
    if any(isinstance(op, AcquireAcc) for op in role.walk()):
        for f in k.fragments:
            w.line(f"spatialc_acc<ACCT> {f.name}[{f.count}];")
    by_class(k, role, w, lambda ops: _program(printer, ops))


def printed(role: Role) -> tuple[tuple[ChoreoOp, ...], ...]:
    """The programs the kernel prints for `role`: one, where every site class runs the engine alike (a multicast's
    compute and writer), else each class's."""
    return role.programs[:1] if len(set(role.programs)) == 1 else role.programs


def _program(printer: EnginePrinter, ops: tuple[ChoreoOp, ...]) -> None:
    """One engine program, its item's coordinates bound first when it has no ITEM loop (a site's only item)."""
    printer.fills = frozenset(printer.k.rings.template[op.into] for op in walk(ops) if isinstance(op, ReadTiles))
    env: dict[LoopVar, str] = {}
    if not any(isinstance(op, Loop) and op.var == LV_ITEM for op in walk(ops)):
        printer.item_header("ITEM_LIST[item_off]")
        env = {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
    printer.ops(ops, env)


def budget_of(k: GeneralKernel, target: SpatialTarget) -> Budget:
    ring_bytes = sum(aligned(r.bytes) for r in k.rings.rings.values())
    return Budget(
        ring_bytes,
        k.dyn_bytes > target.smem_static_max,
        True,
        k.dyn_bytes,
        0,
        target.registers_per_thread(k.acc_tiles),
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


def lower(program: SpatialProgram, target: SpatialTarget) -> CudaArtifact:
    """The general-form CUDA artifact of a verified program, or a typed error saying what it cannot print yet."""
    k = make_kernel(program, target)
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

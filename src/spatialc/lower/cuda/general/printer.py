"""The general form's printing: the engine printer — each engine's program on its own warps, its ring ops as waits
and arrivals on the slot's full and empty mbarriers (the counters, slots and parities `kernel.py` describes) — and
the kernel text around it: the preamble, the ring declarations and barrier initialisation, a branch per engine and
site class. What the form takes and lays out (`GeneralKernel`) is `kernel.py`'s; the sm_90a form's printer
(`sm90a/printer.py`) builds on this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....inputs import row_limits
from ....ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, LoopVar, loop_var_name
from ....ir.names import plain
from ....ir.nodes import TensorRole
from ....ir.ops import (
    AcquireAcc,
    AddPartial,
    Barrier,
    ChoreoOp,
    Compute,
    Dequant,
    Flush,
    Loop,
    MatmulTiles,
    McastSend,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    ScaleAcc,
    SemSet,
    Span,
    TileAddr,
    Trip,
    Wait,
    WriteBarrier,
    walk,
)
from ....ir.printer import addr_text
from ....numerics.blockscale import is_mx
from ....target import WARP
from ...census import marker
from ...errors import Unsupported
from ..common import epilogue
from ..common.barrier_ids import engine_barrier
from ..common.blockscale import mx_lines
from ..common.clusters import GeneralClusterPrinter, reset_image
from ..common.cols import ColPrinter
from ..common.cwriter import (
    CHECK_MACRO,
    PAGE_MACROS,
    RING_MACROS,
    STORE_MACRO,
    Writer,
    addr_expr,
    includes,
    inlined_lines,
    site_prologue,
    span_count,
)
from ..common.dequant import DequantPrinter, InRegisters, has_dequant, param_c_type, register_rings
from ..common.handover import HandoverPrinter
from ..common.maps import MapPrinter
from ..common.program import other_outputs
from ..common.registers import RegisterPrinter
from ..common.rings import TILE_ELEMS
from ..common.rows import RowPrinter
from ..common.tiles import Fragments, TilePrinter, tensor_core_lines

if TYPE_CHECKING:
    from .kernel import GeneralKernel, Role

KERNEL_NAME = "spatialc_general"


def accumulator_of(op: ChoreoOp) -> BufferId | None:
    """The accumulator `op` zeroes, adds into, packs or lets go; None for an op that touches none."""
    match op:
        case AcquireAcc(buf) | ReleaseAcc(buf):
            return buf
        case PackAcc(acc=acc) | Compute(acc=acc):
            return acc
    return None


class EnginePrinter(
    GeneralClusterPrinter,
    HandoverPrinter,
    RegisterPrinter,
    RowPrinter,
    ColPrinter,
    MapPrinter,
    DequantPrinter,
    TilePrinter,
):
    """Prints one engine's program on its own warps: its ops in order, its loops as its own `for`s."""

    counts_sends = True  # each multicast ring's sends are counted (the receiver's page is the send's number)

    def __init__(self, k: GeneralKernel, role: Role, w: Writer):
        super().__init__(k.plan, k.rings, k.lane_grid, w, tid="etid", nthreads=str(role.threads))
        self.k = k
        self.role = role
        self.bar_id = engine_barrier(k.roles.index(role))  # the engine's named barrier (`barrier_ids.py`)
        self.fills: frozenset[int] = frozenset()  # rings the program being printed fills by cp.async
        self.tail_item = False  # whether the program runs the site's last item apart (a split tail's)
        self.after: ChoreoOp | None = None  # the op after the one being printed, in its own body (None: the last)
        self.received: set[int] = set()  # rings whose page the engine waits for from its sender, not yet pushed
        # (TilePrinter.lean) — not where the recurrence's rings live in registers: there S's K steps unrolled take
        # fewer registers than rolled ones (ptxas, sm_90, (4, 4, 8): 246 against 255 and a spill)
        self.lean = k.rows is not None and k.accumulates and role.first_warp == 0 and not k.in_registers
        self.single: frozenset[int] = frozenset()  # rings counted by one counter (`cycles`), set by `counters`

    def read_slot(self, r: int) -> str:
        if r in self.single:
            return f"((n_{r} - 1) % DEPTH_{r})"
        return f"(pop_{r} % DEPTH_{r})"

    def full_wait(self, r: int) -> str:
        """The device function a Wait on ring `r`'s full barrier calls: at cluster scope for a multicast ring, whose
        page a peer may have written and published (clusters.py)."""
        if self.k.multicast is not None and r in self.k.multicast.rings:
            return "spatialc_mbar_wait_cluster"
        return "spatialc_mbar_wait"

    def load(self, pointer: str, element: str) -> str:
        """Page elements are read through SPATIALC_PAGE_LD, which the emulation's race check sees."""
        return f"SPATIALC_PAGE_LD({pointer})"

    def write_slot(self, r: int) -> str:
        if r in self.single:
            return f"((n_{r} - 1) % DEPTH_{r})"
        return f"((rsv_{r} - 1) % DEPTH_{r})"

    def counters(self) -> None:
        """One counter per kept ring and op kind the engine uses, so that none is unused (a ring a fused store
        replaced has none)."""
        kinds = {Reserve: "rsv", Push: "psh", Wait: "wt", Pop: "pop"}
        used: dict[int, set[str]] = {}
        in_registers = self.register_rings(self.role.programs)  # a W4A16 operand page the register path does without
        for op in self.role.walk():
            kept = (
                not self.k.rings.is_fused(op.buf)
                and not self.k.rings.is_direct(op.buf)
                and not self.held(op.buf)
                and self.k.rings.template[op.buf] not in in_registers
                if isinstance(op, Reserve | Push | Wait | Pop)
                else False
            )
            if kept:
                used.setdefault(self.k.rings.template[op.buf], set()).add(kinds[type(op)])
        if self.lean:  # lean on registers (TilePrinter.lean): one counter for each ring the engine cycles alone
            self.single = frozenset(r for r in used if all(cycles(ops, r, self.k.rings) for ops in self.role.programs))
        for r in sorted(self.single):
            self.w.line(f"unsigned n_{r} = 0;  // ring {r}'s pages reserved, pushed, waited for and popped so far")
        for r in sorted(set(used) - self.single):
            names = [f"{n}_{r} = 0" for n in ("rsv", "psh", "wt", "pop") if n in used[r]]
            self.w.line(f"unsigned {', '.join(names)};")
        sent = {self.k.rings.template[op.buf] for op in self.role.walk() if isinstance(op, McastSend)}
        for r in sorted(sent) if self.counts_sends else ():
            self.w.line(f"unsigned snd_{r} = 0;  // pages of ring {r} multicast so far")
        for g in sorted({int(op.group) for op in self.role.walk() if isinstance(op, Barrier)}):
            self.w.line(f"int crossed_{g} = 0;  // this site's crossings of group {g}'s barrier (the first thread's)")

    def ops(self, ops: tuple[ChoreoOp, ...], env: dict[LoopVar, str]) -> None:
        before: ChoreoOp | None = None
        ops = self.fuse(ops, env)  # a W4A16 GEMM's dequant in registers (common/dequant.py)
        for i, op in enumerate(ops):
            self.after = ops[i + 1] if i + 1 < len(ops) else None
            if isinstance(op, InRegisters):
                self.elided(op)
            elif isinstance(op, SemSet):
                if not reset_image(self.k.multicast, op, self.w):
                    self.reset(op, before)
            else:
                with self.holding(self.layer(op)):
                    self.op(op, env)
            before = op
        self.after = None  # read only while an op of this body prints

    def layer(self, op: ChoreoOp) -> Fragments | None:
        """The fragments of the accumulator `op` touches, where the compute warps hold several; else None."""
        acc = accumulator_of(op)
        return None if acc is None else self.k.layers.get(self.k.rings.template[acc])

    def op(self, op: ChoreoOp, env: dict[LoopVar, str]) -> None:
        mark = marker(op)
        if self.register_op(op, env, mark):
            return
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
                        shown = f"{plain(t.name)}[{addr_text(TileAddr(trip.index, trip.steps))}]"
                    else:
                        row, col = divmod(trip.index, t.elems[1])
                        at = str(((row // 16) * t.tiles[1] + col // 16) * TILE_ELEMS + (row % 16) * 16 + col % 16)
                        shown = f"{plain(t.name)}[{trip.index}]"
                    if trip.per > 1:  # a row count: at most the rows it counts (`inputs.row_limits`)
                        limit = row_limits(self.k.program).get(t.name, trip.per * trip.bound)
                        read = f"t{int(trip.tensor)}[{at}], {trip.per}, {trip.bound}, {limit}, {error}"
                        self.w.line(f"const int trip_{v} = spatialc_trip_per({read});  // ceil({shown} / {trip.per})")
                    else:
                        read = f"t{int(trip.tensor)}[{at}], {trip.bound}, {error}"
                        self.w.line(f"const int trip_{v} = spatialc_trip({read});  // {shown}")
                    with self.w.block(f"for (int {v} = 0; {v} < trip_{v}; ++{v})", mark):
                        self.ops(body, env | {var: v})
            case Loop(var, Span() as span, body):
                # A count known per item (a causal band's KV blocks): every thread of the engine works it out.
                v = loop_var_name(var)
                with self.w.block():
                    for line in span_count(span, env, f"trip_{v}"):
                        self.w.line(line)
                    with self.w.block(f"for (int {v} = 0; {v} < trip_{v}; ++{v})", mark):
                        self.ops(body, env | {var: v})
            case Loop(var, count, body, first):
                v = loop_var_name(var)
                bound = "n_items" if var == LV_ITEM else str(count.n)  # type: ignore[union-attr]
                start = "0"
                if var == LV_ITEM and self.tail_item:  # a split tail's: the site's last item runs apart
                    start, bound = ("n_items - 1", "n_items") if first else ("0", "n_items - 1")
                with self.w.block(f"for (int {v} = {start}; {v} < {bound}; ++{v})", mark):
                    inner = env | {var: v}
                    if var == LV_ITEM:
                        self.item_header(f"ITEM_LIST[item_off + {v}]")
                        inner |= {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
                    self.ops(body, inner)
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) if self.kept(buf).id in self.single:
                self.cycled(op, self.kept(buf).id, mark)
            case Reserve(buf):
                r = self.kept(buf).id
                self.w.line(
                    f"spatialc_mbar_wait(&empty_{r}[rsv_{r} % DEPTH_{r}], ((rsv_{r} / DEPTH_{r}) & 1) ^ 1); ++rsv_{r};",
                    mark,
                )
            case Push(buf) if self.received_push(self.kept(buf).id, mark):
                pass
            case Push(buf):
                r = self.kept(buf).id
                # A page this engine's cp.asyncs fill is published when they land; any other (an epilogue stage's,
                # written by the engine's threads) at once.
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
            case _ if (
                self.cluster_handshake(op, mark)
                or self.handover(op, mark)
                or self.row_op(op, env, mark)
                or self.col_op(op, env, mark)
            ):
                pass
            case _ if self.common(op, env, mark, "ordered by the ring barriers"):
                pass
            case Compute(op=AddPartial(), ins=(src,)):
                self.add_partial(self.kept(src), mark)
            case Compute(op=ScaleAcc(), ins=(src,)):
                self.scale_acc(self.kept(src), mark)
            case Compute(op=Dequant() as dq, ins=(src,), outs=(dst,)):
                self.dequant(dq, self.kept(src), self.kept(dst), env, mark)
            case Compute(op=stage, ins=ins, outs=(dst,)) if ins:
                self.elementwise(op, stage, [self.kept(b) for b in ins], self.kept(dst), env, mark)
            case PackAcc(to=buf):
                self.pack(self.kept(buf), mark)
            case _:
                raise Unsupported(f"a {type(op).__name__} op", "the general form has no image for it yet")

    def cycled(self, op: ChoreoOp, r: int, mark: str) -> None:
        """A ring op of a ring this engine alone reserves, pushes, waits for and pops, a page at a time (`cycles`):
        one counter n, the page's slot (n − 1) mod depth once Reserve has counted it, the phases as elsewhere."""
        page = f"(n_{r} - 1) % DEPTH_{r}"
        match op:
            case Reserve():
                line = f"spatialc_mbar_wait(&empty_{r}[n_{r} % DEPTH_{r}], ((n_{r} / DEPTH_{r}) & 1) ^ 1); ++n_{r};"
            case Push():
                arrive = "spatialc_cp_async_arrive" if r in self.fills else "spatialc_mbar_arrive"
                line = f"{arrive}(&full_{r}[{page}]);"
            case Wait():
                line = f"{self.full_wait(r)}(&full_{r}[{page}], ((n_{r} - 1) / DEPTH_{r}) & 1);"
            case _:
                line = f"spatialc_mbar_arrive(&empty_{r}[{page}]);"
        self.w.line(line, mark)

    @staticmethod
    def element(t, flat: str) -> str:
        """Where element `flat` (row-major) of tensor `t` lies in its tiled buffer, as a C expression."""
        cols = t.elems[1]
        row, col = f"({flat} / {cols})", f"({flat} % {cols})"
        return f"(({row} / 16) * {t.tiles[1]} + {col} / 16) * {TILE_ELEMS} + ({row} % 16) * 16 + {col} % 16"

    def engine_sync(self) -> str:
        """The engine's threads meet (its named barrier)."""
        return f"spatialc_engine_sync({self.bar_id}, {self.role.threads});"


def cycles(ops: tuple[ChoreoOp, ...], r: int, rings) -> bool:
    """Whether `ops` take ring `r`'s pages through Reserve, Push, Wait and Pop, in that order, one page at a time, and
    every loop that touches the ring holds whole cycles: then the engine's four counters of the ring are always
    equal where it reads them (a page is pushed, waited for and popped before the next is reserved), and one does
    (`EnginePrinter.cycled`)."""
    order = (Reserve, Push, Wait, Pop)

    def run(body: tuple[ChoreoOp, ...]) -> int | None:
        state = 0
        for op in body:
            if isinstance(op, Loop):
                ring_ops = (o for o in walk(op.body) if isinstance(o, Reserve | Push | Wait | Pop))
                if any(rings.template[o.buf] == r for o in ring_ops) and (state != 0 or run(op.body) != 0):
                    return None
            elif isinstance(op, Reserve | Push | Wait | Pop) and rings.template[op.buf] == r:
                if not isinstance(op, order[state]) or op.pages != 1:
                    return None
                state = (state + 1) % 4
        return state

    return run(ops) == 0


def preamble(k: GeneralKernel) -> list[str]:
    p = k.program

    def float_page(buf) -> bool:
        ring = k.rings.rings.get(k.rings.template[buf])  # (none: a register ring, packed as a matmul reads it)
        return ring is not None and ring.c_type == "EPIT"

    lines = [
        f"// {plain(p.name)}: the general CUDA form printed by spatialc from the spatial IR; each block is one site,"
        " each engine runs on warps of its own and the rings hand pages over through mbarriers."
    ]
    lines += [f"#include <{h}>" for h in includes(k.types.operand)]
    lines += ["", RING_MACROS, PAGE_MACROS, STORE_MACRO, CHECK_MACRO, "", *inlined_lines("general/mbarrier.cuh"), ""]
    more_loads = any(  # a matmul reading float32 values (attention's P, rounded as loaded) or Bᵀ (its K)
        isinstance(op, Compute) and isinstance(op.op, MatmulTiles) and (op.op.transpose_b or float_page(op.ins[0]))
        for role in k.roles
        for op in role.walk()
    )
    # A map program's kernel multiplies nothing: no tensor-core layer, no accumulator type, no compute warps.
    lines += [*tensor_core_lines(k.rings, k.types, more_loads), ""] if k.accumulates else []
    # (after the tensor-core layer: its register path fills that layer's fragments)
    lines += [*inlined_lines("common/dequant.cuh"), ""] if has_dequant(p) or is_mx(p) else []
    lines += mx_lines(p)  # (an MX program's promotion: mx_promote.cuh)
    epit = "long long" if k.integer else "float"
    lines += [f"typedef {k.types.operand} OPT;"]
    lines += [f"typedef {k.types.acc} ACCT;"] if k.accumulates else []
    lines += [f"typedef {k.out_type} OUT_T;", f"typedef {epit} EPIT;"]
    if k.stages:
        lines += ["", *epilogue.helpers(k.integer).rstrip("\n").split("\n"), ""]
    lines += [f"#define NTHREAD {k.threads}"] + ([f"#define NWARP {k.lanes}"] if k.lanes else [])
    if k.rows is not None:  # each compute warp's rows of the band, one share of each a lane (rows.py)
        lines += [f"#define RROWS {k.rows.per_warp}"]
    if k.cols is not None:  # each compute thread's columns of the band, the whole value of each (cols.py)
        lines += [f"#define CCOLS {k.cols.per_thread}"]
    lines += [f"#define {f.count} {f.perw}" for f in k.fragments]
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        lines += [f"#define DEPTH_{rid} {ring.depth}u", f"#define PAGE_{rid} {ring.page}"]
        lines += [f"#define FULL_COUNT_{rid} {k.full_count[rid]}", f"#define EMPTY_COUNT_{rid} {k.empty_count[rid]}"]
    if k.multicast is not None:  # each multicast ring's ready barriers count its receivers
        lines += [f"#define READY_COUNT_{r} {n}u" for r, n in sorted(k.multicast.receivers.items())]
    lines += [f"#define SMEM_OFF_{name.upper()} {off}" for name, off in k.offsets.items()]
    lines.append(f"#define DYN_SMEM {k.dyn_bytes}")
    return lines + [""]


def kernel_params(k: GeneralKernel) -> list[str]:
    """The kernel's parameters (kernel-abi.md): its tensors, the work list, and its sync words where it has any —
    the general form's, and the sm_90a form's before its tensor maps."""
    return (
        [f"{_param_head(k, t)}* __restrict__ t{int(t.id)}" for t in k.program.tensors]
        + ["const int* __restrict__ spatialc_work"]
        + (["int* __restrict__ spatialc_sync"] if k.sync else [])
    )


def kernel_text(k: GeneralKernel) -> str:
    """The kernel source (`kernel_cu`) of the general form."""
    w = Writer()
    for line in preamble(k):
        w.line(line)
    params = ", ".join(kernel_params(k))
    class_table(k, w)
    # Multicast groups are thread-block clusters of `cluster` consecutive sites (the emulation runs each at once).
    dims = f" __cluster_dims__({k.cluster}, 1, 1)" if k.cluster > 1 else ""
    w.line(f'extern "C" __global__ __launch_bounds__(NTHREAD, {k.blocks_per_sm}){dims} void {KERNEL_NAME}({params})')
    with w.block():
        site_prologue(w, k.cluster)
        w.line("extern __shared__ __align__(32) char spatialc_dyn_smem[];")
        declare_rings(k, w)
        mc = k.multicast.rings if k.multicast is not None else ()
        for r in mc:
            ready = f"ready_{r}, spatialc_dyn_smem, SMEM_OFF_READY_{r}, DEPTH_{r}, 1"
            w.line(f"SPATIALC_DYNAMIC_RING(unsigned long long, {ready});")
        with w.block("if (tid == 0)"):
            init_barriers(k, w)
            for r in mc:
                with w.block(f"for (unsigned s = 0; s < DEPTH_{r}; ++s)", "// a stage free in every receiver"):
                    w.line(f"spatialc_mbar_init(&ready_{r}[s], READY_COUNT_{r});")
            if mc:
                w.line("spatialc_fence_barrier_init();  // visible to the cluster's other blocks")
        w.line("__syncthreads();  // the barriers are initialised before any engine uses them")
        if mc:
            w.line("spatialc_cluster_sync();  // and before a peer block arrives on them or copies into this one")
        for i, role in enumerate(k.roles):
            last = role.first_warp + role.warps
            head = f"{'if' if i == 0 else 'else if'} (warp < {last})"
            with w.block(head, f"// {role.engine.value}: warps {role.first_warp}-{last - 1}"):
                _engine(k, role, w)
        if mc:
            # Every page a peer copied into this block was waited for, and every arrival this block made on a
            # peer's barrier was waited for there; CUDA still asks that no block of a cluster exits while a peer may
            # use its shared memory, which this barrier makes true whatever the schedule.
            w.line("spatialc_cluster_sync();  // no block leaves while its peers may still reach its shared memory")
    if k.cluster > 1:
        w.line(f"SPATIALC_CLUSTER_KERNEL({KERNEL_NAME}, {k.cluster})")
    return w.text()


def class_table(k: GeneralKernel, w: Writer) -> None:
    """Where sites run different programs: each site's class (-1: no items, it returns at once)."""
    if len(k.classes) > 1:
        cls = {s: i for i, c in enumerate(k.classes) for s in c.sites}
        table = ", ".join(str(cls.get(s, -1)) for s in range(k.sites))
        w.line(f"__device__ const int spatialc_site_class[{k.sites}] = {{{table}}};")


def by_class(k: GeneralKernel, role: Role, w: Writer, body, indexed: bool = False) -> None:
    """`body(ops)` for the one program every site runs on `role`, else for each class's under a test of the site's
    class — `body(ops, i)` with the class's index where `indexed` (None for the one program)."""
    if len(printed(role)) == 1:
        body(role.programs[0], None) if indexed else body(role.programs[0])
        return
    first = True
    for i, (c, ops) in enumerate(zip(k.classes, role.programs, strict=True)):
        if not ops:
            continue
        sites = ", ".join(map(str, c.sites))
        with w.block(f"{'if' if first else 'else if'} (spatialc_site_class[site] == {i})", f"// sites {sites}"):
            body(ops, i) if indexed else body(ops)
        first = False


def declare_rings(k: GeneralKernel, w: Writer) -> None:
    """Each ring's pages and its full and empty barriers, in the dynamic block at their offsets."""
    unused = register_rings(k, (ops for role in k.roles for ops in role.programs))
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        if rid in unused:
            w.line(f"// ring_{rid}: a W4A16 operand page the register path never writes (common/dequant.py)")
        else:
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
    return param_c_type(t, "OPT")


def _param_head(k: GeneralKernel, t) -> str:
    """A tensor parameter's pointer type: the output and workspaces are written, the others read."""
    if t.role == TensorRole.OUTPUT:
        return other_outputs(k.program, k.out_type).get(int(t.id), "OUT_T")
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
    printer.out_types = other_outputs(k.program, k.out_type)
    printer.counters()
    if any(isinstance(op, AcquireAcc) for op in role.walk()):
        for f in k.fragments:
            w.line(f"spatialc_acc<ACCT> {f.name}[{f.count}];")
        for t in sorted(k.rows.reductions if k.rows is not None else ()):
            w.line(f"float racc_{t}[RROWS];  // the lane's share of each of the warp's rows")
        for t in sorted(k.cols.reductions if k.cols is not None else ()):
            w.line(f"float cacc_{t}[CCOLS];  // the thread's columns of the band")
        printer.declare_registers()
    by_class(k, role, w, lambda ops: _program(printer, ops))


def printed(role: Role) -> tuple[tuple[ChoreoOp, ...], ...]:
    """The programs the kernel prints for `role`: one, where every site class runs the engine alike (a multicast's
    compute and writer), else each class's."""
    return role.programs[:1] if len(set(role.programs)) == 1 else role.programs


def _program(printer: EnginePrinter, ops: tuple[ChoreoOp, ...]) -> None:
    """One engine program, its item's coordinates bound first when it has no ITEM loop (a site's only item)."""
    printer.fills = frozenset(printer.k.rings.template[op.into] for op in walk(ops) if isinstance(op, ReadTiles))
    env: dict[LoopVar, str] = {}
    printer.tail_item = any(isinstance(op, Loop) and op.var == LV_ITEM and op.first for op in ops)
    if not any(isinstance(op, Loop) and op.var == LV_ITEM for op in walk(ops)):
        printer.item_header("ITEM_LIST[item_off]")
        env = {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
    printer.ops(ops, env)

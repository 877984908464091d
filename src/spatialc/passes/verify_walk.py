"""verify's view of a program: name lookups, located messages, and one walk per distinct engine program.

The walk checks rule 1 for every op it meets (ids resolve, counts and pages are sane, loop variables are bound)
and records what the other rules need: each buffer use with its side (produce / consume / accumulator) and its
enclosing loops, each tile access, the pages each loop's body moves per iteration, and the engine's own pairing of
Reserve with Push and Wait with Pop. Sites share op tuples, so facts are computed once per distinct program.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from ..errors import IllFormedError
from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, GroupId, SemId, Site, TensorId, loop_var_name
from ..ir.nodes import Accumulator, Buffer, EngineProgram, Group, Semaphore, SpatialProgram, Tensor, TensorRole
from ..ir.ops import (
    AcquireAcc,
    Barrier,
    Bias,
    ChoreoOp,
    Compute,
    Const,
    Flush,
    Loop,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    TileAddr,
    Trip,
    Wait,
    WriteBarrier,
    WriteTiles,
)
from ..ir.printer import op_text
from .verify_tables import compute_fault, role_text


class Side(StrEnum):
    """Which end of a buffer an op works: a ring's producer or consumer end, or an accumulator."""

    PRODUCE = "produce"
    CONSUME = "consume"
    ACC = "accumulator"


@dataclass(frozen=True, slots=True)
class Ctx:
    """Lookups of one program, built once rule 1 has shown its ids unique."""

    p: SpatialProgram
    buffers: dict[BufferId, Buffer]
    tensors: dict[TensorId, Tensor]
    sems: dict[SemId, Semaphore]
    groups: dict[GroupId, Group]
    sites: frozenset[Site]

    @staticmethod
    def of(p: SpatialProgram) -> Ctx:
        """The lookups of `p`."""
        placement = p.placement
        return Ctx(
            p,
            {b.id: b for b in p.buffers},
            {t.id: t for t in p.tensors},
            {s.id: s for s in p.semaphores},
            {g.id: g for g in placement.groups} if placement else {},
            frozenset(placement.sites) if placement else frozenset(),
        )

    def name(self, bid: BufferId) -> str:
        """A buffer's name (its ring's name is the template's)."""
        b = self.buffers.get(bid)
        return b.name if b is not None else f"buffer {int(bid)}"

    def ring(self, bid: BufferId) -> BufferId:
        """The ring a buffer belongs to (its template)."""
        return self.buffers[bid].ring

    def depth(self, ring: BufferId) -> int:
        """Pages of a ring (0 for an accumulator)."""
        kind = self.buffers[ring].kind
        return 0 if isinstance(kind, Accumulator) else kind.depth_pages

    def page_tiles(self, bid: BufferId) -> int:
        """Tiles in one page of a ring, or in an accumulator."""
        kind = self.buffers[bid].kind
        return kind.tiles if isinstance(kind, Accumulator) else kind.page_tiles

    def op(self, op: ChoreoOp) -> str:
        """One op as text, even when an id in it does not resolve."""
        try:
            return op_text(self.p, op)
        except KeyError:
            return repr(op)


def where(site: Site | int, engine: str) -> str:
    """'site 3 compute', the head of every located message."""
    return f"site {int(site)} {engine}"


@dataclass(frozen=True, slots=True)
class Frame:
    """A loop around an op: its key (the path of (var, count, ordinal) from the program's root), its trips."""

    op: Loop
    key: tuple[tuple[object, ...], ...]
    n: int
    trip: Trip | None


@dataclass(frozen=True, slots=True)
class Use:
    """One buffer named by one op. `flow` is the op's pages for Reserve/Push/Wait/Pop, else 0."""

    op: ChoreoOp
    buf: BufferId
    side: Side
    flow: int
    loops: tuple[Frame, ...]


@dataclass(frozen=True, slots=True)
class BiasRead:
    """The bias row a `Compute(Bias)` reads, shaped as a block read so rule 5 checks it like any other: one row of
    `width` tiles of the bias tensor at `at`, into the page of the stage's input ring."""

    source: Compute
    tensor: TensorId
    at: TileAddr
    block_h: int
    block_w: int
    stride_h: int
    stride_w: int
    into: BufferId


@dataclass(frozen=True, slots=True)
class Access:
    """One ReadTiles / WriteTiles (or a bias read) and the loops around it."""

    op: ReadTiles | WriteTiles | BiasRead
    loops: tuple[Frame, ...]


@dataclass(frozen=True, slots=True)
class Fault:
    """An engine's own Reserve/Push or Wait/Pop mismatch (rule 3), found by `pairing`."""

    op: ChoreoOp
    buf: BufferId
    message: str


@dataclass
class Facts:
    """What one engine program does, for every rule after the first."""

    uses: list[Use] = field(default_factory=list)
    accesses: list[Access] = field(default_factory=list)
    per_iter: dict[tuple[tuple[object, ...], ...], dict[BufferId, list[int]]] = field(default_factory=dict)
    totals: dict[BufferId, list[int]] = field(default_factory=dict)  # ring → [pushed, popped], at Trip bounds
    item_loops: list[tuple[Loop, int]] = field(default_factory=list)
    item_free: list[ChoreoOp] = field(default_factory=list)  # item_y / item_x outside any ITEM loop
    sem_targets: set[Site] = field(default_factory=set)
    groups: set[GroupId] = field(default_factory=set)
    sets: list[ChoreoOp] = field(default_factory=list)  # ops that can lower a semaphore
    trip_counted: list[ChoreoOp] = field(default_factory=list)  # SemInc / Barrier inside a Trip loop
    fault: Fault | None = None


class _Walk:
    """One pass over one engine program: rule 1 on each op, the facts for the rest."""

    def __init__(self, ctx: Ctx, prog: EngineProgram):
        self.ctx, self.prog, self.facts = ctx, prog, Facts()

    def fail(self, op: ChoreoOp, why: str, buf: BufferId | None = None) -> IllFormedError:
        at = where(self.prog.site, self.prog.engine.value)
        return IllFormedError(
            f"{at}: {self.ctx.op(op)} — {why}",
            site=int(self.prog.site),
            engine=self.prog.engine.value,
            op=self.ctx.op(op),
            buffer=None if buf is None else self.ctx.name(buf),
        )

    def body(self, ops: tuple[ChoreoOp, ...], loops: tuple[Frame, ...], mult: int) -> dict[BufferId, list[int]]:
        """Walk `ops`; the pages pushed and popped per ring by one run of them."""
        flow: dict[BufferId, list[int]] = {}
        seen: Counter[tuple[object, ...]] = Counter()
        for op in ops:
            if isinstance(op, Loop):
                frame = self.frame(op, loops, seen)
                inner = self.body(op.body, (*loops, frame), mult * frame.n)
                self.facts.per_iter[frame.key] = inner
                for ring, (pushed, popped) in inner.items():
                    acc = flow.setdefault(ring, [0, 0])
                    acc[0] += pushed * frame.n
                    acc[1] += popped * frame.n
            else:
                self.visit(op, loops, mult, flow)
        return flow

    def frame(self, op: Loop, loops: tuple[Frame, ...], seen: Counter[tuple[object, ...]]) -> Frame:
        """Rule 1 on a loop, and its frame; sibling loops with equal (var, count) are told apart by an ordinal."""
        if op.var in (LV_ITEM_Y, LV_ITEM_X):
            raise self.fail(op, f"{loop_var_name(op.var)} stands for the item's coordinate; no loop may bind it")
        if any(f.op.var == op.var for f in loops):
            raise self.fail(op, f"loop variable {loop_var_name(op.var)} is already bound by an enclosing loop")
        match op.count:
            case Const(n) if n < 0:
                raise self.fail(op, f"a loop count must be ≥ 0, not {n}")
            case Const(n):
                count, trip = n, None
            case Trip():
                self.check_trip(op, op.count)
                count, trip = op.count.bound, op.count
        if op.var == LV_ITEM and isinstance(op.count, Const):
            self.facts.item_loops.append((op, count))
        label = (op.var, op.count)
        seen[label] += 1
        return Frame(op, (*(loops[-1].key if loops else ()), (*label, seen[label])), count, trip)

    def check_trip(self, op: Loop, trip: Trip) -> None:
        t = self.ctx.tensors.get(trip.tensor)
        if t is None:
            raise self.fail(op, f"its trip count reads tensor {int(trip.tensor)}, which does not exist")
        if t.role != TensorRole.PARAMETER:
            raise self.fail(
                op, f"its trip count reads {t.name}, an {t.role.value} tensor; trip counts come from a parameter tensor"
            )
        if not 0 <= trip.index < t.elems[0] * t.elems[1]:
            raise self.fail(
                op, f"its trip count reads element {trip.index} of {t.name}, which has {t.elems[0] * t.elems[1]}"
            )
        if trip.bound < 0:
            raise self.fail(op, f"a trip bound must be ≥ 0, not {trip.bound}")

    def buf(self, op: ChoreoOp, bid: BufferId) -> None:
        if bid not in self.ctx.buffers:
            raise self.fail(op, f"buffer {int(bid)} does not exist (the program has {len(self.ctx.buffers)})")

    def use(self, op: ChoreoOp, bid: BufferId, side: Side, loops: tuple[Frame, ...], flow: int = 0) -> None:
        self.buf(op, bid)
        self.facts.uses.append(Use(op, bid, side, flow, loops))

    def sem(self, op: ChoreoOp, sid: SemId) -> None:
        if sid not in self.ctx.sems:
            raise self.fail(op, f"semaphore {int(sid)} does not exist")

    def group(self, op: ChoreoOp, gid: GroupId) -> None:
        # Whether this site belongs to the group is checked per site: facts are shared by sites with equal ops.
        if gid not in self.ctx.groups:
            raise self.fail(op, f"group {int(gid)} does not exist")
        self.facts.groups.add(gid)

    def tensor(self, op: ChoreoOp, tid: TensorId) -> None:
        if tid not in self.ctx.tensors:
            raise self.fail(op, f"tensor {int(tid)} does not exist")

    def role(self, op: ReadTiles | WriteTiles) -> None:
        """A ReadTiles reads an input or a parameter tensor; a WriteTiles writes the output tensor."""
        self.tensor(op, op.tensor)
        t = self.ctx.tensors[op.tensor]
        if isinstance(op, ReadTiles) and t.role == TensorRole.OUTPUT:
            raise self.fail(
                op,
                f"it reads {t.name}, the output tensor, into {self.ctx.name(op.into)}; a read comes"
                " from an input or a parameter tensor",
                op.into,
            )
        if isinstance(op, WriteTiles) and t.role != TensorRole.OUTPUT:
            raise self.fail(
                op,
                f"it writes {self.ctx.name(op.src)} to {t.name}, {role_text(t)}; only the output tensor is written",
                op.src,
            )

    def addr(self, op: ReadTiles | WriteTiles, at: TileAddr, loops: tuple[Frame, ...]) -> None:
        """Every variable of an address is bound (item_y / item_x by the item); the block is not empty."""
        bound = {f.op.var for f in loops}
        for var, _ in at.steps:
            if var in (LV_ITEM_Y, LV_ITEM_X):
                if LV_ITEM not in bound:
                    self.facts.item_free.append(op)
            elif var not in bound:
                raise self.fail(op, f"its address uses {loop_var_name(var)}, which no enclosing loop binds")
        if op.block_h < 1 or op.block_w < 1:
            raise self.fail(op, f"a block must be at least 1x1 tiles, not {op.block_h}x{op.block_w}")
        self.facts.accesses.append(Access(op, loops))

    def flow(
        self,
        op: Reserve | Push | Wait | Pop,
        side: Side,
        loops: tuple[Frame, ...],
        mult: int,
        flow: dict[BufferId, list[int]],
    ) -> None:
        """A Reserve / Push / Wait / Pop: its use, and its pages in the body's flow and the program's totals."""
        if op.pages < 1:
            raise self.fail(op, f"an op moves at least 1 page, not {op.pages}", op.buf)
        self.use(op, op.buf, side, loops, op.pages)
        if isinstance(op, Push | Pop):
            slot = 0 if isinstance(op, Push) else 1
            ring = self.ctx.ring(op.buf)
            flow.setdefault(ring, [0, 0])[slot] += op.pages
            self.facts.totals.setdefault(ring, [0, 0])[slot] += op.pages * mult

    def visit(self, op: ChoreoOp, loops: tuple[Frame, ...], mult: int, flow: dict[BufferId, list[int]]) -> None:
        """One op that is not a loop."""
        match op:
            case Reserve() | Push():
                self.flow(op, Side.PRODUCE, loops, mult, flow)
            case Wait() | Pop():
                self.flow(op, Side.CONSUME, loops, mult, flow)
            case ReadTiles(at=at, into=into):
                self.role(op)
                self.use(op, into, Side.PRODUCE, loops)
                self.addr(op, at, loops)
            case WriteTiles(src=src, at=at):
                self.role(op)
                self.use(op, src, Side.CONSUME, loops)
                self.addr(op, at, loops)
            case AcquireAcc(buf) | ReleaseAcc(buf):
                self.use(op, buf, Side.ACC, loops)
            case Compute():
                self.compute(op, loops)
            case PackAcc(acc, to, tiles, _):
                if tiles < 1:
                    raise self.fail(op, f"a pack moves at least 1 tile, not {tiles}", to)
                self.use(op, acc, Side.ACC, loops)
                self.use(op, to, Side.PRODUCE, loops)
            case _:
                self.handshake(op, loops)

    def compute(self, op: Compute, loops: tuple[Frame, ...]) -> None:
        why = compute_fault(op.op, self.ctx.p.precision)
        if why is not None:
            raise self.fail(op, why)
        if isinstance(op.op, Bias):
            self.bias(op, op.op, loops)
        for b in op.ins:
            self.use(op, b, Side.CONSUME, loops)
        for b in op.outs:
            self.use(op, b, Side.PRODUCE, loops)
        if op.acc is not None:
            self.use(op, op.acc, Side.ACC, loops)
        if op.acc_reload is not None:
            self.buf(op, op.acc_reload)

    def bias(self, op: Compute, bias: Bias, loops: tuple[Frame, ...]) -> None:
        """A bias names a parameter row of one value per output column, and reads inside it (rule 5)."""
        self.tensor(op, bias.tensor)
        t = self.ctx.tensors[bias.tensor]
        out = next((x for x in self.ctx.tensors.values() if x.role == TensorRole.OUTPUT), None)
        if t.role != TensorRole.PARAMETER or t.elems[0] != 1 or (out is not None and t.elems[1] != out.elems[1]):
            want = f"1x{out.elems[1]}" if out is not None else "one row"
            raise self.fail(
                op,
                f"a bias is a parameter tensor of {want} values; {t.name} is a {t.role.value}"
                f" tensor of {t.elems[0]}x{t.elems[1]}",
            )
        if len(op.ins) != 1 or len(op.outs) != 1:
            raise self.fail(op, "an elementwise stage reads one ring and writes one")
        if bias.width < 1:
            raise self.fail(op, f"a bias row is at least 1 tile wide, not {bias.width}")
        view = BiasRead(op, bias.tensor, bias.at, 1, bias.width, 0, 1, op.ins[0])
        self.addr(view, bias.at, loops)  # type: ignore[arg-type]

    def handshake(self, op: ChoreoOp, loops: tuple[Frame, ...]) -> None:
        """Semaphores, multicast, barriers and the ordering points."""
        if isinstance(op, SemInc | Barrier) and any(f.trip is not None for f in loops):
            self.facts.trip_counted.append(op)
        match op:
            case SemSet(sem, _):
                self.sem(op, sem)
                self.facts.sets.append(op)
            case SemInc(sem, at, by):
                self.sem(op, sem)
                if at not in self.ctx.sites:
                    raise self.fail(op, f"site {int(at)} is not a site of the placement")
                self.facts.sem_targets.add(at)
                if by < 0:
                    self.facts.sets.append(op)
            case SemWait(sem, _):
                self.sem(op, sem)
            case McastSetValid(sem, group, _):
                self.sem(op, sem)
                self.group(op, group)
                self.facts.sets.append(op)
            case McastSend(buf, group):
                self.group(op, group)
                self.use(op, buf, Side.PRODUCE, loops)
            case Barrier(group):
                self.group(op, group)
            case Flush(buf):
                self.buf(op, buf)
            case ReadBarrier() | WriteBarrier():
                pass
            case _:
                raise self.fail(op, "not a choreography op")


def facts_of(ctx: Ctx, prog: EngineProgram) -> Facts:
    """Rule 1 on every op of `prog` (raises IllFormedError), then what it does, for the other rules."""
    walk = _Walk(ctx, prog)
    walk.body(prog.ops, (), 1)
    walk.facts.fault = pairing(ctx, prog.ops)
    return walk.facts


# ---- an engine's own pairing of Reserve with Push and Wait with Pop (rule 3) -----------------------------------
#
# `reserved` counts pages claimed and not yet pushed: Reserve claims the next pages (cumulative, as the lowering's
# slot counter steps), Push publishes claimed ones. `waited` counts front pages the engine knows are published:
# Wait(n) makes it at least n (the front n pages, not n more), Pop(n) frees n of them.


@dataclass
class _Held:
    reserved: int = 0
    waited: int = 0
    last: ChoreoOp | None = None  # the last Reserve, to name when pages are never pushed


class _Stop(Exception):
    def __init__(self, fault: Fault):
        self.fault = fault


def pairing(ctx: Ctx, ops: tuple[ChoreoOp, ...]) -> Fault | None:
    """The first op of `ops` that pushes unreserved pages, pops unwaited ones, or leaves a loop's ring changed."""
    state: dict[BufferId, _Held] = {}
    try:
        _pair(ctx, ops, state)
    except _Stop as stop:
        return stop.fault
    for ring, held in state.items():
        if held.reserved and held.last is not None:
            return Fault(held.last, ring, f"{held.reserved} reserved page(s) of {ctx.name(ring)} are never pushed")
    return None


def _pair(ctx: Ctx, ops: tuple[ChoreoOp, ...], state: dict[BufferId, _Held]) -> None:
    def held(bid: BufferId) -> _Held:
        return state.setdefault(ctx.ring(bid), _Held())

    def need(op: ChoreoOp, bid: BufferId, produce: bool) -> None:
        if isinstance(ctx.buffers[bid].kind, Accumulator):
            return  # rule 2's business
        h = held(bid)
        if produce and h.reserved < 1:
            raise _Stop(Fault(op, bid, f"fills a page of {ctx.name(bid)} it has not reserved"))
        if not produce and h.waited < 1:
            raise _Stop(Fault(op, bid, f"reads a page of {ctx.name(bid)} it has not waited for"))

    for op in ops:
        match op:
            case Reserve(buf, n):
                h = held(buf)
                h.reserved, h.last = h.reserved + n, op
            case Push(buf, n):
                h = held(buf)
                if h.reserved < n:
                    raise _Stop(Fault(op, buf, f"pushes {n} page(s) of {ctx.name(buf)} with {h.reserved} reserved"))
                h.reserved -= n
            case Wait(buf, n):
                h = held(buf)
                h.waited = max(h.waited, n)
            case Pop(buf, n):
                h = held(buf)
                if h.waited < n:
                    raise _Stop(Fault(op, buf, f"pops {n} page(s) of {ctx.name(buf)} with {h.waited} waited for"))
                h.waited -= n
            case ReadTiles(into=b) | PackAcc(to=b) | McastSend(buf=b):
                need(op, b, True)
            case WriteTiles(src=b):
                need(op, b, False)
            case Compute(ins=ins, outs=outs):
                for b in ins:
                    need(op, b, False)
                for b in outs:
                    need(op, b, True)
            case Loop():
                _pair_loop(ctx, op, state)


def _pair_loop(ctx: Ctx, loop: Loop, state: dict[BufferId, _Held]) -> None:
    """Run the body once from the entry state; a loop that runs more than once must restore every reservation.

    The waited marks only matter as a lower bound for the pops that follow, and the body is monotone in them (more
    known pages never invalidates a pop), so the body is rerun only while some mark shrinks — at most the sum of
    the entry marks times, since they are whole numbers.
    """
    count = loop.count.n if isinstance(loop.count, Const) else loop.count.bound
    if count == 0:
        _pair(ctx, loop.body, {r: _Held(h.reserved, h.waited, h.last) for r, h in state.items()})
        return
    entry = {r: (h.reserved, h.waited) for r, h in state.items()}
    _pair(ctx, loop.body, state)
    if count == 1:
        return
    for ring, h in state.items():
        before = entry.get(ring, (0, 0))[0]
        if h.reserved != before:
            raise _Stop(
                Fault(
                    loop,
                    ring,
                    f"each iteration leaves {h.reserved - before:+d} reserved page(s) of"
                    f" {ctx.name(ring)} unpushed; a loop body must leave each ring as it"
                    " found it",
                )
            )
    runs = 1
    marks = {r: entry.get(r, (0, 0))[1] for r in state}
    while runs < count and any(h.waited < marks.get(r, 0) for r, h in state.items()):
        marks = {r: h.waited for r, h in state.items()}
        _pair(ctx, loop.body, state)
        runs += 1

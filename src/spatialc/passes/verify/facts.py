"""What verify's rules after the first read of an engine program, gathered in one walk per distinct program.

The walk records each buffer use with its side (produce / consume / accumulator) and its enclosing loops, each tile
access, the pages each loop's body moves per iteration, the ITEM loops, and the handshakes. It runs after rule 1,
on well-formed programs only. Sites share op tuples, so facts are gathered once per distinct program; `Programs`
keeps the schedule's programs by site with their facts, and says which sites run the same ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, GroupId, ItemId, Site, TensorId
from ...ir.index import ProgramIndex
from ...ir.nodes import EngineProgram, SpatialProgram
from ...ir.ops import (
    AcquireAcc,
    Barrier,
    ChoreoOp,
    Compute,
    Const,
    Loop,
    Map,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    SemInc,
    Span,
    TileAddr,
    Trip,
    VecAxis,
    Wait,
    WriteTiles,
    cols,
)


class Side(StrEnum):
    """Which end of a buffer an op works: a ring's producer or consumer end, or an accumulator."""

    PRODUCE = "produce"
    CONSUME = "consume"
    ACC = "accumulator"


@dataclass(frozen=True, slots=True)
class Frame:
    """A loop around an op: its key (the path of (var, count, ordinal) from the program's root), its trips."""

    op: Loop
    key: tuple[tuple[object, ...], ...]
    n: int
    trip: Trip | Span | None  # a loop counted at run time or per item: followed at its bound


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
    """The row a column vector of a `Compute(Map)` reads (a bias), shaped as a block read so rule 6 checks it like any
    other: one row of `width` tiles of the vector's tensor at `at`, into the page of the stage's first input ring."""

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
    sets: list[ChoreoOp] = field(default_factory=list)  # ops that lower a semaphore by a negative raise
    trip_counted: list[ChoreoOp] = field(default_factory=list)  # SemInc / Barrier inside a Trip loop


class _Walk:
    """One pass over one well-formed engine program, gathering its facts."""

    def __init__(self, index: ProgramIndex):
        self.index, self.facts = index, Facts()

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
        """A loop's frame; sibling loops with equal (var, count) are told apart by an ordinal."""
        count, trip = (op.count.n, None) if isinstance(op.count, Const) else (op.count.bound, op.count)
        if op.var == LV_ITEM and isinstance(op.count, Const):
            self.facts.item_loops.append((op, count))
        label = (op.var, op.count)
        seen[label] += 1
        return Frame(op, (*(loops[-1].key if loops else ()), (*label, seen[label])), count, trip)

    def use(self, op: ChoreoOp, bid: BufferId, side: Side, loops: tuple[Frame, ...], flow: int = 0) -> None:
        self.facts.uses.append(Use(op, bid, side, flow, loops))

    def access(self, op: ReadTiles | WriteTiles | BiasRead, at: TileAddr, loops: tuple[Frame, ...]) -> None:
        if not any(f.op.var == LV_ITEM for f in loops) and any(v in (LV_ITEM_Y, LV_ITEM_X) for v, _ in at.steps):
            self.facts.item_free.append(op.source if isinstance(op, BiasRead) else op)
        self.facts.accesses.append(Access(op, loops))

    def visit(self, op: ChoreoOp, loops: tuple[Frame, ...], mult: int, flow: dict[BufferId, list[int]]) -> None:
        """One op that is not a loop."""
        match op:
            case Reserve(buf, n) | Push(buf, n):
                self.use(op, buf, Side.PRODUCE, loops, n)
            case Wait(buf, n) | Pop(buf, n):
                self.use(op, buf, Side.CONSUME, loops, n)
            case ReadTiles(at=at, into=into):
                self.use(op, into, Side.PRODUCE, loops)
                self.access(op, at, loops)
            case WriteTiles(src=src, at=at):
                self.use(op, src, Side.CONSUME, loops)
                self.access(op, at, loops)
            case AcquireAcc(buf) | ReleaseAcc(buf):
                self.use(op, buf, Side.ACC, loops)
            case Compute():
                self.compute(op, loops)
            case PackAcc(acc, to, _, _):
                self.use(op, acc, Side.ACC, loops)
                self.use(op, to, Side.PRODUCE, loops)
            case McastSend(buf, group):
                self.facts.groups.add(group)
                self.use(op, buf, Side.PRODUCE, loops)
            case _:
                self.handshake(op, loops)
        if isinstance(op, Push | Pop):
            slot = 0 if isinstance(op, Push) else 1
            ring = self.index.ring(op.buf)
            flow.setdefault(ring, [0, 0])[slot] += op.pages
            self.facts.totals.setdefault(ring, [0, 0])[slot] += op.pages * mult

    def compute(self, op: Compute, loops: tuple[Frame, ...]) -> None:
        if isinstance(op.op, Map):
            for c in cols(op.op.expr):
                if c.axis == VecAxis.ROW:  # a tile row of the vector for each page row: its one column of tiles
                    rows = self.page_rows(op, c.width)
                    self.access(BiasRead(op, c.tensor, c.at, rows, 1, 1, 0, op.ins[0]), c.at, loops)
                else:
                    self.access(BiasRead(op, c.tensor, c.at, 1, c.width, 0, 1, op.ins[0]), c.at, loops)
        for b in op.ins:
            self.use(op, b, Side.CONSUME, loops)
        for b in op.outs:
            self.use(op, b, Side.PRODUCE, loops)
        if op.acc is not None:
            self.use(op, op.acc, Side.ACC, loops)

    def page_rows(self, op: Compute, width: int) -> int:
        """The tile rows of the page `op` fills, in rows of `width` tiles (at least one: wellformed says the rest)."""
        try:
            tiles = self.index.page_tiles(op.outs[0]) if op.outs else 1
        except KeyError:
            tiles = 1
        return max(1, tiles // max(1, width))

    def handshake(self, op: ChoreoOp, loops: tuple[Frame, ...]) -> None:
        """Semaphores and barriers: who they join, and what the deadlock rule cannot decide."""
        if isinstance(op, SemInc | Barrier | McastSetValid) and any(f.trip is not None for f in loops):
            self.facts.trip_counted.append(op)
        match op:
            case SemInc(_, at, by):
                self.facts.sem_targets.add(at)
                if by < 0:
                    self.facts.sets.append(op)
            case McastSetValid(_, group, _):  # SemSet and McastSetValid: `handshake.epoch_copies` decides them
                self.facts.groups.add(group)
            case Barrier(group):
                self.facts.groups.add(group)


def facts_of(index: ProgramIndex, ops: tuple[ChoreoOp, ...]) -> Facts:
    """The facts of one well-formed engine program."""
    walk = _Walk(index)
    walk.body(ops, (), 1)
    return walk.facts


SiteProgs = Sequence[tuple[EngineProgram, Facts]]  # one site's engine programs with their facts


@dataclass(frozen=True, slots=True)
class Run:
    """One distinct engine program, its facts, and the sites that run it with their items."""

    prog: EngineProgram
    facts: Facts
    sites: tuple[tuple[Site, tuple[ItemId, ...]], ...]


class Programs:
    """The schedule's engine programs by site. Sites share op tuple objects, so each distinct tuple is numbered
    once — by identity where it can, since the (uncached, recursive) hash of a frozen op tree is costly — and its
    facts are gathered once."""

    def __init__(self, p: SpatialProgram) -> None:
        self.p = p
        self._by_id: dict[int, tuple[int, tuple[ChoreoOp, ...]]] = {}  # the tuple is kept so its id stays its own
        self._by_value: dict[tuple[ChoreoOp, ...], int] = {}
        self._facts: dict[int, Facts] = {}
        self.listed: dict[Site, list[EngineProgram]] = {}
        for prog in p.schedule.programs if p.schedule else ():
            self.listed.setdefault(prog.site, []).append(prog)
        self.keys: dict[Site, tuple[object, ...]] = {
            site: tuple((q.engine, self.number(q.ops)) for q in progs) for site, progs in self.listed.items()
        }
        self.by_site: dict[Site, SiteProgs] = {}

    def number(self, ops: tuple[ChoreoOp, ...]) -> int:
        """The number of `ops`' value."""
        hit = self._by_id.get(id(ops))
        if hit is None:
            hit = self._by_id[id(ops)] = (self._by_value.setdefault(ops, len(self._by_value)), ops)
        return hit[0]

    def distinct(self) -> list[EngineProgram]:
        """One program (the first listed) per distinct op tuple."""
        first: dict[int, EngineProgram] = {}
        for progs in self.listed.values():
            for q in progs:
                first.setdefault(self.number(q.ops), q)
        return list(first.values())

    def gather(self, index: ProgramIndex) -> None:
        """The facts of every program, walked once per distinct op tuple (after rule 1)."""
        for site, progs in self.listed.items():
            self.by_site[site] = [(q, self.facts(index, q)) for q in progs]

    def facts(self, index: ProgramIndex, prog: EngineProgram) -> Facts:
        n = self.number(prog.ops)
        if n not in self._facts:
            self._facts[n] = facts_of(index, prog.ops)
        return self._facts[n]

    def distinct_sites(self) -> list[tuple[Site, SiteProgs]]:
        """One site per distinct set of engine programs (the lowest-numbered), for the rules items do not affect."""
        seen: set[tuple[object, ...]] = set()
        out = []
        for site in sorted(self.by_site):
            if self.keys[site] not in seen:
                seen.add(self.keys[site])
                out.append((site, self.by_site[site]))
        return out

    def runs(self) -> list[Run]:
        """Each distinct engine program with the sites that run it and their items."""
        groups: dict[tuple[object, ...], tuple[EngineProgram, Facts, list[tuple[Site, tuple[ItemId, ...]]]]] = {}
        items = dict(self.p.placement.items_of_site) if self.p.placement else {}
        for site in sorted(self.by_site):
            for prog, facts in self.by_site[site]:
                entry = groups.setdefault((prog.engine, self.number(prog.ops)), (prog, facts, []))
                entry[2].append((site, items.get(site, ())))
        return [Run(prog, facts, tuple(sites)) for prog, facts, sites in groups.values()]

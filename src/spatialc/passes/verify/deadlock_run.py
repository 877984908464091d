"""verify's rule 7, the counter run: one run of a set of sites' engines on page, semaphore and arrival counters
(`Network`), the blocked engines it ends with, named. Why one run decides deadlock is verify/deadlock.py's.

Speed. Programs are compiled to flat instruction lists holding only the ops that touch a counter. The run then
skips whole periods of a loop, soundly: at each loop back-edge it records the whole state — every engine's
position and loop counters, every ring's held and published pages, every semaphore and arrival count — and when
the state at a back-edge equals one recorded earlier at the same back-edge except that some loop counters have
grown (each within one unchanged loop instance), the moves between the two are a function of that state alone (a
counter matters only where its loop tests for its end, and none ended in between), so they repeat exactly as long
as no grown counter reaches its loop's end. The run adds that many periods to the grown counters at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ...ir.ids import BufferId, GroupId, SemId, Site, loop_var_name
from ...ir.index import ProgramIndex, where
from ...ir.nodes import EngineProgram
from ...ir.ops import (
    Barrier,
    ChoreoOp,
    Const,
    Loop,
    McastSend,
    McastSetValid,
    Pop,
    Push,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    Wait,
)
from .handshake import Clocks

RESERVE, PUSH, WAIT, POP, LOOP, NEXT, SEMINC, SEMWAIT, BARRIER, EPOCHWAIT, MCSET, MCSEND = range(12)
# Instructions a run with clocks may take (it cannot skip periods) before it gives up.
MAX_CLOCKED_STEPS = 30_000_000
_SEEN_CAP = 1 << 14  # recorded back-edge states kept before the table is cleared (it only speeds the run up)
# Back-edges the run may record before it gives up: a program whose state never repeats (a count that grows each
# iteration past a threshold, barriers in a long loop) would otherwise take as long as running it.
MAX_RECORDED = 200_000


class _Unsettled(Exception):
    def __init__(self, recorded: int):
        self.recorded = recorded


Instr = tuple[int, int, int, tuple[int, ...]]


@dataclass(slots=True)
class _Engine:
    site: Site
    name: str
    code: list[Instr]
    src: list[ChoreoOp]  # the op each instruction came from
    pc: int = 0
    stack: list[list[int]] = field(default_factory=list)  # [head pc, counter, instance] per open loop
    pending: int = 0  # the arrival count a Barrier waits for, 0 when none


class Network:
    """The counters of one set of interacting sites, and one run of their engines."""

    def __init__(
        self,
        ctx: ProgramIndex,
        programs: Sequence[EngineProgram],
        fast_forward: bool = True,
        epochs: set[tuple[Site, SemId]] | frozenset = frozenset(),
    ):
        self.ctx, self.fast, self.epoch_copies = ctx, fast_forward, epochs
        self.rings: dict[tuple[Site, BufferId], int] = {}
        self.held: list[int] = []  # pages reserved and not yet popped
        self.ready: list[int] = []  # pages pushed and not yet popped
        self.depth: list[int] = []
        self.sem_slots: dict[tuple[Site, SemId], int] = {}
        self.sem: list[int] = []
        self.arrive_slots: dict[tuple[GroupId, Site], int] = {}
        self.arrived: list[int] = []
        self.seen: dict[tuple[object, ...], tuple[list[list[tuple[int, int]]], tuple[int, ...]]] = {}
        self.instances = 0
        self.skipped = 0  # loop iterations fast-forwarded (of any loop), for tests and curiosity
        self.steps = 0  # instructions run
        self.recorded = 0  # back-edges at which the state was recorded
        self.thresholds: dict[int, set[int]] = {}  # semaphore slot → the counts SemWaits wait for
        self.raisers: dict[int, list[_Engine]] = {}  # semaphore slot → the engines whose programs raise it
        self.receiving: set[int] = set()  # ring slots McastSends fill
        self.clocked = False  # whether the program has resets or multicast: then the run keeps vector clocks
        self.engines = [self._compile(p) for p in programs]
        self.clocks: Clocks | None = None
        if self.clocked:
            slots = {slot for key, slot in self.sem_slots.items() if key in epochs}
            self.clocks = Clocks(len(self.engines), slots, self.receiving, self._where)
            self.fast = False

    # ---- compiling ---------------------------------------------------------------------------------------------

    def _ring(self, site: Site, buf: BufferId) -> int:
        key = (site, self.ctx.ring(buf))
        if key not in self.rings:
            self.rings[key] = len(self.held)
            self.held.append(0)
            self.ready.append(0)
            self.depth.append(self.ctx.depth(key[1]))
        return self.rings[key]

    def _sem(self, site: Site, sem: SemId) -> int:
        if (site, sem) not in self.sem_slots:
            self.sem_slots[(site, sem)] = len(self.sem)
            self.sem.append(self.ctx.sems[sem].initial)
        return self.sem_slots[(site, sem)]

    def _arrive(self, group: GroupId, site: Site) -> int:
        if (group, site) not in self.arrive_slots:
            self.arrive_slots[(group, site)] = len(self.arrived)
            self.arrived.append(0)
        return self.arrive_slots[(group, site)]

    def _compile(self, prog: EngineProgram) -> _Engine:
        e = _Engine(prog.site, prog.engine.value, [], [])
        self._emit(e, prog.ops)
        return e

    def _emit(self, e: _Engine, ops: Sequence[ChoreoOp]) -> None:
        site = e.site
        for i, op in enumerate(ops):
            match op:
                case Reserve(buf, n) | Push(buf, n) | Wait(buf, n) | Pop(buf, n):
                    code = {Reserve: RESERVE, Push: PUSH, Wait: WAIT, Pop: POP}[type(op)]
                    self._put(e, op, (code, self._ring(site, buf), n, ()))
                case SemInc(sem, at, by):
                    slot = self._sem(at, sem)
                    self._raiser(slot, e)
                    self._put(e, op, (SEMINC, slot, by, ()))
                case SemWait(sem, value) if (site, sem) in self.epoch_copies:
                    self.clocked = True  # its reset, next, is what EPOCHWAIT does after passing
                    self._put(e, op, (EPOCHWAIT, self._sem(site, sem), value, ()))
                case SemSet(sem):
                    assert i and e.src[-1] == ops[i - 1], "handshake.epoch_copies admits only resets after a wait"
                case SemWait(sem, value):
                    slot = self._sem(site, sem)
                    self.thresholds.setdefault(slot, set()).add(value)
                    self._put(e, op, (SEMWAIT, slot, value, ()))
                case McastSetValid(sem, group, _):
                    self.clocked = True
                    slots = tuple(self._sem(s, sem) for s in self.ctx.groups[group].sites)
                    for slot in slots:
                        self._raiser(slot, e)
                    self._put(e, op, (MCSET, 0, 0, slots))
                case McastSend(buf, group):
                    self.clocked = True
                    rings = tuple(self._ring(s, buf) for s in self.ctx.groups[group].sites if s != site)
                    self.receiving.update(rings)
                    self._put(e, op, (MCSEND, 0, 0, rings))
                case Barrier(group):
                    others = tuple(self._arrive(group, s) for s in self.ctx.groups[group].sites)
                    self._put(e, op, (BARRIER, self._arrive(group, site), 0, others))
                case Loop(_, count, body):
                    n = count.n if isinstance(count, Const) else count.bound
                    head = len(e.code)
                    self._put(e, op, (LOOP, n, 0, ()))
                    self._emit(e, body)
                    if len(e.code) == head + 1:  # nothing in it touches a counter
                        e.code.pop()
                        e.src.pop()
                        continue
                    self._put(e, op, (NEXT, head, n, ()))
                    e.code[head] = (LOOP, n, len(e.code), ())

    def _raiser(self, slot: int, e: _Engine) -> None:
        """Engine e's program raises semaphore `slot` (named when a wait on it deadlocks)."""
        if not any(r is e for r in self.raisers.setdefault(slot, [])):
            self.raisers[slot].append(e)

    @staticmethod
    def _put(e: _Engine, op: ChoreoOp, instr: Instr) -> None:
        e.code.append(instr)
        e.src.append(op)

    # ---- running -----------------------------------------------------------------------------------------------

    def run(self) -> list[_Engine]:
        """Run every engine until all are done or none can move; the engines left blocked (empty: no deadlock)."""
        moved = True
        while moved:
            moved = False
            for index, e in enumerate(self.engines):
                if e.pc < len(e.code) and self._advance(index, e):
                    moved = True
        blocked = [e for e in self.engines if e.pc < len(e.code)]
        if self.clocks is not None and not blocked:
            self.clocks.finish()
        return blocked

    def _advance(self, index: int, e: _Engine) -> bool:
        """Run `e` until it blocks or ends; whether it moved at all. (One flat loop on purpose: it is the hot path;
        `clk`, the vector clocks, is there only for programs with resets or multicast.)"""
        code, held, ready, depth, sem, arrived = e.code, self.held, self.ready, self.depth, self.sem, self.arrived
        pc, stack, end, steps, clk = e.pc, e.stack, len(e.code), 0, self.clocks
        while pc < end:
            op, a, b, c = code[pc]
            if op == RESERVE:
                if held[a] + b > depth[a]:
                    break
                held[a] += b
                if clk is not None:
                    e.pc = pc
                    clk.reserve(index, a, b, depth[a])
            elif op == PUSH:
                ready[a] += b
                if clk is not None:
                    e.pc = pc
                    clk.push(index, a, b)
            elif op == WAIT:
                if ready[a] < b:
                    break
                if clk is not None:
                    clk.wait(index, a, b)
            elif op == POP:
                held[a] -= b
                ready[a] -= b
                if clk is not None:
                    clk.pop(index, a, b)
            elif op == LOOP:
                if a == 0:
                    pc, steps = b, steps + 1
                    continue
                self.instances += 1
                stack.append([pc, 0, self.instances])
            elif op == NEXT:
                top = stack[-1]
                top[1] += 1
                if top[1] < b:
                    pc = e.pc = a + 1
                    steps += 1
                    if self.fast:
                        self._fast_forward(index)
                    continue
                stack.pop()
            elif op == SEMINC:
                sem[a] += b
                if clk is not None:
                    clk.raised(index, pc, (a,), b)
            elif op == SEMWAIT:
                if sem[a] < b:
                    break
                if clk is not None:
                    clk.plain_wait(index)
            elif op == BARRIER:
                if not e.pending:
                    arrived[a] += 1
                    e.pending = arrived[a]
                    steps += 1  # an arrival is a move: it may free the others
                    if clk is not None:
                        clk.arrive(index, a)
                if any(arrived[s] < e.pending for s in c):
                    break
                if clk is not None:
                    clk.cross(index, c, e.pending)
                e.pending = 0
            elif op == EPOCHWAIT:
                if sem[a] < b:
                    break
                assert clk is not None
                clk.epoch_wait(index, pc, a, b, sem[a])
                sem[a] = 0
            elif op == MCSET:
                for slot in c:
                    sem[slot] += 1
                assert clk is not None
                clk.raised(index, pc, c)
            elif op == MCSEND:
                assert clk is not None
                e.pc = pc
                clk.send(index, c)
            pc += 1
            steps += 1
        e.pc = pc
        self.steps += steps
        if clk is not None and self.steps > MAX_CLOCKED_STEPS:
            raise _Unsettled(self.steps)
        return steps > 0

    def _where(self, index: int, pc: int | None) -> tuple[str, int, str, str]:
        """For the clocks' messages: (head, site, engine, op text) of engine `index`'s op at pc (None: where it is)."""
        e = self.engines[index]
        text = self.ctx.op(e.src[e.pc if pc is None else pc])
        return f"{where(e.site, e.name)}: {text}", int(e.site), e.name, text

    def _fast_forward(self, index: int) -> None:
        """At a back-edge of engine `index`: skip the periods that will repeat exactly (see the module docstring).

        Semaphore counts may grow from one period to the next like loop counters do: a SemWait compares a count
        with its threshold, and while every threshold on a growing count stays below the period's first value (it
        passes throughout) or above the last skipped period's (it blocks throughout), the periods repeat too."""
        self.recorded += 1
        if self.recorded > MAX_RECORDED:
            raise _Unsettled(self.recorded)
        engines = self.engines
        shape = (
            index,
            engines[index].pc,
            tuple(self.held),
            tuple(self.ready),
            tuple(self.arrived),
            tuple((e.pc, e.pending, tuple(f[0] for f in e.stack)) for e in engines),
        )
        now = ([[(f[1], f[2]) for f in e.stack] for e in engines], tuple(self.sem))
        before = self.seen.get(shape)
        if len(self.seen) >= _SEEN_CAP:
            self.seen.clear()
        self.seen[shape] = now
        if before is None:
            return
        grown: list[tuple[list[int], int]] = []
        periods = -1
        for e, old, new in zip(engines, before[0], now[0], strict=True):
            for frame, (c0, i0), (c1, i1) in zip(e.stack, old, new, strict=True):
                if c0 == c1:
                    continue  # untouched, or a fresh instance at the same count: it behaves the same
                if i0 != i1 or c1 < c0:
                    return
                left = (e.code[frame[0]][1] - 1 - c1) // (c1 - c0)
                periods = left if periods < 0 else min(periods, left)
                grown.append((frame, c1 - c0))
        sems = self._sem_periods(before[1], now[1])
        if sems is None:
            return
        periods = min(periods, sems)
        if periods <= 0:
            return
        for frame, step in grown:
            frame[1] += periods * step
            self.skipped += periods * step
        for slot, (c0, c1) in enumerate(zip(before[1], now[1], strict=True)):
            self.sem[slot] += periods * (c1 - c0)
        self.seen[shape] = ([[(f[1], f[2]) for f in e.stack] for e in engines], tuple(self.sem))

    def _sem_periods(self, old: tuple[int, ...], new: tuple[int, ...]) -> int | None:
        """How many more periods the semaphores allow (None: a count fell, or a threshold lies inside the period)."""
        periods = 1 << 62
        for slot, (c0, c1) in enumerate(zip(old, new, strict=True)):
            if c1 < c0:
                return None
            if c1 == c0:
                continue
            for v in self.thresholds.get(slot, ()):
                if c0 < v <= c1:
                    return None
                if v > c1:
                    periods = min(periods, (v - 1 - c1) // (c1 - c0))
        return periods

    # ---- reporting ---------------------------------------------------------------------------------------------

    def blocked_text(self, e: _Engine) -> str:
        """'site 0 writer [item 2]: Wait C_ring — 0 of 1 pages published'."""
        op, a, b, c = e.code[e.pc]
        loops = ", ".join(f"{loop_var_name(self._loop_var(e, f[0]))} {f[1]}" for f in e.stack)
        head = where(e.site, e.name) + (f" [{loops}]" if loops else "")
        text = self.ctx.op(e.src[e.pc])
        if op == RESERVE:
            why = f"needs {b} free page(s), but {self.held[a]} of {self.depth[a]} are held"
        elif op == WAIT:
            why = f"{self.ready[a]} of {b} page(s) published"
        elif op in (SEMWAIT, EPOCHWAIT):
            who = [
                where(r.site, r.name) + (" (finished)" if r.pc >= len(r.code) else "") for r in self.raisers.get(a, [])
            ]
            raised = f"raised only by {', '.join(who)}" if who else "no engine raises it"
            why = f"the count is {self.sem[a]}, it needs {b}; {raised}"
        else:
            late = [
                int(s) for (_, s), slot in self.arrive_slots.items() if slot in c and self.arrived[slot] < e.pending
            ]
            why = f"site(s) {', '.join(map(str, late))} have not arrived"
        return f"{head}: {text} — {why}"

    @staticmethod
    def _loop_var(e: _Engine, head: int):
        loop = e.src[head]
        assert isinstance(loop, Loop)
        return loop.var

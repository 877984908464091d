"""verify's rule 5, balance: each engine pairs its own Reserve with Push and Wait with Pop, a ring's producer and
consumer move equal pages in each iteration of loops they run in lockstep, and every ring ends empty.

An engine's own pairing is followed op by op: `reserved` counts pages claimed and not yet pushed (Reserve claims the
next pages, cumulatively, as the kernel's slot counter steps; Push publishes claimed ones), `waited` counts front
pages the engine knows are published (Wait(n) makes it at least n — the front n pages, not n more — and Pop(n) frees
n of them). A loop body must leave every reservation as it found it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import UnbalancedError
from ...ir.ids import BufferId, Site
from ...ir.ids import loop_var_name as _var
from ...ir.index import ProgramIndex, where
from ...ir.ops import (
    ChoreoOp,
    Compute,
    Const,
    Loop,
    McastSend,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    Reserve,
    Wait,
    WriteTiles,
    walk,
)
from .facts import Facts, Frame, Side, SiteProgs
from .ownership import Engines


@dataclass(frozen=True, slots=True)
class Fault:
    """An engine's own Reserve/Push or Wait/Pop mismatch, found by `pairing`."""

    op: ChoreoOp
    buf: BufferId
    message: str


def check_balance(ctx: ProgramIndex, site: Site, progs: SiteProgs, engines: Engines) -> None:
    """Rule 5: each engine pairs its own ops, co-iterating loops move equal pages, and every ring ends empty."""
    for prog, _ in progs:
        fault = pairing(ctx, prog.ops)
        if fault is not None:
            text, engine = ctx.op(fault.op), prog.engine.value
            raise UnbalancedError(
                f"{where(site, engine)}: {text} — {fault.message}",
                site=int(site),
                engine=engine,
                op=text,
                buffer=ctx.name(fault.buf),
            )
    by_engine = {prog.engine.value: facts for prog, facts in progs}
    rings = sorted({ring for (side, ring) in engines if side != Side.ACC})
    for ring in rings:
        producer, consumer = engines.get((Side.PRODUCE, ring)), engines.get((Side.CONSUME, ring))
        if producer is not None and consumer is not None and producer != consumer:
            _check_coiteration(ctx, site, ring, (producer, by_engine[producer]), (consumer, by_engine[consumer]))
    for ring in rings:
        pushed = sum(f.totals.get(ring, (0, 0))[0] for f in by_engine.values())
        popped = sum(f.totals.get(ring, (0, 0))[1] for f in by_engine.values())
        if pushed != popped:
            producer = engines.get((Side.PRODUCE, ring), "no engine")
            consumer = engines.get((Side.CONSUME, ring), "no engine")
            moves = tuple(
                (int(site), prog.engine.value, ctx.op(op))
                for prog, _ in progs
                for op in walk(prog.ops)
                if isinstance(op, Push | Pop) and ctx.ring(op.buf) == ring
            )
            raise UnbalancedError(
                f"site {int(site)}: {ctx.name(ring)} has {pushed} page(s) pushed (by {producer}) but"
                f" {popped} popped (by {consumer}); every ring must end empty",
                site=int(site),
                engine=producer,
                buffer=ctx.name(ring),
                related=moves,  # every push and pop of it: the user sees which loops they are in
            )


def _flow_loops(facts: Facts, ring: BufferId, side: Side, ctx: ProgramIndex) -> tuple[Frame, ...]:
    """The loops that enclose every Reserve/Push (or Wait/Pop) of `ring` in one program, outermost first."""
    chains = [u.loops for u in facts.uses if u.flow and u.side == side and ctx.ring(u.buf) == ring]
    if not chains:
        return ()
    common = chains[0]
    for chain in chains[1:]:
        n = 0
        while n < min(len(common), len(chain)) and common[n].key == chain[n].key:
            n += 1
        common = common[:n]
    return common


def _check_coiteration(
    ctx: ProgramIndex, site: Site, ring: BufferId, prod: tuple[str, Facts], cons: tuple[str, Facts]
) -> None:
    """Where a ring's producer and consumer both sit inside loops with the same key, those loops run in lockstep:
    the pages pushed by one iteration of the producer's must equal those popped by one of the consumer's."""
    outer = _flow_loops(prod[1], ring, Side.PRODUCE, ctx)
    inner_keys = {f.key for f in _flow_loops(cons[1], ring, Side.CONSUME, ctx)}
    for frame in reversed([f for f in outer if f.key in inner_keys]):
        pushed = prod[1].per_iter[frame.key].get(ring, [0, 0])[0]
        popped = cons[1].per_iter[frame.key].get(ring, [0, 0])[1]
        if pushed != popped:
            text = ctx.op(frame.op)
            theirs = [f for f in _flow_loops(cons[1], ring, Side.CONSUME, ctx) if f.key == frame.key]
            raise UnbalancedError(
                f"{where(site, prod[0])}: {text} — each iteration pushes {pushed} page(s) of"
                f" {ctx.name(ring)}, but each iteration of {cons[0]}'s co-iterating loop"
                f" {_var(frame.op.var)} pops {popped}",
                site=int(site),
                engine=prod[0],
                op=text,
                buffer=ctx.name(ring),
                related=tuple((int(site), cons[0], ctx.op(f.op)) for f in theirs),  # the consumer's loop
            )


@dataclass
class _Held:
    reserved: int = 0
    waited: int = 0
    last: ChoreoOp | None = None  # the last Reserve, to name when pages are never pushed


class _Stop(Exception):
    def __init__(self, fault: Fault):
        self.fault = fault


def pairing(ctx: ProgramIndex, ops: tuple[ChoreoOp, ...]) -> Fault | None:
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


def _pair(ctx: ProgramIndex, ops: tuple[ChoreoOp, ...], state: dict[BufferId, _Held]) -> None:
    def held(bid: BufferId) -> _Held:
        return state.setdefault(ctx.ring(bid), _Held())

    def need(op: ChoreoOp, bid: BufferId, produce: bool) -> None:
        if ctx.is_acc(bid):
            return  # rule 3's business
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


def _pair_loop(ctx: ProgramIndex, loop: Loop, state: dict[BufferId, _Held]) -> None:
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

"""verify's rule 7, deadlock: the program cannot deadlock — decided by running its choreography once, on page counters.

Why one run is a proof (DESIGN §2). Rule 3 has given every ring of a site one producer engine and one consumer
engine, each engine runs its ops in order, and only four ops can block: `Reserve` (room in a ring), `Wait` (pages
in a ring), `SemWait` (a semaphore count) and `Barrier` (the group's arrivals). Each of those conditions, once true,
stays true until the blocked engine itself acts: room is taken only by the ring's one producer and published pages
only by its one consumer, and semaphores and arrivals only count up. So an enabled engine is never disabled by
another — the network is a bounded Kahn process network, and the engines' moves commute. Any two complete
interleavings from the same state therefore reach the same state, and either every interleaving ends with all
engines done or every one ends with the same engines blocked. Running one interleaving, with static trip counts,
decides it. The ring depths are part of the state (a full ring blocks Reserve), which is how a program that only
deadlocks because a ring is one page too shallow is caught. Data plays no part: a page counter is all a ring is.

Resets. A semaphore its owner resets right after each wait (`SemWait s ≥ v; SemSet s = 0`) and `McastSetValid`
onto such a copy are counters with an epoch: counted from the start they only rise, as long as no raise comes
before the reset it belongs after. The run follows them as such and checks that condition with vector clocks, along
with the order of multicast pages (`handshake`). Such a run goes step by step (the clocks have no period to skip).

Limits. What one run cannot decide is refused with `StrongerCheckNeeded`, not guessed at:
- any other `SemSet`, a `McastSetValid` onto a copy waited on without resets, and a negative `SemInc` can lower a
  count, which breaks "once enabled, stays enabled": whether a `SemWait` passes then depends on the interleaving.
- `Trip` loops run at their `bound`. A ring whose producer and consumer are not both inside the same Trip loops
  would balance for some trip counts and not others, and a `SemInc` or `Barrier` inside a Trip loop raises a
  count that depends on the data, so such programs are refused. What is left is proved with every trip count at
  its bound; for the smaller counts the data may hold, the run is evidence, not proof.
`McastSend` moves data, not counters: the run checks only its order against the receivers' reserves and pushes
(`handshake`); what the page holds is rule 8's.

Sites that share no semaphore, multicast group or barrier are independent networks; each is simulated once per
distinct set of engine programs (sites share op tuples). Sites that interact are simulated together.

The run — programs compiled to flat lists of the ops that touch a counter, whole periods of a loop skipped where
the state repeats — is `deadlock_run.Network`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import StrongerCheckNeeded, VerifyDeadlockError
from ...ir.ids import BufferId, Site
from ...ir.index import ProgramIndex, where
from ...ir.nodes import EngineProgram
from ...ir.ops import Barrier, ChoreoOp, Loop, McastSend, McastSetValid, SemInc
from .deadlock_run import RESERVE, Network, _Engine, _Unsettled
from .facts import Facts, SiteProgs
from .handshake import epoch_copies
from .limits import MAX_RING_DEPTH


def check_decidable(ctx: ProgramIndex, site: Site, progs: SiteProgs) -> None:
    """Refuse what one counter run cannot decide: counts that can go down, rings balanced only by data."""
    for prog, facts in progs:
        if facts.sets:
            text, engine = ctx.op(facts.sets[0]), prog.engine.value
            raise StrongerCheckNeeded(
                f"{where(site, engine)}: {text} — this can lower a semaphore count, so whether a SemWait passes can"
                " depend on how the engines interleave and one counter run proves nothing; a stronger check (over"
                " every interleaving) is needed",
                site=int(site),
                engine=engine,
                op=text,
            )
        if facts.trip_counted:
            text, engine = ctx.op(facts.trip_counted[0]), prog.engine.value
            raise StrongerCheckNeeded(
                f"{where(site, engine)}: {text} — it runs inside a Trip loop, so the count it raises depends on the"
                " data; one counter run at the trip bounds cannot decide what waits on it",
                site=int(site),
                engine=engine,
                op=text,
            )
    trips: dict[BufferId, tuple[str, ChoreoOp, tuple[object, ...]]] = {}
    for prog, facts in progs:
        for use in facts.uses:
            if not use.flow:
                continue
            sig = tuple(f.key for f in use.loops if f.trip is not None)
            first = trips.setdefault(ctx.ring(use.buf), (prog.engine.value, use.op, sig))
            if first[2] != sig:
                text, engine = ctx.op(use.op), prog.engine.value
                raise StrongerCheckNeeded(
                    f"{where(site, engine)}: {text} — it is not inside the same loops counted at run time (Trip"
                    f" loops) as {first[0]}'s"
                    f" {ctx.op(first[1])}, so whether {ctx.name(use.buf)} balances depends on the data; one counter"
                    " run at the trip bounds cannot decide it",
                    site=int(site),
                    engine=engine,
                    op=text,
                    buffer=ctx.name(use.buf),
                )


def _components(sites: Sequence[Site], facts: dict[Site, list[Facts]], ctx: ProgramIndex) -> list[list[Site]]:
    """Sites joined by a semaphore increment, a multicast group or a barrier, as sorted groups."""
    parent = {s: s for s in sites}

    def find(s: Site) -> Site:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    def join(a: Site, b: Site) -> None:
        if a in parent and b in parent:
            parent[find(a)] = find(b)

    for s in sites:
        for f in facts[s]:
            for t in f.sem_targets:
                join(s, t)
            for g in f.groups:
                for t in ctx.groups[g].sites:
                    join(s, t)
    groups: dict[Site, list[Site]] = {}
    for s in sites:
        groups.setdefault(find(s), []).append(s)
    return sorted(groups.values())


def _relative(ctx: ProgramIndex, comp: list[Site], progs: list[EngineProgram]) -> tuple[object, ...]:
    """What a set of sites that hand over to each other runs, with every site it names given by its place in the
    set: two sets alike in this (split-K's items, each on its own sites) have the same run, so one is simulated."""
    pos = {s: i for i, s in enumerate(comp)}
    groups = ctx.groups

    def norm(ops: tuple[ChoreoOp, ...]) -> tuple[object, ...]:
        out: list[object] = []
        for op in ops:
            match op:
                case Loop(var, count, body):
                    out.append(("loop", var, count, norm(body)))
                case SemInc(sem, at, by):
                    out.append(("raise", sem, pos.get(at, ("outside", int(at))), by))
                case Barrier():
                    out.append(("site", int(comp[0]), op))  # a group names its sites: such sets are not merged
                case McastSend(buf, group) | McastSetValid(sem=buf, group=group):  # a group by its sites' places
                    value = op.value if isinstance(op, McastSetValid) else None
                    places = tuple(pos.get(s, ("outside", int(s))) for s in groups[group].sites)
                    out.append((type(op).__name__, buf, value, places))
                case _:
                    out.append(op)
        return tuple(out)

    return ("sites", len(comp), tuple((pos[p.site], p.engine, norm(p.ops)) for p in progs))


def check_deadlock(ctx: ProgramIndex, programs: dict[Site, SiteProgs], keys: dict[Site, tuple[object, ...]]) -> int:
    """Rule 7: simulate each independent set of sites once; raise VerifyDeadlockError naming each blocked engine.

    `keys` says which sites run the same programs. Returns the number of networks simulated."""
    sites = sorted(programs)
    facts = {s: [f for _, f in programs[s]] for s in sites}
    epochs = epoch_copies(ctx, (p for s in sites for p, _ in programs[s]))
    done: set[tuple[object, ...]] = set()
    runs = 0
    for comp in _components(sites, facts, ctx):
        progs = [p for s in comp for p, _ in programs[s]]
        key = keys[comp[0]] if len(comp) == 1 else _relative(ctx, comp, progs)
        if key in done:
            continue
        done.add(key)
        net = Network(ctx, progs, epochs=epochs)
        runs += 1
        try:
            blocked = net.run()
        except _Unsettled as stop:
            named = ", ".join(str(int(s)) for s in comp[:8])
            why = (
                f"its handshakes (resets or multicast) are followed step by step, and after {stop.recorded} steps the"
                " run is still going: the program is too long to decide in reasonable time (fewer items a site)"
                if net.clocks is not None
                else f"after {stop.recorded} loop iterations the counter run still finds no period that repeats (a"
                " count that keeps growing past what a SemWait waits for, or barriers in a long loop), so it cannot"
                " decide deadlock-freedom in reasonable time"
            )
            raise StrongerCheckNeeded(f"site(s) {named}: {why}", site=int(comp[0])) from None
        if blocked:
            others = sum(1 for s in sites if len(comp) == 1 and s not in comp and keys[s] == key)
            note = f" (and on {others} other site(s) with the same programs)" if others else ""
            fix = remedy(ctx, net, progs, epochs, blocked)
            raise VerifyDeadlockError(
                "deadlock: " + "; ".join(net.blocked_text(e) for e in blocked) + note + (fix[1] if fix else ""),
                tuple((int(e.site), e.name, ctx.op(e.src[e.pc])) for e in blocked),
                buffer=fix[0] if fix else None,
            )
    return runs


MAX_REMEDY_RUNS = 12  # counter runs spent looking for the depth that removes a deadlock: a doubling, then halving


def remedy(
    ctx: ProgramIndex, net: Network, progs: list[EngineProgram], epochs: set | frozenset, blocked: list[_Engine]
) -> tuple[str, str] | None:
    """(ring name, the sentence that says its fix) where one blocked engine waits on a full ring and that ring, on
    every site, deep enough lets the run finish: the least such depth, found by more counter runs (more pages never
    make a network of blocking rings deadlock, so the search may halve). None where no depth up to MAX_RING_DEPTH
    does (a page that never comes), or the search would take too long."""
    full = [e for e in blocked if e.code[e.pc][0] == RESERVE]
    if not full or net.clocks is not None:
        return None
    slot = full[0].code[full[0].pc][1]
    ring = next(buf for (_, buf), s in net.rings.items() if s == slot)
    have = ctx.depth(ring)

    def finishes(depth: int) -> bool:
        trial = Network(ctx, progs, epochs=epochs)
        for (_, buf), s in trial.rings.items():
            if buf == ring:
                trial.depth[s] = depth
        try:
            return not trial.run()
        except _Unsettled:
            return False

    lo, hi, runs = have, None, 0  # lo: a depth that deadlocks; hi: one that finishes
    depth = have
    while hi is None and runs < MAX_REMEDY_RUNS and depth < MAX_RING_DEPTH:
        depth, runs = min(2 * depth, MAX_RING_DEPTH), runs + 1
        if finishes(depth):
            hi = depth
        else:
            lo = depth
    while hi is not None and hi - lo > 1 and runs < MAX_REMEDY_RUNS:
        mid, runs = (lo + hi) // 2, runs + 1
        lo, hi = (lo, mid) if finishes(mid) else (mid, hi)
    if hi is None or hi - lo > 1:
        return None
    name = ctx.name(ring)
    return name, (
        f"; {name} needs {hi} pages for this order of ops (it has {have}): give it {hi} (the plan's depth, --depth),"
        " or let its consumer pop pages before the producer reserves more"
    )

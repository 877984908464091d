"""verify's rule 7 decides a deadlock by one run of its counters; the argument (passes/verify/deadlock.py) is that
rings with one producer and one consumer, and semaphores that only count up, make the engines' moves commute, so
every interleaving ends in the same state. This checks the argument against an oracle that knows nothing of it: an
exhaustive search of every interleaving of small random programs — rings between engines, semaphore handshakes
across sites, a group barrier, planted faults (a wait for a count nobody reaches, a barrier some sites never
cross) — op by op, with its own model of what each op waits for.

The oracle and rule 7 must agree on every program: deadlock or not, and which engines are stuck at which op. And
the oracle shows why rule 7 refuses `SemSet` (StrongerCheckNeeded): with a count that can go down, interleavings
of one program end in different states.
"""

from __future__ import annotations

import functools
from collections import deque

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import spatialc
from spatialc.errors import StrongerCheckNeeded
from spatialc.ir.ids import LV_K, BufferId, GroupId, SemId, Site
from spatialc.ir.index import ProgramIndex
from spatialc.ir.nodes import Buffer, Engine, EngineProgram, Fifo, Group, Placement, Schedule, Semaphore
from spatialc.ir.ops import Barrier, Const, Loop, Pop, Push, Reserve, SemInc, SemSet, SemWait, Wait
from spatialc.passes.verify import deadlock

ENGINES = (Engine.READER, Engine.COMPUTE, Engine.WRITER)
STATE_CAP = 60_000  # states the oracle explores before an example is set aside (rarely reached)


# ---- the oracle -------------------------------------------------------------------------------------------------


def flat(ops):
    """An engine's ops with every loop unrolled (the oracle steps op by op)."""
    out = []
    for op in ops:
        if isinstance(op, Loop):
            for _ in range(op.count.n):
                out += flat(op.body)
        else:
            out.append(op)
    return out


def explore(programs, depth, initial, group=()):
    """Every state every interleaving reaches; the set of terminal states (no engine can move), each as the tuple of
    engine positions. `depth[(site, ring)]` is a ring's pages, `initial[(site, sem)]` a semaphore's start, `group`
    the sites a Barrier joins: an engine's n-th Barrier first arrives (a move of its own), then waits until every
    site of the group has arrived n times."""
    engines = [(p.site, flat(p.ops)) for p in programs]
    gi = {s: i for i, s in enumerate(group)}
    rings = sorted({(s, op.buf) for s, ops in engines for op in ops if hasattr(op, "buf")})
    sems = sorted(set(initial) | {(op.at, op.sem) for _, ops in engines for op in ops if isinstance(op, SemInc)})
    sems = sorted(set(sems) | {(s, op.sem) for s, ops in engines for op in ops if isinstance(op, SemWait | SemSet)})
    ri = {r: i for i, r in enumerate(rings)}
    si = {s: i for i, s in enumerate(sems)}

    # Each op as the oracle reads it, worked out once: (kind, the index of its ring or count, its pages or value,
    # a Reserve's ring depth) — the kind 0 of an op that only moves on (a Loop's ops are unrolled).
    def decoded(site, op):
        try:
            return decode(site, op)
        except KeyError as missing:  # (raised when the op is reached, as the lookup there would)
            return (9, missing, 0, 0)

    def decode(site, op):
        match op:
            case Barrier():
                return (1, gi[site], 0, 0)
            case Reserve(buf, n):
                return (2, ri[(site, buf)], n, depth[(site, buf)])
            case Push(buf, n):
                return (3, ri[(site, buf)], n, 0)
            case Wait(buf, n):
                return (4, ri[(site, buf)], n, 0)
            case Pop(buf, n):
                return (5, ri[(site, buf)], n, 0)
            case SemInc(sem, at, by):
                return (6, si[(at, sem)], by, 0)
            case SemWait(sem, value):
                return (7, si[(site, sem)], value, 0)
            case SemSet(sem, value):
                return (8, si[(site, sem)], value, 0)
        return (0, 0, 0, 0)

    moves = [[decoded(site, op) for op in ops] for site, ops in engines]

    def step(state, e):
        """The state after engine e's next op, or None when it cannot move."""
        pcs, held, ready, count, arrived, waiting = state
        ops = moves[e]
        pc = pcs[e]
        if pc == len(ops):
            return None
        kind, i, n, most = ops[pc]
        if kind == 1:  # a Barrier: arrive, then wait until every site of the group has arrived as often
            mine = arrived[i]
            if not waiting[e]:  # arrive
                arrived = arrived[:i] + (mine + 1,) + arrived[i + 1 :]
                waiting = waiting[:e] + (mine + 1,) + waiting[e + 1 :]
                return pcs, held, ready, count, arrived, waiting
            if min(arrived) < waiting[e]:
                return None
            waiting = waiting[:e] + (0,) + waiting[e + 1 :]
        elif kind == 2:  # Reserve
            if held[i] + n > most:
                return None
            held = held[:i] + (held[i] + n,) + held[i + 1 :]
        elif kind == 3:  # Push
            ready = ready[:i] + (ready[i] + n,) + ready[i + 1 :]
        elif kind == 4:  # Wait
            if ready[i] < n:
                return None
        elif kind == 5:  # Pop
            held = held[:i] + (held[i] - n,) + held[i + 1 :]
            ready = ready[:i] + (ready[i] - n,) + ready[i + 1 :]
        elif kind == 6:  # SemInc
            count = count[:i] + (count[i] + n,) + count[i + 1 :]
        elif kind == 7:  # SemWait
            if count[i] < n:
                return None
        elif kind == 8:  # SemSet
            count = count[:i] + (n,) + count[i + 1 :]
        elif kind == 9:
            raise i
        return pcs[:e] + (pc + 1,) + pcs[e + 1 :], held, ready, count, arrived, waiting

    start = (
        tuple(0 for _ in engines),
        tuple(0 for _ in rings),
        tuple(0 for _ in rings),
        tuple(initial.get(s, 0) for s in sems),
        tuple(0 for _ in group),
        tuple(0 for _ in engines),
    )
    terminal = search(start, step, len(engines), STATE_CAP)
    return None if terminal is None else (terminal, [len(ops) for _, ops in engines])


def search(start, step, engines: int, cap: int):
    """Every state reachable from `start` by `step(state, engine)` (None: that engine cannot move); the first field
    of each state where no engine can move, or None past `cap` states."""
    seen, todo, terminal = {start}, deque([start]), set()
    while todo:
        state = todo.popleft()
        moved = False
        for e in range(engines):
            nxt = step(state, e)
            if nxt is not None:
                moved = True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if not moved:
            terminal.add(state[0])
        if len(seen) > cap:
            return None
    return terminal


# ---- random programs ------------------------------------------------------------------------------------------

RING_A, RING_B, SEM, GROUP = BufferId(0), BufferId(1), SemId(0), GroupId(0)


@st.composite
def programs(draw, setting=False, barriers=True):
    """1–3 sites, each a reader → compute → writer pipeline over rings A and B (depth 1–2), a K loop of 1–3 steps,
    and semaphore raises and waits between sites dropped in anywhere — the waits sometimes for counts the raises
    never reach, the rings sometimes too shallow for the order the ops were drawn in."""
    sites = [Site(s) for s in range(draw(st.integers(1, 3)))]
    steps = draw(st.integers(1, 3))
    depth = {(s, r): draw(st.integers(1, 2)) for s in sites for r in (RING_A, RING_B)}
    progs = []
    for s in sites:
        per = {
            Engine.READER: [Reserve(RING_A), Push(RING_A)],
            Engine.COMPUTE: [Wait(RING_A), Pop(RING_A), Reserve(RING_B), Push(RING_B)],
            Engine.WRITER: [Wait(RING_B), Pop(RING_B)],
        }
        # The compute engine may claim its output page before it has its input.
        if draw(st.booleans()):
            per[Engine.COMPUTE] = [Reserve(RING_B), Wait(RING_A), Pop(RING_A), Push(RING_B)]
        pre = {e: [] for e in ENGINES}
        post = {e: [] for e in ENGINES}
        for _ in range(draw(st.integers(0, 3))):
            e = draw(st.sampled_from(ENGINES))
            where = draw(st.sampled_from(["pre", "body", "post"]))
            kind = draw(st.sampled_from(["inc", "wait"] + (["set"] if setting else [])))
            if kind == "inc":
                op = SemInc(SEM, draw(st.sampled_from(sites)), draw(st.integers(1, 2)))
            elif kind == "wait":
                op = SemWait(SEM, draw(st.integers(1, 4)))
            else:
                op = SemSet(SEM, draw(st.integers(0, 2)))
            if where == "body":
                body = per[e]
                body.insert(draw(st.integers(0, len(body))), op)
            else:
                (pre if where == "pre" else post)[e].append(op)
        # A group barrier over every site, crossed by each site's compute engine — by some sites only, or a
        # different number of times, when the draw plants that fault.
        if barriers and draw(st.booleans()):
            where = draw(st.sampled_from(["pre", "body", "post"]))
            if where == "body":
                per[Engine.COMPUTE].insert(draw(st.integers(0, len(per[Engine.COMPUTE]))), Barrier(GROUP))
            else:
                (pre if where == "pre" else post)[Engine.COMPUTE].append(Barrier(GROUP))
        for e in ENGINES:
            ops = (*pre[e], Loop(LV_K, Const(steps), tuple(per[e])), *post[e])
            progs.append(EngineProgram(s, e, ops))
    initial = {(s, SEM): draw(st.integers(0, 1)) for s in sites}
    return progs, depth, initial, tuple(sites)


@functools.cache
def small_gemm():
    """The program whose tables and schedule the examples replace, built once (a program is never changed)."""
    return spatialc.build(spatialc.gemm(16, 16, 16, "int8"), "sm_86", sites=1)


def network(progs, depth, initial, group=()):
    """Rule 7's counter run over `progs`, on a program whose tables hold its rings, semaphore and group."""
    base = small_gemm()
    d = {r: max(v for (s, rr), v in depth.items() if rr == r) for r in (RING_A, RING_B)}
    assert all(v == d[r] for (s, r), v in depth.items()), "one depth per ring template"
    init = set(initial.values())
    assert len(init) == 1
    p = base.evolve(
        buffers=(Buffer(RING_A, "A", Fifo(d[RING_A], 1)), Buffer(RING_B, "B", Fifo(d[RING_B], 1))),
        semaphores=(Semaphore(SEM, "s", init.pop()),),
        schedule=Schedule(tuple(progs)),
    )
    if group:
        p = p.evolve(placement=Placement(tuple((s, ()) for s in group), (Group(GROUP, tuple(group)),)))
    net = deadlock.Network(ProgramIndex.of(p), progs)
    blocked = net.run()
    return {(int(e.site), e.name, e.pc) for e in blocked}, net


def same_depths(depth):
    """Ring depths as rule 7 sees them: one per ring template (its copies at every site share it)."""
    return {(s, r): max(v for (_, rr), v in depth.items() if rr == r) for (s, r) in depth}


def same_initial(initial):
    v = max(initial.values())
    return {k: v for k in initial}


@pytest.mark.long
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_one_run_of_the_counters_decides_what_every_interleaving_does(drawn):
    progs, depth, initial, group = drawn
    depth, initial = same_depths(depth), same_initial(initial)
    found = explore(progs, depth, initial, group)
    assume(found is not None)
    terminal, lengths = found
    # The argument: every interleaving ends in one state.
    assert len(terminal) == 1, terminal
    (end,) = terminal
    blocked, net = network(progs, depth, initial, group)
    stuck = {i for i, (pc, n) in enumerate(zip(end, lengths, strict=True)) if pc < n}
    event("deadlock" if stuck else "every engine finishes")
    # The same verdict, and the same engines stuck (rule 7's program counters count loop instructions too, so
    # only who is stuck is compared, and that the run found a deadlock exactly when the oracle did).
    assert bool(blocked) == bool(stuck)
    names = [(int(p.site), p.engine.value) for p in progs]
    assert {(s, n) for s, n, _ in blocked} == {names[i] for i in stuck}
    # And with the fast-forward off, the run agrees with itself.
    slow = deadlock.Network(net.ctx, progs, fast_forward=False)
    assert {(int(e.site), e.name, e.pc) for e in slow.run()} == blocked


def test_the_oracle_finds_planted_deadlocks_and_clean_handshakes():
    """Hand-made examples the random ones are sure to contain, so a broken oracle cannot pass by saying "fine"."""
    s0, s1 = Site(0), Site(1)
    k = Loop(LV_K, Const(2), (Reserve(RING_A), Push(RING_A)))
    handshake = [
        EngineProgram(s0, Engine.READER, (k, SemInc(SEM, s1))),
        EngineProgram(s0, Engine.COMPUTE, (Loop(LV_K, Const(2), (Wait(RING_A), Pop(RING_A))),)),
        EngineProgram(s1, Engine.READER, (SemWait(SEM, 1), k)),
        EngineProgram(s1, Engine.COMPUTE, (Loop(LV_K, Const(2), (Wait(RING_A), Pop(RING_A))),)),
    ]
    depth = {(s, r): 1 for s in (s0, s1) for r in (RING_A, RING_B)}
    initial = {(s0, SEM): 0, (s1, SEM): 0}
    terminal, lengths = explore(handshake, depth, initial)
    assert terminal == {tuple(lengths)}  # everyone finishes
    assert network(handshake, depth, initial)[0] == set()
    # Site 1 waits for 2: the raise comes once. The oracle and the run both find site 1's reader stuck (and its
    # compute engine, which waits for the reader's pages).
    stuck = [p for p in handshake]
    stuck[2] = EngineProgram(s1, Engine.READER, (SemWait(SEM, 2), k))
    terminal, lengths = explore(stuck, depth, initial)
    (end,) = terminal
    assert [pc < n for pc, n in zip(end, lengths, strict=True)] == [False, False, True, True]
    assert {(s, n) for s, n, _ in network(stuck, depth, initial)[0]} == {(1, "reader"), (1, "compute")}


def test_a_count_that_can_go_down_makes_the_outcome_depend_on_the_interleaving():
    """Why rule 7 refuses SemSet: site 0's writer resets the count its own reader waits for, racing the raise from
    its compute engine; one interleaving finishes, another leaves the reader waiting forever."""
    s0 = Site(0)
    progs = [
        EngineProgram(s0, Engine.READER, (SemWait(SEM, 1),)),
        EngineProgram(s0, Engine.COMPUTE, (SemInc(SEM, s0),)),
        EngineProgram(s0, Engine.WRITER, (SemSet(SEM, 0),)),
    ]
    terminal, lengths = explore(progs, {}, {(s0, SEM): 0})
    assert len(terminal) == 2 and tuple(lengths) in terminal
    # verify refuses such a program by name rather than run it once.
    p = spatialc.build(spatialc.gemm(16, 16, 16, "int8"), "sm_86", sites=1)
    assert p.schedule is not None
    reader = next(q for q in p.schedule.programs if q.engine == Engine.READER)
    edited = tuple(
        EngineProgram(q.site, q.engine, (SemSet(SEM, 0), *q.ops)) if q is reader else q for q in p.schedule.programs
    )
    q = p.evolve(semaphores=(Semaphore(SEM, "s"),), schedule=Schedule(edited))
    with pytest.raises(StrongerCheckNeeded, match="SemSet"):
        spatialc.verify(q)

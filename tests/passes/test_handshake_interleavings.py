"""Rule 7 decides handshakes whose semaphores are reset (counters with an epoch) and the order of multicast pages by
one run with vector clocks (passes/verify/handshake.py). This checks that argument against an oracle that knows
nothing of it: every interleaving of small random multicast handshakes — a sender and one or two receivers, rings one
or two deep, one to three K steps — op by op, with the IR's own semantics (a SemSet sets, a McastSetValid sets each
site of the group, a McastSend copies into each receiver's newest reserved page), and random faults planted in them
(an op deleted, two swapped, one repeated, a wait for another count).

What the oracle looks for in every interleaving: a deadlock; a multicast race (a send into a page that is not the
receiver's next one, or a page published before its copy landed); a lost raise (a reset that finds more than its wait
asked for, a flag set onto a copy already set); and whether all interleavings end in one state.

The claims: whatever rule 7 accepts finishes in every interleaving, without a race or a lost raise, in one state; a
deadlock it reports is one no interleaving escapes; each HandshakeError it raises names a race or a loss some
interleaving really has.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from spatialc.errors import HandshakeError, StrongerCheckNeeded
from spatialc.ir.ids import LV_K, BufferId, GroupId, SemId, Site
from spatialc.ir.index import ProgramIndex
from spatialc.ir.nodes import Buffer, Engine, EngineProgram, Fifo, Group, Placement, Schedule, Semaphore
from spatialc.ir.ops import Const, Loop, McastSend, McastSetValid, Pop, Push, Reserve, SemInc, SemSet, SemWait, Wait
from spatialc.passes.verify import deadlock, handshake

from .test_interleavings import ENGINES, flat, search, small_gemm

X, READY, VALID, GROUP = BufferId(0), SemId(1), SemId(2), GroupId(0)
STATE_CAP = 80_000


def explore(programs, depth, group):
    """Every interleaving of `programs`: (terminal states as engine positions, whether any interleaving raced, lost
    a raise), or None past STATE_CAP states."""
    engines = [(p.site, flat(p.ops)) for p in programs]
    rings = sorted({(s, op.buf) for s, ops in engines for op in ops if hasattr(op, "buf")} | {(s, X) for s in group})
    sems = sorted({(s, m) for s in group for m in (READY, VALID)})
    waited = {(s, op.sem) for s, ops in engines for op in ops if isinstance(op, SemWait)}
    multicast = any(_sends(ops) for _, ops in engines)  # (without a send, a page pushed unfilled is rule 8's)
    ri = {r: i for i, r in enumerate(rings)}
    si = {m: i for i, m in enumerate(sems)}
    bad: set[str] = set()

    # Each op as the oracle reads it, worked out once: (kind, the index of its ring or count, its pages or value,
    # what else its kind needs) — the kind 0 of an op that only moves on (a Loop's ops are unrolled).
    def decoded(site, ops, pc):
        try:
            return decode(site, ops, pc)
        except KeyError as missing:  # (raised when the op is reached, as the lookup there would)
            return (9, missing, 0, None)

    def decode(site, ops, pc):
        match ops[pc]:
            case Reserve(buf, n):
                return (1, ri[(site, buf)], n, None)
            case Push(buf, n):  # (a page published before its copy landed: a race, where a copy is sent)
                return (2, ri[(site, buf)], n, multicast and not _sends(ops))
            case Wait(buf, n):
                return (3, ri[(site, buf)], n, None)
            case Pop(buf, n):
                return (4, ri[(site, buf)], n, None)
            case SemInc(sem, at, by):
                return (5, si[(at, sem)], by, None)
            case SemWait(sem, v):
                return (6, si[(site, sem)], v, None)
            case SemSet(sem, v):
                before = ops[pc - 1] if pc else None
                waited_for = before.value if isinstance(before, SemWait) and before.sem == sem else None
                return (7, si[(site, sem)], v, waited_for)
            case McastSetValid(sem, _, v):
                return (8, 0, v, [(si[(s, sem)], (s, sem) in waited and s != site) for s in group])
            case McastSend(buf):
                return (10, 0, 0, [ri[(s, buf)] for s in group if s != site])
        return (0, 0, 0, None)

    moves = [[decoded(site, ops, pc) for pc in range(len(ops))] for site, ops in engines]

    def step(state, e):
        pcs, reserved, pushed, popped, sent, count = state
        ops = moves[e]
        pc = pcs[e]
        if pc == len(ops):
            return None
        kind, i, n, more = ops[pc]
        if kind == 1:  # Reserve
            if reserved[i] + n - popped[i] > depth:
                return None
            reserved = reserved[:i] + (reserved[i] + n,) + reserved[i + 1 :]
        elif kind == 2:  # Push
            if more and sent[i] < pushed[i] + n:  # published before its copy landed
                bad.add("race")
            pushed = pushed[:i] + (pushed[i] + n,) + pushed[i + 1 :]
        elif kind == 3:  # Wait
            if pushed[i] - popped[i] < n:
                return None
        elif kind == 4:  # Pop
            popped = popped[:i] + (popped[i] + n,) + popped[i + 1 :]
        elif kind == 5:  # SemInc
            count = count[:i] + (count[i] + n,) + count[i + 1 :]
        elif kind == 6:  # SemWait
            if count[i] < n:
                return None
        elif kind == 7:  # SemSet
            if more is not None and count[i] > more:
                bad.add("lost")
            count = count[:i] + (n,) + count[i + 1 :]
        elif kind == 8:  # McastSetValid: each site of the group's flag
            values = list(count)
            for j, check in more:
                if check and values[j] != 0:
                    bad.add("lost")
                values[j] = n
            count = tuple(values)
        elif kind == 10:  # McastSend
            copies = list(sent)
            for r in more:
                # The copy lands in the newest reserved, unpublished page: it must be page `sent`.
                if reserved[r] - pushed[r] < 1 or reserved[r] - 1 != copies[r]:
                    bad.add("race")
                copies[r] += 1
            sent = tuple(copies)
        elif kind == 9:
            raise i
        return pcs[:e] + (pc + 1,) + pcs[e + 1 :], reserved, pushed, popped, sent, count

    zero = tuple(0 for _ in rings)
    start = (tuple(0 for _ in engines), zero, zero, zero, zero, tuple(0 for _ in sems))
    terminal = search(start, step, len(engines), STATE_CAP)
    return None if terminal is None else (terminal, [len(ops) for _, ops in engines], bad)


def _sends(ops) -> bool:
    return any(isinstance(op, McastSend) for op in ops)


@st.composite
def handshakes(draw):
    """A sender (site 0) multicasting ring X to 1–2 receivers with the standard handshake, each site's compute
    engine consuming X, and 0–2 planted faults in the readers (and, half the time, an extra raise before or after the
    loop of a reader or compute engine)."""
    n = draw(st.integers(2, 3))
    sites = [Site(s) for s in range(n)]
    steps = draw(st.integers(1, 3))
    depth = draw(st.integers(1, 2))
    sender = [
        Reserve(X),
        SemWait(READY, n - 1),
        SemSet(READY, 0),
        McastSend(X, GROUP),
        McastSetValid(VALID, GROUP, 1),
        Push(X),
    ]
    receiver = [Reserve(X), SemInc(READY, Site(0)), SemWait(VALID, 1), SemSet(VALID, 0), Push(X)]
    bodies = {s: list(sender if s == 0 else receiver) for s in sites}
    for _ in range(draw(st.integers(0, 2))):
        s = draw(st.sampled_from(sites))
        body = bodies[s]
        i = draw(st.integers(0, len(body) - 1))
        kind = draw(st.sampled_from(["delete", "swap", "repeat", "count"]))
        if kind == "delete" and not isinstance(body[i], Reserve | Push):  # (rule 5 refuses an unbalanced ring)
            del body[i]
        elif kind == "swap" and i + 1 < len(body):
            body[i], body[i + 1] = body[i + 1], body[i]
        elif kind == "repeat" and not isinstance(body[i], Reserve | Push | McastSend):
            body.insert(i, body[i])
        elif kind == "count" and isinstance(body[i], SemWait):
            body[i] = SemWait(body[i].sem, draw(st.integers(0, n)))
    # A raise outside the loops, before or after them, in some site's reader or compute engine (one after them is
    # what no wait may count).
    extra: dict[tuple[Site, Engine, str], tuple] = {}
    if draw(st.booleans()):
        at = (draw(st.sampled_from(sites)), draw(st.sampled_from(ENGINES[:2])), draw(st.sampled_from(["pre", "post"])))
        extra[at] = (draw(st.sampled_from([SemInc(READY, Site(0)), SemInc(VALID, draw(st.sampled_from(sites)))])),)
    progs = []
    for s in sites:
        for engine, body in ((Engine.READER, tuple(bodies[s])), (Engine.COMPUTE, (Wait(X), Pop(X)))):
            ops = (
                *extra.get((s, engine, "pre"), ()),
                Loop(LV_K, Const(steps), body),
                *extra.get((s, engine, "post"), ()),
            )
            progs.append(EngineProgram(s, engine, ops))
    return progs, depth, tuple(sites)


def rule7(progs, depth, group):
    """Rule 7's verdict: "ok", "deadlock" (with who is stuck), "race" (HandshakeError) or "unsure"."""
    p = small_gemm().evolve(
        buffers=(Buffer(X, "X", Fifo(depth, 1)),),
        semaphores=(Semaphore(READY, "ready"), Semaphore(VALID, "valid")),
        placement=Placement(tuple((s, ()) for s in group), (Group(GROUP, tuple(group)),)),
        schedule=Schedule(tuple(progs)),
    )
    ctx = ProgramIndex.of(p)
    try:
        epochs = handshake.epoch_copies(ctx, progs)
        net = deadlock.Network(ctx, progs, epochs=epochs)
        blocked = net.run()
    except HandshakeError:
        return "race", None
    except StrongerCheckNeeded:
        return "unsure", None
    return ("deadlock" if blocked else "ok"), {(int(e.site), e.name) for e in blocked}


@pytest.mark.long
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(handshakes())
def test_one_clocked_run_decides_what_every_interleaving_of_a_handshake_does(drawn):
    progs, depth, group = drawn
    found = explore(progs, depth, group)
    assume(found is not None)
    terminal, lengths, bad = found
    verdict, stuck = rule7(progs, depth, group)
    event(verdict)
    done = tuple(lengths)
    if verdict == "ok":
        assert not bad, bad
        assert terminal == {done}
    elif verdict == "deadlock":
        assert done not in terminal
        if not bad:  # without a race every interleaving ends alike, with the same engines stuck
            assert len(terminal) == 1
            (end,) = terminal
            names = [(int(p.site), p.engine.value) for p in progs]
            assert stuck == {names[i] for i, (pc, n) in enumerate(zip(end, lengths, strict=True)) if pc < n}
    elif verdict == "race":
        assert bad, "rule 7 reported a race no interleaving has"


def test_the_oracle_sees_the_standard_handshake_clean_and_planted_faults_bad():
    """Hand-made cases, so a broken oracle cannot pass by seeing nothing."""
    sites = (Site(0), Site(1), Site(2))

    def make(sender, receiver, steps=2):
        progs = []
        for s in sites:
            body = sender if s == 0 else receiver
            progs.append(EngineProgram(s, Engine.READER, (Loop(LV_K, Const(steps), tuple(body)),)))
            progs.append(EngineProgram(s, Engine.COMPUTE, (Loop(LV_K, Const(steps), (Wait(X), Pop(X))),)))
        return progs

    send = [Reserve(X), SemWait(READY, 2), SemSet(READY, 0), McastSend(X, GROUP), McastSetValid(VALID, GROUP), Push(X)]
    recv = [Reserve(X), SemInc(READY, Site(0)), SemWait(VALID, 1), SemSet(VALID, 0), Push(X)]
    terminal, lengths, bad = explore(make(send, recv), 2, sites)
    assert terminal == {tuple(lengths)} and not bad
    assert rule7(make(send, recv), 2, sites)[0] == "ok"
    # The sender does not wait for the receivers' pages: an overwrite some interleaving makes.
    hasty = [op for op in send if not isinstance(op, SemWait | SemSet)]
    assert "race" in explore(make(hasty, recv), 2, sites)[2]
    assert rule7(make(hasty, recv), 2, sites)[0] == "race"
    # A receiver publishes before it waits for the flag.
    early = [Reserve(X), SemInc(READY, Site(0)), Push(X), SemWait(VALID, 1), SemSet(VALID, 0)]
    assert "race" in explore(make(send, early), 2, sites)[2]
    assert rule7(make(send, early), 2, sites)[0] == "race"
    # The sender waits for one receiver of two: a raise of the next step can come before its reset.
    one = [Reserve(X), SemWait(READY, 1), SemSet(READY, 0), McastSend(X, GROUP), McastSetValid(VALID, GROUP), Push(X)]
    assert rule7(make(one, recv), 2, sites)[0] == "race"
    assert explore(make(one, recv), 2, sites)[2]

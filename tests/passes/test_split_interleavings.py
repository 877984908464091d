"""Split-K's handshake against an oracle that knows nothing of the rules that accept it: an exhaustive search of every
interleaving of a small split program's engines, op by op, that tracks the workspace besides the rings and
semaphores — a partial written, made visible by a WriteBarrier, read by the owner.

The argument verify makes (passes/verify/partials.py) is that the owner's wait for every raise its copy of the
semaphore gets, each raise after its writer's fence, orders every read of the workspace after the write it reads, in
every interleaving: the counts only rise, so one run of rule 7 decides the waits and the program order decides the
rest. The oracle checks it on the real programs `spatialc.build` makes and on hypothesis-drawn edits of their
handshake (an op deleted, moved, or its count or site changed): whatever verify accepts has no interleaving that
deadlocks or reads a partial before it is visible, and whatever has such an interleaving verify refuses.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spatialc
from spatialc.errors import SpatialError
from spatialc.ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, Site
from spatialc.ir.nodes import Schedule, TensorRole
from spatialc.ir.ops import (
    Flush,
    Loop,
    Pop,
    Push,
    ReadTiles,
    Reserve,
    SemInc,
    SemWait,
    Wait,
    WriteBarrier,
    WriteTiles,
)
from spatialc.passes.verify import verify

from ..rewrite import edit

STATE_CAP = 400_000


def slot(p, site, at, item: int = 0) -> int:
    """The workspace tile `at` names at the site's `item`-th item (its only one, outside ITEM loops)."""
    items = dict(p.placement.items_of_site).get(site, ())
    y, x = divmod(int(items[item]), p.plan.grid[1]) if items else (0, 0)
    return at.base + sum(stride * {LV_ITEM_Y: y, LV_ITEM_X: x}.get(var, 0) for var, stride in at.steps)


def flat(p, site, ops, work, item: int = 0):
    out = []
    for op in ops:
        if isinstance(op, Loop):
            for i in range(op.count.n):  # an ITEM loop runs the site's items from its `first` on
                out += flat(p, site, op.body, work, op.first + i if op.var == LV_ITEM else item)
        elif isinstance(op, WriteTiles) and op.tensor == work:
            out.append(("write", p.buffer(op.src).ring, slot(p, site, op.at, item)))
        elif isinstance(op, ReadTiles) and op.tensor == work:
            out.append(("read", None, slot(p, site, op.at, item)))
        elif isinstance(op, Reserve | Push | Wait | Pop | SemInc | SemWait | WriteBarrier | Flush):
            out.append(op)
    return out


def explore(p, cap: int = STATE_CAP):
    """(deadlocks, races) over every interleaving of `p`'s engines (see the module docstring)."""
    work = next(t.id for t in p.tensors if t.role == TensorRole.WORKSPACE)
    engines = [(q.site, flat(p, q.site, q.ops, work)) for q in p.schedule.programs if q.ops]
    rings = sorted(
        {(s, p.buffer(op.buf).ring) for s, ops in engines for op in ops if isinstance(op, Reserve | Push | Wait | Pop)}
    )
    ri = {r: i for i, r in enumerate(rings)}
    depth = {r: p.buffer(r[1]).kind.depth_pages for r in rings}
    sems = sorted(
        {(op.at, op.sem) for _, ops in engines for op in ops if isinstance(op, SemInc)}
        | {(s, op.sem) for s, ops in engines for op in ops if isinstance(op, SemWait)}
    )
    si = {s: i for i, s in enumerate(sems)}
    initial = {s.id: s.initial for s in p.semaphores}

    def step(state, e):
        pcs, held, ready, count, pending, visible = state
        site, ops = engines[e]
        if pcs[e] == len(ops):
            return None, False
        op = ops[pcs[e]]
        held, ready, count = list(held), list(ready), list(count)
        race = False
        match op:
            case ("write", ring, tile):
                pending = pending | {(e, ring, tile)}
            case ("read", _, tile):
                race = tile not in visible
            case WriteBarrier():
                visible = visible | {t for (x, _, t) in pending if x == e}
                pending = frozenset(w for w in pending if w[0] != e)
            case Flush(buf):
                ring = p.buffer(buf).ring
                visible = visible | {t for (x, r, t) in pending if x == e and r == ring}
                pending = frozenset(w for w in pending if not (w[0] == e and w[1] == ring))
            case Reserve(buf, n):
                r = ri[(site, p.buffer(buf).ring)]
                if held[r] + n > depth[rings[r]]:
                    return None, False
                held[r] += n
            case Push(buf, n):
                ready[ri[(site, p.buffer(buf).ring)]] += n
            case Wait(buf, n):
                if ready[ri[(site, p.buffer(buf).ring)]] < n:
                    return None, False
            case Pop(buf, n):
                r = ri[(site, p.buffer(buf).ring)]
                held[r] -= n
                ready[r] -= n
            case SemInc(sem, at, by):
                count[si[(at, sem)]] += by
            case SemWait(sem, value):
                if count[si[(site, sem)]] < value:
                    return None, False
        new = (pcs[:e] + (pcs[e] + 1,) + pcs[e + 1 :], tuple(held), tuple(ready), tuple(count), pending, visible)
        return new, race

    start = (
        tuple(0 for _ in engines),
        tuple(0 for _ in rings),
        tuple(0 for _ in rings),
        tuple(initial[sem] for _, sem in sems),
        frozenset(),
        frozenset(),
    )
    seen, todo = {start}, deque([start])
    deadlocks = races = False
    ends = tuple(len(ops) for _, ops in engines)
    while todo:
        state = todo.popleft()
        moved = False
        for e in range(len(engines)):
            nxt, race = step(state, e)
            races |= race
            if nxt is not None:
                moved = True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if not moved and state[0] != ends:
            deadlocks = True
        assert len(seen) <= cap, "state space too large for the oracle"
    return deadlocks, races


def small(splits: int):
    """The smallest split program of `splits` sites: one 16x16 item, one K step a split."""
    return spatialc.build(spatialc.gemm(16, 16, 16 * splits, "int8"), "sm_86", block=(1, 1, 1), split_k=splits)


SMALL = {s: small(s) for s in (2, 3)}
# A split tail: 3 items of 16 × 16 on 2 sites, one whole item each, the last split over both (split 0 owns it).
TAIL = spatialc.build(
    spatialc.gemm(16, 48, 32, "int8"), "sm_86", placement="split_tail", sites=2, block=(1, 1, 1), sub_blocks=(1, 1)
)


def test_the_split_tail_spatialc_builds_has_no_bad_interleaving():
    assert (TAIL.placement.tail, TAIL.placement.splits) == (1, 2)
    assert explore(TAIL) == (False, False)


def tail_edits(p):
    """`handshake_edits` of the ops in each program's tail loop (its last op, an ITEM loop of the site's last item)."""
    out = []
    for q in p.schedule.programs:
        *whole, tail = q.ops
        if not (isinstance(tail, Loop) and tail.first):
            continue
        inner = dataclasses.replace(q, ops=tail.body)
        for name, _, f in handshake_edits(p.evolve(schedule=Schedule((inner,)))):
            out.append((name, q, lambda ops, f=f: (*ops[:-1], dataclasses.replace(ops[-1], body=f(ops[-1].body)))))
    return out


def test_every_single_edit_of_the_split_tails_handshake_is_judged_as_the_oracle_judges_it():
    edits = tail_edits(TAIL)
    assert len(edits) >= 12
    verdicts = [judged(edit(TAIL.evolve(verified=False), q.engine, f, (q.site,)), name) for name, q, f in edits]
    assert sum(bad for _, bad in verdicts) >= len(verdicts) // 2


@pytest.mark.parametrize("splits", [2, 3])
def test_the_handshake_spatialc_builds_has_no_bad_interleaving(splits):
    found = explore(SMALL[splits])
    assert found == (False, False)


def handshake_edits(p):
    """Every single edit of the handshake: delete an op of it, move a raise before its write, change a wait's count
    or a raise's site."""
    out = []
    work = next(t.id for t in p.tensors if t.role == TensorRole.WORKSPACE)
    for q in p.schedule.programs:
        for i, op in enumerate(q.ops):
            touches = isinstance(op, SemWait | SemInc | WriteBarrier) or (
                isinstance(op, ReadTiles | WriteTiles) and op.tensor == work
            )
            if not touches:
                continue
            out.append(
                (
                    f"site {int(q.site)} {q.engine.value}: delete {type(op).__name__}",
                    q,
                    lambda ops, i=i: ops[:i] + ops[i + 1 :],
                )
            )
            if i > 0:
                out.append(
                    (
                        f"site {int(q.site)} {q.engine.value}: {type(op).__name__} one earlier",
                        q,
                        lambda ops, i=i: (*ops[: i - 1], ops[i], ops[i - 1], *ops[i + 1 :]),
                    )
                )
            if isinstance(op, SemWait):
                for v in (op.value - 1, op.value + 1):
                    out.append(
                        (
                            f"site {int(q.site)}: wait for {v}",
                            q,
                            lambda ops, i=i, v=v: (*ops[:i], SemWait(ops[i].sem, v), *ops[i + 1 :]),
                        )
                    )
            if isinstance(op, SemInc):
                for at in sorted({0, int(op.at) + 1, int(q.site)} - {int(op.at)}):
                    out.append(
                        (
                            f"site {int(q.site)}: raise site {at}",
                            q,
                            lambda ops, i=i, at=at: (*ops[:i], SemInc(ops[i].sem, Site(at), ops[i].by), *ops[i + 1 :]),
                        )
                    )
    return out


EDITS = {s: handshake_edits(SMALL[s]) for s in (2, 3)}


def judged(q, name):
    """verify's verdict on `q` against the oracle's: an accepted program has no bad interleaving, and a program with
    one is refused. (verify may refuse more: a page moved before it is filled computes the wrong thing, which the
    oracle, tracking order only, does not see.)"""
    found = explore(q)
    assert found is not None, name
    deadlocks, races = found
    try:
        verify(q)
        accepted = True
    except SpatialError:
        accepted = False
    assert not (accepted and (deadlocks or races)), (
        f"verify accepted {name}, which can {'deadlock' if deadlocks else 'race'}"
    )
    return accepted, deadlocks or races


@pytest.mark.parametrize("splits", [2, 3])
def test_every_single_edit_of_the_handshake_is_judged_as_the_oracle_judges_it(splits):
    verdicts = [
        judged(edit(SMALL[splits].evolve(verified=False), q.engine, f, (q.site,)), name) for name, q, f in EDITS[splits]
    ]
    assert sum(bad for _, bad in verdicts) >= len(verdicts) // 2  # most edits break the handshake, and are refused


@pytest.mark.long
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_two_edits_at_once_are_judged_as_the_oracle_judges_them(data):
    splits = data.draw(st.sampled_from([2, 3]))
    picks = data.draw(st.lists(st.sampled_from(EDITS[splits]), min_size=2, max_size=2, unique_by=lambda e: e[0]))
    q = SMALL[splits].evolve(verified=False)
    done = set()
    for _, prog, f in picks:
        if (prog.site, prog.engine) in done:  # a second edit of one program would use stale op indices
            continue
        done.add((prog.site, prog.engine))
        q = edit(q, prog.engine, f, (prog.site,))
    judged(q, " + ".join(name for name, _, _ in picks))


def test_the_oracle_sees_the_faults_it_is_trusted_to_see():
    """The oracle itself, on planted faults: a raise before the fence races, a wait for one raise too few races, a
    wait for one too many deadlocks."""
    p = SMALL[3]
    by = {name: (q, f) for name, q, f in EDITS[3]}
    for name, want in [
        ("site 1 writer: delete WriteBarrier", (False, True)),
        ("site 0: wait for 1", (False, True)),
        ("site 0: wait for 3", (True, False)),
    ]:
        q, f = by[name]
        assert explore(edit(p.evolve(verified=False), q.engine, f, (q.site,))) == want, name

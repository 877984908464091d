"""A hostile review of multicast verification (rule 7's handshake clocks, rule 8 across sites): hand edits of valid
multicast programs that verify must refuse, or that must still compute A @ B exactly in every engine order.

The first tests were findings, each mended since: verify accepted a program that deadlocks or races in the
interpreter (a set counted as a raise, a raise of 0 counted as one that released a wait), or refused one with a
crash's message."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.errors import (
    HandshakeError,
    IllFormedError,
    SemanticError,
    StrongerCheckNeeded,
    VerifyDeadlockError,
    VerifyError,
)
from spatialc.ir.ids import LV_K, GroupId, SemId, Site
from spatialc.ir.nodes import Group
from spatialc.ir.ops import McastSetValid, ReadTiles, SemInc, SemWait
from spatialc.passes.verify import verify

from ..rewrite import edit_k_steps

# semaphores of passes/multicast.py
A_READY, A_VALID = SemId(1), SemId(2)


@cache
def _build(m: int, n: int, k: int, prec: str, group: tuple[int, int], sites: int | None = None):
    sites = sites or group[0] * group[1]
    return spatialc.build(spatialc.gemm(m, n, k, prec), "sm_90", multicast=group, sites=sites)


def _2x2():
    """Sites 0..3: site 0 sends A to 1 and B to 2; site 1 sends B to 3; site 2 sends A to 3."""
    return _build(128, 128, 128, "fp16", (2, 2))


def _1x3():
    """Site 0 sends A to sites 1 and 2 (its SemWait a_ready waits for 2)."""
    return _build(128, 384, 64, "int8", (1, 3))


def _k_body(p, site, f):
    """`p` with the K-loop body of site `site`'s reader rewritten by f (a list of ops in, a list out)."""
    return edit_k_steps(p, site, f).evolve(verified=False)


def _change(kind, nth=0, **fields):
    def f(body):
        at = [i for i, op in enumerate(body) if isinstance(op, kind)][nth]
        return [*body[:at], dataclasses.replace(body[at], **fields), *body[at + 1 :]]

    return f


def _twice(kind):
    def f(body):
        at = next(i for i, op in enumerate(body) if isinstance(op, kind))
        return [*body[: at + 1], *body[at:]]

    return f


def _before_first(kind, new):
    def f(body):
        at = next(i for i, op in enumerate(body) if isinstance(op, kind))
        return [*body[:at], new, *body[at:]]

    return f


def _orders(p):
    """Schedules listing the same engines in other orders: the interpreter then interleaves them differently."""
    progs = p.schedule.programs
    return [
        progs,
        progs[::-1],
        progs[1::2] + progs[::2],
        tuple(sorted(progs, key=lambda q: (q.engine.value, -q.site))),
        tuple(sorted(progs, key=lambda q: (-q.site, q.engine.value))),
    ]


def _refused_or_right(p) -> VerifyError | None:
    """verify refuses `p` (the error), or every engine order of it computes A @ B exactly (None)."""
    try:
        v = verify(p)
    except VerifyError as e:
        return e
    a, b = (next(t for t in p.tensors if t.name == name) for name in ("A", "B"))
    rng = np.random.default_rng(0)
    ins = {"A": rng.integers(-4, 5, a.elems), "B": rng.integers(-4, 5, b.elems)}
    want = ins["A"].astype(np.int64) @ ins["B"].astype(np.int64)
    for order in _orders(v):
        q = v.evolve(schedule=dataclasses.replace(v.schedule, programs=order))
        got = np.asarray(spatialc.evaluate(q, ins), dtype=np.int64)
        assert np.array_equal(got, want)
    return None


# ---- findings: accepted, yet they deadlock or race -----------------------------------------------------------------


# Found by a hostile review, now refused: handshake.py counts McastSetValid as a raise of 1, but it *sets* the copy:
# two sets in one epoch leave it at 1, and the receiver's wait for 2 never passes (verify accepts; the interpreter
# deadlocks in every order)
def test_a_flag_set_twice_for_a_wait_of_two_is_refused():
    p = _k_body(_2x2(), 0, _twice(McastSetValid))  # site 0 sets site 1's a_valid twice a page
    p = _k_body(p, 1, _change(SemWait, 0, value=2))  # site 1 waits for a_valid >= 2
    with pytest.raises(StrongerCheckNeeded, match="a flag is waited for 1"):
        verify(p)


# Found by a hostile review, now refused: a raise and a set on one copy in one epoch: the receiver raises its own
# a_valid before it offers the page, the sender's McastSetValid then sets it to 1 (not 2); verify adds them and
# accepts a wait for 2
def test_a_raise_overwritten_by_the_flag_is_refused():
    own = SemInc(A_VALID, Site(1), 1)
    p = _k_body(_2x2(), 1, _before_first(SemInc, own))
    p = _k_body(p, 1, _change(SemWait, 0, value=2))
    with pytest.raises(StrongerCheckNeeded, match="a flag is waited for 1"):
        verify(p)


# Found by a hostile review, now refused: a group that lists a receiver twice: the McastSetValid is counted as two
# raises of its copy, the set leaves it at 1, and the receiver's wait for 2 never passes (verify accepts; the
# interpreter deadlocks)
def test_a_flag_set_through_a_group_that_lists_a_site_twice_is_refused():
    p = _2x2()
    twice = Group(GroupId(9), (Site(0), Site(1), Site(1)))
    p = p.evolve(placement=dataclasses.replace(p.placement, groups=(*p.placement.groups, twice)))
    p = _k_body(p, 0, _change(McastSetValid, 0, group=twice.id))  # a_valid to sites 0, 1, 1
    p = _k_body(p, 1, _change(SemWait, 0, value=2))
    with pytest.raises(IllFormedError, match="names site 1 twice"):
        verify(p)


# Found by a hostile review, now refused: a SemInc by 0 is joined into the clocks as a raise the sender's wait needed:
# site 1 raises a_ready by 2, site 2 by 0, the wait for 2 can pass before site 2 reserved its page, and the McastSend
# lands in a page site 2 does not hold (interpreter FlowError under another engine order)
def test_a_raise_of_zero_does_not_order_the_send_after_the_receivers_reserve():
    p = _k_body(_1x3(), 1, _change(SemInc, 0, by=2))
    p = _k_body(p, 2, _change(SemInc, 0, by=0))
    with pytest.raises(HandshakeError, match="overwrite"):
        verify(p)


# Found by a hostile review, now refused: handshake.Clocks.epoch_wait reads raises[-1] of an empty list when the count
# passes the wait's value without a raise (a negative value, or an initial count above it): the refusal is
# IllFormedError 'not made of spatialc's IR values: IndexError', not the handshake error it is
@pytest.mark.parametrize("how", ["negative wait", "initial above the wait"])
def test_a_wait_passed_without_any_raise_is_refused_as_a_handshake_error(how):
    p = _2x2()
    if how == "negative wait":
        p = _k_body(p, 1, _change(SemWait, 0, value=-1))  # site 1's a_valid wait passes at once
    else:
        sems = tuple(dataclasses.replace(s, initial=2) if s.id == A_READY else s for s in p.semaphores)
        p = p.evolve(semaphores=sems, verified=False)  # site 0's a_ready starts above the 1 it waits for
    with pytest.raises(VerifyError) as info:
        verify(p)
    assert isinstance(info.value, HandshakeError | StrongerCheckNeeded | VerifyDeadlockError)
    assert "IndexError" not in str(info.value)


# ---- still refused, or still right ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sem", [1, 2, 3, 4])
def test_a_handshake_semaphore_that_starts_at_one_is_refused(sem):
    p = _2x2()
    sems = tuple(dataclasses.replace(s, initial=1) if int(s.id) == sem else s for s in p.semaphores)
    with pytest.raises(HandshakeError, match="overwrite|landed"):
        verify(p.evolve(semaphores=sems, verified=False))


def test_a_flag_set_to_two_is_refused():
    with pytest.raises(StrongerCheckNeeded, match="set to 1"):
        verify(_k_body(_2x2(), 0, _change(McastSetValid, 0, value=2)))


def test_a_raise_of_zero_answered_by_a_wait_for_zero_is_refused():
    p = _k_body(_2x2(), 1, _change(SemInc, 0, by=0))
    p = _k_body(p, 0, _change(SemWait, 0, value=0))
    with pytest.raises((HandshakeError, StrongerCheckNeeded), match="overwrite|at least 1"):
        verify(p)


def test_a_sender_that_reverses_its_k_steps_is_refused():
    """Site 0 reads A and B with K reversed: its own product is right, but what it sends is not what sites 1 and 2
    pair with their own reads."""
    steps = _2x2().plan.k_steps

    def reverse(body):
        out = []
        for op in body:
            if isinstance(op, ReadTiles):
                k = dict(op.at.steps)[LV_K]
                at = dataclasses.replace(
                    op.at,
                    base=op.at.base + k * (steps - 1),
                    steps=tuple((v, -s if v == LV_K else s) for v, s in op.at.steps),
                )
                op = dataclasses.replace(op, at=at)
            out.append(op)
        return out

    with pytest.raises(SemanticError, match="k-tile"):
        verify(_k_body(_2x2(), 0, reverse))


def test_receivers_of_two_groups_that_trade_items_are_refused():
    p = _build(256, 256, 128, "fp16", (2, 2), 8)
    listed = list(p.placement.items_of_site)
    listed[1], listed[5] = (listed[1][0], listed[5][1]), (listed[5][0], listed[1][1])
    traded = p.evolve(placement=dataclasses.replace(p.placement, items_of_site=tuple(listed)), verified=False)
    with pytest.raises(SemanticError, match="another column"):
        verify(traded)


@pytest.mark.parametrize("by", [2, 3])
def test_raises_by_more_than_one_answered_by_the_sum_are_right(by):
    p = _k_body(_1x3(), 1, _change(SemInc, 0, by=by))
    p = _k_body(p, 2, _change(SemInc, 0, by=by))
    p = _k_body(p, 0, _change(SemWait, 0, value=2 * by))
    assert _refused_or_right(p) is None

"""A second hostile review of multicast verification (rule 7's epoch clocks, rule 8 across sites): hand edits of
valid multicast programs — to the compute and writer engines, to ring depths, to the groups — that verify must
refuse, or that must compute A @ B exactly in every interleaving of their engines.

The interpreter resumes engines round-robin, so the orders it tries keep the sites of a cluster in near lock step.
`_run_first` drives the same engines in another legal interleaving: it always resumes the first engine (of the
sites listed first) that can move, so those sites run as far ahead as the handshakes let them."""

from __future__ import annotations

import dataclasses
import itertools
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.errors import HandshakeError, IllFormedError, VerifyError
from spatialc.interp.errors import FlowError
from spatialc.interp.evaluate import load_inputs, result
from spatialc.interp.machine import Machine
from spatialc.ir.ids import SemId, Site
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import SemInc
from spatialc.passes.verify import verify

from ..rewrite import edit
from .test_hostile_multicast import _orders

# semaphores of passes/multicast.py
A_READY, A_VALID, B_READY, B_VALID = SemId(1), SemId(2), SemId(3), SemId(4)


@cache
def _build(m: int, n: int, k: int, group: tuple[int, int], sites: int | None = None):
    sites = sites or group[0] * group[1]
    return spatialc.build(spatialc.gemm(m, n, k, "int8"), "sm_90", multicast=group, sites=sites)


def _ins(p):
    a, b = (next(t for t in p.tensors if t.name == name) for name in ("A", "B"))
    rng = np.random.default_rng(0)
    ins = {"A": rng.integers(-4, 5, a.elems), "B": rng.integers(-4, 5, b.elems)}
    return ins, ins["A"].astype(np.int64) @ ins["B"].astype(np.int64)


def _run_first(p, ins, first: tuple[int, ...]) -> np.ndarray:
    """The interpreter's run of `p` in the interleaving that always resumes the first engine that can move, the
    engines of the sites in `first` before all others (in that order): a legal schedule the round-robin never takes."""
    stores, params = load_inputs(p, ins)
    m = Machine(p, stores, params, False)
    rank = {Site(s): i for i, s in enumerate(first)}
    live = sorted(m.engines(), key=lambda e: rank.get(e[0].site, len(rank)))
    while live:
        for i, (eng, gen) in enumerate(live):
            try:
                blocked = next(gen)
            except StopIteration:
                del live[i]
                break
            if blocked is not None:  # it ran up to a new op
                eng.blocked = blocked
                break
        else:
            raise AssertionError("deadlock")
    for store in stores.values():
        store.flush()
    return result(p, stores)


def _refused_or_right(p, firsts) -> VerifyError | None:
    """verify refuses `p` (the error), or it computes A @ B exactly in the interpreter's engine orders and in each
    interleaving `_run_first(…, first)` of `firsts` (None)."""
    try:
        v = verify(p.evolve(verified=False))
    except VerifyError as e:
        return e
    ins, want = _ins(v)
    for order in _orders(v):
        q = v.evolve(schedule=dataclasses.replace(v.schedule, programs=order))
        assert np.array_equal(np.asarray(spatialc.evaluate(q, ins), dtype=np.int64), want)
    for first in firsts:
        assert np.array_equal(np.asarray(_run_first(v, ins, first), dtype=np.int64), want), first
    return None


def _at_end(p, site: int, engine: Engine, *ops):
    """`p` with `ops` appended to the program of site `site`'s `engine`."""
    return edit(p, engine, lambda prog: (*prog, *ops), (site,)).evolve(verified=False)


# ---- findings (mended): accepted, yet some interleaving races --------------------------------------------------


# handshake.Clocks checks a raise of a counter with an epoch only at the wait of the epoch it lands in; a raise no
# later wait counts (left over after the owner's last reset in the run) is never checked, so nothing shows it comes
# after that reset. One that can come earlier adds to an earlier epoch: the owner's wait passes on it before the raise
# that wait needed (the receiver's "page reserved", or the sender's "page landed"), and the clocks joined that raise
# all the same. Here the extra raise is at the end of an engine that nothing orders after the owner's last reset:
# - 2x2, one cluster: site 2 (row 1's A sender) ends by raising site 1's b_ready. Site 2 is ordered after site 3's last
#   a_ready raise, not after its b_ready raise; run site 2 ahead and site 1's last wait for b_ready passes on site 2's
#   raise, its McastSend lands in site 3 before site 3 reserved the page (the interpreter's FlowError; the general
#   CUDA form, which `lower` prints for it, copies into slot snd % DEPTH — a page site 3's compute may still read);
# - 1x2 over two clusters: site 2 (cluster 1) ends by raising site 0's a_ready (its send overtakes site 1's reserve)
#   or site 1's a_valid (site 1 publishes its A page before site 0's copy landed: compute reads a page never written).
LEFTOVER = [
    pytest.param((128, 128, 64, (2, 2), None), 2, Engine.WRITER, SemInc(B_READY, Site(1), 1), (0, 1, 2, 3), id="2x2"),
    pytest.param((128, 128, 64, (2, 2), None), 2, Engine.READER, SemInc(B_READY, Site(1), 1), (2, 0, 1, 3), id="2x2r"),
    pytest.param((128, 256, 64, (1, 2), 4), 2, Engine.WRITER, SemInc(A_READY, Site(0), 1), (2, 3, 0, 1), id="ready"),
    pytest.param((128, 256, 64, (1, 2), 4), 2, Engine.COMPUTE, SemInc(A_VALID, Site(1), 1), (2, 3, 0, 1), id="valid"),
]


@pytest.mark.parametrize("shape, site, engine, raise_, first", LEFTOVER)
def test_a_raise_left_over_after_the_last_epoch_is_refused(shape, site, engine, raise_, first):
    """Found by this review, now refused: rule 7 checks, once the run ends, every raise no wait counted against the
    owner's last reset (`handshake.Clocks.finish`)."""
    p = _at_end(_build(*shape), site, engine, raise_)
    with pytest.raises(HandshakeError, match="no wait counts this raise"):
        verify(p)


@pytest.mark.parametrize("shape, site, engine, raise_, first", LEFTOVER)
def test_the_refused_leftover_raises_do_race_in_some_interleaving(shape, site, engine, raise_, first):
    """The refusals above are justified: run as the interleaving `first` drives it, each program fails."""
    p = _at_end(_build(*shape), site, engine, raise_)
    ins, _ = _ins(p)
    with pytest.raises(FlowError):
        _run_first(p.evolve(verified=True), ins, first)


# ---- still refused, or still right -----------------------------------------------------------------------------


def test_the_interleavings_run_first_finds_are_right_for_the_built_programs():
    for shape in [(128, 128, 64, (2, 2), None), (128, 256, 64, (1, 2), 4)]:
        p = _build(*shape)
        sites = len(p.placement.items_of_site)
        assert _refused_or_right(p, list(itertools.permutations(range(sites)))[:: 5 if sites > 3 else 1]) is None


# A site's own end is after its group's last resets (site 3 of a 2x2 receives from both senders; site 1's end follows
# its last A page from site 0, so site 0's last a_ready reset): such a raise cannot land early.
@pytest.mark.parametrize(
    "site, engine, raise_",
    [(3, Engine.WRITER, SemInc(A_READY, Site(0), 1)), (1, Engine.READER, SemInc(A_READY, Site(0), 1))],
)
def test_a_raise_after_everything_it_could_overtake_is_refused_or_right(site, engine, raise_):
    p = _at_end(_build(128, 128, 64, (2, 2)), site, engine, raise_)
    assert _refused_or_right(p, list(itertools.permutations(range(4)))) is None


@pytest.mark.parametrize("group, mnk", [((1, 3), (128, 384, 64)), ((2, 4), (128, 256, 64)), ((4, 2), (256, 128, 64))])
@pytest.mark.parametrize("ring", ["A_ring", "B_ring"])
@pytest.mark.parametrize("depth", [1, 3])
def test_a_ring_of_another_depth_is_refused_or_right(group, mnk, ring, depth):
    p = _build(*mnk, group)
    bufs = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, depth_pages=depth)) if b.name == ring else b
        for b in p.buffers
    )
    sites = len(p.placement.items_of_site)
    firsts = [tuple(range(sites)), tuple(range(sites))[::-1], (sites - 1, *range(sites - 1))]
    assert _refused_or_right(p.evolve(buffers=bufs, verified=False), firsts) is None


def test_a_semaphore_listed_twice_is_ill_formed():
    p = _build(128, 128, 64, (2, 2))
    again = dataclasses.replace(p.semaphores[0], name="again", initial=1)
    with pytest.raises(IllFormedError, match="two semaphores have id"):
        verify(p.evolve(semaphores=(*p.semaphores, again), verified=False))


def test_groups_listing_their_sender_last_are_right():
    p = _build(128, 128, 64, (2, 2))
    groups = tuple(dataclasses.replace(g, sites=g.sites[::-1]) for g in p.placement.groups)
    p = p.evolve(placement=dataclasses.replace(p.placement, groups=groups), verified=False)
    assert _refused_or_right(p, [(0, 1, 2, 3), (3, 2, 1, 0)]) is None

"""Planted faults of a split tail that a review found getting through: a raise before the tail's partial write excused
by an equal write earlier, item coordinates used outside ITEM loops, a tail loop nested in a loop of one trip (printed
over every item before), and a tail item's fault named by another item. Each test failed before its fix."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.errors import CoverageError, SpatialError, VerifyError
from spatialc.ir.ids import BufferId, LoopVar, Site
from spatialc.ir.nodes import Engine, TensorRole
from spatialc.ir.ops import (
    Const,
    Loop,
    PackAcc,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    SemWait,
    WriteTiles,
)
from spatialc.passes.verify import verify

from .rewrite import edit, map_ops, replace
from .test_split_k import operands, reference
from .test_split_tail import BASE, tail_body, tailed

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

# 7 items of 32 × 32 in a row on 5 sites: one whole item a site, items 5 and 6 split 2 ways over sites 0–3, each
# site's ITEM loops two loops of one item (the first a "once" loop the handshake rule looks inside).
SEVEN = tailed(32, 224, 512)


def _rebase(base: int, step_x: int | None = None, wait: int | None = None):
    """An op rewriter: workspace reads and writes from tile `base` (item_x's step `step_x`), waits at `wait`."""

    def f(op):
        if isinstance(op, ReadTiles | WriteTiles) and op.tensor == WORK:
            (y, sy), (x, sx) = op.at.steps
            steps = ((y, sy), (x, sx if step_x is None else step_x))
            return (dataclasses.replace(op, at=dataclasses.replace(op.at, base=base, steps=steps)),)
        if wait is not None and isinstance(op, SemWait):
            return (SemWait(op.sem, wait),)
        return None

    return f


WORK = next(t.id for t in SEVEN.tensors if t.role == TensorRole.WORKSPACE)


def test_a_raise_before_the_tail_write_is_not_excused_by_an_equal_write_earlier():
    """BUG (passes/verify/partials.py `_level_of`): the handshake finds the contributor's partial write by equality
    (`op == target`) and, in a split tail, looks inside the ITEM loops of one item — so an equal WriteTiles earlier
    (here a spare partial of site 1's whole item, written in its first ITEM loop and followed by a barrier and a
    raise) stands in for the tail's, whose raise comes *before* the write. verify accepts; the emulation reports a
    race on the workspace between blocks 0 and 1."""
    p = SEVEN.evolve(
        verified=False,
        tensors=tuple(
            dataclasses.replace(t, tiles=(6, 2), elems=(96, 32)) if t.id == WORK else t for t in SEVEN.tensors
        ),
    )  # three slots: item 6's at tile 4 (as built), item 5's at 8, the spare at 0
    p = replace(p, Engine.READER, _rebase(-12, wait=2), (Site(0),))  # item 5's slot; both raises of site 1
    p = replace(p, Engine.WRITER, _rebase(-2, step_x=2), (Site(1),))  # item 1 → tile 0, item 5 → tile 8

    def spare_page(ops):
        whole, tail = ops
        body = list(whole.body)
        at = next(i for i, op in enumerate(body) if isinstance(op, ReleaseAcc))
        body[at:at] = [Reserve(BufferId(4), 1), PackAcc(BufferId(2), BufferId(4), 4, False), Push(BufferId(4), 1)]
        return (dataclasses.replace(whole, body=tuple(body)), tail)

    def raise_first(ops):
        whole, tail = ops
        wait, write, pop, barrier, inc = tail.body
        return (
            dataclasses.replace(whole, body=(*whole.body, wait, write, pop, barrier, inc)),
            dataclasses.replace(tail, body=(wait, inc, write, pop, barrier)),  # raised before the partial is there
        )

    p = edit(edit(p, Engine.COMPUTE, spare_page, (Site(1),)), Engine.WRITER, raise_first, (Site(1),))
    with pytest.raises(VerifyError):
        verify(p)


def test_item_coordinates_outside_an_item_loop_at_a_site_of_two_items_are_refused():
    """BUG (passes/verify/coverage.py `_check_item_loops`): where a program's ITEM loops start past the first item,
    the check returns after `_check_item_runs`, skipping the rule that item_y / item_x outside an ITEM loop name the
    site's only item. verify accepts site 0's reads of its whole item hoisted out of their loop; the interpreter
    then refuses the program (EvalError: item_y outside an ITEM loop, site 0 has 2 items)."""

    def hoist(ops):
        whole, tail = ops
        return (*whole.body, dataclasses.replace(whole, body=()), tail)

    p = edit(SEVEN.evolve(verified=False), Engine.READER, hoist, (Site(0),))
    with pytest.raises(CoverageError, match="outside an ITEM loop"):
        verify(p)


@emulation
@pytest.mark.emulation
def test_a_tail_loop_inside_a_loop_of_one_trip_is_refused_or_printed_as_the_last_item():
    """BUG (lower/cuda/common/sites.py `_tail_last`, general/printer.py `tail_item`): both look only at a program's
    top-level ops, while `item_counts` walks into loops. The compute engine's tail loop wrapped in a loop of one trip
    verifies and evaluates exactly, and the general form prints both of its ITEM loops as `for (item = 0; item <
    n_items; ...)`: the compute engine runs every item twice, and the emulated kernel deadlocks."""

    def wrap(ops):  # (site 4 holds whole items only: one ITEM loop)
        return (ops[0], Loop(LoopVar(8), Const(1), (ops[1],))) if len(ops) == 2 else ops

    v = verify(edit(BASE.evolve(verified=False), Engine.COMPUTE, wrap))
    ins = operands("int8", 96, 128, 512, 1)
    assert np.array_equal(spatialc.evaluate(v, ins), reference(ins))
    try:
        art = spatialc.lower(v)
    except SpatialError:
        return  # refused: what the kernel cannot print
    assert np.array_equal(spatialc.emulate(art, ins, mode="late", timeout=60), reference(ins))


def test_a_tail_items_wrong_sum_is_named_by_the_tail_item():
    """BUG (passes/verify/semantics_write.py `base`): the witness of a fault is the site's first item, not the
    items of the write's ITEM loop — a fault in item 10's sum (its contributor reading the owner's half of K) is
    reported as "item 0 (y 0, x 0): C tile (4, 4) …", naming a whole item beside item 10's tile."""

    def owners_half(body):
        def f(op):
            if isinstance(op, ReadTiles) and op.tensor in (BASE.tensors[0].id, BASE.tensors[1].id):
                return (dataclasses.replace(op, at=dataclasses.replace(op.at, base=0)),)
            return None

        return map_ops(body, f)

    with pytest.raises(VerifyError) as info:
        verify(tail_body(BASE, 1, Engine.READER, owners_half))
    assert "C tile (4, 4)" in str(info.value)
    assert "item 10 (y 2, x 2)" in str(info.value), str(info.value)

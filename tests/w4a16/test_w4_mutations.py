"""Rule 8 against edits of a W4A16 GEMM's dequant prologue: each named edit — a scale from another group, a zero
point from another column, signed weights read as unsigned, the two nibbles of a byte exchanged, the dequant
dropped or its scales and zero points exchanged — is refused with its own message; random edits of the saved
schedule (tests/mutants.py's) are refused or compute the reference bit for bit, never accepted and wrong; and with
rule 8 switched off the named edits are accepted and wrong, so the suite can fail.

The nibble order is the packed tensor's, fixed by numerics/w4.py (`pack_int4`); a Dequant states the order it reads
its page's bytes in (`low_first`), which a printer follows and the interpreter honours (rows 2i and 2i + 1 of each
tile exchanged when it is False), and rule 8 holds it to the tensor's."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable

import numpy as np
import pytest

import spatialc
import spatialc.passes.verify as verify_package
from spatialc.errors import SemanticError, VerifyError
from spatialc.ir.ids import LV_ITEM_X
from spatialc.ir.nodes import ComputeStage, Engine, SpatialProgram
from spatialc.ir.ops import Compute, Dequant, MatmulTiles, TileAddr, WeightFormat
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from .. import mutants
from ..rewrite import replace
from .w4_inputs import w4_inputs, w4_program


@pytest.fixture(scope="module")
def w4() -> SpatialProgram:
    """int4 weights with zero points, a group of 32 (two k-tiles): 2 K steps of 4 k-tiles, a 2x3 grid of items on
    4 sites (ITEM loops)."""
    return w4_program(40, 96, 256, "int4", zeros=True, group=32, block=(2, 2, 4), sites=4)


def _dequants(p: SpatialProgram, f: Callable[[Dequant], Dequant]) -> SpatialProgram:
    return replace(
        p,
        Engine.COMPUTE,
        lambda op: (
            (dataclasses.replace(op, op=f(op.op)),) if isinstance(op, Compute) and isinstance(op.op, Dequant) else None
        ),
    )


def _declared(p: SpatialProgram, f: Callable[[Dequant], Dequant]) -> SpatialProgram:
    """The dequant stage's declaration edited, and the schedule's ops with it (both say the same wrong thing)."""
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(f(s.kind.op)))
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Dequant)
        else s
        for s in p.stages
    )
    return _dequants(p.evolve(stages=stages), f)


def _shift(at: TileAddr, by: int) -> TileAddr:
    return dataclasses.replace(at, base=at.base + by)


def _no_item_x(at: TileAddr) -> TileAddr:
    return dataclasses.replace(at, steps=tuple(s for s in at.steps if s[0] != LV_ITEM_X))


def _k_stride(at: TileAddr) -> TileAddr:  # the K step's term halved: K steps 1, 2, … read earlier groups' scales
    return dataclasses.replace(at, steps=tuple((v, s // 2) for v, s in at.steps))


def _dequant_dropped(p: SpatialProgram) -> SpatialProgram:
    """The matmul multiplies the packed page itself: B's read ring in place of the dequantised one."""
    dq = next(s for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Dequant))

    def f(op):
        if isinstance(op, Compute) and isinstance(op.op, Dequant):
            return ()
        if isinstance(op, Compute) and isinstance(op.op, MatmulTiles):
            return (dataclasses.replace(op, ins=(op.ins[0], dq.ins[0])),)
        return None

    return replace(p, Engine.COMPUTE, f)


EDITS: dict[str, tuple[Callable[[SpatialProgram], SpatialProgram], type[VerifyError], str]] = {
    "scale from the next k-tile's group": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, rows=_shift(d.rows, 2))),
        SemanticError,
        r"gets scale and zero point tile row \d+, not its own row \d+",
    ),
    "scale of group 0 for every K step": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, rows=TileAddr(0))),
        SemanticError,
        r"gets scale and zero point tile row \d+, not its own row \d+",
    ),
    "scale's K step stride halved": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, rows=_k_stride(d.rows))),
        SemanticError,
        r"gets scale and zero point tile row \d+, not its own row \d+",
    ),
    "zero point from the next column": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, cols=_shift(d.cols, 1))),
        SemanticError,
        r"gets scale and zero point tile column \d+, not its own column \d+",
    ),
    "zero point of the first item's columns everywhere": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, cols=_no_item_x(d.cols))),
        SemanticError,
        r"gets scale and zero point tile column \d+, not its own column \d+",
    ),
    "scales and zero points exchanged": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, scale=d.zero, zero=d.scale)),  # type: ignore[arg-type]
        SemanticError,
        r"schedule op dequant int4 to bf16: zeros\[k/32, j\] \* \(x0 - scale\[g, j\]\).* where stage dequant_B",
    ),
    "signed weights dequantised as unsigned (schedule)": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, weights=WeightFormat.UINT4)),
        SemanticError,
        r"schedule op dequant uint4 .* where stage dequant_B declares dequant int4",
    ),
    "signed weights dequantised as unsigned (declared)": (
        lambda p: _declared(p, lambda d: dataclasses.replace(d, weights=WeightFormat.UINT4)),
        SemanticError,
        r"stage dequant_B dequantises uint4 weights, but B holds int4 values",
    ),
    "another group size (schedule)": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, group=64)),
        SemanticError,
        r"schedule op dequant int4 to bf16: scale\[k/64, j\]",
    ),
    "another group size (declared)": (
        lambda p: _declared(p, lambda d: dataclasses.replace(d, group=64)),
        SemanticError,
        r"reads scale \(8x96 bf16\) as the scales of B: one per group of 64 rows and column, 4x96 values",
    ),
    "the dequant dropped": (_dequant_dropped, VerifyError, r"Bq_ring"),
    "the two nibbles of a byte exchanged (schedule)": (
        lambda p: _dequants(p, lambda d: dataclasses.replace(d, low_first=False)),
        SemanticError,
        r"schedule op dequant int4 .* high nibble first where stage dequant_B declares",
    ),
    "the two nibbles of a byte exchanged (declared)": (
        lambda p: _declared(p, lambda d: dataclasses.replace(d, low_first=False)),
        SemanticError,
        r"stage dequant_B unpacks each byte high nibble first, but B's bytes hold row 2i in the low nibble",
    ),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_each_edit_of_the_dequant_is_refused_by_name(w4, name):
    edit, error, says = EDITS[name]
    with pytest.raises(error, match=says):
        verify(edit(w4))


@pytest.mark.parametrize("name", [n for n in EDITS if "declared" not in n and n != "the dequant dropped"])
def test_without_rule_8_the_edits_compute_something_else(w4, name, monkeypatch):
    """The suite can fail: rules 1–7 alone accept each schedule edit, and it computes another C than the stages
    declare (the inputs' scales differ group by group and zero points column by column)."""
    monkeypatch.setattr(verify_package, "check_semantics", lambda *a: None)
    edited = verify(EDITS[name][0](w4))
    x = w4_inputs(w4, seed=5)
    try:
        c = spatialc.evaluate(edited, x)
    except spatialc.SpatialError:  # a scale read past its tensor (rule 8's proof is what keeps reads inside)
        return
    assert not np.array_equal(c, reference(w4, x))


W4_PROGRAMS: dict[str, Callable[[], SpatialProgram]] = {
    "int4 zeros, items loop": lambda: w4_program(40, 96, 256, "int4", zeros=True, group=32, block=(2, 2, 4), sites=4),
    "uint4 fp16, one item a site": lambda: w4_program(
        20, 48, 128, "uint4", "fp16", zeros=True, group=64, block=(1, 1, 2)
    ),
    "mxfp4 decode row": lambda: w4_program(1, 64, 128, "mxfp4", block=(1, 2, 2), sites=2),
    "int4 split over K": lambda: w4_program(16, 64, 512, "int4", zeros=True, split_k=2, block=(1, 2, 2)),
}


@pytest.mark.parametrize("name", list(W4_PROGRAMS))
def test_random_edits_are_never_accepted_and_wrong(name):
    p = W4_PROGRAMS[name]()
    x = w4_inputs(p, seed=1)
    ref = reference(p, x)
    doc = json.loads(spatialc.to_json(p))
    rng = random.Random(f"w4:{name}")
    tally = mutants.Tally()
    for _ in range(60):
        edited = rng.choice(mutants.EDITS)(doc, rng)
        if edited is not None:
            mutants.judge(name, p, json.dumps(edited[0]), edited[1], x, ref, tally)
    assert not tally.holes, "\n".join(tally.holes[:5])
    assert tally.counts["refused"] > 0


@pytest.fixture(scope="module")
def split() -> SpatialProgram:
    """int4 weights split over K on 4 sites an item: each site dequantises its own K steps' pages."""
    return w4_program(16, 64, 1024, "int4", zeros=True, split_k=4, block=(1, 2, 2))


def test_split_k_runs_each_sites_own_groups(split):
    assert split.placement is not None and split.placement.splits == 4 and split.verified
    x = w4_inputs(split, seed=7)
    assert np.array_equal(spatialc.evaluate(split, x), reference(split, x))


def test_every_site_dequantising_with_the_first_sites_groups_is_refused(split):
    """The edit a with_dequant that placed one dequant for all sites would make: the other sites' pages scaled by
    the first site's K range's groups."""
    first = next(
        op.op
        for prog in split.schedule.programs  # type: ignore[union-attr]
        for op in mutants.walk(prog.ops)
        if isinstance(op, Compute) and isinstance(op.op, Dequant)
    )
    edited = _dequants(split, lambda d: dataclasses.replace(d, rows=first.rows))
    with pytest.raises(SemanticError, match=r"gets scale and zero point tile row \d+, not its own row \d+"):
        verify(edited)

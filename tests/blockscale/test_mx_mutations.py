"""Rule 8 on an MXFP8 schedule (issue 34 item 2): the block-scale proof (verify/blockscale.py) holds each e8m0 scale
to its own (row, group) of A and (group, column) of B where a group is 32 of K — one K step of 2 tiles. Edits of
test_mutations.py's kinds on an MX program — a scale from the wrong K group, row or column, a group promoted twice
or skipped, the tensors exchanged, a step spanning two groups — are each refused with its own message, and the
sweep of every promotion address moved has no hole: an edit rule 8 accepts computes the reference bit for bit. The
layouts against the scales' element type (issue 46): a group below 128 only of e8m0 scales, both operands', and
e8m0 scales only in groups of 32 — each refused by one line; the step read from the layouts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spatialc
from spatialc.errors import SemanticError, VerifyError
from spatialc.ir.ids import LV_ITEM_Y
from spatialc.ir.nodes import DType
from spatialc.ir.ops import KScale, TileAddr
from spatialc.numerics.blockscale import promotion_k
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from .programs import inputs_of, scaled
from .test_mutations import _sweep, compute, declared, matmuls, moved, rescaled, scales


@pytest.fixture(scope="module")
def base():
    """Items of 2x2 tiles, four MX groups of K (128 = 4 × 32: K steps of 2 tiles), an ITEM loop on each of three
    sites."""
    p = scaled(64, 96 * 4, 128, scales="mx", block=(2, 2, 2), sites=3)
    assert p.plans[0].block.ibw == 2
    return p


@pytest.fixture(scope="module")
def truth(base):
    ins = inputs_of(base, seed=7)
    return ins, reference(base, ins)


def _a_k(k: int):
    return lambda mm: dataclasses.replace(mm, scales=dataclasses.replace(mm.scales, a=KScale(mm.scales.a.tensor, 1, k)))


MUTATIONS = {
    "scales of the next group": (
        rescaled(k=moved(2)),
        r"promotes K tile 0 with the scales of the step at K tile 2: a scale of another K group than its product's",
    ),
    "scales of group 0 at every step": (
        rescaled(k=TileAddr(0)),
        r"promotes K tile 2 with the scales of the step at K tile 0",
    ),
    "scales of every other group": (
        rescaled(k=moved(k=4)),
        r"promotes K tile 2 with the scales of the step at K tile 4",
    ),
    "A's scales a tile row down": (rescaled(rows=moved(1)), r"scale_a \(A's scales\) at tile row \d+, not its own \d+"),
    "A's scales of row tile 0 for every item": (rescaled(rows=TileAddr(0)), r"scale_a \(A's scales\) at tile row 0"),
    "B's scales a tile column on": (rescaled(cols=moved(1)), r"scale_b \(B's\) at tile column \d+, not its own \d+"),
    "B's scales at the item's row": (
        rescaled(cols=lambda at: TileAddr(0, ((LV_ITEM_Y, 2),))),
        r"scale_b \(B's\) at tile column",
    ),
    "a group promoted twice": (
        lambda p: compute(p, matmuls(lambda op: (op, op))),
        r"sums k-tiles 0\.\.7 \(16 products\) of 0\.\.7; K needs 0\.\.7 each exactly once",
    ),
    "a group skipped": (lambda p: compute(p, matmuls(lambda op: ())), r"sums no products of 0\.\.\d+; K needs"),
    "A's and B's scale tensors exchanged": (
        lambda p: compute(
            p,
            matmuls(
                scales(
                    a=lambda a: dataclasses.replace(a, tensor=a.tensor + 1),
                    b=lambda b: dataclasses.replace(b, tensor=b.tensor - 1),
                )
            ),
        ),
        r"promoted by scale_b\[1x32\] scale_a\[32x1\]",
    ),
    "a step spanning two of A's groups (groups of 16)": (
        lambda p: declared(p, _a_k(16)),
        r"a K step of 2 tiles from K tile 2·k may span two groups of 16 elements of scale_a",
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_each_edit_is_refused_by_rule_8(base, name):
    edit, message = MUTATIONS[name]
    with pytest.raises(SemanticError, match=message):
        verify(edit(base))


@pytest.mark.parametrize(
    "name", ["scales of the next group", "A's scales a tile row down", "B's scales a tile column on"]
)
def test_a_refused_edit_computes_something_else(base, truth, name):
    """The interpreter runs the edit (unverified) to another C: the refusal is of a real fault, not of a form."""
    ins, ref = truth
    assert not np.array_equal(spatialc.evaluate(MUTATIONS[name][0](base), ins), ref)


def test_sweep_of_the_promotion_addresses_has_no_holes(base, truth):
    ins, ref = truth
    refused, same, holes = [], [], []
    for name, mutant in _sweep(base).items():
        try:
            checked = verify(mutant)
        except VerifyError:
            refused.append(name)
            continue
        try:
            ok = np.array_equal(spatialc.evaluate(checked, ins), ref)
        except Exception:  # a verified program that fails at run time is a hole too
            ok = False
        (same if ok else holes).append(name)
    assert holes == [], holes
    assert len(refused) >= 60
    unchanged = {name for name, mutant in _sweep(base).items() if mutant.schedule == base.schedule}
    assert set(same) == unchanged and len(unchanged) == 9, same  # only the edits that edit nothing are accepted


def test_a_128_wide_step_over_mx_groups_is_refused():
    """A schedule whose K step is DeepGEMM's 128 (8 tiles) promoted with scales of MX's groups of 32: every step would
    take its first group's scale for four groups, refused as a step spanning groups."""
    p = scaled(64, 96, 256, block=(2, 2, 8))
    mx = declared(
        p,
        lambda mm: dataclasses.replace(mm, scales=dataclasses.replace(mm.scales, a=KScale(mm.scales.a.tensor, 1, 32))),
    )
    with pytest.raises(SemanticError, match=r"a K step of 8 tiles from K tile 8·k may span two groups of 32 elements"):
        verify(mx)


def _typed(p, types, k=None):
    """`p` with its scale tensors' element types `types` (A's, B's) and, where given, both layouts' group `k`."""
    names = ("scale_a", "scale_b")
    ts = tuple(dataclasses.replace(t, dtype=types[names.index(t.name)]) if t.name in names else t for t in p.tensors)
    p = dataclasses.replace(p, tensors=ts, verified=False)
    if k is None:
        return p
    return declared(
        p,
        lambda mm: dataclasses.replace(
            mm,
            scales=dataclasses.replace(
                mm.scales, a=dataclasses.replace(mm.scales.a, k=k), b=dataclasses.replace(mm.scales.b, k=k)
            ),
        ),
    )


E8, F32 = DType.E8M0, DType.FLOAT32
# Issue 46: the layouts against the scales' element type (verify/blockscale.py's check_scale_types), every other rule
# holding: each edit's steps lie within its groups.
TYPED = {
    "MX's groups of 32 with float32 scales": (
        lambda p, _: _typed(p, (F32, F32)),
        r"^stage matmul is promoted by scale_a and scale_b: scale_a holds float32 scales of groups of 32 elements of"
        r" K; a group narrower than 128 is OCP MX's, of e8m0 scales$",
    ),
    "e8m0 scales of groups of 64": (
        lambda p, _: _typed(p, (E8, E8), k=64),
        r"^stage matmul is promoted by scale_a and scale_b: scale_a holds e8m0 scales of groups of 64 elements of K;"
        r" OCP MX's e8m0 scales group 32$",
    ),
    "e8m0 scales in DeepGEMM's groups of 128": (
        lambda _, q: _typed(q, (E8, E8)),
        r"^stage matmul is promoted by scale_a and scale_b: scale_a holds e8m0 scales of groups of 128 elements",
    ),
    "A's scales e8m0, B's float32": (
        lambda p, _: _typed(p, (E8, F32)),
        r"^stage matmul is promoted by scale_a and scale_b, of element types e8m0 and float32: e8m0 scales \(OCP MX\)"
        r" are both operands' or neither's$",
    ),
}


@pytest.fixture(scope="module")
def deepgemm():
    return scaled(64, 96, 256, block=(2, 2, 8))


@pytest.mark.parametrize("name", list(TYPED))
def test_a_layout_of_the_wrong_scale_type_is_refused_by_one_line(base, deepgemm, name):
    edit, message = TYPED[name]
    with pytest.raises(SemanticError, match=message) as e:
        verify(edit(base, deepgemm))
    assert "\n" not in str(e.value)


def test_the_step_is_read_from_the_layouts_the_hole_it_closes(base, truth):
    """An MX program whose scales were made float32 (the review's hole.py): its step is still its layouts' 32 — the
    interpreter and the bound agree (it was 128 from scale_a's type, and the interpreter failed its own bound) —
    and verify refuses it (above); the programs verify accepts keep their steps."""
    ins, _ = truth
    q = TYPED["MX's groups of 32 with float32 scales"][0](base, None)
    assert promotion_k(q) == 32 and promotion_k(base) == 32
    as_floats = {**ins, "scale_a": ins["scale_a"].astype(np.float32), "scale_b": ins["scale_b"].astype(np.float32)}
    ok, how = spatialc.tolerance(q).check(spatialc.evaluate(q, as_floats), as_floats)
    assert ok and "promoted every 32 of K" in how, how
    assert promotion_k(scaled(64, 96, 256)) == 128

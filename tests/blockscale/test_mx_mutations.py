"""Rule 8 on an MXFP8 schedule (issue 34 item 2): the block-scale proof (verify/blockscale.py) holds each e8m0 scale
to its own (row, group) of A and (group, column) of B where a group is 32 of K — one K step of 2 tiles. Edits of
test_mutations.py's kinds on an MX program — a scale from the wrong K group, row or column, a group promoted twice
or skipped, the tensors exchanged, a step spanning two groups — are each refused with its own message, and the
sweep of every promotion address moved has no hole: an edit rule 8 accepts computes the reference bit for bit. The
layouts against the scales' element type (issue 46): a group below 128 only of e8m0 scales, both operands', and
e8m0 scales only in groups of 32 — each refused by one line; the step read from the layouts."""

from __future__ import annotations

import dataclasses
import json

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

from ..rewrite import json_dicts
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


def _saved(p, scales=None, tensors=None):
    """`p` saved, its file edited — each BlockScales' (the declaration's and every scheduled op's alike) fields of
    `scales` ({"a": {"outer": 0}}), each named tensor's fields of `tensors` — and loaded (from_json verifies it
    again)."""
    doc = json.loads(spatialc.to_json(p))
    for node in json_dicts(doc["program"]):
        if node.get("type") == "BlockScales":
            for which, fields in (scales or {}).items():
                node[which].update(fields)
    for t in doc["program"]["tensors"]:
        t.update((tensors or {}).get(t["name"], {}))
    return spatialc.from_json(json.dumps(doc))


@pytest.fixture(scope="module")
def mx384():
    """MX steps of 2 tiles over K = 384: room for a group of 192 whose steps lie within it (review 47's r9)."""
    return scaled(64, 64, 384, scales="mx", block=(2, 2, 2))


WHERE = r"^stage matmul is promoted by scale_a and scale_b: "
# Review 47: a saved file's layouts against the operands (check_scale_types), every other rule holding. Each verified
# before: a block of outer 0 printed `(r + 0) / 0`, of -1 read the scales at negative rows; a scale tensor of the
# wrong shape multiplied K past it by zero (or the interpreter raised about an element it does not have); a float32
# group of 192 was promoted by the reference with group 0's scale over K 128 … 191 and 192 … 255 alike.
SAVED = {
    "MX: A's blocks of outer 0": (
        lambda p, _, __: _saved(p, {"a": {"outer": 0}}),
        WHERE + r"scale_a's blocks span outer = 0 rows of A; a block spans one row or more$",
    ),
    "MX: A's blocks of outer -1": (
        lambda p, _, __: _saved(p, {"a": {"outer": -1}}),
        WHERE + r"scale_a's blocks span outer = -1 rows of A; a block spans one row or more$",
    ),
    "MX: A's e8m0 blocks of 2 rows (its tensor of their shape)": (
        lambda p, _, __: _saved(p, {"a": {"outer": 2}}, {"scale_a": {"elems": [32, 4], "tiles": [2, 1]}}),
        WHERE + r"scale_a holds e8m0 scales of blocks of outer = 2 rows of A; OCP MX's e8m0 scales are one a row"
        r" \(outer = 1\)$",
    ),
    "MX: scale_a of 2 groups of K where K = 128 takes 4": (
        lambda p, _, __: _saved(p, tensors={"scale_a": {"elems": [64, 2]}}),
        WHERE + r"scale_a holds 64x2 scales, but its layout \(1x32 blocks of A's 64x128 elements\) takes 64x4$",
    ),
    "DeepGEMM: B's blocks of outer 0": (
        lambda _, q, __: _saved(q, {"b": {"outer": 0}}),
        WHERE + r"scale_b's blocks span outer = 0 columns of B; a block spans one column or more$",
    ),
    "DeepGEMM: A's blocks of outer -2": (
        lambda _, q, __: _saved(q, {"a": {"outer": -2}}),
        WHERE + r"scale_a's blocks span outer = -2 rows of A",
    ),
    "DeepGEMM: B's blocks of 48 columns, its tensor unchanged": (
        lambda _, q, __: _saved(q, {"b": {"outer": 48}}),
        WHERE + r"scale_b holds 2x1 scales, but its layout \(128x48 blocks of B's 256x96 elements\) takes 2x2$",
    ),
    "DeepGEMM: scale_b 1x1 where K = 256 takes 2 groups": (
        lambda _, q, __: _saved(q, tensors={"scale_b": {"elems": [1, 1]}}),
        WHERE + r"scale_b holds 1x1 scales, but its layout \(128x128 blocks of B's 256x96 elements\) takes 2x1$",
    ),
    "float32 scales, A's group 192 of K = 384": (
        lambda _, __, r: _as_group_192(r),
        WHERE + r"scale_a holds float32 scales of groups of 192 elements of K; a group is a multiple of 128 \(the"
        r" promotion step\) or all of K \(384\)$",
    ),
}


def _as_group_192(p):
    return _saved(
        p,
        {"a": {"k": 192}, "b": {"k": 128}},
        {"scale_a": {"dtype": "float32", "elems": [64, 2]}, "scale_b": {"dtype": "float32", "elems": [3, 64]}},
    )


@pytest.mark.parametrize("name", list(SAVED))
def test_a_saved_layout_its_operands_contradict_is_refused_by_one_line(base, deepgemm, mx384, name):
    edit, message = SAVED[name]
    with pytest.raises(SemanticError, match=message) as e:
        verify(edit(base, deepgemm, mx384))
    assert "\n" not in str(e.value)


def test_the_group_of_192_is_a_real_fault_and_a_group_of_all_k_is_not(base, mx384):
    """The float32 group of 192: the interpreter promotes each 32 of K with its own group's scale, the reference
    every 128 with the group of the step's first element (`step_of`), so the two differ — verify refuses it, where
    the reference and the interpreter would each blame the other. A group of all of K (A's, 128 = K: one group)
    stays accepted."""
    q = _as_group_192(mx384)
    ins = inputs_of(q, seed=4)
    assert not np.array_equal(spatialc.evaluate(q, ins), reference(q, ins))
    whole = _saved(
        base,
        {"a": {"k": 128}, "b": {"k": 128}},
        {"scale_a": {"dtype": "float32", "elems": [64, 1]}, "scale_b": {"dtype": "float32", "elems": [1, 384]}},
    )
    assert verify(whole).verified

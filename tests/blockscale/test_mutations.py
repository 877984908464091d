"""Rule 8 against edits of a block-scaled schedule (issue 34, item 4): a scale from the wrong K group, A's scales
at another row block or B's at another column block, a step promoted twice or skipped, a promotion without its
scales or with the two tensors exchanged, a step that spans two groups — each refused with its own message; and a
sweep of every address of the promotion moved, each refused or computing the same as the schedule it edits.
0 accepted-and-wrong: an edit rule 8 accepts is run by the interpreter and must equal the reference bit for bit.

In this IR the promotion is part of each K step's op (`MatmulTiles.scales`): there is no partial accumulator to
promote before its group is complete. What such a promotion gets wrong — part of a group's products multiplied by
another group's scale — is a step spanning two groups, refused here as the spec edit below shows."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

import spatialc
from spatialc.errors import SemanticError, VerifyError
from spatialc.ir.ids import LV_ITEM_X, LV_ITEM_Y, LV_K
from spatialc.ir.nodes import ComputeStage, Engine, SpatialProgram
from spatialc.ir.ops import ChoreoOp, Compute, KScale, Loop, MatmulTiles, TileAddr
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from .programs import inputs_of, scaled

Ops = tuple[ChoreoOp, ...]


def program() -> SpatialProgram:
    """Items of 2x2 tiles, two K groups of A and of B (1x128, 128x128), three column blocks of B's scales, an ITEM
    loop on each of three sites."""
    return scaled(64, 96 * 4, 512, block=(2, 2, 8), sites=3)


def compute(p: SpatialProgram, f: Callable[[Ops], Ops]) -> SpatialProgram:
    progs = tuple(
        dataclasses.replace(q, ops=f(q.ops)) if q.engine == Engine.COMPUTE else q
        for q in p.schedule.programs  # type: ignore[union-attr]
    )
    return dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, programs=progs), verified=False)


def matmuls(f: Callable[[Compute], ChoreoOp | tuple[ChoreoOp, ...]]) -> Callable[[Ops], Ops]:
    """Each block-scaled matmul op replaced by f(op) (one op, or several, or none)."""

    def go(ops: Ops) -> Ops:
        out: list[ChoreoOp] = []
        for op in ops:
            if isinstance(op, Loop):
                out.append(dataclasses.replace(op, body=go(op.body)))
            elif isinstance(op, Compute) and isinstance(op.op, MatmulTiles):
                got = f(op)
                out.extend(got if isinstance(got, tuple) else (got,))
            else:
                out.append(op)
        return tuple(out)

    return go


def scales(**fields) -> Callable[[Compute], ChoreoOp]:
    """The op with its BlockScales' fields replaced (each a value, or a function of the old one)."""

    def go(op: Compute) -> ChoreoOp:
        s = op.op.scales  # type: ignore[union-attr]
        new = {k: (v(getattr(s, k)) if callable(v) else v) for k, v in fields.items()}
        return dataclasses.replace(op, op=dataclasses.replace(op.op, scales=dataclasses.replace(s, **new)))

    return go


def moved(base: int = 0, **strides: int) -> Callable[[TileAddr], TileAddr]:
    """An address with `base` added and the strides of the named loop variables set."""
    names = {"k": LV_K, "item_y": LV_ITEM_Y, "item_x": LV_ITEM_X}

    def go(at: TileAddr) -> TileAddr:
        steps = dict(at.steps)
        for name, stride in strides.items():
            steps[names[name]] = stride
        return TileAddr(at.base + base, tuple((v, s) for v, s in steps.items() if s))

    return go


def rescaled(**fields) -> Callable[[SpatialProgram], SpatialProgram]:
    """The edit that promotes each step with its scales read at other addresses (`scales`' fields)."""
    return lambda p: compute(p, matmuls(scales(**fields)))


def declared(p: SpatialProgram, f: Callable[[MatmulTiles], MatmulTiles]) -> SpatialProgram:
    """`p` with its matmul stage's op and every scheduled one replaced by f(op): a different program declared."""
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(f(s.kind.op)))
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles)
        else s
        for s in p.stages
    )
    p = dataclasses.replace(p, stages=stages)
    return compute(p, matmuls(lambda op: dataclasses.replace(op, op=f(op.op))))  # type: ignore[arg-type]


def _a_group(k: int):
    return lambda mm: dataclasses.replace(mm, scales=dataclasses.replace(mm.scales, a=KScale(mm.scales.a.tensor, 1, k)))


MUTATIONS: dict[str, tuple[Callable[[SpatialProgram], SpatialProgram], str]] = {
    "scales of the next K group": (
        rescaled(k=moved(8)),
        r"promotes K tile 0 with the scales of the step at K tile 8: a scale of another K group than its product's",
    ),
    "scales of group 0 at every step": (
        rescaled(k=TileAddr(0)),
        r"promotes K tile 8 with the scales of the step at K tile 0",
    ),
    "scales of every other group": (
        rescaled(k=moved(k=16)),
        r"promotes K tile 8 with the scales of the step at K tile 16",
    ),
    "A's scales a tile row down": (
        rescaled(rows=moved(1)),
        r"promotes with scale_a \(A's scales\) at tile row \d+, not its own \d+",
    ),
    "A's scales of the next item's rows": (
        rescaled(rows=moved(2)),
        r"scale_a \(A's scales\) at tile row",
    ),
    "A's scales of row block 0 for every item": (
        rescaled(rows=TileAddr(0)),
        r"scale_a \(A's scales\) at tile row 0, not its own",
    ),
    "B's scales of the next column block": (
        rescaled(cols=moved(8)),
        r"promotes with scale_b \(B's\) at tile column \d+, not its own \d+",
    ),
    "B's scales at the item's row": (
        rescaled(cols=lambda at: TileAddr(0, ((LV_ITEM_Y, 2),))),
        r"scale_b \(B's\) at tile column",
    ),
    "a step promoted twice": (
        lambda p: compute(p, matmuls(lambda op: (op, op))),
        r"sums k-tiles 0\.\.31 \(64 products\) of 0\.\.31; K needs 0\.\.31 each exactly once",
    ),
    "a step skipped (its promotion left out)": (
        lambda p: compute(p, matmuls(lambda op: ())),
        r"sums no products of 0\.\.\d+; K needs",
    ),
    "promoted without its scales": (
        lambda p: compute(p, matmuls(lambda op: dataclasses.replace(op, op=dataclasses.replace(op.op, scales=None)))),
        r"schedule op matmul 2x2x8 e4m3 where stage matmul declares matmul 2x2x8 e4m3 promoted by scale_a",
    ),
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
        r"schedule op matmul 2x2x8 e4m3 promoted by scale_b\[1x128\] scale_a\[128x128\]",
    ),
    "a step spanning two of A's groups (groups of 64)": (
        lambda p: declared(p, _a_group(64)),
        r"a K step of 8 tiles from K tile 8·k may span two groups of 64 elements of scale_a",
    ),
}


@pytest.fixture(scope="module")
def base() -> SpatialProgram:
    return program()


@pytest.fixture(scope="module")
def truth(base):
    ins = inputs_of(base, seed=7)
    return ins, reference(base, ins)


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_each_edit_is_refused_by_rule_8(base, truth, name):
    edit, message = MUTATIONS[name]
    mutant = edit(base)
    with pytest.raises(SemanticError, match=message):
        verify(mutant)


def test_split_k_contributors_are_held_to_their_own_groups():
    """A split-K program's sites each promote their own K steps: the proof follows the partial sums to the products
    their writers promoted, and one of group 0's scales at every step is refused."""
    p = scaled(32, 64, 1024, split_k=2, form="general")
    assert p.placement.splits == 2  # type: ignore[union-attr]
    ins = inputs_of(p, seed=9)
    assert spatialc.tolerance(p).check(spatialc.evaluate(p, ins), ins)[0]
    with pytest.raises(SemanticError, match=r"with the scales of the step at K tile 0: a scale of another K group"):
        verify(rescaled(k=TileAddr(0))(p))


@pytest.mark.parametrize(
    "name", ["scales of the next K group", "A's scales a tile row down", "B's scales of the next column block"]
)
def test_a_refused_edit_computes_something_else(base, truth, name):
    """The interpreter runs the edit (unverified) to another C: the refusal is of a real fault, not of a form."""
    ins, ref = truth
    c = spatialc.evaluate(MUTATIONS[name][0](base), ins)
    assert not np.array_equal(c, ref)


def _sweep(p: SpatialProgram) -> dict[str, SpatialProgram]:
    out = {}
    for field in ("rows", "cols", "k"):
        for base in (-8, -2, -1, 1, 2, 8, 16):
            out[f"{field} base {base:+d}"] = rescaled(**{field: moved(base)})(p)
        for var in ("k", "item_y", "item_x"):
            for stride in (0, 1, 2, 4, 8, 16):
                out[f"{field} {var} stride {stride}"] = rescaled(**{field: moved(**{var: stride})})(p)
    out["rows and cols exchanged"] = compute(
        p,
        matmuls(lambda op: scales(rows=op.op.scales.cols, cols=op.op.scales.rows)(op)),  # type: ignore[union-attr]
    )
    return out


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
    assert len(refused) >= 40
    unchanged = {name for name, mutant in _sweep(base).items() if mutant.schedule == base.schedule}
    assert len(unchanged) == 9  # each address's own stride set again, and a stride 0 of a variable it has not
    assert set(same) == unchanged, same

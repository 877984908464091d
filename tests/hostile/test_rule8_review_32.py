"""A hostile review of rule 8 for attention (issue 32): schedules and declarations edited so that verify accepts
them while the interpreter's O and LSE differ from the declared function's (`spatialc.reference`), beyond
`spatialc.tolerance`.

One hole was found, in seven forms, now refused by rule 8 (`verify/attention._declared`; each test below failed
before the fix): the declaration `Attention(scale, seq_q, seq_kv, group, causal)` was never held to the tensors it
declares over. The proof builds the mask from the declaration's seq_q and seq_kv; the reference
(`numerics.attention`) takes the rows from the tensors. So

1. the declaration's seq_kv lowered (72 → 60) with the schedule's mask following it (c < 60) verified, and masked
   keys 60..71 the reference keeps;
2. the declaration's seq_q raised (40 → 56) with the causal offset following it (seq_kv − seq_q = 16) verified,
   and masked keys the reference keeps;
3. Q's tensor of fewer rows (36) than O's and the declaration's (40) verified: O held 40 rows, the reference 36;
4. V's tensor of head_dim 16 under Q's, K's and O's 32 verified: O held 32 columns, the reference 16;
5. O's tensor of head_dim 16 (V's 32) verified, and held half of each row;
6. LSE's tensor of two columns verified (the reference's has one);
7. V's tensor of 4 heads (its tile grid too) under K's 2 verified, and the reference refused to run it (ValueError:
   4 query heads do not read 4 KV heads 2 to one).

Every attack tried, and its outcome (the programs: `scheduled(1, 4, 40, 72, 32, kv_heads=2, causal=True)`, GQA of
group 2, causal, two sites; the square one `scheduled(1, 2, 64, 64, 64)`):

| attack                                                                   | outcome                                  |
|--------------------------------------------------------------------------|------------------------------------------|
| declaration seq_kv 72 → 60, schedule unchanged                           | refused, rule 8 (mask's c < 72 ≠ X)      |
| declaration seq_kv 72 → 60, mask c < 60 (offset kept 32 → 0 too)         | refused, rule 8 (mask ≠ X)               |
| declaration seq_kv 72 → 60, mask c < 60 and offset 32 → 20               | HOLE, fixed (1)                          |
| declaration seq_q 40 → 56, causal offset 32 → 16                         | HOLE, fixed (2)                          |
| declaration scale × 2, schedule unchanged                                | refused, rule 8 (S · scale ≠ X)          |
| declaration causal → False, schedule unchanged                           | refused, rule 8 (mask ≠ keep)            |
| declaration group 2 → 1                                                  | refused, rule 1 (plan's heads ≠ O's)     |
| tensor q's rows 40 → 36                                                  | HOLE, fixed (3)                          |
| tensor v's head_dim 32 → 16                                              | HOLE, fixed (4)                          |
| tensor o's head_dim 32 → 16                                              | HOLE, fixed (5)                          |
| tensor lse's columns 1 → 2                                               | HOLE, fixed (6)                          |
| tensor v's groups 2 → 4 (tile grid 32x2)                                 | HOLE, fixed (7)                          |
| tensor v's groups 2 → 1 (tile grid 8x2)                                  | refused, bounds (reads outside v)        |
| tensor k's rows 72 → 60 (tile grid kept)                                 | refused, rule 1 (tile grid too large)    |
| tensor k's groups 2 → 4 (tile grid kept)                                 | refused, rule 1 (tile grid too small)    |
| tensor lse's groups 4 → 2                                                | refused, rule 8 (LSE's rows)             |
| placement: both items on site 0, programs unchanged                      | refused, coverage (site holds 2 items)   |
| placement: the two sites' items exchanged                                | neutral (every item still run once)      |
| one site (an ITEM loop): the ITEM loop one short in every engine         | refused, coverage (ITEM loop count)      |
| heads permuted: Q read and O, LSE written at head group − 1 − h          | refused, rule 8 (Q's head ≠ the item's)  |
| transpose_b on P·V (3x2x4 block)                                         | refused, rule 8 (block vs pages)         |
| transpose_b on P·V, square (4x4x4: bw = head_dim tiles)                  | refused, rule 8 (unlike tiles)           |
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import spatialc
from spatialc.errors import SemanticError
from spatialc.ir.nodes import ComputeStage, SpatialProgram, TensorRole
from spatialc.ir.ops import Apply, Attention, Compute, Expr, Lit, Loop, Map
from spatialc.passes.verify import verify

from ..attention.mutants import engines, ring, scheduled


def gqa() -> SpatialProgram:
    return scheduled(1, 4, 40, 72, 32, kv_heads=2, causal=True)


def declared(p: SpatialProgram, **fields: object) -> SpatialProgram:
    """`p` with its Attention declaration's fields changed."""
    stages = tuple(
        dataclasses.replace(s, kind=dataclasses.replace(s.kind, op=dataclasses.replace(s.kind.op, **fields)))
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Attention)
        else s
        for s in p.stages
    )
    return p.evolve(stages=stages)


def tensor(p: SpatialProgram, name: str, **fields: object) -> SpatialProgram:
    return p.evolve(tensors=tuple(dataclasses.replace(t, **fields) if t.name == name else t for t in p.tensors))


def lits(p: SpatialProgram, changed: dict[float, float]) -> SpatialProgram:
    """`p` with the mask map's constants changed (old value → new)."""
    x = ring(p, "x_ring")

    def expr(e: Expr) -> Expr:
        if isinstance(e, Lit) and e.value in changed:
            return Lit(changed[e.value])
        if isinstance(e, Apply):
            return Apply(e.op, tuple(expr(a) for a in e.args), e.params)
        return e

    def go(ops):
        return tuple(
            dataclasses.replace(o, body=go(o.body))
            if isinstance(o, Loop)
            else dataclasses.replace(o, op=Map(expr(o.op.expr)))
            if isinstance(o, Compute) and o.outs == (x,)
            else o
            for o in ops
        )

    return engines(p, "compute", go)


def wrong_when_run(p: SpatialProgram) -> bool:
    """Whether the interpreter's outputs of `p`, run unverified, lie outside the declared function's tolerance."""
    rng = np.random.default_rng(0)
    given = {
        t.name: rng.standard_normal((t.groups, *t.elems)).astype(np.float32)
        for t in p.tensors
        if t.role == TensorRole.INPUT
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = spatialc.evaluate(p, given)
        try:
            return not spatialc.tolerance(p).check(out, given)[0]
        except ValueError:  # the declared function of heads its tensors do not have: none to compare with
            return True


HOLES = {
    "declared seq_kv 60, the mask's c < 60": (
        lambda: lits(declared(gqa(), seq_kv=60), {72.0: 60.0, 32.0: 20.0}),
        r"declares seq_kv = 60 keys a KV head; k holds 72",
    ),
    "declared seq_q 56, the causal offset 16": (
        lambda: lits(declared(gqa(), seq_q=56), {32.0: 16.0}),
        r"declares seq_q = 56 query rows a head; q holds 40",
    ),
    "q of 36 rows": (lambda: tensor(gqa(), "q", elems=(36, 32)), r"declares seq_q = 40 query rows a head; q holds 36"),
    "v of head_dim 16": (lambda: tensor(gqa(), "v", elems=(72, 16)), r"v holds 72x16 elements a head, not 72x32"),
    "o of head_dim 16": (lambda: tensor(gqa(), "o", elems=(40, 16)), r"o holds 40x16 elements a head, not 40x32"),
    "lse of two columns": (lambda: tensor(gqa(), "lse", elems=(40, 2)), r"lse holds 40x2 elements a head, not 40x1"),
    "v of 4 heads": (
        lambda: tensor(gqa(), "v", groups=4, tiles=(32, 2)),
        r"declares 2 query heads a KV head over q's 4; v holds 4 heads",
    ),
}


@pytest.mark.parametrize("name", list(HOLES))
def test_a_declaration_its_tensors_contradict_is_refused(name: str) -> None:
    make, message = HOLES[name]
    p = make()
    assert wrong_when_run(p)  # what verify accepted before: O and LSE other than the declared function's
    with pytest.raises(SemanticError, match=message):
        verify(p)


def test_the_declaration_check_passes_the_built_programs() -> None:
    p = gqa()
    assert verify(p).verified
    assert not wrong_when_run(p)

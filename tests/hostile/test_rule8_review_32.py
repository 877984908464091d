"""A hostile review of rule 8 for attention (issue 32): schedules and declarations edited so that verify accepts
them while the interpreter's O and LSE differ from the declared function's (`spatialc.reference`), beyond
`spatialc.tolerance`.

Two holes were found, now refused by rule 8 (`verify/attention._declared`; each test below failed before the fix).
The second: a third output tensor that no stage writes verified, and evaluate handed it back as it found it
(review 31's hole 3 again: attention's proof returns before `declared` refuses it). The first, in seven forms: the
declaration `Attention(scale, seq_q, seq_kv, group, causal)` was never held to the tensors it
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

Beside them, tensors of types attention does not use verified, though none computed a wrong value in the
interpreter: an O of e4m3 (evaluate refused to write it), of int8 or LSE of bf16 (rounded alike by the reference),
K of fp16 under bf16 matmuls (`lower` refused it). Each is now refused by rule 8 too, as a GEMM's are.

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
| tensor k's dtype bf16 → fp16 under bf16 matmuls                          | accepted, neutral in the interpreter,    |
|                                                                          | refused by lower: now refused, rule 8    |
| tensor o's / lse's dtype → bf16                                          | neutral (the reference rounds alike);    |
|                                                                          | lse's now refused (below)                |
| tensor o's dtype → int8, int32, int64; lse's → int8                      | accepted, neutral (rounded alike): now   |
|                                                                          | refused, rule 8 (O float, LSE float32)   |
| tensor o's dtype → e4m3, e5m2                                            | accepted, evaluate refused (NumericError)|
|                                                                          | now refused, rule 8                      |
| tensor k's rows 72 → 60 (tile grid kept)                                 | refused, rule 1 (tile grid too large)    |
| tensor k's groups 2 → 4 (tile grid kept)                                 | refused, rule 1 (tile grid too small)    |
| a third output tensor no stage writes                                    | HOLE, fixed (the second)                 |
| a fourth input tensor no stage reads                                     | neutral                                  |
| the stage's outs exchanged (O ↔ LSE)                                     | refused, rule 8 (the new check: shapes)  |
| the stage's ins: K and V exchanged                                       | refused, rule 8 (V's rows ≠ K's block)   |
| tensor lse's groups 4 → 2                                                | refused, rule 8 (LSE's rows)             |
| placement: both items on site 0, programs unchanged                      | refused, coverage (site holds 2 items)   |
| placement: the two sites' items exchanged                                | neutral (every item still run once)      |
| one site (an ITEM loop): the ITEM loop one short in every engine         | refused, coverage (ITEM loop count)      |
| heads permuted: Q read and O, LSE written at head group − 1 − h          | refused, rule 8, though neutral (a test) |
| transpose_b on P·V (3x2x4 block)                                         | refused, rule 8 (block vs pages)         |
| transpose_b on P·V, square (4x4x4: bw = head_dim tiles)                  | refused, rule 8 (unlike tiles)           |
| m_new packed before the max reduces (α = 1, P from the entry max)        | refused, rule 8 (l′'s tree; a test)      |
| l and o both rescaled by α twice a block                                 | refused, rule 8 (l′'s tree; a test)      |
| o rescaled after P·V: α·(o + P·V)                                        | refused, rule 8 (o′'s tree)              |
| α's and LSE's maps reading their row vectors as Arg, not RowArg          | neutral (one value a row either way)     |
| K read from tensor v, V from k (either, or both exchanged)               | refused, ownership (ring's tensor)       |
| Q read from the output o                                                 | refused, rule 1 (a read of an output)    |
| Q's address uses the KV loop's variable (outside that loop)              | refused, rule 1 (no enclosing loop)      |
| the head loop's variable made the KV loop's (shadowed)                   | refused, rule 1 (already bound)          |
| KV Span: per, base and steps doubled                                     | neutral (the same counts)                |
| KV Span: + 64·item_x (more blocks for later KV heads, bound kept)        | neutral (the extra blocks masked)        |
| KV Span: − 64·item_x                                                     | refused, rule 8 (`enough`)               |
| KV Span: base − 16, to the band's last real row (40), not its end (48)   | refused, rule 8 (`enough`; a test)       |
| KV Span: base − 17; bound 1; bound 0                                     | refused, rule 8 (`enough`, `coverage`)   |
| KV Span → Const(2) in both engines                                       | neutral (every block, the mask cuts)     |
| KV Span: per 0; per −64 with base and steps negated                      | refused, rule 1 (Span out of range)      |
| ring depths: k_ring, x_ring, m_old_ring 1 page                           | neutral                                  |
| heads loop Const(0)                                                      | refused, balance (Q never popped)        |
| site 1's programs removed; site 1's writer removed                       | refused, coverage; balance               |
| site 1's addresses without item_x (KV head 0 twice)                      | refused, rule 8 (Q's head)               |
| placement's multicast (1, 2) / (2, 1), band 1, kind round_robin          | neutral                                  |
| placement's splits 2                                                     | refused, coverage                        |
| plan's depth 1, k_tiles 4 or 16                                          | neutral (the schedule is what runs)      |
| plan's groups 2, sub_blocks (1, 2), block ibw 2, block osw 1             | refused, rule 1                          |
| maps: RowArg(2) of two rings, an op not in the table, exp of two args,   | refused, rule 1                          |
| no rings, a Lit alone; ScaleAcc or a matmul missing a ring or its acc;   |                                          |
| a reduction 0 wide; a pack of 0 tiles; Attention run as an op            |                                          |
| the max reduction a min; a mask's Pos 0 wide                             | refused, rule 8                          |
| P·V of sub-blocks (1, 2)                                                 | refused, rule 8 (StrongerCheckNeeded)    |
| P·V block 3x1x4                                                          | refused, rule 8 (block vs pages)         |
| causal declared (mask following) over seq_q 72 > seq_kv 40               | neutral (rows with no key: NaN alike);   |
|                                                                          | now refused, rule 8 (`keyless`)          |
| site 0's writer, compute or all three programs twice                     | refused, rule 1 (two programs)           |
| the schedule's programs reordered; site 0's writer given site 1's ops    | neutral                                  |
| m_new_ring made a copy of m_old_ring (`origin`: one ring)                | refused, balance                         |
| alpha_ring a copy of p_ring; k_ring of v_ring                            | refused, rule 1; ownership               |
| x_ring, m_new_ring, alpha_ring made Interm                               | neutral                                  |
| o_acc, m_acc, s_acc of half the tiles                                    | refused, bounds (packs past the acc)     |
| x_ring's page_tiles 12 → 6                                               | refused, rule 6 (a map's page, since)    |
| page_tiles → 1 (MHA 40x72 causal, lowered and emulated): x_ring, p_ring  | refused, rule 6 (was: `lower` refused)   |
| alpha_ring                                                               | refused, rule 6 (was: emulated in bound) |
| o_acc_ring, s_ring                                                       | refused, bounds (packs past the page)    |
| 3,500 random pairs of single-op edits (test_mutations' `_edits` applied  | 9 accepted, all neutral; none crashed    |
| twice) over four programs: the GQA above; MHA 72x72 d64 causal on one    |                                          |
| site (an ITEM loop); GQA batch 2, 130x160, causal on 3 sites; MHA 72x100 |                                          |
| d64 on 2 sites                                                           |                                          |

The review's scratch harness ran each: verify, then (accepted) `spatialc.evaluate` against `spatialc.tolerance`.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import spatialc
from spatialc.errors import SemanticError, TileBoundsError
from spatialc.ir.ids import LV_HEAD, LV_K, TensorId
from spatialc.ir.nodes import ComputeStage, DType, SpatialProgram, TensorRole
from spatialc.ir.ops import (
    Apply,
    Attention,
    Compute,
    Expr,
    Lit,
    Loop,
    Map,
    PackAcc,
    Push,
    ReadTiles,
    Reserve,
    RowReduce,
    ScaleAcc,
    Span,
    TileAddr,
    WriteTiles,
)
from spatialc.passes.verify import verify

from ..attention.mutants import engines, in_loop, ring, scheduled


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


def test_an_operand_tensor_of_another_type_than_the_matmuls_is_refused() -> None:
    """K stored fp16 under the program's bf16 matmuls verified. Not a wrong result: the interpreter takes a tensor's
    tiles as they are (so it agreed with the reference), and `lower` refused it (UnsupportedPrecision: tiles are
    copied into the operand rings byte for byte). But a GEMM's operand of another type is refused by verify
    (`declared`), so attention's now is too, rather than passing all eight rules and failing at the printer."""
    p = tensor(gqa(), "k", dtype=DType.FP16)
    with pytest.raises(SemanticError, match=r"k holds fp16 values, but attention's matmuls read bf16"):
        verify(p)


@pytest.mark.parametrize(("name", "dtype"), [("o", "int8"), ("o", "e4m3"), ("lse", "bf16")])
def test_an_output_of_a_type_attention_does_not_write_is_refused(name: str, dtype: str) -> None:
    """O of int8 or e4m3, LSE of bf16 verified: O softmax weights rounded to integers (the reference rounded alike),
    an e4m3 O the interpreter then refused to write (NumericError). `spatialc.attention` writes O as float32, bf16
    or fp16 and LSE as float32; verify now says so."""
    p = tensor(gqa(), name, dtype=DType(dtype))
    with pytest.raises(SemanticError, match=rf"attention writes {name} as .*, not {dtype}"):
        verify(p)


def test_an_output_no_stage_writes_is_refused() -> None:
    """A third output tensor, written by no stage, verified (review 31's hole 3, for attention: its proof returns
    before `declared` is read), and evaluate handed it back as it found it (zeros; a GPU, whatever its memory
    held), beside O and LSE."""
    p = gqa()
    o = next(t for t in p.tensors if t.name == "o")
    p = p.evolve(tensors=(*p.tensors, dataclasses.replace(o, id=TensorId(len(p.tensors)), name="extra")))
    assert wrong_when_run(p)  # (the outputs are o, lse; the result given holds o, lse, extra)
    with pytest.raises(SemanticError, match=r"output extra is written by no stage; attention writes o and lse"):
        verify(p)


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


# ---- the schedule attacks, all refused already --------------------------------------------------------------------


def kv_body(p: SpatialProgram, f) -> SpatialProgram:
    """`p` with the compute engine's KV loop body rewritten by f (a list of ops in, a list out)."""
    return engines(p, "compute", in_loop(LV_K, f))


def mnew_before_max(p: SpatialProgram) -> SpatialProgram:
    """m_new packed before the max reduces into m (α = 1, P from the block's entry max)."""
    m_new = ring(p, "m_new_ring")

    def f(body):
        moved = [o for o in body if getattr(o, "buf", None) == m_new and isinstance(o, Reserve | Push)]
        moved.insert(1, next(o for o in body if isinstance(o, PackAcc) and o.to == m_new))
        body = [o for o in body if o not in moved]
        at = next(i for i, o in enumerate(body) if isinstance(o, Compute) and isinstance(o.op, RowReduce))
        return [*body[:at], *moved, *body[at:]]

    return kv_body(p, f)


def scaled_twice(p: SpatialProgram) -> SpatialProgram:
    """l and o each rescaled by α twice a block (consistently: both)."""
    return kv_body(
        p,
        lambda body: [
            x for o in body for x in ((o, o) if isinstance(o, Compute) and isinstance(o.op, ScaleAcc) else (o,))
        ],
    )


def heads_reversed(p: SpatialProgram) -> SpatialProgram:
    """Q read and O, LSE written at query head group − 1 − head: the heads of a group permuted, consistently."""
    rings = {ring(p, n) for n in ("q_ring", "o_ring", "lse_ring")}

    def at(a: TileAddr) -> TileAddr:
        stride = dict(a.steps).get(LV_HEAD, 0)
        return TileAddr(a.base + stride, tuple((v, -s if v == LV_HEAD else s) for v, s in a.steps))

    def f(ops):
        return tuple(
            dataclasses.replace(o, body=f(o.body))
            if isinstance(o, Loop)
            else dataclasses.replace(o, at=at(o.at))
            if isinstance(o, ReadTiles) and o.into in rings or isinstance(o, WriteTiles) and o.src in rings
            else o
            for o in ops
        )

    return engines(engines(p, "reader", f), "writer", f)


def diagonal_short(p: SpatialProgram) -> SpatialProgram:
    """Each band's blocks counted to the band's last real row (40 query rows) rather than its padded end (48): one
    block, 64 keys, where row 39 keeps 72."""

    def f(ops):
        return tuple(
            dataclasses.replace(o, count=dataclasses.replace(o.count, base=o.count.base - 16), body=f(o.body))
            if isinstance(o, Loop) and isinstance(o.count, Span)
            else dataclasses.replace(o, body=f(o.body))
            if isinstance(o, Loop)
            else o
            for o in ops
        )

    return engines(engines(p, "reader", f), "compute", f)


REFUSED = {
    "m_new packed before the max": (mnew_before_max, gqa, r"l_acc after a KV block is \(exp\(\(m − m\)\)·l"),
    # (two whole blocks of 64 keys: with 72, the max of most rows lies in the first, α = 1 and both scale the same)
    "l and o rescaled twice": (
        scaled_twice,
        lambda: scheduled(1, 2, 40, 128, 32),
        r"l_acc after a KV block is \(α·α·l \+ rowsum\(P\)\)",
    ),
    "each band's blocks one short": (diagonal_short, gqa, r"too few for the keys its band's rows keep \(at most 80\)"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_schedule_attack_is_refused(name: str) -> None:
    make, program, message = REFUSED[name]
    p = make(program())
    assert wrong_when_run(p)
    with pytest.raises(SemanticError, match=message):
        verify(p)


def test_a_consistent_permutation_of_a_groups_heads_computes_the_same_and_is_refused() -> None:
    """Q read and O, LSE written at head group − 1 − head: every head still computes its own rows, so the outputs
    are the declared ones; rule 8 pins Q's head to the head loop's own (`item_x · group + head`) and refuses it, a
    schedule it does not follow rather than a wrong one."""
    p = heads_reversed(gqa())
    assert not wrong_when_run(p)
    with pytest.raises(SemanticError, match=r"Q's page is read from head 2·item_x - 1·head \+ 1"):
        verify(p)


@pytest.mark.parametrize(("name", "tiles"), [("x_ring", 6), ("x_ring", 1), ("p_ring", 1), ("alpha_ring", 1)])
def test_a_maps_ring_of_pages_smaller_than_its_inputs_is_refused(name: str, tiles: int) -> None:
    """A map fills a page of its inputs' tiles: a ring whose pages hold fewer (left alone by the review, which found
    the interpreter moving pages by value and the kernel within its bound or refused by `lower`) is refused by rule 6,
    naming the ring and both sizes."""
    p = scheduled(1, 2, 40, 72, 32, causal=True)
    bid = ring(p, name)
    buffers = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, page_tiles=tiles)) if b.id == bid else b
        for b in p.buffers
    )
    with pytest.raises(TileBoundsError, match=f"a page of {name}, which holds {tiles} tiles"):
        verify(p.evolve(buffers=buffers))

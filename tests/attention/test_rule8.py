"""Rule 8 proves an attention schedule runs the online softmax recurrence (passes/verify/attention.py): the schedules
`spatialc.build` makes pass, across shapes, groups, masks and placements; what the proof does not follow is
StrongerCheckNeeded; a constant is compared as the float32 a Map holds."""

from __future__ import annotations

import dataclasses
import json
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

import spatialc
from spatialc.errors import SemanticError, StrongerCheckNeeded
from spatialc.ir.ids import LV_HEAD, LV_K, LV_SUB_H, Site
from spatialc.ir.nodes import Engine, SpatialProgram
from spatialc.ir.ops import (
    AcquireAcc,
    Attention,
    Compute,
    Const,
    Lit,
    Loop,
    Map,
    PackAcc,
    Pop,
    Push,
    ReleaseAcc,
    Reserve,
    RowReduce,
    TileAddr,
    Wait,
    WriteTiles,
)
from spatialc.passes.verify import verify

from ..rewrite import json_dicts
from .mutants import attentions, engines, in_loop, loop_count, planned, ring, scheduled, with_expr
from .qkv import inputs

# (batch, heads, seq_q, seq_kv, head_dim), keywords: odd lengths (padded rows, a partial last block), GQA and MQA,
# causal and not, one tile of head_dim, one KV block, several batches.
CASES = [
    ((1, 2, 40, 72, 32), {}),
    ((1, 4, 40, 72, 64), {"kv_heads": 2, "causal": True}),
    ((2, 2, 72, 72, 128), {"causal": True}),
    ((1, 2, 16, 16, 16), {}),
    ((1, 8, 40, 40, 32), {"kv_heads": 1, "causal": True}),
    ((2, 6, 72, 40, 64), {"kv_heads": 3}),
]


@pytest.mark.parametrize(("args", "kw"), CASES, ids=lambda c: str(c))
def test_built_schedules_pass(args, kw) -> None:
    assert spatialc.build(spatialc.attention(*args, **kw), "sm_90").verified


@pytest.mark.parametrize("sites", [1, 3, 5])
def test_items_on_several_sites_and_one(sites: int) -> None:
    """One site running every item (an ITEM loop), and items spread unevenly over a few sites."""
    p = scheduled(2, 4, 72, 72, 32, kv_heads=2, causal=True, sites=sites)
    assert verify(p).verified


def test_a_gemm_is_not_proved_as_attention() -> None:
    assert spatialc.build(spatialc.gemm(64, 64, 64), "sm_90").verified


def _scale_lit(p, value: float):
    def edit(e):
        return Lit(value) if isinstance(e, Lit) and e.value == p.stages[3].kind.op.scale else None

    return engines(
        p,
        "compute",
        in_loop(
            LV_K,
            lambda body: [
                dataclasses.replace(o, op=Map(with_expr(o.op.expr, edit)))
                if isinstance(o, Compute) and isinstance(o.op, Map)
                else o
                for o in body
            ],
        ),
    )


def test_scale_is_compared_as_float32() -> None:
    """A constant equal to the declared scale as a float32 is the same program; the next float32 is not."""
    p = scheduled(1, 2, 40, 72, 32)
    scale = p.stages[3].kind.op.scale
    same = float(np.float32(scale)) + 1e-12
    assert float(np.float32(same)) == float(np.float32(scale)) and same != scale
    assert verify(_scale_lit(p, same)).verified
    with pytest.raises(SemanticError, match="differs at 0.1767767 where the recurrence has 0.17677669"):
        verify(_scale_lit(p, float(np.nextafter(np.float32(scale), np.float32(1)))))


def test_a_loop_inside_the_kv_loop_is_not_followed() -> None:
    """A shape the proof does not follow is StrongerCheckNeeded, not a guess."""
    p = scheduled(1, 2, 40, 72, 32)
    nested = engines(
        p,
        "compute",
        in_loop(LV_K, lambda body: [Loop(LV_SUB_H, Const(1), (o,)) if isinstance(o, Compute) else o for o in body]),
    )
    with pytest.raises(StrongerCheckNeeded, match="one loop over the KV blocks, with no loop inside it"):
        verify(nested)


def test_reduction_over_more_keys_than_the_mask_keeps_is_accepted() -> None:
    """Keys past seq_kv are masked to −∞ (the max's identity, and exp(−∞) = 0 the sum's), so a reduction over the
    padded block is the same function: only `cols` below seq_kv is refused (test_mutations)."""
    p = scheduled(1, 2, 40, 72, 32)

    def wider(body):
        return [
            dataclasses.replace(o, op=dataclasses.replace(o.op, cols=o.op.cols + 8))
            if isinstance(o, Compute) and isinstance(o.op, RowReduce)
            else o
            for o in body
        ]

    assert verify(engines(p, "compute", in_loop(LV_K, wider))).verified


def test_a_site_without_items_writes_nothing() -> None:
    """A site that holds no item, yet packs a zeroed accumulator into O's ring and writes it at a fixed address (no
    item coordinate, so rule 2 has nothing to refuse): rule 8 refuses the write."""
    p = scheduled(1, 1, 16, 16, 16, sites=2)
    assert dict(p.placement.items_of_site)[Site(1)] == ()  # type: ignore[union-attr]
    o, acc = ring(p, "o_ring"), ring(p, "o_acc")
    out = next(t.id for t in p.tensors if t.name == "o")
    ops = {
        Engine.COMPUTE: (AcquireAcc(acc), Reserve(o), PackAcc(acc, o, 1), Push(o), ReleaseAcc(acc)),
        Engine.WRITER: (Wait(o), WriteTiles(o, out, TileAddr(0), 1, 1, 1, 1), Pop(o)),
    }
    progs = tuple(
        dataclasses.replace(q, ops=ops.get(q.engine, q.ops)) if q.site == Site(1) else q
        for q in p.schedule.programs  # type: ignore[union-attr]
    )
    with pytest.raises(SemanticError, match="site 1 writer: .* the site holds no item, yet writes"):
        verify(p.evolve(schedule=dataclasses.replace(p.schedule, programs=progs)))


@settings(max_examples=40, deadline=None)
@given(attentions())
def test_any_shape_plan_and_placement_builds_verified(case) -> None:
    """Whatever the lengths (padded rows, a partial last block), group, mask, block, depth and placement, the schedule
    `build` makes is proved."""
    shape, kw, plan = case
    assert spatialc.build(spatialc.attention(*shape, **kw), "sm_90", **plan).verified


def test_pages_waited_at_two_places_are_not_followed() -> None:
    """K's and V's first block waited for and dropped before the KV loop, which runs one block fewer: rules 1–7 pass
    (the rings balance), and rule 8, which matches the reader's one ReadTiles to one Wait, does not follow it."""
    p = scheduled(1, 2, 40, 72, 32)
    k, v = ring(p, "k_ring"), ring(p, "v_ring")

    def drop_first(body):
        at = next(j for j, o in enumerate(body) if isinstance(o, Loop))
        return [*body[:at], Wait(k), Pop(k), Wait(v), Pop(v), *body[at:]]

    edited = engines(engines(p, "compute", in_loop(LV_HEAD, drop_first)), "compute", loop_count(LV_K, -1))
    with pytest.raises(StrongerCheckNeeded, match="k_ring moved by one Wait and one Pop of this engine"):
        verify(edited)


def _rescaled_file(p, new: float) -> SpatialProgram:
    """`p` saved, its declaration's scale and the schedule's literal of it (the score map's) set to `new` in the file,
    and loaded (from_json verifies it again)."""
    old = next(s.kind.op.scale for s in p.stages if isinstance(getattr(s.kind, "op", None), Attention))
    doc = json.loads(spatialc.to_json(p))
    edits = []
    for node in json_dicts(doc["program"]):
        if node.get("type") == "Attention" or (node.get("type") == "Lit" and node.get("value") == old):
            node["scale" if node["type"] == "Attention" else "value"] = new
            edits.append(node["type"])
    assert "Attention" in edits and "Lit" in edits
    return spatialc.from_json(json.dumps(doc))


@pytest.mark.parametrize("new", [-0.125, 0.0])
def test_a_saved_scale_the_api_refuses_is_refused(new: float) -> None:
    """Review 47: a saved attention whose declared scale and the schedule's literal were edited alike to -0.125 or 0
    verified (spatialc.attention refuses scale <= 0): the proof compares the two, not the value. Verify holds the
    declaration to what the API takes."""
    q = _rescaled_file(scheduled(1, 4, 40, 72, 32, kv_heads=2, causal=True), new)
    assert not q.verified
    with pytest.raises(SemanticError, match=rf"^stage attention declares attention with scale = {new}; attention's"):
        verify(q)


@pytest.mark.parametrize("new", [math.nan, math.inf])
def test_a_scale_that_is_not_finite_is_refused(new: float) -> None:
    p = scheduled(1, 2, 16, 16, 16)
    stages = tuple(
        dataclasses.replace(s, kind=dataclasses.replace(s.kind, op=dataclasses.replace(s.kind.op, scale=new)))
        if isinstance(getattr(s.kind, "op", None), Attention)
        else s
        for s in p.stages
    )
    with pytest.raises(SemanticError, match=r"scale = (nan|inf); attention's scale is a finite number > 0"):
        verify(p.evolve(stages=stages))


def test_the_kernel_bound_is_of_the_scores_magnitude() -> None:
    """The kernel's bound on a score's float32 sum is (dim + 4) ulps of |scale|·|Q|·|K|ᵀ: of a negative scale (an
    unverified file's) it went negative, and the interpreter's own result, the reference's, fell outside it."""
    q = _rescaled_file(scheduled(1, 4, 40, 72, 32, kv_heads=2, causal=True), -0.125)
    x = {k: v.astype(ml_dtypes.bfloat16) for k, v in inputs(1, 4, 40, 72, 32, kv_heads=2, seed=1).items()}
    ok, how = spatialc.tolerance(q, kernel=True).check(spatialc.evaluate(q, x), x)
    assert ok, how


def test_a_causal_declaration_that_leaves_rows_no_key_is_refused() -> None:
    """A causal attention of seq_q 48 over seq_kv 16 (made past spatialc.attention, as a saved file or a lang program
    may declare it) verified: the proof assumed seq_q ≤ seq_kv, and its first 32 rows of O and LSE came out NaN,
    as the reference's, so the check passed. Verify holds the declaration to what the API takes."""
    p = spatialc.attention(1, 2, 48, 16, 32)
    stages = tuple(
        dataclasses.replace(s, kind=dataclasses.replace(s.kind, op=dataclasses.replace(s.kind.op, causal=True)))
        if isinstance(getattr(s.kind, "op", None), Attention)
        else s
        for s in p.stages
    )
    q = planned(p.evolve(stages=stages))
    with pytest.raises(SemanticError, match=r"^stage attention: a causal attention with seq_q \(48\) > seq_kv \(16\)"):
        verify(q)

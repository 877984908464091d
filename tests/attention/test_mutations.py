"""Rule 8 against edits of an attention schedule: every edit that changes what the schedule computes is refused,
each with its own message (mutants.mutations); and an enumerated sweep of single-op edits — an op dropped, a ring
of a Compute swapped for another, a constant moved — where each edit is refused or is one that computes the same.

The edits the sweep sees accepted are the kinds listed in NEUTRAL, with why each computes the same, and the
interpreter runs each of them to the same outputs as the schedule it edits, bit for bit."""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spatialc
from spatialc.errors import SemanticError, StrongerCheckNeeded, TileBoundsError, VerifyError
from spatialc.inputs import InexactInputWarning
from spatialc.ir.ids import LV_ITEM_X, LV_ITEM_Y, LoopVar, loop_var_name
from spatialc.ir.index import ProgramIndex
from spatialc.ir.nodes import SpatialProgram, TensorRole
from spatialc.ir.ops import (
    Apply,
    ChoreoOp,
    Compute,
    Const,
    Expr,
    Lit,
    Loop,
    Map,
    Pos,
    ReadTiles,
    ReleaseAcc,
    RowReduce,
    Span,
    TileAddr,
    WriteTiles,
    walk,
)
from spatialc.passes.verify import verify
from spatialc.passes.verify.facts import Programs
from spatialc.passes.verify.semantics import check_semantics

from .mutants import attentions, engines, mutations, scheduled

# Each edit's refusal: the error and what its message must say.
REFUSED: dict[str, tuple[type[VerifyError], str]] = {
    "P from m_old (stale max in P)": (SemanticError, r"rowsum\(exp\(\(X − m\)\)\).* at m where the recurrence has m′"),
    "α from m_new, m_new": (SemanticError, r"exp\(\(m′ − m′\)\)·l .* at m′ where the recurrence has m "),
    "α reversed: exp(m_new − m_old)": (SemanticError, r"differs at \(m′ − m\) where the recurrence has \(m − m′\)"),
    "ScaleAcc of o_acc removed": (SemanticError, r"o_acc after a KV block is \(o \+ P·V\), not .* \(α·o \+ P·V\)"),
    "ScaleAcc of l_acc removed": (SemanticError, r"l_acc after a KV block is \(l \+ rowsum\(P\)\), not .* \(α·l \+"),
    "P·V added twice in a block": (SemanticError, r"o_acc after a KV block is \(o′ \+ P·V\)"),
    "rowsum(P) added twice in a block": (SemanticError, r"l_acc after a KV block is \(l′ \+ rowsum\(P\)\)"),
    "KV loop one block short": (SemanticError, r"it reads \d+ key tile rows \(\d+ keys\); the declaration has \d+"),
    "KV loop one block long": (TileBoundsError, r"reads tile \d+ of k, outside"),
    "K and V always block 0": (SemanticError, r"key is tile 4·k \+ page col, where the element it masks is at tile"),
    "K, V, the mask's and the reductions' keys all block 0": (SemanticError, r"blocks reads the same key tile rows"),
    "K and V at half a block's stride": (SemanticError, r"where the element it masks is at tile 2·k \+ page col"),
    "mask padding bound + 1": (SemanticError, r"c < \d+\b.* differs at (\d+) where the recurrence has \d+"),
    "mask padding bound − 1": (SemanticError, r"c < \d+\b.* differs at (\d+) where the recurrence has \d+"),
    "mask's key position shifted a tile": (SemanticError, r"its mask's key is tile 4·k \+ page col \+ 1"),
    "scale changed": (SemanticError, r"differs at 0\.\d+ where the recurrence has 0\.\d+"),
    "row max over fewer keys than the mask keeps": (SemanticError, r"it reduces the keys below \d+, hiding keys"),
    "V from another KV head": (SemanticError, r"V's page is read from head 0, not the item's KV head"),
    "V always from block 0": (SemanticError, r"V's page holds key tile rows page row, not K's block"),
    "Q band of another head": (SemanticError, r"Q's page is read from head .*, not the item's query head"),
    "final division left out (O = o)": (SemanticError, r"the page of o_ring is o, not the recurrence's \(o / l\)"),
    "LSE without log": (SemanticError, r"the page of lse_ring is \(m \+ l\), not .* \(m \+ log\(l\)\)"),
    "LSE with exp for log": (SemanticError, r"differs at exp\(l\) where the recurrence has log\(l\)"),
    "m not acquired for a head": (SemanticError, r"a max adds into .* of those acquired before this loop, none"),
    "S not acquired a block": (SemanticError, r"it reads s_acc before acquiring it"),
    "every head's O at head 0's rows": (SemanticError, r"it writes tile rows .* of o; the item's query head"),
    "every head's LSE at head 0's rows": (SemanticError, r"it writes tile rows .* of lse; the item's query head"),
    "each band one block short of its diagonal": (SemanticError, r"an item runs min\(.*⌉\) KV blocks .*, too few"),
    "causal mask offset + 1": (SemanticError, r"c ≤ \(r \+ -?\d+\).* differs at -?\d+ where the recurrence has -?\d+"),
    "causal mask offset − 1": (SemanticError, r"c ≤ \(r \+ -?\d+\).* differs at -?\d+ where the recurrence has -?\d+"),
    "mask's query row shifted a tile": (SemanticError, r"its mask's query row is tile (4·item_y \+ )?page row \+ 1"),
}  # fmt: skip

# Schedules edited: GQA and causal (every edit applies), then plain, several batches at head_dim 128.
CASES = {
    "gqa causal 40x72 d32": lambda: scheduled(1, 4, 40, 72, 32, kv_heads=2, causal=True),
    "mha 40x72 d64": lambda: scheduled(1, 2, 40, 72, 64),
    "batch 2 causal 72x72 d128": lambda: scheduled(2, 2, 72, 72, 128, causal=True),
}


@pytest.fixture(scope="module", params=list(CASES))
def program(request) -> SpatialProgram:
    p = CASES[request.param]()
    assert verify(p).verified
    return p


def test_every_edit_is_refused_with_its_reason(program: SpatialProgram) -> None:
    """Accepted-and-wrong: none. Every edit is refused, by the error and message it should be refused with."""
    edits = mutations(program)
    causal = program.stages[3].kind.op.causal  # type: ignore[union-attr]
    assert len(edits) == len(REFUSED) - (0 if causal else 4)
    accepted, wrong_reason = [], []
    for name, edited in edits.items():
        cls, pattern = REFUSED[name]
        try:
            verify(edited)
        except VerifyError as e:
            if not isinstance(e, cls) or not re.search(pattern, str(e)):
                wrong_reason.append(f"{name}: {type(e).__name__}: {e}")
            continue
        accepted.append(name)
    assert accepted == [], accepted
    assert wrong_reason == [], "\n".join(wrong_reason)


# ---- the sweep -------------------------------------------------------------------------------------------------

# Single-op edits verify may accept because they compute the same: a ReleaseAcc dropped leaves an accumulator live
# until the next AcquireAcc zeroes it, or the program ends; no value read changes.
# An address's stride of a variable that is always 0 (a loop of one iteration, one band, one KV head) changes nothing.
NEUTRAL = ("drop ReleaseAcc", "(always 0)")


def _paths(ops: tuple[ChoreoOp, ...], at: tuple[int, ...] = ()) -> Iterator[tuple[tuple[int, ...], ChoreoOp]]:
    for i, op in enumerate(ops):
        yield (*at, i), op
        if isinstance(op, Loop):
            yield from _paths(op.body, (*at, i))


def _put(ops: tuple[ChoreoOp, ...], at: tuple[int, ...], new: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    i = at[0]
    if len(at) == 1:
        return (*ops[:i], *new, *ops[i + 1 :])
    loop = ops[i]
    assert isinstance(loop, Loop)
    return (*ops[:i], dataclasses.replace(loop, body=_put(loop.body, at[1:], new)), *ops[i + 1 :])


def _shifted(at: TileAddr, zero: set[LoopVar]) -> Iterator[tuple[str, TileAddr]]:
    """`at` with its base, or one stride, moved a tile either way."""
    for d in (1, -1):
        yield f"base {d:+}", TileAddr(at.base + d, at.steps)
        for j, (var, stride) in enumerate(at.steps):
            steps = (*at.steps[:j], (var, stride + d), *at.steps[j + 1 :])
            yield f"{loop_var_name(var)} stride {d:+}{' (always 0)' if var in zero else ''}", TileAddr(at.base, steps)


def _moved(e: Expr, zero: set[LoopVar] = frozenset()) -> Iterator[Expr]:  # type: ignore[assignment]
    """`e` with one constant moved (±1, ×2), or one position's address moved a tile."""
    if isinstance(e, Lit):
        yield from (Lit(e.value + 1), Lit(e.value - 1), Lit(e.value * 2))
    elif isinstance(e, Pos):
        yield from (Pos(e.axis, at, e.width) for label, at in _shifted(e.at, zero) if "(always 0)" not in label)
    elif isinstance(e, Apply):
        for j, a in enumerate(e.args):
            for b in _moved(a, zero):
                yield Apply(e.op, (*e.args[:j], b, *e.args[j + 1 :]), e.params)


def _always_zero(p: SpatialProgram) -> set[LoopVar]:
    """The variables of p's addresses that take one value: loops of at most one iteration, a grid of one band or KV
    head."""
    assert p.plan is not None
    zero = {var for var, n in ((LV_ITEM_Y, p.plan.grid[0]), (LV_ITEM_X, p.plan.grid[1])) if n == 1}
    for q in p.schedule.programs:  # type: ignore[union-attr]
        zero |= {
            op.var
            for op in walk(q.ops)
            if isinstance(op, Loop) and (op.count == Const(1) or isinstance(op.count, Span) and op.count.bound == 1)
        }
    return zero


def _edits(p: SpatialProgram) -> Iterator[tuple[str, SpatialProgram]]:
    """Every single-op edit of every engine's program: each op dropped; each ring a Compute reads replaced by each
    other ring the engine computes with, two rings swapped; each constant of a Map moved; each address of a read, a
    write, a row reduction or a mask's position moved a tile (its base, or one stride)."""
    assert p.schedule is not None
    zero = _always_zero(p)
    for engine in ("reader", "compute", "writer"):
        prog = next(q for q in p.schedule.programs if q.engine.value == engine)  # site 0's: it holds items
        rings = sorted({b for op in walk(prog.ops) if isinstance(op, Compute) for b in (*op.ins, *op.outs)})
        for at, op in _paths(prog.ops):
            if isinstance(op, Loop):
                continue

            def put(new: tuple[ChoreoOp, ...], at=at, engine=engine, prog=prog) -> SpatialProgram:
                return engines(p, engine, lambda ops: _put(ops, at, new), only=prog.ops)

            yield f"{engine}: drop {type(op).__name__} {op}", put(())
            if isinstance(op, ReadTiles | WriteTiles):
                for label, moved in _shifted(op.at, zero):
                    yield f"{engine}: {op} at {label}", put((dataclasses.replace(op, at=moved),))
            if not isinstance(op, Compute):
                continue
            if isinstance(op.op, RowReduce):
                for label, moved in _shifted(op.op.at, zero):
                    new = dataclasses.replace(op, op=dataclasses.replace(op.op, at=moved))
                    yield f"{engine}: {op} at {label}", put((new,))
            for j, b in enumerate(op.ins):
                for c in rings:
                    if c != b:
                        ins = (*op.ins[:j], c, *op.ins[j + 1 :])
                        yield f"{engine}: {op} reading {c} for {b}", put((dataclasses.replace(op, ins=ins),))
            if len(op.ins) == 2:
                yield f"{engine}: {op} rings swapped", put((dataclasses.replace(op, ins=op.ins[::-1]),))
            if isinstance(op.op, Map):
                for e in _moved(op.op.expr, zero):
                    if e == op.op.expr:  # a constant 0 doubled: the same program
                        continue
                    yield f"{engine}: {op} as {e}", put((dataclasses.replace(op, op=Map(e)),))


def test_single_op_edits_are_refused_or_compute_the_same(program: SpatialProgram) -> None:
    accepted, unsure, total = [], [], 0
    for name, edited in _edits(program):
        total += 1
        try:
            verify(edited)
        except StrongerCheckNeeded as e:  # every edit here is wrong or neutral: none is beyond the proof
            unsure.append(f"{name}: {e}")
            continue
        except VerifyError:
            continue
        accepted.append((name, edited))
    assert unsure == [], unsure
    wrong = [name for name, _ in accepted if not any(n in name for n in NEUTRAL)]
    assert total > 300
    assert wrong == [], wrong
    # Among the neutral edits, the ReleaseAccs: one for each of the compute engine's four accumulators.
    releases = sum(isinstance(op, ReleaseAcc) for q in program.schedule.programs[:3] for op in walk(q.ops))  # type: ignore[union-attr]
    assert sum("drop ReleaseAcc" in name for name, _ in accepted) == releases
    want = _run(program)
    differ = [name for name, edited in accepted if not _same(_run(edited), want)]
    assert differ == [], differ


def _run(p: SpatialProgram) -> dict[str, np.ndarray]:
    """The interpreter's outputs of `p` (verified) on fixed random inputs."""
    rng = np.random.default_rng(0)
    inputs = {
        t.name: rng.standard_normal((t.groups, *t.elems)).astype(np.float32)
        for t in p.tensors
        if t.role == TensorRole.INPUT
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InexactInputWarning)  # the inputs are rounded to bf16 alike for both runs
        return spatialc.evaluate(verify(p), inputs)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_a_random_edit_of_a_random_schedule(data) -> None:
    """Hypothesis draws a shape, plan and placement (mutants.attentions), builds it, and draws one single-op edit of
    its schedule: refused, or one that computes the same."""
    shape, kw, plan = data.draw(attentions())
    p = spatialc.build(spatialc.attention(*shape, **kw), "sm_90", **plan)
    edits = list(_edits(p))
    name, edited = edits[data.draw(st.integers(0, len(edits) - 1))]
    try:
        verify(edited)
    except StrongerCheckNeeded as e:
        raise AssertionError(f"{name}: beyond the proof: {e}") from None
    except VerifyError:
        return
    assert any(n in name for n in NEUTRAL), f"accepted: {name}"
    assert _same(_run(edited), _run(p)), f"accepted, and computes otherwise: {name}"


def test_rule_8_alone_refuses_every_wrong_single_op_edit(program: SpatialProgram) -> None:
    """The attention proof on its own, without rules 1–7 before it (which refuse most of these edits first): it
    refuses each edit the full verify refuses, with its own error, and never fails inside itself."""
    escaped = []
    for name, edited in _edits(program):
        index, programs = ProgramIndex.of(edited), Programs(edited)
        programs.gather(index)
        try:
            check_semantics(index, programs)
        except VerifyError:
            continue
        if not any(n in name for n in NEUTRAL):
            escaped.append(name)
    assert escaped == [], escaped


def test_the_output_comparison_tells_programs_apart() -> None:
    """The sweep's bit-for-bit comparison fails where it should: the same shapes with and without the causal mask."""
    causal, full = (spatialc.build(spatialc.attention(1, 2, 40, 72, 32, causal=c), "sm_90") for c in (True, False))
    assert _same(_run(causal), _run(causal))
    assert not _same(_run(causal), _run(full))

"""Verify's rule 8 against an attacker: every edit of a valid program is refused, or still computes the reference.

Hand-picked edits (the ones a first review found accepted and wrong) must be refused, each naming the first wrong
thing; random edits of several programs — numbers, op lists, placements — must never be accepted and wrong; and
the suite itself is shown able to fail: with rule 8 switched off, the same edits find accepted programs that compute
something else.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

import spatialc
import spatialc.passes.verify as verify_package
from spatialc.errors import IllFormedError, SemanticError, StrongerCheckNeeded, VerifyError
from spatialc.frontend import BUF_ACC, bias, relu, requant
from spatialc.ir.ids import LV_K, LoopVar, TensorId
from spatialc.ir.nodes import Engine, SpatialProgram
from spatialc.ir.ops import (
    AcquireAcc,
    Apply,
    Arg,
    Compute,
    Const,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    ReadBarrier,
    ReadTiles,
    Relu,
    Requant,
    Scalar,
    TileAddr,
    WriteTiles,
    cols,
    with_cols,
)
from spatialc.numerics.reference import reference
from spatialc.passes.rows import is_row_program
from spatialc.passes.verify import verify

from .. import mutants
from ..rewrite import edit, replace

R, C, W = Engine.READER, Engine.COMPUTE, Engine.WRITER


@pytest.fixture(scope="module")
def layer() -> SpatialProgram:
    """An int8 layer with every kind of epilogue op: a 4x3 grid of 2x2-tile items on 5 sites (3, 3, 2, 2, 2 items:
    ITEM loops), K loops of 4 steps."""
    gemm = spatialc.gemm(100, 70, 50, "int8", epilogue=[bias(), relu(), requant(0.01, 3)])
    return spatialc.build(gemm, "sm_86", block=(2, 2, 1), sub_blocks=(1, 1), depth=3, sites=5)


def _k_loops(p: SpatialProgram, f) -> SpatialProgram:
    """Every K loop of the reader and the compute engine replaced by f(loop)."""
    for engine in (R, C):
        p = replace(p, engine, lambda op: (f(op),) if isinstance(op, Loop) and op.var == LV_K else None)
    return p


def _ops(p: SpatialProgram, engine: Engine, kind: type, f) -> SpatialProgram:
    return replace(p, engine, lambda op: (f(op),) if isinstance(op, kind) else None)


def _computes(p: SpatialProgram, which, f) -> SpatialProgram:
    """`p` with f applied to each compute engine's Compute whose op is of class `which` (or which `which` holds of)."""
    holds = (lambda op: isinstance(op, which)) if isinstance(which, type) else which
    return replace(p, C, lambda op: (f(op),) if isinstance(op, Compute) and holds(op.op) else None)


def _is_bias(op) -> bool:
    return isinstance(op, Map) and bool(cols(op.expr))


def _column_zero(c):
    return dataclasses.replace(c, at=TileAddr(0))


def _reads_a(p: SpatialProgram, f) -> SpatialProgram:
    return replace(p, R, lambda op: (f(op),) if isinstance(op, ReadTiles) and op.tensor == TensorId(0) else None)


def _acquire_outside_items(ops):
    item_loop = ops[0]
    body = tuple(op for op in item_loop.body if not isinstance(op, AcquireAcc))
    return (AcquireAcc(BUF_ACC), dataclasses.replace(item_loop, body=body))


# (name, edit, error type, words the message must hold). The words name the first wrong thing: the site, engine and
# op, and what was expected against what was found.
HAND_PICKED = [
    (
        "the K loop one step short",
        lambda p: _k_loops(p, lambda lp: dataclasses.replace(lp, count=Const(lp.count.n - 1))),
        SemanticError,
        ["site 0 writer [in item]: WriteTiles", "item 0 (y 0, x 0): C tile (0, 0) sums k-tiles 0..2", "0..3 each"],
    ),
    (
        "a step dropped from the output address",
        lambda p: _ops(p, W, WriteTiles, lambda op: dataclasses.replace(op, at=TileAddr(0, op.at.steps[1:]))),
        SemanticError,
        ["site 0 writer", "writes C tile (0, 0), outside its block of tile rows 2..3"],
    ),
    (
        "every item written to the same tile",
        lambda p: _ops(p, W, WriteTiles, lambda op: dataclasses.replace(op, at=TileAddr(0))),
        SemanticError,
        ["site 0 writer", "writes C tile (0, 0), outside its block"],
    ),
    (
        "the K step dropped from the A address",
        lambda p: _reads_a(p, lambda op: dataclasses.replace(op, at=TileAddr(0, op.at.steps[:1]))),
        SemanticError,
        ["C tile (0, 0) multiplies A's k-tile 0 by B's k-tile 1"],
    ),
    (
        "a stride_h of 0",
        lambda p: _reads_a(p, lambda op: dataclasses.replace(op, stride_h=0)),
        SemanticError,
        ["C tile (1, 0) (item 0 (y 0, x 0)) sums tiles of A row 0, not 1"],
    ),
    (
        "relu replaced by scalar add 100",
        lambda p: _computes(p, lambda op: op == Relu(), lambda op: dataclasses.replace(op, op=Scalar("add", 100.0))),
        SemanticError,
        ["site 0 compute [in item]: Compute add 100", "schedule op add 100 where stage relu1 declares relu"],
    ),
    (
        "the requant zero point changed in the schedule",
        lambda p: _computes(
            p, Requant, lambda op: dataclasses.replace(op, op=dataclasses.replace(op.op, zero_point=4))
        ),
        SemanticError,
        ["zero point 4 where stage requant2 declares", "zero point 3"],
    ),
    (
        "the requant multiplier changed in the schedule",
        lambda p: _computes(
            p, Requant, lambda op: dataclasses.replace(op, op=dataclasses.replace(op.op, multiplier=7))
        ),
        SemanticError,
        ["requant x7 shift", "where stage requant2 declares"],
    ),
    (
        "the bias address losing its column step",
        lambda p: _computes(
            p, _is_bias, lambda op: dataclasses.replace(op, op=Map(with_cols(op.op.expr, _column_zero)))
        ),
        SemanticError,
        [
            "C tile (0, 2) (item 1 (y 0, x 1) of site 2 (whose programs are site 0's))",
            " gets bias tile column 0, not its own column 2",
        ],
    ),
    (
        "the K step wrapped in a loop of 4200 trips",
        lambda p: _k_loops(p, lambda lp: Loop(LoopVar(9), Const(4200), (lp,))),
        SemanticError,
        ["sums k-tiles 0..3 (16800 products) of 0..3"],
    ),
    (
        "a loop count of 2^31 + 1",
        lambda p: _k_loops(p, lambda lp: dataclasses.replace(lp, count=Const(2**31 + 1))),
        IllFormedError,
        ["a loop count must be at most 2147483647 (the kernel counts in a C int), not 2147483649"],
    ),
    (
        "a loop count of 2^64 + 1",
        lambda p: _k_loops(p, lambda lp: dataclasses.replace(lp, count=Const(2**64 + 1))),
        IllFormedError,
        ["not 18446744073709551617"],
    ),
    (
        "the accumulator never zeroed",
        lambda p: replace(p, C, lambda op: () if isinstance(op, AcquireAcc) else None),
        SemanticError,
        ["site 0 compute [in item, k]: Compute matmul", "acc is not acquired here: no AcquireAcc zeroes it"],
    ),
    (
        "the accumulator zeroed once, outside the ITEM loop",
        lambda p: edit(p, C, _acquire_outside_items),
        SemanticError,
        ["PackAcc acc -> C_ring", "it reads a partial sum: the loop Loop item < 3: around it still adds"],
    ),
    (
        "pages pushed without being filled",
        lambda p: _reads_a(p, lambda op: ReadBarrier()),
        SemanticError,
        ["it reads page 4·item + k of A_ring, which reader's Push A_ring pushed without anything filling it"],
    ),
    (
        "operands swapped",
        lambda p: _computes(p, MatmulTiles, lambda op: dataclasses.replace(op, ins=op.ins[::-1])),
        SemanticError,
        ["it multiplies B_ring by A_ring; stage matmul multiplies A_ring by B_ring"],
    ),
    (
        "a data-dependent K loop",
        lambda p: _trips(p),
        StrongerCheckNeeded,
        ["Loop k < trip(", "its trip count is read from data"],
    ),
]


def _trips(p: SpatialProgram) -> SpatialProgram:
    from spatialc.ir.nodes import DType, Tensor, TensorRole
    from spatialc.ir.ops import Trip

    trips = Tensor(TensorId(len(p.tensors)), "trips", TensorRole.PARAMETER, (1, 1), (1, 1), DType.INT32)
    p = p.evolve(tensors=(*p.tensors, trips))
    return _k_loops(p, lambda lp: dataclasses.replace(lp, count=Trip(trips.id, 0, lp.count.n)))


@pytest.mark.parametrize(("name", "change", "error", "words"), HAND_PICKED, ids=[h[0] for h in HAND_PICKED])
def test_hand_picked_edits_are_refused_naming_the_first_wrong_thing(layer, name, change, error, words):
    with pytest.raises(error) as info:
        verify(change(layer))
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    assert "\n" not in str(info.value)  # one line on the CLI


def test_hand_picked_edits_are_refused_through_a_saved_file(layer):
    # A hand-edited file keeps its "verified": true; from_json must not believe it (or must not read it at all:
    # a count beyond 64 bits is no document of ours), and lower must refuse it even when the mark is forged.
    for name, change, _, _ in HAND_PICKED:
        text = spatialc.to_json(change(layer).evolve(verified=True))
        try:
            changed = spatialc.from_json(text)
        except spatialc.SerdeError:
            assert name == "a loop count of 2^64 + 1"
            continue
        assert not changed.verified, name
        with pytest.raises(VerifyError):
            spatialc.lower(changed.evolve(verified=True))


def test_a_constant_or_parameter_of_the_other_signed_zero_is_refused():
    # 0.0 == -0.0 in Python, and rule 8 compared formulas with ==: a schedule multiplying by −0 where its stage
    # multiplies by 0 was accepted, and the recip after it gave −inf where the reference gives +inf.
    def program(expr):
        return spatialc.build(spatialc.gemm(16, 16, 16, "fp16", epilogue=[Map(expr)]), "sm_86")

    def scheduled(p, expr):
        return _computes(p, Map, lambda op: dataclasses.replace(op, op=Map(expr)))

    times = Apply("recip", (Apply("mul", (Arg(0), Lit(0.0))),))
    p = program(times)
    inputs = {"A": np.ones((16, 16)), "B": np.ones((16, 16))}
    assert reference(p, inputs)[0, 0] == np.inf
    with pytest.raises(SemanticError, match=r"schedule op recip\(\(x0 \* -0\)\) where stage map0 declares"):
        verify(scheduled(p, Apply("recip", (Apply("mul", (Arg(0), Lit(-0.0))),))))
    leaky = Apply("recip", (Apply("leaky_relu", (Apply("neg", (Arg(0),)),), (0.0,)),))
    with pytest.raises(SemanticError, match="where stage map0 declares"):
        verify(scheduled(program(leaky), Apply("recip", (Apply("leaky_relu", leaky.args[0].args, (-0.0,)),))))


@pytest.mark.parametrize("name", list(mutants.LAYERNORM_EDITS))
def test_each_edit_of_a_program_of_several_outputs_is_refused_by_rule_8_alone(name):
    """LayerNorm's out, mean and rstd, each proved apart: two outputs exchanged, a broadcast operand swapped, a
    reduction a page short, an output written twice or never — verify refuses each, and rule 8 does on its own
    (rules 1–7 switched off); the interpreter, running the edit anyway, gives something else (written twice: the
    same values, refused all the same)."""
    from spatialc.ir.index import ProgramIndex
    from spatialc.passes.verify.facts import Programs
    from spatialc.passes.verify.semantics import check_semantics

    change, words = mutants.LAYERNORM_EDITS[name]
    p = mutants.layernorm_program()
    q = change(p)
    with pytest.raises(VerifyError):
        verify(q)
    index, programs = ProgramIndex.of(q), Programs(q)
    programs.gather(index)
    with pytest.raises((SemanticError, StrongerCheckNeeded)) as info:
        check_semantics(index, programs)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    if name == "an output written twice":
        return
    inputs = mutants.inputs_for(p)
    try:
        got = spatialc.evaluate(q, inputs)
    except spatialc.SpatialError:
        return  # the interpreter refuses it too
    assert not mutants._same(got, reference(p, inputs))


@pytest.mark.parametrize("name", list(mutants.ROW_OUTPUT_EDITS))
def test_each_edit_of_a_row_program_of_two_outputs_or_none_is_refused_by_rule_8_alone(name):
    """Fused add + RMSNorm (out and residual_out, a page of each stored at a time) and row reductions (an m x 1
    vector, no pass of pages): the outputs exchanged, residual_out stored from the scaled ring, a page stored twice
    or a tile never, x + x for x + residual, absmax reduced as a max, the mean's divisor wrong, a vector stored at
    another band — verify refuses each, rule 8 on its own too; the interpreter, running the edit anyway, gives
    something else than the stages declare (stored twice: the same values, refused all the same)."""
    from spatialc.ir.index import ProgramIndex
    from spatialc.passes.verify.facts import Programs
    from spatialc.passes.verify.semantics import check_semantics

    make, change, words = mutants.ROW_OUTPUT_EDITS[name]
    p = make()
    q = change(p)
    with pytest.raises(VerifyError):
        verify(q)
    index, programs = ProgramIndex.of(q), Programs(q)
    programs.gather(index)
    with pytest.raises((SemanticError, StrongerCheckNeeded)) as info:
        check_semantics(index, programs)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    if name == "each page of residual_out stored twice":
        return
    # x − 1: values −4..2, so a row's largest magnitude is a negative value's (a max is no absmax on them)
    inputs = {k: v - 1 for k, v in mutants.inputs_for(p).items()}
    try:
        got = spatialc.evaluate(q, inputs)
    except spatialc.SpatialError:
        return  # the interpreter refuses it too
    assert not mutants._same(got, reference(q, inputs))  # the stages' function (an edit of the stages: the edited)


@pytest.fixture(scope="module")
def tally():
    """250 random edits of each program, judged (once for the module: the emulation below samples its harmless ones)."""
    return mutants.run(edits_per_program=250, seed=2026)


@pytest.mark.long
def test_random_edits_are_never_accepted_and_wrong(tally):
    print(f"\nmutation suite: {tally.line()}")
    assert tally.counts["hole"] == 0, "\n".join(tally.holes[:20])
    assert sum(tally.counts.values()) == 250 * len(mutants.PROGRAMS)
    # The edits must bite both ways: most are refused, and some harmless ones are accepted (else the suite tests
    # a verifier that refuses everything).
    assert tally.counts["refused"] > tally.counts["same"] > 0


@pytest.mark.long
def test_the_suite_finds_holes_in_a_verifier_without_rule_8(monkeypatch, layer):
    monkeypatch.setattr(verify_package, "check_semantics", lambda index, programs: None)
    tally = mutants.run(edits_per_program=60, seed=7)  # ~40 holes at seed 7 (the test needs more than 10)
    assert tally.counts["hole"] > 10, tally.line()
    assert sum(1 for _, change, error, _ in HAND_PICKED if error is SemanticError and _accepted(change(layer))) >= 10


def _accepted(p: SpatialProgram) -> bool:
    try:
        verify(p)
    except VerifyError:
        return False
    return True


@pytest.mark.emulation
def test_accepted_edits_run_exact_in_the_emulated_kernel(tally):
    """A sample of the harmless edits, lowered and run through the host emulation: the kernel agrees too (exactly,
    the inputs being small integers; a row program's float32 sums within the kernel's bound)."""
    rng = random.Random(5)
    ran = 0
    for base, what, q in rng.sample(tally.accepted, len(tally.accepted)):
        try:
            art = spatialc.lower(q)
        except spatialc.SpatialError:
            continue  # a typed refusal by the lowering is an honest answer
        inputs = mutants.inputs_for(q)
        c = spatialc.emulate(art, inputs)
        ref = reference(q, inputs)
        if is_row_program(q):  # a float32 sum in the warps' order: within the kernel's bound, not bit for bit
            ok, how = spatialc.tolerance(q, kernel=True).check(c if isinstance(c, dict) else np.asarray(c), inputs)
            assert ok, f"{base}: {what}: {how}"
        else:
            assert np.array_equal(np.asarray(c).astype(ref.dtype), ref), f"{base}: {what}"
        ran += 1
        if ran == 6:
            break
    assert ran == 6


RING_OPS = ("Reserve", "Push", "Wait", "Pop", "ReadTiles", "WriteTiles", "Compute", "PackAcc", "AcquireAcc")


@pytest.mark.long
def test_every_refusal_of_a_random_edit_fills_the_fields_its_message_names():
    """An error about an op carries its site, engine and op text, and the ring the op moves where it moves one; an
    error whose message starts at a site carries that site (issue 35: the fields were None where the README said
    errors carry them)."""
    import json
    import re

    from spatialc.errors import DeadlockError, VerifyRuleError

    from ..mutants import EDITS, PROGRAMS

    seen = 0
    for name, make in PROGRAMS.items():
        doc = json.loads(spatialc.to_json(make()))
        rng = random.Random(f"fields:{name}")
        for _ in range(60):
            edited = rng.choice(EDITS)(doc, rng)
            if edited is None:
                continue
            try:
                q = spatialc.from_json(json.dumps(edited[0]))
                if not q.verified:
                    spatialc.verify(q)
            except (VerifyRuleError, DeadlockError) as err:
                seen += 1
                text = str(err).removeprefix("deadlock: ")
                at = re.match(r"site (-?\d+)\b", text)
                assert at is None or err.site == int(at.group(1)), (edited[1], text)
                if err.op is not None:
                    assert err.site is not None and err.engine is not None, (edited[1], text)
                    missing = re.search(r"buffer (-?\d+) does not exist", text)
                    if missing:  # the fault is the id no buffer has: named as such, not as another of the op's
                        assert err.buffer == f"buffer {missing.group(1)}", (edited[1], text, err.buffer)
                    elif err.op.startswith(RING_OPS) and not isinstance(err, DeadlockError):
                        assert err.buffer is not None, (edited[1], text)
            except spatialc.SpatialError:
                pass
    assert seen > 150  # the edits were refused by verify's rules, not only by the reader

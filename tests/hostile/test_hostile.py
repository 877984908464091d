"""What an independent hostile review of verify found, each kept as a test: the program it built, and what must happen
now — refused by name, or verified and then exact in the interpreter and (where it lowers) in the emulated kernel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spatialc
from spatialc.errors import IllFormedError, SemanticError, StrongerCheckNeeded, VerifyError
from spatialc.frontend import bias, scalar
from spatialc.interp.evaluate import load_inputs
from spatialc.interp.machine import Machine
from spatialc.ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LV_K, BufferId, ItemId, LoopVar, Site, StageId
from spatialc.ir.nodes import (
    Accumulator,
    Buffer,
    ComputeStage,
    DType,
    Engine,
    EngineProgram,
    Fifo,
    Schedule,
    Stage,
    WriteStage,
)
from spatialc.ir.ops import (
    AcquireAcc,
    BlockShape,
    Compute,
    Const,
    Generic,
    Loop,
    Map,
    MatmulTiles,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    Relu,
    Reserve,
    Scalar,
    TileAddr,
    Wait,
    WriteTiles,
)
from spatialc.lower.errors import TooBig, Unsupported
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from ..mutants import inputs_for
from ..rewrite import edit, map_ops, replace, swap_compute

R, C, W = Engine.READER, Engine.COMPUTE, Engine.WRITER


def _refused(p, error: type[Exception], *words: str) -> None:
    with pytest.raises(error) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"


def _exact(p) -> None:
    """Verified, and the interpreter equals the reference of what the stages declare."""
    q = verify(p)
    inputs = inputs_for(q)
    assert np.array_equal(spatialc.evaluate(q, inputs), reference(q, inputs))


def test_a_second_matmul_stage_cannot_lend_its_op_to_the_schedule():
    p = spatialc.build(spatialc.gemm(32, 32, 64, "int8"), "sm_86", block=(1, 1, 2), sites=1)
    decoy_op = MatmulTiles(BlockShape(1, 1, 1), (1, 1), p.precision)
    decoy = Stage(StageId(9), "decoy", ComputeStage(decoy_op), C, ins=(BufferId(0), BufferId(1)), outs=(BufferId(9),))
    q = p.evolve(
        stages=(*p.stages[:2], decoy, *p.stages[2:]), buffers=(*p.buffers, Buffer(BufferId(9), "D", Fifo(1, 1)))
    )
    q = replace(q, C, lambda op: (dataclasses.replace(op, op=decoy_op),) if isinstance(op, Compute) else None)
    _refused(q, SemanticError, "stage decoy is not on the way from the inputs to C")


def test_stages_listed_out_of_ring_order_mean_the_ring_order():
    # The reference and rule 8 both read the chain by its rings: relu, then add, whatever the list says.
    p = spatialc.build(
        spatialc.gemm(64, 48, 40, "int8", epilogue=[spatialc.relu(), spatialc.scalar("add", -1000)]), "sm_86"
    )
    st = list(p.stages)
    i = next(k for k, s in enumerate(st) if s.name.startswith("relu"))
    st[i], st[i + 1] = st[i + 1], st[i]
    _exact(p.evolve(stages=tuple(st)))


def test_operands_are_the_matmuls_whatever_their_names():
    p = spatialc.build(spatialc.gemm(48, 48, 48, "int8"), "sm_86", sites=2)
    names = {"A": "B", "B": "A"}
    _exact(p.evolve(tensors=tuple(dataclasses.replace(t, name=names.get(t.name, t.name)) for t in p.tensors)))


def test_a_stage_off_the_way_to_c_is_refused():
    p = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", sites=3)
    dead = Stage(StageId(9), "relu_dead", ComputeStage(Relu()), C, ins=(BufferId(3),), outs=(BufferId(9),))
    q = p.evolve(stages=(*p.stages, dead), buffers=(*p.buffers, Buffer(BufferId(9), "R", Fifo(2, 4))))
    _refused(q, SemanticError, "stage relu_dead is not on the way from the inputs to C")


def test_an_elementwise_compute_naming_an_accumulator_is_ill_formed():
    p = spatialc.build(spatialc.gemm(64, 48, 40, "int8", epilogue=[spatialc.relu()]), "sm_86", sites=3)
    q = replace(
        p,
        C,
        lambda op: (dataclasses.replace(op, acc=BufferId(2)),) if isinstance(op, Compute) and op.op == Relu() else None,
    )
    _refused(
        q, IllFormedError, "an elementwise compute reads the 1 ring its expression names and fills one; it names no"
    )
    q = replace(
        p,
        C,
        lambda op: (
            (dataclasses.replace(op, acc=None),) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles) else None
        ),
    )
    _refused(q, IllFormedError, "a tile matmul reads two rings (A, B) and adds into an accumulator")


def test_a_generic_epilogue_stage_is_refused_by_name():
    p = spatialc.build(spatialc.gemm(64, 48, 40, "fp16", epilogue=[spatialc.relu()]), "sm_86", sites=3)
    q = swap_compute(p, Relu(), Generic("gelu", ()))
    _refused(q, StrongerCheckNeeded, "(generic gelu) is no elementwise stage of the one page before it, nor a requant")


def test_a_bias_that_is_not_int32_is_refused():
    p = spatialc.build(
        spatialc.gemm(32, 32, 64, "int8", epilogue=[spatialc.bias(), spatialc.scalar("mul", 2**20)]), "sm_86"
    )
    q = p.evolve(tensors=tuple(dataclasses.replace(t, dtype=DType.INT64) if t.name == "bias" else t for t in p.tensors))
    _refused(q, SemanticError, "stage bias0 adds bias, which holds int64; a int8 program's bias holds int32")


def test_an_accumulating_pack_of_part_of_the_accumulator_is_refused_and_the_interpreter_says_why():
    p = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", block=(2, 1, 1), sites=3)
    q = replace(
        p, C, lambda op: (dataclasses.replace(op, tiles=1, accumulate=True),) if isinstance(op, PackAcc) else None
    )
    with pytest.raises(VerifyError):
        verify(q)
    with pytest.raises(spatialc.SpatialError):  # typed, not a reshape failure deep in numpy
        spatialc.evaluate(q, inputs_for(q))


def test_a_second_accumulator_is_for_the_interpreter_only():
    base = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", sites=2)
    p = base.evolve(buffers=(*base.buffers, Buffer(BufferId(7), "acc2", Accumulator(4))))
    q = replace(p, C, lambda op: (AcquireAcc(BufferId(7)), op) if isinstance(op, PackAcc) else None)
    _exact(q)
    with pytest.raises(Unsupported, match="2 accumulators"):
        spatialc.lower(verify(q))


def test_data_through_a_ring_no_stage_names_is_refused():
    base = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", sites=2)
    cr, u = BufferId(3), BufferId(7)
    p = base.evolve(buffers=(*base.buffers, Buffer(u, "U_ring", Fifo(2, 4))))

    def move(op):
        if isinstance(op, Reserve | Push | Wait | Pop) and op.buf == cr:
            return (dataclasses.replace(op, buf=u),)
        if isinstance(op, PackAcc) and op.to == cr:
            return (dataclasses.replace(op, to=u),)
        if isinstance(op, WriteTiles) and op.src == cr:
            return (dataclasses.replace(op, src=u),)
        return None

    _refused(
        replace(replace(p, C, move), W, move),
        SemanticError,
        "its data goes through U_ring, but the stages send it through C_ring",
    )


def test_the_int32_bound_reads_k_from_the_matmuls_operand_whatever_the_tensor_order():
    p = spatialc.build(spatialc.gemm(16, 16, 140000, "int8"), "sm_86", block=(1, 1, 8), sites=1)
    a, b, c = p.tensors
    with pytest.raises(TooBig, match="K = 140000"):
        spatialc.lower(verify(p.evolve(tensors=(b, a, c))))


def test_a_site_without_items_that_writes_is_refused():
    p = spatialc.build(spatialc.gemm(32, 32, 64, "int8"), "sm_86", block=(2, 2, 1), sites=2)

    def const(op):  # the only item's coordinates are 0: drop them, so nothing names the item
        if isinstance(op, ReadTiles | WriteTiles):
            return (
                dataclasses.replace(
                    op, at=TileAddr(op.at.base, tuple(s for s in op.at.steps if s[0] not in (LV_ITEM_X, LV_ITEM_Y)))
                ),
            )
        return None

    first = [EngineProgram(q.site, q.engine, map_ops(q.ops, const)) for q in p.schedule.programs if q.site == Site(0)]
    twin = [EngineProgram(Site(1), q.engine, q.ops) for q in first]
    _refused(
        p.evolve(schedule=Schedule((*first, *twin))), SemanticError, "site 1 holds no item, yet runs site 0's programs"
    )


def test_python_values_of_the_wrong_type_are_ill_formed():
    p = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", sites=2)
    q = replace(
        p,
        Engine.READER,
        lambda op: (dataclasses.replace(op, count=Const(4.0)),) if isinstance(op, Loop) and op.var != 0 else None,
    )
    _refused(q, IllFormedError, "site 0 reader: Loop.count.n: expected a whole number, found 4.0")
    q = replace(
        p, Engine.READER, lambda op: (dataclasses.replace(op, pages=True),) if isinstance(op, Reserve) else None
    )
    _refused(q, IllFormedError, "Reserve.pages: expected a whole number, found True")


def test_an_int64_array_is_taken_for_an_int64_tensor():
    from spatialc.inputs import InputError, check_values

    check_values("x", np.zeros(4, dtype=np.int64), DType.INT64)
    with pytest.raises(InputError, match="beyond 2\\^53"):
        check_values("x", np.array([2**60], dtype=np.int64), DType.INT64)


# ---- round 2 ----------------------------------------------------------------------------------------------------


def _with_scalars(precision: str, *ops: Map) -> spatialc.SpatialProgram:
    """A GEMM whose epilogue is `ops`, put in by hand where the frontend would refuse them."""
    p = spatialc.build(
        spatialc.gemm(32, 32, 32, precision, epilogue=[scalar("add", i + 1) for i in range(len(ops))]), "sm_86"
    )
    olds = [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage) and s.name.startswith("scalar")]
    for old, new in zip(olds, ops, strict=True):
        p = swap_compute(p, old, new)
    return p


def test_a_bias_with_a_padding_row_of_tiles_is_refused():
    # C pads a whole item column and the bias a whole row of tiles: the flat tile the last item reads, 3, is in
    # bounds of the bias's 2x3 tiles but is its second row; a bias's values must lie in one row.
    p = spatialc.build(spatialc.gemm(32, 40, 64, "int8", epilogue=[bias()]), "sm_86", block=(1, 1, 2), sites=1)
    b_id = next(t.id for t in p.tensors if t.name == "B")
    grids = {"C": (2, 4), "B": (4, 4), "bias": (2, 3)}
    tensors = tuple(dataclasses.replace(t, tiles=grids.get(t.name, t.tiles)) for t in p.tensors)
    assert p.placement is not None
    placement = dataclasses.replace(p.placement, items_of_site=((Site(0), tuple(ItemId(i) for i in range(8))),))

    def four_columns(op):
        if isinstance(op, Loop) and op.var == LV_ITEM:
            return (Loop(LV_ITEM, Const(8), map_ops(op.body, four_columns)),)
        if isinstance(op, ReadTiles) and op.tensor == b_id:
            return (dataclasses.replace(op, at=TileAddr(0, ((LV_K, 8), (LV_ITEM_X, 1))), stride_h=4),)
        if isinstance(op, WriteTiles):
            return (dataclasses.replace(op, at=TileAddr(0, ((LV_ITEM_Y, 4), (LV_ITEM_X, 1)))),)
        return None

    q = p.evolve(tensors=tensors, plans=(dataclasses.replace(p.plan, grid=(2, 4)),), placement=placement)
    for engine in (R, C, W):
        q = replace(q, engine, four_columns)
    _refused(q, IllFormedError, "bias is a parameter tensor of 1x40 in 2x3 tiles", "in one row of tiles")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_float_scalar_beyond_float32_is_refused_and_one_within_is_exact(precision):
    _refused(_with_scalars(precision, Scalar("mul", 1e300)), IllFormedError, "the constant 1e+300 is beyond float32")
    _refused(_with_scalars(precision, Scalar("max", 1e39)), IllFormedError, "beyond float32")
    _exact(_with_scalars(precision, Scalar("mul", 1e-30)))


@pytest.mark.parametrize(
    ("ops", "words"),
    [
        ((Scalar("max", -(2**63)),), "a constant needs a whole number within ±2^62, not -9223372036854775808"),
        ((Scalar("min", 1e20),), "a constant needs a whole number within ±2^62, not 1e+20"),
        ((Relu(), Scalar("min", 0), Scalar("mul", 2**70)), "stage scalar2: an int8 program's epilogue is integer"),
    ],
)
def test_an_int8_scalar_constant_beyond_2_62_is_refused_whatever_the_range_it_meets(ops, words):
    # The values the constant meets may stay small (max(x, -2^63) is x); the interpreter and the kernel still hold
    # the constant itself, so it must be within their exact range.
    _refused(_with_scalars("int8", *ops), IllFormedError, words)


def test_an_int8_add_that_reaches_the_exact_bound_is_refused_with_a_margin():
    # 32 products of (-128)·(-128) plus v reach 2^62 - 1 exactly; float64 estimates of that round to 2^62, so the
    # bound keeps a margin below ±2^62 and a value this close is refused.
    v = 2**62 - 1 - 32 * 128 * 128
    _refused(
        _with_scalars("int8", Scalar("add", v)),
        SemanticError,
        "beyond ±(2^62 - 2^12), where integer epilogues are exact",
    )
    _exact(_with_scalars("int8", Scalar("add", 2**40)))


def test_a_write_stage_that_fills_its_own_ring_is_refused_not_followed_forever():
    p = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", sites=2)
    c_ring = next(b.id for b in p.buffers if b.name == "C_ring")
    w_ring = BufferId(max(b.id for b in p.buffers) + 1)
    buffers = (*p.buffers, Buffer(w_ring, "W_ring", Fifo(2, 4)))
    stages = tuple(
        dataclasses.replace(s, ins=(w_ring,), outs=(w_ring,)) if isinstance(s.kind, WriteStage) else s for s in p.stages
    )

    def writer_fills(op):
        if isinstance(op, WriteTiles):
            return (Pop(c_ring), Reserve(w_ring), Push(w_ring), Wait(w_ring), dataclasses.replace(op, src=w_ring))
        if isinstance(op, Pop) and op.buf == c_ring:
            return (Pop(w_ring),)
        return None

    q = replace(p.evolve(buffers=buffers, stages=stages), W, writer_fills)
    _refused(q, StrongerCheckNeeded, "stage write_C fills W_ring, and only read or compute stages fill rings")


def test_loops_nested_deeper_than_a_kernel_prints_are_refused_without_recursion():
    p = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", block=(1, 1, 1), sites=3)

    def nest(ops):
        for j in range(5000):
            ops = (Loop(LoopVar(100 + j), Const(1), ops),)
        return ops

    _refused(edit(p, R, nest), IllFormedError, "loops nested more than 32 deep")
    _exact(edit(p, R, lambda ops: (Loop(LoopVar(100), Const(1), (Loop(LoopVar(101), Const(1), ops),)),)))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda p: p.evolve(tensors=list(p.tensors)), "program.tensors: expected a tuple, found list"),
        (
            lambda p: p.evolve(tensors=(dataclasses.replace(p.tensors[0], dtype="int8"), *p.tensors[1:])),
            "program.tensors[0].dtype: expected a DType, found 'int8'",
        ),
        (
            lambda p: p.evolve(tensors=(dataclasses.replace(p.tensors[0], tiles=(4.0, 4)), *p.tensors[1:])),
            "program.tensors[0].tiles[0]: expected a whole number, found 4.0",
        ),
        (
            lambda p: p.evolve(buffers=(dataclasses.replace(p.buffers[0], kind=None), *p.buffers[1:])),
            "program.buffers[0].kind: expected a Fifo, found NoneType",
        ),
        (lambda p: p.evolve(precision="fp8"), "program.precision: expected a Precision, found 'fp8'"),
        (
            lambda p: p.evolve(stages=(dataclasses.replace(p.stages[0], kind=None), *p.stages[1:])),
            "program.stages[0].kind: expected a ReadStage, found NoneType",
        ),
        (
            lambda p: replace(p, W, lambda op: (Relu(),) if isinstance(op, Pop) else None),
            "site 0 writer: an op: expected a choreography op, found Map",
        ),
    ],
)
def test_values_of_other_types_anywhere_are_named_by_their_path(change, words):
    p = spatialc.build(spatialc.gemm(64, 48, 40, "int8"), "sm_86", sites=2)
    _refused(change(p), IllFormedError, words)


def test_an_empty_loop_is_not_spun_by_the_interpreter():
    # A loop with nothing inside may count to 2^31 - 1; running it would take minutes and change nothing.
    p = spatialc.build(spatialc.gemm(32, 32, 32, "int8"), "sm_86")
    q = verify(edit(p, W, lambda ops: (Loop(LoopVar(30), Const(2**31 - 1), ()), *ops)))
    inputs = inputs_for(q)
    stores, params = load_inputs(q, inputs)
    writer = next(e.code for e, _ in Machine(q, stores, params, False).engines() if e.engine == W)
    assert "range(2147483647)" not in writer.source
    assert "no operation inside, skipped" in writer.source
    assert np.array_equal(spatialc.evaluate(q, inputs), reference(q, inputs))

"""What an independent hostile review of verify found, each kept as a test: the program it built, and what must happen
now — refused by name, or verified and then exact in the interpreter and (where it lowers) in the emulated kernel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spatialc
from spatialc.errors import IllFormedError, SemanticError, StrongerCheckNeeded, VerifyError
from spatialc.ir.ids import LV_ITEM_X, LV_ITEM_Y, BufferId, Site, StageId
from spatialc.ir.nodes import Accumulator, Buffer, ComputeStage, DType, Engine, EngineProgram, Fifo, Schedule, Stage
from spatialc.ir.ops import (
    AcquireAcc,
    BlockShape,
    Compute,
    Const,
    Generic,
    Loop,
    MatmulTiles,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    Relu,
    Reserve,
    TileAddr,
    Wait,
    WriteTiles,
)
from spatialc.lower.errors import TooBig, Unsupported
from spatialc.passes.verify import verify
from spatialc.reference import reference

from .mutants import inputs_for
from .rewrite import map_ops, replace

C, W = Engine.COMPUTE, Engine.WRITER


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
    _refused(q, StrongerCheckNeeded, "several tile matmuls")


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
        lambda op: (
            (dataclasses.replace(op, acc=BufferId(2)),) if isinstance(op, Compute) and isinstance(op.op, Relu) else None
        ),
    )
    _refused(q, IllFormedError, "an elementwise compute reads one ring and fills one; it names no accumulator")
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
    g = Generic("gelu", ())

    def swap(s: Stage) -> Stage:
        return (
            dataclasses.replace(s, kind=ComputeStage(g))
            if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Relu)
            else s
        )

    q = p.evolve(stages=tuple(map(swap, p.stages)))
    q = replace(
        q,
        C,
        lambda op: (dataclasses.replace(op, op=g),) if isinstance(op, Compute) and isinstance(op.op, Relu) else None,
    )
    _refused(q, StrongerCheckNeeded, "(generic gelu) is no elementwise bias, relu, scalar or requant")


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
    _refused(q, IllFormedError, "must be a whole number, not 4.0")
    q = replace(
        p, Engine.READER, lambda op: (dataclasses.replace(op, pages=True),) if isinstance(op, Reserve) else None
    )
    _refused(q, IllFormedError, "its pages must be a whole number, not True")


def test_an_int64_array_is_taken_for_an_int64_tensor():
    from spatialc.inputs import InputError, check_values

    check_values("x", np.zeros(4, dtype=np.int64), DType.INT64)
    with pytest.raises(InputError, match="beyond 2\\^53"):
        check_values("x", np.array([2**60], dtype=np.int64), DType.INT64)

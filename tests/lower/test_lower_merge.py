"""Serialising a site's engine programs onto one block (lower/cuda/persistent/merge.py), and the ring proof on the
result."""

import pytest

from spatialc.ir.ids import LV_ITEM, LV_K, BufferId, LoopVar, TensorId
from spatialc.ir.ops import (
    AcquireAcc,
    Compute,
    Const,
    Loop,
    PackAcc,
    Pop,
    Push,
    ReleaseAcc,
    Relu,
    Reserve,
    TileAddr,
    Wait,
    WriteTiles,
)
from spatialc.lower.cuda.common.rings import Ring, Rings
from spatialc.lower.cuda.persistent.merge import SerialLoop, serialise
from spatialc.lower.cuda.persistent.order import prove, rotation
from spatialc.lower.errors import TooBig, Unsupported

A, B, ACC, C = BufferId(0), BufferId(1), BufferId(2), BufferId(3)
K4 = Const(4)
READER = (Loop(LV_K, K4, (Reserve(A), Push(A), Reserve(B), Push(B))),)
COMPUTE = (
    AcquireAcc(ACC),
    Loop(LV_K, K4, (Wait(A), Wait(B), Pop(A), Pop(B))),
    Reserve(C),
    PackAcc(ACC, C, 1),
    Push(C),
    ReleaseAcc(ACC),
)
WRITER = (Wait(C), Pop(C))  # the standard writer: no K loop, waiting on a push made after the compute's K loop


def rings(depth_a=2, depth_c=2, fused=()):
    table = {
        0: Ring(0, "A", depth_a, 256, "OPT", 1),
        1: Ring(1, "B", depth_a, 256, "OPT", 1),
        3: Ring(3, "C", depth_c, 256, "ACCT", 4),
    }
    for f in fused:
        table.pop(f)
    return Rings(table, {A: 0, B: 1, ACC: 2, C: 3}, fused, {0: "A", 1: "B", 3: "C"})


def test_the_writer_carries_its_blocked_ops_past_the_k_loop_it_has_no_part_in():
    # DESIGN §4: draining every program before a co-iterated loop would refuse this good program, because the
    # writer's Wait C waits on a push the compute engine makes only after its K loop.
    ops = serialise([READER, COMPUTE, WRITER])
    assert ops[0] == AcquireAcc(ACC)
    assert isinstance(ops[1], SerialLoop) and ops[1].var == LV_K and ops[1].merged == 2
    assert ops[1].body == (Reserve(A), Push(A), Reserve(B), Push(B), Wait(A), Wait(B), Pop(A), Pop(B))
    assert ops[2:] == (Reserve(C), PackAcc(ACC, C, 1), Push(C), ReleaseAcc(ACC), Wait(C), Pop(C))
    prove(rings(), ops)  # and the carried order is one the rings allow


def test_the_same_order_inside_item_loops_and_whatever_order_the_engines_are_listed_in():
    wrap = [(Loop(LV_ITEM, Const(3), body),) for body in (WRITER, COMPUTE, READER)]
    (item,) = serialise(wrap)
    assert isinstance(item, SerialLoop) and item.var == LV_ITEM and item.merged == 3
    assert item.body == serialise([READER, COMPUTE, WRITER])


def test_a_program_that_must_enter_its_loop_cannot_carry_a_blocked_op_past_it():
    # The compute engine would wait on C before its own K loop, but C is pushed only after that loop.
    compute = (Wait(C), Loop(LV_K, K4, (Wait(A), Pop(A))), Pop(C))
    reader = (Loop(LV_K, K4, (Reserve(A), Push(A))), Reserve(C), Push(C))
    with pytest.raises(Unsupported, match="cannot be serialised"):
        serialise([reader, compute])


def test_programs_waiting_on_each_other_have_no_order():
    with pytest.raises(Unsupported, match="cannot be serialised"):
        serialise([(Wait(A), Reserve(B), Push(B)), (Wait(B), Reserve(A), Push(A))])


def test_loops_over_different_variables_at_the_same_point_are_refused():
    other = LoopVar(9)
    with pytest.raises(Unsupported, match="different variables"):
        serialise([(Loop(LV_K, K4, (Reserve(A), Push(A))),), (Loop(other, K4, (Wait(A), Pop(A))),)])


def test_co_iterating_loops_with_different_counts_are_refused():
    with pytest.raises(Unsupported, match="different counts"):
        serialise([(Loop(LV_K, K4, (Reserve(A), Push(A))),), (Loop(LV_K, Const(3), (Wait(A), Pop(A))),)])


def test_a_loop_waiting_on_a_later_pass_is_left_out_until_that_pass():
    """A row program's shape: the reader and the compute engine make two passes over the row's pages (the first
    reduces it into a vector V, the second maps the pages into C), the writer one pass storing C. Merged into the
    first pass, the writer's loop would wait for C pages no op before it pushes; it is left out of it, and merged
    into the second."""
    x1, x2, v = BufferId(4), BufferId(5), BufferId(6)
    reader = (Loop(LV_K, K4, (Reserve(x1), Push(x1))), Loop(LV_K, K4, (Reserve(x2), Push(x2))))
    first = Loop(LV_K, K4, (Wait(x1), Pop(x1)))
    second = Loop(LV_K, K4, (Wait(x2), Reserve(C), Push(C), Pop(x2)))
    compute = (first, Reserve(v), Push(v), Wait(v), second, Pop(v))
    writer = (Loop(LV_K, K4, (Wait(C), Pop(C))),)
    ops = serialise([reader, compute, writer])
    loops = [op for op in ops if isinstance(op, SerialLoop)]
    assert [lp.merged for lp in loops] == [2, 3]
    assert loops[0].body == (Reserve(x1), Push(x1), Wait(x1), Pop(x1))
    assert loops[1].body == (Reserve(x2), Push(x2), Wait(x2), Reserve(C), Push(C), Pop(x2), Wait(C), Pop(C))
    assert ops[1:4] == (Reserve(v), Push(v), Wait(v)) and ops[-1] == Pop(v)
    table = {r: Ring(r, f"r{r}", 2, 256, "OPT", 1) for r in (3, 4, 5, 6)}
    prove(Rings(table, {C: 3, x1: 4, x2: 5, v: 6}, (), {}), ops)
    # A loop that also drains what the merged loop fills stays in (examples/shallow_ring.py: its reader runs all
    # of A ahead of B): left out, the A pages would pile up over the trips. The proof refuses the order, by name.
    ahead = (Loop(LV_K, K4, (Reserve(A), Push(A))), Loop(LV_K, K4, (Reserve(B), Push(B))))
    both = (Loop(LV_K, K4, (Wait(A), Wait(B), Pop(A), Pop(B))),)
    ops = serialise([ahead, both])
    assert [op.merged for op in ops] == [2, 1]
    with pytest.raises(Unsupported, match="Wait on ring B in the serialised order"):
        prove(rings(), ops)
    # Waiting on each other's later passes, neither loop can be left out: both are merged, and the proof refuses
    # the order (a wait on a page not yet pushed), naming it.
    a = (Loop(LV_K, K4, (Wait(A), Pop(A))), Loop(LV_K, K4, (Reserve(B), Push(B))))
    b = (Loop(LV_K, K4, (Wait(B), Pop(B))), Loop(LV_K, K4, (Reserve(A), Push(A))))
    crossed = serialise([a, b])
    assert [op.merged for op in crossed] == [2, 2]
    with pytest.raises(Unsupported, match="Wait on ring A in the serialised order"):
        prove(rings(), crossed)


def test_a_loop_that_runs_once_is_absorbed_whole_and_one_that_runs_more_stays_a_cut():
    once = LoopVar(9)
    producer = (Loop(once, Const(1), (Reserve(A), Push(A))), Reserve(B), Push(B))
    consumer = (Wait(A), Pop(A), Wait(B), Pop(B))
    ops = serialise([consumer, producer])
    assert ops[0] == SerialLoop(once, Const(1), (Reserve(A), Push(A)), 1)
    assert ops[1:] == (Reserve(B), Push(B), Wait(A), Pop(A), Wait(B), Pop(B))
    # Run four times, the loop would push four pages before the consumer (carried past it) drains any: the merge
    # allows that order, and the ring proof refuses it.
    many = (Loop(once, K4, (Reserve(A), Push(A))),)
    drain = (Wait(A), Pop(A), Wait(A), Pop(A), Wait(A), Pop(A), Wait(A), Pop(A))
    ops = serialise([drain, many])
    assert ops[0] == SerialLoop(once, K4, (Reserve(A), Push(A)), 1) and ops[1:] == drain
    with pytest.raises(Unsupported, match="does not leave every ring as it found it"):
        prove(rings(depth_a=8), ops)


def test_the_proof_refuses_a_ring_filled_past_its_depth():
    with pytest.raises(TooBig, match="ring A") as err:
        prove(rings(depth_a=2), (Reserve(A), Push(A), Reserve(A), Push(A), Reserve(A)))
    assert (err.value.need, err.value.have) == (3, 2)


def test_rotation_needs_twice_a_step_of_pages_and_the_proof_follows_it():
    (k_loop,) = [op for op in serialise([READER, COMPUTE, WRITER]) if isinstance(op, SerialLoop)]
    assert rotation(rings(depth_a=1), k_loop) is None
    rot = rotation(rings(depth_a=2), k_loop)
    assert rot is not None and rot.prod == (Reserve(A), Push(A), Reserve(B), Push(B)) and rot.cons[0] == Wait(A)
    prove(rings(depth_a=2), (k_loop,))
    prove(rings(depth_a=1), (k_loop,))


def test_the_rotation_runs_as_far_ahead_as_its_pops_stay_barrier_free():
    """Depth D, one page a step: D − 1 steps ahead (the producer printed behind the consumer's wait barrier, a ring
    holds D steps' pages), never more than the loop's steps less one; and the occupancy proof, which replays the
    prologue, every steady step and the drain, accepts exactly that."""
    (k_loop,) = [op for op in serialise([READER, COMPUTE, WRITER]) if isinstance(op, SerialLoop)]
    steps = k_loop.count.n
    for depth in (2, 3, 4, 5, 8):
        rot = rotation(rings(depth_a=depth), k_loop)
        assert rot is not None and rot.ahead == max(1, min(depth - 1, steps - 1)), depth
        assert rot.head == (Wait(A), Wait(B)) and rot.head + rot.rest == rot.cons
        prove(rings(depth_a=depth), (k_loop,))


def test_the_proof_refuses_an_unbalanced_loop_and_a_wait_with_no_page():
    with pytest.raises(Unsupported, match="does not leave every ring as it found it"):
        prove(rings(depth_a=8), (SerialLoop(LV_K, K4, (Reserve(A), Push(A))),))
    with pytest.raises(Unsupported, match="Wait on ring A"):
        prove(rings(), (Reserve(A), Wait(A)))
    with pytest.raises(Unsupported, match="pages still in a ring"):
        prove(rings(), (Reserve(A), Push(A)))


def test_the_fused_output_must_be_stored_before_the_accumulators_change():
    fused = rings(fused=(3,))
    store = WriteTiles(C, TensorId(2), TileAddr(0), 1, 1, 1, 1)
    prove(fused, (AcquireAcc(ACC), Reserve(C), PackAcc(ACC, C, 1), Push(C), Wait(C), store, Pop(C)))
    with pytest.raises(Unsupported, match="accumulators unstored"):
        prove(fused, (AcquireAcc(ACC), Reserve(C), PackAcc(ACC, C, 1), Push(C), Wait(C), Pop(C)))
    with pytest.raises(Unsupported, match="between the fused PackAcc"):
        prove(fused, (Reserve(C), PackAcc(ACC, C, 1), Push(C), AcquireAcc(ACC)))


def test_the_fused_chain_must_be_applied_in_order_once_between_pack_and_store():
    # C is the matmul's output and E a relu stage's: fused, neither has a ring; the store prints the whole chain.
    e = BufferId(4)
    fused = Rings(
        {0: Ring(0, "A", 2, 256, "OPT", 1), 1: Ring(1, "B", 2, 256, "OPT", 1)},
        {A: 0, B: 1, ACC: 2, C: 3, e: 4},
        (3, 4),
        {0: "A", 1: "B", 3: "C", 4: "E"},
    )
    pack, relu_e = PackAcc(ACC, C, 1), Compute(Relu(), (C,), (e,))
    store_e, store_c = (WriteTiles(buf, TensorId(2), TileAddr(0), 1, 1, 1, 1) for buf in (e, C))
    prove(fused, (AcquireAcc(ACC), pack, relu_e, store_e))
    for order in (
        (AcquireAcc(ACC), pack, store_c),  # the relu skipped
        (AcquireAcc(ACC), relu_e, pack, store_e),  # applied before the accumulators are packed
        (AcquireAcc(ACC), pack, relu_e, relu_e, store_e),
    ):  # applied twice
        with pytest.raises(Unsupported, match="on the fused output out of order"):
            prove(fused, order)
    with pytest.raises(Unsupported, match="between the fused PackAcc"):
        prove(fused, (AcquireAcc(ACC), pack, relu_e, AcquireAcc(ACC), store_e))

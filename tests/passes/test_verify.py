"""verify: every built program passes; one hand-broken program per rule is refused with the rule's error, located."""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spatialc
from spatialc.errors import (
    CoverageError,
    DeadlockError,
    IllFormedError,
    RingDepthError,
    RingOwnershipError,
    SemanticError,
    StrongerCheckNeeded,
    TileBoundsError,
    UnbalancedError,
    VerifyDeadlockError,
    VerifyError,
)
from spatialc.frontend import BUF_A, BUF_ACC, BUF_B, BUF_C, T_A, T_B, T_C
from spatialc.ir.ids import (
    LV_ITEM,
    LV_ITEM_X,
    LV_ITEM_Y,
    LV_K,
    BufferId,
    GroupId,
    ItemId,
    LoopVar,
    SemId,
    Site,
    TensorId,
)
from spatialc.ir.index import ProgramIndex as Ctx
from spatialc.ir.nodes import (
    Buffer,
    ComputeStage,
    DType,
    Engine,
    EngineProgram,
    Fifo,
    Group,
    Placement,
    ReadStage,
    Schedule,
    Semaphore,
    SpatialProgram,
    Tensor,
    TensorRole,
    Tile,
    WriteStage,
)
from spatialc.ir.ops import (
    Apply,
    Arg,
    Barrier,
    BlockShape,
    ChoreoOp,
    Compute,
    Const,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    Pop,
    Push,
    ReadTiles,
    Requant,
    Reserve,
    Scalar,
    SemInc,
    SemSet,
    SemWait,
    TileAddr,
    Trip,
    Wait,
    WriteTiles,
    walk,
    with_cols,
)
from spatialc.passes.place import place
from spatialc.passes.schedule import schedule
from spatialc.passes.tile import tile
from spatialc.passes.verify import deadlock, deadlock_run, verify
from spatialc.target import target

from ..rewrite import edit, k_body, replace

R, C, W = Engine.READER, Engine.COMPUTE, Engine.WRITER


def small(**kw) -> SpatialProgram:
    """C[100×70] = A @ B in int8 on sm_86: 1x1x1 blocks, a 7x5 grid, 4 K steps, one item per site."""
    kw.setdefault("block", (1, 1, 1))
    kw.setdefault("placement", "contiguous")
    kw.setdefault("depth", 3)
    return spatialc.build(spatialc.gemm(100, 70, 50, "int8"), "sm_86", **kw)


def refused(p: SpatialProgram, error: type[Exception], *words: str) -> Exception:
    with pytest.raises(error) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    return info.value


# ---- every built program verifies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "prec", "tgt", "kw"),
    [
        ((100, 70, 50), "int8", "sm_86", {}),
        ((1, 1, 1), "fp16", "sm_80", {}),
        ((256, 256, 256), "bf16", "sm_90", {}),
        ((1000, 300, 130), "int8", "sm_80", {"placement": "round_robin", "sites": 7}),
        ((1000, 300, 130), "fp16", "sm_90", {"placement": "contiguous", "sites": 5}),
        ((64, 64, 64), "int8", "sm_86", {"sites": 40}),  # more sites than items: empty sites
        ((300, 500, 200), "fp16", "sm_86", {"block": (2, 4, 2), "sub_blocks": (2, 1), "depth": 2}),
        ((300, 500, 200), "int8", "sm_90", {"block": (1, 1, 1), "sub_blocks": (1, 1), "depth": 1, "sites": 3}),
        ((200, 200, 96), "bf16", "sm_80", {"block": (4, 4, 4), "sub_blocks": (1, 2), "placement": "round_robin"}),
    ],
)
def test_built_programs_verify(shape, prec, tgt, kw):
    p = spatialc.build(spatialc.gemm(*shape, prec), tgt, **kw)
    assert p.verified
    assert verify(p.evolve()).verified


def test_only_verify_sets_verified():
    t = target("sm_86")
    p = spatialc.gemm(100, 70, 50, "int8")
    steps = [tile(p, t)]
    steps.append(place(steps[-1], t))
    steps.append(schedule(steps[-1]))
    assert not any(q.verified for q in steps)
    # verify runs after any pass: what a program does not have yet (placement, schedule) it cannot break
    assert all(verify(q).verified for q in steps)
    done = verify(steps[-1])
    assert done.verified and not done.evolve(name="x").verified
    assert not schedule(done).verified and not tile(done, t).verified


def test_hand_placement_with_an_empty_site_and_uneven_item_loops():
    t = target("sm_86")
    p = place(tile(spatialc.gemm(100, 70, 50, "int8"), t), t)
    assert p.plan is not None
    n = p.plan.items
    uneven = (
        (Site(0), tuple(ItemId(i) for i in range(0, n, 2))),
        (Site(1), ()),
        (Site(2), tuple(ItemId(i) for i in range(1, n, 2))),
    )
    p = schedule(p.evolve(placement=Placement(uneven, (), "strided")))
    assert p.schedule is not None and any(q.ops and q.ops[0].count == Const(0) for q in p.schedule.programs)
    assert verify(p).verified


def test_writer_walking_an_empty_k_loop_verifies():
    # DESIGN §4's first way to let the lowering merge a site's programs: every engine gets the K loop skeleton.
    p = small(sites=5)
    assert p.plan is not None
    skeleton = Loop(LV_K, Const(p.plan.k_steps), ())
    p = replace(
        p,
        W,
        lambda op: (
            (dataclasses.replace(op, body=(skeleton, *op.body)),)
            if isinstance(op, Loop) and op.var == LV_ITEM
            else None
        ),
    )
    assert verify(p).verified


# ---- rule 1: ids resolve, counts sane ---------------------------------------------------------------------------


def test_unknown_buffer():
    p = replace(small(), C, lambda op: (Wait(BufferId(9)),) if op == Wait(BUF_B) else None)
    e = refused(p, IllFormedError, "site 0 compute", "buffer 9 does not exist")
    assert (e.site, e.engine) == (0, "compute")


def test_bad_counts_and_pages():
    p = replace(small(), R, lambda op: (Push(BUF_A, 0),) if op == Push(BUF_A) else None)
    refused(p, IllFormedError, "site 0 reader", "Push A_ring x0", "moves 1 to 1024 pages")
    p = replace(small(), C, lambda op: (dataclasses.replace(op, count=Const(-1)),) if isinstance(op, Loop) else None)
    refused(p, IllFormedError, "site 0 compute", "loop count must be ≥ 0")


def test_every_count_and_depth_is_bounded_by_what_a_target_could_hold():
    """A ring of 2^62 pages verified and then could be neither evaluated nor lowered: rule 1 bounds each field."""
    p = spatialc.build(spatialc.gemm(32, 32, 32, "int8"), "sm_86")
    huge = 2**62

    def buffer(name, **kinds):
        return p.evolve(
            buffers=tuple(
                dataclasses.replace(b, kind=dataclasses.replace(b.kind, **kinds)) if b.name == name else b
                for b in p.buffers
            )
        )

    refused(buffer("A_ring", depth_pages=huge), IllFormedError, "ring A_ring must have 1 to 1024 pages")
    refused(buffer("A_ring", depth_pages=1025), IllFormedError, "ring A_ring must have 1 to 1024 pages")
    assert spatialc.verify(buffer("A_ring", depth_pages=1024)).verified  # the bound itself is legal
    refused(buffer("A_ring", page_tiles=huge), IllFormedError, "of 1 to 1048576 tiles")
    refused(buffer("acc", tiles=huge), IllFormedError, "accumulator acc must hold 1 to 1048576 tiles")
    plan = p.plans[0]
    refused(p.evolve(plans=(dataclasses.replace(plan, depth=huge),)), IllFormedError, "a ring holds at most 1024")
    place = p.placement
    refused(p.evolve(placement=dataclasses.replace(place, band=huge)), IllFormedError, "band")
    refused(p.evolve(placement=dataclasses.replace(place, multicast=(huge, 1))), IllFormedError, "multicast groups")
    refused(p.evolve(placement=dataclasses.replace(place, multicast=(0, 1))), IllFormedError, "each side ≥ 1")
    big = replace(p, R, lambda op: (Reserve(op.buf, huge),) if isinstance(op, Reserve) else None)
    refused(big, IllFormedError, "moves 1 to 1024 pages")
    wide = replace(p, R, lambda op: (dataclasses.replace(op, block_h=huge),) if isinstance(op, ReadTiles) else None)
    refused(wide, IllFormedError, "a block must be 1x1 to 1024x1024 tiles")


def test_trip_reads_a_parameter_and_vars_are_bound():
    p = replace(
        small(), R, lambda op: (dataclasses.replace(op, count=Trip(T_A, 0, 4)),) if isinstance(op, Loop) else None
    )
    refused(p, IllFormedError, "site 0 reader", "input tensor", "parameter")
    bad = LoopVar(9)
    p = replace(
        small(),
        R,
        lambda op: (dataclasses.replace(op, at=TileAddr(0, ((bad, 1),))),) if isinstance(op, ReadTiles) else None,
    )
    refused(p, IllFormedError, "site 0 reader", "ReadTiles A", "lv9, which no enclosing loop binds")


def test_unknown_tensor_semaphore_group_and_site():
    p = replace(
        small(), W, lambda op: (dataclasses.replace(op, tensor=TensorId(7)),) if isinstance(op, WriteTiles) else None
    )
    refused(p, IllFormedError, "site 0 writer", "tensor 7 does not exist")
    p = edit(small(), C, lambda ops: (SemWait(SemId(0), 1), *ops), sites=(2,))
    refused(p, IllFormedError, "site 2 compute", "semaphore 0 does not exist")
    p = edit(small(), C, lambda ops: (Barrier(GroupId(0)), *ops), sites=(2,))
    refused(p, IllFormedError, "site 2 compute", "group 0 does not exist")
    p = small()
    assert p.schedule is not None
    stray = EngineProgram(Site(99), R, ())
    refused(p.evolve(schedule=Schedule((*p.schedule.programs, stray))), IllFormedError, "no site 99")


def test_tables_and_loop_variables():
    p = small()
    ring = p.buffer(BUF_C)
    refused(p.evolve(buffers=(*p.buffers, ring)), IllFormedError, "two buffers have id 3")
    shallow = dataclasses.replace(ring, kind=Fifo(0, 1))
    refused(
        p.evolve(buffers=tuple(shallow if b.id == BUF_C else b for b in p.buffers)),
        IllFormedError,
        "ring C_ring must have 1 to 1024 pages",
    )
    copy = Buffer(BufferId(8), "A_ring_1", Fifo(1, 1), origin=BUF_A)
    refused(p.evolve(buffers=(*p.buffers, copy)), IllFormedError, "A_ring_1 is a copy of A_ring but is Fifo")
    assert p.placement is not None
    g = Group(GroupId(0), (Site(0), Site(77)))
    refused(p.evolve(placement=dataclasses.replace(p.placement, groups=(g,))), IllFormedError, "names site 77")
    nested = replace(p, R, lambda op: (Loop(LV_K, Const(1), (op,)),) if isinstance(op, Loop) else None)
    refused(nested, IllFormedError, "site 0 reader: Loop k < 4", "already bound by an enclosing loop")
    item_y = replace(p, R, lambda op: (dataclasses.replace(op, var=LoopVar(1)),) if isinstance(op, Loop) else None)
    refused(item_y, IllFormedError, "site 0 reader: Loop item_y < 4", "no loop may bind it")


# ---- rule 2: one producer and one consumer engine per ring per site -------------------------------------------


def test_reserve_moved_to_the_consumer():
    p = replace(small(), R, lambda op: () if op == Reserve(BUF_A) else None)
    p = replace(p, C, lambda op: (Reserve(BUF_A), op) if op == Wait(BUF_A) else None)
    e = refused(p, RingOwnershipError, "site 0 compute: Reserve A_ring", "produced by reader (stage read_A)")
    assert (e.site, e.engine, e.buffer) == (0, "compute", "A_ring")
    write = next(op for op in walk(p.schedule.programs[2].ops) if isinstance(op, WriteTiles))
    p = replace(small(), C, lambda op: (op, Wait(BUF_C), write, Pop(BUF_C)) if op == Push(BUF_C) else None, sites=(5,))
    refused(p, RingOwnershipError, "site 5 compute: Wait C_ring", "consumed by writer (stage write_C)")


def test_two_producer_engines_without_stages():
    p = replace(small(), R, lambda op: () if op == Push(BUF_B) else None)
    p = replace(p, C, lambda op: (op, Push(BUF_B)) if op == Wait(BUF_A) else None)
    refused(p.evolve(stages=()), RingOwnershipError, "site 0 compute: Push B_ring", "already produced by reader")


def test_accumulator_only_through_its_ops():
    p = replace(small(), C, lambda op: (op, Wait(BUF_ACC)) if op == Wait(BUF_A) else None)
    refused(p, RingOwnershipError, "site 0 compute: Wait acc", "acc is an accumulator")


# ---- rule 3: balance ---------------------------------------------------------------------------------------------


def test_loop_body_pushes_twice_pops_once():
    twice = (Reserve(BUF_A), Push(BUF_A))
    p = replace(small(), R, lambda op: (op, *twice) if op == Push(BUF_A) else None)
    e = refused(p, UnbalancedError, "site 0 reader: Loop k < 4", "pushes 2 page(s) of A_ring", "compute", "pops 1")
    assert e.buffer == "A_ring"


def test_push_of_unreserved_and_pop_of_unwaited_pages():
    p = replace(small(), R, lambda op: () if op == Reserve(BUF_B) else None)
    refused(p, UnbalancedError, "site 0 reader: ReadTiles B", "fills a page of B_ring it has not reserved")
    p = replace(small(), C, lambda op: () if op == Wait(BUF_B) else None)
    refused(p, UnbalancedError, "site 0 compute: Compute", "reads a page of B_ring it has not waited for")
    p = replace(small(), C, lambda op: (op, Pop(BUF_A)) if op == Pop(BUF_A) else None)
    refused(p, UnbalancedError, "site 0 compute: Pop A_ring", "pops 1 page(s) of A_ring with 0 waited for")


def test_loop_that_keeps_a_reservation():
    p = replace(small(), R, lambda op: (op, Reserve(BUF_A)) if op == Reserve(BUF_A) else None)
    refused(p, UnbalancedError, "site 0 reader: Loop k", "+1 reserved page(s) of A_ring unpushed")


def test_ring_left_full_at_the_end():
    p = replace(small(), C, lambda op: (op, Reserve(BUF_C), Push(BUF_C)) if op == Push(BUF_C) else None)
    e = refused(p, UnbalancedError, "site 0: C_ring has 2 page(s) pushed (by compute) but 1 popped (by writer)")
    assert e.buffer == "C_ring"


# ---- rule 4: no op moves more pages than its ring holds --------------------------------------------------------


def test_wait_deeper_than_the_ring():
    p = small()
    assert p.buffer(BUF_A).kind.depth_pages == 3
    p = replace(p, C, lambda op: (Wait(BUF_A, 4),) if op == Wait(BUF_A) else None)
    e = refused(p, RingDepthError, "site 0 compute: Wait A_ring x4", "moves 4 pages of A_ring, a ring of 3")
    assert e.buffer == "A_ring"


# ---- rule 5: tile addresses -----------------------------------------------------------------------------------------


def _shift(op: ChoreoOp, by: int, kind: type) -> tuple[ChoreoOp, ...] | None:
    if isinstance(op, kind):
        return (dataclasses.replace(op, at=dataclasses.replace(op.at, base=op.at.base + by)),)
    return None


def test_write_off_the_grid_for_the_last_item_only():
    p = replace(small(), W, lambda op: _shift(op, 1, WriteTiles))  # C is 7x5 tiles; item 34 is (6, 4)
    e = refused(
        p,
        TileBoundsError,
        "site 34 writer: WriteTiles C_ring -> C[1 + 5*item_y + 1*item_x]",
        "item 34 (y 6, x 4)",
        "tile 35 of C, outside its 7x5 tile grid",
    )
    assert (e.site, e.engine) == (34, "writer")


def test_read_stride_off_the_tensor_for_the_last_row_of_items():
    p = spatialc.build(
        spatialc.gemm(1024, 1024, 1024, "fp16"), "sm_90", block=(2, 4, 1), sub_blocks=(2, 2)
    )  # A: 64x64 tiles, 4x1 blocks
    p = replace(
        p,
        R,
        lambda op: (dataclasses.replace(op, stride_h=65),) if isinstance(op, ReadTiles) and op.tensor == T_A else None,
    )
    # Only the last row of items (y 15: items 120..127, one per site) reaches past the end; the first is named.
    e = refused(
        p,
        TileBoundsError,
        "site 120 reader: ReadTiles A",
        "at item 120 (y 15, x 0), k 63, block row 3 it reads tile 4098 of A, outside its 64x64 tile grid",
    )
    assert (e.site, e.buffer) == (120, "A_ring")


def test_block_row_wrapping_into_the_next_row():
    p = spatialc.build(spatialc.gemm(1024, 1024, 1024, "fp16"), "sm_90")  # B read: 1x8 blocks at 8*item_x
    b = p.tensor_named("B")
    taller = dataclasses.replace(b, tiles=(b.tiles[0] + 1, b.tiles[1]))  # room below, so only the wrap is wrong
    p = p.evolve(tensors=tuple(taller if t.id == b.id else t for t in p.tensors))
    p = replace(p, R, lambda op: _shift(op, 4, ReadTiles) if isinstance(op, ReadTiles) and op.tensor == b.id else None)
    e = refused(
        p,
        TileBoundsError,
        "site 7 reader: ReadTiles B",
        "item 7 (y 0, x 7)",
        "column 60 of B's 64",
        "wrap into the next row",
    )
    assert e.buffer == "B_ring"


def test_block_bigger_than_its_page():
    p = replace(
        small(),
        R,
        lambda op: (
            (dataclasses.replace(op, block_h=2, stride_h=4),)
            if isinstance(op, ReadTiles) and op.tensor == T_A
            else None
        ),
    )
    refused(p, TileBoundsError, "site 0 reader: ReadTiles A", "2x1 block (2 tiles) does not fit a page of A_ring")


# ---- rule 6: placement ---------------------------------------------------------------------------------------


def _placed(p: SpatialProgram, items_of_site) -> SpatialProgram:
    assert p.placement is not None
    return p.evolve(
        placement=Placement(
            tuple((Site(s), tuple(ItemId(i) for i in items)) for s, items in items_of_site),
            p.placement.groups,
            p.placement.kind,
        )
    )


def test_placement_missing_or_repeating_an_item():
    p = small(sites=5)  # 35 items, 7 per site
    assert p.placement is not None
    items = [(int(s), [int(i) for i in its]) for s, its in p.placement.items_of_site]
    missing = [(s, [i for i in its if i != 9]) for s, its in items]
    refused(_placed(p, missing), CoverageError, "item 9 (y 1, x 4)", "on no site")
    twice = [(s, its + [9] if s == 4 else its) for s, its in items]
    e = refused(_placed(p, twice), CoverageError, "item 9", "on sites 1, 4")
    assert e.site == 4
    outside = [(s, its + [35] if s == 3 else its) for s, its in items]
    refused(_placed(p, outside), CoverageError, "site 3 holds item 35, outside the 7x5 grid")


def test_item_loop_disagrees_with_the_placement():
    p = small(sites=5)
    assert p.placement is not None
    items = [(int(s), [int(i) for i in its]) for s, its in p.placement.items_of_site]
    moved = [(s, its[:-1] if s == 0 else its + [items[0][1][-1]] if s == 1 else its) for s, its in items]
    refused(_placed(p, moved), CoverageError, "site 0 reader: Loop item < 7", "holds 6 item(s)")


def test_item_coordinates_without_an_item_loop_and_sites_with_nothing_to_run():
    p = small(sites=5)  # 7 items per site, so every program has an ITEM loop
    flat = replace(p, W, lambda op: op.body if isinstance(op, Loop) and op.var == LV_ITEM else None)
    refused(flat, CoverageError, "site 0 writer: WriteTiles C_ring", "name the site's only item, but the site holds 7")
    idle = edit(small(), R, lambda ops: (), sites=(2,))
    idle = edit(edit(idle, C, lambda ops: (), sites=(2,)), W, lambda ops: (), sites=(2,))
    refused(idle, CoverageError, "site 2 holds 1 item(s) but the schedule gives it nothing to run")


# ---- rule 7: deadlock ----------------------------------------------------------------------------------------------


def _a_twice(p: SpatialProgram) -> SpatialProgram:
    """The K loop unrolled by two, with the reader fetching both A pages (steps 2k and 2k+1) before either B page: it
    holds two A pages before the compute engine (which wants A then B) frees any."""
    rb, cb = k_body(p, R), k_body(p, C)

    def step(ops: tuple[ChoreoOp, ...], odd: int) -> tuple[ChoreoOp, ...]:
        """`ops` with each read's K address doubled, plus one K step when `odd`."""

        def at_step(at: TileAddr) -> TileAddr:
            k = dict(at.steps).get(LV_K, 0)
            return TileAddr(at.base + odd * k, tuple((v, s * 2 if v == LV_K else s) for v, s in at.steps))

        return tuple(dataclasses.replace(op, at=at_step(op.at)) if isinstance(op, ReadTiles) else op for op in ops)

    a_part, b_part = rb[:3], rb[3:]

    def unroll(loop: ChoreoOp, body: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...] | None:
        if isinstance(loop, Loop) and loop.var == LV_K:
            assert isinstance(loop.count, Const)
            return (Loop(LV_K, Const(loop.count.n // 2), body),)
        return None

    reader = step(a_part, 0) + step(a_part, 1) + step(b_part, 0) + step(b_part, 1)
    p = replace(p, R, lambda op: unroll(op, reader))
    return replace(p, C, lambda op: unroll(op, cb * 2))


def test_a_deadlock_says_the_depth_that_removes_it_and_fills_its_fields():
    shallow = _a_twice(small(block=(1, 1, 1), sub_blocks=(1, 1), depth=1))
    e = refused(
        shallow,
        VerifyDeadlockError,
        "; A_ring needs 2 pages for this order of ops (it has 1): give it 2 (the plan's depth, --depth)",
    )
    assert (e.site, e.engine, e.op, e.buffer) == (0, "reader", "Reserve A_ring", "A_ring")
    # The depth it names is the least that verifies: the ring one page deeper passes.
    deep = shallow.evolve(
        buffers=tuple(
            dataclasses.replace(b, kind=dataclasses.replace(b.kind, depth_pages=2)) if b.name == "A_ring" else b
            for b in shallow.buffers
        )
    )
    assert verify(deep).verified


def test_deadlock_only_because_a_ring_is_one_page_too_shallow():
    fine = _a_twice(small(block=(1, 1, 1), sub_blocks=(1, 1), depth=2))
    assert verify(fine).verified
    shallow = _a_twice(small(block=(1, 1, 1), sub_blocks=(1, 1), depth=1))
    e = refused(
        shallow,
        VerifyDeadlockError,
        "site 0 reader [k 0]: Reserve A_ring — needs 1 free page(s), but 1 of 1",
        "site 0 compute [k 0]: Wait B_ring — 0 of 1 page(s) published",
        "site 0 writer: Wait C_ring — 0 of 1 page(s) published",
        "34 other site(s)",
    )
    assert isinstance(e, DeadlockError) and isinstance(e, VerifyError)
    assert [b[:2] for b in e.blocked] == [(0, "reader"), (0, "compute"), (0, "writer")]


def test_consumer_waiting_before_its_producer_can_push():
    # A token ring from compute back to the reader: the reader waits for it before loading anything, but the
    # compute engine sends it only after its K loop, which needs the reader's loads.
    p = small()
    token = BufferId(4)
    p = p.evolve(buffers=(*p.buffers, Buffer(token, "token", Fifo(1, 1))))
    p = edit(p, R, lambda ops: (Wait(token), Pop(token), *ops))
    p = edit(p, C, lambda ops: (*ops, Reserve(token), Push(token)))
    refused(
        p,
        VerifyDeadlockError,
        "site 0 reader: Wait token — 0 of 1",
        "site 0 compute [k 0]: Wait A_ring — 0 of 1",
        "site 0 writer: Wait C_ring",
    )


def test_semset_refused():
    p = small().evolve(semaphores=(Semaphore(SemId(0), "flag"),))
    p = edit(p, C, lambda ops: (*ops, SemSet(SemId(0), 0)), sites=(3,))
    e = refused(
        p, StrongerCheckNeeded, "site 3 compute: SemSet sem0 = 0", "can lower a semaphore count", "stronger check"
    )
    assert e.site == 3


def _handshake(cycle: bool) -> SpatialProgram:
    """Site 1's reader waits for site 0's compute to finish; with `cycle`, site 0's reader waits for site 1's."""
    s = SemId(0)
    p = small().evolve(semaphores=(Semaphore(s, "done"),))
    p = edit(p, C, lambda ops: (*ops, SemInc(s, Site(1))), sites=(0,))
    p = edit(p, R, lambda ops: (SemWait(s, 1), *ops), sites=(1,))
    if cycle:
        p = edit(p, C, lambda ops: (*ops, SemInc(s, Site(0))), sites=(1,))
        p = edit(p, R, lambda ops: (SemWait(s, 1), *ops), sites=(0,))
    return p


def test_semaphore_handshake_between_sites():
    assert verify(_handshake(False)).verified
    e = refused(
        _handshake(True),
        VerifyDeadlockError,
        "site 0 reader: SemWait sem0 >= 1 — the count is 0, it needs 1",
        "site 1 reader: SemWait sem0 >= 1",
        "site 0 compute [k 0]: Wait A_ring",
        "site 1 compute",
    )
    assert {b[:2] for b in e.blocked} >= {(0, "reader"), (1, "reader")}


def test_barrier_across_sites():
    p = small()
    assert p.placement is not None
    g = Group(GroupId(0), (Site(0), Site(1)))
    p = p.evolve(placement=dataclasses.replace(p.placement, groups=(g,)))
    both = edit(p, W, lambda ops: (*ops, Barrier(g.id)), sites=(0, 1))
    assert verify(both).verified
    one = edit(p, W, lambda ops: (*ops, Barrier(g.id)), sites=(0,))
    refused(one, VerifyDeadlockError, "site 0 writer: Barrier group0 — site(s) 1 have not arrived")


def _with_trips(p: SpatialProgram, engines: tuple[Engine, ...]) -> SpatialProgram:
    trips = Tensor(TensorId(3), "trips", TensorRole.PARAMETER, (1, 1), (1, 1), DType.INT32)
    p = p.evolve(tensors=(*p.tensors, trips))
    for engine in engines:
        p = replace(
            p,
            engine,
            lambda op: (
                (dataclasses.replace(op, count=Trip(trips.id, 0, op.count.n)),)
                if isinstance(op, Loop) and op.var == LV_K
                else None
            ),
        )
    return p


def test_trip_loops():
    # Rule 7 decides this one (the rings balance whatever the trip count), but what it computes depends on the data:
    # rule 8 proves a fixed function of A and B, so it refuses it by name.
    refused(
        _with_trips(small(), (R, C)),
        StrongerCheckNeeded,
        "site 0 reader: Loop k < trip(trips[0]<=4): — its trip count is read from data",
        "semantic rule",
    )
    refused(
        _with_trips(small(), (R,)),
        StrongerCheckNeeded,
        "site 0",
        "not inside the same loops counted at run time (Trip loops)",
        "depends on the data",
    )
    s = SemId(0)
    p = _with_trips(small(), (R, C)).evolve(semaphores=(Semaphore(s, "k_done"),))
    p = replace(p, C, lambda op: (op, SemInc(s, Site(0))) if op == Pop(BUF_B) else None, sites=(0,))
    refused(p, StrongerCheckNeeded, "site 0 compute: SemInc sem0@site0 += 1", "inside a Trip loop")


# ---- the counter run itself -------------------------------------------------------------------------------------


def _net_outcome(p: SpatialProgram, fast: bool):
    assert p.schedule is not None
    net = deadlock.Network(Ctx.of(p), p.schedule.programs, fast_forward=fast)
    blocked = net.run()
    return [(int(e.site), e.name, e.pc, [f[1] for f in e.stack]) for e in blocked], net.steps


def test_fast_forward_skips_and_agrees_with_the_exact_run():
    p = spatialc.build(spatialc.gemm(2048, 2048, 2048, "fp16"), "sm_90", block=(2, 4, 1), sites=4)
    assert p.schedule is not None and p.plan is not None
    p = p.evolve(schedule=Schedule(p.schedule.programs[:3]))  # one site: a quarter of the items, every K step
    (fast, fast_steps), (exact, exact_steps) = _net_outcome(p, True), _net_outcome(p, False)
    assert fast == exact == []
    assert exact_steps > p.plan.items // 4 * p.plan.k_steps * 8 > 50 * fast_steps
    shallow = _a_twice(small(block=(1, 1, 1), sub_blocks=(1, 1), depth=1, sites=2))
    assert _net_outcome(shallow, True)[0] == _net_outcome(shallow, False)[0] != []


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    order=st.lists(st.sampled_from([0, 1]), min_size=1, max_size=5),
    depths=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    counts=st.tuples(st.integers(1, 9), st.integers(1, 9)),
)
def test_fast_forward_matches_exact_on_random_choreographies(data, order, depths, counts):
    """Two rings; each iteration the producer pushes pages in one order and the consumer pops them in another."""
    rings = (BufferId(0), BufferId(1))
    popped = data.draw(st.permutations(order))
    prod = tuple(op for r in order for op in (Reserve(rings[r]), Push(rings[r])))
    cons = tuple(op for r in popped for op in (Wait(rings[r]), Pop(rings[r])))
    outer, inner = counts
    progs = (
        EngineProgram(Site(0), R, (Loop(LV_ITEM, Const(outer), (Loop(LV_K, Const(inner), prod),)),)),
        EngineProgram(Site(0), C, (Loop(LV_ITEM, Const(outer), (Loop(LV_K, Const(inner), cons),)),)),
    )
    p = small()
    p = p.evolve(
        buffers=tuple(Buffer(r, f"r{int(r)}", Fifo(d, 1)) for r, d in zip(rings, depths, strict=True)),
        schedule=Schedule(progs),
    )
    assert _net_outcome(p, True)[0] == _net_outcome(p, False)[0]


def test_big_builds_are_fast():
    for shape in ((8192, 8192, 8192), (1024, 1024, 1024)):
        start = time.perf_counter()
        p = spatialc.build(spatialc.gemm(*shape, "fp16"), "sm_90")
        assert p.verified and time.perf_counter() - start < 1.0, shape


# ---- rule 1 on what memory is sized by and code is picked by: roles, shapes, plan, compute ops, target -----------


def _with_tensor(p: SpatialProgram, name: str, **changes) -> SpatialProgram:
    return p.evolve(tensors=tuple(dataclasses.replace(t, **changes) if t.name == name else t for t in p.tensors))


def _with_plan(p: SpatialProgram, **changes) -> SpatialProgram:
    assert p.plan is not None
    return p.evolve(plans=(dataclasses.replace(p.plan, **changes),))


def test_reads_come_from_inputs_and_writes_go_to_the_output():
    # The review's repro: the reader's B ReadTiles reading C (int64) into the int8 B ring passed verify.
    p = replace(
        small(),
        R,
        lambda op: (dataclasses.replace(op, tensor=T_C),) if isinstance(op, ReadTiles) and op.tensor == T_B else None,
    )
    e = refused(
        p,
        IllFormedError,
        "site 0 reader: ReadTiles C",
        "reads C, the output tensor, into B_ring",
        "an input, a parameter or a workspace tensor",
    )
    assert (e.site, e.engine, e.buffer) == (0, "reader", "B_ring")
    p = replace(small(), W, lambda op: (dataclasses.replace(op, tensor=T_A),) if isinstance(op, WriteTiles) else None)
    e = refused(
        p,
        IllFormedError,
        "site 0 writer: WriteTiles C_ring -> A",
        "writes C_ring to A, an input tensor",
        "only the output tensor and workspace tensors are written",
    )
    assert (e.engine, e.buffer) == ("writer", "C_ring")
    # Right roles, wrong tensor for the ring: the stages say read_B fills B_ring from B.
    p = replace(
        small(),
        R,
        lambda op: (dataclasses.replace(op, tensor=T_A),) if isinstance(op, ReadTiles) and op.tensor == T_B else None,
    )
    e = refused(p, RingOwnershipError, "site 0 reader: ReadTiles A", "B_ring is filled from B (stage read_B), not A")
    assert e.buffer == "B_ring"


def test_stages_read_inputs_and_write_the_output():
    p = small()
    read_c = tuple(dataclasses.replace(s, kind=ReadStage(T_C)) if s.name == "read_B" else s for s in p.stages)
    refused(p.evolve(stages=read_c), IllFormedError, "stage read_B reads C, the output tensor")
    write_a = tuple(dataclasses.replace(s, kind=WriteStage(T_A)) if s.name == "write_C" else s for s in p.stages)
    refused(p.evolve(stages=write_a), IllFormedError, "stage write_C writes A, an input tensor")


def test_tile_and_tensor_shapes():
    p = small()  # A: 100x50 elements in 7x4 tiles of 16x16; the 1x1x1 block pads nothing
    refused(p.evolve(tile=Tile(0, 16)), IllFormedError, "the tile must be at least 1x1 elements, not 0x16")
    refused(_with_tensor(p, "A", elems=(0, 50)), IllFormedError, "tensor A's elements must be ≥ 1, not 0x50")
    refused(_with_tensor(p, "B", tiles=(4, 0)), IllFormedError, "tensor B's tile grid must be ≥ 1, not 4x0")
    refused(
        _with_tensor(p, "A", tiles=(6, 4)),
        IllFormedError,
        "tensor A: 100x50 elements in 16x16 tiles take 7x4 tiles, but its tile grid is 6x4, too few rows of tiles",
    )
    # The review's repro: a 2**40 x 4 tile grid made the interpreter allocate petabytes.
    refused(
        _with_tensor(p, "A", tiles=(2**40, 4)), IllFormedError, "tile grid is 1099511627776x4", "the plan pads no rows"
    )
    unplanned = spatialc.gemm(100, 70, 50, "int8")
    refused(
        _with_tensor(unplanned, "B", tiles=(4, 6)),
        IllFormedError,
        "tensor B:",
        "a program without a plan pads no columns",
    )


def test_padding_is_less_than_one_item_or_k_step():
    p = small(block=(2, 4, 2))  # items of 2x4 tiles, K steps of 2: A 8x4 tiles, B 4x8, C 8x8 for 7x4, 4x5, 7x5
    assert verify(p).verified
    assert [t.tiles for t in p.tensors] == [(8, 4), (4, 8), (8, 8)]
    # A's columns are K: a K step of 2 pads at most 1; an item of 2 rows at most 1 row, 4 columns at most 3.
    refused(
        _with_tensor(p, "A", tiles=(8, 8)),
        IllFormedError,
        "tensor A:",
        "its tile grid is 8x8",
        "whole blocks pad at most 3 more columns of tiles",
    )
    refused(_with_tensor(p, "A", tiles=(9, 4)), IllFormedError, "whole blocks pad at most 1 more rows of tiles")


def test_scalar_requant_and_matmul_fields():
    epi = [spatialc.bias(), spatialc.scalar("add", 3), spatialc.requant(0.01)]
    p = spatialc.build(spatialc.gemm(32, 64, 32, "int8", epilogue=epi), "sm_86", block=(2, 2, 1))
    assert p.verified

    def swap(kind: type, new) -> SpatialProgram:
        """`p` with its `kind` compute op replaced in the schedule (the stages keep the good one)."""
        return replace(
            p,
            C,
            lambda op: (
                (dataclasses.replace(op, op=new),) if isinstance(op, Compute) and isinstance(op.op, kind) else None
            ),
        )

    # The review's repro: an op the interpreter does not know passed verify and made it raise KeyError.
    e = refused(
        swap(Map, Map(Apply("swish", (Arg(0),)))),
        IllFormedError,
        "site 0 compute: Compute",
        "elementwise op 'swish' is none of the table's",
    )
    assert (e.site, e.engine) == (0, "compute")
    refused(swap(Map, Scalar("add", float("inf"))), IllFormedError, "an elementwise constant must be a finite number")
    refused(swap(Map, Scalar("mul", 0.5)), IllFormedError, "int8 program's epilogue is integer arithmetic")
    refused(swap(Map, Map(Apply("pow", (Arg(0), Lit(2.0))))), IllFormedError, "pow is float arithmetic")
    refused(
        swap(Map, Map(Apply("clamp", (Arg(0),), (1.0,)))), IllFormedError, "clamp takes 1 operand(s) and parameters"
    )
    refused(swap(Map, Map(Apply("add", (Arg(0), Arg(1))))), IllFormedError, "reads the 2 rings its expression names")
    refused(swap(Requant, Requant(2**31, -6, 0)), IllFormedError, "requant multiplier lies in [0, 2147483647]")
    refused(swap(Requant, Requant(1 << 30, 31, 0)), IllFormedError, "requant shift lies in [-31, 30], not 31")
    refused(swap(Requant, Requant(1 << 30, -32, 0)), IllFormedError, "requant shift lies in [-31, 30], not -32")
    refused(swap(Requant, Requant(1 << 30, 0, 128)), IllFormedError, "requant zero point lies in [-128, 127]")
    mm = next(op.op for op in walk(k_body(p, C)) if isinstance(op, Compute))
    assert isinstance(mm, MatmulTiles)
    refused(
        swap(MatmulTiles, dataclasses.replace(mm, sub_blocks=(0, 1))),
        IllFormedError,
        "site 0 compute",
        "tile matmul's block (2x2x1) and sub-blocks (0x1) must be ≥ 1",
    )
    # The same fields on a stage: refused before any op is walked.
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(Map(Apply("swish", (Arg(0),))))) if s.name == "scalar1" else s
        for s in p.stages
    )
    e = refused(p.evolve(stages=stages), IllFormedError, "stage scalar1: elementwise op 'swish'")
    assert e.site is None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"block": BlockShape(0, 1, 1)}, "plan 0's block (osh x osw x ibw) must be ≥ 1, not 0x1x1"),
        ({"sub_blocks": (1, 0)}, "plan 0's sub_blocks must be ≥ 1, not 1x0"),
        ({"grid": (0, 5)}, "plan 0's grid must be ≥ 1, not 0x5"),
        ({"k_tiles": 0}, "plan 0's k_tiles must be ≥ 1, not 0"),
        ({"depth": 0}, "plan 0's depth must be ≥ 1, not 0"),
        ({"grid": (7, 4)}, "plan 0's 7x4 items of 1x1 tiles cover 7x4 tiles, but the output tensor C has 7x5"),
        ({"sub_blocks": (2, 1)}, "plan 0's 7x5 items of 2x1 tiles cover 14x5 tiles, but the output tensor C has 7x5"),
        ({"block": BlockShape(1, 1, 3)}, "plan 0 has 4 K tiles, not a whole number of K steps of 3"),
        ({"block": BlockShape(1, 1, 2048), "k_tiles": 2048}, "no side may exceed 1024 tiles"),
    ],
)
def test_plan_fields(changes, words):
    refused(_with_plan(small(), **changes), IllFormedError, words)


def test_an_enormous_item_grid_is_refused_at_once():
    # The review's repro: a 2**20 x 2**20 grid made the coverage rule build a list of 2**40 items (MemoryError).
    p = small()
    p = _with_tensor(_with_plan(p, grid=(2**20, 2**20)), "C", tiles=(2**20, 2**20))
    start = time.perf_counter()
    refused(p, IllFormedError, "plan 0's grid of 1048576x1048576 items has 1099511627776; at most 16777216")
    assert time.perf_counter() - start < 0.5


def test_unknown_target():
    p = small()
    refused(p.evolve(target="sm_70"), IllFormedError, "the program's target is 'sm_70'; spatialc knows sm_80")
    # As the review found it: a program file naming sm_70.
    text = spatialc.to_json(p).replace('"target": "sm_86"', '"target": "sm_70"')
    assert '"sm_70"' in text
    refused(spatialc.from_json(text), IllFormedError, "'sm_70'")
    # A target spatialc does not list is accepted when the program is verified for it.
    mine = dataclasses.replace(target("sm_86"), name="my_gpu")
    assert verify(p.evolve(target="my_gpu"), mine).verified


def test_every_build_of_a_small_matrix_verifies():
    epilogues: list[list] = [[], [spatialc.bias(), spatialc.relu()], [spatialc.scalar("max", 1)]]
    built = 0
    for tgt, prec, shape, epi in itertools.product(
        ("sm_80", "sm_86", "sm_89", "sm_90"),
        ("int8", "fp16", "bf16"),
        ((1, 1, 1), (17, 33, 40), (100, 70, 50)),
        epilogues,
    ):
        if prec == "int8" and epi:
            epi = [*epi, spatialc.requant(0.01)]
        p = spatialc.build(spatialc.gemm(*shape, prec, epilogue=epi), tgt)
        assert p.verified and verify(p.evolve()).verified, (tgt, prec, shape, epi)
        built += 1
    for kw in (
        {"block": (2, 4, 2), "sub_blocks": (2, 1)},
        {"block": (1, 1, 4), "depth": 1},
        {"block": (8, 1, 1), "placement": "round_robin", "sites": 3},
    ):
        p = spatialc.build(spatialc.gemm(100, 70, 50, "fp16"), "sm_86", **kw)
        assert verify(p.evolve()).verified, kw
        built += 1
    assert built == 4 * 3 * 3 * 3 + 3


def test_a_bias_address_over_an_unbound_variable_is_ill_formed():
    # The message names the Compute itself: formatting it once raised a TypeError of its own.
    p = spatialc.build(spatialc.gemm(64, 48, 32, "int8", epilogue=[spatialc.bias()]), "sm_86")
    unbound = TileAddr(0, ((LoopVar(9), 1),))
    p = replace(
        p,
        C,
        lambda op: (
            (dataclasses.replace(op, op=Map(with_cols(op.op.expr, lambda c: dataclasses.replace(c, at=unbound)))),)
            if isinstance(op, Compute) and not isinstance(op.op, MatmulTiles)
            else None
        ),
    )
    refused(p, IllFormedError, "site 0 compute: Compute bias bias[1*lv9 +", "uses lv9, which no enclosing loop binds")


def test_a_plan_that_disagrees_with_the_operands_k_tiles_is_refused():
    refused(_with_plan(small(), k_tiles=8), SemanticError, "the plan reduces 8 k-tiles, but A's tile grid has 4")


def test_a_pipeline_without_a_matmul_is_refused_by_name():
    # Rule 8 proves GEMM pipelines and maps of reads; a read written straight out (no stage between) is refused
    # rather than half-checked (its types and bounds would be nobody's).
    p = small()
    a, c = p.tensor(T_A), p.tensor(T_C)
    t = dataclasses.replace(a, elems=c.elems, tiles=c.tiles)
    copy = p.evolve(
        tensors=(t, p.tensor(T_B), c),
        stages=(p.stages[0], dataclasses.replace(p.stages[-1], ins=(BUF_A,))),
        buffers=(p.buffers[0],),
    )
    assert copy.plan is not None
    h, w = copy.plan.item_tiles
    read = ReadTiles(T_A, TileAddr(0, ((LV_ITEM_Y, h * c.tiles[1]), (LV_ITEM_X, w))), h, w, c.tiles[1], 1, BUF_A)
    write = WriteTiles(BUF_A, T_C, read.at, h, w, c.tiles[1], 1)
    progs = []
    for site, items in copy.placement.items_of_site:  # type: ignore[union-attr]
        reader = (Reserve(BUF_A), read, Push(BUF_A)) if items else ()
        writer = (Wait(BUF_A), write, Pop(BUF_A)) if items else ()
        progs += [EngineProgram(site, R, reader), EngineProgram(site, C, ()), EngineProgram(site, W, writer)]
    no_stage = "writes a ring no elementwise stage fills"
    refused(copy.evolve(schedule=Schedule(tuple(progs))), StrongerCheckNeeded, no_stage)


def test_the_output_type_holds_what_the_stages_compute():
    # The declared values of a K=50 int8 GEMM lie in -50·128·127..50·128·128: an int8 C cannot hold them, an int32
    # one can; a float program's output is float32.
    refused(_with_tensor(small(), "C", dtype=DType.INT8), SemanticError, "the output C holds int8", "-812800..819200")
    assert verify(_with_tensor(small(), "C", dtype=DType.INT32)).verified
    fp = spatialc.build(spatialc.gemm(40, 40, 40, "fp16"), "sm_86")
    refused(_with_tensor(fp, "C", dtype=DType.INT64), SemanticError, "fp16 program computes float32 values")
    refused(
        _with_tensor(small(), "A", dtype=DType.INT32), SemanticError, "tensor A holds int32 values, but the int8 matmul"
    )


def _counted(n: int, by: int, waits: tuple[int, ...]) -> SpatialProgram:
    """Site 0's reader adds `by` to a semaphore n times before its work; its writer waits for each of `waits` first."""
    s = SemId(0)
    p = small().evolve(semaphores=(Semaphore(s, "count"),))
    p = edit(p, R, lambda ops: (Loop(LoopVar(9), Const(n), (SemInc(s, Site(0), by),)), *ops), sites=(0,))
    return edit(p, W, lambda ops: (*(SemWait(s, v) for v in waits), *ops), sites=(0,))


def test_a_semaphore_counted_up_in_a_long_loop_is_fast_forwarded():
    p = _counted(10**6, 1, (10**6,))
    assert p.schedule is not None
    net = deadlock.Network(Ctx.of(p), p.schedule.programs)
    assert net.run() == [] and net.skipped > 10**6 - 1000 and net.recorded < 1000
    refused(_counted(10**6, 1, (10**6 + 1,)), VerifyDeadlockError, "SemWait sem0 >= 1000001 — the count is 1000000")


@pytest.mark.long
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), by=st.integers(0, 3), waits=st.lists(st.integers(0, 130), max_size=3))
def test_fast_forward_over_a_growing_count_matches_the_exact_run(n, by, waits):
    p = _counted(n, by, tuple(waits))
    assert _net_outcome(p, True)[0] == _net_outcome(p, False)[0]


def test_a_run_that_never_repeats_is_refused_by_name(monkeypatch):
    # Barriers in a long loop: the arrival counts grow past anything recorded, so no period ever repeats.
    monkeypatch.setattr(deadlock_run, "MAX_RECORDED", 500)  # read by the run (Network), where it lives
    p = small()
    assert p.placement is not None
    g = Group(GroupId(0), (Site(0), Site(1)))
    p = p.evolve(placement=dataclasses.replace(p.placement, groups=(g,)))
    p = edit(p, W, lambda ops: (Loop(LoopVar(9), Const(10**6), (Barrier(g.id),)), *ops), sites=(0, 1))
    refused(p, StrongerCheckNeeded, "no period that repeats", "cannot decide deadlock-freedom in reasonable time")


def test_a_fault_in_another_sites_item_names_that_site():
    # Sites 0 and 1 run the same programs, followed once as site 0's; the wrong row step shows only on site 1's
    # items (item_y = 1), and the message says whose item it is.
    p = spatialc.build(spatialc.gemm(64, 128, 64, "bf16"), "sm_90", sites=2, block=(2, 4, 4), placement="contiguous")
    assert [len(items) for _, items in p.placement.items_of_site] == [2, 2]  # type: ignore[union-attr]

    def halve_row_step(op):
        if not isinstance(op, WriteTiles):
            return None
        steps = tuple((v, s // 2 if v == LV_ITEM_Y else s) for v, s in op.at.steps)
        return (dataclasses.replace(op, at=TileAddr(op.at.base, steps)),)

    with pytest.raises(SemanticError, match=r"item 2 \(y 1, x 0\) of site 1 \(whose programs are site 0's\) writes"):
        verify(replace(p, Engine.WRITER, halve_row_step))

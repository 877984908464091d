"""Before/after tests of tile, place and schedule, with the verifier run after every pass that can be verified."""

import math

import pytest

import spatialc
from spatialc.errors import PlanError, ProgramError
from spatialc.ir import ops
from spatialc.ir.ids import LV_ITEM, LV_K
from spatialc.ir.nodes import Accumulator, Engine, Fifo, PageLayout, TileOrder
from spatialc.passes.footprint import smem_bytes
from spatialc.passes.place import place, split
from spatialc.passes.schedule import schedule
from spatialc.passes.tile import candidates, tile

T90 = spatialc.target("sm_90")


def test_tile_pads_tensors_to_whole_blocks_and_sizes_the_rings():
    p = tile(spatialc.gemm(100, 70, 50, "fp16"), T90, block=(2, 1, 2), sub_blocks=(1, 2), depth=3)
    plan = p.plan
    assert plan.grid == (math.ceil(7 / 2), math.ceil(5 / 2)) and plan.k_tiles == 4
    a, b, c = p.tensors
    assert a.tiles == (8, 4) and b.tiles == (4, 6) and c.tiles == (8, 6)
    assert a.elems == (100, 50)  # the logical shape is kept
    rings = {buf.name: buf.kind for buf in p.buffers}
    # 16-bit operand pages are swizzled for the fragment loads; every tensor stays row-major.
    assert rings["A_ring"] == Fifo(3, 2 * 2, PageLayout.SWIZZLED) and rings["B_ring"] == Fifo(3, 2 * 2, "swizzled")
    assert rings["acc"] == Accumulator(2 * 2) and rings["C_ring"] == Fifo(2, 4)
    assert {t.order for t in p.tensors} == {TileOrder.ROW}
    assert not p.verified


def test_int8_b_is_k_major_in_its_tensor_and_its_pages():
    p = tile(spatialc.gemm(100, 70, 50, "int8"), T90)
    a, b, c = p.tensors
    assert (a.order, b.order, c.order) == (TileOrder.ROW, TileOrder.COL, TileOrder.ROW)
    rings = {buf.name: buf.kind.layout for buf in p.buffers if not isinstance(buf.kind, Accumulator)}
    assert rings == {"A_ring": PageLayout.ROW, "B_ring": PageLayout.COL, "C_ring": PageLayout.ROW}


def test_every_candidate_fits_and_they_come_best_first():
    p = spatialc.gemm(4096, 4096, 4096, "bf16")
    found = candidates(p, T90)
    assert found and [c.cost for c in found] == sorted(c.cost for c in found)
    assert all(0 < c.smem <= T90.smem_per_site_max and c.sites_per_unit >= 1 for c in found)
    best = found[0].plan
    # A large problem wants a large square-ish item: bytes per MAC and padding both favour it.
    assert best.item_tiles[0] * best.item_tiles[1] >= 16


def test_forced_fields_are_kept_and_an_impossible_one_says_why():
    p = tile(spatialc.gemm(64, 64, 64), T90, block=(1, 2, 4), sub_blocks=(2, 1), depth=1)
    assert (p.plan.block, p.plan.sub_blocks, p.plan.depth) == (ops.BlockShape(1, 2, 4), (2, 1), 1)
    with pytest.raises(PlanError, match=r"needs \d+ bytes of shared memory per block.*has 232448"):
        tile(spatialc.gemm(64, 64, 64, "fp16"), T90, block=(4, 8, 8), sub_blocks=(2, 2), depth=4)
    with pytest.raises(ProgramError, match="block must be 3 whole numbers"):
        tile(spatialc.gemm(64, 64, 64), T90, block=(0, 1, 1))


def test_smem_counts_the_output_ring_only_when_the_epilogue_cannot_fuse():
    p = tile(spatialc.gemm(64, 64, 64), spatialc.target("sm_86"), block=(2, 2, 1), depth=2)
    fused = smem_bytes(spatialc.target("sm_86"), p.plan, p.precision)
    assert fused == 2 * (2 + 2) * 256  # the operand rings alone: the fused store reads the accumulators
    q = tile(spatialc.gemm(64, 64, 64), spatialc.target("sm_86"), block=(3, 3, 1), depth=2)
    assert smem_bytes(spatialc.target("sm_86"), q.plan, q.precision) == 2 * 6 * 256 + 2 * 9 * 256 * 4


@pytest.mark.parametrize("kind", ["contiguous", "round_robin"])
@pytest.mark.parametrize(("items", "sites"), [(10, 3), (3, 10), (7, 7), (1, 1)])
def test_placement_covers_every_item_once(kind, items, sites):
    placed = split(items, sites, kind)
    flat = sorted(int(i) for _, its in placed for i in its)
    assert flat == list(range(items)) and len(placed) == sites
    counts = [len(its) for _, its in placed]
    assert max(counts) - min(counts) <= 1
    if kind == "round_robin":
        assert all(int(i) % sites == s for s, its in placed for i in its)
    else:
        assert all(list(map(int, its)) == list(range(int(its[0]), int(its[0]) + len(its))) for _, its in placed if its)


def test_default_sites_are_what_the_target_keeps_resident_capped_at_items():
    p = place(tile(spatialc.gemm(8192, 8192, 8192, "fp16"), T90), T90)
    per_sm = T90.resident_sites_per_unit(
        smem_bytes(T90, p.plan, p.precision), p.plan.block.osh, p.plan.block.osw, p.plan.sub_blocks
    )
    assert len(p.placement.items_of_site) == min(p.plan.items, T90.units * per_sm)
    small = place(tile(spatialc.gemm(16, 16, 16), T90), T90)
    assert len(small.placement.items_of_site) == 1
    with pytest.raises(ProgramError, match="unknown placement 'diagonal'"):
        place(tile(spatialc.gemm(16, 16, 16), T90), T90, placement="diagonal")


def test_schedule_is_the_standard_gemm_choreography():
    p = schedule(place(tile(spatialc.gemm(64, 64, 64), T90, block=(1, 1, 1)), T90, sites=3))
    reader, compute, writer = p.schedule.programs_of(spatialc.ir.Site(0))
    assert (reader.engine, compute.engine, writer.engine) == (Engine.READER, Engine.COMPUTE, Engine.WRITER)
    (item_loop,) = compute.ops
    assert item_loop.var == LV_ITEM and item_loop.count == ops.Const(6)  # 16 items over 3 sites: 6, 5, 5
    kinds = [type(op).__name__ for op in item_loop.body]
    assert kinds == ["AcquireAcc", "Loop", "Reserve", "PackAcc", "Push", "ReleaseAcc"]
    k_loop = item_loop.body[1]
    assert k_loop.var == LV_K and [type(op).__name__ for op in k_loop.body] == ["Wait", "Wait", "Compute", "Pop", "Pop"]
    assert [type(op).__name__ for op in writer.ops[0].body] == ["Wait", "WriteTiles", "Pop"]
    assert p.schedule.programs_of(spatialc.ir.Site(2))[1].ops[0].count == ops.Const(5)


def test_one_item_per_site_drops_the_item_loop_and_empty_sites_get_empty_programs():
    p = schedule(place(tile(spatialc.gemm(32, 32, 32), T90, block=(1, 1, 1)), T90, sites=6))
    busy = p.schedule.programs_of(spatialc.ir.Site(0))
    assert not any(isinstance(op, ops.Loop) and op.var == LV_ITEM for prog in busy for op in prog.ops)
    idle = p.schedule.programs_of(spatialc.ir.Site(5))
    assert all(prog.ops == () for prog in idle)


def test_schedule_size_does_not_grow_with_the_matrix():
    def ops_per_site(n):
        p = spatialc.build(
            spatialc.gemm(n, n, n, "fp16"), "sm_90", block=(4, 8, 1), sub_blocks=(2, 2), depth=3, sites=4
        )
        return [sum(1 for _ in ops.walk(prog.ops)) for prog in p.schedule.programs_of(spatialc.ir.Site(0))]

    assert ops_per_site(1024) == ops_per_site(8192)


def test_a_plan_whose_accumulators_cannot_stay_in_registers_is_refused_with_that_reason():
    # 8x8 tiles in 2x2 sub-blocks over 8 warps: 32 fragments a warp, about 436 registers a thread against 255.
    assert T90.resident_sites_per_unit(1024, 8, 8, (2, 2)) == 0
    with pytest.raises(PlanError, match=r"accumulator of 256 tiles needs about \d+ registers a thread and sm_90 has"):
        tile(spatialc.gemm(512, 512, 512, "fp16"), T90, block=(8, 8, 1), sub_blocks=(2, 2))
    best = candidates(spatialc.gemm(8192, 8192, 8192, "fp16"), T90)[0].plan
    tiles = best.item_tiles[0] * best.item_tiles[1]
    assert T90.registers_needed(tiles) <= T90.regs_per_thread_max


def test_every_default_plan_keeps_its_warps_multiplying():
    # A block smaller than the warp count leaves warps idle; the cost model steers away from it.
    for name in ("sm_86", "sm_90"):
        t = spatialc.target(name)
        for n in (16, 64, 256, 1024):
            plan = candidates(spatialc.gemm(n, n, n, "bf16"), t)[0].plan
            assert plan.block.osh * plan.block.osw >= t.accumulator_lanes
            assert t.accumulator_lane_grid(plan.block.osh, plan.block.osw) is not None


def test_epilogue_programs_get_plans_the_fused_store_can_take():
    from spatialc.frontend import bias, relu

    p = tile(spatialc.gemm(48, 40, 32, "int8", epilogue=[bias(), relu()]), spatialc.target("sm_86"))
    assert spatialc.target("sm_86").accumulator_lane_grid(p.plan.block.osh, p.plan.block.osw) is not None

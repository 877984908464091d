"""The persistent CUDA lowering: what it refuses and why, and the structure of what it prints (no compiler needed)."""

import dataclasses
import json
import re
from functools import cache

import pytest

import spatialc
from spatialc.frontend import relu
from spatialc.ir.ids import LV_K, GroupId, ItemId, SemId, Site
from spatialc.ir.nodes import ComputeStage, DType, Group, Placement, Semaphore, Tile
from spatialc.ir.ops import Compute, Const, Generic, Loop, MatmulTiles, McastSend, PackAcc, Precision, Reserve, Trip
from spatialc.lower.census import count_printed
from spatialc.lower.cuda.common.host import write_artifact
from spatialc.lower.cuda.common.rings import MMA_TYPES, ring_table
from spatialc.lower.cuda.persistent.kernel import lower, printed_site_programs
from spatialc.lower.cuda.persistent.merge import serialise
from spatialc.lower.cuda.persistent.order import barrier_free_pops
from spatialc.lower.errors import (
    GroupSpansSites,
    NeedsGeneral,
    TooBig,
    Unsupported,
    UnsupportedPrecision,
    Unverified,
)
from spatialc.passes.footprint import smem_bytes
from spatialc.passes.place import place
from spatialc.passes.schedule import schedule
from spatialc.passes.tile import tile
from spatialc.passes.verify import verify


@cache
def built(m=64, n=64, k=64, prec="int8", tgt="sm_86", **kw):
    """A small program; one-tile blocks unless the test forces another (the printer paths these tests expect)."""
    kw.setdefault("block", (1, 1, 1))
    return spatialc.build(spatialc.gemm(m, n, k, prec), tgt, **kw)


def lowered(*args, **kw):
    p = built(*args, **kw)
    return lower(p, spatialc.target(p.target))


def with_ops(p, engine, edit):
    """`p` with `edit` applied to every op list of `engine`'s programs (recursively into loops), still verified."""

    def walk(ops):
        return tuple(edit(Loop(o.var, o.count, walk(o.body)) if isinstance(o, Loop) else o) for o in ops)

    progs = tuple(
        dataclasses.replace(pr, ops=walk(pr.ops)) if pr.engine.value == engine else pr for pr in p.schedule.programs
    )
    return p.evolve(schedule=dataclasses.replace(p.schedule, programs=progs), verified=True)


def matmul_replaced(p, op):
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(op)) if isinstance(s.kind, ComputeStage) else s for s in p.stages
    )
    return p.evolve(stages=stages, verified=True)


def generic_stage():
    """An epilogue program whose relu stage became a compute only the general lowering could print."""
    p = spatialc.build(spatialc.gemm(64, 64, 32, "int8", epilogue=[relu()]), "sm_86", block=(2, 4, 1))
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(Generic("gelu"))) if s.name == "relu0" else s for s in p.stages
    )
    return p.evolve(stages=stages, verified=True)


def refusal(p, tgt="sm_86"):
    with pytest.raises(spatialc.SpatialError) as err:
        lower(p, spatialc.target(tgt))
    return err.value


# ---- refusals ----------------------------------------------------------------------------------------------


def test_an_unverified_program_is_refused():
    err = refusal(built().evolve(verified=False))
    assert isinstance(err, Unverified) and "not verified" in str(err)


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda: generic_stage(), "generic gelu stage"),
        (
            lambda: spatialc.build(spatialc.gemm(32, 32, 32, "int8", epilogue=[relu()]), "sm_86", block=(1, 1, 1)),
            "epilogue relu: the fused epilogue applies where each warp reads back its own accumulators, and no warp"
            " grid",
        ),
        (lambda: built().evolve(plans=built().plans * 2, verified=True), "2 plans"),
        (
            lambda: with_ops(
                built(),
                "reader",
                lambda o: Loop(o.var, Trip(built().tensors[0].id, 0, 4), o.body) if isinstance(o, Loop) else o,
            ),
            "trip count is read from data",
        ),
        (lambda: built().evolve(semaphores=(Semaphore(SemId(0), "s"),), verified=True), "semaphore handshake"),
    ],
)
def test_what_the_persistent_kernel_cannot_hold_names_the_general_form(make, what):
    err = refusal(make())
    assert isinstance(err, NeedsGeneral) and isinstance(err, Unsupported)
    assert what in str(err) and "the general form prints it" in str(err)


def test_a_group_spanning_sites_is_refused():
    p = built(sites=4)
    p = p.evolve(
        placement=dataclasses.replace(p.placement, groups=(Group(GroupId(0), (Site(0), Site(1))),)), verified=True
    )
    err = refusal(p)
    assert isinstance(err, GroupSpansSites) and err.sites == (0, 1)


def test_multicast_ops_and_foreign_tiles_are_refused():
    p = with_ops(built(), "reader", lambda o: McastSend(o.buf, GroupId(0)) if isinstance(o, Reserve) else o)
    assert "multicast" in str(refusal(p))
    assert "tiles of 8x8" in str(refusal(built().evolve(tile=Tile(8, 8), verified=True)))


def test_a_program_without_a_tile_matmul_is_refused():
    p = built()
    p = p.evolve(stages=tuple(s for s in p.stages if not isinstance(s.kind, ComputeStage)), verified=True)
    err = refusal(p)  # a program without a tile matmul is one map of its inputs, in the persistent form as elsewhere
    assert type(err) is Unsupported and "without a tile matmul that is no map program" in str(err)
    assert "stage write_C reads C_ring, which no stage fills" in str(err)


def test_ring_ops_of_several_pages_accumulating_packs_and_spills_are_refused():
    two = with_ops(built(), "reader", lambda o: Reserve(o.buf, 2) if isinstance(o, Reserve) else o)
    assert "Reserve of 2 pages" in str(refusal(two))
    acc = with_ops(
        built(), "compute", lambda o: dataclasses.replace(o, accumulate=True) if isinstance(o, PackAcc) else o
    )
    assert "accumulating PackAcc" in str(refusal(acc))
    spill = with_ops(
        built(), "compute", lambda o: dataclasses.replace(o, acc_reload=o.acc) if isinstance(o, Compute) else o
    )
    assert "acc_reload" in str(refusal(spill))


def test_an_operand_precision_the_tensor_cores_lack_is_refused():
    p = built()
    mm = p.plan.block
    err = refusal(matmul_replaced(p, MatmulTiles(mm, (1, 1), "fp8")))
    assert isinstance(err, UnsupportedPrecision) and "fp8" in str(err)
    a = dataclasses.replace(p.tensors[0], dtype=DType.FP16)
    err = refusal(p.evolve(tensors=(a, *p.tensors[1:]), verified=True))
    assert isinstance(err, UnsupportedPrecision) and "input A" in str(err)


def test_an_int8_reduction_that_can_overflow_int32_is_refused():
    # K·128·128 (the product of two -128s, K times) must stay within int32: K = 131071 fits, 131072 does not.
    assert lowered(16, 16, 131071, "int8", "sm_86", split_k=1).census.agrees
    err = refusal(built(16, 16, 131072, "int8", "sm_86", split_k=1))
    assert isinstance(err, TooBig) and err.need == 131072 * 128 * 128 and err.have == 2**31 - 1
    assert lowered(16, 16, 131072, "fp16", "sm_86", split_k=1).census.agrees  # fp32 accumulators: no such limit
    # Split over sites, the partial sums are smaller, but the owner adds them all in int32: the same bound holds.
    split = built(16, 16, 131072, "int8", "sm_86", split_k=4)
    assert split.placement.splits == 4
    with pytest.raises(TooBig) as info:
        spatialc.lower(split)  # the general form, which prints split-K
    assert info.value.need == 131072 * 128 * 128


def test_sites_whose_programs_differ_are_refused():
    p = built(sites=4)
    progs = list(p.schedule.programs)
    last = max(i for i, pr in enumerate(progs) if pr.engine.value == "reader")
    progs[last] = dataclasses.replace(progs[last], ops=progs[last].ops * 2)
    err = refusal(p.evolve(schedule=dataclasses.replace(p.schedule, programs=tuple(progs)), verified=True))
    assert "differ from site 0" in str(err)


# ---- structure ---------------------------------------------------------------------------------------------


def test_the_k_loop_is_pipelined_at_depth_two_or_more_and_printed_as_written_at_depth_one():
    deep = lowered(depth=2).kernel_cu
    # Two deep: step k+1's copies go out right after step k's waits, which leave nothing in flight.
    assert "if (k + 1 < 4)" in deep and "__pipeline_wait_prior(0);" in deep
    assert count_printed(deep, "pre") == {"Push": 2, "ReadTiles": 2, "Reserve": 2}
    assert count_printed(deep, "pad") == {"Push": 2}
    shallow = lowered(depth=1).kernel_cu
    assert "k + 1" not in shallow and "// pre:" not in shallow and "// pad:" not in shallow
    assert "__pipeline_wait_prior(0);" in shallow and "__pipeline_wait_prior(2)" not in shallow


def test_waits_and_pops_each_cross_one_barrier_per_run():
    text = lowered(depth=1).kernel_cu
    waits = [line for line in text.splitlines() if "// op:Wait" in line]
    assert [("__syncthreads" in w) for w in waits] == [False, True, True]  # Wait A, Wait B (run), Wait C
    pops = [line for line in text.splitlines() if "// op:Pop" in line]
    assert [("__syncthreads" in p) for p in pops] == [False, True, True]


def k_step(text: str) -> list[str]:
    """The lines of the K loop's body (the loop `for (int k = 0; …)` up to its closing brace)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("for (int k = 0;"))
    depth = 0
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if depth == 0:
            return lines[start : i + 1]
    raise AssertionError("the K loop never closes")


@pytest.mark.parametrize("depth", [2, 3, 4, 5])
def test_a_rotated_k_loop_waits_once_and_crosses_one_barrier_per_step(depth):
    """Rings of depth D are filled D − 1 steps ahead (at most the loop's 4 steps less one), step k + D − 1's copies
    issued right after step k's wait barrier; its waits leave the D − 2 steps before it in flight (two copy groups
    a step: A and B), and the pops need no barrier."""
    text = lowered(depth=depth).kernel_cu
    step = k_step(text)
    ahead = min(depth - 1, 3)
    waits = [line for line in step if "// op:Wait" in line]
    assert [line.strip() for line in waits] == [
        f"__pipeline_wait_prior({2 * (ahead - 1)});  // op:Wait",
        "__syncthreads();  // op:Wait",
    ]
    joined = "\n".join(step)
    assert f"if (k + {ahead} < " in joined and joined.index("__syncthreads") < joined.index(f"if (k + {ahead} < ")
    pops = [line for line in step if "// op:Pop" in line]
    assert len(pops) == 2 and not any("__syncthreads" in line for line in pops)
    assert sum(line.count("__syncthreads") for line in step) == 1
    assert sum(line.count("__pipeline_wait_prior") for line in step) == 1
    # The output ring is drained outside the K loop: its pop keeps its barrier.
    after = [line for line in text.splitlines() if "// op:Pop" in line and line not in step]
    assert after and all("__syncthreads();" in line for line in after)


def test_pop_barriers_are_elided_only_for_rings_of_a_rotated_loop():
    for depth, free in ((1, set()), (2, {0, 1}), (3, {0, 1}), (4, {0, 1})):
        p = built(depth=depth)
        rings = ring_table(p, MMA_TYPES[Precision.INT8], ())
        ops = serialise(printed_site_programs(p))
        assert barrier_free_pops(rings, ops) == free, depth
    # One K step is printed as written (not rotated): each run of pops keeps its barrier (A, B in a run; C).
    text = lowered(16, 16, 16, depth=3).kernel_cu
    pops = [line for line in text.splitlines() if "// op:Pop" in line]
    assert ["__syncthreads();" in line for line in pops] == [False, True, True]


def test_the_fused_epilogue_has_no_output_ring():
    a = lowered(block=(2, 4, 2))  # sm_86: four warps in a 1x4 grid over a 2x4 block
    text = a.kernel_cu
    assert "ring_3" not in text and "DEPTH_3" not in text
    assert text.count("(fused output: no ring)") == 5  # Reserve, PackAcc, Push, Wait, Pop C: handled, empty
    # Each lane stores its own accumulator elements: no staging in shared memory, no warp barrier, no dynamic block.
    assert "accf[q].x[i + j]" in text and "__syncwarp();" not in text and "spatialc_dyn_smem" not in text
    assert a.census.agrees and a.budget.dyn_bytes == 0


def test_no_fused_epilogue_without_a_lane_grid():
    text = lowered(block=(1, 1, 1)).kernel_cu  # four warps cannot split one tile
    assert "SPATIALC_SHARED_RING(ACCT, ring_3, DEPTH_3, PAGE_3);" in text and "accf[q].x[i + j]" not in text
    assert "const int ot = warp + q * NWARP;" in text


def c_value(expr, **names):
    """A printed C expression of non-negative ints, evaluated."""
    return eval(expr.replace("/", "//"), {}, names)


def test_each_warp_owns_a_rectangle_of_every_sub_block_without_aliasing():
    p = built(64, 128, 48, "fp16", "sm_86", block=(2, 4, 1), sub_blocks=(2, 2))
    text = lower(p, spatialc.target("sm_86")).kernel_cu
    assert "#define PERW 8" in text  # 2x2 sub-blocks x (2x1 tiles per warp)
    owned = re.search(r"const int bh = (.*), bw = (.*);", text).groups()
    seen = {}
    for warp in range(4):
        for q in range(8):
            tile = tuple(c_value(e, q=q, wi=warp // 4, wj=warp % 4) for e in owned)
            assert tile not in seen, f"warp {warp} fragment {q} aliases {seen.get(tile)}"
            seen[tile] = (warp, q)
    assert sorted(seen) == [(r, c) for r in range(4) for c in range(8)]
    # The multiply indexes its accumulators by the same map: fragment q of (row r, column c) is that tile.
    row = re.search(r"spatialc_load_a\(af, ring_0 \+ rslot_0 \* PAGE_0 \+ \(\((.*?)\)(?: \* \d+)? \+ kk\)", text).group(
        1
    )
    col = re.search(r"\(kk \* 8 \+ ([^)]*)\) \* 256", text).group(1)
    q_of = re.search(r"const int q = (.*);", text).group(1)
    for warp in range(4):
        for r in range(4):
            for c in range(2):
                env = dict(r=r, c=c, wi=warp // 4, wj=warp % 4)
                q = c_value(q_of, **env)
                assert seen[(c_value(row, **env), c_value(col, **env))] == (warp, q)


def per_site(launch, sms=None):
    """Each site's items, read back from the work list the launch would pass (offsets, counts, the items)."""
    w = launch.work_list(sms)
    sites = launch.sites(sms)
    offs, counts, items = w[:sites], w[sites : 2 * sites], w[2 * sites :]
    return [items[o : o + n] for o, n in zip(offs, counts, strict=True)]


def test_the_work_list_is_the_placement_round_robin_included():
    p = built(100, 100, 32, "int8", "sm_86", sites=3, placement="round_robin")
    launch = lower(p, spatialc.target("sm_86")).launch
    assert launch.per_sm == 0 and launch.sites(7) == 3  # three sites were asked for: three on any device
    assert per_site(launch) == [[int(i) for i in items] for _, items in p.placement.items_of_site]
    assert per_site(launch)[1] == list(range(1, p.plan.items, 3))


def test_the_work_list_follows_the_device_by_the_same_rule():
    # Placed over what sm_86 keeps resident (82 SMs x blocks per SM, capped at the items): at launch the sites are
    # the device's, the items split by the same rule — the kernel text does not change, only its argument.
    p = built(1000, 600, 64, "int8", "sm_86", placement="round_robin")
    launch = lower(p, spatialc.target("sm_86")).launch
    assert launch.per_sm > 0 and launch.grid == len(p.placement.items_of_site)
    assert per_site(launch, 82) == [[int(i) for i in items] for _, items in p.placement.items_of_site]
    for sms in (1, 7, 132):
        sites = per_site(launch, sms)
        assert len(sites) == min(p.plan.items, sms * launch.per_sm)
        assert sorted(i for s in sites for i in s) == list(range(p.plan.items))
        assert sites[1] == list(range(1, p.plan.items, len(sites)))


def test_a_listed_placement_keeps_its_list_and_grid():
    t = spatialc.target("sm_86")
    p = place(tile(spatialc.gemm(100, 70, 50, "int8"), t), t)
    n = p.plan.items
    odd = (
        (Site(0), tuple(ItemId(i) for i in range(0, n, 2))),
        (Site(1), ()),
        (Site(2), tuple(ItemId(i) for i in range(1, n, 2))),
    )
    q = verify(schedule(p.evolve(placement=Placement(odd, (), "strided"))))
    launch = lower(q, t).launch
    assert launch.placement == "listed" and launch.sites(132) == 3
    assert per_site(launch, 132) == [[int(i) for i in items] for _, items in odd]


def test_a_site_without_items_returns_at_once_and_one_with_many_loops():
    a = lowered(32, 32, 32, "int8", "sm_86", sites=7)  # four items on seven sites: no ITEM loop in the program
    text = a.kernel_cu
    assert [len(s) for s in per_site(a.launch)] == [1, 1, 1, 1, 0, 0, 0]
    assert "if (n_items == 0) { return; }" in text
    # The kernel loops over whatever share of the items a site gets at launch, whether the program had a loop or not.
    assert "for (int item = 0; item < n_items; ++item) {" in text
    assert a.launch.grid == 7 and a.census.agrees
    looped = lowered(64, 64, 32, "int8", "sm_86", sites=3).kernel_cu
    assert "for (int item = 0; item < n_items; ++item) {  // op:Loop x3" in looped


def test_the_kernel_text_does_not_depend_on_how_many_sites_hold_the_items():
    texts = {lowered(200, 200, 64, "int8", "sm_86", sites=s).kernel_cu for s in (1, 3, 7, 40)}
    assert len(texts) == 1


def test_rings_stay_static_up_to_48_kib_and_move_to_the_dynamic_block_beyond():
    # sm_90, fp16, 4x4x4 blocks: the operand rings are depth x 32 tiles x 512 bytes.
    static = lowered(128, 128, 128, "fp16", "sm_90", block=(4, 4, 4), depth=3)
    assert static.budget.ring_bytes == 48 * 1024 and not static.budget.rings_dynamic
    assert static.budget.static_bytes == 48 * 1024 and static.budget.dyn_bytes == 0
    assert "SPATIALC_SHARED_RING(OPT, ring_0, DEPTH_0, PAGE_0);" in static.kernel_cu
    # 48 KiB of static rings is what a block gets without opting in.
    assert not static.budget.dynamic_opt_in and "cudaFuncSetAttribute" not in static.program_cu
    dynamic = lowered(128, 128, 128, "fp16", "sm_90", block=(4, 4, 4), depth=4)
    b = dynamic.budget
    assert b.rings_dynamic and b.static_bytes == 0 and b.dyn_bytes == 64 * 1024 and b.dynamic_opt_in
    assert "SPATIALC_DYNAMIC_RING(OPT, ring_0, spatialc_dyn_smem, SMEM_OFF_0, DEPTH_0, PAGE_0);" in dynamic.kernel_cu
    assert "#define SMEM_OFF_0 0" in dynamic.kernel_cu and "#define SMEM_OFF_1 32768" in dynamic.kernel_cu
    assert dynamic.launch.dyn_smem == b.dyn_bytes and dynamic.launch.smem_opt_in
    small = lowered(block=(2, 4, 2)).budget
    assert not small.dynamic_opt_in and "cudaFuncSetAttribute" not in lowered(block=(2, 4, 2)).program_cu


@pytest.mark.parametrize(
    "tgt, prec, kw",
    [
        ("sm_86", "int8", {}),
        ("sm_86", "fp16", {"block": (2, 4, 2)}),
        ("sm_90", "bf16", {"block": (4, 4, 4), "depth": 4}),
        ("sm_80", "fp16", {"block": (2, 4, 1), "sub_blocks": (2, 2)}),
        ("sm_90", "int8", {"depth": 1}),
    ],
)
def test_the_budget_agrees_with_the_planner(tgt, prec, kw):
    p = built(128, 128, 128, prec, tgt, **kw)
    t = spatialc.target(tgt)
    a = lower(p, t)
    assert a.budget.total_bytes == smem_bytes(t, p.plan, p.precision)
    assert a.budget.blocks_per_sm == t.resident_sites_per_unit(
        a.budget.total_bytes, p.plan.block.osh, p.plan.block.osw, p.plan.sub_blocks
    )
    assert f"__launch_bounds__(NTHREAD, {a.budget.blocks_per_sm})" in a.kernel_cu
    assert a.budget.threads == t.accumulator_lanes * 32 == a.launch.block


def test_the_census_counts_every_op_of_the_site_once_in_the_kernel():
    a = lowered(64, 64, 32, "int8", "sm_86", sites=3)
    assert a.census.agrees
    assert a.census.program == {
        "AcquireAcc": 1,
        "Compute": 1,
        "Loop": 5,
        "PackAcc": 1,
        "Pop": 3,
        "Push": 3,
        "ReadTiles": 2,
        "ReleaseAcc": 1,
        "Reserve": 3,
        "Wait": 3,
        "WriteTiles": 1,
    }
    assert a.census.rotated == {"Push": 2, "ReadTiles": 2, "Reserve": 2}  # the producer half, again
    assert "// op:Loop x2" in a.kernel_cu  # the reader's and the compute engine's K loops are one `for`


def test_the_texts_follow_the_kernel_abi():
    a = lowered(33, 17, 49, "int8", "sm_86")
    head = a.program_cu.splitlines()
    assert head[0].startswith("// ") and head[1:9] == [
        f"#include <{h}>"
        for h in ("cuda_pipeline.h", "mma.h", "cuda_bf16.h", "cuda_fp16.h", "cstdio", "cstdlib", "vector", "cstring")
    ]
    assert a.program_cu.startswith(a.kernel_cu) and a.bench_cu.startswith(a.kernel_cu)
    assert "int main()" not in a.kernel_cu and "spatialc_persistent(const OPT* __restrict__ t0" in a.kernel_cu
    assert 'spatialc_read("a.txt", h0)' in a.program_cu and 'spatialc_read("b.txt", h1)' in a.program_cu
    assert '"%lld\\n", (long long)y[' in a.program_cu
    assert '"%.9g\\n", (double)(float)y[' in lowered(33, 17, 49, "bf16", "sm_86").program_cu
    main = a.program_cu[a.program_cu.index("int main()") :]
    for call in re.findall(r"^\s*(.*\bcuda[A-Z]\w*\(.*)$", main, re.M):
        assert call.startswith("SPATIALC_CHECK(cuda"), call
    block = a.launch.block
    assert re.search(rf"^\s*spatialc_persistent<<<GRID, {block}>>>\(d0, d1, d2, d_work\);$", main, re.M)
    assert [p.c_type for p in a.launch.params] == ["signed char", "signed char", "int"]


def test_the_bench_times_twenty_launches_and_reports_only_after_checking_them():
    bench = lowered(64, 64, 64, "fp16", "sm_86", block=(2, 4, 2)).bench_cu
    assert "a.txt" not in bench and "spatialc_bench_input(h0, 0);" in bench
    assert "const int ITERS = 20;" in bench and bench.count("<<<GRID, 128>>>") == 2  # fused: no dynamic block
    checked, rate = bench.index("SPATIALC_CHECK(cudaEventSynchronize(e1));"), bench.index('printf("GOPS')
    assert bench.index("SPATIALC_CHECK(cudaGetLastError());", bench.index("cudaEventRecord(e1)")) < checked < rate


def test_write_artifact_writes_the_texts_and_the_json(tmp_path):
    a = lowered()
    written = {p.name for p in write_artifact(a, tmp_path / "out")}
    assert {"program.cu", "bench.cu", "budget.json", "census.json"} <= written
    assert (tmp_path / "out" / "program.cu").read_text() == a.program_cu
    assert json.loads((tmp_path / "out" / "budget.json").read_text())["ring_bytes"] == a.budget.ring_bytes
    assert json.loads((tmp_path / "out" / "census.json").read_text())["agrees"] is True


def test_spatialc_lower_stays_the_function_after_the_first_call():
    p = built()
    assert spatialc.lower(p).census.agrees and spatialc.lower(p).census.agrees


def test_a_k_loop_of_one_step_is_printed_as_written():
    a = lowered(32, 32, 16, "int8", "sm_86")
    assert a.census.agrees and "// pre:" not in a.kernel_cu
    (k,) = [
        o
        for pr in built(32, 32, 16, "int8", "sm_86").schedule.programs
        for o in pr.ops
        if isinstance(o, Loop) and o.var == LV_K
    ][:1]
    assert k.count == Const(1)


@pytest.mark.parametrize("prec", ["int8", "bf16"])
def test_the_planner_asks_the_backend_and_gets_the_kernels_own_shared_memory(prec):
    from spatialc.passes.footprint import smem_bytes

    for tgt, block, depth in [("sm_80", (1, 1, 1), 3), ("sm_86", (2, 4, 2), 2), ("sm_90", (4, 4, 4), 4)]:
        p = spatialc.build(spatialc.gemm(128, 128, 128, prec), tgt, block=block, depth=depth)
        assert smem_bytes(spatialc.target(tgt), p.plan, p.precision) == spatialc.lower(p).budget.total_bytes


def test_lowering_many_sites_groups_the_schedule_by_site_once(monkeypatch):
    """The forms take each site's programs from one grouping of the schedule (`Schedule.by_site`), not a scan of it
    per site: lowering was quadratic in the sites (65,536 of them, which `build` accepts, never finished)."""
    from spatialc.ir.nodes import Schedule

    p = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_90", sites=300)
    grouped = p.schedule.by_site()
    assert list(grouped) == [s for s, _ in p.placement.items_of_site]
    assert all(grouped[s] == p.schedule.programs_of(s) for s in grouped)

    def scan(self, site):
        raise AssertionError(f"the schedule scanned for site {int(site)}")

    monkeypatch.setattr(Schedule, "programs_of", scan)
    art = spatialc.lower(p)
    assert art.launch.grid == 300 and art.general is not None


@pytest.mark.emulation
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the host emulation needs g++")
def test_auto_falls_back_to_the_general_form_where_the_persistent_kernel_cannot_hold_a_correct_program():
    """K steps unrolled out of order hold more A pages than the ring has in the serialised order: the persistent
    kernel's TooBig was auto's answer, though the general form (as the docstring says auto falls back to) runs it
    exactly."""
    import numpy as np

    from ..rewrite import unroll_k

    p = spatialc.build(spatialc.gemm(32, 32, 128, "int8"), "sm_86", block=(2, 2, 2), sites=1, split_k=1)
    q = verify(unroll_k(p, [3, 2, 1, 0]))
    with pytest.raises(TooBig, match="held at once in the printed order"):
        spatialc.lower(q, form="persistent")
    a = spatialc.lower(q)
    assert a.budget.form == "general"
    assert a.notes == (
        "the general form, as the persistent kernel cannot hold the program: pages of ring A_ring held at once in"
        " the printed order: needs 4, has 3; deepen the ring or let its consumer drain it sooner",
    )
    rng = np.random.default_rng(0)
    ins = {"A": rng.integers(-9, 9, (32, 128)), "B": rng.integers(-9, 9, (128, 32))}
    want = spatialc.evaluate(q, ins)
    assert np.array_equal(want, ins["A"] @ ins["B"])
    assert np.array_equal(spatialc.emulate(a, ins), want)

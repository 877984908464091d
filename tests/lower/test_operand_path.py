"""The tensor-core operand path (issue "operand path"): ldmatrix fragments from swizzled 16-bit pages and K-major
int8 B pages, mma.sync (k32 for int8), the page layouts in the IR, the tilize that stores B K-major, and the SASS
nvcc makes of it.

The emulation implements the hardware's fragment layouts (emu_mma.h); that it is trusted is shown here by the faults
it must catch: a reader that forgets the swizzle, and a B stored in the order its pages do not hold.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import spatialc
from spatialc.errors import RingOwnershipError
from spatialc.inputs import InputError
from spatialc.ir import serde
from spatialc.ir.nodes import Fifo, PageLayout, TileOrder
from spatialc.lower.errors import LowerError
from spatialc.runtime.emulate import EmulationError, EmulationRace
from spatialc.runtime.nvcc import compile_cubin, find_nvcc, kernel_ptxas
from spatialc.runtime.sass import Sass, disassemble, find_cuobjdump
from spatialc.runtime.tilize import tile_offset

GPP = shutil.which("g++")
needs_gpp = pytest.mark.skipif(GPP is None, reason="g++ is not installed")


def inputs(p, seed=0):
    rng = np.random.default_rng(seed)
    a, b = (t for t in p.tensors if t.role.value == "input")
    lo, hi = (-128, 128) if p.precision.value == "int8" else (-4, 5)
    return {t.name: rng.integers(lo, hi, t.elems).astype(np.float32) for t in (a, b)}


def exact(art, p, x, mode="late"):
    return np.array_equal(np.asarray(spatialc.emulate(art, x, mode=mode, timeout=120)), spatialc.evaluate(p, x))


# ---- the layouts in the IR and their check -----------------------------------------------------------------------


def test_each_operand_page_is_laid_out_for_its_fragment_load():
    for prec, want in (
        ("fp16", ("swizzled", "swizzled")),
        ("bf16", ("swizzled", "swizzled")),
        ("int8", ("row", "col")),
    ):
        p = spatialc.build(spatialc.gemm(40, 30, 50, prec), "sm_86")
        rings = {b.name: b.kind.layout.value for b in p.buffers if isinstance(b.kind, Fifo)}
        assert (rings["A_ring"], rings["B_ring"]) == want
        assert p.tensor_named("B").order == (TileOrder.COL if prec == "int8" else TileOrder.ROW)
        # and they survive a save and a load
        assert spatialc.from_json(spatialc.to_json(p)) == p


def b_flipped(p):
    """`p` with its B tensor stored in the other tile order, its pages unchanged."""
    flip = {TileOrder.ROW: TileOrder.COL, TileOrder.COL: TileOrder.ROW}
    return p.evolve(
        tensors=tuple(dataclasses.replace(t, order=flip[t.order]) if t.name == "B" else t for t in p.tensors)
    )


@pytest.mark.parametrize("prec", ["int8", "fp16"])
def test_verify_refuses_a_tensor_stored_in_another_order_than_its_pages(prec):
    p = spatialc.build(spatialc.gemm(48, 32, 64, prec), "sm_90")
    with pytest.raises(RingOwnershipError, match=r"B_ring holds .*-major tiles .* filled from B, stored .*transposed"):
        spatialc.verify(b_flipped(p))


def test_verify_refuses_an_a_ring_of_column_major_pages_filled_from_row_major_a():
    p = spatialc.build(spatialc.gemm(48, 32, 64, "int8"), "sm_90")
    col = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, layout=PageLayout.COL)) if b.name == "A_ring" else b
        for b in p.buffers
    )
    with pytest.raises(RingOwnershipError, match="A_ring holds col-major tiles .* filled from A, stored row-major"):
        spatialc.verify(p.evolve(buffers=col))


@needs_gpp
def test_the_order_guards_a_real_fault_the_emulation_sees():
    """B stored row-major into K-major pages (the host's tilize told to forget the order) computes A·B with every
    B tile transposed: the wrong answer the verify rule exists to refuse, seen by the emulation."""
    p = spatialc.build(spatialc.gemm(32, 32, 32, "int8"), "sm_90", block=(2, 2, 2))
    art = spatialc.lower(p)
    tilize_b = "spatialc_tilize(h1, 32, 32, 2, x1, true);"
    assert tilize_b in art.program_cu
    broken = dataclasses.replace(art, program_cu=art.program_cu.replace(tilize_b, tilize_b.replace(", true", "")))
    x = inputs(p)
    assert exact(art, p, x)
    assert not exact(broken, p, x)


def _b_pages(p, layout: PageLayout, order: TileOrder | None = None):
    """`p` with B's ring laid out `layout` (and B stored `order`), verified."""
    pages = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, layout=layout)) if b.name == "B_ring" else b
        for b in p.buffers
    )
    tensors = tuple(dataclasses.replace(t, order=order) if order and t.name == "B" else t for t in p.tensors)
    return spatialc.verify(p.evolve(buffers=pages, tensors=tensors))


def test_lowering_reads_16_bit_b_from_plain_pages_and_refuses_pages_the_loads_cannot_read():
    p = spatialc.build(spatialc.gemm(48, 32, 64, "fp16"), "sm_90")
    plain = _b_pages(p, PageLayout.ROW)  # consistent: row-major B in row-major pages, read by ldmatrix .trans
    assert "spatialc_load_b_row(bf" in spatialc.lower(plain, form="persistent").kernel_cu
    columns = _b_pages(p, PageLayout.COL, TileOrder.COL)  # consistent too, but no 16-bit load reads K-major tiles
    with pytest.raises(LowerError, match="operand B in col pages .* swizzled"):
        spatialc.lower(columns, form="persistent")


# ---- the tilize that matches ------------------------------------------------------------------------------------


def test_a_column_major_tile_holds_each_column_contiguously():
    x = np.arange(20 * 37, dtype=np.int32).reshape(20, 37)
    flat = spatialc.tilize(x, order="col")
    for i, j in ((0, 0), (0, 1), (1, 0), (15, 16), (19, 36)):
        assert flat[tile_offset(i, j, 3, order="col")] == x[i, j]
    assert flat[tile_offset(1, 0, 3, order="col")] == flat[tile_offset(0, 0, 3, order="col") + 1]
    np.testing.assert_array_equal(spatialc.untilize(flat, x.shape, order="col"), x)
    assert not np.array_equal(flat, spatialc.tilize(x))
    with pytest.raises(InputError, match="order must be 'row' or 'col'"):
        spatialc.tilize(x, order="k-major")


def test_the_launch_contract_names_the_order_of_each_parameter():
    art = spatialc.lower(spatialc.build(spatialc.gemm(48, 32, 64, "int8"), "sm_90"))
    assert [(q.name, q.order) for q in art.launch.params] == [("A", "row"), ("B", "col"), ("C", "row")]


# ---- the kernel text and its emulation --------------------------------------------------------------------------


@needs_gpp
@pytest.mark.parametrize("ibw", [1, 2, 3])
@pytest.mark.parametrize("form", ["persistent", "general"])
def test_int8_takes_k_in_pairs_of_tiles_and_the_odd_one_alone(ibw, form):
    p = spatialc.build(spatialc.gemm(40, 40, 16 * ibw * 2 + 5, "int8"), "sm_90", block=(2, 2, ibw), form=form)
    art = spatialc.lower(p, form=form)
    text = art.kernel_cu
    assert ("spatialc_mma2(accf[q]" in text) == (ibw >= 2)
    assert ("spatialc_mma(accf[q]" in text) == (ibw % 2 == 1)
    assert exact(art, p, inputs(p, seed=ibw))


@needs_gpp
@pytest.mark.parametrize("mode", ["late", "early"])
def test_a_reader_that_forgets_the_swizzle_is_a_wrong_answer(mode):
    p = spatialc.build(spatialc.gemm(32, 32, 48, "bf16"), "sm_86", block=(2, 2, 1))
    art = spatialc.lower(p)
    swizzle = "(off ^ ((off >> 3) & 1)) * 16"
    assert art.program_cu.count(swizzle) == 4  # the A and B readers, before the K loop and in it
    broken = dataclasses.replace(art, program_cu=art.program_cu.replace(swizzle, "off * 16"))
    x = inputs(p)
    assert exact(art, p, x, mode)
    assert not exact(broken, p, x, mode)


@needs_gpp
def test_an_operand_load_from_global_memory_is_refused_by_the_emulation():
    p = spatialc.build(spatialc.gemm(32, 32, 32, "fp16"), "sm_86", block=(2, 2, 1))
    art = spatialc.lower(p)
    text = art.program_cu.replace("spatialc_load_b(bf[c], ring_1 + rslot_1 * PAGE_1 +", "spatialc_load_b(bf[c], t1 +")
    assert text != art.program_cu
    with pytest.raises(EmulationError, match="ldmatrix reads shared memory only"):
        spatialc.emulate(dataclasses.replace(art, program_cu=text), inputs(p), timeout=60)


def test_the_planner_takes_deep_k_steps_and_even_ones_for_int8():
    for prec in ("fp16", "bf16", "int8"):
        plan = spatialc.build(spatialc.gemm(4096, 4096, 4096, prec), "sm_90").plan
        assert plan.block.ibw >= 2 and plan.block.ibw % 2 == 0, (prec, plan)


# ---- SASS: what nvcc makes of it --------------------------------------------------------------------------------

NVCC, CUOBJDUMP = find_nvcc(), find_cuobjdump()
SASS_CASES = [
    (p, f, a) for p in ("fp16", "bf16", "int8") for f in ("persistent", "general") for a in ("sm_80", "sm_90")
]


@pytest.fixture(scope="module")
def compiled():
    """(precision, form, arch) → (Sass, PtxasInfo) of the default 4096³ kernel."""

    def one(case):
        prec, form, arch = case
        art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, prec), arch, form=form), form=form)
        cubin = compile_cubin(art.kernel_cu, arch)
        return case, (disassemble(cubin), kernel_ptxas(cubin, art.launch.kernel_name))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, SASS_CASES))


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="nvcc or cuobjdump is not installed")
@pytest.mark.parametrize("case", SASS_CASES, ids=["-".join(c) for c in SASS_CASES])
def test_the_main_loop_feeds_the_tensor_cores_from_shared_memory(compiled, case):
    prec, form, _ = case
    sass, ptxas = compiled[case]
    (loop,) = sass.main_loops()
    assert sass.count("LDSM", *loop) > 0  # operand fragments by ldmatrix
    assert sass.count("LD") == 0  # no generic loads anywhere (the bf16 WMMA builtins made them)
    assert not any(sass.count(f"LDS.{w}", *loop) for w in ("U8", "S8", "U16", "S16"))  # no byte / half gathers
    if prec == "int8":
        assert sass.count("IMMA.16832", *loop) > 0 and sass.count("IMMA.16816", *loop) == 0
    else:
        assert sass.count("HMMA.16816.F32", *loop) > 0
    if form == "persistent":
        assert sass.count("BAR.SYNC", *loop) == 1  # one block barrier a K step
    assert ptxas is not None and ptxas.spill_stores == 0 and ptxas.spill_loads == 0


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="nvcc or cuobjdump is not installed")
@pytest.mark.parametrize(
    ("prec", "out", "wide"), [("bf16", "bf16", "STG.E"), ("fp16", "fp16", "STG.E"), ("int8", "int32", "STG.E.64")]
)
def test_the_fused_store_writes_a_lanes_adjacent_columns_as_one_store_of_twice_their_width(prec, out, wide):
    """Each lane holds pairs of adjacent columns of C; the fused store writes each pair as one store (SPATIALC_OUT_ST2):
    a bf16 / fp16 C 32 bits at a time, where it took 128 two-byte stores a thread an item (issue 36, section 2)."""
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, prec, out=out), "sm_90"))
    sass = disassemble(compile_cubin(art.kernel_cu, "sm_90"))
    stores = Counter(i.op for i in sass.instrs if i.base == "STG")
    assert stores[wide] > 0 and set(stores) == {wide}, stores  # no narrower store of C anywhere


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="nvcc or cuobjdump is not installed")
@pytest.mark.parametrize(
    ("target", "arch", "form"),
    [("sm_90", "sm_90", "general"), ("sm_90a", "sm_90a", "sm90a"), ("sm_86", "sm_86", "general")],
)
def test_a_ring_wait_suspends_in_hardware_on_hopper_and_backs_off_before_it(target, arch, form):
    """A wait on a ring's mbarrier is mbarrier.try_wait on sm_90 and later (the thread suspends until the phase
    completes: SYNCS.PHASECHK…TRYWAIT, no __nanosleep back-off), and test_wait with a back-off before sm_90, which has
    no try_wait (issue 36, section 2, item 3)."""
    art = spatialc.lower(spatialc.build(spatialc.gemm(1024, 1024, 1024, "bf16"), target, form=form), form=form)
    ops = Counter(i.op for i in disassemble(compile_cubin(art.kernel_cu, arch)).instrs)
    tries = sum(n for op, n in ops.items() if op.startswith("SYNCS.PHASECHK") and op.endswith("TRYWAIT"))
    tests = sum(n for op, n in ops.items() if op.startswith("SYNCS.PHASECHK") and not op.endswith("TRYWAIT"))
    if arch == "sm_86":
        assert ops["NANOSLEEP"] > 0 and tries == 0
    else:
        assert tries > 0 and tests == 0 and ops["NANOSLEEP"] == 0, ops


def test_the_sass_reader_finds_loops_and_skips_padding():
    text = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/              @!PT LDS RZ, [RZ] ;
        /*0020*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0030*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/              @!P1 BRA 0x20 ;
        /*0060*/                   EXIT ;
    """
    sass = Sass.parse(text)
    assert len(sass.instrs) == 7 and sass.count("LDS") == 0 and sass.count("LDSM") == 1
    assert sass.main_loops() == [(0x20, 0x51)] and sass.count("BAR.SYNC", 0x20, 0x51) == 1
    # An out-of-line slow path after the last EXIT (a try_wait retried) that jumps back into the loop is no loop.
    stub = text.replace("/*0060*/                   EXIT ;", "/*0060*/                   EXIT ;\n/*0070*/  BRA 0x30 ;")
    assert Sass.parse(stub).loops() == [(0x20, 0x51), (0x30, 0x71)]
    assert Sass.parse(stub).main_loops() == [(0x20, 0x51)]


# ---- the deeper pipeline ----------------------------------------------------------------------------------------


@needs_gpp
@pytest.mark.parametrize("depth", [4, 5])
def test_a_pipeline_depth_less_one_steps_deep_is_exact_and_needs_every_page_of_its_rings(depth):
    """Rings of depth D are filled D − 1 steps ahead; the same kernel on rings one page shallower overwrites a page
    still in use, which the emulation catches."""
    p = spatialc.build(spatialc.gemm(32, 32, 16 * 9, "fp16"), "sm_86", block=(2, 2, 1), depth=depth)
    art = spatialc.lower(p)
    assert f"is pipelined {depth - 1} steps deep" in art.kernel_cu
    x = inputs(p)
    assert exact(art, p, x, "late") and exact(art, p, x, "early")
    shallow = art.program_cu.replace(f"#define DEPTH_0 {depth}\n", f"#define DEPTH_0 {depth - 1}\n")
    assert shallow != art.program_cu
    # Early mode lands each copy when issued: the prefetch lands on the slot a warp is still reading.
    with pytest.raises(EmulationRace, match="RACE on shared ring 'ring_0'.*fragment load \\(ldmatrix\\)"):
        spatialc.emulate(dataclasses.replace(art, program_cu=shallow), x, mode="early", timeout=120)


def test_the_interpreter_trace_and_its_picture_name_each_ring_layout():
    from spatialc import viz

    for prec, want in (("int8", {"A_ring": "row", "B_ring": "col"}), ("bf16", {"A_ring": "swizzled"})):
        p = spatialc.build(spatialc.gemm(32, 32, 64, prec), "sm_90", sites=1)
        _, trace = spatialc.evaluate(p, inputs(p), trace=True)
        layouts = {r.ring: r.layout for r in trace.rings if r.site == 0}
        assert want.items() <= layouts.items()
        svg = viz.timeline_svg(trace, 0)
        assert (", K-major" in svg) == (prec == "int8") and (", swizzled" in svg) == (prec == "bf16")


def test_the_budget_names_each_ring_layout():
    art = spatialc.lower(spatialc.build(spatialc.gemm(48, 32, 64, "int8"), "sm_90"))
    assert dict(art.budget.layouts) == {"A_ring": "row", "B_ring": "col"}
    assert art.budget.to_dict()["layouts"] == {"A_ring": "row", "B_ring": "col"}


# ---- every layout edit of a saved program ---------------------------------------------------------------------


def _layout_edits(doc):
    """Every one-field change of a saved program's page layouts and tile orders: (description, edited doc)."""
    import copy

    prog = doc["program"]
    for i, b in enumerate(prog["buffers"]):
        kind = b["kind"]
        if "layout" not in kind:
            continue
        for other in ("row", "col", "swizzled"):
            if other != kind["layout"]:
                out = copy.deepcopy(doc)
                out["program"]["buffers"][i]["kind"]["layout"] = other
                yield f"{b['name']} pages {kind['layout']} -> {other}", out
    for i, t in enumerate(prog["tensors"]):
        out = copy.deepcopy(doc)
        out["program"]["tensors"][i]["order"] = "row" if t["order"] == "col" else "col"
        yield f"tensor {t['name']} order {t['order']} -> {out['program']['tensors'][i]['order']}", out


@needs_gpp
def test_every_layout_edit_is_refused_or_still_exact_in_the_emulated_kernel():
    """The interpreter moves whole tiles and cannot see a layout, so the mutation suite's judge would call any
    accepted layout edit harmless; here each is taken to the emulated kernel. Refused by verify, refused by the
    lowering, or exact: never accepted and wrong."""
    from spatialc.numerics.reference import reference
    from tests import mutants

    outcomes = {"verify": 0, "lower": 0, "exact": 0}
    for name, make in mutants.PROGRAMS.items():
        p = make()
        doc = json.loads(spatialc.to_json(p))
        x = mutants.inputs_for(p)
        ref = reference(p, x)
        for what, out in _layout_edits(doc):
            try:
                q = spatialc.from_json(json.dumps(out))
            except spatialc.SpatialError:
                q = None
            if q is None or not q.verified:  # from_json verifies a document that says it is verified
                outcomes["verify"] += 1
                continue
            try:
                art = spatialc.lower(q)
            except spatialc.SpatialError:
                outcomes["lower"] += 1
                continue
            c = np.asarray(spatialc.emulate(art, x, timeout=120))
            assert np.array_equal(c.astype(ref.dtype), ref), f"{name}: {what}: accepted, lowered, and wrong"
            outcomes["exact"] += 1
    assert outcomes["verify"] > 0 and outcomes["lower"] > 0 and outcomes["exact"] > 0, outcomes


def test_a_program_saved_before_page_layouts_loads_laid_out_and_verified():
    """Version 1 documents (no layouts, no tile orders) are read and laid out as the tile pass lays them out now."""

    for prec in ("int8", "bf16"):
        p = spatialc.build(spatialc.gemm(48, 32, 64, prec), "sm_90")
        doc = json.loads(spatialc.to_json(p))
        assert doc["version"] == serde.VERSION
        doc["version"] = 1
        for b in doc["program"]["buffers"]:
            b["kind"].pop("layout", None)
        for t in doc["program"]["tensors"]:
            t.pop("order", None)
        old = spatialc.from_json(json.dumps(doc))
        assert old == p and old.verified
        assert dict(spatialc.lower(old).budget.layouts)["B_ring"] == ("col" if prec == "int8" else "swizzled")


def test_a_grouped_launch_without_its_grid_is_one_launch_error():
    from spatialc.runtime.tilize import LaunchError

    art = spatialc.lower(spatialc.build(spatialc.gemm(1024, 1024, 256, "fp16"), "sm_90", sites=8))
    assert art.launch.placement == "grouped" and art.launch.band > 0
    broken = {"kernel_name": "k", "grid": 8, "block": 256, "dyn_smem": 0, "items": 128, "placement": "grouped"}
    with pytest.raises(LaunchError, match="grouped placement needs the item grid"):
        spatialc.work_list(broken, 8)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="nvcc or cuobjdump is not installed")
def test_the_cli_counts_the_main_loop_of_the_kernel_it_prints(capsys):
    from spatialc.cli import main

    assert (
        main(
            [
                "gemm",
                "128",
                "128",
                "2048",
                "--precision",
                "int8",
                "--block",
                "2,4,2",
                "--depth",
                "3",
                "--split-k",
                "1",
                "--sass",
            ]
        )
        == 0
    )
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  sass")]
    assert "IMMA.16832" in line and "0 generic loads" in line and "spills 0 B" in line
    steps = re.search(r"(one|\d+) K steps? a trip", line).group(1)  # nvcc may unroll the K loop
    steps = 1 if steps == "one" else int(steps)
    assert f" {steps} block barrier" in line  # one a K step


def test_the_cli_says_in_one_line_what_sass_needs(capsys, monkeypatch):
    from spatialc.cli import main
    from spatialc.runtime import sass

    monkeypatch.setattr(sass, "find_cuobjdump", lambda: None)
    assert main(["gemm", "64", "64", "64", "--sass"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sass needs nvcc and cuobjdump" in err[0] and "Traceback" not in err[0]

"""The sm_90a form (lower/cuda/sm90a/kernel.py): a TMA producer and wgmma consumers, run through the host
emulation's sm_90a layer (runtime/emu/emu_hopper.h) against the interpreter, with planted faults the emulation
must catch, the static refusals before printing, and nvcc / SASS checks where the toolchain is present."""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import spatialc
import spatialc.runtime.launch as L
from spatialc.errors import PlanError
from spatialc.ir.nodes import panel_bytes, panel_offset
from spatialc.lower.cuda.sm90a import kernel as sm90a_kernel
from spatialc.lower.cuda.sm90a import plan as sm90a_plan
from spatialc.lower.errors import TooBig, Unsupported
from spatialc.passes import pipeline
from spatialc.passes.footprint import in_panels
from spatialc.runtime import nvcc as N
from spatialc.runtime.emulate import EmulationError
from spatialc.runtime.launch import LaunchError

from ..stand_in import MapStandIn, StandInDevice, product

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
EXACT = "exact"


def inputs(prec: str, m: int, n: int, k: int, seed: int = 5) -> dict[str, np.ndarray]:
    """Small whole numbers: every product and sum is exact in float32, so emulation and interpreter agree exactly."""
    rng = np.random.default_rng(seed)
    if prec == "int8":
        return {
            "A": rng.integers(-128, 128, (m, k)).astype(np.int8),
            "B": rng.integers(-128, 128, (k, n)).astype(np.int8),
        }
    return {"A": rng.integers(-4, 5, (m, k)).astype(np.float32), "B": rng.integers(-4, 5, (k, n)).astype(np.float32)}


# ---- the plan and the form ---------------------------------------------------------------------------------------


def test_sm90a_is_a_target_that_plans_for_wgmma_items():
    t = spatialc.target("sm_90a")
    assert t.hopper and t.units == 132 and t.smem_per_site_max == 227 * 1024
    p = spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16"), "sm_90a")
    plan = p.plans[0]
    # Hopper's plan: 128 × 256 items (two warpgroups of 64 rows, one m64n256 wgmma each), K steps of 64, 4 stages.
    assert (plan.item_tiles, plan.block.ibw, plan.depth) == ((8, 16), 4, 4)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and art.budget.threads == 384 and art.budget.blocks_per_sm == 1
    assert art.budget.total_bytes <= t.smem_per_site_max  # the stages and the output's staging (no output ring)
    assert art.budget.rings == (("A_ring", 4 * 128 * 64 * 2), ("B_ring", 4 * 64 * 256 * 2))
    assert art.general is None and art.notes == ()  # no general form rides along: it reads tiles, not panels
    # A's page is one 128-byte swizzled panel of 128 rows; B's 64 rows of 256 columns are four, a box each; then
    # the store's map: a tile a box.
    maps = [(m.box, m.swizzle) for m in art.launch.tensor_maps]
    # C's: a consumer warpgroup's 64 rows of 128 bytes (32 float32 columns), swizzled as wide (sm90a/staging.py).
    assert maps == [((128, 64), 128), ((64, 64), 128), ((64, 32), 128)]
    # A, B and C stored as matrices, every map 2-D over one (C's stored a tile a box).
    assert [q.order for q in art.launch.params] == ["rows", "rows", "rows"]
    assert art.kernel_cu.count("spatialc_tma_load_2d((char*)") == 5


@pytest.mark.parametrize(
    ("shape", "prec", "kw"),
    [((4096, 4096, 4096), "bf16", {}), ((256, 256, 256), "int8", {}), ((256, 256, 256), "bf16", {"multicast": (2, 1)})],
)
def test_the_sm90a_budget_names_its_rings_apart_from_the_blocks_shared_memory(shape, prec, kw, tmp_path):
    """The rings, barriers, output staging and alignment gaps add up to the dynamic block the launch asks for; the
    rings' figure is `ring_bytes`, and budget.json has no `smem_bytes` a reader could take for the block's."""
    from spatialc.lower.cuda.common.host import write_artifact

    art = spatialc.lower(spatialc.build(spatialc.gemm(*shape, prec), "sm_90a", **kw))
    bud = art.budget
    assert bud.form == "sm90a" and bud.ring_bytes == sum(size for _, size in bud.rings)
    parts = bud.ring_bytes + bud.barrier_bytes + bud.staging_bytes + bud.padding_bytes
    assert parts == bud.dyn_bytes == bud.total_bytes == art.launch.dyn_smem and bud.static_bytes == 0
    assert bud.barrier_bytes > 0 and 0 <= bud.padding_bytes < 1024 * (len(bud.rings) + 1)
    write_artifact(art, tmp_path)
    doc = json.loads((tmp_path / "budget.json").read_text())
    assert "smem_bytes" not in doc and doc["ring_bytes"] == bud.ring_bytes and doc["total_bytes"] == parts
    assert doc["padding_bytes"] == bud.padding_bytes


def test_sm90_keeps_its_persistent_kernel_and_other_targets_refuse_the_form():
    p = spatialc.build(spatialc.gemm(256, 256, 256, "bf16"), "sm_90")
    assert spatialc.lower(p).budget.form == "persistent"
    with pytest.raises(Unsupported, match="sm_90a only"):
        spatialc.lower(p, form="sm90a")


def test_what_the_wgmma_layout_does_not_take_falls_back_with_a_note():
    # Forced 2-row blocks: not a warpgroup's 64 rows, so auto plans and prints the persistent kernel.
    p = spatialc.build(spatialc.gemm(128, 128, 64, "fp16"), "sm_90a", block=(2, 4, 2))
    art = spatialc.lower(p)
    assert art.budget.form == "persistent"
    assert any("not the sm_90a form" in n and "holds 64 rows" in n for n in art.notes)
    with pytest.raises(Unsupported, match="a consumer warpgroup holds 64 rows and a block one or two"):
        spatialc.lower(p, form="sm90a")


def test_panels_are_the_sm90a_forms_alone_and_auto_plans_for_the_others_where_it_refuses():
    # Planned for sm_90a, the operand pages are swizzled panels (int8 B transposed), which only that form reads.
    p = spatialc.build(spatialc.gemm(200, 72, 100, "int8"), "sm_90a")
    layouts = {b.name: b.kind.layout.value for b in p.buffers if b.name in ("A_ring", "B_ring")}
    assert layouts == {"A_ring": "panels", "B_ring": "panels_t"}
    assert {t.name: t.order.value for t in p.tensors if t.name in "AB"} == {"A": "row", "B": "col"}  # B K-major
    with pytest.raises(Unsupported, match="swizzled panels, which only it reads.*form='persistent' or 'general'"):
        spatialc.lower(p, form="general")
    assert pipeline.sm90a_refusal(p, spatialc.target("sm_90a")) is None  # what it prints it is planned for


def test_a_plan_the_sm90a_form_refuses_is_made_again_for_the_others(monkeypatch):
    """Where the form refuses its own plan once made (a placement its clusters cannot take, say), build plans the
    program for the other forms; lower of a program in panels gives the form's own refusal, not another form's."""
    g = spatialc.gemm(300, 200, 100, "bf16")
    planned = spatialc.build(g, "sm_90a")
    refused = Unsupported("a planted refusal", "a test refuses it")

    def refuse(*_):
        raise refused

    monkeypatch.setattr(sm90a_kernel, "make_kernel", refuse)
    assert pipeline.sm90a_refusal(planned, spatialc.target("sm_90a")) == str(refused)
    with pytest.raises(Unsupported, match="a planted refusal"):
        spatialc.lower(planned)  # no other form reads its panels: the form's own reason
    auto = spatialc.build(g, "sm_90a")
    assert not in_panels(auto)
    art = spatialc.lower(auto)
    # (its note: why the form cannot print the plan made for the persistent kernel)
    assert art.budget.form == "persistent" and any(n.startswith("not the sm_90a form: ") for n in art.notes)


def test_a_replan_that_fails_too_says_the_sm90a_form_refused_first(monkeypatch):
    real = pipeline._build

    def build(*args, sm90a, **kw):
        if not sm90a:
            raise PlanError("no plan fits (planted)")
        return real(*args, sm90a=sm90a, **kw)

    def refuse(*_):
        raise Unsupported("a planted refusal", "a test refuses it")

    monkeypatch.setattr(pipeline, "_build", build)
    monkeypatch.setattr(sm90a_kernel, "make_kernel", refuse)
    said = r"no plan fits \(planted\) \(planned for the other forms because the sm_90a form refused its own plan: "
    with pytest.raises(PlanError, match=said + "cannot lower a planted refusal"):
        spatialc.build(spatialc.gemm(300, 200, 100, "bf16"), "sm_90a")


def test_panels_on_a_ring_the_copy_engine_does_not_fill_are_refused():
    doc = json.loads(spatialc.to_json(spatialc.build(spatialc.gemm(200, 72, 100, "bf16"), "sm_90a")))
    next(b for b in doc["program"]["buffers"] if b["name"] == "C_ring")["kind"]["layout"] = "panels"
    p = spatialc.from_json(json.dumps(doc))  # verify sees a row-major tile order, as C's
    with pytest.raises(Unsupported, match="C_ring's pages in panels layout: panels are operand pages TMA fills"):
        spatialc.lower(p)


def test_the_sm90a_plan_holds_an_activations_rings():
    # The fused store does not apply an activation: its output and epilogue rings stay, and the plan counts them.
    g = spatialc.gemm(1024, 2048, 256, "bf16", epilogue=[spatialc.activation("gelu_tanh")])
    p = spatialc.build(g, "sm_90a")
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and p.plan.item_tiles == (8, 4)  # 128 × 256 items would not hold them
    assert art.budget.total_bytes <= spatialc.target("sm_90a").smem_per_site_max
    with pytest.raises(PlanError, match="no plan with block=\\(8, 16, 4\\)"):
        spatialc.build(g, "sm_90a", form="sm90a", block=(8, 16, 4))


def test_a_version_5_document_built_for_sm90a_is_laid_out_in_panels_when_read():
    """Version 5 saved sm_90a programs with A's tiles by column (`swizzled_cols`, `row_cols`), which no form reads
    now: from_json lays them out again as the tile pass does for the form, and they verify and print in it."""
    for prec, a_then, b_then in (("bf16", "swizzled_cols", "swizzled"), ("int8", "row_cols", "col")):
        doc = json.loads(spatialc.to_json(spatialc.build(spatialc.gemm(200, 72, 100, prec), "sm_90a")))
        doc["version"] = 5
        rings = {b["name"]: b["kind"] for b in doc["program"]["buffers"]}
        rings["A_ring"]["layout"], rings["B_ring"]["layout"] = a_then, b_then
        p = spatialc.from_json(json.dumps(doc))
        layouts = {b.name: b.kind.layout for b in p.buffers if b.name in ("A_ring", "B_ring")}
        assert p.verified and all(layout.panels for layout in layouts.values()), layouts
        assert spatialc.lower(p).budget.form == "sm90a"


def test_a_panel_is_the_widest_swizzle_its_rows_take():
    assert [panel_bytes(n) for n in (16, 32, 64, 96, 128, 256, 384, 512)] == [None, 32, 64, 32, 128, 128, 128, 128]
    # 8 rows of one 128-byte panel: chunk c of row r lands at chunk c ^ r — a permutation of the page's bytes.
    where = [panel_offset(r, c, 8, 128) for r in range(8) for c in range(128)]
    assert sorted(where) == list(range(1024)) and panel_offset(3, 16, 8, 128) == 3 * 128 + (1 ^ 3) * 16
    # Rows of 256 bytes are two panels, the second a whole panel (rows × 128 bytes) on.
    assert panel_offset(0, 128, 16, 256) == 16 * 128 and panel_offset(1, 0, 16, 64) == 64  # 64-byte: rows 0, 1 kept
    assert panel_offset(2, 0, 16, 64) == 128 + 16  # rows 2 and 3 of a 64-byte panel swap their chunks 0 and 1
    with pytest.raises(ValueError, match="16 bytes"):
        panel_offset(0, 0, 8, 16)


def test_int8_k_steps_come_in_pairs():
    with pytest.raises(Unsupported, match="pairs of tiles"):
        sm90a_plan.check_plan(
            dataclasses.replace(
                spatialc.build(spatialc.gemm(128, 64, 64, "int8"), "sm_90a").plans[0],
                block=spatialc.ir.ops.BlockShape(8, 4, 1),
            ),
            spatialc.ir.ops.Precision.INT8,
        )


def test_static_checks_refuse_before_printing():
    p = spatialc.build(spatialc.gemm(256, 256, 256, "bf16"), "sm_90a", block=(8, 8, 4), depth=3)
    k = sm90a_kernel.make_kernel(p, spatialc.target("sm_90a"))
    t = spatialc.target("sm_90a")
    # Stage bytes against the block's shared memory.
    big = dataclasses.replace(k, base=dataclasses.replace(k.base, dyn_bytes=t.smem_per_site_max + 16))
    with pytest.raises(TooBig, match="fewer stages"):
        sm90a_kernel.check_resources(big, t)
    # A stage off its 1024-byte boundary.
    moved = dict(k.base.offsets, ring_0=512)
    with pytest.raises(Unsupported, match="1024 bytes"):
        sm90a_kernel.check_resources(dataclasses.replace(k, base=dataclasses.replace(k.base, offsets=moved)), t)
    # The setmaxnreg split over the register file (on a file that still gives each thread 40 to 232 at launch).
    small = dataclasses.replace(t, regs_per_unit=61440)
    with pytest.raises(TooBig, match="registers after setmaxnreg: needs 64512, has 61440"):
        sm90a_kernel.check_resources(k, small)
    # Registers at launch outside what setmaxnreg moves between (a file of 8K: 21 a thread).
    with pytest.raises(Unsupported, match="16 registers a thread at launch"):
        sm90a_kernel.check_resources(k, dataclasses.replace(t, regs_per_unit=8192))


def test_the_launcher_passes_each_tensor_map_after_the_work_list_encoded_over_its_buffer():
    art = spatialc.lower(spatialc.build(spatialc.gemm(200, 72, 100, "fp16"), "sm_90a", block=(8, 5, 4)))
    x = inputs("fp16", 200, 72, 100)
    dev = MapStandIn(art, product)  # the numpy GPU, which also encodes tensor maps: it keeps what it was asked for
    c = L.run_with(dev, art, x["A"], x["B"])
    np.testing.assert_allclose(c, x["A"] @ x["B"], rtol=1e-3)
    (kernel, grid, block, dyn, args) = dev.launches[0]
    assert block == 384 and [int(a[0]) for a in args[-3:]] == [1000, 1001, 1002]
    # Each map over the buffer of its own tensor (A, then B, then the output C the store writes), with the geometry
    # the host program prints.
    for (buffer, dims, strides, box, elem, swizzle), m in zip(dev.maps, art.launch.tensor_maps, strict=True):
        out = art.launch.params[m.tensor].role == "output"
        assert (elem, swizzle) == ((4, m.swizzle) if out else (2, m.swizzle)) and swizzle in (32, 64, 128)
        assert not out or (box, swizzle) == ((16, 64), 64)  # C's: 64 rows of one float32 tile (5 tiles: no pair)
        # (the output's buffer was encoded poisoned, before the kernel wrote it)
        assert buffer.shape == args[m.tensor].shape and (out or np.array_equal(buffer, args[m.tensor]))
        n = len(dims)
        text = f"const cuuint64_t dims[{n}] = {{{', '.join(map(str, dims))}}};"
        assert text in art.program_cu
        assert f"const cuuint32_t box[{n}] = {{{', '.join(map(str, box))}}};" in art.program_cu
        assert f"const cuuint64_t strides[{n - 1}] = {{{', '.join(map(str, strides))}}};" in art.program_cu
    (rows_t, cols_t), (_, a_dims, a_strides, *_) = art.launch.params[0].tiles, dev.maps[0]
    assert (a_dims, a_strides) == ((cols_t * 16, rows_t * 16), (cols_t * 16 * 2,))  # A row-major: columns inner
    assert np.array_equal(args[0].reshape(rows_t * 16, cols_t * 16)[:200, :100], x["A"].astype(np.float16))


def test_the_launcher_refuses_what_cannot_take_an_sm90a_kernel():
    art = spatialc.lower(spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90a"))
    a = b = np.ones((64, 64), dtype=np.float32)
    with pytest.raises(LaunchError, match="cannot encode the TMA tensor maps"):
        L.run_with(StandInDevice(art, product), art, a, b)
    older = MapStandIn(art, product, arch="sm_80")
    with pytest.raises(LaunchError, match="printed for sm_90a.*this device is sm_80"):
        L.run_with(older, art, a, b)


class FakeDriver:
    """Stands in for libcuda's cuTensorMapEncodeTiled: checks the arguments as ctypes passes them, fills the map."""

    def __init__(self, code=0):
        self.code = code
        self.seen = None

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, dims, strides, box, unit, inter, swz, l2, oob):
        self.seen = (dtype.value, rank.value, address.value, list(dims), list(strides), list(box), list(unit))
        self.seen += (inter.value, swz.value, l2.value, oob.value)
        assert out.value % 64 == 0  # the driver wants the map on 64 bytes
        ctypes.memmove(out.value, bytes(range(128)), 128)
        return self.code


def test_tensor_maps_are_encoded_through_the_driver_and_passed_as_128_bytes():
    drv = FakeDriver()
    m = L.encode_tensor_map(drv, 4096, (16, 16, 7, 3), (32, 512, 3584), (16, 16, 4, 8), 2, 32)
    assert m.dtype.itemsize == 128 and m.tobytes() == bytes(range(128))
    assert drv.seen == (1, 4, 4096, [16, 16, 7, 3], [32, 512, 3584], [16, 16, 4, 8], [1, 1, 1, 1], 0, 1, 2, 0)
    L.encode_tensor_map(drv, 4096, (16, 16, 7, 3), (16, 256, 1792), (16, 16, 4, 8), 1, 0)
    assert drv.seen[0] == 0 and drv.seen[8] == 0  # uint8, no swizzle
    L.encode_tensor_map(drv, 4096, (112, 48), (224,), (64, 16), 2, 128)  # a 2-D panel map, 128-byte swizzle
    assert drv.seen[1:6] == (2, 4096, [112, 48], [224], [64, 16]) and drv.seen[8] == 3
    with pytest.raises(LaunchError, match="CUresult 1"):
        L.encode_tensor_map(FakeDriver(code=1), 4096, (16, 16, 7, 3), (32, 512, 3584), (16, 16, 4, 8), 2, 32)


def test_host_program_encodes_each_tensor_map_through_the_driver_entry_point():
    art = spatialc.lower(spatialc.build(spatialc.gemm(200, 72, 100, "fp16"), "sm_90a", block=(8, 5, 4)))
    text = art.program_cu
    assert 'cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled"' in text
    assert text.count("encode_tiled(&tmap_") == len(art.launch.tensor_maps) == 3  # A, B; C for the TMA store
    assert "CU_TENSOR_MAP_SWIZZLE_128B" in text and "CU_TENSOR_MAP_DATA_TYPE_FLOAT16" in text
    assert "spatialc_store_matrix(h0, 200, 100, 128, x0, false);" in text  # A padded to whole K steps, not tiled
    assert "CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, d2," in text  # C's map over its float32 output
    assert re.search(r"spatialc_hopper<<<GRID, 384, \d+>>>\(d0, d1, d2, d_work, tmap_0, tmap_1, tmap_2\);", text)


# ---- emulation against the interpreter --------------------------------------------------------------------------


def exact_both_ways(p, art, x) -> None:
    """The emulated kernel equals the interpreter bit for bit, its asynchronous results retired late and early."""
    want = spatialc.evaluate(p, x)
    for mode in ("late", "early"):
        got = spatialc.emulate(art, x, mode=mode, timeout=120)
        assert got.dtype == want.dtype and np.array_equal(got, want), mode


CASES = [
    ("bf16", (200, 136, 100), {}),  # the planner's own plan, odd sizes everywhere
    ("fp16", (130, 300, 70), {}),
    ("int8", (129, 250, 190), {}),
    ("bf16", (300, 260, 200), {"block": (8, 8, 4), "depth": 3}),  # the 4096³ plan: 224 KiB of stages and rings
    ("int8", (150, 100, 300), {"block": (8, 4, 4), "depth": 4}),
    ("int8", (70, 40, 96), {"block": (8, 2, 2), "depth": 1}),  # one-page rings: no group kept in flight
    ("int8", (140, 70, 300), {"block": (8, 8, 8), "depth": 2}),  # K steps of 128 bytes: A and Bᵀ in 128-byte panels
    ("fp16", (100, 200, 300), {"block": (8, 4, 8), "depth": 2}),  # K steps of 256 bytes: A's rows two panels
    ("fp16", (1, 1, 1), {}),
]


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(("prec", "shape", "kw"), CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}" for c in CASES])
def test_emulated_sm90a_kernel_equals_the_interpreter(prec, shape, kw):
    p = spatialc.build(spatialc.gemm(*shape, prec), "sm_90a", **kw)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a"
    exact_both_ways(p, art, inputs(prec, *shape))


@needs_gxx
@pytest.mark.emulation
def test_emulated_sm90a_epilogue_and_several_items_per_site():
    from spatialc.frontend import bias, relu

    g = spatialc.gemm(256, 96, 64, "bf16", epilogue=[bias(), relu()])
    p = spatialc.build(g, "sm_90a", sites=1)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a"
    x = inputs("bf16", 256, 96, 64) | {"bias": np.arange(96, dtype=np.float32) - 40}
    assert np.array_equal(spatialc.emulate(art, x, timeout=120), spatialc.evaluate(p, x))


# ---- planted faults ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulty():
    """bf16 150×100×120 in 8×2-tile items, K steps of 2 tiles over depth-2 rings: every slot is refilled."""
    p = spatialc.build(spatialc.gemm(150, 100, 120, "bf16"), "sm_90a", block=(8, 2, 2), depth=2)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and p.plans[0].k_steps > 2
    return p, art, inputs("bf16", 150, 100, 120)


def outcome(case, text: str, mode: str = "late") -> str:
    p, art, x = case
    try:
        got = spatialc.emulate(dataclasses.replace(art, program_cu=text), x, mode=mode, timeout=60)
    except EmulationError as e:
        return f"{e.kind}: {e}"
    return EXACT if np.array_equal(got, spatialc.evaluate(p, x)) else "mismatch"


def replaced(text: str, old: str, new: str, count: int = 1) -> str:
    assert text.count(old) >= count, old
    return text.replace(old, new, count)


@needs_gxx
@pytest.mark.emulation
def test_unplanted_kernel_is_exact(faulty):
    assert outcome(faulty, faulty[1].program_cu) == EXACT


@needs_gxx
@pytest.mark.emulation
def test_a_prefetch_of_what_is_not_a_tensor_map_is_refused(faulty):
    text = faulty[1].program_cu
    assert text.count("spatialc_prefetch_tensormap(&spatialc_tmap_") == len(faulty[1].launch.tensor_maps)
    planted = replaced(
        text, "spatialc_prefetch_tensormap(&spatialc_tmap_0);", "spatialc_prefetch_tensormap((const CUtensorMap*)t0);"
    )
    got = outcome(faulty, planted)
    assert got.startswith("fault") and "spatialc_prefetch_tensormap at line" in got and "not a tensor map" in got, got


def expecting(text: str, ring: int, more: int) -> str:
    """`text` with ring `ring`'s expect_tx announcing `more` bytes more (fewer, when negative) than a page has."""
    page = re.search(rf"spatialc_mbar_arrive_expect_tx\(&full_{ring}\[[^\]]*\], (\d+)u\);", text)
    assert page
    return text.replace(f", {page[1]}u);", f", {int(page[1]) + more}u);", 1)


@needs_gxx
@pytest.mark.emulation
def test_expect_tx_more_than_loaded_hangs_and_the_report_says_how_many_bytes(faulty):
    got = outcome(faulty, expecting(faulty[1].program_cu, 0, 16))
    assert got.startswith("deadlock") and "16 more bytes of TMA loads" in got, got


@needs_gxx
@pytest.mark.emulation
def test_expect_tx_fewer_than_loaded_is_refused(faulty):
    got = outcome(faulty, expecting(faulty[1].program_cu, 1, -512))
    assert got.startswith("fault") and "512 bytes of TMA loads more than its expect_tx" in got, got


@needs_gxx
@pytest.mark.emulation
def test_stage_released_before_wait_group_is_a_race(faulty):
    # Two groups left in flight instead of one: the previous K step's stages go back to the copy engine while the
    # MMA that reads them may still be running.
    text = faulty[1].program_cu
    assert text.count("spatialc_wgmma_wait<1>();") == 1
    text = replaced(text, "spatialc_wgmma_wait<1>();", "spatialc_wgmma_wait<2>();")
    late = outcome(faulty, text, "late")
    assert late.startswith("race") and "wgmma operand read" in late, late
    # Early mode runs each wgmma when issued: it cannot see this one (documented in emu_hopper.h).
    assert outcome(faulty, text, "early") == EXACT


@needs_gxx
@pytest.mark.emulation
def test_a_consumer_warp_frees_a_stage_with_one_arrival(faulty):
    """One arrival a consumer warp (EMPTY_COUNT 8), by lane 0 once the warp is past its wait_group. Were every lane
    to arrive, one warp's 32 arrivals would complete four phases: the copy engine refills the stage under other
    warps' wgmma (a race), or the producer waits for a phase the counts ran past (a hang) — whichever comes first."""
    text = faulty[1].program_cu
    assert "#define EMPTY_COUNT_0 8" in text and "#define EMPTY_COUNT_1 8" in text
    guard = "if ((threadIdx.x & 31) == 0) {  // one arrival a warp (EMPTY_COUNT: the consumer warps)"
    assert text.count(guard) >= 2
    late = outcome(faulty, text.replace(guard, "{"), "late")
    assert ("wgmma operand read" in late and late.startswith("race")) or (
        late.startswith("deadlock") and "empty_" in late
    ), late


@needs_gxx
@pytest.mark.emulation
def test_unpipelined_k_loop_releases_after_its_group_retired():
    # One-page rings: no step can stay in flight, so each release waits for its own group (wait_group 0).
    p = spatialc.build(spatialc.gemm(150, 100, 120, "bf16"), "sm_90a", block=(8, 2, 2), depth=1)
    art = spatialc.lower(p)
    assert "spatialc_wgmma_wait<1>" not in art.program_cu
    assert "spatialc_wgmma_wait<0>();  // the K step's wgmma have read the stage" in art.program_cu
    x = inputs("bf16", 150, 100, 120)
    assert np.array_equal(spatialc.emulate(art, x, timeout=60), spatialc.evaluate(p, x))
    # Without the wait, late mode never retires the groups in the loop: the accumulators miss the sums, or — the
    # lanes no longer meeting at each step's wait, their stages freed by lane 0 — a lane still waits for a page
    # that never comes while its warp meets at the next wait.
    text = replaced(art.program_cu, "spatialc_wgmma_wait<0>();  // the K step's wgmma have read the stage", "")
    got = outcome((p, art, x), text, "late")
    assert got == "mismatch" or (got.startswith("deadlock") and "waits on full_" in got), got


@needs_gxx
@pytest.mark.emulation
def test_missing_proxy_fence_after_barrier_init_is_a_race(faulty):
    text = replaced(faulty[1].program_cu, "spatialc_fence_proxy_async();", "")
    for mode in ("late", "early"):
        got = outcome(faulty, text, mode)
        assert got.startswith("race") and "fence.proxy.async" in got, got


@needs_gxx
@pytest.mark.emulation
def test_consumer_reading_a_stage_it_did_not_wait_for_is_a_race(faulty):
    # The wait on B's full barrier dropped, its counter kept: the MMA may read the page before the copy engine
    # wrote it, or after without the phase ordering them — a race either way, on every run.
    text = faulty[1].program_cu
    wait = "spatialc_mbar_wait(&full_1[wt_1 % DEPTH_1], (wt_1 / DEPTH_1) & 1); ++wt_1;"
    assert text.count(wait) == 1
    for mode in ("late", "early"):
        got = outcome(faulty, text.replace(wait, "++wt_1;"), mode)
        assert got.startswith("race") and "TMA load" in got, got


@needs_gxx
@pytest.mark.emulation
def test_wrong_descriptor_offset_and_wrong_swizzle_give_wrong_results(faulty):
    text = faulty[1].program_cu  # 64-byte panels: A's rows and B's hold 32 bf16
    assert outcome(faulty, replaced(text, "2048u, 512u, 2u)", "2048u, 256u, 2u)")) == "mismatch"  # B's SBO
    assert outcome(faulty, replaced(text, "16u, 512u, 2u)", "16u, 512u, 3u)")) == "mismatch"  # A read 32B-swizzled
    swz = re.search(r"encode_tiled\(&tmap_0, [^;]*CU_TENSOR_MAP_SWIZZLE_64B", text)
    assert swz
    unswizzled = text.replace(swz[0], swz[0].replace("SWIZZLE_64B", "SWIZZLE_NONE"), 1)
    assert outcome(faulty, unswizzled) == "mismatch"  # A lands unswizzled, wgmma reads it swizzled


@needs_gxx
@pytest.mark.emulation
def test_128_byte_panels_and_the_leading_offset_between_them_are_what_wgmma_reads():
    """bf16 items 128 columns wide: A's rows and each of B's two panels are 128 bytes (64 elements)."""
    p = spatialc.build(spatialc.gemm(130, 140, 70, "bf16"), "sm_90a", block=(8, 8, 4), depth=2)
    case = (p, spatialc.lower(p), inputs("bf16", 130, 140, 70))
    text = case[1].program_cu
    assert "+ 8192, &spatialc_tmap_1, (at % 16) * 16 + 64," in text  # B's second panel: its own box, 8 KiB on
    assert outcome(case, text) == EXACT
    assert outcome(case, replaced(text, "8192u, 1024u, 1u)", "4096u, 1024u, 1u)")) == "mismatch"  # B's LBO
    assert outcome(case, replaced(text, "16u, 1024u, 1u)", "16u, 1024u, 2u)")) == "mismatch"  # A read 64B-swizzled
    one_box = re.sub(r"spatialc_tma_load_2d\([^;]*\+ 8192,[^;]*;", "", text)
    assert one_box != text and outcome(case, one_box).startswith("deadlock")  # a panel never loaded: bytes missing


def test_a_forced_plan_the_form_cannot_hold_is_refused_with_the_forms_reason():
    """Not "needs 0 bytes of shared memory": the wgmma layout's reason, or the bytes the plan would need."""
    g = spatialc.gemm(512, 512, 512, "bf16")
    with pytest.raises(PlanError, match=r"takes no plan of items of 48 rows: .* use blocks of 4 or 8 tile rows"):
        spatialc.build(g, "sm_90a", form="sm90a", block=(3, 4, 2))
    with pytest.raises(PlanError, match=r"takes no plan of sub-blocks \(2, 1\): an sm_90a item is one block"):
        spatialc.build(g, "sm_90a", form="sm90a", sub_blocks=(2, 1))
    with pytest.raises(PlanError, match=r"int8 K steps of 1 tiles"):
        spatialc.build(spatialc.gemm(512, 512, 512, "int8"), "sm_90a", form="sm90a", block=(8, 4, 1))
    with pytest.raises(PlanError, match=r"depth=100 fits sm_90a: it needs (\d+) bytes") as e:
        spatialc.build(g, "sm_90a", depth=100)
    assert int(re.search(r"needs (\d+) bytes", str(e.value))[1]) > 232448


# ---- nvcc and SASS -----------------------------------------------------------------------------------------------

NVCC = shutil.which("nvcc")


SM90A_NVCC = ["-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-Werror", "all-warnings"]


def sm90a_cubin(text: str, tmp_path) -> tuple[Path, str]:
    """`text` compiled for sm_90a with -Werror and ptxas -v: (its cubin, nvcc's stderr). A compile that succeeded is
    kept in the compile cache (`tests-sm90a` under runtime/cache.py's root, named by nvcc's version, the flags and
    the text), so a kernel two tests compile — this file's 4096³ int8 kernel and test_sm90a_staging.py's — is
    compiled once."""
    from spatialc.runtime.cache import cache_dir

    key = hashlib.sha256("\n".join([N.nvcc_version(NVCC), *SM90A_NVCC, text]).encode()).hexdigest()[:32]
    kept = cache_dir("tests-sm90a", create=True) / key
    if (kept / "k.cubin").is_file():
        return kept / "k.cubin", (kept / "stderr.txt").read_text()
    src, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    src.write_text(text)
    done = subprocess.run(
        [NVCC, *SM90A_NVCC, "-Xptxas", "-v", "-o", str(cubin), str(src)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    made = Path(tempfile.mkdtemp(dir=kept.parent))
    (made / "stderr.txt").write_text(done.stderr)
    shutil.copy(cubin, made / "k.cubin")
    try:
        made.rename(kept)
    except OSError:  # another worker kept the same text first
        shutil.rmtree(made, ignore_errors=True)
    return cubin, done.stderr


def compiled_clean(art, tmp_path):
    """The SASS instructions of `art`'s kernel, compiled for sm_90a with -Werror: no spills, no ptxas note of the
    C75xx family — setmaxnreg ignored (C7508), wgmma serialised (C7510–C7520), a warpgroup.arrive ptxas had to add
    (C7519) — (skips where cuobjdump is missing)."""
    from spatialc.runtime.sass import disassemble, find_cuobjdump

    cubin, log = sm90a_cubin(art.kernel_cu, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in log
    assert not re.findall(r"\(C75\d\d\)", log), log  # ptxas fixing or serialising the wgmma
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return disassemble(cubin, tool).instrs


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("prec", ["bf16", "fp16", "int8"])
def test_sm90a_kernel_compiles_clean_and_its_sass_has_the_hopper_instructions(prec, tmp_path):
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, prec), "sm_90a"))
    instrs = compiled_clean(art, tmp_path)
    ops = Counter(i.base for i in instrs)
    mma = "IGMMA" if prec == "int8" else "HGMMA"
    assert ops[mma] >= 1 and ops["UTMALDG"] >= 2 and ops["SYNCS"] >= 1 and ops["USETMAXREG"] == 2, ops
    # Each operand's arrival and expect_tx in one instruction: no expect_tx of its own (arrive 0, bytes: A0TR).
    syncs = Counter(i.op for i in instrs if i.base == "SYNCS")
    assert syncs["SYNCS.ARRIVE.TRANS64"] >= 2 and not any(".A0TR" in op for op in syncs), syncs
    assert ops["HMMA"] == ops["IMMA"] == 0  # no mma.sync fallback
    assert ops["UTMACCTL"] == len(art.launch.tensor_maps) == 3  # each map's descriptor prefetched (A, B, C)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("prec", ["int8", "bf16"])
def test_one_k_step_kernels_compile_without_a_warpgroup_arrive_ptxas_adds(prec, tmp_path):
    """An item of one K step: nvcc sank the accumulators' zeroing past wgmma.fence (ptxas then added a
    warpgroup.arrive, C7519) until the kernel pinned them there (`spatialc_acc_fence`)."""
    art = spatialc.lower(spatialc.build(spatialc.gemm(150, 200, 64, prec), "sm_90a"))
    assert art.budget.form == "sm90a" and "for (int k = 0; k < 1; ++k)" in art.kernel_cu
    ops = Counter(i.base for i in compiled_clean(art, tmp_path))
    assert ops["IGMMA" if prec == "int8" else "HGMMA"] >= 1, ops


# ---- the emulated copy engine on its own -------------------------------------------------------------------------

TMA_PROBE = r"""
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cstdio>
#include <vector>
extern "C" __global__ void probe(unsigned char* out, const __grid_constant__ CUtensorMap map)
{
    extern __shared__ __align__(1024) char spatialc_dyn_smem[];
    SPATIALC_DYNAMIC_RING(unsigned char, page, spatialc_dyn_smem, 0, 1, 2048);
    SPATIALC_DYNAMIC_RING(unsigned long long, bar, spatialc_dyn_smem, 2048, 1, 1);
    if (threadIdx.x == 0) {
        spatialc_mbar_init(bar, 1);
        spatialc_fence_proxy_async();
    }
    __syncthreads();  // the barrier initialised before anyone waits on it
    if (threadIdx.x == 0) {
        spatialc_mbar_expect_tx(bar, 16 * WIDTH);
        spatialc_tma_load_2d(page, &map, 208 - WIDTH / 2, 16, bar);  // 16 rows from row 16, half past the last column
        spatialc_mbar_arrive(bar);
    }
    spatialc_mbar_wait(bar, 0);
    for (int i = threadIdx.x; i < 16 * WIDTH; i += 32) out[i] = page[i];
}
int main()
{
    std::vector<unsigned char> h(24 * 208);  // a 24 x 208 byte matrix, row-major
    for (size_t i = 0; i < h.size(); ++i) h[i] = (unsigned char)(1 + i % 251);
    unsigned char *src = nullptr, *out = nullptr;
    cudaMalloc(&src, h.size());
    cudaMalloc(&out, 16 * WIDTH);
    cudaMemcpy(src, h.data(), h.size(), cudaMemcpyHostToDevice);
    PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    cudaDriverEntryPointQueryResult found;
    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &found);
    const cuuint64_t dims[2] = {208, 24};
    const cuuint64_t strides[1] = {208};
    const cuuint32_t box[2] = {WIDTH, 16}, unit[2] = {1, 1};
    CUtensorMap map;
    if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, src, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
               SWIZZLE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return 3;
    probe<<<1, 32, 4096>>>(out, map);
    cudaDeviceSynchronize();
    std::vector<unsigned char> y(16 * WIDTH);
    cudaMemcpy(y.data(), out, y.size(), cudaMemcpyDeviceToHost);
    for (unsigned char v : y) printf("%d\n", v);
    return 0;
}
"""


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("width", [0, 32, 64, 128])
def test_emulated_tma_box_fills_past_the_tensor_with_zeros_and_lands_as_a_swizzled_panel(width):
    """A 2-D box of 16 rows × `width` bytes (0: 32 bytes, unswizzled) lands as `PageLayout.panels` says a page of
    one panel lies: row r's byte c at `panel_offset(r, c, ...)`; past the matrix's rows and columns, zeros."""
    from spatialc.ir.nodes import panel_offset
    from spatialc.runtime.emulate import emulate_source

    wide = width or 32
    swizzle = f"CU_TENSOR_MAP_SWIZZLE_{width}B" if width else "CU_TENSOR_MAP_SWIZZLE_NONE"
    text = TMA_PROBE.replace("SWIZZLE,", f"{swizzle},").replace("WIDTH", str(wide))
    got = emulate_source(text, {}, (16 * wide,), np.int64)
    src = (1 + np.arange(24 * 208) % 251).reshape(24, 208)
    box = np.zeros((16, wide), dtype=np.int64)
    box[:8, : wide // 2] = src[16:24, 208 - wide // 2 :]  # rows 16–23 and the columns up to 208: the rest is past
    want = np.zeros(16 * wide, dtype=np.int64)
    for r in range(16):
        for c in range(wide):
            want[panel_offset(r, c, 16, wide) if width else r * wide + c] = box[r, c]
    assert np.array_equal(got, want)
    if width:  # and the swizzle is not the identity: something moved
        assert not np.array_equal(got, box.reshape(-1))


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_launcher_compiles_an_sm90a_kernel_for_the_architecture_specific_target(tmp_path):
    art = spatialc.lower(spatialc.build(spatialc.gemm(256, 256, 256, "int8"), "sm_90a"))
    cubin = N.compile_cubin(art.kernel_cu, "sm_90a", cache=tmp_path)
    ptxas = N.kernel_ptxas(cubin, "spatialc_hopper")
    assert cubin.stat().st_size > 0 and ptxas is not None and ptxas.spill_stores == 0


@needs_gxx
@pytest.mark.emulation
def test_an_epilogue_the_fused_store_cannot_apply_keeps_its_rings_and_the_writer():
    from spatialc.frontend import activation, bias

    g = spatialc.gemm(130, 64, 64, "bf16", epilogue=[bias(), activation("gelu_tanh")])
    p = spatialc.build(g, "sm_90a")
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and "C_ring" in dict(art.budget.rings)  # page to page, as the general form
    assert "fused output" not in art.kernel_cu
    fused = spatialc.lower(spatialc.build(spatialc.gemm(130, 64, 64, "bf16", epilogue=[bias()]), "sm_90a"))
    assert "C_ring" not in dict(fused.budget.rings) and "(fused output: no ring)" in fused.kernel_cu
    x = inputs("bf16", 130, 64, 64) | {"bias": np.arange(64, dtype=np.float32) / 8 - 4}
    np.testing.assert_allclose(spatialc.emulate(art, x, timeout=120), spatialc.evaluate(p, x), rtol=1e-6, atol=1e-6)


# ---- holes an adversarial review found, closed ---------------------------------------------------------------------


@needs_gxx
@pytest.mark.emulation
def test_a_tma_write_is_ordered_only_by_its_own_barrier(faulty):
    # A's full barrier no longer waited for (its counter kept): B's barrier, which the producer arrives on after
    # issuing A's load, says nothing of A's bytes — the copy engine's write is its own, published only by full_0.
    text = faulty[1].program_cu
    wait = "spatialc_mbar_wait(&full_0[wt_0 % DEPTH_0], (wt_0 / DEPTH_0) & 1); ++wt_0;"
    got = outcome(faulty, replaced(text, wait, "++wt_0;"))
    assert got.startswith("race") and "TMA load landing (the copy engine)" in got, got
    # The producer's arrival made before its expect_tx instead of with it: the phase completes with no bytes,
    # before the load is issued.
    fused = re.search(r"spatialc_mbar_arrive_expect_tx\((&full_0\[[^\]]*\]), (\d+)u\);", text)
    assert fused
    apart = f"spatialc_mbar_arrive({fused[1]}); spatialc_mbar_expect_tx({fused[1]}, {fused[2]}u);"
    assert outcome(faulty, replaced(text, fused[0], apart)) != EXACT


@needs_gxx
@pytest.mark.emulation
def test_the_producers_arrival_goes_with_its_expect_tx(faulty):
    text = faulty[1].program_cu
    fused = re.search(r"spatialc_mbar_arrive_expect_tx\((&full_1\[[^\]]*\]), (\d+)u\);", text)
    assert fused and "++psh_1;  // op:Push (its arrival went with the expect_tx above)" in text
    # The bytes announced without the arrival: the phase waits for the one arrival its count says, forever.
    got = outcome(faulty, replaced(text, fused[0], f"spatialc_mbar_expect_tx({fused[1]}, {fused[2]}u);"))
    assert got.startswith("deadlock") and "has 0 of 1 arrivals" in got, got
    # The two made apart, the arrival after the loads as a Push of its own would: the same kernel.
    push = "++psh_1;  // op:Push (its arrival went with the expect_tx above)"
    arrive = "spatialc_mbar_arrive(&full_1[psh_1 % DEPTH_1]); ++psh_1;"
    apart = replaced(replaced(text, fused[0], f"spatialc_mbar_expect_tx({fused[1]}, {fused[2]}u);"), push, arrive)
    assert outcome(faulty, apart) == EXACT


@needs_gxx
@pytest.mark.emulation
def test_a_wgmma_after_ordinary_accumulator_writes_needs_the_fence(faulty):
    got = outcome(faulty, replaced(faulty[1].program_cu, "spatialc_wgmma_fence();", ""))
    assert got.startswith("fault") and "no spatialc_wgmma_fence() since" in got, got


@needs_gxx
@pytest.mark.emulation
def test_accumulators_never_zeroed_hold_garbage(faulty):
    got = outcome(faulty, replaced(faulty[1].program_cu, "spatialc_acc_zero(accf[q]);", ""))
    assert got == "mismatch", got


@needs_gxx
@pytest.mark.emulation
def test_a_box_reading_past_its_allocation_is_refused(faulty):
    # A's buffer allocated (and filled) at half its size while its map still spans all of it: the boxes of the
    # second half read past the allocation.
    text = faulty[1].program_cu
    for call in ("cudaMalloc(&d0, x0.size() * sizeof", "cudaMemcpy(d0, x0.data(), x0.size() * sizeof"):
        text = replaced(text, call, call.replace("x0.size() * sizeof", "x0.size() / 2 * sizeof"))
    got = outcome(faulty, text)
    assert got.startswith("fault") and "reads past the end of the tensor's allocation" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_barrier_used_before_the_block_barrier_after_its_initialisation_is_a_race(faulty):
    text = faulty[1].program_cu
    sync = "    __syncthreads();\n    if (warp >= 8) {"
    assert text.count(sync) == 1
    got = outcome(faulty, text.replace(sync, "    if (warp >= 8) {", 1))
    # Used after thread 0 initialised it, with no block barrier between (a race), or before (never initialised).
    raced = got.startswith("race") and "with no __syncthreads() between them" in got
    assert raced or (got.startswith("fault") and "never initialised" in got), got


@needs_gxx
@pytest.mark.emulation
def test_setmaxnreg_faults_are_caught(faulty):
    text = faulty[1].program_cu
    assert text.count("spatialc_regs_inc<232>();") == 1 and text.count("spatialc_regs_dec<40>();") == 1
    # More than the register file once every warp has moved: the increase would wait forever.
    got = outcome(faulty, replaced(text, "spatialc_regs_inc<232>();", "spatialc_regs_inc<240>();"))
    assert got.startswith("deadlock") and "66560 registers" in got and "waits forever" in got, got
    # A decrease above what the launch gave (168 a thread at 384 threads).
    got = outcome(faulty, replaced(text, "spatialc_regs_dec<40>();", "spatialc_regs_dec<240>();"))
    assert got.startswith("fault") and "holds 168 registers a thread: undefined" in got, got
    # One warp of the producer warpgroup alone.
    got = outcome(faulty, replaced(text, "spatialc_regs_dec<40>();", "if (warp == 8) spatialc_regs_dec<40>();"))
    assert got.startswith("fault") and "of one warpgroup hold 40 and 168 registers" in got, got


# ---- the output through shared memory and a TMA store ------------------------------------------------------------


@pytest.fixture(scope="module")
def wide():
    """bf16 150×200×64 in 8×6-tile items, three on each of two sites: each consumer warp stages its row of 6 tiles
    (fp32) in three boxes of 2 — an odd count, so an item's first box is the other staging box than the last
    item's first."""
    p = spatialc.build(spatialc.gemm(150, 200, 64, "bf16"), "sm_90a", block=(8, 6, 2), depth=2, sites=2)
    art = spatialc.lower(p, epilogue="tiles")  # the first epilogue (test_sm90a_staging.py: the default one)
    assert art.launch.grid == 2 and art.launch.params[2].tiles == (16, 18)
    assert art.budget.form == "sm90a" and "#define OUT_CHUNK 2" in art.kernel_cu
    return p, art, inputs("bf16", 150, 200, 64)


def test_the_fused_store_goes_out_by_tma_store_from_each_warps_staging():
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16"), "sm_90a"), epilogue="tiles")
    text = art.kernel_cu
    assert "const int row = (int)(tile / 256) * 16, col = (int)(tile % 256) * 16;" in text
    assert "spatialc_tma_store_2d(&spatialc_tmap_2, col + c * 16, row, staged + c * 256);" in text
    assert art.launch.tensor_maps[-1].box == (16, 16) and art.launch.tensor_maps[-1].tensor == 2  # C, a tile a box
    assert "SPATIALC_PAGE_ST(staged + c * 256 + el, (OUT_T)accf[q].x[i]);" in text
    # Stages, their barriers and 8 warps × 2 boxes × 2 KiB of staging fit the 227 KiB a block may have.
    assert art.launch.dyn_smem == 196608 + 1024 + 8 * 2 * 2048 and art.launch.dyn_smem <= 232448
    assert "#define OUT_CHUNK 2" in text and "spatialc_bulk_wait_read<1>();" in text
    # A box is 2 KiB: an int8 GEMM's int32 output stages 2 tiles a box too; int64 (asked for) 1.
    assert sm90a_plan.store_chunk(16, "int") == 2 and sm90a_plan.store_chunk(16, "long long") == 1
    assert sm90a_plan.store_chunk(16, "__nv_bfloat16") == 4 and sm90a_plan.store_chunk(6, "float") == 2
    assert sm90a_plan.store_chunk(1, "float") == 1 and sm90a_plan.store_chunk(3, "__nv_bfloat16") == 1


@needs_gxx
@pytest.mark.emulation
def test_staged_store_unplanted_is_exact(wide):
    for mode in ("late", "early"):
        assert outcome(wide, wide[1].program_cu, mode) == EXACT


@needs_gxx
@pytest.mark.emulation
def test_c_is_stored_row_major_a_tile_a_box(wide):
    """C is stored row-major (no untilize for the caller): its map's rows are a padded matrix row apart; a wrong
    pitch in its place puts C's values elsewhere, boxes over each other: elements of C stored twice, a race."""
    text, cols_t = wide[1].program_cu, wide[1].launch.params[2].tiles[1]
    pitch = cols_t * 16 * 4  # float32 C
    row_major = f"const cuuint64_t strides[1] = {{{pitch}}};"
    assert wide[1].launch.params[2].order == "rows" and text.count(row_major) == 1
    assert text.count("spatialc_tma_store_2d(&spatialc_tmap_2, col + c * 16, row, staged + c * 256);") == 1
    got = outcome(wide, text.replace(row_major, f"const cuuint64_t strides[1] = {{{pitch - 64}}};"))
    assert got.startswith("race") and "every element of an output is written once" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_staged_box_stored_without_the_proxy_fence_is_a_race(wide):
    text = replaced(wide[1].program_cu, "spatialc_fence_proxy_async();  // the lane's staged values", "//")
    for mode in ("late", "early"):
        got = outcome(wide, text, mode)
        assert got.startswith("race") and "no fence.proxy.async since" in got, got


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(
    "wait",
    [
        "//",  # no wait: the box is staged while the copy engine may still read the previous one
        "if (lane == 0) { spatialc_bulk_wait_read<2>(); }",  # two groups left in flight: the box's last one too
    ],
)
def test_staging_written_again_before_the_store_read_it_is_caught(wide, wait):
    text = replaced(wide[1].program_cu, "if (lane == 0) { spatialc_bulk_wait_read<1>(); }", wait)
    for mode in ("late", "early"):
        got = outcome(wide, text, mode)
        assert got.startswith("race") and "TMA store issued at line" in got and "may still be reading" in got, got


@needs_gxx
@pytest.mark.emulation
def test_the_staging_boxes_alternate_across_items(wide):
    """Three boxes an item (an odd count): the turn is counted over all the warp's items, so the next item starts on
    the other box than the one the item before ended on. Restarting the count with each item writes that box while
    its store may still read it."""
    text = wide[1].program_cu
    assert text.count("++boxes_out;") == 1 and "(boxes_out) % 2" in text
    got = outcome(wide, replaced(text, "++boxes_out;", "boxes_out = (q0 / OUT_CHUNK + 1) % (PERW / OUT_CHUNK);"))
    assert got.startswith("race") and "may still be reading" in got, got


@needs_gxx
@pytest.mark.emulation
def test_an_even_count_of_boxes_restarts_each_item_on_the_first_box():
    """Four boxes an item: a whole number of turns, so the box is known where printed (no count) and each item
    starts on the first box, which the last store of the item before (on the second box) does not read."""
    p = spatialc.build(spatialc.gemm(150, 200, 64, "bf16"), "sm_90a", block=(8, 8, 2), depth=2, sites=2)
    art = spatialc.lower(p, epilogue="tiles")
    text = art.kernel_cu
    assert "#define OUT_CHUNK 2" in text and "#define PERW 8" in text and "boxes_out" not in text
    assert "(warp * 2 + (q0 / OUT_CHUNK) % 2)" in text and art.launch.grid == 2
    case = (p, art, inputs("bf16", 150, 200, 64))
    for mode in ("late", "early"):
        assert outcome(case, art.program_cu, mode) == EXACT
    # Always the same box: written while the store of the box before may still read it.
    got = outcome(case, replaced(art.program_cu, "(q0 / OUT_CHUNK) % 2", "0"))
    assert got.startswith("race") and "may still be reading" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_warp_that_never_waits_for_its_last_store_is_refused_at_exit(wide):
    last = "if ((threadIdx.x & 31) == 0) { spatialc_bulk_wait_read<0>(); }  // the last boxes' stores"
    text = replaced(wide[1].program_cu, last, "//")
    for mode in ("late", "early"):
        got = outcome(wide, text, mode)
        assert got.startswith("fault") and "never waited for (spatialc_bulk_wait_read)" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_16_bit_output_is_staged_by_stmatrix_and_equals_the_interpreter():
    from spatialc.frontend import bias, relu

    g = spatialc.gemm(150, 200, 64, "fp16", epilogue=[bias(), relu()], out="fp16")
    p = spatialc.build(g, "sm_90a", block=(8, 8, 2), depth=2)
    art = spatialc.lower(p, epilogue="tiles")
    assert "spatialc_stmatrix_tile(staged + c * 256, out);" in art.kernel_cu and "#define OUT_CHUNK 4" in art.kernel_cu
    x = inputs("fp16", 150, 200, 64) | {"bias": np.arange(200, dtype=np.float32) - 40}
    want = spatialc.evaluate(p, x)
    for mode in ("late", "early"):
        got = spatialc.emulate(art, x, mode=mode, timeout=120)
        assert got.dtype == want.dtype == np.float16 and np.array_equal(got, want), mode


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_staged_store_compiles_to_stmatrix_and_tma_stores(tmp_path):
    art = spatialc.lower(
        spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16", out="bf16"), "sm_90a"), epilogue="tiles"
    )
    ops = Counter(i.base for i in compiled_clean(art, tmp_path))
    # A warp's row of 16 tiles: 16 stmatrix and 16 TMA stores, a tile each (four boxes of 4 tiles, two staging
    # boxes in turn); no store to global from the registers.
    assert ops["STSM"] == 16 and ops["UTMASTG"] == 16 and ops["STG"] == 0, ops


@needs_gxx
@pytest.mark.emulation
def test_a_fence_after_the_warps_barrier_does_not_order_the_staging_before_the_store(wide):
    fence = "spatialc_fence_proxy_async();  // the lane's staged values, visible to the copy engine\n"
    text = wide[1].program_cu
    at = text.index(fence)
    sync = text.index("__syncwarp();\n", at)
    # The barrier first, then each lane's fence: lane 0 may issue the store before another lane's fence.
    swapped = (
        text[:at] + "__syncwarp();\n" + text[at + len(fence) : sync] + fence + text[sync + len("__syncwarp();\n") :]
    )
    got = outcome(wide, swapped)
    assert got.startswith("race") and "fence.proxy.async" in got, got

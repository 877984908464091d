"""The sm_90a form (lower/cuda/hopper.py): a TMA producer and wgmma consumers, run through the host emulation's sm_90a
layer (runtime/emu/emu_hopper.h) against the interpreter, with planted faults the emulation must catch, the static
refusals before printing, and nvcc / SASS checks where the toolchain is present."""

from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest

import spatialc
import spatialc.runtime.launch as L
from spatialc.lower.cuda import hopper
from spatialc.lower.errors import TooBig, Unsupported
from spatialc.runtime.emulate import EmulationError
from spatialc.runtime.launch import LaunchError

from .test_launch import NumpyDevice

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
    assert art.general is None and any("no general form" in n for n in art.notes)  # its rings would not fit
    loads = [(8, plan.block.ibw), (plan.block.ibw, plan.item_tiles[1])]
    assert [m.box for m in art.launch.tensor_maps] == [*loads, (1, 4)]  # then the store's: a tile row, 4 tiles
    small = spatialc.lower(spatialc.build(spatialc.gemm(300, 200, 100, "bf16"), "sm_90a"))
    assert small.budget.form == "sm90a" and small.general is not None  # where it fits, the general form rides along


def test_sm90_keeps_its_persistent_kernel_and_other_targets_refuse_the_form():
    p = spatialc.build(spatialc.gemm(256, 256, 256, "bf16"), "sm_90")
    assert spatialc.lower(p).budget.form == "persistent"
    with pytest.raises(Unsupported, match="sm_90a only"):
        spatialc.lower(p, form="sm90a")


def test_what_the_wgmma_layout_does_not_take_falls_back_with_a_note():
    # Forced 4-row blocks: not two warpgroups of 64 rows, so auto plans and prints the persistent kernel.
    p = spatialc.build(spatialc.gemm(128, 128, 64, "fp16"), "sm_90a", block=(4, 4, 2))
    art = spatialc.lower(p)
    assert art.budget.form == "persistent"
    assert any("not the sm_90a form" in n and "64 rows each" in n for n in art.notes)
    with pytest.raises(Unsupported, match="64 rows each"):
        spatialc.lower(p, form="sm90a")


def test_int8_k_steps_come_in_pairs():
    with pytest.raises(Unsupported, match="pairs of tiles"):
        hopper.check_plan(
            dataclasses.replace(
                spatialc.build(spatialc.gemm(128, 64, 64, "int8"), "sm_90a").plans[0],
                block=spatialc.ir.ops.BlockShape(8, 4, 1),
            ),
            spatialc.ir.ops.Precision.INT8,
        )


def test_static_checks_refuse_before_printing():
    p = spatialc.build(spatialc.gemm(256, 256, 256, "bf16"), "sm_90a", block=(8, 8, 4), depth=3)
    k = hopper.make_kernel(p, spatialc.target("sm_90a"))
    t = spatialc.target("sm_90a")
    # Stage bytes against the block's shared memory.
    big = dataclasses.replace(k, base=dataclasses.replace(k.base, dyn_bytes=t.smem_per_site_max + 16))
    with pytest.raises(TooBig, match="fewer stages"):
        hopper.check_resources(big, t)
    # A stage off its 1024-byte boundary.
    moved = dict(k.base.offsets, ring_0=512)
    with pytest.raises(Unsupported, match="1024 bytes"):
        hopper.check_resources(dataclasses.replace(k, base=dataclasses.replace(k.base, offsets=moved)), t)
    # The setmaxnreg split over the register file (on a file that still gives each thread 40 to 232 at launch).
    small = dataclasses.replace(t, regs_per_unit=61440)
    with pytest.raises(TooBig, match="registers after setmaxnreg: needs 64512, has 61440"):
        hopper.check_resources(k, small)
    # Registers at launch outside what setmaxnreg moves between (a file of 8K: 21 a thread).
    with pytest.raises(Unsupported, match="16 registers a thread at launch"):
        hopper.check_resources(k, dataclasses.replace(t, regs_per_unit=8192))


class MapDevice(NumpyDevice):
    """The launcher tests' numpy GPU, which also encodes tensor maps: it keeps what it was asked for."""

    arch = "sm_90"

    def __init__(self, art):
        super().__init__(art)
        self.maps = []

    def launch(self, kernel, grid, block, dyn_smem, args):
        super().launch(kernel, grid, block, dyn_smem, args[:3])  # the product of A and B into C
        self.launches[-1] = (kernel, grid, block, dyn_smem, [a.copy() for a in args])

    def tensor_map(self, buffer, dims, strides, box, elem, swizzle):
        self.maps.append((buffer.copy(), dims, strides, box, elem, swizzle))
        return np.array([1000 + len(self.maps) - 1])  # a stand-in for the 128 bytes, told apart by value


def test_the_launcher_passes_each_tensor_map_after_the_work_list_encoded_over_its_buffer():
    art = spatialc.lower(spatialc.build(spatialc.gemm(200, 72, 100, "fp16"), "sm_90a"))
    x = inputs("fp16", 200, 72, 100)
    dev = MapDevice(art)
    c = L.run_with(dev, art, x["A"], x["B"])
    np.testing.assert_allclose(c, x["A"] @ x["B"], rtol=1e-3)
    (kernel, grid, block, dyn, args) = dev.launches[0]
    assert block == 384 and [int(a[0]) for a in args[-3:]] == [1000, 1001, 1002]
    # Each map over the buffer of its own tensor (A, then B, then the output C the store writes), with the geometry
    # the host program prints.
    for (buffer, dims, strides, box, elem, swizzle), m in zip(dev.maps, art.launch.tensor_maps, strict=True):
        out = art.launch.params[m.tensor].role == "output"
        assert (elem, swizzle) == ((4, 0) if out else (2, 1))
        # (the output's buffer was encoded poisoned, before the kernel wrote it)
        assert buffer.shape == args[m.tensor].shape and (out or np.array_equal(buffer, args[m.tensor]))
        text = f"const cuuint64_t dims[4] = {{{', '.join(map(str, dims))}}};"
        assert text in art.program_cu and f"const cuuint32_t box[4] = {{{', '.join(map(str, box))}}};" in art.program_cu
        assert f"const cuuint64_t strides[3] = {{{', '.join(map(str, strides))}}};" in art.program_cu
    a_dims = dev.maps[0][1]
    assert a_dims[2:] == (art.launch.params[0].tiles[0], art.launch.params[0].tiles[1])  # A by column: rows inner


def test_the_launcher_refuses_what_cannot_take_an_sm90a_kernel():
    art = spatialc.lower(spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90a"))
    a = b = np.ones((64, 64), dtype=np.float32)
    with pytest.raises(LaunchError, match="cannot encode the TMA tensor maps"):
        L.run_with(NumpyDevice(art), art, a, b)
    older = MapDevice(art)
    older.arch = "sm_80"
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
    m = L.encode_tensor_map(drv, 4096, (16, 16, 7, 3), (32, 512, 3584), (16, 16, 4, 8), 2, 1)
    assert m.dtype.itemsize == 128 and m.tobytes() == bytes(range(128))
    assert drv.seen == (1, 4, 4096, [16, 16, 7, 3], [32, 512, 3584], [16, 16, 4, 8], [1, 1, 1, 1], 0, 1, 2, 0)
    L.encode_tensor_map(drv, 4096, (16, 16, 7, 3), (16, 256, 1792), (16, 16, 4, 8), 1, 0)
    assert drv.seen[0] == 0 and drv.seen[8] == 0  # uint8, no swizzle
    with pytest.raises(LaunchError, match="CUresult 1"):
        L.encode_tensor_map(FakeDriver(code=1), 4096, (16, 16, 7, 3), (32, 512, 3584), (16, 16, 4, 8), 2, 1)


def test_host_program_encodes_each_tensor_map_through_the_driver_entry_point():
    art = spatialc.lower(spatialc.build(spatialc.gemm(200, 72, 100, "fp16"), "sm_90a"))
    text = art.program_cu
    assert 'cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled"' in text
    assert text.count("encode_tiled(&tmap_") == len(art.launch.tensor_maps) == 3  # A, B; C for the TMA store
    assert "CU_TENSOR_MAP_SWIZZLE_32B" in text and "CU_TENSOR_MAP_DATA_TYPE_FLOAT16" in text
    assert "CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, d2," in text  # C's map over its float32 output
    assert re.search(r"spatialc_hopper<<<GRID, 384, \d+>>>\(d0, d1, d2, d_work, tmap_0, tmap_1, tmap_2\);", text)


# ---- emulation against the interpreter --------------------------------------------------------------------------

CASES = [
    ("bf16", (200, 136, 100), {}),  # the planner's own plan, odd sizes everywhere
    ("fp16", (130, 300, 70), {}),
    ("int8", (129, 250, 190), {}),
    ("bf16", (300, 260, 200), {"block": (8, 8, 4), "depth": 3}),  # the 4096³ plan: 224 KiB of stages and rings
    ("int8", (150, 100, 300), {"block": (8, 4, 4), "depth": 4}),
    ("int8", (70, 40, 96), {"block": (8, 2, 2), "depth": 1}),  # one-page rings: no group kept in flight
    ("fp16", (1, 1, 1), {}),
]


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(("prec", "shape", "kw"), CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}" for c in CASES])
def test_emulated_sm90a_kernel_equals_the_interpreter(prec, shape, kw):
    p = spatialc.build(spatialc.gemm(*shape, prec), "sm_90a", **kw)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a"
    x = inputs(prec, *shape)
    want = spatialc.evaluate(p, x)
    for mode in ("late", "early"):
        got = spatialc.emulate(art, x, mode=mode, timeout=120)
        assert got.dtype == want.dtype and np.array_equal(got, want), mode


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
def expecting(text: str, ring: int, more: int) -> str:
    """`text` with ring `ring`'s expect_tx announcing `more` bytes more (fewer, when negative) than a page has."""
    page = re.search(rf"spatialc_mbar_expect_tx\(&full_{ring}\[[^\]]*\], (\d+)u\);", text)
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
def test_unpipelined_k_loop_releases_after_its_group_retired():
    # One-page rings: no step can stay in flight, so each release waits for its own group (wait_group 0).
    p = spatialc.build(spatialc.gemm(150, 100, 120, "bf16"), "sm_90a", block=(8, 2, 2), depth=1)
    art = spatialc.lower(p)
    assert "spatialc_wgmma_wait<1>" not in art.program_cu
    assert "spatialc_wgmma_wait<0>();  // the K step's wgmma have read the stage" in art.program_cu
    x = inputs("bf16", 150, 100, 120)
    assert np.array_equal(spatialc.emulate(art, x, timeout=60), spatialc.evaluate(p, x))
    # Without the wait, late mode never retires the groups: the accumulators never receive the sums.
    text = replaced(art.program_cu, "spatialc_wgmma_wait<0>();  // the K step's wgmma have read the stage", "")
    assert outcome((p, art, x), text, "late") == "mismatch"


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
    text = faulty[1].program_cu
    assert outcome(faulty, replaced(text, "512u, 256u, 3u)", "256u, 256u, 3u)")) == "mismatch"  # B's LBO
    swz = re.search(r"encode_tiled\(&tmap_0, [^;]*CU_TENSOR_MAP_SWIZZLE_32B", text)
    assert swz
    unswizzled = text.replace(swz[0], swz[0].replace("SWIZZLE_32B", "SWIZZLE_NONE"), 1)
    assert outcome(faulty, unswizzled) == "mismatch"  # A lands unswizzled, ldmatrix reads it swizzled


# ---- nvcc and SASS -----------------------------------------------------------------------------------------------

NVCC = shutil.which("nvcc")


def compiled_clean(art, tmp_path):
    """The SASS instructions of `art`'s kernel, compiled for sm_90a with -Werror: no spills, no ptxas warning that
    setmaxnreg was ignored or wgmma serialised (skips where cuobjdump is missing)."""
    from spatialc.runtime.sass import disassemble, find_cuobjdump

    src, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    src.write_text(art.kernel_cu)
    cmd = [NVCC, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-Werror", "all-warnings"]
    done = subprocess.run([*cmd, "-Xptxas", "-v", "-o", str(cubin), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in done.stderr
    for code in ("C7508", "C7510", "C7515", "C7520"):  # setmaxnreg ignored, wgmma serialised
        assert code not in done.stderr
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return disassemble(cubin, tool).instrs


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("prec", ["bf16", "fp16", "int8"])
def test_sm90a_kernel_compiles_clean_and_its_sass_has_the_hopper_instructions(prec, tmp_path):
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, prec), "sm_90a"))
    ops = Counter(i.base for i in compiled_clean(art, tmp_path))
    mma = "IGMMA" if prec == "int8" else "HGMMA"
    assert ops[mma] >= 1 and ops["UTMALDG"] >= 2 and ops["SYNCS"] >= 1 and ops["USETMAXREG"] == 2, ops
    assert ops["HMMA"] == ops["IMMA"] == 0  # no mma.sync fallback


# ---- the emulated copy engine on its own -------------------------------------------------------------------------

TMA_PROBE = r"""
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cstdio>
#include <vector>
extern "C" __global__ void probe(unsigned char* out, const __grid_constant__ CUtensorMap map)
{
    extern __shared__ __align__(1024) char spatialc_dyn_smem[];
    SPATIALC_DYNAMIC_RING(unsigned char, page, spatialc_dyn_smem, 0, 1, 1024);
    SPATIALC_DYNAMIC_RING(unsigned long long, bar, spatialc_dyn_smem, 1024, 1, 1);
    if (threadIdx.x == 0) {
        spatialc_mbar_init(bar, 1);
        spatialc_fence_proxy_async();
    }
    __syncthreads();  // the barrier initialised before anyone waits on it
    if (threadIdx.x == 0) {
        spatialc_mbar_expect_tx(bar, 1024);
        spatialc_tma_load_4d(page, &map, 0, 0, 2, 1, bar);  // tile column 2, tile row 1: a 2x2-tile box
        spatialc_mbar_arrive(bar);
    }
    spatialc_mbar_wait(bar, 0);
    for (int i = threadIdx.x; i < 1024; i += 32) out[i] = page[i];
}
int main()
{
    std::vector<unsigned char> h(6 * 256);  // 2 x 3 tiles of 16 x 16 bytes
    for (size_t i = 0; i < h.size(); ++i) h[i] = (unsigned char)(1 + i % 251);
    unsigned char *src = nullptr, *out = nullptr;
    cudaMalloc(&src, h.size());
    cudaMalloc(&out, 1024);
    cudaMemcpy(src, h.data(), h.size(), cudaMemcpyHostToDevice);
    PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    cudaDriverEntryPointQueryResult found;
    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &found);
    const cuuint64_t dims[4] = {16, 16, 3, 2};
    const cuuint64_t strides[3] = {16, 256, 768};
    const cuuint32_t box[4] = {16, 16, 2, 2}, unit[4] = {1, 1, 1, 1};
    CUtensorMap map;
    if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, src, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
               SWIZZLE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return 3;
    probe<<<1, 32, 2048>>>(out, map);
    cudaDeviceSynchronize();
    std::vector<unsigned char> y(1024);
    cudaMemcpy(y.data(), out, 1024, cudaMemcpyDeviceToHost);
    for (unsigned char v : y) printf("%d\n", v);
    return 0;
}
"""


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("swizzle", ["NONE", "32B"])
def test_emulated_tma_box_fills_past_the_tensor_with_zeros_and_swizzles_by_address(swizzle):
    from spatialc.runtime.emulate import emulate_source

    text = TMA_PROBE.replace("SWIZZLE,", f"CU_TENSOR_MAP_SWIZZLE_{swizzle},")
    got = emulate_source(text, {}, (1024,), np.int64)
    src = (1 + np.arange(6 * 256) % 251).reshape(2, 3, 256)
    want = np.zeros((2, 2, 256), dtype=np.int64)  # [box tile row][box tile column][element]
    want[0, 0] = src[1, 2]  # the box's only tile inside the 2 x 3 tensor; the other three are past it: zeros
    flat = want.reshape(-1)
    if swizzle == "32B":  # 16-byte chunks exchanged within each 32-byte span where address bit 7 is set
        chunks = flat.reshape(-1, 16).copy()
        for c in range(len(chunks)):
            if (c * 16 >> 7) & 1:
                chunks[c] = flat.reshape(-1, 16)[c ^ 1]
        flat = chunks.reshape(-1)
    assert np.array_equal(got, flat)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_launcher_compiles_an_sm90a_kernel_for_the_architecture_specific_target(tmp_path):
    art = spatialc.lower(spatialc.build(spatialc.gemm(256, 256, 256, "int8"), "sm_90a"))
    cubin = L.compile_cubin(art.kernel_cu, "sm_90a", cache=tmp_path)
    ptxas = L.kernel_ptxas(cubin, "spatialc_hopper")
    assert cubin.stat().st_size > 0 and ptxas is not None and ptxas.spill_stores == 0


@needs_gxx
@pytest.mark.emulation
def test_an_epilogue_the_fused_store_cannot_apply_keeps_its_rings_and_the_writer():
    from spatialc.frontend import activation, bias

    g = spatialc.gemm(130, 64, 64, "bf16", epilogue=[bias(), activation("gelu")])
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
    # The producer's arrival before its expect_tx: the phase completes with no bytes, before the load is issued.
    expect = re.search(r"spatialc_mbar_expect_tx\(&full_0\[[^\]]*\], \d+u\);", text)
    push = "spatialc_mbar_arrive(&full_0[psh_0 % DEPTH_0]); ++psh_0;  // op:Push"
    assert expect and text.count(push) == 1
    arrive = "spatialc_mbar_arrive(&full_0[psh_0 % DEPTH_0]); ++psh_0;\n"
    early = replaced(replaced(text, push, "// (moved)"), expect[0], arrive + expect[0])
    assert outcome(faulty, early) != EXACT


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
    """bf16 150×200×64 in 8×8-tile items: each consumer warp stages its row of 8 tiles in two boxes of 4."""
    p = spatialc.build(spatialc.gemm(150, 200, 64, "bf16"), "sm_90a", block=(8, 8, 2), depth=2)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and "#define OUT_CHUNK 4" in art.kernel_cu
    return p, art, inputs("bf16", 150, 200, 64)


def test_the_fused_store_goes_out_by_tma_store_from_each_warps_staging():
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16"), "sm_90a"))
    text = art.kernel_cu
    assert "spatialc_tma_store_4d(&spatialc_tmap_2, 0, 0, (int)(tile % 256), (int)(tile / 256), staged);" in text
    assert art.launch.tensor_maps[-1].box == (1, 4) and art.launch.tensor_maps[-1].tensor == 2  # C, 4 tiles a box
    assert "SPATIALC_PAGE_ST(staged + c * 256 + el, (OUT_T)accf[q].x[i]);" in text
    # Stages, their barriers and 8 warps × 4 KiB of staging fit the 227 KiB a block may have.
    assert art.launch.dyn_smem == 196608 + 1024 + 8 * 4096 and art.launch.dyn_smem <= 232448
    # An int8 GEMM's int32 output stages 4 tiles too; int64 (asked for) 2.
    assert hopper.store_chunk(16, "int") == 4 and hopper.store_chunk(16, "long long") == 2
    assert hopper.store_chunk(16, "__nv_bfloat16") == 8 and hopper.store_chunk(6, "float") == 2


@needs_gxx
@pytest.mark.emulation
def test_staged_store_unplanted_is_exact(wide):
    for mode in ("late", "early"):
        assert outcome(wide, wide[1].program_cu, mode) == EXACT


@needs_gxx
@pytest.mark.emulation
def test_a_staged_box_stored_without_the_proxy_fence_is_a_race(wide):
    text = replaced(wide[1].program_cu, "spatialc_fence_proxy_async();  // the lane's staged values", "//")
    for mode in ("late", "early"):
        got = outcome(wide, text, mode)
        assert got.startswith("race") and "no fence.proxy.async since" in got, got


@needs_gxx
@pytest.mark.emulation
def test_staging_written_again_before_the_store_read_it_is_caught(wide):
    # The next box is staged while the copy engine may still read the previous one.
    text = replaced(wide[1].program_cu, "if (lane == 0) { spatialc_bulk_wait_read<0>(); }\n", "\n")
    for mode in ("late", "early"):
        got = outcome(wide, text, mode)
        assert got.startswith("race") and "TMA store issued at line" in got and "may still be reading" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_warp_that_never_waits_for_its_last_store_is_refused_at_exit(wide):
    last = "if (lane == 0) { spatialc_bulk_wait_read<0>(); }  // the staging is free"
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
    art = spatialc.lower(p)
    assert "spatialc_stmatrix_tile(staged + c * 256, out);" in art.kernel_cu and "#define OUT_CHUNK 8" in art.kernel_cu
    x = inputs("fp16", 150, 200, 64) | {"bias": np.arange(200, dtype=np.float32) - 40}
    want = spatialc.evaluate(p, x)
    for mode in ("late", "early"):
        got = spatialc.emulate(art, x, mode=mode, timeout=120)
        assert got.dtype == want.dtype == np.float16 and np.array_equal(got, want), mode


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_staged_store_compiles_to_stmatrix_and_tma_stores(tmp_path):
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16", out="bf16"), "sm_90a"))
    ops = Counter(i.base for i in compiled_clean(art, tmp_path))
    # A warp's row of 16 tiles: 16 stmatrix and 2 TMA stores of 8 tiles; no store to global from the registers.
    assert ops["STSM"] == 16 and ops["UTMASTG"] == 2 and ops["STG"] == 0, ops


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

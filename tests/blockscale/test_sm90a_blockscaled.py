"""Block-scaled 8-bit float GEMMs in the sm_90a form (issue 34): each 128-element K group's wgmma into fresh
partial accumulators (scale-d 0 on the group's first), waited for, then promoted by the forms' one promotion printer;
A's per-row scales landed by TMA beside A's page (sm90a/blockscale.py). The host emulation runs it within the
kernel's bound of the interpreter (numerics.blockscale: four reduced-precision wgmma steps a group, whatever K);
planted faults — a scale of the wrong K group, A's scales of the wrong row block, a group's partials not made fresh
(promoted twice), the promotion before the group retired, an emulated wgmma that ignores scale-d — are caught; nvcc
compiles the planned 4096³ kernel for sm_90a clean, its main loop QGMMA and the promotion's FFMAs; auto picks the
form where the plan fits."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import spatialc
from spatialc.errors import PlanError
from spatialc.numerics.blockscale import kernel_ulps
from spatialc.numerics.tolerance import FP8_WGMMA_STEP
from spatialc.runtime import emu_compile
from spatialc.runtime import emulate as emulation
from spatialc.runtime.emu_errors import EmulationError
from spatialc.runtime.sass import disassemble, find_cuobjdump, main_loop_census

from ..lower.test_sm90a_fp8 import emulated  # the sm_90a form's kernel, its text edited, through the emulation
from ..nvcc_clean import FLAGS, NVCC
from .programs import inputs_of

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def hopper(m, n, k, layouts=("1x128", "128x128"), prec="e4m3", epilogue=(), out="float32", **kw):
    gemm = spatialc.gemm(m, n, k, prec, scales=layouts, epilogue=list(epilogue), out=out)
    return spatialc.build(gemm, "sm_90a", **kw)


CASES = {
    # two item rows (the second past M: its scales' box zero-filled), three K groups, A's scales by TMA
    "1x128-128x128": ("e4m3", (150, 140, 384), ("1x128", "128x128"), (), "float32"),
    # one scale a row of A (TMA, one group over all of K) and a column of B; a bias into bf16 (the fused store)
    "row-col-e5m2-bf16": ("e5m2", (70, 48, 256), ("row", "col"), (spatialc.bias(),), "bf16"),
    # one scale for A (read from global memory, as B's): no TMA box
    "tensor-128x128": ("e4m3", (64, 40, 256), ("tensor", "128x128"), (), "float32"),
}


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", CASES)
def test_the_emulated_kernel_is_within_the_kernel_bound_of_the_interpreter(case):
    prec, shape, layouts, epilogue, out = CASES[case]
    p = hopper(*shape, layouts, prec, epilogue, out)
    x = inputs_of(p, seed=5)
    if epilogue:
        x["bias"] = np.linspace(-2, 2, shape[1]).astype(np.float32)
    c = emulated(p, x)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    # The emulation sums exact products in float32: far inside the bound the hardware's sums need.
    want = spatialc.evaluate(p, x)
    assert np.abs(c - want).max() <= (1e-5 if out == "float32" else 2**-7) * np.abs(want).max()


PLANTED = {
    # the box of A's scales for the other K group (0 <-> 1)
    "A's scales of the wrong K group": (r"\* 16\) / 128, &full_", r"* 16) / 128 ^ 1, &full_"),
    "B's scale of the wrong K group": (r"const int gb = sk0 / 128;", "const int gb = (sk0 / 128) ^ 1;"),
    # (an item's 16 columns lie in one of B's 128-column scale blocks: its scale is the item's first column's)
    "B's scale of the next column block": (r"sc0 / 128", "(sc0 + 128) / 128"),
    # the box of A's scales for the next 128 rows (the other item row's; past M for the second: zeros)
    "A's scales of the wrong row block": (r"\(at / (\d+)\) \* 16, \(\(at", r"(at / \1) * 16 + 128, ((at"),
    # the first group's partials fresh, every later group's accumulated onto the last: the groups before promoted
    # again (not the poison of never-written registers, which the first group would read)
    "a group promoted twice": (r", kk > 0\);", ", kk > 0 || k > 0);"),
    # the promotion reads the partials before the group retires (the emulation runs a wgmma at its wait_group)
    "the promotion before the group retired": (r"spatialc_wgmma_wait<0>\(\);  // the group's partial", "// "),
}


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("fault", PLANTED)
def test_a_fault_planted_in_the_kernel_text_is_caught(fault):
    pattern, replacement = PLANTED[fault]
    p = hopper(150, 140, 256)  # two item rows, two K groups, two of B's column blocks
    x = inputs_of(p, seed=4)

    def planted(text):
        out, n = re.subn(pattern, replacement, text)
        assert n >= 1
        return out

    try:
        c = emulated(p, x, planted)
    except EmulationError as e:  # the emulation's own checks (a stage released under a running wgmma, …)
        assert fault == "the promotion before the group retired", e
        return
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


@needs_gxx
@pytest.mark.emulation
def test_an_emulated_wgmma_that_ignores_scale_d_is_caught(tmp_path, monkeypatch):
    headers = tmp_path / "emu"
    shutil.copytree(emulation.HEADER_DIR, headers)
    hopper_h = headers / "emu_hopper.h"
    right = "    if (!scale_d) {"
    assert right in hopper_h.read_text()
    hopper_h.write_text(hopper_h.read_text().replace(right, "    if (false && !scale_d) {"))
    monkeypatch.setattr(emu_compile, "HEADER_DIR", headers)
    p = hopper(64, 40, 256)
    x = inputs_of(p, seed=6)
    ok, how = spatialc.tolerance(p, kernel=True).check(emulated(p, x), x)
    assert not ok, how


def test_auto_prints_it_on_sm90a_with_128_x_128_items_and_the_scales_in_a_stage():
    p = hopper(4096, 4096, 4096, out="bf16")
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and p.plan.block.osw * 16 == 128  # type: ignore[union-attr]
    text = art.kernel_cu
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in text and "setp.ne.b32 p, %66, 0" in text
    assert "spatialc_acc<ACCT> part[8];" in text and "sa_stage[" in text
    orders = {q.name: q.order for q in art.launch.params}
    assert orders["scale_a"] == "cols" and orders["scale_b"] == "row"  # A's stored groups x rows, for its box
    assert any(m.box == (1, 128) and m.transposed for m in art.launch.tensor_maps)
    # a program built for the persistent form keeps it
    kept = spatialc.build(spatialc.gemm(64, 64, 256, "e4m3", scales=("1x128", "128x128")), "sm_90a", form="persistent")
    assert spatialc.lower(kept).budget.form == "persistent"


def test_items_wider_than_the_partials_allow_are_not_planned():
    with pytest.raises(PlanError, match=r"block-scaled items of 128 rows and 256 columns: each K group's partial"):
        hopper(1024, 1024, 512, block=(8, 16, 8), form="sm90a")
    assert hopper(1024, 1024, 512, block=(8, 8, 8), form="sm90a").plan.block.osw == 8  # type: ignore[union-attr]


MULTICAST = {"A": (1, 2), "B": (2, 1)}  # two items of a row share A's pages (and scales), of a column B's


@needs_gxx
@pytest.mark.emulation
@pytest.mark.filterwarnings("ignore::spatialc.MulticastWarning")
@pytest.mark.parametrize("shared", MULTICAST)
def test_a_page_multicast_to_a_cluster_of_two_is_within_the_bound(shared):
    p = hopper(256, 256, 256, form="sm90a", multicast=MULTICAST[shared])
    art = spatialc.lower(p)
    assert art.launch.cluster == 2
    # A's scales go with A's page: multicast where it is, announced by every receiver with it
    assert ("spatialc_tma_load_2d_multicast(sa_stage" in art.kernel_cu) == (shared == "A")
    x = inputs_of(p, seed=7)
    ok, how = spatialc.tolerance(p, kernel=True).check(emulated(p, x), x)
    assert ok, how


@needs_gxx
@pytest.mark.emulation
@pytest.mark.filterwarnings("ignore::spatialc.MulticastWarning")
def test_a_receiver_that_does_not_announce_the_scales_bytes_is_caught():
    """A receiver's expect_tx of A's page alone: the sender's box of scales brings it more bytes than announced."""
    p = hopper(256, 256, 256, form="sm90a", multicast=(1, 2))
    x = inputs_of(p, seed=7)
    page = 128 * 128  # A's page of e4m3 bytes; with the scales' box 512 more

    def short(text):
        announced = f"{page + 512}u);  // the page the sender sends"
        assert announced in text
        return text.replace(announced, f"{page}u);  // the page the sender sends")

    with pytest.raises(EmulationError, match="bytes"):
        emulated(p, x, short)


def test_its_bound_adds_four_wgmma_steps_a_group_whatever_k():
    for k in (512, 4096):
        sm90a = spatialc.tolerance(hopper(128, 128, k), kernel=True)
        assert sm90a.ulps == kernel_ulps(k) + 4 * FP8_WGMMA_STEP  # 2^-10 of M, where the unpromoted kernel's grows
        assert "four a group" in sm90a.text
    other = spatialc.build(spatialc.gemm(128, 128, 4096, "e4m3", scales=("1x128", "128x128")), "sm_90")
    assert spatialc.tolerance(other, kernel=True).ulps == kernel_ulps(4096)  # mma.sync's float32 sums


PLANS = {"planned": ({}, 128), "paired": ({"form": "sm90a", "block": (4, 4, 8)}, 64)}  # 64-row items, 2 blocks an SM


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The 4096³ kernels (DeepGEMM's layouts, bf16 C) — the planner's, and a paired block's of 64 × 64 items (128
    registers a thread) — compiled for sm_90a with -Werror and ptxas -v."""
    done = {}
    for name, (kw, _) in PLANS.items():
        art = spatialc.lower(hopper(4096, 4096, 4096, out="bf16", **kw))
        src = tmp_path_factory.mktemp("bs90a") / f"{name}.cu"
        src.write_text(art.kernel_cu)
        cubin = src.with_suffix(".cubin")
        cmd = [NVCC, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", *FLAGS]
        done[name] = subprocess.run([*cmd, "-o", str(cubin), str(src)], capture_output=True, text=True), cubin
    return done


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("plan", PLANS)
def test_nvcc_compiles_it_clean_its_main_loop_qgmma_and_the_promotions_ffma(compiled, plan):
    proc, cubin = compiled[plan]
    n = PLANS[plan][1]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in proc.stderr
    assert not re.findall(r"\(C75\d\d\)", proc.stderr), proc.stderr  # ptxas serialising the wgmma
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    code = disassemble(cubin, tool)
    loop = main_loop_census(code)
    assert loop is not None and loop.mmas == ((f"QGMMA.64x{n}x32.F32.E4M3.E4M3", 4),), loop  # a K group a trip
    lo, hi = code.main_loops()[0]
    assert code.count("FFMA", lo, hi) >= n // 2  # the promotion: an FFMA for each of a thread's n / 2 partials
    assert loop.other_lds >= 2  # A's scales of a lane's two rows, from the stage
    ops = [i.op for i in code.instrs if lo <= i.addr < hi and not i.never]
    first_mma = next(i for i, op in enumerate(ops) if op.startswith("QGMMA"))
    waited = ops.index("WARPGROUP.DEPBAR.LE")
    # the scales read before the group is issued, the promotion after its wait
    assert max(i for i, op in enumerate(ops) if op == "LDS") < first_mma < waited
    assert min(i for i, op in enumerate(ops) if op == "FFMA") > waited


def test_the_cli_describes_the_promotion_and_the_scales_stage(capsys):
    from spatialc.cli import main

    status = main(
        ["gemm", "150", "140", "384", "--precision", "e4m3", "--scales", "1x128,128x128", "--target", "sm_90a"]
    )
    out, err = capsys.readouterr()
    assert status == 0, out + err
    assert "scale_aᵀ 1x128 unswizzled" in out and "each group waited for and promoted by its scales" in out
    assert "A's scales 2048 B" in out  # 4 stages of 128 rows' floats

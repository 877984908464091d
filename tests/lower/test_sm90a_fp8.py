"""8-bit float GEMMs in the sm_90a form (issue 34, item 6's sm_90a half): e4m3 and e5m2 operands multiplied by
`wgmma.mma_async … m64nNk32.f32.e4m3.e4m3` (e5m2), both K-major from int8's panels, float32 accumulators and the float
fused store. The emulated wgmma decodes the bytes exactly and runs within the kernel's bound of the interpreter, which
is wide enough for Hopper's reduced-precision 8-bit sums (`tolerance.FP8_WGMMA_STEP`); a planted fault in the
emulation or in the kernel text is caught; nvcc compiles it for sm_90a clean, its main loop QGMMA."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import numpy as np
import pytest

import spatialc
from spatialc.errors import PlanError
from spatialc.lower.errors import Unsupported
from spatialc.numerics.tolerance import FP8_WGMMA_STEP
from spatialc.runtime import emu_compile
from spatialc.runtime import emulate as emulation
from spatialc.runtime.sass import disassemble, find_cuobjdump, main_loop_census
from tests.test_fp8 import SCALED, scaled_inputs

NVCC = shutil.which("nvcc")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def hopper_gemm(m, n, k, prec, epilogue=SCALED, out="float32", **kw):
    return spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=list(epilogue), out=out), "sm_90a", **kw)


def emulated(p, x, text=None):
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a"
    if text is not None:
        art = dataclasses.replace(art, program_cu=text(art.program_cu))
    return spatialc.emulate(art, x)


CASES = {
    # odd M, N and K (53: a k32 step, then one whose upper half is padding), row and column scales and a bias
    "e4m3-scaled": ("e4m3", (37, 29, 53), SCALED, "float32"),
    # two items of 128 rows, K of three k32 steps; a column scale and a bias into bf16 (the stmatrix store)
    "e5m2-bf16": ("e5m2", (150, 40, 96), [spatialc.col_scale(), spatialc.bias()], "bf16"),
}


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", CASES)
def test_the_emulated_wgmma_is_within_the_kernel_bound_of_the_interpreter(case):
    prec, (m, n, k), epilogue, out = CASES[case]
    p = hopper_gemm(m, n, k, prec, epilogue, out=out)
    names = {"A", "B", *(e.name for e in epilogue)}
    x = {key: v for key, v in scaled_inputs(m, n, k, prec).items() if key in names}
    c = emulated(p, x)
    assert c.shape == (m, n)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    # The emulation sums exact products in float32: far inside the bound the hardware's sums need.
    want = spatialc.evaluate(p, x).astype(np.float64)
    assert np.abs(c.astype(np.float64) - want).max() <= (1e-3 if out == "float32" else 2**-7) * np.abs(want).max()


@needs_gxx
@pytest.mark.emulation
def test_a_residual_of_e4m3_values_read_by_tma_into_an_fp16_c():
    """The residual's page lands a 16 x 16 box of bytes a tile (its map's elements 1 byte, as int8's) and the fused
    store adds it to the scaled sum; C is fp16 (stmatrix)."""
    m, n, k = 70, 48, 96
    p = hopper_gemm(m, n, k, "e4m3", [spatialc.col_scale(), spatialc.residual()], out="fp16")
    assert {t.name: t.dtype.value for t in p.tensors}["residual"] == "e4m3"
    x = {key: v for key, v in scaled_inputs(m, n, k, "e4m3").items() if key in ("A", "B", "col_scale")}
    x["residual"] = np.random.default_rng(1).integers(-16, 16, (m, n)).astype(np.float32) / 4  # e4m3 values
    c = emulated(p, x)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    want = spatialc.evaluate(p, x).astype(np.float64)
    assert np.abs(c.astype(np.float64) - want).max() <= 2**-10 * np.abs(want).max()


@needs_gxx
@pytest.mark.emulation
def test_an_emulated_wgmma_decoding_e4m3_bytes_as_e5m2_is_caught(tmp_path, monkeypatch):
    headers = tmp_path / "emu"
    shutil.copytree(emulation.HEADER_DIR, headers)
    half = headers / "emu_half.h"
    right = "explicit operator float() const {  // exact; e4m3fn's top exponent holds normal numbers, all but its NaN"
    assert right in half.read_text()
    # Fp8's conversion to float, its first statement now e5m2's decoding
    half.write_text(half.read_text().replace(right, f"{right}\n        return float(decode_fp8(__x, 2, 5, false));"))
    monkeypatch.setattr(emu_compile, "HEADER_DIR", headers)
    p = hopper_gemm(37, 29, 53, "e4m3", [])
    x = {key: v for key, v in scaled_inputs(37, 29, 53, "e4m3").items() if key in "AB"}
    ok, how = spatialc.tolerance(p, kernel=True).check(emulated(p, x), x)
    assert not ok, how


@needs_gxx
@pytest.mark.emulation
def test_a_b_descriptor_that_drops_its_k_offset_is_caught():
    """Every wgmma of a K step (96 bytes: three) reads B's first 32 bytes of K: A's k 32-63 meet B's k 0-31."""
    p = hopper_gemm(37, 29, 96, "e4m3", [], block=(8, 2, 6))
    x = {key: v for key, v in scaled_inputs(37, 29, 96, "e4m3").items() if key in "AB"}
    b_at = "spatialc_wgmma_desc((const char*)(ring_1"

    def dropped(text):
        at = text.index(b_at)
        end = text.index(", 16u,", at)
        assert "(kk * 16 * (int)sizeof(OPT))" in text[at:end]
        return text[:at] + text[at:end].replace("(kk * 16 * (int)sizeof(OPT))", "0") + text[end:]

    ok, how = spatialc.tolerance(p, kernel=True).check(emulated(p, x, dropped), x)
    assert not ok, how


@pytest.mark.parametrize("prec", ["e4m3", "e5m2"])
def test_auto_on_sm90a_prints_the_wgmma_of_the_8_bit_floats_on_int8s_panels(prec):
    p = hopper_gemm(37, 29, 53, prec)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and not art.notes
    text = art.kernel_cu
    assert f"wgmma.mma_async.sync.aligned.m64n16k32.f32.{prec}.{prec}" in text and "p, 1, 1;" in text
    assert f"typedef __nv_fp8_{prec} OPT;" in text and "ACCT" in text
    assert dict(art.budget.layouts) == {"A_ring": "panels", "B_ring": "panels_t"}  # int8's: both K-major
    assert [p.order for p in art.launch.params if p.name in ("A", "B")] == ["rows", "cols"]
    # the same program as int8's but for its types: the same plan, pages and K steps
    int8 = spatialc.build(spatialc.gemm(37, 29, 53, "int8"), "sm_90a")
    assert int8.plan == p.plan


def test_the_other_targets_keep_their_forms_and_split_k_is_the_sm90a_forms_too():
    assert spatialc.lower(spatialc.build(spatialc.gemm(48, 40, 72, "e4m3"), "sm_90")).budget.form == "persistent"
    with pytest.raises(Unsupported, match="the sm_90a form on sm_89"):
        spatialc.lower(spatialc.build(spatialc.gemm(48, 40, 72, "e4m3"), "sm_89"), form="sm90a")
    split = hopper_gemm(48, 40, 512, "e4m3", [], split_k=2)
    assert any(t.role.value == "workspace" for t in split.tensors)
    assert spatialc.lower(split).budget.form == "sm90a"  # its consumers move the partial sums (sm90a/partials.py)
    with pytest.raises(PlanError, match="e4m3 K steps of 3 tiles: an 8-bit wgmma takes K in pairs of tiles"):
        hopper_gemm(37, 29, 53, "e4m3", block=(8, 1, 3), form="sm90a")
    forced = spatialc.lower(hopper_gemm(37, 29, 53, "e4m3", block=(2, 4, 3)))  # a block wgmma does not take: mma.sync
    assert forced.budget.form == "persistent" and "mma.sync.aligned.m16n8k32.row.col.f32.e4m3" in forced.kernel_cu


def test_the_kernel_bound_of_the_sm90a_fp8_kernel_counts_its_wgmma_steps():
    k = 4096
    hopper = hopper_gemm(128, 256, k, "e4m3", [])
    other = spatialc.build(spatialc.gemm(128, 256, k, "e4m3"), "sm_90")
    assert spatialc.tolerance(hopper, kernel=True).ulps == k + 4 + (k // 32) * FP8_WGMMA_STEP  # 2^-6 + ... of |A|@|B|
    assert spatialc.tolerance(other, kernel=True).ulps == k + 4  # mma.sync's float32 sums
    assert spatialc.tolerance(hopper).ulps == 4  # the interpreter's
    assert "8-bit float wgmma" in spatialc.tolerance(hopper, kernel=True).text


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """e4m3 and e5m2 sm_90a kernels of 4096³ (the planner's 128 x 256 items, K steps of 128 bytes) with the dequant
    epilogue into bf16, compiled once each for sm_90a with -Werror."""
    done = {}
    for prec in ("e4m3", "e5m2"):
        art = spatialc.lower(hopper_gemm(4096, 4096, 4096, prec, out="bf16"))
        src = tmp_path_factory.mktemp("fp8") / f"{prec}.cu"
        src.write_text(art.kernel_cu)
        cubin = src.with_suffix(".cubin")
        cmd = [NVCC, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-Werror", "all-warnings"]
        proc = subprocess.run([*cmd, "-Xptxas", "-v", "-o", str(cubin), str(src)], capture_output=True, text=True)
        done[prec] = (proc, cubin)
    return done


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("prec", ["e4m3", "e5m2"])
def test_nvcc_compiles_it_clean_and_its_main_loop_is_qgmma(compiled, prec):
    proc, cubin = compiled[prec]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in proc.stderr
    assert not re.findall(r"\(C75\d\d\)", proc.stderr), proc.stderr  # ptxas fixing or serialising the wgmma
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    loop = main_loop_census(disassemble(cubin, tool))
    ty = prec.upper()
    assert loop is not None and loop.mmas == ((f"QGMMA.64x256x32.F32.{ty}.{ty}", 4),), loop  # 128 bytes of K a step
    assert loop.tile_macs == 128  # 2 warpgroups x 64 x 256 x 128 / (16³ x 8 warps) a warp


@needs_gxx
@pytest.mark.emulation
def test_the_cli_runs_an_e5m2_gemm_in_the_sm90a_form_within_its_bound(capsys):
    from spatialc.cli import main

    args = ["gemm", "70", "50", "96", "--precision", "e5m2", "--target", "sm_90a", "--row-scale", "--bias", "--run"]
    status = main(args)
    out, err = capsys.readouterr()
    assert status == 0, out + err
    assert "sm_90a form" in out and "with wgmma m64n16k32" in out  # 32 K elements an 8-bit wgmma
    assert "C equals the numpy reference within its bound" in out and "8-bit float wgmma sums" in out

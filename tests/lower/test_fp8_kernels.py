"""8-bit float GEMMs printed (issue 34, item 6's first half): the persistent and general forms multiply e4m3 and e5m2
operands with sm_89's mma.sync m16n8k32 (`common/tensor_core_fp8.cuh`), their pages laid out and loaded as int8's,
float32 accumulators and the float epilogue. The host emulation runs them within the kernel's bound of the
interpreter's result, a planted fault in the emulation or in the kernel text is caught, nvcc compiles them for sm_89
and sm_90 without a warning, and sm_80 / sm_86 refuse them by one line (the sm_90a form's wgmma: test_sm90a_fp8.py)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import numpy as np
import pytest

import spatialc
from spatialc import inputs
from spatialc.cli import main
from spatialc.inputs import InexactInputWarning
from spatialc.lower.errors import Unsupported
from spatialc.runtime import emu_compile
from spatialc.runtime import emulate as emulation
from spatialc.runtime import launch as launcher
from spatialc.runtime.nvcc import compile_cubin
from spatialc.runtime.sass import disassemble, find_cuobjdump, main_loop_census
from spatialc.runtime.tilize import element_type, fp8_values, quantize, storage_dtype
from tests.nvcc_clean import assert_clean, nvcc_compile, nvcc_device
from tests.stand_in import StandInDevice, product
from tests.test_fp8 import FORMATS, SCALED, scaled_inputs

NVCC = shutil.which("nvcc")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def fp8_gemm(m, n, k, prec, target="sm_90", epilogue=SCALED, **kw):
    return spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=list(epilogue)), target, **kw)


def emulated(p, form, x, text=None):
    """C of `p` lowered in `form` (its program_cu replaced by `text` when given), run through the emulation."""
    art = spatialc.lower(p, form=form)
    assert art.budget.form == form
    if text is not None:
        art = dataclasses.replace(art, program_cu=text(art.program_cu))
    return spatialc.emulate(art, x)


CASES = {
    # K = 53: four K tiles, two k32 steps of a 3-tile page then one k16 (the upper k zero); odd M and N
    "e4m3-persistent-ibw3": ("e4m3", "persistent", (37, 29, 53), {"block": (2, 4, 3)}),
    "e5m2-general-ibw3": ("e5m2", "general", (37, 29, 53), {"block": (2, 4, 3), "form": "general"}),
    "e4m3-general-split-k": ("e4m3", "general", (33, 20, 160), {"split_k": 2, "form": "general"}),
    "e5m2-persistent-sm89": ("e5m2", "persistent", (48, 40, 72), {"target": "sm_89"}),
}


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", CASES)
def test_the_emulated_kernel_is_within_the_kernel_bound_of_the_interpreter(case):
    prec, form, (m, n, k), kw = CASES[case]
    p = fp8_gemm(m, n, k, prec, **kw)
    if "split_k" in kw:
        assert any(t.role.value == "workspace" for t in p.tensors)
    x = scaled_inputs(m, n, k, prec)
    c = emulated(p, form, x)
    want = spatialc.evaluate(p, x)
    assert c.dtype == np.float32 and c.shape == (m, n)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    # float32 sums of exact products: near the float64 sum, not equal to it everywhere
    assert np.abs(c - want).max() <= 1e-3 * np.abs(want).max()


@needs_gxx
@pytest.mark.emulation
def test_a_bf16_output_of_the_general_form():
    gemm = spatialc.gemm(33, 20, 40, "e4m3", epilogue=[spatialc.col_scale()], out="bf16")
    p = spatialc.build(gemm, "sm_90", form="general")
    x = {k: v for k, v in scaled_inputs(33, 20, 40, "e4m3").items() if k in ("A", "B", "col_scale")}
    c = emulated(p, "general", x)
    assert spatialc.tolerance(p, kernel=True).check(c, x)[0]


@needs_gxx
@pytest.mark.emulation
def test_a_fragment_register_order_swapped_in_the_kernel_text_is_caught():
    """B's two K tiles of a k32 step loaded the other way round: A's k 0-15 meet B's k 16-31."""
    p = fp8_gemm(37, 29, 53, "e4m3", block=(2, 4, 3))
    x = scaled_inputs(37, 29, 53, "e4m3")

    def swapped(text):
        out, n = re.subn(r"spatialc_load_b2\((\w+\[c\]), ([^,]+), ([^;]+)\);", r"spatialc_load_b2(\1, \3, \2);", text)
        assert n >= 1
        return out

    c = emulated(p, "persistent", x, swapped)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


@needs_gxx
@pytest.mark.emulation
def test_an_emulation_decoding_e4m3_bytes_as_e5m2_is_caught(tmp_path, monkeypatch):
    headers = tmp_path / "emu"
    shutil.copytree(emulation.HEADER_DIR, headers)
    half = headers / "emu_half.h"
    right = "explicit operator float() const {  // exact; e4m3fn's top exponent holds normal numbers, all but its NaN"
    assert right in half.read_text()
    # Fp8's conversion to float, its first statement now e5m2's decoding
    half.write_text(half.read_text().replace(right, f"{right}\n        return float(decode_fp8(__x, 2, 5, false));"))
    monkeypatch.setattr(emu_compile, "HEADER_DIR", headers)
    p = fp8_gemm(37, 29, 53, "e4m3", epilogue=[])
    x = {k: v for k, v in scaled_inputs(37, 29, 53, "e4m3").items() if k in "AB"}
    c = emulated(p, "persistent", x)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


def test_the_kernels_use_the_fp8_mma_and_int8_pages():
    p = fp8_gemm(37, 29, 53, "e5m2", block=(2, 4, 3))
    for form in ("persistent", "general"):
        art = spatialc.lower(p, form=form)
        text = art.kernel_cu
        assert "#include <cuda_fp8.h>" in text and "typedef __nv_fp8_e5m2 OPT;" in text
        assert "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32" in text
        assert "spatialc_mma2(" in text and "spatialc_mma(" in text  # k32 steps, then the page's last tile
        assert ("A_ring", "row") in art.budget.layouts and ("B_ring", "col") in art.budget.layouts  # int8's pages
    bf16 = spatialc.lower(spatialc.build(spatialc.gemm(37, 29, 53, "bf16"), "sm_90"))
    assert "cuda_fp8.h" not in bf16.kernel_cu and "tensor_core_fp8" not in bf16.kernel_cu  # other kernels unchanged


@pytest.mark.parametrize("target", ["sm_80", "sm_86"])
def test_targets_without_fp8_mma_are_refused_by_one_line(target):
    p = fp8_gemm(48, 40, 72, "e4m3", target=target)
    assert p.verified
    for form in ("auto", "persistent", "general"):
        with pytest.raises(Unsupported, match=rf"for {target}: 8-bit float operands need .* sm_89 and later"):
            spatialc.lower(p, form=form)
    with pytest.raises(Unsupported, match="sm_89 and later"):
        spatialc.lower(fp8_gemm(48, 40, 72, "e4m3"), target)  # a program of sm_90 lowered for it


def test_the_launcher_takes_fp8_as_uint8_bits():
    assert element_type("__nv_fp8_e4m3*") == "float8_e4m3fn" and storage_dtype("float8_e5m2") == "uint8"
    x = np.array([1.0, -0.3, 448.0, 2.0**-9, 0.0, 57344.0])
    for elem, ty in (("float8_e4m3fn", FORMATS["e4m3"]), ("float8_e5m2", FORMATS["e5m2"])):
        given = x[:-1] if elem == "float8_e4m3fn" else x
        bits = quantize(given, elem, np)
        assert bits.dtype == np.uint8 and np.array_equal(bits, given.astype(ty).view(np.uint8))
        assert np.array_equal(fp8_values(bits, elem, np), given.astype(ty).astype(np.float32))


def test_the_cli_emits_an_fp8_kernel_and_refuses_sm80_by_one_line(capsys, tmp_path):
    status = main(["gemm", "48", "40", "72", "--precision", "e4m3", "--row-scale", "--emit", str(tmp_path)])
    out, _ = capsys.readouterr()
    assert status == 0, out
    assert "e4m3.e4m3.f32" in (tmp_path / "kernel.cu").read_text()
    status = main(["gemm", "48", "40", "72", "--precision", "e5m2", "--target", "sm_86", "--emit", str(tmp_path / "x")])
    _, err = capsys.readouterr()
    assert status == 2 and err.count("\n") == 1 and "sm_89 and later" in err


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """An e4m3 persistent program_cu (a page of 3 K tiles: k32, then the k16 tail) and an e5m2 general one (its
    planned block), both with the dequant epilogue, compiled by nvcc -Werror for sm_89 and sm_90 in one call each:
    the e4m3 one in host mode (`-c`, which covers the fp8 host code: gcc -Wall -Wextra -Werror), the e5m2 one
    device-only (-fatbin; its host code differs from the e4m3 one's only in the element type)."""
    arts = {
        "e4m3-persistent": spatialc.lower(fp8_gemm(37, 29, 53, "e4m3", block=(2, 4, 3)), form="persistent"),
        "e5m2-general": spatialc.lower(fp8_gemm(37, 29, 53, "e5m2", form="general"), form="general"),
    }
    host = {"e4m3-persistent": nvcc_compile, "e5m2-general": nvcc_device}
    return {
        name: host[name](art.program_cu, tmp_path_factory.mktemp("fp8") / f"{name}.cu", ("89", "90"), timeout=600)
        for name, art in arts.items()
    }


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", ["e4m3-persistent", "e5m2-general"])
def test_nvcc_compiles_the_fp8_kernels_for_sm89_and_sm90_clean_without_spills(compiled, name):
    assert_clean(compiled[name], ("89", "90"))


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_ptxas_refuses_the_fp8_mma_for_sm86_which_is_why_lower_does(tmp_path):
    art = spatialc.lower(fp8_gemm(48, 40, 72, "e4m3"), form="persistent")
    src = tmp_path / "k.cu"
    src.write_text(art.kernel_cu)
    # device-only (-cubin): the refusal is ptxas's, and kernel_cu has no host code
    proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_86", "-cubin", "-o", str(tmp_path / "k.cubin"), str(src)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode != 0 and "requires .target sm_89 or higher" in proc.stderr


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None or find_cuobjdump() is None, reason="nvcc and cuobjdump are needed")
def test_the_sass_is_sm89s_fp8_mma_and_on_sm90_ptxas_unpacks_to_fp16():
    """sm_89 runs mma.sync e4m3 as QMMA.16832; on sm_90 ptxas widens the bytes to fp16 (exact) and runs two
    HMMA.16816 a k32 step — Hopper's 8-bit float tensor-core path is wgmma, the sm_90a form's (test_sm90a_fp8.py)."""
    art = spatialc.lower(fp8_gemm(256, 256, 256, "e4m3"))
    assert art.budget.form == "persistent"
    on89 = main_loop_census(disassemble(compile_cubin(art.kernel_cu, "sm_89")))
    assert on89 is not None and [op for op, _ in on89.mmas] == ["QMMA.16832.F32.E4M3.E4M3"]
    sass90 = disassemble(compile_cubin(art.kernel_cu, "sm_90"))
    on90 = main_loop_census(sass90)
    assert on90 is not None and {op.split(".")[0] for op, _ in on90.mmas} == {"HMMA"}
    assert on90.tile_macs == on89.tile_macs  # the same work: one QMMA.16832 is two HMMA.16816
    (loop,) = sass90.main_loops()
    assert sass90.count("F2FP.F16.E4M3.UNPACK_B", *loop) > 0


def fp8_mlp():
    """The MLP example in e4m3, its pages laid out as an 8-bit kernel reads them (A row-major, B K-major)."""
    from tests.lang.test_mlp import MLP

    source = MLP.read_text().replace('precision="bf16"', 'precision="e4m3"')
    layouts = {
        'p.input("W1", K, H)': 'p.input("W1", K, H, order="col")',
        'p.input("W2", H, N)': 'p.input("W2", H, N, order="col")',
        '"W1_ring", depth=2, tiles=4 * 4, layout="swizzled"': '"W1_ring", depth=2, tiles=4 * 4, layout="col"',
        '"W2_ring", depth=2, tiles=4 * 4, layout="swizzled"': '"W2_ring", depth=2, tiles=4 * 4, layout="col"',
        '"X_ring", depth=2, tiles=2 * 4, layout="swizzled"': '"X_ring", depth=2, tiles=2 * 4',
    }
    for old, new in layouts.items():
        assert old in source
        source = source.replace(old, new)
    scope: dict[str, object] = {"__name__": "mlp_e4m3"}
    exec(compile(source, str(MLP), "exec"), scope)
    return scope["mlp"]()


@needs_gxx
@pytest.mark.emulation
def test_an_e4m3_mlp_rounds_its_hidden_page_to_e4m3_in_the_general_form():
    """The gelu's float32 values stored into the second matmul's A page by cuda_fp8.h's saturating constructor
    (`MmaTypes.to_operand`), as the interpreter rounds a computed operand."""
    program = fp8_mlp()
    rng = np.random.default_rng(2)
    ty = FORMATS["e4m3"]
    x = {
        "X": rng.standard_normal((64, 64)).astype(ty),
        "W1": (rng.standard_normal((64, 128)) / 4).astype(ty),
        "W2": (rng.standard_normal((128, 64)) / 8).astype(ty),
    }
    art = spatialc.lower(program)
    assert art.budget.form == "general" and "__nv_fp8_e4m3(v)" in art.kernel_cu
    c = spatialc.emulate(art, x)
    ok, how = spatialc.tolerance(program, kernel=True).check(c, x)
    assert ok, how


@needs_gxx
@pytest.mark.emulation
def test_map_and_row_programs_of_fp8_inputs_are_printed_in_both_forms_on_any_target():
    """They multiply nothing: each byte converted to float32 (cuda_fp8.h's exact conversion) as a page is read."""
    from spatialc import ew

    x0, x1 = ew.inputs(2)
    rng = np.random.default_rng(3)
    ty = FORMATS["e5m2"]
    mapped = spatialc.build(spatialc.elementwise(x0 * x1 + 1.0, 37, 29, "e5m2"), "sm_80")
    x = {"x0": rng.standard_normal((37, 29)).astype(ty), "x1": rng.standard_normal((37, 29)).astype(ty)}
    for form in ("general", "persistent"):
        art = spatialc.lower(mapped, form=form)
        assert "#include <cuda_fp8.h>" in art.kernel_cu and "spatialc_mma" not in art.kernel_cu
        assert np.array_equal(spatialc.emulate(art, x), spatialc.evaluate(mapped, x))  # each op rounded once
    rows = spatialc.build(spatialc.softmax(37, 29, "e4m3"), "sm_86")
    xs = {"x": rng.standard_normal((37, 29)).astype(FORMATS["e4m3"])}
    assert spatialc.tolerance(rows, kernel=True).check(spatialc.emulate(spatialc.lower(rows), xs), xs)[0]


def test_run_uploads_fp8_operands_as_their_bytes_rounding_float_inputs_once(monkeypatch):
    monkeypatch.setattr(inputs, "_WARNED", set())  # the once-per-process warning, seen here
    p = fp8_gemm(37, 29, 53, "e4m3", epilogue=[])
    art = spatialc.lower(p)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((37, 53)).astype(FORMATS["e4m3"])  # an ml_dtypes array, taken as it is
    b = rng.standard_normal((53, 29))  # float64, rounded to e4m3 once (and said so)
    dev = StandInDevice(art, product)  # its kernel decodes the two 8-bit float operands' bytes and multiplies them
    with pytest.warns(InexactInputWarning, match="e4m3 inputs that are not e4m3 values were rounded"):
        c = launcher.run_with(dev, art, a, b)
    assert {x: dev.given(x).dtype for x in "AB"} == {"A": np.uint8, "B": np.uint8}
    assert np.array_equal(c, spatialc.evaluate(p, {"A": a, "B": b}))

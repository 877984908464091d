"""The GPU launcher without a GPU: argument handling, operand rounding, the tiled layout, the no-GPU error.

A numpy stand-in device (tests/stand_in.py) plays the GPU: its "kernel" reads the tiled operands, multiplies them and
writes the tiled result, so the launcher's whole path (bind, convert, tilize, poison, launch order, untilize, library)
runs here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest

import spatialc
from spatialc.errors import SpatialError
from spatialc.inputs import InputError
from spatialc.lower.artifact import Budget, Census, CudaArtifact, KernelParam, Launch
from spatialc.runtime import discover
from spatialc.runtime import launch as L
from spatialc.runtime import nvcc as N
from spatialc.runtime.tilize import (
    LaunchError,
    bf16_bits,
    bf16_to_float32,
    element_type,
    poison_value,
    quantize,
    tile_offset,
    tilize,
    untilize,
    unwritten,
    work_list,
)

from ..stand_in import StandInDevice, product, reference_kernel

OPERAND_C = {"int8": "signed char", "fp16": "__half", "bf16": "__nv_bfloat16"}
OUT_C = {"int8": "long long", "fp16": "float", "bf16": "float"}


def artifact(m, n, k, precision="int8", *, pad=(0, 0, 0), dyn_smem=0, bias=False):
    """A hand-made artifact for C[m×n] = A[m×k] @ B[k×n] on a tile grid padded by `pad` extra tiles."""
    mt, nt, kt = (math.ceil(m / 16) + pad[0], math.ceil(n / 16) + pad[1], math.ceil(k / 16) + pad[2])
    params = [
        KernelParam("A", f"const {OPERAND_C[precision]}", "input", (m, k), (mt, kt)),
        KernelParam("B", f"const {OPERAND_C[precision]}", "input", (k, n), (kt, nt)),
        KernelParam("C", OUT_C[precision], "output", (m, n), (mt, nt)),
    ]
    if bias:
        params.append(KernelParam("bias", "float", "parameter", (1, n), (1, nt)))
    launch = Launch("spatialc_persistent", grid=7, block=256, dyn_smem=dyn_smem, params=tuple(params))
    budget = Budget(0, False, False, dyn_smem, 0, 64, 1, 256)
    return CudaArtifact("sm_90", "", "", "// kernel text", launch, budget, Census({}, {}))


class Torchish(np.ndarray):
    """Looks like a torch tensor to the launcher's library check."""


Torchish.__module__ = "torch"


class Cupyish(np.ndarray):
    """Looks like a CuPy array to the launcher's library check."""


Cupyish.__module__ = "cupy"


def run_fake(art, a, b, **params):
    dev = StandInDevice(art, product)
    return L.run_with(dev, art, a, b, **params), dev


# ---- the tiled layout ----------------------------------------------------------------------------------------


def test_tilize_places_every_element_at_its_tile_offset_and_pads_with_zero():
    rng = np.random.default_rng(1)
    x = rng.integers(1, 100, size=(37, 50))
    tiles = (4, 5)  # one more tile row than 37 needs; 50 needs 4 tile columns, one more given
    flat = tilize(x, tiles, np)
    assert flat.shape == (4 * 5 * 256,)
    expected = np.zeros(4 * 5 * 256, dtype=x.dtype)
    for i in range(37):
        for j in range(50):
            expected[tile_offset(i, j, cols_t=5)] = x[i, j]
    np.testing.assert_array_equal(flat, expected)
    assert np.count_nonzero(flat) == x.size  # everything else is zero padding


def test_tile_offset_is_the_documented_formula():
    # tile (ti, tj) at (ti * cols_t + tj) * 256, row-major in a 16×16 tile
    assert tile_offset(0, 0, 3) == 0
    assert tile_offset(0, 17, 3) == 256 + 1
    assert tile_offset(17, 2, 3) == (1 * 3 + 0) * 256 + 1 * 16 + 2
    assert tile_offset(31, 47, 3) == (1 * 3 + 2) * 256 + 15 * 16 + 15


def test_untilize_inverts_tilize():
    x = np.arange(33 * 19, dtype=np.float32).reshape(33, 19)
    np.testing.assert_array_equal(untilize(tilize(x, (3, 2), np), (3, 2), (33, 19), np), x)
    for order in ("col", "rows", "cols"):
        np.testing.assert_array_equal(
            untilize(tilize(x, (3, 2), np, order=order), (3, 2), (33, 19), np, order=order), x
        )


def test_rows_and_cols_are_the_padded_matrix_and_its_transpose_not_tiles():
    x = np.arange(1, 33 * 19 + 1).reshape(33, 19)
    rows, cols = tilize(x, (3, 2), np, order="rows"), tilize(x, (3, 2), np, order="cols")
    padded = np.zeros((48, 32), dtype=x.dtype)
    padded[:33, :19] = x
    np.testing.assert_array_equal(rows, padded.reshape(-1))  # element (i, j) at i * 32 + j
    np.testing.assert_array_equal(cols, padded.T.reshape(-1))  # element (i, j) at j * 48 + i
    assert rows[5 * 32 + 7] == x[5, 7] and cols[7 * 48 + 5] == x[5, 7]
    with pytest.raises(InputError, match="'rows' or 'cols'"):
        spatialc.tilize(x, order="diagonal")


def test_tilize_refuses_a_grid_too_small():
    with pytest.raises(LaunchError, match="needs 3×2 tiles"):
        tilize(np.zeros((33, 19)), (2, 2), np)


# ---- operand rounding ----------------------------------------------------------------------------------------


def exact_bf16(x: float) -> float:
    """Round a normal float64 to bfloat16 (8 significant bits) with exact rational arithmetic, ties to even."""
    if x == 0 or not math.isfinite(x):
        return x
    _, e = math.frexp(x)
    scaled = Fraction(x) * Fraction(2) ** (8 - e)
    n = round(scaled)  # Python's round on a Fraction is half-to-even
    return float(n * Fraction(2) ** (e - 8))


def test_bf16_rounds_float32_to_nearest_even():
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F80C000, 0x3F807FFF], dtype=np.uint32)
    got = bf16_bits(ties.view(np.float32), np)
    assert [hex(v) for v in got] == ["0x3f80", "0x3f82", "0xbf80", "0x3f81", "0x3f80"]
    special = np.array([np.inf, -np.inf, np.nan, 3.4e38, -0.0], dtype=np.float32)
    bits = bf16_bits(special, np)
    back = bf16_to_float32(bits, np)
    assert back[0] == np.inf and back[1] == -np.inf and np.isnan(back[2])
    assert back[3] == np.inf  # above bf16's largest finite value: rounds to infinity
    assert bits[4] == 0x8000


def test_float64_to_bf16_is_one_rounding_not_two():
    rng = np.random.default_rng(7)
    xs = list(rng.standard_normal(300) * 10.0 ** rng.integers(-5, 6, size=300))
    # 1 + 2^-8 is halfway between two bf16 values; a float32 step first would land on the tie and round to even.
    xs += [1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 1 + 3 * 2**-8 - 2**-40, 1 + 2**-8]
    got = bf16_to_float32(quantize(np.array(xs), "bfloat16", np), np).astype(np.float64)
    assert list(got) == [exact_bf16(x) for x in xs]


def test_float64_to_fp16_matches_numpys_direct_rounding():
    rng = np.random.default_rng(8)
    xs = np.concatenate([rng.uniform(-70000, 70000, 500), [1 + 2**-11 + 2**-40, 2.0**-20, 1e-9, 1e6]])
    got = quantize(xs, "float16", np)
    assert got.dtype == np.float16
    with np.errstate(over="ignore"):  # 1e6 overflows fp16 to infinity, on purpose
        np.testing.assert_array_equal(got, xs.astype(np.float16))  # numpy rounds float64 → float16 once
    assert got[500] == np.float16(1 + 2**-10)  # the case a float32 detour rounds down


def test_int8_operands_round_half_to_even_and_are_range_checked():
    got = quantize(np.array([0.5, 1.5, 2.5, -0.5, -1.5, 127.4, -128.0]), "int8", np)
    assert got.dtype == np.int8 and list(got) == [0, 2, 2, 0, -2, 127, -128]
    with pytest.raises(LaunchError, match=r"outside int8's \[-128, 127\]"):
        quantize(np.array([1, 200]), "int8", np, name="A")
    with pytest.raises(LaunchError, match="NaN or infinity"):
        quantize(np.array([1.0, np.nan]), "int8", np)
    with pytest.raises(LaunchError, match="complex"):
        quantize(np.array([1j]), "float16", np)


def test_element_types_of_c_types():
    assert element_type("const signed char* __restrict__") == "int8"
    assert element_type("__nv_bfloat16") == "bfloat16"
    assert element_type("long long") == "int64"
    with pytest.raises(LaunchError, match="not one the launcher knows"):
        element_type("float4")


def test_poison_is_counted():
    buf = np.full(8, poison_value("float32"), dtype=np.float32)
    buf[:5] = 1.0
    assert unwritten(buf, "float32", np) == 3
    ints = np.full(4, poison_value("int64"), dtype=np.int64)
    ints[0] = 0
    assert unwritten(ints, "int64", np) == 3


# ---- run_with on the stand-in device -------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["int8", "fp16", "bf16"])
def test_run_converts_tiles_launches_and_untiles(precision):
    m, n, k = 37, 21, 40
    art = artifact(m, n, k, precision, pad=(1, 0, 2), dyn_smem=64 * 1024)
    rng = np.random.default_rng(3)
    # int8 operands as whole floats: the launcher checks them as the interpreter does (never rounds them)
    a = np.rint(rng.uniform(-100, 100, (m, k))) if precision == "int8" else rng.standard_normal((m, k))
    b = np.rint(rng.uniform(-100, 100, (k, n))) if precision == "int8" else rng.standard_normal((k, n))
    c, dev = run_fake(art, a, b)
    assert isinstance(c, np.ndarray) and c.shape == (m, n)
    ((kernel, grid, block, smem, args),) = dev.launches
    assert (kernel[1], grid, block, smem) == ("spatialc_persistent", 7, 256, 64 * 1024)
    assert [x.size for x in args] == [4 * 5 * 256, 5 * 2 * 256, 4 * 2 * 256]
    assert np.isnan(args[2]).all() if precision != "int8" else (args[2] == np.iinfo(np.int64).min).all()
    if precision == "int8":
        assert c.dtype == np.int64
        np.testing.assert_array_equal(c, np.rint(a).astype(np.int64) @ np.rint(b).astype(np.int64))
    else:
        ra = quantize(a, "float16", np) if precision == "fp16" else bf16_to_float32(quantize(a, "bfloat16", np), np)
        rb = quantize(b, "float16", np) if precision == "fp16" else bf16_to_float32(quantize(b, "bfloat16", np), np)
        assert c.dtype == np.float32
        np.testing.assert_allclose(c, ra.astype(np.float64) @ rb.astype(np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_run_takes_the_launch_contract_of_a_lowered_kernel(precision):
    art = spatialc.lower(spatialc.build(spatialc.gemm(40, 24, 56, precision), "sm_90"))
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (40, 56)) if precision == "int8" else rng.standard_normal((40, 56))
    b = rng.integers(-128, 128, (56, 24)) if precision == "int8" else rng.standard_normal((56, 24))
    c, dev = run_fake(art, a, b)
    ((_, grid, block, smem, _),) = dev.launches
    assert (grid, block, smem) == (art.launch.grid, art.launch.block, art.launch.dyn_smem)
    if precision == "int8":
        np.testing.assert_array_equal(c, a @ b)
    else:
        ra, rb = (bf16_to_float32(quantize(x, "bfloat16", np), np).astype(np.float64) for x in (a, b))
        np.testing.assert_allclose(c, ra @ rb, rtol=1e-6, atol=1e-6)


def test_run_gives_a_kernel_its_work_list_after_its_tensors(monkeypatch):
    """What the printed kernel takes after its tensors — the work list, and the sync words of sites that wait on each
    other (tests/test_split_k.py) — `run` passes as `Prepared.order` does: it launched the tensors alone before, and a
    GPU would have read the work list from whatever came next. The stand-in's signature check stops such a launch."""
    art = spatialc.lower(spatialc.build(spatialc.gemm(40, 24, 56, "int8"), "sm_90"))
    a, b = np.ones((40, 56)), np.ones((56, 24))
    dev = StandInDevice(art, product, sms=7)
    assert np.array_equal(L.run_with(dev, art, a, b), a @ b)
    ((_, grid, _, _, args),) = dev.launches
    sites, work = work_list(art.launch, 7)
    assert grid == sites and len(args) == 4 and args[3].dtype == np.int32 and np.array_equal(args[3], work)
    monkeypatch.setattr(L.Prepared, "extra", lambda self: ())  # the launcher as it was
    with pytest.raises(AssertionError, match="the kernel takes 4 arguments"):
        L.run_with(StandInDevice(art, product, sms=7), art, a, b)


def test_run_passes_named_parameters_in_parameter_order():
    art = artifact(20, 18, 16, "fp16", bias=True)
    bias = np.arange(18, dtype=np.float32)
    c, dev = run_fake(art, np.ones((20, 16)), np.ones((16, 18)), bias=bias)
    np.testing.assert_array_equal(c, np.broadcast_to(16 + bias, (20, 18)))
    assert len(dev.launches[0][4]) == 4


def test_result_library_follows_the_inputs():
    art = artifact(16, 16, 16)
    a, b = np.ones((16, 16)), np.ones((16, 16))
    _, dev = run_fake(art, a.view(Torchish), b)
    _, dev2 = run_fake(art, a.view(Cupyish), b.view(Cupyish))
    _, dev3 = run_fake(art, a.tolist(), b)
    assert (dev.downloads, dev2.downloads, dev3.downloads) == (["torch"], ["cupy"], ["numpy"])
    with pytest.raises(InputError, match="mix cupy and torch"):
        run_fake(art, a.view(Torchish), b.view(Cupyish))
    with pytest.raises(InputError, match="pass a numpy, torch or CuPy array"):
        run_fake(art, a, {"not": "an array"})


def test_run_refuses_wrong_shapes_and_names():
    art = artifact(20, 18, 16, "fp16", bias=True)
    a, b, bias = np.ones((20, 16)), np.ones((16, 18)), np.ones(18)
    # Bad inputs are the InputError of spatialc.inputs, with the interpreter's words.
    with pytest.raises(InputError, match=r"tensor A: expected shape \(20, 16\), got \(16, 20\)"):
        run_fake(art, a.T, b, bias=bias)
    with pytest.raises(InputError, match="this kernel needs tensor bias"):
        run_fake(art, a, b)
    with pytest.raises(InputError, match="no input or parameter tensor named scale"):
        run_fake(art, a, b, bias=bias, scale=2.0)
    with pytest.raises(InputError, match=r"A is int8 but holds values outside -128\.\.127"):
        run_fake(artifact(16, 16, 16), np.full((16, 16), 300), np.ones((16, 16)))


def test_launch_errors_are_spatial_errors():
    assert issubclass(LaunchError, SpatialError) and issubclass(L.GpuUnavailable, SpatialError)
    assert issubclass(N.KernelBuildError, SpatialError)
    # The compile half (runtime/nvcc.py) keeps its names under launch too, as the errors table spells them.
    assert L.KernelBuildError is N.KernelBuildError and L.compile_cubin is N.compile_cubin


# ---- no GPU ----------------------------------------------------------------------------------------------------


def test_no_cupy_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy → ImportError
    monkeypatch.setattr(L, "_DEVICE", None)
    monkeypatch.setattr(discover, "DEVICE_PROBES", (lambda: True,))  # a machine with a device, without CuPy
    art = artifact(16, 16, 16)
    with pytest.raises(L.GpuUnavailable) as err:
        spatialc.run(art, np.ones((16, 16)), np.ones((16, 16)))
    assert "CuPy is not installed" in str(err.value) and "\n" not in str(err.value)


class _Runtime:
    def __init__(self, count):
        self.count = count

    def getDeviceCount(self):  # noqa: N802 — CuPy's name
        if isinstance(self.count, Exception):
            raise self.count
        return self.count


class _FakeCupy:
    def __init__(self, count):
        self.cuda = type("cuda", (), {"runtime": _Runtime(count)})()


@pytest.mark.parametrize(
    ("count", "present", "words"),
    [
        (0, True, r"^no GPU: no CUDA device found \(the CUDA driver sees none\)$"),
        (
            RuntimeError("cudaErrorNoDevice\nmore"),
            None,
            r"^no GPU: the CUDA driver did not answer \(cudaErrorNoDevice\)$",
        ),
        (RuntimeError("cudaErrorInsufficientDriver"), False, r"^no GPU: no CUDA device found$"),
    ],
)
def test_no_device_or_driver_is_one_clear_line(monkeypatch, count, present, words):
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy(count))
    monkeypatch.setattr(L, "_DEVICE", None)
    monkeypatch.setattr(discover, "DEVICE_PROBES", (lambda: present,))
    with pytest.raises(L.GpuUnavailable, match=words) as err:
        L.cupy_device()
    assert "\n" not in str(err.value)


# Without CuPy, the reason depends on whether the machine has a device at all, asked of the driver directly.
@pytest.mark.parametrize(
    ("present", "says"),
    [
        (False, "no GPU: no CUDA device found"),
        (
            True,
            f"no GPU: CuPy is not installed ({L.INSTALL_CUPY})",
        ),
        (
            None,
            f"no GPU: CuPy is not installed ({L.INSTALL_CUPY}, if this machine has a GPU)",
        ),
    ],
)
def test_without_cupy_the_reason_follows_the_device_probes(monkeypatch, present, says):
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(L, "_DEVICE", None)
    monkeypatch.setattr(discover, "DEVICE_PROBES", (lambda: present,))
    with pytest.raises(L.GpuUnavailable) as err:
        L.cupy_device()
    assert str(err.value) == says


def test_the_first_probe_that_sees_a_device_decides_and_the_others_are_not_asked():
    asked = []

    def probe(answer):
        return lambda: asked.append(answer) or answer

    def present(*answers):
        asked.clear()
        discover.DEVICE_PROBES = tuple(probe(a) for a in answers)
        return discover.cuda_device_present()

    saved = discover.DEVICE_PROBES
    try:
        assert present(None, True, False) is True and asked == [None, True]
        assert present(None, False, None) is False and asked == [None, False, None]
        assert present(None, None) is None
    finally:
        discover.DEVICE_PROBES = saved


def test_the_proc_probe_reads_the_drivers_folder_of_gpus(monkeypatch, tmp_path):
    gpus = tmp_path / "gpus"
    monkeypatch.setattr(discover, "NVIDIA_GPUS", gpus)
    assert discover._probe_proc() is None  # no folder: no NVIDIA driver loaded here, or not Linux; it cannot tell
    gpus.mkdir()
    assert discover._probe_proc() is False
    (gpus / "0000:01:00.0").mkdir()
    assert discover._probe_proc() is True


class _FakeLibcuda:
    def __init__(self, init_status, count):
        self.init_status, self.count = init_status, count

    def cuInit(self, flags):  # noqa: N802 — the driver's names
        return self.init_status

    def cuDeviceGetCount(self, ptr):  # noqa: N802
        ptr._obj.value = self.count
        return 0


@pytest.mark.parametrize(
    ("lib", "found"),
    [
        (None, False),  # no libcuda: no device CUDA could use
        (_FakeLibcuda(0, 2), True),
        (_FakeLibcuda(0, 0), False),
        (_FakeLibcuda(100, 0), False),  # CUDA_ERROR_NO_DEVICE
        (_FakeLibcuda(999, 0), None),  # an error it cannot read: no answer
    ],
)
def test_the_driver_probe_asks_libcuda(monkeypatch, lib, found):
    def cdll(name):
        if lib is None:
            raise OSError(f"{name}: cannot open shared object file")
        return lib

    monkeypatch.setattr(discover.sys, "platform", "linux")
    monkeypatch.setattr(discover.ctypes, "CDLL", cdll)
    assert discover._probe_driver() is found


def test_the_driver_probe_does_not_guess_on_other_systems(monkeypatch):
    monkeypatch.setattr(discover.sys, "platform", "darwin")
    assert discover._probe_driver() is None


@pytest.mark.parametrize(
    ("script", "found"),
    [
        ("echo 'GPU 0: NVIDIA H200 (UUID: GPU-1234)'", True),
        ("echo 'No devices were found'; exit 6", False),
        ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9", False),
        ("exec sleep 10", None),  # past its time limit: no answer
    ],
)
def test_the_nvidia_smi_probe_reads_its_list(monkeypatch, tmp_path, script, found):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(discover, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    assert discover._probe_nvidia_smi() is found


def test_the_nvidia_smi_probe_without_nvidia_smi_cannot_tell(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert discover._probe_nvidia_smi() is None


# ---- compiling -------------------------------------------------------------------------------------------------


def test_kernel_symbol_finds_the_plain_or_the_mangled_name():
    cubin = b"\x7fELF\x00.text._Z19spatialc_persistentPKaS0_Px\x00_Z19spatialc_persistentPKaS0_Px\x00"
    assert N.kernel_symbol(cubin, "spatialc_persistent") == "_Z19spatialc_persistentPKaS0_Px"
    assert N.kernel_symbol(b"\x00.text.k\x00k\x00", "k") == "k"  # extern "C"
    with pytest.raises(N.KernelBuildError, match="not in the compiled module"):
        N.kernel_symbol(cubin, "other")


def test_nvrtc_source_drops_only_host_headers():
    src = "#include <cuda_pipeline.h>\n#include <mma.h>\n#include <cstdio>\n#include <vector>\nint x;\n"
    assert N.nvrtc_source(src) == "#include <cuda_pipeline.h>\n#include <mma.h>\n\n\nint x;\n"


@pytest.mark.nvcc
@pytest.mark.skipif(N.find_nvcc() is None, reason="nvcc is not installed")
def test_nvcc_cubin_of_a_lowered_kernel_is_cached_and_its_kernel_found(tmp_path, monkeypatch):
    art = spatialc.lower(spatialc.build(spatialc.gemm(40, 24, 56, "bf16"), "sm_90"))
    path = N.compile_cubin(art.kernel_cu, "sm_90", cache=tmp_path)
    symbol = N.kernel_symbol(path.read_bytes(), art.launch.kernel_name)
    assert symbol == "spatialc_persistent"  # extern "C": the name launch.json gives is the symbol
    info = N.kernel_ptxas(path, art.launch.kernel_name)  # what this nvcc's ptxas said, kept beside the cubin
    assert info is not None and info.function == symbol and 0 < info.registers <= 255
    assert info.smem == art.budget.static_bytes  # the budget's static shared memory is what ptxas counts
    monkeypatch.setattr(N.subprocess, "run", lambda *a, **k: pytest.fail("recompiled a cached kernel"))
    assert N.compile_cubin(art.kernel_cu, "sm_90", cache=tmp_path) == path
    assert N.kernel_ptxas(path, art.launch.kernel_name) == info
    monkeypatch.undo()
    with pytest.raises(N.KernelBuildError, match="nvcc failed: .*error"):
        N.compile_cubin("__global__ void k( { }", "sm_90", cache=tmp_path)


def test_a_compile_failure_is_told_by_its_reason_not_by_the_line_that_says_it_stopped():
    # What ptxas (CUDA 13.0) printed for a wgmma of 256 columns under launch bounds of 128 registers a thread.
    said = (
        "ptxas fatal   : (C7602) Insufficient registers (128) to compile instruction at line 853 in function"
        " spatialc_hopper. Try to compile with register target of 154 or higher.\n"
        "ptxas fatal   : Ptx assembly aborted due to errors\n"
    )
    assert N.first_error(said).startswith("ptxas fatal   : (C7602) Insufficient registers (128)")
    assert N.first_error("k.cu(1): error: expected a )\n1 error detected\n") == "k.cu(1): error: expected a )"
    assert N.first_error("ptxas fatal   : Ptx assembly aborted due to errors") == (
        "ptxas fatal   : Ptx assembly aborted due to errors"  # nothing better said: the line itself
    )


# What `nvcc -cubin -arch=sm_90 -O3 -std=c++17 -Xptxas -v` (CUDA 13.0) printed for a lowered bf16 gemm(40, 24, 56),
# for a file with a kernel, an extern "C" kernel and a non-inlined device function, and for a kernel made to spill
# (__launch_bounds__(1024, 2) over 64 live floats).
PTXAS_GEMM = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z19spatialc_persistentPK13__nv_bfloat16S1_Pf' for 'sm_90'
ptxas info    : Function properties for _Z19spatialc_persistentPK13__nv_bfloat16S1_Pf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 62 registers, used 1 barriers, 9216 bytes smem
ptxas info    : Compile time = 56.520 ms
"""
PTXAS_TWO = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 2.513 ms
ptxas info    : Compiling entry function '_Z1aPfi' for 'sm_90'
ptxas info    : Function properties for _Z1aPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 256 bytes smem
ptxas info    : Compile time = 2.660 ms
ptxas info    : Function properties for _Z1fPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
PTXAS_SPILLS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z2spPfi' for 'sm_90'
ptxas info    : Function properties for _Z2spPfi
    640 bytes stack frame, 672 bytes spill stores, 736 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 640 bytes cumulative stack size
ptxas info    : Compile time = 45.501 ms
"""


def test_ptxas_output_is_parsed_per_kernel():
    (gemm,) = N.parse_ptxas(PTXAS_GEMM).values()
    assert gemm == N.PtxasInfo("_Z19spatialc_persistentPK13__nv_bfloat16S1_Pf", 62, 0, 0, 9216, 0)
    two = N.parse_ptxas(PTXAS_TWO)
    assert set(two) == {"b", "_Z1aPfi"}  # the device function _Z1fPfi is no kernel
    assert two["b"] == N.PtxasInfo("b", 8, 0, 0, 0, 0) and two["_Z1aPfi"].smem == 256
    assert N.parse_ptxas(PTXAS_SPILLS)["_Z2spPfi"] == N.PtxasInfo("_Z2spPfi", 32, 672, 736, 0, 640)
    assert N.parse_ptxas("nvcc warning : something\n") == {}


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """An nvcc script that writes a cubin and prints PTXAS_GEMM on stderr; returns the file counting its compiles."""
    calls = tmp_path / "calls"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    (tmp_path / "ptxas.txt").write_text(PTXAS_GEMM)
    nvcc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, fake"; exit 0; fi\n'
        f"echo x >> {calls}\n"
        'while [ "$1" != "-o" ]; do shift; done\n'
        'printf "\\0_Z19spatialc_persistentPK13__nv_bfloat16S1_Pf\\0" > "$2"\n'
        f"cat {tmp_path / 'ptxas.txt'} >&2\n"
    )
    nvcc.chmod(0o755)
    monkeypatch.setattr(N, "find_nvcc", lambda: str(nvcc))
    return calls


def test_ptxas_numbers_are_cached_beside_the_cubin(fake_nvcc, tmp_path):
    cache = tmp_path / "cache"
    path = N.compile_cubin("__global__ void k() {}", "sm_90", cache=cache)
    assert N.ptxas_path(path).name == path.name.removesuffix(".cubin") + ".ptxas.json"
    info = N.kernel_ptxas(path, "spatialc_persistent")
    assert (info.registers, info.spill_stores, info.spill_loads, info.smem) == (62, 0, 0, 9216)
    assert N.compile_cubin("__global__ void k() {}", "sm_90", cache=cache) == path
    assert N.kernel_ptxas(path, "spatialc_persistent") == info  # a cache hit still has them
    assert fake_nvcc.read_text().count("x") == 1
    assert N.kernel_ptxas(path, "other_kernel") is None
    N.ptxas_path(path).unlink()  # a cubin cached before the numbers were kept is compiled again
    assert N.kernel_ptxas(path, "spatialc_persistent") is None
    N.compile_cubin("__global__ void k() {}", "sm_90", cache=cache)
    assert fake_nvcc.read_text().count("x") == 2 and N.kernel_ptxas(path, "spatialc_persistent") == info
    assert sorted(p.name for p in cache.iterdir()) == sorted([path.name, N.ptxas_path(path).name])  # no .tmp left


def test_missing_nvcc_is_a_build_error(monkeypatch, tmp_path):
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    with pytest.raises(N.KernelBuildError, match="nvcc was not found"):
        N.compile_cubin("__global__ void k() {}", "sm_90", cache=tmp_path)


def test_a_bf16_output_comes_back_as_its_values():
    # The kernel stores bf16 bits; numpy (and CuPy) have no bfloat16, so C comes back as float32 holding them exactly.
    art = artifact(40, 24, 32, "bf16")
    params = [dataclasses.replace(q, c_type="__nv_bfloat16") if q.role == "output" else q for q in art.launch.params]
    art = dataclasses.replace(art, launch=dataclasses.replace(art.launch, params=tuple(params)))
    rng = np.random.default_rng(2)
    a, b = rng.integers(-3, 4, (40, 32)).astype(np.float32), rng.standard_normal((32, 24)).astype(np.float32)
    c, _ = run_fake(art, a, b)
    b16 = bf16_to_float32(quantize(b, "bfloat16", np), np).astype(np.float64)
    want = bf16_to_float32(quantize(a.astype(np.float64) @ b16, "bfloat16", np), np)
    assert c.dtype == np.float32 and np.array_equal(c, want)


def test_an_operand_that_already_is_the_padded_matrix_is_not_filled_and_copied_first():
    """End to end, an operand whose shape is whole tiles goes to the kernel as it is in order "rows" (a view, no
    zero-fill, no copy) and in one transposing copy otherwise; the result is the one the padded path gives, and the
    public spatialc.tilize still returns a copy (issue 36, section 2, item 5)."""
    x = np.arange(32 * 48, dtype=np.float32).reshape(32, 48)
    expected = {
        "rows": x.reshape(-1),
        "cols": x.T.reshape(-1),
        "row": x.reshape(2, 16, 3, 16).transpose(0, 2, 1, 3).reshape(-1),
        "col": x.reshape(2, 16, 3, 16).transpose(0, 2, 3, 1).reshape(-1),
    }
    for order, want in expected.items():
        whole = tilize(x, (2, 3), np, order=order)
        assert np.array_equal(whole, want) and np.shares_memory(whole, x) == (order == "rows"), order
        assert np.array_equal(untilize(whole, (2, 3), (32, 48), np, order=order), x)
        grown = tilize(x, (3, 4), np, order=order)  # a larger grid: zero-padded as before
        assert np.array_equal(untilize(grown, (3, 4), (48, 64), np, order=order)[32:].sum(), 0.0)
    assert not np.shares_memory(spatialc.tilize(x, order="rows"), x)


# ---- several outputs -----------------------------------------------------------------------------------------------


def swapped_mean_and_rstd(outs):
    """A planted fault: mean's values stored in rstd's buffer and rstd's in mean's (the launcher must not hide it)."""
    return {**outs, "mean": outs["rstd"], "rstd": outs["mean"]}


def test_run_gives_each_output_of_a_layernorm_by_name():
    # Three outputs (out m×n; mean and rstd m×1, each its own tile grid), each poisoned before the launch, untiled
    # from its own buffer and given back by name in parameter order: what spatialc.evaluate and emulate give.
    p = spatialc.build(spatialc.layernorm(40, 72, "bf16"), "sm_90")
    art = spatialc.lower(p)
    rng = np.random.default_rng(4)
    x = rng.uniform(-3, 3, (40, 72)).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, 72).astype(np.float32), rng.uniform(-1, 1, 72).astype(np.float32)
    dev = StandInDevice(art, reference_kernel(p))
    got = L.run_with(dev, art, x, weight=w, bias=b)
    want = spatialc.evaluate(p, {"x": x, "weight": w, "bias": b})
    assert list(got) == list(want) == ["out", "mean", "rstd"]
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert spatialc.tolerance(p, kernel=True).check(got, {"x": x, "weight": w, "bias": b})[0]
    outs = [i for i, a in enumerate(dev.args) if a.role == "output"]
    assert len(outs) == 3 and all(np.isnan(dev.launches[-1][4][i]).all() for i in outs)  # each poisoned, none shared
    # Mean's values in rstd's buffer: the launcher reads each output from its own, so the swap shows.
    swapped = L.run_with(StandInDevice(art, reference_kernel(p, swapped_mean_and_rstd)), art, x, weight=w, bias=b)
    assert not np.allclose(swapped["mean"], want["mean"]) and np.allclose(swapped["mean"], want["rstd"])
    assert not spatialc.tolerance(p, kernel=True).check(swapped, {"x": x, "weight": w, "bias": b})[0]


def test_a_kernel_of_several_outputs_takes_a_buffer_for_each():
    p = spatialc.build(spatialc.layernorm(20, 40, "fp16"), "sm_90")
    prep = L.prepare(spatialc.lower(p), StandInDevice(spatialc.lower(p), reference_kernel(p)))
    assert prep.output_names == ["out", "mean", "rstd"] and prep.output.name == "out"
    bufs = prep.output_buffers()
    assert [b.size for b in bufs.values()] == [a.tiles[0] * a.tiles[1] * 256 for a in prep.outputs]
    assert [a.elems for a in prep.outputs] == [(20, 40), (20, 1), (20, 1)] and prep.outputs[1].tiles[1] == 1
    with pytest.raises(LaunchError, match="3 outputs: pass a buffer for each"):
        prep.order((np.zeros(1),), bufs["out"], {})
    with pytest.raises(LaunchError, match="no output 'C'; its outputs: out, mean, rstd"):
        prep.output_buffer(name="C")
    art = artifact(16, 16, 16)
    none = dataclasses.replace(art.launch, params=tuple(q for q in art.launch.params if q.role != "output"))
    with pytest.raises(LaunchError, match="at least one output"):
        L.kernel_args(none)


def test_the_cli_checks_each_output_a_gpu_run_gives(tmp_path, monkeypatch, capsys):
    """`spatialc run` of a saved LayerNorm on a (stand-in) GPU: spatialc.run's dict of outputs is checked output by
    output, as the emulation's is; one output wrong makes the run differ."""
    import types

    from spatialc import api
    from spatialc.cli import main

    p = spatialc.build(spatialc.layernorm(40, 72, "bf16"), "sm_90")
    path = tmp_path / "ln.json"
    path.write_text(spatialc.to_json(p))

    class Cupy:  # what the CLI reads of CuPy: the device's name
        class cuda:  # noqa: N801 — CuPy's names
            class runtime:  # noqa: N801
                @staticmethod
                def getDeviceProperties(i):  # noqa: N802
                    return {"name": b"Fake GPU"}

            class Device:  # noqa: N801
                id = 0

    wrong = {}

    def run(art, *operands, **named):
        got = spatialc.evaluate(p, named)
        return {**got, **wrong}

    monkeypatch.setattr(L, "cupy_device", lambda: types.SimpleNamespace(cp=Cupy))
    monkeypatch.setattr(api, "run", run)
    assert main(["run", str(path)]) == 0
    assert "on the GPU (Fake GPU): C equals" in capsys.readouterr().out
    wrong["rstd"] = np.zeros((40, 1), np.float32)
    assert main(["run", str(path)]) == 1
    assert "DIFFERS" in capsys.readouterr().out


def swapped_halves(outs):
    """A planted fault: RoPE's out1 values stored in out2's buffer and out2's in out1's."""
    return {**outs, "out1": outs["out2"], "out2": outs["out1"]}


@pytest.mark.parametrize("program", ["rope", "col_absmax"])
def test_run_gives_a_map_programs_outputs_and_a_column_vector_by_name(program):
    """spatialc.run of a map program of two outputs (RoPE's halves) and of a column program (its 1 × n vector alone),
    on the stand-in device: each output from its own buffer, by name, as evaluate gives them; swapped halves show."""
    rng = np.random.default_rng(6)
    if program == "rope":
        from spatialc import ew

        x1, x2, c, s = ew.inputs(4)
        names = ("x1", "x2", "cos", "sin")
        halves = {"out1": x1 * c - x2 * s, "out2": x2 * c + x1 * s}
        p = spatialc.build(spatialc.elementwise(halves, 40, 70, "bf16", names=names), "sm_90")
        given = {k: rng.uniform(-2, 2, (40, 70)).astype(np.float32) for k in names}
    else:
        p = spatialc.build(spatialc.col_reduce(40, 70, "absmax", "bf16"), "sm_90")
        given = {"x": rng.uniform(-2, 2, (40, 70)).astype(np.float32)}
    art = spatialc.lower(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        got = L.run_with(StandInDevice(art, reference_kernel(p)), art, **given)
        want = spatialc.evaluate(p, given)
    if program == "col_absmax":
        assert got.shape == want.shape == (1, 70) and np.array_equal(got, want)
        return
    assert list(got) == list(want) == ["out1", "out2"]
    for name in want:
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
    assert spatialc.tolerance(p, kernel=True).check(got, given)[0]
    swapped = L.run_with(StandInDevice(art, reference_kernel(p, swapped_halves)), art, **given)
    assert not spatialc.tolerance(p, kernel=True).check(swapped, given)[0]

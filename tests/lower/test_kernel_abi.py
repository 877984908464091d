"""Launching kernel.cu yourself (docs/kernel-abi.md): the public tilize / untilize, the extern "C" symbol, and the
section's own commands and CuPy example, run on the CPU with a stand-in for CuPy whose kernel is the host emulation.
"""

import json
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc.errors import SpatialError
from spatialc.lower.artifact import operand_files
from spatialc.lower.cuda.persistent.printer import KERNEL_NAME
from spatialc.runtime import nvcc as N
from spatialc.runtime.emulate import emulate_source

from .test_lower_nvcc import NVCC

DOC = Path(__file__).parents[2] / "docs" / "kernel-abi.md"
GOLDEN = Path(__file__).parents[1] / "golden"
GXX = shutil.which("g++")
NM = shutil.which("nm")


def tiled_index(i, j, cols_t, tile, order="row"):
    """Where element (i, j) lies in the tiled layout, from DESIGN.md §2 (written here, not taken from spatialc):
    row-major inside each tile, or column-major for order "col" (kernel-abi.md, "Tile order")."""
    tr, tc = tile
    tile_start = ((i // tr) * cols_t + (j // tc)) * (tr * tc)
    inside = (i % tr) * tc + (j % tc) if order == "row" else (j % tc) * tr + (i % tr)
    return tile_start + inside


def values_of(shape, dtype, seed=0):
    """Distinct non-zero values of `dtype` (zero is what the padding holds)."""
    n = int(np.prod(shape))
    if np.dtype(dtype) == np.bool_:
        return np.ones(shape, dtype)
    base = np.arange(1, n + 1) % 97 + 1
    return np.random.default_rng(seed).permutation(base).reshape(shape).astype(dtype)


# ---- spatialc.tilize / spatialc.untilize ---------------------------------------------------------------------------

SHAPES = [(1, 1), (20, 20), (33, 17), (16, 16), (17, 1), (1, 40), (47, 31)]
DTYPES = [np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_, np.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_untilize_inverts_tilize_and_keeps_the_dtype(shape, dtype):
    x = values_of(shape, dtype)
    flat = spatialc.tilize(x)
    grid = (-(-shape[0] // 16), -(-shape[1] // 16))
    assert flat.shape == (grid[0] * grid[1] * 256,) and flat.dtype == x.dtype
    back = spatialc.untilize(flat, shape)
    assert back.dtype == x.dtype and back.shape == shape and back.flags.c_contiguous
    np.testing.assert_array_equal(back, x)


def test_bfloat16_round_trips():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = values_of((19, 35), np.float32).astype(ml_dtypes.bfloat16)
    flat = spatialc.tilize(x, grid=(3, 3))
    assert flat.dtype == x.dtype
    np.testing.assert_array_equal(spatialc.untilize(flat, x.shape, grid=(3, 3)).view(np.uint16), x.view(np.uint16))


@pytest.mark.parametrize("tile", [(16, 16), (8, 4), (1, 1), (3, 5)], ids=str)
@pytest.mark.parametrize("shape, extra", [((20, 20), None), ((20, 20), (0, 2)), ((33, 17), (2, 1)), ((7, 9), (1, 0))])
def test_every_element_is_at_its_tile_offset_and_the_rest_is_zero(shape, extra, tile):
    """`extra` tiles beyond the smallest grid in each direction; None: the default grid."""
    x = values_of(shape, np.int32, seed=shape[0])
    need = (-(-shape[0] // tile[0]), -(-shape[1] // tile[1]))
    grid = None if extra is None else (need[0] + extra[0], need[1] + extra[1])
    flat = spatialc.tilize(x, tile, grid)
    rows_t, cols_t = grid or need
    assert flat.size == rows_t * cols_t * tile[0] * tile[1]
    expected = np.zeros(flat.size, np.int32)
    for i in range(shape[0]):
        for j in range(shape[1]):
            expected[tiled_index(i, j, cols_t, tile)] = x[i, j]
    np.testing.assert_array_equal(flat, expected)  # every element in place, every other one zero
    assert np.count_nonzero(flat) == x.size
    np.testing.assert_array_equal(spatialc.untilize(flat, shape, tile, grid=(rows_t, cols_t)), x)


def test_the_worked_example_of_the_doc():
    """A 20 × 20 matrix in 16 × 16 tiles: 2 × 2 tiles, 1024 elements, 624 of them padding."""
    x = np.arange(1, 401, dtype=np.int32).reshape(20, 20)
    flat = spatialc.tilize(x)
    assert flat.size == 1024 and np.count_nonzero(flat == 0) == 624
    np.testing.assert_array_equal(flat[0:16], x[0, 0:16])
    np.testing.assert_array_equal(flat[16:32], x[1, 0:16])
    np.testing.assert_array_equal(flat[256:272], np.r_[x[0, 16:20], np.zeros(12, np.int32)])
    assert flat[531] == x[17, 3] == flat[2 * 256 + 1 * 16 + 3]


def test_the_inputs_are_not_changed_and_the_results_do_not_alias_them():
    x = values_of((40, 16), np.float32)
    keep = x.copy()
    flat = spatialc.tilize(x)
    flat_keep = flat.copy()
    back = spatialc.untilize(flat, x.shape)  # one tile column: the reshape alone could have been a view
    back[:] = -1
    np.testing.assert_array_equal(x, keep)
    np.testing.assert_array_equal(flat, flat_keep)
    assert not np.shares_memory(spatialc.tilize(x[:16, :16]), x)


def test_a_transposed_or_strided_array_is_tiled_by_its_values():
    x = values_of((20, 30), np.int64)
    np.testing.assert_array_equal(spatialc.untilize(spatialc.tilize(x.T), (30, 20)), x.T)
    np.testing.assert_array_equal(spatialc.untilize(spatialc.tilize(x[::3, ::2]), (7, 15)), x[::3, ::2])


def test_a_kernel_grid_larger_than_the_smallest_is_honoured_and_needed_back():
    art = spatialc.lower(spatialc.build(spatialc.gemm(20, 20, 20, "fp16"), "sm_90"))
    b_param = art.launch.params[1]
    assert b_param.tiles == (2, 4)  # B's grid is padded to whole items: wider than 20 columns need
    b = values_of((20, 20), np.float16)
    flat = spatialc.tilize(b, grid=b_param.tiles)
    assert flat.size == 2 * 4 * 256
    with pytest.raises(spatialc.InputError, match=r"2×2 tiles .* holds 1024 elements, not 2048; pass grid="):
        spatialc.untilize(flat, b.shape)
    np.testing.assert_array_equal(spatialc.untilize(flat, b.shape, grid=b_param.tiles), b)


def test_json_lists_are_taken_as_tile_grid_and_shape():
    x = values_of((20, 20), np.int8)
    flat = spatialc.tilize(x, [16, 16], [2, 4])
    np.testing.assert_array_equal(spatialc.untilize(flat, [20, 20], [16, 16], grid=[2, 4]), x)


def test_empty_arrays_tile_to_empty_buffers():
    x = np.zeros((0, 5), np.float32)
    assert spatialc.tilize(x).size == 0
    assert spatialc.untilize(spatialc.tilize(x), (0, 5)).shape == (0, 5)
    assert spatialc.tilize(x, grid=(1, 1)).size == 256


BAD_CALLS = {
    "a list": (lambda: spatialc.tilize([[1, 2], [3, 4]]), "takes a numpy array, not a list"),
    "a scalar": (lambda: spatialc.tilize(3.0), "takes a numpy array, not a float"),
    "untilize of a list": (lambda: spatialc.untilize([0] * 256, (1, 1)), "takes a numpy array, not a list"),
    "1-D": (lambda: spatialc.tilize(np.zeros(5)), r"2-D array, not a 1-D .*reshape\(1, -1\)"),
    "3-D": (lambda: spatialc.tilize(np.zeros((2, 2, 2))), "2-D array, not a 3-D"),
    "numpy scalar": (lambda: spatialc.tilize(np.float32(1.0)), "numpy array, not a float32"),
    "0-D": (lambda: spatialc.tilize(np.array(1.0)), "2-D array, not a 0-D"),
    "untilize of 2-D": (lambda: spatialc.untilize(np.zeros((16, 16)), (16, 16)), "flat .1-D. tiled buffer"),
    "small grid": (lambda: spatialc.tilize(np.zeros((20, 20)), grid=(1, 2)), r"grid 1×2 is too small.*needs 2×2"),
    "small grid back": (lambda: spatialc.untilize(np.zeros(512), (20, 20), grid=(1, 2)), "grid 1×2 is too small"),
    "negative grid": (lambda: spatialc.tilize(np.zeros((2, 2)), grid=(-1, 1)), "grid must be two non-negative"),
    "zero tile": (lambda: spatialc.tilize(np.zeros((2, 2)), (0, 16)), "tile must be two positive"),
    "bool tile": (lambda: spatialc.tilize(np.zeros((2, 2)), (True, 16)), "tile must be two positive"),
    "float tile": (lambda: spatialc.tilize(np.zeros((2, 2)), (16.0, 16)), "tile must be two positive"),
    "three tile": (lambda: spatialc.tilize(np.zeros((2, 2)), (16, 16, 1)), "tile must be two positive"),
    "bad shape": (lambda: spatialc.untilize(np.zeros(256), (16,)), "shape must be two non-negative"),
    "negative shape": (lambda: spatialc.untilize(np.zeros(256), (-1, 16)), "shape must be two non-negative"),
    "wrong size": (lambda: spatialc.untilize(np.zeros(300), (16, 16)), "holds 256 elements, not 300"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments_are_one_typed_error(case):
    call, message = BAD_CALLS[case]
    with pytest.raises(spatialc.InputError, match=message) as err:
        call()
    assert isinstance(err.value, SpatialError) and isinstance(err.value, ValueError)
    assert "\n" not in str(err.value)


def test_the_helpers_are_public():
    assert {"tilize", "untilize", "InputError"} <= set(spatialc.__all__)
    assert spatialc.tilize.__doc__ and spatialc.untilize.__doc__


# ---- the extern "C" kernel ---------------------------------------------------------------------------------------

DECLARATION = re.compile(rf'^extern "C" __global__ __launch_bounds__\(NTHREAD, \d+\) void {KERNEL_NAME}\(', re.M)


@pytest.mark.parametrize("precision", ["int8", "fp16", "bf16"])
def test_the_kernel_is_declared_extern_c_in_every_text(precision):
    epilogue = [spatialc.bias(), spatialc.relu()]
    art = spatialc.lower(spatialc.build(spatialc.gemm(40, 24, 56, precision, epilogue=epilogue), "sm_90"))
    for text in (art.kernel_cu, art.program_cu, art.bench_cu):
        assert len(DECLARATION.findall(text)) == 1
        assert len(re.findall(r"__global__", text)) == 1
    assert art.launch.kernel_name == KERNEL_NAME


def test_every_golden_file_declares_the_kernel_extern_c():
    files = sorted(GOLDEN.glob("*.cu"))
    assert files
    for path in files:
        assert len(DECLARATION.findall(path.read_text())) == 1, path.name


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "precision, needs_optin", [("int8", False), ("bf16", False), ("fp16", True)], ids=["int8", "bf16", "smem_opt_in"]
)
def test_nvccs_cubin_holds_the_plain_symbol(tmp_path, precision, needs_optin):
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    kw = {"block": (4, 4, 4), "depth": 4} if needs_optin else {"block": (2, 2, 2), "depth": 3}
    art = spatialc.lower(spatialc.build(spatialc.gemm(64, 64, 128, precision), "sm_90", **kw))
    assert art.launch.smem_opt_in == needs_optin
    path = N.compile_cubin(art.kernel_cu, "sm_90", cache=tmp_path)
    cubin = path.read_bytes()
    assert N.kernel_symbol(cubin, art.launch.kernel_name) == KERNEL_NAME
    assert b"_Z19" + KERNEL_NAME.encode() not in cubin  # no C++ mangling anywhere in the module
    info = N.kernel_ptxas(path, KERNEL_NAME)  # ptxas names the entry function by the same symbol
    assert info is not None and info.function == KERNEL_NAME
    if NM is not None:
        symbols = subprocess.run([NM, str(path)], capture_output=True, text=True, check=True).stdout
        assert re.search(rf"^[0-9a-f]+ T {KERNEL_NAME}$", symbols, re.M), symbols


@pytest.mark.nvcc
def test_a_kernel_saved_before_extern_c_is_still_found_by_its_mangled_name(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    art = spatialc.lower(spatialc.build(spatialc.gemm(40, 24, 56, "fp16"), "sm_90"))
    old = art.kernel_cu.replace('extern "C" __global__', "__global__")
    assert old != art.kernel_cu
    path = N.compile_cubin(old, "sm_90", cache=tmp_path)
    symbol = N.kernel_symbol(path.read_bytes(), KERNEL_NAME)
    assert symbol.startswith(f"_Z19{KERNEL_NAME}PK6__half")
    assert N.kernel_ptxas(path, KERNEL_NAME).function == symbol


# ---- the doc's section, run -------------------------------------------------------------------------------------


def section(title):
    """The text of the doc's section `title`, up to the next `## ` heading."""
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def code_blocks(text, language):
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)


FAKE_SMS = 7  # fewer multiprocessors than any target plans for: the sites must follow the device


class FakeKernel:
    """The function CuPy would hand back: called as CuPy calls kernels, it checks the launch against launch.json,
    reads the tiled operands by the layout's formula and runs the emitted program.cu through the host emulation."""

    def __init__(self, directory, launch):
        self.directory, self.launch = Path(directory), launch
        self.max_dynamic_shared_size_bytes = 0
        self.calls = 0

    def __call__(self, grid, block, args, shared_mem=0):
        ls = self.launch
        sites, work = spatialc.work_list(ls, FAKE_SMS)  # the device's sites, and the list the kernel must be given
        assert (grid, block, shared_mem) == ((sites,), (ls["block"],), ls["dyn_smem"])
        assert len(args) == len(ls["params"]) + 1 and np.array_equal(args[-1], work) and args[-1].dtype == np.int32
        if ls["smem_opt_in"]:
            assert self.max_dynamic_shared_size_bytes >= ls["dyn_smem"]
        storage = {"signed char": "int8", "__half": "float16", "__nv_bfloat16": "uint16", "float": "float32"}
        storage |= {"int": "int32", "long long": "int64"}
        files, out = {}, None
        names = operand_files([p["role"] for p in ls["params"]])
        for p, buf, name in zip(ls["params"], args[:-1], names, strict=True):
            rows_t, cols_t = p["tiles"]
            assert buf.dtype == np.dtype(storage[p["c_type"]]) and buf.shape == (rows_t * cols_t * 256,)
            if p["role"] == "output":
                out = (p, buf)
                continue
            i, j = np.indices((rows_t * 16, cols_t * 16))
            grid_values = buf[tiled_index(i, j, cols_t, (16, 16), p.get("order", "row"))]  # as the kernel reads it
            rows, cols = p["elems"]
            assert not grid_values[rows:].any() and not grid_values[:, cols:].any()  # the padding is zero
            logical = grid_values[:rows, :cols]
            if p["c_type"] == "__nv_bfloat16":
                logical = (logical.astype(np.uint32) << 16).view(np.float32)
            files[name] = logical.astype(np.float64)
        p, buf = out
        program = (self.directory / "program.cu").read_text()
        c = emulate_source(program, files, tuple(p["elems"]), np.dtype(buf.dtype), sms=FAKE_SMS)
        rows_t, cols_t = p["tiles"]
        i, j = np.indices(c.shape)
        buf[tiled_index(i, j, cols_t, (16, 16))] = c  # the padding of a plain GEMM's C is zero: left as it was
        self.calls += 1


def fake_cupy(launches):
    """A `cupy` module enough for the doc's example, on numpy."""
    cp = types.ModuleType("cupy")
    cp.asarray = lambda x: np.array(x, copy=True)
    cp.asnumpy = lambda x: np.array(x, copy=True)
    cp.zeros = np.zeros

    class RawModule:
        def __init__(self, code=None, *, path=None, **_):
            assert code is None and path is not None
            self.path = Path(path)

        def get_function(self, name):
            cubin = self.path.read_bytes()
            if cubin != b"no nvcc":
                assert N.kernel_symbol(cubin, name) == name  # found by the plain name, as CuPy looks it up
            kernel = FakeKernel(self.path.parent, json.loads((self.path.parent / "launch.json").read_text()))
            launches.append(kernel)
            return kernel

    cp.RawModule = RawModule
    device = types.SimpleNamespace(attributes={"MultiProcessorCount": FAKE_SMS})
    cp.cuda = types.SimpleNamespace(Device=lambda *_: device)
    return cp


def run_commands(block, gemm, cwd, compile_it=True):
    """The doc's shell commands for `gemm` (its sizes and options): `spatialc` is this Python's, nvcc is run when it
    is installed and `compile_it` (the other precisions' kernels are compiled by test_lower_nvcc.py)."""
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert [ln.split()[0] for ln in lines] == ["spatialc", "nvcc"]
    assert DOC_GEMM in lines[0]
    emit = shlex.split(lines[0].replace(DOC_GEMM, gemm))
    subprocess.run([sys.executable, "-m", *emit], cwd=cwd, check=True, capture_output=True, text=True)
    nvcc = shlex.split(lines[1])
    cubin = Path(cwd, nvcc[nvcc.index("-o") + 1])
    if NVCC is None or not compile_it:
        cubin.write_bytes(b"no nvcc")
        return cubin
    subprocess.run([NVCC, *nvcc[1:]], cwd=cwd, check=True, capture_output=True, text=True, timeout=600)
    if NM is not None:
        symbols = subprocess.run([NM, str(cubin)], capture_output=True, text=True, check=True).stdout
        assert re.search(rf"^[0-9a-f]+ T {KERNEL_NAME}$", symbols, re.M), symbols
    return cubin


DOC_GEMM = "20 20 20 --precision fp16"
GEMMS = {
    "as_written": DOC_GEMM,
    "int8": "20 20 20 --precision int8",
    "bf16": "33 20 17 --precision bf16",
    "smem_opt_in": "64 64 128 --precision fp16 --block 4,4,4 --depth 4",
}


@pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")
@pytest.mark.parametrize("case", GEMMS)
def test_the_docs_commands_and_cupy_example_run(tmp_path, monkeypatch, case):
    if "bf16" in GEMMS[case]:
        pytest.importorskip("ml_dtypes")
    text = section("Launching kernel.cu yourself")
    (commands,) = code_blocks(text, "bash")
    example = next(b for b in code_blocks(text, "python") if "import cupy as cp" in b)
    cubin = run_commands(commands, GEMMS[case], tmp_path, compile_it=case == "as_written")
    directory = cubin.parent
    kernel_cu, program_cu = (directory / "kernel.cu").read_text(), (directory / "program.cu").read_text()
    assert program_cu.startswith(kernel_cu)  # the emulation below runs the very kernel text the example loads
    assert len(DECLARATION.findall(kernel_cu)) == 1
    launches = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(launches))
    monkeypatch.chdir(tmp_path)
    exec(compile(example, str(DOC), "exec"), {"__name__": "kernel_abi_example"})  # its own assert checks C
    assert len(launches) == 1 and launches[0].calls == 1
    if launches[0].launch["smem_opt_in"]:
        assert launches[0].max_dynamic_shared_size_bytes == launches[0].launch["dyn_smem"]
    assert launches[0].launch["smem_opt_in"] == (case == "smem_opt_in")


def test_the_docs_tilize_snippet_runs():
    text = section("Launching kernel.cu yourself")
    (snippet,) = [b for b in code_blocks(text, "python") if "import cupy" not in b]
    x = values_of((20, 20), np.float16)
    scope = {"spatialc": spatialc, "x": x, "param": {"tiles": [2, 4]}}
    exec(compile(snippet, str(DOC), "exec"), scope)
    assert scope["tiled"].shape == (2 * 4 * 256,)
    np.testing.assert_array_equal(scope["x_again"], x)

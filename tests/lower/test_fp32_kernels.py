"""float32 programs with no matmul in the general and the persistent CUDA forms: pages of 4-byte elements, sized so
by the planners (`passes.maps.block_resources`, `passes.rows.ring_bytes`) as the kernels lay them out, a float32
tile of 64 16-byte chunks copied by threads of fewer (`TilePrinter.read_chunks`); the host emulation of each kernel
against the interpreter within `spatialc.tolerance(p, kernel=True)`, and a planted fault (a page element loaded as
bf16) caught; nvcc for sm_80 and sm_90 without a warning or a spill."""

from __future__ import annotations

import dataclasses
import shutil
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.ir.nodes import TensorRole
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.passes.maps import block_resources
from spatialc.passes.rows import ring_bytes
from spatialc.target import target

from ..nvcc_clean import nvcc_run
from .test_lower_nvcc import NVCC, in_namespace, ptxas_entries

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
FORMS = ("general", "persistent")


def _add(m, n):
    x, y = ew.inputs(2)
    return spatialc.elementwise(x + y, m, n, precision="fp32")


# Small shapes of Triton's float32 tutorials and norms; a block of 1 × 2 tiles on two sites (ITEM loops), N padded.
PROGRAMS = {
    "vector_add": lambda: _add(98, 130),
    "softmax": lambda: spatialc.softmax(40, 200, "fp32"),
    "softmax_online": lambda: spatialc.softmax(40, 200, "fp32", online=True),
    "rmsnorm_residual": lambda: spatialc.rmsnorm(40, 70, "fp32", residual=True),
    "layernorm": lambda: spatialc.layernorm(40, 70, "fp32"),
}


@cache
def built(name: str):
    return spatialc.build(PROGRAMS[name](), "sm_90", block=(1, 2, 1), sites=2)


@cache
def lowered(name: str, form: str):
    art = spatialc.lower(built(name), form=form)
    assert art.budget.form == form and art.census.agrees
    return art


def inputs(p, seed=0):
    """float32 values bf16 cannot hold, an input's around 2 ± 3, a parameter's around 0 ± 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role == TensorRole.INPUT:
            out[t.name] = (rng.standard_normal(t.elems) * 3 + 2).astype(np.float32)
        elif t.role == TensorRole.PARAMETER:
            out[t.name] = rng.standard_normal(t.elems).astype(np.float32)
    return out


@pytest.mark.parametrize("form", FORMS)
def test_float32_pages_are_four_bytes_an_element_as_the_planners_size_them(form):
    add, art = built("vector_add"), lowered("vector_add", form)
    text = art.kernel_cu
    assert "typedef float OPT;" in text and "const OPT* __restrict__ t0, const OPT* __restrict__ t1" in text
    page = 2 * 256 * 4  # a page of 1 × 2 float32 tiles
    assert dict(art.budget.rings) == {"x0_ring": 2 * page, "x1_ring": 2 * page, "out_ring": 2 * page}
    smem, _ = block_resources(add, target("sm_90"), 2, 1, 2, add.plan.depth)
    assert smem == lowered("vector_add", "general").budget.dyn_bytes  # the map planner's block is the kernel's
    rows = built("softmax")
    assert ring_bytes(rows, 1, 2, rows.plan.depth) == lowered("softmax", form).budget.ring_bytes


@pytest.mark.parametrize("form", FORMS)
def test_a_float32_tile_is_copied_as_its_64_chunks_dealt_round_the_threads(form):
    text = lowered("softmax", form).kernel_cu
    assert "constexpr int CHUNKS = (int)(sizeof(OPT) * 256 / 16), TILES = 2;" in text
    assert "a thread copies one chunk of each tile it visits" not in text  # (16-bit tiles' copy: 32 chunks at most)
    assert "c < TILES * CHUNKS; c +=" in text


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize(
    ("name", "form"),
    [
        ("vector_add", "general"),
        ("vector_add", "persistent"),
        ("softmax", "persistent"),
        ("softmax_online", "general"),
        ("rmsnorm_residual", "general"),
        ("layernorm", "persistent"),
    ],
)
def test_the_emulation_is_the_interpreter_within_the_kernel_tolerance(name, form):
    p, art = built(name), lowered(name, form)
    x = inputs(p)
    got, want = spatialc.emulate(art, x), spatialc.evaluate(p, x)
    pairs = got.items() if isinstance(got, dict) else [("out", got)]
    for out, value in pairs:
        expected = want[out] if isinstance(want, dict) else want
        assert value.shape == expected.shape and value.dtype == expected.dtype == np.float32, out
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how
    if name == "vector_add":  # float32's sum of two float32 values is one rounding: the kernel's is exact
        np.testing.assert_array_equal(got, x["x0"] + x["x1"])


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize(("name", "ring"), [("vector_add", "ring_0"), ("softmax", "ring_5")])
def test_a_page_element_loaded_as_bf16_is_caught(name, ring):
    """A map's load of an input page element (x0's of the add, x2's of the softmax's quotient) rounded through bf16,
    as a kernel that narrowed float32 pages would: the emulated result fails the kernel tolerance."""
    p, art = built(name), lowered(name, "general")
    load = f"= (float)SPATIALC_PAGE_LD({ring} + "
    assert art.program_cu.count(load) == 1
    wrong = art.program_cu.replace(load, f"= (float)(__nv_bfloat16)SPATIALC_PAGE_LD({ring} + ")
    x = inputs(p)
    bad = spatialc.emulate(dataclasses.replace(art, program_cu=wrong), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok, how


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_float32_kernels_compile_for_sm80_and_sm90_without_warnings_or_spills(tmp_path):
    """The vector add's and the softmax's kernels, and the fused add + RMSNorm's in both forms, in one nvcc run:
    kernel_cu texts with no host code but a stub main, so device-only (-fatbin, tests/nvcc_clean.py)."""
    arts = [lowered("vector_add", "general"), lowered("softmax", "persistent")]
    arts += [lowered("rmsnorm_residual", form) for form in FORMS]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(art.kernel_cu, i, "p") for i, art in enumerate(arts)]
    (tmp_path / "fp32.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    run = nvcc_run(tmp_path / "fp32.cu", ("80", "90"), host=False, timeout=600, extra=("--threads", "2"))
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert len(entries) == 2 * len(arts)
    for case, kind, arch, spill, _ in entries:
        assert spill == 0, f"case {case} {kind} {arch} spills {spill} bytes"

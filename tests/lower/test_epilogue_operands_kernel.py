"""GEMM epilogues with row and column scale vectors and a residual or gate tensor (issue 31), printed and run.

The general form prints them all (a row vector read at the element's own row, the residual's page from a ring the
reader fills); the persistent kernel and the sm_90a form apply row and column vectors in their fused stores (sm_90a's
before the staging store) and refuse a residual or a gate by name. The host emulation of each printed form equals the
interpreter, and a row vector read at the wrong row in the printed text is caught. nvcc compiles the kernels without
a warning or a spill.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.lower.cuda.emit import INCLUDES
from spatialc.lower.errors import NeedsGeneral

from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")

# name → (precision, epilogue, m, n, k, build options, target)
CASES = {
    "bf16_all": (
        "bf16",
        # four stages: the general form's compute warps spill past that at this block, whatever the stages (an
        # epilogue of bias, relu, two scalars and silu spills 16 bytes on sm_80 too)
        lambda: [spatialc.row_scale(), spatialc.col_scale(), spatialc.residual(), spatialc.gate()],
        40,
        48,
        32,
        {"block": (1, 1, 1), "sites": 3},
        "sm_80",
    ),
    "int8_row_residual": (
        "int8",
        lambda: [spatialc.row_scale("s"), spatialc.residual("r"), spatialc.scalar("add", -5)],
        33,
        40,
        48,
        {"block": (2, 1, 1), "sites": 2},
        "sm_86",
    ),
    "persistent_scales": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.col_scale(), spatialc.relu()],
        64,
        80,
        64,
        {"sub_blocks": (1, 2)},
        "sm_80",
    ),
    "persistent_int8_row": (
        "int8",
        lambda: [spatialc.row_scale(), spatialc.bias(), spatialc.requant(0.001, 2)],
        50,
        64,
        96,
        {},
        "sm_86",
    ),
    "splitk_residual": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.residual()],
        32,
        64,
        2048,
        {"split_k": 4},
        "sm_90",
    ),
    "multicast_residual": (
        "fp16",
        lambda: [spatialc.col_scale(), spatialc.residual()],
        64,
        256,
        128,
        {"multicast": (1, 2), "block": (2, 4, 4)},
        "sm_90",
    ),
    "sm90a_scales": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.col_scale(), spatialc.relu()],
        128,
        96,
        64,
        {},
        "sm_90a",
    ),
}


@cache
def built(name: str) -> spatialc.SpatialProgram:
    prec, epi, m, n, k, opts, tgt = CASES[name]
    return spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=epi()), tgt, **opts)


@cache
def lowered(name: str):
    return spatialc.lower(built(name), CASES[name][-1])


def inputs(p, seed: int = 0) -> dict[str, np.ndarray]:
    """int8 operands over their range with int32 scales; small integers in a float program (exact products)."""
    rng = np.random.default_rng(seed)
    integer = p.precision.value == "int8"
    out = {}
    for t in p.tensors:
        if t.role.value == "input":
            out[t.name] = rng.integers(-128, 128, t.elems) if integer else rng.integers(-3, 4, t.elems) * 1.0
        elif t.role.value == "parameter":
            n = t.elems[0] * t.elems[1]
            out[t.name] = rng.integers(-(2**31), 2**31, n) if integer else rng.integers(-4, 5, n) * 0.5
    return out


def emulated(name: str, mutate=lambda text: text) -> tuple[np.ndarray, np.ndarray]:
    """(the emulation's C, the interpreter's C) of a case, its printed text passed through `mutate`."""
    art, ins = lowered(name), inputs(built(name), seed=len(name))
    c = spatialc.emulate(dataclasses.replace(art, program_cu=mutate(art.program_cu)), ins)
    return c, np.asarray(spatialc.evaluate(built(name), ins))


# ---- which form --------------------------------------------------------------------------------------------------


def test_auto_prints_a_residual_in_the_general_form_saying_why():
    art = lowered("bf16_all")
    assert art.budget.form == "general"
    assert any("persistent kernel refuses" in n and "reads a tensor beside C's value" in n for n in art.notes)


def test_the_persistent_kernel_refuses_a_residual_by_name_and_applies_scales_in_its_fused_store():
    residual = spatialc.build(spatialc.gemm(32, 32, 32, "fp16", epilogue=[spatialc.residual()]), "sm_80")
    with pytest.raises(NeedsGeneral, match=r"stage residual0 \(\(x0 \+ x1\)\), which reads a tensor beside C's"):
        spatialc.lower(residual, "sm_80", form="persistent")
    for name in ("persistent_scales", "persistent_int8_row"):
        art = lowered(name)
        assert art.budget.form == "persistent", art.notes
        assert "(el / 16) * 16]);  // op:Compute:Map_mul_x0_row" in art.kernel_cu


def test_the_sm90a_form_refuses_a_residual_by_name_and_auto_plans_for_the_general_form():
    gemm = spatialc.gemm(128, 128, 64, "bf16", epilogue=[spatialc.residual()])
    planned = spatialc.build(gemm, "sm_90a", form="sm90a")
    with pytest.raises(NeedsGeneral, match="an epilogue that reads residual beside C's value .* in the sm_90a form"):
        spatialc.lower(planned, "sm_90a")
    art = spatialc.lower(spatialc.build(gemm, "sm_90a"), "sm_90a")
    assert art.budget.form == "general"
    assert any("not the sm_90a form" in n for n in art.notes)


def test_the_sm90a_form_applies_row_and_column_vectors_before_its_staging_store():
    art = lowered("sm90a_scales")
    assert art.budget.form == "sm90a"
    text = art.kernel_cu
    row = text.index("(el / 16) * 16]);  // op:Compute:Map_mul_x0_row")  # the element's own row of its tile
    col = text.index("el % 16]);  // op:Compute:Map_mul_x0_col")
    staged = text.index("SPATIALC_PAGE_ST(staged + c * 256 + el, (OUT_T)v);", col)  # then into the staging box
    assert row < col < staged < text.index("spatialc_tma_store_2d(", staged)  # and out by TMA


# ---- the host emulation against the interpreter -------------------------------------------------------------------


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize("name", list(CASES))
def test_the_emulation_equals_the_interpreter(name):
    c, want = emulated(name)
    assert c.dtype == want.dtype and c.shape == want.shape
    np.testing.assert_array_equal(c, want)


@pytest.mark.emulation
@needs_gxx
def test_a_row_vector_read_at_the_wrong_row_is_caught():
    """The row scale indexed by the element's column in its tile (el % 16) where it must be its row (el / 16)."""

    def by_column(text: str) -> str:
        old = " * 256 + (el / 16) * 16]"
        assert text.count(old) == 1
        return text.replace(old, " * 256 + (el % 16) * 16]")

    for name in ("bf16_all", "sm90a_scales"):
        c, want = emulated(name, by_column)
        assert not np.array_equal(c, want), name


# ---- nvcc ----------------------------------------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_kernels_compile_without_warnings_or_spills(tmp_path):
    """The general form's kernels for sm_80, 86 and 90, and the sm_90a form's for sm_90a, in one translation unit
    each."""
    groups = {
        ("sm_80", "sm_86", "sm_90"): [
            lowered("bf16_all").kernel_cu,
            lowered("int8_row_residual").program_cu,
            lowered("persistent_scales").kernel_cu,
            lowered("persistent_int8_row").kernel_cu,
        ],
        ("sm_90a",): [lowered("sm90a_scales").kernel_cu],
    }
    for targets, texts in groups.items():
        parts = [f"#include <{h}>\n" for h in INCLUDES]
        parts += [in_namespace(text, i, "p") for i, text in enumerate(texts)]
        src = tmp_path / f"epi_{targets[0]}.cu"
        src.write_text("".join(parts) + "int main() { return 0; }\n")
        archs = [g for t in targets for g in gencode(t)]
        cmd = [NVCC, "-c", "--threads", "2", "-o", str(src.with_suffix(".o")), str(src), *archs, *FLAGS]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        log = run.stdout + run.stderr
        assert run.returncode == 0, log[-6000:]
        assert "warning" not in log.lower(), log[-6000:]
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
        assert spills and not any(spills), log[-3000:]
        if targets[0] != "sm_90a":  # (ptxas_entries reads the general form's entries, by their numbered names)
            assert len(ptxas_entries(log)) == len(texts) * len(targets)

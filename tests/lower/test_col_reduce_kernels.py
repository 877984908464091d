"""Column reductions (`spatialc.col_reduce`) in the general CUDA form: a thread a column of the band, each folding its
column of every page down the rows, the padding rows left out, the value stored into every row of its column of the
vector page; nvcc for sm_80 and sm_90 without a warning or a spill; the host emulation against the interpreter within
`spatialc.tolerance(p, kernel=True)`; a planted fault (each page's last row skipped) caught. The persistent form
prints it with the same per-op printers on every thread of its block, emulated alike; the sm_90a form refuses it in one
line naming the general form."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import warnings
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.ir.nodes import ComputeStage
from spatialc.lower.census import stage_kind
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.errors import NeedsGeneral

from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
FOLD = "for (int r = 0; r < rows; ++r) {"
LOAD = "const float x = (float)SPATIALC_PAGE_LD(at_col + (r / 16) * 512 + (r % 16) * 16);"


@cache
def built(op: str = "sum", precision: str = "bf16"):
    """100 rows of 70 values (7 tile rows, read 2 a page: the last page's last tile row padding, and 4 of its rows
    too), bands of 2 tile columns (3 bands, the last half padding) on two sites (an ITEM loop)."""
    return spatialc.build(spatialc.col_reduce(100, 70, op, precision), "sm_90", block=(2, 2, 1), sites=2)


@cache
def lowered(op: str = "sum", precision: str = "bf16"):
    return spatialc.lower(built(op, precision))


def x_for(shift: float = 0.0) -> dict[str, np.ndarray]:
    return {"x": (3.0 * np.random.default_rng(0).standard_normal((100, 70)) + shift).astype(np.float32)}


def test_the_kernel_folds_a_column_a_thread_and_leaves_the_padding_rows_out():
    art = lowered()
    text = art.kernel_cu
    assert art.budget.form == "general" and art.census.agrees
    assert "#define CCOLS 1" in text and "#define NWARP 1" in text  # 32 columns a band: one warp, a column a thread
    assert "float cacc_2[CCOLS];" in text
    assert "const int rows = row0 + 32 <= 100 ? 32 : (int)(100 - row0);" in text  # the column's 100 values alone
    assert text.count(FOLD) == 1
    assert "cacc_2[q] = spatialc_fadd(cacc_2[q], x);" in text
    assert "SPATIALC_PAGE_ST(ring_0 + ((rsv_0 - 1) % DEPTH_0) * PAGE_0 + (col / 16) * 256 + r * 16 + col % 16," in text
    # The writer stores the band's vector at its columns of the output's one tile row.
    assert "const int base = item_x * 2;" in text


@pytest.mark.parametrize(
    ("op", "identity", "combine"), [("max", "(-INFINITY)", "spatialc_max"), ("absmax", "0e+00f", "spatialc_max")]
)
def test_each_reductions_c_is_its_one_definitions(op, identity, combine):
    text = lowered(op).kernel_cu
    assert f"cacc_2[q] = {identity};" in text and f"cacc_2[q] = {combine}(cacc_2[q]" in text


def test_the_census_counts_each_stage_once():
    art, p = lowered("mean"), built("mean")
    want: dict[str, int] = {}
    for s in p.stages:
        if isinstance(s.kind, ComputeStage):
            want[stage_kind(s.kind.op)] = want.get(stage_kind(s.kind.op), 0) + 1
    assert art.census.stages == want == art.census.printed_stages
    assert want == {"ColReduce": 1, "Map_div_x0_lit": 1}


def test_the_sm90a_form_refuses_it_in_one_line_naming_the_general_form():
    p = spatialc.build(spatialc.col_reduce(100, 70, "sum", "bf16"), "sm_90a")
    with pytest.raises(NeedsGeneral, match="a program that reduces columns") as info:
        spatialc.lower(p, form="sm90a")
    assert "general" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_kernels_and_their_programs_compile_for_sm80_and_sm90_without_warnings_or_spills(tmp_path):
    """A bf16 column sum and an fp16 column max (fp16 out), in one nvcc invocation: each program_cu, which begins with
    its kernel_cu as printed (so the kernel is compiled once, not again on its own), its host code compiled too (`-c`:
    gcc -Wall -Wextra -Werror)."""
    arts = [
        lowered(),
        spatialc.lower(spatialc.build(spatialc.col_reduce(300, 200, "max", "fp16", out="fp16"), "sm_90")),
    ]
    assert all(art.program_cu.startswith(art.kernel_cu) for art in arts)
    texts = [("p", art.program_cu) for art in arts]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(text, i, kind) for i, (kind, text) in enumerate(texts)]
    (tmp_path / "cols.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "2", "-o", str(tmp_path / "cols.o"), str(tmp_path / "cols.cu"), *archs, *FLAGS]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = list(ptxas_entries(log))
    assert entries
    for _, kind, arch, spill, _ in entries:
        assert spill == 0, f"{kind} {arch} spills {spill} bytes"


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize(("op", "shift"), [("sum", 0.0), ("max", -20.0), ("mean", 1.0), ("sumsq", 0.0)])
def test_the_emulation_is_within_the_kernel_tolerance(op, shift):
    """A max over negative values: one padding row's 0 taken in would be the result."""
    p, art = built(op), lowered(op)
    x = x_for(shift)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        got, want = spatialc.emulate(art, x), spatialc.evaluate(p, x)
    assert got.shape == want.shape == (1, 70) and got.dtype == want.dtype == np.float32
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how


@pytest.mark.emulation
@needs_gxx
def test_a_planted_fault_each_pages_last_row_skipped_is_caught():
    p, art = built(), lowered()
    x = x_for()
    assert art.program_cu.count(LOAD) == 1
    wrong = art.program_cu.replace(LOAD, "if (r == rows - 1) { continue; }  // planted\n" + LOAD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        bad = spatialc.emulate(dataclasses.replace(art, program_cu=wrong), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok, how


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize("op", ["sum", "max"])
def test_the_persistent_form_prints_it_and_emulates_within_the_kernel_tolerance(op):
    """The same per-op printers on every thread of the block (`persistent/pages.py`); a max over negative values."""
    p = built(op)
    art = spatialc.lower(p, form="persistent")
    assert art.budget.form == "persistent" and art.census.agrees
    assert "float cacc_" in art.kernel_cu and "#define CCOLS" in art.kernel_cu
    x = x_for(-20.0 if op == "max" else 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        got = spatialc.emulate(art, x)
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize("form", ["general", "persistent"])
def test_a_float32_column_sum_emulates_within_the_kernel_tolerance(form):
    p = built("sum", "fp32")
    x = x_for()
    got = spatialc.emulate(spatialc.lower(p, form=form), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok and np.abs(got).max() > 1.0, how

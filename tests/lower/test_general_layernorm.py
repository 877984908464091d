"""LayerNorm's three outputs in the general CUDA form: the maps of row vectors printed once a band, the vectors
written a tile a row of the band into their m × 1 tensors, every output printed by program_cu in turn; nvcc for sm_80
and sm_90 without a warning or a spill; the host emulation against the interpreter, each output within
`spatialc.tolerance(p, kernel=True)`; a planted fault (rstd's output filled from the mean's ring) caught. An out of
bf16 or fp16 beside float32 vectors: each stored through its own C type, by the general and the persistent form alike,
and emulated within the bound; a form that stores one type refuses outputs of two in words.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.inputs import operand_values
from spatialc.ir.nodes import ComputeStage, TensorRole
from spatialc.lower.census import stage_kind
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.cuda.common.program import out_c_type
from spatialc.lower.errors import Unsupported

from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


@cache
def built():
    """40 rows of 70 values (5 tiles a row, read 2 a page: the last page one tile of padding), bands of one tile row,
    three bands on two sites (an ITEM loop)."""
    return spatialc.build(spatialc.layernorm(40, 70, "bf16"), "sm_90", block=(1, 2, 1), sites=2)


@cache
def lowered():
    return spatialc.lower(built())


def inputs(p, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role == TensorRole.INPUT:
            out[t.name] = operand_values(t.name, rng.standard_normal(t.elems) * 3 + 2, t.dtype)
        elif t.role == TensorRole.PARAMETER:
            out[t.name] = rng.standard_normal(t.elems[1]).astype(np.float32)
    return out


def test_the_kernel_writes_each_vector_a_tile_a_row_of_the_band():
    art = lowered()
    text = art.kernel_cu
    assert art.budget.form == "general" and art.census.agrees
    # mean = Σ / n and rstd = rsqrt(Σ / n + eps): once a band, on the vectors' pages (one tile a row, so tl / 1).
    assert "const float v = spatialc_div(v0, 7e+01f);" in text
    assert "spatialc_rsqrt(spatialc_fadd(spatialc_div(v0, 7e+01f), 1e-05f))" in text
    # The output's map reads both vectors at its element's row, the weight and bias at its column.
    assert "spatialc_fadd(spatialc_fmul(spatialc_fmul(spatialc_fsub(v0, v1), v2), t1[" in text
    # The writer stores each vector into its m × 1 tensor (t4: mean, t5: rstd), the band's tile rows from item_y.
    assert text.count("const int base = item_y;") == 2
    assert "SPATIALC_OUT_ST(&t4[(long long)tile * 256 + el]" in text
    assert "SPATIALC_OUT_ST(&t5[(long long)tile * 256 + el]" in text


def test_the_census_counts_each_stage_once():
    art, p = lowered(), built()
    want: dict[str, int] = {}
    for s in p.stages:
        if isinstance(s.kind, ComputeStage):
            want[stage_kind(s.kind.op)] = want.get(stage_kind(s.kind.op), 0) + 1
    assert art.census.stages == want == art.census.printed_stages


def test_program_cu_prints_every_output_in_turn():
    text = lowered().program_cu
    assert "Prints the output out, then mean, then rstd the same way." in text
    assert text.index("y_3[spatialc_tiled_index(i, j, 6)]") < text.index("y_4[spatialc_tiled_index(i, j, 1)]")
    assert text.index("y_4[spatialc_tiled_index(i, j, 1)]") < text.index("y_5[spatialc_tiled_index(i, j, 1)]")
    assert "for (int i = 0; i < 40; ++i)" in text and "for (int j = 0; j < 1; ++j)" in text


@cache
def narrow(precision: str):
    """The same LayerNorm with its out in the inputs' type (bf16 or fp16), mean and rstd float32."""
    return spatialc.build(spatialc.layernorm(40, 70, precision, out=precision), "sm_90", block=(1, 2, 1), sites=2)


@pytest.mark.parametrize("form", ["general", "persistent"])
def test_an_out_of_the_inputs_type_is_stored_beside_float32_vectors(form):
    art = spatialc.lower(narrow("bf16"), form=form)
    text = art.kernel_cu
    assert art.budget.form == form
    assert "typedef __nv_bfloat16 OUT_T;" in text
    assert "OUT_T* __restrict__ t3, float* __restrict__ t4, float* __restrict__ t5" in text
    assert "SPATIALC_OUT_ST(&t3[(long long)tile * 256 + el], (OUT_T)" in text
    assert "SPATIALC_OUT_ST(&t4[(long long)tile * 256 + el], (float)" in text
    assert "SPATIALC_OUT_ST(&t5[(long long)tile * 256 + el], (float)" in text
    assert [q.c_type for q in art.launch.params if q.role == "output"] == ["__nv_bfloat16", "float", "float"]


def test_a_form_that_stores_one_type_refuses_outputs_of_two_in_words():
    with pytest.raises(Unsupported, match=r"outputs of different element types \(bf16, float32\): the persistent fo"):
        out_c_type(narrow("bf16"), "the persistent form")


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_kernels_and_their_programs_compile_for_sm80_and_sm90_without_warnings_or_spills(tmp_path):
    """The float32 outputs' kernel, and the bf16 out's in the general and the persistent form: each program_cu, which
    begins with its kernel_cu as printed (so the kernel is compiled once, not again on its own), its host code
    compiled too (`-c`: gcc -Wall -Wextra -Werror)."""
    arts = [lowered(), *(spatialc.lower(narrow("bf16"), form=f) for f in ("general", "persistent"))]
    assert all(art.program_cu.startswith(art.kernel_cu) for art in arts)
    texts = [("p", art.program_cu) for art in arts]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(text, i, kind) for i, (kind, text) in enumerate(texts)]
    (tmp_path / "ln.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "2", "-o", str(tmp_path / "ln.o"), str(tmp_path / "ln.cu"), *archs, *FLAGS]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    for _, kind, arch, spill, _ in ptxas_entries(log):
        assert spill == 0, f"{kind} {arch} spills {spill} bytes"


@pytest.mark.emulation
@needs_gxx
def test_the_emulation_gives_each_output_within_the_kernel_tolerance_and_catches_a_planted_fault():
    """The kernel's out, mean and rstd against the interpreter's; then rstd's output filled from the mean's ring
    (the copy the writer stores reads the wrong vector): the check names rstd."""
    p, art = built(), lowered()
    x = inputs(p)
    got, want = spatialc.emulate(art, x), spatialc.evaluate(p, x)
    assert set(got) == set(want) == {"out", "mean", "rstd"}
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how
    assert np.abs(got["mean"]).max() > 1.0 and np.abs(got["rstd"] - 1.0).max() > 0.1  # the data exercise both

    rstd_copy = "ring_6 + (pop_6 % DEPTH_6) * PAGE_6 + (tl / 1) * 256 + el"
    assert art.kernel_cu.count(rstd_copy) == 1
    wrong = art.program_cu.replace(rstd_copy, "ring_2 + (pop_2 % DEPTH_2) * PAGE_2 + (tl / 1) * 256 + el")
    bad = spatialc.emulate(dataclasses.replace(art, program_cu=wrong), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok and np.array_equal(bad["rstd"], bad["mean"]), how


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize(("precision", "form"), [("bf16", "general"), ("fp16", "persistent")])
def test_an_out_of_the_inputs_type_emulates_within_the_kernel_tolerance(precision, form):
    """out in bf16 (general form) or fp16 (persistent form), mean and rstd float32: each against the interpreter's;
    then the mean stored through OUT_T, as a kernel of one output type would (rounded to 16 bits): the check names
    the mean."""
    p = narrow(precision)
    x = inputs(p)
    art = spatialc.lower(p, form=form)
    got, want = spatialc.emulate(art, x), spatialc.evaluate(p, x)
    assert set(got) == set(want) == {"out", "mean", "rstd"}
    assert [got[n].dtype for n in ("mean", "rstd")] == [np.float32] * 2
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how
    assert np.abs(got["mean"]).max() > 1.0 and np.abs(got["rstd"] - 1.0).max() > 0.1

    mean_store = "(float)SPATIALC_PAGE_LD(ring_9 + "
    assert art.program_cu.count(mean_store) == 1
    wrong = art.program_cu.replace(mean_store, "(float)(OUT_T)SPATIALC_PAGE_LD(ring_9 + ")
    bad = spatialc.emulate(dataclasses.replace(art, program_cu=wrong), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok and np.array_equal(bad["out"], got["out"]) and not np.array_equal(bad["mean"], got["mean"]), how

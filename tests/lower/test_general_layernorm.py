"""LayerNorm's three outputs in the general CUDA form: the maps of row vectors printed once a band, the vectors
written a tile a row of the band into their m × 1 tensors, every output printed by program_cu in turn; nvcc for sm_80
and sm_90 without a warning or a spill; the host emulation against the interpreter, each output within
`spatialc.tolerance(p, kernel=True)`; a planted fault (rstd's output filled from the mean's ring) caught; outputs of
two element types refused in words.
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


def test_outputs_of_two_element_types_are_refused_in_words():
    p = spatialc.build(spatialc.layernorm(40, 70, "bf16", out="bf16"), "sm_90")
    with pytest.raises(Unsupported, match=r"outputs of different element types \(bf16, float32\)"):
        spatialc.lower(p)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_kernel_and_its_program_compile_for_sm80_and_sm90_without_warnings_or_spills(tmp_path):
    art = lowered()
    texts = [("p", art.kernel_cu), ("p", art.program_cu)]
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

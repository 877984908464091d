"""The GPU check's fp8 rows (gpucheck/fp8.py): e4m3 / e5m2 GEMMs with per-row and per-column dequant scales, bf16 C —
their sizes and place in the run (after every row the table had before them), their build (each form that prints
fp8 on sm_90, the sm_90a form's refusal said in its place), their float64 reference against the interpreter's, and
the rows on the stand-in GPU: checked and timed against torch._scaled_mm (rowwise and per-tensor scales, B
column-major), a kernel that loses a scale reported wrong, torch's refusal of two e5m2 operands and a torch without
_scaled_mm each said in the contestant."""

from __future__ import annotations

import numpy as np
import pytest

import spatialc
from spatialc.errors import SpatialError
from spatialc.gpucheck import fp8 as F8
from spatialc.gpucheck.agreement import check_result, values64
from spatialc.gpucheck.builds import build_case
from spatialc.gpucheck.cases import DEFAULT_SIZES, cases_of, kernel_path
from spatialc.runtime import launch as L
from spatialc.runtime.tilize import bf16_bits, fp8_bits

from .test_gpucheck_device import run
from .test_gpucheck_fakes import FakeTorch
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture

# ---- sizes and the build ----------------------------------------------------------------------------------------


def test_fp8_sizes_name_their_kind_and_run_after_every_row_the_table_had():
    cases = cases_of(["fp8:e4m3:4096", "fp8:E5M2:40x32x64"], ["int8", "bf16"])
    assert [(c.precision, c.size) for c in cases] == [("e4m3", "fp8:4096x4096x4096"), ("e5m2", "fp8:40x32x64")]
    assert cases[0].ops == 2 * 4096**3 and str(cases[1]) == "e5m2 fp8:40x32x64"
    assert kernel_path(cases[0], "spatialc general") == "spatialc general (fp8)"  # left out in fp8 rows alone
    for bad in ("fp8:e4m3:", "fp8:int8:4096", "fp8:4096"):
        with pytest.raises(SpatialError, match="not fp8:KIND:SIZE"):
            cases_of([bad], ["bf16"])
    every = cases_of(DEFAULT_SIZES, ["int8", "fp16", "bf16"])
    order = [str(c) for c in every if not (c.heads[0] or c.blockscaled or c.weights)]  # attention, W4A16 after
    assert order[-3:] == ["e4m3 fp8:4096x4096x4096", "e4m3 fp8:8192x8192x8192", "e5m2 fp8:4096x4096x4096"]
    assert order[-4] == "bf16 g64:4096x4096x4096"


def test_an_fp8_case_is_built_with_its_scales_in_every_form_that_prints_fp8():
    (case,) = cases_of(["fp8:e4m3:64"], ["bf16"])
    built = build_case(case, "sm_90")
    assert not built.error and built.kernel["out"] == "bf16"
    persistent, general, hopper = built.forms
    for form in (persistent, general):
        assert form.artifact is not None and form.facts["c_elem"] == "bfloat16", form.contestant
        args = [(a.name, a.elem) for a in L.kernel_args(form.artifact.launch)]
        assert args == [
            ("A", "float8_e4m3fn"),
            ("B", "float8_e4m3fn"),
            ("C", "bfloat16"),
            ("row_scale", "float32"),
            ("col_scale", "float32"),
        ], form.contestant
    # The sm_90a form: its wgmma fp8 path once it prints one, else its refusal in the contestant's place.
    assert hopper.name == "sm90a" and (hopper.artifact is not None or "8-bit float" in hopper.absent), hopper.absent


def test_the_reference_is_the_interpreters_and_each_scale_matters():
    rng = np.random.default_rng(4)
    m, n, k = 32, 48, 64
    a, b = (fp8_bits(rng.uniform(-1, 1, s).astype(np.float32), "float8_e4m3fn", np) for s in ((m, k), (k, n)))
    (case,) = cases_of([f"fp8:e4m3:{m}x{n}x{k}"], ["bf16"])
    more = F8.more_inputs(case, lambda shape, lo, hi: rng.uniform(lo, hi, shape).astype(np.float32))
    av, bv = values64(a, "float8_e4m3fn", np), values64(b, "float8_e4m3fn", np)
    scales = {name: x.astype(np.float64) for name, x in more.items()}
    ref = F8.reference(av @ bv, scales)
    program = spatialc.gemm(m, n, k, "e4m3", epilogue=F8.epilogue())  # float32 C
    given = {"A": av, "B": bv, **{name: x.reshape(-1) for name, x in scales.items()}}
    np.testing.assert_allclose(spatialc.evaluate(spatialc.build(program), given), ref, rtol=1e-5, atol=1e-5)
    for name in more:  # a scale lost is far outside the bf16 tolerance
        lost = F8.reference(av @ bv, {**scales, name: 1.0})
        assert not check_result(bf16_bits(lost.astype(np.float32), np), ref, np.zeros(1), "bfloat16", np).correct
    assert F8.library_reference(F8.SCALED_TENSOR, "AB", "scaled") == "AB"
    assert F8.library_reference(F8.SCALED_ROWWISE, "AB", "scaled") == "scaled"


# ---- on the stand-in GPU ------------------------------------------------------------------------------------------


def test_fp8_rows_are_checked_and_timed_against_scaled_mm(fake_gpu, tmp_path, capsys):
    status, header, rows = run(tmp_path, "--sizes", "fp8:e4m3:64", "fp8:e5m2:64")
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    assert [(r["precision"], r["status"]) for r in rows] == [("e4m3", "ok"), ("e5m2", "ok")]
    steps = [p["name"] for p in header["preflight"]]
    assert not any("e4m3" in s or "e5m2" in s or "_scaled_mm" in s for s in steps), steps  # rows check their own
    for row in rows:
        by = row["by_name"]
        for form in ("persistent", "general"):
            mine = by[f"spatialc {form}"]
            assert mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], form
            assert mine["end_to_end"] is not None and "(their bits) and the scales" in mine["detail"]
        assert by["spatialc sm90a"]["note"].startswith("n/a") or by["spatialc sm90a"]["ok"]
        assert "torch.matmul" not in by and "Triton matmul" not in by
    e4m3, e5m2 = (r["by_name"] for r in rows)
    for name in F8.SCALED_MM:  # each checked against its own C (per-tensor: A·B) and timed both ways
        theirs = e4m3[name]
        assert theirs["ok"] and theirs["family"] == "cublas" and theirs["kernel"] and theirs["end_to_end"], name
        assert "B column-major" in theirs["detail"]
        assert e5m2[name]["note"].startswith("n/a: torch._scaled_mm refuses two e5m2 operands"), name
    assert rows[0]["timings"]["kernel"]["cublas_best"]["name"] in F8.SCALED_MM
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| e4m3 | fp8:64×64×64 | spatialc persistent | " in md
    capsys.readouterr()


def test_an_fp8_kernel_that_loses_a_scale_is_reported_wrong(fake_gpu, tmp_path, capsys):
    fake_gpu["fault"] = ("col_scale", "spatialc_general")
    status, _, rows = run(tmp_path, "--sizes", "fp8:e4m3:64")
    (row,) = rows
    assert status == 1 and row["status"] == "wrong" and "spatialc general: C wrong" in row["note"], row["note"]
    by = row["by_name"]
    assert not by["spatialc general"]["check"]["correct"] and by["spatialc persistent"]["check"]["correct"]
    assert all(by[name]["ok"] for name in F8.SCALED_MM)
    capsys.readouterr()


def test_a_torch_without_scaled_mm_is_said_in_each_of_its_contestants(fake_gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.delattr(FakeTorch, "_scaled_mm")
    status, _, rows = run(tmp_path, "--sizes", "fp8:e4m3:64")
    (row,) = rows
    assert status == 0 and row["status"] == "ok", row["note"]
    for name in F8.SCALED_MM:
        assert row["by_name"][name]["note"] == "unavailable: torch fake has no _scaled_mm", name
    capsys.readouterr()


@pytest.mark.emulation
def test_the_fp8_kernel_emulated_meets_the_checks_tolerance_and_one_without_its_column_scale_does_not():
    # The general form's fp8 kernel text, run by the host emulation on a row's tensors: right by the GPU check's rule
    # (check_result at bf16 against the reference the row uses); the same kernel with its column scale at 1 is not.
    (case,) = cases_of(["fp8:e4m3:32x48x64"], ["bf16"])
    general = build_case(case, "sm_90").form("general")
    rng = np.random.default_rng(6)
    a, b = (fp8_bits(rng.uniform(-1, 1, s).astype(np.float32), "float8_e4m3fn", np) for s in ((32, 64), (64, 48)))
    more = F8.more_inputs(case, lambda shape, lo, hi: rng.uniform(lo, hi, shape).astype(np.float32))
    av, bv = values64(a, "float8_e4m3fn", np), values64(b, "float8_e4m3fn", np)
    scales = {name: x.astype(np.float64) for name, x in more.items()}
    ref = F8.reference(av @ bv, scales)
    given = {"A": av, "B": bv, **scales}
    c = bf16_bits(np.asarray(spatialc.emulate(general.artifact, given), np.float32), np)
    check = check_result(c, ref, c, "bfloat16", np)
    assert check.correct, check
    lost = spatialc.emulate(general.artifact, {**given, "col_scale": np.ones_like(scales["col_scale"])})
    lost = bf16_bits(np.asarray(lost, np.float32), np)
    assert not check_result(lost, ref, lost, "bfloat16", np).correct

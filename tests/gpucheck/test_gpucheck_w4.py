"""The GPU check's W4A16 rows (gpucheck/w4rows.py, w4measure.py): their sizes and place in the run (after every row
the table had before them), their bytes (the program's own weights), their build (each form of W4_FORMS for its
own plan, the list extended by one name), their inputs (shared by every M of one weight shape, the reference's
operands), and the rows on the stand-in GPU: each form checked within spatialc.tolerance and timed against torch's
mm on the dequantised weights and the copy ceiling, in a table of their own; a kernel that drops the zero points or
leaves an element unwritten reported wrong; `--prepare` compiling their kernels and the dry run naming those cubins;
a row that runs out of budget skipped, the run going on."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spatialc
from spatialc import gpucheck
from spatialc.errors import SpatialError
from spatialc.gpucheck import device as D
from spatialc.gpucheck import driver as G
from spatialc.gpucheck import w4measure as W4M
from spatialc.gpucheck import w4rows as W4
from spatialc.gpucheck.builds import build_case
from spatialc.gpucheck.cases import DEFAULT_SIZES, cases_of, kernel_path
from spatialc.gpucheck.prepare import MANIFEST
from spatialc.ir.nodes import DType
from spatialc.runtime import launch as L
from spatialc.runtime import nvcc as N

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture

SMALL = ("w4:int4:16x256x256", "w4:mxfp4:1x128x256")  # two formats, two shapes: quick on the stand-in

# ---- sizes, bytes and the build ------------------------------------------------------------------------------------


def test_w4_sizes_name_their_format_and_run_after_every_other_row():
    cases = cases_of(["w4:int4:1x4096x4096", "w4:MXFP4:16x256x512"], ["int8"])  # bf16 A whatever the run's list
    assert [(c.precision, c.weights, c.size) for c in cases] == [
        ("bf16", "int4", "w4:int4:1x4096x4096"),
        ("bf16", "mxfp4", "w4:mxfp4:16x256x512"),
    ]
    assert str(cases[0]) == "bf16 w4:int4:1x4096x4096" and cases[0].ops == W4.weight_bytes("int4", 4096, 4096)
    assert kernel_path(cases[0], "spatialc general") == "spatialc general (w4)"
    for bad in ("w4:int8:1x64x64", "w4:int4:", "w4:int4:1x64"):
        with pytest.raises(SpatialError, match="not w4:FORMAT:MxNxK|not N or MxNxK"):
            cases_of([bad], ["bf16"])
    every = cases_of(DEFAULT_SIZES, ["int8", "fp16", "bf16"])
    w4 = [c for c in every if c.weights]
    assert every[-len(w4) :] == w4 and len(w4) == 12  # last of all: they push no earlier row out of a budget
    assert {(c.weights, c.m, c.n) for c in w4} == {
        (f, m, s) for f in ("int4", "mxfp4") for m in W4.MS for s in W4.SIDES
    }
    assert all(c.n == c.k for c in w4)


BYTES = {DType.BF16: 2, DType.E8M0: 1, DType.INT4: 1, DType.UINT4: 1}  # a scale's or zero point's, as the kernel reads


@pytest.mark.parametrize("fmt", list(W4.FORMATS))
def test_a_rows_bytes_are_its_programs_weights(fmt):
    (case,) = cases_of([f"w4:{fmt}:16x384x512"], ["bf16"])
    program = W4.gemm_of(case)
    tensors = {t.name: t for t in program.tensors}
    k, n = tensors["B"].elems
    side = sum(BYTES[tensors[x].dtype] * np.prod(tensors[x].elems) for x in ("scale", "zeros") if x in tensors)
    assert case.ops == k * n // 2 + side
    assert ("zeros" in tensors) == (fmt != "mxfp4")


def test_each_form_is_built_for_its_own_plan_the_sm90a_one_for_a_hopper_only():
    (case,) = cases_of(["w4:int4:16x256x256"], ["bf16"])
    built = build_case(case, "sm_90")
    assert not built.error and built.kernel["out"] == "bf16" and built.plan
    assert [f.name for f in built.forms] == list(W4.W4_FORMS)
    for form in built.forms:
        assert form.artifact is not None and form.artifact.budget.form == form.name, form.absent
        assert form.facts["c_elem"] == "bfloat16" and form.facts["w4_plan"].startswith("block ")
        assert any(a.packed for a in L.kernel_args(form.artifact.launch))  # the 4-bit weights, two a byte
    hopper = built.forms[-1]  # the sm_90a form's, compiled for sm_90a where the board is a Hopper
    assert hopper.name == "sm90a" and (hopper.artifact is not None or hopper.absent), hopper
    elsewhere = build_case(case, "sm_80").forms[-1]
    assert elsewhere.artifact is None and "runs on sm_90" in elsewhere.absent


def test_the_inputs_are_shared_by_every_m_and_are_the_references_operands():
    (one, many) = cases_of(["w4:int4:1x256x128", "w4:int4:16x256x128"], ["bf16"])
    p1, p16 = (spatialc.build(W4.gemm_of(c), "sm_90") for c in (one, many))
    w1, w16 = W4.weights_of(p1, 3), W4.weights_of(p16, 3)
    assert all(np.array_equal(w1[name], w16[name]) for name in w1) and set(w1) == {"B", "scale", "zeros"}
    assert not np.array_equal(W4.weights_of(p16, 4)["B"], w16["B"])  # the seed matters
    given = W4.inputs(p16, 3)
    a, b = W4.operands(p16, given)
    assert np.array_equal(W4.a_values(p16, given), a)
    want = np.asarray(spatialc.evaluate(p16, given), np.float64)  # the interpreter: C in bf16
    np.testing.assert_allclose(want, a @ b, rtol=2**-8, atol=1e-12)  # … of the sum of these operands
    c = (a @ b).astype(np.float32)
    tol = spatialc.tolerance(p16, kernel=True)
    ref, bound = tol.against(given)  # made once a row, each form's C checked against it
    for x, right in ((c, True), (c * 1.05, False)):  # the bound can refuse
        assert tol.check(x, given)[0] is right and tol.check_against(x, ref, bound, given) == tol.check(x, given)


# ---- on the stand-in GPU ------------------------------------------------------------------------------------------


def test_w4_rows_are_checked_and_timed_against_torch_and_the_ceiling(fake_gpu, tmp_path, capsys):
    status, _, rows = run(tmp_path, "--sizes", *SMALL)
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    for row in rows:
        assert row["status"] == "ok" and row["unit"] == "GB/s"
        names = [c["name"] for c in row["contestants"]]
        assert names == [*(f"spatialc {f}" for f in W4.W4_FORMS), W4.TORCH_MM, "torch copy_"]
        for c in row["contestants"]:
            assert c["ok"] and c["kernel"]["median_s"] > 0 and c["end_to_end"] is None, c["name"]
        for form in W4.W4_FORMS:
            mine = row["by_name"][f"spatialc {form}"]
            assert mine["check"]["correct"] and mine["check"]["stable"] and "bound:" in mine["detail"]
        summary = row["w4_timings"]
        assert summary["weight_bytes"] == row["ops"] and summary["ceiling_s"] > 0
        for name, s in summary["contestants"].items():
            assert s["gb_s"] == pytest.approx(row["ops"] / s["kernel_s"] / 1e9), name
            assert s["of_ceiling"] == pytest.approx(summary["ceiling_s"] / s["kernel_s"]), name
    md = (tmp_path / "gpucheck.md").read_text()
    table = md.split("W4A16 (bf16 A", 1)[1].split("\n\n", 2)[1].splitlines()
    assert table[0].startswith("| weights | m×n×k | MB | contestant | kernel µs | GB/s of the weights | of ceiling")
    assert len(table) == 2 + 2 * (len(W4.W4_FORMS) + 2)  # each row: its forms, torch's mm, the copy
    assert table[2].startswith("| int4 | 16×256×256 | 0.0343 | spatialc general | ")
    assert table[-1].startswith("| mxfp4 | 1×128×256 | 0.0174 | torch copy_ | ")
    assert "| precision | m×n×k | spatialc persistent e2e" not in md  # no GEMM table: theirs is their own
    capsys.readouterr()


@pytest.mark.parametrize("fault", ["zeros", "miss"])
def test_a_w4_kernel_with_a_wrong_c_marks_the_row_wrong(fake_gpu, tmp_path, capsys, fault):
    fake_gpu["fault"] = (fault, "spatialc_general")
    status, _, rows = run(tmp_path, "--sizes", SMALL[0])
    (row,) = rows
    assert status == 1 and row["status"] == "wrong" and "spatialc general: C wrong" in row["note"], row["note"]
    by = row["by_name"]
    assert not by["spatialc general"]["check"]["correct"] and not by["spatialc general"]["ok"]
    assert by["spatialc persistent"]["check"]["correct"] and by[W4.TORCH_MM]["ok"]
    assert row["w4_timings"]["contestants"]["spatialc general"]["gb_s"] is None  # a wrong kernel's speed: none
    if fault == "miss":
        assert by["spatialc general"]["check"]["unwritten"] == 1
    capsys.readouterr()


def test_prepare_compiles_the_w4_kernels_and_the_dry_run_names_them(tmp_path, capsys, monkeypatch, fake_nvcc):
    from spatialc.gpucheck import prepare
    from spatialc.gpucheck.cases import preflight_case

    monkeypatch.setattr(prepare, "preflight_cases", lambda cases: [preflight_case(list(cases))])
    prep = tmp_path / "prep"
    assert gpucheck.main([str(prep), "--prepare", "--sizes", SMALL[0], "--commit", "abc"]) == 0
    entries = json.loads((prep / MANIFEST).read_text())["kernels"]
    mine = [(e["form"], e["arch"]) for e in entries if e["case"] == "bf16 w4:int4:16x256x256"]
    assert mine == [(f, "sm_90a" if f == "sm90a" else "sm_90") for f in W4.W4_FORMS]
    assert all(e["cubin"] for e in entries)
    capsys.readouterr()
    monkeypatch.setattr(N, "find_nvcc", lambda: None)  # the dry run reads the prepared folder, compiles nothing
    assert gpucheck.main(["unused", "--dry-run", "--prepared", str(prep), "--sizes", SMALL[0]]) == 0
    dry = capsys.readouterr().out
    assert dry.count("cubin     prepared: ") == len(W4.W4_FORMS), dry
    assert "plan      its own (persistent form): block " in dry
    assert f"{W4.TORCH_MM}: kernel only" in dry and "moved by a device-to-device copy" in dry


def test_a_w4_row_past_the_budget_is_skipped_and_the_run_goes_on(fake_gpu, monkeypatch):
    clock = {"t": 0.0}
    made = W4M.weights_of

    def slow_weights(program, seed=0):  # making the weights spends the budget
        clock["t"] = 1000.0
        launched.append(len(fake_gpu["grids"]))
        return made(program, seed)

    monkeypatch.setattr(W4M, "weights_of", slow_weights)
    launched = []  # spatialc's launches (the stand-in device records each grid) when the budget ran out
    monkeypatch.setattr(W4M, "_KEPT", {})
    cases = cases_of(SMALL, ["bf16"])
    runner = D.GpuRunner("sm_90", seed=0, workers=1)
    rows, stop = G.run_all(cases, runner, budget_s=100, clock=lambda: clock["t"], log=lambda s: None)
    runner.close()
    assert stop == "" and [r.status for r in rows] == ["skipped", "skipped"]
    assert rows[0].note == "not finished: time budget spent" and "budget of 100 s spent" in rows[1].note
    assert launched and launched[0] > 0 and len(fake_gpu["grids"]) == launched[0]  # the preflight's kernels only

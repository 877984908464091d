"""The GPU check's fused-epilogue rows (gpucheck/fused.py): the GEMM C = (A·B) · row_scale · col_scale + residual in
bf16 — its sizes and place in the run, its build (the form `auto` picks, recorded; the plain GEMM's kernels beside),
its tensors passed to each kernel by name, its float64 reference against the interpreter's and against the kernel
itself, emulated; the rows on the stand-in GPU (checked and timed against torch's GEMM and epilogue and against the
plain GEMM in the same row, a lost residual caught), their report, and their kernels prepared and found by the dry
run."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import spatialc
from spatialc.errors import SpatialError
from spatialc.gpucheck import fused as F
from spatialc.gpucheck.agreement import TOLERANCE, Check, check_result
from spatialc.gpucheck.builds import build_case
from spatialc.gpucheck.cases import DEFAULT_SIZES, Contestant, Row, cases_of, kernel_path
from spatialc.gpucheck.cuda import Inputs, kernel_tensors
from spatialc.gpucheck.report import row_dict, to_markdown
from spatialc.gpucheck.timing import Timing
from spatialc.runtime import launch as L
from spatialc.runtime.tilize import bf16_bits, bf16_to_float32, untilize

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture

# ---- sizes and the build ----------------------------------------------------------------------------------------


def test_fused_sizes_are_bf16_gemms_of_their_own_kind_run_after_the_multicast_rows():
    cases = cases_of(["fused:4096", "fused:40x24x36"], ["int8", "fp16", "bf16"])
    assert [(c.size, c.precision, c.fused) for c in cases] == [
        ("fused:4096x4096x4096", "bf16", True),
        ("fused:40x24x36", "bf16", True),
    ]
    assert cases[0].ops == 2 * 4096**3 and str(cases[1]) == "bf16 fused:40x24x36"
    assert kernel_path(cases[0], "spatialc general") == "spatialc general (fused)"  # left out in fused rows alone
    with pytest.raises(SpatialError, match="not fused:SIZE"):
        cases_of(["fused:"], ["bf16"])
    order = [c.size for c in cases_of(DEFAULT_SIZES, ["bf16"])]
    at = order.index("fused:4096x4096x4096")
    assert order[at - 1] == "mc2x2:8192x8192x8192" and order[at + 1 : at + 3] == ["fused:8192x8192x8192", "256x256x256"]


def test_a_fused_case_is_lowered_as_auto_chooses_with_the_plain_gemms_kernels_beside():
    (case,) = cases_of(["fused:64"], ["bf16"])
    built = build_case(case, "sm_90")
    # Every form prints the residual now: auto takes the persistent kernel on sm_90, and the row times all three.
    assert not built.error and built.kernel["form"] == "persistent" and built.kernel["out"] == "bf16"
    assert built.note == "lower's auto chose the persistent form"
    names = [f.contestant for f in built.forms]
    assert names == [
        "spatialc persistent",
        "spatialc general",
        "spatialc sm90a",
        "spatialc persistent (plain GEMM)",
        "spatialc general (plain GEMM)",
        "spatialc sm90a (plain GEMM)",
    ]
    persistent, general, hopper, *plain = built.forms
    for form in (persistent, general, hopper):
        assert form.artifact is not None and not form.absent, form.contestant
        names = [a.name for a in L.kernel_args(form.artifact.launch)]
        assert names == ["A", "B", "C", "row_scale", "col_scale", "residual"], form.contestant
    assert all(f.kernel_only and f.artifact is not None and F.is_plain(f) for f in plain)
    assert [a.name for a in L.kernel_args(plain[0].artifact.launch)] == ["A", "B", "C"]
    assert not any(F.is_plain(f) for f in (persistent, general, hopper))


# ---- the tensors and the reference --------------------------------------------------------------------------------


def _prep(art):
    """A kernel prepared on a numpy stand-in device (no work list): what kernel_tensors tiles and orders with."""
    return L.Prepared(SimpleNamespace(xp=np), None, art.launch, L.kernel_args(art.launch))


def _stored(rng, shape, lo, hi):
    return bf16_bits(rng.uniform(lo, hi, shape).astype(np.float32), np)


def test_each_kernel_gets_the_tensors_it_takes_by_name_scales_as_float32_values():
    # The fused kernel its A, B, residual and scales (the scales' bf16 bits as float32 values, each in its own shape);
    # the plain GEMM's A and B alone from the same set.
    (case,) = cases_of(["fused:40x24x36"], ["bf16"])
    built = build_case(case, "sm_90")
    fused, plain = built.form("general"), next(f for f in built.forms if F.is_plain(f))
    rng = np.random.default_rng(1)
    more = F.more_inputs(case, lambda shape, lo, hi: _stored(rng, shape, lo, hi))
    assert {k: v.shape for k, v in more.items()} == {"row_scale": (40, 1), "col_scale": (1, 24), "residual": (40, 24)}
    inputs = Inputs([_stored(rng, (40, 36), -1, 1)], [_stored(rng, (36, 24), -1, 1)], [more])
    args = kernel_tensors(_prep(fused.artifact), inputs.named(0), "C-buffer", np)
    by_name = dict(zip([a.name for a in L.kernel_args(fused.artifact.launch)], args, strict=False))
    assert by_name["C"] == "C-buffer" and len(args) == 6
    for name in ("row_scale", "col_scale"):
        arg = next(a for a in L.kernel_args(fused.artifact.launch) if a.name == name)
        got = untilize(by_name[name], arg.tiles, arg.elems, np)
        assert got.dtype == np.float32 and np.array_equal(got, bf16_to_float32(more[name], np)), name
    resid = next(a for a in L.kernel_args(fused.artifact.launch) if a.name == "residual")
    assert np.array_equal(untilize(by_name["residual"], resid.tiles, resid.elems, np), more["residual"])
    assert len(kernel_tensors(_prep(plain.artifact), inputs.named(0), "C-buffer", np)) == 3


def _values(x):
    return bf16_to_float32(x, np).astype(np.float64)


def test_the_reference_is_the_interpreters_and_the_residual_matters():
    (case,) = cases_of(["fused:40x24x36"], ["bf16"])
    rng = np.random.default_rng(2)
    a, b = _stored(rng, (40, 36), -1, 1), _stored(rng, (36, 24), -1, 1)
    more = F.more_inputs(case, lambda shape, lo, hi: _stored(rng, shape, lo, hi))
    ref = F.reference(_values(a) @ _values(b), {k: _values(v) for k, v in more.items()})
    program = spatialc.gemm(40, 24, 36, "bf16", epilogue=F.epilogue())  # float32 C: the epilogue's own rounding
    values = {"A": _values(a), "B": _values(b), **{k: _values(v).reshape(-1) for k, v in more.items()}}
    values["residual"] = _values(more["residual"])
    np.testing.assert_allclose(spatialc.evaluate(spatialc.build(program), values), ref, rtol=1e-5, atol=1e-4)
    # The residual is drawn as wide as A·B's elements: leaving it out is far outside the tolerance.
    spread = np.std(_values(a) @ _values(b)) / np.std(_values(more["residual"]))
    assert 0.5 < spread < 2
    without = F.reference(_values(a) @ _values(b), {**{k: _values(v) for k, v in more.items()}, "residual": 0.0})
    assert not check_result(bf16_bits(without.astype(np.float32), np), ref, np.zeros(1), "bfloat16", np).correct


@pytest.mark.emulation
def test_the_fused_kernel_emulated_meets_the_checks_tolerance_and_one_without_its_residual_does_not():
    # The general form's fused kernel text, run by the host emulation on a row's tensors: right by the GPU check's
    # rule (check_result at C's type); the same kernel with its residual tensor zeroed is not.
    (case,) = cases_of(["fused:40x24x36"], ["bf16"])
    general = build_case(case, "sm_90").form("general")
    rng = np.random.default_rng(3)
    a, b = _stored(rng, (40, 36), -1, 1), _stored(rng, (36, 24), -1, 1)
    more = F.more_inputs(case, lambda shape, lo, hi: _stored(rng, shape, lo, hi))
    ref = F.reference(_values(a) @ _values(b), {k: _values(v) for k, v in more.items()})
    given = {"A": _values(a), "B": _values(b), **{k: _values(v) for k, v in more.items()}}
    c = bf16_bits(np.asarray(spatialc.emulate(general.artifact, given), np.float32), np)
    check = check_result(c, ref, c, "bfloat16", np)
    assert check.correct and check.rel_fro < TOLERANCE["bfloat16"][0], check
    lost = bf16_bits(
        np.asarray(spatialc.emulate(general.artifact, {**given, "residual": 0 * given["residual"]}), np.float32), np
    )
    assert not check_result(lost, ref, lost, "bfloat16", np).correct


# ---- on the stand-in GPU ------------------------------------------------------------------------------------------


def test_a_fused_row_is_checked_and_timed_against_torch_and_the_plain_gemm(fake_gpu, tmp_path, capsys):
    status, _, rows = run(tmp_path, "--sizes", "fused:64", "fused:40x24x36", "--precisions", "bf16")
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    for row in rows:
        assert row["status"] == "ok" and row["fused"] and row["kernel"]["form"] == "persistent", row["note"]
        by = row["by_name"]
        for form in ("persistent", "general", "sm90a"):  # every form prints the fused kernel: each timed both ways
            mine = by[f"spatialc {form}"]
            assert mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], form
            assert mine["end_to_end"] is not None and "store A, B, the residual and the scales" in mine["detail"]
        for form in ("persistent", "general", "sm90a"):
            plain = by[f"spatialc {form} (plain GEMM)"]
            assert plain["ok"] and plain["check"]["correct"] and plain["end_to_end"] is None, form  # kernel only
            assert plain["kernel"]["method"] == "graph"
        theirs = by[F.TORCH_EPILOGUE]
        assert theirs["ok"] and theirs["family"] == "cublas" and "Triton matmul" not in by
        summary = row["fused_timings"]
        assert summary["picked"] == "persistent" and summary["goal"] == "met"
        for form in ("persistent", "general", "sm90a"):  # the stand-in times a fused kernel as its plain GEMM
            assert summary["forms"][form]["ratio"] == pytest.approx(1.0, rel=1e-6), form
        assert row["timings"]["kernel"]["cublas_best"]["name"] == F.TORCH_EPILOGUE
    md = (tmp_path / "gpucheck.md").read_text()
    assert "- bf16 fused:64x64x64 (auto: persistent): persistent 1.00×; general 1.00×; sm90a 1.00×;" in md
    assert "| bf16 | fused:40×24×36 | spatialc persistent | " in md  # the kernel table: the fused kernels
    capsys.readouterr()


@pytest.mark.parametrize(("fault", "said"), [("residual", "C wrong (max err"), ("miss", "1 element unwritten")])
def test_a_fused_kernel_that_loses_its_residual_fails_its_row(fake_gpu, tmp_path, fault, said, capsys):
    # The stand-in's kernel adds no residual (or leaves an element of C poisoned): the row is wrong, the goal not
    # judged; the plain GEMM's kernels, which have no residual, stay right.
    fake_gpu["fault"] = (fault, "64x64")
    status, _, rows = run(tmp_path, "--sizes", "fused:64", "--precisions", "bf16")
    (row,) = rows
    assert status == 1 and row["status"] == "wrong" and said in row["note"], row["note"]
    assert not row["by_name"]["spatialc general"]["check"]["correct"]
    assert row["fused_timings"]["goal"] is None and row["fused_timings"]["forms"]["general"]["fused_s"] is None
    if fault == "residual":
        assert row["by_name"]["spatialc general (plain GEMM)"]["ok"] and row["by_name"][F.TORCH_EPILOGUE]["ok"]
    capsys.readouterr()


def test_a_fused_kernel_that_hangs_is_left_out_of_fused_rows_alone(fake_gpu, monkeypatch, tmp_path, capsys):
    # The fused kernel hangs in the first fused row: the next worker runs the plain row's general form and, in both
    # fused rows, the plain GEMM's kernels and torch's, without the fused kernel.
    from .test_gpucheck_restart_faults import by_name, supervise, workers

    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "40x24", "spatialc_general"), None])
    status, header, rows = supervise(tmp_path, run_worker, ["fused:40x24x36", "64", "fused:40x24x48"])
    assert seen == [3, 1] and header["restarts"][0].startswith("spatialc general (fused) lost the GPU on row 1/3")
    assert by_name(rows[1])["spatialc general"]["ok"]  # the plain row's general form runs on
    for r in (rows[0], rows[2]):
        mine = by_name(r)
        assert r["status"] == "error" and mine["spatialc general"]["note"].startswith("unavailable: lost")
        assert mine["spatialc general (plain GEMM)"]["ok"] and mine[F.TORCH_EPILOGUE]["ok"]
    capsys.readouterr()


# ---- the report ---------------------------------------------------------------------------------------------------


def _t(s):
    return Timing(s, 10, 4, s, s, "graph")


def _mine(name, s, right=True):
    check = Check(right, 0.01, 0.001, 0, 0, 0, True)
    return Contestant(name, "spatialc", None, _t(s), 0.01, right, "", "", check)


def test_the_goal_sets_the_fastest_right_fused_kernel_against_the_fastest_right_plain_one():
    row = Row("bf16", 8192, 8192, 8192, status="ok", fused=True, kernel={"form": "general"})
    row.contestants = [
        _mine("spatialc general", 2.2e-3),
        _mine("spatialc persistent (plain GEMM)", 2.0e-3),
        _mine("spatialc general (plain GEMM)", 2.1e-3),
        _mine("spatialc sm90a (plain GEMM)", 1.5e-3, right=False),  # a wrong kernel's speed says nothing
    ]
    s = row_dict(row)["fused_timings"]
    assert s["forms"]["general"]["ratio"] == pytest.approx(2.2 / 2.1) and s["fastest_plain"] == "persistent"
    assert s["ratio"] == pytest.approx(1.1) and s["goal"] == "missed: 1.10× the plain GEMM's time"
    row.contestants[0] = _mine("spatialc general", 2.09e-3)
    assert row_dict(row)["fused_timings"]["goal"] == "met"  # 4.5% slower: within 3% plus the timing noise (2%)
    md = to_markdown({}, [row])
    assert "- bf16 fused:8192x8192x8192 (auto: general): general 1.00×; persistent —; sm90a —" not in md
    assert "(auto: general): persistent —; general 1.00×; sm90a —; fastest fused (general)" in md


# ---- prepared, and found by the dry run ----------------------------------------------------------------------------


def test_prepare_compiles_the_fused_and_layernorm_kernels_and_the_dry_run_finds_them(
    tmp_path, capsys, monkeypatch, fake_nvcc
):
    from spatialc import gpucheck
    from spatialc.gpucheck.prepare import Manifest
    from spatialc.runtime import nvcc as N

    prep, sizes = tmp_path / "prep", ["fused:64", "map:layernorm:64x64"]
    assert gpucheck.main([str(prep), "--prepare", "--sizes", *sizes, "--precisions", "bf16"]) == 0
    out = capsys.readouterr().out
    # The preflight's five, the fused GEMM's three forms and LayerNorm's general form; the plain GEMM's three at 64³
    # are the preflight's own texts (compiled once).
    assert "gpucheck prepare: 9 kernels (3 more share a text with one of them) for sm_90 with fake nvcc" in out
    assert "9 compiled, 0 failed" in out
    for form in ("persistent", "general", "sm90a"):
        assert f"bf16 fused:64x64x64 {form}: " in out
    entries = Manifest.load(prep).entries
    fused = {(e.form, e.kernel_name) for e in entries if e.case == "bf16 fused:64x64x64" and e.cubin}
    assert fused == {
        ("persistent", "spatialc_persistent"),
        ("general", "spatialc_general"),
        ("sm90a", "spatialc_hopper"),
    }
    (entry,) = [e for e in entries if e.case == "bf16 map:layernorm:64x64"]
    assert (entry.form, entry.kernel_name) == ("general", "spatialc_general") and entry.cubin
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    argv = ["unused", "--dry-run", "--prepared", str(prep), "--sizes", *sizes, "--precisions", "bf16"]
    assert gpucheck.main(argv) == 0
    dry = capsys.readouterr().out
    assert dry.count("    cubin     prepared: ") == 7  # the fused three, the plain GEMM's three, LayerNorm's general
    fused = dry.split("bf16 fused:64x64x64\n")[1].split("bf16 map:")[0]
    assert "  note      lower's auto chose the persistent form" in fused
    timed = next(line for line in fused.splitlines() if line.startswith("  timed     "))
    assert "spatialc general: end to end + kernel only; spatialc sm90a: end to end + kernel only" in timed
    assert "spatialc general (plain GEMM): kernel only, against the fused kernel" in timed
    assert "torch.matmul + epilogue: end to end + kernel only (out= forms)" in timed
    ln = dry.split("bf16 map:layernorm:64x64\n")[1]
    timed = next(line for line in ln.splitlines() if line.startswith("  timed     "))
    assert (
        "it reads x 3 times, the GB/s count once; its outputs out, mean, rstd each checked, stored as float32" in timed
    )
    assert "torch F.layer_norm(x, (n,), w, b, eps=1e-05): end to end + kernel only (the same call" in timed
    assert "    C         stored as float32\n" in ln  # out as mean and rstd are; its end to end converts nothing

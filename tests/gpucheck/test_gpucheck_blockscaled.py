"""The GPU check's block-scaled fp8 rows (gpucheck/blockscaled.py): `fp8bs:e4m3:SIZE`, DeepGEMM's 1x128 / 128x128
scales, bf16 C — their sizes and place in the default run, their build (the persistent and general forms print it
with the scale tensors as float32 arguments, the sm_90a form too), their float64 reference
against the interpreter's, and the rows on the stand-in GPU: checked and timed against torch._scaled_mm per-tensor,
the blockwise contestant said where torch has none, a kernel whose scale is wrong reported wrong, the dry run."""

from __future__ import annotations

import numpy as np
import pytest

import spatialc
from spatialc.errors import SpatialError
from spatialc.gpucheck import blockscaled as BS
from spatialc.gpucheck.agreement import values64
from spatialc.gpucheck.builds import build_case
from spatialc.gpucheck.cases import DEFAULT_SIZES, cases_of
from spatialc.gpucheck.fp8 import SCALED_TENSOR
from spatialc.runtime import launch as L
from spatialc.runtime.tilize import fp8_bits

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture


def test_sizes_name_the_block_scaled_rows_and_the_default_run_has_4096_and_8192():
    (case,) = cases_of(["fp8bs:E4M3:256x128x384"], ["int8"])
    assert (case.precision, case.blockscaled, case.size) == ("e4m3", True, "fp8bs:256x128x384")
    assert BS.scale_shapes(case) == {"scale_a": (256, 3), "scale_b": (3, 1)}
    for bad in ("fp8bs:int8:4096", "fp8bs:e4m3:"):
        with pytest.raises(SpatialError, match="not fp8bs:KIND:SIZE"):
            cases_of([bad], ["bf16"])
    scaled = [str(c) for c in cases_of(DEFAULT_SIZES, ["bf16"]) if c.blockscaled and not c.mx and c.groups == 1]
    assert scaled == ["e4m3 fp8bs:4096x4096x4096", "e4m3 fp8bs:8192x8192x8192"]


def test_the_row_is_built_in_each_form_that_prints_it_with_its_scales():
    (case,) = cases_of(["fp8bs:e4m3:128"], ["bf16"])
    built = build_case(case, "sm_90")
    assert not built.error and built.kernel["out"] == "bf16"
    persistent, general, hopper = built.forms
    for form in (persistent, general):
        args = [(a.name, a.elem) for a in L.kernel_args(form.artifact.launch)]
        assert args[3:] == [("scale_a", "float32"), ("scale_b", "float32")], form.contestant
        assert "part[" in form.artifact.kernel_cu  # the promoted step
    # the sm_90a form's (A's scales stored groups x rows, for their TMA boxes)
    args = [(a.name, a.elem) for a in L.kernel_args(hopper.artifact.launch)]
    assert args[3:5] == [("scale_a", "float32"), ("scale_b", "float32")] and "sa_stage[" in hopper.artifact.kernel_cu


def test_the_reference_is_the_interpreters():
    rng = np.random.default_rng(3)
    m, n, k = 32, 256, 384
    (case,) = cases_of([f"fp8bs:e4m3:{m}x{n}x{k}"], ["bf16"])
    a, b = (fp8_bits(rng.uniform(-1, 1, s).astype(np.float32), "float8_e4m3fn", np) for s in ((m, k), (k, n)))
    av, bv = values64(a, "float8_e4m3fn", np), values64(b, "float8_e4m3fn", np)
    more = BS.more_inputs(case, lambda shape, lo, hi: rng.uniform(lo, hi, shape).astype(np.float32))
    scales = {name: x.astype(np.float64) for name, x in more.items()}
    ref = BS.reference(av, bv, scales, np)
    p = spatialc.build(spatialc.gemm(m, n, k, "e4m3", scales=BS.LAYOUTS), "sm_90")
    np.testing.assert_allclose(spatialc.evaluate(p, {"A": av, "B": bv, **more}), ref, rtol=1e-6, atol=1e-6)
    assert not np.allclose(BS.reference(av, bv, {**scales, "scale_b": scales["scale_b"][::-1]}, np), ref)


def test_rows_are_checked_and_timed_against_scaled_mm(fake_gpu, tmp_path, capsys):
    status, _, rows = run(tmp_path, "--sizes", "fp8bs:e4m3:128")
    (row,) = rows
    assert status == 0 and row["status"] == "ok", row["note"]
    by = row["by_name"]
    for form in ("persistent", "general", "sm90a"):
        mine = by[f"spatialc {form}"]
        assert mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], form
    theirs = by[SCALED_TENSOR]
    assert theirs["ok"] and theirs["kernel"] and theirs["end_to_end"]
    assert by[BS.BLOCKWISE]["note"].startswith("unavailable: torch fake: no blockwise _scaled_mm known")
    capsys.readouterr()


def test_a_kernel_reading_a_wrong_scale_is_reported_wrong(fake_gpu, tmp_path, capsys):
    fake_gpu["fault"] = ("scale_b", "spatialc_general")  # two K groups: their B scales exchanged
    status, _, rows = run(tmp_path, "--sizes", "fp8bs:e4m3:128x128x256")
    (row,) = rows
    assert status == 1 and row["status"] == "wrong" and "spatialc general: C wrong" in row["note"], row["note"]
    assert row["by_name"]["spatialc persistent"]["check"]["correct"]
    capsys.readouterr()


def test_the_dry_run_lists_the_row(tmp_path, capsys):
    from spatialc import gpucheck

    argv = ["unused", "--dry-run", "--sizes", "fp8bs:e4m3:256", "--precisions", "bf16"]
    assert gpucheck.main(argv) == 0
    dry = capsys.readouterr().out
    assert "e4m3 fp8bs:256x256x256" in dry
    timed = next(line for line in dry.split("e4m3 fp8bs:256x256x256\n")[1].splitlines() if "timed" in line)
    assert f"{BS.BLOCKWISE}: end to end + kernel only, its C checked in the row (the block-scaled sum)" in timed
    assert f"{SCALED_TENSOR}: end to end + kernel only" in timed


# ---- MXFP8 rows (fp8mx:): OCP MX's e8m0 scales, one per 32 of K --------------------------------------------------


def _mx_operands(rng, m, n, k):
    (case,) = cases_of([f"fp8mx:e4m3:{m}x{n}x{k}"], ["bf16"])
    a, b = (fp8_bits(rng.uniform(-1, 1, s).astype(np.float32), "float8_e4m3fn", np) for s in ((m, k), (k, n)))
    av, bv = values64(a, "float8_e4m3fn", np), values64(b, "float8_e4m3fn", np)
    more = BS.more_inputs(case, lambda shape, lo, hi: rng.uniform(lo, hi, shape).astype(np.float32))
    return case, av, bv, more


def test_mx_rows_are_named_built_and_drawn_as_mx_scales():
    scaled = [str(c) for c in cases_of(DEFAULT_SIZES, ["bf16"]) if c.mx]
    assert scaled == ["e4m3 fp8mx:4096x4096x4096", "e4m3 fp8mx:8192x8192x8192"]
    with pytest.raises(SpatialError, match="not fp8mx:KIND:SIZE"):
        cases_of(["fp8mx:int4:64"], ["bf16"])
    case, _, _, more = _mx_operands(np.random.default_rng(0), 64, 96, 256)
    assert case.blockscaled and BS.scale_shapes(case) == {"scale_a": (64, 8), "scale_b": (8, 96)}
    for x in more.values():  # powers of two over the whole range, float32
        e = np.log2(x)
        assert x.dtype == np.float32 and np.array_equal(e, np.round(e)) and {e.min(), e.max()} == set(BS.MX_EXPONENTS)
    persistent, general, hopper = build_case(case, "sm_90").forms
    for form in (persistent, general):
        args = [(a.name, a.elem) for a in L.kernel_args(form.artifact.launch)]
        assert args[3:] == [("scale_a", "float8_e8m0fnu"), ("scale_b", "float8_e8m0fnu")], form.contestant
    assert hopper.artifact is None and "MXFP8" in hopper.absent
    assert "not MX's e8m0" in BS.refusal(BS.BLOCKWISE, case) and not BS.refusal(SCALED_TENSOR, case)


def test_the_mx_reference_and_bound_are_the_interpreters_and_tolerances():
    case, av, bv, more = _mx_operands(np.random.default_rng(4), 32, 48, 256)
    scales = {name: x.astype(np.float64) for name, x in more.items()}
    ref = BS.reference(av, bv, scales, np)
    p = spatialc.build(spatialc.gemm(32, 48, 256, "e4m3", scales="mx", out="bf16"), "sm_90")
    given = {"A": av, "B": bv, **more}
    np.testing.assert_allclose(spatialc.evaluate(p, given), ref, rtol=2**-8, atol=1e-30)
    tol = spatialc.tolerance(p, kernel=True)
    magnitude = BS.reference(np.abs(av), np.abs(bv), {k: np.abs(v) for k, v in scales.items()}, np)
    mine = BS.tolerance_bound(tol, ref, magnitude, np)
    np.testing.assert_allclose(mine, tol.against(given)[1], rtol=2**-8)
    assert not np.allclose(BS.reference(av, bv, {**scales, "scale_b": scales["scale_b"][::-1]}, np), ref)


def test_mx_rows_are_checked_within_the_tolerance_and_timed(fake_gpu, tmp_path, capsys):
    status, _, rows = run(tmp_path, "--sizes", "fp8mx:e4m3:128x128x256")
    (row,) = rows
    assert status == 0 and row["status"] == "ok", row["note"]
    by = row["by_name"]
    for form in ("persistent", "general"):
        assert by[f"spatialc {form}"]["ok"] and by[f"spatialc {form}"]["check"]["correct"], form
    assert by["spatialc sm90a"]["note"].startswith("n/a: cannot lower an MXFP8 GEMM")
    assert by[SCALED_TENSOR]["ok"] and not by[BS.BLOCKWISE]["ok"]  # (the stand-in torch has no blockwise call)
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| e4m3 | fp8mx:128×128×256 |" in md
    capsys.readouterr()


def test_an_mx_kernel_past_the_tolerances_bound_is_reported_wrong(fake_gpu, tmp_path, capsys, monkeypatch):
    from spatialc.gpucheck import device as D

    made = D.GpuRunner._mx_bound
    monkeypatch.setattr(D.GpuRunner, "_mx_bound", lambda *a: made(*a) * 0.0)  # a bound none but exact C meets
    status, _, rows = run(tmp_path, "--sizes", "fp8mx:e4m3:128x128x256")
    (row,) = rows
    assert status == 1 and row["status"] == "wrong"
    assert not row["by_name"]["spatialc general"]["check"]["correct"]  # within the GEMM rows' bar, not this bound
    capsys.readouterr()


# ---- block-scaled grouped rows (fp8bs:KIND:gG:…): DeepGEMM's grouped fp8 MoE GEMM ----------------------------------

GROUPED = "fp8bs:e4m3:g4:64x256x384"


def test_grouped_block_scaled_rows_are_named_and_in_the_default_list():
    (case,) = cases_of([GROUPED], ["int8"])
    assert (case.groups, case.m, case.blockscaled, case.mx) == (4, 64, True, False)
    assert str(case) == "e4m3 fp8bs:g4:64x256x384"
    every = [str(c) for c in cases_of(DEFAULT_SIZES, ["bf16"]) if c.blockscaled and c.groups > 1]
    assert every == ["e4m3 fp8bs:g8:512x4096x7168", "e4m3 fp8bs:g4:1024x7168x2048"]
    with pytest.raises(SpatialError, match="gG:MAXROWSxNxK"):
        cases_of(["fp8bs:e4m3:g1:64x64x128"], ["bf16"])
    from spatialc.gpucheck.dryrun import contenders
    from spatialc.gpucheck.groupedbs import LOOP_BLOCKWISE, LOOP_TENSOR

    said = contenders(case, build_case(case, "sm_90"))  # what the dry run lists for the row
    assert said[1] == "spatialc general: kernel only, rows past each count checked to keep the poison"
    assert said[2].startswith(f"{LOOP_TENSOR}: kernel only") and said[3].startswith(f"{LOOP_BLOCKWISE}: kernel only")


def test_grouped_block_scaled_rows_are_checked_and_timed_against_the_scaled_mm_loop(fake_gpu, tmp_path, capsys):
    from spatialc.gpucheck.groupedbs import LOOP_BLOCKWISE, LOOP_TENSOR

    status, _, rows = run(tmp_path, "--sizes", GROUPED)
    (row,) = rows
    assert status == 0 and row["status"] == "ok", row["note"]
    by = row["by_name"]
    assert by["spatialc general"]["ok"] and by["spatialc general"]["check"]["correct"]
    assert by["spatialc general"]["kernel"]["median_s"] > 0 and "spatialc persistent" not in by  # general alone
    assert by[LOOP_TENSOR]["ok"] and by[LOOP_TENSOR]["kernel"]["median_s"] > 0
    assert by[LOOP_BLOCKWISE]["note"].startswith("unavailable: torch fake")
    capsys.readouterr()


def test_a_grouped_block_scaled_kernel_that_ignores_a_scale_is_reported_wrong(fake_gpu, tmp_path, capsys, monkeypatch):
    from spatialc.gpucheck import groupedbs as GB

    made = GB.GroupedScaled._params

    def one_scale_wrong(self, prep, args):  # the kernel gets a B scale the reference does not have
        params = made(self, prep, args)
        params["scale_b"] = prep.tiled(args["scale_b"], self.scales["scale_b"] * 2)
        return params

    monkeypatch.setattr(GB.GroupedScaled, "_params", one_scale_wrong)
    status, _, rows = run(tmp_path, "--sizes", GROUPED)
    (row,) = rows
    assert status == 1 and row["status"] == "wrong" and not row["by_name"]["spatialc general"]["check"]["correct"]
    assert row["by_name"][GB.LOOP_TENSOR]["ok"]  # the library's check is its own
    capsys.readouterr()

"""The GPU check's device side on the stand-ins (tests/gpucheck/test_gpucheck_fakes.py): the preflight, every contestant
checked and timed both ways, the fallbacks the real libraries' rules force, prepared cubins, hangs, lost contexts
and compiles stopped at the budget."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from spatialc import gpucheck
from spatialc.gpucheck import baselines as BL
from spatialc.gpucheck import builds as B
from spatialc.gpucheck import device as D
from spatialc.gpucheck import driver as G
from spatialc.gpucheck import dryrun as DR
from spatialc.gpucheck.cases import Case, Deadline, kernel_arch
from spatialc.runtime import nvcc as N

from .test_gpucheck_fakes import exit_raises, lowered_as, without_general
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture


def run(tmp_path, *argv):
    """main on the stand-ins; returns its status, the report's header and its rows (each contestant by name)."""
    status = gpucheck.main([str(tmp_path), "--commit", "x", *argv], make_runner=D.GpuRunner)
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    for row in data["rows"]:
        row["by_name"] = {c["name"]: c for c in row["contestants"]}
    return status, data["header"], data["rows"]


def probes(header):
    return {p["name"].split(":")[0]: p for p in header["preflight"]}


# spatialc's contestants, in the report's order: on an sm_90 device the same GEMM built for sm_90a is the third.
FORMS = ("spatialc persistent", "spatialc general", "spatialc sm90a")


def test_every_contestant_is_checked_and_timed_both_ways(fake_gpu, tmp_path, capsys):
    status, header, rows = run(tmp_path, "--sizes", "64", "40x24x36", "--precisions", "int8", "bf16")
    assert status == 0
    assert header["gpu"] == "Fake H200" and header["sms"] == 132 and header["target"] == "sm_90"
    assert header["warnings"] == [] and header["kernel_timing"].startswith("CUDA graphs, except rows with a library")
    found = probes(header)
    kernels = ("spatialc persistent kernel", "spatialc general kernel", "spatialc sm90a kernel")
    for ok in ("device", "CuPy cuBLAS", *kernels, "torch.matmul", "torch._int_mm (B column-major)"):
        assert found[ok]["ok"], found[ok]
    assert found["cublasGemmEx TN"]["ok"] and found["CUDA graphs"]["ok"] and found["Triton matmul"]["ok"]
    assert found["torch._int_mm (B row-major)"]["ok"] is False  # cuBLASLt without NN int8 kernels
    assert "CUBLAS_STATUS_NOT_SUPPORTED" in found["torch._int_mm (B row-major)"]["detail"]
    assert [(r["precision"], r["status"]) for r in rows] == [("int8", "ok"), ("bf16", "ok")] * 2
    for r in rows:  # both of spatialc's kernels, each checked against the reference and timed both ways
        assert [c["name"] for c in r["contestants"][:3]] == list(FORMS)
        for name in FORMS:
            mine = r["by_name"][name]
            assert mine["check"]["correct"] and mine["check"]["stable"] and mine["check"]["unwritten"] == 0
            graphed = "events" if r["precision"] == "int8" else "graph"  # cublasGemmEx TN cannot be captured
            assert mine["ok"] and mine["kernel"]["method"] == graphed and mine["end_to_end"]["method"] == "events"
            assert mine["kernel"]["median_s"] > 0 and mine["end_to_end"]["median_s"] > 0
        for form in ("persistent", "general", "sm90a"):
            summary = r["timings"]["end_to_end"]["spatialc"][form]
            assert summary["rate"] > 0 and summary["pct_of_cublas"] is not None
            assert r["timings"]["kernel"]["spatialc"][form]["pct_of_triton"]
    int8 = rows[0]["by_name"]
    for name in ("torch._int_mm (B column-major)", "cublasGemmEx TN", "Triton matmul"):
        assert int8[name]["ok"] and int8[name]["kernel"]["method"] == "events", int8[name]
    assert int8["torch._int_mm (B row-major)"]["note"].startswith("unavailable: torch._int_mm (B row-major): int8")
    for name in FORMS:
        assert rows[0]["by_name"][name]["facts"]["c_elem"] == "int32"
        assert rows[1]["by_name"][name]["facts"]["c_elem"] == "bfloat16"
    odd = rows[2]["by_name"]  # 40×24×36: k = 36 is no multiple of 8
    assert odd["torch._int_mm (B column-major)"]["note"].startswith("n/a: torch._int_mm needs m > 16 and k, n")
    assert odd["cublasGemmEx TN"]["ok"] and "no padding needed" in odd["cublasGemmEx TN"]["detail"]
    assert fake_gpu["cp"].freed == 4  # memory released after every row
    plan = rows[0]["kernel"]  # the plan, which both kernels share
    assert plan["block"].count("×") == 2 and plan["depth"] > 0 and plan["sites"] > 0
    persistent, general, hopper = (rows[0]["by_name"][name]["facts"] for name in FORMS)
    for k in (persistent, general, hopper):  # each kernel's budget, and why ptxas said nothing: no nvcc here
        assert k["threads"] > 0 and k["blocks_per_sm"] > 0 and k["launch"].startswith("grid ")
        assert k["ptxas"] == "no nvcc (NVRTC)" and "registers" not in k
    assert persistent["threads"] != general["threads"]  # the general form adds the reader's and writer's warps
    assert hopper["threads"] == 384 and hopper["own_plan"].startswith("block 8×")  # its own plan: 128-row items
    # Its tensor maps, encoded by the device under cuTensorMapEncodeTiled's rules, each 2-D over a stored matrix: A's
    # box 128 rows of one swizzled panel; the output's a consumer warpgroup's 64 rows, swizzled as wide as they are.
    maps = fake_gpu["tensor_maps"]
    assert maps and all(len(box) == 2 for _, _, box, _ in maps) and any(box[1] == 128 for _, _, box, _ in maps)
    assert any(box[1] == 64 for _, _, box, _ in maps)
    swizzles = {swizzle for *_, swizzle in maps}
    assert swizzles <= {32, 64, 128} and 128 in swizzles
    out = capsys.readouterr().out
    assert "| bf16 | 40×24×36 |" in out and "| int8 | 64×64×64 | torch._int_mm (B row-major) |" in out
    head = (
        "| precision | m×n×k | spatialc persistent e2e | spatialc general e2e | spatialc sm90a e2e | "
        "cuBLAS e2e (fastest) | % cuBLAS e2e |"
    )
    assert head in out and "| 100% / 100% / 100% |" in out and "| 0 / 0 / 0 | yes / yes / yes | ok |" in out
    assert "| int8 | 64×64×64 | persistent | " in out and "| int8 | 64×64×64 | general | " in out  # kernel table
    assert "| int8 | 64×64×64 | sm90a | " in out


def test_gemm_ex_runs_on_padded_operands_and_the_stand_in_refuses_them_unpadded(
    fake_gpu, tmp_path, monkeypatch, capsys
):
    status, header, rows = run(tmp_path / "a", "--sizes", "33x35x37", "--precisions", "int8")
    assert status == 0
    ex = rows[0]["by_name"]["cublasGemmEx TN"]
    assert ex["ok"] and "operands zero-padded to 36×36×40" in ex["detail"]
    assert ex["kernel"]["median_s"] > 0 and ex["end_to_end"]["median_s"] > 0
    monkeypatch.setattr(BL, "gemm_ex_shape", lambda m, n, k: (m, n, k))  # as if the rule were ignored
    status, header, rows = run(tmp_path / "b", "--sizes", "33x35x37", "--precisions", "int8")
    assert status == 0  # spatialc's row is still right; the library path is marked, with cuBLAS's reason
    assert probes(header)["cublasGemmEx TN"]["ok"] is False
    note = rows[0]["by_name"]["cublasGemmEx TN"]["note"]
    assert note.startswith("unavailable: cublasGemmEx TN: int8 33x35x37:") and "lda, ldb multiples of 4" in note
    capsys.readouterr()


def test_int_mm_with_b_row_major_counts_where_the_device_takes_it(fake_gpu, tmp_path, capsys):
    fake_gpu["torch"].nn_int8 = True
    status, header, rows = run(tmp_path, "--sizes", "64", "16x64x64", "--precisions", "int8")
    assert status == 0 and probes(header)["torch._int_mm (B row-major)"]["ok"]
    assert rows[0]["by_name"]["torch._int_mm (B row-major)"]["ok"]
    small = rows[1]["by_name"]  # m = 16: _int_mm refuses both layouts; cuBLAS's own path still runs
    assert small["torch._int_mm (B row-major)"]["note"] == (
        "n/a: torch._int_mm needs m > 16 and k, n multiples of 8 (m=16, n=64, k=64)"
    )
    assert small["cublasGemmEx TN"]["ok"]
    capsys.readouterr()


def test_without_torch_the_cublas_path_through_cupy_still_counts(fake_gpu, tmp_path, capsys):
    fake_gpu["torch"] = None
    status, header, rows = run(tmp_path, "--sizes", "64", "--precisions", "int8", "fp16")
    assert status == 0
    found = probes(header)
    assert found["torch.matmul"]["ok"] is False and "torch is not installed" in found["torch.matmul"]["detail"]
    assert found["Triton matmul"]["detail"] == "Triton: needs torch"
    int8, fp16 = rows[0], rows[1]
    assert int8["timings"]["kernel"]["cublas_best"]["name"] == "cublasGemmEx TN"
    assert int8["by_name"]["torch._int_mm (B column-major)"]["note"].startswith("unavailable: torch is not installed")
    assert fp16["timings"]["end_to_end"]["cublas_best"] is None and fp16["status"] == "ok"
    capsys.readouterr()


def test_a_library_that_fails_its_step_is_left_out_with_the_reason(fake_gpu, tmp_path, capsys):
    fake_gpu["triton"].refuse = "CompilationError: at 12:8: unsupported dot operand types"
    fake_gpu["torch"].wrong_above = 64  # right in the preflight's 64³, wrong in the row's 96³
    status, header, rows = run(tmp_path, "--sizes", "96", "--precisions", "fp16")
    assert status == 0 and probes(header)["torch.matmul"]["ok"] and probes(header)["Triton matmul"]["ok"] is False
    found = rows[0]["by_name"]
    assert found["Triton matmul"]["note"] == (
        "unavailable: Triton matmul: fp16 64x64x64: FakeError: CompilationError: at 12:8: unsupported dot operand types"
    )
    assert found["torch.matmul"]["note"] == "wrong; not timed" and found["torch.matmul"]["ok"] is False
    assert rows[0]["timings"]["kernel"]["cublas_best"] is None and rows[0]["status"] == "ok"
    assert "| fp16 | 96×96×96 | torch.matmul | — | — | — | WRONG (1) | wrong; not timed |" in capsys.readouterr().out


def test_when_graphs_fail_every_contestant_is_timed_launch_by_launch(fake_gpu, tmp_path, capsys):
    fake_gpu["cp"].capture_refused = "cudaErrorStreamCaptureUnsupported: operation not permitted when capturing"
    status, header, rows = run(tmp_path, "--sizes", "64", "--precisions", "fp16")
    assert status == 0
    assert probes(header)["CUDA graphs"]["ok"] is False
    assert header["kernel_timing"] == (
        "events (graphs unavailable: CUDA graphs: every contestant captured and replayed: spatialc persistent: "
        "FakeError: cudaErrorStreamCaptureUnsupported: operation not permitted when capturing)"
    )
    for c in rows[0]["contestants"]:
        assert c["kernel"]["method"] == "events" and c["kernel"]["note"] == "", c
    capsys.readouterr()


def test_one_library_that_cannot_be_captured_turns_graphs_off_for_its_rows_alone(fake_gpu, tmp_path, capsys):
    # torch refuses the capture here; CuPy's cuBLAS does always (the first GPU run, 2026-12-06: cublasGemmEx TN:
    # "calling cuBLAS API during stream capture is currently unsupported"), which once turned graphs off for all.
    fake_gpu["torch"].capture_refused = "CUDA error: operation not permitted when stream is capturing"
    status, header, rows = run(tmp_path, "--sizes", "64", "--precisions", "bf16", "int8")
    graphs = probes(header)["CUDA graphs"]
    assert status == 0 and graphs["ok"], graphs
    assert "torch.matmul: not captured (FakeError: CUDA error: operation not permitted" in graphs["detail"]
    assert "cublasGemmEx TN: not captured (NotImplementedError: calling cuBLAS API" in graphs["detail"]
    assert header["kernel_timing"].startswith("CUDA graphs, except rows with a library a graph cannot hold")
    by_precision = {r["precision"]: r for r in rows}
    for precision in ("bf16", "int8"):  # each row has one such library: all its contestants alike, by events
        methods = {c["kernel"]["method"] for c in by_precision[precision]["contestants"] if c.get("kernel")}
        assert methods == {"events"}, (precision, methods)
    capsys.readouterr()


def test_a_row_whose_libraries_all_capture_keeps_its_graphs(fake_gpu, tmp_path, capsys):
    status, header, rows = run(tmp_path, "--sizes", "64", "--precisions", "int8", "fp16")
    assert status == 0
    by_precision = {r["precision"]: r for r in rows}
    int8 = {c["kernel"]["method"] for c in by_precision["int8"]["contestants"] if c.get("kernel")}
    fp16 = {c["kernel"]["method"] for c in by_precision["fp16"]["contestants"] if c.get("kernel")}
    assert int8 == {"events"} and fp16 == {"graph"}, (int8, fp16)  # cublasGemmEx runs in int8 rows only
    capsys.readouterr()


def test_graphs_take_in_every_contestant_that_passed_its_step(fake_gpu, tmp_path, capsys):
    status, header, rows = run(tmp_path, "--sizes", "64", "--precisions", "int8")
    detail = probes(header)["CUDA graphs"]["detail"]
    assert detail == (
        "spatialc persistent, spatialc general, spatialc sm90a, spatialc general (multicast), torch._int_mm (B "
        "column-major), Triton matmul: captured, replayed, correct; cublasGemmEx TN: not captured (NotImplementedError:"
        " calling cuBLAS API during stream capture is currently unsupported), its rows timed by events"
    )
    capsys.readouterr()


def test_without_gemm_out_the_end_to_end_time_includes_the_conversion(fake_gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(B, "gemm_takes_out", lambda: False)
    monkeypatch.setattr(DR, "gemm_takes_out", lambda: False)
    status, header, rows = run(tmp_path, "--sizes", "48", "--precisions", "bf16")
    assert status == 0 and "spatialc.gemm takes no `out` yet" in header["outputs"]
    for name in FORMS:
        mine = rows[0]["by_name"][name]
        assert mine["facts"]["c_elem"] == "float32" and mine["ok"]
        assert "read C back, convert float32 → bfloat16 (spatialc.run's argument checks" in mine["detail"]
    capsys.readouterr()


def test_a_device_with_fewer_sms_than_planned_is_warned_about(fake_gpu, tmp_path, capsys):
    fake_gpu["cp"].props["multiProcessorCount"] = 7
    status, header, rows = run(tmp_path, "--sizes", "256", "--precisions", "fp16")
    assert status == 0 and header["target_sms"] == 132
    assert header["warnings"] == [
        "the device has 7 SMs, fewer than the 132 that sm_90 plans for: each kernel's work list is split over the "
        "sites this device runs (the kernel table's sites column: planned (run)), but its block, sub-blocks and ring "
        "depth were chosen for 132"
    ]
    assert rows[0]["kernel"]["sites"] == 32
    persistent, general, hopper = (rows[0]["by_name"][name] for name in FORMS)
    assert persistent["facts"]["sites_run"] == 28  # 7 SMs × 4 blocks each run the 32 items …
    assert general["facts"]["sites_run"] == 21  # … and the general form's 7 SMs × 3 …
    assert hopper["facts"]["sites"] == 32 and hopper["facts"]["sites_run"] == 7  # … and its own plan's 32 on 7 × 1
    # The preflight's 64³ (two items; the sm90a form's own plan: four), the row's 256³ in each form.
    assert set(fake_gpu["grids"]) == {2, 4, 28, 21, 7}
    for mine in (persistent, general, hopper):  # every item computed, on fewer sites
        assert mine["check"]["correct"], mine
    out = capsys.readouterr()
    assert "gpucheck: ⚠ the device has 7 SMs" in out.err
    assert re.search(r"\| \d \| 32 \(28\) \| 256 \|", out.out) and re.search(r"\| \d \| 32 \(21\) \| 320 \|", out.out)
    assert re.search(r"\| sm90a \| 8×1×4 \| 1×1 \| \d \| 32 \(7\) \| 384 \|", out.out)


def test_a_kernel_that_misses_an_element_fails_its_row(fake_gpu, tmp_path, capsys):
    fake_gpu["fault"] = ("miss", "32x32")
    status, header, rows = run(tmp_path, "--sizes", "32", "--precisions", "fp16")
    assert status == 1
    row = rows[0]
    assert row["status"] == "wrong"
    for name in FORMS:
        check = row["by_name"][name]["check"]
        assert check["unwritten"] == 1 and not check["correct"]
    capsys.readouterr()


def test_a_wrong_general_form_fails_its_row_beside_a_right_persistent_kernel(fake_gpu, tmp_path, capsys):
    fake_gpu["fault"] = ("miss", "32x32", "spatialc_general")
    status, header, rows = run(tmp_path, "--sizes", "32", "--precisions", "fp16")
    assert status == 1 and probes(header)["spatialc general kernel"]["ok"]  # the preflight's 64³ is right
    assert probes(header)["spatialc sm90a kernel"]["ok"]
    row = rows[0]
    persistent, general, hopper = (row["by_name"][name] for name in FORMS)
    assert row["status"] == "wrong" and persistent["check"]["correct"] and not general["check"]["correct"]
    assert general["check"]["unwritten"] == 1 and general["kernel"]["median_s"] > 0  # still timed, like spatialc was
    # The fault is the general form's kernel's (spatialc_general): the sm90a kernel (spatialc_hopper) is right.
    assert hopper["ok"] and hopper["check"]["correct"] and hopper["check"]["unwritten"] == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| fp16 | 32×32×32 |"))
    said = f" / nan / {hopper['check']['max_abs']:.3g} | yes / no / yes | wrong: spatialc general: C wrong (max err"
    assert line.endswith(said + " nan, 1 element unwritten); end-to-end C wrong (max err nan) |")
    assert general["check"]["stable"]  # a second run left the same element unwritten: NaN errors compare equal


def test_a_general_form_that_fails_costs_only_its_own_contestant(fake_gpu, tmp_path, capsys):
    fake_gpu["fault"] = ("fails", "32x32", "spatialc_general")
    status, header, rows = run(tmp_path, "--sizes", "32", "--precisions", "int8")
    assert status == 1
    row = rows[0]
    persistent, general, hopper = (row["by_name"][name] for name in FORMS)
    assert row["status"] == "error" and "spatialc general: failed: FakeError: CUDA_ERROR_INVALID_IMAGE" in row["note"]
    assert general["note"].startswith("failed: FakeError: CUDA_ERROR_INVALID_IMAGE") and general["kernel"] is None
    for mine in (persistent, hopper):  # the other kernels, the sm90a one (spatialc_hopper) too, checked and timed
        assert mine["ok"] and mine["check"]["correct"] and mine["kernel"]["median_s"] > 0, mine
    assert row["by_name"]["cublasGemmEx TN"]["ok"]  # and the libraries still ran
    out = capsys.readouterr().out
    assert "| int8 | 32×32×32 | spatialc general | — | — | — | — | failed: FakeError: CUDA_ERROR_INVALID_IMAGE" in out


def test_a_general_form_that_fails_the_preflight_is_left_out_of_every_row(fake_gpu, tmp_path, capsys):
    fake_gpu["fault"] = ("fails", "spatialc_general")
    status, header, rows = run(tmp_path, "--sizes", "32", "--precisions", "bf16")
    assert status == 1 and probes(header)["spatialc persistent kernel"]["ok"]
    assert probes(header)["spatialc general kernel"]["ok"] is False and probes(header)["spatialc sm90a kernel"]["ok"]
    graphs = probes(header)["CUDA graphs"]
    assert graphs["ok"] and graphs["detail"] == (
        "spatialc persistent, spatialc sm90a, torch.matmul, Triton matmul: captured, replayed, correct"
    )
    row = rows[0]
    assert row["status"] == "error" and row["by_name"]["spatialc persistent"]["ok"]
    assert row["by_name"]["spatialc sm90a"]["ok"] and row["by_name"]["spatialc sm90a"]["check"]["correct"]
    assert row["by_name"]["spatialc general"]["note"].startswith(
        "unavailable: spatialc general kernel: bf16 64x64x64: FakeError: CUDA_ERROR_INVALID_IMAGE"
    )
    capsys.readouterr()


def test_a_case_without_a_general_form_says_why_in_its_general_contestant(fake_gpu, tmp_path, monkeypatch, capsys):
    why = "no general form: shared memory of one block of the general form on sm_90: needs 299200, has 232448"
    lowered_as(monkeypatch, without_general(why))
    status, header, rows = run(tmp_path, "--sizes", "48", "--precisions", "fp16")
    assert status == 0 and probes(header)["spatialc general kernel"]["detail"] == why
    assert probes(header)["spatialc sm90a kernel"]["ok"]  # built and lowered apart: it has its own kernel
    row = rows[0]
    assert row["status"] == "ok" and row["by_name"]["spatialc persistent"]["ok"]
    assert row["by_name"]["spatialc sm90a"]["ok"] and row["by_name"]["spatialc sm90a"]["check"]["correct"]
    general = row["by_name"]["spatialc general"]
    assert general["note"] == f"n/a: {why}" and general["end_to_end"] is None and general["facts"] == {}
    assert row["timings"]["kernel"]["spatialc"]["general"] == {
        "rate": None,
        "pct_of_cublas": None,
        "pct_of_triton": None,
    }
    out = capsys.readouterr().out
    assert f"| fp16 | 48×48×48 | spatialc general | — | — | — | — | n/a: {why} |" in out
    line = next(x for x in out.splitlines() if x.startswith("| fp16 | 48×48×48 |") and "TFLOP/s" in x)
    assert "| — TFLOP/s |" in line and "| yes / — / yes | ok |" in line
    assert len(re.findall(r"\| \d+% / — / \d+% \|", line)) == 3  # % of cuBLAS both ways and of Triton: — the middle
    assert "| fp16 | 48×48×48 | persistent |" in out and "| fp16 | 48×48×48 | general |" not in out
    assert "| fp16 | 48×48×48 | sm90a |" in out


def test_a_case_lower_gives_only_in_the_general_form_runs_that_alone(fake_gpu, tmp_path, monkeypatch, capsys):
    why = "the general form, as the persistent kernel refuses: a planted refusal"
    lowered_as(monkeypatch, lambda lower, p, t: dataclasses.replace(lower(p, t, form="general"), notes=(why,)))
    status, header, rows = run(tmp_path, "--sizes", "48", "--precisions", "int8")
    assert status == 0 and probes(header)["spatialc persistent kernel"]["detail"] == why
    row = rows[0]
    assert row["status"] == "ok" and row["note"] == why
    assert "spatialc persistent" not in row["by_name"] and row["by_name"]["spatialc general"]["ok"]
    assert row["by_name"]["spatialc general"]["facts"]["threads"] == 320
    assert row["by_name"]["spatialc sm90a"]["ok"]  # lowered apart, in its own form: untouched by the refusal
    capsys.readouterr()


@pytest.mark.parametrize(
    ("fault", "precision", "statuses", "notes"),
    [
        pytest.param(
            ("hang", "32x32"),
            "int8",
            ["hung", "skipped"],
            [lambda n: "did not finish" in n, lambda n: "hung on an earlier row" in n],
            id="a_hung_kernel_becomes_a_written_table",
        ),
        pytest.param(
            "hang",
            "fp16",
            ["skipped", "skipped"],
            [lambda n: n.startswith("not run: the GPU was lost in the preflight (GpuHung: the GPU did not finish")],
            id="a_hang_in_the_preflight_skips_every_row",
        ),
        pytest.param(
            ("illegal", "32x32"),
            "bf16",
            ["error", "skipped"],
            [lambda n: "illegal memory access" in n, lambda n: "context was lost" in n],
            id="a_sticky_cuda_error_stops_the_run",
        ),
    ],
)
def test_a_lost_gpu_writes_the_table_and_exits_3(
    fault, precision, statuses, notes, fake_gpu, tmp_path, monkeypatch, capsys
):
    exit_raises(monkeypatch)
    fake_gpu["fault"] = fault
    with pytest.raises(SystemExit) as done:
        gpucheck.main([str(tmp_path), "--sizes", "32", "48", "--precisions", precision], make_runner=D.GpuRunner)
    assert done.value.code == 3
    rows = json.loads((tmp_path / "gpucheck.json").read_text())["rows"]
    assert [r["status"] for r in rows] == statuses
    for says, row in zip(notes, rows, strict=False):  # a test of each of the first rows' notes
        assert says(row["note"]), row["note"]
    capsys.readouterr()


# ---- prepared cubins ---------------------------------------------------------------------------------------------


def fake_prepared(folder, cases, target="sm_90", tamper=None):
    """A prepared folder written by hand: each case's real kernel source hash, a stand-in cubin that names the kernel
    (what `kernel_symbol` looks for), the architecture it is compiled for (the sm90a form's: sm_90a) and made-up
    ptxas numbers."""
    from spatialc.gpucheck.prepare import FORMAT, MANIFEST, file_hash, source_hash

    folder.mkdir(parents=True, exist_ok=True)
    kernels = []
    for case in cases:
        for form in B.build_case(case, target).forms:
            name = form.artifact.launch.kernel_name
            cubin = folder / f"{case.size}-{case.precision}-{form.name}.cubin"
            cubin.write_bytes(b"\x7fELF\x00" + name.encode() + b"\x00")
            source = form.artifact.kernel_cu if tamper != "source" else form.artifact.kernel_cu + "// changed"
            ptxas = {"registers": 96, "spill_stores": 0, "spill_loads": 0, "static_smem": 4608, "stack": 0}
            kernels.append(
                {"case": str(case), "source_sha256": source_hash(source), "arch": kernel_arch(form.name, target),
                 "kernel_name": name,
                 "form": form.name, "cubin": cubin.name, "cubin_sha256": file_hash(cubin), "ptxas": ptxas,
                 "seconds": 1.0, "error": ""}
            )  # fmt: skip
            if tamper == "cubin":
                cubin.write_bytes(cubin.read_bytes() + b"changed")
    data = {
        "format": FORMAT,
        "arch": target,
        "target": target,
        "nvcc": "fake nvcc",
        "created": "now",
        "kernels": kernels,
    }
    (folder / MANIFEST).write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("tamper", "origin"),
    [
        (None, "prepared"),
        ("source", "compiled here: not prepared (its source changed since, or the case was not in the prepared run)"),
        ("cubin", "compiled here: prepared cubin 32x32x32-fp16-{form}.cubin does not match its recorded hash"),
    ],
)
def test_a_prepared_cubin_is_used_only_when_its_hashes_match(fake_gpu, tmp_path, tamper, origin, capsys):
    cases = [Case(64, 64, 64, "fp16"), Case(32, 32, 32, "fp16")]
    fake_prepared(tmp_path / "prep", cases, tamper=tamper)
    argv = ["--prepared", str(tmp_path / "prep"), "--sizes", "32", "--precisions", "fp16"]
    status, header, rows = run(tmp_path / "out", *argv)
    assert status == 0 and header["prepared"].startswith(f"{tmp_path / 'prep'}: ")
    for form in ("persistent", "general", "sm90a"):  # each kernel loaded from its own cubin
        k = rows[0]["by_name"][f"spatialc {form}"]["facts"]
        assert k["cubin"] == origin.format(form=form)
        assert (k.get("registers") == 96) == (tamper is None)  # ptxas's numbers come from the manifest
    capsys.readouterr()


def test_the_prepared_device_loads_the_cubin_by_source_hash():
    from spatialc.gpucheck.prepare import source_hash

    from .test_gpucheck_fakes import FakeCupy

    cp = FakeCupy()
    loaded = []
    base = type("Base", (), {"xp": cp, "load": lambda self, *a: loaded.append(a) or "compiled"})()
    device = D.PreparedDevice(base, cp)
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpucheck-{os.getpid()}.cubin"
    cubin.write_bytes(b"\x7fELF\x00spatialc_persistent\x00")
    try:
        device.cubins[source_hash("the kernel's text")] = cubin
        kernel = device.load("the kernel's text", "spatialc_persistent", 100_000)
        assert kernel.path == str(cubin) and kernel.symbol == "spatialc_persistent"
        assert kernel.max_dynamic_shared_size_bytes == 100_000 and cp.modules == [str(cubin)]
        assert device.load("the kernel's text", "spatialc_persistent", 100_000) is kernel  # loaded once
        assert device.load("another text", "k", 0) == "compiled" and loaded == [("another text", "k", 0)]
    finally:
        cubin.unlink()


# ---- background compiles and the budget --------------------------------------------------------------------------
#
# A fake nvcc (a shell script) that answers --version and otherwise sleeps a minute in a child of its own, as nvcc
# does in cicc and ptxas; each call writes its pid and the sleeper's to a file, so the test can tell what is alive.


def _alive(pid):
    try:
        state = Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _gone(pids, within=3.0):
    end = time.monotonic() + within
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


@pytest.fixture
def slow_nvcc(fake_gpu, tmp_path, monkeypatch):
    """find_nvcc gives a script that compiles for a minute; yields a function returning the pids it started."""
    if not Path("/proc", str(os.getpid()), "stat").exists():
        pytest.skip("needs /proc")
    pidfile = tmp_path / "nvcc.pids"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, fake"; exit 0; fi\n'
        f"echo $$ >> {pidfile}\n"
        "sleep 60 &\n"
        f"echo $! >> {pidfile}\n"
        "wait\n"
    )
    nvcc.chmod(0o755)
    monkeypatch.setattr(N, "find_nvcc", lambda: str(nvcc))
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path / "cache"))

    def pids():
        return [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []

    yield pids
    for pid in pids():  # whatever a failing test left running (only the processes this test started)
        cmd = Path("/proc", str(pid), "cmdline").read_text() if _alive(pid) else ""
        if "sleep" in cmd or str(nvcc) in cmd:
            os.kill(pid, signal.SIGKILL)


def test_compiles_still_running_at_the_budget_are_killed(slow_nvcc, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(G, "RESERVE_S", 1.0)
    monkeypatch.setattr(G, "MIN_ROW_S", 0.5)
    monkeypatch.setattr(B, "COMPILE_GRACE_S", 100.0)  # so that only `close` can end them
    made = []

    def make_runner(target, **kw):
        made.append(D.GpuRunner(target, workers=2, **kw))
        return made[0]

    t0 = time.monotonic()
    argv = [str(tmp_path / "out"), "--budget", "3", "--sizes", "32", "48", "--precisions", "int8"]
    assert gpucheck.main(argv, make_runner=make_runner) == 0
    elapsed = time.monotonic() - t0
    assert elapsed < 3 + 1.5, elapsed  # the budget, plus a small margin; not the minute the compiles want
    data = json.loads((tmp_path / "out" / "gpucheck.json").read_text())
    spatialc_step = probes(data["header"])["spatialc persistent kernel"]
    assert (
        spatialc_step["ok"] is None
        or "compile" in spatialc_step["detail"]
        or "BudgetExceeded" in spatialc_step["detail"]
    )
    assert [r["status"] for r in data["rows"]] == ["skipped", "skipped"]
    pids = slow_nvcc()
    assert len(pids) == 4  # two workers, two compiles (nvcc and its child each); the third was cancelled
    assert _gone(pids), [p for p in pids if _alive(p)]  # nvcc and what it started
    pool = made[0].builds
    assert pool.futures[Case(48, 48, 48, "int8")].cancelled()
    assert all(not t.is_alive() for t in pool.executor._threads)  # so the interpreter's exit waits on nothing
    persistent, general, hopper = pool.futures[Case(64, 64, 64, "int8")].result().forms
    assert persistent.error == "compile: stopped at the end of the run"
    assert general.error == "compile: not started: time budget spent"  # the general form's, after it …
    assert hopper.error == "compile: not started: time budget spent"  # … and the sm90a form's, after that
    capsys.readouterr()


def test_a_compile_never_outlives_the_budget_on_its_own(slow_nvcc, monkeypatch):
    monkeypatch.setattr(B, "COMPILE_GRACE_S", 0.5)
    pool = B.BuildPool("sm_90", "sm_90", workers=1)
    t0 = time.monotonic()
    case = Case(64, 64, 64, "fp16")
    pool.start([case], Deadline(t0 + 1.5, time.monotonic))
    persistent, general, hopper = pool.futures[case].result(timeout=30).forms
    assert time.monotonic() - t0 < 1.5 + 0.5 + 1.0
    assert re.fullmatch(r"compile: nvcc ran past [12] s", persistent.error)  # its limit: the time left plus the grace
    assert general.error == "compile: not started: time budget spent"  # and none was left for the general form …
    assert hopper.error == "compile: not started: time budget spent"  # … nor for the sm90a form
    assert len(slow_nvcc()) == 2
    pool.close()


def test_no_compile_starts_once_the_budget_is_spent(slow_nvcc):
    pool = B.BuildPool("sm_90", "sm_90", workers=1)
    case = Case(64, 64, 64, "bf16")
    pool.start([case], Deadline(time.monotonic() - 1, time.monotonic))
    forms = pool.futures[case].result(timeout=30).forms
    assert [f.name for f in forms] == ["persistent", "general", "sm90a"]  # an sm_90 case's three kernels …
    assert [f.error for f in forms] == ["compile: not started: time budget spent"] * 3  # … none of them compiled
    pool.close()
    assert slow_nvcc() == []


def test_a_case_whose_plan_leaves_the_general_form_no_room_gets_it_a_plan_of_its_own():
    built = B.build_case(Case(2048, 2048, 2048, "fp16"), "sm_90")
    persistent, general = (built.form(f) for f in ("persistent", "general"))
    assert persistent.artifact is not None and persistent.artifact.general is None
    assert general.artifact is not None and general.artifact.budget.form == "general"
    assert general.facts["own_plan"] != built.plan and general.facts["block"] != built.kernel["block"]


def test_a_grouped_row_checks_each_groups_rows_and_times_the_grouped_ways(fake_gpu, tmp_path):
    """A grouped GEMM's row: spatialc's general form on drawn row counts (rows past each count must keep the poison),
    torch.matmul per group and torch._grouped_mm, each checked against the float64 reference and timed kernel only."""
    from spatialc.gpucheck.cases import grouped_sizes

    status, header, rows = run(tmp_path, "--sizes", "g3:40x32x48", "--precisions", "bf16")
    assert status == 0, rows
    (row,) = rows
    assert row["status"] == "ok" and row["size"] == "g3:40x32x48"
    sizes = grouped_sizes(3, 40)
    assert row["ops"] == 2 * int(sizes.sum()) * 32 * 48
    mine = row["by_name"]["spatialc general"]
    assert mine["ok"] and mine["check"]["correct"] and mine["check"]["unwritten"] == 0
    assert mine["kernel"]["median_s"] > 0 and mine["end_to_end"] is None
    for name in ("torch.matmul per group", "torch._grouped_mm"):
        assert row["by_name"][name]["ok"] and row["by_name"][name]["kernel"]["median_s"] > 0, row["by_name"][name]
    assert "row counts " in row["note"]


def test_a_grouped_kernel_that_writes_past_a_count_is_wrong(fake_gpu, tmp_path, monkeypatch):
    fake_gpu["fault"] = "spill"
    monkeypatch.delattr(type(fake_gpu["torch"]), "_grouped_mm")
    status, _, rows = run(tmp_path, "--sizes", "g3:40x32x48", "--precisions", "fp16")
    assert status == 1
    (row,) = rows
    assert row["status"] == "wrong" and "rows past their group's count were written" in row["note"]
    assert row["by_name"]["torch._grouped_mm"]["note"].startswith("unavailable: this torch (fake) has no _grouped_mm")

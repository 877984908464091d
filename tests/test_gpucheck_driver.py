"""The GPU check without a GPU: cases, result checking, timing, the budget loop, the table and the command line.

Timing and running are injected: a fake timer keeps a simulated device clock, a fake runner returns prepared rows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from spatialc import gpucheck as G
from spatialc.errors import SpatialError
from spatialc.gpucheck_report import Baseline, Check, Row, best, percent_of, row_dict, to_markdown, write_report
from spatialc.runtime import launch as L
from spatialc.runtime.tilize import poison_value, tilize

# ---- cases -----------------------------------------------------------------------------------------------------


def test_sizes_parse_and_cases_are_size_major():
    assert G.parse_size("256") == (256, 256, 256)
    assert G.parse_size("4097x513x1031") == (4097, 513, 1031)
    with pytest.raises(SpatialError, match="not N or MxNxK"):
        G.parse_size("12x3")
    cases = G.cases_of(["256", "8x16x24"], ["int8", "bf16"])
    assert [(c.size, c.precision) for c in cases] == [
        ("256x256x256", "int8"),
        ("256x256x256", "bf16"),
        ("8x16x24", "int8"),
        ("8x16x24", "bf16"),
    ]
    with pytest.raises(SpatialError, match="unknown precision"):
        G.cases_of(["8"], ["fp8"])
    assert len(G.cases_of(["8", "8x8x8"], ["int8", "int8"])) == 1  # the same product is run once


def test_default_plan_covers_the_asked_sizes():
    sizes = {G.parse_size(s) for s in G.DEFAULT_SIZES}
    assert {(256,) * 3, (8192,) * 3, (1000,) * 3, (4097, 513, 1031)} <= sizes


# ---- checking a result -----------------------------------------------------------------------------------------


def poisoned_output(c, storage, tiles):
    """The tiled buffer a kernel would leave: C written, padding written as zero."""
    return tilize(c.astype(storage), tiles, np)


def test_int8_check_is_exact_and_counts_poison():
    ref = np.arange(12, dtype=np.float64).reshape(3, 4) - 5
    c = ref.astype(np.int64)
    out = poisoned_output(c, "int64", (1, 1))
    good = G.check_result(c, ref, out, "int64", "int8", np)
    assert good.correct and good.max_abs == 0 and good.unwritten == 0 and good.pad_unwritten == 0
    off = c.copy()
    off[1, 2] += 1
    assert not G.check_result(off, ref, out, "int64", "int8", np).correct
    hole = c.copy()
    hole[2, 3] = poison_value("int64")
    bad = G.check_result(hole, ref, poisoned_output(hole, "int64", (1, 1)), "int64", "int8", np)
    assert not bad.correct and bad.unwritten == 1


def test_poison_left_in_the_padding_is_reported_but_c_is_still_right():
    ref = np.ones((3, 4))
    c = ref.astype(np.float32)
    out = poisoned_output(c, "float32", (1, 1))
    out[255] = np.nan  # a padding element the kernel never wrote
    check = G.check_result(c, ref, out, "float32", "fp16", np)
    assert check.correct and check.pad_unwritten == 1 and check.unwritten == 0


def test_float_check_tolerance():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((32, 32)) * 30
    close = (ref * (1 + 1e-7)).astype(np.float32)
    far = (ref * (1 + 1e-3)).astype(np.float32)
    out = poisoned_output(close, "float32", (2, 2))
    assert G.check_result(close, ref, out, "float32", "bf16", np).correct
    assert not G.check_result(far, ref, out, "float32", "bf16", np).correct
    nan = close.copy()
    nan[0, 0] = np.nan
    check = G.check_result(nan, ref, poisoned_output(nan, "float32", (2, 2)), "float32", "fp16", np)
    assert not check.correct and check.unwritten == 1 and check.nonfinite == 1


# ---- timing ----------------------------------------------------------------------------------------------------


class FakeTimer:
    """A simulated device clock: each launch advances it by the launch's duration."""

    def __init__(self):
        self.now = 0.0
        self.waits = []

    def mark(self):
        return self.now

    def elapsed_s(self, start, end):
        return end - start

    def wait(self, mark, limit_s):
        self.waits.append(limit_s)


def fake_launches(timer, durations):
    seen = []

    def launch(i):
        seen.append(i)
        timer.now += durations(len(seen), i)

    return launch, seen


def test_timing_warms_up_rotates_inputs_and_takes_the_median():
    timer = FakeTimer()
    # a slow launch (0.1 s) first, then 1 ms each, with one outlier: the median ignores both
    launch, seen = fake_launches(timer, lambda n, i: 0.1 if n == 1 else (0.5 if n == 10 else 0.001))
    t = G.time_launches(launch, 3, timer, warmup=3, min_reps=20, max_reps=40, target_s=0.03)
    assert t.median_s == pytest.approx(0.001)
    assert t.reps == 30  # 0.03 s of 1 ms launches, within [20, 40]
    assert len(seen) == 3 + 30 and seen[:8] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert t.max_s == pytest.approx(0.5)


def test_timing_runs_at_least_min_reps_of_a_slow_kernel():
    timer = FakeTimer()
    launch, seen = fake_launches(timer, lambda n, i: 2.0)
    t = G.time_launches(launch, 2, timer, min_reps=20, target_s=0.3)
    assert t.reps == 20 and t.median_s == 2.0


def test_timing_refuses_a_zero_time():
    timer = FakeTimer()
    launch, _ = fake_launches(timer, lambda n, i: 0.0)
    with pytest.raises(SpatialError, match="did nothing"):
        G.time_launches(launch, 2, timer)


def test_rotation_outgrows_the_l2_cache_within_limits():
    l2 = 50 << 20
    assert G.copies_for(256 << 20, l2) == 2  # big inputs: two sets are enough
    assert G.copies_for(1 << 20, l2) == 150  # 3 × L2 of 1 MiB sets
    assert G.copies_for(1 << 10, l2) == 512  # tiny inputs: capped
    assert G.copies_for(3 << 30, l2, cap_bytes=4 << 30) == 2


# ---- the budget loop -------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class FakeRunner:
    """Rows come back ok after `cost` simulated seconds; `fail` maps a size to the exception its row raises."""

    def __init__(self, clock, cost=100.0, fail=None):
        self.clock, self.cost, self.fail = clock, cost, fail or {}
        self.started, self.ran, self.closed = None, [], False

    def start(self, cases, deadline):
        self.started, self.deadline = list(cases), deadline

    def info(self):
        return {"gpu": "Fake GPU", "sms": 3, "clocks": "1 MHz", "target": "sm_90"}

    def close(self):
        self.closed = True

    def run(self, case, deadline):
        self.ran.append(case)
        self.clock.t += self.cost
        if case.size in self.fail:
            fail = self.fail[case.size]
            if callable(fail) and not isinstance(fail, type):
                fail = fail()
            if fail is not None:
                raise fail
        row = Row(
            case.precision,
            case.m,
            case.n,
            case.k,
            status="ok",
            plan="block 1×1×1",
            median_s=1e-3,
            check=Check(True, 0.0, 0.0, 0, 0, 0, True),
        )
        row.baselines = [Baseline("torch.matmul", "cublas", 5e-4, 0.0, True)]
        return row


def test_budget_cut_skips_the_rest_and_keeps_every_row():
    clock = FakeClock()
    runner = FakeRunner(clock, cost=100.0)
    cases = G.cases_of(["16", "32", "48", "64"], ["fp16"])
    # 205 s less the 5 s kept for writing: two rows of 100 s, then too little is left to start a third
    rows, lost = G.run_all(cases, runner, budget_s=205, clock=clock, log=lambda s: None)
    assert not lost and runner.started == cases
    assert [r.status for r in rows] == ["ok", "ok", "skipped", "skipped"]
    assert "time budget of 205 s spent" in rows[2].note
    assert len(runner.ran) == 2


def test_a_hung_gpu_stops_the_run_and_the_rest_is_marked():
    clock = FakeClock()
    runner = FakeRunner(clock, cost=1.0, fail={"32x32x32": G.GpuHung("no answer in 60 s")})
    rows, lost = G.run_all(
        G.cases_of(["16", "32", "48"], ["int8"]), runner, budget_s=400, clock=clock, log=lambda s: None
    )
    assert lost == "lost"
    assert [r.status for r in rows] == ["ok", "hung", "skipped"]
    assert "hung on an earlier row" in rows[2].note and len(runner.ran) == 2


def test_a_failing_row_is_an_error_row_and_the_run_goes_on():
    clock = FakeClock()
    fail = {"16x16x16": RuntimeError("bad thing\nwith detail"), "32x32x32": G.BudgetExceeded()}
    rows, lost = G.run_all(
        G.cases_of(["16", "32", "48"], ["bf16"]),
        FakeRunner(clock, 1.0, fail),
        budget_s=400,
        clock=clock,
        log=lambda s: None,
    )
    assert not lost
    assert [r.status for r in rows] == ["error", "skipped", "ok"]
    assert rows[0].note == "RuntimeError: bad thing"


def test_an_interrupt_keeps_the_rows_that_finished_and_marks_the_rest():
    clock = FakeClock()
    seen = []
    rows, stop = G.run_all(
        G.cases_of(["16", "32", "48"], ["fp16"]),
        FakeRunner(clock, 1.0, {"32x32x32": KeyboardInterrupt()}),
        budget_s=400,
        clock=clock,
        log=lambda s: None,
        on_row=lambda rows: seen.append(len(rows)),
    )
    assert stop == "interrupted"
    assert [(r.status, r.note) for r in rows] == [
        ("ok", ""),
        ("skipped", "not finished: interrupted"),
        ("skipped", "not run: interrupted"),
    ]
    assert seen == [1]  # the report was brought up to date after the row that finished


# ---- the table -------------------------------------------------------------------------------------------------


def int8_row():
    row = Row("int8", 1024, 1024, 1024, status="ok", median_s=2e-3, check=Check(True, 0.0, 0.0, 0, 0, 0, True))
    row.baselines = [
        Baseline("torch._int_mm", "cublas", 4e-3, 0.0, True),
        Baseline("cublasGemmEx NN", "cublas", 1e-3, 0.0, True),  # the fastest right one
        Baseline("cublasGemmEx TN", "cublas", 0.5e-3, 9.0, False, "wrong result; not timed"),
        Baseline("Triton matmul", "triton", None, None, None, "not available"),
    ]
    return row


def test_percent_of_cublas_uses_the_fastest_correct_int8_path():
    row = int8_row()
    assert best(row, "cublas").name == "cublasGemmEx NN"
    assert percent_of(row, "cublas") == pytest.approx(50.0)
    assert best(row, "triton") is None and percent_of(row, "triton") is None
    d = row_dict(row)
    assert d["spatialc_rate"] == pytest.approx(2 * 1024**3 / 2e-3 / 1e12)
    assert d["cublas_best"]["name"] == "cublasGemmEx NN" and d["pct_of_cublas"] == pytest.approx(50.0)


def test_report_files_hold_the_header_and_every_row(tmp_path):
    header = {"date": "2026-01-01T00:00:00+00:00", "gpu": "Fake GPU", "sms": 132, "commit": "abc123"}
    skipped = Row("bf16", 8192, 8192, 8192, status="skipped", note="not run: time budget of 420 s spent")
    wrong = Row(
        "fp16",
        64,
        64,
        64,
        status="wrong",
        median_s=1e-5,
        check=Check(False, float("nan"), float("nan"), 3, 0, 3, False),
    )
    js, md = write_report(tmp_path / "out", header, [int8_row(), wrong, skipped])
    data = json.loads(js.read_text())  # strict JSON: NaN written as a string
    assert data["header"]["gpu"] == "Fake GPU" and [r["status"] for r in data["rows"]] == ["ok", "wrong", "skipped"]
    assert data["rows"][1]["check"]["max_abs"] == "nan"
    text = md.read_text()
    assert "- gpu: Fake GPU" in text and "- commit: abc123" in text
    assert "| int8 | 1024×1024×1024 |" in text and "50%" in text and "(cublasGemmEx NN)" in text
    assert "| no |" in text and "skipped: not run: time budget" in text
    assert "cublasGemmEx TN: wrong result; not timed" in text
    assert text == to_markdown(header, [int8_row(), wrong, skipped])


def kernel_row(precision, n, **ptxas):
    row = Row(precision, n, n, n, status="ok", median_s=1e-3, check=Check(True, 0.0, 0.0, 0, 0, 0, True))
    row.kernel = {
        "block": "4×8×1",
        "sub_blocks": "2×2",
        "depth": 3,
        "sites": 99,
        "threads": 256,
        "blocks_per_sm": 1,
        "dyn_smem": 8192,
        "regs_est": 244,
        **ptxas,
    }
    return row


def test_the_kernel_table_shows_plan_budget_and_ptxas_and_flags_spills(tmp_path):
    clean = kernel_row("bf16", 1024, registers=212, spill_stores=0, spill_loads=0, static_smem=36864, stack=0)
    spills = kernel_row("int8", 2048, registers=255, spill_stores=672, spill_loads=736, static_smem=18432, stack=640)
    spills.kernel["blocks_per_sm"] = 2  # 255 registers × 256 threads fit once per SM, not twice
    unknown = kernel_row("fp16", 512, ptxas="no nvcc (NVRTC)")
    skipped = Row("bf16", 8192, 8192, 8192, status="skipped", note="not run")
    js, md = write_report(tmp_path, {"gpu": "Fake GPU"}, [clean, spills, unknown, skipped])
    rows = json.loads(js.read_text())["rows"]
    assert rows[0]["kernel"]["registers"] == 212 and rows[1]["kernel"]["spill_loads"] == 736
    assert rows[2]["kernel"]["ptxas"] == "no nvcc (NVRTC)" and rows[3]["kernel"] == {}
    text = md.read_text()
    head = (
        "| precision | m×n×k | block | sub | depth | sites | threads | blocks/SM | dyn smem | regs (est) | spill st/ld"
    )
    assert head in text and "Kernels (plan: block osh×osw×ibw" in text
    assert "| bf16 | 1024×1024×1024 | 4×8×1 | 2×2 | 3 | 99 | 256 | 1 | 8192 | 212 (244) | 0/0 | 36864 |" in text
    assert "| int8 | 2048×2048×2048 | 4×8×1 | 2×2 | 3 | 99 | 256 | 2 | 8192 | 255 (244) | 672/736 ⚠ | 18432 |" in text
    assert "| fp16 | 512×512×512 | 4×8×1 | 2×2 | 3 | 99 | 256 | 1 | 8192 | — (244) | no nvcc (NVRTC) | — |" in text
    assert "| bf16 | 8192×8192×8192 | 4×8×1" not in text  # a row without kernel numbers has no kernel line
    notes = text.split("Kernel notes:")[1]
    assert "- int8 2048x2048x2048: ptxas spills 672 B stored / 736 B loaded per thread" in notes
    assert "leave room for 1 blocks/SM; the budget planned 2" in notes
    assert "bf16 1024" not in notes and "fp16" not in notes
    assert "Kernels" not in to_markdown({}, [skipped])


# ---- the command line ------------------------------------------------------------------------------------------


def test_dry_run_lists_plans_and_baselines_and_exits_0(capsys, monkeypatch):
    monkeypatch.setattr(L, "find_nvcc", lambda: None)
    status = G.main(["unused-dir", "--dry-run", "--sizes", "64", "40x24x36", "--precisions", "int8", "bf16"])
    out = capsys.readouterr().out
    assert status == 0
    assert "gpucheck dry run: 4 rows on sm_90" in out
    assert out.count("  plan      block") == 4 and out.count("  launch    ") == 4
    assert "cuBLAS torch._int_mm (n/a: needs m > 16 and k, n multiples of 8)" in out  # 40×24×36: k = 36
    assert "cuBLAS cublasGemmEx TN" in out and "cuBLAS torch.matmul" in out
    assert out.count("  ptxas     no nvcc here") == 4


@pytest.mark.nvcc
@pytest.mark.skipif(L.find_nvcc() is None, reason="nvcc is not installed")
def test_dry_run_shows_what_ptxas_says_when_nvcc_is_here(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert G.main(["unused-dir", "--dry-run", "--sizes", "40x24x56", "--precisions", "bf16"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"  ptxas     (\d+) regs \(est \d+\), spills (\d+)/(\d+) B \(st/ld\), static smem (\d+) B", out)
    assert found, out
    assert 0 < int(found.group(1)) <= 255 and int(found.group(4)) > 0
    assert list(tmp_path.glob("spatialc/cubin/*-sm_90.ptxas.json"))  # compiled for sm_90, numbers cached


@pytest.mark.parametrize(
    ("device", "why"),
    [
        (False, "no CUDA device found"),
        (
            True,
            f"CuPy is not installed ({L.INSTALL_CUPY})",
        ),
    ],
)
def test_without_a_gpu_it_says_why_and_names_the_dry_run_in_one_line_and_exits_2(
    device, why, capsys, monkeypatch, tmp_path
):
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(L, "_DEVICE", None)
    monkeypatch.setattr(L, "DEVICE_PROBES", (lambda: device,))
    monkeypatch.setattr(L, "find_nvcc", lambda: None)
    out = tmp_path / "my out"
    status = G.main([str(out), "--sizes", "64"])
    err = capsys.readouterr().err
    assert status == 2
    dry = f"`spatialc gpucheck '{out}' --sizes 64 --dry-run` lists what a GPU run would do"
    assert err == f"gpucheck: {why}; {dry}\n"
    assert not out.exists()
    assert G.main([str(out), "--sizes", "64", "--dry-run"]) == 0  # and the command it names runs here


def no_runner(*args, **kwargs):
    raise AssertionError("a bad argument must be refused before the GPU is touched")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["{d}/out", "--sizes", "12x"], "not N or MxNxK"),
        (["{d}/out", "--sizes", "0"], "positive numbers"),
        (["{d}/out", "--sizes"], "expected at least one argument"),
        (["{d}/out", "--budget", "0"], "must be a positive number of seconds, not 0"),
        (["{d}/out", "--budget", "-30"], "must be a positive number of seconds"),
        (["{d}/out", "--budget", "nan"], "must be a positive number of seconds"),
        (["{d}/out", "--budget", "inf"], "must be a positive number of seconds"),
        (["{d}/out", "--budget", "7m"], "'7m' is not a number of seconds"),
        (["{d}/out", "--precisions", "fp8"], "unknown precision 'fp8'; use int8, fp16, bf16"),
        (["{d}/out", "--target", "sm_99"], "unknown target 'sm_99'"),
        (["{d}/out", "--seed", "x"], "--seed"),
        (["{d}/out", "--frobnicate"], "unrecognized arguments"),
        ([], "required: outdir"),
        (["{d}/afile"], "exists and is not a folder"),
        (["{d}/afile/sub/dir"], "is not a folder"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, says, capsys, tmp_path):
    (tmp_path / "afile").write_text("a file, not a folder")
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    status = G.main(argv, make_runner=no_runner)
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.startswith("gpucheck: ") and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "out").exists() and (tmp_path / "afile").read_text() == "a file, not a folder"


def test_the_reviewed_repro_an_outdir_that_is_a_file(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    status = G.main([str(afile), "--sizes", "32", "--precisions", "int8"], make_runner=no_runner)
    assert status == 2 and capsys.readouterr().err == f"gpucheck: OUTDIR {str(afile)!r} exists and is not a folder\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_outdir_that_cannot_be_written_is_refused(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert G.main([str(locked), "--sizes", "32"], make_runner=no_runner) == 2
        assert G.main([str(locked / "new"), "--sizes", "32"], make_runner=no_runner) == 2
    finally:
        locked.chmod(0o700)
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "is not writable" in err


def test_an_outdir_that_fails_on_creation_exits_2_before_any_row(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(G, "check_outdir", lambda outdir: None)  # as if the folder went away after the check
    (tmp_path / "afile").write_text("x")
    runner = FakeRunner(FakeClock(), cost=0.0)
    status = G.main([str(tmp_path / "afile"), "--sizes", "32"], make_runner=lambda *a, **k: runner)
    out, err = capsys.readouterr()
    assert status == 2 and err.startswith("gpucheck: cannot write to OUTDIR") and err.count("\n") == 1
    assert runner.ran == [] and runner.closed


def test_main_writes_the_table_with_an_injected_runner(capsys, tmp_path):
    made = {}

    def make_runner(target, seed, triton):
        made["runner"] = FakeRunner(FakeClock(), cost=0.0)
        made["args"] = (target, seed, triton)
        return made["runner"]

    status = G.main(
        [str(tmp_path), "--sizes", "32", "--precisions", "fp16", "--no-triton", "--commit", "c0ffee", "--seed", "5"],
        make_runner=make_runner,
    )
    out = capsys.readouterr().out
    assert status == 0 and made["args"] == (None, 5, False) and made["runner"].closed
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    assert data["header"]["commit"] == "c0ffee" and data["header"]["gpu"] == "Fake GPU"
    assert data["rows"][0]["pct_of_cublas"] == pytest.approx(50.0)
    assert "| fp16 | 32×32×32 |" in out and "wrote" in out


def test_the_report_is_on_disk_after_every_row(capsys, tmp_path):
    seen = []

    def look():  # called as the second row runs: the first must be on disk already, the rest pending
        data = json.loads((tmp_path / "gpucheck.json").read_text())
        seen.append(([r["status"] for r in data["rows"]], data["header"]["state"]))
        seen.append((tmp_path / "gpucheck.md").read_text())

    runner = FakeRunner(FakeClock(), cost=0.0, fail={"32x32x32": look})
    assert (
        G.main([str(tmp_path), "--sizes", "16", "32", "48", "--precisions", "int8"], make_runner=lambda *a, **k: runner)
        == 0
    )
    assert seen[0] == (["ok", "pending", "pending"], "running (pending rows not reached yet)")
    assert "| int8 | 32×32×32 |" in seen[1] and "pending: not reached yet" in seen[1]
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    assert [r["status"] for r in data["rows"]] == ["ok"] * 3 and data["header"]["state"] == "complete"
    assert not list(tmp_path.glob(".*tmp"))  # written aside, then renamed
    capsys.readouterr()


def test_the_table_is_printed_even_when_the_report_cannot_be_written(capsys, tmp_path, monkeypatch):
    real, calls = G.write_report, []

    def write_report(outdir, header, rows):
        calls.append(len(rows))
        if len(calls) > 1:  # the folder was fine at the start, then the disk filled up
            raise OSError(28, "No space left on device")
        return real(outdir, header, rows)

    monkeypatch.setattr(G, "write_report", write_report)
    runner = FakeRunner(FakeClock(), cost=0.0)
    status = G.main([str(tmp_path), "--sizes", "16", "32", "--precisions", "bf16"], make_runner=lambda *a, **k: runner)
    out, err = capsys.readouterr()
    assert status == 1 and len(calls) == 4  # opened, after each row, at the end
    assert "| bf16 | 16×16×16 |" in out and "| bf16 | 32×32×32 |" in out
    assert '"pct_of_cublas": 50.0' in out  # the JSON goes to stdout instead
    assert err.count("could not update the report") == 1 and "could not write the report" in err
    assert err.count("\n") == 2 + err.count("gpucheck: row ")  # those two, beside a line as each row starts


@pytest.mark.parametrize("how", ["KeyboardInterrupt", "SIGTERM"])
def test_an_interrupted_run_still_writes_and_prints_the_table(how, capsys, tmp_path, monkeypatch):
    def exit_(code):
        raise SystemExit(code)

    def interrupt():
        if how == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
            raise AssertionError("SIGTERM did not interrupt the run")
        return KeyboardInterrupt()

    monkeypatch.setattr(G.os, "_exit", exit_)
    before = signal.getsignal(signal.SIGTERM)
    runner = FakeRunner(FakeClock(), cost=0.0, fail={"32x32x32": interrupt})
    with pytest.raises(SystemExit) as done:
        G.main([str(tmp_path), "--sizes", "16", "32", "48", "--precisions", "fp16"], make_runner=lambda *a, **k: runner)
    assert done.value.code == 130 and runner.closed
    assert signal.getsignal(signal.SIGTERM) == before
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    assert data["header"]["state"] == "stopped: interrupted"
    assert [(r["status"], r["note"]) for r in data["rows"]] == [
        ("ok", ""),
        ("skipped", "not finished: interrupted"),
        ("skipped", "not run: interrupted"),
    ]
    out = capsys.readouterr().out
    assert "| fp16 | 16×16×16 |" in out and "state: stopped: interrupted" in out and "wrote" in out


def test_each_row_is_announced_on_stderr_with_its_number_and_the_time_so_far(capsys, tmp_path):
    clock = FakeClock()
    runner = FakeRunner(clock, cost=7.0)
    argv = [str(tmp_path), "--sizes", "16", "32", "--precisions", "int8", "fp16"]
    assert G.main(argv, make_runner=lambda *a, **k: runner) == 0
    out, err = capsys.readouterr()
    rows = [line for line in err.splitlines() if line.startswith("gpucheck: row ")]
    assert [line.split(",")[0] for line in rows] == [
        "gpucheck: row 1/4: int8 16x16x16",
        "gpucheck: row 2/4: fp16 16x16x16",
        "gpucheck: row 3/4: int8 32x32x32",
        "gpucheck: row 4/4: fp16 32x32x32",
    ]
    assert all(line.endswith(" s so far") for line in rows)
    assert "| int8 | 32×32×32 |" in out and "gpucheck: row" not in out  # the table's stdout stays clean


def test_run_all_announces_only_the_rows_it_starts():
    clock = FakeClock()
    said = []
    runner = FakeRunner(clock, cost=100.0)
    cases = G.cases_of(["16", "32", "48"], ["int8"])
    rows, _ = G.run_all(cases, runner, budget_s=205, clock=clock, log=lambda s: None, progress=said.append)
    assert [r.status for r in rows] == ["ok", "ok", "skipped"]
    assert said == ["row 1/3: int8 16x16x16, 0 s so far", "row 2/3: int8 32x32x32, 100 s so far"]


def test_main_exits_1_when_a_row_fails(capsys, tmp_path):
    def make_runner(target, seed, triton):
        return FakeRunner(FakeClock(), cost=0.0, fail={"32x32x32": RuntimeError("boom")})

    assert G.main([str(tmp_path), "--sizes", "32", "--precisions", "int8"], make_runner=make_runner) == 1
    assert "error: RuntimeError: boom" in capsys.readouterr().out


# ---- the GPU runner on a numpy stand-in for CuPy -----------------------------------------------------------------
#
# The runner's control flow (inputs, poisoning, the checked run, timing, the recheck, the cuBLAS int8 call's
# arguments, memory release, the hang path) runs here against numpy dressed as CuPy. What this cannot show is that
# the real libraries behave as their documentation says; the GPU run itself shows that.


class FakeEvent:
    now = 0.0
    hang = False

    def record(self):
        FakeEvent.now += 1e-4
        self.t = FakeEvent.now

    @property
    def done(self):
        return not FakeEvent.hang

    def synchronize(self):
        pass


class FakeRandomState:
    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)

    def randint(self, low, high, size):
        return self.rs.randint(low, high, size=size)

    def uniform(self, low, high, size, dtype):
        return self.rs.uniform(low, high, size=size).astype(dtype)


def _colmajor(ptr, rows, cols, ld, ctype):
    """The rows × cols column-major matrix at address `ptr` with leading dimension `ld`, as a numpy view."""
    import ctypes

    assert ld >= rows, "cuBLAS refuses a leading dimension below the row count"
    flat = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), shape=(ld * cols,))
    return flat.reshape(cols, ld)[:, :rows].T


def fake_gemm_ex(
    handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype, ldc, compute, algo
):
    """cublasGemmEx's meaning for int8 → int32, column-major, done in numpy on the arrays' addresses."""
    import ctypes

    assert (atype, btype, ctype, compute) == (3, 3, 10, 72)
    assert ctypes.c_int32.from_address(alpha).value == 1 and ctypes.c_int32.from_address(beta).value == 0
    op_a = _colmajor(a, k, m, lda, ctypes.c_int8).T if transa == 1 else _colmajor(a, m, k, lda, ctypes.c_int8)
    op_b = _colmajor(b, n, k, ldb, ctypes.c_int8).T if transb == 1 else _colmajor(b, k, n, ldb, ctypes.c_int8)
    _colmajor(c, m, n, ldc, ctypes.c_int32)[...] = op_a.astype(np.int64) @ op_b.astype(np.int64)


class FakeCupy(type(sys)):
    """numpy, with the parts of CuPy's API the runner touches."""

    def __init__(self):
        super().__init__("cupy")
        from types import SimpleNamespace as NS

        props = {
            "name": b"Fake H200",
            "multiProcessorCount": 132,
            "totalGlobalMem": 2**30,
            "l2CacheSize": 64 << 10,
            "clockRate": 1980000,
            "memoryClockRate": 2619000,
        }
        self.__version__ = "fake"
        self.freed = 0
        self.cuda = NS(
            runtime=NS(
                getDeviceCount=lambda: 1,
                getDevice=lambda: 0,
                getDeviceProperties=lambda d: props,
                driverGetVersion=lambda: 13000,
            ),
            Device=lambda *a: NS(compute_capability="90"),
            Event=FakeEvent,
            get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
            cublas=NS(
                gemmEx=fake_gemm_ex,
                setPointerMode=lambda h, mode: None,
                setStream=lambda h, ptr: None,
                CUBLAS_OP_N=0,
                CUBLAS_OP_T=1,
                CUBLAS_COMPUTE_32I=72,
            ),
            device=NS(get_cublas_handle=lambda: 1),
            get_current_stream=lambda: NS(ptr=0),
        )
        self.random = NS(RandomState=FakeRandomState)

    def get_default_memory_pool(self):
        from types import SimpleNamespace as NS

        return NS(free_all_blocks=lambda: setattr(self, "freed", self.freed + 1))

    def __getattr__(self, name):
        return getattr(np, name)


class FakeKernel:
    """The tiled product a correct kernel computes; `fault` plants a missed element or a hang."""

    def __init__(self, args, fault):
        self.args, self.fault = args, fault

    def __call__(self, buffers):
        from spatialc.runtime.tilize import bf16_to_float32, untilize

        a_arg, b_arg, c_arg = self.args
        vals = []
        for arg, buf in zip((a_arg, b_arg), buffers[:2], strict=True):
            x = untilize(buf, arg.tiles, (arg.tiles[0] * 16, arg.tiles[1] * 16), np)
            vals.append(bf16_to_float32(x, np).astype(np.float64) if arg.storage == "uint16" else x.astype(np.float64))
        out = buffers[2]
        out[:] = tilize((vals[0] @ vals[1]).astype(c_arg.storage), c_arg.tiles, np)
        if self.fault == "miss":
            out[17] = poison_value(c_arg.storage)
        if self.fault == "hang":
            FakeEvent.hang = True
        if self.fault == "illegal":
            raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


@pytest.fixture
def fake_gpu(monkeypatch):
    """CuPy replaced by numpy, kernels by FakeKernel; returns the dict whose `fault` the kernels obey."""
    from spatialc import gpucheck_gpu as GG

    cp, state = FakeCupy(), {"fault": None}
    device = type("Dev", (), {"xp": cp, "launch": lambda self, k, g, b, s, args: k(args)})()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(L, "cupy_device", lambda: device)
    monkeypatch.setattr(L, "find_nvcc", lambda: None)  # no cubins: the fake kernel needs none
    monkeypatch.setattr(
        L,
        "prepare",
        lambda art, dev: L.Prepared(
            dev, FakeKernel(L.kernel_args(art.launch), state["fault"]), art.launch, L.kernel_args(art.launch)
        ),
    )
    monkeypatch.setattr(GG, "_import_torch", lambda: None)
    monkeypatch.setattr(GG, "_ptr", lambda x: x.ctypes.data)
    monkeypatch.setattr(GG, "HANG_MIN_S", 0.05)
    monkeypatch.setattr(GG, "HANG_S", 0.05)
    monkeypatch.setattr(FakeEvent, "hang", False)
    state["cp"] = cp
    return state


def test_gpu_runner_checks_times_and_compares_on_the_stand_in(fake_gpu, tmp_path, capsys):
    from spatialc.gpucheck_gpu import GpuRunner

    argv = [str(tmp_path), "--sizes", "64", "40x24x36", "--precisions", "int8", "bf16", "--commit", "x"]
    assert G.main(argv, make_runner=GpuRunner) == 0
    rows = json.loads((tmp_path / "gpucheck.json").read_text())["rows"]
    header = json.loads((tmp_path / "gpucheck.json").read_text())["header"]
    assert header["gpu"] == "Fake H200" and header["sms"] == 132 and header["target"] == "sm_90"
    assert [(r["precision"], r["status"]) for r in rows] == [("int8", "ok"), ("bf16", "ok")] * 2
    for r in rows:
        assert r["check"]["correct"] and r["check"]["stable"] and r["check"]["unwritten"] == 0
        assert r["median_s"] > 0 and r["reps"] >= 20
    int8 = {b["name"]: b for b in rows[0]["baselines"]}
    assert int8["cuBLAS (torch)"]["note"] == "torch is not installed"
    assert int8["cublasGemmEx NN"]["ok"] and int8["cublasGemmEx TN"]["ok"]  # both argument forms compute A·B
    assert rows[0]["pct_of_cublas"] is not None
    odd = {b["name"]: b for b in rows[2]["baselines"]}
    assert odd["cublasGemmEx NN"]["ok"] and odd["cublasGemmEx TN"]["ok"]  # 40×24×36: odd leading dimensions
    assert fake_gpu["cp"].freed == 4  # memory released after every row
    k = rows[0]["kernel"]  # the plan and the budget, and why ptxas said nothing: no nvcc here
    assert k["block"].count("×") == 2 and k["threads"] > 0 and k["blocks_per_sm"] > 0 and k["depth"] > 0
    assert k["ptxas"] == "no nvcc (NVRTC)" and "registers" not in k
    assert "| bf16 | 40×24×36 |" in capsys.readouterr().out


def test_gpu_runner_fails_a_kernel_that_misses_an_element(fake_gpu, tmp_path, capsys):
    from spatialc.gpucheck_gpu import GpuRunner

    fake_gpu["fault"] = "miss"
    assert G.main([str(tmp_path), "--sizes", "64", "--precisions", "fp16"], make_runner=GpuRunner) == 1
    row = json.loads((tmp_path / "gpucheck.json").read_text())["rows"][0]
    assert row["status"] == "wrong" and row["check"]["unwritten"] == 1 and not row["check"]["correct"]
    capsys.readouterr()


def test_gpu_runner_turns_a_hung_kernel_into_a_written_table_and_exit_3(fake_gpu, tmp_path, monkeypatch, capsys):
    from spatialc.gpucheck_gpu import GpuRunner

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(G.os, "_exit", exit_)
    fake_gpu["fault"] = "hang"
    with pytest.raises(SystemExit) as done:
        G.main([str(tmp_path), "--sizes", "64", "32", "--precisions", "int8"], make_runner=GpuRunner)
    assert done.value.code == 3
    rows = json.loads((tmp_path / "gpucheck.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["hung", "skipped"]
    assert "did not finish" in rows[0]["note"] and "hung on an earlier row" in rows[1]["note"]
    capsys.readouterr()


def test_gpu_runner_stops_after_a_sticky_cuda_error(fake_gpu, tmp_path, monkeypatch, capsys):
    from spatialc.gpucheck_gpu import GpuRunner

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(G.os, "_exit", exit_)
    fake_gpu["fault"] = "illegal"
    with pytest.raises(SystemExit) as done:
        G.main([str(tmp_path), "--sizes", "64", "32", "--precisions", "bf16"], make_runner=GpuRunner)
    assert done.value.code == 3
    rows = json.loads((tmp_path / "gpucheck.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["error", "skipped"]
    assert "illegal memory access" in rows[0]["note"] and "context was lost" in rows[1]["note"]
    capsys.readouterr()


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
    monkeypatch.setattr(L, "find_nvcc", lambda: str(nvcc))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def pids():
        return [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []

    yield pids
    for pid in pids():  # whatever a failing test left running (only the processes this test started)
        if _alive(pid) and (
            "sleep" in Path("/proc", str(pid), "cmdline").read_text()
            or str(nvcc) in Path("/proc", str(pid), "cmdline").read_text()
        ):
            os.kill(pid, signal.SIGKILL)


def test_compiles_still_running_at_the_budget_are_killed(slow_nvcc, tmp_path, monkeypatch, capsys):
    from spatialc import gpucheck_gpu as GG

    monkeypatch.setattr(G, "RESERVE_S", 1.0)
    monkeypatch.setattr(G, "MIN_ROW_S", 0.5)
    monkeypatch.setattr(GG, "COMPILE_GRACE_S", 100.0)  # so that only `close` can end them
    made = []

    def make_runner(target, seed, triton):
        made.append(GG.GpuRunner(target, seed=seed, triton=triton, workers=2))
        return made[0]

    t0 = time.monotonic()
    argv = [str(tmp_path / "out"), "--budget", "3", "--sizes", "64", "32", "48", "--precisions", "int8"]
    assert G.main(argv, make_runner=make_runner) == 0
    elapsed = time.monotonic() - t0
    assert elapsed < 3 + 1.5, elapsed  # the budget, plus a small margin; not the minute the compiles want
    rows = json.loads((tmp_path / "out" / "gpucheck.json").read_text())["rows"]
    assert [(r["status"], r["note"]) for r in rows] == [
        ("skipped", "not finished: time budget spent"),
        ("skipped", "not run: time budget of 3 s spent"),
        ("skipped", "not run: time budget of 3 s spent"),
    ]
    pids = slow_nvcc()
    assert len(pids) == 4  # two workers, two compiles (nvcc and its child each); the third was cancelled
    assert _gone(pids), [p for p in pids if _alive(p)]  # nvcc and what it started
    runner = made[0]
    assert runner.builds[G.Case(48, 48, 48, "int8")].cancelled()
    assert all(not t.is_alive() for t in runner.pool._threads)  # so the interpreter's exit waits on nothing
    assert "compile: stopped at the end of the run" in runner.builds[G.Case(64, 64, 64, "int8")].result().error
    capsys.readouterr()


def test_a_compile_never_outlives_the_budget_on_its_own(slow_nvcc, monkeypatch):
    from spatialc import gpucheck_gpu as GG

    monkeypatch.setattr(GG, "COMPILE_GRACE_S", 0.5)
    runner = GG.GpuRunner(None, workers=1)
    t0 = time.monotonic()
    case = G.Case(64, 64, 64, "fp16")
    runner.start([case], G.Deadline(t0 + 1.5, time.monotonic))
    built = runner.builds[case].result(timeout=30)
    assert time.monotonic() - t0 < 1.5 + 0.5 + 1.0
    assert re.fullmatch(r"compile: nvcc ran past [12] s", built.error)  # its limit: the time left plus the grace
    assert len(slow_nvcc()) == 2
    runner.close()


def test_no_compile_starts_once_the_budget_is_spent(slow_nvcc):
    from spatialc import gpucheck_gpu as GG

    runner = GG.GpuRunner(None, workers=1)
    case = G.Case(64, 64, 64, "bf16")
    runner.start([case], G.Deadline(time.monotonic() - 1, time.monotonic))
    assert runner.builds[case].result(timeout=30).error == "compile: not started: time budget spent"
    runner.close()
    assert slow_nvcc() == []

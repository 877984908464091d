"""The GPU check's driver without a GPU: cases, the preflight and the budget loop, the command line, the dry run, the
report on disk through interrupts and full disks. A fake runner returns prepared rows on a simulated clock."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import pytest

from spatialc import gpucheck
from spatialc.errors import SpatialError
from spatialc.gpucheck import driver as G
from spatialc.gpucheck.agreement import Check
from spatialc.gpucheck.cases import (
    DEFAULT_SIZES,
    BudgetExceeded,
    Case,
    Contestant,
    GpuHung,
    GpuLost,
    Probe,
    Row,
    cases_of,
)
from spatialc.gpucheck.sizes import parse_size
from spatialc.gpucheck.timing import Timing
from spatialc.runtime import discover
from spatialc.runtime import launch as L
from spatialc.runtime import nvcc as N

from .test_gpucheck_fakes import exit_raises, lowered_as, without_general

# ---- cases -----------------------------------------------------------------------------------------------------


def test_sizes_parse_and_cases_are_size_major():
    assert parse_size("256") == (256, 256, 256)
    assert parse_size("4097x513x1031") == (4097, 513, 1031)
    with pytest.raises(SpatialError, match="not N or MxNxK"):
        parse_size("12x3")
    cases = cases_of(["256", "8x16x24"], ["int8", "bf16"])
    assert [(c.size, c.precision) for c in cases] == [
        ("256x256x256", "int8"),
        ("256x256x256", "bf16"),
        ("8x16x24", "int8"),
        ("8x16x24", "bf16"),
    ]
    with pytest.raises(SpatialError, match="unknown precision"):
        cases_of(["8"], ["fp8"])
    assert len(cases_of(["8", "8x8x8"], ["int8", "int8"])) == 1  # the same product is run once


def test_default_plan_covers_the_asked_sizes():
    sizes = {
        parse_size(s) for s in DEFAULT_SIZES if not s.startswith(("g", "mc", "map:", "fused:", "fp8", "att:", "w4:"))
    }
    assert {(256,) * 3, (8192,) * 3, (1000,) * 3, (4097, 513, 1031), (128, 128, 65536), (512, 512, 32768)} <= sizes
    grouped = [c for c in cases_of(DEFAULT_SIZES, ["int8", "bf16"]) if c.groups > 1]
    assert [(c.groups, c.m, c.n, c.k, c.precision) for c in grouped] == [
        (8, 4096, 4096, 4096, "bf16"),
        (64, 4096, 4096, 4096, "bf16"),
        (8, 512, 4096, 7168, "e4m3"),  # block-scaled (gpucheck/groupedbs.py), after the fp8 rows
        (4, 1024, 7168, 2048, "e4m3"),
    ]
    with pytest.raises(SpatialError, match="at least 2 groups"):
        cases_of(["g1:8x8x8"], ["bf16"])
    # Multicast rows (issue: 4096³ and 8192³ with 2×1 and 2×2 groups), each beside the same size without groups.
    multicast = [c for c in cases_of(DEFAULT_SIZES, ["bf16"]) if c.multicast != (1, 1)]
    assert [(c.multicast, c.m, c.n, c.k) for c in multicast] == [
        ((2, 1), 4096, 4096, 4096),
        ((2, 2), 4096, 4096, 4096),
        ((2, 1), 8192, 8192, 8192),
        ((2, 2), 8192, 8192, 8192),
    ]
    assert all((c.m, c.n, c.k) in sizes for c in multicast) and multicast[1].size == "mc2x2:4096x4096x4096"
    with pytest.raises(SpatialError, match="not mcGYxGX:SIZE"):
        cases_of(["mc2:64"], ["bf16"])
    # A budget cut drops the tail: what the open goals are judged by comes first (4096³ and 8192³, then with groups),
    # split-K and grouped GEMMs last of those; the fp8 rows after them all.
    order = [c.size for c in cases_of(DEFAULT_SIZES, ["bf16"])]
    assert order[:2] == ["4096x4096x4096", "8192x8192x8192"] and all(s.startswith("mc") for s in order[2:6])
    gemms = [s for s in order if not s.startswith(("att:", "w4:"))]  # attention after the fp8 rows, then W4A16
    assert gemms[-13:-9] == ["128x128x65536", "512x512x32768", "g8:4096x4096x4096", "g64:4096x4096x4096"]
    assert all(s.startswith("fp8:") for s in gemms[-9:-6]) and order[: len(gemms)] == gemms
    assert all(s.startswith("fp8bs:") for s in gemms[-6:-4])  # the block-scaled rows after the fp8 ones,
    assert all(s.startswith("fp8mx:") for s in gemms[-4:-2])  # then MXFP8's, then the block-scaled grouped ones
    assert gemms[-2:] == ["fp8bs:g8:512x4096x7168", "fp8bs:g4:1024x7168x2048"]


# ---- the budget loop -------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def timing(s):
    return Timing(s, 10, 4, s, s, "graph")


PROBES = [
    Probe("device", True, "Fake GPU, 3 SMs"),
    Probe("torch._int_mm (B row-major): int8 64x64x64", False, "CUBLAS_STATUS_NOT_SUPPORTED", 0.1, ("x",)),
]


class FakeRunner:
    """Rows come back ok after `cost` simulated seconds; `fail` maps a size to the exception its row raises."""

    def __init__(self, clock, cost=100.0, fail=None, preflight_cost=0.0, preflight_fails=None):
        self.clock, self.cost, self.fail = clock, cost, fail or {}
        self.preflight_cost, self.preflight_fails = preflight_cost, preflight_fails
        self.started, self.ran, self.closed, self.flown = None, [], False, False

    def start(self, cases, deadline):
        self.started, self.deadline = list(cases), deadline

    def preflight(self, deadline, say, lost):
        say("preflight: device")
        self.clock.t += self.preflight_cost
        self.flown = True
        if self.preflight_fails is not None:
            raise self.preflight_fails
        return list(PROBES)

    def info(self):
        return {"gpu": "Fake GPU", "sms": 3, "clocks": "1 MHz", "target": "sm_90", "warnings": []}

    def close(self):
        self.closed = True

    def run(self, case, deadline):
        assert self.flown, "a row ran before the preflight"
        self.ran.append(case)
        self.clock.t += self.cost
        if case.size in self.fail:
            fail = self.fail[case.size]
            if callable(fail) and not isinstance(fail, type):
                fail = fail()
            if fail is not None:
                raise fail
        row = Row(case.precision, case.m, case.n, case.k, status="ok", plan="block 1×1×1")
        right = Check(True, 0.0, 0.0, 0, 0, 0, True)
        row.contestants = [
            Contestant("spatialc persistent", "spatialc", timing(2e-3), timing(1e-3), 0.0, True, check=right),
            Contestant("spatialc general", "spatialc", timing(4e-3), timing(2e-3), 0.0, True, check=right),
            Contestant("spatialc sm90a", "spatialc", timing(1e-3), timing(2.5e-4), 0.0, True, check=right),
            Contestant("torch.matmul", "cublas", timing(1e-3), timing(5e-4), 0.0, True),
        ]
        return row


def quiet(s):
    pass


def test_budget_cut_skips_the_rest_and_keeps_every_row():
    clock = FakeClock()
    runner = FakeRunner(clock, cost=100.0, preflight_cost=10.0)
    cases = cases_of(["16", "32", "48", "64"], ["fp16"])
    # 215 s less the 5 s kept for writing, less 10 s of preflight: two rows of 100 s, then too little is left
    rows, lost = G.run_all(cases, runner, budget_s=215, clock=clock, log=quiet)
    assert not lost and runner.started == cases
    assert [r.status for r in rows] == ["ok", "ok", "skipped", "skipped"]
    assert "time budget of 215 s spent" in rows[2].note
    assert len(runner.ran) == 2


def test_the_preflight_comes_first_and_its_findings_are_handed_on():
    clock, seen, said, logged = FakeClock(), [], [], []
    runner = FakeRunner(clock, cost=1.0)
    rows, stop = G.run_all(
        cases_of(["16"], ["int8"]),
        runner,
        budget_s=100,
        clock=clock,
        log=logged.append,
        on_preflight=seen.append,
        progress=said.append,
    )
    assert stop == "" and [r.status for r in rows] == ["ok"]
    assert seen == [PROBES] and said[0] == "preflight: device" and said[1].startswith("row 1/1")
    assert any("preflight: torch._int_mm (B row-major): int8 64x64x64: unavailable (CUBLAS" in s for s in logged)


def test_a_gpu_lost_in_the_preflight_skips_every_row():
    clock = FakeClock()
    runner = FakeRunner(clock, cost=1.0, preflight_fails=GpuHung("no answer in 60 s"))
    seen = []
    rows, stop = G.run_all(
        cases_of(["16", "32"], ["int8"]), runner, budget_s=100, clock=clock, log=quiet, on_preflight=seen.append
    )
    assert stop == "lost" and runner.ran == []
    assert [r.status for r in rows] == ["skipped", "skipped"]
    assert rows[0].note == "not run: the GPU was lost in the preflight (GpuHung: no answer in 60 s)"
    assert seen[0][0].ok is False


def test_a_hung_gpu_stops_the_run_and_the_rest_is_marked():
    clock = FakeClock()
    runner = FakeRunner(clock, cost=1.0, fail={"32x32x32": GpuHung("no answer in 60 s")})
    rows, lost = G.run_all(cases_of(["16", "32", "48"], ["int8"]), runner, budget_s=400, clock=clock, log=quiet)
    assert lost == "lost"
    assert [r.status for r in rows] == ["ok", "hung", "skipped"]
    assert "hung on an earlier row" in rows[2].note and len(runner.ran) == 2


def test_a_failing_row_is_an_error_row_and_the_run_goes_on():
    clock = FakeClock()
    fail = {"16x16x16": RuntimeError("bad thing\nwith detail"), "32x32x32": BudgetExceeded()}
    runner = FakeRunner(clock, 1.0, fail)
    rows, lost = G.run_all(cases_of(["16", "32", "48"], ["bf16"]), runner, budget_s=400, clock=clock, log=quiet)
    assert not lost
    assert [r.status for r in rows] == ["error", "skipped", "ok"]
    assert rows[0].note == "RuntimeError: bad thing"


def test_a_lost_context_stops_the_run():
    clock = FakeClock()
    runner = FakeRunner(clock, 1.0, {"16x16x16": GpuLost("cudaErrorIllegalAddress")})
    rows, lost = G.run_all(cases_of(["16", "32"], ["bf16"]), runner, budget_s=400, clock=clock, log=quiet)
    assert lost == "lost" and [r.status for r in rows] == ["error", "skipped"]
    assert "context was lost" in rows[1].note


def test_an_interrupt_keeps_the_rows_that_finished_and_marks_the_rest():
    clock = FakeClock()
    seen = []
    rows, stop = G.run_all(
        cases_of(["16", "32", "48"], ["fp16"]),
        FakeRunner(clock, 1.0, {"32x32x32": KeyboardInterrupt()}),
        budget_s=400,
        clock=clock,
        log=quiet,
        on_row=lambda rows: seen.append(len(rows)),
    )
    assert stop == "interrupted"
    assert [(r.status, r.note) for r in rows] == [
        ("ok", ""),
        ("skipped", "not finished: interrupted"),
        ("skipped", "not run: interrupted"),
    ]
    assert seen == [1]  # the report was brought up to date after the row that finished


def test_run_all_announces_only_the_rows_it_starts():
    clock = FakeClock()
    said = []
    runner = FakeRunner(clock, cost=100.0)
    cases = cases_of(["16", "32", "48"], ["int8"])
    rows, _ = G.run_all(cases, runner, budget_s=205, clock=clock, log=quiet, progress=said.append)
    assert [r.status for r in rows] == ["ok", "ok", "skipped"]
    assert said == ["preflight: device", "row 1/3: int8 16x16x16, 0 s so far", "row 2/3: int8 32x32x32, 100 s so far"]


# ---- the dry run -------------------------------------------------------------------------------------------------


def test_dry_run_lists_the_preflight_the_timings_and_each_case(capsys, monkeypatch):
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    status = gpucheck.main(["unused-dir", "--dry-run", "--sizes", "64", "40x24x36", "--precisions", "int8", "bf16"])
    out = capsys.readouterr().out
    assert status == 0
    assert "gpucheck dry run: 4 rows on sm_90" in out
    preflight = next(line for line in out.splitlines() if line.startswith("preflight (first, at most 60 s; "))
    assert preflight.split(": ", 1)[1].split("; ") == [
        "device",
        "CuPy cuBLAS: float64 matmul 64³",
        "spatialc persistent kernel: int8 64x64x64",
        "spatialc general kernel: int8 64x64x64",
        # The sm_90a form's at the large rows' plan (128×256 items, 128-byte panels), not a corner of it no row runs.
        "spatialc sm90a kernel: bf16 256x512x256 (128×256 items, 128-byte panels)",
        "spatialc general kernel in clusters: int8 mc2x1:64x64x64",  # its handshake on the clusters' barriers
        "torch.matmul: bf16 64x64x64",
        "torch._int_mm (B column-major): int8 64x64x64",
        "cublasGemmEx TN: int8 33x35x37",
        "torch._int_mm (B row-major): int8 64x64x64",
        "Triton matmul: int8 64x64x64",
        "CUDA graphs: every contestant captured and replayed",
    ]
    assert "timings: end to end: row-major A and B in, row-major C out in torch's type" in out
    assert "kernel only: operands already in each contestant's layout" in out
    # Each case's three kernels: the persistent one, its general form and, on sm_90, the sm90a form's (4 × 3).
    assert out.count("  plan      block") == 4 and out.count("  launch    ") == 12
    assert out.count("  ptxas     no nvcc here") == 12 and out.count("  cubin     compiled on the GPU machine") == 12
    assert out.count("\n  spatialc persistent\n    launch    grid ") == 4
    assert out.count("\n  spatialc general\n    launch    grid ") == 4
    hopper = r"\n  spatialc sm90a\n    plan      its own [^\n]*: block 8×1×\d[^\n]*\n    launch    grid \d+ × 384 "
    assert len(re.findall(hopper, out)) == 4  # its own plan, for target sm_90a, above its launch
    assert "torch._int_mm (B column-major): n/a (torch._int_mm needs m > 16 and k, n multiples of 8" in out
    assert "cublasGemmEx TN: end to end + kernel only, no padding needed" in out
    timed = "spatialc persistent: end to end + kernel only; spatialc general: end to end + kernel only; "
    assert out.count(timed + "spatialc sm90a: end to end + kernel only; ") == 4
    assert "torch.matmul: end to end + kernel only" in out


def test_dry_run_says_why_a_case_has_no_general_form(capsys, monkeypatch):
    why = "no general form: shared memory of one block of the general form on sm_90: needs 299200, has 232448"
    lowered_as(monkeypatch, without_general(why))
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    assert gpucheck.main(["d", "--dry-run", "--sizes", "48", "--precisions", "fp16"]) == 0
    out = capsys.readouterr().out
    # Two launches: the persistent kernel's and the sm90a form's (lowered apart, for sm_90a); none of a general form.
    assert f"\n  spatialc general: {why}\n" in out and out.count("  launch    ") == 2
    assert out.count("\n  spatialc persistent\n    launch    ") == 1 and out.count("\n  spatialc sm90a\n") == 1
    timed = "  timed     spatialc persistent: end to end + kernel only; spatialc general: n/a (no kernel); "
    assert timed + "spatialc sm90a: end to end + kernel only; " in out


def test_dry_run_names_gemm_ex_padding(capsys, monkeypatch):
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    assert gpucheck.main(["d", "--dry-run", "--sizes", "33x35x37", "--precisions", "int8"]) == 0
    assert "cublasGemmEx TN: end to end + kernel only, operands zero-padded to 36×36×40" in capsys.readouterr().out


@pytest.mark.nvcc
@pytest.mark.skipif(N.find_nvcc() is None, reason="nvcc is not installed")
def test_dry_run_shows_what_ptxas_says_when_nvcc_is_here(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path))
    assert gpucheck.main(["unused-dir", "--dry-run", "--sizes", "40x24x56", "--precisions", "bf16"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"  ptxas     (\d+) regs \(est \d+\), spills (\d+)/(\d+) B \(st/ld\), static smem (\d+) B", out)
    assert found, out
    assert 0 < int(found.group(1)) <= 255 and int(found.group(4)) > 0
    assert list(tmp_path.glob("cubin/*-sm_90.ptxas.json"))  # compiled for sm_90, numbers cached under SPATIALC_CACHE


# ---- the command line ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "why"),
    [
        (False, "no CUDA device found"),
        (True, f"CuPy is not installed ({L.INSTALL_CUPY})"),
    ],
)
def test_without_a_gpu_it_says_why_and_names_the_dry_run_in_one_line_and_exits_2(
    device, why, capsys, monkeypatch, tmp_path
):
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(L, "_DEVICE", None)
    monkeypatch.setattr(discover, "DEVICE_PROBES", (lambda: device,))
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    out = tmp_path / "my out"
    status = gpucheck.main([str(out), "--sizes", "64"])
    err = capsys.readouterr().err
    assert status == 2
    dry = f"`spatialc gpucheck '{out}' --sizes 64 --dry-run` lists what a GPU run would do"
    assert err == f"gpucheck: {why}; {dry}\n"
    assert not out.exists()
    assert gpucheck.main([str(out), "--sizes", "64", "--dry-run"]) == 0  # and the command it names runs here


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
        (["{d}/out", "--prepared", "{d}/nothing"], "no manifest.json in"),
        (["{d}/out", "--prepared", "{d}/afile"], "no manifest.json in"),
        (["{d}/out", "--prepare", "--dry-run"], "--prepare compiles the kernels into OUTDIR"),
        (["{d}/afile", "--prepare"], "exists and is not a folder"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, says, capsys, tmp_path):
    (tmp_path / "afile").write_text("a file, not a folder")
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    status = gpucheck.main(argv, make_runner=no_runner)
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.startswith("gpucheck: ") and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "out").exists() and (tmp_path / "afile").read_text() == "a file, not a folder"


def test_prepare_without_nvcc_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    assert gpucheck.main([str(tmp_path / "p"), "--prepare", "--sizes", "32"], make_runner=no_runner) == 2
    err = capsys.readouterr().err
    assert err == "gpucheck: --prepare compiles with nvcc, which was not found (PATH, CUDA_HOME, /usr/local/cuda)\n"


def test_the_reviewed_repro_an_outdir_that_is_a_file(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    status = gpucheck.main([str(afile), "--sizes", "32", "--precisions", "int8"], make_runner=no_runner)
    assert status == 2 and capsys.readouterr().err == f"gpucheck: OUTDIR {str(afile)!r} exists and is not a folder\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_outdir_that_cannot_be_written_is_refused(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert gpucheck.main([str(locked), "--sizes", "32"], make_runner=no_runner) == 2
        assert gpucheck.main([str(locked / "new"), "--sizes", "32"], make_runner=no_runner) == 2
    finally:
        locked.chmod(0o700)
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "is not writable" in err


def test_an_outdir_that_fails_on_creation_exits_2_before_any_row(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(G, "check_outdir", lambda outdir: None)  # as if the folder went away after the check
    (tmp_path / "afile").write_text("x")
    runner = FakeRunner(FakeClock(), cost=0.0)
    status = gpucheck.main([str(tmp_path / "afile"), "--sizes", "32"], make_runner=lambda *a, **k: runner)
    out, err = capsys.readouterr()
    assert status == 2 and err.startswith("gpucheck: cannot write to OUTDIR") and err.count("\n") == 1
    assert runner.ran == [] and runner.closed


def test_main_writes_the_table_with_an_injected_runner(capsys, tmp_path):
    made = {}

    def make_runner(target, **kw):
        made["runner"] = FakeRunner(FakeClock(), cost=0.0)
        made["args"] = (target, kw)
        return made["runner"]

    argv = [str(tmp_path), "--sizes", "32", "--precisions", "fp16", "--no-triton", "--no-graphs"]
    status = gpucheck.main([*argv, "--commit", "c0ffee", "--seed", "5"], make_runner=make_runner)
    out = capsys.readouterr().out
    assert status == 0 and made["runner"].closed
    assert made["args"] == (None, {"seed": 5, "triton": False, "prepared": None, "graphs": False})
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    assert data["header"]["commit"] == "c0ffee" and data["header"]["gpu"] == "Fake GPU"
    assert [p["name"] for p in data["header"]["preflight"]] == [p.name for p in PROBES]
    timings = data["rows"][0]["timings"]
    assert timings["end_to_end"]["spatialc"]["persistent"]["pct_of_cublas"] == pytest.approx(50.0)
    assert timings["kernel"]["spatialc"]["persistent"]["pct_of_cublas"] == pytest.approx(50.0)
    assert timings["kernel"]["spatialc"]["general"]["pct_of_cublas"] == pytest.approx(25.0)
    assert timings["end_to_end"]["spatialc"]["sm90a"]["pct_of_cublas"] == pytest.approx(100.0)
    assert timings["kernel"]["spatialc"]["sm90a"]["pct_of_cublas"] == pytest.approx(200.0)
    assert "| fp16 | 32×32×32 |" in out and "| 50% / 25% / 100% |" in out and "| 50% / 25% / 200% |" in out
    assert "wrote" in out


def test_the_report_is_on_disk_after_the_preflight_and_every_row(capsys, tmp_path):
    seen = []

    def look():  # called as the second row runs: the first must be on disk already, the rest pending
        data = json.loads((tmp_path / "gpucheck.json").read_text())
        seen.append(([r["status"] for r in data["rows"]], data["header"]["state"], len(data["header"]["preflight"])))
        seen.append((tmp_path / "gpucheck.md").read_text())

    runner = FakeRunner(FakeClock(), cost=0.0, fail={"32x32x32": look})
    argv = [str(tmp_path), "--sizes", "16", "32", "48", "--precisions", "int8"]
    assert gpucheck.main(argv, make_runner=lambda *a, **k: runner) == 0
    assert seen[0] == (["ok", "pending", "pending"], "running (pending rows not reached yet)", 2)
    assert "| int8 | 32×32×32 |" in seen[1] and "pending: not reached yet" in seen[1]
    assert "| torch._int_mm (B row-major): int8 64x64x64 | unavailable | 0.1 | CUBLAS_STATUS_NOT_SUPPORTED |" in seen[1]
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
    argv = [str(tmp_path), "--sizes", "16", "32", "--precisions", "bf16"]
    status = gpucheck.main(argv, make_runner=lambda *a, **k: runner)
    out, err = capsys.readouterr()
    assert status == 1 and len(calls) == 5  # opened, after the preflight, after each row, at the end
    assert "| bf16 | 16×16×16 |" in out and "| bf16 | 32×32×32 |" in out
    assert '"pct_of_cublas": 50.0' in out  # the JSON goes to stdout instead
    assert err.count("could not update the report") == 1 and "could not write the report" in err
    steps = err.count("gpucheck: row ") + err.count("gpucheck: preflight: ")
    assert err.count("\n") == 2 + steps  # those two, beside a line as each step and row starts


@pytest.mark.parametrize("how", ["KeyboardInterrupt", "SIGTERM"])
def test_an_interrupted_run_still_writes_and_prints_the_table(how, capsys, tmp_path, monkeypatch):
    def interrupt():
        if how == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
            raise AssertionError("SIGTERM did not interrupt the run")
        return KeyboardInterrupt()

    exit_raises(monkeypatch)
    before = signal.getsignal(signal.SIGTERM)
    runner = FakeRunner(FakeClock(), cost=0.0, fail={"32x32x32": interrupt})
    argv = [str(tmp_path), "--sizes", "16", "32", "48", "--precisions", "fp16"]
    with pytest.raises(SystemExit) as done:
        gpucheck.main(argv, make_runner=lambda *a, **k: runner)
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
    assert gpucheck.main(argv, make_runner=lambda *a, **k: runner) == 0
    out, err = capsys.readouterr()
    rows = [line for line in err.splitlines() if line.startswith("gpucheck: row ")]
    assert [line.split(",")[0] for line in rows] == [
        "gpucheck: row 1/4: int8 16x16x16",
        "gpucheck: row 2/4: fp16 16x16x16",
        "gpucheck: row 3/4: int8 32x32x32",
        "gpucheck: row 4/4: fp16 32x32x32",
    ]
    assert all(line.endswith(" s so far") for line in rows)
    assert "gpucheck: preflight: device" in err
    assert "| int8 | 32×32×32 |" in out and "gpucheck: row" not in out  # the table's stdout stays clean


def test_main_exits_1_when_a_row_fails(capsys, tmp_path):
    def make_runner(target, **kw):
        return FakeRunner(FakeClock(), cost=0.0, fail={"32x32x32": RuntimeError("boom")})

    assert gpucheck.main([str(tmp_path), "--sizes", "32", "--precisions", "int8"], make_runner=make_runner) == 1
    assert "error: RuntimeError: boom" in capsys.readouterr().out


def test_a_warning_from_the_runner_reaches_stderr_and_the_report(capsys, tmp_path):
    runner = FakeRunner(FakeClock(), cost=0.0)
    runner.info = lambda: {"gpu": "Fake", "sms": 114, "warnings": ["the device has 114 SMs, fewer than 132"]}
    assert (
        gpucheck.main([str(tmp_path), "--sizes", "16", "--precisions", "int8"], make_runner=lambda *a, **k: runner) == 0
    )
    err = capsys.readouterr().err
    assert "gpucheck: ⚠ the device has 114 SMs, fewer than 132" in err
    assert "- ⚠ the device has 114 SMs, fewer than 132" in (tmp_path / "gpucheck.md").read_text()


def test_the_module_runs_as_a_script(tmp_path):
    import subprocess

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spatialc.gpucheck",
            str(tmp_path),
            "--dry-run",
            "--sizes",
            "32",
            "--precisions",
            "fp16",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": "/usr/bin:/bin"},  # no nvcc on this PATH: nothing compiles
    )
    assert done.returncode == 0, done.stderr
    assert "gpucheck dry run: 1 row on sm_90" in done.stdout and "fp16 32x32x32" in done.stdout


def test_the_preflight_case_is_64_cubed_in_the_first_precision():
    from spatialc.gpucheck.cases import preflight_case

    assert preflight_case(cases_of(["1000"], ["bf16", "int8"])) == Case(64, 64, 64, "bf16")

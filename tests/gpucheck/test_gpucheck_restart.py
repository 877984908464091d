"""Going on after a lost GPU (gpucheck/restart.py): a worker process that hangs or loses its CUDA context is followed
by a fresh one without what lost it. The workers here run in this process on the stand-in GPU (a new worker resets
the stand-in's hang, as a new process gets a fresh context); `_run_worker` itself runs real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spatialc import gpucheck
from spatialc.gpucheck import device as D
from spatialc.gpucheck import restart as R
from spatialc.gpucheck.cases import Case, row_of

from .test_gpucheck_fakes import FakeEvent, exit_raises
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture

CASES = [Case(32, 32, 32, "bf16"), Case(48, 48, 48, "bf16"), Case(64, 64, 64, "bf16")]


def progress(upto: int, loss: R.Loss | None) -> R.Progress:
    rows = [row_of(c, "ok") for c in CASES[:upto]]
    if loss is not None and loss.index is not None:
        rows.append(row_of(CASES[loss.index], "hung", loss.message))
        rows += [row_of(c, "skipped", "not run: the GPU hung on an earlier row") for c in CASES[loss.index + 1 :]]
    return R.Progress(rows, loss)


def test_a_kernel_that_hung_a_row_is_left_out_and_its_row_runs_again():
    loss = R.Loss(1, "spatialc sm90a", "the GPU did not finish within 60 s")
    nxt = R.next_resume(R.Resume(wall_started=5.0), progress(1, loss), CASES, left_s=200, restarts=2)
    assert isinstance(nxt, R.Resume)
    assert [r.size for r in nxt.rows] == ["32x32x32"]  # the row it hung on is not kept: it runs again
    assert nxt.lost == {
        "spatialc sm90a": "lost the GPU on row 2/3 (bf16 48x48x48) (the GPU did not finish within 60 s); left out "
        "after the restart"
    }
    assert nxt.restarts == [
        "spatialc sm90a lost the GPU on row 2/3 (bf16 48x48x48) (the GPU did not finish within 60 s); went on "
        "without it, in a fresh process"
    ]
    assert nxt.wall_started == 5.0  # the budget still counts from the first worker's start


def test_a_loss_nothing_is_blamed_for_keeps_its_row_and_the_next_starts():
    nxt = R.next_resume(R.Resume(), progress(0, R.Loss(0, None, "illegal address")), CASES, 200, 2)
    assert isinstance(nxt, R.Resume) and not nxt.lost
    assert [(r.size, r.status) for r in nxt.rows] == [("32x32x32", "hung")]
    assert "nothing to blame, so that row stands" in nxt.restarts[0]


@pytest.mark.parametrize(
    ("resume", "loss", "left", "why"),
    [
        (R.Resume(restarts=["a", "b"]), R.Loss(1, "x", "hung"), 200, "no restart left (--restarts 2)"),
        (R.Resume(), R.Loss(1, "x", "hung"), 29, "29 s of the budget left, less than a restart takes (30 s)"),
        (R.Resume(), R.Loss(None, None, "device: hung"), 200, "lost in the preflight by no path the rows can go"),
        (R.Resume(), R.Loss(0, "reference", "hung"), 200, "by the reference, which every row needs"),
        (R.Resume(), None, 200, "the worker ended without saying how it lost the GPU"),
    ],
)
def test_no_restart_when_none_is_left_or_none_could_help(resume, loss, left, why):
    got = R.next_resume(resume, progress(1, loss), CASES, left, 2)
    assert isinstance(got, str) and why in got, got


def in_process(fake_gpu, monkeypatch, faults):
    """A `run_worker` for `supervise`: each worker is main in this process on the stand-ins, with a fresh device (no
    hang left over) and the next of `faults` planted; returns the exit statuses it saw."""
    exit_raises(monkeypatch)
    seen = []

    def run_worker(cmd, limit_s, signals):
        assert cmd[:3] == [sys.executable, "-m", "spatialc.gpucheck"] and limit_s > 0
        FakeEvent.hang = False
        fake_gpu["fault"] = faults[len(seen)]
        try:
            status = gpucheck.main(cmd[3:], make_runner=D.GpuRunner)
        except SystemExit as e:
            status = e.code
        seen.append(status)
        return status

    return run_worker, seen


def supervised(tmp_path, run_worker, *argv, restarts=2):
    args = [str(tmp_path), "--commit", "x", "--precisions", "bf16", *argv]
    status = R.supervise(
        args,
        CASES,
        outdir=str(tmp_path),
        budget_s=240,
        restarts=restarts,
        started=time.monotonic(),
        run_worker=run_worker,
    )
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    return status, data["header"], data["rows"]


def test_a_kernel_that_hangs_in_the_preflight_is_left_out_and_every_row_runs(fake_gpu, monkeypatch, tmp_path, capsys):
    run_worker, seen = in_process(fake_gpu, monkeypatch, [("hang", "spatialc_hopper"), None])
    status, header, rows = supervised(tmp_path, run_worker, "--sizes", "32", "48")
    assert seen == [3, 1] and status == 1  # lost, then a complete run whose rows say the sm90a kernel could not run
    assert header["state"] == "complete" and len(header["restarts"]) == 1
    assert header["restarts"][0].startswith("spatialc sm90a lost the GPU in the preflight (GpuHung: the GPU did not")
    step = next(p for p in header["preflight"] if p["name"].startswith("spatialc sm90a kernel"))
    assert step["ok"] is False and step["detail"].startswith("lost the GPU in the preflight")
    assert [r["status"] for r in rows] == ["error", "error"]
    for row in rows:
        by = {c["name"]: c for c in row["contestants"]}
        assert by["spatialc sm90a"]["note"].startswith("unavailable: lost the GPU in the preflight")
        assert by["spatialc persistent"]["ok"] and by["spatialc general"]["ok"]  # what the first process lost
        assert by["torch.matmul"]["ok"]
    assert "restart 1: spatialc sm90a lost the GPU" in (tmp_path / "gpucheck.md").read_text()
    assert "went on without it, in a fresh process (restart 1 of 2)" in capsys.readouterr().err


def test_a_kernel_that_hangs_a_row_is_left_out_and_the_row_runs_again(fake_gpu, monkeypatch, tmp_path, capsys):
    run_worker, seen = in_process(fake_gpu, monkeypatch, [("hang", "48x48", "spatialc_hopper"), None])
    status, header, rows = supervised(tmp_path, run_worker, "--sizes", "32", "48", "64")
    assert seen == [3, 1] and status == 1
    assert header["restarts"][0].startswith("spatialc sm90a lost the GPU on row 2/3 (bf16 48x48x48)")
    # The first worker's row 1 kept, row 2 run again; a form that cannot run makes its rows errors, as a preflight's.
    assert [r["status"] for r in rows] == ["ok", "error", "error"]
    again = {c["name"]: c for c in rows[1]["contestants"]}
    assert again["spatialc sm90a"]["note"].startswith("unavailable: lost the GPU on row 2/3")
    assert again["spatialc persistent"]["ok"] and again["torch.matmul"]["ok"]
    last = {c["name"]: c for c in rows[2]["contestants"]}
    assert "unavailable" in last["spatialc sm90a"]["note"]  # left out from then on, at every size
    capsys.readouterr()


def test_restarts_stop_at_the_limit_and_the_last_workers_table_stands(fake_gpu, monkeypatch, tmp_path, capsys):
    # Every kernel hangs: the preflight blames the first form's step each time, until no restart is left.
    run_worker, seen = in_process(fake_gpu, monkeypatch, ["hang", "hang"])
    status, header, rows = supervised(tmp_path, run_worker, "--sizes", "32", restarts=1)
    assert seen == [3, 3] and status == 3
    assert header["state"] == "stopped: the GPU was lost" and len(header["restarts"]) == 1
    assert rows[0]["status"] == "skipped" and "lost in the preflight" in rows[0]["note"]
    assert "no restart left (--restarts 1)" in capsys.readouterr().err


def test_the_worker_runs_as_its_own_process_and_is_killed_past_its_limit():
    assert R._run_worker([sys.executable, "-c", "raise SystemExit(3)"], 30, R.Signals()) == 3
    t0 = time.monotonic()
    assert R._run_worker([sys.executable, "-c", "import time; time.sleep(60)"], 1.0, R.Signals()) == -signal.SIGKILL
    assert time.monotonic() - t0 < 20


def test_a_worker_killed_past_the_budget_ends_the_run(tmp_path, capsys):
    seen = []

    def run_worker(cmd, limit_s, signals):
        seen.append(limit_s)
        return -signal.SIGKILL

    status = R.supervise(
        [str(tmp_path)],
        CASES,
        outdir=str(tmp_path),
        budget_s=100,
        restarts=2,
        started=time.monotonic(),
        run_worker=run_worker,
    )
    assert status == 3 and len(seen) == 1 and 159 < seen[0] <= 160  # the budget left and OVERTIME_S


def test_restarts_must_be_a_whole_number_and_0_runs_in_one_process(capsys, tmp_path):
    assert gpucheck.main([str(tmp_path), "--restarts", "-1"]) == 2
    assert "--restarts: must be 0 or more, not -1" in capsys.readouterr().err
    assert gpucheck.main([str(tmp_path), "--restarts", "two"]) == 2
    assert "'two' is not a whole number" in capsys.readouterr().err


def test_the_real_command_restarts_a_real_worker_process(tmp_path):
    # `python -m spatialc.gpucheck` as a user runs it, its supervisor and workers real processes on the stand-in GPU
    # (tests/fake_site): the first worker's sm90a kernel hangs on row 2 and the process ends with os._exit(3); a
    # second process, started from what the first left, keeps row 1, runs row 2 without that kernel, and row 3.
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, SPATIALC_FAKE_GPU="hang,48x48,spatialc_hopper;", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(root / "tests" / "fake_site"), str(root / "src")])
    cmd = [
        sys.executable,
        "-m",
        "spatialc.gpucheck",
        str(tmp_path),
        "--sizes",
        "32",
        "48",
        "64",
        "--precisions",
        "bf16",
    ]
    done = subprocess.run([*cmd, "--commit", "x"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]  # the rows without the sm90a kernel are errors, not lost
    assert "spatialc sm90a lost the GPU on row 2/3 (bf16 48x48x48)" in done.stderr
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    assert data["header"]["state"] == "complete" and len(data["header"]["restarts"]) == 1
    rows = data["rows"]
    assert [r["status"] for r in rows] == ["ok", "error", "error"]
    again = {c["name"]: c for c in rows[1]["contestants"]}
    assert again["spatialc sm90a"]["note"].startswith("unavailable: lost the GPU on row 2/3")
    assert again["spatialc persistent"]["ok"] and again["torch.matmul"]["ok"]
    assert done.stdout.count("| bf16 | 32×32×32 |") >= 2  # each worker printed its table: the first, then the whole


def test_ctrl_c_between_two_workers_ends_130_without_a_traceback(tmp_path, capsys):
    def run_worker(cmd, limit_s, signals):
        return 3  # lost, and then Ctrl-C while the supervisor reads what the worker left

    calls = []

    def clock():  # the supervisor's start and the first worker's budget, then Ctrl-C
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return 0.0

    status = R.supervise(
        [str(tmp_path)], CASES, outdir=str(tmp_path), budget_s=100, restarts=2, started=0.0,
        run_worker=run_worker, clock=clock,
    )  # fmt: skip
    assert status == 130 and len(calls) == 3 and "gpucheck: interrupted" in capsys.readouterr().err

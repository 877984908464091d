"""Going on after a lost GPU (gpucheck/restart.py), against the cases a hostile review found wanting: a restart
that loses or reruns finished rows, blames the wrong path, leaves the report stale, or breaks the exit status. The
workers run in this process on the stand-in GPU, as in test_gpucheck_restart.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from spatialc import gpucheck
from spatialc.gpucheck import device as D
from spatialc.gpucheck import grouped as GR
from spatialc.gpucheck import restart as R
from spatialc.gpucheck.cases import cases_of

from .test_gpucheck_fakes import FakeError, FakeEvent, exit_raises
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture


def workers(fake_gpu, monkeypatch, faults, before=None):
    """Like test_gpucheck_restart.in_process, with `before(n, cmd)` called as worker n (0-based) starts; it may
    return an exit status to end that worker at once, or raise `Killed` from inside it (a process killed)."""
    exit_raises(monkeypatch)
    seen = []

    def run_worker(cmd, limit_s, signals):
        n = len(seen)
        FakeEvent.hang = False
        fake_gpu["fault"] = faults[n] if n < len(faults) else None
        status = before(n, cmd) if before else None
        if status is None:
            try:
                status = gpucheck.main(cmd[3:], make_runner=D.GpuRunner)
            except SystemExit as e:
                status = e.code
            except Killed:
                status = -signal.SIGKILL
        seen.append(status)
        return status

    return run_worker, seen


class Killed(BaseException):
    """The worker process vanishing (SIGKILL: a wall-clock limit, or the supervisor's overtime kill)."""


def supervise(tmp_path, run_worker, sizes, restarts=2, budget=600):
    args = [str(tmp_path), "--commit", "x", "--precisions", "bf16", "--sizes", *sizes]
    cases = cases_of(sizes, ["bf16"])
    status = R.supervise(
        args,
        cases,
        outdir=str(tmp_path),
        budget_s=budget,
        restarts=restarts,
        started=time.monotonic(),
        run_worker=run_worker,
    )
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    return status, data["header"], data["rows"]


def by_name(row):
    return {c["name"]: c for c in row["contestants"]}


# ---- rows lost --------------------------------------------------------------------------------------------------


def test_a_preflight_loss_after_a_restart_keeps_the_rows_finished_before_it(fake_gpu, monkeypatch, tmp_path, capsys):
    # Worker 1 finishes row 1, loses the GPU on row 2 (sm90a); worker 2 loses it in its preflight (general);
    # worker 3 keeps worker 1's row 1, and does not run it again.
    faults = [("hang", "48x48", "spatialc_hopper"), ("hang", "spatialc_general"), None]
    run_worker, seen = workers(fake_gpu, monkeypatch, faults)
    status, header, rows = supervise(tmp_path, run_worker, ["32", "48"])
    assert seen == [3, 3, 1] and len(header["restarts"]) == 2
    first = by_name(rows[0])
    assert first["spatialc general"]["ok"], first["spatialc general"]["note"]  # worker 1's row 1, as it finished
    assert capsys.readouterr().err.count("row 1/2: bf16 32x32x32") == 1  # and run once, not again


def test_a_restarted_worker_cut_off_in_its_preflight_leaves_the_finished_rows_in_the_report(
    fake_gpu, monkeypatch, tmp_path, capsys
):
    # Worker 2 is killed in its preflight (a wall-clock SIGKILL, the supervisor's overtime kill): the report still
    # holds row 1, which worker 1 finished, and says how the run stopped.
    def preflight(self, *a, **k):
        raise Killed

    def before(n, cmd):
        if n == 1:
            monkeypatch.setattr(D.GpuRunner, "preflight", preflight)

    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "48x48", "spatialc_hopper")], before)
    status, header, rows = supervise(tmp_path, run_worker, ["32", "48"])
    assert seen == [3, -signal.SIGKILL] and status == 3
    assert rows[0]["status"] == "ok", rows[0]
    assert header["state"] == "stopped: killed past the budget"


# ---- the exit status ------------------------------------------------------------------------------------------


def test_a_worker_ended_by_sigterm_before_its_handler_gives_130(tmp_path):
    # SIGTERM reaches the supervisor while its worker is still starting (imports, GpuRunner: seconds, and again at
    # every restart), before the worker's own handler: the worker dies of the signal, and the run still ends 130.
    def run_worker(cmd, limit_s, signals):
        child = [sys.executable, "-c", "import time; time.sleep(5)"]  # a worker that has not reached run_all yet
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        return R._run_worker(child, limit_s, signals)

    status = R.supervise([str(tmp_path)], cases_of(["32"], ["bf16"]), outdir=str(tmp_path), budget_s=100,
                         restarts=2, started=time.monotonic(), run_worker=run_worker)  # fmt: skip
    assert status == 130, status


def test_a_hung_row_a_restart_did_not_reach_again_still_fails_the_run(fake_gpu, monkeypatch, tmp_path, capsys):
    # A restart with little budget left (30 s is enough to be tried; its start and preflight take 15-30 s) may
    # reach no row again: the row that hung keeps its failure, and the run does not end 0.
    def before(n, cmd):
        if n == 1:  # the second worker's budget as good as spent (its start and preflight took it)
            folder = cmd[cmd.index("--worker") + 1]
            resume = R.load_resume(folder)
            resume.wall_started -= 10_000
            R._write(R.Path(folder) / R.RESUME, resume)

    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "48x48", "spatialc_hopper")], before)
    status, header, rows = supervise(tmp_path, run_worker, ["32", "48"])
    assert seen[0] == 3 and len(header["restarts"]) == 1
    assert (status, rows[1]["status"]) == (1, "hung"), (status, rows[1]["note"])


# ---- blame ------------------------------------------------------------------------------------------------------


def test_a_kernel_that_hangs_when_replayed_in_the_graph_step_is_blamed_not_graphs(
    fake_gpu, monkeypatch, tmp_path, capsys
):
    # The graph step replays every contestant: a hang there is the replayed kernel's, not CUDA graphs' (which
    # left out would time every contestant without them, and keep the kernel that hung).
    real = D.GpuRunner._replay_kernel

    def replay(self, name, probed, deadline):
        if name == "spatialc sm90a" and not replay.done:  # the first process's replay of the sm90a kernel hangs
            replay.done = True
            FakeEvent.hang = True
        return real(self, name, probed, deadline)

    replay.done = False
    monkeypatch.setattr(D.GpuRunner, "_replay_kernel", replay)
    run_worker, seen = workers(fake_gpu, monkeypatch, [None, None])
    status, header, rows = supervise(tmp_path, run_worker, ["32"])
    assert header["restarts"][0].startswith("spatialc sm90a lost the GPU in the preflight"), header["restarts"]
    assert header["kernel_timing"] == "CUDA graphs", header["kernel_timing"]


def test_a_multicast_kernel_that_hangs_leaves_out_only_multicast_kernels(fake_gpu, monkeypatch, tmp_path, capsys):
    # mc rows run the general form (and sm90a) with clusters, kernels of their own: a hang there leaves out the
    # multicast kernel, not the plain general form of every row after it (in the default list, mc rows are 3-6).
    faults = [("hang", "256x256", "spatialc_general"), None]
    run_worker, seen = workers(fake_gpu, monkeypatch, faults)
    status, header, rows = supervise(tmp_path, run_worker, ["32", "mc2x1:256", "48"])
    assert seen == [3, 1], seen
    assert "mc2x1" in header["restarts"][0]
    plain = by_name(rows[2])
    assert plain["spatialc general"]["ok"], plain["spatialc general"]["note"]


def test_a_grouped_rows_reference_that_loses_the_gpu_is_not_blamed_on_the_kernel(
    fake_gpu, monkeypatch, tmp_path, capsys
):
    # A grouped row's float64 references are made before its first contestant runs: a sticky error in them is the
    # references' (which end the run), not the first kernel's.
    real = GR._References.of

    def of(self, g):
        if not of.done:
            of.done = True
            raise FakeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
        return real(self, g)

    of.done = False
    monkeypatch.setattr(GR._References, "of", of)
    run_worker, seen = workers(fake_gpu, monkeypatch, [None, None])
    status, header, rows = supervise(tmp_path, run_worker, ["g2:64x64x64"])
    assert "spatialc general lost the GPU" not in header.get("restarts", [""])[0], header["restarts"]


def test_a_loss_in_a_rows_float64_reference_ends_the_run(fake_gpu, monkeypatch, tmp_path, capsys):
    # A sticky error in a dense row's float64 reference is the reference's, which every row needs: the run ends 3.
    real = D.GpuRunner._reference

    def reference(self, inputs, case, deadline):
        if case.m == 48 and not reference.done:
            reference.done = True
            matmul = self.cp.matmul

            def failing(*a):
                raise FakeError("cudaErrorIllegalAddress: an illegal memory access was encountered")

            self.cp.matmul = failing
            try:
                return real(self, inputs, case, deadline)
            finally:
                self.cp.matmul = matmul
        return real(self, inputs, case, deadline)

    reference.done = False
    monkeypatch.setattr(D.GpuRunner, "_reference", reference)
    run_worker, seen = workers(fake_gpu, monkeypatch, [None, None])
    status, header, rows = supervise(tmp_path, run_worker, ["32", "48", "64"])
    assert seen == [3] and status == 3, (seen, header.get("restarts"))
    assert "lost on row 2/3 (bf16 48x48x48) by the reference" in capsys.readouterr().err


# ---- sweeps, grouped rows, signals --------------------------------------------------------------------------------


def test_a_sweep_plan_that_hangs_is_left_out_alone_and_its_row_runs_again(fake_gpu, monkeypatch, tmp_path, capsys):
    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "smem101376"), None])
    status, header, rows = supervise(tmp_path, run_worker, ["32", "sweep:64"])
    assert seen == [3, 1], (seen, header.get("restarts"))  # 1: a plan left out makes its row an error
    assert header["restarts"][0].startswith("spatialc sm90a 8×1×4 d5 lost the GPU on row 2/2")
    sweep = by_name(rows[1])
    assert sweep["spatialc sm90a 8×1×4 d5"]["note"].startswith("unavailable: lost the GPU on row 2/2")
    assert sweep["spatialc sm90a"]["ok"] and sweep["spatialc sm90a 8×1×4 d3"]["ok"]
    assert rows[0]["status"] == "ok" and rows[1]["status"] == "error"


def test_a_grouped_kernel_that_hangs_is_left_out_and_its_row_runs_again(fake_gpu, monkeypatch, tmp_path, capsys):
    from . import test_gpucheck_fakes as F

    real = F.FakeKernel._grouped

    def grouped(self, buffers):  # the grouped kernel hangs in the first worker (its shape is the preflight's)
        real(self, buffers)
        if not grouped.done:
            grouped.done = FakeEvent.hang = True

    grouped.done = False
    monkeypatch.setattr(F.FakeKernel, "_grouped", grouped)
    run_worker, seen = workers(fake_gpu, monkeypatch, [None, None])
    status, header, rows = supervise(tmp_path, run_worker, ["32", "g2:64x64x64"])
    restarts = header.get("restarts", [])
    assert seen == [3, 1] and restarts and "row 2/2" in restarts[0], (seen, restarts)
    g = by_name(rows[1])
    assert g["spatialc general"]["note"].startswith("unavailable") and g["torch.matmul per group"]["ok"]


def test_sigterm_reaching_a_worker_after_a_restart_writes_the_kept_rows_and_130(
    fake_gpu, monkeypatch, tmp_path, capsys
):
    def row(self, case, deadline):
        if case.m == 48 and FakeEvent.hang is False and row.n == 1:
            raise KeyboardInterrupt  # what the worker's SIGTERM handler raises
        return real(self, case, deadline)

    real = D.GpuRunner.run
    row.n = 0

    def before(n, cmd):
        row.n = n

    monkeypatch.setattr(D.GpuRunner, "run", row)
    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "48x48", "spatialc_hopper")], before)
    status, header, rows = supervise(tmp_path, run_worker, ["32", "48", "64"])
    assert seen == [3, 130] and status == 130
    assert [r["status"] for r in rows] == ["ok", "skipped", "skipped"] and header["state"] == "stopped: interrupted"


def test_a_fresh_worker_that_cannot_start_after_a_loss_still_ends_3(fake_gpu, monkeypatch, tmp_path, capsys):
    # After an Xid the device may refuse a new context: worker 2 says "no GPU" (2) or dies in GpuRunner's start
    # (1, a traceback). The run was lost: it ends 3, and the report says why.
    def before(n, cmd):
        return 2 if n == 1 else None

    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "48x48", "spatialc_hopper")], before)
    status, header, rows = supervise(tmp_path, run_worker, ["32", "48"])
    assert seen == [3, 2] and status == 3, status
    assert header["state"] == "stopped: the GPU was lost, and a fresh worker did not start (exit status 2)"
    assert [r["status"] for r in rows] == ["ok", "hung"]


def test_a_row_that_lost_the_gpu_does_not_free_its_memory(fake_gpu, monkeypatch, tmp_path, capsys):
    # Freeing (cudaFree, torch's empty_cache) waits for the device, which a hung kernel keeps busy for good: the row
    # that lost the GPU leaves its memory to the process's end, and the worker gets to write its table.
    freed = []
    monkeypatch.setattr(D.GpuRunner, "_free", lambda self: freed.append(True))
    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "48x48", "spatialc_hopper"), None])
    status, header, rows = supervise(tmp_path, run_worker, ["32", "48"], restarts=0)
    assert seen == [3] and status == 3
    assert len(freed) == 1  # row 1's, not row 2's

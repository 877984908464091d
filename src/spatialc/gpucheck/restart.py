"""Going on after a lost GPU: the check's rows run in a worker process, and a fresh one takes over when it is lost.

A kernel that hangs or leaves a sticky CUDA error ruins its process's context for good: nothing more can run in it,
and only the process's exit frees the GPU. Run in one process, a first GPU session whose new kernel hangs on its
first row (or in the preflight) would keep nothing else: every other form, cuBLAS and the rows after it lost. So
`spatialc gpucheck` supervises: it runs the check in a worker process (the same command with `--worker DIR`), which
leaves in DIR, after its preflight and each row, the rows it finished and, when the GPU is lost, what lost it — the
contestant or preflight path the failing call ran for (`GpuLost.path`). When a worker ends lost (exit status 3) and
time and `--restarts` are left, a new worker resumes: the rows finished are kept as they are, the path that lost the
GPU is unavailable from then on (its preflight step not tried, its contestant in every row says why), the row it was
lost on runs again without it, and the report's header lists each restart. A loss nothing can be blamed on (the
device itself, the float64 references) ends the run, as before.

The supervisor itself never touches the GPU; it forwards SIGTERM and Ctrl-C to the worker, which writes its table,
and kills a worker that runs past the budget by more than `OVERTIME_S` (wedged in a driver call; the run then ends,
its report as the worker last wrote it).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cases import Case, Row, one_line

PROGRESS = "progress.pickle"  # the worker's: rows finished and the loss, after the preflight and every row
RESUME = "resume.pickle"  # the supervisor's, for the next worker: rows to keep, paths left out, the restarts so far
DEFAULT_RESTARTS = 2
MIN_RESTART_S = 30.0  # a worker is not started again with less of the budget left: its preflight alone takes that
OVERTIME_S = 60.0  # a worker still running this long past the budget is killed (it did not stop itself)
EXIT_LOST = 3
# Paths without which the rows mean nothing: a loss blamed on them ends the run.
VITAL = frozenset({"reference"})


@dataclass
class Loss:
    """How a worker lost the GPU: on row `index` (0-based, of all the run's cases), or in the preflight (None), and
    the path blamed (None: nothing could be)."""

    index: int | None
    path: str | None
    message: str


@dataclass
class Progress:
    """What a worker leaves in its folder: the rows it finished, in order from the run's first, and its loss."""

    rows: list[Row] = field(default_factory=list)
    loss: Loss | None = None


@dataclass
class Resume:
    """What a worker starts from: the rows kept, the paths left out (with why), a line per restart, and when the
    run started (`time.time()`: its budget counts from the supervisor's start, whichever worker is running)."""

    rows: list[Row] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)
    restarts: list[str] = field(default_factory=list)
    wall_started: float | None = None

    def started(self, clock: Callable[[], float] = time.monotonic) -> float | None:
        """The run's start on `clock` (None: not known)."""
        return None if self.wall_started is None else clock() - (time.time() - self.wall_started)


def _write(path: Path, obj: object) -> None:
    """Atomically: a reader never sees half a file (the worker may be killed while it writes)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(pickle.dumps(obj))
    os.replace(tmp, path)


def _read(path: Path, kind: type) -> Any:
    """The object pickled at `path` by this package (a folder only spatialc's processes write), or None."""
    try:
        obj = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return obj if isinstance(obj, kind) else None


def save_progress(folder: str | Path, progress: Progress) -> None:
    _write(Path(folder) / PROGRESS, progress)


def load_resume(folder: str | Path) -> Resume:
    """The resume a supervisor left in `folder` (nothing kept: the first worker)."""
    return _read(Path(folder) / RESUME, Resume) or Resume()


# ---- the supervisor ----------------------------------------------------------------------------------------------


def worker_command(argv: Sequence[str], folder: Path) -> list[str]:
    return [sys.executable, "-m", "spatialc.gpucheck", *argv, "--worker", str(folder)]


def _run_worker(cmd: list[str], limit_s: float) -> int:
    """Run one worker to its end (its output is this process's): SIGTERM is passed on to it (Ctrl-C reaches it from
    the terminal), and it is killed when it runs `limit_s` seconds — wedged in a driver call, past the budget."""
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + limit_s
    old = signal.getsignal(signal.SIGTERM)

    def forward(signum: int, frame: Any) -> None:
        proc.send_signal(signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread: the worker still has its own handler
        old = None
    try:
        while True:
            try:
                return proc.wait(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    print(f"gpucheck: the worker ran {limit_s:.0f} s, past the budget: killed", file=sys.stderr)
                    proc.kill()
                    proc.wait()
                    return -signal.SIGKILL
            except KeyboardInterrupt:
                pass  # Ctrl-C reached the worker too (one process group): it writes its table and ends
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def label(cases: Sequence[Case], i: int) -> str:
    return f"row {i + 1}/{len(cases)} ({cases[i]})"


def next_resume(
    resume: Resume, progress: Progress, cases: Sequence[Case], left_s: float, restarts: int
) -> Resume | str:
    """What the next worker starts from after `progress` ended lost, or why there is none."""
    loss = progress.loss
    if loss is None:
        return "the worker ended without saying how it lost the GPU"
    where = "in the preflight" if loss.index is None else f"on {label(cases, loss.index)}"
    if len(resume.restarts) >= restarts:
        return f"lost {where}; no restart left (--restarts {restarts})"
    if left_s < MIN_RESTART_S:
        return f"lost {where}; {left_s:.0f} s of the budget left, less than a restart takes ({MIN_RESTART_S:.0f} s)"
    if loss.path is None and loss.index is None:
        return f"lost in the preflight by no path the rows can go without ({loss.message})"
    if loss.path in VITAL:
        return f"lost {where} by the {loss.path}, which every row needs ({loss.message})"
    lost = dict(resume.lost)
    if loss.index is None:  # the preflight's: every row runs
        rows = []
    elif loss.path is None:  # nothing to leave out: the row keeps its hung (or failed) result and the run goes on
        rows = progress.rows[: loss.index + 1]
    else:  # the row the GPU was lost on runs again, without what lost it
        rows = progress.rows[: loss.index]
    if loss.path is None:
        what = f"lost {where} ({loss.message}); nothing to blame, so that row stands and the next one starts"
    else:
        lost[loss.path] = f"lost the GPU {where} ({loss.message}); left out after the restart"
        what = f"{loss.path} lost the GPU {where} ({loss.message}); went on without it"
    return Resume(rows, lost, [*resume.restarts, f"{what}, in a fresh process"], resume.wall_started)


def supervise(
    argv: Sequence[str],
    cases: Sequence[Case],
    *,
    budget_s: float,
    restarts: int,
    started: float,
    run_worker: Callable[[list[str], float], int] = _run_worker,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the check (`argv`, its own arguments) in workers until one ends other than lost, or no restart is left;
    the exit status is the last worker's."""
    with tempfile.TemporaryDirectory(prefix="spatialc-gpucheck-") as tmp:
        folder = Path(tmp)
        resume = Resume(wall_started=time.time() - (clock() - started))
        _write(folder / RESUME, resume)
        while True:
            left = budget_s - (clock() - started)
            status = run_worker(worker_command(argv, folder), left + OVERTIME_S)
            if status not in (EXIT_LOST, -signal.SIGKILL):
                return status
            progress = _read(folder / PROGRESS, Progress) or Progress()
            if status == -signal.SIGKILL:  # past the budget: no time for another, and its report stays as it left it
                return EXIT_LOST
            step = next_resume(resume, progress, cases, budget_s - (clock() - started), restarts)
            if isinstance(step, str):
                print(f"gpucheck: {step}", file=sys.stderr, flush=True)
                return status if status == EXIT_LOST else EXIT_LOST
            resume = step
            print(f"gpucheck: {resume.restarts[-1]} (restart {len(resume.restarts)} of {restarts})", file=sys.stderr)
            try:
                _write(folder / RESUME, resume)
                (folder / PROGRESS).unlink(missing_ok=True)
            except OSError as e:
                print(f"gpucheck: cannot restart: {one_line(e)}", file=sys.stderr)
                return EXIT_LOST

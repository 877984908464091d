"""Going on after a lost GPU: the check's rows run in a worker process, and a fresh one takes over when it is lost.

A kernel that hangs or leaves a sticky CUDA error ruins its process's context for good: nothing more can run in it,
and only the process's exit frees the GPU. Run in one process, a first GPU session whose new kernel hangs on its
first row (or in the preflight) would keep nothing else: every other form, cuBLAS and the rows after it lost. So
`spatialc gpucheck` supervises: it runs the check in a worker process (the same command with `--worker DIR`), which
leaves in DIR, after its preflight and each row, its report's header, the rows it finished and, when the GPU is
lost, what lost it — the kernel or preflight path the failing call ran for (`GpuLost.path`). When a worker ends
lost (exit status 3) and time and `--restarts` are left, a new worker resumes: the rows finished are kept as they
are, the path that lost the GPU is unavailable from then on (its preflight step not tried, its contestant in every
row says why), the row it was lost on runs again without it (and keeps its failed result if the budget does not
reach it again), and the report's header lists each restart. A loss in a row that nothing can be blamed on keeps
that row as it failed and goes on with the next; one in the preflight's device step, or in the float64 references
every row needs, ends the run.

The supervisor itself never touches the GPU. SIGTERM is passed on to the running worker (Ctrl-C reaches it from the
terminal), which writes its table; after either, nothing restarts and the exit status is 130. A worker that runs
past the budget by more than `OVERTIME_S` (wedged in a driver call) is killed, as is the run: the supervisor writes
the report from what the worker last left, its unfinished rows skipped, and exits 3.
"""

from __future__ import annotations

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

from ..files import write_whole
from .cases import Case, Row, one_line, row_of
from .preflight import REFERENCE
from .report import write_report

PROGRESS = "progress.pickle"  # the worker's: header, rows finished and the loss, after the preflight and every row
RESUME = "resume.pickle"  # the supervisor's, for the next worker: rows to keep, paths left out, the restarts so far
DEFAULT_RESTARTS = 2
MIN_RESTART_S = 30.0  # a worker is not started again with less of the budget left: its preflight alone takes that
OVERTIME_S = 60.0  # a worker still running this long past the budget is killed (it did not stop itself)
EXIT_LOST = 3
EXIT_INTERRUPTED = 130
VITAL = frozenset({REFERENCE})  # paths without which the rows mean nothing: a loss blamed on them ends the run


@dataclass
class Loss:
    """How a worker lost the GPU: on row `index` (0-based, of all the run's cases), or in the preflight (None), and
    the path blamed (None: nothing could be)."""

    index: int | None
    path: str | None
    message: str


@dataclass
class Progress:
    """What a worker leaves in its folder: its report's header, the rows it has (from the run's first, the kept ones
    included), whether its preflight is done, and its loss."""

    rows: list[Row] = field(default_factory=list)
    loss: Loss | None = None
    header: dict[str, Any] | None = None
    preflown: bool = False


@dataclass
class Resume:
    """What a worker starts from: the rows kept, the paths left out (with why), the rows the GPU was lost on (by
    index: they stand where this worker does not reach them again), a line per restart, and when the run started
    (`time.time()`: its budget counts from the supervisor's start, whichever worker is running)."""

    rows: list[Row] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)
    restarts: list[str] = field(default_factory=list)
    wall_started: float | None = None
    lost_rows: dict[int, Row] = field(default_factory=dict)

    def started(self, clock: Callable[[], float] = time.monotonic) -> float | None:
        """The run's start on `clock` (None: not known)."""
        return None if self.wall_started is None else clock() - (time.time() - self.wall_started)


def _write(path: Path, obj: object) -> None:
    """Atomically: a reader never sees half a file (the worker may be killed while it writes)."""
    write_whole(path, pickle.dumps(obj))


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


# ---- what the next worker starts from ----------------------------------------------------------------------------


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
    lost, lost_rows = dict(resume.lost), dict(resume.lost_rows)
    if loss.index is None:  # the preflight's: the rows kept before it stay, the rest run
        rows = list(resume.rows)
    elif loss.path is None:  # nothing to leave out: the row keeps its hung (or failed) result and the run goes on
        rows = progress.rows[: loss.index + 1]
    else:  # the row the GPU was lost on runs again, without what lost it; its failure stands if it is not reached
        rows = progress.rows[: loss.index]
        if loss.index < len(progress.rows):
            lost_rows[loss.index] = progress.rows[loss.index]
    if loss.path is None:
        what = f"lost {where} ({loss.message}); nothing to blame, so that row stands and the next one starts"
    else:
        lost[loss.path] = f"lost the GPU {where} ({loss.message}); left out after the restart"
        what = f"{loss.path} lost the GPU {where} ({loss.message}); went on without it"
    return Resume(rows, lost, [*resume.restarts, f"{what}, in a fresh process"], resume.wall_started, lost_rows)


# ---- the supervisor ----------------------------------------------------------------------------------------------


def worker_command(argv: Sequence[str], folder: Path) -> list[str]:
    return [sys.executable, "-m", "spatialc.gpucheck", *argv, "--worker", str(folder)]


class Signals:
    """SIGTERM and Ctrl-C while the supervisor runs: SIGTERM is passed on to the running worker (Ctrl-C reaches it
    from the terminal); after either, no worker is started again."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen = False
        self.old: Any = None

    def __enter__(self) -> Signals:
        try:
            self.old = signal.signal(signal.SIGTERM, self._term)
        except ValueError:  # not the main thread: a worker still has its own handler
            self.old = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)

    def _term(self, signum: int, frame: Any) -> None:
        self.seen = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def _run_worker(cmd: list[str], limit_s: float, signals: Signals) -> int:
    """Run one worker to its end (its output is this process's); it is killed when it runs `limit_s` seconds
    (wedged in a driver call, past the budget), and then the status is -SIGKILL."""
    proc = subprocess.Popen(cmd)
    signals.proc = proc
    deadline = time.monotonic() + limit_s
    try:
        while True:
            try:
                return proc.wait(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    proc.kill()
                    proc.wait()
                    return -signal.SIGKILL
            except KeyboardInterrupt:
                signals.seen = True  # Ctrl-C reached the worker too (one process group): it writes its table
    finally:
        signals.proc = None


def _stopped(outdir: str, progress: Progress | None, resume: Resume, cases: Sequence[Case], why: str) -> None:
    """The report as the last worker that wrote one left it (or the kept rows), its unfinished rows skipped with
    `why` and its state saying so — for a worker that ended without writing its own."""
    if progress is None or progress.header is None:
        return  # no worker got as far as writing a report: there is nothing to correct
    rows = list(progress.rows) if len(progress.rows) >= len(resume.rows) else list(resume.rows)
    for i in range(len(rows), len(cases)):
        rows.append(resume.lost_rows.get(i) or row_of(cases[i], "skipped", f"not finished: {why}"))
    header = dict(progress.header, state=f"stopped: {why}")
    try:
        write_report(outdir, header, rows)
    except OSError as e:
        print(f"gpucheck: could not update the report in {outdir}: {one_line(e)}", file=sys.stderr)


def supervise(
    argv: Sequence[str],
    cases: Sequence[Case],
    *,
    outdir: str,
    budget_s: float,
    restarts: int,
    started: float,
    run_worker: Callable[[list[str], float, Signals], int] = _run_worker,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run the check (`argv`, its own arguments) in workers until one ends other than lost, or no restart is left;
    the exit status is the last worker's (3 where a fresh one could not start, 130 after a signal)."""
    try:
        with tempfile.TemporaryDirectory(prefix="spatialc-gpucheck-") as tmp, Signals() as signals:
            folder = Path(tmp)
            resume = Resume(wall_started=time.time() - (clock() - started))
            last: Progress | None = None  # what the last worker that ended lost had left
            _write(folder / RESUME, resume)
            while True:
                left = budget_s - (clock() - started)
                status = run_worker(worker_command(argv, folder), left + OVERTIME_S, signals)
                progress = _read(folder / PROGRESS, Progress)
                if signals.seen:
                    if status < 0:  # ended by the signal before it could write its table
                        _stopped(outdir, progress or last, resume, cases, "interrupted")
                    return EXIT_INTERRUPTED
                if status < 0:
                    why = (
                        "killed past the budget"
                        if status == -signal.SIGKILL
                        else f"the worker died of signal {-status}"
                    )
                    print(f"gpucheck: {why}", file=sys.stderr, flush=True)
                    _stopped(outdir, progress or last, resume, cases, why)
                    return EXIT_LOST
                if resume.restarts and status != EXIT_LOST and (progress is None or not progress.preflown):
                    # A fresh worker that could not even run its preflight (no GPU any more, a crash): still lost.
                    why = f"the GPU was lost, and a fresh worker did not start (exit status {status})"
                    print(f"gpucheck: {why}", file=sys.stderr, flush=True)
                    _stopped(outdir, progress or last, resume, cases, why)
                    return EXIT_LOST
                if status != EXIT_LOST:
                    return status
                step = next_resume(resume, progress or Progress(), cases, budget_s - (clock() - started), restarts)
                if isinstance(step, str):
                    print(f"gpucheck: {step}", file=sys.stderr, flush=True)
                    return EXIT_LOST
                last, resume = progress, step
                print(
                    f"gpucheck: {resume.restarts[-1]} (restart {len(resume.restarts)} of {restarts})", file=sys.stderr
                )
                try:
                    _write(folder / RESUME, resume)
                    (folder / PROGRESS).unlink(missing_ok=True)
                except OSError as e:
                    print(f"gpucheck: cannot restart: {one_line(e)}", file=sys.stderr)
                    return EXIT_LOST
    except KeyboardInterrupt:  # Ctrl-C between two workers: none was running, and none starts
        print("gpucheck: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED

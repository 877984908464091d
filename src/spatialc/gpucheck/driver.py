"""The GPU check's driver: the command line, the preflight and the budget loop, the dry run, the report on disk.

GPU-free: the device side (`device.GpuRunner`) is imported only when a run needs it and is injected in tests
(`main(argv, make_runner=…)`), so all of this is tested on a CPU with fake runners.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from ..errors import SpatialError
from .cases import (
    DEFAULT_SIZES,
    PRECISIONS,
    RUN_PRECISIONS,
    SWEEP_SIZES,
    BudgetExceeded,
    Case,
    Deadline,
    GpuHung,
    GpuLost,
    Probe,
    Row,
    cases_of,
    one_line,
    probe_result,
    row_of,
)
from .dryrun import END_TO_END, KERNEL_ONLY, dry_run, outputs_note
from .report import to_json, to_markdown, write_report
from .restart import DEFAULT_RESTARTS, Loss, Progress, load_resume, save_progress

DEFAULT_BUDGET_S = 240.0  # the whole run, preflight included: with Python's start and the end, under 5 minutes
RESERVE_S = 5.0  # kept back at the end for writing the table
MIN_ROW_S = 3.0  # a row is not started with less than this left


class Runner(Protocol):
    """What runs the rows: the GPU runner, or a fake in tests. `start` may begin work in the background (builds and
    compiles), which must end by the deadline; `preflight` tries every path once; `close` stops what still runs."""

    def start(self, cases: Sequence[Case], deadline: Deadline) -> None: ...

    def preflight(self, deadline: Deadline, say: Callable[[str], None], lost: Mapping[str, str]) -> list[Probe]: ...

    def run(self, case: Case, deadline: Deadline) -> Row: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


# ---- the budget loop -------------------------------------------------------------------------------------------


def run_all(
    cases: Sequence[Case],
    runner: Runner,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = print,
    started: float | None = None,
    on_row: Callable[[list[Row]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    on_preflight: Callable[[list[Probe]], None] | None = None,
    done: Sequence[Row] = (),
    left_out: Mapping[str, str] | None = None,
    on_loss: Callable[[int | None, GpuLost], None] | None = None,
    fallback: Mapping[int, Row] | None = None,
) -> tuple[list[Row], str]:
    """The preflight, then every case within `budget_s` seconds (from `started`), calling `on_preflight` with the
    preflight's findings, `on_row` with the rows so far after each, and `progress` with each step of the preflight
    and `row i/n: precision size, t s so far` as each row starts (main prints those on stderr). A run that resumes
    an earlier process's (restart.py) keeps its rows `done` (the first cases') and leaves out the paths `left_out`
    names; `on_loss` hears where the GPU was lost (a row's index, None in the preflight) and what lost it;
    `fallback` holds, by index, the rows an earlier process lost the GPU on: they stand where this run does not
    reach them again.

    Returns a row for every case and why the run stopped early: "" (it did not), "lost" (the GPU hung or lost its
    context; the rest are skipped) or "interrupted" (KeyboardInterrupt, which main also raises on SIGTERM)."""
    t0 = clock() if started is None else started
    deadline = Deadline(t0 + budget_s - RESERVE_S, clock)
    say = progress or (lambda s: None)
    rows: list[Row] = list(done)
    lost = ""
    running = False  # a row was started and has not come back
    try:
        runner.start(cases[len(done) :], deadline)
        probes, lost, loss = _preflight(runner, deadline, say, left_out or {})
        if loss is not None and on_loss is not None:
            on_loss(None, loss)
        for p in probes:
            log(f"[{clock() - t0:6.1f} s] preflight: {p.name}: {_probe_result(p)}")
        if on_preflight is not None:
            on_preflight(probes)
        for case in cases[len(done) :]:
            if lost:
                row = row_of(case, "skipped", f"not run: {lost}")
            elif deadline.left() < MIN_ROW_S:
                row = row_of(case, "skipped", f"not run: time budget of {budget_s:.0f} s spent")
            else:
                running = True
                say(f"row {len(rows) + 1}/{len(cases)}: {case}, {clock() - t0:.0f} s so far")
                row, lost, loss = _run_one(case, runner, deadline)
                if loss is not None and on_loss is not None:
                    on_loss(len(rows), loss)
            running = False
            if row.status == "skipped" and fallback and len(rows) in fallback:
                row = fallback[len(rows)]  # not reached again: its failure in the process that lost the GPU stands
            rows.append(row)
            _log_row(log, clock() - t0, row)
            if on_row is not None:
                on_row(rows)
    except KeyboardInterrupt:
        for i, case in enumerate(cases[len(rows) :]):
            why = "not finished: interrupted" if i == 0 and running else "not run: interrupted"
            rows.append(row_of(case, "skipped", why))
        log(f"[{clock() - t0:6.1f} s] interrupted: the rows not finished are marked skipped")
        return rows, "interrupted"
    return rows, "lost" if lost else ""


def _preflight(
    runner: Runner, deadline: Deadline, say: Callable[[str], None], left_out: Mapping[str, str]
) -> tuple[list[Probe], str, GpuLost | None]:
    """The runner's preflight, why the run cannot go on ('' when it can) and the loss that stopped it."""
    try:
        return runner.preflight(deadline, say, left_out), "", None
    except GpuLost as e:
        return [Probe("preflight", False, one_line(e))], f"the GPU was lost in the preflight ({one_line(e)})", e


def _probe_result(p: Probe) -> str:
    return probe_result(p.ok, p.marked) + (f" ({p.detail})" if p.detail else "")


def _log_row(log: Callable[[str], None], t: float, r: Row) -> None:
    log(f"[{t:6.1f} s] {r}: {r.status}" + (f" ({r.note})" if r.note else ""))


def _run_one(case: Case, runner: Runner, deadline: Deadline) -> tuple[Row, str, GpuLost | None]:
    """The case's row, why the run cannot go on ('' when it can) and the loss that stopped it."""
    try:
        return runner.run(case, deadline), "", None
    except GpuHung as e:
        return row_of(case, "hung", _blamed(e)), "the GPU hung on an earlier row", e
    except GpuLost as e:
        return row_of(case, "error", _blamed(e)), "the CUDA context was lost on an earlier row", e
    except BudgetExceeded:
        return row_of(case, "skipped", "not finished: time budget spent"), "", None
    except Exception as e:  # one broken row must not cost the table
        return row_of(case, "error", one_line(e)), "", None


def _blamed(e: GpuLost) -> str:
    """The loss in words, led by what it is blamed on where its message does not already name it."""
    said = str(e)
    return said if e.path is None or said.startswith(f"{e.path}:") else f"{e.path}: {said}"


def pending(case: Case) -> Row:
    """A row not reached yet (what the report holds for it until it runs)."""
    return row_of(case, "pending", "not reached yet")


# ---- the command line ------------------------------------------------------------------------------------------


def git_commit() -> str:
    """The spatialc checkout's commit (with `+dirty`), or `unknown` where there is no git."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (SpatialError) instead of usage text and exit."""

    def error(self, message: str) -> Any:
        raise SpatialError(message)


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _restarts(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def parse_args(argv: Sequence[str] | None, description: str = "") -> argparse.Namespace:
    ap = _Parser(prog="spatialc gpucheck", description=description)
    ap.add_argument(
        "outdir",
        help="where gpucheck.json and gpucheck.md go (created; rewritten after every row); with --prepare the cubins",
    )
    ap.add_argument(
        "--budget", type=_budget, default=DEFAULT_BUDGET_S, help="seconds for the whole run, preflight included (240)"
    )
    ap.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help="N (for N³) or MxNxK, several; gG:MAXROWSxNxK a grouped GEMM, mcGYxGX:SIZE multicast groups, "
        "sweep:SIZE each form's plans around its planner's, fused:SIZE the GEMM with row and column scales and a "
        "residual fused (bf16) beside the plain GEMM, map:KIND:MxN[:PRECISION] an elementwise map (swiglu, residual, "
        "gelu) or a norm (softmax, log_softmax, rmsnorm, layernorm, row_logsumexp, …) against torch and the copy "
        "bandwidth, in the precision it names if it names one, fp8:KIND:SIZE an e4m3 or e5m2 "
        "GEMM with dequant scales against torch._scaled_mm (its precision its own), w4:FORMAT:MxNxK a W4A16 GEMM "
        "(bf16 A, int4 / uint4 / mxfp4 weights) against torch's mm and the copy bandwidth (default: the check's own "
        "list; with --prepare also "
        f"{' '.join(SWEEP_SIZES)}, for a second run)",
    )
    ap.add_argument(
        "--precisions",
        nargs="+",
        default=list(PRECISIONS),
        help=f"of {', '.join(RUN_PRECISIONS)} (default {' '.join(PRECISIONS)}; fp32: map and norm rows alone, a GEMM "
        "size skips it)",
    )
    ap.add_argument("--target", default=None, help="spatialc target (default: from the GPU; sm_90 without one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton contender")
    ap.add_argument("--no-graphs", action="store_true", help="time kernel-only launch by launch, without CUDA graphs")
    ap.add_argument("--commit", default=None, help="the commit to record (default: git's)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would run, build the plans, and exit (without --prepared, nvcc compiles each kernel here for "
        "ptxas's numbers: seconds a kernel, minutes for the default list)",
    )
    ap.add_argument(
        "--prepare", action="store_true", help="compile every kernel of the run into OUTDIR (needs nvcc, no GPU)"
    )
    ap.add_argument("--prepared", metavar="DIR", help="load the kernels --prepare compiled into DIR (hash-checked)")
    ap.add_argument(
        "--restarts",
        type=_restarts,
        metavar="N",
        default=DEFAULT_RESTARTS,
        help=f"after a hang or a lost CUDA context, go on in a fresh process without the kernel or library that lost "
        f"it, at most this many times ({DEFAULT_RESTARTS}; 0: stop there, in one process)",
    )
    ap.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)  # a supervised run's process (restart.py)
    args = ap.parse_args(argv)
    if args.prepare and (args.dry_run or args.prepared):
        raise SpatialError("--prepare compiles the kernels into OUTDIR; it goes with neither --dry-run nor --prepared")
    return args


def check_outdir(outdir: str | Path) -> None:
    """Refuse (SpatialError, one line) an OUTDIR that is not a folder or that cannot be created or written.
    Creates nothing: `open_outdir` does, once there is a GPU."""
    out = Path(outdir)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise SpatialError(f"OUTDIR {str(out)!r} exists and is not a folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise SpatialError(f"OUTDIR {str(out)!r} is not writable")
        return
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SpatialError(f"cannot create OUTDIR {str(out)!r}: {str(parent)!r} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpatialError(f"cannot create OUTDIR {str(out)!r}: {str(parent)!r} is not writable")


def open_outdir(outdir: str | Path, header: dict[str, Any], cases: Sequence[Case], done: Sequence[Row] = ()) -> None:
    """Create OUTDIR and write the report with every row pending (but those an earlier worker finished, `done`):
    the proof that the results will have a place."""
    try:
        write_report(outdir, header, [*done, *(pending(c) for c in cases[len(done) :])])
    except OSError as e:
        raise SpatialError(f"cannot write to OUTDIR {str(outdir)!r}: {one_line(e)}") from None


class _Saver:
    """Rewrites the report after each row (rows not reached yet pending); a failed write is said once, not fatal."""

    def __init__(self, outdir: str, header: dict[str, Any], cases: Sequence[Case], started: float):
        self.outdir, self.header, self.cases, self.started = outdir, header, cases, started
        self.error = ""

    def __call__(self, rows: list[Row]) -> None:
        self.header["elapsed_s"] = round(time.monotonic() - self.started, 1)
        try:
            write_report(self.outdir, self.header, rows + [pending(c) for c in self.cases[len(rows) :]])
        except OSError as e:
            if not self.error:
                print(f"gpucheck: could not update the report in {self.outdir}: {one_line(e)}", file=sys.stderr)
            self.error = one_line(e)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _sigterm_interrupts() -> Any:
    """Make SIGTERM (a wall-clock limit's kill) raise KeyboardInterrupt, so the table is still written; returns the
    handler to restore (None where none was set: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGTERM, _interrupt)
    except (ValueError, OSError):
        return None


def no_gpu(e: BaseException, argv: Sequence[str]) -> str:
    """The refusal without a GPU, in one line: why (GpuUnavailable's reason), and the dry run of the same command,
    which needs none."""
    why = str(e).removeprefix("no GPU: ")
    own = list(argv)
    if "--worker" in own:  # a supervised run's process: the command to name is the user's
        at = own.index("--worker")
        del own[at : at + 2]
    dry = shlex.join(["spatialc", "gpucheck", *own, "--dry-run"])
    return f"{why}; `{dry}` lists what a GPU run would do"


STATE = {"": "complete", "lost": "stopped: the GPU was lost", "interrupted": "stopped: interrupted"}


def _setup(argv: Sequence[str] | None, description: str) -> tuple[argparse.Namespace, list[Case], Any]:
    """The arguments, the cases and the prepared folder (None), every one checked; SpatialError for a bad one."""
    from .prepare import MANIFEST, Manifest

    args = parse_args(argv, description)
    sizes = args.sizes or list(DEFAULT_SIZES)
    if args.prepare and args.sizes is None:  # the session's second run, the sweep, is prepared with the first
        sizes += SWEEP_SIZES
    cases = cases_of(sizes, args.precisions)
    if args.target is not None:
        from ..target import target

        target(args.target)
    manifest = None
    if args.prepared:
        manifest = Manifest.load(args.prepared)
    elif not args.prepare and (Path(args.outdir) / MANIFEST).is_file():
        manifest = Manifest.load(args.outdir)  # prepared and run in one folder
    if not args.dry_run:
        check_outdir(args.outdir)
    return args, cases, manifest


def main(
    argv: Sequence[str] | None = None, make_runner: Callable[..., Any] | None = None, description: str = ""
) -> int:
    """The GPU check's entry point (`spatialc gpucheck …` calls this; tests pass a fake `make_runner`)."""
    started = time.monotonic()
    try:
        args, cases, manifest = _setup(argv, description)
        if args.prepare:
            from .prepare import prepare

            return prepare(
                cases, args.target or "sm_90", args.outdir, commit=args.commit or git_commit(), seed=args.seed
            )
    except SpatialError as e:
        print(f"gpucheck: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        dry_run(cases, args.target or "sm_90", manifest)
        return 0
    from ..runtime.launch import GpuUnavailable, require_cupy

    own = list(sys.argv[1:] if argv is None else argv)
    try:
        if make_runner is None and args.worker is None and args.restarts > 0:
            from .restart import supervise

            require_cupy()  # the supervisor never uses the GPU, but without one it says so here, once
            return supervise(
                own, cases, outdir=args.outdir, budget_s=args.budget, restarts=args.restarts, started=started
            )
        if make_runner is None:
            from .device import GpuRunner

            make_runner = GpuRunner
        runner = make_runner(
            args.target, seed=args.seed, triton=not args.no_triton, prepared=manifest, graphs=not args.no_graphs
        )
    except GpuUnavailable as e:
        print(f"gpucheck: {no_gpu(e, own)}", file=sys.stderr)
        return 2
    return _run(args, cases, runner, started)


def _run(args: argparse.Namespace, cases: list[Case], runner: Any, started: float) -> int:
    resume = load_resume(args.worker) if args.worker else None
    if resume is not None and (at := resume.started()) is not None:
        started = at  # the budget counts from the supervisor's start
    header = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "state": "running (pending rows not reached yet)",
        "commit": args.commit or git_commit(),
        "budget_s": args.budget,
        "outputs": outputs_note(),
        "timing": f"{END_TO_END}; {KERNEL_ONLY}",
        **runner.info(),
    }
    if resume is not None and resume.restarts:
        header["restarts"] = list(resume.restarts)
    try:
        open_outdir(args.outdir, header, cases, resume.rows if resume is not None else ())
    except SpatialError as e:
        runner.close()
        print(f"gpucheck: {e}", file=sys.stderr)
        return 2
    print(
        f"gpucheck: {header.get('gpu')} · {header.get('sms')} SMs · {header.get('clocks')} · target "
        f"{header.get('target')} · commit {header['commit']}",
        flush=True,
    )
    for warning in header.get("warnings", []):
        print(f"gpucheck: ⚠ {warning}", file=sys.stderr, flush=True)
    save = _Saver(args.outdir, header, cases, started)
    progress = Progress()

    def saved(rows: list[Row]) -> None:
        save(rows)
        if args.worker:  # what a restart keeps; after the report, which matters more
            progress.rows, progress.header = list(rows), dict(save.header)
            save_progress(args.worker, progress)

    def lost(index: int | None, e: GpuLost) -> None:
        progress.loss = Loss(index, e.path, one_line(e))

    def preflown(probes: list[Probe]) -> None:
        header.update(runner.info())
        header["preflight"] = [asdict(p) for p in probes]
        progress.preflown = True
        saved(list(resume.rows) if resume is not None else [])

    old_handler = _sigterm_interrupts()
    try:
        rows, stop = run_all(
            cases,
            runner,
            budget_s=args.budget,
            started=started,
            log=lambda s: print(s, flush=True),
            on_row=saved,
            progress=lambda s: print(f"gpucheck: {s}", file=sys.stderr, flush=True),
            on_preflight=preflown,
            done=resume.rows if resume is not None else (),
            left_out=resume.lost if resume is not None else None,
            on_loss=lost,
            fallback=resume.lost_rows if resume is not None else None,
        )
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        runner.close()
    return _finish(args, header, rows, stop, started)


def _finish(args: argparse.Namespace, header: dict[str, Any], rows: list[Row], stop: str, started: float) -> int:
    """Print the table, write the report, and end with the run's exit status."""
    header["state"] = STATE[stop]
    header["elapsed_s"] = round(time.monotonic() - started, 1)
    print(to_markdown(header, rows), flush=True)  # the table first: whatever happens to OUTDIR, stdout has it
    failed = [r for r in rows if r.status in ("wrong", "error", "hung")]
    status = 1 if failed else 0
    try:
        paths = write_report(args.outdir, header, rows)
        print(f"gpucheck: wrote {paths[0]} and {paths[1]}", flush=True)
    except OSError as e:
        print(
            f"gpucheck: could not write the report to {args.outdir}: {one_line(e)}; the JSON follows", file=sys.stderr
        )
        print(to_json(header, rows), flush=True)
        status = 1
    if stop:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3 if stop == "lost" else 130)  # a hung or interrupted kernel could hang a normal exit's CUDA teardown
    return status

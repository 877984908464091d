"""The GPU check: build, run, check and time spatialc's kernels against cuBLAS (and Triton) in one short run.

    python -m spatialc.gpucheck OUTDIR [--budget 420] [--sizes 256 1000 4097x513x1031 …] [--dry-run]

For every size × precision (int8, fp16, bf16) it builds `gemm(m, n, k, p)` for the target, lowers it, compiles the
kernel, runs it on fresh random inputs with the output poisoned first, compares C with a float64 reference of the
operand-rounded inputs, times it with CUDA events (warm-up, median of ≥ 20, inputs rotated across copies so the L2
cache does not flatter it) and times the baselines on the same inputs. Each row also records its kernel's plan, its
budget and what ptxas said of it (registers, spills, static shared memory; `nvcc -Xptxas -v`), shown in a second
table whose notes flag spills and register counts that cost resident blocks. The table goes to stdout and, as JSON
and Markdown, to OUTDIR, which is checked and created before the first row and rewritten after every row (rows not
reached yet are marked pending), so a run cut short still leaves what it finished. It stops at `--budget` seconds:
background compiles get no more than the time left and are killed at the end, rows not reached are marked skipped
and the table is still written; Ctrl-C or SIGTERM stops it the same way. Exit status: 0 all run rows correct, 1 some
wrong or failed (or the report could not be written; the table and the JSON then go to stdout), 2 no GPU or a bad
argument (one line on stderr; without a GPU it names the `--dry-run` that works anyway), 3 the GPU hung or lost its
context, 130 interrupted (the table is written first). As it goes, stderr says which row starts (`gpucheck: row
3/24: fp16 256x256x256, 41 s so far`) and stdout how each one ended.

This module is the GPU-free part (cases, checking, timing, the budget loop, the dry run); `gpucheck_gpu` drives
the device and is imported only when one is needed. Timing and running are injected, so all of this is tested
on a CPU with fake timers and runners.
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .errors import SpatialError
from .gpucheck_report import MAX_ABS_TOL, REL_FRO_TOL, Check, Row, to_json, to_markdown, write_report

PRECISIONS = ("int8", "fp16", "bf16")
DEFAULT_SIZES = ("256", "512", "1024", "2048", "4096", "8192", "1000", "4097x513x1031")
DEFAULT_BUDGET_S = 420.0
RESERVE_S = 5.0  # kept back at the end for writing the table
MIN_ROW_S = 3.0  # a row is not started with less than this left


class GpuLost(Exception):
    """The GPU can no longer be trusted (a kernel hung, or the CUDA context holds a sticky error)."""


class GpuHung(GpuLost):
    """A wait on the GPU ran past its limit: most likely a deadlocked kernel."""


class BudgetExceeded(Exception):
    """The time budget ran out inside a row."""


@dataclass(frozen=True, slots=True)
class Case:
    """One product to check."""

    m: int
    n: int
    k: int
    precision: str

    @property
    def size(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


def parse_size(text: str) -> tuple[int, int, int]:
    """`256` → 256³; `4097x513x1031` (or with commas) → (m, n, k)."""
    parts = text.lower().replace(",", "x").replace("×", "x").split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise SpatialError(f"size {text!r} is not N or MxNxK") from None
    if len(dims) == 1:
        dims *= 3
    if len(dims) != 3 or min(dims) < 1:
        raise SpatialError(f"size {text!r} is not N or MxNxK with positive numbers")
    return dims[0], dims[1], dims[2]


def cases_of(sizes: Iterable[str], precisions: Iterable[str]) -> list[Case]:
    """Every size × precision, size-major (so a budget cut drops whole sizes, not one precision); each case once."""
    precs = list(precisions)
    for p in precs:
        if p not in PRECISIONS:
            raise SpatialError(f"unknown precision {p!r}; use {', '.join(PRECISIONS)}")
    dims = [parse_size(s) for s in sizes]
    return list(dict.fromkeys(Case(*d, p) for d in dims for p in precs))


# ---- checking --------------------------------------------------------------------------------------------------


def check_result(c: Any, ref: Any, out_tiled: Any, storage: str, precision: str, xp: Any) -> Check:
    """Compare the logical C with the float64 reference `ref`; count poison left in C and in the padding."""
    from .runtime.tilize import unwritten

    logical_poison = unwritten(c, storage, xp)
    pad_poison = unwritten(out_tiled, storage, xp) - logical_poison
    c64 = c.astype(xp.float64)
    nonfinite = int(c.size - xp.count_nonzero(xp.isfinite(c64)))
    diff = c64 - ref
    max_abs = float(xp.max(xp.abs(diff))) if c.size else 0.0
    ref_norm = float(xp.sqrt(xp.sum(ref * ref)))
    rel_fro = float(xp.sqrt(xp.sum(diff * diff))) / ref_norm if ref_norm > 0 else max_abs
    if precision == "int8":
        within = max_abs == 0.0
    else:
        scale = float(xp.max(xp.abs(ref))) if ref.size else 0.0
        within = rel_fro <= REL_FRO_TOL and max_abs <= MAX_ABS_TOL * max(scale, 1e-30)
    correct = within and logical_poison == 0 and nonfinite == 0
    return Check(bool(correct), max_abs, rel_fro, logical_poison, pad_poison, nonfinite)


# ---- timing ----------------------------------------------------------------------------------------------------


class Timer(Protocol):
    """Device-side timestamps: `mark` records one on the stream, `wait` blocks (within a limit) until it passes."""

    def mark(self) -> Any: ...

    def elapsed_s(self, start: Any, end: Any) -> float: ...

    def wait(self, mark: Any, limit_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Timing:
    median_s: float
    reps: int
    min_s: float
    max_s: float


def time_launches(
    launch: Callable[[int], None],
    copies: int,
    timer: Timer,
    *,
    warmup: int = 3,
    min_reps: int = 20,
    max_reps: int = 200,
    target_s: float = 0.3,
    limit_s: float = 60.0,
) -> Timing:
    """Median time of `launch(i)`, i cycling over `copies` input sets: warm-up first, then at least `min_reps`
    launches (more when they are quick, up to about `target_s` of device time), each between two marks."""
    for r in range(warmup - 1):
        launch(r % copies)
    start = timer.mark()
    launch((warmup - 1) % copies)
    end = timer.mark()
    timer.wait(end, limit_s)
    once = timer.elapsed_s(start, end)
    reps = max(min_reps, min(max_reps, round(target_s / once) if once > 0 else max_reps))
    marks = []
    for r in range(reps):
        s = timer.mark()
        launch((warmup + r) % copies)
        marks.append((s, timer.mark()))
    timer.wait(marks[-1][1], limit_s + reps * once)
    times = sorted(timer.elapsed_s(s, e) for s, e in marks)
    mid = len(times) // 2
    median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    if median <= 0:
        raise SpatialError(f"the timer measured {median} s; a launch that did nothing?")
    return Timing(median, reps, times[0], times[-1])


def copies_for(set_bytes: int, l2_bytes: int, *, cap_bytes: int = 4 << 30, most: int = 512) -> int:
    """How many input sets to rotate so that one pass over them is at least three times the L2 cache."""
    want = math.ceil(3 * l2_bytes / max(set_bytes, 1))
    return max(2, min(most, want, max(2, cap_bytes // max(set_bytes, 1))))


# ---- the budget loop -------------------------------------------------------------------------------------------


class Deadline:
    """A point on a clock; rows ask how long is left."""

    def __init__(self, at: float, clock: Callable[[], float]):
        self.at, self.clock = at, clock

    def left(self) -> float:
        return self.at - self.clock()

    def passed(self) -> bool:
        return self.left() <= 0


class Runner(Protocol):
    """What runs the rows: the GPU runner, or a fake in tests. `start` may begin work in the background (compiles),
    which must end by the deadline; `close` stops whatever of it is still going."""

    def start(self, cases: Sequence[Case], deadline: Deadline) -> None: ...

    def run(self, case: Case, deadline: Deadline) -> Row: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


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
) -> tuple[list[Row], str]:
    """Run every case within `budget_s` seconds (from `started`), calling `on_row` with the rows so far after each
    and `progress` with `row i/n: precision size, t s so far` as each row starts (main prints it on stderr).

    Returns a row for every case and why the run stopped early: "" (it did not), "lost" (the GPU hung or lost its
    context; the rest are skipped) or "interrupted" (KeyboardInterrupt, which main also raises on SIGTERM)."""
    t0 = clock() if started is None else started
    deadline = Deadline(t0 + budget_s - RESERVE_S, clock)
    rows: list[Row] = []
    lost = ""
    running = False  # a row was started and has not come back
    try:
        runner.start(cases, deadline)
        for case in cases:
            if lost:
                row = _skipped(case, f"not run: {lost}")
            elif deadline.left() < MIN_ROW_S:
                row = _skipped(case, f"not run: time budget of {budget_s:.0f} s spent")
            else:
                running = True
                if progress is not None:
                    progress(
                        f"row {len(rows) + 1}/{len(cases)}: {case.precision} {case.size}, {clock() - t0:.0f} s so far"
                    )
                row, lost = _run_one(case, runner, deadline)
            running = False
            rows.append(row)
            _log_row(log, clock() - t0, row)
            if on_row is not None:
                on_row(rows)
    except KeyboardInterrupt:
        for i, case in enumerate(cases[len(rows) :]):
            rows.append(_skipped(case, "not finished: interrupted" if i == 0 and running else "not run: interrupted"))
        log(f"[{clock() - t0:6.1f} s] interrupted: the rows not finished are marked skipped")
        return rows, "interrupted"
    return rows, "lost" if lost else ""


def _log_row(log: Callable[[str], None], t: float, r: Row) -> None:
    log(f"[{t:6.1f} s] {r.precision} {r.size}: {r.status}" + (f" ({r.note})" if r.note else ""))


def _run_one(case: Case, runner: Runner, deadline: Deadline) -> tuple[Row, str]:
    try:
        return runner.run(case, deadline), ""
    except GpuHung as e:
        return _failed(case, "hung", str(e)), "the GPU hung on an earlier row"
    except GpuLost as e:
        return _failed(case, "error", str(e)), "the CUDA context was lost on an earlier row"
    except BudgetExceeded:
        return _skipped(case, "not finished: time budget spent"), ""
    except Exception as e:  # one broken row must not cost the table
        return _failed(case, "error", one_line(e)), ""


def pending(case: Case) -> Row:
    """A row not reached yet (what the report holds for it until it runs)."""
    return Row(case.precision, case.m, case.n, case.k, status="pending", note="not reached yet")


def _skipped(case: Case, why: str) -> Row:
    return Row(case.precision, case.m, case.n, case.k, status="skipped", note=why)


def _failed(case: Case, status: str, why: str) -> Row:
    return Row(case.precision, case.m, case.n, case.k, status=status, note=why)


def one_line(e: BaseException) -> str:
    """An exception as one short line: its type and first line."""
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else ""
    name = type(e).__name__
    return (f"{name}: {text}" if text and not isinstance(e, SpatialError) else text or name)[:240]


# ---- building (CPU) and the dry run ----------------------------------------------------------------------------


@dataclass
class Built:
    """A case built and lowered (or the reason it was not)."""

    case: Case
    artifact: Any = None
    plan: str = ""
    launch: str = ""
    error: str = ""
    kernel: dict[str, Any] = field(default_factory=dict)  # plan, budget and (once compiled) ptxas numbers


def build_case(case: Case, target: str) -> Built:
    """Build and lower one case on the CPU; errors become text, never exceptions."""
    import spatialc

    built = Built(case)
    try:
        program = spatialc.build(spatialc.gemm(case.m, case.n, case.k, case.precision), target)
        built.plan = describe_plan(program)
        built.kernel = plan_facts(program)
        built.artifact = spatialc.lower(program, target)
        built.launch = describe_launch(built.artifact)
        built.kernel.update(budget_facts(built.artifact))
    except Exception as e:
        built.error = ("lower: " if built.plan else "build: ") + one_line(e)
    return built


def plan_facts(program: Any) -> dict[str, Any]:
    """The plan's numbers for the report: block osh×osw×ibw, sub-blocks, ring depth, sites."""
    p = program.plan
    b = p.block
    return {
        "block": f"{b.osh}×{b.osw}×{b.ibw}",
        "sub_blocks": f"{p.sub_blocks[0]}×{p.sub_blocks[1]}",
        "depth": p.depth,
        "sites": len(program.placement.items_of_site) if program.placement else 0,
    }


def budget_facts(artifact: Any) -> dict[str, Any]:
    """The artifact's budget for the report: threads, blocks per SM, dynamic shared memory, the register estimate."""
    ls, bud = artifact.launch, artifact.budget
    return {
        "threads": ls.block,
        "blocks_per_sm": bud.blocks_per_sm,
        "dyn_smem": ls.dyn_smem,
        "regs_est": bud.regs_est,
    }


def compile_kernel(built: Built, arch: str, timeout_s: float = 300.0) -> None:
    """Compile a built case's kernel with nvcc for `arch` (or take it from the cache) and add what ptxas said of it
    to `built.kernel`: registers per thread, spill stores / loads and static shared memory, in bytes.
    KernelBuildError when nvcc refuses or runs too long."""
    from .runtime import launch

    path = launch.compile_cubin(built.artifact.kernel_cu, arch, timeout_s=timeout_s)
    info = launch.kernel_ptxas(path, built.artifact.launch.kernel_name)
    if info is None:
        built.kernel["ptxas"] = "not reported"
        return
    built.kernel.update(
        registers=info.registers,
        spill_stores=info.spill_stores,
        spill_loads=info.spill_loads,
        static_smem=info.smem,
        stack=info.stack,
    )


def describe_ptxas(kernel: dict[str, Any]) -> str:
    """The ptxas numbers in one line, or why there are none."""
    if "registers" not in kernel:
        return str(kernel.get("ptxas", "—"))
    return (
        f"{kernel['registers']} regs (est {kernel.get('regs_est', '?')}), spills {kernel['spill_stores']}/"
        f"{kernel['spill_loads']} B (st/ld), static smem {kernel['static_smem']} B, stack {kernel['stack']} B"
        + ("  ⚠ spills" if kernel["spill_stores"] or kernel["spill_loads"] else "")
    )


def describe_plan(program: Any) -> str:
    """The plan in one line: block, sub-blocks, item grid, ring depth, sites."""
    p = program.plan
    b = p.block
    sites = len(program.placement.items_of_site) if program.placement else 0
    kind = program.placement.kind if program.placement else "?"
    return (
        f"block {b.osh}×{b.osw}×{b.ibw}, sub {p.sub_blocks[0]}×{p.sub_blocks[1]}, items {p.grid[0]}×{p.grid[1]}, "
        f"depth {p.depth}, {sites} sites ({kind})"
    )


def describe_launch(artifact: Any) -> str:
    """The launch in one line: grid, threads, shared memory, residency."""
    ls, bud = artifact.launch, artifact.budget
    return (
        f"grid {ls.grid} × {ls.block} threads, dyn smem {ls.dyn_smem} B, rings {bud.smem_bytes} B "
        f"({'dynamic' if bud.rings_dynamic else 'static'}), {bud.blocks_per_sm}/SM"
    )


def baselines_for(case: Case) -> list[str]:
    """The baselines a case is timed against, with the reason when one cannot take the shape."""
    if case.precision != "int8":
        return ["cuBLAS torch.matmul", "Triton matmul (if installed)"]
    int_mm = "cuBLAS torch._int_mm"
    if not int_mm_takes(case.m, case.n, case.k):
        int_mm += " (n/a: needs m > 16 and k, n multiples of 8)"
    return [int_mm, "cuBLAS cublasGemmEx NN", "cuBLAS cublasGemmEx TN (Bᵀ stored)", "Triton matmul (if installed)"]


def int_mm_takes(m: int, n: int, k: int) -> bool:
    """torch._int_mm's shape rule."""
    return m > 16 and k % 8 == 0 and n % 8 == 0


def _say(line: str) -> None:
    print(line, flush=True)  # each case as it is built, also through a pipe


def dry_run(cases: Sequence[Case], target: str, out: Callable[[str], None] = _say) -> None:
    """Say what a GPU run would do: each case's plan and launch (built here, on the CPU), what ptxas says of its
    kernel (compiled for `target` when nvcc is here) and its baselines."""
    from .runtime import launch

    nvcc = launch.find_nvcc()
    out(f"gpucheck dry run: {len(cases)} rows on {target}; would write gpucheck.json and gpucheck.md")
    for case in cases:
        built = build_case(case, target)
        if built.artifact is not None:
            if nvcc is None:
                built.kernel["ptxas"] = "no nvcc here"
            else:
                try:
                    compile_kernel(built, target)
                except launch.KernelBuildError as e:
                    built.kernel["ptxas"] = f"compile: {e}"
        out(f"{case.precision} {case.size}")
        out(f"  plan      {built.plan or '—'}")
        out(f"  launch    {built.launch or built.error}")
        if built.artifact is not None:
            out(f"  ptxas     {describe_ptxas(built.kernel)}")
        out(f"  baselines {'; '.join(baselines_for(case))}")


# ---- the command line ------------------------------------------------------------------------------------------


def git_commit() -> str:
    """The spatialc checkout's commit (with `+dirty`), or `unknown` where there is no git."""
    root = Path(__file__).resolve().parents[2]
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = _Parser(prog="spatialc gpucheck", description=__doc__.splitlines()[0])
    ap.add_argument("outdir", help="where gpucheck.json and gpucheck.md go (created; rewritten after every row)")
    ap.add_argument("--budget", type=_budget, default=DEFAULT_BUDGET_S, help="seconds for the whole run (420)")
    ap.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), help="N (for N³) or MxNxK, several")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), help=f"of {', '.join(PRECISIONS)}")
    ap.add_argument("--target", default=None, help="spatialc target (default: from the GPU; sm_90 in a dry run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton baseline")
    ap.add_argument("--commit", default=None, help="the commit to record (default: git's)")
    ap.add_argument("--dry-run", action="store_true", help="list what would run, build the plans, and exit")
    return ap.parse_args(argv)


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


def open_outdir(outdir: str | Path, header: dict[str, Any], cases: Sequence[Case]) -> None:
    """Create OUTDIR and write the report with every row pending: the proof that the results will have a place."""
    try:
        write_report(outdir, header, [pending(c) for c in cases])
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
    dry = shlex.join(["spatialc", "gpucheck", *argv, "--dry-run"])
    return f"{why}; `{dry}` lists what a GPU run would do"


STATE = {"": "complete", "lost": "stopped: the GPU was lost", "interrupted": "stopped: interrupted"}


def main(argv: Sequence[str] | None = None, make_runner: Callable[..., Any] | None = None) -> int:
    """The GPU check's entry point (`spatialc gpucheck …` calls this; tests pass a fake `make_runner`)."""
    started = time.monotonic()
    try:
        args = parse_args(argv)
        cases = cases_of(args.sizes, args.precisions)
        if args.target is not None:
            from .target import target

            target(args.target)
        if not args.dry_run:
            check_outdir(args.outdir)
    except SpatialError as e:
        print(f"gpucheck: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        dry_run(cases, args.target or "sm_90")
        return 0
    from .runtime.launch import GpuUnavailable

    try:
        if make_runner is None:
            from .gpucheck_gpu import GpuRunner as make_runner
        runner = make_runner(args.target, seed=args.seed, triton=not args.no_triton)
    except GpuUnavailable as e:
        print(f"gpucheck: {no_gpu(e, sys.argv[1:] if argv is None else argv)}", file=sys.stderr)
        return 2
    header = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "state": "running (pending rows not reached yet)",
        "commit": args.commit or git_commit(),
        "budget_s": args.budget,
        **runner.info(),
    }
    try:
        open_outdir(args.outdir, header, cases)
    except SpatialError as e:
        runner.close()
        print(f"gpucheck: {e}", file=sys.stderr)
        return 2
    print(
        f"gpucheck: {header.get('gpu')} · {header.get('sms')} SMs · {header.get('clocks')} · target "
        f"{header.get('target')} · commit {header['commit']}",
        flush=True,
    )
    save = _Saver(args.outdir, header, cases, started)
    old_handler = _sigterm_interrupts()
    try:
        rows, stop = run_all(
            cases,
            runner,
            budget_s=args.budget,
            started=started,
            log=lambda s: print(s, flush=True),
            on_row=save,
            progress=lambda s: print(f"gpucheck: {s}", file=sys.stderr, flush=True),
        )
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        runner.close()
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


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # `python -m spatialc.gpucheck OUTDIR --dry-run | head`: end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None

"""Running an emulation binary: its input files written, its stderr streamed (progress lines to a callback), its
exit status turned into the typed error it stands for, and its printed values read back."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ProgramError
from .emu_compile import binary_mode
from .emu_errors import EmulationDeadlock, EmulationError, EmulationFault, EmulationRace, EmulationTimeout

# Exit statuses the emulator ends a run with (emu_core.h), and the host code's own (kernel-abi.md §10).
EXIT_RACE, EXIT_DEADLOCK, EXIT_TIMEOUT, EXIT_MISUSE = 86, 87, 88, 89
EXIT_CUDA, EXIT_INPUT = 1, 2

# `progress(done, total)`: blocks of the running launch done so far (emu_runtime.h, report_blocks).
Progress = Callable[[int, int], None]
PROGRESS_LINE = re.compile(r"spatialc-emu progress (\d+) (\d+)")

# What the files a run is given may be called: names in its own folder, never a path out of it ("../x", "/etc/x").
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


# ---- running --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """What one emulated run printed, and how long it took."""

    stdout: str
    stderr: str
    seconds: float


_BY_STATUS: dict[int, type[EmulationError]] = {
    EXIT_RACE: EmulationRace,
    EXIT_DEADLOCK: EmulationDeadlock,
    EXIT_TIMEOUT: EmulationTimeout,
}


def _report(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("spatialc-emu")]
    return "\n".join(lines) or stderr.strip()[-2000:] or "(no message)"


DEFAULT_TIMEOUT_S = 120.0  # an emulated run's wall-clock limit, unless the caller or SPATIALC_EMU_TIMEOUT_S gives one


def timeout_seconds(timeout: float | None) -> float:
    """The wall-clock limit of a run: `timeout`, or where None, SPATIALC_EMU_TIMEOUT_S from the environment, or
    DEFAULT_TIMEOUT_S; ProgramError for one that is no positive number of seconds."""
    if timeout is None:
        text = os.environ.get("SPATIALC_EMU_TIMEOUT_S", "").strip()
        if not text:
            return DEFAULT_TIMEOUT_S
        try:
            timeout = float(text)
        except ValueError:
            timeout = float("nan")
        if not 0 < timeout < float("inf"):
            raise ProgramError(
                f"SPATIALC_EMU_TIMEOUT_S is the emulation's limit in seconds, a positive number, not {text!r}"
            )
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
        raise ProgramError(f"timeout is the emulation's watchdog in seconds, a positive number, not {timeout!r}")
    return float(timeout)


def run_program(
    binary: Path,
    files: Mapping[str, str | np.ndarray],
    timeout: float | None = None,
    *,
    progress: Progress | None = None,
    sms: int | None = None,
    tensors: str | None = None,
) -> Run:
    """Run `binary` in a fresh folder holding `files` (name → text, or values `write_values` writes); its stdout, or
    the typed error it ended with.
    `tensors` (`tensor_spec`) names the launch's tensor arguments for the emulator's checks and poisons its outputs.

    The run may take `timeout` seconds (`timeout_seconds`: None is SPATIALC_EMU_TIMEOUT_S, or 120). The emulator
    reports the blocks done as it goes; `progress(done, total)` is called (from a reader thread) as each report
    arrives; those lines are kept out of `Run.stderr` and out of the errors. A callback that raises stops the run,
    and its exception is raised here. A run whose pace says it would take more than twice its limit is stopped then,
    and one past its limit still running says how far it got (EmulationTimeout, with how to give it longer)."""
    limit = timeout_seconds(timeout)
    for name in files:
        if not isinstance(name, str) or _FILE_NAME.fullmatch(name) is None:
            raise ProgramError(
                f"input file name {ascii(name)}: a plain file name (letters, digits, _ . -, not starting with a dot)"
                " inside the run's folder, never a path"
            )
    with tempfile.TemporaryDirectory(prefix="spatialc-run-") as tmp:
        for name, text in files.items():
            if isinstance(text, str):
                Path(tmp, name).write_text(text)
            else:
                write_values(Path(tmp, name), text)
        env = dict(os.environ, SPATIALC_EMU_TIMEOUT_S=repr(limit))
        mode = binary_mode(Path(binary))
        if mode is not None:  # the mode compile_program named the binary for; else the caller's environment's
            env["SPATIALC_EMU_MODE"] = mode
        env["SPATIALC_EMU_PROGRESS"] = "1"  # the pace, for the projection and a timeout's message
        if sms is not None:  # the emulated device's multiprocessors (default 132): a kernel's sites follow them
            env["SPATIALC_EMU_SMS"] = str(sms)
        env.pop("SPATIALC_EMU_TENSORS", None)
        if tensors:
            env["SPATIALC_EMU_TENSORS"] = tensors
        t0 = time.perf_counter()
        status, stdout, stderr, (pace, need) = _watched([str(binary)], tmp, env, limit + 15, progress, limit)
        seconds = time.perf_counter() - t0
    if status == 0:
        return Run(stdout, stderr, seconds)
    if status < 0:
        raise EmulationFault(
            f"the emulated run died of signal {-status}: {_report(stderr)}", stderr=stderr, status=status
        )
    kind = _BY_STATUS.get(status, EmulationFault)
    prefix = {EXIT_CUDA: "a CUDA error: ", EXIT_INPUT: "a missing or short input file: "}.get(status, "")
    report = _report(stderr)
    if status == EXIT_TIMEOUT and "passed its wall-clock limit" in report:
        # still running at its limit: how far it got says more than where its threads were at that moment
        report = (
            f"{report.split(': TIMEOUT:')[0]}: TIMEOUT: the emulation passed its limit of {limit:g} s still running"
            + (f" ({pace})" if pace else "")
            + f". {more_time(limit, need)}"
            + ("" if pace else f". Where its threads were:{report.split('(SPATIALC_EMU_TIMEOUT_S).', 1)[-1]}")
        )
    raise kind(f"{prefix}{report}", stderr=stderr, status=status)


class _StderrReader(threading.Thread):
    """Reads a child's stderr as it comes: progress lines go to the callback, every other line is kept. From the
    progress lines it keeps the pace (`pace`), and stops a run whose launch, at that pace, would take more than
    PROJECTED_PAST times its wall-clock `limit` (`projected`)."""

    def __init__(self, proc: subprocess.Popen[str], progress: Progress | None, limit: float | None = None):
        super().__init__(daemon=True)
        self.proc, self.progress, self.limit = proc, progress, limit
        self.lines: list[str] = []
        self.failure: BaseException | None = None  # what the callback raised, or the projection; the run is stopped
        self.started = time.perf_counter()
        self.launch_at = self.started  # when the running launch reported its first line (0 blocks done)
        self.latest: tuple[int, int, float] | None = None  # blocks done, of how many, seconds since the start

    def run(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            found = PROGRESS_LINE.fullmatch(line.rstrip("\n"))
            if found is None:
                self.lines.append(line)
                continue
            done, total = int(found.group(1)), int(found.group(2))
            now = time.perf_counter()
            if done == 0:
                self.launch_at = now
            self.latest = (done, total, now - self.started)
            if self.failure is not None:
                continue
            if self.progress is not None:
                try:
                    self.progress(done, total)
                except Exception as e:  # handed to the caller's thread, which raises it
                    self.failure = e
                    self.proc.kill()
                    continue
            self.failure = self.projected(done, total, now)
            if self.failure is not None:
                self.proc.kill()

    def projected(self, done: int, total: int, now: float) -> EmulationTimeout | None:
        """An EmulationTimeout where the launch, at the pace of its blocks done so far, would end past PROJECTED_PAST
        times the limit (after PROJECT_AFTER_S of it at least: a first block's pace may include warming up)."""
        spent = now - self.launch_at
        if self.limit is None or not 0 < done < total or spent < PROJECT_AFTER_S:
            return None
        finish = (self.launch_at - self.started) + spent / done * total
        if finish <= PROJECTED_PAST * self.limit:
            return None
        return EmulationTimeout(
            f"TIMEOUT: stopped early — at the pace of its first {done} of {total} blocks ({spent / done:.2g} s a"
            f" block) the emulation would take about {duration_text(finish)}, past its limit of {self.limit:g} s. "
            + more_time(self.limit, finish)
        )

    def pace(self) -> tuple[str, float | None]:
        """The progress made, for a timeout's message — `14 of 16 blocks of the launch done, about 8.6 s a block`,
        or '' — and the run's time at that pace (None without a block done)."""
        if self.latest is None or self.latest[0] == 0:
            return "", None
        done, total, _ = self.latest
        now = time.perf_counter()
        each = (now - self.launch_at) / done
        finish = (self.launch_at - self.started) + each * total
        return f"{done} of {total} blocks of the launch done, about {each:.2g} s a block", finish


PROJECT_AFTER_S = 5.0  # seconds of a launch before its pace is taken as what the rest will take
PROJECTED_PAST = 2.0  # a launch projected past this many times the limit is stopped at once, not at the limit


def duration_text(seconds: float) -> str:
    """A time in words for a message: whole seconds below two minutes, whole minutes above."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def more_time(limit: float, need: float | None = None) -> str:
    """How to give an emulation longer, in words: half as long again as it would `need` at its pace, if known."""
    more = max(2 * limit, math.ceil(1.5 * need / 10) * 10) if need is not None else max(2 * limit, 300)
    return (
        f"Give it longer (emulate(..., timeout={more:g}); on the command line --timeout {more:g}, or"
        f" SPATIALC_EMU_TIMEOUT_S={more:g}), or emulate a smaller size"
    )


def _watched(
    cmd: list[str],
    cwd: str,
    env: dict[str, str],
    kill_after: float,
    progress: Progress | None,
    limit: float | None = None,
) -> tuple[int, str, str, tuple[str, float | None]]:
    """Run `cmd` to its end, streaming its stderr: (status, stdout, stderr without progress lines, the pace it kept
    — `_StderrReader.pace`). Killed after `kill_after` seconds (EmulationTimeout), when its pace goes past its
    `limit` (`_StderrReader.projected`), or when the caller stops waiting (an interrupt)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    out_reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
    err_reader = _StderrReader(proc, progress, limit)
    out_reader.start()
    err_reader.start()
    # Waited for without a timeout, which returns as the process ends (a wait with one polls, and a run's end is
    # seen up to 50 ms late); a timer kills a run still going after `kill_after` seconds. The timer may fire just as
    # the process ends by itself, finding nothing to kill: only a run that died of the kill counts as killed.
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(kill_after, kill)
    timer.daemon = True
    timer.start()
    try:
        status = proc.wait()
        if killed.is_set() and status == -signal.SIGKILL:
            raise EmulationTimeout(
                f"TIMEOUT: the emulated run was killed after {kill_after:g} s (its own watchdog did not end it)"
            )
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out_reader.join()
        err_reader.join()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    if err_reader.failure is not None:
        raise err_reader.failure
    return status, "".join(out), "".join(err_reader.lines), err_reader.pace()


def parse_output(stdout: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """The printed values (one a line, row-major) as an array of `shape`."""
    words = stdout.split()
    need = int(np.prod(shape))
    if len(words) != need:
        raise EmulationFault(f"the program printed {len(words)} values; C has {need} ({'×'.join(map(str, shape))})")
    if np.dtype(dtype).kind in "iu":
        return np.array([int(w) for w in words], dtype=dtype).reshape(shape)
    return np.array(words, dtype=np.float64).astype(dtype).reshape(shape)


VALUES_CHUNK = 1 << 20  # values formatted at a time: a file of any size is written in bounded memory


def write_values(path: Path, values: np.ndarray) -> None:
    """`values` as `format_values` writes them, into `path`, a chunk at a time (never the whole text at once)."""
    flat = np.asarray(values).ravel()
    with path.open("w") as f:
        for start in range(0, flat.size, VALUES_CHUNK):
            f.write(format_values(flat[start : start + VALUES_CHUNK]))


def format_values(values: np.ndarray) -> str:
    """Whitespace-separated numbers in row-major order, exact: integers as integers, floats round-trip."""
    flat = np.asarray(values).ravel()
    if flat.dtype.kind in "iub":
        return "\n".join(map(str, flat.astype(np.int64).tolist())) + "\n"
    return "\n".join(repr(float(v)) for v in flat.astype(np.float64).tolist()) + "\n"

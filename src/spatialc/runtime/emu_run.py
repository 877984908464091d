"""Running an emulation binary: its input files written, its stderr streamed (progress lines to a callback), its
exit status turned into the typed error it stands for, and its printed values read back."""

from __future__ import annotations

import os
import re
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


def run_program(
    binary: Path,
    files: Mapping[str, str | np.ndarray],
    timeout: float = 120.0,
    *,
    progress: Progress | None = None,
    sms: int | None = None,
    tensors: str | None = None,
) -> Run:
    """Run `binary` in a fresh folder holding `files` (name → text, or values `write_values` writes); its stdout, or
    the typed error it ended with.
    `tensors` (`tensor_spec`) names the launch's tensor arguments for the emulator's checks and poisons its outputs.

    With `progress`, the emulator reports blocks done and `progress(done, total)` is called (from a reader thread)
    as each report arrives; those lines are kept out of `Run.stderr` and out of the errors. A callback that raises
    stops the run, and its exception is raised here."""
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
        env = dict(os.environ, SPATIALC_EMU_TIMEOUT_S=str(timeout))
        mode = binary_mode(Path(binary))
        if mode is not None:  # the mode compile_program named the binary for; else the caller's environment's
            env["SPATIALC_EMU_MODE"] = mode
        env.pop("SPATIALC_EMU_PROGRESS", None)
        if progress is not None:
            env["SPATIALC_EMU_PROGRESS"] = "1"
        if sms is not None:  # the emulated device's multiprocessors (default 132): a kernel's sites follow them
            env["SPATIALC_EMU_SMS"] = str(sms)
        env.pop("SPATIALC_EMU_TENSORS", None)
        if tensors:
            env["SPATIALC_EMU_TENSORS"] = tensors
        t0 = time.perf_counter()
        status, stdout, stderr = _watched([str(binary)], tmp, env, timeout + 15, progress)
        seconds = time.perf_counter() - t0
    if status == 0:
        return Run(stdout, stderr, seconds)
    if status < 0:
        raise EmulationFault(
            f"the emulated run died of signal {-status}: {_report(stderr)}", stderr=stderr, status=status
        )
    kind = _BY_STATUS.get(status, EmulationFault)
    prefix = {EXIT_CUDA: "a CUDA error: ", EXIT_INPUT: "a missing or short input file: "}.get(status, "")
    raise kind(f"{prefix}{_report(stderr)}", stderr=stderr, status=status)


class _StderrReader(threading.Thread):
    """Reads a child's stderr as it comes: progress lines go to the callback, every other line is kept."""

    def __init__(self, proc: subprocess.Popen[str], progress: Progress | None):
        super().__init__(daemon=True)
        self.proc, self.progress = proc, progress
        self.lines: list[str] = []
        self.failure: BaseException | None = None  # what the callback raised; the run is stopped

    def run(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            found = PROGRESS_LINE.fullmatch(line.rstrip("\n"))
            if found is None:
                self.lines.append(line)
            elif self.progress is not None and self.failure is None:
                try:
                    self.progress(int(found.group(1)), int(found.group(2)))
                except Exception as e:  # handed to the caller's thread, which raises it
                    self.failure = e
                    self.proc.kill()


def _watched(
    cmd: list[str], cwd: str, env: dict[str, str], kill_after: float, progress: Progress | None
) -> tuple[int, str, str]:
    """Run `cmd` to its end, streaming its stderr: (status, stdout, stderr without progress lines). Killed after
    `kill_after` seconds (EmulationTimeout), or when the caller stops waiting (an interrupt)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    out_reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
    err_reader = _StderrReader(proc, progress)
    out_reader.start()
    err_reader.start()
    try:
        status = proc.wait(timeout=kill_after)
    except subprocess.TimeoutExpired as e:
        raise EmulationTimeout(
            f"TIMEOUT: the emulated run was killed after {kill_after:.0f} s (its own watchdog did not end it)"
        ) from e
    finally:
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
    return status, "".join(out), "".join(err_reader.lines)


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

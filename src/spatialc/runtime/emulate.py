"""Run an emitted CUDA program on the CPU: the host emulation of DESIGN.md §5.3.

The exact `program_cu` text is compiled by g++ against `runtime/emu/*.h` (one real thread per CUDA thread, block
and warp barriers, ldmatrix / mma.sync fragments, cp.async copies that land late or early, a race check on shared
memory) after two rewrites and nothing else: the launch `k<<<g, b[, s]>>>(args);` becomes a call, and the dynamic shared
declaration becomes a pointer to the emulator's block. Binaries are cached by the hash of what built them.

A run can report progress: given a `progress(done, total)` callback, the runner asks the emulator for its
`spatialc-emu progress <done> <total>` lines (blocks of the launch done so far, a few a second) and calls it as
they arrive; `stderr_progress` is a ready-made one that keeps a line on a terminal up to date.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import ProgramError, SpatialError
from ..inputs import check_inputs, check_row_counts
from ..lower.artifact import operand_files
from .cache import cache_dir as cache_of
from .tilize import element_type, launch_specs, poison_value, storage_dtype

__all__ = [
    "EmulationCompileError",
    "EmulationDeadlock",
    "EmulationError",
    "EmulationFault",
    "EmulationRace",
    "EmulationTimeout",
    "MODES",
    "Progress",
    "StderrProgress",
    "compile_program",
    "emulate",
    "emulate_source",
    "host_source",
    "run_program",
    "stderr_progress",
]

HEADER_DIR = Path(__file__).parent / "emu"
MODES = ("late", "early")
# -ffp-contract=off: no multiply and add fused into one rounding, on any host (the kernel's float arithmetic is
# printed so that nvcc fuses none either), as numpy rounds each.
CXX_FLAGS = ("-std=c++20", "-O2", "-pthread", "-ffp-contract=off")

DYN_DECL = "extern __shared__ __align__(32) char spatialc_dyn_smem[];"
# The declaration as earlier kernels printed it (16-byte aligned); still recognised, so saved .cu files run.
DYN_DECLS = (
    DYN_DECL,
    "extern __shared__ __align__(16) char spatialc_dyn_smem[];",
    "extern __shared__ __align__(1024) char spatialc_dyn_smem[];",  # the sm_90a form's swizzled stages
)
DYN_HOST = "char* spatialc_dyn_smem = ::spatialc_emu::dynamic_shared();"
LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*<<<([^;<>]*?)>>>\s*\(")

# Exit statuses the emulator ends a run with (emu_core.h), and the host code's own (kernel-abi.md §10).
EXIT_RACE, EXIT_DEADLOCK, EXIT_TIMEOUT, EXIT_MISUSE = 86, 87, 88, 89
EXIT_CUDA, EXIT_INPUT = 1, 2
OUTPUT_DTYPES = {"signed char": np.int8, "int": np.int32, "long long": np.int64, "__half": np.float16}

# `progress(done, total)`: blocks of the running launch done so far (emu_runtime.h, report_blocks).
Progress = Callable[[int, int], None]
PROGRESS_LINE = re.compile(r"spatialc-emu progress (\d+) (\d+)")


class EmulationError(SpatialError):
    """The emulation could not produce C: `kind` says why, the message carries the emulator's own words."""

    kind = "failed"

    def __init__(self, message: str, *, stderr: str = "", status: int | None = None):
        super().__init__(message)
        self.stderr = stderr
        self.status = status


class EmulationCompileError(EmulationError):
    """g++ refused the program text (the message holds the first errors)."""

    kind = "compile"


class EmulationRace(EmulationError):
    """Two threads touched the same shared bytes in one barrier interval; the message names ring, slot, threads."""

    kind = "race"


class EmulationDeadlock(EmulationError):
    """Every live thread waits at a barrier that can never complete."""

    kind = "deadlock"


class EmulationTimeout(EmulationError):
    """The run passed its wall-clock limit or stopped making progress."""

    kind = "timeout"


class EmulationFault(EmulationError):
    """Anything else: a CUDA error, a missing input, a misuse of an emulated primitive, output of the wrong size."""

    kind = "fault"


class EmulationTooLarge(EmulationError):
    """A run whose tensors would take more memory than it may use: refused before anything is written or run."""

    kind = "too large"


# ---- the text rewrite -------------------------------------------------------------------------------------------


def host_source(program_cu: str) -> str:
    """The text g++ compiles: the launches and the dynamic shared declaration rewritten, every other byte kept."""
    lines = program_cu.split("\n")
    for i, line in enumerate(lines):
        if line.strip() in DYN_DECLS:
            lines[i] = line[: len(line) - len(line.lstrip())] + DYN_HOST
    text = LAUNCH.sub(r"::spatialc_emu::launch(\1, \2)(", "\n".join(lines))
    if "<<<" in text or ">>>" in text:
        bad = next(n for n, line in enumerate(text.split("\n"), 1) if "<<<" in line or ">>>" in line)
        raise EmulationFault(
            f"line {bad}: a kernel launch the emulation cannot rewrite "
            "(expected one statement `kernel<<<grid, block[, smem]>>>(args…);`)"
        )
    return text


# ---- compiling, with a cache ---------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where the emulation's binaries are kept: `emu` under spatialc's cache root (runtime/cache.py), made here."""
    return cache_of("emu", create=True)


@cache
def _compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx:
        raise EmulationCompileError("the host emulation needs g++ (C++20) on PATH, or CXX naming it")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    return cxx, version.split("\n", 1)[0]


def _headers() -> list[Path]:
    return sorted(HEADER_DIR.glob("*.h"))


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise EmulationFault(f"unknown emulation mode {mode!r}; use one of {', '.join(MODES)}")


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:24]


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _gxx(args: list[str], what: str) -> None:
    cxx, _ = _compiler()
    done = subprocess.run([cxx, *args], capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line][:12]
        excerpt = "\n".join(errors) or done.stderr[-3000:]
        raise EmulationCompileError(
            f"g++ could not compile {what}:\n{excerpt}", stderr=done.stderr, status=done.returncode
        )


def _flags(mode: str) -> list[str]:
    return [*CXX_FLAGS, f"-DSPATIALC_EMU_MODE={mode}", "-DSPATIALC_EMU_LINKED"]


def _prepared(mode: str) -> Path:
    """A folder holding the headers, their precompiled form and the emulator's runtime object for `mode`.

    Programs then compile only their own code (about a second) and link the runtime, instead of compiling the
    emulator's threads, barriers and race check every time.
    """
    headers = _headers()
    folder = _runtime_folder(mode)
    if (folder / "runtime.o").exists():
        return folder
    with _lock(str(folder)):
        if (folder / "runtime.o").exists():
            return folder
        tmp = Path(tempfile.mkdtemp(prefix="rt-", dir=cache_dir()))
        try:
            for h in headers:
                shutil.copy2(h, tmp / h.name)
            header, flags = str(tmp / "cuda_emu.h"), _flags(mode)
            _gxx([*flags, "-x", "c++-header", header, "-o", f"{header}.gch"], "the emulation header")
            impl = ["-DSPATIALC_EMU_IMPLEMENTATION", "-x", "c++", "-c", header]
            _gxx([*flags, *impl, "-o", str(tmp / "runtime.o")], "the emulation runtime")
            tmp.rename(folder)
        except OSError:  # another process got there first
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _runtime_folder(mode: str) -> Path:
    """Where `_prepared` keeps the runtime of `mode`: named by the compiler, the flags and the headers' text."""
    headers = _headers()
    key = _digest(_compiler()[1], mode, *CXX_FLAGS, *(h.name.encode() + h.read_bytes() for h in headers))
    return cache_dir() / f"rt-{mode}-{key}"


def _binary_path(rt: Path, program_cu: str, mode: str) -> Path:
    return cache_dir() / f"prog-{mode}-{_digest(rt.name, host_source(program_cu))}"


def is_compiled(program_cu: str, mode: str = "late") -> bool:
    """Whether `compile_program` would find `program_cu`'s binary in the cache (else g++ takes seconds first)."""
    _check_mode(mode)
    rt = _runtime_folder(mode)
    return (rt / "runtime.o").exists() and _binary_path(rt, program_cu, mode).exists()


def compile_program(program_cu: str, mode: str = "late") -> Path:
    """The emulation binary of `program_cu` in `mode`, compiled once and cached by source, mode and header hash."""
    _check_mode(mode)
    source = host_source(program_cu)
    rt = _prepared(mode)
    binary = _binary_path(rt, program_cu, mode)
    if binary.exists():
        return binary
    with _lock(str(binary)):
        if binary.exists():
            return binary
        with tempfile.TemporaryDirectory(prefix="spatialc-emu-") as tmp:
            src = Path(tmp) / "program.cpp"
            src.write_text(source)
            out = Path(tmp) / "program"
            use_rt = ["-Winvalid-pch", "-I", str(rt), "-include", "cuda_emu.h"]
            sources = ["-x", "c++", str(src), "-x", "none", str(rt / "runtime.o")]
            _gxx([*_flags(mode), *use_rt, *sources, "-o", str(out)], "the program")
            os.replace(out, binary)
    return binary


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


MAX_SMS = 1 << 16  # far beyond any GPU's multiprocessors: an emulated device of more is a mistake


def check_run_options(timeout: Any, sms: Any) -> None:
    """ProgramError for a watchdog that is not a positive number of seconds, or a device whose multiprocessors are
    not a whole number from 1 to MAX_SMS — before anything is compiled (the emulator itself would take 0 or -1 for
    its default of 132 without a word)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
        raise ProgramError(f"timeout is the emulation's watchdog in seconds, a positive number, not {timeout!r}")
    if sms is not None and (isinstance(sms, bool) or not isinstance(sms, int | np.integer) or not 1 <= sms <= MAX_SMS):
        raise ProgramError(
            f"sms is the emulated device's multiprocessors, a whole number from 1 to {MAX_SMS}, not {sms!r}"
        )


def emulate_source(
    program_cu: str,
    files: Mapping[str, str | np.ndarray],
    out_shape: tuple[int, ...],
    out_dtype: np.dtype | type = np.float32,
    *,
    mode: str = "late",
    timeout: float = 120.0,
    progress: Progress | None = None,
    sms: int | None = None,
    tensors: str | None = None,
) -> np.ndarray:
    """Compile and run any program text that follows kernel-abi.md; `files` are its input files (name → values).
    `progress(done, total)` hears of the blocks done as the run goes (see `run_program`); `sms` is the emulated
    device's multiprocessor count (132 when None); `tensors` names the kernel's tensor arguments (`tensor_spec`)."""
    check_run_options(timeout, sms)
    texts = {name: v if isinstance(v, str) else np.asarray(v) for name, v in files.items()}
    note = getattr(progress, "note", None)
    if note is not None and not is_compiled(program_cu, mode):  # the first run of a kernel text waits on g++
        note("compiling the emulation with g++ (seconds, once for each kernel text: cached)")
    run = run_program(compile_program(program_cu, mode), texts, timeout, progress=progress, sms=sms, tensors=tensors)
    return parse_output(run.stdout, out_shape, out_dtype)


# What the files a run is given may be called: names in its own folder, never a path out of it ("../x", "/etc/x").
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")

EMULATION_MAX_BYTES = 2 << 30  # what an emulated run may take by default, as the interpreter's evaluate
_C_BYTES = {
    "signed char": 1,
    "__nv_fp8_e4m3": 1,
    "__nv_fp8_e5m2": 1,
    "__half": 2,
    "__nv_bfloat16": 2,
    "float": 4,
    "int": 4,
    "long long": 8,
}


def emulation_bytes(launch) -> int:
    """About the memory an emulated run of `launch` takes, from its tensors alone: each input or parameter read into
    doubles, tilized and copied to the device; each output or workspace on the device, with 16 bytes an element
    for the emulator's checks of global memory, and C copied back, printed and parsed (about 80 bytes a value)."""
    total = 0
    for q in launch.params:
        padded = q.tiles[0] * q.tiles[1] * 256
        logical = int(getattr(q, "groups", 1)) * q.elems[0] * q.elems[1]
        elem = _C_BYTES.get(q.c_type, 8)
        if q.role in ("output", "workspace"):
            total += (elem + 16) * padded + ((elem * padded + 80 * logical) if q.role == "output" else 0)
        else:
            total += 8 * logical + 2 * elem * padded
    return total


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


# The OS threads a cooperative launch may start at once (one per CUDA thread of every block): about what a Linux
# machine gives a process before thread creation fails for stacks and process limits.
COOPERATIVE_THREADS = 16384


def _input_files(artifact, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The program's input files (name → values), from `inputs` checked as the interpreter checks them."""
    values = check_inputs("this kernel", launch_specs(artifact.launch), inputs)
    check_row_counts(dict(getattr(artifact.launch, "row_counts", ())), values)
    # Files by the tensors' positions (an MLP's X, W1, W2 are a.txt, b.txt and c.txt), never by their names.
    files = operand_files([q.role for q in artifact.launch.params])
    return {file: values[q.name] for q, file in zip(artifact.launch.params, files, strict=True) if file is not None}


def emulate(
    artifact,
    inputs: Mapping[str, Any],
    mode: str = "late",
    timeout: float = 120.0,
    *,
    progress: Progress | None = None,
    sms: int | None = None,
    max_bytes: int = EMULATION_MAX_BYTES,
) -> np.ndarray | dict[str, np.ndarray]:
    """C of `artifact.program_cu` on `inputs` (tensor name → array), run through the host emulation in `mode`, on an
    emulated device of `sms` multiprocessors (132 when None: the work list follows them, as on a GPU). A run that
    would take more than `max_bytes` of memory (`emulation_bytes`) is refused first (EmulationTooLarge).

    C has the interpreter's type for the output: int8, int32 or int64; float32, float16 (fp16) or float32 holding bf16
    values. A program of several outputs (LayerNorm's out, mean and rstd) gives a dict name → array, as
    `spatialc.evaluate` does. Inputs are checked as
    `spatialc.evaluate` checks them (InputError). Raises an EmulationError subclass naming a race, a deadlock, a
    timeout, a compile error or a CUDA error when the run does not finish cleanly. `progress(done, total)` is
    called with the blocks done as the run goes (`stderr_progress()` makes one that shows them on a terminal).
    """
    out = next((p for p in artifact.launch.params if p.role == "output"), None)
    if out is None:
        raise EmulationFault("the artifact's launch names no output tensor")
    need = emulation_bytes(artifact.launch)
    if need > max_bytes:
        raise EmulationTooLarge(
            f"emulating this kernel takes about {_gib(need)} (its tensors read as text, tilized and copied to the"
            f" emulated device, C printed and read back), more than {_gib(max_bytes)}: emulate a smaller size (the"
            " emulation runs each CUDA thread as a thread of this machine), run it on a GPU, or, where this machine"
            " has the memory, raise spatialc.emulate's max_bytes"
        )
    # A cooperative launch runs every site at once; a cluster launch one cluster at a time (its sites wait only on
    # each other).
    cluster = getattr(artifact.launch, "cluster", 1)
    threads = (cluster if cluster > 1 else artifact.launch.grid) * artifact.launch.block
    together = getattr(artifact.launch, "cooperative", False) or cluster > 1
    if together and threads > COOPERATIVE_THREADS:
        raise EmulationFault(
            f"the {artifact.launch.grid} sites of this kernel wait on each other, so the emulation runs them all at"
            f" once: {threads} threads, more than the {COOPERATIVE_THREADS} it starts at a time; emulate the program"
            " with fewer sites that wait on each other (a split-K program: a smaller split_k; a multicast one:"
            " fewer sites)"
        )
    # The interpreter's types for the same output: fp16 as float16, bf16 as its values in float32.
    dtype = OUTPUT_DTYPES.get(out.c_type, np.float32)
    files = _input_files(artifact, inputs)
    outs = [q for q in artifact.launch.params if q.role == "output"]
    if len(outs) > 1:  # several outputs (LayerNorm's out, mean, rstd): printed one after another, each by name
        text = _emulated_text(artifact, files, mode, timeout, progress, sms)
        return _outputs(text, outs)
    groups = int(getattr(out, "groups", 1))
    shape = (groups, *out.elems) if groups > 1 else tuple(out.elems)
    c = emulate_source(
        artifact.program_cu,
        files,
        shape,
        dtype,
        mode=mode,
        timeout=timeout,
        progress=progress,
        sms=sms,
        tensors=tensor_spec(artifact.launch),
    )
    return _rows_past_counts(artifact.launch, out, inputs, c)


def _emulated_text(artifact, files, mode: str, timeout: float, progress: Progress | None, sms: int | None) -> str:
    """What the artifact's program_cu prints, run through the emulation (`emulate_source` without the parse)."""
    check_run_options(timeout, sms)
    note = getattr(progress, "note", None)
    if note is not None and not is_compiled(artifact.program_cu, mode):
        note("compiling the emulation with g++ (seconds, once for each kernel text: cached)")
    texts = {name: np.asarray(v) for name, v in files.items()}
    binary = compile_program(artifact.program_cu, mode)
    run = run_program(binary, texts, timeout, progress=progress, sms=sms, tensors=tensor_spec(artifact.launch))
    return run.stdout


def _outputs(stdout: str, outs: list[Any]) -> dict[str, np.ndarray]:
    """Each output of a program that prints several, one after another in launch order, by name."""
    words = stdout.split()
    # A grouped output (attention's O and LSE, a head after another) is printed group after group: (groups, *elems).
    shapes = [((int(getattr(q, "groups", 1)),) if getattr(q, "groups", 1) > 1 else ()) + tuple(q.elems) for q in outs]
    sizes = [int(np.prod(shape)) for shape in shapes]
    if len(words) != sum(sizes):
        said = ", ".join(f"{q.name} {'×'.join(map(str, shape))}" for q, shape in zip(outs, shapes, strict=True))
        raise EmulationFault(f"the program printed {len(words)} values; its outputs have {sum(sizes)} ({said})")
    found, at = {}, 0
    for q, n, shape in zip(outs, sizes, shapes, strict=True):
        dtype = OUTPUT_DTYPES.get(q.c_type, np.float32)
        found[q.name] = parse_output("\n".join(words[at : at + n]), shape, dtype)
        at += n
    return found


def tensor_spec(launch: Any) -> str:
    """What the emulator is told of the kernel's tensor arguments, in launch order (SPATIALC_EMU_TENSORS, read by
    emu_global.h): `hexname,role,element bytes,hex poison,tiled` each, `;` between. An output or workspace is poisoned
    before the launch with what `spatialc.run` fills an output with on a GPU (NaN, the most negative integer)."""
    entries = []
    for p in launch.params:
        storage = np.dtype(storage_dtype(element_type(p.c_type)))
        poison = ""
        if p.role in ("output", "workspace"):
            poison = np.array([poison_value(storage.name)], dtype=storage).tobytes().hex()
        tiled = int(getattr(p, "order", "row") in ("row", "col"))  # (else a matrix the copy engine stores)
        entries.append(f"{p.name.encode().hex()},{p.role},{storage.itemsize},{poison},{tiled}")
    return ";".join(entries)


def _rows_past_counts(launch: Any, out: Any, inputs: Mapping[str, Any], c: np.ndarray) -> np.ndarray:
    """A grouped C with the rows at or past each group's count as the interpreter has them (zeros), after checking
    the kernel left them alone: they still hold the poison (EmulationFault naming the first written one)."""
    counts = [name for name, _ in getattr(launch, "row_counts", ())]
    if c.ndim != 3 or len(counts) != 1 or counts[0] not in inputs:
        return c
    sizes = np.asarray(inputs[counts[0]]).reshape(-1)
    storage = storage_dtype(element_type(out.c_type))
    poison = poison_value(storage)
    for g, rows in enumerate(sizes[: c.shape[0]].astype(np.int64)):
        rest = c[g, rows:]
        left = np.isnan(rest) if isinstance(poison, float) or storage == "uint16" else rest == poison
        if not left.all():
            r, col = (int(x[0]) for x in np.nonzero(~left))
            raise EmulationFault(
                f"the kernel wrote row {rows + r} (column {col}) of group {g} of {out.name}, at or past the group's"
                f" count of {rows} rows: rows past a group's count are left alone"
            )
        c[g, rows:] = 0
    return c


# ---- a progress line on a terminal ------------------------------------------------------------------------------


class StderrProgress:
    """A `progress(done, total)` callback that keeps one line on stderr up to date: `emulating: 37/132 blocks, 12 s`.

    It writes only when its stream is a terminal (or with `force`), at most ten times a second, and finishes the
    line when `done` reaches `total`. Used as a context manager it also finishes a line left open by a run that
    failed, so the error printed next starts on a line of its own. Seconds count from its creation."""

    EVERY_S = 0.1

    def __init__(
        self,
        label: str = "emulating",
        *,
        force: bool = False,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.force, self.stream, self.clock = label, force, stream, clock
        self.started = clock()
        self.width = 0  # characters of the open line; 0 when none is open
        self.shown = -float("inf")
        self._lock = threading.Lock()

    def _out(self) -> IO[str] | None:
        stream = self.stream if self.stream is not None else sys.stderr
        if stream is None:
            return None
        try:
            return stream if self.force or stream.isatty() else None
        except (AttributeError, ValueError):  # no isatty, or closed
            return None

    def note(self, text: str) -> None:
        """A line of its own before the count (what the run waits on first), where the count would be shown."""
        stream = self._out()
        if stream is not None:
            with self._lock:
                stream.write(("\n" if self.width else "") + f"{self.label}: {text}\n")  # after a count left open
                self.width = 0
                stream.flush()

    def __call__(self, done: int, total: int) -> None:
        stream = self._out()
        if stream is None:
            return
        with self._lock:
            now, last = self.clock(), done >= total
            if not last and self.width and now - self.shown < self.EVERY_S:
                return
            text = f"{self.label}: {done}/{total} blocks, {now - self.started:.0f} s"
            stream.write("\r" + text.ljust(self.width) + ("\n" if last else ""))
            stream.flush()
            self.width, self.shown = (0 if last else len(text)), now

    def close(self) -> None:
        """End the open line, if there is one (a run that stopped before its last block)."""
        stream = self._out()
        with self._lock:
            if stream is not None and self.width:
                stream.write("\n")
                stream.flush()
            self.width = 0

    def __enter__(self) -> StderrProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stderr_progress(label: str = "emulating", *, force: bool = False) -> StderrProgress:
    """A progress callback for `emulate(..., progress=)` that shows `label: done/total blocks, seconds` on one
    rewritten stderr line when stderr is a terminal (silent when piped, unless `force`)."""
    return StderrProgress(label, force=force)

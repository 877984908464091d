"""Run an emitted CUDA program on the CPU: the host emulation of DESIGN.md §5.3.

The exact `program_cu` text is compiled by g++ against `runtime/emu/*.h` (each CUDA thread a fiber, all on one OS
thread, switched at each wait; block and warp barriers, ldmatrix / mma.sync fragments, cp.async copies that land late
or early, a race check on shared memory) after two rewrites and nothing else: the launch `k<<<g, b[, s]>>>(args);`
becomes a call, and the dynamic shared declaration becomes a pointer to the emulator's block. Binaries are cached by
the hash of what built them.

A run can report progress: given a `progress(done, total)` callback, the runner asks the emulator for its
`spatialc-emu progress <done> <total>` lines (blocks of the launch done so far, a few a second) and calls it as
they arrive; `stderr_progress` is a ready-made one that keeps a line on a terminal up to date.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ProgramError
from ..inputs import check_inputs, check_row_counts
from ..lower.artifact import operand_files
from .emu_compile import (  # noqa: F401 — named here as before: spatialc.runtime.emulate.compile_program, …
    CXX_FLAGS,
    DYN_DECL,
    DYN_DECLS,
    DYN_HOST,
    HEADER_DIR,
    LAUNCH,
    MODES,
    cache_dir,
    compile_program,
    host_source,
    is_compiled,
)
from .emu_errors import (  # noqa: F401 — named here as before: spatialc.runtime.emulate.EmulationRace, …
    EmulationCompileError,
    EmulationDeadlock,
    EmulationError,
    EmulationFault,
    EmulationRace,
    EmulationTimeout,
    EmulationTooLarge,
)
from .emu_progress import StderrProgress, stderr_progress
from .emu_run import (  # noqa: F401 — named here as before: spatialc.runtime.emulate.run_program, …
    EXIT_CUDA,
    EXIT_DEADLOCK,
    EXIT_INPUT,
    EXIT_MISUSE,
    EXIT_RACE,
    EXIT_TIMEOUT,
    PROGRESS_LINE,
    VALUES_CHUNK,
    Progress,
    Run,
    _watched,
    format_values,
    parse_output,
    run_program,
    timeout_seconds,
    write_values,
)
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
    "check_emulable",
    "compile_program",
    "emulate",
    "emulate_source",
    "host_source",
    "run_program",
    "stderr_progress",
]

OUTPUT_DTYPES = {"signed char": np.int8, "int": np.int32, "long long": np.int64, "__half": np.float16}


MAX_SMS = 1 << 16  # far beyond any GPU's multiprocessors: an emulated device of more is a mistake


def check_run_options(timeout: Any, sms: Any) -> None:
    """ProgramError for a watchdog that is not a positive number of seconds, or a device whose multiprocessors are
    not a whole number from 1 to MAX_SMS — before anything is compiled (the emulator itself would take 0 or -1 for
    its default of 132 without a word)."""
    timeout_seconds(timeout)
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
    timeout: float | None = None,
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


# The CUDA threads a cooperative launch runs at once (every block's): each a fiber with a stack of its own, two
# memory mappings (its guard page and its pages), which keeps well inside Linux's default of 65530 a process.
COOPERATIVE_THREADS = 16384


def _input_files(artifact, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The program's input files (name → values), from `inputs` checked as the interpreter checks them."""
    values = check_inputs("this kernel", launch_specs(artifact.launch), inputs)
    check_row_counts(dict(getattr(artifact.launch, "row_counts", ())), values)
    # Files by the tensors' positions (an MLP's X, W1, W2 are a.txt, b.txt and c.txt), never by their names.
    files = operand_files([q.role for q in artifact.launch.params])
    return {file: values[q.name] for q, file in zip(artifact.launch.params, files, strict=True) if file is not None}


def check_emulable(artifact, max_bytes: int = EMULATION_MAX_BYTES) -> None:
    """Refuse, from the artifact's launch alone, an emulated run that could not finish here: no output tensor
    (EmulationFault), more than `max_bytes` of memory (`emulation_bytes`: EmulationTooLarge), or more threads
    waiting on each other than this machine starts at once (EmulationFault). `emulate` calls it first; the CLI
    calls it before it makes any input, so a run at an LLM's size is refused in a second, not after minutes."""
    if not any(p.role == "output" for p in artifact.launch.params):
        raise EmulationFault("the artifact's launch names no output tensor")
    need = emulation_bytes(artifact.launch)
    if need > max_bytes:
        raise EmulationTooLarge(
            f"emulating this kernel takes about {_gib(need)} (its tensors read as text, tilized and copied to the"
            f" emulated device, C printed and read back), more than {_gib(max_bytes)}: emulate a smaller size (the"
            " emulation runs each CUDA thread as a fiber, on one core of this machine), run it on a GPU, or, where this"
            " machine has the memory, raise spatialc.emulate's max_bytes"
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


def emulate(
    artifact,
    inputs: Mapping[str, Any],
    mode: str = "late",
    timeout: float | None = None,
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
    timeout (`timeout` seconds of wall clock; None: SPATIALC_EMU_TIMEOUT_S, or 120 — a run whose pace says it would
    take more than twice that is stopped then), a compile error or a CUDA error when the run does not finish
    cleanly. `progress(done, total)` is
    called with the blocks done as the run goes (`stderr_progress()` makes one that shows them on a terminal).
    """
    check_emulable(artifact, max_bytes)
    out = next(p for p in artifact.launch.params if p.role == "output")
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


def _emulated_text(
    artifact, files, mode: str, timeout: float | None, progress: Progress | None, sms: int | None
) -> str:
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

"""Kernels compiled beforehand: `spatialc gpucheck DIR --prepare` on a CPU machine with nvcc, loaded by the GPU run.

The GPU machine's time is short and its first minutes would otherwise go to nvcc. `--prepare` builds every case of
the run (and the preflight's kernels: 64³ in each form, the sm_90a form at the large rows' plan, a multicast group's
cluster kernel) exactly as the GPU run will, compiles each of its kernels — the persistent kernel, its
general form where lower printed one, and the sm_90a form's (for sm_90a) — for the target's architecture with
`spatialc.runtime.nvcc.compile_cubin` into DIR (the cubin and what ptxas said of it, side by side), and writes
DIR/manifest.json: per kernel its case and form, the SHA-256 of its CUDA source and of its cubin, the architecture,
nvcc's version, ptxas's registers and spills. The GPU run (`--prepared DIR`) builds each case again, hashes each
kernel text it got, and loads a cubin only when the manifest holds that very text for the device's architecture and
the cubin file still has its recorded hash; every other kernel it compiles itself, and its report says which and
why.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import SpatialError
from ..files import read_at_most, write_whole
from ..ir.printer import plural
from ..runtime import nvcc
from ..runtime.cpus import usable_cpus
from .builds import PTXAS_FIELDS, Built, Form, build_case, compile_kernel, describe_ptxas
from .cases import Case, kernel_arch
from .preflight import preflight_cases

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest of every case of a run is a few hundred kilobytes
FORMAT = 1
PREPARE_COMPILE_S = 600.0  # one kernel's nvcc, on the CPU machine (no budget there)


def source_hash(text: str) -> str:
    """The SHA-256 of a kernel's CUDA source: what ties a cubin to the text it was compiled from."""
    return hashlib.sha256(text.encode()).hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True, slots=True)
class Entry:
    """One prepared kernel."""

    case: str  # `fp16 64x64x64`
    source_sha256: str
    arch: str
    kernel_name: str
    form: str = ""  # persistent | general ('' when the case did not lower)
    cubin: str = ""  # the file's name in the folder ('' when it did not compile)
    cubin_sha256: str = ""
    ptxas: dict[str, Any] | None = None  # registers, spill_stores, spill_loads, static_smem, stack
    seconds: float = 0.0
    error: str = ""
    sass: str = ""  # the main loop's SASS census in one line, where cuobjdump was at hand ('' when not)


class Manifest:
    """A prepared folder: its manifest's kernels, found by source hash and architecture."""

    def __init__(self, folder: Path, data: dict[str, Any]):
        self.folder, self.data = folder, data
        self.entries = [Entry(**e) for e in data.get("kernels", [])]
        self.by_source = {(e.source_sha256, e.arch): e for e in self.entries if e.cubin}

    @classmethod
    def load(cls, folder: str | Path) -> Manifest:
        """The folder's manifest; SpatialError (one line) when there is none or it cannot be read."""
        path = Path(folder) / MANIFEST
        try:
            text = read_at_most(path, MAX_MANIFEST_BYTES)  # a link to /dev/zero, a FIFO: the folder may be another's
            if text is None:
                raise ValueError(f"over {MAX_MANIFEST_BYTES >> 20} MiB, no manifest's size")
            data = json.loads(text)
        except (FileNotFoundError, NotADirectoryError):
            raise SpatialError(
                f"no {MANIFEST} in {str(folder)!r}: make one with `spatialc gpucheck {folder} --prepare`"
            ) from None
        except (OSError, ValueError) as e:
            raise SpatialError(f"cannot read {path}: {e}") from None
        fault = _manifest_fault(data)
        if fault is not None:
            raise SpatialError(f"{path} {fault}; prepare it again")
        return cls(Path(folder), data)

    def find(self, source: str, arch: str) -> tuple[Path | None, Entry | None, str]:
        """The prepared cubin of `source` for `arch`, with its entry; or None and why not."""
        digest = source_hash(source)
        entry = self.by_source.get((digest, arch))
        if entry is None:
            archs = sorted({e.arch for e in self.entries if e.source_sha256 == digest})
            if archs:
                return None, None, f"prepared for {', '.join(archs)}, the device is {arch}"
            return None, None, "not prepared (its source changed since, or the case was not in the prepared run)"
        path = self.folder / entry.cubin
        if not path.is_file():
            return None, None, f"prepared cubin {entry.cubin} is missing"
        if file_hash(path) != entry.cubin_sha256:
            return None, None, f"prepared cubin {entry.cubin} does not match its recorded hash"
        return path, entry, ""

    def summary(self) -> str:
        archs = ", ".join(sorted({arch for _, arch in self.by_source}))  # sm_90, and sm_90a for the sm_90a form
        ok = len(self.by_source)
        return (
            f"{ok} kernels for {archs or self.data.get('arch')} by {self.data.get('nvcc')} ({self.data.get('created')})"
        )


def _manifest_fault(data: Any) -> str | None:
    """Why `data` is not a manifest `prepare` writes ("is not …", "holds …"), or None. A prepared folder may come from
    someone else: every value the run reads must be of the type it reads, and no cubin's name may lead out of it."""
    if not isinstance(data, dict) or type(data.get("format")) is not int or data["format"] != FORMAT:
        return f"is not a gpucheck manifest of format {FORMAT}"
    shown = [k for k in _SHOWN if k in data and not _plain(data[k])]
    if shown:
        return f"holds a {shown[0]} that is not one line of text"
    kernels = data.get("kernels", [])
    if not isinstance(kernels, list):
        return "holds kernels that are not a list"
    return next((f"holds kernel {i}: {why}" for i, e in enumerate(kernels) if (why := _entry_fault(e))), None)


_SHOWN = ("target", "arch", "nvcc", "commit", "created")  # the manifest's own fields the run's output quotes


def _plain(value: Any) -> bool:
    """Whether `value` is text the run's output can quote as it is: one line, no control character (an escape
    sequence would reach the terminal)."""
    return isinstance(value, str) and value.isprintable()


_ENTRY_FIELDS = {f.name: f for f in fields(Entry)}
_ENTRY_NUMBERS = ("seconds",)  # every other field but `ptxas` is a string


def _entry_fault(entry: Any) -> str | None:
    """Why one of a manifest's kernels is not an Entry `prepare` writes, or None."""
    if not isinstance(entry, dict):
        return "not an object"
    unknown = sorted(str(k)[:40] for k in entry if k not in _ENTRY_FIELDS)
    missing = sorted(k for k, f in _ENTRY_FIELDS.items() if f.default is MISSING and k not in entry)
    if unknown or missing:
        return f"unknown fields {unknown}" if unknown else f"missing fields {missing}"
    for name, value in entry.items():
        if name == "ptxas":
            ok = value is None or (
                isinstance(value, dict)
                and all(k in PTXAS_FIELDS and type(v) in (int, float, type(None)) for k, v in value.items())
            )
        elif name in _ENTRY_NUMBERS:
            ok = type(value) in (int, float)
        else:  # quoted by the run's output but `error`, which is nvcc's own lines (`prepare` says them)
            ok = isinstance(value, str) and (name == "error" or _plain(value))
        if not ok:
            return f"its {name} is not what prepare writes there"
    cubin = entry.get("cubin", "")
    if cubin and (cubin in (".", "..") or Path(cubin).name != cubin or "\\" in cubin):
        return f"cubin {cubin[:40]!r} is not a file name of the prepared folder"
    return None


def prepare(
    cases: Sequence[Case],
    target: str,
    folder: str | Path,
    *,
    say: Callable[[str], None] = print,
    workers: int | None = None,
    commit: str = "",
    seed: int = 0,
) -> int:
    """Compile every kernel of every case (and of the preflight's) for `target` into `folder` and write its
    manifest. Returns 0 when every kernel compiled, 1 when some did not (or a case did not lower); SpatialError when
    there is no nvcc."""
    found = nvcc.find_nvcc()
    if found is None:
        raise SpatialError("--prepare compiles with nvcc, which was not found (PATH, CUDA_HOME, /usr/local/cuda)")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    builds = [build_case(c, target) for c in dict.fromkeys([*preflight_cases(cases), *cases])]
    kernels = _distinct([(b.case, f) for b in builds for f in b.forms if f.artifact is not None], target)
    shared = sum(f.artifact is not None for b in builds for f in b.forms) - len(kernels)
    unbuilt = [b for b in builds if b.error]
    version = nvcc.nvcc_version(found)
    also = f" ({shared} more share a text with one of them)" if shared else ""
    say(f"gpucheck prepare: {len(kernels) + len(unbuilt)} kernels{also} for {target} with {version} into {out}")
    for b in builds:
        _say_unbuilt(b, say)
    with ThreadPoolExecutor(max_workers=workers or min(8, usable_cpus())) as pool:
        compiled = list(pool.map(lambda kernel: _prepare_one(*kernel, target, out, say), kernels))
    entries = [Entry(str(b.case), "", target, "", error=b.error) for b in unbuilt] + compiled
    data = {
        "format": FORMAT,
        "target": target,
        "arch": target,
        "nvcc": version,
        "commit": commit,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "kernels": [asdict(e) for e in entries],
    }
    refs = _w4_references(cases, target, out, seed, say)
    if refs:
        data["w4_references"] = refs
    write_whole(out / MANIFEST, json.dumps(data, indent=1, ensure_ascii=False))
    failed = [e for e in entries if e.error]
    say(f"gpucheck prepare: wrote {out / MANIFEST}: {len(entries) - len(failed)} compiled, {len(failed)} failed")
    return 1 if failed else 0


def _w4_references(cases: Sequence[Case], target: str, out: Path, seed: int, say: Callable[[str], None]) -> list[str]:
    """Each W4A16 row's reference C and bound for the run's seed, saved beside the cubins (w4refs.py): the GPU run
    loads them instead of spending seconds of its budget a row. The saved files' names."""
    import spatialc

    from . import w4refs
    from .w4rows import gemm_of, inputs

    saved = []
    for case in dict.fromkeys(c for c in cases if c.weights):
        t0 = time.monotonic()
        program = spatialc.build(gemm_of(case), target)
        path = w4refs.save(out, program, seed, inputs(program, seed))
        saved.append(path.name)
        say(f"{case}: reference and bound for seed {seed} into {path.name} in {time.monotonic() - t0:.1f} s")
    return saved


def _distinct(kernels: list[tuple[Case, Form]], target: str) -> list[tuple[Case, Form]]:
    """Each kernel text once for its architecture (the first case that has it names it): the GPU run finds a cubin by
    its text's hash, so a kernel two cases share — a sweep's row-major neighbour, its planner's second timing, a
    size in two lists — is compiled once."""
    seen: set[tuple[str, str]] = set()
    out = []
    for case, form in kernels:
        key = (source_hash(form.artifact.kernel_cu), kernel_arch(form.name, target))
        if key not in seen:
            seen.add(key)
            out.append((case, form))
    return out


def _say_unbuilt(built: Built, say: Callable[[str], None]) -> None:
    """Say why a case has no kernel to compile, or no kernel in some form."""
    if built.error or built.skip:
        say(f"{built.case}: {built.error or 'skipped: ' + built.skip}")
    for form in built.forms:
        if form.artifact is None:
            say(f"{built.case} {form.label}: {form.absent}")


def _prepare_one(case: Case, form: Form, target: str, out: Path, say: Callable[[str], None]) -> Entry:
    """Compile one kernel of a case into `out`; a failed compile becomes the entry's `error`."""
    t0 = time.monotonic()
    art = form.artifact
    arch = kernel_arch(form.name, target)
    base = Entry(str(case), source_hash(art.kernel_cu), arch, art.launch.kernel_name, form=form.name)
    label = f"{case} {form.label}"  # a sweep's plans by their own names
    try:
        path = compile_kernel(form, arch, timeout_s=PREPARE_COMPILE_S, cache=out)
    except nvcc.KernelBuildError as e:
        say(f"{label}: compile: {e}")
        return _with(base, error=f"compile: {e}", seconds=time.monotonic() - t0)
    ptxas = _ptxas_of(form)
    census = sass_census(path)
    seconds = round(time.monotonic() - t0, 2)
    say(f"{label}: {path.name} in {seconds:.1f} s: {describe_ptxas(form.facts)}")
    return _with(base, cubin=path.name, cubin_sha256=file_hash(path), ptxas=ptxas, seconds=seconds, sass=census)


def sass_census(cubin: Path) -> str:
    """The kernel's main loop counted from its SASS (`runtime.sass`), one line for the manifest and the dry run: the
    first GPU table can then be read against what the loop issues. '' without cuobjdump."""
    from ..runtime import sass

    if sass.find_cuobjdump() is None:
        return ""
    try:
        code = sass.disassemble(cubin)
    except (sass.SassError, OSError) as e:
        return f"unread: {e}"
    c = sass.main_loop_census(code)
    if c is None:
        return f"{len(code.main_loops())} loops hold MMAs (no one main loop)"
    per = f", {c.instrs / c.tile_macs:.1f} issue slots a tile-MAC" if c.tile_macs else ""
    mmas = ", ".join(f"{n} {op}" for op, n in c.mmas)
    return (
        f"main loop {c.instrs} instructions a trip{per}; {mmas}; {c.ldsm} LDSM, {c.other_lds} other shared loads,"
        f" {c.generic} generic loads, {plural(c.barriers, 'block barrier')}"
    )


def _ptxas_of(form: Form) -> dict[str, Any] | None:
    return {k: form.facts[k] for k in PTXAS_FIELDS} if "registers" in form.facts else None


def _with(entry: Entry, **changes: Any) -> Entry:
    return Entry(**{**asdict(entry), **changes})

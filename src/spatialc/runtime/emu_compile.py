"""Compiling a program for the host emulation: the text rewrite g++ needs (`host_source`), and the binaries, built
once against the emulator's precompiled runtime and cached by the hash of what built them."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

from .cache import cache_dir as cache_of
from .emu_errors import EmulationCompileError, EmulationFault

HEADER_DIR = Path(__file__).parent / "emu"
MODES = ("late", "early")
# -ffp-contract=off: no multiply and add fused into one rounding, on any host (the kernel's float arithmetic is
# printed so that nvcc fuses none either), as numpy rounds each. -O1, not -O2: a program's g++ build is most of an
# emulation's time, and -O1 builds it about a fifth faster for runs as quick (two sm_90a test files: 46.7 → 37.9 s).
CXX_FLAGS = ("-std=c++20", "-O1", "-pthread", "-ffp-contract=off")

DYN_DECL = "extern __shared__ __align__(32) char spatialc_dyn_smem[];"
# The declaration as earlier kernels printed it (16-byte aligned); still recognised, so saved .cu files run.
DYN_DECLS = (
    DYN_DECL,
    "extern __shared__ __align__(16) char spatialc_dyn_smem[];",
    "extern __shared__ __align__(1024) char spatialc_dyn_smem[];",  # the sm_90a form's swizzled stages
)
DYN_HOST = "char* spatialc_dyn_smem = ::spatialc_emu::dynamic_shared();"
LAUNCH = re.compile(r"\b([A-Za-z_]\w*)\s*<<<([^;<>]*?)>>>\s*\(")


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


def _flags() -> list[str]:
    return [*CXX_FLAGS, *_NO_SHADOW_STACK, "-DSPATIALC_EMU_LINKED"]


@cache
def _link_flags() -> tuple[str, ...]:
    """GNU gold where g++ can use it: it links a program against the runtime object in a third of the time of the
    default linker (about 0.03 against 0.1 CPU-s, over 600 programs in the test suite); the default otherwise."""
    done = subprocess.run(
        [_compiler()[0], "-fuse-ld=gold", "-Wl,--version"], capture_output=True, text=True, check=False, timeout=60
    )
    return ("-fuse-ld=gold",) if done.returncode == 0 and "gold" in done.stdout.lower() else ()


# The emulator switches its fibers' stacks itself (emu_runtime.h): a binary marked for x86's shadow stacks (CET, which
# some distributions' g++ does by default) would fault at the first switch where the kernel enforces them.
_NO_SHADOW_STACK = ("-fcf-protection=none",) if platform.machine().lower() in ("x86_64", "amd64") else ()


def _prepared() -> Path:
    """A folder holding the headers, their precompiled form and the emulator's runtime object.

    Programs then compile only their own code (about a second) and link the runtime, instead of compiling the
    emulator's threads, barriers and race check every time.
    """
    headers = _headers()
    folder = _runtime_folder()
    if (folder / "runtime.o").exists():
        return folder
    with _lock(str(folder)):
        if (folder / "runtime.o").exists():
            return folder
        tmp = Path(tempfile.mkdtemp(prefix="rt-", dir=cache_dir()))
        try:
            for h in headers:
                shutil.copy2(h, tmp / h.name)
            header, flags = str(tmp / "cuda_emu.h"), _flags()
            _gxx([*flags, "-x", "c++-header", header, "-o", f"{header}.gch"], "the emulation header")
            impl = ["-DSPATIALC_EMU_IMPLEMENTATION", "-x", "c++", "-c", header]
            _gxx([*flags, *impl, "-o", str(tmp / "runtime.o")], "the emulation runtime")
            tmp.rename(folder)
        except OSError:  # another process got there first
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _runtime_folder() -> Path:
    """Where `_prepared` keeps the runtime: named by the compiler, the flags and the headers' text."""
    headers = _headers()
    key = _digest(_compiler()[1], *_flags(), *(h.name.encode() + h.read_bytes() for h in headers))
    return cache_dir() / f"rt-{key}"


def _binary_path(rt: Path, program_cu: str) -> Path:
    return cache_dir() / f"prog-{_digest(rt.name, host_source(program_cu))}"


def binary_mode(binary: Path) -> str | None:
    """The mode a binary `compile_program` gave runs in: its name's suffix (`prog-….early`); None for another file.

    One binary serves both modes (the emulator reads SPATIALC_EMU_MODE when it starts); each mode has its own name
    for it, a hard link, so that whoever runs the path (`run_program`) runs the mode it was compiled for."""
    suffix = binary.suffix.removeprefix(".")
    return suffix if binary.name.startswith("prog-") and suffix in MODES else None


def is_compiled(program_cu: str, mode: str = "late") -> bool:
    """Whether `compile_program` would find `program_cu`'s binary in the cache (else g++ takes seconds first)."""
    _check_mode(mode)
    rt = _runtime_folder()
    return (rt / "runtime.o").exists() and _binary_path(rt, program_cu).exists()


def compile_program(program_cu: str, mode: str = "late") -> Path:
    """The emulation binary of `program_cu`, compiled once (for both modes) and cached by source and header hash,
    under the name that runs it in `mode` (`binary_mode`)."""
    _check_mode(mode)
    source = host_source(program_cu)
    rt = _prepared()
    binary = _binary_path(rt, program_cu)
    named = binary.with_name(f"{binary.name}.{mode}")
    if named.exists():
        return named
    with _lock(str(binary)):
        if not binary.exists():
            with tempfile.TemporaryDirectory(prefix="spatialc-emu-") as tmp:
                src = Path(tmp) / "program.cpp"
                src.write_text(source)
                out = Path(tmp) / "program"
                use_rt = ["-Winvalid-pch", "-I", str(rt), "-include", "cuda_emu.h"]
                sources = ["-x", "c++", str(src), "-x", "none", str(rt / "runtime.o")]
                _gxx([*_flags(), *_link_flags(), *use_rt, *sources, "-o", str(out)], "the program")
                os.replace(out, binary)
        if not named.exists():
            _link(binary, named)
    return named


def _link(binary: Path, named: Path) -> None:
    """`named` the same file as `binary` (a hard link; a copy where the file system has none), made atomically."""
    tmp = named.with_name(f"{named.name}.{os.getpid()}-{threading.get_ident()}")
    try:
        os.link(binary, tmp)
    except OSError:
        shutil.copy2(binary, tmp)
    os.replace(tmp, named)

"""Compile a lowered kernel with nvcc: find the toolkit, build a cubin (cached on disk under its source hash), keep
what ptxas said of each kernel, and check it against what the kernel assumes — the compile half of running on a GPU
(`launch.py` loads and launches what this makes; `sass.py` reads its instructions).

Errors: `KernelBuildError` (nvcc or NVRTC refused the text, or ptxas gave a kernel other registers than its
setmaxnreg split assumes); one line each.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpatialError
from ..files import write_whole
from .cache import cache_dir as cache_of

__all__ = [
    "HOST_ONLY_HEADERS",
    "KernelBuildError",
    "PtxasInfo",
    "cached_cubin",
    "check_entry_registers",
    "compile_cubin",
    "cubin_path",
    "find_cuda_tool",
    "find_nvcc",
    "first_error",
    "kernel_ptxas",
    "kernel_symbol",
    "nvcc_version",
    "nvrtc_source",
    "parse_ptxas",
    "with_ptxas",
]

HOST_ONLY_HEADERS = ("cstdio", "cstdlib", "vector", "cstring")  # what NVRTC lacks: left out of its text


class KernelBuildError(SpatialError):
    """The kernel text did not compile (the message carries the compiler's first error line)."""


def find_nvcc() -> str | None:
    """nvcc on PATH, else under CUDA_HOME / CUDA_PATH or /usr/local/cuda."""
    return find_cuda_tool("nvcc")


def find_cuda_tool(name: str) -> str | None:
    """A CUDA toolkit program (`nvcc`, `cuobjdump`) on PATH, else under CUDA_HOME / CUDA_PATH or /usr/local/cuda."""
    found = shutil.which(name)
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", name).is_file():
            return str(Path(root, "bin", name))
    return None


def cache_dir() -> Path:
    """Where cubins are kept between runs: `cubin` under spatialc's cache root (runtime/cache.py)."""
    return cache_of("cubin")


def compile_cubin(
    source: str, arch: str, *, nvcc: str | None = None, cache: Path | None = None, timeout_s: float = 300.0
) -> Path:
    """The cubin file of `source` for `arch` (`sm_90`), from the disk cache when the same text was compiled before.

    nvcc runs with `-Xptxas -v`; what ptxas says of each kernel (registers, spills, static shared memory) is kept
    beside the cubin (`….ptxas.json`, read back by `kernel_ptxas`), so a cache hit has it too. A cached cubin without
    that file (cached before it was kept) is compiled again. Safe to call from several threads at once (the GPU
    check compiles its kernels in parallel)."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise KernelBuildError("nvcc was not found (PATH, CUDA_HOME, /usr/local/cuda)")
    cache = cache or cache_dir()
    path = cubin_path(source, arch, nvcc, cache)
    if path.is_file() and ptxas_path(path).is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spatialc-") as tmp:
        src, dst = Path(tmp, "kernel.cu"), Path(tmp, "kernel.cubin")
        src.write_text(source)
        # An architecture-specific target (sm_90a) is named in full: `-arch=sm_90a` has been seen to run a plain
        # sm_90 pass as well, which refuses wgmma.
        cc = arch.removeprefix("sm_")
        gpu = [f"-gencode=arch=compute_{cc},code={arch}"] if arch.endswith("a") else [f"-arch={arch}"]
        cmd = [nvcc, "-cubin", *gpu, "-O3", "-std=c++17", "-Xptxas", "-v", "-o", str(dst), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise KernelBuildError(f"nvcc ran past {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise KernelBuildError(f"nvcc failed: {first_error(proc.stderr or proc.stdout)}")
        data = dst.read_bytes()
    functions = parse_ptxas(f"{proc.stdout}\n{proc.stderr}")
    info = {"arch": arch, "functions": {name: f.to_dict() for name, f in functions.items()}}
    write_whole(ptxas_path(path), json.dumps(info, indent=1).encode())  # first: a cubin on disk has its ptxas file
    write_whole(path, data)  # a concurrent compile of the same text writes the same bytes
    return path


def cubin_path(source: str, arch: str, nvcc: str, cache: Path) -> Path:
    """Where `compile_cubin` keeps the cubin of `source` for `arch` made by `nvcc`: named by the hash of all three."""
    key = hashlib.sha256(f"{arch}\n{nvcc_version(nvcc)}\n{source}".encode()).hexdigest()[:32]
    return cache / f"{key}-{arch}.cubin"


def cached_cubin(source: str, arch: str) -> Path | None:
    """The cubin `compile_cubin` made of `source` for `arch`, with what ptxas said of it; None where it made none
    (or there is no nvcc). Compiles nothing."""
    found = find_nvcc()
    if found is None:
        return None
    path = cubin_path(source, arch, found, cache_dir())
    return path if path.is_file() and ptxas_path(path).is_file() else None


@dataclass(frozen=True, slots=True)
class PtxasInfo:
    """What `ptxas -v` said of one kernel (an entry function): registers per thread, spill traffic, static shared
    memory and stack frame, in bytes."""

    function: str  # the symbol (`_Z19spatialc_persistent…`)
    registers: int
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0  # static __shared__ bytes
    stack: int = 0  # stack frame bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "registers": self.registers,
            "spill_stores": self.spill_stores,
            "spill_loads": self.spill_loads,
            "smem": self.smem,
            "stack": self.stack,
        }


_PTXAS_FUNCTION = re.compile(r"Compiling entry function '([^']+)'|Function properties for (\S+)")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> dict[str, PtxasInfo]:
    """Each kernel's `PtxasInfo`, by symbol, from nvcc's `-Xptxas -v` output. Device functions that are not kernels
    (a `Function properties` block without a `Used N registers` line) are left out."""
    fields: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in text.splitlines():
        if m := _PTXAS_FUNCTION.search(line):
            current = m.group(1) or m.group(2)
        elif current is None:
            continue
        elif m := _PTXAS_FRAME.search(line):
            stack, stores, loads = (int(g) for g in m.groups())
            fields.setdefault(current, {}).update(stack=stack, spill_stores=stores, spill_loads=loads)
        elif m := _PTXAS_USED.search(line):
            smem = _PTXAS_SMEM.search(line)
            fields.setdefault(current, {}).update(registers=int(m.group(1)), smem=int(smem.group(1)) if smem else 0)
    return {name: PtxasInfo(name, **f) for name, f in fields.items() if "registers" in f}


def ptxas_path(cubin: Path) -> Path:
    """Where `compile_cubin` keeps what ptxas said of `cubin`."""
    return cubin.with_name(cubin.name.removesuffix(".cubin") + ".ptxas.json")


def kernel_ptxas(cubin: Path, name: str) -> PtxasInfo | None:
    """What ptxas said of kernel `name` (plain or C++ mangled) in a cubin `compile_cubin` made; None where that was
    not kept or the kernel is not in it."""
    try:
        functions = json.loads(ptxas_path(cubin).read_text())["functions"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    mangled = f"_Z{len(name)}{name}"
    for symbol, f in functions.items():
        if symbol == name or symbol.startswith(mangled):
            return PtxasInfo(**f)
    return None


def check_entry_registers(budget: Any, info: PtxasInfo | None) -> None:
    """Refuse a kernel whose setmaxnreg split assumes a register count at entry (`Budget.regs_entry`) that ptxas
    did not give it: a block holds what its threads got at launch, and an increase past what the decreases freed
    waits for registers no warp gives back — the kernel would hang on the GPU. Nothing to check where the kernel
    moves no registers or ptxas's count is unknown."""
    want = getattr(budget, "regs_entry", 0)
    if not want or info is None or info.registers == want:
        return
    raise KernelBuildError(
        f"ptxas gave the kernel {info.registers} registers a thread where its setmaxnreg split assumes {want} at"
        " entry: the consumers' setmaxnreg.inc would wait forever on the GPU; not launched"
    )


_NVCC_VERSIONS: dict[str, str] = {}


def nvcc_version(nvcc: str) -> str:
    """nvcc's release line (`Build cuda_13.0…`), once per process."""
    if nvcc not in _NVCC_VERSIONS:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        _NVCC_VERSIONS[nvcc] = out.strip().splitlines()[-1] if out.strip() else "unknown"
    return _NVCC_VERSIONS[nvcc]


def first_error(text: str) -> str:
    """The line of a compiler's output that says what went wrong: its first error or fatal message, not the one
    that says only that it stopped (ptxas's "Ptx assembly aborted due to errors" follows the reason)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ("error" in ln.lower() or "fatal" in ln.lower()) and "aborted due to" not in ln]
    return (errors or lines or ["no message"])[0][:300]


def kernel_symbol(cubin: bytes, name: str) -> str:
    """The symbol of kernel `name` in a cubin: `name` itself, as kernels declared extern "C" (every kernel spatialc
    prints now) have it, or the C++ mangled name (`_Z19spatialc_persistent…`) of a kernel saved before that."""
    raw = name.encode()
    if re.search(rb"(^|\x00|\.)" + re.escape(raw) + rb"\x00", cubin):
        return name
    found = re.search(rb"_Z%d%s[A-Za-z0-9_]*" % (len(raw), re.escape(raw)), cubin)
    if found:
        return found.group(0).decode()
    raise KernelBuildError(f"kernel {name} is not in the compiled module")


def nvrtc_source(source: str) -> str:
    """The kernel text NVRTC can take: without the host-only standard headers."""
    names = "|".join(HOST_ONLY_HEADERS)
    pattern = re.compile(rf"^\s*#\s*include\s*<({names})>\s*$", re.MULTILINE)
    return pattern.sub("", source)


def with_ptxas(artifact: Any, timeout_s: float = 300.0, *, general: bool = True) -> Any:
    """`artifact` (and, with `general`, the general form it carries) with ptxas's register and spill counts in its
    budget, its kernel compiled by nvcc for the artifact's target; as it was where nvcc is missing or refuses (then
    the estimate stands alone)."""
    import dataclasses

    if artifact is None or find_nvcc() is None:
        return artifact
    try:
        path = compile_cubin(artifact.kernel_cu, artifact.target, timeout_s=timeout_s)
    except KernelBuildError:
        return artifact
    info = kernel_ptxas(path, artifact.launch.kernel_name)
    budget = artifact.budget
    if info is not None:
        spills = info.spill_stores + info.spill_loads
        budget = dataclasses.replace(budget, regs_ptxas=info.registers, spills_ptxas=spills, stack_ptxas=info.stack)
    carried = with_ptxas(artifact.general, timeout_s) if general else artifact.general
    return dataclasses.replace(artifact, budget=budget, general=carried)

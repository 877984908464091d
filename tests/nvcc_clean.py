"""One nvcc check for the tests that compile a printed kernel: -Werror on every warning (host and device), ptxas -v,
the given architectures in one call; and what a clean compile means — it succeeded, ptxas compiled each
architecture, and no kernel spills a byte.

Two modes, the same flags. `nvcc_compile` (host mode, `-c`) compiles the whole text, its host code by the host
compiler (gcc -Wall -Wextra -Werror) too; `nvcc_device` (device mode: `-cubin` for one architecture, `-fatbin` for
several) runs only the device side — cicc and ptxas — at about a third of the CPU (the host side, cudafe++ and gcc
compiling the host code, is most of a `-c`). The device front end still parses the whole translation unit, host code
included, so a device-mode text must still be valid C++: on CUDA 13.0 (V13.0.88) a host function calling an
undeclared function fails `-cubin` with 'error: identifier "…" is undefined', and an unused host variable fails it
under -Werror all-warnings (#177-D); only gcc's own warnings (-Wall -Wextra, e.g. -Wsign-compare) need the host
mode. So a test whose subject is the device code (ptxas's spills, registers and shared memory, the SASS, warnings in
kernel code) compiles device-only, and each host-code printer path is compiled in host mode somewhere (the docstring
of each test says where)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

NVCC = shutil.which("nvcc")
FLAGS = ("-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror", "-Xptxas", "-v")


def gencode(ccs: Sequence[str]) -> list[str]:
    """-gencode flags for `ccs` ("89", "90", "90a", …), each its own SASS."""
    return [f for cc in ccs for f in ("-gencode", f"arch=compute_{cc},code=sm_{cc}")]


def nvcc_run(
    src: Path, ccs: Sequence[str], *, host: bool, timeout: int = 900, extra: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """nvcc with FLAGS on the file `src` for each of `ccs`: host mode (`host`) compiles an object (`-c`), host code
    and all; device mode only the device code, a cubin (one architecture) or a fatbin (several: -cubin takes one)."""
    assert NVCC is not None
    if host:
        mode, out = "-c", src.with_suffix(".o")
    elif len(ccs) == 1:
        mode, out = "-cubin", src.with_suffix(".cubin")
    else:
        mode, out = "-fatbin", src.with_suffix(".fatbin")
    cmd = [NVCC, "-std=c++17", "-O3", *gencode(ccs), *FLAGS, *extra, mode, "-o", str(out), str(src)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def nvcc_compile(text: str, where: Path, ccs: Sequence[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """Host mode: `text` (a kernel's program_cu) written to `where` (a .cu path) and compiled to an object for each
    of `ccs` ("89", "90", …), its host code by gcc -Wall -Wextra -Werror."""
    where.write_text(text)
    return nvcc_run(where, ccs, host=True, timeout=timeout)


def nvcc_device(text: str, where: Path, ccs: Sequence[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """Device mode: `text` written to `where` and compiled to a cubin (fatbin) for `ccs`; its host code is parsed
    by the device front end but not compiled by gcc (see the module's docstring)."""
    where.write_text(text)
    return nvcc_run(where, ccs, host=False, timeout=timeout)


def assert_clean(proc: subprocess.CompletedProcess[str], ccs: Sequence[str]) -> str:
    """The compile succeeded without a warning (-Werror), ptxas compiled every architecture of `ccs`, and no kernel
    spills; returns the log."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "Compiling entry function" in log
    for cc in ccs:
        assert f"for 'sm_{cc}'" in log, cc
    assert not re.search(r"[1-9]\d* bytes spill", log)
    return log

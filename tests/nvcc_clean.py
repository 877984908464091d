"""One nvcc check for the tests that compile a printed kernel: -Werror on every warning (host and device), ptxas -v,
the given architectures in one call; and what a clean compile means — it succeeded, ptxas compiled each
architecture, and no kernel spills a byte."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

NVCC = shutil.which("nvcc")
FLAGS = ("-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror", "-Xptxas", "-v")


def nvcc_compile(text: str, where: Path, ccs: Sequence[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """`text` (a kernel's program_cu) written to `where` (a .cu path) and compiled to an object for each of `ccs`
    ("89", "90", …)."""
    assert NVCC is not None
    where.write_text(text)
    gencode = [f for cc in ccs for f in ("-gencode", f"arch=compute_{cc},code=sm_{cc}")]
    cmd = [NVCC, "-std=c++17", "-O3", *gencode, *FLAGS, "-c", "-o", str(where.with_suffix(".o")), str(where)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


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

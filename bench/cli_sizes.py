"""`spatialc gemm` at the sizes kernel engineers deploy: wall time and peak memory of the default command.

    python bench/cli_sizes.py [--quick]

Each row runs the CLI in a fresh process (`python -m spatialc gemm …`), as a user would, and reads the process's
own peak resident memory from the kernel (os.wait4). Baseline, measured in the same run: the same command with
`--check none` (build, lower and printing, no interpreter). The issue's goal: the default under 5 s and 1 GB at
8192³ and at 512×14336×4096 (a Llama-3-8B MLP layer), on any target. `--quick`: the two 8192³ rows only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

ROWS = [
    ("8192³ bf16 sm_90", ["8192", "8192", "8192", "--precision", "bf16", "--target", "sm_90"]),
    ("8192³ int8 sm_90", ["8192", "8192", "8192", "--precision", "int8", "--target", "sm_90"]),
    ("8192³ fp16 sm_86", ["8192", "8192", "8192", "--precision", "fp16", "--target", "sm_86"]),
    ("8192³ bf16 sm_80", ["8192", "8192", "8192", "--precision", "bf16", "--target", "sm_80"]),
    ("512×14336×4096 bf16 sm_90a --emit", ["512", "14336", "4096", "--precision", "bf16", "--target", "sm_90a"]),
    ("512×14336×4096 fp16 sm_86", ["512", "14336", "4096", "--precision", "fp16", "--target", "sm_86"]),
    ("16384³ bf16 sm_90", ["16384", "16384", "16384", "--precision", "bf16", "--target", "sm_90"]),
]


def run(args: list[str]) -> tuple[float, float, int, str]:
    """(seconds, peak GB, exit status, the check line) of one CLI run in its own process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "spatialc", "gemm", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    check = next((line.strip() for line in out.splitlines() if line.strip().startswith(("check", "spatialc:"))), "")
    return seconds, usage.ru_maxrss / 1e6, proc.returncode, check  # ru_maxrss: KiB on Linux


def main(quick: bool) -> None:
    rows = ROWS[:2] if quick else ROWS
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in rows:
            if "--emit" in name:
                args = [*args, "--emit", os.path.join(tmp, "emit")]
            base_s, base_gb, _, _ = run([*args, "--check", "none"])
            s, gb, rc, check = run(args)
            print(
                f"{name:36} default: {s:5.1f} s {gb:5.2f} GB (exit {rc});"
                f" --check none: {base_s:4.1f} s {base_gb:4.2f} GB;"
                f"  ratio {s / base_s:.1f}x\n    {check[:150]}"
            )


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])

"""The tutorial's chapter "Block-scaled fp8 GEMMs" runs and prints what it shows; examples/fp8_blockscaled.py runs
and says OK; the schedule line the chapter quotes is the printer's."""

from __future__ import annotations

import re
import runpy
import shutil
from pathlib import Path

import pytest

import spatialc
from spatialc.ir.printer import program_text

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = (ROOT / "docs" / "tutorial.md").read_text().split("## 16. Block-scaled fp8 GEMMs")[1].split("\n## ")[0]


def test_the_chapter_runs_and_prints_what_it_shows(capsys):
    (body,) = re.findall(r"```python\n(.*?)```", CHAPTER, re.S)
    exec(compile(body, "docs/tutorial.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    shown = [line.removeprefix("# ") for line in body.splitlines() if line.startswith("# ")]
    assert printed == shown


def test_the_quoted_schedule_line_is_the_printers():
    p = spatialc.build(spatialc.gemm(64, 256, 384, "e4m3", scales=("1x128", "128x128")), "sm_89")
    quoted = re.search(r"    (Compute matmul .*) …", CHAPTER).group(1)  # type: ignore[union-attr]
    assert quoted in program_text(p)


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the example's kernel runs through the host emulation")
def test_the_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "fp8_blockscaled.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count(": OK,") == 2 and "WRONG" not in out

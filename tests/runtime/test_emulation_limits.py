"""The emulation at real sizes: refused before it allocates, never minutes of growing memory."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest

import spatialc
from spatialc.runtime import emu_run
from spatialc.runtime import emulate as E


def test_an_emulation_past_its_memory_is_refused_before_anything_is_made():
    """8192³ int8: about 8 GiB of text, tiles and device copies. The refusal comes before inputs are checked,
    files written or g++ run — with inputs that are not even arrays."""
    p = spatialc.build(spatialc.gemm(8192, 8192, 8192, "int8"), "sm_86")
    a = spatialc.lower(p)
    assert E.emulation_bytes(a.launch) > 4 * 2**30
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(E.EmulationTooLarge, match=r"emulating this kernel takes about \d+\.\d GiB .* more than 2\.0"):
        spatialc.emulate(a, {"A": None, "B": None})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.perf_counter() - t0 < 1.0 and peak < 2**20
    small = spatialc.lower(spatialc.build(spatialc.gemm(32, 32, 32, "int8"), "sm_86"))
    assert E.emulation_bytes(small.launch) < 2**20  # a small kernel is far from the bound
    with pytest.raises(E.EmulationTooLarge):
        spatialc.emulate(small, {}, max_bytes=1000)  # the bound is the caller's to set


def test_input_files_are_written_a_chunk_at_a_time_and_read_back_the_same(tmp_path, monkeypatch):
    values = np.arange(-500, 537, dtype=np.int64).reshape(61, 17)
    floats = np.linspace(-3.0, 7.0, 1037).astype(np.float32)
    monkeypatch.setattr(emu_run, "VALUES_CHUNK", 100)
    for name, v in (("i.txt", values), ("f.txt", floats)):
        E.write_values(tmp_path / name, v)
        assert (tmp_path / name).read_text() == E.format_values(v)  # the same text as formatted whole


def test_the_cli_says_so_in_one_line_and_exits_2():
    run = subprocess.run(
        [sys.executable, "-m", "spatialc", "gemm", "8192", "8192", "8192", "--target", "sm_86", "--run"]
        + ["--check", "none", "--precision", "int8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("spatialc: error:")]
    assert len(errors) == 1 and "emulating this kernel takes about" in errors[0]

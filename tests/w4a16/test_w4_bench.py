"""bench/w4a16_rows.py's dry run: each row's bytes, its program built and verified, its kernel line; and --gpu
without a device exits 2 with one line."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("w4a16_rows", ROOT / "bench" / "w4a16_rows.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["w4a16_rows"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_rows_are_the_issues_sizes(bench):
    names = [r.name for r in bench.rows()]
    assert len(names) == 12 and "w4:int4:1x4096x4096" in names and "w4:mxfp4:64x14336x14336" in names


def test_bytes_read_count_packed_weights_scales_zeros_a_and_c(bench):
    int4, mx = bench.Row(1, 4096, 4096, "int4"), bench.Row(1, 4096, 4096, "mxfp4")
    weights = 4096 * 4096 // 2
    assert int4.bytes_read() == weights + 32 * 4096 * 3 + 2 * 4096 + 2 * 4096
    assert mx.bytes_read() == weights + 128 * 4096 + 2 * 4096 + 2 * 4096


def test_the_dry_run_builds_each_row_and_names_its_kernel(bench):
    lines = bench.dry_run([bench.Row(1, 256, 256, "int4"), bench.Row(16, 128, 256, "mxfp4")])
    assert len(lines) == 3
    for line in lines[1:]:
        assert "block " in line and "kernel: printed (general form), launched by spatialc.run" in line
        assert re.search(r"\d arguments bound \([12] laid out as 4-bit bytes on the host\), timed beside torch$", line)


def test_gpu_mode_without_a_device_is_one_line_and_status_2(bench, capsys, monkeypatch):
    try:
        import torch
    except ImportError:
        monkeypatch.setitem(sys.modules, "torch", None)  # import torch then fails, as without it
        assert bench.main(["--gpu"]) == 2
        assert capsys.readouterr().err.strip() == "w4a16_rows: --gpu needs torch"
        return
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the measured run is not a unit test")
    assert bench.main(["--gpu"]) == 2
    assert capsys.readouterr().err.strip() == "w4a16_rows: --gpu needs a CUDA device"

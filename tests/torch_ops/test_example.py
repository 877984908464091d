"""examples/torch_mlp.py runs as the README says."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_mlp.py"


def test_the_torch_example_runs(capsys):
    spec = importlib.util.spec_from_file_location("torch_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "activation=silu" in out and "of the magnitudes summed" in out

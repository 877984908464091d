"""The printed CUDA of a few small programs against reviewed golden files (regenerate: python tests/golden/regen.py)."""

import difflib
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("golden_regen", Path(__file__).parents[1] / "golden" / "regen.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_the_printed_program_matches_its_golden_file(name):
    want = golden.path(name).read_text()
    got = golden.render(name)
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "printed", n=2))
        pytest.fail(f"{name} differs from its golden file (python tests/golden/regen.py, then review):\n{diff[:4000]}")

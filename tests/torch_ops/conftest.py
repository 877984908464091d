"""Each torch test keeps its built programs in a folder of its own, not the user's cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path / "cache"))

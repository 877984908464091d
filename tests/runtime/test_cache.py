"""One cache root for everything spatialc builds: the emulation's binaries and nvcc's cubins both follow
SPATIALC_CACHE (README's environment line), else XDG_CACHE_HOME, else ~/.cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from spatialc.runtime import emulate, nvcc


def test_every_cache_follows_spatialc_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert nvcc.cache_dir() == tmp_path / "mine" / "cubin"
    assert emulate.cache_dir() == tmp_path / "mine" / "emu" and emulate.cache_dir().is_dir()
    monkeypatch.delenv("SPATIALC_CACHE")
    assert nvcc.cache_dir() == tmp_path / "xdg" / "spatialc" / "cubin"
    assert emulate.cache_dir() == tmp_path / "xdg" / "spatialc" / "emu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert nvcc.cache_dir() == Path(tmp_path / "home" / ".cache" / "spatialc" / "cubin")


@pytest.mark.skipif(nvcc.find_nvcc() is None, reason="nvcc is not installed")
def test_a_cached_cubin_is_found_without_compiling(monkeypatch, tmp_path):
    """What the launcher checks before a launch: the cubin the device compiled, looked up, never made again."""
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path))
    source = "__global__ void k() {}"
    assert nvcc.cached_cubin(source, "sm_90") is None
    path = nvcc.compile_cubin(source, "sm_90")
    assert nvcc.cached_cubin(source, "sm_90") == path and nvcc.cached_cubin(source, "sm_80") is None


def test_a_smoke_test_that_reaches_the_emulations_compiler_fails_by_name(request):
    assert request.node.get_closest_marker("smoke") is not None  # test_cache is one of conftest's SMOKE_MODULES
    from spatialc.runtime import emu_compile

    with pytest.raises(AssertionError, match=r"compiles with g\+\+: mark it pytest.mark.emulation"):
        emu_compile._compiler()

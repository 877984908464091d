"""Each torch test keeps its built programs in a folder of its own, not the user's cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path / "cache"))


class CudaStandIn:
    """What a test of the CUDA branch patches so that CPU tensors pass through it: torch's device and stream
    calls, CuPy's stream and allocator (none here), and whether a graph is being captured (`capturing`)."""

    def __init__(self, monkeypatch):
        import contextlib

        import torch

        import spatialc.torch as sct

        self.capturing = False
        monkeypatch.setattr(sct.family, "_stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(sct.family, "_torch_memory", contextlib.nullcontext)
        monkeypatch.setattr(sct.family, "_capturing", lambda: self.capturing)
        monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda d: None)


@pytest.fixture
def cuda_stand_in(monkeypatch):
    """The CUDA branch run with CPU tensors (`CudaStandIn`); the test gives the device (`family._gpu_device`)."""
    return CudaStandIn(monkeypatch)

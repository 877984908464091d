"""The core imports with numpy alone; spatialc.torch without torch is one typed line that says what to install."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import spatialc
from spatialc.errors import TorchUnavailable


def test_spatialc_torch_without_torch_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as where it is not installed
    monkeypatch.delitem(sys.modules, "spatialc.torch", raising=False)
    with pytest.raises(TorchUnavailable, match=r"pip install 'spatialc\[torch\]'") as e:
        importlib.import_module("spatialc.torch")
    assert isinstance(e.value, ImportError) and isinstance(e.value, spatialc.SpatialError)
    assert "\n" not in str(e.value)


def test_the_core_needs_no_torch():
    code = (
        "import sys; sys.modules['torch'] = None; import spatialc;"
        "p = spatialc.build(spatialc.gemm(16, 16, 16, 'bf16'));"
        "assert 'spatialc.torch' not in sys.modules; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_spatialc_torch_does_not_shadow_torch():
    torch = pytest.importorskip("torch")
    import spatialc.torch as sct
    from spatialc.runtime.launch import _torch_bf16

    assert sct.torch is torch is sys.modules["torch"] and hasattr(torch, "library")
    assert _torch_bf16() is torch.bfloat16  # spatialc's own `import torch`, inside the package, is the real one

"""Fixtures the GPU check's tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpucheck --prepare` without nvcc: a toolkit is "found" (version "fake nvcc") and each kernel's "cubin" is
    its text, written under its source hash, with ptxas "not reported". A test that needs nvcc gone again (the dry
    run) sets `find_nvcc` back itself."""
    from spatialc.gpucheck import prepare
    from spatialc.runtime import nvcc as N

    monkeypatch.setattr(N, "find_nvcc", lambda: "/nonexistent/nvcc")
    monkeypatch.setattr(N, "nvcc_version", lambda nvcc: "fake nvcc")

    def compile_kernel(form, arch, timeout_s, cache):
        path = cache / f"{prepare.source_hash(form.artifact.kernel_cu)[:16]}.cubin"
        path.write_bytes(form.artifact.kernel_cu.encode())
        form.facts["ptxas"] = "not reported"
        return path

    monkeypatch.setattr(prepare, "compile_kernel", compile_kernel)

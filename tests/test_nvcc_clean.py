"""What the device mode of tests/nvcc_clean.py rests on: nvcc's device front end parses the whole translation unit,
so a device-only compile (-cubin) still refuses host code that is not valid C++, and a warning anywhere (-Werror
all-warnings) — the tests that compile device-only leave only gcc's own host warnings to a host-mode compile."""

import pytest

from .nvcc_clean import NVCC, nvcc_device

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")]

KERNEL = "__global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n"


def test_a_device_only_compile_refuses_an_error_and_a_warning_in_host_code(tmp_path):
    host = "int launch(float* x) {{ k<<<1, 32>>>(x); {} return 0; }}\n"
    undefined = nvcc_device(KERNEL + host.format("spatialc_undeclared();"), tmp_path / "undefined.cu", ("90",))
    assert undefined.returncode != 0 and 'identifier "spatialc_undeclared" is undefined' in undefined.stderr
    unused = nvcc_device(KERNEL + host.format("int spatialc_unused = 1;"), tmp_path / "unused.cu", ("90",))
    assert unused.returncode != 0 and '"spatialc_unused" was declared but never referenced' in unused.stderr

"""The emulation's narrow floats (emu_half.h: __half, __nv_bfloat16, __nv_fp8_e4m3, __nv_fp8_e5m2) convert to float
exactly as ml_dtypes does, for every code of each format: the emulated tensor cores decode every operand they read
through these conversions, whose normal numbers take a fast path built from the bits (decode_normal). A fast path
with its exponent off by one is told apart by the same comparison."""

from __future__ import annotations

import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from spatialc.runtime import emu_compile

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++"),
]

HARNESS = """
#include <cstdio>
#include "emu_half.h"
using namespace spatialc_emu;
template <class T> void all(unsigned n) {
    for (unsigned b = 0; b < n; ++b) {
        T v;
        std::memcpy(&v, &b, sizeof v);  // little-endian: the code's low bytes
        const float f = float(v), d = float(double(v));
        std::fwrite(&f, sizeof f, 1, stdout);
        std::fwrite(&d, sizeof d, 1, stdout);
    }
}
int main() {
    all<__half>(1u << 16);
    all<__nv_bfloat16>(1u << 16);
    all<__nv_fp8_e4m3>(256);
    all<__nv_fp8_e5m2>(256);
}
"""
FORMATS = (
    (np.float16, 1 << 16, np.uint16),
    (ml_dtypes.bfloat16, 1 << 16, np.uint16),
    (ml_dtypes.float8_e4m3fn, 256, np.uint8),
    (ml_dtypes.float8_e5m2, 256, np.uint8),
)


def decoded(headers, tmp_path) -> list[str]:
    """Each format's codes whose float or double the emulation's types give differently from ml_dtypes."""
    src = tmp_path / "decode.cpp"
    src.write_text(HARNESS)
    exe = tmp_path / "decode"
    subprocess.run(["g++", "-std=c++20", "-O1", "-I", str(headers), str(src), "-o", str(exe)], check=True)
    out = np.frombuffer(subprocess.run([str(exe)], capture_output=True, check=True).stdout, dtype=np.float32)
    wrong, at = [], 0
    for dtype, n, bits in FORMATS:
        want = np.arange(n, dtype=bits).view(dtype).astype(np.float32)
        got = out[at : at + 2 * n].reshape(n, 2)
        at += 2 * n
        for col in (0, 1):
            same = (got[:, col].view(np.uint32) == want.view(np.uint32)) | (np.isnan(got[:, col]) & np.isnan(want))
            wrong += [f"{np.dtype(dtype).name} code {c:#x}" for c in np.flatnonzero(~same)[:3]]
    assert at == len(out)
    return wrong


def test_every_code_of_each_narrow_float_converts_as_ml_dtypes_does(tmp_path):
    assert decoded(emu_compile.HEADER_DIR, tmp_path) == []


def test_a_fast_path_with_its_exponent_off_by_one_is_told_apart(tmp_path):
    headers = tmp_path / "emu"
    shutil.copytree(emu_compile.HEADER_DIR, headers)
    half = headers / "emu_half.h"
    right = "uint32_t(ef - bias + 127) << 23"
    assert right in half.read_text()
    half.write_text(half.read_text().replace(right, "uint32_t(ef - bias + 128) << 23"))
    wrong = decoded(headers, tmp_path)
    assert {w.split(" code")[0] for w in wrong} == {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}, wrong

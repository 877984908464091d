"""The C text of the dequantisation (lower/cuda/common/dequant.cuh), compiled with g++ against the host emulation's
bf16 / fp16 types exactly as a kernel is, computes numerics.w4.dequant bit for bit: every code of every format,
scales of each type (fp32 ones that round, bf16 ones, e8m0 from 2^-127 to 2^127), zero points across the range, both
operand types — and a printed unpacking or scale type that were wrong would be told apart by the same harness."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.numerics import w4

CUDA = Path(spatialc.__file__).parent / "lower" / "cuda"
EMU = Path(spatialc.__file__).parent / "runtime" / "emu"

HARNESS = """
#include <cstdio>
#include <cstring>
#include <cmath>
#define __device__
#define __forceinline__ inline
#include "emu_half.h"
{header}
static float bits(unsigned u) {{ float f; std::memcpy(&f, &u, 4); return f; }}
int main() {{
{body}
    return 0;
}}
"""

VALUE = {"int4": "spatialc_w4_int4", "uint4": "spatialc_w4_uint4", "mxfp4": "spatialc_w4_e2m1"}
ZEROS = {"int4": (-8, -3, 0, 5, 7), "uint4": (0, 8, 15), "mxfp4": (0,)}


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", np.float32(x)))[0]


def scales(rng: np.random.Generator) -> list[tuple[str, float]]:
    """(C expression of the scale in float32, its value) for scales of each type."""
    out = [(f"bits({f32_bits(s)}u)", float(np.float32(s))) for s in rng.uniform(0.004, 0.03, 6)]
    out += [(f"bits({f32_bits(s)}u)", float(np.float32(s))) for s in (1 / 3, -7.1e-5, 3.0e38)]
    out += [(f"bits({f32_bits(s)}u)", float(s)) for s in rng.uniform(0.004, 0.03, 4).astype(ml_dtypes.bfloat16)]
    out += [(f"spatialc_e8m0_value({c})", 2.0 ** (c - 127)) for c in (0, 1, 100, 123, 127, 128, 200, 254)]
    return out


def cases(rng: np.random.Generator) -> list[tuple[str, int, str, float, int, str]]:
    found = []
    for fmt, zeros in ZEROS.items():
        for code in range(16):
            for c_scale, scale in scales(rng):
                for zero in zeros:
                    for operand in ("bf16", "fp16"):
                        found.append((fmt, code, c_scale, scale, zero, operand))
    return found


def expected_bits(fmt: str, code: int, scale: float, zero: int, operand: str) -> int:
    q = float(w4.from_codes(np.array([code], np.uint8), w4.format_dtype(fmt)).astype(np.float64)[0])
    d = w4.dequant(np.array([q]), np.array([scale]), None if fmt == "mxfp4" else np.array([zero]), operand)
    typed = d.astype(ml_dtypes.bfloat16 if operand == "bf16" else np.float16)
    return int(typed.view(np.uint16)[0])


@pytest.mark.emulation
def test_the_dequant_c_computes_numerics_w4_bit_for_bit(tmp_path):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    rng = np.random.default_rng(34)
    found = cases(rng)
    lines = [
        f'    printf("%u\\n", (unsigned)spatialc_dequant_{op}({VALUE[fmt]}({code}u), {c_scale}, {float(z)!r}f).__x);'
        for fmt, code, c_scale, _, z, op in found
    ]
    src = HARNESS.format(header=(CUDA / "common" / "dequant.cuh").read_text(), body="\n".join(lines))
    exe = tmp_path / "dequant"
    # -O0: main is one long run of printf lines, which g++ takes twice as long to build at -O2 (8.4 s against 4.7 s
    # on a busy machine); the arithmetic is the same IEEE float code either way (SSE, no contraction).
    subprocess.run(
        [cxx, "-std=c++20", "-O0", "-ffp-contract=off", f"-I{EMU}", "-x", "c++", "-", "-o", str(exe)],
        input=src,
        text=True,
        check=True,
    )
    printed = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert len(printed) == len(found)
    want = [expected_bits(fmt, code, scale, z, op) for fmt, code, _, scale, z, op in found]
    wrong = [(case[:2], case[3:], got, w) for case, got, w in zip(found, printed, want, strict=True) if got != w]
    assert not wrong, wrong[:5]
    # The comparison tells formats apart: reading int4 codes as uint4 (no sign extension) changes codes 8..15.
    as_uint = [expected_bits("uint4", code, s, z, op) for fmt, code, _, s, z, op in found if fmt == "int4"]
    as_int = [w for (fmt, *_), w in zip(found, want, strict=True) if fmt == "int4"]
    assert sum(a != b for a, b in zip(as_uint, as_int, strict=True)) > len(as_int) // 3

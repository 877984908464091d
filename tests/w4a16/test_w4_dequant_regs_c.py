"""The register path's C text (dequant.cuh's spatialc_w4_regs: a lane's 32-bit word of packed weights to its four
mma.sync B registers), compiled with g++ against the host emulation's bf16 / fp16 types exactly as a kernel is,
computes numerics.w4.dequant bit for bit for every nibble of the word, in the fragment's order: every code of every
format at every nibble, scales of each type (float32 ones that round, bf16, e8m0 from 2^-127 to 2^127) and zero points
per column, both operand types; and the nibble order it is told (LOW_FIRST) is the one it reads, so a swapped one
is told apart."""

from __future__ import annotations

import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from spatialc.numerics import w4

from .test_w4_dequant_c import CUDA, EMU, HARNESS, ZEROS, scales

FORMAT = {"int4": 0, "uint4": 1, "mxfp4": 2}
CTYPE = {"bf16": "__nv_bfloat16", "fp16": "__half"}


def dequant_bits(fmt: str, code: int, scale: float, zero: int, operand: str) -> int:
    q = float(w4.from_codes(np.array([code], np.uint8), w4.format_dtype(fmt)).astype(np.float64)[0])
    d = w4.dequant(np.array([q]), np.array([scale]), None if fmt == "mxfp4" else np.array([zero]), operand)
    return int(d.astype(ml_dtypes.bfloat16 if operand == "bf16" else np.float16).view(np.uint16)[0])


def expected(fmt, word, s, z, operand, low_first=True) -> list[int]:
    """Register i of the lane: bytes i of `word`, two consecutive K values of column n (i < 2) or n + 8, the even
    row (pack_int4's low nibble where `low_first`) in the low half."""
    regs = []
    for i in range(4):
        byte = (word >> (8 * i)) & 0xFF
        even, odd = (byte & 15, byte >> 4) if low_first else (byte >> 4, byte & 15)
        col = 0 if i < 2 else 1
        lo, hi = (dequant_bits(fmt, c, s[col], z[col], operand) for c in (even, odd))
        regs.append(lo | (hi << 16))
    return regs


def cases(rng):
    found = []
    pool = scales(rng)
    for fmt, zeros in ZEROS.items():
        for operand in CTYPE:
            for a, (c0, s0) in enumerate(pool):
                c1, s1 = pool[(a * 7 + 3) % len(pool)]
                z0, z1 = zeros[a % len(zeros)], zeros[(a + 1) % len(zeros)]
                words = [0x76543210, 0xFEDCBA98, *(int(w) for w in rng.integers(0, 2**32, 3, dtype=np.uint64))]
                for word in words:
                    found.append((fmt, operand, word, (c0, c1), (s0, s1), (z0, z1)))
    return found


@pytest.mark.emulation
def test_the_register_dequant_computes_numerics_w4_bit_for_bit(tmp_path):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    found = cases(np.random.default_rng(35))
    lines = []
    for fmt, operand, word, (c0, c1), _, (z0, z1) in found:
        f = FORMAT[fmt]
        for low in ("true", "false"):
            lines.append(
                f"    {{ unsigned r[4]; spatialc_w4_regs<{f}, {low}, {CTYPE[operand]}>(r, {word}u, {c0}, {c1},"
                f" spatialc_w4_bias<{f}>({z0}), spatialc_w4_bias<{f}>({z1}));"
                ' printf("%u %u %u %u\\n", r[0], r[1], r[2], r[3]); }'
            )
    src = HARNESS.format(header=(CUDA / "common" / "dequant.cuh").read_text(), body="\n".join(lines))
    exe = tmp_path / "regs"
    subprocess.run(
        [cxx, "-std=c++20", "-O2", "-ffp-contract=off", f"-I{EMU}", "-x", "c++", "-", "-o", str(exe)],
        input=src,
        text=True,
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    printed = [[int(x) for x in line.split()] for line in out if line.strip()]
    assert len(printed) == 2 * len(found)
    wrong, swapped_differs = [], 0
    for n, (fmt, operand, word, _, s, z) in enumerate(found):
        want = expected(fmt, word, s, z, operand)
        if printed[2 * n] != want:
            wrong.append((fmt, operand, hex(word), s, z, printed[2 * n], want))
        swapped = expected(fmt, word, s, z, operand, low_first=False)
        if printed[2 * n + 1] != swapped:
            wrong.append(("high first", fmt, operand, hex(word), printed[2 * n + 1], swapped))
        swapped_differs += swapped != want
    assert not wrong, wrong[:3]
    assert swapped_differs > len(found) * 3 // 4  # the nibble order is seen: most words read the other way differ

"""The C text of an MXFP8 kernel's promotion (lower/cuda/common/mx_promote.cuh), compiled with g++ against the host
emulation as a kernel is: acc + part · 2^(ca − 127) · 2^(cb − 127) rounded once to float32, for every pair of e8m0
codes 0 … 254 — the interpreter's promotion (numerics.blockscale.promote: the product exact in float64, one
rounding) — where a float32 product of the two scales (the float32 scales' promotion) is inf, NaN or 0 at the
range's ends, as the same harness shows."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc.numerics.blockscale import promote

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
static unsigned of(float f) {{ unsigned u; std::memcpy(&u, &f, 4); return u; }}
int main() {{
    const unsigned parts[] = {{{parts}}};
    const unsigned accs[] = {{{accs}}};
    for (unsigned p : parts)
        for (unsigned a : accs)
            for (int ca = 0; ca < 255; ++ca)
                for (int cb = 0; cb < 255; ++cb) {{
                    const float sa = spatialc_e8m0_value(ca), sb = spatialc_e8m0_value(cb);
                    printf("%x %x\\n", of(spatialc_mx_promote(bits(p), ca, cb, bits(a))),
                           of(fmaf(bits(p), sa * sb, bits(a))));
                }}
    return 0;
}}
"""

# Partial sums of a step (float32: an exact e4m3 product 2^-18, sums to 2^22.6, zero) and accumulators.
PARTS = np.array([1.0, -1.5, 2.0**-18, 1.375 * 2.0**-20, -(2.0**22) * 1.71875, 0.0], np.float32)
ACCS = np.array([0.0, 0.75], np.float32)


@pytest.mark.emulation
def test_the_promotion_c_is_the_interpreters_for_every_pair_of_codes(tmp_path):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    header = "\n".join((CUDA / "common" / n).read_text() for n in ("dequant.cuh", "mx_promote.cuh"))
    src = HARNESS.format(
        header=header,
        parts=", ".join(f"{v}u" for v in PARTS.view(np.uint32)),
        accs=", ".join(f"{v}u" for v in ACCS.view(np.uint32)),
    )
    exe = tmp_path / "promote"
    subprocess.run(
        [cxx, "-std=c++20", "-O2", "-ffp-contract=off", f"-I{EMU}", "-x", "c++", "-", "-o", str(exe)],
        input=src,
        text=True,
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    got = np.array([int(x, 16) for x in out], np.uint32).reshape(len(PARTS), len(ACCS), 255, 255, 2)
    codes = np.arange(255, dtype=np.float64)
    sa, sb = np.exp2(codes - 127), np.exp2(codes - 127)
    with np.errstate(over="ignore"):
        for i, part in enumerate(PARTS):
            for j, acc in enumerate(ACCS):
                exact = promote(np.full((255, 255), float(part)), sa, sb) + float(acc)  # exact in float64
                want = exact.astype(np.float32).view(np.uint32)
                wrong = np.argwhere(got[i, j, :, :, 0] != want)
                assert not len(wrong), (float(part), float(acc), wrong[:5].tolist())
    # The float32 product of the scales differs where it leaves float32's range: inf (NaN on a zero part), or 0.
    old = got[..., 1].view(np.float32)
    assert np.isnan(old[PARTS == 0]).any() and np.isinf(old).any()
    assert (got[..., 0] != got[..., 1]).sum() > 255 * 255 // 4

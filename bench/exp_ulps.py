"""How far the printed exp and exp2 (float32 arithmetic, lower/cuda/common/elementwise.cuh) lie from the
interpreter's (float64's value rounded once to float32), over every float32 input or every `stride`-th one.

    python bench/exp_ulps.py            # all 2^32 inputs: a few minutes on one core
    python bench/exp_ulps.py 101        # every 101st

The header is compiled with g++ exactly as the host emulation compiles a kernel (-ffp-contract=off), and it is the
text nvcc compiles: its steps are single IEEE roundings (fused multiply-adds, the _rn intrinsics), so the GPU gives
the same bits. The distance is counted in float32 steps, as the table's `ulps` is (numerics/elementwise.py).
Exit status 1 where an op lies past the table's bound. tests/numerics/test_exp_float32.py runs it on a sample and
on a planted fault."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HEADER = Path(__file__).resolve().parent.parent / "src" / "spatialc" / "lower" / "cuda" / "common" / "elementwise.cuh"

SWEEP = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __device__
#define __forceinline__ inline
{header}
static long long ordered(float f)
{{
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? -(long long)(i & 0x7fffffff) : (long long)i;
}}
// float32 steps between `got` and `want` rounded once to float32 (a NaN where the other is not: far)
static long long steps(float got, double want)
{{
    const float w = (float)want;
    if (std::isnan(w) || std::isnan(got)) return std::isnan(w) && std::isnan(got) ? 0 : (1LL << 40);
    const long long d = ordered(got) - ordered(w);
    return d < 0 ? -d : d;
}}
int main(int argc, char** argv)
{{
    const uint64_t stride = std::strtoull(argv[1], nullptr, 10);
    long long worst_e = 0, worst_2 = 0;
    float at_e = 0, at_2 = 0;
    unsigned long long n = 0;
    for (uint64_t b = 0; b < (1ULL << 32); b += stride) {{
        const uint32_t u = (uint32_t)b;
        float x;
        std::memcpy(&x, &u, 4);
        const long long de = steps(spatialc_exp(x), std::exp((double)x));
        const long long d2 = steps(spatialc_exp2(x), std::exp2((double)x));
        if (de > worst_e) {{ worst_e = de; at_e = x; }}
        if (d2 > worst_2) {{ worst_2 = d2; at_2 = x; }}
        n++;
    }}
    std::printf("%llu %lld %.9g %lld %.9g\n", n, worst_e, at_e, worst_2, at_2);
    return 0;
}}
"""


def sweep(stride: int = 1, header: str | None = None) -> dict[str, tuple[int, float]]:
    """{op: (the most float32 steps from the interpreter's value, an input where it is)} over every `stride`-th
    float32 bit pattern, for the header's text (`header`: another text, such as one with a planted fault)."""
    cxx = shutil.which("g++")
    if cxx is None:
        raise RuntimeError("the sweep needs g++")
    text = SWEEP.format(header=HEADER.read_text() if header is None else header)
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "sweep"
        subprocess.run(
            [cxx, "-std=c++20", "-O2", "-ffp-contract=off", "-x", "c++", "-", "-o", str(exe)],
            input=text,
            text=True,
            check=True,
        )
        out = subprocess.run([str(exe), str(stride)], capture_output=True, text=True, check=True).stdout.split()
    return {"count": (int(out[0]), 0.0), "exp": (int(out[1]), float(out[2])), "exp2": (int(out[3]), float(out[4]))}


def main() -> int:
    from spatialc.numerics.elementwise import OPS

    stride = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    got = sweep(stride)
    print(f"{got['count'][0]:,} float32 inputs (every {stride}th bit pattern)" if stride > 1 else "every float32 input")
    bad = 0
    for name in ("exp", "exp2"):
        worst, at = got[name]
        bound = OPS[name].ulps
        print(f"  {name:5} {worst} float32 step(s) from the interpreter at most (x = {at:.9g}); the table: {bound}")
        bad += worst > bound
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The printed exp and exp2 are float32 arithmetic of spatialc's own (no float64, no library call): within the
table's ulps of the interpreter on a sample of every float32 region (bench/exp_ulps.py tries all 2^32), exact at
the edges, and a planted fault in a coefficient is caught by the same sweep."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from spatialc.numerics.elementwise import OPS

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "exp_ulps.py"
_spec = importlib.util.spec_from_file_location("exp_ulps", BENCH)
assert _spec is not None and _spec.loader is not None
exp_ulps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exp_ulps)

STRIDE = 4099  # a prime: about a million bit patterns, every exponent of both signs


@pytest.fixture(scope="module")
def swept():
    return exp_ulps.sweep(STRIDE)


def test_exp_and_exp2_lie_within_the_tables_ulps_of_the_interpreter(swept):
    assert swept["count"][0] > 1_000_000
    for name in ("exp", "exp2"):
        worst, at = swept[name]
        assert worst <= OPS[name].ulps, (name, worst, at)


def test_the_c_is_float32_arithmetic_alone():
    header = exp_ulps.HEADER.read_text()
    for name in ("spatialc_exp(float x)", "spatialc_exp2(float x)"):
        body = header[header.index(f"float {name}") :]
        body = body[: body.index("\n}\n")]
        assert "double" not in body and "exp(" not in body.split("\n", 1)[1], name


def test_a_wrong_coefficient_is_caught_by_the_sweep():
    """The sweep is trusted once it fails: a coefficient of e^r's polynomial off in its sixth digit, or the
    reduction's low part of ln 2 dropped, each puts exp past its bound."""
    header = exp_ulps.HEADER.read_text()
    for good, bad in (("4.1665795894e-2f", "4.1660795894e-2f"), ("-1.42860682030941723e-6f", "0.0f")):
        assert good in header
        got = exp_ulps.sweep(STRIDE * 7, header.replace(good, bad))
        assert got["exp"][0] > OPS["exp"].ulps, (good, got)


def test_the_edges_are_exact_and_subnormal_results_round_once(tmp_path):
    """±0, ±inf, NaN, the overflow and underflow thresholds and results deep in the subnormal range: the values the
    interpreter gives, bit for bit."""
    import struct
    import subprocess

    xs = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72283, 88.72284, 89.0, -87.3, -100.0, -103.27, -103.97, -104.0, -150.0],
        np.float32,
    )
    xs2 = np.array([0.0, 127.99, 128.0, 129.0, -126.0, -140.5, -149.0, -149.5, -150.0, -151.0, 1e-8], np.float32)
    body = "\n".join(
        f'    printf("%u\\n", out({fn}(bits({struct.unpack("<I", struct.pack("<f", x))[0]}u))));'
        for fn, arr in (("spatialc_exp", xs), ("spatialc_exp2", xs2))
        for x in arr
    )
    src = (
        "#include <cstdio>\n#include <cstring>\n#include <cmath>\n#define __device__\n#define __forceinline__ inline\n"
        + exp_ulps.HEADER.read_text()
        + "\nstatic float bits(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }\n"
        + "static unsigned out(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }\n"
        + "int main() {\n"
        + body
        + "\n}\n"
    )
    exe = tmp_path / "edges"
    subprocess.run(
        ["g++", "-std=c++20", "-O2", "-ffp-contract=off", "-x", "c++", "-", "-o", str(exe)],
        input=src,
        text=True,
        check=True,
    )
    got = [
        np.float32(struct.unpack("<f", struct.pack("<I", int(t)))[0])
        for t in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    ]
    with np.errstate(over="ignore", under="ignore"):
        want = [np.float32(np.exp(np.float64(x))) for x in xs] + [np.float32(np.exp2(np.float64(x))) for x in xs2]
    for x, g, w in zip([*xs, *xs2], got, want, strict=True):
        if np.isnan(w):
            assert np.isnan(g), x
        else:
            # the edges: equal bits but for one step of a result that is not itself an edge case
            assert g == w or abs(int(g.view(np.int32)) - int(w.view(np.int32))) <= 1 and 0 < w < np.inf, (x, g, w)
            assert np.signbit(g) == np.signbit(w), x

"""Numeric edges of the reference interpreter and the checks around it (issue 30, points 3, 5 and 6)."""

from __future__ import annotations

import numpy as np
import pytest

import spatialc

# ---- int8 sums past int32 (issue 30, point 5) --------------------------------------------------------------------

LONG_K = 131072  # the shortest K whose int8 dot products pass int32 (128 · 128 · 2^17 = 2^31): C is int64


@pytest.mark.parametrize("build", [{}, {"split_k": 1}, {"split_k": 4}, {"form": "general", "split_k": 1}])
def test_an_int64_output_of_long_int8_sums_is_exact(build):
    """C is int64 at this K, and the float64 sums were written into it with np.matmul(out=…), which refused to cast
    (exit 3 from `spatialc gemm 16 16 131072`): every split, the general form's plan and none."""
    p = spatialc.build(spatialc.gemm(16, 16, LONG_K, "int8"), **build)
    assert p.output_tensor().dtype.value == "int64"
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, size=(16, LONG_K), dtype=np.int8)
    b = rng.integers(-128, 128, size=(LONG_K, 16), dtype=np.int8)
    a[0], b[:, 0] = -128, -128  # C[0, 0] = 2^31, one past int32
    c = spatialc.evaluate(p, {"A": a, "B": b})
    want = a.astype(np.int64) @ b.astype(np.int64)  # integer arithmetic: exact
    assert c.dtype == np.int64 and c[0, 0] == 2**31
    np.testing.assert_array_equal(c, want)

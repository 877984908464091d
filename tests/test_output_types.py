"""C in the type a user asks for: int32 (int8's default) or int64 sums, float32 (the default), fp16 or bf16 for float
programs — the same in the interpreter, the numpy reference and the emulated kernel, within the stated bound."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import spatialc
from spatialc.errors import ProgramError
from spatialc.ir.nodes import DType

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the emulation compiles with g++")


@pytest.mark.parametrize(
    ("args", "kw", "want"),
    [
        (("int8",), {}, DType.INT32),
        (("int8",), {"out": "int64"}, DType.INT64),
        (("int8",), {"epilogue": [spatialc.relu()]}, DType.INT64),
        (("int8",), {"epilogue": [spatialc.relu()], "out": "int32"}, DType.INT32),
        (("int8",), {"epilogue": [spatialc.requant(0.01)]}, DType.INT8),
        (("fp16",), {}, DType.FLOAT32),
        (("fp16",), {"out": "fp16"}, DType.FP16),
        (("bf16",), {"out": "bf16"}, DType.BF16),
    ],
)
def test_the_output_type_is_the_default_or_what_was_asked(args, kw, want):
    assert spatialc.gemm(40, 30, 20, *args, **kw).output_tensor().dtype == want


def test_an_int8_gemm_too_long_for_int32_sums_defaults_to_int64():
    assert spatialc.gemm(16, 16, 131071).output_tensor().dtype == DType.INT32
    assert spatialc.gemm(16, 16, 131072).output_tensor().dtype == DType.INT64


@pytest.mark.parametrize(
    ("args", "kw", "says"),
    [
        (("int8",), {"out": "bf16"}, "int8 program's output is one of int32, int64, not 'bf16'"),
        (("fp16",), {"out": "int32"}, "fp16 program's output is one of float32, fp16, bf16"),
        (("int8",), {"epilogue": [spatialc.requant(0.5)], "out": "int32"}, "a requant's output is int8"),
    ],
)
def test_an_output_type_the_program_cannot_produce_is_refused(args, kw, says):
    with pytest.raises(ProgramError, match=says):
        spatialc.gemm(40, 30, 20, *args, **kw)


@needs_gxx
@pytest.mark.parametrize(("prec", "out", "dtype"), [("fp16", "fp16", np.float16), ("bf16", "bf16", np.float32)])
@pytest.mark.emulation  # compiles with g++
def test_half_outputs_agree_in_the_interpreter_the_reference_and_the_kernel(prec, out, dtype):
    p = spatialc.build(spatialc.gemm(40, 48, 96, prec, epilogue=[spatialc.relu()], out=out), "sm_86")
    rng = np.random.default_rng(3)
    x = {"A": rng.integers(-4, 5, (40, 96)).astype(np.float32), "B": rng.standard_normal((96, 48)).astype(np.float32)}
    x["B"] = np.round(x["B"] * 8) / 8  # exact in bf16 and fp16: no rounding warning, the bound is the sums' alone
    c = spatialc.evaluate(p, x)
    assert c.dtype == dtype
    ok, how = spatialc.tolerance(p).check(c, x)
    assert ok, how
    art = spatialc.lower(p)
    assert [q.c_type for q in art.launch.params if q.role == "output"] == [
        {"fp16": "__half", "bf16": "__nv_bfloat16"}[out]
    ]
    k = spatialc.emulate(art, x)
    assert k.dtype == dtype
    ok, how = spatialc.tolerance(p, kernel=True).check(k, x)
    assert ok, how
    if out == "bf16":  # every value the kernel stored is a bf16 value
        assert np.array_equal(k, spatialc.inputs.round_bf16(k.astype(np.float64)).astype(np.float32))


@needs_gxx
@pytest.mark.emulation  # compiles with g++
def test_int8_sums_stored_as_int32_and_int64_are_exact_in_the_kernel():
    rng = np.random.default_rng(5)
    x = {
        "A": rng.integers(-128, 128, (33, 200)).astype(np.int8),
        "B": rng.integers(-128, 128, (200, 17)).astype(np.int8),
    }
    want = x["A"].astype(np.int64) @ x["B"].astype(np.int64)
    for out, dtype in (("int32", np.int32), ("int64", np.int64)):
        art = spatialc.lower(spatialc.build(spatialc.gemm(33, 17, 200, out=out), "sm_86"))
        c = spatialc.emulate(art, x)
        assert c.dtype == dtype and np.array_equal(c, want)

"""W4A16 GEMMs built, verified and interpreted: the interpreter equals the reference (exactly), which equals the
bf16 / fp16 GEMM of A by the dequantised weights; the frontend's refusals, one typed error each; JSON round trips."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import spatialc
from spatialc.inputs import round_bf16, round_fp16
from spatialc.ir.nodes import DType
from spatialc.ir.printer import program_text
from spatialc.numerics import w4
from spatialc.numerics.reference import reference
from spatialc.weights import WeightError

from .w4_inputs import w4_inputs, w4_program


def dequantised_gemm(p, x) -> np.ndarray:
    """What the program declares, in numpy from the definition: A rounded to the operand type, B dequantised."""
    prec = p.precision.value
    rnd = round_bf16 if prec == "bf16" else round_fp16
    b = p.tensor_named("B")
    fmt = {DType.INT4: "int4", DType.UINT4: "uint4", DType.E2M1: "mxfp4"}[b.dtype]
    q = w4.unpack_int4(x["B"], fmt).astype(np.float64)
    scale_t = p.tensor_named("scale").dtype
    s = x["scale"] if scale_t in (DType.E8M0, DType.FLOAT32) else rnd(x["scale"]) if scale_t.value == prec else None
    if s is None:
        s = round_bf16(x["scale"]) if scale_t == DType.BF16 else round_fp16(x["scale"])
    s = np.asarray(s, np.float64).astype(np.float32) if scale_t == DType.FLOAT32 else s
    group = b.elems[0] // p.tensor_named("scale").elems[0]
    d = w4.dequant_matrix(q, s, x.get("zeros"), group, prec)
    return rnd(x["A"]).astype(np.float64) @ d


CASES = [
    (32, 48, 256, "int4", "bf16", {"zeros": True}),
    (37, 40, 256, "uint4", "fp16", {"zeros": True, "group": 64}),
    (1, 64, 512, "int4", "bf16", {}),
    (16, 96, 128, "mxfp4", "bf16", {}),
    (5, 33, 96, "mxfp4", "fp16", {}),
    (20, 24, 384, "int4", "bf16", {"scale_type": "float32", "group": 32}),
]


@pytest.mark.parametrize(("m", "n", "k", "fmt", "prec", "kw"), CASES)
def test_the_interpreter_equals_the_reference_and_the_dequantised_gemm(m, n, k, fmt, prec, kw):
    p = w4_program(m, n, k, fmt, prec, **kw)
    assert p.verified
    for exact in (True, False):
        x = w4_inputs(p, seed=m + n, exact=exact)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # real-valued A and scales are rounded to the operand type, as said
            c = spatialc.evaluate(p, x)
            ref = reference(p, x)
        assert np.array_equal(c, ref)
        want = dequantised_gemm(p, x).astype(np.float32)
        if exact:
            assert np.array_equal(c, want)
        else:
            assert np.allclose(c, want, rtol=1e-5, atol=1e-5)  # float64 sums in another order
        ok, how = spatialc.tolerance(p).check(c, x)
        assert ok, how


def test_unpacked_and_ml_dtypes_weights_give_the_same_result():
    p = w4_program(24, 40, 256, "int4", zeros=True)
    x = w4_inputs(p, seed=3)
    q = spatialc.unpack_int4(x["B"], "int4")
    c = spatialc.evaluate(p, x)
    assert np.array_equal(c, spatialc.evaluate(p, dict(x, B=q)))
    assert np.array_equal(c, spatialc.evaluate(p, dict(x, B=q.astype(np.int64))))


def test_a_zero_point_from_another_column_changes_the_result():
    """The inputs are not blind to where a zero point sits: the test data could catch an edit that moved it."""
    p = w4_program(16, 32, 128, "uint4", zeros=True)
    x = w4_inputs(p, seed=4)
    moved = dict(x, zeros=np.roll(x["zeros"], 1, axis=1))
    assert not np.array_equal(spatialc.evaluate(p, x), spatialc.evaluate(p, moved))


def test_a_w4_program_round_trips_through_json():
    p = w4_program(20, 40, 256, "int4", zeros=True, sites=3)
    q = spatialc.from_json(spatialc.to_json(p))
    assert q == p and q.verified
    text = program_text(p)
    assert "dequant int4 to bf16: scale[k/128, j] * (x0 - zeros[g, j]) at rows" in text


def test_the_stages_and_tensors_are_as_documented():
    p = spatialc.gemm(64, 96, 256, "bf16", weights="uint4", group=64, zeros=True)
    assert [s.name for s in p.stages] == ["read_A", "read_B", "dequant_B", "matmul", "write_C"]
    assert [(t.name, t.elems, t.dtype.value) for t in p.tensors[3:]] == [
        ("scale", (4, 96), "bf16"),
        ("zeros", (4, 96), "uint4"),
    ]
    mx = spatialc.gemm(8, 16, 64, "fp16", weights="mxfp4")
    assert [(t.name, t.elems, t.dtype.value) for t in mx.tensors[3:]] == [("scale", (2, 16), "e8m0")]


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"weights": "int3"}, "unknown weights 'int3'; use one of int4, uint4, mxfp4"),
        ({"weights": "int4", "group": 100}, "a multiple of 16"),
        ({"weights": "int4", "group": 96}, "K = 256 is not a multiple of the group \\(96\\)"),
        ({"weights": "int4", "zeros": 1}, "zeros is True or False"),
        ({"weights": "int4", "scale_type": "e8m0"}, "an int4 scale is one of bf16, fp16, float32"),
        ({"weights": "mxfp4", "group": 128}, "mxfp4 weights have an e8m0 scale per 32"),
        ({"weights": "mxfp4", "zeros": True}, "no zero point"),
        ({"group": 128}, "give weights= too"),
    ],
)
def test_each_bad_request_is_one_typed_error(kw, says):
    with pytest.raises(spatialc.ProgramError, match=says):
        spatialc.gemm(16, 16, 256, "bf16", **kw)


def test_weights_need_a_16_bit_operand_and_are_weight_errors():
    with pytest.raises(WeightError, match="dequantised to bf16 or fp16; precision int8"):
        spatialc.gemm(16, 16, 256, "int8", weights="int4")


def test_the_forms_that_do_not_print_w4a16_refuse_it_by_one_line():
    with pytest.raises(spatialc.ProgramError, match="unknown form 'tiles'"):
        spatialc.build(spatialc.gemm(16, 16, 256, "bf16", weights="int4"), "sm_90a", form="tiles")
    with pytest.raises(spatialc.ProgramError, match="a W4A16 GEMM is not multicast"):
        spatialc.build(spatialc.gemm(16, 32, 256, "bf16", weights="int4"), "sm_90", multicast=(1, 2))


def test_a_scale_tensor_of_the_wrong_shape_is_an_input_error():
    p = w4_program(16, 32, 256, "int4")
    x = w4_inputs(p)
    with pytest.raises(spatialc.inputs.InputError, match="tensor scale: expected shape \\(2, 32\\)"):
        spatialc.evaluate(p, dict(x, scale=np.ones((4, 32))))
    zeros = w4_program(16, 32, 256, "int4", zeros=True)
    with pytest.raises(spatialc.inputs.InputError, match="needs tensor zeros"):  # the bound's too, not a KeyError
        spatialc.tolerance(zeros).bound(w4_inputs(p))


def test_an_epilogue_applies_to_the_dequantised_product():
    epilogue = [spatialc.bias(), spatialc.relu(), spatialc.row_scale()]
    p = w4_program(20, 40, 256, "uint4", zeros=True, epilogue=epilogue, out="bf16")
    x = w4_inputs(p, seed=6)
    c = spatialc.evaluate(p, x)
    assert np.array_equal(c, reference(p, x))
    want = np.maximum(dequantised_gemm(p, x) + x["bias"], 0) * x["row_scale"][:, None]  # exact: small integers
    assert np.array_equal(c, round_bf16(want.astype(np.float32)))


def test_an_epilogue_tensor_may_not_take_the_scales_name():
    with pytest.raises(WeightError, match="scales and zero points are the tensors 'scale' and 'zeros'"):
        spatialc.gemm(16, 32, 128, "bf16", epilogue=[spatialc.col_scale("scale")], weights="int4")

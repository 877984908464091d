"""Requantisation: spatialc.numerics.quant against a scalar implementation written here from TFLite's reference code."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spatialc
from spatialc.errors import ProgramError
from spatialc.frontend import bias, relu, requant, scalar
from spatialc.ir.nodes import DType, TensorRole
from spatialc.numerics.quant import QuantError, quantize_multiplier, requantize


def c_div(a: int, b: int) -> int:
    """C's integer division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def ref_requant(x: int, mult: int, shift: int, zp: int) -> int:
    """One value, step by step as TFLite's MultiplyByQuantizedMultiplier, with spatialc's int32 saturation."""
    sat = lambda v: max(-(2**31), min(2**31 - 1, v))  # noqa: E731
    x = sat(x)
    left, right = (shift, 0) if shift > 0 else (0, -shift)
    a = sat(x * (1 << left))
    if a == mult == -(2**31):
        high = 2**31 - 1
    else:
        ab = a * mult
        high = c_div(ab + ((1 << 30) if ab >= 0 else 1 - (1 << 30)), 1 << 31)
    mask = (1 << right) - 1
    rem = high & mask
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    out = (high >> right) + (1 if rem > threshold else 0)
    return max(-128, min(127, out + zp))


@pytest.mark.parametrize(
    ("scale", "mult", "shift"),
    [(0.5, 1 << 30, 0), (1.0, 1 << 30, 1), (0.25, 1 << 30, -1), (0.75, 3 << 29, 0), (0.0, 0, 0)],
)
def test_quantize_multiplier_exact_cases(scale, mult, shift):
    assert quantize_multiplier(scale) == (mult, shift)


@given(st.floats(min_value=1e-9, max_value=1000.0))
def test_quantize_multiplier_represents_the_scale(scale):
    mult, shift = quantize_multiplier(scale)
    assert (1 << 30) <= mult < (1 << 31)
    assert math.isclose(mult * 2.0 ** (shift - 31), scale, rel_tol=2**-30)


def test_quantize_multiplier_refuses_negative_and_huge_scales():
    for bad in (-1.0, float("nan"), float("inf"), 2.0**40):
        with pytest.raises(QuantError):
            quantize_multiplier(bad)


@pytest.mark.parametrize(
    ("x", "scale", "zp", "want"),
    [
        (1, 0.5, 0, 1),  # +0.5 rounds away from zero
        (3, 0.5, 0, 2),  # +1.5 -> 2
        (-1, 0.5, 0, 0),  # -0.5: the gemmlowp nudge rounds this tie toward zero
        (-3, 0.5, 0, -1),  # -1.5 -> -1 (the same nudge), then the shift is exact
        (5, 0.25, 0, 2),  # 1.25 -> 2: gemmlowp rounds twice (2.5 -> 3 in the high multiply, 1.5 -> 2 in the shift)
        (6, 0.25, 0, 2),  # 1.5 -> 2: RoundingDivideByPOT rounds half away from zero
        (-6, 0.25, 0, -2),  # -1.5 -> -2
        (1000, 0.5, 0, 127),  # saturates high
        (-1000, 0.5, 0, -128),  # saturates low
        (10, 1.0, -5, 5),  # zero point added after scaling
        (120, 1.0, 10, 127),  # and the clamp comes after the zero point
        (2**40, 1.0, 0, 127),  # inputs beyond int32 saturate first
    ],
)
def test_requantize_edge_cases(x, scale, zp, want):
    mult, shift = quantize_multiplier(scale)
    assert ref_requant(x, mult, shift, zp) == want
    assert requantize(np.array([x]), mult, shift, zp)[0] == want


@settings(max_examples=300)
@given(st.lists(st.integers(-(2**33), 2**33), min_size=1, max_size=20), st.floats(1e-6, 64.0), st.integers(-128, 127))
def test_requantize_matches_the_scalar_reference(xs, scale, zp):
    mult, shift = quantize_multiplier(scale)
    got = requantize(np.array(xs, dtype=np.int64), mult, shift, zp)
    assert got.dtype == np.int8
    assert got.tolist() == [ref_requant(x, mult, shift, zp) for x in xs]


def test_gemm_with_an_epilogue_adds_parameter_tensors_and_types_the_output():
    p = spatialc.gemm(20, 30, 40, "int8", epilogue=[bias(), relu(), requant(0.02, 3)])
    b = p.tensor_named("bias")
    assert (b.role, b.elems, b.dtype) == (TensorRole.PARAMETER, (1, 30), DType.INT32)
    assert p.output_tensor().dtype == DType.INT8
    q = spatialc.gemm(20, 30, 40, "bf16", epilogue=[bias("b0"), scalar("mul", 0.5)])
    assert q.tensor_named("b0").dtype == DType.FLOAT32 and q.output_tensor().dtype == DType.FLOAT32


@pytest.mark.parametrize(
    ("precision", "epilogue", "says"),
    [
        ("fp16", [requant(0.1)], "requant produces int8 from an integer accumulator"),
        ("int8", [requant(0.1), relu()], "requant must be the last"),
        ("int8", [scalar("mul", 0.5)], "needs a whole number"),
        ("int8", [bias("x"), bias("x")], "share a tensor name"),
        (
            "int8",
            ["relu"],
            "use spatialc.bias, relu, scalar, activation, row_scale, col_scale, residual, gate or requant",
        ),
    ],
)
def test_bad_epilogues_are_refused(precision, epilogue, says):
    with pytest.raises(ProgramError, match=says):
        spatialc.gemm(16, 16, 16, precision, epilogue=epilogue)


def test_bad_epilogue_arguments_are_refused():
    with pytest.raises(ProgramError, match="unknown scalar op 'pow'"):
        scalar("pow", 2)
    with pytest.raises(ProgramError, match="zero point"):
        requant(0.5, 300)
    with pytest.raises(ProgramError, match="finite number"):
        requant(-0.5)
    with pytest.raises(ProgramError, match="identifier name"):
        bias("A")

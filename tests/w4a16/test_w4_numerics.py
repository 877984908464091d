"""4-bit weights' numerics (numerics/w4.py): the packing order, the formats' values, the dequant's one rounding, and
how inputs of each kind are taken or refused."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.inputs import InputError, TensorSpec
from spatialc.ir.nodes import DType
from spatialc.numerics import w4

FORMATS = {"int4": (-8, 7), "uint4": (0, 15)}
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


@pytest.mark.parametrize("fmt", ["int4", "uint4"])
def test_pack_puts_the_even_row_in_the_low_nibble(fmt):
    lo, hi = FORMATS[fmt]
    w = np.array([[lo, hi], [hi, 1], [3, lo], [0, 2]])
    packed = w4.pack_int4(w, fmt)
    assert packed.shape == (2, 2) and packed.dtype == np.uint8
    code = (lambda v: v & 0xF) if fmt == "int4" else (lambda v: v)
    for i in range(2):
        for j in range(2):
            assert packed[i, j] == code(int(w[2 * i, j])) | code(int(w[2 * i + 1, j])) << 4
    back = w4.unpack_int4(packed, fmt)
    assert back.dtype == w4.ml_type(w4.format_dtype(fmt)) and np.array_equal(back.astype(np.int64), w)


@pytest.mark.parametrize("fmt", ["int4", "uint4", "mxfp4"])
def test_pack_of_an_ml_dtypes_array_equals_pack_of_its_values(fmt):
    rng = np.random.default_rng(1)
    if fmt == "mxfp4":
        values = E2M1[rng.integers(0, 8, (64, 24))] * rng.choice([-1, 1], (64, 24))
    else:
        values = rng.integers(FORMATS[fmt][0], FORMATS[fmt][1] + 1, (64, 24)).astype(np.float64)
    typed = values.astype(w4.ml_type(w4.format_dtype(fmt)))
    assert np.array_equal(w4.pack_int4(typed), w4.pack_int4(values, fmt))
    assert np.array_equal(w4.unpack_int4(w4.pack_int4(typed), fmt).astype(np.float64), values)


def test_e2m1_codes_are_ml_dtypes_own():
    codes = w4.codes(np.array([0.5, -6.0, 1.0, -0.0]), DType.E2M1)
    assert list(codes) == [1, 15, 2, 8]  # sign bit 3, exponent bits 2-1, fraction bit 0


@pytest.mark.parametrize(
    ("w", "fmt", "says"),
    [
        (np.array([[8.0], [0.0]]), "int4", "whole numbers in -8..7"),
        (np.array([[1.5], [0.0]]), "uint4", "whole numbers in 0..15"),
        (np.array([[-1.0], [0.0]]), "uint4", "whole numbers in 0..15"),
        (np.array([[2.5], [0.0]]), "mxfp4", "float4_e2m1fn values"),
        (np.array([[7.0], [0.0]]), "mxfp4", "float4_e2m1fn values"),
        (np.array([[1.0], [2.0], [3.0]]), "int4", "even K"),
        (np.array([[1.0], [2.0]]), "int3", "unknown weight format"),
    ],
)
def test_pack_refuses_what_is_not_the_format(w, fmt, says):
    with pytest.raises(spatialc.SpatialError, match=says):
        w4.pack_int4(w, fmt)


def test_dequant_rounds_the_float32_product_once_to_the_operand_type():
    s = np.array([1 + 2.0**-7, 1 + 2.0**-7, 1 + 2.0**-10, 2.0**-20 + 1])
    q, z = np.array([7.0, -8.0, 15.0, 3.0]), np.array([-8.0, 7.0, 0.0, 0.0])
    got = w4.dequant(q, s, z, "bf16")
    exact = s * (q - z)  # float64: exact here
    assert np.array_equal(got, spatialc.inputs.round_bf16(exact))  # one rounding from the exact product
    assert got[0] == 15.125  # 15·(1 + 2^-7) = 15.1171875, to bf16's 8 bits
    # A float32 scale's product is rounded to float32 first (as the kernel's register is): then once more to fp16
    s32 = np.float32(1 + 2.0**-23)
    want = spatialc.inputs.round_fp16(np.float32(s32 * np.float32(11.0)))
    assert w4.dequant(np.array([11.0]), np.array([s32]), None, "fp16")[0] == want


def test_mxfp4_scales_are_powers_of_two_exactly():
    q = np.array([6.0, -0.5, 1.5])
    s = np.array([2.0**-127, 2.0**100, 2.0**-3])
    assert np.array_equal(w4.dequant(q, s, None, "bf16"), q * s)  # bf16 has float32's exponents: exact
    assert w4.dequant(np.array([6.0]), np.array([2.0**100]), None, "fp16")[0] == np.inf  # past fp16's range


def spec(name, elems, dtype):
    return TensorSpec(name, "input", elems, dtype)


def test_inputs_take_packed_bytes_ml_dtypes_and_numbers_alike():
    rng = np.random.default_rng(2)
    w = rng.integers(-8, 8, (32, 16))
    s = spec("B", (32, 16), DType.INT4)
    from_numbers = w4.input_values(s, w)
    assert np.array_equal(from_numbers, w)
    assert np.array_equal(w4.input_values(s, w4.pack_int4(w, "int4")), w)
    assert np.array_equal(w4.input_values(s, w.astype(ml_dtypes.int4)), w)


def test_inputs_out_of_the_format_are_refused_by_name_and_place():
    s = spec("B", (4, 2), DType.UINT4)
    with pytest.raises(InputError, match=r"tensor B is uint4 but B\[1, 0\] = 16 is not one of its whole numbers"):
        w4.input_values(s, np.array([[1, 2], [16, 0], [0, 0], [0, 0]]))
    e8 = spec("scale", (1, 3), DType.E8M0)
    with pytest.raises(InputError, match=r"scale\[0, 1\] = 3 is not one of its powers of two"):
        w4.input_values(e8, np.array([[1.0, 3.0, 0.5]]))
    assert np.array_equal(w4.input_values(e8, np.array([1.0, 0.25, 4.0], ml_dtypes.float8_e8m0fnu)), [[1, 0.25, 4]])


def test_swapped_nibbles_unpack_to_other_weights():
    """The order is observable: a byte packed high-nibble-first unpacks to B with its row pairs exchanged."""
    w = np.arange(-8, 8).reshape(4, 4)
    p = w4.pack_int4(w, "int4")
    swapped = ((p >> 4) | (p << 4)).astype(np.uint8)
    got = w4.unpack_int4(swapped, "int4").astype(np.int64)
    assert np.array_equal(got, w[[1, 0, 3, 2]]) and not np.array_equal(got, w)


def test_torch_tensors_are_taken_packed_or_as_values():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    w = rng.integers(0, 16, (32, 8))
    s = spec("B", (32, 8), DType.UINT4)
    packed = torch.from_numpy(w4.pack_int4(w, "uint4"))
    assert packed.dtype == torch.uint8 and np.array_equal(w4.input_values(s, packed), w)
    assert np.array_equal(w4.input_values(s, torch.from_numpy(w)), w)
    if hasattr(torch, "float8_e8m0fnu"):  # MXFP4's scales as torch holds them
        e8 = torch.tensor([[0.25, 1.0, 8.0]]).to(torch.float8_e8m0fnu)
        assert np.array_equal(w4.input_values(spec("scale", (1, 3), DType.E8M0), e8), [[0.25, 1.0, 8.0]])

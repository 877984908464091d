"""Hostile inputs to spatialc.torch: each a typed spatialc error of one line naming the fix, never an
AttributeError, OverflowError, TypeError or torch RuntimeError from inside, nor a silent wrong meaning."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spatialc.errors import ProgramError  # noqa: E402
from spatialc.inputs import InputError  # noqa: E402
from spatialc.numerics.attention import valid_scale  # noqa: E402
from spatialc.torch import Linear, attention, attention_op, gemm_op  # noqa: E402


def _qkv():
    q = torch.randn(1, 2, 4, 8, dtype=torch.bfloat16)
    return q, q.clone(), q.clone()


def test_a_none_operand_is_an_input_error():
    with pytest.raises(InputError, match="A is None; pass a torch tensor"):
        gemm_op("bf16")(None, torch.randn(4, 4).bfloat16())


@pytest.mark.parametrize("scale", [10**400, -(10**400), float("nan"), float("inf")])
def test_a_scale_past_float_is_refused_as_nan_is(scale):
    assert not valid_scale(scale)
    with pytest.raises(ProgramError, match="scale is a finite number > 0 or None"):
        attention(*_qkv(), scale=scale)


@pytest.mark.parametrize("kw", [{"target": ["x"]}, {"out": ["x"]}, {"target": 90}])
def test_gemm_op_options_of_the_wrong_type_are_program_errors(kw):
    name = next(iter(kw))
    with pytest.raises(ProgramError, match=f"gemm_op's {name} is"):
        gemm_op("bf16", **kw)


@pytest.mark.parametrize("sizes", [(0, 16), (-1, 16), (32, 0), (32, -3), (True, 16), (32.0, 16)])
def test_linear_sizes_below_one_are_refused_at_construction(sizes):
    with pytest.raises(InputError, match="it is an int of at least 1"):
        Linear(*sizes)


@pytest.mark.parametrize("shape", [(4, 31), (4, 33), (31,), ()])
def test_linear_refuses_a_wrong_last_dimension(shape):
    with pytest.raises(InputError, match=r"its last dimension must be in_features \(32\)"):
        Linear(32, 16)(torch.randn(shape))


def test_linear_refuses_a_non_tensor():
    with pytest.raises(InputError, match="pass a torch tensor"):
        Linear(32, 16)([[1.0] * 32])


def test_causal_must_be_a_bool():
    attention_op("bf16", causal=True)  # a causal op already made: a truthy "no" must not find it
    with pytest.raises(ProgramError, match="causal is True or False, not 'no'"):
        attention(*_qkv(), causal="no")
    with pytest.raises(ProgramError, match="causal is True or False, not 1"):
        attention_op("bf16", causal=1)


@pytest.mark.parametrize("meta_first", [True, False])
def test_a_meta_tensor_mixed_with_a_cpu_one_is_refused(meta_first):
    cpu = torch.randn(4, 4).bfloat16()
    meta = torch.empty(4, 4, dtype=torch.bfloat16, device="meta")
    a, b = (meta, cpu) if meta_first else (cpu, meta)
    with pytest.raises(InputError, match="tensors on cpu and meta; pass them on one"):
        gemm_op("bf16")(a, b)


def test_all_meta_still_gives_the_meta_shape():
    meta = torch.empty(4, 4, dtype=torch.bfloat16, device="meta")
    got = gemm_op("bf16")(meta, meta)
    assert got.device.type == "meta" and tuple(got.shape) == (4, 4)

"""Autograd of gemm_op: dA = dZ·Bᵀ and dB = Aᵀ·dZ as spatialc GEMMs, dZ = dC · activation'(Z).

Why not gradcheck in float64: spatialc's programs take int8, fp16 or bf16 operands (there is no float64 GEMM), so
finite differences of a bf16 op measure its rounding, not its derivative. Instead the gradients are compared with
torch's own float32 autograd of the same function of the same (bf16) operands, within the bound the backward's one
rounding gives (`within`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import spatialc.torch as sct  # noqa: E402

F = torch.nn.functional
REFERENCE = {
    None: lambda z: z,
    "relu": torch.relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def within(got, want, size):
    """|got − want| ≤ 2^-7 · size + 2^-8 · |want| (+ float32's smallest normal), elementwise: dZ's rounding to bf16
    (2^-8 of the sizes its products sum), doubled for the float32 sums and the derivative read off C or a
    recomputed Z, then dA's or dB's own rounding to bf16."""
    return bool(((got.float() - want).abs() <= 2**-7 * size + 2**-8 * want.abs() + 1e-30).all())


@pytest.mark.parametrize("activation", list(REFERENCE))
def test_gradients_match_torch_matmul_within_the_rounding_bound(activation):
    op = sct.gemm_op("bf16", bias=True, activation=activation)
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(24, 40, generator=gen).to(torch.bfloat16).requires_grad_()
    b = torch.randn(40, 32, generator=gen).to(torch.bfloat16).requires_grad_()
    bias = torch.randn(32, generator=gen).requires_grad_()
    weight = torch.randn(24, 32, generator=gen)
    (op(a, b, bias) * weight).sum().backward()

    a32, b32, bias32 = (t.detach().float().requires_grad_() for t in (a, b, bias))
    z = a32 @ b32 + bias32
    (REFERENCE[activation](z) * weight).sum().backward()
    assert a.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.bfloat16 and bias.grad.dtype == torch.float32
    # the bound's sizes: |dZ| @ |B|ᵀ and |A|ᵀ @ |dZ|, with |dZ| ≤ |weight| · max |activation'| (≤ 1.13)
    gz = 1.13 * weight.abs()
    assert within(a.grad, a32.grad, gz @ b32.detach().abs().t())
    assert within(b.grad, b32.grad, a32.detach().abs().t() @ gz)
    assert torch.allclose(bias.grad, bias32.grad, rtol=1e-5, atol=1e-5)


def test_only_the_gradients_asked_for_are_computed():
    op = sct.gemm_op("bf16")
    a = torch.randn(16, 16).to(torch.bfloat16).requires_grad_()
    b = torch.randn(16, 16).to(torch.bfloat16)
    op(a, b).sum().backward()
    assert a.grad is not None and b.grad is None
    assert torch.allclose(a.grad.float(), torch.ones(16, 16) @ b.float().t(), rtol=2**-7)


def test_linear_trains_like_nn_linear():
    torch.manual_seed(6)
    ref = torch.nn.Linear(32, 16)
    ours = sct.Linear.from_linear(torch.nn.Linear(32, 16), activation="relu")
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(8, 32)
    torch.relu(ref(x)).square().sum().backward()
    ours(x).square().sum().backward()
    assert ours.weight.grad.dtype == torch.float32
    assert torch.allclose(ours.weight.grad, ref.weight.grad, rtol=0.03, atol=0.03 * ref.weight.grad.abs().max())
    assert torch.allclose(ours.bias.grad, ref.bias.grad, rtol=0.03, atol=0.03 * ref.bias.grad.abs().max())

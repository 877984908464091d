"""spatialc.torch.Linear (nn.Linear computed by a spatialc GEMM, bias and activation fused) and replace_linears."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402

nn = torch.nn


def rounded(t):
    return t.to(torch.bfloat16).float()


def test_linear_state_dict_is_nn_linears_both_ways():
    torch.manual_seed(0)
    ref = nn.Linear(48, 32)
    ours = sct.Linear(48, 32, activation="relu")
    ours.load_state_dict(ref.state_dict())
    assert ours.state_dict().keys() == ref.state_dict().keys()
    back = nn.Linear(48, 32)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, ref.weight) and torch.equal(back.bias, ref.bias)
    assert isinstance(ours, nn.Linear) and "activation=relu, precision=bf16" in repr(ours)


@pytest.mark.parametrize(("activation", "fn"), [("relu", torch.relu), ("silu", nn.functional.silu), (None, None)])
def test_linear_is_the_fused_gemm_within_its_tolerance(activation, fn):
    torch.manual_seed(1)
    layer = sct.Linear(48, 32, activation=activation)
    x = torch.randn(2, 10, 48)
    y = layer(x)
    assert y.shape == (2, 10, 32) and y.dtype == torch.float32
    [entry] = [e for e in layer.op.compiled() if e.sizes == (20, 32, 48)]  # the op is shared: pick this shape
    inputs = {"A": rounded(x.reshape(20, 48)), "B": rounded(layer.weight.t()), "bias": layer.bias[None].detach()}
    ok, how = spatialc.tolerance(entry.program).check(y.reshape(20, 32).detach().numpy(), inputs)
    assert ok, how
    z = inputs["A"] @ inputs["B"] + layer.bias.detach()
    assert torch.allclose(y.reshape(20, 32), fn(z) if fn else z, atol=1e-4, rtol=1e-4)


# Bug: a batch of no rows (an expert no token was routed to) was refused ("m must be a whole number ≥ 1, not 0"),
# where nn.Linear gives an empty y and zero gradients.
def test_linear_of_no_rows_is_empty_with_zero_gradients():
    layer = sct.Linear(48, 32, activation="relu")
    y = layer(torch.randn(2, 0, 48))
    assert y.shape == (2, 0, 32) and y.dtype == torch.float32
    y.sum().backward()
    assert torch.equal(layer.weight.grad, torch.zeros(32, 48)) and torch.equal(layer.bias.grad, torch.zeros(32))


def test_linear_without_bias_and_in_bf16():
    layer = sct.Linear(16, 16, bias=False, dtype=torch.bfloat16)
    x = torch.randn(4, 16).to(torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), (x.float() @ layer.weight.float().t()).to(torch.bfloat16).float())


def test_replace_linears_fuses_a_following_activation_and_keeps_keys():
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 16), nn.SiLU()
    )
    keys = model.state_dict().keys()
    weights = [m.weight for m in model if isinstance(m, nn.Linear)]
    x = torch.randn(8, 32)
    want = model(x)
    sct.replace_linears(model)
    assert [type(m).__name__ for m in model] == ["Linear", "Identity"] * 3
    assert [m.activation for m in model if isinstance(m, sct.Linear)] == ["relu", "gelu_tanh", "silu"]
    assert [m.weight for m in model if isinstance(m, sct.Linear)] == weights  # the same Parameters
    assert model.state_dict().keys() == keys
    got = model(x)
    assert torch.allclose(got, want, atol=0.05, rtol=0.05)  # bf16 operands, three layers deep


def test_replace_linears_in_a_plain_module_leaves_activations_alone():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.proj(x))

    block = sct.replace_linears(Block())
    assert isinstance(block.proj, sct.Linear) and block.proj.activation is None and isinstance(block.act, nn.ReLU)
    single = sct.replace_linears(nn.Linear(8, 8))
    assert isinstance(single, sct.Linear)
    assert sct.replace_linears(single) is single  # already converted: unchanged
    with pytest.raises(spatialc.ProgramError, match="takes a torch.nn.Module"):
        sct.replace_linears("model")


def test_linear_refuses_int8_and_an_unknown_activation():
    with pytest.raises(spatialc.ProgramError, match="bf16 or fp16, not 'int8'"):
        sct.Linear(8, 8, precision="int8")
    with pytest.raises(spatialc.ProgramError, match="unknown activation"):
        sct.Linear(8, 8, activation="mish")


def test_freeze_makes_the_weight_operand_once_and_a_load_makes_it_again():
    torch.manual_seed(3)
    layer = sct.Linear(32, 16, activation="relu")
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = layer(x)
        layer.freeze()
        assert layer.frozen_weight.dtype == torch.bfloat16 and layer.frozen_weight.shape == (32, 16)
        assert torch.equal(layer(x), want)
        assert "frozen_weight" not in layer.state_dict() and "frozen" in repr(layer)
        layer.weight.mul_(2)  # a change in place is not seen while frozen …
        assert torch.equal(layer(x), want)
        layer.load_state_dict({"weight": layer.weight / 2, "bias": layer.bias})  # … a load makes it again
        assert torch.equal(layer(x), want)
        layer.weight.mul_(2)
        assert not torch.equal(layer.unfreeze()(x), want)
    frozen = sct.replace_linears(nn.Sequential(nn.Linear(8, 8), nn.Tanh()), freeze=True)
    assert frozen[0].frozen_weight is not None and frozen[0].activation == "tanh"

"""torch.compile(fullgraph=True) traces spatialc ops without a graph break and gives eager's result.

Two compiles only: inductor's are slow (tens of seconds on two cores). The first uses the `aot_eager` backend —
Dynamo's trace with `fullgraph=True` (which raises at any graph break) and AOT autograd's functionalisation, the
parts that read the fake implementation, without inductor's code generation; the second is what a user runs: a
model written with nn.Linear, converted by replace_linears, compiled by inductor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402

bf16 = torch.bfloat16


def mlp_weights(seed=0, m=32, d=64, h=64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=gen).to(bf16)
    w1 = (torch.randn(d, h, generator=gen) / 8).to(bf16)
    w2 = (torch.randn(h, d, generator=gen) / 8).to(bf16)
    return x, w1, torch.randn(h, generator=gen), w2, torch.randn(d, generator=gen)


def test_two_layer_mlp_of_spatialc_ops_compiles_whole_and_equals_eager():
    up = sct.gemm_op("bf16", bias=True, activation="relu")
    down = sct.gemm_op("bf16", bias=True)

    def mlp(x, w1, b1, w2, b2):
        return down(up(x, w1, b1).to(bf16), w2, b2)

    args = mlp_weights()
    eager = mlp(*args)
    torch._dynamo.reset()
    compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")(*args)
    hidden = up(*args[:3]).to(bf16)  # the second layer's operand, as both runs computed it
    program = next(e.program for e in down.compiled() if e.sizes == (32, 64, 64))
    ok, how = spatialc.tolerance(program).check(compiled.numpy(), {"A": hidden, "B": args[3], "bias": args[4][None]})
    assert ok, how
    assert torch.equal(compiled, eager)


def test_a_torch_model_converted_and_compiled_by_inductor_matches_eager_torch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    x = torch.randn(2, 16, 64)
    want = model(x)
    converted = sct.replace_linears(model)
    assert [type(m).__name__ for m in converted] == ["Linear", "Identity", "Linear"]
    torch._dynamo.reset()
    with torch.no_grad():  # inference, as a served model runs (one graph, no backward to plan)
        got = torch.compile(converted, fullgraph=True)(x)
        eager = converted(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, eager)
    # Against float32 torch: x, W1, the hidden layer and W2 are each rounded to bf16 once (2^-8 relative), gelu's
    # slope is at most 1.13; 2^-6 = 4 · 2^-8 of the magnitudes each output sums is a bound with room to spare.
    (w1, b1), (w2, b2) = (model[0].weight, model[0].bias), (model[2].weight, model[2].bias)
    size = (x.abs() @ w1.abs().t() + b1.abs()) @ w2.abs().t() + b2.abs()
    assert ((got - want).abs() <= 2**-6 * size).all()


def test_torch_export_keeps_the_ops():
    model = sct.replace_linears(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)))
    x = torch.randn(8, 32)
    exported = torch.export.export(model, (x,))
    called = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert [c for c in called if c.startswith("spatialc.")] == [
        "spatialc.gemm_bf16_bias_relu_sm_90.default",
        "spatialc.gemm_bf16_bias_sm_90.default",
    ]
    assert torch.equal(exported.module()(x), model(x))


def test_an_input_the_op_refuses_while_compile_traces_is_its_one_line_input_error():
    # The fake implementation refuses float32 A as Dynamo traces. Dynamo wrapped that in a TorchRuntimeError whose
    # first line was "RuntimeError when making fake tensor call", its cause dropped; a TracedInputError passes out.
    up = sct.gemm_op("bf16", bias=True, activation="relu")
    x, w1, b1, _, _ = mlp_weights()
    torch._dynamo.reset()
    with pytest.raises(spatialc.InputError) as e:
        torch.compile(lambda x, w, b: up(x, w, b), fullgraph=True, backend="eager")(x.float(), w1, b1)
    first = str(e.value).splitlines()[0]
    assert first.startswith("spatialc::gemm_bf16_bias_relu") and first.endswith(
        ": A is float32; this op takes bfloat16"
    )

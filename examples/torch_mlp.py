"""A PyTorch MLP whose linear layers are spatialc GEMMs: converted, compiled whole and checked against torch.

`spatialc.torch.replace_linears` swaps each `nn.Linear` (and the activation after it) for `spatialc.torch.Linear`,
a torch custom op over a verified spatialc program: bias and activation fused, bf16 operands, float32 sums.
`torch.compile(fullgraph=True)` traces through it (the op's fake implementation gives its output's shape), and the
result is compared with the float32 torch model. On a CPU the op runs spatialc's reference interpreter (exact, not
fast); on a CUDA device it launches the kernel. Needs torch (pip install 'spatialc[torch]').

    python examples/torch_mlp.py
"""

from __future__ import annotations

import logging

import torch

import spatialc.torch as sct


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # each shape spatialc builds is said once
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(), torch.nn.Linear(128, 64))
    x = torch.randn(32, 64)
    want = model(x)

    sct.replace_linears(model)  # in place; the state_dict keeps nn.Linear's keys
    print(model)
    with torch.no_grad():  # inference: with autograd on, the forward also keeps what silu's backward needs
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)  # "inductor" (the default) works too

    w1, b1, w2, b2 = model[0].weight, model[0].bias, model[2].weight, model[2].bias
    size = (x.abs() @ w1.abs().t() + b1.abs()) @ w2.abs().t() + b2.abs()
    error = ((got - want).abs() / size).max().item()
    print(f"max |spatialc - torch| = {(got - want).abs().max().item():.2e}, {error:.2e} of the magnitudes summed")
    assert error < 2**-6, "bf16 operands: a few 2^-8 roundings of the magnitudes summed"
    for layer in (model[0], model[2]):
        print(layer.op.name, [str(c) for c in layer.op.compiled()])


if __name__ == "__main__":
    main()

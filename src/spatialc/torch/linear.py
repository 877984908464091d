"""`nn.Linear` computed by a spatialc GEMM (`Linear`), and `replace_linears`, which swaps a model's for it."""

from __future__ import annotations

from typing import Any

import torch

from ..arguments import refuse_float32
from ..errors import ProgramError
from ..inputs import InputError
from .gemm import PRECISIONS, gemm_op
from .signature import _dims, _kind

# ---- nn.Linear -------------------------------------------------------------------------------------------------


class Linear(torch.nn.Linear):
    """`nn.Linear` (its parameters, initialisation and state_dict) computed by a spatialc GEMM with the bias and an
    activation fused: y = activation(x Wᵀ + b). x and W are rounded to `precision` (bf16 unless told); the product is
    accumulated in float32 and returned in x's dtype. W's operand (Wᵀ in `precision`, contiguous) is made at each
    call, so autograd reaches W; `freeze()` makes it once, for inference."""

    frozen_weight: Any

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        activation: str | None = None,
        precision: str = "bf16",
    ):
        refuse_float32(precision, "spatialc.torch.Linear")
        if precision not in ("bf16", "fp16"):
            raise ProgramError(f"spatialc.torch.Linear computes in bf16 or fp16, not {precision!r}")
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InputError(f"spatialc.torch.Linear: {name} is {n!r}; it is an int of at least 1")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation
        self.precision = precision
        self.op = gemm_op(precision, bias=bias, activation=activation)
        self.register_buffer("frozen_weight", None, persistent=False)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, activation: str | None = None, precision: str = "bf16") -> Linear:
        """A Linear that shares `linear`'s weight and bias (the same Parameters, so an optimizer keeps them)."""
        new = cls(
            linear.in_features,
            linear.out_features,
            linear.bias is not None,
            device="meta",
            activation=activation,
            precision=precision,
        )
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def freeze(self) -> Linear:
        """For inference: W's operand made once, now, and used by every call until `unfreeze()` (a change to W in
        place is not seen until then; `load_state_dict` makes it again). No gradient reaches W through it."""
        with torch.no_grad():
            self.frozen_weight = self.weight.detach().t().to(PRECISIONS[self.precision]).contiguous()
        return self

    def unfreeze(self) -> Linear:
        self.frozen_weight = None
        return self

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        if self.frozen_weight is not None:
            self.freeze()

    def forward(self, x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            raise InputError(f"spatialc.torch.Linear: x is {_kind(x)}; pass a torch tensor")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise InputError(
                f"spatialc.torch.Linear: x is {_dims(x.shape)}; its last dimension must be in_features"
                f" ({self.in_features})"
            )
        low = PRECISIONS[self.precision]
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features).to(low).contiguous()
        w = self.frozen_weight if self.frozen_weight is not None else self.weight.t().to(low).contiguous()
        if a.shape[0] == 0:  # no rows (an expert no token was routed to): nothing to run, an empty y as nn.Linear's
            y = a.to(torch.float32) @ w.to(torch.float32)  # in the graph, so W and the bias get zero gradients
            y = y if self.bias is None else y + self.bias.to(torch.float32)
        else:
            y = self.op(a, w) if self.bias is None else self.op(a, w, self.bias.to(torch.float32))
        y = y.reshape(*lead, self.out_features)
        return y.to(x.dtype) if x.dtype.is_floating_point else y

    def extra_repr(self) -> str:
        frozen = ", frozen" if self.frozen_weight is not None else ""
        return f"{super().extra_repr()}, activation={self.activation}, precision={self.precision}{frozen}"


def _activation_of(module: Any) -> str | None:
    """The gemm_op activation a module is, or None."""
    nn = torch.nn
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.SiLU):
        return "silu"
    if isinstance(module, nn.Sigmoid):
        return "sigmoid"
    if isinstance(module, nn.Tanh):
        return "tanh"
    if isinstance(module, nn.GELU):
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    return None


def replace_linears(model: Any, *, precision: str = "bf16", fuse: bool = True, freeze: bool = False) -> Any:
    """`model` with each `nn.Linear` (exactly that class) swapped for a `Linear` sharing its parameters, in place.
    With `fuse`, an activation (ReLU, SiLU, GELU, Sigmoid, Tanh) right after a Linear in an `nn.Sequential` is
    fused into it and left as an `nn.Identity` (the indices, so the state_dict's keys, stay); with `freeze`, each
    new Linear is frozen (`Linear.freeze`: inference). Returns the model (a bare nn.Linear comes back as a new
    Linear)."""
    if type(model) is torch.nn.Linear:
        single = Linear.from_linear(model, precision=precision)
        return single.freeze() if freeze else single
    if not isinstance(model, torch.nn.Module):
        raise ProgramError(f"replace_linears takes a torch.nn.Module, not {_kind(model)}")
    for parent in list(model.modules()):
        names = list(parent._modules)
        for i, name in enumerate(names):
            child = parent._modules[name]
            if type(child) is not torch.nn.Linear:
                continue
            act = None
            if fuse and isinstance(parent, torch.nn.Sequential) and i + 1 < len(names):
                act = _activation_of(parent._modules[names[i + 1]])
                if act is not None:
                    parent._modules[names[i + 1]] = torch.nn.Identity()
            new = Linear.from_linear(child, activation=act, precision=precision)
            parent._modules[name] = new.freeze() if freeze else new
    return model

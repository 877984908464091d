"""GEMM families as torch ops (`gemm_op`), with autograd: the backward as more spatialc GEMMs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..arguments import refuse_float32
from ..errors import ProgramError
from ..ir import ops
from ..ir.nodes import SpatialProgram
from .family import _LOCK, SpatialOp

# ---- GEMMs, with autograd --------------------------------------------------------------------------------------

# torch's activation names (nn.GELU() is the erf form; approximate="tanh" is spatialc's "gelu_tanh").
ACTIVATIONS = ("relu", "silu", "gelu", "gelu_tanh", "sigmoid", "tanh")
PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8}
_GEMMS: dict[tuple[Any, ...], SpatialOp] = {}


def _epilogue(bias: bool, activation: str | None) -> list[Any]:
    from .. import frontend

    out: list[Any] = [frontend.bias()] if bias else []
    if activation == "relu":
        out.append(frontend.relu())
    elif activation == "gelu":
        out.append(ops.Map(ops.Apply("gelu", (ops.Arg(0),))))  # the erf form, as torch's default
    elif activation == "gelu_tanh":
        out.append(frontend.activation("gelu_tanh"))
    elif activation is not None:
        out.append(frontend.activation(activation))
    return out


def gemm_op(
    precision: str = "bf16",
    *,
    bias: bool = False,
    activation: str | None = None,
    out: str | None = None,
    target: str = "sm_90",
) -> SpatialOp:
    """C = activation(A @ B + bias) as an op of (A (m×k), B (k×n)[, bias (n)]), one per set of arguments in the
    process (named spatialc::gemm_…). A and B are `precision`'s torch dtype, the bias float32 (int32 for int8);
    C is float32 unless `out` says otherwise (int64 for int8). Float GEMMs have autograd."""
    refuse_float32(precision, "gemm_op")  # torch's default dtype: say why not, and the fix
    if precision not in PRECISIONS:
        raise ProgramError(f"gemm_op's precision is one of {', '.join(PRECISIONS)}, not {precision!r}")
    if activation is not None and activation not in ACTIVATIONS:
        raise ProgramError(f"unknown activation {activation!r}; use one of {', '.join(ACTIVATIONS)}")
    if precision == "int8" and activation not in (None, "relu"):
        raise ProgramError(f"an int8 GEMM's epilogue is exact integer arithmetic; {activation} is a float op")
    if not isinstance(target, str):
        raise ProgramError(f"gemm_op's target is a string such as 'sm_90', not {target!r}")
    if out is not None and not isinstance(out, str):
        raise ProgramError(f"gemm_op's out is a precision name such as 'bf16' or None, not {out!r}")
    key = (precision, bool(bias), activation, out, target)
    with _LOCK:
        found = _GEMMS.get(key)
    if found is not None:
        return found
    from .. import frontend

    epilogue = _epilogue(bias, activation)

    def builder(m: int, n: int, k: int) -> SpatialProgram:
        return frontend.gemm(m, n, k, precision, epilogue=epilogue, target=target, out=out)

    parts = [precision, "bias" if bias else "", activation or "", out or "", target]
    made = SpatialOp(builder, "spatialc::gemm_" + "_".join(p for p in parts if p))
    if precision != "int8":
        _GemmBackward(precision, bool(bias), activation, target).register(made)
    with _LOCK:
        return _GEMMS.setdefault(key, made)


@dataclass(frozen=True)
class _GemmBackward:
    """dZ = dC · activation'(Z); dA = dZ · Bᵀ and dB = Aᵀ · dZ as spatialc GEMMs of the same precision (dZ rounded
    to it once, as mixed-precision training does), d(bias) = Σ rows of dZ. activation'(Z) is read off C for relu,
    sigmoid and tanh; silu and gelu recompute Z = A @ B + bias with one more spatialc GEMM."""

    precision: str
    bias: bool
    activation: str | None
    target: str

    def register(self, made: SpatialOp) -> None:
        made.register_autograd(self.backward, self.setup_context)

    def setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs, output)

    def backward(self, ctx: Any, grad: Any) -> tuple[Any, ...]:
        a, b, *rest = ctx.saved_tensors
        c = rest.pop()
        bias = rest[0] if rest else None
        dz = self.pre_grad(grad.float(), a, b, bias, c.float())
        mm = gemm_op(self.precision, target=self.target)
        wants = ctx.needs_input_grad
        low = PRECISIONS[self.precision]
        dzq = dz.to(low)
        da = mm(dzq, b.t().contiguous()).to(a.dtype) if wants[0] else None
        db = mm(a.t().contiguous(), dzq).to(b.dtype) if wants[1] else None
        if bias is None:
            return da, db
        dbias = dz.sum(0).reshape(bias.shape).to(bias.dtype) if wants[2] else None
        return da, db, dbias

    def pre_grad(self, g: Any, a: Any, b: Any, bias: Any, c: Any) -> Any:
        """dC · activation'(Z)."""
        act = self.activation
        if act is None:
            return g
        if act == "relu":
            return g * (c > 0)
        if act == "sigmoid":
            return g * c * (1 - c)
        if act == "tanh":
            return g * (1 - c * c)
        pre = gemm_op(self.precision, bias=self.bias, target=self.target)
        z = (pre(a, b, bias) if self.bias else pre(a, b)).float()
        if act == "silu":
            return torch.ops.aten.silu_backward(g, z)
        return torch.ops.aten.gelu_backward(g, z, approximate="none" if act == "gelu" else "tanh")

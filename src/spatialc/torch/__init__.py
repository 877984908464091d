"""spatialc programs as PyTorch operators.

`op(builder, name)` turns a program *family* — a function from sizes to a spatialc program, such as
`lambda m, n, k: spatialc.gemm(m, n, k, "bf16", epilogue=[spatialc.bias(), spatialc.relu()])` — into a
`torch.library` custom op. Its inputs are the program's input tensors, then its parameter tensors, in the program's
order; its output is the program's one output, or a tuple of its outputs in the program's order for a program of
several (LayerNorm's (out, mean, rstd), each shaped as the program has it: mean and rstd m×1). The family's sizes
are read off the inputs' shapes: the builder is called twice with made-up sizes (frontend only, nothing built) to
learn which axis of which tensor each argument is.

- The fake (meta) implementation gives each output's shape and dtype from those axes alone, so `torch.compile` and
  `torch.export` trace through the op without building anything.
- A real call builds and verifies the program once per (sizes, device) and keeps it (`op.compiled()` lists what was
  built; the `spatialc.torch` logger says so at INFO); built programs are also kept on disk, as JSON under
  `$SPATIALC_CACHE/torch`, keyed by the unbuilt program, the build options and spatialc's version.
- On a CPU tensor the op runs `spatialc.evaluate`: the reference interpreter, exact, slow — a correctness path.
  On a CUDA tensor it lowers the program once, loads the kernel once and launches it with `spatialc.run`'s machinery
  on torch's current stream. That path has not run on a GPU yet.

`gemm_op(precision, bias=, activation=)` is a GEMM family with autograd (the backward is two more spatialc GEMMs);
`Linear` is `nn.Linear` computed by it, and `replace_linears(model)` swaps a model's `nn.Linear`s (and an activation
that follows one in an `nn.Sequential`) for it. `attention(q, k, v, causal=, scale=)` is `spatialc.attention` called
as torch's scaled_dot_product_attention is, over `attention_op` (no autograd yet); its `causal=True` mask is aligned
bottom right, so where seq_q ≠ seq_kv it is not SDPA's `is_causal=True` (aligned top left). `rms_norm` (with
`residual=`: fused add + RMSNorm), `layer_norm`, `softmax` and `log_softmax` are the row programs called as torch's
functions are, along x's last axis (no autograd yet). Bad input raises one line:
`InputError` for tensors the op cannot take, `ProgramError` for a family or option it cannot use.
"""

from __future__ import annotations

from ..errors import TorchUnavailable

try:
    import torch as torch  # the one torch this package uses (spatialc.torch.torch is it)
except ImportError:  # the core needs numpy alone; this package needs torch
    raise TorchUnavailable(
        "spatialc.torch needs PyTorch: pip install 'spatialc[torch]' (torch 2.13), or pip install torch"
    ) from None

from .family import Compiled, SpatialOp, op
from .family import launch_entry as launch_entry  # the CUDA branch's one call, which the tests drive
from .gemm import gemm_op
from .linear import Linear, replace_linears
from .rows import layer_norm, log_softmax, rms_norm, softmax
from .sdpa import _ATTENTION_OUT as _ATTENTION_OUT
from .sdpa import attention, attention_op
from .signature import _shape_of as _shape_of  # the tests read a program tensor's shape as the op takes it

__all__ = [
    "Compiled",
    "Linear",
    "SpatialOp",
    "attention",
    "attention_op",
    "gemm_op",
    "layer_norm",
    "log_softmax",
    "op",
    "replace_linears",
    "rms_norm",
    "softmax",
]

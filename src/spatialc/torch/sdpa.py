"""`attention`: spatialc.attention called as torch's scaled_dot_product_attention is, over `attention_op`.

One difference in meaning: `causal=True` is spatialc.attention's mask, aligned bottom right (query r sees keys up to
r + seq_kv − seq_q: FlashAttention's, torch's `causal_lower_right`). SDPA's `is_causal=True` aligns it top left (query
r sees keys up to r). The two agree only where seq_q = seq_kv; where seq_q < seq_kv the results differ (and causal
with seq_q > seq_kv is refused). For SDPA's top-left mask at other lengths, there is no flag here."""

from __future__ import annotations

from typing import Any

import torch

from ..arguments import refuse_float32
from ..errors import ProgramError, clipped
from ..inputs import InputError
from ..ir.nodes import SpatialProgram
from ..numerics.attention import FLOAT32_HOLDS, keyless, valid_scale
from .family import _LOCK, SpatialOp
from .signature import _dims, _dtype, _kind

# ---- attention -------------------------------------------------------------------------------------------------

_ATTENTION_IN = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_ATTENTION_OUT = {torch.float32: None, torch.bfloat16: "bf16", torch.float16: "fp16"}
_ATTENTIONS: dict[tuple[Any, ...], SpatialOp] = {}
# Two sets of (heads, seq_q, seq_kv, head_dim, kv_heads) the family is read with: kv_heads divides heads and
# seq_q ≤ seq_kv, so a causal family takes them.
_ATTENTION_PROBES = ((6, 5, 7, 8, 3), (12, 9, 11, 10, 4))
_NEVER_EMPTY = ("heads", "kv_heads", "seq_kv", "head_dim")  # (an empty batch or seq_q gives an empty O)


def attention_op(
    precision: str = "bf16", *, causal: bool = False, scale: float | None = None, out: str | None = None
) -> SpatialOp:
    """The op of `spatialc.attention` on tensors as its program has them: (q (G×seq_q×d), k, v (Gkv×seq_kv×d)) →
    (o (G×seq_q×d), lse (G×seq_q×1, float32)), G = batch · heads and Gkv = batch · kv_heads (batch folded into the
    heads: KV head j serves query heads j·G/Gkv … , as KV head h // (heads / kv_heads) of each batch does). One
    op per set of arguments in the process (named spatialc::attention_…); `attention` calls it."""
    refuse_float32(precision, "attention_op")
    if precision not in ("bf16", "fp16"):
        raise ProgramError(f"attention's operands are bf16 or fp16, not {precision!r}")
    if not isinstance(causal, bool):
        raise ProgramError(f"causal is True or False, not {causal!r}")
    if scale is not None and not valid_scale(scale):  # before float(): 10**400 overflows it
        raise ProgramError(f"scale is a finite number > 0 or None, not {clipped(repr(scale))} ({FLOAT32_HOLDS})")
    scale = None if scale is None else float(scale)
    key = (precision, bool(causal), scale, out)
    with _LOCK:
        found = _ATTENTIONS.get(key)
    if found is not None:
        return found
    from ..attention import attention as program

    def builder(heads: int, seq_q: int, seq_kv: int, head_dim: int, kv_heads: int) -> SpatialProgram:
        return program(
            1,
            heads,
            seq_q,
            seq_kv,
            head_dim,
            kv_heads=kv_heads,
            causal=causal,
            scale=scale,
            precision=precision,
            out=out,
        )

    scaled = "" if scale is None else "scale_" + float.hex(scale).replace(".", "_").replace("-", "m").replace("+", "p")
    parts = [precision, "causal" if causal else "", scaled, out or ""]
    made = SpatialOp(builder, "spatialc::attention_" + "_".join(p for p in parts if p), probes=_ATTENTION_PROBES)
    with _LOCK:
        return _ATTENTIONS.setdefault(key, made)


@torch.compiler.assume_constant_result  # torch.compile runs it as it traces (its lock and registration unseen)
def _attention_name(precision: str, causal: bool, scale: float | None, out: str | None) -> str:
    """The name in torch.ops.spatialc of `attention_op`'s op for these options, made if it is not yet."""
    return attention_op(precision, causal=causal, scale=scale, out=out).name.removeprefix("spatialc::")


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    out_dtype: Any = None,
    return_lse: bool = False,
) -> Any:
    """softmax(scale · Q·Kᵀ + mask) · V as `torch.nn.functional.scaled_dot_product_attention` takes it: q (batch,
    heads, seq_q, head_dim), k and v (batch, kv_heads, seq_kv, head_dim), bf16 or fp16 alike, kv_heads dividing heads
    (SDPA's `enable_gqa=True`). Returns O (batch, heads, seq_q, head_dim) in `out_dtype` (q's dtype unless told;
    torch.float32 keeps the float32 result), and with `return_lse` (O, LSE) with LSE (batch, heads, seq_q) float32,
    the natural log-sum-exp of each row's scaled, masked scores. `causal` masks key c for query r where
    c > r + seq_kv − seq_q: aligned bottom right (torch's `causal_lower_right`, FlashAttention's). That is NOT SDPA's
    `is_causal=True` (aligned top left) where seq_q ≠ seq_kv: the two agree only where seq_q = seq_kv. `scale`
    defaults to 1/√head_dim. The op behind it (`attention_op`) is built once per shape, as every op of `op`; it has no
    autograd yet (a backward through it raises torch's error). An empty batch or seq_q gives an empty O (and LSE); any
    other empty axis is an InputError naming it."""
    if not isinstance(causal, bool):  # a truthy 'no' would otherwise mask, or find a causal op already made
        raise ProgramError(f"spatialc.torch.attention: causal is True or False, not {causal!r}")
    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise InputError(f"spatialc.torch.attention: {name} is {_kind(t)}; pass a torch tensor")
        if t.dim() != 4:
            raise InputError(
                f"spatialc.torch.attention: {name} is {_dims(t.shape)}; it takes (batch, heads, seq, head_dim)"
            )
        if t.dtype != q.dtype or t.dtype not in _ATTENTION_IN:
            raise InputError(
                f"spatialc.torch.attention: q, k and v are {', '.join(_dtype(x.dtype) for x in tensors.values())};"
                " pass all three bfloat16 or all three float16"
            )
    for name, t in tensors.items():  # before any division or reshape by them: an empty axis is no attention
        axes = ("batch", "heads", "seq_q", "head_dim") if name == "q" else ("batch", "kv_heads", "seq_kv", "head_dim")
        empty = next((axis for axis, n in zip(axes, t.shape, strict=True) if n == 0 and axis in _NEVER_EMPTY), None)
        if empty is not None:
            raise InputError(
                f"spatialc.torch.attention: {name} is {_dims(t.shape)}, its {empty} 0; only batch and seq_q may be 0"
                " (an empty O, as SDPA's)"
            )
    (b, h, sq, d), (bk, hk, skv, dk) = q.shape, k.shape
    if tuple(v.shape) != tuple(k.shape) or bk != b or dk != d or h % hk != 0:
        raise InputError(
            f"spatialc.torch.attention: q {_dims(q.shape)}, k {_dims(k.shape)} and v {_dims(v.shape)} do not fit:"
            " k and v are (batch, kv_heads, seq_kv, head_dim), q (batch, heads, seq_q, head_dim), kv_heads dividing"
            " heads"
        )
    why = keyless(sq, skv, causal)
    if why is not None:
        raise InputError(f"spatialc.torch.attention: {why}")
    want = q.dtype if out_dtype is None else out_dtype
    if want not in _ATTENTION_OUT:
        raise ProgramError(f"spatialc.torch.attention: out_dtype is torch.float32, bfloat16 or float16, not {want}")
    if b == 0 or sq == 0:  # no query row: nothing to run, O and LSE empty (SDPA's O for an empty batch)
        o, lse = q.new_empty((b, h, sq, d), dtype=want), q.new_empty((b, h, sq), dtype=torch.float32)
        return (o, lse) if return_lse else o
    made = getattr(torch.ops.spatialc, _attention_name(_ATTENTION_IN[q.dtype], causal, scale, _ATTENTION_OUT[want]))
    o, lse = made(*(t.reshape(-1, *t.shape[2:]).contiguous() for t in (q, k, v)))
    o = o.reshape(b, h, sq, d)
    return (o, lse.reshape(b, h, sq)) if return_lse else o

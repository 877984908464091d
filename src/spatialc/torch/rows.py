"""`rms_norm`, `layer_norm`, `softmax` and `log_softmax`: spatialc's row programs called as torch's functions are.

Each takes x of any shape (..., n) — bf16, fp16 or float32 — and reduces along its last axis: the leading axes are
folded into the program's m rows, and the result has x's shape (and, unless `out_dtype` says otherwise, x's dtype,
as torch's own functions give it). Each set of options (the dtypes, eps, which of weight, bias and residual are
given) is one op, made once in the process and named in torch.ops.spatialc, so torch.compile traces through it as
through any `spatialc.torch.op`. A weight or bias is taken in any float dtype and computed with as float32 (the
programs' parameters are float32), as torch computes a bf16 model's norm in float32.

`rms_norm` and `layer_norm` also take torch.nn.functional's calling form, the normalised shape second —
`rms_norm(x, (n,), weight, eps)`, `layer_norm(x, (n,), weight, bias, eps)`, or `normalized_shape=` — so that they
stand in for F.rms_norm and F.layer_norm unchanged; the shape must be x's last axis (the programs reduce one), and
rms_norm's eps, where that form leaves it out, is torch's: the machine epsilon of x's dtype.

`rms_norm(x, weight, eps, residual=r)` is fused add + RMSNorm (`spatialc.rmsnorm(..., residual=True)`, vLLM's and
FlashInfer's `fused_add_rms_norm`): it returns (out, residual_out), residual_out = x + r in x's dtype — a new tensor,
not written over r as those kernels do."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..errors import ProgramError
from ..inputs import InputError
from ..rows import eps_value
from .family import _LOCK, SpatialOp
from .signature import _dims, _dtype, _kind

_ROW_IN = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_ROW_OUT = {torch.float32: None, torch.bfloat16: "bf16", torch.float16: "fp16"}
_ROW_OPS: dict[tuple[Any, ...], SpatialOp] = {}


def _x(what: str, x: Any) -> tuple[str, int]:
    """x's precision and the length of its rows (its last axis), or InputError in one line."""
    if not isinstance(x, torch.Tensor):
        raise InputError(f"spatialc.torch.{what}: x is {_kind(x)}; pass a torch tensor")
    if x.dtype not in _ROW_IN:
        raise InputError(f"spatialc.torch.{what}: x is {_dtype(x.dtype)}; pass bfloat16, float16 or float32")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise InputError(f"spatialc.torch.{what}: x is {_dims(x.shape)}; it reduces a last axis of at least 1 value")
    return _ROW_IN[x.dtype], int(x.shape[-1])


def _vector(what: str, name: str, v: Any, n: int) -> torch.Tensor | None:
    """A weight or bias of n values as float32 (None where not given), or InputError."""
    if v is None:
        return None
    if not isinstance(v, torch.Tensor) or not v.is_floating_point():
        got = f"a {_dtype(v.dtype)} tensor" if isinstance(v, torch.Tensor) else _kind(v)
        raise InputError(f"spatialc.torch.{what}: {name} is {got}; pass a float tensor of {n} values or None")
    if tuple(v.shape) != (n,):
        raise InputError(f"spatialc.torch.{what}: {name} is {_dims(v.shape)}; x's rows take ({n},)")
    return v.to(torch.float32).contiguous()


def _out(what: str, x: torch.Tensor, out_dtype: Any) -> torch.dtype:
    want = x.dtype if out_dtype is None else out_dtype
    if want not in _ROW_OUT:
        raise ProgramError(f"spatialc.torch.{what}: out_dtype is torch.float32, bfloat16 or float16, not {want}")
    return want


def _eps(what: str, eps: object) -> float:
    return eps_value(eps, f"spatialc.torch.{what}")


_NOT_GIVEN = object()
# torch.nn.functional.rms_norm's eps when it is None: the machine epsilon of the type torch computes in (its opmath
# type: float32 for bf16, fp16 and float32 alike), not of x's dtype as its docs say (bf16's 2^-7 would be 65,536
# times larger).
_TORCH_RMS_EPS = torch.finfo(torch.float32).eps


def _is_shape(v: object) -> bool:
    """Whether `v` reads as a normalised shape (torch.nn.functional's second argument): an int or a sequence of ints."""
    if isinstance(v, torch.Size):
        return True
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return True
    return isinstance(v, tuple | list) and all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in v)


def _arguments(
    what: str, x: Any, given: tuple[Any, ...], shape: Any, keywords: dict[str, Any]
) -> tuple[bool, tuple[Any, ...]]:
    """Whether torch.nn.functional's calling form was used, and the values of `keywords`' names in order, from
    either form: spatialc's (`given` are those names' values by place) or torch's, whose first is the normalised shape
    (or `shape`, given by keyword) — checked to be x's last axis and dropped. Each name's value by place or by name
    (both is an InputError, as Python's own would be a TypeError); _NOT_GIVEN where neither (the caller's default)."""
    names = tuple(keywords)
    if given and _is_shape(given[0]):
        if shape is not _NOT_GIVEN:  # (no weight is a shape: this is the shape by place too)
            raise InputError(f"spatialc.torch.{what}: normalized_shape given twice, by place and by name")
        shape, given = given[0], given[1:]
    if len(given) > len(names):
        raise InputError(
            f"spatialc.torch.{what} takes x, {'the normalised shape, ' if shape is not _NOT_GIVEN else ''}"
            f"then at most {', '.join(names)}; {len(given)} more arguments given"
        )
    if shape is not _NOT_GIVEN:
        dims = [shape] if isinstance(shape, numbers.Integral) else list(shape) if _is_shape(shape) else None
        last = int(x.shape[-1])
        if dims is None or len(dims) != 1 or int(dims[0]) != last:
            raise InputError(
                f"spatialc.torch.{what}: normalized_shape is {repr(shape)[:60]}; the program normalises x's last"
                f" axis alone, so pass ({last},)"
            )
    values = []
    for k, (name, by_name) in enumerate(keywords.items()):
        by_place = given[k] if k < len(given) else _NOT_GIVEN
        if by_name is not _NOT_GIVEN and by_place is not _NOT_GIVEN:
            raise InputError(f"spatialc.torch.{what}: {name} given twice, by place and by name")
        values.append(by_place if by_name is _NOT_GIVEN else by_name)
    return shape is not _NOT_GIVEN, tuple(values)


def _row_op(kind: str, precision: str, out: str | None, **options: Any) -> SpatialOp:
    """The op of row program `kind` for these options, made once in the process."""
    key = (kind, precision, out, tuple(sorted(options.items())))
    with _LOCK:
        found = _ROW_OPS.get(key)
    if found is not None:
        return found
    from .. import rows

    def builder(m: int, n: int) -> Any:
        if kind == "rms_norm":
            return rows.rmsnorm(m, n, precision, out=out, **options)
        if kind == "layer_norm":
            return rows.layernorm(m, n, precision, out=out, **options)
        return getattr(rows, kind)(m, n, precision, out=out, **options)

    def spelt(v: Any) -> str:
        return float.hex(v).replace(".", "_").replace("-", "m").replace("+", "p") if isinstance(v, float) else str(v)

    parts = [kind, precision, out or "", *(f"{k}_{spelt(v)}" for k, v in sorted(options.items()))]
    made = SpatialOp(builder, "spatialc::rows_" + "_".join(p for p in parts if p), disk_cache=True)
    with _LOCK:
        return _ROW_OPS.setdefault(key, made)


@torch.compiler.assume_constant_result  # torch.compile runs it as it traces (its lock and registration unseen)
def _op_name(kind: str, precision: str, out: str | None, options: tuple[tuple[str, Any], ...]) -> str:
    return _row_op(kind, precision, out, **dict(options)).name.removeprefix("spatialc::")


def _run(
    kind: str, x: torch.Tensor, want: torch.dtype, rows: list[torch.Tensor], vectors: list[Any], **options: Any
) -> Any:
    """The op on `rows` (x, a residual: leading axes folded into m) and the parameter `vectors` given, its outputs
    shaped back: those of x's rows as x, a row vector as x's leading axes (…, 1). None where x has no row."""
    precision, n = _ROW_IN[x.dtype], int(x.shape[-1])
    rows_shape = tuple(x.shape[:-1])
    if x.numel() == 0:  # no row: nothing to run
        return None
    made = getattr(torch.ops.spatialc, _op_name(kind, precision, _ROW_OUT[want], tuple(sorted(options.items()))))
    got = made(*(t.reshape(-1, n).contiguous() for t in rows), *(v for v in vectors if v is not None))
    outs = got if isinstance(got, tuple | list) else (got,)
    return tuple(o.reshape(*rows_shape, o.shape[-1]) for o in outs)


def rms_norm(
    x: Any,
    *args: Any,
    normalized_shape: Any = _NOT_GIVEN,
    weight: Any = _NOT_GIVEN,
    eps: Any = _NOT_GIVEN,
    residual: Any = None,
    out_dtype: Any = None,
) -> Any:
    """x · rsqrt(mean(x²) + eps) · weight along x's last axis: `rms_norm(x, weight=None, eps=1e-6)`, or torch's
    form `rms_norm(x, (n,), weight=None, eps=None)` (eps None: float32's machine epsilon, as torch takes it). Out
    in x's dtype unless `out_dtype` (the program computes in float32). With `residual` (x's shape and dtype): fused
    add + RMSNorm — h = x + residual, returns (rms_norm(h), h in x's dtype)."""
    _, n = _x("rms_norm", x)
    torch_form, (weight, eps) = _arguments("rms_norm", x, args, normalized_shape, {"weight": weight, "eps": eps})
    if eps is _NOT_GIVEN or (eps is None and torch_form):
        eps = _TORCH_RMS_EPS if torch_form else 1e-6
    eps = _eps("rms_norm", eps)
    w = _vector("rms_norm", "weight", None if weight is _NOT_GIVEN else weight, n)
    if residual is not None and (
        not isinstance(residual, torch.Tensor) or residual.shape != x.shape or residual.dtype != x.dtype
    ):
        got = (
            f"{_dims(residual.shape)} {_dtype(residual.dtype)}"
            if isinstance(residual, torch.Tensor)
            else _kind(residual)
        )
        raise InputError(
            f"spatialc.torch.rms_norm: residual is {got}; it is x's shape and dtype, {_dims(x.shape)} {_dtype(x.dtype)}"
        )
    want = _out("rms_norm", x, out_dtype)
    fused = residual is not None
    rows = [x, residual] if fused else [x]
    got = _run("rms_norm", x, want, rows, [w], eps=eps, weight=w is not None, residual=fused)
    if got is None:
        empty = x.new_empty(x.shape, dtype=want)
        return (empty, x.new_empty(x.shape)) if fused else empty
    return got if fused else got[0]


def layer_norm(
    x: Any,
    *args: Any,
    normalized_shape: Any = _NOT_GIVEN,
    weight: Any = _NOT_GIVEN,
    bias: Any = _NOT_GIVEN,
    eps: Any = _NOT_GIVEN,
    out_dtype: Any = None,
    stats: bool = False,
) -> Any:
    """(x − mean) · rstd · weight + bias along x's last axis: `layer_norm(x, weight=None, bias=None, eps=1e-5)`,
    or torch's form `layer_norm(x, (n,), weight, bias, eps)`. Out in x's dtype unless `out_dtype`; with `stats`,
    (out, mean, rstd), mean and rstd (…, 1) float32 as torch.native_layer_norm gives them."""
    _, n = _x("layer_norm", x)
    _, (weight, bias, eps) = _arguments(
        "layer_norm", x, args, normalized_shape, {"weight": weight, "bias": bias, "eps": eps}
    )
    eps = _eps("layer_norm", 1e-5 if eps is _NOT_GIVEN else eps)
    weight, bias = (None if v is _NOT_GIVEN else v for v in (weight, bias))
    w, b = _vector("layer_norm", "weight", weight, n), _vector("layer_norm", "bias", bias, n)
    want = _out("layer_norm", x, out_dtype)
    got = _run("layer_norm", x, want, [x], [w, b], eps=eps, weight=w is not None, bias=b is not None)
    if got is None:
        got = (x.new_empty(x.shape, dtype=want), *(x.new_empty((*x.shape[:-1], 1), dtype=torch.float32),) * 2)
    return got if stats else got[0]


def softmax(x: Any, dim: int = -1, dtype: Any = None, *, out_dtype: Any = None, online: bool = False) -> Any:
    """torch.softmax(x, dim, dtype) along the last axis (dim -1 or x.dim() − 1): out in x's dtype unless `out_dtype`.
    `dtype` is torch's: x cast to it first, and the result in it (softmax(x.to(dtype)) — bf16, fp16 or float32).
    `online`: two passes over each row, not three (`spatialc.softmax`)."""
    return _softmax("softmax", x, dim, dtype, out_dtype, online)


def log_softmax(x: Any, dim: int = -1, dtype: Any = None, *, out_dtype: Any = None, online: bool = False) -> Any:
    """torch.log_softmax(x, dim, dtype) along the last axis, as `softmax` takes it."""
    return _softmax("log_softmax", x, dim, dtype, out_dtype, online)


def _softmax(kind: str, x: Any, dim: Any, dtype: Any, out_dtype: Any, online: Any) -> Any:
    _x(kind, x)
    if dtype is not None:  # torch's: the input cast first, the result in that type
        if not isinstance(dtype, torch.dtype) or dtype not in _ROW_IN:
            raise InputError(f"spatialc.torch.{kind}: dtype is {dtype!r}; pass torch.bfloat16, float16 or float32")
        if out_dtype is not None and out_dtype != dtype:
            raise InputError(f"spatialc.torch.{kind}: dtype {dtype} and out_dtype {out_dtype}: give one")
        x, out_dtype = x.to(dtype), dtype
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim not in (-1, x.dim() - 1):
        raise InputError(
            f"spatialc.torch.{kind}: dim is {dim!r}; spatialc reduces the last axis (dim=-1): move the axis last first"
        )
    if not isinstance(online, bool):
        raise ProgramError(f"spatialc.torch.{kind}: online is True or False, not {online!r}")
    want = _out(kind, x, out_dtype)
    got = _run(kind, x, want, [x], [], online=online)
    return x.new_empty(x.shape, dtype=want) if got is None else got[0]

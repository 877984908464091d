"""The one check of the arrays a program is run on, shared by `evaluate`, `emulate` and `run`.

A program's inputs and parameters are `TensorSpec`s — name, role, logical shape, element type — taken from a
SpatialProgram (`specs_of`) or from an artifact's launch contract (`runtime.tilize.launch_specs`). `check_inputs`
matches a mapping of arrays to them by name, reads each as numpy (numpy arrays, nested lists, ml_dtypes arrays,
torch tensors and CuPy arrays), checks its shape and its values, and returns each as exactly what a tensor of its
element type holds. Bad inputs raise `InputError`, whichever of the three was called. The GPU launcher keeps its
arrays on the device: it calls the name, shape and value checks separately (`match_names`, `shaped`,
`check_values`), the last one with the device's array module.

Values: int8 / int32 / int64 tensors take whole numbers within their range (never rounded, wrapped or
truncated); fp16 / bf16 / e4m3 / e5m2 tensors round each value to nearest even, once, straight from float64, and
say so once per process and precision (`InexactInputWarning`) when that changed a value; float32 tensors take any
real. An e4m3 tensor (float8_e4m3fn: no infinity) refuses a value that rounds past its largest, ±448 — any of
magnitude above 464, ±inf included — naming the first; an e5m2 one rounds such a value to ±inf, as fp16 does.
torch is never imported here, and ml_dtypes only to round to an 8-bit float: an array of theirs is only converted
when one is given. The rounding itself is `numerics.narrow`'s (`round_bf16` is read from here too, as documented).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np

from .errors import SpatialError
from .ir.nodes import FOUR_BIT, DType, SpatialProgram, TensorRole
from .ir.ops import Attention, ReadTiles, WriteTiles, walk
from .numerics.narrow import as_float32, chunks, round_bf16, round_e4m3, round_e5m2, round_fp16

__all__ = [
    "InexactInputWarning",
    "InputError",
    "NonFiniteInputWarning",
    "TensorSpec",
    "check_inputs",
    "check_row_counts",
    "row_limits",
    "check_values",
    "host_array",
    "match_names",
    "operand_values",
    "round_bf16",
    "round_fp16",
    "rounding_watched",
    "shaped",
    "specs_of",
    "warn_if_rounded",
]

INT_RANGE = {DType.INT8: (-128, 127), DType.INT32: (-(2**31), 2**31 - 1), DType.INT64: (-(2**63), 2**63 - 1)}
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
FLOAT_EXACT = 2**53  # float64 holds every integer up to here, and the interpreter stores float64
FP8_MAX = {DType.E4M3: 448.0, DType.E5M2: 57344.0}  # the largest finite value of each 8-bit float
# What rounds to e4m3's largest value, 448 (1.75·2^8; the tie 464 goes to its even fraction): past it float8_e4m3fn
# has no value but NaN, so an input past it is refused rather than made NaN (ml_dtypes' cast) or 448 (torch's).
E4M3_LIMIT = 464.0
W4_TYPES = FOUR_BIT | {DType.E8M0}  # taken exactly as their values (numerics/w4.py), never rounded


class InputError(SpatialError, ValueError):
    """A missing, unknown or wrongly shaped input tensor, or values its element type cannot hold."""


class InexactInputWarning(UserWarning):
    """Inputs of an fp16 / bf16 / e4m3 / e5m2 program that were not values of that type, so were rounded (to nearest
    even)."""


class NonFiniteInputWarning(UserWarning):
    """Inputs holding NaN or ±inf: spatialc computes with them as IEEE arithmetic does (NaN where inf meets 0 or
    −inf) in the interpreter, the reference and the kernels alike, and compares NaN with NaN as equal."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What one input or parameter tensor takes: its name, role (`input` / `parameter`), logical shape and type."""

    name: str
    role: str
    elems: tuple[int, int]
    dtype: DType
    groups: int = 1  # a grouped tensor's arrays are (groups, *elems)
    heads: bool = False  # an attention's Q, K or V: its array may also come as (batch, heads, *elems)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.groups, *self.elems) if self.groups > 1 else tuple(self.elems)


def specs_of(p: SpatialProgram) -> list[TensorSpec]:
    """The input and parameter tensors of a program, in its order."""
    wanted = (TensorRole.INPUT, TensorRole.PARAMETER)
    heads = any(isinstance(getattr(s.kind, "op", None), Attention) for s in p.stages)
    return [
        TensorSpec(t.name, t.role.value, t.elems, t.dtype, t.groups, heads and t.role == TensorRole.INPUT)
        for t in p.tensors
        if t.role in wanted
    ]


def row_limits(p: SpatialProgram) -> dict[str, int]:
    """Each tensor of row counts (a grouped GEMM's `sizes`) → the most rows a count may give: the rows of the
    grouped tensors it limits."""
    out: dict[str, int] = {}
    listed = {id(prog.ops): prog.ops for prog in p.schedule.programs} if p.schedule else {}  # sites share lists
    for ops in listed.values():
        for op in walk(ops):
            if isinstance(op, ReadTiles | WriteTiles) and op.rows_from is not None:
                name = p.tensor(op.rows_from).name
                out[name] = min(out.get(name, 1 << 62), p.tensor(op.tensor).elems[0])
    return out


def check_row_counts(limits: Mapping[str, int], values: Mapping[str, np.ndarray]) -> None:
    """InputError unless every row count lies in 0 … its tensor's rows (a row count past them would name rows
    that do not exist)."""
    for name, limit in limits.items():
        counts = np.asarray(values[name]).reshape(-1)
        bad = np.flatnonzero((counts < 0) | (counts > limit))
        if bad.size:
            g = int(bad[0])
            raise InputError(
                f"tensor {name}: group {g} has {counts[g]:g} rows; each group's row count lies in 0..{limit}"
                f" (its max_rows)"
            )


def check_inputs(owner: str, specs: list[TensorSpec], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each spec's array from `inputs`, checked and holding exactly its element type's values; else InputError."""
    out = {}
    for spec, value in match_names(owner, specs, inputs):
        if spec.dtype in W4_TYPES:  # 4-bit weights (packed or not) and e8m0 scales: numerics/w4.py
            from .numerics.w4 import input_values

            out[spec.name] = input_values(spec, value)
            continue
        given = shaped(spec, host_array(spec.name, _an_array(spec, value)))
        values = operand_values(spec.name, given, spec.dtype)
        warn_if_rounded(spec.dtype, given, values)
        warn_if_not_finite(spec.name, values)
        out[spec.name] = values
    return out


def _an_array(spec: TensorSpec, value: Any) -> Any:
    """`value`, unless it is no array at all — None, a string, one number — which InputError names as what it is
    (numpy would read it as an array of shape ())."""
    if value is None or isinstance(value, str | bytes | int | float | complex):
        what = "None" if value is None else f"a {type(value).__name__} ({value!r:.40})"
        raise InputError(f"tensor {spec.name}: expected an array of shape {spec.shape}, got {what}")
    return value


def match_names(owner: str, specs: list[TensorSpec], inputs: Mapping[str, Any]) -> list[tuple[TensorSpec, Any]]:
    """Each spec with the value `inputs` gives it; InputError for a name too many or too few."""
    if not isinstance(inputs, Mapping):
        raise InputError(
            f"inputs are a mapping of tensor name to array (e.g. {{'A': a, 'B': b}}), not a {type(inputs).__name__}"
        )
    wanted = {s.name: s for s in specs}
    unknown = sorted((str(k) for k in inputs if k not in wanted), key=str)
    if unknown:
        raise InputError(
            f"{owner} has no input or parameter tensor named {', '.join(unknown)}"
            f" (it takes {', '.join(sorted(wanted)) or 'none'})"
        )
    missing = sorted(set(wanted) - set(inputs))
    if missing:
        raise InputError(f"{owner} needs tensor {', '.join(missing)}, which is not among the inputs")
    return [(s, inputs[s.name]) for s in specs]


def shaped(spec: TensorSpec, value: Any) -> Any:
    """`value` in the spec's logical shape (a row or column vector may come as a plain vector); any array library."""
    if not hasattr(value, "shape"):
        value = host_array(spec.name, value)
    shape = tuple(int(d) for d in value.shape)
    if len(shape) == 1 and spec.elems[0] == 1 and spec.groups == 1:  # a row vector (a bias, row counts) may come
        if shape[0] != spec.elems[1]:  # as a plain vector
            raise InputError(f"tensor {spec.name}: expected {spec.elems[1]} values, got {shape[0]}")
        value, shape = value.reshape(1, -1), (1, *shape)
    elif len(shape) == 1 and spec.elems[1] == 1 and spec.groups == 1:  # a column vector (a per-row scale) too
        if shape[0] != spec.elems[0]:
            raise InputError(f"tensor {spec.name}: expected {spec.elems[0]} values, got {shape[0]}")
        value, shape = value.reshape(-1, 1), (*shape, 1)
    elif spec.heads and len(shape) in (3, 4) and math.prod(shape[:-2]) == spec.groups and shape[-2:] == spec.elems:
        value, shape = value.reshape(spec.shape), spec.shape  # (batch, heads, seq, dim): the heads one after another
    if shape != spec.shape:
        rows, cols = spec.elems
        also = f" or (batch, heads, {rows}, {cols}) with batch·heads = {spec.groups}" if spec.heads else ""
        raise InputError(f"tensor {spec.name}: expected shape {spec.shape}{also}, got {shape}")
    return value


def host_array(name: str, value: Any) -> np.ndarray:
    """`value` as a numpy array of real numbers where it is one: torch tensors (any device, bf16 / fp16 through
    float32, exactly), CuPy arrays, ml_dtypes arrays (through float64, exactly), nested lists."""
    library = type(value).__module__.split(".")[0]
    try:
        if library == "torch":
            value = _torch_to_numpy(value)
        elif library == "cupy":
            value = value.get()
        arr = np.asarray(value)
    except Exception as e:  # a ragged list, an object numpy cannot read, a tensor that cannot leave its device
        what = type(value).__name__
        raise InputError(f"tensor {name}: cannot read a {what} as an array ({_first_line(e)})") from None
    if arr.dtype.kind == "V" and arr.dtype.type.__module__.split(".")[0] == "ml_dtypes":
        return arr.astype(np.float64)  # bfloat16, float8, int4: float64 holds each of their values exactly
    return arr


def _torch_to_numpy(t: Any) -> np.ndarray:
    t = t.detach()
    if t.is_floating_point() and t.element_size() < 4:
        t = t.float()  # numpy has no bfloat16 (and float8): float32 holds each of their values exactly
    return t.cpu().numpy()


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]


# ---- values ----------------------------------------------------------------------------------------------------


def operand_values(name: str, values: Any, dtype: DType) -> np.ndarray:
    """An array whose values, read as float64, are exactly what a tensor of `dtype` holds; or InputError.

    Integer arrays that fit are returned as they are, and so are float16 arrays for fp16 and float32 arrays of fp16 /
    bf16 / e4m3 / e5m2 values; other such inputs come back rounded, as float32 (which holds every such value)."""
    arr = host_array(name, values)
    check_values(name, arr, dtype)
    match dtype:
        case DType.FP16:
            return arr if arr.dtype == np.float16 else as_float32(arr, round_fp16)
        case DType.BF16:
            return as_float32(arr, round_bf16)
        case DType.E4M3:
            return as_float32(arr, round_e4m3)
        case DType.E5M2:
            return as_float32(arr, round_e5m2)
        case DType.FLOAT32:
            return arr.astype(np.float32, copy=False)
    return arr


def check_values(name: str, x: Any, dtype: DType, xp: Any = np) -> None:
    """InputError unless `x` (an array of module `xp`: numpy, or CuPy on a GPU) holds real numbers that a tensor of
    `dtype` takes as they are: for integer types, whole numbers within range; for e4m3, none that rounds past ±448."""
    kind = np.dtype(x.dtype).kind
    if kind not in "biuf":
        raise InputError(f"tensor {name}: expected numbers, got an array of {x.dtype}")
    if dtype == DType.E4M3 and kind in "iuf" and x.size:
        _check_e4m3_range(name, x, xp)
    if dtype not in INT_RANGE or not x.size:
        return
    lo, hi = INT_RANGE[dtype]
    if kind == "f" and not bool(xp.all(x == xp.trunc(x))):  # NaN is not whole; ±inf fails the range below
        raise InputError(f"tensor {name} is {dtype.value} but holds values that are not whole numbers")
    fits = kind in "iu" and np.iinfo(x.dtype).min >= lo and np.iinfo(x.dtype).max <= hi
    if fits and dtype != DType.INT64:
        return  # the array's own type holds nothing the tensor's does not
    least, most = x.min().item(), x.max().item()
    if least < lo or most > hi:
        raise InputError(f"tensor {name} is {dtype.value} but holds values outside {lo}..{hi}")
    if dtype == DType.INT64 and max(abs(int(least)), abs(int(most))) >= FLOAT_EXACT:
        raise InputError(f"tensor {name}: values beyond 2^53 are not exact in the interpreter's float64")


def _check_e4m3_range(name: str, x: Any, xp: Any) -> None:
    """InputError naming the first element of `x` past E4M3_LIMIT (±inf included; NaN is e4m3fn's own)."""
    past = (x > E4M3_LIMIT) | (x < -E4M3_LIMIT)
    if not bool(past.any()):
        return
    at = tuple(int(i) for i in np.unravel_index(int(xp.argmax(past.reshape(-1))), x.shape))
    value = float(x[at])
    raise InputError(
        f"tensor {name} is e4m3 (float8_e4m3fn: largest value ±448, no infinity) but {name}{list(at)} = {value:g}"
        f" rounds past it ({int(past.sum())} such values); scale the tensor into range and multiply C back by the"
        " scale (spatialc.row_scale / col_scale / scalar('mul', s))"
    )


# the element types an input is rounded to: float32 too, which a float64 or int array given for a float32 tensor
# (an fp32 program's input, a parameter) is rounded to as bf16 data is to bf16 (a finite 1e300 to inf included)
ROUNDED = (DType.FP16, DType.BF16, DType.E4M3, DType.E5M2, DType.FLOAT32)


# ---- saying that inputs were rounded -----------------------------------------------------------------------------

_WARNED: set[DType] = set()  # the precisions already warned about in this process


def rounding_watched(dtype: DType) -> bool:
    """Whether rounding inputs to `dtype` is still to be looked for: fp16 / bf16 / e4m3 / e5m2 / float32, not yet
    warned about."""
    return dtype in ROUNDED and dtype not in _WARNED


def warn_if_rounded(dtype: DType, before: Any, after: Any, xp: Any = np) -> None:
    """Warn once per process and precision when rounding `before` to its float type (giving `after`) changed a value;
    nothing is computed once the warning has been given."""
    if not rounding_watched(dtype) or not before.size or after is before:
        return
    # float32 holds fp16 / bf16 / float32 inputs and their rounded values exactly, and halves a GPU's scratch
    kind, size = np.dtype(before.dtype).kind, np.dtype(before.dtype).itemsize
    wide = xp.float32 if kind == "f" and size <= 4 else xp.float64
    largest = 0.0
    # a chunk at a time on the host (the differences of a whole input would take gigabytes); whole on a GPU
    pairs = zip(chunks(before.reshape(-1)), chunks(after.reshape(-1)), strict=True) if xp is np else [(before, after)]
    for b0, a0 in pairs:
        with np.errstate(invalid="ignore", over="ignore"):
            b = b0.astype(wide)
            change = xp.where(xp.isfinite(b), xp.abs(a0.astype(wide) - b), 0)
        largest = max(largest, float(change.max()))
    if largest == 0:
        return
    _WARNED.add(dtype)
    how = "some finite values beyond its range became infinite" if largest == np.inf else f"by at most {largest:.3g}"
    name = dtype.value
    warnings.warn(
        f"{name} inputs that are not {name} values were rounded to the nearest {name} value (ties to even), {how};"
        f" said once per process for {name}",
        InexactInputWarning,
        stacklevel=_outside_spatialc(),
    )


_NONFINITE_WARNED: list[bool] = []  # whether a NonFiniteInputWarning was given in this process


def warn_if_not_finite(name: str, values: np.ndarray) -> None:
    """Say once per process, in spatialc's words, that an input holds NaN or ±inf (numpy would say it in a
    RuntimeWarning from inside spatialc, once for every op that meets one)."""
    if _NONFINITE_WARNED or values.dtype.kind != "f":
        return
    if all(np.isfinite(part).all() for part in chunks(values.reshape(-1))):
        return
    _NONFINITE_WARNED.append(True)
    warnings.warn(
        f"tensor {name} holds NaN or ±inf: spatialc computes with them as IEEE arithmetic does (inf · 0 and inf − inf"
        " are NaN), and a check counts NaN equal to NaN; the tolerance bound holds only where C is finite; said once"
        " per process",
        NonFiniteInputWarning,
        stacklevel=_outside_spatialc(),
    )


def _outside_spatialc() -> int:
    """The stack level of the first caller outside spatialc, so that a warning names the user's line. torch's own
    frames count as spatialc's: a spatialc.torch function runs its program as a torch op, through torch's dispatch
    (and torch.compile's), between the user's line and spatialc's."""
    frame: FrameType | None = sys._getframe(2)  # level 1 is the function that warns, the caller of this one
    level = 2
    inside = (PACKAGE_DIR, *_torch_dir())
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _torch_dir() -> tuple[str, ...]:
    """torch's package folder where torch is imported (spatialc never imports it to warn), else nothing."""
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None)
    return (os.path.dirname(os.path.abspath(where)) + os.sep,) if where else ()

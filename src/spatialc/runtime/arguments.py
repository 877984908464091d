"""What a kernel's arguments are: each launch parameter with its element and storage types, and the caller's
arrays paired with them (names, shapes and libraries checked, nothing moved off its device)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..inputs import InputError, TensorSpec, host_array, match_names, shaped
from .tilize import BYTE_ELEMS, ORDERS, LaunchError, check_tiles, element_type, storage_dtype, tensor_spec
from .w4_args import HostBytes, host_bytes, is_packed_c

# ---- what a kernel's arguments are -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arg:
    """One kernel parameter and its element / storage types."""

    name: str
    role: str
    elems: tuple[int, int]
    tiles: tuple[int, int]
    elem: str  # int8, float16, bfloat16, int64, float32, …
    storage: str  # the device array's dtype (bf16 → uint16)
    order: str = "row"  # KernelParam.order: "row" / "col" inside each tile; "rows" / "cols" a padded matrix
    groups: int = 1  # a grouped tensor's arrays are (groups, *elems)
    heads: bool = False  # an attention's Q, K or V: (batch, heads, *elems) too (KernelParam.heads)
    packed: bool = False  # a W4A16 kernel's 4-bit weights, two a byte (runtime/w4_args.py)

    @property
    def spec(self) -> TensorSpec:
        """What `spatialc.inputs` checks this argument's array against."""
        return tensor_spec(self.name, self.role, self.elem, self.elems, self.groups, self.heads)


def kernel_args(launch: Any) -> list[Arg]:
    """The launch's parameters with their element types resolved, in launch order."""
    out = []
    for p in launch.params:
        if p.role not in ("input", "output", "parameter", "workspace"):
            raise LaunchError(
                f"kernel parameter {p.name} has role {p.role!r}; expected input, output, parameter or workspace"
            )
        elem = element_type(p.c_type)
        order = getattr(p, "order", "row")
        if order not in ORDERS:
            raise LaunchError(
                f"kernel parameter {p.name} has order {order!r}; expected 'row' or 'col' (tiled), 'rows' or 'cols'"
            )
        groups, heads = int(getattr(p, "groups", 1)), bool(getattr(p, "heads", False))
        packed = is_packed_c(p.c_type)
        store = storage_dtype(elem)
        out.append(Arg(p.name, p.role, tuple(p.elems), tuple(p.tiles), elem, store, order, groups, heads, packed))
    if not any(a.role == "output" for a in out):
        raise LaunchError("the launcher runs kernels with at least one output; this one has none")
    if not any(a.role == "input" for a in out):
        raise LaunchError("the launcher runs kernels with at least one input")
    return out


def bind(args: Sequence[Arg], operands: Sequence[Any], params: Mapping[str, Any]) -> list[tuple[Arg, Any]]:
    """Pair each input/parameter Arg with the caller's array (output Args get None): `operands` are the inputs in
    the kernel's order (A, B; an MLP's X, W1, W2; a map's x0, x1, …), `params` any tensor by name. Names and shapes
    are checked with `spatialc.inputs` (InputError), without moving any array off its device."""
    inputs = [x.name for x in args if x.role == "input"]
    if len(operands) > len(inputs):
        raise InputError(
            f"{len(operands)} arrays given by position, but this kernel has {len(inputs)} input(s): {', '.join(inputs)}"
        )
    given = {name: x for name, x in zip(inputs, operands, strict=False) if x is not None}
    twice = sorted(set(given) & set(params))
    if twice:
        raise InputError(f"{', '.join(twice)} given twice: by position and by name")
    values = {**given, **params}
    match_names("this kernel", [x.spec for x in args if x.role not in ("output", "workspace")], values)
    bound: list[tuple[Arg, Any]] = []
    for x in args:
        if x.role in ("output", "workspace"):  # the launcher makes them
            bound.append((x, None))
            continue
        library_of(x.name, values[x.name])
        if x.elem in BYTE_ELEMS:  # 4-bit weights, their zero points, e8m0 scales: their bytes, made on the host
            if (x.groups > 1 and x.elem != "float8_e8m0fnu") or x.order != "row":  # (MXFP8's grouped scales: made)
                raise LaunchError(f"kernel parameter {x.name} holds {x.elem} in a layout the launcher does not make")
            bound.append((x, host_bytes(x.spec, x.tiles, x.packed, values[x.name])))
            continue
        value = shaped(x.spec, values[x.name])
        if isinstance(value, np.ndarray) and value.dtype.kind == "V":  # ml_dtypes (float8, bfloat16): no device array
            value = host_array(x.name, value)  # library has them; their values, exactly (fp8 goes up as its bytes)
        if x.groups > 1:  # each group on its own share of the stacked grid
            check_tiles(x.name, tuple(value.shape[1:]), (x.tiles[0] // x.groups, x.tiles[1]))
        else:
            check_tiles(x.name, tuple(value.shape), x.tiles)
        bound.append((x, value))
    return bound


def library_of(name: str, x: Any) -> str:
    """`numpy`, `torch` or `cupy`: the library an argument comes from (lists and scalars count as numpy)."""
    if isinstance(x, HostBytes):  # 4-bit bytes made on the host: the caller's array says
        x = x.given
    root = type(x).__module__.split(".")[0]
    if root in ("torch", "cupy", "numpy"):
        return root
    if isinstance(x, list | tuple | int | float):
        return "numpy"
    raise InputError(f"{name} is a {type(x).__name__}; pass a numpy, torch or CuPy array")


def result_library(bound: Sequence[tuple[Arg, Any]]) -> str:
    """The library the result comes back in: the arguments' one non-numpy library, else numpy."""
    libs = {library_of(arg.name, v) for arg, v in bound if v is not None} - {"numpy"}
    if len(libs) > 1:
        raise InputError(f"arguments mix {' and '.join(sorted(libs))} arrays; pass one library's")
    return libs.pop() if libs else "numpy"

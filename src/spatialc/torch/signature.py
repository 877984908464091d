"""A program family's signature, read off two builder calls: which tensor axis each size argument is, and the op's
tensor slots (their names, roles, torch dtypes and axes) that `family.SpatialOp` registers as its schema."""

from __future__ import annotations

import inspect
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ProgramError
from ..ir.nodes import DType, SpatialProgram, Tensor, TensorRole

TORCH_DTYPES = {
    DType.INT8: torch.int8,
    DType.INT32: torch.int32,
    DType.INT64: torch.int64,
    DType.FP16: torch.float16,
    DType.BF16: torch.bfloat16,
    DType.FLOAT32: torch.float32,
    DType.E4M3: torch.float8_e4m3fn,  # a kernel's launcher uploads their values as bytes (runtime.tilize.fp8_bits)
    DType.E5M2: torch.float8_e5m2,
}

# Made-up sizes the builder is called with to learn which tensor axis each of its arguments is: two sets, each
# argument a different value in each, so an axis that follows an argument differs between them and a constant does
# not. An unbuilt program's family only runs the frontend on them; a spatialc.lang family traces and verifies.
PROBES = ((33, 50, 67, 84, 101, 118, 135, 152), (41, 58, 75, 92, 109, 126, 143, 161))

Axis = int | str  # an axis of a tensor: a fixed size, or the name of the builder argument it equals


@dataclass(frozen=True, slots=True)
class Slot:
    """One tensor of the op: its name in the program, role, torch dtype and axes."""

    name: str
    role: TensorRole
    dtype: torch.dtype
    axes: tuple[Axis, ...]

    @property
    def row(self) -> bool:
        """A parameter of one row (a bias): it takes a 1-D tensor of its columns too."""
        return self.role == TensorRole.PARAMETER and len(self.axes) == 2 and self.axes[0] == 1


def _qualified(name: object) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"([A-Za-z_]\w*::)?[A-Za-z_]\w*", name):
        raise ProgramError(f"an op's name is 'namespace::name' or 'name' (letters, digits, _), not {name!r}")
    return name if "::" in name else f"spatialc::{name}"


def _parameters(builder: Callable[..., Any], name: str) -> tuple[str, ...]:
    try:
        sig = inspect.signature(builder)
    except (TypeError, ValueError):
        raise ProgramError(f"{name}: the builder's signature cannot be read; pass a def or lambda of sizes") from None
    params = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            if p.kind == p.KEYWORD_ONLY and p.default is not p.empty:
                continue
            raise ProgramError(f"{name}: the builder's arguments are sizes by position; {p} is not one")
        if p.default is p.empty:
            params.append(p.name)
    if len(params) > len(PROBES[0]):
        raise ProgramError(f"{name}: a family takes at most {len(PROBES[0])} sizes, not {len(params)}")
    return tuple(params)


def _call(builder: Callable[..., Any], name: str, sizes: tuple[int, ...]) -> SpatialProgram:
    p = builder(*sizes)
    if not isinstance(p, SpatialProgram):
        raise ProgramError(f"{name}: the builder returned {_kind(p)}; it must return a spatialc program")
    if p.plans and not p.verified:
        raise ProgramError(f"{name}: the builder returned a planned program that is not verified; verify it first")
    return p


def _probes(name: str, count: int, given: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two sets of `count` sizes: each set's all different, and each size different between the sets."""
    if given is None:
        return PROBES[0][:count], PROBES[1][:count]
    try:
        one, two = (tuple(int(v) for v in p) for p in given)
    except (TypeError, ValueError):
        raise ProgramError(f"{name}: probes are two tuples of {count} sizes, not {given!r}") from None
    if not (
        len(one) == len(two) == count
        and len(set(one)) == len(set(two)) == count
        and all(a != b for a, b in zip(one, two, strict=True))
    ):
        raise ProgramError(
            f"{name}: probes are two tuples of {count} sizes, each tuple's all different and each size different"
            f" between them; not {given!r}"
        )
    return one, two


def _signature(
    builder: Callable[..., Any], name: str, given: Any = None
) -> tuple[tuple[str, ...], tuple[Slot, ...], tuple[Slot, ...]]:
    """The builder's size arguments, the op's input slots (the program's inputs, then its parameters) and its
    output slots (in the program's order), each axis a constant or the argument it equals: learnt from two calls
    with different sizes."""
    params = _parameters(builder, name)
    probes = _probes(name, len(params), given)
    first, second = (_call(builder, name, probe) for probe in probes)
    if [(t.name, t.role, t.dtype) for t in first.tensors] != [(t.name, t.role, t.dtype) for t in second.tensors]:
        raise ProgramError(f"{name}: the family's tensors change with its sizes; it cannot be one op")
    slots = []
    for t0, t1 in zip(first.tensors, second.tensors, strict=True):
        axes: list[Axis] = []
        for v0, v1 in zip(_shape_of(t0), _shape_of(t1), strict=True):
            if v0 == v1:
                axes.append(v0)
            elif v0 in probes[0] and probes[1][probes[0].index(v0)] == v1:
                axes.append(params[probes[0].index(v0)])
            else:
                raise ProgramError(
                    f"{name}: tensor {t0.name}'s shape is not made of the family's sizes (an axis of {v0} at sizes"
                    f" {probes[0]}); make each axis one argument"
                )
        if t0.dtype not in TORCH_DTYPES:
            raise ProgramError(f"{name}: tensor {t0.name} holds {t0.dtype}, which torch has no dtype for")
        slots.append(Slot(t0.name, t0.role, TORCH_DTYPES[t0.dtype], tuple(axes)))
    outputs = [s for s in slots if s.role == TensorRole.OUTPUT]
    if not outputs:
        raise ProgramError(f"{name}: an op is a program of at least one output tensor; this one has none")
    if any(s.role == TensorRole.WORKSPACE for s in slots):
        raise ProgramError(f"{name}: an op's program keeps no workspace tensor; this one has one")
    ins = [s for s in slots if s.role == TensorRole.INPUT] + [s for s in slots if s.role == TensorRole.PARAMETER]
    unread = [p for p in params if not any(p in s.axes for s in ins)]
    if unread:
        raise ProgramError(f"{name}: size {unread[0]} is no axis of an input tensor, so it cannot be read off one")
    return params, tuple(ins), tuple(outputs)


def _arg_names(slots: tuple[Slot, ...]) -> list[str]:
    """The schema's argument names: the tensors' names made identifiers torch takes, each once."""
    out: list[str] = []
    for s in slots:
        n = re.sub(r"\W", "_", s.name)
        n = f"t_{n}" if not n or n[0].isdigit() or keyword.iskeyword(n) or n == "self" else n
        while n in out:
            n += "_"
        out.append(n)
    return out


def _shape_of(t: Tensor) -> tuple[int, ...]:
    return (t.groups, *t.elems) if t.groups > 1 else tuple(t.elems)


def _taken(slot: Slot, t: Tensor) -> tuple[int, ...]:
    """The shape the op takes or gives for the program's tensor `t`: `_shape_of`, with a leading axis of one where
    the family's tensor has a groups axis that these sizes make one (a program tensor of one group has no such axis,
    as `spatialc.attention`'s q at batch · heads = 1)."""
    shape = _shape_of(t)
    return (1, *shape) if len(slot.axes) == len(shape) + 1 else shape


def _dims(shape: Any) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _dtype(d: Any) -> str:
    return str(d).removeprefix("torch.")


def _kind(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"

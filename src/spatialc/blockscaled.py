"""Block-scaled 8-bit float GEMMs in the frontend: `gemm(..., precision="e4m3", scales=("1x128", "128x128"))`.

The names of the scale layouts (one per operand; `numerics.blockscale` defines what a scale means):

    A (one value per block of A's rows × K)      B (one value per block of K × B's columns)
    "1x128"   each row, each group of 128 of K    "128x128" each 128 of K × 128 columns (DeepGEMM's)
    "RxG"     R rows × G of K (G a multiple of    "GxC"     G of K × C columns (G a multiple of 128):
              128): "128x128", "1x256"                    "128x1" each column, each group of 128
    "row"     each row, all of K (per token)      "col"     each column, all of K (per channel)
    "tensor"  one value for all of A              "tensor"  one value for all of B

A's scales are the parameter tensor `scale_a` of shape (⌈M / R⌉, ⌈K / G⌉), B's `scale_b` of (⌈K / G⌉, ⌈N / C⌉),
float32 (bf16 and float8_e8m0fnu arrays are taken exactly; other floats rounded to float32, nearest even). A grouped
GEMM's (`grouped_gemm(..., scales=...)`: DeepGEMM's grouped fp8 kernels of a mixture-of-experts layer) are a
matrix a group: scale_a (G, ⌈MAXROWS / R⌉, ⌈K / G⌉) — each expert's rows — and scale_b (G, ⌈K / G⌉, ⌈N / C⌉) —
each expert's B; "tensor" is then one value a group.

OCP MX for 8-bit floats (MXFP8): `scales="mx"` (or its layouts spelled out, ("1x32", "32x1")) gives A one scale per
row and 32 of K and B one per 32 of K and column, of element type e8m0 — float8_e8m0fnu arrays, or powers of two
2^-127 … 2^127, taken exactly (`numerics.w4` defines the type) — and promotes every 32 of K, the group
(`numerics.blockscale`). A 32 along K is MX's alone: other layouts group multiples of 128, with float32 scales.
"""

from __future__ import annotations

import dataclasses
import math
import re

from .errors import ProgramError
from .ir.ids import TensorId
from .ir.names import fitted_name
from .ir.nodes import ComputeStage, DType, SpatialProgram, Tensor, TensorRole
from .ir.ops import FP8_PRECISIONS, BlockScales, KScale, MatmulTiles
from .numerics.blockscale import MX_K, MX_LAYOUTS, PROMOTION_K, scale_shape

MX = "mx"  # scales="mx": OCP MX's e8m0 scale per 32 of K, A's per row and B's per column (MX_LAYOUTS)
SCALE_NAMES = ("scale_a", "scale_b")  # the parameter tensors of A's and B's scales
A_LAYOUTS = "1x128, RxG (R rows × G of K, G a multiple of 128), row or tensor"
B_LAYOUTS = "128x128, GxC (G of K × C columns, G a multiple of 128), 128x1, col or tensor"
_BLOCK = re.compile(r"^([1-9][0-9]{0,9})x([1-9][0-9]{0,9})$")


def layout(which: str, name: object, outer: int, k: int) -> tuple[int, int]:
    """(outer, k) elements one scale of operand `which` ("A" or "B") covers, for a layout name; ProgramError else."""
    accepted = A_LAYOUTS if which == "A" else B_LAYOUTS
    if not isinstance(name, str):
        raise ProgramError(f"{which}'s scales are named by a string ({accepted}), not {name!r}")
    text = name.strip().lower()
    whole = {"tensor": (outer, k), ("row" if which == "A" else "col"): (1, k)}
    if text in whole:
        return whole[text]
    found = _BLOCK.match(text)
    if found is None:
        raise ProgramError(f"unknown scale layout {name!r} for {which}; use {accepted}")
    first, second = int(found.group(1)), int(found.group(2))
    block_outer, block_k = (first, second) if which == "A" else (second, first)
    if block_k % PROMOTION_K:
        side = "second" if which == "A" else "first"
        raise ProgramError(
            f"{which}'s scale layout {name!r} groups {block_k} elements of K (its {side} number); a group along K is"
            f" a multiple of {PROMOTION_K}, the kernel's promotion interval (or use scales='mx': {MX_LAYOUTS[0]},"
            f" {MX_LAYOUTS[1]} with e8m0 scales)"
        )
    return block_outer, block_k


def with_scales(p: SpatialProgram, scales: object, m: int, n: int, k: int, groups: int = 1) -> SpatialProgram:
    """The gemm program `p` made block-scaled by `scales`, a pair of layout names (A's, B's): its matmul promotes
    each K step with the scale tensors scale_a and scale_b, two parameters more (a grouped GEMM's: `groups` matrices
    each, stacked, `m` its most rows); `scales` "mx": OCP MX's layouts, e8m0 scales (the module docstring)."""
    mx = _is_mx(scales)
    if mx:
        scales = MX_LAYOUTS
    if not isinstance(scales, tuple | list) or len(scales) != 2:
        raise ProgramError(
            f"scales is a pair of layout names, A's and B's (e.g. ('1x128', '128x128')), or 'mx', not {scales!r}"
        )
    if p.precision not in FP8_PRECISIONS:
        raise ProgramError(f"block scales are for 8-bit float operands (e4m3, e5m2), not {p.precision.value} ones")
    taken = {t.name.lower() for t in p.tensors}
    for name in SCALE_NAMES:
        if name in taken:
            raise ProgramError(f"the scale tensor {name!r} is a block-scaled GEMM's own; name the epilogue's otherwise")
    a_outer, a_k = (1, MX_K) if mx else layout("A", scales[0], m, k)
    b_outer, b_k = (1, MX_K) if mx else layout("B", scales[1], n, k)
    dtype = DType.E8M0 if mx else DType.FLOAT32
    sa = KScale(TensorId(len(p.tensors)), a_outer, a_k)
    sb = KScale(TensorId(len(p.tensors) + 1), b_outer, b_k)
    b_outer_blocks, b_k_blocks = scale_shape(sb, n, k)  # B's tensor is stored (K blocks, column blocks)
    tensors = (
        *p.tensors,
        _param(sa.tensor, SCALE_NAMES[0], scale_shape(sa, m, k), p.tile.rows, groups, dtype),
        _param(sb.tensor, SCALE_NAMES[1], (b_k_blocks, b_outer_blocks), p.tile.rows, groups, dtype),
    )
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(dataclasses.replace(s.kind.op, scales=BlockScales(sa, sb))))
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles)
        else s
        for s in p.stages
    )
    tag = "_mx" if mx else f"_bs{_tag(scales[0])}_{_tag(scales[1])}"
    return dataclasses.replace(p, name=fitted_name(p.name + tag), tensors=tensors, stages=stages)


def _is_mx(scales: object) -> bool:
    """Whether `scales` names OCP MX's layouts: "mx", or the pair ("1x32", "32x1") spelled out."""
    if isinstance(scales, str):
        if scales.strip().lower() != MX:
            raise ProgramError(f"scales is a pair of layout names, A's and B's, or 'mx', not {scales!r}")
        return True
    if isinstance(scales, tuple | list) and len(scales) == 2 and all(isinstance(x, str) for x in scales):
        return tuple(_tag(x) for x in scales) == MX_LAYOUTS
    return False


def _param(tid: TensorId, name: str, shape: tuple[int, int], side: int, groups: int, dtype: DType) -> Tensor:
    tiles = (groups * math.ceil(shape[0] / side), math.ceil(shape[1] / side))  # a grouped tensor's: stacked
    return Tensor(tid, name, TensorRole.PARAMETER, shape, tiles, dtype, groups=groups)


def _tag(name: str) -> str:
    return name.strip().lower()

"""The interpreter's dequant prologue (a W4A16 GEMM): a page of 4-bit weights into a page of bf16 / fp16 operands,
each element by `numerics.w4.dequant` with its scale and zero point at its own (group, column)."""

from __future__ import annotations

import numpy as np

from ..ir.nodes import FOUR_BIT
from ..ir.ops import Dequant
from ..numerics.w4 import WEIGHT_FORMATS, codes, from_codes
from ..numerics.w4 import dequant as dequant_values
from .errors import AddressError
from .values import Store, Tiles, tiles_of


def dequant(x: object, op: Dequant, scale: Store, zero: Store | None, rows_at: int, cols_at: int, where: str) -> Tiles:
    """The page `x` (rows of `op.width` tiles: tile s at B's tile row rows_at + s // width, tile column
    cols_at + s mod width) dequantised."""
    n = x.count  # type: ignore[attr-defined]
    q = tiles_of(x, n)
    held = getattr(getattr(x, "store", None), "tensor", None)
    fmt = WEIGHT_FORMATS[op.weights.value]
    if held is not None and held.dtype != fmt and held.dtype in FOUR_BIT:  # the bits read as the op's format says,
        q = from_codes(codes(q, held.dtype), fmt).astype(np.float64)  # as a kernel would (int4 read as uint4: +16)
    tr, tc = q.shape[1], q.shape[2]
    if not op.low_first and tr % 2 == 0:  # each byte's nibbles read the other way: rows 2i and 2i + 1 exchanged
        q = q.reshape(n, tr // 2, 2, tc)[:, :, ::-1].reshape(n, tr, tc)
    s = np.arange(n)
    k = (rows_at + s // op.width)[:, None] * tr + np.arange(tr)  # (n, tr): each element's row of B
    j = (cols_at + s % op.width)[:, None] * tc + np.arange(tc)  # (n, tc): its column
    g = k // op.group
    if g.min() < 0 or j.min() < 0 or g.max() >= scale.mat.shape[0] or j.max() >= scale.mat.shape[1]:
        raise AddressError(
            f"{where}: its page reaches group {int(g.max())}, column {int(j.max())} of {scale.tensor.name}, whose"
            f" {scale.mat.shape[0]}x{scale.mat.shape[1]} values (padded) hold no such place"
        )
    if op.group % tr == 0:  # every row of a tile in one group: one row of scales a tile, broadcast over its rows
        rows = g[:, :1]
        s_vals = scale.mat[rows, j][:, None, :]
        z_vals = None if zero is None else zero.mat[rows, j][:, None, :]
    else:
        s_vals = scale.mat[g[:, :, None], j[:, None, :]]
        z_vals = None if zero is None else zero.mat[g[:, :, None], j[:, None, :]]
    return Tiles(dequant_values(q, s_vals, z_vals, op.operand.value))

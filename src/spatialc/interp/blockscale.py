"""The interpreter's block-scaled K step (`ops.MatmulTiles.scales`): the step's product, a partial sum of its own,
promoted into the accumulator times each row's and each column's scale of the step's K group, in float64 — the
operations `numerics.blockscale` defines, in its order, so the interpreter's C is the reference's bit for bit."""

from __future__ import annotations

import numpy as np

from ..ir.ops import BlockScales
from ..numerics.blockscale import col_values, promote, row_values
from .state import Acc, EngineState
from .support import fail
from .values import Store, matmul, page_matrix


def scaled_step(
    E: EngineState,
    i: int,
    x: object,
    y: object,
    acc: Acc,
    geom: tuple[int, int, int, int, int],
    scales: BlockScales,
    sa: Store,
    sb: Store,
    r0: int,
    c0: int,
    k0: int,
    g: int = 0,
) -> None:
    """acc += promote(A-page @ B-page, sa of each row, sb of each column) at the step whose first tile row, tile
    column and K tile are r0, c0, k0 (a grouped GEMM's: in group g, whose own scale tensors it reads): kept as a
    partial sum that the pack adds, in the order of the steps."""
    if not acc.live:
        fail(E, i, f"{acc.name} is not acquired")
    if acc.a:
        fail(E, i, f"{acc.name} already holds products that no scale promotes")
    h, w, ibw, t, _ = geom
    for store in (sa, sb):
        if not 0 <= g < store.tensor.groups:
            fail(E, i, f"reads group {g} of {store.tensor.name}, which holds {store.tensor.groups}")
    partial = matmul(page_matrix(x, h, ibw, t, t), page_matrix(y, ibw, w, t, t))
    rows, cols = r0 * t + np.arange(h * t), c0 * t + np.arange(w * t)
    promoted = promote(
        partial,
        row_values(_values(sa, g), scales.a, rows, k0 * t),
        col_values(_values(sb, g), scales.b, cols, k0 * t),
    )
    acc.parts.append(promoted.reshape(h, t, w, t).transpose(0, 2, 1, 3).reshape(h * w, t, t))


def _values(store: Store, g: int) -> np.ndarray:
    """A parameter tensor's values (group g's matrix of a grouped one, stacked on its own tile rows), its logical
    elements only (a scale past them is 0: `numerics.blockscale`)."""
    t = store.tensor
    rows, cols = t.elems
    first = g * t.group_tiles[0] * store.tr
    return store.mat[first : first + rows, :cols]

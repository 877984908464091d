"""The interpreter's products: a @ b summed in float64 a panel at a time (`matmul`), and the same over a store's
live tile rows only (`live_matmul`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .values import Store

CHUNK_ELEMS = 1 << 22  # float64 operand elements one BLAS call converts at once (32 MiB), and its row panel's


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b summed in float64, from operands of any stored type, a panel of rows and K at a time so that the float64
    copies of the operands stay within CHUNK_ELEMS; into `out` when given — float64, or int64 for int8 sums, which
    float64 holds exactly (each below 2^53: `numerics.INT8_EXACT_K`)."""
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n)) if out is None else out
    rows = max(1, min(m, CHUNK_ELEMS // max(k, n, 1)))  # a panel of A and one of the result within CHUNK_ELEMS
    ks = max(1, CHUNK_ELEMS // (rows + n))
    for r0 in range(0, m, rows):
        part = out[r0 : r0 + rows]
        acc = part if part.dtype == np.float64 else np.empty(part.shape)
        for k0 in range(0, max(k, 1), ks):
            pa = np.asarray(a[r0 : r0 + rows, k0 : k0 + ks], np.float64)
            pb = np.asarray(b[k0 : k0 + ks], np.float64)
            if k0 == 0:
                np.matmul(pa, pb, out=acc)
            else:
                acc += pa @ pb
        if acc is not part:
            part[...] = acc  # exact integers, below 2^53
    return out


def live_matmul(store: Store, rlo: int, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`matmul(a, b, out)` for `a`, the tile rows rlo… of `store`: rows the store keeps zero are not multiplied."""
    live = None if store.live is None else store.live[rlo : rlo + a.shape[0] // store.tr]
    if live is None or live.all():
        return matmul(a, b, out)
    t = store.tr
    if out is None:
        out = np.zeros((a.shape[0], b.shape[1]))  # its pages are the OS's zero page until written
    else:  # rows no live A row reaches are zero: cleared only where they are not already (reading maps no pages)
        for lo, hi in _runs(~live):
            dead = out[lo * t : hi * t]
            if dead.any():
                dead[...] = 0
    rows = (np.flatnonzero(live)[:, None] * t + np.arange(t)).reshape(-1)  # a sample's rows: few
    rows = rows[rows < a.shape[0]]
    out[rows] = matmul(a[rows], b)  # one call, so B's float64 panels are made once, not once a tile row
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The maximal runs [lo, hi) of True in `mask`."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))

"""Tensor storage and the values ring pages hold.

A tensor is stored as an array of shape (rows_t, tile_rows, cols_t, tile_cols): tile (ti, tj) — flat tile
index ti·cols_t + tj, as DESIGN §2 addresses it — is `arr[ti, :, tj, :]`, and the same memory read as a 2-D array
is the padded logical matrix, so a block of tiles that forms a rectangle is a slice, not a gather. Its element type
(`store_dtype`): an input tensor nothing writes holds only its element type's values, so it keeps them narrow — int8
as int8, fp16 as float16, bf16, e4m3, e5m2 and float32 as float32, each exactly; a tensor something writes holds
sums: float64, or int64 for an int64 tensor (its values may pass 2^53, beyond which float64 holds only even
integers). Every matmul converts its operands to float64 a panel at a time (`matmul`), so the float64 copies stay
small.

An input's tile rows that the caller asked not to be read (a sample, `evaluate(rows=...)`) are not `live`: they stay
zero, and products of them are skipped, which is exact (they are zero).

Page values are immutable snapshots, so a page can be popped and its slot refilled while an accumulator still
refers to what it held:
- `TileRefs`: tiles `at + off[s]` of a tensor nothing writes (its contents never change, so reading is free);
- `Tiles`: tiles held as an array (n, tile_rows, tile_cols);
- `AccValue`: a packed accumulator — a sum of A-page × B-page products plus an optional base page — computed
  only when something needs its numbers. `realise` computes many at once: products of rectangles of the same
  tensors over the same K range that together fill a rectangle of the output become one BLAS call.
- `MapValue`: an elementwise stage's page — its input pages and column vectors — computed, like an AccValue, when
  something needs its numbers, with every other such page then (`mapped.realise_maps`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..ir.nodes import DType, Tensor, TensorRole
from .blas import CHUNK_ELEMS, live_matmul, matmul  # noqa: F401 — named here as before: interp.values.matmul, …
from .pages import (  # noqa: F401 — named here as before: spatialc.interp.values.TileRefs, …
    HULL_DENSITY,
    HULL_MAX_ELEMS,
    LATER_ROWS,
    AccValue,
    LaterRows,
    MapValue,
    Masked,
    PageValue,
    RowMap,
    RowPack,
    RowScaled,
    TileRefs,
    Tiles,
    Transposed,
    as_matrix,
    factor_column,
    page_matrix,
    realise,
    tiles_of,
)

# An input's element type → the numpy type that holds each of its values exactly (an input nothing writes)
NARROW = {
    DType.INT8: np.int8,
    DType.FP16: np.float16,
    DType.BF16: np.float32,
    DType.FLOAT32: np.float32,
    DType.E4M3: np.float32,
    DType.E5M2: np.float32,
}
PENDING_ELEMS = 1 << 24  # computed values a store's pending writes may hold (128 MiB) before it applies them


def store_dtype(tensor: Tensor, written: bool) -> type:
    """The numpy type of a tensor's store: its values' narrow type for an input nothing writes, else float64 (int64
    for an int64 tensor: an integer chain's values, as they are)."""
    if not written and tensor.role == TensorRole.INPUT and tensor.dtype in NARROW:
        return NARROW[tensor.dtype]
    return np.int64 if tensor.dtype == DType.INT64 else np.float64


def adoptable(tensor: Tensor, tile_rows: int, tile_cols: int, written: bool, given: Any) -> bool:
    """Whether an input array may be the tensor's store itself: nothing writes the tensor, and the array is what its
    store would be — one group, whole tiles (no padding), the store's type, C order."""
    rows_t, cols_t = tensor.tiles
    return (
        not written
        and tensor.groups == 1
        and isinstance(given, np.ndarray)
        and given.shape == (rows_t * tile_rows, cols_t * tile_cols)
        and given.dtype == np.dtype(store_dtype(tensor, written))
        and given.flags.c_contiguous
    )


class Store:
    """One tensor's tiled storage, and the writes to it not yet applied (their values may still be lazy)."""

    __slots__ = (
        "tensor",
        "arr",
        "mat",
        "cols_t",
        "ntiles",
        "tr",
        "tc",
        "written",
        "pending",
        "live",
        "applied",
        "_blocks",
    )

    def __init__(self, tensor: Tensor, tile_rows: int, tile_cols: int, written: bool) -> None:
        rows_t, cols_t = tensor.tiles
        self.tensor, self.tr, self.tc = tensor, tile_rows, tile_cols
        self.arr = np.zeros((rows_t, tile_rows, cols_t, tile_cols), dtype=store_dtype(tensor, written))
        self.mat = self.arr.reshape(rows_t * tile_rows, cols_t * tile_cols)
        self.cols_t, self.ntiles, self.written = cols_t, rows_t * cols_t, written
        self.pending = Pending(self)
        self.live: np.ndarray | None = None  # per tile row, whether it may be non-zero (None: every row)
        self.applied = False  # whether any write was applied (else the store is as made: zeros, or its input)
        self._blocks: dict[tuple[int, int, int], tuple[np.ndarray, Any]] = {}

    def adopt(self, given: np.ndarray) -> bool:
        """Read the tensor from `given` itself where `adoptable` (a read-only view: no copy of a large operand);
        False otherwise."""
        if not adoptable(self.tensor, self.tr, self.tc, self.written, given):
            return False
        view = given.view()
        view.flags.writeable = False
        self.arr = view.reshape(self.arr.shape)
        self.mat = view
        return True

    def gather(self, flat: np.ndarray) -> np.ndarray:
        """Tiles at flat indices `flat`, shape (n, tr, tc)."""
        ti, tj = np.divmod(flat, self.cols_t)
        return self.arr[ti, :, tj, :]

    def is_block(self, off: np.ndarray, h: int, w: int) -> bool:
        """Whether offsets `off[:h·w]` are an h × w rectangle of this grid (row-major), for any corner."""
        key = (id(off), h, w)
        hit = self._blocks.get(key)
        if hit is None or hit[0] is not off:  # the entry keeps `off` alive, so its id is not reused meanwhile
            want = (np.arange(h)[:, None] * self.cols_t + np.arange(w)[None, :]).reshape(-1)
            hit = self._blocks[key] = (off, len(off) >= h * w and np.array_equal(off[: h * w], want))
        return hit[1]

    def block_shape(self, off: np.ndarray) -> tuple[int, int] | None:
        """(h, w) when offsets `off` are an h × w rectangle of this grid, row-major from its corner; else None."""
        key = (id(off), 0, 0)
        hit = self._blocks.get(key)
        if hit is None or hit[0] is not off:  # (kept beside is_block's entries, which h = w = 0 never names)
            breaks = np.flatnonzero(np.diff(off) != 1)
            w = int(breaks[0]) + 1 if len(breaks) else len(off)
            h = len(off) // w if w else 0
            shape = (h, w) if h * w == len(off) and h and self.is_block(off, h, w) else None
            hit = self._blocks[key] = (off, shape)  # type: ignore[assignment]
        return hit[1]  # type: ignore[return-value]

    def rect(self, at: int, off: np.ndarray, h: int, w: int) -> tuple[int, int] | None:
        """(ti, tj) of the corner when the tiles `at + off` (h × w, row-major) form a rectangle of the grid."""
        if self.is_block(off, h, w):
            r0, c0 = divmod(at, self.cols_t)
            return (r0, c0) if c0 + w <= self.cols_t else None
        ti, tj = np.divmod((at + off[: h * w]).reshape(h, w), self.cols_t)
        r0, c0 = int(ti[0, 0]), int(tj[0, 0])
        if (ti == r0 + np.arange(h)[:, None]).all() and (tj == c0 + np.arange(w)[None, :]).all():
            return r0, c0
        return None

    def flush(self) -> None:
        """Apply the pending writes in order, computing their lazy values first (in one batch)."""
        if not self.pending:
            return
        self.applied = True
        lazy = [v.value if isinstance(v, Masked) else v for *_, v in self.pending]
        rows = [v for v in lazy if v.__class__ in LATER_ROWS]
        if rows:  # row vectors written (a mean, a log-sum-exp): every band's at once
            from .rowpacks import realise_packs  # rowpacks.py builds on this module's values

            realise_packs(rows)
        maps = [v for v in lazy if isinstance(v, MapValue)]
        if maps:
            from .mapped import realise_maps  # mapped.py builds on this module's values

            realise_maps(maps)
        placed = realise([v for v in lazy if isinstance(v, AccValue)], self._direct_targets())
        if not (maps and self._write_bands(placed, self.mat)):
            k = 0
            while k < len(self.pending):
                at, off, bh, bw, value = self.pending[k]
                end = self._band_run(k) if isinstance(value, MapValue) else k + 1
                if end > k + 1:
                    self._write_band(at, off, bh, bw, value, end - k)
                elif id(value) not in placed:
                    self._write(at, off, bh, bw, value)
                k = end
        for v in placed.values():
            v.result = None  # it viewed this store, which later writes may change: recompute if asked again
        self.pending.clear()

    def _direct_targets(self) -> dict[int, tuple[Store, int, int]]:
        """Where each pending value lands, when every pending write puts a whole accumulator on its own rectangle
        (no two overlap, so their order does not matter and a matmul may write straight into the tensor)."""
        targets: dict[int, tuple[Store, int, int]] = {}
        cover = np.zeros((self.ntiles // self.cols_t, self.cols_t), dtype=np.int8)
        for at, off, bh, bw, v in self.pending:
            if not isinstance(v, AccValue) or (v.h, v.w, v.count) != (bh, bw, bh * bw) or id(v) in targets:
                return {}
            corner = self.rect(at, off, bh, bw)
            if corner is None:
                return {}
            r0, c0 = corner
            cover[r0 : r0 + bh, c0 : c0 + bw] += 1
            targets[id(v)] = (self, r0, c0)
        return targets if cover.max(initial=0) <= 1 else {}

    def _write_bands(
        self, placed: dict[int, AccValue], mat: np.ndarray, only_maps: bool = False, done: set[int] | None = None
    ) -> bool:
        """Apply the pending writes to `mat` (this store's matrix, or one of its shape), computed bands (`MapValue.
        band`) as whole slices, where they may be applied in any order — each on a rectangle of its own, none
        overlapping, and with `only_maps` each a whole computed page; False (nothing written) where not. The
        computed pages `done` (ids) were computed in their place in `mat` already."""
        done = done or set()
        bands: dict[int, list[tuple[int, int, int, MapValue]]] = defaultdict(list)
        pages, rest = [], []
        rects: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # corners, by rectangle shape
        for write in self.pending:
            at, off, bh, bw, v = write
            corner = self.rect(at, off, bh, bw)
            if corner is None:
                return False
            r0, c0 = corner
            rects[bh, bw].append(corner)
            if v.__class__ is MapValue and (v.h, v.width) == (bh, bw):
                if id(v) in done:
                    pass
                elif v.band is not None:
                    bands[id(v.band)].append((v.slot, r0, c0, v))
                else:
                    pages.append((r0, c0, v))
            elif only_maps:
                return False
            elif id(v) not in placed:
                rest.append(write)
        if self._overlap(rects):
            return False
        tr, tc = self.tr, self.tc
        for run in bands.values():
            run.sort(key=lambda e: e[0])
            slot0, r0, c0, v = run[0]
            bh, bw = v.h, v.width
            if all(e[0] == slot0 + k and e[1:3] == (r0, c0 + k * bw) for k, e in enumerate(run)):
                cols = slice(slot0 * bw * tc, (slot0 + len(run)) * bw * tc)
                mat[r0 * tr : (r0 + bh) * tr, c0 * tc : (c0 + len(run) * bw) * tc] = v.band[:, cols]  # type: ignore[index]
            else:
                pages.extend(e[1:] for e in run)
        for r0, c0, v in pages:
            mat[r0 * tr : (r0 + v.h) * tr, c0 * tc : (c0 + v.width) * tc] = v.matrix()
        for write in rest:
            self._write(*write)
        return True

    def _overlap(self, rects: dict[tuple[int, int], list[tuple[int, int]]]) -> bool:
        """Whether two of the rectangles (h × w tiles at each corner, by shape) share a tile: every tile they cover
        counted at once, a shape at a time."""
        tiles = []
        for (h, w), corners in rects.items():
            at = np.asarray(corners, dtype=np.int64)
            rows = at[:, 0, None, None] + np.arange(h)[None, :, None]
            cols = at[:, 1, None, None] + np.arange(w)[None, None, :]
            tiles.append((rows * self.cols_t + cols).reshape(-1))
        flat = np.concatenate(tiles) if tiles else np.zeros(0, np.int64)
        flat = flat[flat < self.ntiles]  # (a rectangle past the grid's last row covers nothing of it, as a slice)
        return bool(np.bincount(flat, minlength=1).max() > 1)

    def narrow_result(self) -> np.ndarray | None:
        """The tensor's matrix in float32, made from its pending writes alone, and kept as the store from then on:
        where nothing was applied before (the store is still zeros) and every pending write is a whole computed page
        (float32 values, `MapValue`) on a rectangle of its own. A float32 output is then written once, not through
        float64 and converted (the same numbers). None, with nothing done, where not."""
        if self.applied or not self.pending or any(w[4].__class__ is not MapValue for w in self.pending):
            return None
        from .mapped import realise_maps  # mapped.py builds on this module's values

        where = self._map_rects()
        if where is None:
            return None
        mat = np.zeros(self.mat.shape, np.float32)
        placed = realise_maps([w[4] for w in self.pending], (mat, where))  # computed in place where they may be
        if len(placed) < len(self.pending) and not self._write_bands({}, mat, only_maps=True, done=placed):
            return None
        self.mat, self.arr = mat, mat.reshape(self.arr.shape)
        self.applied = True
        self.pending.clear()
        return mat

    def _map_rects(self) -> dict[int, tuple[int, int]] | None:
        """By pending computed page (id), the tile (row, column) of the rectangle it is written to, where every
        pending write is a whole computed page on a rectangle and no two overlap (None where not); a page written
        more than once, or computed already, is left out (it is copied, as other writes are)."""
        where: dict[int, tuple[int, int]] = {}
        rects: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        twice: set[int] = set()
        shape, corners = None, []  # (the writes of a tensor are mostly of one shape: its list, kept at hand)
        for at, off, bh, bw, v in self.pending:
            corner = self.rect(at, off, bh, bw)
            if corner is None or v.h != bh or v.width != bw:
                return None
            if shape != (bh, bw):
                shape = (bh, bw)
                corners = rects[shape]
            corners.append(corner)
            k = id(v)
            if k in where:
                twice.add(k)
            elif v.result is None:
                where[k] = corner
        if self._overlap(rects):
            return None
        for k in twice:
            where.pop(k, None)
        return where

    def _band_run(self, k: int) -> int:
        """The end of the run of pending writes from k on that put consecutive pages of one computed band (`MapValue.
        band`) on consecutive rectangles of one row of this tensor's tiles: applied as one slice, in the same order."""
        at, off, bh, bw, v = self.pending[k]
        if v.band is None or (v.h, v.width) != (bh, bw):
            return k + 1
        corner = self.rect(at, off, bh, bw)
        if corner is None:
            return k + 1
        most = min(len(self.pending), k + (self.cols_t - corner[1]) // bw)  # not past the grid's right edge
        end = k + 1
        while end < most:
            at2, off2, bh2, bw2, w = self.pending[end]
            step = end - k
            if w.__class__ is not MapValue or w.band is not v.band or w.slot != v.slot + step:
                break
            if off2 is not off or at2 != at + step * bw or (bh2, bw2) != (bh, bw):
                break
            end += 1
        return end

    def _write_band(self, at: int, off: np.ndarray, bh: int, bw: int, first: MapValue, n: int) -> None:
        """Write n pages of one computed band, from `first` on, to the n rectangles from `at` on (`_band_run`)."""
        corner = self.rect(at, off, bh, bw)
        assert corner is not None and first.band is not None
        r0, c0 = corner
        cols = slice(first.slot * bw * self.tc, (first.slot + n) * bw * self.tc)
        self.mat[r0 * self.tr : (r0 + bh) * self.tr, c0 * self.tc : (c0 + n * bw) * self.tc] = first.band[:, cols]

    def _write(self, at: int, off: np.ndarray, bh: int, bw: int, value: object) -> None:
        if isinstance(value, Masked):  # only the kept rows of each tile
            ti, tj = np.divmod(at + off, self.cols_t)
            tiles = tiles_of(value.value, len(off))
            here = self.arr[ti, :, tj, :]
            here[value.keep] = tiles[value.keep]
            self.arr[ti, :, tj, :] = here
            return
        if isinstance(value, AccValue) and (value.h, value.w) == (bh, bw) and value.count == bh * bw:
            corner = self.rect(at, off, bh, bw)
            if corner is not None:
                r0, c0 = corner
                self.mat[r0 * self.tr : (r0 + bh) * self.tr, c0 * self.tc : (c0 + bw) * self.tc] = value.matrix()
                return
        if isinstance(value, MapValue) and value.count == bh * bw and value.width == bw:
            corner = self.rect(at, off, bh, bw)
            if corner is not None:  # its matrix, straight into the rectangle (no tiles made of it)
                r0, c0 = corner
                self.mat[r0 * self.tr : (r0 + bh) * self.tr, c0 * self.tc : (c0 + bw) * self.tc] = value.matrix()
                return
        ti, tj = np.divmod(at + off, self.cols_t)
        self.arr[ti, :, tj, :] = tiles_of(value, len(off))


class Pending(list):
    """A store's writes not yet applied: the engines append to it; past PENDING_ELEMS of computed values held (an
    epilogue's pages, or sums to compute) it applies them at once, so a whole output is never held twice. Applying
    them early changes nothing: every read of the tensor applies them first anyway, in the same order."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store, self.held = store, 0

    def append(self, write: tuple[int, np.ndarray, int, int, object]) -> None:
        list.append(self, write)  # (once a page written: without super()'s proxy)
        v = write[4]
        self.held += v.count * v.tr * v.tc if v.__class__ is MapValue else held_elems(v)  # type: ignore[attr-defined]
        if self.held > PENDING_ELEMS:
            self.store.flush()

    def clear(self) -> None:
        super().clear()
        self.held = 0


def held_elems(value: object) -> int:
    """The elements a pending value holds, or will once computed (a reference to a tensor's tiles holds none)."""
    if isinstance(value, Masked):
        return held_elems(value.value)
    if isinstance(value, Tiles):
        return value.arr.size
    if isinstance(value, MapValue):
        return value.count * value.tr * value.tc
    if isinstance(value, RowPack | RowMap):
        return value.count * value.tile[0] * value.tile[1]
    if isinstance(value, AccValue):
        return value.h * value.w * value.t * value.t
    return 0

"""Row accumulators packed when their numbers are needed, many bands in one reduction.

A float program's `PackAcc` of a row accumulator (`support.pack`) makes a `pages.RowPack` — the reduction's name and
the pages given, not its numbers. Whatever needs the numbers (an elementwise page that reads it as a row vector, a
write, a rescale, a matmul operand) computes every pack it is given at once: the elementwise pages they reduce, a
chunk of packs at a time (`mapped.realise_maps`: their bands stacked), and each chunk's rows in one `reduce_rows`
call. Each row's value does not depend on the rows beside it — a max is exact, a sum is exactly rounded whatever the
order of its terms (`numerics.reductions.reduce_rows`) — so a row reduced among a thousand is the value it had
reduced alone, bit for bit, as `support.packed_rows` defines it.

The elementwise pages computed for a chunk are dropped once reduced (their `result` cleared: computed again, to the
same values, should anything ask): a band's pages are read by its reduction alone in the programs that make them,
and keeping every band of a tensor would keep the tensor's size in fresh memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..numerics.reductions import reduce_rows, reduction_named
from .mapped import CHUNK_ELEMS, realise_maps
from .pages import MapValue, RowPack, TileRefs, page_matrix


def lazy_pack(acc: Any, n: int, accumulate: bool, integer: bool, tile: tuple[int, int]) -> RowPack | None:
    """The pack of a row accumulator as a RowPack, where one may stand for it: a float program's plain pack of pages
    given since the accumulator was acquired (nothing carried), of as many tiles as their rows. The accumulator
    goes on as `support.packed_rows` leaves it (a max's value carried, a sum's pages kept). None where not: then
    `packed_rows` computes it now (and says what is wrong, where something is)."""
    if accumulate or integer or not acc.rows or acc.carried is not None or acc.rows[0][2] != n:
        return None
    name = acc.rows[0][0]
    pack = RowPack(name, tuple(acc.rows), n, tile)
    if reduction_named(name).combine != "add":
        acc.carried, acc.rows = pack, []
    return pack


def realise_packs(packs: list[RowPack], ready: Callable[[list[RowPack]], None] | None = None) -> None:
    """Compute every pack of `packs` not computed yet: the packs the pages they reduce read first, then a chunk of
    packs at a time (about CHUNK_ELEMS values), each chunk's elementwise pages at once and its rows in one reduction.
    `ready` is told each chunk's packs once they are computed, while the pages they reduced still are."""
    todo = list(dict.fromkeys([p for p in packs if p.column is None]))  # (each once: packs hash by identity)
    # The packs their first pages read, at once (any other is computed when its page is, with the others then).
    below = [
        x
        for p in todo
        if p.pages[0][1].__class__ is MapValue and p.pages[0][1].result is None
        for x in p.pages[0][1].ins
        if x.__class__ is RowPack and x.column is None
    ]
    if below:
        realise_packs(below, ready)
    chunk: list[RowPack] = []
    size = 0
    for p in todo:
        if p.column is not None:  # (computed above: a pack below another)
            continue
        chunk.append(p)
        for _, _, h, _, keep in p.pages:  # (a chunk's float64 temporaries stay in cache, as its pages' values do)
            size += h * keep
        if size * p.tile[0] >= CHUNK_ELEMS:
            _realise_chunk(chunk, ready)
            chunk, size = [], 0
    if chunk:
        _realise_chunk(chunk, ready)


def _realise_chunk(chunk: list[RowPack], ready: Callable[[list[RowPack]], None] | None = None) -> None:
    maps = list(dict.fromkeys([x[1] for p in chunk for x in p.pages if x[1].__class__ is MapValue]))
    maps = [v for v in maps if v.result is None]
    if maps:
        realise_maps(maps)
    tr, tc = chunk[0].tile
    values = [reduced_values(list(p.pages), tr, tc) for p in chunk]
    k = 0
    while k < len(chunk):  # runs of packs of one reduction whose rows are one block of memory: one call each
        end = k + 1
        while end < len(chunk) and chunk[end].name == chunk[k].name and _follows(values[end - 1], values[end]):
            end += 1
        rows = values[k] if end == k + 1 else _joined(values[k:end])
        column = np.asarray(reduce_rows(chunk[k].name, rows, False), np.float64)
        flat = np.asarray(np.asarray(column, np.float32), np.float64)  # as packed_rows rounds it: the run's at once
        tiles = np.broadcast_to(flat.reshape(-1, tr, 1), (len(flat) // tr, tr, tc)).copy()
        at = 0
        for p in chunk[k:end]:
            p.column, p.result = column[at * tr : (at + p.count) * tr], tiles[at : at + p.count]
            at += p.count
        k = end
    del values
    if ready is not None:
        ready(chunk)
    for p in chunk:
        p.pages = ()
    for v in maps:  # reduced, and read by nothing else (see above): dropped, not kept
        v.result = v.band = None


def _follows(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether b's rows are the rows right after a's in one block of memory, in the same layout."""
    return (
        a.dtype == b.dtype
        and a.shape[1] == b.shape[1]
        and a.strides == b.strides
        and a.base is not None
        and a.base is b.base
        and b.__array_interface__["data"][0] == a.__array_interface__["data"][0] + a.shape[0] * a.strides[0]
    )


def _joined(values: list[np.ndarray]) -> np.ndarray:
    """Row blocks that follow one another in memory (`_follows`) as one view of all their rows."""
    first = values[0]
    rows = sum(v.shape[0] for v in values)
    return np.lib.stride_tricks.as_strided(first, (rows, first.shape[1]), first.strides, writeable=False)


def reduced_values(pages: list[tuple[str, object, int, int, int]], tr: int, tc: int) -> np.ndarray:
    """The rows a row accumulator reduces: each page's matrix (h × width tiles), its first `keep` columns, side by
    side. Pages that are one row of a tensor nothing writes, in order, are that row's memory, and pages computed side
    by side their band (each in its own type, which `reduce_rows` converts exactly); others are joined in float64 (an
    integer chain's values too, as the reduction has always taken them)."""
    _, first, h, width, _ = pages[0]
    full = width * tc
    if first.__class__ is TileRefs and _tensor_row(pages, first, width, full):
        corner = first.store.rect(first.at, first.off, h, width)
        if corner is not None and corner[1] + len(pages) * width <= first.store.cols_t:
            r0, c0 = corner
            span = (len(pages) - 1) * full + pages[-1][4]
            return first.store.mat[r0 * tr : (r0 + h) * tr, c0 * tc : c0 * tc + span]
    if first.__class__ is MapValue and first.band is not None and first.slot == 0:
        band = first.band  # computed side by side, in this order (mapped.py): the band itself
        if _band_in_order(pages, band, full) and band.shape[0] == h * tr:
            return band[:, : (len(pages) - 1) * full + pages[-1][4]]
    mats = [page_matrix(x, h, width, tr, tc)[:, :keep] for _, x, h, width, keep in pages]
    return np.asarray(np.concatenate(mats, axis=1), np.float64)


def _tensor_row(pages: list[tuple[str, Any, int, int, int]], first: TileRefs, width: int, full: int) -> bool:
    """Whether the pages are tiles of `first`'s tensor one after another along a row, `width` tiles apart, each kept
    whole (`full` columns) but the last."""
    store, off, at = first.store, first.off, first.at
    for k, (_, x, _, _, keep) in enumerate(pages):
        if x.__class__ is not TileRefs or x.store is not store or x.off is not off or x.at != at + k * width:
            return False
        if keep != full and k < len(pages) - 1:
            return False
    return True


def _band_in_order(pages: list[tuple[str, Any, int, int, int]], band: np.ndarray, full: int) -> bool:
    """Whether the pages are the band's, in its order from its first, each kept whole (`full` columns) but the last."""
    for k, (_, x, _, _, keep) in enumerate(pages):
        if x.__class__ is not MapValue or x.band is not band or x.slot != k:
            return False
        if keep != full and k < len(pages) - 1:
            return False
    return True

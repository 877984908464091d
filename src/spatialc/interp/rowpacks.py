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

from ..numerics.elementwise import OPS
from ..numerics.epilogue import mapped, start
from ..numerics.reductions import reduce_rows, reduction_named
from .mapped import CHUNK_ELEMS, realise_maps
from .pages import LATER_ROWS, LaterRows, MapValue, RowMap, RowPack, RowScaled, TileRefs, factor_column, page_matrix


def lazy_pack(
    acc: Any, n: int, accumulate: bool, integer: bool, tile: tuple[int, int], later: LaterRows
) -> RowPack | None:
    """The pack of a row accumulator as a RowPack, where one may stand for it: a float program's pack of the pages
    given since it was acquired or last carried, of as many tiles as their rows, on the value it carried then (a pack
    or a rescale of its own, computed later too; or nothing). The accumulator goes on as `support.packed_rows` leaves
    it (a max's value carried, a sum's pages kept where nothing was carried, else its value carried). None where not:
    then `packed_rows` computes it now (and says what is wrong, where something is)."""
    rows, carried = acc.rows, acc.carried
    if accumulate or integer or (rows and rows[0][2] != n):
        return None
    if carried is not None and (carried.__class__ not in LATER_ROWS or carried.count != n):
        return None
    if not rows and carried.__class__ is RowPack:  # packed again, nothing given since: the same value, the same tiles
        return carried
    name = rows[0][0] if rows else acc.reduction or "sum"
    pack = RowPack(name, tuple(rows), n, tile, later, carried)
    if carried is not None or reduction_named(name).combine != "add":
        acc.carried, acc.rows = pack, []
    return pack


def scaled_later(acc: Any, x: object, tile: tuple[int, int], later: LaterRows) -> bool:
    """ScaleAcc of a float program's row accumulator as a value computed later (`RowScaled`: its value now, a RowPack
    of the pages given since it was last carried, times the row vector page `x`), carried on; False, with nothing
    done, where `support.scale_acc` computes it now (and says what is wrong, where something is)."""
    rows, carried = acc.rows, acc.carried
    if carried is not None and carried.__class__ not in LATER_ROWS:
        return False
    h = rows[0][2] if rows else carried.count if carried is not None else x.count  # type: ignore[attr-defined]
    if (carried is not None and carried.count != h) or x.count < h:  # type: ignore[attr-defined]
        return False
    name = rows[0][0] if rows else acc.reduction or "sum"
    inner = (
        carried if not rows and carried.__class__ is RowPack else RowPack(name, tuple(rows), h, tile, later, carried)
    )
    acc.carried, acc.rows = RowScaled(inner, x, h, later), []
    return True


def row_map_later(kernel: Any, xs: list, later: LaterRows) -> RowMap | None:
    """A map of row vector pages alone (`MapKernel.row_map`) as a RowMap, where its pages are whole row vectors of
    one count (its tiles those `support.elementwise` would compute now); else None."""
    n = xs[0].count
    for x in xs:  # (a loop, not all() of a generator: this runs once a page)
        if x.count != n:
            return None
    return RowMap(kernel, xs, n, kernel.tile, later)


def realise_packs(packs: list[Any], ready: Callable[[list[Any]], None] | None = None) -> None:
    """Compute every row value of `packs` (RowPack, RowMap, RowScaled) not computed yet, and with them every value of
    their run not computed yet at their level or below (`LaterRows`: what they read, and the other bands' values
    beside it), a level at a time — its maps of row vectors in one evaluation a kernel, its rescales, and its packs a
    chunk at a time (about CHUNK_ELEMS values), each chunk's elementwise pages at once and its rows in one reduction.
    `ready` is told each chunk's packs, and each level's maps, once they are computed (a chunk's while the pages they
    reduced still are)."""
    todo = [p for p in packs if p.column is None]
    if not todo:
        return
    later = todo[0].later
    top = max([p.level for p in todo])
    while later.low <= top:  # (a level's values read only values of the levels before it: none is made meanwhile)
        k = later.low
        level, later.levels[k] = [x for x in later.levels[k] if x.column is None], []
        later.low = k + 1
        _realise_level(level, ready)
    for p in todo:  # (values of another run, should any be asked for with these: each with its own)
        if p.column is None and p.later is not later:
            realise_packs([p], ready)


def _realise_level(level: list[Any], ready: Callable[[list[Any]], None] | None) -> None:
    """Row values of one level, each reading only values computed already: the maps, the rescales, then the packs,
    those of one reduction together (in the order they were made: a band's rows before the next band's)."""
    maps: list[Any] = []
    scaled: list[Any] = []
    packs: list[Any] = []
    for x in level:
        (packs if x.__class__ is RowPack else maps if x.__class__ is RowMap else scaled).append(x)
    if maps:
        _realise_row_maps(maps)
        if ready is not None:
            ready(maps)
    if scaled:
        _realise_scaled(scaled)
    if len(packs) > 1 and len({p.name for p in packs}) > 1:  # one reduction after another: a run is one call
        packs.sort(key=lambda p: p.name)
    if packs:
        _realise_pack_chunks(packs, ready)


def _realise_row_maps(maps: list[RowMap]) -> None:
    """Maps of row vectors alone, those of one kernel in one evaluation: each page's first column of values (float32,
    as `epilogue.start` takes them and `RowArg` reads them), the maps' columns stacked."""
    by_kernel: dict[int, list[RowMap]] = {}
    for v in maps:
        by_kernel.setdefault(id(v.kernel), []).append(v)
    for same in by_kernel.values():
        v0 = same[0]
        tr, tc = v0.tile
        counts = [v.count for v in same]
        pages = [np.asarray(_row_columns([v.ins[j] for v in same], counts), np.float32) for j in range(len(v0.ins))]
        out = np.asarray(mapped(v0.kernel.op.expr, [start(m, False) for m in pages], False), np.float32)
        column = np.asarray(np.broadcast_to(out, (len(pages[0]), 1)), np.float64)
        tiles = np.broadcast_to(column.reshape(-1, tr, 1), (len(column) // tr, tr, tc)).copy()
        _share(same, column, tiles, tr)


def _realise_scaled(scaled: list[RowScaled]) -> None:
    """Rescales whose values and factors are computed: each value (its pack's column, not rounded) times its factors
    (`support.scale_acc`: in float64, the factors as `row_factors` reads them), all at once."""
    inner: list[Any] = [x.inner.column for x in scaled]  # type: ignore[union-attr]
    values: np.ndarray = inner[0] if len(inner) == 1 else np.concatenate(inner)
    factors = np.asarray(_row_columns([x.factors for x in scaled], [x.count for x in scaled]), np.float64)
    _share(scaled, values * factors, None, len(values) // sum([x.count for x in scaled]))
    for x in scaled:
        x.inner = x.factors = None  # (computed: what it read is not kept alive by it)


def _row_columns(pages: list[Any], counts: list[int]) -> np.ndarray:
    """The values of each row vector page's first `count` tiles, one a row, as its tiles hold them (`factor_column`),
    joined: a row value's column rounded to float32 (its tiles are that), another page's tiles' first column."""
    whole = True
    x: Any
    for x, h in zip(pages, counts, strict=True):  # (a loop, not all() of a generator: a row value a band)
        whole = whole and (x.__class__ is RowPack or x.__class__ is RowMap) and len(x.column) == h * x.tile[0]  # type: ignore[arg-type]
    if whole:  # every page a row value's whole column: joined, then rounded at once
        columns = [x.column for x in pages]
        return np.asarray(columns[0] if len(columns) == 1 else np.concatenate(columns), np.float32)
    parts = [
        np.asarray(x.column[: h * x.tile[0]], np.float32) if x.__class__ in (RowPack, RowMap) else factor_column(x, h)  # type: ignore[index]
        for x, h in zip(pages, counts, strict=True)
    ]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _share(values: list[Any], column: np.ndarray, tiles: np.ndarray | None, tr: int) -> None:
    """Each value's rows of a column computed for all of them, in order (and its tiles, `tr` rows each)."""
    at = 0
    for v in values:
        v.column = column[at * tr : (at + v.count) * tr]
        if tiles is not None:
            v.result = tiles[at : at + v.count]
        at += v.count


def _realise_pack_chunks(todo: list[RowPack], ready: Callable[[list[Any]], None] | None) -> None:
    """Packs whose bases and first pages' row vectors are computed, a chunk at a time: those given no pages alone
    (their base's value, or the identity), the others in chunks of about CHUNK_ELEMS values."""
    chunk: list[RowPack] = []
    size = 0
    for p in todo:
        if p.column is not None:  # (computed already: a pack its own pages read, with them)
            continue
        if not p.pages:
            _realise_empty(p)
            continue
        chunk.append(p)
        for _, _, h, _, keep in p.pages:  # (a chunk's float64 temporaries stay in cache, as its pages' values do)
            size += h * keep
        if size * p.tile[0] >= CHUNK_ELEMS:
            _realise_chunk(chunk, ready)
            chunk, size = [], 0
    if chunk:
        _realise_chunk(chunk, ready)


def _realise_empty(p: RowPack) -> None:
    """A pack given no pages since its base: the base's value (as `support.row_value` carries it), or the reduction's
    identity where it has none; its tiles that value rounded to float32."""
    tr, tc = p.tile
    base: Any = p.base
    column = base.column if base is not None else np.full((p.count * tr, 1), reduction_named(p.name).identity)
    flat = np.asarray(np.asarray(column, np.float32), np.float64)
    p.column, p.result = column, np.broadcast_to(flat.reshape(-1, tr, 1), (p.count, tr, tc)).copy()
    p.base = None


def _realise_chunk(chunk: list[RowPack], ready: Callable[[list[Any]], None] | None = None) -> None:
    maps = list(dict.fromkeys([x[1] for p in chunk for x in p.pages if x[1].__class__ is MapValue]))
    maps = [v for v in maps if v.result is None]
    if maps:
        realise_maps(maps)
    tr, tc = chunk[0].tile
    found = [_reduced(list(p.pages), tr, tc) for p in chunk]
    values = [v for v, _ in found]
    starts = _starts(found) if len(found) > 1 else [0]
    k = 0
    while k < len(chunk):  # runs of packs of one reduction whose rows are one block of memory: one call each
        end = k + 1
        based = chunk[k].base is not None
        while (
            end < len(chunk)
            and chunk[end].name == chunk[k].name
            and (chunk[end].base is not None) == based
            and _follows(values[end - 1], values[end], starts[end] - starts[end - 1])
        ):
            end += 1
        rows = values[k] if end == k + 1 else _joined(values[k:end])
        column = np.asarray(reduce_rows(chunk[k].name, rows, False), np.float64)
        if based:  # the value carried before the pages, combined with theirs (`support.row_value`), every row at once
            bases = [p.base.column for p in chunk[k:end]]  # type: ignore[attr-defined]
            combine = OPS[reduction_named(chunk[k].name).combine].f64
            column = np.asarray(combine(bases[0] if len(bases) == 1 else np.concatenate(bases), column))  # type: ignore[misc]
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
        p.pages, p.base = (), None
    for v in maps:  # reduced, and read by nothing else (see above): dropped, not kept
        v.result = v.band = None


def _follows(a: np.ndarray, b: np.ndarray, step: int) -> bool:
    """Whether b's rows are the rows right after a's in one block of memory, in the same layout (b starting `step`
    bytes after a)."""
    return (
        a.dtype == b.dtype
        and a.shape[1] == b.shape[1]
        and a.strides == b.strides
        and a.base is not None
        and a.base is b.base
        and step == a.shape[0] * a.strides[0]
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
    return _reduced(pages, tr, tc)[0]


def _reduced(pages: list[tuple[str, object, int, int, int]], tr: int, tc: int) -> tuple[np.ndarray, Any]:
    """`reduced_values`, and where they lie: (the tensor's matrix, its row, its column) for a tensor's memory, the
    band's first byte for a band, None for values joined afresh."""
    _, first, h, width, _ = pages[0]
    full = width * tc
    if first.__class__ is TileRefs and _tensor_row(pages, first, width, full):
        corner = first.store.rect(first.at, first.off, h, width)
        if corner is not None and corner[1] + len(pages) * width <= first.store.cols_t:
            r0, c0 = corner
            span = (len(pages) - 1) * full + pages[-1][4]
            mat = first.store.mat
            return mat[r0 * tr : (r0 + h) * tr, c0 * tc : c0 * tc + span], (mat, r0 * tr, c0 * tc)
    if first.__class__ is MapValue and first.band is not None and first.slot == 0:
        band = first.band  # computed side by side, in this order (mapped.py): the band itself
        if _band_in_order(pages, band, full) and band.shape[0] == h * tr:
            return band[:, : (len(pages) - 1) * full + pages[-1][4]], first.start
    mats = [page_matrix(x, h, width, tr, tc)[:, :keep] for _, x, h, width, keep in pages]
    return np.asarray(np.concatenate(mats, axis=1), np.float64), None


def _starts(found: list[tuple[np.ndarray, Any]]) -> list[int]:
    """Each of the values' first byte in memory (`_follows`), from where `_reduced` found them: a tensor's matrix's
    own first byte asked once, a band's known, any other's asked of it."""
    at: dict[int, int] = {}
    starts = []
    for values, where in found:
        if where.__class__ is tuple:
            mat, row, col = where
            first = at.get(id(mat))
            if first is None:
                first = at[id(mat)] = mat.__array_interface__["data"][0]
            starts.append(first + row * mat.strides[0] + col * mat.strides[1])
        elif where is not None:
            starts.append(where)
        else:
            starts.append(values.__array_interface__["data"][0])
    return starts


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

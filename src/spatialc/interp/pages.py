"""The values ring pages hold (`TileRefs`, `Tiles`, `AccValue`, `MapValue`, `Transposed`; see values.py), and
computing accumulators: `realise` turns products of tensor rectangles into as few BLAS calls as the pages allow."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from .blas import live_matmul, matmul

if TYPE_CHECKING:
    from .values import Store


class Masked:
    """A page written with some rows left alone (a grouped tensor's rows past their group's count): its value, and
    per tile and row whether that row is written."""

    __slots__ = ("value", "keep")

    def __init__(self, value: object, keep: np.ndarray) -> None:
        self.value, self.keep = value, keep


class TileRefs:
    """Tiles `at + off[s]` of a store that nothing writes."""

    __slots__ = ("store", "at", "off", "count")

    def __init__(self, store: Store, at: int, off: np.ndarray) -> None:
        self.store, self.at, self.off = store, at, off
        self.count = len(off)  # (read at every op that takes the page: an attribute, not a property)

    def tiles(self) -> np.ndarray:
        return self.store.gather(self.at + self.off)


class Tiles:
    """Tiles held as an array (n, tr, tc)."""

    __slots__ = ("arr", "count")

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr
        self.count = len(arr)

    def tiles(self) -> np.ndarray:
        return self.arr


class AccValue:
    """A packed accumulator of h × w tiles: base + Σ_s A_s × B_s, A_s holding h × ibw tiles and B_s ibw × w."""

    __slots__ = ("h", "w", "ibw", "t", "a", "b", "base", "count", "result")

    def __init__(self, geom: tuple[int, int, int, int], a: tuple, b: tuple, base: object, count: int) -> None:
        self.h, self.w, self.ibw, self.t = geom
        self.a, self.b, self.base, self.count = a, b, base, count
        self.result: np.ndarray | None = None

    def matrix(self) -> np.ndarray:
        """The (h·t, w·t) sum."""
        if self.result is None:
            realise([self])
        assert self.result is not None
        return self.result

    def tiles(self) -> np.ndarray:
        h, w, t = self.h, self.w, self.t
        return self.matrix().reshape(h, t, w, t).transpose(0, 2, 1, 3).reshape(h * w, t, t)[: self.count]


class MapValue:
    """An elementwise stage's page of h × width tiles (tr × tc each): `kernel` (`mapped.MapKernel`) on the input pages
    `ins` — page j read as rows of `widths[j]` tiles, 1 for a row vector — and the broadcast vectors' values `cols`
    (flat: a column vector's width·tc, a row vector's h·tr), `row_key` naming what its row vectors read
    (`support.row_key`)."""

    start: int  # the band's first byte in memory (its data pointer), set with `band`

    __slots__ = (
        "kernel",
        "ins",
        "widths",
        "cols",
        "row_key",
        "h",
        "width",
        "tr",
        "tc",
        "count",
        "result",
        "band",
        "slot",
        "start",
    )

    def __init__(
        self,
        kernel: Any,
        ins: list,
        widths: tuple[int, ...],
        cols: list,
        h: int,
        width: int,
        tile: tuple[int, int],
        row_key: tuple = (),
    ) -> None:
        self.kernel, self.ins, self.widths, self.cols, self.row_key = kernel, ins, widths, cols, row_key
        self.h, self.width, (self.tr, self.tc) = h, width, tile
        self.count = h * width
        self.result: np.ndarray | None = None  # (h·tr, width·tc), once computed: float32 values (the table's)
        self.band: np.ndarray | None = None  # the pages computed with it, side by side: it is column block `slot`
        self.slot = 0  # (and `start`, the band's first byte in memory, set with `band`: read only where it is)

    def matrix(self) -> np.ndarray:
        """The page as one (h·tr, width·tc) matrix of float32 values, tile (i, j) at slot i·width + j."""
        if self.result is None:
            from .mapped import realise_maps  # mapped.py builds on this module's values

            realise_maps([self])
        assert self.result is not None
        return self.result

    def tiles(self) -> np.ndarray:
        """The page's tiles (h·width, tr, tc) in float64, as every computed page holds them."""
        h, w, tr, tc = self.h, self.width, self.tr, self.tc
        return self.matrix().reshape(h, tr, w, tc).transpose(0, 2, 1, 3).astype(np.float64).reshape(h * w, tr, tc)


class LaterColumn:
    """A row value computed later (`RowPack`, `RowMap`, `RowScaled`): `column`, one float64 per row, once
    `rowpacks.realise_packs` has computed it — with every other pending row value of its run then."""

    __slots__ = ()
    column: np.ndarray | None

    def value(self) -> np.ndarray:
        """The value, one float64 per row (a column), computed now where it is not yet."""
        if self.column is None:
            from .rowpacks import realise_packs  # rowpacks.py builds on this module's values

            realise_packs([self])
        assert self.column is not None
        return self.column


class LaterTiles(LaterColumn):
    """A row value computed later that is also a page: `result`, its tiles (n, tr, tc), each row's value in every
    column."""

    __slots__ = ()
    result: np.ndarray | None

    def tiles(self) -> np.ndarray:
        if self.result is None:
            self.value()
        assert self.result is not None
        return self.result


class RowPack(LaterTiles):
    """A row accumulator's pack (`support.pack`) in a float program, computed when its numbers are needed, with every
    other pending pack then (`rowpacks.realise_packs`): the reduction `name` of the pages it was given (as `Acc.rows`
    holds them, each h tile rows), combined by the reduction's own op with `base` — the value the accumulator carried
    before those pages (a pack, a rescale: `RowScaled`, or a computed column; None: nothing) — a row vector of
    `count` = h tiles. Given no pages, its value is `base`'s, or the reduction's identity. `column` is its value, one
    float64 per row (not rounded: what `support.row_value` computes, the value carried on), and `result` its tiles
    (n, tr, tc): each row's value, rounded to float32, in every column (what `support.packed_rows` packs)."""

    __slots__ = ("name", "pages", "tile", "count", "base", "column", "result", "later", "level")

    def __init__(
        self, name: str, pages: tuple, h: int, tile: tuple[int, int], later: LaterRows, base: object = None
    ) -> None:
        self.name, self.pages, self.tile, self.count, self.base = name, pages, tile, h, base
        self.column: np.ndarray | None = None
        self.result: np.ndarray | None = None
        later.add(self, 1 + max(level_of(base), pages_level(pages)))


class RowMap(LaterTiles):
    """A float program's map of row vectors alone (α = exp(m_old − m_new), a mean Σx / n: `support.elementwise`),
    computed when its numbers are needed, with every other pending row value then (`rowpacks.realise_packs`): `kernel`
    (`mapped.MapKernel`) on the row vector pages `ins`, each read as rows of one tile, a row vector of `count` = h
    tiles. Its expression reads each page's first column (`RowArg`), so its value is one float32 a row: `column` holds
    them as float64, and `result` its tiles (n, tr, tc), each row's value in every column."""

    __slots__ = ("kernel", "ins", "tile", "count", "column", "result", "later", "level")

    def __init__(self, kernel: Any, ins: list, h: int, tile: tuple[int, int], later: LaterRows) -> None:
        self.kernel, self.ins, self.tile, self.count = kernel, ins, tile, h
        self.column: np.ndarray | None = None
        self.result: np.ndarray | None = None
        later.add(self, 1 + max([level_of(x) for x in ins]))


class RowScaled(LaterColumn):
    """A row accumulator's value rescaled (`support.scale_acc`), computed when its numbers are needed: the value it
    held then (`inner`, a RowPack of the pages given since it was last carried) times each row's factor in the row
    vector page `factors` (`row_factors`), in float64 — carried on as the accumulator's value, never a page itself.
    `count` = h tile rows; `column` its value, once computed."""

    __slots__ = ("inner", "factors", "count", "column", "later", "level")

    def __init__(self, inner: RowPack, factors: object, h: int, later: LaterRows) -> None:
        self.inner: RowPack | None = inner
        self.factors, self.count = factors, h
        self.column: np.ndarray | None = None
        later.add(self, 1 + max(level_of(inner), level_of(factors)))


LATER_ROWS = (RowPack, RowMap, RowScaled)  # row values computed later, together (`rowpacks.realise_packs`)


class LaterRows:
    """One run's row values not computed yet (RowPack, RowMap, RowScaled), by level: a value's level is one more than
    that of every value not computed yet it reads, at once or through the pages it reduces (`level_of`), so computing
    the levels in order computes each value after what it reads — and each level's values, every band's, together."""

    __slots__ = ("levels", "low")

    def __init__(self) -> None:
        self.levels: list[list[Any]] = []
        self.low = 0  # no level below it holds a value

    def add(self, value: Any, level: int) -> None:
        value.later, value.level = self, level
        while len(self.levels) <= level:
            self.levels.append([])
        self.levels[level].append(value)
        if level < self.low:
            self.low = level


def pages_level(pages: tuple) -> int:
    """`level_of` the highest of the pages a row accumulator was given (as `Acc.rows` holds them): a band's pages,
    which read one row vector page after another, asked of each such page once."""
    level, last = -1, None
    for page in pages:
        x = page[1]
        if x.__class__ is MapValue and x.result is None:
            for y in x.ins:  # (a computed page's level, inlined: once a page)
                if y is not last and y.__class__ is not TileRefs:
                    found = level_of(y)
                    level = found if found > level else level
                    last = y
        elif x.__class__ is not TileRefs:  # (a tensor's tiles are read as they are)
            found = level_of(x)
            level = found if found > level else level
    return level


def level_of(value: object) -> int:
    """The level of a row value not computed yet (`LaterRows`), of a page not computed yet the highest of those its
    pages read; −1 for anything computed (or nothing)."""
    cls = value.__class__
    if cls is RowPack or cls is RowMap or cls is RowScaled:
        return value.level if value.column is None else -1  # type: ignore[attr-defined]
    if cls is MapValue and value.result is None:  # type: ignore[attr-defined]
        return max([level_of(x) for x in value.ins], default=-1)  # type: ignore[attr-defined]
    return -1


def factor_column(x: object, h: int) -> np.ndarray:
    """The values of a row vector page of at least h tiles, one per row, as a float64 column: each tile's first
    column (a row vector holds each row's value in every column)."""
    return np.asarray(tiles_of(x, h)[:, :, 0], np.float64).reshape(-1, 1)


class Transposed:
    """A matmul's B page that holds Bᵀ (`MatmulTiles.transpose_b`: attention's K block, `w × ibw` tiles as stored) read
    as the `ibw × w` page B: tile (k, j) is the transpose of the page's tile (j, k). Nothing is copied until a product
    asks for the tiles."""

    __slots__ = ("page", "w", "ibw", "count")

    def __init__(self, page: object, w: int, ibw: int) -> None:
        self.page, self.w, self.ibw = page, w, ibw
        self.count = w * ibw

    def tiles(self) -> np.ndarray:
        t = tiles_of(self.page, self.count)
        return t.reshape(self.w, self.ibw, *t.shape[1:]).transpose(1, 0, 3, 2).reshape(self.count, t.shape[2], -1)


PageValue = TileRefs | Tiles | AccValue | MapValue | RowPack | RowMap | Transposed


def tiles_of(value: object, n: int) -> np.ndarray:
    """The first n tiles of a page value."""
    return value.tiles()[:n]  # type: ignore[attr-defined]


def as_matrix(value: object, h: int, w: int, t: int) -> np.ndarray:
    """A page value's first h·w tiles as one (h·t, w·t) matrix, tile (i, j) from slot i·w + j."""
    return page_matrix(value, h, w, t, t)


def page_matrix(value: object, h: int, w: int, tr: int, tc: int) -> np.ndarray:
    """A page value's first h·w tiles (tr × tc each) as one (h·tr, w·tc) matrix, tile (i, j) from slot i·w + j: the
    tensor's own memory (read only) where they are a rectangle of a tensor nothing writes, the computed matrix where
    the page is one, else the tiles laid out."""
    if isinstance(value, AccValue) and (value.h, value.w) == (h, w) and value.count == h * w:
        return value.matrix()
    if isinstance(value, MapValue) and (value.h, value.width) == (h, w):
        return value.matrix()
    if isinstance(value, TileRefs) and len(value.off) >= h * w:
        store = value.store
        corner = store.rect(value.at, value.off, h, w)
        if corner is not None:
            r0, c0 = corner
            return store.mat[r0 * tr : (r0 + h) * tr, c0 * tc : (c0 + w) * tc]
    return tiles_of(value, h * w).reshape(h, w, tr, tc).transpose(0, 2, 1, 3).reshape(h * tr, w * tc)


# ---- computing accumulators ---------------------------------------------------------------------------------


HULL_DENSITY = 0.8  # a shared matmul may compute at most 1/0.8 of the tiles its members need
HULL_MAX_ELEMS = 2**23  # and hold at most this many float64 results at once (64 MiB)


def realise(values: list[AccValue], into: dict[int, tuple[Store, int, int]] | None = None) -> dict[int, AccValue]:
    """Compute every value's sum; products of tensor rectangles over one K range share matmuls where dense.

    `into` offers a destination (store, tile row, tile column) per value; the values a matmul wrote straight
    there are returned (by id)."""
    into = into or {}
    placed: dict[int, AccValue] = {}
    todo = list({id(v): v for v in values if v.result is None}.values())
    groups: dict[tuple, list[tuple[int, int, int, int, AccValue]]] = defaultdict(list)
    for v in todo:
        key = _rect_key(v)
        if key is None:
            v.result = _product_general(v)
        else:
            groups[key[0]].append((*key[1], v))
    for (sa, k0, ka, sb, kb0), members in groups.items():
        if not _hull_product(sa, k0, ka, sb, kb0, members, into, placed):
            bands: dict[tuple[int, int], list] = defaultdict(list)
            for mem in members:
                bands[mem[:2]].append(mem)
            for band in bands.values():
                if not _hull_product(sa, k0, ka, sb, kb0, band, into, placed):
                    for mem in band:
                        _hull_product(sa, k0, ka, sb, kb0, [mem], into, placed)
    for v in todo:
        if v.base is not None:
            base = as_matrix(v.base, v.h, v.w, v.t)
            if id(v) in placed:  # in place: the result is the tensor's memory (int64: base holds exact integers)
                np.add(v.result, base, out=v.result, casting="unsafe")
            else:
                v.result = v.result + base
    return placed


def _run(pages: tuple, rows: int, cols: int, step: int) -> tuple[Store, int, int] | None:
    """(store, corner row, corner column) when the pages, each `rows × cols` tiles in slot order, are TileRefs
    of one read op whose blocks are rectangles of the tensor and whose `at`s advance by `step` per page."""
    p0 = pages[0] if pages else None
    if not isinstance(p0, TileRefs) or not p0.store.is_block(p0.off, rows, cols):
        return None
    store, off, at0 = p0.store, p0.off, p0.at
    expect = at0
    for p in pages:
        if p.__class__ is not TileRefs or p.store is not store or p.off is not off or p.at != expect:
            return None
        expect += step
    return store, *divmod(at0, store.cols_t)


def _rect_key(v: AccValue) -> tuple[tuple, tuple[int, int, int, int]] | None:
    """((A store, A column, K tiles, B store, B row), (A row, h, B column, w)) when A and B are rectangles."""
    s, h, w, ibw = len(v.a), v.h, v.w, v.ibw
    # A pages side by side along K are the h × (s·ibw) block; B pages stacked along K are (s·ibw) × w.
    ra = _run(v.a, h, ibw, ibw)
    tensor_b = ra is not None and isinstance(v.b[0], TileRefs)  # (a computed B page has no store)
    rb = _run(v.b, ibw, w, ibw * v.b[0].store.cols_t) if tensor_b else None
    if ra is None or rb is None:
        return None
    (sa, r0, k0), (sb, kb0, c0) = ra, rb
    if k0 + s * ibw > sa.cols_t or c0 + w > sb.cols_t:  # the run wraps past the grid's right edge
        return None
    return (sa, k0, s * ibw, sb, kb0), (r0, h, c0, w)


def _hull_product(
    sa: Store,
    k0: int,
    ka: int,
    sb: Store,
    kb0: int,
    members: list,
    into: dict[int, tuple[Store, int, int]],
    placed: dict[int, AccValue],
) -> bool:
    """One matmul over the bounding rectangle of the members' outputs, if dense and small enough (else False);
    written straight into the destination tensor when the members tile exactly the rectangle `into` gives."""
    t = sa.tc
    rlo, clo = min(m[0] for m in members), min(m[2] for m in members)
    rhi, chi = max(m[0] + m[1] for m in members), max(m[2] + m[3] for m in members)
    cover = np.zeros((rhi - rlo, chi - clo), dtype=bool)
    for r0, h, c0, w, _ in members:
        cover[r0 - rlo : r0 - rlo + h, c0 - clo : c0 - clo + w] = True
    if len(members) > 1 and (cover.mean() < HULL_DENSITY or cover.size * t * t > HULL_MAX_ELEMS):
        return False
    a = sa.mat[rlo * t : rhi * t, k0 * t : (k0 + ka) * t]
    b = sb.mat[kb0 * t : (kb0 + ka) * t, clo * t : chi * t]
    exact = cover.all() and sum(m[1] * m[3] for m in members) == cover.size
    out = _direct_out(members, into, rlo, clo, rhi, chi, t) if exact else None
    if out is None:
        out = live_matmul(sa, rlo, a, b)
    else:
        live_matmul(sa, rlo, a, b, out)
        placed.update((id(m[4]), m[4]) for m in members)
    for r0, h, c0, w, v in members:
        v.result = out[(r0 - rlo) * t : (r0 - rlo + h) * t, (c0 - clo) * t : (c0 - clo + w) * t]
    return True


def _direct_out(
    members: list, into: dict[int, tuple[Store, int, int]], rlo: int, clo: int, rhi: int, chi: int, t: int
) -> np.ndarray | None:
    """The destination of the hull in one tensor, when every member lands at the same shift from its place in
    the hull and that part of the tensor is contiguous (BLAS writes it directly)."""
    dests = [into.get(id(m[4])) for m in members]
    if any(d is None for d in dests):
        return None
    store, dr, dc = dests[0][0], dests[0][1] - members[0][0], dests[0][2] - members[0][2]  # type: ignore[index]
    for (r0, _, c0, _, _), (st, d0, e0) in zip(members, dests, strict=True):  # type: ignore[misc]
        if st is not store or d0 - r0 != dr or e0 - c0 != dc:
            return None
    out = store.mat[(rlo + dr) * t : (rhi + dr) * t, (clo + dc) * t : (chi + dc) * t]
    return out if out.flags.c_contiguous else None


def _product_general(v: AccValue) -> np.ndarray:
    """Σ A_s × B_s from the pages' tiles, as one matmul of the pages laid side by side."""
    h, w, ibw, t, s = v.h, v.w, v.ibw, v.t, len(v.a)
    if s == 0:
        return np.zeros((h * t, w * t))
    a = np.stack([tiles_of(p, h * ibw) for p in v.a]).reshape(s, h, ibw, t, t)
    b = np.stack([tiles_of(p, ibw * w) for p in v.b]).reshape(s, ibw, w, t, t)
    a2 = a.transpose(1, 3, 0, 2, 4).reshape(h * t, s * ibw * t)
    b2 = b.transpose(0, 1, 3, 2, 4).reshape(s * ibw * t, w * t)
    return matmul(a2, b2)

"""What generated engine code calls off its hot path: error reports, PackAcc, multicast, barriers, trip counts.

Every function takes the engine `E` and the index `i` of the op in its compiled program, so a message can name
the site, engine, op and buffer it is about.
"""

from __future__ import annotations

import numpy as np

from ..ir.ops import Barrier, Loop, Map, Pos, Reserve, RowReduce, SemWait, Trip, VecAxis, Wait
from ..numerics import epilogue
from ..numerics.elementwise import OPS
from ..numerics.reductions import reduce_rows, reduction_named
from ..numerics.rounding import INT8_EXACT_K, computed_operand
from .colpacks import packed_cols
from .errors import AddressError, FlowError, NumericError, UnsupportedOp
from .mapped import MapKernel, realise_maps
from .rowpacks import lazy_pack, reduced_values, row_map_later, scaled_later
from .state import Acc, BarrierState, EngineState, Ring
from .values import (
    LATER_ROWS,
    AccValue,
    MapValue,
    Masked,
    RowMap,
    Store,
    TileRefs,
    Tiles,
    Transposed,
    factor_column,
    tiles_of,
)


def where(E: EngineState, i: int) -> str:
    """`site 3 compute: `Wait A_ring`` — the place a message is about."""
    return f"{E.label}: `{E.code.texts[i]}`"


def fail(E: EngineState, i: int, what: str) -> None:
    """A ring or accumulator used out of protocol."""
    raise FlowError(f"{where(E, i)}: {what}")


def fail_addr(E: EngineState, i: int, store: Store, at: int, off: np.ndarray) -> None:
    t = store.tensor
    raise AddressError(
        f"{where(E, i)}: tiles {at + int(off.min())}..{at + int(off.max())} of {t.name} are outside"
        f" its {t.tiles[0]}x{t.tiles[1]} tile grid (0..{store.ntiles - 1})"
    )


def fail_page(E: EngineState, i: int, r: Ring, n: int) -> None:
    """A consumer-side read of n tiles from the front page of r that has no such page."""
    if not r.published:
        fail(E, i, f"reads the front page of {r.name} but none is published")
    v = r.slots[r.front()]
    held = "was never written" if v is None else f"holds {v.count} tiles"  # type: ignore[attr-defined]
    fail(E, i, f"needs {n} tiles of {r.name}'s front page, which {held}")


def item_coords(E: EngineState, coords: list[tuple[int, int]], k: int, i: int) -> tuple[int, int]:
    """(item_y, item_x) of the site's k-th item."""
    if k >= len(coords):
        fail(E, i, f"the ITEM loop reaches item {k} but site {int(E.site)} has {len(coords)} items")
    return coords[k]


def set_geom(E: EngineState, i: int, acc: Acc, geom: tuple[int, int, int, int, int]) -> None:
    """First product into an acquired accumulator fixes its block shape; a later one must agree."""
    if acc.geom is not None and acc.geom[:4] != geom[:4]:
        fail(E, i, f"{acc.name} already holds products of another block shape")
    acc.geom = geom


def pack(E: EngineState, i: int, acc: Acc, r: Ring, n: int, accumulate: bool) -> None:
    """PackAcc: the accumulator (its products, not yet multiplied) into the newest reserved page of r."""
    if not acc.live:
        fail(E, i, f"{acc.name} is not acquired")
    if not r.reserved:
        fail(E, i, f"writes {r.name} but holds no reserved page of it")
    slot = r.newest_reserved()
    if acc.col_op is not None or acc.columns:
        r.slots[slot] = packed_cols(E, i, acc, n, accumulate)
        return
    if acc.rows or acc.reduction is not None or acc.carried is not None:
        t = E.m.p.tile
        later = lazy_pack(acc, n, accumulate, E.m.p.precision.value == "int8", (t.rows, t.cols), E.m.later)
        r.slots[slot] = later if later is not None else packed_rows(E, i, acc, n, accumulate)
        return
    base = r.slots[slot] if accumulate else None
    if accumulate and (base is None or base.count < n):  # type: ignore[attr-defined]
        fail(E, i, f"accumulates onto a page of {r.name} that holds no {n} tiles")
    if acc.parts:  # partial sums added (split-K), in their order, onto whatever the pack adds to
        total = base.tiles()[:n].copy() if base is not None else np.zeros_like(acc.parts[0][:n])  # type: ignore[attr-defined]
        for part in acc.parts:
            total += part[:n]
        base = Tiles(total)
    geom = acc.geom
    if geom is None:  # acquired, never multiplied into: zeros
        t = E.m.p.tile
        zeros = np.zeros((n, t.rows, t.cols))
        r.slots[slot] = Tiles(zeros if base is None else base.tiles()[:n].copy())  # type: ignore[attr-defined]
        return
    if n > geom[0] * geom[1]:
        fail(E, i, f"packs {n} tiles of a {geom[0]}x{geom[1]}-tile accumulator")
    if accumulate and n != geom[0] * geom[1]:  # the sum adds its base as a whole accumulator block
        raise UnsupportedOp(
            f"{where(E, i)}: an accumulating pack of {n} of the accumulator's {geom[0] * geom[1]} tiles"
        )
    if len(acc.a) * geom[4] >= INT8_EXACT_K:
        raise NumericError(
            f"{where(E, i)}: an int8 reduction over {len(acc.a) * geom[4]} elements is not exact"
            f" in float64 (limit {INT8_EXACT_K})"
        )
    r.slots[slot] = AccValue(geom[:4], tuple(acc.a), tuple(acc.b), base, n)


def row_reduce(E: EngineState, i: int, x: object, acc: Acc, op: RowReduce, at: int) -> None:
    """A row reduction: the front page `x` (rows of `op.width` tiles, the first at tile column `at` of the row) kept
    in `acc`, its columns at or past the row's `op.cols` values left out; `packed_rows` reduces them."""
    rows, width, name = acc.rows, op.width, op.op
    n = x.count  # type: ignore[attr-defined]
    h = n // width
    if (  # every check below passes (the page taken as it would be there): once a page, in short
        acc.live
        and not acc.a
        and not acc.parts
        and n % width == 0
        and h <= acc.tiles
        and (not rows or (rows[0][0] == name and rows[0][2] == h))
        and (acc.reduction is None or acc.reduction == name)
        and at >= 0
    ):
        tc = E.m.p.tile.cols
        full, keep = width * tc, op.cols - at * tc  # (the columns kept, clamped to 0..full without two calls)
        rows.append((name, x, h, width, full if keep > full else keep if keep > 0 else 0))
        return
    if not acc.live:
        fail(E, i, f"{acc.name} is not acquired")
    if acc.a or acc.parts:
        fail(E, i, f"{acc.name} holds a matmul's products; a row reduction needs an accumulator of its own")
    t = E.m.p.tile
    n = x.count  # type: ignore[attr-defined]
    if n % op.width:
        fail(E, i, f"a page of {n} tiles is not whole rows of {op.width} tiles")
    h = n // op.width
    if h > acc.tiles or (acc.rows and (acc.rows[0][0] != op.op or acc.rows[0][2] != h)):
        fail(E, i, f"{acc.name} ({acc.tiles} tiles) holds other rows, or another reduction, than this page's {h} rows")
    if acc.reduction is not None and acc.reduction != op.op:
        fail(E, i, f"{acc.name} holds a row {acc.reduction}, not a row {op.op}")
    if at < 0:
        raise AddressError(f"{where(E, i)}: a row reduction at tile column {at}")
    keep = max(0, min(op.width * t.cols, op.cols - at * t.cols))
    acc.rows.append((op.op, x, h, op.width, keep))  # the page itself: its values never change (values.py)


def packed_rows(E: EngineState, i: int, acc: Acc, n: int, accumulate: bool) -> Tiles:
    """PackAcc of a row accumulator: each row's reduction over every page it was given (`numerics.elementwise.
    reduce_rows`: a sum exactly rounded, whatever the order of the pages) — or, where it was rescaled (`scale_acc`)
    or packed before, its value then combined with the pages given since (`row_value`) — as a row vector of n tiles:
    tile r the value of the page's rows in tile row r, in every column, a float program's rounded to float32. An
    accumulator given nothing packs its reduction's identity (−inf for max, 0 for a sum).

    A pack is a snapshot: the accumulator goes on reducing after it (online softmax packs its running max before
    and after each block). A max's, min's or absmax's value is carried from the pack on, as it is exact; a sum's
    pages are kept, so that a sum packed once is one exact rounding of all of them, as before."""
    if accumulate:
        raise UnsupportedOp(f"{where(E, i)}: an accumulating pack of a row accumulator")
    t = E.m.p.tile
    name = acc.rows[0][0] if acc.rows else acc.reduction
    column = row_value(E, i, acc, name)
    if column is None:
        column = np.full((n * t.rows, 1), reduction_named(name or "sum").identity)
    if n * t.rows != column.shape[0]:
        fail(E, i, f"packs {n} tiles of a row accumulator of {column.shape[0] // t.rows} tile rows")
    if acc.carried is not None or reduction_named(name or "sum").combine != "add":
        acc.carried, acc.rows = column, []
    integer = E.m.p.precision.value == "int8"
    values = np.asarray(column if integer else np.asarray(column, np.float32), np.float64)
    return Tiles(np.broadcast_to(values.reshape(n, t.rows, 1), (n, t.rows, t.cols)).copy())


def row_value(E: EngineState, i: int, acc: Acc, name: str | None) -> np.ndarray | None:
    """A row accumulator's value now, one per row (a column): the reduction `name` of the pages given since it was
    last carried (`reduce_rows`: a float sum exactly rounded to float32, a max exact), combined by the reduction's
    own op (`REDUCTIONS`: add, max or min) with the value carried — float64 (int64 in an integer program), not
    rounded. None where it holds nothing (its identity)."""
    if acc.carried.__class__ in LATER_ROWS:  # a pack's or a rescale's value, carried: computed now
        acc.carried = acc.carried.value()
    segment = None
    if acc.rows:
        t = E.m.p.tile
        integer = E.m.p.precision.value == "int8"
        realise_maps([x for _, x, *_ in acc.rows if isinstance(x, MapValue)])
        values = reduced_values(acc.rows, t.rows, t.cols)
        segment = np.asarray(reduce_rows(acc.rows[0][0], values, integer), np.int64 if integer else np.float64)
    if acc.carried is None or segment is None:
        return segment if segment is not None else acc.carried
    if segment.shape != acc.carried.shape:
        fail(E, i, f"{acc.name} holds {acc.carried.shape[0]} rows, and a page of {segment.shape[0]} was reduced")
    combine = OPS[reduction_named(name or "sum").combine]
    f = combine.i64 if E.m.p.precision.value == "int8" else combine.f64
    return np.asarray(f(acc.carried, segment))  # type: ignore[misc]


def scale_acc(E: EngineState, i: int, x: object, acc: Acc, geom: tuple[int, int, int, int, int] | None) -> None:
    """ScaleAcc: every row of the accumulator multiplied, in float64, by its value in the row vector page `x` (tile r
    holding tile row r's values in every column) — what it holds now, not what is added later. A matmul
    accumulator's (`geom`: its block, h × w tiles) products so far are summed and the scaled sum kept as a partial sum
    that the pack adds; a row accumulator's (geom None) value is carried (`row_value`). One that holds nothing holds
    zeros, or its reduction's identity, and is scaled all the same (0 · α, as a kernel's register is)."""
    if not acc.live:
        fail(E, i, f"{acc.name} is not acquired")
    if E.m.p.precision.value == "int8":
        raise UnsupportedOp(f"{where(E, i)}: rescaling an accumulator is float arithmetic; an int8 program's is exact")
    t = E.m.p.tile
    if geom is None and scaled_later(
        acc, x, (t.rows, t.cols), E.m.later
    ):  # computed later, with the other bands' (rowpacks.py)
        return
    if geom is None:
        name = acc.rows[0][0] if acc.rows else acc.reduction
        column = row_value(E, i, acc, name)
        h = x.count if column is None else column.shape[0] // t.rows  # type: ignore[attr-defined]
        if column is None:
            column = np.full((h * t.rows, 1), reduction_named(name or "sum").identity)
        acc.carried, acc.rows = column * row_factors(E, i, x, h), []
        return
    h, w = geom[0], geom[1]
    if acc.geom is not None and acc.geom[:4] != geom[:4]:
        fail(E, i, f"{acc.name} holds products of another block shape")
    now = np.zeros((h * w, t.rows, t.cols))
    for part in acc.parts:
        now += part[: h * w]
    if acc.a:
        now += AccValue(geom[:4], tuple(acc.a), tuple(acc.b), None, h * w).tiles()
    alpha = row_factors(E, i, x, h).reshape(h, 1, t.rows, 1)
    scaled = now.reshape(h, w, t.rows, t.cols) * alpha
    acc.parts, acc.a, acc.b, acc.geom = [scaled.reshape(h * w, t.rows, t.cols)], [], [], geom


def row_factors(E: EngineState, i: int, x: object, h: int) -> np.ndarray:
    """The values of a row vector page of at least h tiles, one per row, as a float64 column."""
    if x.count < h:  # type: ignore[attr-defined]
        fail(E, i, f"rescales {h} tile rows by a row vector of {x.count} tiles")  # type: ignore[attr-defined]
    return factor_column(x, h)


def transposed(x: object, w: int, ibw: int) -> Transposed:
    """A B page holding Bᵀ (`MatmulTiles.transpose_b`) as the page B it stands for."""
    return Transposed(x, w, ibw)


def partial(E: EngineState, i: int, x: object, n: int) -> np.ndarray:
    """The n tiles of a page of partial sums (split-K), copied: the page is freed before the sum is packed."""
    if x.count < n:  # type: ignore[attr-defined]
        fail(E, i, f"adds a page of {x.count} tiles to an accumulator of {n}")  # type: ignore[attr-defined]
    return np.array(tiles_of(x, n), dtype=np.float64)


def operand(E: EngineState, i: int, x: object, precision: str) -> object:
    """A page as a matmul multiplies it: a tensor's tiles as they are (their values are the operand type's already);
    a computed page (an elementwise stage's, or a packed accumulator) as float32, rounded to the operand type, nearest
    even — as the kernel stores it into the operand page — or, for int8, checked to hold int8 integers (a
    requant's)."""
    if isinstance(x, TileRefs):
        return x
    tiles = tiles_of(x, x.count)  # type: ignore[attr-defined]
    if precision != "int8":
        return Tiles(computed_operand(tiles, precision))
    if tiles.size and (np.any(tiles != np.rint(tiles)) or tiles.min() < -128 or tiles.max() > 127):
        raise NumericError(f"{where(E, i)}: it multiplies a computed page whose values are not int8 integers")
    return x


def mcast_send(E: EngineState, i: int, r: Ring, others: list[Ring]) -> None:
    """McastSend: this site's newest reserved page of r into the newest reserved page of r on the others."""
    if not r.reserved:
        fail(E, i, f"sends {r.name} but holds no reserved page of it")
    value = r.slots[r.newest_reserved()]
    if value is None:
        fail(E, i, f"sends a page of {r.name} that was never written")
    for o in others:
        if not o.reserved:
            fail(E, i, f"site {int(o.site)} holds no reserved page of {o.name} to receive")
        o.slots[o.newest_reserved()] = value


def barrier_arrive(E: EngineState, st: BarrierState) -> int:
    """Count this site's arrival; the crossing it waits for is its arrival number."""
    st.count[E.site] += 1
    gen = st.count[E.site]
    st.ticks[gen] = max(st.ticks.get(gen, 0), E.clock)
    return gen


def trip(E: EngineState, i: int, iy: int, ix: int) -> int:
    """The count of a Loop with a Trip count (`Machine.trip`), for the item at (iy, ix)."""
    op = E.code.ops[i]
    assert isinstance(op, Loop) and isinstance(op.count, Trip)
    return E.m.trip(op.count, lambda: where(E, i), iy, ix)


def row_mask(store: Store, flat: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Which rows of the tiles at `flat` of a grouped tensor lie below their group's row count: (n, tile rows)."""
    rows_t = store.tensor.group_tiles[0]
    ti = flat // store.cols_t
    group, first = np.divmod(ti, rows_t)
    rows = first[:, None] * store.tr + np.arange(store.tr)[None, :]
    return rows < counts[group][:, None]


def masked_read(E: EngineState, i: int, store: Store, at: int, off: np.ndarray, counts: np.ndarray) -> Tiles | TileRefs:
    """ReadTiles of a grouped tensor with row counts: its tiles, the rows at or past their group's count zero (a
    block all below its count is read as any other, by reference)."""
    flat = at + off
    keep = row_mask(store, flat, counts)
    if keep.all() and not store.written:
        return TileRefs(store, at, off)
    tiles = store.gather(flat).copy()
    tiles[~keep] = 0.0
    return Tiles(tiles)


def masked_write(E: EngineState, i: int, store: Store, at: int, off: np.ndarray, counts: np.ndarray, v: object):
    """A page to write to a grouped tensor with row counts: only its rows below their group's count are written
    (still lazy: the store computes the value with the other pending writes)."""
    return Masked(v, row_mask(store, at + off, counts))


def why(E: EngineState, i: int) -> str:
    """Why the blocking op i of E cannot go on."""
    op, obj = E.code.ops[i], E.code.blocked_on(E.args, i)
    match op:
        case Reserve(_, n):
            return obj.why_blocked("Reserve", n)
        case Wait(_, n):
            return obj.why_blocked("Wait", n)
        case SemWait(_, v):
            return f"{obj.name} at site {int(E.site)} is {obj.value}, waiting for >= {v}"
        case Barrier(group):
            mine = obj.count[E.site]
            missing = ", ".join(str(int(s)) for s in obj.sites if obj.count[s] < mine)
            return f"group {int(group)}: sites {missing} have not arrived"
    return "blocked"


def elementwise(
    E: EngineState,
    i: int,
    xs: list,
    kernel: MapKernel,
    vectors: list[tuple[Store, int, int, bool]],
    places: tuple[tuple[Pos, int], ...] = (),
) -> Tiles | MapValue | RowMap:
    """An elementwise Compute: every element of the front pages `xs` through the kernel's op (numerics.epilogue), as a
    new page — computed later, with others, where the kernel is `lazy` (`mapped.py`), or is a map of row vectors
    alone (`MapKernel.row_map`: `rowpacks.py`).

    Each column vector (store, at, width, False) — a bias — has the page hold rows of `width` tiles, its tile s
    covering the vector's tile column `at + s mod width`; each row vector (store, at, width, True) — a per-row scale
    — its tile s covering the vector's tile row `at + s // width`. Each position (`Pos`, at) — a mask's row or
    column — is the element's index as a value: its tile row `at + s // width` (ROW) or tile column `at + s mod
    width` (COL), times the tile's side, plus its row or column in the tile."""
    if kernel.lazy and kernel.width and kernel.whole:  # the checks below, in short, first (`plain` implies this)
        width = kernel.width
        n = xs[kernel.whole[0]].count
        h = n // width
        fits = n % width == 0
        for j in kernel.whole:  # (loops, not all() of generators: this runs once a page)
            fits = fits and xs[j].count == n
        for j in kernel.by_row:
            fits = fits and xs[j].count >= h
        if fits and kernel.plain:  # a map of pages and row-vector pages alone
            return MapValue(kernel, xs, kernel.widths, [], h, width, kernel.tile, ())
        if fits:  # with broadcast vectors, or of any layout
            vecs = []
            for store, at, w, by_rows in vectors:
                value = vector_values(store, at, w, h, by_rows)
                if value is None:
                    break
                vecs.append(value.copy() if store.written else value)
            else:
                first = xs[kernel.whole[0]]
                shape = first.store.block_shape(first.off) if kernel.free and first.__class__ is TileRefs else None
                if shape is not None and shape[0] * shape[1] == n:  # the page's own rectangle, as it was read
                    return MapValue(kernel, xs, (shape[1],) * len(xs), vecs, shape[0], shape[1], kernel.tile)
                key = row_key(vectors, vecs) if vectors else ()
                return MapValue(kernel, xs, kernel.widths, vecs, h, width, kernel.tile, key)
    if kernel.row_map and not places:
        later = row_map_later(kernel, xs, E.m.later)
        if later is not None:
            return later
    t = E.m.p.tile
    op, integer, by_row = kernel.op, kernel.integer, kernel.by_row
    whole = [x for j, x in enumerate(xs) if j not in by_row] or xs  # (a map of row vectors alone: their shape)
    n = whole[0].count if whole else 0
    if not whole or any(x.count != n for x in whole):
        fail(E, i, f"an elementwise stage's pages hold {[x.count for x in xs]} tiles: one shape, element by element")
    widths = {w for _, _, w, _ in vectors} | set(by_row.values()) | {node.width for node, _ in places}
    width = widths.pop() if len(widths) == 1 else 1
    if widths or n % width:
        fail(E, i, f"a page of {n} tiles is not whole rows of {sorted({width, *widths})} tiles")
    h = n // width
    page_widths = tuple(1 if j in by_row else width for j in range(len(xs)))
    for x, w in zip(xs, page_widths, strict=True):
        if x.count < h * w:
            fail(E, i, f"a row vector of {x.count} tiles, read against a page of {h} tile rows")
    rows = {}
    for k, (store, at, w, by_rows) in enumerate(vectors):
        value = vector_values(store, at, w, h, by_rows)
        if value is None and by_rows:
            raise AddressError(
                f"{where(E, i)}: row vector tile rows {at}..{at + h - 1} are outside"
                f" {store.tensor.name}'s {store.arr.shape[0]} tile rows"
            )
        if value is None:
            raise AddressError(
                f"{where(E, i)}: column vector tile columns {at}..{at + w - 1} are outside"
                f" {store.tensor.name}'s {store.cols_t} tile columns"
            )
        rows[k] = value.copy() if kernel.lazy and store.written else value  # (read now, as a page computed now is)
    if kernel.lazy:
        vecs = [rows[k] for k in range(len(vectors))]
        return MapValue(kernel, xs, page_widths, vecs, h, width, (t.rows, t.cols), row_key(vectors, vecs))
    mats = [
        tiles_of(x, h * w).reshape(h, w, t.rows, t.cols).transpose(0, 2, 1, 3).reshape(h * t.rows, w * t.cols)
        for x, w in zip(xs, page_widths, strict=True)
    ]
    order = kernel.order
    at_of = {node: position_values(node, at, h, t.rows, t.cols) for node, at in places}
    col = (lambda c: at_of[c] if isinstance(c, Pos) else rows[order[id(c)]]) if rows or at_of else None
    if isinstance(op, Map):
        out = epilogue.mapped(op.expr, [epilogue.start(m, integer) for m in mats], integer, col)
    else:
        out = epilogue.apply(op, epilogue.start(mats[0], integer), integer)  # type: ignore[arg-type]
    # An integer chain's values stay int64: past 2^53 float64 would round them (the kernels' long long does not).
    out = out if integer else out.astype(np.float64)
    out = np.broadcast_to(
        out, (h * t.rows, width * t.cols)
    )  # a map of row vectors alone: each row's value, each column
    back = out.reshape(h, t.rows, width, t.cols).transpose(0, 2, 1, 3)
    return Tiles(back.reshape(n, t.rows, t.cols))


def position_values(node: Pos, at: int, h: int, tr: int, tc: int) -> np.ndarray:
    """A position's values for a page of h rows of `node.width` tiles whose first tile row (ROW) or column (COL) is
    `at`: each row's index (h·tr of them) or each column's (width·tc), flat."""
    if node.axis == VecAxis.ROW:
        return at * tr + np.arange(h * tr)
    return at * tc + np.arange(node.width * tc)


def vector_values(store: Store, at: int, w: int, h: int, by_rows: bool) -> np.ndarray | None:
    """A broadcast vector's values for a page of h × w tiles, flat (a view of the store): a row vector's h tile rows
    from tile row `at` (one value per row), a column vector's w tile columns from tile column `at`; None where those
    lie outside the tensor."""
    if by_rows:
        if not 0 <= at <= store.arr.shape[0] - h:
            return None
        return store.arr[at : at + h, :, 0, 0].reshape(-1)
    if not 0 <= at <= store.cols_t - w:
        return None
    return store.arr[0, 0, at : at + w, :].reshape(-1)


def row_key(vectors: list[tuple[Store, int, int, bool]], values: list[np.ndarray]) -> tuple:
    """What the row vectors of a page read, for `mapped.py` to lay side by side only pages that read the same values:
    (store, tile row) where nothing writes the store, else the copy read."""
    return tuple(
        (id(store), at) if not store.written else id(value)
        for (store, at, _, by_rows), value in zip(vectors, values, strict=True)
        if by_rows
    )

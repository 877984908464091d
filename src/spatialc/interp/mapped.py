"""Elementwise pages computed when their numbers are needed, many pages in one numpy evaluation.

An elementwise stage of a float program makes a `values.MapValue` — its input pages (a second page beside the first:
a residual, a gate), its broadcast vectors' values and its shape, not its numbers. Whatever needs the numbers (a
write applied to its tensor, a row accumulator packed, a matmul operand, a later stage's page) computes every such
page it holds at once: `realise_maps` lays the pages of one expression that read one row vector (a row page, or the
same rows of a parameter tensor read along rows: `VecAxis.ROW`) side by side, as the band of rows they came from,
stacks equal bands, and runs the expression once on the stack. The table's ops are elementwise, so this changes how
many elements one numpy call sees, never a value: each element is the float64 op of its float32 operands rounded to
float32, as `numerics.elementwise.evaluate` defines, whether it is computed alone or among millions.

Integer programs (their int64 range check belongs to the op that overflows), `Requant`, and expressions the table
would refuse keep the page-at-a-time path of `support.elementwise`, so that an error still comes from the op that
makes it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..ir.ops import Apply, Arg, Col, Expr, Lit, Map, RowArg, VecAxis, cols, row_reads
from ..numerics.elementwise import OPS, ElementwiseError, evaluate
from ..numerics.epilogue import EpilogueError
from .reuse import reused
from .values import MapValue, RowMap, RowPack, TileRefs, page_matrix

ROW_PAGES = (RowPack, RowMap)  # the row values a page may read that are computed later (`rowpacks.py`)

# Elements one evaluation computes at most. Its float64 temporaries (2 MiB each) are then reused from the heap, not
# mapped fresh from the OS and faulted in page by page as a whole tensor's would be, and stay in cache between ops.
CHUNK_ELEMS = 1 << 18


class MapKernel:
    """What an elementwise op of `ins` input pages takes at every page, found once: the row vectors it reads (page
    index → width), each broadcast vector's place in `cols(expr)` and which of them follow rows (`row_vecs`: one value
    per row), whether its pages may be computed later (`lazy`),
    and for those the pages read whole, the one row width every vector agrees on (0 where they do not), the width
    each page is read at, whether it reads no vector at all (`free`), and whether it reads row vector pages and no
    broadcast vector (`plain`)."""

    __slots__ = (
        "op",
        "integer",
        "tile",
        "by_row",
        "rows",
        "order",
        "row_vecs",
        "lazy",
        "whole",
        "width",
        "widths",
        "free",
        "plain",
        "row_map",
        "reuse",
    )

    def __init__(self, op: object, integer: bool, tile: tuple[int, int], ins: int) -> None:
        self.op, self.integer, self.tile = op, integer, tile
        self.by_row: dict[int, int] = dict(row_reads(op.expr)) if isinstance(op, Map) else {}
        self.rows = tuple(j for j in range(ins) if j in self.by_row)  # the pages read as row vectors, in order
        vectors = cols(op.expr) if isinstance(op, Map) else ()
        self.order = {id(c): k for k, c in enumerate(vectors)}
        self.row_vecs = frozenset(k for k, c in enumerate(vectors) if c.axis == VecAxis.ROW)  # one value per row
        self.lazy = isinstance(op, Map) and not integer and _runs_as_written(op.expr, self.by_row)
        self.whole = tuple(j for j in range(ins) if j not in self.by_row)
        agreed = {c.width for c in cols(op.expr)} | set(self.by_row.values()) if isinstance(op, Map) else set()
        self.width = agreed.pop() if len(agreed) == 1 else 1 if not agreed else 0
        self.widths = tuple(1 if j in self.by_row else self.width for j in range(ins))
        # No row or column vector: a page may be laid out as any h × w rectangle of its tiles (`support.elementwise`
        # takes a read page's own), element by element the same.
        self.free = not self.by_row and not self.order
        # Pages and row vector pages alone, of one row width (softmax's maps): `support.elementwise`'s shortest path.
        self.plain = self.lazy and bool(self.width) and bool(self.whole) and not self.order and not self.free
        # Row vector pages alone, each a row of one tile, and nothing else (α, a mean): a row value computed later
        # (`rowpacks.row_map_later`), one value a row.
        self.row_map = (
            isinstance(op, Map)
            and not integer
            and ins > 0
            and not self.whole
            and not self.order
            and set(self.by_row.values()) == {1}
            and _known_ops(op.expr)
        )
        self.reuse: dict[int, tuple[object, Any]] = {}  # by kernel (id): the part of this op's expression it computes


def _runs_as_written(expr: Expr, by_row: dict[int, int]) -> bool:
    """Whether the table computes `expr` on whole pages without refusing it (`_known_ops`), its value a whole page (it
    reads a page element by element somewhere) and no page read both ways."""
    whole = {node.index for node in _nodes(expr) if isinstance(node, Arg)}
    return _known_ops(expr) and bool(whole) and not whole & set(by_row)


def _known_ops(expr: Expr) -> bool:
    """Whether the table computes `expr` without refusing it: every op known, of its arity and parameters, and every
    leaf a page, a row vector, a column vector or a constant."""
    for node in _nodes(expr):
        match node:
            case Apply(name, args, params):
                op = OPS.get(name)
                if op is None or len(args) != op.arity or len(params) != len(op.params):
                    return False
            case Arg() | RowArg() | Col() | Lit():
                pass
            case _:
                return False
    return True


def _nodes(expr: Expr) -> list[Expr]:
    """Every node of `expr`."""
    found, stack = [], [expr]
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, Apply):
            stack.extend(node.args)
    return found


Into = tuple[np.ndarray, dict[int, tuple[int, int]]]


def realise_maps(values: list[MapValue], into: Into | None = None) -> set[int]:
    """Compute every page of `values` not computed yet, and the elementwise pages they read first. `into` offers a
    float32 matrix and, by page (id), the tile (row, column) of its rectangle there, no two overlapping: a batch whose
    pages lie there as they are computed side by side and stacked is computed straight into it. The pages computed so
    (ids) are returned; each page's `result` is its rectangle there."""
    todo = list(dict.fromkeys([v for v in values if v.result is None]))  # (each once: pages hash by identity)
    inner, packs = [], []
    for v in todo:  # the pages and the packs they read that are not computed yet
        for x in v.ins:
            if x.__class__ is MapValue and x.result is None:
                inner.append(x)
            elif (x.__class__ is RowPack or x.__class__ is RowMap) and x.column is None:  # (a pack, a row map)
                packs.append(x)
    if inner:
        realise_maps(inner)
    placed: set[int] = set()
    if packs:  # the row vectors they read, a chunk at a time, each chunk's pages computed once it is
        from .rowpacks import realise_packs  # rowpacks.py realises the pages its packs reduce here

        waves = _Waves(todo, into, placed)
        realise_packs(packs, waves.ready)
        todo = waves.left()
    _realise_groups(todo, into, placed)
    return placed


def _realise_groups(todo: list[MapValue], into: Into | None, placed: set[int]) -> None:
    """The pages, by kernel and shape, in bands (`_bands`), computed a few runs at a time (`_runs`)."""
    for bands in _bands(todo):
        runs = _runs(bands)
        by_length: dict[int, list[list[MapValue]]] = defaultdict(list)
        for run in runs:
            by_length[len(run)].append(run)
        for length, same in by_length.items():
            v0 = same[0][0]
            per_run = v0.h * v0.tr * v0.width * v0.tc * length
            step = max(1, CHUNK_ELEMS // max(per_run, 1))
            for s0 in range(0, len(same), step):
                _realise_runs(same[s0 : s0 + step], into, placed)


class _Waves:
    """The pages of a `realise_maps` call that read packs not computed yet, each computed as soon as the last pack it
    reads is (`ready`, after each chunk of packs): while the pages those packs reduced are still computed, which a
    page may take a part of its value from (`reuse.py`), and before they are dropped."""

    def __init__(self, todo: list[MapValue], into: Into | None, placed: set[int]) -> None:
        self.into, self.placed = into, placed
        # The pages by the packs they wait for (a band's pages wait for the same ones): each such set, by pack (id),
        # with the count of its packs not computed yet.
        sets: dict[tuple[int, ...], list[MapValue]] = {}
        self.rest: list[MapValue] = []
        pages, before = self.rest, None
        for v in todo:
            if before is None or not _same_packs(v.ins, before.ins):  # (a band's pages follow one another: `_bands`)
                key = tuple([id(x) for x in v.ins if x.__class__ in ROW_PAGES and x.column is None])
                pages = sets.setdefault(key, []) if key else self.rest
            pages.append(v)
            before = v
        self.waiting: dict[int, list[list]] = defaultdict(list)  # by pack (id): [count, pages] of the sets it is in
        for key, pages in sets.items():
            entry = [len(set(key)), pages]
            for k in set(key):
                self.waiting[k].append(entry)

    def ready(self, packs: list[RowPack]) -> None:
        now: list[MapValue] = []
        for p in packs:
            for entry in self.waiting.pop(id(p), ()):
                entry[0] -= 1
                if not entry[0]:
                    now.extend([v for v in entry[1] if v.result is None])
        if now:
            _realise_groups(now, self.into, self.placed)

    def left(self) -> list[MapValue]:
        """The pages not computed yet: those that read no pack, and any whose packs were computed elsewhere."""
        left = {id(v): v for v in self.rest}
        for entries in self.waiting.values():
            for _, pages in entries:
                for v in pages:
                    if v.result is None:
                        left[id(v)] = v
        return list(left.values())


def _bands(todo: list[MapValue]) -> list[list[list[MapValue]]]:
    """The pages by kernel and shape, and among those in bands: pages that read the same row vector pages and row
    vectors' values (a band of rows), each band as made. The sites' engines interleave their pages, but an engine
    makes a band's pages one after another: each page is compared with the one before it, and only a page that
    starts another band is looked up by its keys."""
    groups: dict[tuple, dict[tuple, list[MapValue]]] = {}
    band: list[MapValue] = []
    before: MapValue | None = None
    for v in todo:
        if before is None or not _same_band(v, before):
            kernel = v.kernel
            bands = groups.setdefault((id(kernel), v.h, v.width, v.tr, v.tc, v.widths), {})
            band = bands.setdefault((*[id(v.ins[j]) for j in kernel.rows], *v.row_key), [])
        band.append(v)
        before = v
    return [list(bands.values()) for bands in groups.values()]


def _same_band(v: MapValue, u: MapValue) -> bool:
    """Whether page v belongs with page u: one kernel and shape, the same row vector pages and row vectors' values."""
    if v.kernel is not u.kernel or v.widths is not u.widths and v.widths != u.widths or v.row_key != u.row_key:
        return False
    if v.h != u.h or v.width != u.width or v.tr != u.tr or v.tc != u.tc:
        return False
    same = True
    for j in v.kernel.rows:  # (a loop, not all() of a generator: this runs once a page)
        same = same and v.ins[j] is u.ins[j]
    return same


def _same_packs(ins: list, other: list) -> bool:
    """Whether two pages read the same row packs and row maps in the same places (whatever else they read)."""
    if len(ins) != len(other):
        return False
    for x, y in zip(ins, other, strict=True):
        if x is not y and (
            x.__class__ is RowPack or y.__class__ is RowPack or x.__class__ is RowMap or y.__class__ is RowMap
        ):
            return False
    return True


def _runs(bands: list[list[MapValue]]) -> list[list[MapValue]]:
    """The bands of one kernel and shape in runs of at most CHUNK_ELEMS: in the order of the tensor tiles they read
    where they read some, else as made."""
    v0 = bands[0][0]
    most = max(1, CHUNK_ELEMS // max(v0.h * v0.tr * v0.width * v0.tc, 1))
    first = v0.kernel.whole[0]
    runs: list[list[MapValue]] = []
    for same in bands:
        if not _in_tensor_order(same, first):
            same.sort(key=lambda v: (id(v.ins[first].store), v.ins[first].at))
        runs.extend(same[s : s + most] for s in range(0, len(same), most))
    return runs


def _in_tensor_order(band: list[MapValue], j: int) -> bool:
    """Whether the band's pages are in the order they are laid side by side in: as made where some page j of them is
    no tensor's tiles, else the order of those tiles (one store, ascending: rows of pages, as read)."""
    x0 = band[0].ins[j]
    if x0.__class__ is not TileRefs:
        return True
    store, at, ordered = x0.store, x0.at, True
    for v in band:
        x = v.ins[j]
        if x.__class__ is not TileRefs:
            return True
        ordered = ordered and x.store is store and x.at >= at
        at = x.at
    return ordered


def _realise_runs(runs: list[list[MapValue]], into: Into | None = None, placed: set[int] | None = None) -> None:
    """One evaluation for runs of equal length: each run's pages side by side, the runs stacked — into the matrix
    `into` offers where the pages lie there so (their ids then added to `placed`)."""
    v0 = runs[0][0]
    kernel, h, tr, tc = v0.kernel, v0.h, v0.tr, v0.tc
    pages = []
    for j, w in enumerate(v0.widths):
        if j in kernel.by_row:
            pages.append(_stacked([page_matrix(run[0].ins[j], h, 1, tr, tc) for run in runs]))
        else:
            pages.append(_stacked_bands([[v.ins[j] for v in run] for run in runs], h, w, tr, tc))
    col_values = [_vector_values(runs, k, k in kernel.row_vecs) for k in range(len(v0.cols))]

    def col(c: Col) -> Any:
        return col_values[kernel.order[id(c)]]

    dest = _destination(runs, into) if into is not None else None
    expr = kernel.op.expr
    part = reused(kernel, runs) if kernel.by_row else None
    if part is not None:  # a part of the value that the pages a row pack reduced computed already
        expr, values = part
        pages.append(values)
    try:  # the pages as epilogue.start takes them: float32 (a tensor's own float32 memory is read, not copied)
        out = evaluate(expr, [np.asarray(m, np.float32) for m in pages], False, col, dest)
    except ElementwiseError as e:  # as epilogue.mapped says it (none expected: `_runs_as_written` checked the ops)
        raise EpilogueError(str(e)) from None
    out = np.asarray(out, np.float32)
    if dest is not None and placed is not None:
        placed.update(id(v) for run in runs for v in run)
    width = v0.width * tc
    at, step = out.__array_interface__["data"][0], out.strides[0]  # (where each band starts, for `rowpacks._follows`)
    for r, run in enumerate(runs):
        band = out if len(runs) == 1 else out[r]
        start = at + r * step
        for k, v in enumerate(run):
            v.result, v.band, v.slot, v.start = band[:, k * width : (k + 1) * width], band, k, start


def _destination(runs: list[list[MapValue]], into: Into) -> np.ndarray | None:
    """The part of `into`'s matrix that the runs' evaluation fills, shaped as it computes it — (rows, run columns),
    or (runs, rows, run columns) — where each run's pages lie side by side there, in order, and the runs one below
    the other (a view); else None."""
    mat, where = into
    v0 = runs[0][0]
    h, w = v0.h * v0.tr, v0.width * v0.tc
    corner = where.get(id(v0))
    if corner is None:
        return None
    r0, c0 = corner[0] * v0.tr, corner[1] * v0.tc
    for r, run in enumerate(runs):
        for k, v in enumerate(run):
            at = where.get(id(v))
            if at is None or at[0] * v0.tr != r0 + r * h or at[1] * v0.tc != c0 + k * w:
                return None
    span = len(runs[0]) * w
    if r0 + len(runs) * h > mat.shape[0] or c0 + span > mat.shape[1]:
        return None
    block = mat[r0 : r0 + len(runs) * h, c0 : c0 + span]
    view = block if len(runs) == 1 else block.reshape(len(runs), h, span)
    return view if np.may_share_memory(view, mat) else None


def _vector_values(runs: list[list[MapValue]], k: int, by_rows: bool) -> np.ndarray:
    """Broadcast vector k's values for the runs' band: a column vector's values of the run's pages joined, a row
    vector's (one value per row, the same for every page of a run: `_runs`) as a column, the runs stacked."""
    if by_rows:
        values = [run[0].cols[k] for run in runs]
        shape: tuple[int, ...] = (-1, 1) if len(runs) == 1 else (len(runs), -1, 1)
    else:
        values = [np.concatenate([v.cols[k] for v in run]) if len(run) > 1 else run[0].cols[k] for run in runs]
        shape = (1, -1) if len(runs) == 1 else (len(runs), 1, -1)
    return (values[0] if len(values) == 1 else np.stack(values)).reshape(shape)


def _stacked(mats: list[np.ndarray]) -> np.ndarray:
    return mats[0] if len(mats) == 1 else np.stack(mats)


def _stacked_bands(runs: list[list], h: int, w: int, tr: int, tc: int) -> np.ndarray:
    """Each run's pages side by side (`_band`), the runs stacked: where the runs are consecutive rows of pages of one
    tensor, over the same columns, a view of its memory."""
    corners = [_tensor_run(xs, h, w) for xs in runs]
    c0 = corners[0]
    if c0 is not None and len(runs) > 1:
        store, r0, col = c0
        if all(c is not None and c[0] is store and c[1] == r0 + k * h and c[2] == col for k, c in enumerate(corners)):
            span = len(runs[0]) * w * tc
            block = store.mat[r0 * tr : (r0 + len(runs) * h) * tr, col * tc : col * tc + span]
            return block.reshape(len(runs), h * tr, span)
    return _stacked([_band(xs, h, w, tr, tc, c) for xs, c in zip(runs, corners, strict=True)])


def _tensor_run(xs: list, h: int, w: int) -> tuple[Any, int, int] | None:
    """(store, tile row, tile column) of the first page when the pages are a tensor's tiles in one row of pages, each
    h × w tiles, one after another; else None."""
    first = xs[0]
    if not isinstance(first, TileRefs):
        return None
    for k, x in enumerate(xs):
        if x.__class__ is not TileRefs or x.store is not first.store or x.off is not first.off:
            return None
        if x.at != first.at + k * w:
            return None
    corner = first.store.rect(first.at, first.off, h, w)
    if corner is None or corner[1] + len(xs) * w > first.store.cols_t:
        return None
    return first.store, corner[0], corner[1]


def _band(xs: list, h: int, w: int, tr: int, tc: int, corner: tuple[Any, int, int] | None) -> np.ndarray:
    """Pages side by side, each h × w tiles: a slice of the tensor where they are its tiles in one row of pages
    (`corner`, from `_tensor_run`), else their matrices joined."""
    if corner is not None:
        store, r0, c0 = corner
        return store.mat[r0 * tr : (r0 + h) * tr, c0 * tc : (c0 + len(xs) * w) * tc]
    first = xs[0]
    if first.__class__ is MapValue and (first.h, first.width) == (h, w) and len(xs) > 1:
        first.matrix()  # computed (with its band) if it was not
        band, slot = first.band, first.slot
        if band is not None and all(
            x.__class__ is MapValue and x.band is band and x.slot == slot + k for k, x in enumerate(xs)
        ):  # pages computed side by side, in this order (a chained map reads its first map's so): their band
            return band[:, slot * w * tc : (slot + len(xs)) * w * tc]
    mats = [page_matrix(x, h, w, tr, tc) for x in xs]
    return mats[0] if len(mats) == 1 else np.concatenate(mats, axis=1)

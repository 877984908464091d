"""Column accumulators (`ColReduce`): the pages a band's reduction is given, and their pack as a column vector.

A ColReduce keeps its page (its values never change: values.py) with the rows it keeps — those above the column's
logical height `rows`, the padding below left out. A pack reduces every page given since the accumulator was acquired
at once, down each column (`numerics.reductions.reduce_cols`: a sum exactly rounded whatever the order of the pages, a
max exact), and lays the values out as a column vector: a page of `width` tiles, each column's value in every row.
"""

from __future__ import annotations

import numpy as np

from ..ir.ops import ColReduce
from ..numerics.reductions import reduce_cols, reduction_named
from .errors import AddressError
from .mapped import realise_maps
from .pages import MapValue, page_matrix
from .state import Acc, EngineState
from .values import Tiles


def col_reduce(E: EngineState, i: int, x: object, acc: Acc, op: ColReduce, at: int) -> None:
    """A column reduction: the front page `x` (rows of `op.width` tiles, its first at tile row `at`) kept in `acc`,
    its rows at or past the column's `op.rows` values left out; `packed_cols` reduces them."""
    from .support import fail, where

    if not acc.live:
        fail(E, i, f"{acc.name} is not acquired")
    if acc.a or acc.parts or acc.rows:
        fail(E, i, f"{acc.name} holds other values; a column reduction needs an accumulator of its own")
    t = E.m.p.tile
    n = x.count  # type: ignore[attr-defined]
    if n % op.width or op.width > acc.tiles:
        fail(E, i, f"a page of {n} tiles is not whole rows of {op.width} tiles, one accumulator tile a column tile")
    if acc.col_op is not None and acc.col_op != op.op:
        fail(E, i, f"{acc.name} holds a column {acc.col_op}, not a column {op.op}")
    if acc.columns and acc.columns[0][2] != op.width:
        fail(E, i, f"{acc.name} holds columns of {acc.columns[0][2]} tiles, not this page's {op.width}")
    if at < 0:
        raise AddressError(f"{where(E, i)}: a column reduction at tile row {at}")
    h = n // op.width
    keep = max(0, min(h * t.rows, op.rows - at * t.rows))
    acc.col_op = op.op
    acc.columns.append((x, h, op.width, keep))


def packed_cols(E: EngineState, i: int, acc: Acc, n: int, accumulate: bool) -> Tiles:
    """PackAcc of a column accumulator: each column's reduction over the rows of every page it was given, as a
    column vector of n tiles — tile c the values of the columns of tile column c, in every row, a float program's
    rounded to float32. An accumulator given nothing packs its reduction's identity."""
    from .support import fail

    if accumulate:
        fail(E, i, "an accumulating pack of a column accumulator")
    t = E.m.p.tile
    name = acc.col_op or "sum"
    integer = E.m.p.precision.value == "int8"
    if acc.columns:
        width = acc.columns[0][2]
        if n != width:
            fail(E, i, f"packs {n} tiles of a column accumulator of {width} tile columns")
        realise_maps([x for x, *_ in acc.columns if isinstance(x, MapValue)])
        mats = [page_matrix(x, h, w, t.rows, t.cols)[:keep] for x, h, w, keep in acc.columns]
        row = np.asarray(reduce_cols(name, np.concatenate(mats, axis=0), integer), np.float64)
    else:
        row = np.full((1, n * t.cols), reduction_named(name).identity)
    values = row if integer else np.asarray(np.asarray(row, np.float32), np.float64)
    tiles = np.broadcast_to(values.reshape(n, 1, t.cols), (n, t.rows, t.cols)).copy()
    return Tiles(tiles)

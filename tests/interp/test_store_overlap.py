"""A store's check that its pending writes cover no tile twice (`values.Store._overlap`), which decides whether the
computed bands are written in any order (the output's fast path) or one write after another: counted the way the
slice updates of a cover array it replaced counted them (a rectangle past the grid's last row covers nothing of it)."""

from __future__ import annotations

from spatialc.interp.values import Store
from spatialc.ir.ids import TensorId
from spatialc.ir.nodes import DType, Tensor, TensorRole


def store(rows_t: int = 4, cols_t: int = 6) -> Store:
    t = Tensor(TensorId(0), "c", TensorRole.OUTPUT, (16 * rows_t, 16 * cols_t), (rows_t, cols_t), DType.FLOAT32)
    return Store(t, 16, 16, True)


def test_rectangles_side_by_side_do_not_overlap_and_one_tile_shared_does():
    s = store()
    pages = {(1, 2): [(0, 0), (0, 2), (0, 4), (1, 0)], (2, 1): [(2, 5)]}
    assert not s._overlap(pages)
    assert s._overlap({**pages, (1, 1): [(3, 5)]})  # tile (3, 5) is the 2 × 1 rectangle's at (2, 5) too
    assert s._overlap({(1, 2): [(0, 0), (0, 1)]})  # the same shape, one tile in common
    assert not s._overlap({}) and not s._overlap({(1, 1): [(3, 5)]})


def test_a_rectangle_past_the_last_row_covers_nothing_of_the_grid():
    s = store()
    assert not s._overlap({(2, 1): [(3, 0), (4, 0)]})  # row 4 is past the grid's 4 rows: as a slice, nothing
    assert s._overlap({(2, 1): [(2, 0), (3, 0)]})

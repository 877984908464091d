"""The mask op and positions (`Pos`) in the elementwise table's evaluation and bounds, and in the interpreter's
pages: an element's row or column in its head, as a value."""

from __future__ import annotations

import numpy as np
import pytest

from spatialc.interp.support import position_values
from spatialc.ir.ops import Apply, Arg, Lit, Pos, TileAddr, VecAxis
from spatialc.numerics import elementwise as E
from spatialc.numerics import intervals

ROW, COL = Pos(VecAxis.ROW, TileAddr(0), 2), Pos(VecAxis.COL, TileAddr(0), 2)
CAUSAL = Apply("mask", (Apply("le", (COL, ROW)), Arg(0)))  # keep column ≤ row


def places(c):
    return {ROW: np.arange(4.0).reshape(-1, 1), COL: np.arange(3.0).reshape(1, -1)}[c]


def test_mask_keeps_what_the_condition_holds_and_is_minus_infinity_elsewhere():
    x = np.full((4, 3), 2.5, np.float32)
    out = E.evaluate(CAUSAL, [x], False, places)
    assert out.dtype == np.float32
    assert np.array_equal(out, np.where(np.arange(3)[None, :] <= np.arange(4)[:, None], 2.5, -np.inf))


def test_a_position_needs_its_values():
    with pytest.raises(E.ElementwiseError, match="an element's position"):
        E.evaluate(CAUSAL, [np.zeros((4, 3), np.float32)], False)


def test_a_surely_masked_score_is_exact_and_a_kept_one_carries_its_error():
    x, err = np.full((4, 3), 2.5), np.full((4, 3), 1e-3)
    value, bound = intervals.bounded(CAUSAL, [(x, err)], places)
    kept = np.arange(3)[None, :] <= np.arange(4)[:, None]
    assert np.all(value[~kept] == -np.inf) and np.all(bound[~kept] == 0)
    assert np.all(bound[kept] >= 1e-3) and np.all(np.isfinite(bound[kept]))


def test_a_pages_positions_are_its_elements_rows_and_columns():
    """A page of 2 × 3 tiles of 16 × 16 whose first tile row is 5 and first tile column 6."""
    rows = position_values(Pos(VecAxis.ROW, TileAddr(0), 3), 5, 2, 16, 16)
    cols = position_values(Pos(VecAxis.COL, TileAddr(0), 3), 6, 2, 16, 16)
    assert rows.tolist() == list(range(80, 112)) and cols.tolist() == list(range(96, 144))


def test_a_literal_and_a_position_compare_as_float32_values():
    out = E.evaluate(Apply("lt", (COL, Lit(2.0))), [np.zeros((1, 3), np.float32)], False, places)
    assert out.tolist() == [[1.0, 1.0, 0.0]]

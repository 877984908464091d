"""An elementwise program that reads a row vector (`ew.row`, one value per row), printed in the general form and run
through the host emulation: equal to the interpreter bit for bit, and a row vector read at the wrong row in the
printed text caught."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import spatialc
from spatialc import ew

from .test_general_maps import inputs

GXX = shutil.which("g++")


@pytest.mark.emulation
@pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")
def test_a_row_vector_map_emulates_as_the_interpreter_and_a_wrong_row_is_caught():
    """Odd sizes (the vector padded to whole blocks of rows), several items a site (item_y > 0: the vector read at
    an offset), a column vector beside it. The fault reads the row vector by the element's column in its tile."""
    x, g = ew.inputs(2)
    expr = ew.max(x * ew.row("scale"), g) + ew.col("bias") - ew.row("shift")
    p = spatialc.build(spatialc.elementwise(expr, 45, 40, "bf16"), "sm_90", block=(2, 1, 1), sites=3)
    art = spatialc.lower(p)
    vals = inputs(p)
    rng = np.random.default_rng(1)
    for t in p.tensors:  # a row vector: one value per row, all distinct
        if t.elems[1] == 1:
            vals[t.name] = (rng.standard_normal(t.elems[0]) * 4).astype(np.float32)
    want = spatialc.evaluate(p, vals)
    assert np.array_equal(spatialc.emulate(art, vals), want)

    old = " * 256 + (el / 16) * 16]"
    assert art.program_cu.count(old) == 2  # the two row vectors' reads
    wrong = dataclasses.replace(art, program_cu=art.program_cu.replace(old, " * 256 + (el % 16) * 16]"))
    assert not np.array_equal(spatialc.emulate(wrong, vals), want)

"""Row vectors in the embedded language: `ew.row(name)` in a `p.map`, placed by `e.map(…, row=…)` at the item's tile
row; the traced program is the one `spatialc.elementwise` builds, rule 8 refuses a row vector placed at the wrong row
at the user's line, and `show --python` prints it back as `ew.row`."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc import ew, lang
from spatialc.errors import SpatialError
from spatialc.lang.source import python_source

from .test_lang import line_of

HERE = Path(__file__)


@lang.program(target="sm_90", precision="bf16", name="elementwise_40x96_bf16")
def scaled(p: lang.Builder, ill: str = ""):
    """out = x · scale[row] + bias[col] over 40 × 96 values, items of 1 × 2 tiles on two sites."""
    x = p.input("x0", 40, 96)
    scale = p.parameter("scale", 40, 1) if ill != "shape" else p.parameter("scale", 1, 40)
    p.parameter("bias", 1, 96)
    out = p.output("out", 40, 96)
    x_ring = p.ring("x0_ring", depth=2, tiles=2)
    out_ring = p.ring("out_ring", depth=2, tiles=2, kind="interm")
    p.read("read_x0", x, x_ring)
    m = p.map("map", lambda v: v * ew.row("scale") + ew.col("bias"), x_ring, out_ring)  # the map
    p.write("write_out", out_ring, out)
    p.plan(block=(1, 2, 1), grid=(3, 3), k_tiles=1, depth=2)
    p.place([[0, 1, 2, 3, 4], [5, 6, 7, 8]], kind="contiguous")
    assert scale is not None

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            with x_ring.reserve() as page:
                page.read(x, 6 * item.y + 2 * item.x, 1, 2)

    @p.compute
    def compute(e: lang.Engine):
        for item in e.items():
            a = x_ring.wait()
            with out_ring.reserve() as page:
                e.map(m, a, page, at=2 * item.x, width=2, row=item.x if ill == "row" else item.y)  # the e.map
            a.pop()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with out_ring.wait() as page:
                page.write(out, 6 * item.y + 2 * item.x, 1, 2)


def built() -> spatialc.SpatialProgram:
    x = ew.x(0)
    expr = x * ew.row("scale") + ew.col("bias")
    return spatialc.build(spatialc.elementwise(expr, 40, 96), "sm_90", block=(1, 2, 1), sites=2)


def test_a_row_vector_written_by_hand_is_the_built_one_and_numpys():
    traced = scaled()
    assert traced.verified and traced == built()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 96)).astype(ml_dtypes.bfloat16)  # already bf16 values
    s, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    c = spatialc.evaluate(traced, {"x0": x, "scale": s, "bias": b})
    scaled_rows = (x.astype(np.float64) * s[:, None]).astype(np.float32)  # each op rounded once to float32
    assert np.array_equal(c, (scaled_rows.astype(np.float64) + b).astype(np.float32))


def test_a_row_vector_at_the_wrong_row_is_refused_at_the_users_line():
    with pytest.raises(SpatialError) as caught:
        scaled(ill="row")
    line = line_of(HERE, "# the e.map", after="def scaled")
    assert f"{HERE}:{line}: site 0 compute:" in str(caught.value) and "not its own row" in str(caught.value)


def test_ew_row_of_a_tensor_of_one_row_is_refused_at_the_users_line():
    with pytest.raises(lang.LangError) as caught:
        scaled.trace(ill="shape")  # type: ignore[attr-defined]
    line = line_of(HERE, "# the map", after="def scaled")
    assert (caught.value.file, caught.value.line) == (str(HERE), line), str(caught.value)
    assert "ew.row('scale') is a parameter tensor of one column (p.parameter), not parameter tensor" in str(
        caught.value
    )


@pytest.mark.parametrize("kw", [{"block": (1, 2, 1), "sites": 2}, {"block": (2, 2, 1), "sites": 3}, {}])
def test_show_python_prints_row_vectors_as_ew_row_and_traces_back(kw):
    x, g = ew.inputs(2)
    p = spatialc.build(spatialc.elementwise((x - g) * ew.row("s") + ew.col("bias"), 40, 40), "sm_90", **kw)
    src = python_source(p)
    assert 'ew.row("s")' in src and "e.map(" in src and "Col(" not in src
    scope: dict = {}
    exec(compile(src, "<shown>", "exec"), scope)  # noqa: S102 (the printer's own text)
    assert scope["program"]() == p

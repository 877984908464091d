"""Elementwise programs that read a row vector (issue 31): `ew.row(name)`, a parameter tensor of m values, one per
row (a per-token scale). The planner addresses it from the item's row position as a column vector from its column
position; rule 8 proves each element reads it at its own row and refuses a schedule that reads it at another row or
along the column axis; the interpreter equals the reference and numpy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.errors import ProgramError, VerifyError
from spatialc.ir.ids import LV_ITEM_X
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import Col, Compute, Map, TileAddr, VecAxis, cols, with_cols
from spatialc.passes.verify import verify

from ..rewrite import replace
from .test_maps import exact, inputs_for

C = Engine.COMPUTE
x, g = ew.inputs(2)

PROGRAMS = {
    "per-token scale, bf16": (x * ew.row("scale"), "bf16", 100, 72, {}),
    "row and column vectors and two inputs, fp16": (
        (x - g) * ew.row("s") + ew.col("bias"),
        "fp16",
        70,
        90,
        {"block": (2, 2, 1), "sites": 3},
    ),
    "a row vector twice in a formula, bf16": (ew.exp(x - ew.row("m")) / ew.row("m"), "bf16", 33, 20, {}),
    "int8 row offset and column scale": (x * ew.col("c") + ew.row("r"), "int8", 45, 40, {"block": (2, 1, 1)}),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_map_with_a_row_vector_verifies_and_the_interpreter_equals_the_reference(name):
    expr, prec, m, n, kw = PROGRAMS[name]
    p = spatialc.build(spatialc.elementwise(expr, m, n, prec), "sm_90", **kw)
    assert p.verified
    rows = [t for t in p.tensors if t.name in ("scale", "s", "m", "r")]
    assert rows and all(t.elems == (m, 1) and t.tiles == (p.plan.grid[0] * p.plan.item_tiles[0], 1) for t in rows)
    exact(p)
    exact(p, seed=1)
    back = spatialc.from_json(spatialc.to_json(p))
    assert back == p and back.verified


def test_the_row_vector_scales_each_row_as_numpy_does():
    p = spatialc.build(spatialc.elementwise(x * ew.row("scale") + g, 40, 56, "fp16"), "sm_90", block=(1, 2, 1))
    vals = inputs_for(p)
    assert vals["scale"].shape == (40, 1)
    half = {k: vals[k].astype(np.float16).astype(np.float64) for k in ("x0", "x1")}
    product = (half["x0"] * vals["scale"].astype(np.float32)).astype(np.float32)  # each op rounded once to float32
    want = (product.astype(np.float64) + half["x1"]).astype(np.float32)
    c = spatialc.evaluate(p, vals)
    assert np.array_equal(c, want)
    assert np.array_equal(spatialc.evaluate(p, {**vals, "scale": vals["scale"].reshape(-1)}), c)  # or m values


def test_a_name_read_as_both_a_row_and_a_column_vector_is_refused():
    with pytest.raises(ProgramError, match="read both as a column vector"):
        spatialc.elementwise(x * ew.row("s") + ew.col("s"), 16, 16)
    with pytest.raises(ProgramError, match="need names of their own"):
        spatialc.elementwise(x * ew.row("x0"), 16, 16)
    with pytest.raises(ProgramError, match="a row vector is named by an identifier"):
        ew.row("no name")


# ---- rule 8 against an attacker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scaled() -> spatialc.SpatialProgram:
    """out = (x0 − x1) · s[row] + bias[col] over 2x2-tile items on 3 sites (an ITEM loop)."""
    expr, prec, m, n, kw = PROGRAMS["row and column vectors and two inputs, fp16"]
    return spatialc.build(spatialc.elementwise(expr, m, n, prec), "sm_90", **kw)


def _rows_replaced(p, f):
    """`p` with f applied to each row vector its map reads."""

    def edit(op):
        if isinstance(op, Compute) and isinstance(op.op, Map):
            expr = with_cols(op.op.expr, lambda c: f(c) if c.axis == VecAxis.ROW else c)
            return (dataclasses.replace(op, op=Map(expr)),)
        return None

    return replace(p, C, edit)


FAULTS = [
    (
        "read at the item's column position",
        lambda c: dataclasses.replace(c, at=TileAddr(0, ((LV_ITEM_X, 2),))),
        ["gets row vector tile row", "not its own row"],
    ),
    ("read at the first row of every item", lambda c: dataclasses.replace(c, at=TileAddr(0)), ["not its own row"]),
    (
        "read along the column axis",
        lambda c: Col(c.tensor, TileAddr(0, ((LV_ITEM_X, 2),)), c.width, VecAxis.COL),
        ["a column vector (a bias) is a parameter tensor of one row", "s is a parameter tensor of 70x1"],
    ),
]


@pytest.mark.parametrize(("name", "f", "words"), FAULTS, ids=[f[0] for f in FAULTS])
def test_rule_8_refuses_a_row_vector_read_anywhere_but_its_own_row(scaled, name, f, words):
    with pytest.raises(VerifyError) as info:
        verify(_rows_replaced(scaled, f))
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    assert "\n" not in str(info.value)


def test_a_row_vector_read_at_the_wrong_row_computes_something_else(scaled):
    """The faults are wrong, not only unproven: run unverified, the row vector read at each item's first row gives
    another result."""
    fault = _rows_replaced(scaled, FAULTS[1][1])
    assert any(c.at == TileAddr(0) for s in fault.schedule.programs for c in _row_vectors(s.ops))
    vals = inputs_for(scaled)
    bad = spatialc.evaluate(dataclasses.replace(fault, verified=True), vals)
    assert not np.array_equal(bad, spatialc.evaluate(scaled, vals))


def _row_vectors(ops):
    from spatialc.ir.ops import walk

    for op in walk(ops):
        if isinstance(op, Compute) and isinstance(op.op, Map):
            yield from (c for c in cols(op.op.expr) if c.axis == VecAxis.ROW)


# ---- a row program's map reading a row vector --------------------------------------------------------------------


def _rmsnorm_by_row(m: int, n: int) -> spatialc.SpatialProgram:
    """RMSNorm with its weight one value per row (an m × 1 tensor read by `Col` along ROW) instead of per column."""
    from spatialc.ir.nodes import ComputeStage

    p = spatialc.rmsnorm(m, n)
    w = p.tensor_named("weight").id
    tensors = tuple(dataclasses.replace(t, elems=(m, 1), tiles=(-(-m // 16), 1)) if t.id == w else t for t in p.tensors)

    def by_row(c):
        return dataclasses.replace(c, axis=VecAxis.ROW)

    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(Map(with_cols(s.kind.op.expr, by_row))))
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map)
        else s
        for s in p.stages
    )
    return p.evolve(tensors=tensors, stages=stages)


@pytest.mark.parametrize("kw", [{}, {"block": (2, 2, 1), "sites": 2}])
def test_a_row_programs_map_reads_a_row_vector_at_its_band(kw):
    """The rows planner addresses it from the band's first row; the interpreter, numpy and the tolerance agree; rule 8
    refuses it read at the first band's rows everywhere."""
    import ml_dtypes

    p = spatialc.build(_rmsnorm_by_row(40, 70), "sm_90", **kw)
    rng = np.random.default_rng(0)
    vals = {"x": rng.standard_normal((40, 70)).astype(np.float32), "weight": rng.standard_normal(40).astype(np.float32)}
    c = spatialc.evaluate(p, vals)
    xb = vals["x"].astype(ml_dtypes.bfloat16).astype(np.float64)
    want = xb / np.sqrt((xb * xb).mean(axis=1, keepdims=True) + 1e-6) * vals["weight"][:, None]
    np.testing.assert_allclose(c, want, rtol=2e-6, atol=1e-7)
    ok, how = spatialc.tolerance(p).check(c, vals)
    assert ok, how
    with pytest.raises(VerifyError, match="not its own row"):
        verify(_rows_replaced(p, lambda v: dataclasses.replace(v, at=TileAddr(0))))

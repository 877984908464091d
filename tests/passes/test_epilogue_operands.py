"""GEMM epilogues that read more than C's value (issue 31): row and column scale vectors, a residual or a gate tensor.

The interpreter equals the numpy reference on them; verify's rule 8 states C = epi(Σ A·B, R) and refuses a schedule
that reads the residual at another tile, a row vector along the column axis or at another row, or a binary op's
operands in the other order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spatialc
from spatialc.errors import ProgramError, VerifyError
from spatialc.ir.ids import LV_ITEM_X
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import (
    Apply,
    Col,
    Compute,
    Loop,
    Map,
    Pop,
    Push,
    ReadTiles,
    TileAddr,
    VecAxis,
    Wait,
    cols,
    with_cols,
)
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from ..rewrite import replace

R, C = Engine.READER, Engine.COMPUTE


def _inputs(p, seed: int = 0) -> dict[str, np.ndarray]:
    """Small integers: every product, sum and epilogue op is exact in float32 too."""
    rng = np.random.default_rng(seed)
    out = {t.name: rng.integers(-3, 4, t.elems).astype(np.float32) for t in p.tensors if t.role.value == "input"}
    for t in p.tensors:
        if t.role.value == "parameter":  # a scale vector as its m or n values
            out[t.name] = rng.integers(-3, 4, t.elems[0] * t.elems[1]).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def fused() -> spatialc.SpatialProgram:
    """A bf16 GEMM whose epilogue reads a row scale, a column scale, a residual and a gate: 2x2-tile items on 3 sites
    (ITEM loops), the scales and tensors padded to whole blocks."""
    epi = [spatialc.row_scale(), spatialc.col_scale(), spatialc.residual(), spatialc.relu(), spatialc.gate()]
    return spatialc.build(spatialc.gemm(70, 50, 40, "bf16", epilogue=epi), "sm_80", block=(2, 2, 1), sites=3)


def test_the_interpreter_equals_the_reference_and_numpy(fused):
    x = _inputs(fused)
    c = spatialc.evaluate(fused, x)
    y = np.maximum((x["A"] @ x["B"]) * x["row_scale"][:, None] * x["col_scale"][None, :] + x["residual"], 0) * x["gate"]
    np.testing.assert_array_equal(c, y)
    np.testing.assert_array_equal(reference(fused, x), c)
    assert spatialc.tolerance(fused).check(c, x)[0]


def test_an_int8_gemm_with_a_row_scale_and_a_residual_is_exact():
    epi = [spatialc.row_scale("s"), spatialc.residual("r"), spatialc.scalar("add", 3)]
    p = spatialc.build(spatialc.gemm(40, 33, 50, "int8", epilogue=epi), "sm_86", block=(1, 1, 1), sites=4)
    rng = np.random.default_rng(1)
    x = {
        "A": rng.integers(-128, 128, (40, 50)),
        "B": rng.integers(-128, 128, (50, 33)),
        "s": rng.integers(-(2**31), 2**31, 40),
        "r": rng.integers(-128, 128, (40, 33)),
    }
    c = spatialc.evaluate(p, x)
    want = (x["A"] @ x["B"]) * x["s"][:, None] + x["r"] + 3
    np.testing.assert_array_equal(c, want)
    assert c.dtype == np.int64
    np.testing.assert_array_equal(reference(p, x), want)


def test_pages_read_beside_the_chain_are_popped_after_its_last_push(fused):
    """The compute engine waits for the residual's and the gate's pages at their stages and frees them once the
    chain's last page is pushed: a form applying the whole chain where that page is stored (the sm_90a form's fused
    store) still owns them there."""
    beside = {b for s in fused.stages if s.name in ("read_residual", "read_gate") for b in s.outs}
    last = next(s.ins[0] for s in fused.stages if s.name == "write_C")  # the chain's last page, which C is written from
    for prog in fused.schedule.programs:
        if prog.engine != C:
            continue
        body = prog.ops[-1].body if isinstance(prog.ops[-1], Loop) else prog.ops
        pushed = max(i for i, op in enumerate(body) if isinstance(op, Push) and fused.buffer(op.buf).ring == last)
        pops = [i for i, op in enumerate(body) if isinstance(op, Pop) and fused.buffer(op.buf).ring in beside]
        waits = [i for i, op in enumerate(body) if isinstance(op, Wait) and fused.buffer(op.buf).ring in beside]
        assert len(pops) == len(waits) == 2 and max(waits) < pushed < min(pops), prog.ops


def test_a_row_scale_takes_m_values_or_an_m_by_1_array(fused):
    x = _inputs(fused)
    column = dict(x, row_scale=x["row_scale"].reshape(-1, 1))
    np.testing.assert_array_equal(spatialc.evaluate(fused, column), spatialc.evaluate(fused, x))
    with pytest.raises(spatialc.SpatialError, match="row_scale: expected 70 values, got 50"):
        spatialc.evaluate(fused, dict(x, row_scale=x["col_scale"]))


def test_the_program_round_trips_through_json(fused):
    text = spatialc.to_json(fused)
    assert '"axis": "row"' in text
    again = spatialc.from_json(text)
    assert again == fused and again.verified


def test_the_frontend_refuses_what_it_cannot_state():
    with pytest.raises(ProgramError, match="grouped GEMM's epilogue"):
        spatialc.grouped_gemm(2, 32, 32, 32, epilogue=[spatialc.residual()])
    with pytest.raises(ProgramError, match="share a tensor name"):
        spatialc.gemm(32, 32, 32, epilogue=[spatialc.residual("x"), spatialc.gate("X")])
    with pytest.raises(ProgramError, match="identifier name other than A, B, C"):
        spatialc.row_scale("c")
    with pytest.raises(ProgramError, match="not identifier-like"):  # taken here, refused by the IR at build
        spatialc.residual("bías")
    # two int32 scales of an int8 GEMM can leave int64: refused by rule 8's bounds, by name
    with pytest.raises(VerifyError, match="beyond"):
        spatialc.build(spatialc.gemm(32, 32, 32, epilogue=[spatialc.row_scale(), spatialc.col_scale()]), "sm_80")


# ---- rule 8 refuses planted faults ------------------------------------------------------------------------------


def _residual_read(p, f):
    rid = p.tensor_named("residual").id
    return replace(p, R, lambda op: (f(op),) if isinstance(op, ReadTiles) and op.tensor == rid else None)


def _stage_compute(p, which, f):
    """`p` with f applied to the compute engine's Compute of the stage named `which`."""
    stage = next(s for s in p.stages if s.name == which)
    return replace(p, C, lambda op: (f(op),) if isinstance(op, Compute) and op.outs == stage.outs else None)


def _vectors(op: Compute, f) -> Compute:
    return dataclasses.replace(op, op=Map(with_cols(op.op.expr, f)))


FAULTS = [
    (
        "the residual read at another tile (its column step dropped)",
        lambda p: _residual_read(p, lambda op: dataclasses.replace(op, at=TileAddr(0, op.at.steps[:1]))),
        ["maps residual tile", "not its own"],
    ),
    (
        "the residual's block read transposed (its strides swapped)",
        lambda p: _residual_read(p, lambda op: dataclasses.replace(op, stride_h=op.stride_w, stride_w=op.stride_h)),
        ["maps residual tile", "not its own"],
    ),
    (
        "the row scale read along the column axis",
        lambda p: _stage_compute(
            p,
            "row_scale0",
            lambda op: _vectors(op, lambda c: Col(c.tensor, TileAddr(0, ((LV_ITEM_X, 2),)), c.width, VecAxis.COL)),
        ),
        # refused by rule 1 before rule 8: a column vector is a tensor of one row, and row_scale is one column
        ["a column vector (a bias) is a parameter tensor of one row", "row_scale is a parameter tensor of 70x1"],
    ),
    (
        "the row scale read at the item's column position",
        lambda p: _stage_compute(
            p,
            "row_scale0",
            lambda op: _vectors(op, lambda c: dataclasses.replace(c, at=TileAddr(0, ((LV_ITEM_X, 2),)))),
        ),
        ["gets row vector tile row", "not its own row"],
    ),
    (
        "the row scale read at the first row of every item",
        lambda p: _stage_compute(
            p, "row_scale0", lambda op: _vectors(op, lambda c: dataclasses.replace(c, at=TileAddr(0)))
        ),
        ["gets row vector tile row 0, not its own row 2"],
    ),
    (
        "the column scale read at the first column of every item",
        lambda p: _stage_compute(
            p, "col_scale1", lambda op: _vectors(op, lambda c: dataclasses.replace(c, at=TileAddr(0)))
        ),
        ["gets bias tile column 0, not its own column 2"],
    ),
    (
        "the residual stage's pages swapped",
        lambda p: _stage_compute(p, "residual2", lambda op: dataclasses.replace(op, ins=op.ins[::-1])),
        ["residual2"],
    ),
    (
        "the gate's operands swapped in its formula",
        lambda p: _stage_compute(
            p,
            "gate4",
            lambda op: dataclasses.replace(op, op=Map(Apply("mul", op.op.expr.args[::-1]))),
        ),
        ["(x1 * x0) where stage gate4 declares (x0 * x1)"],
    ),
]


@pytest.mark.parametrize(("name", "change", "words"), FAULTS, ids=[f[0] for f in FAULTS])
def test_rule_8_refuses_a_planted_fault(fused, name, change, words):
    with pytest.raises(VerifyError) as info:
        verify(change(fused))
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    assert "\n" not in str(info.value)


def test_a_fault_rule_8_refuses_would_compute_something_else(fused):
    """The planted faults are wrong, not only unproven: run unverified, the row scale read at each item's first
    row gives another C."""
    x = _inputs(fused)
    fault = FAULTS[4][1](fused)
    assert all(c.at == TileAddr(0) for s in [fault] for op in _maps(s) for c in cols(op.expr) if c.axis == "row")
    bad = spatialc.evaluate(dataclasses.replace(fault, verified=True), x)
    assert not np.array_equal(bad, spatialc.evaluate(fused, x))


def _maps(p):
    from spatialc.ir.ops import walk

    for prog in p.schedule.programs:
        for op in walk(prog.ops):
            if isinstance(op, Compute) and isinstance(op.op, Map):
                yield op.op


def test_a_version_8_document_reads_its_vectors_as_column_vectors():
    """Documents before version 9 have no `axis`: each Col is a column vector (a bias), as it always was."""
    import json

    p = spatialc.build(spatialc.gemm(40, 40, 32, "int8", epilogue=[spatialc.bias()]), "sm_80")
    doc = json.loads(spatialc.to_json(p))
    text = json.dumps({**doc, "version": 8}).replace(', "axis": "col"', "")
    assert '"axis"' not in text
    assert spatialc.from_json(text) == p


def test_show_python_prints_the_program_as_source_that_traces_back_to_it(fused):
    from spatialc.lang.source import python_source

    scope: dict[str, object] = {}
    exec(compile(python_source(fused), "<fused>", "exec"), scope)
    assert scope["program"]() == fused  # type: ignore[operator]


@pytest.mark.parametrize(
    ("name", "options"),
    [("split-K", {"split_k": 4}), ("multicast", {"multicast": (1, 2), "block": (2, 4, 4)})],
)
def test_a_residual_beside_split_k_and_multicast(name, options):
    """Split-K's owner reads the residual (a contributor, which runs no epilogue, reads none); a multicast group
    shares A and B pages, each site reading its own block of the residual."""
    epi = [spatialc.row_scale(), spatialc.residual(), spatialc.gate()]
    m, n, k = (32, 64, 2048) if name == "split-K" else (64, 256, 128)
    p = spatialc.build(spatialc.gemm(m, n, k, "bf16", epilogue=epi), "sm_90", **options)
    x = _inputs(p)
    c = spatialc.evaluate(p, x)
    np.testing.assert_array_equal(c, (x["A"] @ x["B"] * x["row_scale"][:, None] + x["residual"]) * x["gate"])


def test_the_example_runs(capsys):
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).parents[2] / "examples" / "fused_epilogue.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "verified; OK" in out and "CUDA: the persistent form" in out

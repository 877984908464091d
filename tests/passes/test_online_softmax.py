"""The online softmax (`spatialc.softmax(…, online=True)`): two passes over each row, its max and sum of exp kept
running in the first (`passes/rows.py`'s `online`), proved by rule 8 against the running step of
`verify/recurrence.py` (`verify/online.py`), and refused where a mutation breaks the step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spatialc
from spatialc.errors import VerifyError
from spatialc.ir.nodes import Engine, SpatialProgram
from spatialc.ir.ops import Compute, Loop, Map, PackAcc, Pop, ReadTiles, RowReduce, ScaleAcc, walk, with_row_args
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from ..rewrite import edit, map_ops
from .test_rows import DTYPES, inputs_for, numpy_softmax, run

C = Engine.COMPUTE


def reads_a_band(p: SpatialProgram) -> int:
    """How many times the reader reads each page of a band (ReadTiles ops in its per-band body)."""
    reader = next(q for q in p.schedule.programs if q.engine == Engine.READER)
    return sum(isinstance(op, ReadTiles) for op in walk(reader.ops))


@pytest.mark.parametrize("m, n, opts", [(40, 200, {"block": (1, 4, 1), "sites": 2}), (33, 50, {}), (100, 1000, {})])
@pytest.mark.parametrize("prec", ["bf16", "fp16"])
def test_the_online_softmax_reads_each_page_twice_and_equals_the_reference_within_its_tolerance(m, n, opts, prec):
    on = spatialc.build(spatialc.softmax(m, n, prec, online=True), "sm_90", **opts)
    old = spatialc.build(spatialc.softmax(m, n, prec), "sm_90", **opts)
    assert on.verified and (reads_a_band(on), reads_a_band(old)) == (2, 3)
    x = inputs_for(on)
    c = run(on, x)
    ok, how = spatialc.tolerance(on, kernel=True).check(c, x)
    assert ok, how
    assert np.abs(c - reference(on, x)).max() <= 1e-6 * np.abs(c).max()  # the rescaled sum: a few float32 ulps
    np.testing.assert_allclose(c, numpy_softmax(x["x"], DTYPES[prec]), rtol=1e-5, atol=1e-9)


def test_a_row_of_one_page_and_rows_that_leave_the_max_behind_agree_with_numpy():
    """The running max grows on later pages (ascending rows) and never does (descending): α is 1 or < 1."""
    p = spatialc.build(spatialc.softmax(32, 512, "bf16", online=True), "sm_90", block=(1, 2, 1))
    ramp = np.linspace(-8, 8, 512, dtype=np.float32)
    x = {"x": np.stack([ramp if r % 2 else ramp[::-1] for r in range(32)]).astype(np.float32)}
    np.testing.assert_allclose(run(p, x), numpy_softmax(x["x"], DTYPES["bf16"]), rtol=1e-5, atol=1e-12)


def test_a_row_whose_first_pages_are_all_minus_inf_is_its_softmax_not_nan():
    """A masked row: while the running max is −∞, α = exp(−∞ − (−∞)) was NaN and took the whole row with it, where
    the three passes give its softmax; α and P read the max floored at float32's lowest value, and are 0 there."""
    ramp = np.linspace(-2.0, 2.0, 64, dtype=np.float32)
    x = {"x": np.stack([np.where(np.arange(64) < 16 * r, -np.inf, ramp) for r in range(1, 4)]).astype(np.float32)}
    x["x"][2] = -np.inf  # a row of −∞ alone: 0 / 0, NaN, as the three passes and torch give it
    on = spatialc.build(spatialc.softmax(3, 64, "bf16", online=True), "sm_90", block=(1, 1, 1))
    three = spatialc.build(spatialc.softmax(3, 64, "bf16"), "sm_90", block=(1, 1, 1))
    c = run(on, x)
    assert np.isnan(c[2]).all() and np.isnan(run(three, x)[2]).all()
    np.testing.assert_allclose(c[:2], numpy_softmax(x["x"][:2], DTYPES["bf16"]), rtol=1e-5, atol=1e-12)
    ok, how = spatialc.tolerance(on).check(c, x)
    assert ok, how


@pytest.fixture(scope="module")
def on() -> SpatialProgram:
    return spatialc.build(spatialc.softmax(40, 200, "bf16", online=True), "sm_90", block=(1, 4, 1), sites=2)


def ring(p: SpatialProgram, name: str):
    return next(b.id for b in p.buffers if b.name == name)


def body_edit(p: SpatialProgram, f) -> SpatialProgram:
    """`p` with the online loop's body (the K loop that rescales) rewritten by f (a list of ops in, one out)."""

    def g(op):
        if isinstance(op, Loop) and any(isinstance(x, Compute) and isinstance(x.op, ScaleAcc) for x in op.body):
            return (dataclasses.replace(op, body=tuple(f(list(op.body)))),)
        return None

    return edit(p, C, lambda ops: map_ops(ops, g))


def refused(p: SpatialProgram, *words: str) -> None:
    with pytest.raises(VerifyError) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"


def _index(body, pred) -> int:
    return next(i for i, op in enumerate(body) if pred(op))


def test_the_unmutated_schedule_verifies(on):
    verify(on)  # (what every mutation below starts from)
    assert on.verified


def test_a_rescale_of_the_wrong_sign_is_refused(on):
    """α = exp(m_new − m_old) instead of exp(m_old − m_new)."""

    def f(body):
        i = _index(body, lambda op: isinstance(op, Compute) and op.outs == (ring(on, "alpha_ring"),))
        body[i] = dataclasses.replace(body[i], ins=body[i].ins[::-1])
        return body

    refused(body_edit(on, f), "one step of the running max and sum", "l′")


def test_p_of_the_old_max_is_refused(on):
    """P = exp(x − m_old): the new max is not used in both places."""
    m_old, m_new = ring(on, "m_old_ring"), ring(on, "m_new_ring")

    def f(body):
        i = _index(body, lambda op: isinstance(op, Compute) and op.outs == (ring(on, "exp_ring"),))
        body[i] = dataclasses.replace(body[i], ins=(body[i].ins[0], m_old))
        j = _index(body, lambda op: op == Pop(m_old))
        body.insert(i + 1, body.pop(j))  # m_old popped after P reads it
        return body

    refused(body_edit(on, f), "one step of the running max and sum")
    assert m_new != m_old


def test_a_page_summed_twice_is_refused(on):
    def f(body):
        i = _index(body, lambda op: isinstance(op, Compute) and isinstance(op.op, RowReduce) and op.op.op == "sum")
        body.insert(i, body[i])
        return body

    refused(body_edit(on, f), "one step of the running max and sum", "l′")


def test_a_max_taken_twice_of_a_page_is_refused(on):
    def f(body):
        i = _index(body, lambda op: isinstance(op, Compute) and isinstance(op.op, RowReduce) and op.op.op == "max")
        body.insert(i, body[i])
        return body

    refused(body_edit(on, f), "m′")


def test_a_sum_never_rescaled_is_refused(on):
    def f(body):
        return [op for op in body if not (isinstance(op, Compute) and isinstance(op.op, ScaleAcc))]

    # (without a ScaleAcc the loop is an ordinary pass, whose map reads a vector that is no reduction's)
    refused(body_edit(on, f))


def test_a_p_map_other_than_its_stages_is_refused(on):
    def f(body):
        i = _index(body, lambda op: isinstance(op, Compute) and op.outs == (ring(on, "exp_ring"),))
        op = body[i]
        body[i] = dataclasses.replace(op, op=Map(op.op.expr.args[0]))  # x − m, no exp
        return body

    refused(body_edit(on, f))


def test_a_pass_that_skips_its_last_page_is_refused(on):
    """Reader and compute both stop a page short: the rings balance, the step is right; the columns are not whole."""

    x0 = ring(on, "x0_ring")

    def shorter(op):
        if not isinstance(op, Loop):
            return None
        reads = any(isinstance(x, ReadTiles) and x.into == x0 for x in op.body)
        if reads or any(isinstance(x, Compute) and isinstance(x.op, ScaleAcc) for x in op.body):
            return (dataclasses.replace(op, count=dataclasses.replace(op.count, n=op.count.n - 1)),)
        return None

    p = edit(edit(on, Engine.READER, lambda ops: map_ops(ops, shorter)), C, lambda ops: map_ops(ops, shorter))
    refused(p, "tile columns 0..11", "each exactly once")


def test_the_cli_builds_the_online_softmax_and_show_prints_it_as_lang_source_that_traces_back(capsys, tmp_path):
    import runpy

    from spatialc.cli import main

    saved = tmp_path / "online.json"
    assert main(["softmax", "40", "200", "--online", "--json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "softmax over 40x200 bf16, online" in out and "check     interpreter vs numpy reference: OK" in out
    assert main(["show", str(saved), "--python"]) == 0
    source = tmp_path / "online.py"
    source.write_text(capsys.readouterr().out)
    traced = runpy.run_path(str(source))["program"]()
    p = spatialc.from_json(saved.read_text())
    assert (traced.stages, traced.buffers, traced.schedule) == (p.stages, p.buffers, p.schedule)
    verify(traced)


def test_a_map_or_pack_of_the_pass_in_another_shape_is_refused(on):
    """P's row vector read as rows 3 tiles wide (its pages' are 4: the mutation suite's find), and m_old packed as
    1 tile of a band of 2 — neither of which the interpreter can run — are refused by name, not followed."""

    def wide(body):
        i = _index(body, lambda op: isinstance(op, Compute) and op.outs == (ring(on, "exp_ring"),))
        exp = body[i].op.expr
        body[i] = dataclasses.replace(body[i], op=Map(with_row_args(exp, 3)))
        return body

    refused(body_edit(on, wide), "as rows 3 tiles wide against pages of rows 4 tiles wide")

    two = spatialc.build(spatialc.softmax(70, 100, "fp16", online=True), "sm_90", block=(2, 2, 1), sites=2)

    def half_packed(body):
        i = _index(body, lambda op: isinstance(op, PackAcc) and op.to == ring(two, "m_old_ring"))
        body[i] = dataclasses.replace(body[i], tiles=1)
        return body

    refused(body_edit(two, half_packed), "packs 1 tiles of a row accumulator of 2 rows")

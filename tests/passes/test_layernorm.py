"""LayerNorm (issue 31): a row program of three outputs — out (m × n), and mean and rstd (m × 1, float32), the outputs
torch's native_layer_norm returns — built, planned, verified (rule 8 proves each output apart), run exactly by the
interpreter and compared with numpy's layer norm (torch's formula: a two-pass variance) at sizes that are no multiple
of a tile; the planner's refusals of what such a program cannot be; its JSON round trip. (The mutation suite,
tests/passes/test_mutations.py, refuses edits of its schedule; tests/lower/test_general_layernorm.py runs its kernel.)
"""

from __future__ import annotations

import dataclasses
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.errors import ProgramError, SemanticError
from spatialc.ir.ids import LV_K
from spatialc.ir.index import ProgramIndex
from spatialc.ir.nodes import DType, Engine, TensorRole, WriteStage
from spatialc.ir.ops import Apply, Arg, Col, Compute, Loop, Map, Precision, RowArg, TileAddr, WriteTiles, walk
from spatialc.numerics.reference import reference
from spatialc.passes.rows import row_bodies, row_shape
from spatialc.passes.verify import verify
from spatialc.passes.verify.declared import declared_outputs
from spatialc.rows import _Builder

from ..rewrite import replace
from .test_rows import inputs_for

DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
# Ragged sizes: rows past the last band and columns past the row's last page are padding the sums must leave out.
SHAPES = [(40, 200, {"block": (1, 4, 1), "sites": 2}), (33, 50, {}), (1, 1, {}), (70, 300, {"block": (2, 2, 1)})]


def run(p, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        return spatialc.evaluate(p, x)


def numpy_layernorm(x, w, b, eps, dtype):
    """torch.native_layer_norm's three outputs, in float64: mean and rstd of one value a row (m × 1)."""
    v = x.astype(dtype).astype(np.float64)
    mean = v.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(((v - mean) ** 2).mean(axis=1, keepdims=True) + eps)
    y = (v - mean) * rstd
    y = y if w is None else y * w.astype(np.float64)
    y = y if b is None else y + b.astype(np.float64)
    return {"out": y, "mean": mean, "rstd": rstd}


@pytest.mark.parametrize("m, n, opts", SHAPES)
@pytest.mark.parametrize("prec", ["bf16", "fp16"])
def test_layernorm_verifies_and_the_interpreter_equals_the_reference_and_numpy(m, n, opts, prec):
    p = spatialc.build(spatialc.layernorm(m, n, prec), "sm_90", **opts)
    assert p.verified
    x = inputs_for(p, seed=m + n)
    x["x"] = x["x"] + 5.0  # rows off zero: the mean matters, and the two-pass variance with it
    got, want = run(p, x), reference(p, x)
    assert set(got) == set(want) == {"out", "mean", "rstd"}
    for name in want:
        assert got[name].dtype == want[name].dtype == np.float32
        assert np.array_equal(got[name], want[name]), name
    assert got["out"].shape == (m, n) and got["mean"].shape == got["rstd"].shape == (m, 1)
    ok, how = spatialc.tolerance(p).check(got, x)
    assert ok, how
    exact = numpy_layernorm(x["x"], x["weight"], x["bias"], 1e-5, DTYPES[prec])
    for name, value in exact.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-6, atol=2e-6, err_msg=name)


@pytest.mark.parametrize(("weight", "bias"), [(False, True), (True, False), (False, False)])
def test_layernorm_without_its_weight_or_bias_is_the_same_formula_less_them(weight, bias):
    p = spatialc.build(spatialc.layernorm(33, 50, "fp16", eps=1e-3, weight=weight, bias=bias), "sm_90")
    assert {t.name for t in p.tensors} == {"x", "out", "mean", "rstd"} | ({"weight"} if weight else set()) | (
        {"bias"} if bias else set()
    )
    x = inputs_for(p, seed=4)
    got = run(p, x)
    exact = numpy_layernorm(x["x"], x.get("weight"), x.get("bias"), 1e-3, np.float16)
    for name, value in exact.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-6, atol=2e-6, err_msg=name)


def test_the_outputs_in_the_type_asked_and_the_vectors_in_float32():
    p = spatialc.layernorm(40, 70, "bf16", out="bf16")
    types = {t.name: t.dtype for t in p.tensors}
    assert types["out"] == DType.BF16 and types["mean"] == types["rstd"] == DType.FLOAT32
    q = spatialc.build(p, "sm_90")
    x = inputs_for(q)
    ok, how = spatialc.tolerance(q).check(run(q, x), x)
    assert ok, how


def test_the_tolerance_covers_each_output_and_names_the_one_that_is_off():
    p = spatialc.build(spatialc.layernorm(33, 50, "bf16"), "sm_90")
    x = inputs_for(p)
    got = run(p, x)
    bound = spatialc.tolerance(p, kernel=True).bound(x)
    assert set(bound) == {"out", "mean", "rstd"} and all(np.all(b > 0) for b in bound.values())
    off = dict(got, rstd=got["rstd"] * np.float32(1.001))
    ok, how = spatialc.tolerance(p).check(off, x)
    assert not ok and "rstd: max |error|" in how
    ok, how = spatialc.tolerance(p).check(got["out"], x)
    assert not ok and "the outputs are out, mean, rstd" in how


def test_the_plan_writes_each_vector_a_tile_a_row_of_the_band():
    """mean and rstd: one tile column, padded to whole bands like x; computed once a band, between the passes,
    and stored by the writer as soon as the compute engine fills them."""
    p = spatialc.build(spatialc.layernorm(40, 70, "bf16"), "sm_90", block=(2, 2, 1))
    t = {x.name: x for x in p.tensors}
    assert t["x"].tiles == t["out"].tiles == (4, 6) and t["mean"].tiles == t["rstd"].tiles == (4, 1)
    shape = row_shape(p)
    names = {b.id: b.name for b in p.buffers}
    assert sorted(names[b] for b in shape.vectors) == [
        "mean_out_ring",
        "mean_ring",
        "row_sum_ring",
        "row_sumsq_ring",
        "rstd_out_ring",
        "rstd_ring",
    ]
    assert sorted(names[b] for b in shape.written_vectors) == ["mean_out_ring", "rstd_out_ring"]
    writer = row_bodies(p)["writer"]
    vector_writes = [op for op in writer if not hasattr(op, "body")]
    assert [type(op).__name__ for op in vector_writes] == ["Wait", "WriteTiles", "Pop"] * 2
    assert (vector_writes[1].block_h, vector_writes[1].block_w) == (2, 1)


def test_a_map_of_row_vectors_alone_fills_a_row_vector():
    p = spatialc.build(spatialc.layernorm(33, 50, "fp16"), "sm_90")
    rstd = next(s for s in p.stages if s.name == "rstd")
    assert rstd.id in row_shape(p).vector_maps
    maps = [op.op for q in p.schedule.programs for op in q.ops if isinstance(op, Compute) and isinstance(op.op, Map)]
    assert any(m == rstd.kind.op for m in maps)  # run once a band, outside the passes' loops, its vectors one wide


def test_a_row_vector_a_write_empties_and_a_map_reads_is_refused_in_words():
    p = spatialc.layernorm(33, 50, "fp16")
    mean = next(b.id for b in p.buffers if b.name == "mean_ring")
    stages = tuple(
        dataclasses.replace(s, ins=(mean,)) if s.name == "write_mean" else s for s in p.stages if s.name != "mean_out"
    )
    with pytest.raises(ProgramError, match="feeds .*write stage write_mean.*the writer pops a row vector"):
        spatialc.build(p.evolve(stages=stages), "sm_90")


def test_two_outputs_of_the_rows_values_are_written_in_one_last_pass():
    """Two tensors of the rows' values: the band's last pass maps and stores a page of each at a time (one loop over
    the pages on the writer, two stores in it), each output the interpreter computes equal to its own formula."""
    b = _Builder(33, 50, Precision.FP16)
    x = b.tensor("x", TensorRole.INPUT, (33, 50), DType.FP16)
    outs = [b.tensor(name, TensorRole.OUTPUT, (33, 50), DType.FLOAT32) for name in ("a", "c")]
    total = b.reduce("row_sum", "sum", b.read(x, "x0"))
    for i, t in enumerate(outs):
        expr = Apply("sub" if i == 0 else "add", (Arg(0), RowArg(1)))
        b.write(b.map(f"m{i}", expr, (b.read(x, f"x{i + 1}"), total)), t, f"write{i}")
    p = spatialc.build(b.program("two", "sm_90"), "sm_90")
    writer = [q for q in p.schedule.programs if q.engine.value == "writer"][0]
    loops = [op for op in walk(writer.ops) if isinstance(op, Loop) and op.var == LV_K]
    assert len(loops) == 1 and sum(isinstance(op, WriteTiles) for op in loops[0].body) == 2
    xs = np.random.default_rng(0).standard_normal((33, 50)).astype(np.float16)
    got = spatialc.evaluate(p, {"x": xs})
    sums = xs.astype(np.float64).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got["a"], xs - sums, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got["c"], xs + sums, rtol=1e-5, atol=1e-4)


def test_an_output_two_write_stages_write_is_refused_by_rule_8():
    """A second write stage of mean, from rstd's copy: the stages declare mean twice, and rstd not at all."""
    p = spatialc.build(spatialc.layernorm(33, 50, "fp16"), "sm_90")
    mean = next(t.id for t in p.tensors if t.name == "mean")
    stages = tuple(dataclasses.replace(s, kind=WriteStage(mean)) if s.name == "write_rstd" else s for s in p.stages)
    with pytest.raises(SemanticError, match="write stages write_mean and write_rstd both write mean"):
        declared_outputs(ProgramIndex.of(p.evolve(stages=stages)))  # (verify's rule 3 refuses the schedule first)


def test_a_vector_map_that_reads_a_column_vector_is_refused_by_rule_8():
    p = spatialc.build(spatialc.layernorm(33, 50, "fp16"), "sm_90")
    w = next(t.id for t in p.tensors if t.name == "weight")
    odd = Map(Apply("mul", (RowArg(0), Col(w))))
    stages = tuple(
        dataclasses.replace(s, kind=dataclasses.replace(s.kind, op=odd)) if s.name == "rstd_out" else s
        for s in p.stages
    )
    with pytest.raises(SemanticError, match="maps row vectors alone, one value a row, and reads a column vector"):
        verify(p.evolve(stages=stages))


def test_a_vector_written_over_another_bands_rows_is_refused_by_rule_8():
    """Every band's mean stored at band 0's rows: in bounds, the rings balanced — only rule 8 tells."""
    p = spatialc.build(spatialc.layernorm(40, 70, "bf16"), "sm_90", block=(1, 2, 1), sites=2)
    mean = next(t.id for t in p.tensors if t.name == "mean")

    def band_zero(op):
        if isinstance(op, WriteTiles) and op.tensor == mean:
            return (dataclasses.replace(op, at=TileAddr(0)),)
        return None

    with pytest.raises(SemanticError, match="writes mean tile \\(0, 0\\), outside its block of tile rows 1..1"):
        verify(replace(p, Engine.WRITER, band_zero))


def test_a_saved_layernorm_loads_verified_and_equal():
    p = spatialc.build(spatialc.layernorm(40, 70, "fp16", bias=False), "sm_90", sites=2)
    q = spatialc.from_json(spatialc.to_json(p))
    assert q == p and q.verified
    x = inputs_for(p)
    got, again = run(p, x), run(q, x)
    assert all(np.array_equal(got[k], again[k]) for k in got)


def test_eps_and_sizes_a_layernorm_cannot_take_are_refused_in_one_line():
    for bad in (-1.0, float("nan"), True, "1e-5"):
        with pytest.raises(ProgramError, match="layernorm's eps is a finite number ≥ 0"):
            spatialc.layernorm(16, 16, eps=bad)
    with pytest.raises(ProgramError, match="float arithmetic"):
        spatialc.layernorm(16, 16, "int8")


def test_build_and_verify_at_8192_squared_stay_fast():
    """Three outputs proved apart: still well under the issue's 100 ms goal for build + verify (not a timing test:
    a generous bound, for a shared machine)."""
    import time

    t0 = time.perf_counter()
    p = spatialc.build(spatialc.layernorm(8192, 8192, "bf16"), "sm_90")
    assert p.verified and time.perf_counter() - t0 < 5.0


def test_show_python_prints_layernorm_as_lang_source_that_traces_back_to_it():
    """Several writes and maps of row vectors in spatialc.lang's words: the printed module's program() is p."""
    from spatialc.lang.source import python_source

    p = spatialc.build(spatialc.layernorm(33, 50, "fp16", bias=False), "sm_90", sites=2)
    scope: dict = {}
    exec(compile(python_source(p), "<layernorm>", "exec"), scope)  # noqa: S102 — our own printed source
    q = scope["program"]()
    assert q == p and q.verified

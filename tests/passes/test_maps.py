"""Programs with no matmul (issue 31): elementwise maps of tensors — built, verified (rule 8 states out = map(inputs)
element by element and proves each output tile gets the map of the same tile of each input), run exactly by the
interpreter, and refused where an edit makes them wrong."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.errors import PlanError, ProgramError, SemanticError, VerifyError
from spatialc.ir.nodes import ComputeStage, Engine, ReadStage, SpatialProgram
from spatialc.ir.ops import Apply, Arg, Compute, Map, ReadTiles, TileAddr, WriteTiles, with_cols
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify

from ..rewrite import replace

R, C, W = Engine.READER, Engine.COMPUTE, Engine.WRITER


def inputs_for(p: SpatialProgram, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every input and parameter: int8 values for an int8 program's inputs, int32 ones for its
    column vectors, normal floats otherwise."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role.value == "input":
            out[t.name] = rng.integers(-128, 128, t.elems) if p.precision.value == "int8" else rng.normal(size=t.elems)
        elif t.role.value == "parameter":
            out[t.name] = (
                rng.integers(-5000, 5000, t.elems) if p.precision.value == "int8" else rng.normal(size=t.elems)
            )
    return out


def exact(p: SpatialProgram, seed: int = 0) -> np.ndarray:
    """The interpreter's result, asserted equal to the numpy reference and within the tolerance."""
    x = inputs_for(p, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        c = spatialc.evaluate(p, x)
        want = reference(p, x)
        assert np.array_equal(c, want)
        ok, how = spatialc.tolerance(p).check(c, x)
    assert ok, how
    return c


x, g = ew.inputs(2)
PROGRAMS = {
    "swiglu gate, bf16": (ew.silu(g) * x, "bf16", 100, 300, {}),
    "residual add and bias, fp16": (x + g + ew.col("bias"), "fp16", 37, 50, {}),
    "leaky where, bf16": (ew.where(x > 0.25, x, 0.1 * x), "bf16", 64, 64, {"block": (2, 2, 1), "sites": 3}),
    "rsqrt of a sum of squares, fp16": (ew.rsqrt(ew.square(x) + ew.square(g) + 1.0), "fp16", 40, 70, {"sites": 2}),
    "int8 clamp of a product and bias": (ew.clamp(x * g + ew.col("b"), lo=-9000, hi=9000), "int8", 50, 90, {}),
    "int8 max of three": (ew.max(ew.max(x, g), ew.x(2)), "int8", 20, 33, {"block": (1, 2, 1)}),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_map_program_verifies_and_the_interpreter_equals_the_reference(name):
    expr, prec, m, n, kw = PROGRAMS[name]
    p = spatialc.build(spatialc.elementwise(expr, m, n, prec), "sm_90", **kw)
    assert p.verified and p.plan is not None and p.plan.k_tiles == 1
    exact(p)
    exact(p, seed=1)
    back = spatialc.from_json(spatialc.to_json(p))
    assert back == p and back.verified


def test_the_plan_streams_large_maps_in_large_pages_and_small_ones_in_many_items():
    big = spatialc.build(spatialc.elementwise(x + g, 4096, 4096, "bf16"), "sm_90")
    assert big.plan.item_tiles[0] * big.plan.item_tiles[1] >= 16 and len(big.placement.items_of_site) == 264
    small = spatialc.build(spatialc.elementwise(x + g, 100, 300, "bf16"), "sm_90")
    assert small.plan.items >= 100  # a small map is cut fine enough to keep the machine busy
    forced = spatialc.build(spatialc.elementwise(x + g, 100, 300, "bf16"), "sm_90", block=(4, 4, 1), depth=3)
    assert forced.plan.item_tiles == (4, 4) and forced.plan.depth == 3


def test_what_a_map_program_cannot_take_is_refused_in_one_line():
    p = spatialc.elementwise(x + g, 64, 64, "bf16")
    for kw, words in (
        ({"sub_blocks": (1, 2)}, "sub_blocks shapes a matmul's work"),
        ({"split_k": 2}, "split_k shapes a matmul's work"),
        ({"multicast": (2, 1)}, "multicast shapes a matmul's work"),
        ({"form": "sm90a"}, "printed in the general and the persistent forms only"),
        ({"block": (2, 2, 4)}, r"a map's block is \(rows, columns, 1\)"),
    ):
        with pytest.raises(ProgramError, match=words):
            spatialc.build(p, "sm_90", **kw)
    with pytest.raises(PlanError, match="no map block fits"):
        spatialc.build(p, "sm_90", block=(8, 8, 1), depth=64)


def test_the_frontend_refuses_what_is_no_map_by_name():
    with pytest.raises(ProgramError, match="takes an ew expression"):
        spatialc.elementwise("x + y", 16, 16)
    with pytest.raises(ProgramError, match=r"reads inputs 0 … k−1, each at least once; this one reads \[1\]"):
        spatialc.elementwise(g + 1.0, 16, 16)
    with pytest.raises(ProgramError, match="reads none, only constants or vectors"):
        spatialc.elementwise(ew.col("b") * 2.0 + 1.0, 16, 16)
    with pytest.raises(
        ProgramError, match=r"the formula reads 2 input\(s\), and 1 names were given for them: \('a',\)"
    ):
        spatialc.elementwise(x + g, 16, 16, names=("a",))
    with pytest.raises(ProgramError, match="names each by an identifier"):
        spatialc.elementwise(x + g, 16, 16, names=("a", "b c"))
    with pytest.raises(ProgramError, match="need names of their own"):
        spatialc.elementwise(x + g, 16, 16, names=("out", "b"))
    with pytest.raises(ProgramError, match="exp is float arithmetic; an int8 program's epilogue is integer"):
        spatialc.elementwise(ew.exp(x), 16, 16, "int8")
    with pytest.raises(ProgramError, match="output is one of float32, fp16, bf16, not 'int32'"):
        spatialc.elementwise(x + g, 16, 16, "bf16", out="int32")
    with pytest.raises(ProgramError, match="no truth value"):
        bool(x > g)
    with pytest.raises(ProgramError, match="takes the parameter"):
        ew.leaky_relu(x)
    with pytest.raises(ProgramError, match="a finite number"):
        _ = x + float("nan")


def test_a_map_of_a_float_into_a_narrow_output_rounds_once():
    p = spatialc.build(spatialc.elementwise(ew.exp(x) * g, 30, 40, "bf16", out="bf16"), "sm_90")
    c = exact(p)
    assert c.dtype == np.float32 and np.array_equal(c, c.astype(np.float64))  # bf16 values, held as float32


def test_an_int8_map_whose_values_could_leave_the_output_is_refused():
    wide = spatialc.elementwise(x * g * x * g, 16, 16, "int8", out="int32")  # up to 2^28: fits int32
    assert spatialc.build(wide, "sm_90").verified
    huge = spatialc.elementwise(ew.square(ew.square(ew.square(x * g))), 16, 16, "int8", out="int32")
    with pytest.raises(SemanticError, match=r"beyond ±\(2\^62 - 2\^12\), where integer maps are exact"):
        spatialc.build(huge, "sm_90")
    narrow = spatialc.elementwise(x * g * x * g * x, 16, 16, "int8", out="int32")  # up to 2^35: past int32
    with pytest.raises(SemanticError, match="holds int32, but the declared values lie in"):
        spatialc.build(narrow, "sm_90")


# ---- rule 8 against an attacker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gate() -> SpatialProgram:
    """out = x0 − x1 + bias over a grid of 2x2-tile items on 3 sites (an ITEM loop)."""
    p = spatialc.elementwise(x - g + ew.col("bias"), 64, 96, "fp16")
    return spatialc.build(p, "sm_90", block=(2, 2, 1), sites=3)


def refused(p: SpatialProgram, *words: str) -> VerifyError:
    with pytest.raises(VerifyError) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    return info.value


def test_the_maps_operands_swapped_in_the_schedule_are_refused(gate):
    swapped = replace(
        gate, C, lambda op: (dataclasses.replace(op, ins=op.ins[::-1]),) if isinstance(op, Compute) else None
    )
    refused(swapped, "it reads x1_ring, x0_ring into out_ring; stage map reads x0_ring, x1_ring into out_ring")


def test_an_input_read_into_the_other_inputs_ring_is_refused(gate):
    ids = {t.name: t.id for t in gate.tensors}

    def crossed(op):
        if isinstance(op, ReadTiles):
            other = ids["x1"] if op.tensor == ids["x0"] else ids["x0"]
            return (dataclasses.replace(op, tensor=other),)
        return None

    refused(replace(gate, R, crossed), "x0_ring is filled from x0 (stage read_x0), not x1")  # rule 3, first


def test_an_input_block_read_upside_down_is_refused(gate):
    # In bounds everywhere, so only rule 8 can tell: each item reads its block of x0 with its rows reversed.
    x0 = next(t.id for t in gate.tensors if t.name == "x0")

    def reversed_rows(op):
        if isinstance(op, ReadTiles) and op.tensor == x0:
            at = dataclasses.replace(op.at, base=op.at.base + (op.block_h - 1) * op.stride_h)
            return (dataclasses.replace(op, at=at, stride_h=-op.stride_h),)
        return None

    e = refused(replace(gate, R, reversed_rows), "maps x0 tile (1, 0), not its own")
    assert e.related  # the read it is about is named


def test_a_column_vector_read_at_the_wrong_column_is_refused(gate):
    def first_column(op):
        if isinstance(op, Compute) and isinstance(op.op, Map):
            return (dataclasses.replace(op, op=Map(with_cols(op.op.expr, _column_zero))),)
        return None

    refused(replace(gate, C, first_column), "gets bias tile column 0, not its own column")


def _column_zero(c):
    return dataclasses.replace(c, at=TileAddr(0))


def test_a_map_that_differs_from_its_stage_is_refused(gate):
    def added(op):
        if isinstance(op, Compute) and isinstance(op.op, Map):
            expr = op.op.expr
            return (dataclasses.replace(op, op=Map(Apply("add", (Apply("add", expr.args[0].args), expr.args[1])))),)
        return None

    refused(replace(gate, C, added), "where stage map declares")
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(Map(Apply("sub", (Arg(1), Arg(0)))))) if s.name == "map" else s
        for s in gate.stages
    )
    refused(gate.evolve(stages=stages), "where stage map declares")


def test_an_output_tile_written_twice_or_never_is_refused(gate):
    twice = replace(gate, W, lambda op: (op, op) if isinstance(op, WriteTiles) else None)
    refused(twice, "written by more than one op")
    left = replace(gate, W, lambda op: (dataclasses.replace(op, block_w=1),) if isinstance(op, WriteTiles) else None)
    with pytest.raises(VerifyError):
        verify(left)


def test_a_stage_that_reads_a_tensor_of_another_shape_or_type_is_refused(gate):
    tensors = tuple(dataclasses.replace(t, elems=(64, 80)) if t.name == "x1" else t for t in gate.tensors)
    refused(gate.evolve(tensors=tensors), "a map's inputs have its output's shape")
    stray = [s for s in gate.stages if isinstance(s.kind, ReadStage)][0]
    extra = dataclasses.replace(stray, id=spatialc.ir.ids.StageId(9), name="read_again")
    with pytest.raises(VerifyError):
        verify(gate.evolve(stages=(*gate.stages, extra)))


def test_the_example_builds_verifies_and_matches_numpy(capsys):
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).parents[2] / "examples" / "elementwise.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("verified, OK") == 4  # three maps, and RoPE's two outputs of one kernel
    assert "rope      two outputs, one kernel: verified, OK (out1:" in out


def test_an_int8_map_whose_formula_overflows_inside_is_refused_though_its_result_is_small():
    # The review's overflow inside one Map, for a map program: clamp bounds the result, not the cube before it.
    cube = ew.clamp(ew.square(ew.square(ew.square(x * g))) * x, lo=-10, hi=10)
    with pytest.raises(SemanticError, match="within its formula, beyond"):
        spatialc.build(spatialc.elementwise(cube, 16, 16, "int8"), "sm_90")


def test_an_attention_declaration_is_no_map_program_before_or_after_planning():
    """Attention's unplanned stage is a declaration, not an elementwise map: no caller that asks before the
    planner has run (the frontend's checks, the CLI's report) may take it for one."""
    from spatialc.passes.maps import is_map_program

    declared = spatialc.attention(1, 2, 32, 32, 64)
    assert not is_map_program(declared)
    assert not is_map_program(spatialc.build(declared, "sm_90"))
    x, y = ew.inputs(2)
    assert is_map_program(spatialc.elementwise(x + y, 64, 64, "fp16"))

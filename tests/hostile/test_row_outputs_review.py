"""A hostile review of row programs of several outputs of pages, or none (fused add + RMSNorm, `row_reduce`). What it
found, each test failing before its fix:

1. a hand-written row program that reads no tensor (its only page a map of a constant) crashed the planner with a
   bare StopIteration (`rows_tensor`'s next()); one whose reduction, map or read names more or fewer rings than it
   moves (a reduction of two rings, a map filling two) crashed the schedule with ValueError; a row reduction of a row
   vector (the max of a row sum) and a write stage put on the compute engine were refused with verify's complaint
   about the compiler's own schedule (a Pop of a page never waited for; a ring consumed by the wrong engine).
   `row_shape`, the one definition of a row program, now refuses the first two in words, and `scheduled_shape`,
   what the row scheduler can schedule, the last two (a `spatialc.lang` program schedules its own engines);
2. `spatialc.rmsnorm(…, "e4m3", residual=True)` made a program that stores residual_out in x's 8-bit type, which no
   row program can write: build refused it with rule 8's complaint. The builder says so first;
3. `row_reduce`'s refusal of an output type read "a bf16 a row sum's output is one of …";
4. a row sum whose magnitude reaches float32's largest value (±3e38 in turn: exactly 0, a kernel's float32 sum NaN)
   failed the kernel's check with no word of why, where a GEMM's |A|@|B| past float32's range is said (RangeWarning,
   or InputError under strict) and named in the check's account: a row program's sums are now held to the same rule
   (`reductions.past_range`, `Tolerance._rows_in_range`);
5. a forced block whose rings pass a site's shared memory was refused as "no block of a row program fits", and a
   depth of 0 as a bad "block (1x1 tiles) and depth"; a saved row program whose plan misses its rows called x "the
   output tensor" (rule 1 measures a row program's bands against the rows it reads since 53159df);
6. a row reduction whose vector nothing reads was refused naming the read stage before it ("stage read_x1 is not on
   the way from the inputs to any output"): rule 8 names the stage where the unused stages end.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.cli import main
from spatialc.errors import PlanError, ProgramError, SemanticError
from spatialc.inputs import InputError
from spatialc.ir.nodes import DType, Engine, TensorRole
from spatialc.ir.ops import Apply, Arg, Lit, Precision, RowArg
from spatialc.rows import _Builder

M, N = 20, 40


def builder() -> tuple[_Builder, object]:
    b = _Builder(M, N, Precision.BF16)
    return b, b.tensor("x", TensorRole.INPUT, (M, N), DType.BF16)


def row_sum(edit=None) -> spatialc.ir.nodes.SpatialProgram:
    """out = Σ x along each row, and a second read of x; `edit` rewrites the stages (a list) as a hostile file would."""
    b, x = builder()
    o = b.tensor("out", TensorRole.OUTPUT, (M, 1), DType.FLOAT32)
    first, spare = b.read(x, "x0"), b.read(x, "x1")
    b.write(b.reduce("row_sum", "sum", first), o)
    if edit is not None:
        edit(b, spare)
    return b.program("row_sum_edited", "sm_90")


def test_a_row_program_that_reads_no_tensor_is_refused_in_words():
    b, _ = builder()
    o = b.tensor("out", TensorRole.OUTPUT, (M, 1), DType.FLOAT32)
    b.write(b.reduce("row_sum", "sum", b.map("ones", Lit(1.0), ())), o)
    with pytest.raises(ProgramError, match="a row program reads the rows it reduces: no stage here reads a tensor"):
        spatialc.build(b.program("no_read", "sm_90"))


@pytest.mark.parametrize("of_a_map", [False, True])
def test_a_reduction_of_a_row_vector_is_refused_in_words(of_a_map):
    b, x = builder()
    o = b.tensor("out", TensorRole.OUTPUT, (M, 1), DType.FLOAT32)
    vector = b.reduce("row_sum", "sum", b.read(x, "x0"))
    if of_a_map:  # a map of row vectors alone is a row vector too
        vector = b.map("twice", Apply("mul", (RowArg(0), Lit(2.0))), (vector,))
    b.write(b.reduce("row_max", "max", vector), o)
    with pytest.raises(ProgramError, match="stage row_max reduces .*, a row vector .*folds pages of the rows' values"):
        spatialc.build(b.program("max_of_a_sum", "sm_90"))


def _stage(b: _Builder, name: str, **fields) -> None:
    i = next(i for i, s in enumerate(b.stages) if s.name == name)
    b.stages[i] = dataclasses.replace(b.stages[i], **fields)


@pytest.mark.parametrize(
    "edit, says",
    [
        (
            lambda b, spare: _stage(b, "row_sum", ins=(b.stages[2].ins[0], spare)),
            "stage row_sum reads 2 ring.s. and fills 1; in a row program a row reduction reads one ring and fills one",
        ),
        (
            lambda b, spare: _stage(b, "row_sum", outs=(b.stages[2].outs[0], spare)),
            "stage row_sum reads 1 ring.s. and fills 2; in a row program a row reduction reads one ring and fills one",
        ),
        (
            lambda b, spare: _stage(b, "write_out", engine=Engine.COMPUTE),
            "stage write_out runs on the compute; a row program.s write runs on the writer",
        ),
    ],
    ids=["reduction of two rings", "reduction filling two", "write on the compute engine"],
)
def test_a_stage_that_is_no_row_programs_is_refused_in_words(edit, says):
    with pytest.raises(ProgramError, match=says):
        spatialc.build(row_sum(edit))


def test_a_map_that_fills_two_rings_is_refused_in_words():
    b, x = builder()
    o = b.tensor("out", TensorRole.OUTPUT, (M, N), DType.FLOAT32)
    total = b.reduce("row_sum", "sum", b.read(x, "x0"))
    shifted = b.map("shift", Apply("sub", (Arg(0), RowArg(1))), (b.read(x, "x1"), total))
    _stage(b, "shift", outs=(shifted, b.ring("extra")))
    b.write(shifted, o)
    with pytest.raises(ProgramError, match="stage shift reads 2 ring.s. and fills 2; in a row program a map reads"):
        spatialc.build(b.program("two_outs", "sm_90"))


@pytest.mark.parametrize("precision", ["e4m3", "e5m2"])
def test_fused_add_rmsnorm_of_8_bit_floats_is_refused_when_it_is_made(precision):
    with pytest.raises(
        ProgramError, match=f"stores residual_out in x's type.*give x one of those types, not {precision}$"
    ):
        spatialc.rmsnorm(32, 64, precision, residual=True)
    assert spatialc.rmsnorm(32, 64, precision).name.startswith("rmsnorm_")  # without it, one output of float32


def test_a_row_reductions_refusal_reads_as_a_sentence():
    said = r"^a bf16 row sum's output is one of float32, fp16, bf16, not 'int8'$"
    with pytest.raises(ProgramError, match=said):
        spatialc.row_reduce(4, 8, "sum", out="int8")


def opposite_giants() -> dict[str, np.ndarray]:
    """Rows of ±3e38 in turn, row 0 of ones: each row's exact sum 0 (40 for row 0), a float32 sum's NaN or ±inf."""
    x = np.ones((4, N), np.float32)
    x[1:, 0::2], x[1:, 1::2] = 3e38, -3e38
    return {"x": x.astype(ml_dtypes.bfloat16)}


def test_a_row_sum_past_float32s_range_is_said_as_a_gemms_is():
    p = spatialc.build(spatialc.row_reduce(4, N, "sum"))
    x = opposite_giants()
    with pytest.raises(InputError, match=r"3 of the 4 rows have a row sum whose magnitude .* first at row 1\)"):
        spatialc.tolerance(p, kernel=True, strict=True).bound(x)
    spatialc.tolerance(p, strict=True).bound(x)  # the interpreter sums exactly: its bound holds there
    nan = np.full((4, 1), np.nan, np.float32)
    nan[0] = N  # what a kernel's float32 sum may give: NaN where +inf and -inf meet
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the RangeWarning, said once per process)
        ok, how = spatialc.tolerance(p, kernel=True).check(nan, x)
    assert not ok and "3 of the elements outside it lie past float32's range, where it does not hold" in how
    q = spatialc.build(spatialc.rmsnorm(4, N, residual=True))  # Σh² about 4e35, short of the range: nothing said
    rng = np.random.default_rng(0)
    y = {"x": 1e17 * rng.standard_normal((4, N)), "residual": rng.standard_normal((4, N))}
    y = {k: v.astype(ml_dtypes.bfloat16) for k, v in y.items()} | {"weight": np.ones(N, np.float32)}
    spatialc.tolerance(q, kernel=True, strict=True).bound(y)


def test_a_forced_block_that_does_not_fit_says_what_its_rings_take():
    p = spatialc.rmsnorm(15, 64, residual=True)  # rings of pages of x, residual and their sums, two passes or three
    with pytest.raises(PlanError, match=r"rings of 8x8-tile pages, 2 a ring, take \d{7} bytes a site, more than sm_90"):
        spatialc.build(p, block=(8, 8, 1))
    with pytest.raises(PlanError, match=r"^a row program's depth \(pages a ring\) must be ≥ 1, not 0$"):
        spatialc.build(p, depth=0)  # (it named a block of 1x1 tiles no one had asked for)


def test_a_saved_row_program_whose_rows_the_plan_misses_names_them_the_rows(tmp_path, capsys):
    doc = json.loads(spatialc.to_json(spatialc.build(spatialc.rmsnorm(40, 70, residual=True))))
    next(t for t in doc["program"]["tensors"] if t["name"] == "x")["tiles"] = [4, 6]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(doc))
    assert main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tiles, but the rows' tensor x has 4x6" in err  # (was "the output tensor x")


def test_a_reduction_nothing_reads_is_named_not_the_read_before_it():
    b, x = builder()
    o = b.tensor("out", TensorRole.OUTPUT, (M, 1), DType.FLOAT32)
    b.write(b.reduce("row_sum", "sum", b.read(x, "x0")), o)
    b.reduce("row_max", "max", b.read(x, "x1"))  # its vector unread: the user's slip, not read_x1's
    with pytest.raises(SemanticError, match="^stage row_max is not on the way .* any output: no stage reads what it"):
        spatialc.build(b.program("unread_max", "sm_90"))

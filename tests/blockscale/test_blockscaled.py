"""Block-scaled 8-bit float GEMMs (issue 34, item 2): the frontend's layouts and checks, the interpreter equal to
the reference bit for bit and to a sum written apart from it, the tolerance and JSON (the kernels: test_kernels.py
and test_sm90a_blockscaled.py)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.errors import PlanError, ProgramError
from spatialc.inputs import InputError
from spatialc.numerics.blockscale import kernel_ulps, program_scales
from spatialc.numerics.reference import reference
from spatialc.numerics.tolerance import tolerance

from .programs import FORMATS, inputs_of, naive, scaled

LAYOUTS = [
    ((64, 48, 256), ("1x128", "128x128")),  # DeepGEMM's
    ((40, 200, 200), ("1x128", "128x128")),  # K not a multiple of 128: the last group's padding is zeros
    ((48, 32, 384), ("row", "col")),  # per token × per channel
    ((32, 48, 256), ("tensor", "tensor")),
    ((33, 17, 128), ("128x128", "128x1")),
    ((20, 36, 512), ("1x256", "256x16")),
]


@pytest.mark.parametrize(("shape", "layouts"), LAYOUTS)
def test_interpreter_is_the_reference_and_the_definition(shape, layouts):
    p = scaled(*shape, scales=layouts)
    ins = inputs_of(p)
    c = spatialc.evaluate(p, ins)
    assert np.array_equal(c, reference(p, ins))  # the same operations in the same order
    want = naive(p, ins).astype(np.float32)  # C is float32: the float64 sum rounded once
    assert np.array_equal(c, want)
    ok, how = tolerance(p, kernel=True).check(c, ins)
    assert ok, how


def test_e5m2_and_bf16_output():
    p = scaled(32, 64, 256, prec="e5m2")
    ins = inputs_of(p, seed=3)
    assert np.array_equal(spatialc.evaluate(p, ins), reference(p, ins))
    q = spatialc.build(spatialc.gemm(32, 64, 256, "e4m3", out="bf16", scales=("1x128", "128x128")), "sm_89")
    ins = inputs_of(q, seed=4)
    c = spatialc.evaluate(q, ins)
    assert np.array_equal(np.asarray(c, np.float64), np.asarray(naive(q, ins).astype(ml_dtypes.bfloat16), np.float64))


def test_epilogue_after_the_promoted_sum():
    p = scaled(32, 48, 256, epilogue=[spatialc.bias(), spatialc.relu()])
    ins = inputs_of(p, seed=5)
    ins["bias"] = np.linspace(-50, 50, 48).astype(np.float32)
    want = np.maximum(naive(p, ins).astype(np.float32).astype(np.float64) + ins["bias"], 0)
    c = spatialc.evaluate(p, ins)
    assert np.array_equal(c, reference(p, ins))
    assert np.allclose(c, want, rtol=1e-6, atol=1e-4)


def test_scales_change_the_result_group_by_group():
    """A scale of one group, one row, one column block moves exactly that part of C (a lookup of the wrong group or
    block would move another)."""
    p = scaled(32, 256, 256)
    ins = inputs_of(p, seed=1)
    base = spatialc.evaluate(p, ins)
    moved = dict(ins, scale_a=ins["scale_a"].copy(), scale_b=ins["scale_b"].copy())
    moved["scale_a"][5, 1] *= 2  # row 5, K group 1
    moved["scale_b"][0, 1] *= 4  # K group 0, columns 128..255
    c = spatialc.evaluate(p, moved)
    changed = np.argwhere(c != base)
    allowed = {(5, j) for j in range(256)} | {(i, j) for i in range(32) for j in range(128, 256)}
    assert set(map(tuple, changed)) <= allowed
    assert len(changed) > 128
    assert np.array_equal(c, naive(p, moved).astype(np.float32))


def test_scale_inputs_in_bf16_and_e8m0_are_taken_exactly():
    p = scaled(32, 32, 256)
    ins = inputs_of(p, seed=2)
    exps = np.random.default_rng(0).integers(-20, 20, size=ins["scale_a"].shape)
    e8m0 = np.exp2(exps).astype(ml_dtypes.float8_e8m0fnu)
    bf = ins["scale_b"].astype(ml_dtypes.bfloat16)
    c = spatialc.evaluate(p, dict(ins, scale_a=e8m0, scale_b=bf))
    exact = dict(ins, scale_a=np.exp2(exps).astype(np.float32), scale_b=bf.astype(np.float32))
    assert np.array_equal(c, spatialc.evaluate(p, exact))


def test_scale_tensor_shapes():
    p = spatialc.gemm(100, 300, 1000, "e4m3", scales=("1x128", "128x128"))
    shapes = {t.name: t.elems for t in p.tensors}
    assert shapes["scale_a"] == (100, 8) and shapes["scale_b"] == (8, 3)
    p = spatialc.gemm(100, 300, 1000, "e5m2", scales=("tensor", "col"))
    shapes = {t.name: t.elems for t in p.tensors}
    assert shapes["scale_a"] == (1, 1) and shapes["scale_b"] == (1, 300)
    scales = program_scales(p)
    assert scales is not None and scales.a.k == scales.b.k == 1000


def test_a_scale_tensor_of_another_shape_is_refused():
    p = scaled(32, 32, 256)
    ins = inputs_of(p)
    with pytest.raises(InputError, match=r"scale_a: expected shape \(32, 2\)"):
        spatialc.evaluate(p, dict(ins, scale_a=ins["scale_a"][:, :1]))
    with pytest.raises(InputError, match=r"scale_b: expected shape \(2, 1\)"):
        spatialc.evaluate(p, dict(ins, scale_b=np.ones((1, 2), np.float32)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": "bf16"}, r"block scales are for 8-bit float operands \(e4m3, e5m2\), not bf16 ones"),
        ({"precision": "int8"}, r"block scales are for 8-bit float operands"),
        ({"scales": "1x128"}, r"scales is a pair of layout names, A's and B's"),
        ({"scales": ("1x128",)}, r"scales is a pair of layout names"),
        ({"scales": ("1x64", "128x128")}, r"A's scale layout '1x64' groups 64 elements of K .*multiple of 128"),
        ({"scales": ("1x128", "100x128")}, r"B's scale layout '100x128' groups 100 elements of K"),
        ({"scales": ("col", "128x128")}, r"unknown scale layout 'col' for A; use 1x128"),
        ({"scales": ("1x128", "row")}, r"unknown scale layout 'row' for B; use 128x128"),
        ({"scales": ("1x128", 128)}, r"B's scales are named by a string"),
        ({"scales": ("0x128", "128x128")}, r"unknown scale layout '0x128'"),
        ({"epilogue": [spatialc.bias("scale_a")]}, r"the scale tensor 'scale_a' is a block-scaled GEMM's own"),
        ({"weights": "int4"}, r"weights= .* and scales= .* do not combine; give one"),
    ],
)
def test_frontend_refusals(kwargs, message):
    args = {"precision": "e4m3", "scales": ("1x128", "128x128"), **kwargs}
    with pytest.raises(ProgramError, match=message):
        spatialc.gemm(64, 64, 256, args.pop("precision"), **args)


def test_a_k_step_other_than_the_promotion_interval_is_refused():
    with pytest.raises(ProgramError, match=r"K step is its promotion interval, 8 tiles \(128 elements\)"):
        scaled(64, 64, 256, block=(2, 2, 4))
    assert scaled(64, 64, 256, block=(1, 2, 8)).plan.block.ibw == 8  # type: ignore[union-attr]
    with pytest.raises(PlanError, match=r"a block-scaled step's partial fragments beside its accumulator of 32 tiles"):
        scaled(4096, 4096, 4096, form="persistent", block=(2, 4, 8), sub_blocks=(2, 2))  # sm_89: too many registers


def test_tolerance_states_the_bound_and_catches_an_error():
    p = scaled(32, 32, 512)
    tol = tolerance(p, kernel=True)
    assert tol.ulps == kernel_ulps(512) == 128 + 4 + 4
    assert "Σ_g |sa·sb|·|A_g|@|B_g|" in tol.text
    ins = inputs_of(p)
    c = spatialc.evaluate(p, ins)
    plain = spatialc.build(spatialc.gemm(32, 32, 512, "e4m3"), "sm_89")
    unscaled = spatialc.evaluate(plain, {"A": ins["A"], "B": ins["B"]})
    assert not tol.check(unscaled, ins)[0]  # forgetting the scales is far outside it
    wrong_group = dict(ins, scale_a=ins["scale_a"][:, ::-1].copy())
    assert not tol.check(spatialc.evaluate(p, wrong_group), ins)[0]  # and so is every row's groups reversed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tolerance(p).check(c, ins)[0]


def test_scales_whose_float32_product_leaves_float32_are_said():
    """A kernel promotes with fmaf(part, sa · sb, acc), sa · sb in float32: 2^64 · 2^64 is +inf there (NaN on a
    group of zeros) and 2^-74 · 2^-74 a subnormal of few bits, where C itself (e5m2's 2^-16 products, 2^±103) is
    well inside float32 — the range check says so (strict: refused) though |sa·sb|·|A|@|B| is in range."""
    p = scaled(16, 16, 256, prec="e5m2")
    tiny = np.full((16, 256), 2.0**-16).astype(FORMATS["e5m2"])
    ins = {"A": tiny, "B": tiny.T.copy(), "scale_a": np.ones((16, 2), np.float32), "scale_b": np.ones((2, 1))}
    tol = tolerance(p, kernel=True, strict=True)
    tol.check(spatialc.evaluate(p, ins), ins)  # in range: nothing said
    for big, row in ((2.0**64, 0), (2.0**-74 * (1 + 2**-10), 5)):
        ins["scale_a"][row, 1], ins["scale_b"][1, 0] = big, 2.0**64 if big > 1 else 2.0**-74
        with pytest.raises(InputError, match=rf"16 of C's 256 elements have a step whose sa·sb .*at C\[{row}, 0\]"):
            tol.check(spatialc.evaluate(p, ins), ins)
        ins["scale_a"][row, 1] = 1.0
    assert tolerance(p).check(spatialc.evaluate(p, ins), ins)[0]  # the interpreter's float64 product: no such range


def test_a_sample_of_rows_is_checked_with_those_rows_scales():
    """The CLI's default check above 2^30 multiply-adds is a sample of C's rows (`evaluate(rows=...)`), which the
    block-scaled reference refused ('check it whole'), so `spatialc gemm 128 4096 4096 --precision e4m3 --scales
    1x128,128x128` exited 2. The reference and the bound now promote the sampled rows of A with their own rows'
    scales: the sample equals the whole's rows, and a sampled row's scale doubled is caught."""
    p = scaled(96, 32, 256)
    ins = inputs_of(p, seed=2)
    rows = [0, 37, 95]
    sample = dict(ins, A=ins["A"][rows])
    c = spatialc.evaluate(p, sample, rows=rows)
    assert np.array_equal(c, reference(p, ins)[rows])
    assert tolerance(p, kernel=True).check(c, sample, rows=rows)[0]
    sample["scale_a"] = ins["scale_a"].copy()
    sample["scale_a"][37, 1] *= 2
    assert not tolerance(p).check(c, sample, rows=rows)[0]


def test_spatialc_lang_source_refuses_it_rather_than_drop_the_scales():
    from spatialc.lang import LangError
    from spatialc.lang.source import python_source

    with pytest.raises(LangError, match=r"a block-scaled matmul \(spatialc.gemm's scales=\) has no form in spatialc"):
        python_source(scaled(32, 32, 256))

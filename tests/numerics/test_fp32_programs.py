"""float32 as the precision of programs with no matmul: Triton's float32 tutorials (its vector add, its fused softmax)
and an RMSNorm of float32 activations, with their inputs taken as they are (no rounding, no InexactInputWarning),
evaluated equal to the numpy reference (float64 of the float32 inputs) within `spatialc.tolerance`, which a softmax
of the inputs rounded to bf16 is not; every program with a matmul refusing float32 in one line that says the fix —
the API, a saved document, spatialc.lang, the CLI (exit 2) and spatialc.torch alike."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.arguments import precision_of
from spatialc.cli import main
from spatialc.errors import ProgramError, SpatialError
from spatialc.inputs import InexactInputWarning
from spatialc.ir import serde
from spatialc.ir.nodes import DType, TensorRole
from spatialc.ir.ops import NO_FP32_MATMUL, Precision
from spatialc.numerics.reference import reference

FIX = "round A and B to bf16 or fp16"  # the refusal's fix, in every one of its places


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def not_bf16(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """float32 values most of which bf16 (and fp16) cannot hold: rounding them to either would change them."""
    x = (3 * rng(seed).standard_normal(shape) + 1).astype(np.float32)
    assert np.mean(x != x.astype(ml_dtypes.bfloat16).astype(np.float32)) > 0.9
    return x


def exactly(p, inputs):
    """The interpreter's result and the reference's, with any InexactInputWarning an error: float32 data is taken as
    it is."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactInputWarning)
        return spatialc.evaluate(p, inputs), reference(p, inputs)


def test_every_spelling_of_float32_is_the_fp32_precision_and_its_inputs_are_float32_tensors():
    for spelling in ("fp32", "float32", "FP32", "float", np.float32, np.dtype("float32"), Precision.FP32):
        assert precision_of(spelling) == Precision.FP32, spelling
    x, y = ew.inputs(2)
    p = spatialc.elementwise(x + y, 8, 8, precision="fp32")
    assert p.precision == Precision.FP32 and p.name == "elementwise_8x8_float32"
    assert {t.dtype for t in p.tensors} == {DType.FLOAT32}
    assert [t.dtype for t in spatialc.softmax(8, 8, "fp32").tensors if t.role == TensorRole.INPUT] == [DType.FLOAT32]


def test_tritons_vector_add_is_the_float32_sum_exactly():
    """Triton's tutorial 01 (x + y of 98,432 float32 values, here as one row of them): the interpreter's sum of the
    float32 inputs is float32's correctly rounded one, the reference's alike."""
    x, y = ew.inputs(2)
    p = spatialc.build(spatialc.elementwise(x + y, 1, 98432, precision="fp32"), "sm_90")
    inputs = {"x0": not_bf16((1, 98432), 1), "x1": not_bf16((1, 98432), 2)}
    got, want = exactly(p, inputs)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, inputs["x0"] + inputs["x1"])
    np.testing.assert_array_equal(want, inputs["x0"] + inputs["x1"])


def softmax64(x: np.ndarray) -> np.ndarray:
    """Softmax of each row in float64, independent of spatialc."""
    e = np.exp(x.astype(np.float64) - x.astype(np.float64).max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("online", [False, True])
def test_tritons_fused_softmax_is_numpys_within_the_tolerance_and_a_bf16_one_is_not(online):
    """Triton's tutorial 02 (softmax of a 1823 × 781 float32 matrix, here 181 rows of 781): the interpreter's result
    against float64 numpy within `spatialc.tolerance`; the same softmax of the inputs rounded to bf16 — what a
    float32 program silently narrowed would give — fails the check."""
    p = spatialc.build(spatialc.softmax(181, 781, "fp32", online=online), "sm_90")
    x = not_bf16((181, 781))
    got, want = exactly(p, {"x": x})
    assert np.abs(got - softmax64(x)).max() < 1e-6 * np.abs(softmax64(x)).max()
    tol = spatialc.tolerance(p)
    ok, how = tol.check(got, {"x": x})
    assert ok, how
    assert tol.check(want.astype(np.float32), {"x": x})[0]
    narrowed = softmax64(x.astype(ml_dtypes.bfloat16).astype(np.float32)).astype(np.float32)
    ok, how = tol.check(narrowed, {"x": x})
    assert not ok, how


def test_an_rmsnorm_of_float32_activations_is_numpys_within_the_tolerance():
    p = spatialc.build(spatialc.rmsnorm(48, 200, "fp32", eps=1e-6), "sm_90")
    x, w = not_bf16((48, 200)), rng(3).standard_normal(200).astype(np.float32)
    got, _ = exactly(p, {"x": x, "weight": w})
    x64 = x.astype(np.float64)
    independent = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert np.abs(got - independent).max() < 1e-5
    ok, how = spatialc.tolerance(p).check(got, {"x": x, "weight": w})
    assert ok, how
    wrong = got.copy()
    wrong[7, 11] *= 1 + 2.0**-10  # a few float32 ulps past the bound
    assert not spatialc.tolerance(p).check(wrong, {"x": x, "weight": w})[0]


def test_a_layernorm_and_a_row_reduction_of_float32_rows():
    x = not_bf16((33, 70))
    ln = spatialc.build(spatialc.layernorm(33, 70, "fp32", weight=False, bias=False), "sm_90")
    got, _ = exactly(ln, {"x": x})
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(got["mean"], mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["out"], (x64 - mean) / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5), atol=1e-5)
    assert spatialc.tolerance(ln).check(got, {"x": x})[0]
    rr = spatialc.build(spatialc.row_reduce(33, 70, "absmax", "fp32"), "sm_90")
    got, _ = exactly(rr, {"x": x})
    np.testing.assert_array_equal(got[:, 0], np.abs(x).max(axis=1))  # a max of float32 values: exact


def test_a_spatialc_lang_softmax_of_float32_is_the_built_one(tmp_path):
    """examples/lang_softmax.py declared float32: the traced program is what spatialc.softmax(…, "fp32") builds, and
    its result numpy's."""
    source = (Path(__file__).parents[2] / "examples" / "lang_softmax.py").read_text()
    old = 'precision="bf16", name="softmax_64x128_bf16"'
    assert source.count(old) == 1
    scope: dict[str, object] = {"__name__": "fp32_softmax"}
    exec(compile(source.replace(old, 'precision="fp32", name="softmax_64x128_float32"'), "softmax.py", "exec"), scope)
    traced = scope["softmax"]()  # type: ignore[operator]
    built = spatialc.build(spatialc.softmax(64, 128, "fp32"), "sm_90", block=(2, 4, 1), sites=2)
    assert traced.verified and traced == built
    x = not_bf16((64, 128))
    got, _ = exactly(traced, {"x": x})
    assert np.abs(got - softmax64(x)).max() < 1e-6


def test_a_float32_program_round_trips_as_a_version_12_document():
    p = spatialc.build(spatialc.softmax(40, 70, "fp32"), "sm_90")
    doc = json.loads(spatialc.to_json(p))
    assert doc["version"] == serde.VERSION == 12 and doc["program"]["precision"] == "float32"
    back = spatialc.from_json(json.dumps(doc))
    assert back == p and back.verified


# ---- programs with a matmul refuse float32 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: spatialc.gemm(64, 64, 64, precision="fp32"),
        lambda: spatialc.gemm(64, 64, 64, np.float32, epilogue=[spatialc.bias(), spatialc.relu()], out="fp32"),
        lambda: spatialc.grouped_gemm(2, 64, 64, 64, "float32"),
        lambda: spatialc.attention(1, 2, 64, 64, 64, precision="fp32"),
        lambda: spatialc.gemm(64, 64, 256, "fp32", weights="int4"),
    ],
    ids=["gemm", "gemm+epilogue", "grouped_gemm", "attention", "w4a16"],
)
def test_a_program_with_a_matmul_refuses_float32_in_one_line_that_says_the_fix(make):
    with pytest.raises(ProgramError) as caught:
        make()
    text = str(caught.value)
    assert "\n" not in text and NO_FP32_MATMUL in text and FIX in text and "tf32" in text


def test_a_saved_gemm_made_float32_is_refused_by_build_and_by_verify():
    """A document edited to float32 (its precision, tensors and MatmulTiles): build refuses it before planning, and
    the built program, edited so, is refused by verify's rule 1 (so lower, which verifies again, refuses it too)."""
    built = spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90")
    edited = spatialc.from_json(spatialc.to_json(built).replace('"bf16"', '"float32"'))
    assert edited.precision == Precision.FP32
    with pytest.raises(ProgramError, match=FIX):
        spatialc.build(edited.evolve(verified=False))
    with pytest.raises(SpatialError, match=FIX):
        spatialc.verify(edited)


def test_the_cli_runs_float32_row_programs_and_refuses_a_float32_gemm_with_exit_2(capsys):
    assert main(["softmax", "40", "70", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "softmax over 40x70 fp32" in out and "interpreter vs numpy reference: OK" in out
    assert "x0_ring 16384 B" in out  # 2 pages of 8 tiles of float32: 4 bytes an element
    for argv in (["gemm", "64", "64", "64", "--precision", "fp32"], ["attention", "1", "1", "64", "64", "64",
                                                                   "--precision", "fp32"]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and FIX in err and "Traceback" not in err, err


def test_spatialc_torch_maps_float32_tensors_of_a_float32_program_and_refuses_a_float32_gemm_op():
    torch = pytest.importorskip("torch")
    import spatialc.torch as sct

    op = sct.op(lambda m, n: spatialc.softmax(m, n, "fp32"), "test_fp32_softmax", disk_cache=False)
    x = torch.from_numpy(not_bf16((20, 72)))
    got = op(x)
    assert got.dtype == torch.float32
    assert np.abs(got.numpy() - softmax64(x.numpy())).max() < 1e-6
    with pytest.raises(SpatialError, match="takes float32"):
        op(x.to(torch.bfloat16))
    with pytest.raises(ProgramError, match=FIX):
        sct.gemm_op("fp32")

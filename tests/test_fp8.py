"""8-bit float operands (issue 34, first slice): e4m3 (float8_e4m3fn) and e5m2 (float8_e5m2) GEMMs built, verified
and interpreted exactly, their inputs rounded once as ml_dtypes rounds them, e4m3's range refused; sm_80 / sm_86 (no
8-bit float MMA) refusing them by one line (the kernels: tests/lower/test_fp8_kernels.py and test_sm90a_fp8.py)."""

from __future__ import annotations

import dataclasses
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc import inputs
from spatialc.arguments import precision_of
from spatialc.cli import main
from spatialc.errors import SemanticError
from spatialc.inputs import InexactInputWarning, InputError, operand_values
from spatialc.interp import values
from spatialc.ir.nodes import DType
from spatialc.ir.ops import Precision
from spatialc.lower.errors import Unsupported
from spatialc.numerics.reference import reference
from spatialc.numerics.rounding import computed_operand

FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
SCALED = [spatialc.row_scale(), spatialc.col_scale(), spatialc.bias()]


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(inputs, "_WARNED", set())  # each test sees the once-per-process warnings itself


def fp8_gemm(m: int, n: int, k: int, prec: str, epilogue=(), **kw) -> spatialc.SpatialProgram:
    return spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=list(epilogue), **kw), "sm_90")


def scaled_inputs(m: int, n: int, k: int, prec: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A and B as ml_dtypes arrays (values spread over the format's exponents, A's past 1 and below 2^-6), the
    dequant scales and a bias as float32."""
    rng = np.random.default_rng(seed)
    ty = FORMATS[prec]
    return {
        "A": (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-8, 6, (m, k))).clip(-400, 400).astype(ty),
        "B": rng.standard_normal((k, n)).astype(ty),
        "row_scale": rng.uniform(0.01, 2, m).astype(np.float32),
        "col_scale": rng.uniform(0.01, 2, n).astype(np.float32),
        "bias": rng.standard_normal(n).astype(np.float32),
    }


@pytest.mark.parametrize("prec", ["e4m3", "e5m2"])
@pytest.mark.parametrize(("m", "n", "k"), [(48, 40, 72), (37, 29, 53)])
def test_the_interpreter_equals_the_reference_with_scales_and_bias(prec, m, n, k):
    p = fp8_gemm(m, n, k, prec, SCALED)
    assert p.verified and p.tensor(p.tensors[0].id).dtype == DType(prec)
    x = scaled_inputs(m, n, k, prec)
    c = spatialc.evaluate(p, x)
    assert c.dtype == np.float32  # float32 by default, as bf16 programs
    assert np.array_equal(c, reference(p, x))
    # What the reference is: float64 products of the fp8 values (exact), scaled, biased, then rounded to float32
    a, b = x["A"].astype(np.float64), x["B"].astype(np.float64)
    acc = (a @ b).astype(np.float32).astype(np.float64)  # the float32 the epilogue starts from
    want = (acc * x["row_scale"][:, None]).astype(np.float32).astype(np.float64)
    want = (want * x["col_scale"][None, :]).astype(np.float32).astype(np.float64)
    assert np.array_equal(c, (want + x["bias"]).astype(np.float32))
    ok, how = spatialc.tolerance(p).check(c, x)
    assert ok and "max |error| 0 " in how


def test_a_per_tensor_scale_is_a_scalar_mul():
    p = fp8_gemm(37, 29, 53, "e4m3", [spatialc.scalar("mul", 0.375), spatialc.col_scale()])
    x = {k: v for k, v in scaled_inputs(37, 29, 53, "e4m3").items() if k in ("A", "B", "col_scale")}
    c = spatialc.evaluate(p, x)
    acc = (x["A"].astype(np.float64) @ x["B"].astype(np.float64)).astype(np.float32).astype(np.float64)
    want = (acc * 0.375).astype(np.float32).astype(np.float64) * x["col_scale"][None, :]
    assert np.array_equal(c, want.astype(np.float32)) and np.array_equal(c, reference(p, x))


@pytest.mark.parametrize("prec", ["e4m3", "e5m2"])
def test_a_bf16_output_is_the_float32_result_rounded(prec):
    p = fp8_gemm(33, 20, 40, prec, out="bf16")
    x = {k: v for k, v in scaled_inputs(33, 20, 40, prec).items() if k in "AB"}
    c = spatialc.evaluate(p, x)
    assert np.array_equal(c, inputs.round_bf16(x["A"].astype(np.float64) @ x["B"].astype(np.float64)))


@pytest.mark.parametrize("prec", ["e4m3", "e5m2"])
def test_ml_dtypes_inputs_equal_float32_inputs_on_the_grid(prec):
    p = fp8_gemm(37, 29, 53, prec, SCALED)
    x = scaled_inputs(37, 29, 53, prec, seed=3)
    on_grid = dict(x, A=x["A"].astype(np.float32), B=x["B"].astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # values of the format already: nothing is rounded, nothing said
        assert np.array_equal(spatialc.evaluate(p, x), spatialc.evaluate(p, on_grid))


@pytest.mark.parametrize("prec", ["e4m3", "e5m2"])
def test_float_inputs_round_as_ml_dtypes_casts_them_once_and_say_so(prec):
    rng = np.random.default_rng(5)
    big, tie = (440, 1 + 2.0**-4) if prec == "e4m3" else (50000, 1 + 2.0**-3)  # tie: between 1 and its next value
    spread = (rng.standard_normal(4000) * 2.0 ** rng.integers(-20, 9, 4000)).clip(-big, big)
    x64 = np.concatenate([spread, [big, -big, 0.0, -0.0, tie + 2.0**-30, tie]])  # above a tie by less than float32
    # keeps, and the tie
    want = x64.astype(FORMATS[prec]).astype(np.float64)
    assert want[-2] != want[-1]  # one rounding from float64: through float32 both would be ties
    got = operand_values("A", x64, DType(prec))
    assert got.dtype == np.float32 and np.array_equal(got, want)
    x32 = x64.astype(np.float32)
    assert np.array_equal(operand_values("A", x32, DType(prec)), x32.astype(FORMATS[prec]).astype(np.float32))
    p = fp8_gemm(16, 16, 16, prec)
    with pytest.warns(InexactInputWarning, match=f"{prec} inputs that are not {prec} values were rounded"):
        spatialc.evaluate(p, {"A": rng.standard_normal((16, 16)), "B": np.eye(16)})


def test_e4m3_refuses_what_rounds_past_448_and_e5m2_overflows_to_inf():
    at_tie = operand_values("A", np.array([464.0, -464.0, 460.0]), DType.E4M3)
    assert list(at_tie) == [448.0, -448.0, 448.0]  # 464 is the tie between 448 and 480: to even, 448
    p = fp8_gemm(16, 16, 16, "e4m3")
    a = np.zeros((16, 16))
    a[3, 7], a[5, 1] = 464.5, np.inf
    with pytest.raises(InputError, match=r"tensor A is e4m3 .* but A\[3, 7\] = 464.5 rounds past it \(2 such"):
        spatialc.evaluate(p, {"A": a, "B": np.eye(16)})
    with pytest.raises(InputError, match=r"A\[0, 0\] = -1000 rounds past"):
        spatialc.evaluate(p, {"A": np.full((16, 16), -1000, np.int32), "B": np.eye(16)})
    with pytest.warns(InexactInputWarning, match="some finite values beyond its range became infinite"):
        c = spatialc.evaluate(fp8_gemm(16, 16, 16, "e5m2"), {"A": np.full((16, 16), 61440.0), "B": np.ones((16, 16))})
    assert np.isinf(c).all()


def test_computed_operands_saturate_as_the_gpus_conversion_does():
    x = np.array([500.0, -1e9, np.inf, np.nan, 460.0, 0.3])
    got = computed_operand(x, "e4m3")
    assert np.array_equal(got, [448, -448, 448, np.nan, 448, 0.3125], equal_nan=True)
    assert list(computed_operand(np.array([70000.0, -np.inf]), "e5m2")) == [57344, -57344]


def test_an_fp8_mlp_rounds_its_hidden_layer_to_e4m3():
    from tests.lang.test_lang import example

    fn = example("mlp").mlp.__wrapped__
    program = spatialc.lang.trace(fn, precision="e4m3").verify()
    rng = np.random.default_rng(2)
    x = {
        "X": rng.standard_normal((64, 64)).astype(ml_dtypes.float8_e4m3fn),
        "W1": (rng.standard_normal((64, 128)) * 4).astype(ml_dtypes.float8_e4m3fn),
        "W2": (rng.standard_normal((128, 64)) / 8).astype(ml_dtypes.float8_e4m3fn),
    }
    y = spatialc.evaluate(program, x)
    assert np.array_equal(y, reference(program, x))
    assert spatialc.tolerance(program, kernel=True).check(y, x)[0]


def test_a_planted_wrong_scale_or_format_is_caught_by_the_reference():
    p = fp8_gemm(37, 29, 53, "e4m3", SCALED)
    x = scaled_inputs(37, 29, 53, "e4m3")
    c = spatialc.evaluate(p, x)
    tol = spatialc.tolerance(p, kernel=True)
    assert tol.check(c, x)[0]
    wrong_scale = dict(x, row_scale=x["row_scale"] * np.float32(1.01))  # C of another row scale than the one given
    assert not tol.check(spatialc.evaluate(p, wrong_scale), x)[0]
    # A and B rounded to e5m2 where the program says e4m3: the product of other operands
    as_e5m2 = spatialc.evaluate(fp8_gemm(37, 29, 53, "e5m2", SCALED), dict(x, A=x["A"].astype(np.float32)))
    assert not tol.check(as_e5m2, x)[0]


def test_an_interpreter_storing_e4m3_inputs_as_e5m2_is_caught(monkeypatch):
    p = fp8_gemm(37, 29, 53, "e4m3")
    x = {k: v for k, v in scaled_inputs(37, 29, 53, "e4m3").items() if k in "AB"}
    monkeypatch.setitem(values.NARROW, DType.E4M3, ml_dtypes.float8_e5m2)  # a store one format off
    ok, how = spatialc.tolerance(p).check(spatialc.evaluate(p, x), x)
    assert not ok, how


@pytest.mark.parametrize(
    ("target", "forms", "says"),
    [("sm_80", ["auto", "general", "sm90a", "persistent"], "need the tensor cores' e4m3 / e5m2 MMA")],
)
def test_auto_builds_everywhere_and_the_forms_without_fp8_refuse_by_one_line(target, forms, says):
    p = spatialc.build(spatialc.gemm(48, 40, 72, "e5m2", epilogue=SCALED), target)
    assert p.verified
    for form in forms:
        with pytest.raises(Unsupported, match=rf"e5m2 operands\).*: 8-bit float operands {says}"):
            spatialc.lower(p, form=form)
    split = spatialc.build(spatialc.gemm(48, 40, 512, "e4m3"), target, split_k=2)
    assert split.verified and any(t.role.value == "workspace" for t in split.tensors)
    x = scaled_inputs(48, 40, 512, "e4m3")
    assert np.array_equal(spatialc.evaluate(split, {"A": x["A"], "B": x["B"]}), reference(split, x))
    planned = spatialc.build(spatialc.gemm(48, 40, 72, "e4m3"), target, form=forms[-1])
    with pytest.raises(Unsupported, match=says):
        spatialc.lower(planned)


def test_the_precision_names_and_json():
    for name in ("e4m3", "fp8_e4m3", "float8_e4m3fn", ml_dtypes.float8_e4m3fn, np.dtype(ml_dtypes.float8_e4m3fn)):
        assert precision_of(name) == Precision.E4M3
    for name in ("E5M2", "fp8_e5m2", "float8_e5m2", ml_dtypes.float8_e5m2):
        assert precision_of(name) == Precision.E5M2
    p = fp8_gemm(48, 40, 72, "e4m3", SCALED)
    assert spatialc.from_json(spatialc.to_json(p)) == p


def test_rule_8_takes_fp8_operands_of_their_own_precision_only():
    p = fp8_gemm(48, 40, 72, "e4m3")
    assert spatialc.verify(p).verified

    def with_dtype(q, name, dtype):
        t = next(t for t in q.tensors if t.name == name)
        return q.evolve(tensors=tuple(dataclasses.replace(u, dtype=dtype) if u is t else u for u in q.tensors))

    bf16 = spatialc.build(spatialc.gemm(48, 40, 72, "bf16"), "sm_90")
    cases = [
        (with_dtype(bf16, "A", DType.E4M3), "tensor A holds e4m3 values, but the bf16 matmul stage"),
        (with_dtype(p, "B", DType.E5M2), "tensor B holds e5m2 values, but the e4m3 matmul stage"),
        (with_dtype(p, "C", DType.E4M3), "a e4m3 program computes float32 values"),
    ]
    for q, says in cases:
        with pytest.raises(SemanticError, match=says):
            spatialc.verify(q)


def test_torch_float8_tensors_are_taken_as_they_are():
    torch = pytest.importorskip("torch")
    p = fp8_gemm(37, 29, 53, "e4m3", SCALED)
    x = scaled_inputs(37, 29, 53, "e4m3")
    given = dict(x, A=torch.from_numpy(x["A"].astype(np.float32)).to(torch.float8_e4m3fn))
    assert precision_of(torch.float8_e4m3fn) == Precision.E4M3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(spatialc.evaluate(p, given), spatialc.evaluate(p, x))


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_cli_runs_fp8_for_sm86_through_the_interpreter_and_refuses_to_emit(capsys, tmp_path):
    sm86 = ("--precision", "e4m3", "--target", "sm_86")
    status, out, _ = run_cli(capsys, "gemm", "48", "40", "72", *sm86, "--row-scale", "--run")
    assert status == 0
    assert "check     interpreter vs numpy reference: OK" in out
    assert "run       the interpreter's, checked above: no CUDA form multiplies 8-bit floats on sm_86" in out
    status, _, err = run_cli(capsys, "gemm", "48", "40", "72", *sm86, "--emit", str(tmp_path))
    assert status == 2 and err.count("\n") == 1
    assert "8-bit float operands need the tensor cores' e4m3 / e5m2 MMA" in err
    assert not any(tmp_path.iterdir())


def test_the_python_guides_fp8_example_runs():
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "python.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if '"e4m3"' in b]
    space = {"np": np, "spatialc": spatialc}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InexactInputWarning)  # B is rounded, and said so
        exec(compile(example, "docs/python.md", "exec"), space)
    assert space["c"].dtype == np.float32 and np.array_equal(space["c"], reference(space["p"], space["x"]))


def test_a_torch_op_of_an_fp8_program_takes_float8_tensors_on_the_cpu():
    torch = pytest.importorskip("torch")
    import spatialc.torch as spatial_torch

    def family(m: int, n: int, k: int) -> spatialc.SpatialProgram:
        return spatialc.gemm(m, n, k, "e4m3", epilogue=[spatialc.row_scale()])

    op = spatial_torch.op(family, "fp8_gemm_test", disk_cache=False)
    a, b = torch.randn(37, 53).to(torch.float8_e4m3fn), torch.randn(53, 29).to(torch.float8_e4m3fn)
    s = torch.rand(37, 1)
    c = op(a, b, s)  # the interpreter, on CPU tensors
    assert c.dtype == torch.float32
    assert torch.equal(c, ((a.double() @ b.double()).float().double() * s.double()).float())
    with pytest.raises(InputError, match="A is float32; this op takes float8_e4m3fn"):
        op(a.float(), b, s)

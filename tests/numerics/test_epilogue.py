"""Epilogues in the IR, verifier and interpreter, against formulas written out independently here."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spatialc
import spatialc.passes.verify
from spatialc.errors import TileBoundsError, VerifyError
from spatialc.frontend import bias, relu, requant, scalar
from spatialc.ir import ops
from spatialc.numerics import epilogue as epilogue_module
from spatialc.numerics.quant import quantize_multiplier

from .test_quant import ref_requant


def independent(prec: str, a, b, stages, params) -> np.ndarray:
    """C = stages(A @ B), each stage spelled out on whole matrices (int64 exact, or float32 for float programs)."""
    if prec == "int8":
        x = a.astype(np.int64) @ b.astype(np.int64)
    else:
        cast = np.float16 if prec == "fp16" else None
        af, bf = (a.astype(cast).astype(np.float64), b.astype(cast).astype(np.float64)) if cast else (a, b)
        x = (af @ bf).astype(np.float32)
    for kind, arg in stages:
        if kind == "bias":
            x = x + (params[arg].astype(np.int64) if prec == "int8" else params[arg].astype(np.float32))[None, :]
        elif kind == "relu":
            x = np.where(x > 0, x, 0).astype(x.dtype)
        elif kind == "scalar":
            op, v = arg
            v = np.int64(v) if prec == "int8" else np.float32(v)
            x = {"add": x + v, "mul": x * v, "max": np.maximum(x, v), "min": np.minimum(x, v)}[op]
        elif kind == "requant":
            scale, zp = arg
            mult, shift = quantize_multiplier(scale)
            x = np.array([ref_requant(int(e), mult, shift, zp) for e in x.reshape(-1)]).reshape(x.shape).astype(np.int8)
    return x


def spec_to_epilogue(stages):
    out = []
    for kind, arg in stages:
        out.append(
            {
                "bias": lambda a: bias(a),
                "relu": lambda a: relu(),
                "scalar": lambda a: scalar(*a),
                "requant": lambda a: requant(*a),
            }[kind](arg)
        )
    return out


INT_STAGES = st.lists(
    st.sampled_from(
        [
            ("bias", "bias"),
            ("relu", None),
            ("scalar", ("add", 7)),
            ("scalar", ("mul", -2)),
            ("scalar", ("max", -100)),
            ("scalar", ("min", 900)),
        ]
    ),
    max_size=3,
    unique_by=lambda s: s[0] if s[0] == "bias" else str(s),
)
FLOAT_STAGES = st.lists(
    st.sampled_from(
        [
            ("bias", "bias"),
            ("relu", None),
            ("scalar", ("add", 0.25)),
            ("scalar", ("mul", 0.5)),
            ("scalar", ("min", 3.0)),
        ]
    ),
    max_size=3,
    unique_by=lambda s: s[0] if s[0] == "bias" else str(s),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 90),
    st.integers(1, 90),
    st.integers(1, 90),
    INT_STAGES,
    st.sampled_from([None, (0.003, 0), (0.02, -7), (1.5, 100)]),
    st.sampled_from(["contiguous", "round_robin"]),
    st.integers(0, 2**31),
)
def test_int8_epilogues_equal_the_independent_formulas(m, n, k, stages, rq, placement, seed):
    stages = list(stages) + ([("requant", rq)] if rq else [])
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, n))
    params = {"bias": rng.integers(-(2**20), 2**20, n)}
    p = spatialc.build(
        spatialc.gemm(m, n, k, "int8", epilogue=spec_to_epilogue(stages)),
        "sm_86",
        sites=3,
        placement=placement,
        block=(1, 2, 1),
    )
    inputs = {"A": a, "B": b, **({"bias": params["bias"]} if any(s[0] == "bias" for s in stages) else {})}
    got = spatialc.evaluate(p, inputs)
    want = independent("int8", a, b, stages, params)
    if not stages:  # a bare int8 GEMM stores its int32 sums; an epilogue's int64 values stay int64
        want = want.astype(np.int32)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_an_integer_chain_past_two_to_the_53_stays_exact():
    """float64 holds only even integers past 2^53: the interpreter keeps an integer chain's values as int64, as the
    kernels' long long does (an odd value there came back one less)."""
    m, n, k = 16, 24, 520
    chain = [scalar("mul", -(1 << 30)), scalar("add", 5)]
    p = spatialc.build(spatialc.gemm(m, n, k, "int8", epilogue=chain), "sm_86")
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    a[0] = -128
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    b[:, 0] = 127
    want = (a.astype(np.int64) @ b.astype(np.int64)) * -(1 << 30) + 5
    assert want[0, 0] > 2**53 and want[0, 0] % 2 == 1  # -128 · 127 · 520 · -2^30 + 5: odd, past 2^53
    got = spatialc.evaluate(p, {"A": a, "B": b})
    assert got.dtype == np.int64 and np.array_equal(got, want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 70),
    st.integers(1, 70),
    st.integers(1, 70),
    FLOAT_STAGES,
    st.sampled_from(["fp16", "bf16"]),
    st.integers(0, 2**31),
)
def test_float_epilogues_on_integer_valued_data_are_exact(m, n, k, stages, prec, seed):
    # Integer-valued inputs make every product and sum exact in float32, so the float chain must match exactly.
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-8, 8, (m, k)).astype(float), rng.integers(-8, 8, (k, n)).astype(float)
    params = {"bias": rng.integers(-50, 50, n).astype(float)}
    p = spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=spec_to_epilogue(stages)), "sm_80", sites=2)
    inputs = {"A": a, "B": b, **({"bias": params["bias"]} if any(s[0] == "bias" for s in stages) else {})}
    got = spatialc.evaluate(p, inputs)
    assert got.dtype == np.float32 and np.array_equal(got, independent(prec, a, b, stages, params))


def test_real_valued_float_epilogue_within_float32_rounding():
    rng = np.random.default_rng(3)
    a, b, v = rng.standard_normal((40, 33)), rng.standard_normal((33, 50)), rng.standard_normal(50)
    a16, b16 = a.astype(np.float16).astype(float), b.astype(np.float16).astype(float)
    p = spatialc.build(spatialc.gemm(40, 50, 33, "fp16", epilogue=[bias(), relu(), scalar("mul", 3.0)]), "sm_90")
    got = spatialc.evaluate(p, {"A": a16, "B": b16, "bias": v})
    want = independent("fp16", a16, b16, [("bias", "bias"), ("relu", None), ("scalar", ("mul", 3.0))], {"bias": v})
    # float64 sums rounded once to float32 vs float32 products: a few float32 ulps of the magnitudes involved.
    assert np.allclose(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize(("scale", "zp"), [(0.5, 0), (0.25, 3), (0.5, -128), (1.0, 127), (2.0, 0), (1 / 3, -5)])
def test_requant_edge_values_through_the_whole_program(scale, zp):
    # A = ones and B = ±1 with K = 1 make the accumulator ±1; the bias then places any int32 value before requant.
    values = np.array(
        [0, 1, -1, 2, -2, 3, -3, 5, -5, 6, -6, 255, 256, -255, -256, 2**31 - 1, -(2**31), 10**6, -(10**6)],
        dtype=np.int64,
    )
    n = len(values)
    p = spatialc.build(spatialc.gemm(2, n, 1, "int8", epilogue=[bias(), requant(scale, zp)]), "sm_86")
    sign = np.where(values < 0, -1, 1)
    got = spatialc.evaluate(p, {"A": np.ones((2, 1)), "B": sign[None, :], "bias": values - sign})
    mult, shift = quantize_multiplier(scale)
    want = [ref_requant(int(v), mult, shift, zp) for v in values]
    assert got.dtype == np.int8 and got[0].tolist() == want and got[1].tolist() == want


def test_a_bias_read_at_the_wrong_columns_is_caught(monkeypatch):
    # The planted fault: the column vectors' values laid over the columns in reverse. The independent check sees it.
    rng = np.random.default_rng(0)
    a, b, v = rng.integers(-128, 128, (48, 20)), rng.integers(-128, 128, (20, 48)), rng.integers(-999, 999, 48)
    p = spatialc.build(spatialc.gemm(48, 48, 20, "int8", epilogue=[bias()]), "sm_86")
    want = independent("int8", a, b, [("bias", "bias")], {"bias": v})
    assert np.array_equal(spatialc.evaluate(p, {"A": a, "B": b, "bias": v}), want)
    real = epilogue_module._as_row
    monkeypatch.setattr(epilogue_module, "_as_row", lambda col: lambda c: real(col)(c)[:, ::-1])
    assert not np.array_equal(spatialc.evaluate(p, {"A": a, "B": b, "bias": v}), want)


def _with_bias(p, change):
    """`p` with `change` applied to the column vector of each bias op its engines run."""

    def fix(op):
        if isinstance(op, ops.Compute) and isinstance(op.op, ops.Map) and ops.cols(op.op.expr):
            return dataclasses.replace(op, op=ops.Map(ops.with_cols(op.op.expr, change)))
        if isinstance(op, ops.Loop):
            return dataclasses.replace(op, body=tuple(map(fix, op.body)))
        return op

    progs = tuple(dataclasses.replace(pr, ops=tuple(map(fix, pr.ops))) for pr in p.schedule.programs)
    return p.evolve(schedule=dataclasses.replace(p.schedule, programs=progs))


def test_verify_checks_epilogue_stages():
    p = spatialc.build(spatialc.gemm(64, 48, 32, "int8", epilogue=[bias(), relu()]), "sm_86", sites=3)
    assert p.verified
    shifted = _with_bias(p, lambda b: dataclasses.replace(b, at=ops.TileAddr(1, b.at.steps)))
    with pytest.raises(TileBoundsError, match=r"site \d compute: Compute bias bias.*outside its 1x\d tile grid"):
        spatialc.passes.verify.verify(shifted)
    wrong_tensor = _with_bias(p, lambda b: dataclasses.replace(b, tensor=spatialc.ir.TensorId(0)))
    with pytest.raises(
        VerifyError, match=r"a column vector \(a bias\) is a parameter tensor of one row of values in one row of"
    ):
        spatialc.passes.verify.verify(wrong_tensor)
    too_wide = _with_bias(p, lambda b: dataclasses.replace(b, width=5))
    with pytest.raises(VerifyError):
        spatialc.passes.verify.verify(too_wide)


def test_epilogue_inputs_are_checked():
    p = spatialc.build(spatialc.gemm(16, 16, 16, "int8", epilogue=[bias()]), "sm_86")
    ones = np.ones((16, 16), dtype=np.int8)
    with pytest.raises(spatialc.SpatialError, match="needs tensor bias"):
        spatialc.evaluate(p, {"A": ones, "B": ones})
    with pytest.raises(spatialc.SpatialError, match="outside"):
        spatialc.evaluate(p, {"A": ones, "B": ones, "bias": np.full(16, 2**40)})

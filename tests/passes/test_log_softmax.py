"""log_softmax (torch.log_softmax(x, -1)) and the row log-sum-exp (`row_reduce(op="logsumexp")`, torch.logsumexp):
row programs of softmax's passes with another last map — x − max − log Σ exp(x − max) — or a map of the two row
vectors alone (the log-sum-exp in one online pass). Each against numpy in float64; a row where softmax underflows
keeps finite log-probabilities; a row of −∞ has a log-sum-exp of −∞, not NaN; the general form's kernel emulated
within the kernel tolerance; the CLI's `log-softmax` and `row-reduce --op logsumexp`."""

from __future__ import annotations

import shutil
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.cli import main
from spatialc.ir.ids import LV_K
from spatialc.ir.ops import Loop, walk


def _lse(v: np.ndarray) -> np.ndarray:
    mx = v.max(axis=1, keepdims=True)
    return mx + np.log(np.exp(v - mx).sum(axis=1, keepdims=True))


def _x(m: int, n: int, seed: int = 0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal((m, n)) * 4).astype(ml_dtypes.bfloat16)
    x[1, :] = ml_dtypes.bfloat16(-3000.0)  # an even row far below zero
    x[1, 7] = ml_dtypes.bfloat16(0.0)  # where exp(x) of the others underflows: softmax 0, log-softmax ≈ −3000
    return x


@pytest.mark.parametrize("online", [False, True])
def test_log_softmax_is_x_less_its_rows_log_sum_exp(online):
    p = spatialc.build(spatialc.log_softmax(40, 70, online=online), block=(1, 2, 1), sites=2)
    x = _x(40, 70)
    got = spatialc.evaluate(p, {"x": x})
    v = x.astype(np.float64)
    np.testing.assert_allclose(got, v - _lse(v), rtol=1e-6, atol=2e-6)
    assert np.isfinite(got).all() and got[1, 0] == pytest.approx(float(x[1, 0]))  # log(softmax) would be −∞ there
    reader = next(q for q in p.schedule.programs if q.engine.value == "reader")  # site 0's
    reads = sum(isinstance(op, Loop) and op.var == LV_K for op in walk(reader.ops))
    assert reads == (2 if online else 3)  # passes over each row
    ok, how = spatialc.tolerance(p).check(got, {"x": x})
    assert ok, how


def test_the_row_log_sum_exp_is_one_pass_and_minus_inf_for_a_row_of_minus_inf():
    p = spatialc.build(spatialc.row_reduce(40, 70, "logsumexp"), block=(1, 2, 1), sites=2)
    x = _x(40, 70).astype(np.float32)
    x[5, :] = -np.inf
    with warnings.catch_warnings():  # ±inf inputs are said once a process (whichever test comes first)
        warnings.simplefilter("ignore")
        got = spatialc.evaluate(p, {"x": x})
    v = x.astype(np.float64)
    want = _lse(np.where(np.isinf(v), 0.0, v))
    rows = np.arange(40) != 5
    np.testing.assert_allclose(got[rows], want[rows], rtol=1e-6, atol=1e-6)
    assert got[5, 0] == -np.inf
    site = [q for q in p.schedule.programs if q.site == p.schedule.programs[0].site]
    loops = [op for q in site for op in walk(q.ops) if isinstance(op, Loop) and op.var == LV_K]
    assert len(loops) == 2  # one pass: the reader's loop and the compute engine's, nothing for the writer


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_the_general_forms_log_softmax_is_within_the_kernel_tolerance():
    p = spatialc.build(spatialc.log_softmax(40, 70, online=True), block=(1, 2, 1), sites=2)
    x = {"x": _x(40, 70)}
    got = spatialc.emulate(spatialc.lower(p), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how


def test_the_cli_builds_and_checks_both(capsys):
    assert main(["log-softmax", "48", "100", "--online"]) == 0
    assert "check     interpreter vs numpy reference: OK" in capsys.readouterr().out
    assert main(["row-reduce", "48", "100", "--op", "logsumexp"]) == 0
    assert "check     interpreter vs numpy reference: OK" in capsys.readouterr().out
    assert main(["log-softmax", "48", "100", "--precision", "int8"]) == 2
    assert "log_softmax is float arithmetic" in capsys.readouterr().err

"""A hostile review of float32 programs, log_softmax / logsumexp and spatialc.torch's row functions (session 51):
float64 and integer data given to a float32 tensor is rounded and said so, as bf16 data is (a finite 1e300 that
becomes inf included), on the host and by the GPU launcher; the reference's log-sum-exp of a row of −∞ alone is the
interpreter's, a kernel's and torch's −∞ (it was NaN, so a check of a right result failed); a warning from a
spatialc.torch function names the user's line, not torch's dispatch; a weight of integers is named by its dtype; a
numpy integer dim is taken as torch takes it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc import inputs as spatial_inputs
from spatialc.inputs import InexactInputWarning, InputError, NonFiniteInputWarning
from spatialc.numerics.reference import reference
from spatialc.runtime import launch

from ..stand_in import StandInDevice


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(spatial_inputs, "_WARNED", set())
    monkeypatch.setattr(spatial_inputs, "_NONFINITE_WARNED", [])


def _fp32_row_sum():
    return spatialc.build(spatialc.row_reduce(4, 32, "sum", "fp32"), "sm_90")


def test_float64_data_for_a_float32_program_is_said_to_be_rounded(fresh_warnings):
    x = np.full((4, 32), 0.1)  # numpy's default float64: 0.1 is no float32 value
    with pytest.warns(InexactInputWarning, match=r"float32 inputs .* rounded .* by at most 1\.49e-09"):
        got = spatialc.evaluate(_fp32_row_sum(), {"x": x})
    assert got.dtype == np.float32
    with warnings.catch_warnings():  # float32 data is taken as it is: nothing to say
        warnings.simplefilter("error")
        spatial_inputs._WARNED.clear()
        spatialc.evaluate(_fp32_row_sum(), {"x": x.astype(np.float32)})


def test_a_finite_float64_past_float32_is_said_to_become_infinite(fresh_warnings):
    with pytest.warns(InexactInputWarning, match="beyond its range became infinite"):
        got = spatialc.evaluate(_fp32_row_sum(), {"x": np.full((4, 32), 1e300)})
    assert np.isinf(got).all()


def test_the_gpu_launcher_says_float64_data_for_a_float32_program_is_rounded(fresh_warnings):
    x0 = ew.inputs(1)[0]
    art = spatialc.lower(spatialc.build(spatialc.elementwise(x0 * 2, 16, 16, precision="fp32"), "sm_90"))
    with pytest.warns(InexactInputWarning, match="float32 inputs"):
        launch.run_with(StandInDevice(), art, np.full((16, 16), 0.1))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_log_sum_exp_of_a_row_of_minus_infinity_is_minus_infinity_in_the_reference(precision):
    """The online pass reads its running max as max(m, float32's lowest): Σ exp is 0, not NaN, in a row of −∞ alone,
    and its log-sum-exp −∞ (torch.logsumexp's); the reference computes the pass's map, so the check holds."""
    p = spatialc.build(spatialc.row_reduce(2, 16, "logsumexp", precision), "sm_90")
    x = np.zeros((2, 16), np.float32)
    x[0] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteInputWarning)
        got, want = spatialc.evaluate(p, {"x": x}), reference(p, {"x": x})
        ok, how = spatialc.tolerance(p).check(got, {"x": x})
    assert got[0, 0] == -np.inf and want[0, 0] == -np.inf
    assert want[1, 0] == pytest.approx(np.log(16.0))
    assert ok, how


torch = pytest.importorskip("torch")
import spatialc.torch as sct  # noqa: E402


def test_a_warning_from_a_torch_row_function_names_the_callers_line(fresh_warnings):
    x = torch.zeros(2, 24)
    x[0, 3] = float("nan")
    with pytest.warns(NonFiniteInputWarning) as caught:
        sct.softmax(x)
    assert caught[0].filename == __file__  # not torch's custom_ops.py, through which the op runs


def test_a_weight_of_integers_is_named_by_its_dtype():
    with pytest.raises(InputError, match=r"weight is a int32 tensor; pass a float tensor of 24 values"):
        sct.rms_norm(torch.randn(3, 24), torch.ones(24, dtype=torch.int32))


def test_a_numpy_integer_dim_is_taken_as_torch_takes_it():
    x = torch.randn(3, 24)
    got = sct.log_softmax(x, np.int64(-1))
    assert torch.allclose(got, torch.log_softmax(x, np.int64(-1)), atol=1e-6)


@pytest.mark.parametrize("make", [spatialc.rmsnorm, spatialc.layernorm])
def test_an_eps_past_float32_is_refused_where_it_is_given(make):
    """The programs add eps in float32: 1e39 is refused by the constructor in its own words (it was an
    IllFormedError of 'a float32 program's epilogue' from build), the torch functions alike."""
    with pytest.raises(spatialc.ProgramError, match=r"eps is a finite number ≥ 0 within float32 .* not 1e\+39"):
        make(4, 32, "fp32", eps=1e39)
    assert make(4, 32, "fp32", eps=3e38).name  # float32 holds it


def test_the_torch_functions_refuse_an_eps_past_float32_in_their_words():
    with pytest.raises(spatialc.ProgramError, match=r"spatialc\.torch\.rms_norm's eps is .* within float32"):
        sct.rms_norm(torch.ones(2, 24), None, 1e39)

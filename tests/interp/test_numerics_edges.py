"""Numeric edges of the reference interpreter and the checks around it (issue 30, points 3, 5 and 6)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import spatialc

# ---- int8 sums past int32 (issue 30, point 5) --------------------------------------------------------------------

LONG_K = 131072  # the shortest K whose int8 dot products pass int32 (128 · 128 · 2^17 = 2^31): C is int64


@pytest.mark.parametrize("build", [{}, {"split_k": 1}, {"split_k": 4}, {"form": "general", "split_k": 1}])
def test_an_int64_output_of_long_int8_sums_is_exact(build):
    """C is int64 at this K, and the float64 sums were written into it with np.matmul(out=…), which refused to cast
    (exit 3 from `spatialc gemm 16 16 131072`): every split, the general form's plan and none."""
    p = spatialc.build(spatialc.gemm(16, 16, LONG_K, "int8"), **build)
    assert p.output_tensor().dtype.value == "int64"
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, size=(16, LONG_K), dtype=np.int8)
    b = rng.integers(-128, 128, size=(LONG_K, 16), dtype=np.int8)
    a[0], b[:, 0] = -128, -128  # C[0, 0] = 2^31, one past int32
    c = spatialc.evaluate(p, {"A": a, "B": b})
    want = a.astype(np.int64) @ b.astype(np.int64)  # integer arithmetic: exact
    assert c.dtype == np.int64 and c[0, 0] == 2**31
    np.testing.assert_array_equal(c, want)


# ---- memory, before anything is allocated (issue 30, point 6) ----------------------------------------------------


@pytest.fixture(scope="module")
def tall():
    """65536 × 16 × 32768 int8: A alone is 2 GiB (16 GiB when the interpreter held it as float64)."""
    return spatialc.build(spatialc.gemm(65536, 16, 32768, "int8"))


def test_evaluate_refuses_past_its_memory_limit_before_allocating(tall):
    import time
    import tracemalloc

    from spatialc.interp.errors import TooLarge

    a = np.broadcast_to(np.int8(1), (65536, 32768))  # the shape without the memory
    b = np.ones((32768, 16), np.int8)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(
            TooLarge, match=r"needs \d+ bytes \(.*A's store 2\.0 GiB.*\); the interpreter takes at most"
        ):
            spatialc.evaluate(tall, {"A": a, "B": b})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 2 and peak < 16 << 20  # refused from the plan, not from an allocation
    with pytest.raises(TooLarge, match=r"rows=\.\.\..* max_bytes"):  # the way out is in the message
        spatialc.evaluate(tall, {"A": a, "B": b})


def test_max_bytes_bounds_a_small_evaluation_too():
    from spatialc.interp.errors import TooLarge

    p = spatialc.build(spatialc.gemm(64, 64, 64, "int8"))
    inputs = {"A": np.ones((64, 64), np.int8), "B": np.ones((64, 64), np.int8)}
    with pytest.raises(TooLarge, match="max_bytes is 1000 bytes"):
        spatialc.evaluate(p, inputs, max_bytes=1000)
    assert (spatialc.evaluate(p, inputs) == 64).all()


@pytest.mark.parametrize(("precision", "kind"), [("int8", np.int8), ("fp16", np.float16), ("bf16", np.float32)])
def test_operands_nothing_writes_are_stored_in_their_own_narrow_type(precision, kind):
    from spatialc.interp.evaluate import load_inputs

    p = spatialc.build(spatialc.gemm(32, 32, 48, precision))
    stores, _ = load_inputs(p, {"A": np.ones((32, 48), kind), "B": np.ones((48, 32), kind)})
    by_name = {s.tensor.name: s.arr.dtype for s in stores.values()}
    assert by_name == {"A": kind, "B": kind, "C": np.float64}


def test_a_whole_output_is_never_held_twice_in_pending_writes(monkeypatch):
    """An epilogue's pages wait in the store's pending writes; past PENDING_ELEMS they are applied, same result."""
    from spatialc.frontend import bias
    from spatialc.interp import values

    p = spatialc.build(spatialc.gemm(96, 96, 64, "int8", epilogue=[bias()]), "sm_86", block=(1, 1, 1))
    rng = np.random.default_rng(1)
    inputs = {
        "A": rng.integers(-128, 128, (96, 64), dtype=np.int8),
        "B": rng.integers(-128, 128, (64, 96), dtype=np.int8),
        "bias": rng.integers(-1000, 1000, 96).astype(np.int32),
    }
    whole = spatialc.evaluate(p, inputs)
    flushes = []
    real = values.Store.flush
    monkeypatch.setattr(values, "PENDING_ELEMS", 4 * 256)
    monkeypatch.setattr(values.Store, "flush", lambda self: (flushes.append(len(self.pending)), real(self))[1])
    np.testing.assert_array_equal(spatialc.evaluate(p, inputs), whole)
    assert max(flushes) <= 5 and len(flushes) > 8  # applied a few pages at a time, not all 36 at the end


# ---- a sample of C's rows (spatialc.evaluate(rows=...), spatialc gemm --check sampled) ----------------------------


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_a_sample_of_rows_is_exactly_those_rows_of_the_whole_run(precision):
    p = spatialc.build(spatialc.gemm(200, 96, 320, precision), "sm_86")
    rng = np.random.default_rng(2)
    if precision == "int8":
        a, b = (rng.integers(-128, 128, s, dtype=np.int8) for s in ((200, 320), (320, 96)))
    else:
        a, b = (spatialc.inputs.round_bf16(rng.standard_normal(s)).astype(np.float32) for s in ((200, 320), (320, 96)))
    whole = spatialc.evaluate(p, {"A": a, "B": b})
    rows = [199, 0, 17, 100, 101]
    part = spatialc.evaluate(p, {"A": a[rows], "B": b}, rows=rows)
    np.testing.assert_array_equal(part, whole[rows])
    ok, _ = spatialc.tolerance(p).check(part, {"A": a[rows], "B": b}, rows=rows)
    assert ok


def test_a_sample_multiplies_only_its_rows(monkeypatch):
    from spatialc.interp import blas, pages, values

    p = spatialc.build(spatialc.gemm(512, 64, 256, "int8"), "sm_86")
    rows = list(range(32, 48))
    seen = []
    real = values.matmul

    def counted(a, b, out=None):
        seen.append(a.shape[0])
        return real(a, b, out)

    for where in (blas, pages):  # live_matmul's lookup and realise's (once both values.py's)
        monkeypatch.setattr(where, "matmul", counted)
    a = np.ones((16, 256), np.int8)
    c = spatialc.evaluate(p, {"A": a, "B": np.ones((256, 64), np.int8)}, rows=rows)
    assert (c == 256).all() and c.shape == (16, 64)
    assert sum(seen) <= 2 * 16  # a tile row, not 512 rows


def test_a_grouped_sample_takes_the_same_rows_of_every_group():
    p = spatialc.build(spatialc.grouped_gemm(3, 40, 32, 48, "bf16"), "sm_86")
    rng = np.random.default_rng(3)
    a = spatialc.inputs.round_bf16(rng.standard_normal((3, 40, 48))).astype(np.float32)
    b = spatialc.inputs.round_bf16(rng.standard_normal((3, 48, 32))).astype(np.float32)
    sizes = np.array([40, 20, 0], np.int32)
    whole = spatialc.evaluate(p, {"A": a, "B": b, "sizes": sizes})
    rows = [0, 19, 20, 39]
    part = spatialc.evaluate(p, {"A": a[:, rows], "B": b, "sizes": sizes}, rows=rows)
    np.testing.assert_array_equal(part, whole[:, rows])
    assert spatialc.tolerance(p).check(part, {"A": a[:, rows], "B": b, "sizes": sizes}, rows=rows)[0]


@pytest.mark.parametrize("rows", [[0, 0], [64], "0"])
def test_a_sample_of_rows_that_are_not_rows_is_refused(rows):
    from spatialc.errors import SpatialError

    p = spatialc.build(spatialc.gemm(64, 32, 32, "int8"), "sm_86")
    with pytest.raises(SpatialError, match="rows"):
        spatialc.evaluate(p, {"A": np.ones((len(rows), 32), np.int8), "B": np.ones((32, 32), np.int8)}, rows=rows)


# ---- the command's --check ----------------------------------------------------------------------------------------


def run_cli(capsys, *argv):
    from spatialc.cli import main

    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_a_full_check_past_memory_is_one_line_before_any_input_is_made(capsys, monkeypatch):
    monkeypatch.setattr("spatialc.cli.commands.random_inputs", lambda *a: pytest.fail("inputs made before the check"))
    status, out, err = run_cli(capsys, "gemm", "65536", "16", "32768", "--check", "full")
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "random A 2.0 GiB" in err and "--check sampled" in err and "--check none" in err


def test_the_default_above_a_billion_multiply_adds_is_a_sample(capsys):
    status, out, err = run_cli(capsys, "gemm", "2048", "1024", "1024", "--target", "sm_86")
    assert status == 0, err
    check = next(line for line in out.splitlines() if "check " in line)
    assert "on rows 0..15, " in check and "2032..2047 of C (--check sampled; the default above" in check
    assert check.endswith("OK, exact")
    assert re.search(r"time +build \d+ ms, evaluate \d+ ms, check \d+ ms, lower", out)


def test_check_none_runs_no_interpreter_and_says_so(capsys, monkeypatch):
    monkeypatch.setattr(spatialc.api, "evaluate", lambda *a, **k: pytest.fail("the interpreter ran"))
    status, out, err = run_cli(capsys, "gemm", "64", "64", "64", "--check", "none")
    assert status == 0, err
    assert "check     none (--check none)" in out and re.search(r"time +build \d+ ms, check none, lower", out)


def test_a_sampled_grouped_check(capsys):
    status, out, err = run_cli(capsys, "grouped-gemm", "3", "100", "32", "32", "--check", "sampled")
    assert status == 0, err
    assert "interpreter vs numpy reference on rows 0..15, " in out and "..99 of C (--check sampled)" in out


# ---- inputs that are not arrays (issue 30, point 9) ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "said"), [(None, "got None"), ("A", "got a str ('A')"), (3.0, "got a float (3.0)")])
def test_an_input_that_is_no_array_is_named_as_what_it_is(value, said):
    from spatialc.inputs import InputError

    p = spatialc.build(spatialc.gemm(32, 32, 64, "int8"), "sm_86")
    with pytest.raises(InputError, match=rf"tensor A: expected an array of shape \(32, 64\), {re.escape(said)}$"):
        spatialc.evaluate(p, {"A": value, "B": np.ones((64, 32), np.int8)})


# ---- bf16 at the edge of float32's range, and inputs that are not finite (issue 30, point 3) ---------------------


@pytest.fixture
def fresh_range_warnings(monkeypatch):
    from spatialc import inputs
    from spatialc.numerics import tolerance as accuracy

    monkeypatch.setattr(accuracy, "_RANGE_WARNED", [])
    monkeypatch.setattr(inputs, "_NONFINITE_WARNED", [])


def edge_inputs():
    """C[0, 0] = 2^127 + 2^127 − 2^127 and C[1, 1] = 2^200 − 2^200 (bf16 has float32's exponents: 2^100 is one)."""
    a, b = np.zeros((16, 16), np.float32), np.zeros((16, 16), np.float32)
    a[0, :3], b[:3, 0] = 2.0**64, [2.0**63, 2.0**63, -(2.0**63)]
    a[1, 3:5], b[3:5, 1] = 2.0**100, [2.0**100, -(2.0**100)]
    return {"A": a, "B": b}


def float32_sums(inputs):
    """C as a kernel's float32 accumulator sums it, in K order."""
    a, b = inputs["A"].astype(np.float32), inputs["B"].astype(np.float32)
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(a.shape[1]):
            c += a[:, k : k + 1] * b[k : k + 1, :]
    return c


def test_a_kernel_sum_past_float32s_range_is_said_once_and_named_in_the_check(fresh_range_warnings):
    import warnings

    from spatialc.numerics.tolerance import RangeWarning

    p = spatialc.build(spatialc.gemm(16, 16, 16, "bf16"), "sm_86")
    x = edge_inputs()
    c = spatialc.evaluate(p, x)
    assert c[0, 0] == 2.0**127 and c[1, 1] == 0  # the interpreter's float64 sums
    kernel = float32_sums(x)
    assert np.isinf(kernel[0, 0]) and np.isnan(kernel[1, 1])
    with pytest.warns(RangeWarning, match=r"2 of C's 256 elements .* float32's largest value .* C\[0, 0\]") as said:
        ok, how = spatialc.tolerance(p, kernel=True).check(kernel, x)
    assert not ok and "2 of the elements outside it lie past float32's range, where it does not hold" in how
    assert said[0].filename == __file__  # the user's line, not spatialc's
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process
        spatialc.tolerance(p, kernel=True).check(kernel, x)
        assert spatialc.tolerance(p).check(c, x)[0]  # the interpreter's bound: float64 sums, no range to leave


def test_strict_refuses_inputs_past_the_range_and_takes_those_within(fresh_range_warnings):
    import warnings

    from spatialc.inputs import InputError

    p = spatialc.build(spatialc.gemm(16, 16, 16, "bf16"), "sm_86")
    with pytest.raises(InputError, match=r"float32's largest value .*\(strict: scale the inputs down\)$"):
        spatialc.tolerance(p, kernel=True, strict=True).check(float32_sums(edge_inputs()), edge_inputs())
    near = {"A": np.full((16, 16), 2.0**60, np.float32), "B": np.full((16, 16), 2.0**60, np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 16 · 2^120 = 2^124: within range, nothing said
        assert spatialc.tolerance(p, kernel=True, strict=True).check(float32_sums(near), near)[0]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_non_finite_inputs_are_said_once_in_spatialcs_words_and_numpy_says_nothing(precision, fresh_range_warnings):
    import warnings

    from spatialc.frontend import bias, scalar
    from spatialc.inputs import NonFiniteInputWarning

    p = spatialc.build(spatialc.gemm(32, 16, 32, precision, epilogue=[bias(), scalar("mul", 0.0)]), "sm_86")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((32, 32)).astype(np.float16).astype(np.float32)
    b = rng.standard_normal((32, 16)).astype(np.float16).astype(np.float32)
    a[0, 0], a[1, 1], b[2, 2] = np.nan, np.inf, -np.inf  # inf · 0 and inf − inf: NaN; NaN · 0 too
    x = {"A": a, "B": b, "bias": np.full(16, np.inf)}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        c = spatialc.evaluate(p, x)
        ok, _ = spatialc.tolerance(p).check(c, x)
        spatialc.tolerance(p, kernel=True).check(c, x)
        spatialc.evaluate(p, x)
    said = [w for w in said if not issubclass(w.category, spatialc.inputs.InexactInputWarning)]  # fp16 into bf16
    assert [w.category for w in said] == [NonFiniteInputWarning], [str(w.message) for w in said]
    assert said[0].filename == __file__ and "holds NaN or ±inf" in str(said[0].message)
    assert ok and np.isnan(c).all()  # everything times 0 after + inf: NaN, in the interpreter and the reference alike


def test_a_nan_where_an_epilogue_op_leaves_the_bound_unbounded_is_within_it():
    # sqrt of C[0, 0] = 4096 + 2^-12 − 4096 − 2^-13 = 2^-13: a float32 sum in K order rounds 4096 + 2^-12 to 4096
    # and ends at −2^-13, whose sqrt is NaN — within the kernel's K + 4 ulps, and the bound there is infinite
    # (sqrt's domain edge lies in the box). The check refused the NaN (the general form's emulation gave it).
    from spatialc.ir.ops import Apply, Arg, Map

    p = spatialc.build(spatialc.gemm(16, 16, 16, "fp16", epilogue=[Map(Apply("sqrt", (Arg(0),)))]), "sm_86")
    a, b = np.zeros((16, 16)), np.ones((16, 16))
    a[0, :4] = [4096.0, 2.0**-12, -4096.0, -(2.0**-13)]
    a[1, 0] = 4.0
    x = {"A": a, "B": b}
    with np.errstate(invalid="ignore"):
        kernel = np.sqrt(float32_sums(x))
    assert np.isnan(kernel[0, 0]) and spatialc.evaluate(p, x)[0, 0] == np.float32(2.0**-6.5)
    tol = spatialc.tolerance(p, kernel=True)
    assert np.isinf(tol.bound(x)[0, 0]) and tol.check(kernel, x)[0]
    kernel[1, 0] = np.nan  # sqrt(4): a NaN where the bound is finite is still refused
    assert not tol.check(kernel, x)[0]


def test_a_softmax_row_masked_with_minus_inf_keeps_a_finite_bound_and_refuses_a_nan():
    # The bound was infinite over every row holding a −∞ (x − max: inf − inf in its spread; exp(−∞): 0 · ∞ in its
    # tail), so a kernel's NaN or any value there passed the check. An op of exact operands is the
    # same op of the same values in every kernel: −∞ − m is −∞ and exp(−∞) is 0, exactly.
    p = spatialc.build(spatialc.softmax(3, 40, "bf16"), "sm_90")
    x = {"x": np.tile(np.linspace(-2.0, 2.0, 40, dtype=np.float32), (3, 1))}
    x["x"][:, :24] = -np.inf
    tol = spatialc.tolerance(p)
    c = spatialc.evaluate(p, x)
    assert tol.check(c, x)[0] and np.all(np.isfinite(tol.bound(x)))
    c[1, 30] = np.nan
    ok, how = tol.check(c, x)
    assert not ok and "1 of 120 elements NaN where the reference is not" in how


def test_a_check_takes_the_inputs_evaluate_takes_and_refuses_the_rest_by_name():
    # A tensor left out was a KeyError from inside the reference, a vector given transposed a reference broadcast
    # to 7 × 7 ("C has shape (1, 7), the reference (7, 7)"), a plain vector for x an IndexError.
    p = spatialc.build(spatialc.rmsnorm(1, 7, "bf16"), "sm_90")
    x, w = np.linspace(-1.0, 1.0, 7).reshape(1, 7), np.ones(7)
    c, tol = spatialc.evaluate(p, {"x": x, "weight": w}), spatialc.tolerance(p)
    assert tol.check(c, {"x": x.reshape(7), "weight": w.reshape(1, 7)})[0]  # as evaluate takes them
    with pytest.raises(spatialc.InputError, match="needs tensor weight"):
        tol.check(c, {"x": x})
    with pytest.raises(spatialc.InputError, match=r"expected shape \(1, 7\), got \(7, 1\)"):
        tol.check(c, {"x": x.reshape(7, 1), "weight": w})


def test_an_fp16_output_a_subnormal_step_off_is_within_the_kernels_bound():
    # exp(−5.2109375 − 7.3903542) is 3.3676626e-06 rounded once, 3.3676624e-06 in the kernel's float32 exp (1 ulp,
    # within the table's 2): rounded to fp16 they lie one subnormal step (2^-24) apart, which 2 fp16 ulps of |C|
    # (6.6e-9) refused. The GPU check's own bound already allowed the step (gpucheck/maps.py's OUT_STEP).
    x = spatialc.ew.inputs(1)[0]
    p = spatialc.build(spatialc.elementwise(spatialc.ew.exp(x - 7.39035416), 1, 2, "fp16", out="fp16"), "sm_90")
    given = {"x0": np.array([[-5.2109375, 0.0]], np.float32)}
    c = spatialc.evaluate(p, given)
    assert c[0, 0] == np.float16(3.3974648e-06)
    kernel = c.copy()
    kernel[0, 0] = np.float16(3.3378601e-06)  # what the emulation gives: 2^-24 less
    assert spatialc.tolerance(p, kernel=True).check(kernel, given)[0]
    kernel[0, 0] = np.float16(3.2782555e-06)  # two steps off: no rounding gives it
    assert not spatialc.tolerance(p, kernel=True).check(kernel, given)[0]


def test_a_c_past_its_types_range_is_inf_and_no_other_value_passes_for_it():
    # Sums past fp16's 65504 stored as fp16 are inf; the bound there was 2 ulps of inf, so 0, −inf, NaN or a kernel
    # that saturates to 65504 passed. 65504 is still a correct result where the sum may lie just short of 65520.
    p = spatialc.build(spatialc.gemm(16, 16, 32, "fp16", out="fp16"), "sm_86")
    a, b = np.zeros((16, 32)), np.ones((32, 16))
    a[0, :2] = 65504.0  # 131008: far past the range
    a[1, :2] = [65504.0, 16.0]  # exactly 65520, inf; a float32 sum one rounding short of it is 65504
    x = {"A": a, "B": b}
    ref = spatialc.evaluate(p, x)
    tol = spatialc.tolerance(p, kernel=True)
    assert np.isinf(ref[:2, 0]).all() and tol.check(ref, x)[0]
    for wrong in (0.0, -np.inf, np.nan, 65504.0):
        c = ref.copy()
        c[0, 0] = wrong
        assert not tol.check(c, x)[0], wrong
    c = ref.copy()
    c[1, 0] = 65504.0
    assert tol.check(c, x)[0]

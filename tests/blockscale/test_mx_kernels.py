"""MXFP8 kernels printed (issue 34 item 4): the persistent and general forms' K step is one k32 MMA (mma.sync
m16n8k32 fp8) into partial fragments, promoted with each element's e8m0 scales read as their bytes, as their codes,
whose exponents the promotion combines as integers (mx_promote.cuh: exact at every pair of codes, where a float32
product of the scales overflows or underflows) — the scale tensors' kernel parameters are bytes, never float32. The
host emulation runs them within the kernel's bound of the interpreter, at codes 0, 1, 253 and 254 too; a scale of the
wrong K group, row or column, or a wrong e8m0 code, planted in the kernel text is caught; the sm_90a form refuses
by one line (auto prints the persistent form); nvcc -Werror compiles the planned 4096³ kernels for sm_89 and sm_90
without spills. `spatialc.run` and the host program lay the scales out as their bytes, a grouped GEMM's a group at
a time."""

from __future__ import annotations

import dataclasses
import re
import shutil
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.lower.cuda.common.blockscale import MX_PROGRAM
from spatialc.runtime import launch as L
from spatialc.runtime.tilize import tilize, untilize

from ..nvcc_clean import NVCC, assert_clean, nvcc_compile, nvcc_device
from ..stand_in import StandInDevice, values
from .programs import EXTREME, FORMATS, extreme_inputs, inputs_of, naive

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

CASES = {
    "persistent-e4m3": ("persistent", "e4m3", (64, 48, 256), {}),
    "persistent-e5m2-ragged-k-sm90": ("persistent", "e5m2", (37, 70, 200), {"target": "sm_90"}),  # a part group
    "general-e4m3": ("general", "e4m3", (64, 48, 256), {}),
    "general-split-k": ("general", "e4m3", (32, 64, 512), {"split_k": 2}),  # each site promotes its own k32 steps
}
FORMS = ("persistent", "general")


def program(form, prec, shape, kw):
    kw = dict(kw)
    target = kw.pop("target", "sm_89")
    return spatialc.build(spatialc.gemm(*shape, prec, scales="mx"), target, form=form, **kw)


def emulated(p, form, x, text=None):
    art = spatialc.lower(p, form=form)
    assert art.budget.form == form
    if text is not None:
        art = dataclasses.replace(art, program_cu=text(art.program_cu))
    return spatialc.emulate(art, x)


@pytest.mark.parametrize("form", FORMS)
def test_the_scales_are_read_as_their_bytes(form):
    text = spatialc.lower(program(form, "e4m3", (64, 48, 256), {}), form=form).program_cu
    assert re.search(r"const spatialc_e8m0\* __restrict__ t3, const spatialc_e8m0\* __restrict__ t4", text)
    assert "const int sa[2] = {(int)t3[" in text and "(int)t4[" in text  # the codes, promoted by mx_promote.cuh
    assert "= spatialc_mx_promote(part[q].x[i], sa[" in text and "fmaf(part[q]" not in text
    assert "const int ga = sk0 / 32, gb = sk0 / 32;" in text  # a step of 32: one K group of each operand
    assert text.count("spatialc_mma2(part[q]") == 1  # one k32 MMA a step (two 16x8 halves), then its promotion


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", CASES)
def test_the_emulated_kernel_is_within_the_kernel_bound_of_the_interpreter(case):
    form, prec, shape, kw = CASES[case]
    p = program(form, prec, shape, kw)
    x = inputs_of(p, seed=11)
    c = emulated(p, form, x)
    want = spatialc.evaluate(p, x)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    assert np.abs(c - want).max() <= 1e-5 * np.abs(want).max()  # float32 sums: near the float64 ones


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("regime", EXTREME)
def test_extreme_scale_codes_are_promoted_exactly(form, regime):
    """Codes 0, 1, 253, 254 (programs.extreme_inputs): sa · sb from 2^-154 to 2^130, past float32's range where each
    promoted partial sum is not. The kernel combines the codes' exponents (mx_promote.cuh) and is within the bound
    of the interpreter's C, finite and in float32's range (no RangeWarning) — where a float32 product of the scales
    gave inf, NaN (an all-zero group times inf) or 0. The kernels of CASES' 64 × 48 × 256, emulated again."""
    form_, prec, shape, kw = CASES[f"{form}-e4m3"]
    p = program(form_, prec, shape, kw)
    x = extreme_inputs(p, regime, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", spatialc.numerics.tolerance.RangeWarning)
        want = spatialc.evaluate(p, x)
        ok, how = spatialc.tolerance(p, kernel=True).check(c := emulated(p, form, x), x)
    assert np.isfinite(want).all() and ok, how
    assert np.isfinite(c).all()
    if regime == "underflow":  # C is normal, every group's sa · sb below float32's smallest subnormal
        assert np.abs(want).min() > 2 * np.finfo(np.float32).tiny


def test_auto_prints_the_persistent_form_and_the_sm90a_form_refuses_by_one_line():
    p = spatialc.build(spatialc.gemm(64, 48, 256, "e4m3", scales="mx"), "sm_89")
    assert spatialc.lower(p).budget.form == "persistent"
    q = spatialc.build(spatialc.gemm(128, 128, 256, "e4m3", scales="mx"), "sm_90a")
    assert spatialc.lower(q).budget.form == "persistent"  # auto: past the sm_90a form's refusal
    refusal = re.escape(MX_PROGRAM) + r" in the sm_90a form: .*persistent form.*general form"
    with pytest.raises(spatialc.errors.SpatialError, match=refusal):
        spatialc.lower(q, form="sm90a")


PLANTED = {
    # the step promoted with the scales of the next K group of A (or of B): groups 0 ↔ 1, 2 ↔ 3, …
    "A's scale of the wrong group": (r"const int ga = sk0 / 32, gb", "const int ga = (sk0 / 32) ^ 1, gb"),
    "B's scale of the wrong group": (r", gb = sk0 / 32;", ", gb = (sk0 / 32) ^ 1;"),
    "A's scale of the wrong row": (r"\(\(r \+ 0\) / 1\)", "((r + 1) / 1)"),
    "B's scale of the wrong column": (r"\(\(c \+ 1\) / 1\)", "((c + 0) / 1)"),
    "an e8m0 code read one off (the scale doubled)": (r"\(int\)t3\[", "1 + (int)t3["),
}
# Every fault in the persistent form (auto's); two in the general form, which prints the same promotion.
FAULTS = [("persistent", f) for f in PLANTED] + [("general", f) for f in list(PLANTED)[1:3]]


@pytest.fixture(scope="module")
def faulted():
    """The programs and inputs the planted faults run on: four K groups, scales that differ everywhere."""
    out = {form: program(form, "e4m3", (32, 64, 128), {}) for form in FORMS}
    return out, inputs_of(out["general"], seed=4)


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(("form", "fault"), FAULTS)
def test_a_fault_planted_in_the_kernel_text_is_caught(faulted, form, fault):
    programs, x = faulted
    p = programs[form]
    pattern, replacement = PLANTED[fault]

    def planted(text):
        out, n = re.subn(pattern, replacement, text)
        assert n >= 1
        return out

    c = emulated(p, form, x, planted)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("form", FORMS)
def test_nvcc_compiles_the_planned_kernel_for_sm89_and_sm90_without_spills(tmp_path, form):
    """The persistent form's program_cu in host mode (`-c`, which covers the MX host code: gcc -Wall -Wextra
    -Werror), the general form's device-only (-fatbin; the same host printer path)."""
    gemm = spatialc.gemm(4096, 4096, 4096, "e4m3", scales="mx", out="bf16")
    art = spatialc.lower(spatialc.build(gemm, "sm_90", form=form), form=form)
    assert art.budget.form == form and "spatialc_mx_promote(" in art.program_cu
    compile_ = nvcc_compile if form == "persistent" else nvcc_device
    assert_clean(compile_(art.program_cu, tmp_path / "mx.cu", ("89", "90")), ("89", "90"))


def mx_kernel(p):
    """A stand-in kernel on numpy: it decodes the arguments' bytes — A and B as their 8-bit floats, each e8m0 scale
    code c as 2^(c − 127) — and stores the block-scaled sum of `programs.naive` (written apart from the compiler) as
    the kernel's C."""

    def kernel(dev, args):
        got = {a.name: values(a, v, a.elems) for a, v in dev.tensors(args).values() if a.role != "output"}
        kc, c = next((a, v) for a, v in dev.tensors(args).values() if a.role == "output")
        c[:] = tilize(naive(p, got, step=32).astype(np.float32), kc.tiles, np, order=kc.order)

    return kernel


def test_run_lays_out_the_scales_as_their_e8m0_bytes():
    """`spatialc.run`'s arguments for an MX kernel: the scales go up as one byte each (their codes), from ml_dtypes
    arrays and from powers of two alike, and a stand-in device decoding them computes the interpreter's C."""
    p = spatialc.build(spatialc.gemm(48, 40, 96, "e4m3", scales="mx"), "sm_89")
    art = spatialc.lower(p)
    x = inputs_of(p, seed=5)
    want = spatialc.evaluate(p, x)
    for scales in ("ml_dtypes", "floats"):
        given = x if scales == "ml_dtypes" else {**x, **{s: x[s].astype(np.float64) for s in ("scale_a", "scale_b")}}
        dev = StandInDevice(art, mx_kernel(p))
        c = L.run_with(dev, art, **given)
        assert np.array_equal(c, want), scales
        assert dev.given("scale_a").dtype == dev.given("scale_b").dtype == np.uint8


def grouped_mx():
    """A grouped MXFP8 GEMM (each expert its own e8m0 scales), ragged row counts (one group empty), and its inputs."""
    groups, rows, n, k = 3, 40, 48, 192
    p = spatialc.build(spatialc.grouped_gemm(groups, rows, n, k, "e4m3", scales="mx"), "sm_89", form="general")
    rng = np.random.default_rng(3)
    fmt, e8m0 = FORMATS["e4m3"], ml_dtypes.float8_e8m0fnu
    return p, {
        "A": rng.normal(size=(groups, rows, k)).astype(fmt),
        "B": rng.normal(size=(groups, k, n)).astype(fmt),
        "sizes": np.array([40, 0, 17], np.int32),
        "scale_a": np.exp2(rng.integers(-4, 5, (groups, rows, k // 32))).astype(e8m0),
        "scale_b": np.exp2(rng.integers(-4, 5, (groups, k // 32, n))).astype(e8m0),
    }


@needs_gxx
@pytest.mark.emulation
def test_a_grouped_mx_gemm_emulated_within_the_bound():
    """The host program lays each group's e8m0 codes on its own tiles (host.cuh's spatialc_tilize_groups with
    w4_host.cuh's spatialc_e8m0_of)."""
    p, x = grouped_mx()
    c = emulated(p, "general", x)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    assert not c[1].any()  # the empty group's rows are not written


def test_run_lays_out_a_grouped_gemms_scales_a_group_at_a_time():
    p, x = grouped_mx()
    art = spatialc.lower(p, form="general")
    dev = StandInDevice(art)  # it keeps each argument's bytes and writes nothing
    L.run_with(dev, art, **x)
    for name in ("scale_a", "scale_b"):
        a, v = dev.tensors(dev.launches[0][4])[name]
        assert v.dtype == np.uint8
        codes = untilize(v, a.tiles, a.elems, np, groups=a.groups)
        assert np.array_equal(2.0 ** (codes.astype(np.float64) - 127), x[name].astype(np.float64)), name

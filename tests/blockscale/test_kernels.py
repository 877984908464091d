"""Block-scaled GEMMs printed (issue 34, item 5): the persistent and general forms' K step into partial fragments,
promoted by each element's scales (`lower/cuda/common/blockscale.py`). The host emulation runs them within the
kernel's bound of the interpreter; a scale of the wrong K group, or of the wrong column block, planted in the
kernel text is caught; nvcc -Werror compiles the planned 4096³ kernels for sm_89 and sm_90 without spills. The
sm_90a form's are test_sm90a_blockscaled.py's."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

import spatialc

from ..nvcc_clean import NVCC, assert_clean, nvcc_compile, nvcc_device
from .programs import inputs_of

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

CASES = {
    "persistent-1x128-128x128": ("persistent", "e4m3", (64, 160, 256), ("1x128", "128x128"), {}),
    "general-1x128-128x128": ("general", "e4m3", (37, 150, 300), ("1x128", "128x128"), {}),
    "persistent-row-col-e5m2-sm90": ("persistent", "e5m2", (48, 40, 384), ("row", "col"), {"target": "sm_90"}),
    "general-tensor-128x1": ("general", "e4m3", (33, 70, 256), ("tensor", "128x1"), {}),
    "persistent-strided-128x128": ("persistent", "e4m3", (40, 48, 256), ("128x128", "128x128"), {"block": (1, 3, 8)}),
    # split-K: each site promotes its own steps (their K addresses from its first), the partials added in float32
    "general-split-k": ("general", "e4m3", (32, 64, 1024), ("1x128", "128x128"), {"split_k": 2}),
}


def program(form, prec, shape, layouts, kw, epilogue=()):
    kw = dict(kw)
    target = kw.pop("target", "sm_89")
    gemm = spatialc.gemm(*shape, prec, scales=layouts, epilogue=list(epilogue))
    return spatialc.build(gemm, target, form=form, **kw)


def emulated(p, form, x, text=None):
    art = spatialc.lower(p, form=form)
    assert art.budget.form == form
    if text is not None:
        art = dataclasses.replace(art, program_cu=text(art.program_cu))
    return spatialc.emulate(art, x)


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", CASES)
def test_the_emulated_kernel_is_within_the_kernel_bound_of_the_interpreter(case):
    form, prec, shape, layouts, kw = CASES[case]
    p = program(form, prec, shape, layouts, kw)
    x = inputs_of(p, seed=11)
    c = emulated(p, form, x)
    want = spatialc.evaluate(p, x)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how
    assert np.abs(c - want).max() <= 1e-5 * np.abs(want).max()  # float32 sums: near the float64 ones


@needs_gxx
@pytest.mark.emulation
def test_an_epilogue_after_the_promotion_and_a_bf16_output():
    p = spatialc.build(
        spatialc.gemm(40, 64, 256, "e4m3", scales=("1x128", "128x128"), epilogue=[spatialc.bias()], out="bf16"),
        "sm_90",
        form="persistent",
    )
    x = inputs_of(p, seed=2)
    x["bias"] = np.linspace(-3, 3, 64).astype(np.float32)
    c = emulated(p, "persistent", x)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how


PLANTED = {
    # the step promoted with the scales of the other K group of A (two groups: 0 ↔ 1)
    "A's scale of the wrong group": (r"const int ga = sk0 / 128, gb", "const int ga = (sk0 / 128) ^ 1, gb"),
    "B's scale of the wrong group": (r", gb = sk0 / 128;", ", gb = (sk0 / 128) ^ 1;"),
    "B's scale of the next column block": (r"\(c \+ 0\) / 128", "(c + 128) / 128"),
    "a step's partials left unpromoted": (r"fmaf\(part\[q\]\.x\[i\], [^,]+, ", "fmaf(part[q].x[i], 1.0f, "),
}


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("fault", PLANTED)
def test_a_fault_planted_in_the_kernel_text_is_caught(fault):
    pattern, replacement = PLANTED[fault]
    p = program("persistent", "e4m3", (32, 256, 256), ("1x128", "128x128"), {})
    x = inputs_of(p, seed=4)

    def planted(text):
        out, n = re.subn(pattern, replacement, text)
        assert n >= 1
        return out

    c = emulated(p, "persistent", x, planted)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The planned 4096³ e4m3 kernels of both forms (DeepGEMM's layouts, bf16 C), each compiled by nvcc -Werror for
    sm_89 and sm_90 in one call: the persistent one in host mode (`-c`, which covers the blockscaled host code, gcc
    -Wall -Wextra -Werror), the general one device-only (-fatbin; the same host printer path)."""
    done = {}
    for form in ("persistent", "general"):
        gemm = spatialc.gemm(4096, 4096, 4096, "e4m3", scales=("1x128", "128x128"), out="bf16")
        art = spatialc.lower(spatialc.build(gemm, "sm_90", form=form), form=form)
        assert art.budget.form == form and "spatialc_acc<ACCT> part[" in art.program_cu
        compile_ = nvcc_compile if form == "persistent" else nvcc_device
        done[form] = compile_(art.program_cu, tmp_path_factory.mktemp("bscale") / f"{form}.cu", ("89", "90"))
    return done


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("form", ["persistent", "general"])
def test_nvcc_compiles_the_planned_kernels_for_sm89_and_sm90_without_spills(compiled, form):
    assert_clean(compiled[form], ("89", "90"))

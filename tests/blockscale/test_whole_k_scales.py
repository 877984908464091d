"""Scales over all of K (`row`, `col`, `tensor`: one group of the whole product) at a K that is no multiple of 128:
the API takes them, so verify must too — one group cannot be straddled, a step past K reads its zero padding — and
the interpreter, the reference and the emulated kernel agree. A float32 group narrower than 128 and than K is still
OCP MX's, and refused (review 47c: verify refused every whole-K layout at K % 128 ≠ 0)."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest

import spatialc
from spatialc.numerics.reference import reference

from .test_mx_mutations import _saved

LAYOUTS = (("row", "col"), ("tensor", "tensor"), ("1x128", "col"), ("row", "128x128"))


def scaled_inputs(p, seed=1):
    rng = np.random.default_rng(seed)
    names = ("A", "B", "scale_a", "scale_b")
    return {
        t.name: rng.uniform(-2, 2, t.elems) if t.name in "AB" else rng.uniform(0.01, 0.1, t.elems)
        for t in p.tensors
        if t.name in names
    }


@pytest.mark.parametrize("k", [96, 200, 300])
@pytest.mark.parametrize("scales", LAYOUTS)
def test_whole_k_layouts_verify_and_the_interpreter_is_the_reference(k, scales):
    p = spatialc.build(spatialc.gemm(32, 48, k, "e4m3", scales=scales, out="bf16"), "sm_90")
    assert p.verified
    x = scaled_inputs(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        got, want = spatialc.evaluate(p, x), reference(p, x)
    assert np.allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-2, atol=1e-2)


def test_a_float32_group_narrower_than_128_and_than_k_is_refused():
    p = spatialc.build(spatialc.gemm(32, 48, 200, "e4m3", scales=("row", "col"), out="bf16"), "sm_90")
    with pytest.raises(spatialc.VerifyError, match="groups of 96 elements"):
        q = _saved(p, scales={"a": {"k": 96}}, tensors={"scale_a": {"elems": [32, 3]}})
        spatialc.verify(q)


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_a_whole_k_kernel_at_k_200_emulates_within_its_bound():
    p = spatialc.build(spatialc.gemm(32, 48, 200, "e4m3", scales=("row", "col"), out="bf16"), "sm_90")
    x = scaled_inputs(p, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        c = spatialc.emulate(spatialc.lower(p, form="general"), x)
        ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, how

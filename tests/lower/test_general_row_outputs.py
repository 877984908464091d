"""Row programs of two outputs of pages, or none, printed: fused add + RMSNorm (`spatialc.rmsnorm(residual=True)`: out
and residual_out = x + residual, a page of each stored at a time) and the row reductions (`spatialc.row_reduce`: an
m x 1 vector, no pass of pages) — each output stored through its own C type; nvcc for sm_80 and sm_90 without a
warning or a spill, every kernel of both programs in one call (general and persistent forms, bf16 and fp16); the host
emulation within `spatialc.tolerance(p, kernel=True)`, and planted faults it must catch: residual_out stored from out's
ring, a row absmax printed as a max, the mean's divisor printed wrong.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.inputs import operand_values
from spatialc.ir.nodes import TensorRole
from spatialc.lower.cuda.common.cwriter import INCLUDES

from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

# 40 rows of 70 values (5 tiles a row, read 2 a page: the last page one tile of padding), bands of one tile row,
# three bands on two sites (an ITEM loop).
BLOCK = {"block": (1, 2, 1), "sites": 2}


@cache
def fused(precision: str):
    """Fused add + RMSNorm: bf16 with a weight, out float32 beside a bf16 residual_out; fp16 without, both fp16."""
    if precision == "bf16":
        return spatialc.build(spatialc.rmsnorm(40, 70, "bf16", residual=True), "sm_90", **BLOCK)
    program = spatialc.rmsnorm(40, 70, "fp16", residual=True, weight=False, out="fp16")
    return spatialc.build(program, "sm_90", **BLOCK)


@cache
def reduced(op: str, precision: str, out: str | None = None):
    return spatialc.build(spatialc.row_reduce(40, 70, op, precision, out=out), "sm_90", **BLOCK)


@cache
def lowered(p, form: str):
    return spatialc.lower(p, form=form)


def inputs(p, seed=0):
    """x and residual normal times 3, shifted by −1 (so that some rows' largest magnitude is negative), of their
    type; the weight normal."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role == TensorRole.INPUT:
            out[t.name] = operand_values(t.name, rng.standard_normal(t.elems) * 3 - 1, t.dtype)
        elif t.role == TensorRole.PARAMETER:
            out[t.name] = rng.standard_normal(t.elems[1]).astype(np.float32)
    return out


def stores(text: str) -> dict[str, tuple[str, str, str]]:
    """Each output store of a kernel's writer, by tensor parameter (t3, t4, …): (the whole line, its C type, the page
    element it reads)."""
    store = r"(SPATIALC_OUT_ST\(&(t\d+)\[\(long long\)tile \* 256 \+ el\], \((\w+)\)SPATIALC_PAGE_LD\((.*)\)\);)"
    return {t: (line, ctype, page) for line, t, ctype, page in re.findall(store, text)}


def param(p, name: str) -> str:
    """The kernel's parameter for tensor `name`: t<its id>."""
    return f"t{next(int(t.id) for t in p.tensors if t.name == name)}"


def residual_from_outs_ring(p, text: str) -> str:
    """The planted fault: residual_out stored from out's page, in out's store, its own store left empty."""
    found = stores(text)
    out, res = param(p, "out"), param(p, "residual_out")
    out_line, _, out_page = found[out]
    res_line, res_type, _ = found[res]
    wrong = f"SPATIALC_OUT_ST(&{res}[(long long)tile * 256 + el], ({res_type})SPATIALC_PAGE_LD({out_page}));"
    assert text.count(out_line) == text.count(res_line) == 1
    return text.replace(res_line, "(void)tile;").replace(out_line, f"{out_line} {wrong}")


def test_each_output_is_stored_through_its_own_type_and_a_row_vector_once_a_band():
    for form in ("general", "persistent"):
        found = stores(lowered(fused("bf16"), form).kernel_cu)
        assert [found[t][1] for t in ("t3", "t4")] == ["OUT_T", "__nv_bfloat16"], form  # out float32, residual_out bf16
        assert "typedef float OUT_T;" in lowered(fused("bf16"), form).kernel_cu
        text = lowered(reduced("absmax", "bf16"), form).kernel_cu
        assert "spatialc_max(racc_2[q], spatialc_abs(x))" in text and list(stores(text)) == ["t1"], form
    assert "const float v = spatialc_div(v0, 7e+01f);" in lowered(reduced("mean", "fp16", "fp16"), "general").kernel_cu


# Every kernel of both programs, general and persistent, bf16 and fp16, and each row reduction in one of them.
NVCC_CASES = [
    *((lambda prec=prec: fused(prec), form) for prec in ("bf16", "fp16") for form in ("general", "persistent")),
    *(
        (lambda args=args: reduced(*args), form)
        for args, form in (
            (("absmax", "bf16"), "general"),
            (("absmax", "fp16", "fp16"), "persistent"),
            (("mean", "fp16", "fp16"), "general"),
            (("sum", "bf16", "bf16"), "persistent"),
            (("max", "fp16"), "general"),
            (("min", "bf16"), "persistent"),
            (("sumsq", "fp16", "fp16"), "general"),
        )
    ),
]


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_kernel_compiles_for_sm80_and_sm90_without_warnings_or_spills(tmp_path):
    """Each case's program_cu (its kernel and the host code that launches it), all in one translation unit."""
    arts = [lowered(make(), form) for make, form in NVCC_CASES]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(art.program_cu, i, "p") for i, art in enumerate(arts)]
    (tmp_path / "rows.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "2", "-o", str(tmp_path / "rows.o"), str(tmp_path / "rows.cu"), *archs, *FLAGS]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert sorted((case, arch) for case, _, arch, _, _ in entries) == sorted(
        (i, arch) for i in range(len(arts)) for arch in ("sm_80", "sm_90")
    )
    for case, _, arch, spill, _ in entries:
        assert spill == 0, f"case {case} {arch} spills {spill} bytes"


def emulated(p, art, texts, x):
    """The emulation's result for each of `texts` (the artifact's program_cu, or a fault planted in it), 2 at once."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda text: spatialc.emulate(dataclasses.replace(art, program_cu=text), x), texts))


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize(("precision", "form"), [("bf16", "general"), ("fp16", "persistent")])
def test_fused_add_rmsnorm_emulates_within_the_tolerance_and_residual_out_from_outs_ring_is_caught(precision, form):
    """out and residual_out against the interpreter's; then residual_out stored from out's page (the store of the
    wrong ring): the check fails, naming residual_out, while out is as before."""
    p = fused(precision)
    art, x = lowered(p, form), inputs(p)
    got, bad = emulated(p, art, [art.program_cu, residual_from_outs_ring(p, art.program_cu)], x)
    want = spatialc.evaluate(p, x)
    assert set(got) == set(want) == {"out", "residual_out"}
    for name in want:
        assert got[name].shape == want[name].shape == (40, 70) and got[name].dtype == want[name].dtype, name
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how
    # residual_out: x + residual in float32, rounded once to x's type — the kernel's bit for bit
    assert np.array_equal(got["residual_out"], want["residual_out"])
    h = x["x"].astype(np.float64) + x["residual"].astype(np.float64)
    assert np.abs(want["residual_out"] - h).max() <= 2.0**-7 * np.abs(h).max()

    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok and "residual_out" in how, how
    assert np.array_equal(bad["out"], got["out"]) and not np.array_equal(bad["residual_out"], got["residual_out"])


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize(("precision", "form"), [("bf16", "persistent"), ("fp16", "general")])
def test_a_row_absmax_emulates_within_the_tolerance_and_one_printed_as_a_max_is_caught(precision, form):
    """The m x 1 absmax against the interpreter's; then its reduction printed as a max (the abs left out): wrong at
    the rows whose largest magnitude is a negative value's, and the check says so."""
    p = reduced("absmax", precision)
    art, x = lowered(p, form), inputs(p)
    text = art.program_cu
    absmax = "spatialc_max(racc_2[q], spatialc_abs(x))"
    assert text.count(absmax) == 1
    got, bad = emulated(p, art, [text, text.replace(absmax, "spatialc_max(racc_2[q], x)")], x)
    want = spatialc.evaluate(p, x)
    assert got.shape == want.shape == (40, 1) and got.dtype == want.dtype
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how
    rows = x["x"].astype(np.float32)
    assert np.array_equal(got[:, 0], np.abs(rows).max(axis=1))  # exact: a magnitude of the inputs' own
    negative = -rows.min(axis=1) > rows.max(axis=1)
    assert 0 < negative.sum() < 40  # the data tell an absmax from a max

    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok, how
    assert np.array_equal(bad[:, 0] != got[:, 0], negative)


@pytest.mark.emulation
@needs_gxx
def test_a_row_mean_emulates_within_the_tolerance_and_a_wrong_divisor_is_caught():
    """The fp16 mean (persistent form) against the interpreter's; then the sum divided by 64 where rows hold 70."""
    p = reduced("mean", "fp16", "fp16")
    art, x = lowered(p, "persistent"), inputs(p)
    text = art.program_cu
    divide = "spatialc_div(v0, 7e+01f)"
    assert text.count(divide) == 1
    got, bad = emulated(p, art, [text, text.replace(divide, "spatialc_div(v0, 6.4e+01f)")], x)
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok and got.dtype == np.float16, how
    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok, how

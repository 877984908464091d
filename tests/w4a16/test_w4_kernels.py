"""W4A16 GEMMs printed (issue 34, item 6): the general form reads the packed weights' bytes into a ring of their own;
by default its compute warps dequantise them in registers as the matmul loads its B fragments (one 32-bit shared
load a lane and tile, `spatialc_w4_load_b`), or — the shared path, kept selectable — each page into a B operand page
(`lower/cuda/common/dequant.py`, the C of `dequant.cuh`). The host emulation runs them equal to the interpreter — bit
for bit on exact inputs and on a selector A that copies dequantised rows of B into C, within the bf16 / fp16 GEMM's
kernel bound on real-valued ones — for int4 with zero points, uint4 with float32 scales and fp16 operands, mxfp4,
split-K, a block no lane grid divides (a group per tile of K) and the decode shape's plan at a small size; the
nibbles of a byte read the other way round, or
the scales of the other group, planted in the kernel text of either path, are caught, and the shared path's B page
published before its dequant is a race the emulation reports; nvcc -Werror compiles the decode shape's kernel
(M = 16, N = K = 4096, int4 with zero points per 128) for sm_80 and sm_90 without spills; the sm_90a form refuses
a program planned for the others by one line, and auto prints the general form (the persistent form's:
test_w4_persistent.py; the sm_90a form's: test_w4_sm90a.py)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import warnings

import numpy as np
import pytest

import spatialc
from spatialc.inputs import InexactInputWarning
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.errors import NeedsGeneral
from spatialc.numerics import w4
from spatialc.runtime.emulate import EmulationRace
from spatialc.target import target as get_target

from ..nvcc_clean import NVCC, assert_clean, nvcc_compile, nvcc_device
from .w4_inputs import w4_inputs, w4_program

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

CASES = {
    "int4-zeros-bf16": ("int4", "bf16", (37, 40, 256), {"group": 128, "zeros": True}),
    "uint4-f32-scales-fp16": ("uint4", "fp16", (33, 72, 192), {"group": 64, "scale_type": "float32"}),
    "mxfp4-bf16": ("mxfp4", "bf16", (16, 48, 160), {}),
    "int4-split-k": ("int4", "bf16", (16, 64, 512), {"group": 128, "zeros": True, "split_k": 2}),
    # no lane grid divides the block (warps take tiles in turn), a group per tile of K (a page holds two)
    "uint4-strided-g16": ("uint4", "bf16", (40, 48, 256), {"group": 16, "zeros": True, "block": (1, 3, 2)}),
}


# Every case runs on exact inputs; these also with A a selector (the dequantised operand itself, bit for bit), and
# the first three also on real values against the kernel's tolerance (each run is seconds of emulation: the split-K
# and the strided case, the slowest, stay at the exact run, which a wrong group or nibble changes all the same).
SELECTED = ("int4-zeros-bf16", "uint4-f32-scales-fp16", "mxfp4-bf16", "uint4-strided-g16", "int4-zeros-bf16 shared")
REAL_VALUED = SELECTED[:3]
REGISTER_PATH = "spatialc_w4_load_b<"  # the register path's B loads (the shared path's stores: spatialc_dequant_)


def shared_path(p):
    """`p`'s general-form artifact with the weights dequantised into a B operand page (the shared path)."""
    art = general.lower(p, get_target(p.target), dequant="shared")
    assert REGISTER_PATH not in art.program_cu and "SPATIALC_PAGE_ST(d + tl * 256" in art.program_cu
    return art


@pytest.fixture(scope="module")
def built():
    """Each case's program and its general-form artifact, the register path (each emulated kernel is compiled once:
    runs share it); and the shared path's of int4 with zero points."""
    out = {}
    for name, (fmt, prec, (m, n, k), kw) in CASES.items():
        p = w4_program(m, n, k, fmt, prec, **kw)
        art = spatialc.lower(p)
        assert art.budget.form == "general" and REGISTER_PATH in art.program_cu
        assert "SPATIALC_PAGE_ST(d + " not in art.program_cu  # no operand page is written
        out[name] = (p, art)
    p = out["int4-zeros-bf16"][0]
    out["int4-zeros-bf16 shared"] = (p, shared_path(p))
    return out


def emulated(art, x, text=None):
    if text is not None:
        art = dataclasses.replace(art, program_cu=text(art.program_cu))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InexactInputWarning)  # real-valued A and scales, rounded as documented
        return spatialc.emulate(art, x)


def selector(p, x, rng):
    """`x` with A a selector: row i of A is 1 at one column k_i and 0 elsewhere, so that row i of C is row k_i of the
    dequantised B, each element a single product (exact in any order) — and scales real-valued."""
    m, k = p.tensor_named("A").elems
    picked = rng.integers(0, k, m)
    a = np.zeros((m, k))
    a[np.arange(m), picked] = 1.0
    scale = p.tensor_named("scale")
    x = dict(x, A=a)
    if scale.dtype.value != "e8m0":
        x["scale"] = rng.uniform(0.002, 0.05, scale.elems)
    return x, picked


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", [*CASES, "int4-zeros-bf16 shared"])
def test_the_emulated_kernel_equals_the_interpreter(built, case):
    p, art = built[case]
    exact = w4_inputs(p, seed=3, exact=True)  # small integers and powers of two: every sum exact
    c = emulated(art, exact)
    assert np.array_equal(c, spatialc.evaluate(p, exact))
    if case not in SELECTED:
        return
    x, picked = selector(p, w4_inputs(p, seed=4, exact=True), np.random.default_rng(5))
    c = emulated(art, x)
    assert np.array_equal(c, spatialc.evaluate(p, x))  # the dequantised operand, bit for bit
    dq = next(s.kind.op for s in p.stages if type(getattr(s.kind, "op", None)).__name__ == "Dequant")
    operand = w4.w4_operand(p, dq, p.tensor_named("B").id, x)
    assert np.array_equal(c, operand[picked].astype(c.dtype))
    if case not in REAL_VALUED:
        return
    real = w4_inputs(p, seed=6, exact=False)
    c = emulated(art, real)
    want = spatialc.evaluate(p, real)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, real)
    assert ok, how
    assert np.abs(c - want).max() <= 1e-5 * np.abs(want).max()  # float32 sums: near the float64 ones


PLANTED = ("the nibbles of a byte read the other way round", "the scale and zero point of the other group")


def plant(text: str, fault: str, shared: bool) -> str:
    if fault.startswith("the nibbles") and shared:
        out, n = re.subn(r"\(b & 15u\)|\(b >> 4\)", lambda m: "(b >> 4)" if m[0] == "(b & 15u)" else "(b & 15u)", text)
    elif fault.startswith("the nibbles"):  # the register unpack: the even row from the high nibble
        out, n = re.subn(r"\(LOW_FIRST \? (\d)u : (\d)u\)", r"(LOW_FIRST ? \2u : \1u)", text)
    elif shared:  # K = 256 holds two groups of 128: 0 <-> 1
        out, n = re.subn(r"const int g(\d) = \(k0 \+ (\d)\) / 128;", r"const int g\1 = ((k0 + \2) / 128) ^ 1;", text)
    else:
        out, n = re.subn(r"(const unsigned g = .*? / 128);", r"\1 ^ 1u;", text)
    assert n >= 2 if shared or fault.startswith("the nibbles") else n >= 1
    return out


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("path", ["registers", "shared"])
@pytest.mark.parametrize("fault", PLANTED)
def test_a_fault_planted_in_the_kernel_text_is_caught(built, fault, path):
    p, art = built["int4-zeros-bf16" + (" shared" if path == "shared" else "")]
    x = w4_inputs(p, seed=7, exact=True)
    c = emulated(art, x, lambda text: plant(text, fault, path == "shared"))
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


@needs_gxx
@pytest.mark.emulation
def test_the_operand_page_pushed_before_its_dequant_is_a_race(built):
    """The shared path's B page's Push moved above the dequant that fills it: the matmul's fragment loads race the
    page's stores, which the emulation reports (the Push's barrier is what orders them)."""
    p, art = built["int4-zeros-bf16 shared"]

    def early(text: str) -> str:
        at = text.index("{  // op:Compute:Dequant")
        end = text.index("// op:Push", at) + len("// op:Push")
        start = text.rindex("\n", 0, end) + 1
        return text[:at] + text[start:end].strip() + "\n" + text[at:start] + text[end:]

    with pytest.raises(EmulationRace, match=r"RACE on shared ring"):
        emulated(art, w4_inputs(p, seed=8, exact=True), early)


def test_the_sm90a_form_refuses_it_by_one_line_and_auto_prints_the_general_form():
    p = w4_program(16, 64, 256, "int4", target="sm_90a", group=128, zeros=True)
    planned = "planned for the other forms, in the sm_90a form: its B pages are not panels"  # (test_w4_sm90a.py)
    with pytest.raises(NeedsGeneral, match=rf"W4A16 GEMM's dequant prologue \(4-bit weights\).*{planned}") as e:
        spatialc.lower(p, form="sm90a")
    assert "\n" not in str(e.value) and "the general form prints it" in str(e.value)
    art = spatialc.lower(p)  # (the persistent form prints it too: tests/w4a16/test_w4_persistent.py)
    assert art.budget.form == "general" and any("form='persistent'" in n for n in art.notes)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The decode shape's kernel (M = 16, N = K = 4096, int4 with a zero point per 128), built for sm_80 and for sm_90
    and each compiled by nvcc -Werror (ptxas -v) for its own architecture: sm_90's in host mode (`-c`, which
    covers the w4a16 general form's host code, gcc -Wall -Wextra -Werror), sm_80's device-only (-cubin)."""
    done = {}
    for cc in ("80", "90"):
        gemm = spatialc.gemm(16, 4096, 4096, "bf16", weights="int4", group=128, zeros=True)
        art = spatialc.lower(spatialc.build(gemm, f"sm_{cc}"))
        assert art.budget.form == "general" and "spatialc_w4_load_b<0, true, OPT>(" in art.program_cu
        compile_ = nvcc_compile if cc == "90" else nvcc_device
        done[cc] = compile_(art.program_cu, tmp_path_factory.mktemp("w4") / f"sm{cc}.cu", (cc,))
    return done


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cc", ["80", "90"])
def test_nvcc_compiles_the_decode_kernel_without_spills(compiled, cc):
    log = assert_clean(compiled[cc], (cc,))
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log)


@needs_gxx
@pytest.mark.emulation
def test_the_register_path_feeds_an_epilogue_as_the_shared_one_did():
    """A bias, relu and per-row scale after the dequantised product, out in bf16: the register path's matmul leaves
    the accumulators as the epilogue reads them (exact inputs: equal to the interpreter bit for bit)."""
    epilogue = [spatialc.bias(), spatialc.relu(), spatialc.row_scale()]
    p = w4_program(20, 40, 256, "uint4", zeros=True, epilogue=epilogue, out="bf16")
    art = spatialc.lower(p)
    assert REGISTER_PATH in art.program_cu
    x = w4_inputs(p, seed=6)
    assert np.array_equal(emulated(art, x), spatialc.evaluate(p, x))


@needs_gxx
@pytest.mark.emulation
def test_the_decode_shapes_plan_emulates_equal_to_the_interpreter():
    """The plan the planner gives the decode shape (M = 16, N = K = 4096: blocks of one tile row, `tile.dequant_cost`)
    forced on a size the emulation runs, split-K as well: equal to the interpreter bit for bit on exact inputs."""
    decode = spatialc.build(spatialc.gemm(16, 4096, 4096, "bf16", weights="int4", group=128, zeros=True), "sm_90")
    b = decode.plan.block
    assert b.osh == 1 and decode.placement.splits > 1, decode.plan
    p = w4_program(16, 32 * b.osw, 512, "int4", block=(b.osh, b.osw, b.ibw), sub_blocks=decode.plan.sub_blocks,
                   split_k=2, group=128, zeros=True)  # fmt: skip
    assert p.plan.block == b and p.placement.splits == 2
    art = spatialc.lower(p)
    assert REGISTER_PATH in art.program_cu
    x = w4_inputs(p, seed=7, exact=True)
    assert np.array_equal(emulated(art, x), spatialc.evaluate(p, x))

"""W4A16 GEMMs in the sm_90a form (issue 34, item 6; lower/cuda/sm90a/dequant.py): the producer lands each packed
page (and its scales and zero points) by bulk copies, the consumer warpgroups dequantise it into B's page of swizzled
panels (common/dequant.cuh's `spatialc_w4_regs`), fence it over to the async proxy before B's Push, and wgmma reads it
from shared memory. The host emulation runs the printed kernels equal to the interpreter at decode shapes (M = 1, 16,
64) and a square one, for int4 with zero points, uint4 with float32 scales and fp16 operands, and mxfp4, in both of
the form's blocks (two consumer warpgroups; one, two blocks an SM), and with a fused epilogue; the nibbles read the
other way round, the scales of the other group, a missing fence.proxy.async, a wgmma issued before B's barrier, a K
step's stages released before its wgmma group retired (the K loop keeps one group in flight) and a bulk copy of a
size the ISA refuses, each planted in the kernel text, are caught; nvcc -Werror compiles the decode kernel (M = 16,
N = K = 4096, int4 with zero points per 128) for sm_90a without spills, its SASS with wgmma, bulk copies and no byte
loads; a program planned for the general form, and groups that straddle K steps, are refused by one line."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

import spatialc
from spatialc.cli import main
from spatialc.lower.errors import NeedsGeneral, Unsupported
from spatialc.runtime.emulate import EmulationError, EmulationRace

from ..lower.test_sm90a import NVCC, compiled_clean
from .test_w4_kernels import emulated, needs_gxx
from .w4_inputs import w4_inputs

CASES = {  # (weights, precision, (M, N, K), gemm keywords, forced block)
    "int4-zeros-m1": ("int4", "bf16", (1, 64, 512), {"group": 128, "zeros": True}, None),  # 8 K steps, 4 stages
    "int4-zeros-m16-paired": ("int4", "bf16", (16, 64, 256), {"group": 128, "zeros": True}, (4, 2, 4)),
    "uint4-f32-scales-fp16-m64": ("uint4", "fp16", (64, 72, 192), {"group": 64, "scale_type": "float32"}, None),
    "mxfp4-m16": ("mxfp4", "bf16", (16, 48, 160), {}, None),
    "int4-zeros-square": ("int4", "bf16", (256, 256, 256), {"group": 128, "zeros": True}, None),
    "uint4-zeros-fused-epilogue": (  # bias, relu and a row scale applied by the consumers' fused store, out in bf16
        "uint4",
        "bf16",
        (20, 40, 256),
        {"zeros": True, "epilogue": [spatialc.bias(), spatialc.relu(), spatialc.row_scale()], "out": "bf16"},
        None,
    ),
}


def sm90a_program(m, n, k, fmt, prec, kw, block=None):
    return spatialc.build(spatialc.gemm(m, n, k, prec, weights=fmt, **kw), "sm_90a", form="sm90a", block=block)


@pytest.fixture(scope="module")
def built():
    """Each case's program, planned for the sm_90a form, and its artifact (each emulated kernel compiled once)."""
    out = {}
    for name, (fmt, prec, shape, kw, block) in CASES.items():
        p = sm90a_program(*shape, fmt, prec, kw, block)
        art = spatialc.lower(p)  # auto: pages in panels, so the sm_90a form
        assert art.budget.form == "sm90a" and "spatialc_w4_store_panels<" in art.kernel_cu
        assert art.budget.blocks_per_sm == (2 if block else 1)
        out[name] = (p, art)
    return out


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", CASES)
def test_the_emulated_kernel_equals_the_interpreter(built, case):
    p, art = built[case]
    exact = w4_inputs(p, seed=3, exact=True)  # small integers and powers of two: every sum exact
    assert np.array_equal(emulated(art, exact), spatialc.evaluate(p, exact))
    if case == "int4-zeros-m1":  # real-valued: within the kernel's bound, near the float64 sums
        real = w4_inputs(p, seed=6, exact=False)
        c, want = emulated(art, real), spatialc.evaluate(p, real)
        ok, how = spatialc.tolerance(p, kernel=True).check(c, real)
        assert ok, how
        assert np.abs(c - want).max() <= 1e-5 * np.abs(want).max()


def swap_nibbles(text: str) -> str:
    out, n = re.subn(r"spatialc_w4_regs<(\d), true, OPT>", r"spatialc_w4_regs<\1, false, OPT>", text)
    assert n == 1
    return out


def other_group(text: str) -> str:
    """The producer lands the other group's scales and zero points beside the page (groups 0 <-> 1, 2 <-> 3)."""
    out, n = re.subn(r"(const int g0 = .*? / 128);", r"\1 ^ 1;", text)
    assert n == 1
    return out


def no_fence(text: str) -> str:
    out, n = re.subn(r"\n\s*spatialc_fence_proxy_async\(\);  // the thread's operand values.*", "", text)
    assert n == 1
    return out


def wgmma_before_the_barrier(text: str) -> str:
    """B's Wait (the consumers' wait for every thread's dequantised values) dropped: the wgmma follows the thread's
    own arrival only."""
    at = text.index("{  // op:Compute:Dequant")
    wait = re.compile(r"\n\s*spatialc_mbar_wait\(&full_(\d+)\[wt_\1 % DEPTH_\1\], \(wt_\1 / DEPTH_\1\) & 1\); ")
    found = [m for m in wait.finditer(text, at) if text.index("// op:Compute:MatmulTiles", at) > m.start()]
    assert found
    m = found[-1]
    r = m[1]
    return text[: m.start()] + f"\n++wt_{r}; " + text[m.end() :]


def released_before_retired(text: str) -> str:
    """The previous K step's stages released before the wait_group that retires its group: the producer refills a
    stage the wgmma may still read."""
    m = re.search(r"( *)spatialc_wgmma_wait<1>\(\);[^\n]*\n( *if \(k > 0\) \{[^\n]*\n(?:.*\n)*?\1\}\n)", text)
    assert m
    return text[: m.start()] + m[2] + m[1] + "spatialc_wgmma_wait<1>();\n" + text[m.end() :]


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("fault", [swap_nibbles, other_group], ids=["nibble order", "the other group's scales"])
def test_a_wrong_dequant_planted_in_the_kernel_text_is_caught(built, fault):
    p, art = built["int4-zeros-m1"]
    x = w4_inputs(p, seed=7, exact=True)
    c = emulated(art, x, fault)
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (no_fence, r"RACE between the proxies: spatialc_wgmma .* with no fence\.proxy\.async since"),
        (wgmma_before_the_barrier, r"RACE"),
        (released_before_retired, r"RACE on shared ring .* a wgmma operand read .* and a TMA load landing"),
    ],
    ids=["no fence.proxy.async", "wgmma before B's barrier", "stages released before their group retired"],
)
def test_a_broken_handover_to_wgmma_is_a_race_the_emulation_reports(built, fault, says):
    p, art = built["int4-zeros-m1"]
    with pytest.raises(EmulationRace, match=says):
        emulated(art, w4_inputs(p, seed=8, exact=True), fault)


def test_a_program_planned_for_the_general_form_is_refused_by_one_line():
    p = spatialc.build(spatialc.gemm(16, 64, 256, "bf16", weights="int4", group=128, zeros=True), "sm_90a")
    with pytest.raises(NeedsGeneral, match=r"planned for the other forms, in the sm_90a form.*form='sm90a'") as e:
        spatialc.lower(p, form="sm90a")
    assert "\n" not in str(e.value)
    art = spatialc.lower(p)  # auto: the general form, saying why not the sm_90a one
    assert art.budget.form == "general" and any("form='sm90a'" in n for n in art.notes)


@needs_gxx
@pytest.mark.emulation
def test_a_bulk_copy_of_a_size_the_isa_refuses_is_a_misuse_the_emulation_reports(built):
    """A packed row's bulk copy 8 bytes short (not whole 16-byte chunks, as cp.async.bulk asks)."""
    p, art = built["int4-zeros-m1"]

    def short(text: str) -> str:
        out, n = re.subn(
            r"(spatialc_bulk_load\(\(char\*\)\(ring_\d+ .*?), (\d+)u, ", lambda m: f"{m[1]}, {int(m[2]) - 8}u, ", text
        )
        assert n == 1
        return out

    with pytest.raises(EmulationError, match=r"spatialc_bulk_load at line \d+: a bulk copy's ends and size"):
        emulated(art, w4_inputs(p, seed=9, exact=True), short)


def test_the_cli_prints_it_in_the_sm90a_form(capsys):
    argv = ["gemm", "16", "96", "256", "--precision", "bf16", "--weights", "int4", "--zeros", "--target", "sm_90a"]
    assert main([*argv, "--form", "sm90a"]) == 0
    out = capsys.readouterr().out
    assert "kernel    sm_90a form" in out and "B dequantised into its panels by the consumers" in out
    assert "interpreter vs numpy reference: OK" in out


def test_groups_that_straddle_k_steps_are_refused_by_one_line():
    p = sm90a_program(16, 64, 192, "int4", "bf16", {"group": 48})  # K steps of 64 rows, groups of 48
    with pytest.raises(Unsupported, match=r"a K step of 64 rows and groups of 48: .*a K step of whole groups") as e:
        spatialc.lower(p)
    assert "\n" not in str(e.value)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_compiles_the_decode_kernel_without_spills_and_no_byte_loads(tmp_path):
    gemm = spatialc.gemm(16, 4096, 4096, "bf16", weights="int4", group=128, zeros=True)
    art = spatialc.lower(spatialc.build(gemm, "sm_90a", form="sm90a"))
    assert art.budget.form == "sm90a"
    instrs = compiled_clean(art, tmp_path)  # -Werror, no spills, no wgmma ptxas had to serialise
    ops = Counter(i.base for i in instrs)
    assert ops["HGMMA"] >= 1 and ops["UBLKCP"] >= 1 and ops["UTMALDG"] >= 1 and ops["HMMA"] == 0, ops
    loads = Counter(i.op for i in instrs if i.base in ("LDS", "LDG", "LD"))
    assert loads and not any(".U8" in op or ".S8" in op for op in loads), loads  # words only: no byte loads
    # The scales and zero points come with the packed page (bulk copies): the main loop reads no global memory, and
    # the only global loads left are the work list's (an item's offset and count, a list entry).
    assert ops["UBLKCP"] >= 3 and ops["LDG"] <= 4, ops

"""Programs that reduce rows (`spatialc.softmax`, `spatialc.rmsnorm`) in the general CUDA form: the form `lower`
picks and the form that refuses them; the kernel's row accumulators, shuffles, padding mask and row-vector reads;
its ledger and census; nvcc for sm_80 and sm_90 without a warning or a spill; the host emulation against the
interpreter within `spatialc.tolerance(p, kernel=True)` at ragged sizes, several bands a site, forced blocks (bands
of 1, 2 and 8 tile rows, pages 1 to 4 tiles wide) and fp16 / bf16 inputs and outputs; and planted faults (the
padding summed, a page left out, a shuffle step left out, a vector read at the wrong row, a vector published before
it is packed) that the emulation must catch.
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
from spatialc.ir.nodes import ComputeStage, TensorRole
from spatialc.ir.ops import ScaleAcc
from spatialc.lower.census import stage_kind
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.cuda.common.rows import BASE_REGISTERS, SHARE_REGISTERS, TILE_REGISTERS
from spatialc.lower.errors import NeedsGeneral, Unsupported
from spatialc.passes.rows import ONLINE_EXP, ONLINE_P, ONLINE_RESCALE, row_shape
from spatialc.runtime.emulate import EmulationError, EmulationRace

from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")

# name → (program, build options). Ragged sizes throughout: rows past the last band's and columns past the row's
# last page are padding, which the reductions must leave out.
CASES = {
    # 13 tiles a row read 4 a page (4 pages, the last 56 columns padding); 3 bands on 2 sites: an ITEM loop.
    "softmax/bf16": (lambda: spatialc.softmax(40, 200, "bf16"), {"block": (1, 4, 1), "sites": 2}),
    "rmsnorm/fp16": (lambda: spatialc.rmsnorm(40, 200, "fp16"), {"sites": 2}),
    # bands of 2 tile rows (the last band 26 rows of padding), pages of 2 tiles, items dealt round-robin
    "softmax/fp16-out-bf16-bands-of-2": (
        lambda: spatialc.softmax(70, 100, "fp16", out="bf16"),
        {"block": (2, 2, 1), "sites": 2, "placement": "round_robin"},
    ),
    # pages one tile wide (half of each warp's lanes have no column), three pages deep, no weight
    "rmsnorm/bf16-out-fp16-narrow": (
        lambda: spatialc.rmsnorm(33, 50, "bf16", eps=1e-5, weight=False, out="fp16"),
        {"block": (1, 1, 1), "depth": 3},
    ),
    # bands of 8 tile rows: 16 rows a compute warp
    "softmax/bf16-bands-of-8": (lambda: spatialc.softmax(130, 64, "bf16"), {"block": (8, 2, 1)}),
    # online: the max and the sum of exp in one pass over each row's 4 pages, the sum rescaled page by page
    "softmax/bf16-online": (lambda: spatialc.softmax(40, 200, "bf16", online=True), {"block": (1, 4, 1), "sites": 2}),
    # online over bands of 2 tile rows, 2 pages deep, items dealt round-robin
    "softmax/fp16-out-bf16-online-bands-of-2": (
        lambda: spatialc.softmax(70, 100, "fp16", out="bf16", online=True),
        {"block": (2, 2, 1), "sites": 2, "placement": "round_robin"},
    ),
}


@cache
def built(name):
    prog, kw = CASES[name]
    return spatialc.build(prog(), "sm_90", **kw)


@cache
def lowered(name):
    return spatialc.lower(built(name))


def inputs(p, seed=0):
    """x normal times 3, already of its type, a few exact zeros; the weight normal."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role == TensorRole.INPUT:
            x = rng.standard_normal(t.elems) * 3
            x[rng.random(t.elems) < 0.05] = 0.0
            out[t.name] = operand_values(t.name, x, t.dtype)
        elif t.role == TensorRole.PARAMETER:
            out[t.name] = rng.standard_normal(t.elems[1]).astype(np.float32)
    return out


def emulated(names, mutate=lambda text: text, mode="late"):
    """C of each named case through the emulation (2 at once), with its inputs."""

    def one(name):
        art, ins = lowered(name), inputs(built(name), seed=len(name))
        return spatialc.emulate(dataclasses.replace(art, program_cu=mutate(art.program_cu)), ins, mode=mode), ins

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, names))


def within(name, c, ins):
    return spatialc.tolerance(built(name), kernel=True).check(c, ins)


# ---- which form ------------------------------------------------------------------------------------------------


def test_auto_prints_a_row_program_in_the_general_form_and_says_so():
    art = lowered("softmax/bf16")
    assert art.budget.form == "general" and art.launch.kernel_name == "spatialc_general" and art.general is None
    (note,) = [note for note in art.notes if "reduces rows" in note]
    assert note.startswith("the general form") and "form='persistent'" in note
    assert spatialc.lower(built("softmax/bf16"), form="general").kernel_cu == art.kernel_cu


def test_the_sm90a_form_refuses_a_row_program_naming_the_general_form():
    """(The persistent form prints it: tests/lower/test_persistent_pages.py.)"""
    p = built("rmsnorm/fp16")
    with pytest.raises(Unsupported, match="sm_90a only"):
        spatialc.lower(p, form="sm90a")  # built for sm_90, which has no sm_90a instructions
    hopper = spatialc.build(spatialc.rmsnorm(40, 200, "fp16"), "sm_90a")
    with pytest.raises(NeedsGeneral, match=r"reduces rows \(softmax, RMSNorm\) in the sm_90a form.*form='general'"):
        spatialc.lower(hopper, form="sm90a")
    art = spatialc.lower(hopper)
    assert art.budget.form == "general" and art.target == "sm_90a"


# ---- the kernel and its ledger -----------------------------------------------------------------------------------


def test_the_compute_warps_hold_row_accumulators_and_no_fragments():
    art = lowered("softmax/bf16")
    text = art.kernel_cu
    assert re.findall(r"\(warp < \d+\) \{  // (\w+): warps (\d+)-(\d+)", text) == [
        ("compute", "0", "7"),
        ("reader", "8", "8"),
        ("writer", "9", "9"),
    ]
    assert art.budget.engines == (("compute", 8), ("reader", 1), ("writer", 1)) and art.launch.block == 320
    for absent in ("spatialc_mma", "spatialc_acc<", "SPATIALC_TENSOR_CORE", "typedef float ACCT", "PERW"):
        assert absent not in text, absent
    # 16 rows of a band over 8 warps: 2 a warp, one share a lane of each, for the max and for the sum.
    assert "#define NWARP 8" in text and "#define RROWS 2" in text
    assert "float racc_7[RROWS];" in text and "float racc_8[RROWS];" in text
    assert "racc_7[q] = (-INFINITY);" in text and "racc_8[q] = 0e+00f;" in text
    # Each lane folds its columns of the page below the row's 200 values, with the table's max and add.
    assert text.count("if (col0 + c < 200) {  // the row's padding is left out") == 2
    assert "const long long col0 = (long long)(k * 4) * 16;" in text
    assert "racc_7[q] = spatialc_max(racc_7[q], x);" in text and "racc_8[q] = spatialc_fadd(racc_8[q], x);" in text
    # PackAcc: a butterfly over the warp, lane 0's value into the 16 columns of the row.
    assert "v = spatialc_max(v, __shfl_xor_sync(0xffffffffu, v, m));" in text
    assert text.count("v = __shfl_sync(0xffffffffu, v, 0);") == 2
    assert "(row / 16) * 256 + (row % 16) * 16 + lane, (EPIT)v);" in text
    # A map reads the vector at its element's row: tile tl of a page 4 tiles wide is in the vector's tile tl / 4.
    assert (
        "const float v1 = (float)SPATIALC_PAGE_LD(ring_1 + (pop_1 % DEPTH_1) * PAGE_1 + (tl / 4) * 256 + el);" in text
    )
    bud = art.budget
    assert bud.total_bytes == bud.dyn_bytes == bud.ring_bytes + bud.barrier_bytes == art.launch.dyn_smem
    assert dict(bud.rings)["row_max_ring"] == 256 * 4 and dict(bud.rings)["x0_ring"] == 2 * 4 * 256 * 2


def test_rmsnorm_squares_and_scales_with_the_tables_ops():
    text = lowered("rmsnorm/fp16").kernel_cu
    assert "racc_" in text and "= spatialc_fadd(racc_" in text and "spatialc_fmul(x, x)" in text
    assert "spatialc_rsqrt(spatialc_fadd(spatialc_div(v1, 2e+02f), 1e-06f))" in text
    assert "t1[(long long)(k * 8 + tl % 8) * 256 + el % 16]" in text  # the weight at the element's column


def test_the_register_estimate_sets_the_blocks_an_sm_holds():
    art, p = lowered("softmax/bf16"), built("softmax/bf16")
    bh, bw = p.plans[0].block.osh, p.plans[0].block.ibw
    estimate = BASE_REGISTERS + SHARE_REGISTERS * 2 * 2 + TILE_REGISTERS * bh * bw  # 2 rows a warp, 2 reductions
    assert art.budget.regs_est == estimate and art.budget.blocks_per_sm == 2
    assert "__launch_bounds__(NTHREAD, 2)" in art.kernel_cu


@pytest.mark.parametrize("name", list(CASES))
def test_the_census_counts_each_reduction_and_map_once(name):
    art, p = lowered(name), built(name)
    stages = [s for s in p.stages if isinstance(s.kind, ComputeStage)]
    want = {}
    for s in stages:
        want[stage_kind(s.kind.op)] = want.get(stage_kind(s.kind.op), 0) + 1
    if row_shape(p).online is not None:  # the online pass's own ops: α's map, P's (stage E's) and the sum's rescale
        want.pop(stage_kind(ONLINE_EXP))
        want.update({stage_kind(op): 1 for op in (ONLINE_RESCALE, ONLINE_P, ScaleAcc())})
    assert art.census.agrees, art.census
    assert art.census.stages == want == art.census.printed_stages


def test_the_bench_program_reports_bytes_moved():
    art = lowered("rmsnorm/fp16")
    moved = 40 * 200 * 2 + 200 * 4 + 40 * 200 * 4  # x (fp16, credited once), the weight and out (float32)
    assert f"const double total = {moved}.0 * ITERS;  // bytes moved" in art.bench_cu


# ---- nvcc -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nvcc_run(tmp_path_factory):
    """Every case's kernel_cu, and one program_cu / bench_cu, in one translation unit compiled for sm_80 and sm_90
    (`-c`: the general rows' host code by gcc -Wall -Wextra -Werror too)."""
    d = tmp_path_factory.mktemp("nvcc_rows")
    host = lowered("rmsnorm/fp16")  # its kernel in its program_cu and bench_cu, which begin with it, not alone
    assert host.program_cu.startswith(host.kernel_cu) and host.bench_cu.startswith(host.kernel_cu)
    texts = [(name, "p", lowered(name).kernel_cu) for name in CASES if name != "rmsnorm/fp16"]
    texts += [("rmsnorm/fp16", "p", host.program_cu), ("rmsnorm/fp16", "b", host.bench_cu)]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(text, i, kind) for i, (_, kind, text) in enumerate(texts)]
    (d / "rows.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "2", "-o", str(d / "rows.o"), str(d / "rows.cu"), *archs, *FLAGS]
    return texts, subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_row_kernel_compiles_for_sm80_and_sm90_without_warnings_or_spills(nvcc_run):
    texts, run = nvcc_run
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert len(entries) == 2 * len(texts)
    for case, kind, arch, spill, smem in entries:
        assert spill == 0, f"{texts[case][0]} ({kind}, {arch}) spills {spill} bytes"
        assert smem == 0, f"{texts[case][0]} ({arch}): {smem} bytes of static shared memory; all of it is dynamic"


# ---- the host emulation against the interpreter ------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs():
    """Every case through the emulation in late mode, two in early mode too: (name, mode) → (C, the inputs)."""
    if GXX is None:
        pytest.skip("g++ is not installed")
    out = {(n, "late"): r for n, r in zip(CASES, emulated(list(CASES)), strict=True)}
    early = ["softmax/bf16", "rmsnorm/bf16-out-fp16-narrow"]
    out.update({(n, "early"): r for n, r in zip(early, emulated(early, mode="early"), strict=True)})
    return out


@pytest.mark.emulation
def test_the_emulation_lies_within_the_kernel_tolerance(runs):
    for (name, mode), (c, ins) in runs.items():
        want = np.asarray(spatialc.evaluate(built(name), ins))
        ok, how = within(name, c, ins)
        assert ok and c.dtype == want.dtype and c.shape == want.shape, (name, mode, how)


@pytest.mark.emulation
def test_the_data_exercise_what_they_should(runs):
    """Softmax rows that sum to 1 and vary; the padding, summed, would have moved every softmax row (exp(0 − max) of
    each padded column) — what the planted faults below show the check would see."""
    c, _ = runs[("softmax/bf16", "late")]
    assert np.allclose(c.sum(axis=1), 1.0, atol=1e-5) and len(np.unique(c)) > 1000
    c, ins = runs[("rmsnorm/fp16", "late")]
    assert np.abs(c).max() > 1.0 and (ins["x"] == 0).any()


@pytest.mark.emulation
@needs_gxx
def test_the_cli_runs_a_saved_row_program_through_the_emulation(tmp_path, capsys):
    from spatialc.cli import main

    saved = tmp_path / "rms.json"
    assert main(["rmsnorm", "40", "100", "--eps", "1e-5", "--no-weight", "--json", str(saved)]) == 0
    capsys.readouterr()
    assert main(["run", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "check     interpreter vs numpy reference: OK" in out
    assert "under the host emulation" in out and "C equals the numpy reference within its bound" in out


# ---- planted faults the emulation must catch ---------------------------------------------------------------------


def _planted(text, old, new, count=1):
    assert text.count(old) == count, (old, text.count(old))
    return text.replace(old, new)


def _caught(name, mutate):
    ((c, ins),) = emulated([name], mutate)
    ok, how = within(name, c, ins)
    assert not ok, how


@pytest.mark.emulation
@needs_gxx
def test_padding_summed_into_a_row_is_caught():
    """The fold without its mask: the sum takes exp(0 − max) of each of the 56 padded columns of every row."""
    _caught("softmax/bf16", lambda text: _planted(text, "if (col0 + c < 200)", "if (col0 + c >= 0)", 2))


@pytest.mark.emulation
@needs_gxx
def test_a_page_left_out_of_a_reduction_is_caught():
    """Every row's first page (columns 0 to 127) left out of the sum of squares."""
    _caught("rmsnorm/fp16", lambda text: _planted(text, "if (col0 + c < 200)", "if (col0 + c < 200 && col0 != 0)"))


@pytest.mark.emulation
@needs_gxx
def test_a_shuffle_step_left_out_is_caught():
    """The butterfly stops before its last step: a row's value is the even lanes' alone."""
    step = "for (int m = 16; m > 0; m >>= 1)"
    _caught("softmax/bf16", lambda text: _planted(text, step, step.replace("m > 0", "m > 1"), 2))


@pytest.mark.emulation
@needs_gxx
def test_a_row_vector_read_at_the_wrong_row_is_caught():
    """The map reads its tile's first row of the vector for every element of the tile (el % 16 for el)."""
    _caught(
        "softmax/fp16-out-bf16-bands-of-2",
        lambda text: _planted(text, "(tl / 2) * 256 + el)", "(tl / 2) * 256 + el % 16)", 3),
    )


@pytest.mark.emulation
@needs_gxx
def test_a_vector_published_before_it_is_packed_is_a_race():
    """The compute engine pushes the row maxima before the lanes store them: its own threads read them meanwhile."""

    def early_push(text):
        push = "spatialc_mbar_arrive(&full_1[psh_1 % DEPTH_1]); ++psh_1;  // op:Push"
        text = _planted(text, push, "// op:Push (moved before the pack)")
        reserve = "++rsv_1;  // op:Reserve"
        return _planted(text, reserve, f"{reserve}\n{push.replace('  // op:Push', '')}")

    with pytest.raises(EmulationRace, match="ring_1"):
        emulated(["softmax/bf16"], early_push)


@pytest.mark.emulation
@needs_gxx
def test_the_emulation_refuses_a_shuffle_of_part_of_a_warp():
    def half(text):
        return _planted(text, "__shfl_xor_sync(0xffffffffu, v, m)", "__shfl_xor_sync(0x0000ffffu, v, m)", 2)

    with pytest.raises(EmulationError, match="partial mask"):
        emulated(["softmax/bf16"], half)


@pytest.mark.emulation
@needs_gxx
def test_an_online_sum_never_rescaled_is_caught():
    """The online pass's ScaleAcc multiplies by 1: the sum keeps exp(x − m) of pages summed before the max grew."""

    def unscaled(text):
        found = re.findall(r"racc_\d+\[q\] \*= ", text)
        assert len(found) == 1, found
        return text.replace(found[0], found[0].replace("*=", "*= 1.0f + 0.0f *"))

    _caught("softmax/bf16-online", unscaled)


@pytest.mark.emulation
@needs_gxx
def test_an_online_rescale_by_the_new_max_only_is_caught():
    """α = exp(m_new − m_new) = 1: the old max's page read where the new one's belongs."""

    def same_max(text):
        start = text.index("op:Compute:Map_exp_sub_row0_max_row1_lit")
        head, tail = text[:start], text[start:]
        first = re.search(r"ring_(\d+) \+ \(pop_(\d+) % DEPTH_\d+\)", tail)
        second = re.search(r"v1 = \(float\)SPATIALC_PAGE_LD\(ring_(\d+) \+ \(pop_(\d+)", tail)
        assert first and second
        old, new = f"ring_{first[1]} + (pop_{first[2]}", f"ring_{second[1]} + (pop_{second[2]}"
        return head + tail.replace(old, new, 1)

    _caught("softmax/bf16-online", same_max)

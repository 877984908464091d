"""Programs without a tile matmul — maps (`spatialc.elementwise`), softmax, RMSNorm and LayerNorm — in the persistent
CUDA form: the form `lower` prints them in when asked (auto keeps the general form, and says why); the serialised
order (a later pass's writer loop left out of the earlier passes), the printers the general form shares (the same C
for every map and fold), the census; nvcc for sm_80, sm_86 and sm_90 without a warning or a spill; the host
emulation against the interpreter — bit for bit for exact maps, within `spatialc.tolerance(p, kernel=True)` for the
others — at ragged sizes, several items a site, forced blocks, a reduction pipelined two pages deep, rings one page
deep, bands of 8 tile rows, LayerNorm's three outputs; and planted faults (a shuffle step left out, a row vector read
at the wrong row, a column vector at the wrong column, a vector written from the wrong ring, the barriers between a
map and its fold left out) that the emulation must catch.
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
from spatialc import ew
from spatialc.inputs import operand_values
from spatialc.ir.nodes import ComputeStage, DType, TensorRole
from spatialc.ir.ops import ScaleAcc, WriteTiles
from spatialc.lower.census import stage_kind
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.cuda.persistent import pages as persistent_pages
from spatialc.lower.errors import Unsupported
from spatialc.passes.rows import ONLINE_EXP, ONLINE_P, ONLINE_RESCALE, row_shape
from spatialc.runtime.emulate import EmulationRace

from .test_lower import with_ops
from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")


def _map(expr, *args, **kw):
    return lambda: spatialc.elementwise(expr(*ew.inputs(2)), *args, **kw)


# name → (program, build options, exact: the emulation equals the interpreter bit for bit). Ragged sizes throughout.
CASES = {
    # two inputs and a column vector; 3 × 5 items of 1 × 2 tiles over 3 sites, dealt round-robin (an ITEM loop)
    "map/bf16": (
        _map(lambda x, g: ew.relu(x) * g + ew.col("bias") - x, 45, 70, "bf16"),
        {"block": (1, 2, 1), "sites": 3, "placement": "round_robin"},
        True,
    ),
    # int8: exact long long arithmetic past int32, an int64 output
    "map/int8": (
        _map(lambda x, g: ew.max(x * g - 3, ew.col("bias")) * 2 + 7, 50, 40, "int8"),
        {"block": (2, 2, 1), "sites": 2},
        True,
    ),
    # a row vector (one value a row) and a column vector, items of 2 × 2 tiles over 2 sites
    "map/bf16-row-and-col": (
        _map(lambda x, g: x * ew.row("scale") + g * ew.col("bias"), 50, 40, "bf16"),
        {"block": (2, 2, 1), "sites": 2},
        True,
    ),
    # library ops (within the tolerance), fp16 in, bf16 out, one item a site (no ITEM loop)
    "map/fp16-silu": (_map(lambda x, g: ew.silu(g) * x + ew.col("bias"), 33, 17, "fp16", out="bf16"), {}, False),
    # 13 tiles a row read 4 a page (the last 56 columns padding); 3 bands on 2 sites; the max's pass pipelined
    "softmax/bf16": (lambda: spatialc.softmax(40, 200, "bf16"), {"block": (1, 4, 1), "sites": 2}, False),
    # bands of 2 tile rows (the last band 26 rows of padding), items dealt round-robin
    "softmax/fp16-out-bf16-bands-of-2": (
        lambda: spatialc.softmax(70, 100, "fp16", out="bf16"),
        {"block": (2, 2, 1), "sites": 2, "placement": "round_robin"},
        False,
    ),
    # bands of 8 tile rows (16 rows a warp), rings one page deep: no pass pipelined
    "softmax/bf16-bands-of-8-depth-1": (
        lambda: spatialc.softmax(130, 64, "bf16"),
        {"block": (8, 2, 1), "depth": 1},
        False,
    ),
    # online: the max and the sum of exp in one pass, the sum rescaled page by page (two passes in all)
    "softmax/bf16-online": (
        lambda: spatialc.softmax(40, 200, "bf16", online=True),
        {"block": (1, 4, 1), "sites": 2},
        False,
    ),
    "rmsnorm/fp16": (lambda: spatialc.rmsnorm(40, 200, "fp16"), {"sites": 2}, False),
    # pages one tile wide three deep: the sum of squares pipelined two pages ahead
    "rmsnorm/bf16-narrow-depth-3": (
        lambda: spatialc.rmsnorm(33, 50, "bf16", eps=1e-5, weight=False, out="fp16"),
        {"block": (1, 1, 1), "depth": 3},
        False,
    ),
    # three outputs: out, and the mean and rstd vectors written a tile a row of the band
    "layernorm/bf16": (lambda: spatialc.layernorm(40, 70, "bf16"), {"block": (1, 2, 1), "sites": 2}, False),
}


@cache
def built(name):
    prog, kw, _ = CASES[name]
    return spatialc.build(prog(), "sm_90", **kw)


@cache
def lowered(name):
    return spatialc.lower(built(name), form="persistent")


def inputs(p, seed=0):
    """int8 inputs over their whole range, int32 column vectors near its limits; float inputs normal times 3 with a
    few exact zeros, float parameters normal."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role == TensorRole.INPUT and t.dtype == DType.INT8:
            out[t.name] = rng.integers(-128, 128, t.elems).astype(np.int8)
        elif t.role == TensorRole.INPUT:
            x = rng.standard_normal(t.elems) * 3 + (2 if "layernorm" in p.name else 0)
            x[rng.random(t.elems) < 0.05] = 0.0
            out[t.name] = operand_values(t.name, x, t.dtype)
        elif t.role == TensorRole.PARAMETER and t.dtype == DType.INT32:  # a vector: n values (1 × n) or m (m × 1)
            n = t.elems[0] * t.elems[1]
            out[t.name] = rng.choice([-1, 1], n) * (2**31 - 1 - rng.integers(0, 5000, n))
        elif t.role == TensorRole.PARAMETER:
            out[t.name] = (rng.standard_normal(t.elems[0] * t.elems[1]) * 2).astype(np.float32)
    return out


def emulated(names, mutate=lambda text: text, mode="late"):
    """The outputs of each named case through the emulation (2 at once), with its inputs."""

    def one(name):
        art, ins = lowered(name), inputs(built(name), seed=len(name))
        return spatialc.emulate(dataclasses.replace(art, program_cu=mutate(art.program_cu)), ins, mode=mode), ins

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, names))


def within(name, c, ins):
    return spatialc.tolerance(built(name), kernel=True).check(c, ins)


# ---- which form, and the kernel ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["map/bf16", "softmax/bf16"])
def test_auto_keeps_the_general_form_and_the_persistent_one_prints_when_asked(name):
    auto, art = spatialc.lower(built(name)), lowered(name)
    assert auto.budget.form == "general" and any("form='persistent'" in note for note in auto.notes)
    assert art.budget.form == "persistent" and art.launch.kernel_name == "spatialc_persistent"
    assert art.general is not None and art.general.kernel_cu == auto.kernel_cu  # carried, to be run beside it
    text = art.kernel_cu
    for absent in ("spatialc_mma", "spatialc_acc<", "accf", "PERW", "typedef float ACCT", "mbar"):
        assert absent not in text, absent
    assert "#define NTHREAD 256" in text and "#define NWARP 8" in text and art.launch.block == 256


def test_a_built_map_or_row_program_takes_the_persistent_form_but_not_sm90a():
    p = spatialc.elementwise(ew.x(0) + ew.x(1), 32, 32, "fp16")
    assert spatialc.lower(spatialc.build(p, "sm_90", form="persistent"), form="persistent").census.agrees
    with pytest.raises(spatialc.ProgramError, match="general and the persistent forms only, not 'sm90a'"):
        spatialc.build(spatialc.softmax(32, 32), "sm_90", form="sm90a")


def test_the_writer_runs_in_the_last_pass_and_the_first_pass_is_pipelined():
    """The serialised order of a softmax: the max's pass, pipelined one page ahead, its pack and wait; the sum's
    pass; then the output's pass, where alone the writer's loop is merged (`merge._joining`); the vectors popped."""
    text = lowered("softmax/bf16").kernel_cu
    loops = re.findall(r"for \(int k = 0; k < 4; \+\+k\) \{  // op:Loop (x\d)", text)
    assert loops == ["x2", "x2", "x3"]
    assert "// the loop over k is pipelined: step 0's copies are issued before it" in text
    assert text.count("op:Pop (no barrier: these slots are refilled only after the next wait barrier)") == 1
    assert text.index("op:Compute:Map_div_exp_sub_x0_row1_row2") < text.index("op:WriteTiles")
    deep = lowered("rmsnorm/bf16-narrow-depth-3").kernel_cu
    assert "pipelined 2 steps deep" in deep


@pytest.mark.parametrize("name", ["map/bf16", "map/int8", "softmax/bf16", "layernorm/bf16"])
def test_maps_and_folds_print_the_general_forms_c(name):
    """One printer per op: every value a map computes, every fold and every shuffle is the same C in both forms."""
    art = lowered(name)

    def statements(text):
        keep = r"(const (?:float|long long) v = .*|racc_\d+\[q\] = .*|v = .*__shfl.*|if \(col0 \+ c < \d+\).*)"
        return sorted(re.findall(keep, text))

    assert statements(art.kernel_cu) == statements(art.general.kernel_cu) != []


@pytest.mark.parametrize("name", list(CASES))
def test_the_census_counts_every_op_and_each_stage_once(name):
    art, p = lowered(name), built(name)
    want = {}
    for s in p.stages:
        if isinstance(s.kind, ComputeStage):
            want[stage_kind(s.kind.op)] = want.get(stage_kind(s.kind.op), 0) + 1
    if row_shape(p).online is not None:  # the online pass's own ops: α's map, P's (stage E's) and the sum's rescale
        want.pop(stage_kind(ONLINE_EXP))
        want.update({stage_kind(op): 1 for op in (ONLINE_RESCALE, ONLINE_P, ScaleAcc())})
    assert art.census.agrees, art.census
    assert art.census.stages == want == art.census.printed_stages


def test_the_ledger_counts_the_rings_and_the_row_registers():
    art, p = lowered("softmax/bf16"), built("softmax/bf16")
    bud = art.budget
    assert bud.barrier_bytes == 0 and bud.static_bytes == bud.ring_bytes == sum(b for _, b in bud.rings)
    assert dict(bud.rings)["row_max_ring"] == 256 * 4 and dict(bud.rings)["x0_ring"] == 2 * 4 * 256 * 2
    assert bud.regs_est == 80 + 2 * 2 * 2 + p.plans[0].block.osh * p.plans[0].block.ibw  # rows.py's estimate
    assert f"__launch_bounds__(NTHREAD, {bud.blocks_per_sm})" in art.kernel_cu and bud.blocks_per_sm >= 1


def test_a_copy_of_part_of_a_page_is_refused():
    """Verify's rule 8 refuses it (an output tile never written); the lowering, handed it unchecked, refuses it too."""
    edit = lambda op: dataclasses.replace(op, block_w=1) if isinstance(op, WriteTiles) else op  # noqa: E731
    half = with_ops(built("map/bf16"), "writer", edit)
    with pytest.raises(spatialc.VerifyError, match="is never written"):
        spatialc.lower(half, form="persistent")
    with pytest.raises(Unsupported, match=r"a WriteTiles of 1x1 tiles on .*: a copy in or out moves one whole page"):
        persistent_pages.lower(half, spatialc.target("sm_90"))


# ---- nvcc -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nvcc_run(tmp_path_factory):
    """Every case's kernel_cu, and one program_cu / bench_cu, in one translation unit for sm_80, sm_86 and sm_90
    (`-c`: their host code by gcc -Wall -Wextra -Werror too)."""
    d = tmp_path_factory.mktemp("nvcc_pages")
    # layernorm/bf16's and map/int8's kernels in their program_cu and bench_cu (which begin with them), not alone
    program, bench = lowered("layernorm/bf16"), lowered("map/int8")
    assert program.program_cu.startswith(program.kernel_cu) and bench.bench_cu.startswith(bench.kernel_cu)
    texts = [(name, "p", lowered(name).kernel_cu) for name in CASES if name not in ("layernorm/bf16", "map/int8")]
    texts += [("layernorm/bf16", "p", program.program_cu), ("map/int8", "b", bench.bench_cu)]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(text, i, kind) for i, (_, kind, text) in enumerate(texts)]
    (d / "pages.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_86", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "3", "-o", str(d / "pages.o"), str(d / "pages.cu"), *archs, *FLAGS]
    return texts, subprocess.run(cmd, capture_output=True, text=True, timeout=900)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_kernel_compiles_for_sm80_86_90_without_warnings_or_spills(nvcc_run):
    texts, run = nvcc_run
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert len(entries) == 3 * len(texts)
    for case, kind, arch, spill, smem in entries:
        name = texts[case][0]
        assert spill == 0, f"{name} ({kind}, {arch}) spills {spill} bytes"
        assert smem == lowered(name).budget.static_bytes, f"{name} ({arch}): {smem} bytes of static shared memory"


# ---- the host emulation against the interpreter ------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs():
    """Every case through the emulation in late mode, two in early mode too: (name, mode) → (outputs, inputs)."""
    if GXX is None:
        pytest.skip("g++ is not installed")
    out = {(n, "late"): r for n, r in zip(CASES, emulated(list(CASES)), strict=True)}
    early = ["map/int8", "rmsnorm/bf16-narrow-depth-3"]
    out.update({(n, "early"): r for n, r in zip(early, emulated(early, mode="early"), strict=True)})
    return out


@pytest.mark.emulation
def test_the_emulation_equals_the_interpreter_within_the_kernel_tolerance(runs):
    for (name, mode), (got, ins) in runs.items():
        want = spatialc.evaluate(built(name), ins)
        ok, how = within(name, got, ins)
        assert ok, (name, mode, how)
        pairs = got.items() if isinstance(got, dict) else [("C", got)]
        wants = want if isinstance(want, dict) else {"C": want}
        for out, c in pairs:
            assert c.dtype == np.asarray(wants[out]).dtype and c.shape == np.asarray(wants[out]).shape, (name, out)
            if CASES[name][2]:
                assert np.array_equal(c, np.asarray(wants[out])), (name, mode, out)


@pytest.mark.emulation
def test_the_data_exercise_what_they_should(runs):
    """Softmax rows that sum to 1 and vary; int8 values past int32; LayerNorm's mean and rstd both away from 0 and 1."""
    c, _ = runs[("softmax/bf16", "late")]
    assert np.allclose(c.sum(axis=1), 1.0, atol=1e-5) and len(np.unique(c)) > 1000
    c, _ = runs[("map/int8", "late")]
    assert np.abs(c).max() > 2**31
    got, _ = runs[("layernorm/bf16", "late")]
    assert set(got) == {"out", "mean", "rstd"}
    assert np.abs(got["mean"]).max() > 1.0 and np.abs(got["rstd"] - 1.0).max() > 0.1


# ---- planted faults the emulation must catch ---------------------------------------------------------------------


def _planted(text, old, new, count=1):
    assert text.count(old) == count, (old, text.count(old))
    return text.replace(old, new)


def _caught(name, mutate):
    ((got, ins),) = emulated([name], mutate)
    ok, how = within(name, got, ins)
    assert not ok, how
    return got


@pytest.mark.emulation
@needs_gxx
def test_a_shuffle_step_left_out_is_caught():
    """The butterfly of both reductions stops before its last step: a row's value is the even lanes' alone."""
    step = "for (int m = 16; m > 0; m >>= 1)"
    _caught("softmax/bf16", lambda text: _planted(text, step, step.replace("m > 0", "m > 1"), 2))


@pytest.mark.emulation
@needs_gxx
def test_a_row_vector_read_at_the_wrong_row_is_caught():
    """The maps read the vectors at their tile's first row for every element of the tile (el % 16 for el)."""
    _caught(
        "softmax/fp16-out-bf16-bands-of-2",
        lambda text: _planted(text, "(tl / 2) * 256 + el)", "(tl / 2) * 256 + el % 16)", 3),
    )


@pytest.mark.emulation
@needs_gxx
def test_a_column_vector_read_at_the_wrong_column_is_caught():
    """The bias indexed by the element's row in its tile (el / 16) where it must be its column (el % 16)."""
    _caught(
        "map/bf16",
        lambda text: _planted(text, "(item_x * 2 + tl % 2) * 256 + el % 16]", "(item_x * 2 + tl % 2) * 256 + el / 16]"),
    )


@pytest.mark.emulation
@needs_gxx
def test_a_vector_written_from_the_wrong_ring_is_caught():
    """rstd's output filled from the mean's ring (the copy the writer stores reads the wrong vector): the check names
    rstd, which then equals the mean."""
    rstd, mean = (f"ring_{r} + rslot_{r} * PAGE_{r} + (tl / 1) * 256 + el" for r in (6, 2))
    got = _caught("layernorm/bf16", lambda text: _planted(text, rstd, mean))
    assert np.array_equal(got["rstd"], got["mean"])


@pytest.mark.emulation
@needs_gxx
def test_the_barriers_between_a_map_and_its_fold_left_out_are_a_race():
    """Softmax's exp(x − max) page folded into the row sums with neither barrier between the map's stores and the
    fold's loads (the one after the run of pops that ends the map, the one of the fold's wait): a lane folds a row's
    elements that other threads of the block are still storing. (The writer needs no such barrier to be right: its
    threads store the elements their own map computed — a fault the emulation, rightly, does not see.)"""

    def unfenced(text):
        pop = "rslot_2 = (rslot_2 + 1) % DEPTH_2; __syncthreads();  // op:Pop"
        wait = "__pipeline_wait_prior(0); __syncthreads();  // op:Wait\n            {  // op:Compute:RowReduce"
        text = _planted(text, pop, pop.replace(" __syncthreads();", ""))
        return _planted(text, wait, wait.replace(" __syncthreads();", ""))

    with pytest.raises(EmulationRace, match="ring_3"):
        emulated(["softmax/bf16"], unfenced)


# ---- hostile schedule edits --------------------------------------------------------------------------------------


@pytest.mark.emulation
@needs_gxx
def test_accepted_edits_of_maps_and_rows_run_right_in_the_persistent_form():
    """A sample of the edits verify accepts (tests/mutants.py) of the map and row programs, lowered in the persistent
    form: refused with a typed error (sites left running different programs, an order the ring proof cannot meet), or
    run through the emulation exactly (a map) or within the kernel's bound (a row program). A run of 2 × 1,000 edits
    found no hole in 148 accepted ones; this keeps 8."""
    import random

    from spatialc.numerics.reference import reference
    from spatialc.passes.rows import is_row_program
    from tests import mutants

    programs = {
        k: v for k, v in mutants.PROGRAMS.items() if any(w in k for w in ("map", "softmax", "rms", "layernorm"))
    }
    assert len(programs) == 7  # (the online softmax and fused add + RMSNorm among them)
    tally = mutants.run(edits_per_program=150, seed=31, programs=programs)
    ran = 0
    for base, what, q in random.Random(5).sample(tally.accepted, len(tally.accepted)):
        try:
            art = spatialc.lower(q, form="persistent")
        except spatialc.SpatialError:
            continue  # a typed refusal by the lowering is an honest answer
        x = mutants.inputs_for(q)
        c = spatialc.emulate(art, x)
        if is_row_program(q):
            ok, how = spatialc.tolerance(q, kernel=True).check(c, x)
            assert ok, f"{base}: {what}: {how}"
        else:
            ref = reference(q, x)
            assert np.array_equal(np.asarray(c).astype(ref.dtype), ref), f"{base}: {what}"
        ran += 1
        if ran == 8:
            break
    assert ran == 8

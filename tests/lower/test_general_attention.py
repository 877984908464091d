"""Attention (`spatialc.attention`) in the general CUDA form: its schedule printed op by op on the compute, reader and
writer warps — S = Q·Kᵀ with K's rows as the K-major B fragment (spatialc_load_bt), the rescale of O's fragments
and of l's row shares (ScaleAcc), the mask's positions, the causal band's KV blocks counted per item (Span), the
running max packed before and after its reduction — refused by name by the persistent form; emulated on
the CPU equal to the interpreter within the kernel's bound (docs/numerics.md, "Attention"); a missed rescale, a Pop
before its page's last read and a wait on the wrong mbarrier phase each caught by the emulation."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.ir.ids import LV_K
from spatialc.ir.nodes import Engine, SpatialProgram
from spatialc.ir.ops import Compute, Const, Loop, Pop, Push, Reserve, ScaleAcc, Wait, walk
from spatialc.lower.cuda import forms
from spatialc.lower.cuda.common import registers
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.cuda.general.fragments import row_templates
from spatialc.lower.cuda.general.printer import cycles
from spatialc.lower.errors import NeedsGeneral, TooBig, Unsupported
from spatialc.numerics.tolerance import tolerance
from spatialc.runtime.emulate import EmulationDeadlock, EmulationRace
from spatialc.target import target

from ..attention.qkv import inputs
from ..rewrite import replace

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def program(
    *shape: int, block: tuple[int, int] | None = None, tgt: str = "sm_90", sites: int | None = None, **options
) -> SpatialProgram:
    """The attention built for `tgt` (on `sites` sites), verified (rules 1–8)."""
    forced = None if block is None else (*block, 1)
    return spatialc.build(spatialc.attention(*shape, **options), tgt, block=forced, sites=sites)


def lowered(p: SpatialProgram, form: str = "auto"):
    """`p` lowered in `form` (`spatialc.lower`, which verifies it again)."""
    return spatialc.lower(p, form=form)


def unchecked(p: SpatialProgram):
    """`p` lowered in the general form as it stands, marked verified: a planted fault rule 8 would refuse, printed
    to show that the emulation catches it too."""
    return forms.lower(p.evolve(verified=True), target(p.target), "general")


def check_close(p: SpatialProgram, out: dict[str, np.ndarray], given) -> None:
    """The emulated O and LSE within the kernel's bound of the declared function, and so within the kernel's bound
    and the interpreter's of the interpreter's own O and LSE."""
    ok, how = tolerance(p, kernel=True).check(out, given)
    assert ok, how
    want = spatialc.evaluate(p, given)
    kernel, interp = tolerance(p, kernel=True).bound(given), tolerance(p).bound(given)
    for name in ("o", "lse"):
        gap = np.abs(out[name].astype(np.float64) - want[name].astype(np.float64))
        assert np.all(gap <= kernel[name] + interp[name]), name


# ---- what is printed ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def causal():
    """Odd lengths, grouped-query heads, a causal mask: 2 query heads a KV head, 40 queries by 72 keys."""
    return program(1, 4, 40, 72, 32, kv_heads=2, causal=True)


def test_auto_prints_attention_in_the_general_form_off_sm90a_and_says_so(causal):
    art = lowered(causal)
    assert art.budget.form == "general" and forms.ATTENTION_NOTE in art.notes and art.census.agrees
    with pytest.raises(NeedsGeneral, match=r"cannot lower attention .*form='general'"):
        lowered(causal, form="persistent")
    # On sm_90a auto plans for and prints the sm_90a form (tests/lower/test_sm90a_attention.py); the general form
    # is still there when asked for.
    hopper = program(1, 4, 40, 72, 32, kv_heads=2, causal=True, tgt="sm_90a")
    assert lowered(hopper).budget.form == "sm90a"
    general_plan = spatialc.build(
        spatialc.attention(1, 4, 40, 72, 32, kv_heads=2, causal=True), "sm_90a", form="general"
    )
    assert lowered(general_plan).budget.form == "general"


def test_the_recurrence_is_printed_op_by_op(causal):
    text = lowered(causal).kernel_cu
    # S and O in fragments of their own, m and l as row shares. Q, K and V in swizzled pages, as a GEMM's operands:
    # K read as the K-major B it is (ldmatrix without .trans), V as a row-major B; P kept float32 in registers (the
    # running sum adds it unrounded) and packed, rounded to bf16, into the A fragment of P·V.
    assert len(re.findall(r"spatialc_acc<ACCT> accf_\d+\[PERW_\d+\];", text)) == 2
    assert len(re.findall(r"float racc_\d+\[RROWS\];", text)) == 2
    assert "spatialc_load_bt(bf" in text and "spatialc_load_b(bf" in text
    assert text.count("spatialc_load_a(af") == 1 and text.count("spatialc_load_a_acc(af[r], rr_") == 1
    assert "spatialc_load_a_float(af" not in text
    # O's rescale: each element by its row's α; l's: each share. Neither resets what it scales.
    assert text.count("// op:Compute:ScaleAcc") == 2
    assert re.search(r"accf_\d+\[q\]\.x\[e\] \*= rr_\d+\[\(q / 2\) \* 2 \+ \(\(e >> 1\) & 1\)\];", text)
    assert re.search(r"racc_\d+\[s\] \*= rr_\d+\[s\];", text)
    # The running max is packed three times (before and after its reduction, and at the end), each a quad's four
    # shares combined by two shuffles (as is l, once), and reset once a head.
    m_acc = re.search(r"racc_(\d+)\[q\] = \(-INFINITY\);", text).group(1)
    assert len(re.findall(rf"float v = racc_{m_acc}\[s\];", text)) == 3
    assert text.count(f"racc_{m_acc}[q] = (-INFINITY);") == 1
    assert text.count("__shfl_xor_sync(0xffffffffu, v, 1)") == text.count("__shfl_xor_sync(0xffffffffu, v, 2)") == 4
    # The causal band runs its KV blocks up to its diagonal: a count of its own per item, in the reader and the
    # compute warps alike — ceil((band's rows + 72 − 40) / 64 keys), at most the 2 blocks of a head.
    assert text.count("const long long trip_k_v = 80 + (long long)(item_y) * 48;") == 2
    # The mask: the key's column (the lane's first, and the element's place in the fragment) against the keys.
    assert "const int pos0 = (k * 4) * 16 + cbase;" in text
    assert "(float)(pos0 + (q % 4) * 16 + (e & 1) + 8 * (e >> 2)) < 7.2e+01f" in text


def test_lse_keeps_float32_beside_an_o_of_the_operand_type():
    art = lowered(program(1, 2, 40, 72, 64, out="bf16"))
    assert "typedef __nv_bfloat16 OUT_T;" in art.kernel_cu and "float* __restrict__ t4" in art.kernel_cu
    assert "SPATIALC_OUT_ST(&t4[(long long)tile * 256 + el], (float)" in art.kernel_cu


def test_the_recurrences_rings_live_in_the_compute_warps_registers(causal):
    art = lowered(causal)
    text = art.kernel_cu
    compute = text[text.index("// compute: warps") : text.index("// reader: warps")]
    # The recurrence's nine rings, which the compute warps alone fill and empty a page at a time: arrays of registers,
    # no counters, no barriers, no pages. Q's, K's and V's (waited for and popped) and O's and LSE's (reserved and
    # pushed) keep theirs.
    assert len(re.findall(r"float rr_\d+\[PERW_\d+ \* 8\];", compute)) == 4  # S, X, P and O packed
    assert len(re.findall(r"float rr_\d+\[RROWS\];", compute)) == 5  # m_old, m_new, α, l and m
    assert compute.count("in registers: the same warps' order)") == 9 * 4
    assert "unsigned n_" not in compute and "#pragma unroll 1" not in compute
    assert len(re.findall(r"unsigned wt_\d+ = 0, pop_\d+ = 0;", compute)) == 3
    assert len(re.findall(r"unsigned rsv_\d+ = 0, psh_\d+ = 0;", compute)) == 2
    assert [name for name, _ in art.budget.rings] == ["q_ring", "k_ring", "v_ring", "o_ring", "lse_ring"]
    # The compute warps split the band by rows alone: 3 tile rows, 3 warps, a tile row (16 queries) each.
    assert dict(art.budget.engines)["compute"] == 3 and art.census.agrees
    kernel = general.make_kernel(causal, target(causal.target))
    assert all(f.lane_grid == (3, 1) for f in kernel.layers.values()) and len(kernel.in_registers) == 9


def test_a_ring_two_pages_deep_keeps_every_page():
    p = program(1, 1, 40, 72, 32)
    k = general.make_kernel(p, target(p.target))
    compute = list(walk(next(prog.ops for prog in p.schedule.programs if prog.engine == Engine.COMPUTE)))
    depth = {r: 1 for r in (*k.rings.rings, *k.in_registers)}
    held = registers.register_rings(compute, k.rings, depth, row_templates(p), k.layers)
    assert held == k.in_registers and len(held) == 9
    # All of a program's candidates live in registers or none does: one ring two pages deep, and every page is kept.
    deeper = depth | {min(k.in_registers): 2}
    assert registers.register_rings(compute, k.rings, deeper, row_templates(p), k.layers) == {}


def test_the_planner_asks_the_general_form_what_a_block_costs():
    # head_dim 128: a block of 4 × 4 tiles needs 119,104 bytes of shared memory (its recurrence in registers), more
    # than sm_86's 99 KiB a block; 4 × 2 fits.
    p = program(1, 1, 64, 64, 128, tgt="sm_86")
    assert (p.plan.block.osh, p.plan.block.ibw) == (4, 2)
    smem, per_sm = general.attention_resources(target("sm_86"), p.plan, p.precision)
    assert lowered(p).budget.dyn_bytes == smem and per_sm == 1
    with pytest.raises(TooBig, match="shared memory of one block of the general form on sm_86"):
        lowered(program(1, 1, 64, 64, 128, tgt="sm_86", block=(4, 4)))
    wide = program(1, 1, 64, 64, 128, tgt="sm_80")
    assert (wide.plan.block.osh, wide.plan.block.ibw) == (4, 4) and lowered(wide).budget.dyn_bytes == 119104


# ---- emulated against the interpreter ----------------------------------------------------------------------------

CASES = [
    # shape (batch, heads, seq_q, seq_kv, head_dim), options, block (query, key tile rows), emulation mode
    ((1, 4, 40, 72, 32), {"kv_heads": 2, "causal": True, "sites": 1}, None, "late"),  # both KV heads on one site
    ((2, 2, 72, 40, 64), {"precision": "fp16", "out": "fp16"}, (2, 1), "early"),
    ((1, 2, 40, 72, 128), {"kv_heads": 1, "causal": True, "precision": "fp16"}, (2, 2), "late"),
]


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize(("shape", "options", "block", "mode"), CASES)
def test_the_emulated_kernel_equals_the_interpreter(shape, options, block, mode):
    p = program(*shape, block=block, **options)
    given = inputs(*shape, options.get("kv_heads"))
    check_close(p, spatialc.emulate(lowered(p), given, mode=mode, timeout=300), given)


# ---- planted faults ----------------------------------------------------------------------------------------------

SMALL = (1, 1, 40, 72, 32)


@emulation
@pytest.mark.emulation
def test_a_missed_rescale_of_o_is_caught():
    p = program(*SMALL, block=(1, 1))
    given = inputs(*SMALL)
    o_acc = next(b.id for b in p.buffers if b.name == "o_acc")

    def drop(op):
        return () if isinstance(op, Compute) and isinstance(op.op, ScaleAcc) and op.acc == o_acc else None

    broken = replace(p, Engine.COMPUTE, drop)
    with pytest.raises(spatialc.VerifyError):  # rule 8 refuses it ...
        spatialc.verify(broken)
    out = spatialc.emulate(unchecked(broken), given, timeout=300)  # ... and the emulation shows it wrong
    ok, _ = tolerance(p, kernel=True).check(out, given)
    assert not ok


@emulation
@pytest.mark.emulation
def test_a_quad_shuffle_of_the_wrong_distance_is_caught():
    # A row's scores lie in the four lanes of a quad (lane ^ 1, lane ^ 2): a shuffle of distance 4 combines two
    # quads' rows into each row's max and sum, and the emulated O and LSE leave the kernel's bound.
    p = program(*SMALL, block=(1, 1))
    given = inputs(*SMALL)
    art = lowered(p)
    right, wrong = "__shfl_xor_sync(0xffffffffu, v, 2)", "__shfl_xor_sync(0xffffffffu, v, 4)"
    assert art.program_cu.count(right) == 4  # m three times, l once
    out = spatialc.emulate(
        dataclasses.replace(art, program_cu=art.program_cu.replace(right, wrong)), given, timeout=300
    )
    ok, _ = tolerance(p, kernel=True).check(out, given)
    assert not ok


@emulation
@pytest.mark.emulation
def test_a_pop_before_the_last_read_of_its_page_is_a_race():
    p = program(*SMALL, block=(1, 1))
    lines = lowered(p).program_cu.split("\n")
    # V's ring is the third input's: the P·V matmul is the second matmul of the compute warps.
    pop = next(i for i, line in enumerate(lines) if "spatialc_mbar_arrive(&empty_2[pop_2" in line)
    mm = [i for i, line in enumerate(lines) if "op:Compute:MatmulTiles" in line][1]
    assert mm < pop
    text = "\n".join([*lines[:mm], lines[pop], *lines[mm:pop], *lines[pop + 1 :]])
    art = dataclasses.replace(lowered(p), program_cu=text)
    with pytest.raises(EmulationRace, match=r"shared ring 'ring_2'"):
        spatialc.emulate(art, inputs(*SMALL), mode="early", timeout=300)


@emulation
@pytest.mark.emulation
def test_a_wait_on_the_wrong_phase_is_caught():
    p = program(*SMALL, block=(1, 1))
    art = lowered(p)
    wait = "spatialc_mbar_wait(&full_1[wt_1 % DEPTH_1], (wt_1 / DEPTH_1) & 1);"
    assert art.program_cu.count(wait) == 1
    text = art.program_cu.replace(wait, wait.replace("(wt_1 / DEPTH_1) & 1", "((wt_1 / DEPTH_1) & 1) ^ 1"))
    # K's first wait passes at once: the compute warps read a page the reader has not filled (a race), or, a phase
    # behind, wait at last for one that never completes (a deadlock): either way the fault is caught.
    with pytest.raises((EmulationRace, EmulationDeadlock), match=r"ring_1|full_1"):
        spatialc.emulate(dataclasses.replace(art, program_cu=text), inputs(*SMALL), timeout=120)


def test_one_counter_serves_a_ring_only_where_its_pages_go_round_one_at_a_time():
    p = program(*SMALL)
    rings = general.make_kernel(p, target(p.target)).rings
    s_ring = next(b.id for b in p.buffers if b.name == "s_ring")
    r = rings.template[s_ring]
    cycle = (Reserve(s_ring), Push(s_ring), Wait(s_ring), Pop(s_ring))
    assert cycles((Loop(LV_K, Const(3), cycle),), r, rings)
    assert not cycles((Reserve(s_ring), Reserve(s_ring), Push(s_ring), Push(s_ring)), r, rings)  # two reserved
    assert not cycles((Reserve(s_ring), Loop(LV_K, Const(3), cycle[1:] + cycle[:1])), r, rings)  # a loop mid-cycle
    assert not cycles(cycle[:2], r, rings)  # pushed, and left to another engine


def test_a_row_accumulator_scaled_is_a_sum():
    p = program(*SMALL)
    m_acc, l_acc = (next(b.id for b in p.buffers if b.name == n) for n in ("m_acc", "l_acc"))

    def scale_max(op):
        if isinstance(op, Compute) and isinstance(op.op, ScaleAcc) and op.acc == l_acc:
            return (dataclasses.replace(op, acc=m_acc),)
        return None

    with pytest.raises(Unsupported, match="scaling a row accumulator of a max reduction"):
        unchecked(replace(p, Engine.COMPUTE, scale_max))


def test_sites_of_unequal_item_counts_keep_the_recurrence_in_registers():
    """6 items on 4 sites: two run 2 items, two run 1 — compute programs that differ in their ITEM loop's count alone,
    which keep the same rings in registers (as the GPU check's sizes do: 15 and 16 items a site)."""
    p = program(1, 2, 192, 64, 64, block=(4, 4), sites=4)
    programs = {prog.ops for prog in p.schedule.programs if prog.engine == Engine.COMPUTE}
    assert len(programs) == 2
    kernel = general.make_kernel(p, target(p.target))
    assert len(kernel.in_registers) == 9 and "float rr_" in lowered(p).kernel_cu

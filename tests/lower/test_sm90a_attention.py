"""Attention in the sm_90a form (lower/cuda/sm90a/attention.py): a TMA producer of Q, K and V pages, one consumer
warpgroup running S = Q·Kᵀ as wgmma with K-major B and O += P·V as the RS wgmma (P from registers), the recurrence
between them the register path's printers. Emulated on the CPU (runtime/emu/emu_hopper.h): within the kernel's
bound of the interpreter (docs/numerics.md, "Attention"), and for two cases bit for bit the general form's emulation
at the same plan — both emulations add each product to float32 sums in the same k order; planted faults in the
printed text (B read as MN-major, the wrong stage, P's registers overwritten in flight, a stage released before its
group retired) each caught. nvcc -Werror compiles the FlashAttention sizes with no spill, HGMMA of both shapes in the
SASS and no local memory."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections import Counter

import numpy as np
import pytest

import spatialc
from spatialc.lower.cuda import forms
from spatialc.lower.errors import NeedsGeneral, Unsupported
from spatialc.runtime.emulate import EmulationError

from ..attention.qkv import inputs
from .test_general_attention import check_close

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
NVCC = shutil.which("nvcc")

# (batch, heads, seq_q, seq_kv, head_dim), options: the cases emulated against the interpreter and the general form.
CASES = {
    "plain": ((1, 2, 64, 128, 64), {}),  # two KV blocks, two heads
    "causal_gqa_ragged": ((1, 4, 40, 72, 32), {"kv_heads": 2, "causal": True}),  # padding masked, 64-byte panels
    "causal_d128": ((1, 1, 100, 200, 128), {"causal": True}),  # head_dim 128: two panels a row, ragged both ways
    # two query heads on one KV head, bands of 128 rows: two consumer warpgroups (the block forced below)
    "two_warpgroups_gqa_fp16": ((1, 2, 128, 96, 64), {"kv_heads": 1, "precision": "fp16"}),
    # and causal, ragged both ways (one band of 100 rows, 136 keys), K and V one stage deep: the ping-pong asked for
    # (the default for two warpgroups, with two stages; it takes one, `pingpong.py`)
    "two_warpgroups_causal_ragged_depth1": ((1, 2, 100, 136, 64), {"kv_heads": 1, "causal": True}),
}
BLOCKS = {name: (8, 4, 1) for name in CASES if name.startswith("two_")}  # (the planner's bands are of 64 rows)
DEPTH1 = "two_warpgroups_causal_ragged_depth1"
# The cases also emulated in the general form at the same plan and compared bit for bit (the others, against the
# interpreter's bound alone: each general-form emulation is one more compile and run, and these two cover a plain
# and a causal, grouped, ragged plan).
BESIDE_GENERAL = ("plain", "causal_gqa_ragged")


def built(shape, options, form: str = "sm90a", block=None, **more):
    return spatialc.build(spatialc.attention(*shape, **options), "sm_90a", form=form, block=block, **more)


@pytest.fixture(scope="module")
def cases():
    """Each case built for the sm_90a form and lowered (once for the module)."""
    out = {}
    for name, (shape, options) in CASES.items():
        if name == DEPTH1:
            p = built(shape, options, block=BLOCKS[name], depth=1)
            out[name] = (p, spatialc.lower(p, schedule="pingpong"), shape, options)
            continue
        p = built(shape, options, block=BLOCKS.get(name))
        out[name] = (p, spatialc.lower(p), shape, options)
    return out


# ---- what is printed -------------------------------------------------------------------------------------------


def test_the_form_prints_two_wgmma_shapes_around_the_register_path(cases):
    p, art, _, _ = cases["causal_d128"]
    text = art.kernel_cu
    bud = art.budget
    assert bud.form == "sm90a" and art.census.agrees and not art.notes
    # One consumer warpgroup and the producer's, the SM alone: no setmaxnreg (the launch gives 255 a thread).
    assert (bud.threads, bud.blocks_per_sm, bud.regs_entry) == (256, 1, 0)
    assert "spatialc_regs_inc<" not in text and "spatialc_regs_dec<" not in text
    # S: K-major B (imm-trans-b 0), 64 keys wide; O += P·V: A in four registers, V MN-major (imm-trans-b 1).
    wgmma = r"wgmma\.mma_async\.sync\.aligned\.m64n{}k16\.f32\.bf16\.bf16 \{{[^}}]*\}}, "
    assert re.search(wgmma.format(64) + r"%32, %33, p, 1, 1, 0, 0;", text)
    assert re.search(wgmma.format(128) + r"\{%64, %65, %66, %67\}, %68, p, 1, 1, 1;", text)
    compute = text[text.index("// compute: the consumer warpgroups") :]
    assert "spatialc_mma(" not in compute and "spatialc_load_b" not in compute  # no mma.sync, no ldmatrix of K or V
    # The serial schedule (each matmul waited for): one S, one P·V, P's fragments loaded once — the RS wgmma's A.
    serial = spatialc.lower(p, schedule="serial").kernel_cu
    serial = serial[serial.index("// compute: the consumer warpgroups") :]
    assert serial.count("spatialc_wgmma_kb<64, OPT>(accf_") == 1 and serial.count("spatialc_wgmma_rs<128, OPT>(") == 1
    assert serial.count("spatialc_load_a_acc(af[kk], rr_") == 1
    # The overlapped one (the default at head_dim 128): the first block's S before the loop, each step issuing the
    # next one's, and the last step after the loop — S, P·V and the recurrence printed twice, their copies `pre` and
    # `post` in the census.
    assert compute.count("spatialc_wgmma_kb<64, OPT>(accf_") == 2 and compute.count("spatialc_wgmma_rs<128, OPT>(") == 2
    assert compute.count("// pre:Compute:MatmulTiles") == 1 and compute.count("// post:Compute:MatmulTiles") == 1
    # The recurrence between them is the register path's: the same rescale lines as the general form prints (and,
    # overlapped, their copy for the last step).
    general = spatialc.lower(built((1, 1, 100, 200, 128), {"causal": True}, "general", (4, 4, 1)), form="general")
    for line in ("op:Compute:ScaleAcc", "__shfl_xor_sync(0xffffffffu, v, 1)", "spatialc_exp(spatialc_fsub(rr_"):
        assert serial.count(line) == general.kernel_cu.count(line) > 0, line
    assert compute.count("op:Compute:ScaleAcc") == compute.count("post:Compute:ScaleAcc") == serial.count("ScaleAcc")
    # Q, K and V by TMA (a box a 128-byte panel: two a row at head_dim 128), stored as matrices; O goes out by TMA
    # store from the warpgroup's swizzled staging box (64 rows of 32 float32 columns: 128 bytes a row), a matrix
    # too; LSE stays tiled, stored by the lanes. O and LSE leave shared memory's rings and the writer.
    assert [param.order for param in art.launch.params] == ["rows", "rows", "rows", "rows", "row"]
    assert [(m.tensor, m.box, m.swizzle) for m in art.launch.tensor_maps] == [
        *((t, (64, 64), 128) for t in range(3)),
        (3, (64, 32), 128),
    ]
    assert text.count("spatialc_tma_load_2d((char*)") == 6
    assert compute.count("spatialc_tma_store_2d(&spatialc_tmap_3, col, row, staged);") == 1
    assert "#define OUT_BOX_ROW 128" in text and bud.staging_bytes == 2 * 64 * 32 * 4
    assert [name for name, _ in bud.rings] == ["q_ring", "k_ring", "v_ring"] and "SPATIALC_PAGE_LD(" not in compute
    lse = compute[compute.index("op:Compute:Map_add_row0_log_row1") :]
    assert "SPATIALC_OUT_ST(&lse[tile * 256 + (row % 16) * 16 + 4 * t4 + c], (OUT_T)v);" in lse
    # The causal band's KV blocks: a count per item, in the reader and the consumers alike.
    assert len(re.findall(r"const long long trip_k_v = ", text)) == 2


def test_the_overlapped_schedule_issues_the_next_s_before_the_softmax_and_waits_for_it_before_o(cases):
    text = cases["plain"][1].kernel_cu  # two KV blocks: the loop's one step, then the last
    loop = text[text.index("for (int k = 0; k + 1 < 2; ++k) {  // op:Loop") : text.index("the last block: no next S")]
    steps = (
        "spatialc_wgmma_wait<1>();  // S of this block has retired",
        "spatialc_mbar_arrive(&empty_1",  # K's stage back
        "rr_5[q * 8 + e] = accf_14[q].x[e];",  # S copied to the register ring the softmax reads …
        "spatialc_wgmma_kb<64, OPT>(accf_14",  # … before the next S is issued into its accumulators
        "op:Compute:Map_mask",  # the softmax while it runs
        "spatialc_wgmma_wait<0>();  // P·V of the block before has retired, and the next S",
        "accf_17[q].x[e] *= rr_10[",  # O rescaled only then
        "spatialc_wgmma_rs<64, OPT>(accf_17",  # and P·V issued, left in flight into the next step
    )
    at = [loop.index(step) for step in steps]
    assert at == sorted(at) and loop.count("spatialc_wgmma_commit();") == 2 and loop.count("spatialc_wgmma_wait<") == 2
    # Above head_dim 128 the second set of S registers would spill: the default is serial, and asking is refused.
    wide = built((1, 2, 64, 128, 256), {})
    assert "the last block: no next S" not in spatialc.lower(wide).kernel_cu
    with pytest.raises(Unsupported, match=r"overlapped attention schedule at head_dim 256.*schedule='serial'"):
        spatialc.lower(wide, schedule="overlapped")
    shallow = spatialc.build(spatialc.attention(1, 2, 64, 128, 64), "sm_90a", form="sm90a", depth=1)
    assert "the last block: no next S" not in spatialc.lower(shallow).kernel_cu  # one stage: serial
    with pytest.raises(Unsupported, match=r"k_ring 1 stage deep: it waits for the next K before releasing this V"):
        spatialc.lower(shallow, schedule="overlapped")
    with pytest.raises(Unsupported, match=r"schedule='serial' in the general form"):
        spatialc.lower(built((1, 2, 64, 128, 64), {}, "general"), form="general", schedule="serial")


def test_auto_on_sm90a_prints_it_and_the_other_forms_say_what_they_print():
    shape = (1, 2, 64, 128, 64)
    assert spatialc.lower(built(shape, {}, "auto")).budget.form == "sm90a"
    general = built(shape, {}, "general")
    art = spatialc.lower(general)  # planned for the other forms: auto prints the general form, and says why
    assert art.budget.form == "general" and forms.ATTENTION_NOTE in art.notes
    with pytest.raises(NeedsGeneral, match=r"cannot lower attention"):
        spatialc.lower(general, form="persistent")
    with pytest.raises(spatialc.errors.ProgramError, match="form 'sm90a' uses TMA and wgmma, which target sm_90"):
        spatialc.build(spatialc.attention(*shape), "sm_90", form="sm90a")


def test_head_dim_256_fits_once_o_and_lse_leave_shared_memory():
    # Q's band, two K and two V stages of 32 KB and O's two staging boxes of 8 KB: 176 KB and the barriers (with O's
    # and LSE's pages too, 260 KB: auto printed the general form). nvcc compiles it clean (below).
    art = spatialc.lower(built((1, 2, 64, 128, 256), {}, "auto"))
    assert art.budget.form == "sm90a" and not art.notes
    assert art.budget.staging_bytes == 16384 and art.budget.ring_bytes == 5 * 32768


def test_a_band_other_than_one_warpgroup_is_refused_by_name():
    with pytest.raises(Unsupported, match=r"attention bands of 32 query rows.*use a block of 4 or 8 query tile rows"):
        spatialc.lower(built((1, 1, 64, 64, 64), {}, block=(2, 4, 1)))


def test_bands_of_128_rows_take_two_consumer_warpgroups(cases):
    p, art, _, _ = cases["two_warpgroups_gqa_fp16"]
    bud, text = art.budget, art.kernel_cu
    assert bud.form == "sm90a" and art.census.agrees and (bud.threads, bud.blocks_per_sm) == (384, 1)
    # setmaxnreg moves the producer's registers to them; each warpgroup's S reads its own 64 rows of Q's page.
    assert "spatialc_regs_dec<40>();" in text and "spatialc_regs_inc<232>();" in text
    assert text.count(" + (warp / 4) * 8192, 16u, 1024u, 1u), spatialc_wgmma_desc(") == 2  # (S's two copies)
    assert art.launch.tensor_maps[0].box == (128, 64) and bud.staging_bytes == 2 * 2 * 64 * 32 * 4  # 2 boxes each
    assert "#define EMPTY_COUNT_1 8" in text  # K's stage freed by both warpgroups' warps


def test_two_warpgroups_issue_their_matmuls_in_turns(cases):
    p, art, _, _ = cases["two_warpgroups_gqa_fp16"]
    text = art.kernel_cu
    compute = text[text.index("// compute: the consumer warpgroups") :]
    # The ping-pong (the default for two): warpgroup 0 gives itself the first turn before its first item; each turn
    # waits on the warpgroup's own barrier (10 or 11, both warpgroups' 256 threads) and ends arriving on the other's.
    first = "if (warp / 4 == 0) { spatialc_engine_arrive(10, 256); }"
    wait, arrive = "spatialc_engine_sync(10 + warp / 4, 256);", "spatialc_engine_arrive(11 - warp / 4, 256);"
    assert compute.index(first) < compute.index("for (int item = 0;")
    assert compute.count(wait) == compute.count(arrive) == 3  # block 0's S, each step's S and P·V, the last P·V
    # A step: V and K waited for before the turn (a turn never holds the tensor cores while a stage is in flight),
    # then the turn: O rescaled, this block's S and the block before's P·V issued, the other's turn; then S retired
    # and the softmax, under that P·V; then the P·V retired and its V back.
    loop = compute[compute.index("for (int k = 1; k < 2; ++k) {  // op:Loop") :]
    loop = loop[: loop.index("the last block's P·V in a turn of its own")]
    steps = (
        "spatialc_mbar_wait(&full_2[",
        "spatialc_mbar_wait(&full_1[",
        wait,
        "accf_17[q].x[e] *= rr_10[",
        "spatialc_wgmma_kb<64, OPT>(accf_14",
        "spatialc_wgmma_rs<64, OPT>(accf_17",
        arrive,
        "spatialc_wgmma_wait<1>();  // S of this block has retired",
        "spatialc_mbar_arrive(&empty_1",
        "op:Compute:Map_exp_sub_x0_row1",
        "spatialc_wgmma_wait<0>();  // the P·V of block k - 1 has retired",
        "spatialc_mbar_arrive(&empty_2",
    )
    at = [loop.index(step) for step in steps]
    assert at == sorted(at) and loop.count("spatialc_wgmma_commit();") == 2 and loop.count("spatialc_wgmma_wait<") == 2
    # and so block 0's turn (its K waited for before it) and the last P·V's (its V)
    pre = compute[compute.index("spatialc_mbar_wait(&full_1[", compute.index("for (int item = 0;")) :]
    assert pre.index("// pre:Wait") < pre.index(wait) < pre.index("spatialc_wgmma_kb<64, OPT>(accf_14")
    post = compute[compute.index("the last block's P·V in a turn of its own") :]
    assert post.index("spatialc_mbar_wait(&full_2[") < post.index(wait) < post.index("accf_17[q].x[e] *= rr_10[")
    assert "bar.arrive %0, %1;" in text and art.census.agrees
    shallow = cases[DEPTH1][1].kernel_cu  # (asked for with K and V one stage deep: emulated below)
    assert "#define DEPTH_1 1" in shallow and shallow.count(arrive) == 3
    # The overlapped schedule asked for: no turns, and no bar.arrive in the text; one warpgroup takes no ping-pong.
    overlapped = spatialc.lower(p, schedule="overlapped").kernel_cu
    assert "spatialc_engine_arrive" not in overlapped and "the next block's S: the tensor cores run it" in overlapped
    one = cases["plain"][0]
    assert "spatialc_engine_arrive" not in spatialc.lower(one).kernel_cu  # (one warpgroup: overlapped)
    with pytest.raises(Unsupported, match=r"ping-pong attention schedule with 1 consumer warpgroup.*block of 8"):
        spatialc.lower(one, schedule="pingpong")
    # Above head_dim 128 ptxas spills the ping-pong's registers (as the overlapped one's): serial by default.
    wide = built((1, 2, 128, 128, 256), {}, block=(8, 4, 1))
    assert "spatialc_engine_arrive" not in spatialc.lower(wide).kernel_cu
    with pytest.raises(Unsupported, match=r"ping-pong attention schedule at head_dim 256: ptxas spills"):
        spatialc.lower(wide, schedule="pingpong")


# ---- emulated ----------------------------------------------------------------------------------------------------


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("name", list(CASES))
def test_the_emulation_lies_within_the_interpreters_bound_and_equals_the_general_forms_bit_for_bit(cases, name):
    p, art, shape, options = cases[name]
    given = inputs(*shape, kv_heads=options.get("kv_heads"))
    out = spatialc.emulate(art, given, timeout=600)
    check_close(p, out, given)
    if name == "two_warpgroups_gqa_fp16":  # the ping-pong (the default here) is the overlapped schedule's bits
        overlapped = spatialc.emulate(spatialc.lower(p, schedule="overlapped"), given, timeout=600)
        assert all(np.array_equal(overlapped[n], out[n]) for n in ("o", "lse"))
    if name not in BESIDE_GENERAL:
        return
    plan = p.plans[0].block
    general = built(shape, options, "general", (plan.osh, plan.ibw, 1))
    assert general.plans[0].block == plan
    theirs = spatialc.emulate(spatialc.lower(general, form="general"), given, timeout=600)
    for name_ in ("o", "lse"):
        assert np.array_equal(out[name_], theirs[name_]), name_
    if name == "plain":  # the wgmma run when issued instead of at their wait_group: the same values
        early = spatialc.emulate(art, given, mode="early", timeout=600)
        assert all(np.array_equal(early[n], out[n]) for n in ("o", "lse"))
        # and the serial schedule (each matmul waited for) the overlapped one's bits
        serial = spatialc.emulate(spatialc.lower(p, schedule="serial"), given, timeout=600)
        assert all(np.array_equal(serial[n], out[n]) for n in ("o", "lse"))


# Planted faults in the emulated text of the "plain" case: each must leave the interpreter's answer or stop the run.
def _faults(text: str) -> dict[str, str]:
    s_block = text.index("spatialc_wgmma_kb<64, OPT>(accf_")
    k_slot = re.search(r"ring_1 \+ \(\(wt_1 - 1\) % DEPTH_1\)", text[s_block:])
    assert k_slot is not None
    at = s_block + k_slot.start()
    rs = text.index("spatialc_wgmma_rs<64, OPT>(")
    commit = text.index("spatialc_wgmma_commit();", rs)
    p_ring = re.search(r"spatialc_load_a_acc\(af\[kk\], (rr_\d+) \+ kk \* 8\);", text)
    assert p_ring is not None
    wait = text.index("spatialc_wgmma_wait<0>();", s_block)
    swizzle = "#define OUT_SWZ(b) ((b) ^ ((((b) >> 7) & OUT_SWIZZLE) << 4))"
    fence = "spatialc_fence_proxy_async();  // the thread's staged values"
    assert text.count(swizzle) == 1 and text.count(fence) == 1
    # The loop's softmax reading the next S's accumulators, in flight, instead of this block's copy of S.
    issued = text.index("// the next block's S: the tensor cores run it during this block's softmax")
    mask = text.index("op:Compute:Map_mask", issued)
    s_read = text.index("rr_5[q * 8 + e]", mask)
    return {
        # K read MN-major (the GEMM's B: imm-trans-b 1) instead of K-major.
        "transpose bit": text[:s_block] + text[s_block:].replace("spatialc_wgmma_kb<", "spatialc_wgmma<", 1),
        # The K stage after the one waited for.
        "stage index": text[:at] + "ring_1 + ((wt_1) % DEPTH_1)" + text[at + len(k_slot.group(0)) :],
        # P's registers written again while the RS group is in flight.
        "A registers": text[:commit] + f"spatialc_load_a_acc(af[0], {p_ring.group(1)} + 8);\n" + text[commit:],
        # The S group left in flight: K's stage released and S read before it retires.
        "early release": text[:wait] + text[wait + len("spatialc_wgmma_wait<0>();") :],
        # O staged unswizzled in the box the copy engine stores as 128-byte swizzled.
        "staging swizzle": text.replace(swizzle, "#define OUT_SWZ(b) (b)"),
        # O's staged values not made visible to the async proxy before the TMA store reads them.
        "staging fence": text.replace(fence, "// " + fence),
        "S in flight": text[:s_read] + "accf_14[q].x[e]" + text[s_read + len("rr_5[q * 8 + e]") :],
    }


# What the emulation says of each fault: a wrong answer, or the report that names it. Where the copy engine may land
# the next page before or after the wgmma reads the stage, the race is reported or, the page already replaced, the
# answer is wrong: the threads' interleaving decides which.
# (the report names the two accesses in the order the emulation met them)
RACE_ON_K = (
    "race: .*RACE on shared ring 'ring_1'.*"
    "(a TMA load landing.*a wgmma operand read|a wgmma operand read.*a TMA load landing)"
)
CAUGHT = {
    "transpose bit": "mismatch$",
    "stage index": f"{RACE_ON_K}|mismatch$",
    "A registers": "fault: .*spatialc_wgmma_rs at line \\d+: its A registers were written before the wait_group",
    "early release": f"{RACE_ON_K}|mismatch$",
    "staging swizzle": "mismatch$",
    "staging fence": "race: .*no fence.proxy.async since",
    "S in flight": "mismatch$",  # (the emulation runs a wgmma at its wait: the registers read are S's zeros)
}


@needs_gxx
@pytest.mark.emulation
def test_planted_faults_are_caught(cases):
    p, art, shape, _ = cases["plain"]
    given = inputs(*shape)
    want = spatialc.evaluate(p, given)
    faults = _faults(art.program_cu)
    assert set(faults) == set(CAUGHT)
    for fault, text in faults.items():
        try:
            out = spatialc.emulate(dataclasses.replace(art, program_cu=text), given, timeout=600)
        except EmulationError as e:
            said = f"{e.kind}: {e}"
        else:
            close = all(np.allclose(out[n], want[n], rtol=1e-2, atol=1e-2) for n in ("o", "lse"))
            said = "close" if close else "mismatch"
        assert re.match(CAUGHT[fault], said, re.S), f"{fault}: {said[:400]}"


def _turn_faults(text: str) -> dict[str, str]:
    """The ping-pong's turns broken in the printed text of the "two_warpgroups_gqa_fp16" case. (A turn's ids
    swapped in one place only, each barrier's arrivals still its count, is another order of the same turns: the
    values are the same and a GPU would not hang either — no fault the emulation could, or should, report.)"""
    arrive = "spatialc_engine_arrive(11 - warp / 4, 256);"
    step = text.index("for (int k = 1; k < 2; ++k) {  // op:Loop")
    at = text.index(arrive, step)
    return {
        # A step's arrival left out: the other warpgroup's next turn never comes.
        "arrival left out": text[:at] + text[at + len(arrive) :],
        # Each turn's arrival on the warpgroup's own barrier (the ids of the wait and the arrival swapped): warpgroup
        # 0 gives itself every turn, warpgroup 1 waits for its first for ever.
        "own barrier": text.replace(arrive, "spatialc_engine_arrive(10 + warp / 4, 256);"),
    }


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("fault", ["arrival left out", "own barrier"])
def test_a_broken_turn_hangs_and_the_deadlock_is_reported(cases, fault):
    p, art, shape, options = cases["two_warpgroups_gqa_fp16"]
    text = _turn_faults(art.program_cu)[fault]
    with pytest.raises(EmulationError) as e:
        spatialc.emulate(dataclasses.replace(art, program_cu=text), inputs(*shape, kv_heads=1), timeout=600)
    said = str(e.value)
    # Warpgroup 1 (threads 128-255) waits for a turn that never comes; left out, warpgroup 0's next turn neither.
    assert e.value.kind == "deadlock" and "128 threads (128-255) waits at named barrier 11 (bar.sync)" in said, said
    assert fault != "arrival left out" or "128 threads (0-127) waits at named barrier 10 (bar.sync)" in said


# ---- nvcc ----------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize(
    ("head_dim", "causal", "precision", "out", "rows"),
    [
        (128, False, "bf16", None, 4),
        (64, True, "fp16", "fp16", 4),
        (256, False, "bf16", None, 4),
        (128, False, "bf16", None, 8),  # two consumer warpgroups: ptxas fits them in the launch's 168 registers
    ],
)
def test_nvcc_compiles_the_flashattention_sizes_without_spills(tmp_path, head_dim, causal, precision, out, rows):
    from .test_sm90a import compiled_clean

    options = {"causal": causal, "precision": precision, "out": out}
    p = built(
        (2, 16, 4096, 4096, head_dim), options, "auto" if rows == 4 else "sm90a", (rows, 4, 1) if rows == 8 else None
    )
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a"
    ops = [i.op for i in compiled_clean(art, tmp_path)]
    # S: a wgmma 64 keys wide per 16 of head_dim; P·V: one head_dim wide per 16 of the block's 64 keys.
    ty = ".BF16" if precision == "bf16" else ""  # (cuobjdump names fp16 HGMMA by its accumulator alone)
    # The overlapped schedule (head_dim 128 and below) prints each twice: the first S before the loop, the last P·V
    # after it; at 256 the serial one, once.
    twice = 2 if head_dim <= 128 else 1
    want = Counter({f"HGMMA.64x64x16.F32{ty}": twice * head_dim // 16})
    want += Counter({f"HGMMA.64x{head_dim}x16.F32{ty}": twice * 4})  # (at head_dim 64 the same shape as S's)
    assert Counter(op for op in ops if op.startswith("HGMMA")) == want
    # O: a TMA store a staging box of 128-byte rows (float32 O at 128: four; fp16 O at 64: one), 16-bit O written
    # into it by stmatrix, a tile a warp at once (an instruction a tile of the lane's row: four at head_dim 64).
    o_bytes = 2 if out else 4
    assert Counter(ops)["UTMASTG.2D"] == head_dim * o_bytes // 128
    assert Counter(ops)["STSM.16.M88.4"] == (head_dim // 16 if out else 0)
    assert sum(op.startswith("USETMAXREG") for op in ops) == (2 if rows == 8 else 0)
    # Two warpgroups take turns (the ping-pong): a BAR.ARV for each bar.arrive printed (the first turn and each
    # turn's end); one warpgroup, none.
    if rows == 8:
        assert Counter(ops)["BAR.ARV"] == art.kernel_cu.count("spatialc_engine_arrive(") - 1 == 4  # (less its def)
    else:
        assert Counter(ops)["BAR.ARV"] == 0 and "spatialc_engine_arrive(" not in art.kernel_cu
    assert not [op for op in ops if op.startswith(("LDL", "STL"))]  # nothing in local memory

"""Multicast groups (passes/multicast.py): sites of a gy × gx group share A pages along a group row and B pages down a
group column through the standard handshake. Built, verified (rule 7's clocked run, rule 8 across sites), run by the
interpreter equal to numpy whatever the order engines run in, read from global memory gx / gy times less, refused by
name where they cannot be built or lowered — and every planted fault in a handshake refused."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import warnings

import numpy as np
import pytest

import spatialc
from spatialc.errors import (
    HandshakeError,
    ProgramError,
    SemanticError,
    StrongerCheckNeeded,
    VerifyDeadlockError,
)
from spatialc.ir import serde
from spatialc.ir.ids import Site
from spatialc.ir.ops import Loop, McastSend, McastSetValid, Push, ReadBarrier, ReadTiles, SemInc, SemSet, SemWait
from spatialc.ir.traffic import read_bytes
from spatialc.lower.errors import NeedsGeneral, Unsupported
from spatialc.passes.verify import verify
from spatialc.runtime import launch as L
from spatialc.runtime.emulate import EmulationDeadlock, EmulationError, EmulationFault, EmulationRace

from .rewrite import edit_k_steps, engine_orders
from .stand_in import StandInDevice, product


def build(m, n, k, prec, group, **kw):
    return spatialc.build(spatialc.gemm(m, n, k, prec), "sm_90", multicast=group, **kw)


def operands(m, n, k, prec, seed=0):
    rng = np.random.default_rng(seed)
    # Small integers: exact in every precision, so fp16 / bf16 results compare exactly too.
    return {"A": rng.integers(-4, 5, (m, k)), "B": rng.integers(-4, 5, (k, n))}


@pytest.mark.parametrize(
    "shape, prec, group",
    [
        ((256, 256, 128), "int8", (2, 2)),
        ((256, 512, 96), "fp16", (2, 1)),
        ((512, 256, 128), "bf16", (1, 2)),
        ((384, 384, 64), "int8", (1, 3)),
        ((256, 256, 256), "fp16", (4, 2)),
    ],
)
def test_a_multicast_build_verifies_and_computes_the_gemm(shape, prec, group):
    m, n, k = shape
    p = build(m, n, k, prec, group)
    assert p.verified and p.placement.multicast == group
    ins = operands(m, n, k, prec)
    want = ins["A"].astype(np.int64) @ ins["B"].astype(np.int64)
    assert np.array_equal(np.asarray(spatialc.evaluate(p, ins), dtype=np.int64), want)


def test_each_group_runs_a_block_of_items_in_lock_step():
    p = build(256, 256, 128, "fp16", (2, 2), sites=8)
    nx = p.plan.grid[1]
    items = dict(p.placement.items_of_site)
    for q in range(2):
        first = [items[Site(q * 4 + s)] for s in range(4)]
        assert len({len(i) for i in first}) == 1
        for j in range(len(first[0])):
            (y0, x0), (y1, x1), (y2, x2), (y3, x3) = (divmod(int(i[j]), nx) for i in first)
            assert (y0, y1, y2, y3) == (y0, y0, y0 + 1, y0 + 1) and (x0, x1, x2, x3) == (x0, x0 + 1, x0, x0 + 1)
    # Row groups (A) then column groups (B); the first site of each sends.
    rows = [tuple(map(int, g.sites)) for g in p.placement.groups[:2]]
    assert rows == [(0, 1), (2, 3)]


def test_the_result_does_not_depend_on_the_order_engines_run_in():
    """The interpreter resumes engines round-robin in the order the schedule lists them; other orders change which
    engine moves first at every step, and the result stays bit for bit the same (a float sum included)."""
    p = build(256, 256, 192, "fp16", (2, 2), sites=8)
    rng = np.random.default_rng(5)
    ins = {"A": rng.normal(size=(256, 192)), "B": rng.normal(size=(192, 256))}
    first = spatialc.evaluate(p, ins)
    for q in engine_orders(p):
        assert np.array_equal(spatialc.evaluate(verify(q), ins), first)


@pytest.mark.parametrize("group", [(2, 1), (1, 2), (2, 2), (4, 2)])
def test_a_group_reads_each_shared_operand_gx_or_gy_times_less(group):
    gy, gx = group
    plain = spatialc.build(spatialc.gemm(1024, 1024, 512, "fp16"), "sm_90", form="general")
    shared = build(1024, 1024, 512, "fp16", group)
    assert shared.plan == plain.plan
    before, after = read_bytes(plain), read_bytes(shared)
    assert after["A"] * gx == before["A"] and after["B"] * gy == before["B"]
    assert spatialc.lower(plain).budget.global_read_bytes == sum(before.values())


def test_a_multicast_plan_that_reads_no_less_than_the_plan_without_groups_says_so(capsys):
    """96 × 96 × 512 on sm_86 in groups of 1 × 2: the best plan's 3 × 3 grid does not fall into them, and the one that
    does (6 × 2 items of 1 × 4 tiles) reads more than the best plan without groups: a MulticastWarning at the
    caller's line with both figures, a `note` line from the command line. Where the groups read less, neither."""
    from spatialc.cli import main
    from spatialc.ir.traffic import global_read_bytes

    g = spatialc.gemm(96, 96, 512, "fp16")
    plain = global_read_bytes(spatialc.build(g, "sm_86"))
    with pytest.warns(spatialc.MulticastWarning) as said:
        p = spatialc.build(g, "sm_86", multicast=(1, 2))
    ours = global_read_bytes(p)
    assert ours > plain and len(said) == 1 and said[0].filename == __file__
    text = str(said[0].message)
    assert text.startswith(f"multicast=(1, 2) (--multicast 1,2) reads 0.8 MiB ({ours} bytes) from global memory")
    assert f"more than the best plan without groups: 0.6 MiB ({plain} bytes) (block 2x2x8, grid 3x3 items)" in text
    assert main(["gemm", "96", "96", "512", "--precision", "fp16", "--target", "sm_86", "--multicast", "1,2"]) == 0
    assert f"  note      {text}\n" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error", spatialc.MulticastWarning)
        spatialc.build(spatialc.gemm(1024, 1024, 512, "fp16"), "sm_90", multicast=(2, 2))
        argv = ["gemm", "1024", "1024", "512", "--precision", "fp16", "--multicast", "2,2", "--check", "none"]
        assert main(argv) == 0
    assert "note      multicast" not in capsys.readouterr().out


def test_a_saved_multicast_program_loads_verified():
    p = build(256, 256, 128, "int8", (2, 2))
    doc = json.loads(spatialc.to_json(p))
    assert doc["version"] == serde.VERSION and doc["program"]["placement"]["multicast"] == [2, 2]
    assert spatialc.from_json(json.dumps(doc)).verified


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"multicast": (3, 1)}, "does not fall into groups"),
        ({"multicast": (0, 2)}, "two whole numbers"),
        ({"multicast": (4, 4)}, "at most 8 sites"),
        ({"multicast": "2x2"}, "two whole numbers"),
        ({"multicast": (2, 2), "split_k": 2}, "takes one of them"),
        ({"multicast": (2, 2), "placement": "round_robin"}, "no placement rule"),
        ({"multicast": (2, 2), "form": "persistent"}, "persistent kernel"),
        ({"multicast": (2, 2), "sites": 3}, "sites=3 is not a whole number of groups of 4 sites"),
        ({"multicast": (2, 1), "sites": 3}, "sites=3 is not a whole number of groups of 2 sites"),  # not 2, quietly
    ],
)
def test_a_multicast_that_cannot_be_built_is_refused_by_name(kw, words):
    with pytest.raises(ProgramError, match=words):
        spatialc.build(spatialc.gemm(256, 256, 128, "fp16"), "sm_90", **kw)


@pytest.mark.parametrize(("target", "form", "group"), [("sm_90", "general", (2, 1)), ("sm_90a", "auto", (1, 2))])
def test_the_planner_takes_a_block_whose_grid_falls_into_the_groups(target, form, group):
    """129 × 100: the best plan of the form a multicast build plans for has a grid of items the group does not
    divide; with the block left to the planner, the group takes the best plan whose grid it divides (it was refused,
    naming a block the user never chose)."""
    g = spatialc.gemm(129, 100, 33, "fp16")
    best = spatialc.build(g, target, form=form).plan
    assert best is not None and (best.grid[0] % group[0] or best.grid[1] % group[1])
    p = spatialc.build(g, target, multicast=group)
    assert p.plan is not None and p.plan.grid[0] % group[0] == p.plan.grid[1] % group[1] == 0
    assert p.placement is not None and p.placement.multicast == group
    with pytest.raises(ProgramError, match="does not fall into groups"):  # a forced block is taken as given
        spatialc.build(g, target, multicast=group, block=(best.block.osh, best.block.osw, best.block.ibw))


# ---- the general form: groups as thread-block clusters (sm_90) ---------------------------------------------------

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def test_a_multicast_is_printed_as_clusters_on_sm90_and_refused_by_name_elsewhere():
    p = build(256, 256, 128, "fp16", (2, 2), sites=8)
    art = spatialc.lower(p)  # auto: the persistent kernel cannot, the general form does
    assert art.budget.form == "general" and art.launch.cluster == 4 and not art.launch.cooperative
    assert art.launch.grid == 8 and "__cluster_dims__(4, 1, 1)" in art.kernel_cu
    # Site (0, 0) sends A and B, (0, 1) B down its column, (1, 0) A along its row: four copies printed.
    assert art.kernel_cu.count("spatialc_dsmem_copy16(src + 16 * i, dst + 16 * i,") == 4
    assert "<<<GRID" in art.program_cu and "cudaLaunchCooperativeKernel" not in art.program_cu
    assert "thread-block clusters of %d sites, which need sm_90" in art.program_cu  # checked before launching
    with pytest.raises(NeedsGeneral):
        spatialc.lower(p, form="persistent")
    for tgt in ("sm_80", "sm_86"):
        q = spatialc.build(spatialc.gemm(256, 256, 128, "fp16"), tgt, multicast=(2, 1))
        with pytest.raises(Unsupported, match=f"multicast groups on {tgt}: a group is a thread-block cluster"):
            spatialc.lower(q)


@pytest.mark.parametrize("shape, group, sites", [((256, 256, 128), (2, 2), 4), ((128, 1024, 64), (1, 8), None)])
def test_one_cluster_and_absolute_site_classes_lower_with_their_groups_relative(shape, group, sites):
    """Where the sites' programs are told apart by their own sites (one cluster: relative offsets make no fewer
    classes), the multicast groups are still printed as offsets from the site (a hostile review's crash)."""
    art = spatialc.lower(build(*shape, "fp16", group, sites=sites))
    assert art.launch.cluster == group[0] * group[1] and art.census.agrees
    assert "spatialc_dsmem_copy16(src + 16 * i, dst + 16 * i, (site + 1), (site + 1) %" in art.kernel_cu


def test_two_multicasts_of_one_ring_at_a_site_are_refused_by_the_kernel():
    from spatialc.lower.cuda.general import kernel as general

    twice = edit(0, lambda body: [x for op in body for x in ((op, op) if isinstance(op, McastSend) else (op,))])
    with pytest.raises(Unsupported, match="two multicasts of one ring"):
        general.lower(twice.evolve(verified=True), spatialc.target("sm_90"))


def test_the_launcher_refuses_a_cluster_kernel_on_a_device_before_sm90():
    art = spatialc.lower(build(256, 256, 128, "int8", (2, 1), sites=4))
    dev = StandInDevice(art, product, arch="sm_86")
    with pytest.raises(L.LaunchError, match="thread-block clusters of 2 sites, which need sm_90; this device is sm_86"):
        L.prepare(art, dev)


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize(
    "shape, prec, group, mode",
    [
        ((256, 256, 128, 8), "fp16", (2, 2), "late"),
        ((128, 256, 96, 4), "int8", (1, 2), "early"),
        ((256, 128, 64, 4), "bf16", (2, 1), "late"),
    ],
)
def test_the_emulated_cluster_kernel_equals_the_interpreter(shape, prec, group, mode):
    m, n, k, sites = shape
    p = build(m, n, k, prec, group, sites=sites)
    ins = operands(m, n, k, prec, seed=2)
    got = spatialc.emulate(spatialc.lower(p), ins, mode=mode)
    np.testing.assert_array_equal(got, spatialc.evaluate(p, ins))


FAULT_PROGRAM = build(128, 128, 64, "int8", (1, 2), sites=2)
FAULT_INPUTS = operands(128, 128, 64, "int8", seed=4)


def planted(right: str, wrong: str):
    """FAULT_PROGRAM's kernel with the printed text `right` replaced by `wrong` (which must be there)."""
    art = spatialc.lower(FAULT_PROGRAM)
    assert right in art.program_cu
    return dataclasses.replace(art, program_cu=art.program_cu.replace(right, wrong))


@emulation
@pytest.mark.emulation
def test_a_page_multicast_into_the_wrong_slot_is_a_race_in_emulation():
    """The copy lands in the slot the receiver is reading (its ready flag freed the other one): the emulation
    race-checks stores into a peer's shared memory against the receiver's own accesses. Where the threads interleave
    so that the receiver's reads come first (seen under heavy load), its wait for the slot the copy never filled is
    the deadlock the emulation names instead: the same fault, caught on the same ring."""
    art = planted("(snd_0 % DEPTH_0) * PAGE_0", "((snd_0 + 1) % DEPTH_0) * PAGE_0")
    with pytest.raises((EmulationRace, EmulationDeadlock)) as caught:
        spatialc.emulate(art, FAULT_INPUTS, timeout=30)
    said = str(caught.value)
    if isinstance(caught.value, EmulationRace):
        assert "RACE between blocks on shared ring 'ring_0'" in said, said
    else:
        assert re.search(r"(full|empty|ready)_0\[", said), said


@emulation
@pytest.mark.emulation
def test_a_copy_to_the_wrong_rank_of_the_cluster_is_refused_by_the_emulation():
    art = planted("(site + 1), (site + 1) % 2);", "(site + 1), 0);")
    with pytest.raises(EmulationError, match="not that site's rank in this block's cluster of 2"):
        spatialc.emulate(art, FAULT_INPUTS, timeout=30)


@emulation
@pytest.mark.emulation
def test_a_page_never_published_is_a_deadlock_the_emulation_names():
    """The sender copies but never arrives on the receiver's full barrier (the valid flag's image): the receiver's
    consumers wait for the page forever, and so does the sender for the ready arrival that would follow."""
    art = planted(
        "spatialc_mbar_arrive_cluster(&full_0[(snd_0 - 1) % DEPTH_0], ((((site + 1)) % 2 + 2) % 2));",
        "// (the page is never published)",
    )
    with pytest.raises(EmulationDeadlock, match=r"DEADLOCK in the cluster of block \d.* waits on full_0\["):
        spatialc.emulate(art, FAULT_INPUTS, mode="early", timeout=30)


@emulation
@pytest.mark.emulation
def test_a_ready_arrival_never_made_or_made_before_the_stage_is_free_deadlocks():
    """The receiver never tells the sender its stage is free, or tells it before its own consumers freed it (a
    phase ahead: the sender's wait then looks for a phase that has passed): either way the group stops, by name."""
    arrive = "if (etid == 0) { spatialc_mbar_arrive_cluster(&ready_0[((rsv_0 - 1) % DEPTH_0)], (((0) % 2 + 2) % 2)); }"
    reserve = "spatialc_mbar_wait(&empty_0[rsv_0 % DEPTH_0], ((rsv_0 / DEPTH_0) & 1) ^ 1); ++rsv_0;"
    art = spatialc.lower(FAULT_PROGRAM)
    text = art.program_cu
    assert text.count(arrive) == 1
    at = text.index(arrive)
    receiver_reserve = text.rindex(reserve, 0, at)
    early = arrive.replace("((rsv_0 - 1) % DEPTH_0)", "(rsv_0 % DEPTH_0)")
    ahead = text[:receiver_reserve] + early + text[receiver_reserve:].replace(arrive, "", 1)
    never = text.replace(arrive, "// (never ready)")
    with pytest.raises(EmulationDeadlock, match=r"waits on ready_0\[0\]"):
        spatialc.emulate(dataclasses.replace(art, program_cu=never), FAULT_INPUTS, mode="early", timeout=30)
    # Told a phase ahead, the sender either waits for a phase that has passed (a deadlock) or — where the early
    # arrival lands while it waits — passes and overwrites a page the receiver has not read (a race): the thread
    # interleaving decides which, and either way the fault is named.
    with pytest.raises(
        (EmulationDeadlock, EmulationRace), match=r"waits on ready_0\[0\]|RACE between blocks on shared ring 'ring_0'"
    ):
        spatialc.emulate(dataclasses.replace(art, program_cu=ahead), FAULT_INPUTS, mode="early", timeout=30)


@emulation
@pytest.mark.emulation
def test_a_peer_arriving_before_the_cluster_barrier_after_the_barriers_initialisation_is_caught():
    """Without it a receiver may arrive on the sender's ready barrier before the sender has initialised it (a race
    the emulation names, or, where the arrival comes before the initialisation itself, an arrival on a barrier
    never initialised), or — where the sender waits first — its block, never having crossed a cluster barrier,
    waits for a peer it cannot know will come (a deadlock of the block). Which one depends on how the threads
    interleave; each is the fault named."""
    art = planted("spatialc_cluster_sync();  // and before a peer", "// and before a peer")
    caught = "with no cluster barrier since|DEADLOCK in block|spatialc_mbar_init never initialised"
    with pytest.raises((EmulationRace, EmulationDeadlock, EmulationFault), match=caught):
        spatialc.emulate(art, FAULT_INPUTS, mode="late", timeout=30)


# ---- planted faults: every handshake op deleted or changed ------------------------------------------------------

BASE = build(256, 256, 128, "fp16", (2, 2), sites=4)


def edit(site: int, f):
    """BASE with the K-step body of site `site`'s reader rewritten by f."""
    return edit_k_steps(BASE, site, f)


def drop(kind, nth=0):
    def f(body):
        i = [j for j, op in enumerate(body) if isinstance(op, kind)][nth]
        return body[:i] + body[i + 1 :]

    return f


def twice(kind):
    def f(body):
        i = next(j for j, op in enumerate(body) if isinstance(op, kind))
        return body[: i + 1] + body[i:]

    return f


def change(kind, **fields):
    def f(body):
        return [dataclasses.replace(op, **fields) if isinstance(op, kind) else op for op in body]

    return f


def move_before(kind, anchor):
    def f(body):
        i = next(j for j, op in enumerate(body) if isinstance(op, kind))
        op = body.pop(i)
        at = next(j for j, o in enumerate(body) if isinstance(o, anchor))
        return body[:at] + [op] + body[at:]

    return f


@pytest.mark.parametrize(
    "site, f, error, words",
    [
        # Site 1 receives A from site 0 and sends B to site 3; site 0 sends both.
        (1, drop(SemInc), VerifyDeadlockError, "site 0 reader"),  # a raise that never comes
        (1, move_before(Push, SemWait), HandshakeError, "after the multicast of page 0"),  # reads before valid
        (0, change(McastSetValid, value=0), HandshakeError, "does not own the semaphore"),
        (0, drop(SemWait), StrongerCheckNeeded, "SemSet"),  # a reset without its wait
        (0, change(SemWait, value=0), StrongerCheckNeeded, "at least 1"),  # refills before every receiver released
        (0, drop(SemSet), StrongerCheckNeeded, "never reset"),
        (1, drop(SemSet), StrongerCheckNeeded, "without resetting"),
        (0, twice(McastSetValid), HandshakeError, "lost"),
        (1, twice(SemInc), HandshakeError, "lost"),
        (0, move_before(McastSetValid, McastSend), HandshakeError, "landed"),
        (0, drop(McastSend), SemanticError, "without anything filling it"),
        (0, change(SemWait, value=2), VerifyDeadlockError, "needs 2"),  # a wait for a count never reached
        (1, change(SemWait, value=2), StrongerCheckNeeded, "a flag is waited for 1"),  # sets do not add up
        (0, drop(ReadBarrier), None, ""),  # accepted: the kernel's McastSend waits for its own copies itself
    ],
)
def test_a_broken_handshake_is_refused_naming_the_site_and_op(site, f, error, words):
    if error is None:
        p = verify(edit(site, f))
        ins = operands(256, 256, 128, "fp16")
        assert np.array_equal(np.asarray(spatialc.evaluate(p, ins), dtype=np.int64), ins["A"] @ ins["B"])
        return
    with pytest.raises(error) as info:
        verify(edit(site, f))
    assert words in str(info.value)


def test_a_page_sent_to_the_wrong_sites_or_of_the_wrong_tiles_is_refused():
    # Site 0 sends its A page down its column instead of along its row.
    col = next(g.id for g in BASE.placement.groups if tuple(map(int, g.sites)) == (0, 2))
    with pytest.raises((HandshakeError, StrongerCheckNeeded)):
        verify(
            edit(
                0,
                lambda body: [
                    dataclasses.replace(op, group=col)
                    if isinstance(op, McastSend) and isinstance(body[body.index(op) - 4], ReadTiles)
                    else op
                    for op in body
                ],
            )
        )
    # Two receivers trade items: each now receives the A strip of another row than its item's.
    listed = list(BASE.placement.items_of_site)
    listed[1], listed[2] = (listed[1][0], listed[2][1]), (listed[2][0], listed[1][1])
    swapped = BASE.evolve(placement=dataclasses.replace(BASE.placement, items_of_site=tuple(listed)))
    with pytest.raises(SemanticError, match="tiles of another row than the item needs"):
        verify(swapped)


def test_every_single_op_deleted_from_a_handshake_is_refused_or_still_right():
    """The issue's kept-back check, here: delete each handshake op of each site's reader in turn; verify refuses the
    edit or the interpreter still computes the GEMM."""
    ins = operands(256, 256, 128, "fp16")
    want = ins["A"].astype(np.int64) @ ins["B"].astype(np.int64)
    kinds = (SemInc, SemWait, SemSet, McastSend, McastSetValid)
    tried = 0
    for site in range(4):
        reader = next(q for q in BASE.schedule.programs if int(q.site) == site and q.engine.value == "reader")
        k_body = (
            next(op for op in reader.ops[0].body if isinstance(op, Loop)).body
            if isinstance(reader.ops[0], Loop)
            else ()
        )
        for kind in kinds:
            for nth in range(sum(isinstance(op, kind) for op in k_body)):
                tried += 1
                try:
                    p = verify(edit(site, drop(kind, nth)))
                except spatialc.VerifyError:
                    continue
                assert np.array_equal(np.asarray(spatialc.evaluate(p, ins), dtype=np.int64), want)
    assert tried >= 20


def test_the_command_line_builds_and_checks_a_multicast_gemm(capsys):
    from spatialc.cli import main

    assert main(["gemm", "256", "256", "128", "--multicast", "2,2", "--precision", "int8"]) == 0
    out = capsys.readouterr().out
    assert "multicast 2x2 sites a group" in out and "interpreter vs numpy reference: OK" in out
    assert "clusters  4 sites each (__cluster_dims__)" in out and "census" in out
    assert main(["gemm", "256", "256", "128", "--multicast", "2,1", "--target", "sm_86"]) == 0
    assert "kernel    none: cannot lower multicast groups on sm_86" in capsys.readouterr().out
    assert main(["gemm", "256", "256", "128", "--multicast", "3,2"]) == 2
    assert "does not fall into groups" in capsys.readouterr().err


def test_a_raise_that_never_comes_is_drawn_as_a_deadlock(capsys, tmp_path):
    from spatialc.cli import main

    saved = tmp_path / "broken.json"
    saved.write_text(spatialc.to_json(edit(1, drop(SemInc))))
    assert main(["verify", str(saved), "--pictures", str(tmp_path / "pics")]) == 2
    assert "site 0 reader [item 0, k 0]: SemWait" in capsys.readouterr().err
    svg = (tmp_path / "pics" / "deadlock.svg").read_text()
    assert "site 0 reader" in svg and "SemWait" in svg


def test_the_placement_picture_frames_each_group_s_block_and_names_its_senders():
    from spatialc import viz

    p = build(256, 256, 128, "int8", (2, 2), sites=8)
    svg = viz.placement_svg(p)
    blocks = sum(len(items) for _, items in p.placement.items_of_site) // 4
    assert svg.count('class="group"') == blocks == 8
    assert "multicast group of sites 4-7, block 0: A from sites 4, 6 along their rows; B from sites 4, 5" in svg
    assert "a multicast group&#x27;s 2x2 items at one time" in svg  # the key (its apostrophe escaped)
    assert 'class="group"' not in viz.placement_svg(spatialc.build(spatialc.gemm(256, 256, 128, "int8"), "sm_90"))

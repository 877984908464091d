"""The sm_90a form's multicast groups (lower/cuda/common/clusters.py): thread-block clusters whose shared operand
pages the copy engine multicasts, run through the host emulation's cluster layer (runtime/emu/emu_cluster.h) against the
interpreter, with the planted faults it must catch, and nvcc / SASS checks where the toolchain is present."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import numpy as np
import pytest

import spatialc
from spatialc.lower.cuda.common import clusters
from spatialc.lower.errors import Unsupported
from spatialc.runtime.tilize import LaunchError

from .test_sm90a import NVCC, compiled_clean, exact_both_ways, inputs, needs_gxx, outcome, replaced


def built(prec: str, shape: tuple[int, int, int], group: tuple[int, int], **kw):
    p = spatialc.build(spatialc.gemm(*shape, prec), "sm_90a", multicast=group, **kw)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and art.launch.cluster == group[0] * group[1]
    return p, art


# ---- what is printed ---------------------------------------------------------------------------------------------


def test_a_multicast_build_on_sm90a_plans_for_the_form_and_prints_clusters():
    p, art = built("bf16", (256, 512, 128), (1, 2))
    text = art.kernel_cu
    assert "__cluster_dims__(2, 1, 1)" in text and "SPATIALC_CLUSTER_KERNEL(spatialc_hopper, 2)" in text
    # The sender loads where the IR sends; the receiver announces the bytes, then tells the sender its stage is free.
    assert text.count("spatialc_tma_load_2d_multicast((char*)(ring_") == 1  # A: one 128-byte panel a page
    assert re.search(r"spatialc_mbar_expect_tx\(&full_0\[[^\]]*\], \d+u\);  // the page the sender sends", text)
    assert text.count("spatialc_mbar_arrive_cluster(&ready_0") == 1
    assert text.count("spatialc_mbar_wait_cluster(&ready_0") == 1
    assert "#define READY_COUNT_0 1u" in text
    # A cluster barrier after the barriers' initialisation and one before exit.
    assert text.count("spatialc_cluster_sync();") == 2
    assert art.launch.grid % 2 == 0 and p.placement is not None and p.placement.multicast == (1, 2)


def test_the_ready_count_is_the_group_size_less_the_sender():
    _, art = built("fp16", (512, 256, 64), (1, 4), block=(8, 1, 4))
    assert "#define READY_COUNT_0 3u" in art.kernel_cu


def test_a_cluster_larger_than_a_portable_one_is_refused():
    with pytest.raises(Unsupported, match="portable cluster holds at most 8"):
        clusters.check_cluster(9)


def test_a_semaphore_other_than_the_handshake_is_refused():
    p, _ = built("bf16", (256, 256, 64), (1, 2))
    mc = clusters.multicast(p, _template(p))
    assert mc is not None and mc.receivers == {0: 1}
    # A split-K program's semaphores are no multicast handshake: refused by name.
    split = spatialc.build(spatialc.gemm(128, 64, 2048, "bf16"), "sm_90", split_k=2)
    with pytest.raises(Unsupported, match="multicast handshakes only"):
        clusters.multicast(split, _template(split))


def _template(p):
    return {b.id: int(b.ring) for b in p.buffers}


# ---- emulated against the interpreter ----------------------------------------------------------------------------

CASES = [
    ("bf16", (256, 256, 128), (1, 2), {}),  # A shared along a group row
    ("fp16", (256, 256, 200), (2, 1), {}),  # B shared down a group column; odd K
    ("int8", (256, 512, 256), (1, 2), {}),
    ("bf16", (250, 500, 100), (2, 2), {}),  # both operands multicast, odd sizes
    ("bf16", (256, 256, 192), (1, 2), {"block": (8, 2, 2), "depth": 2}),  # every stage refilled
]


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(
    ("prec", "shape", "group", "kw"),
    CASES,
    ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}-mc{c[2][0]}x{c[2][1]}" for c in CASES],
)
def test_emulated_multicast_kernel_equals_the_interpreter(prec, shape, group, kw):
    p, art = built(prec, shape, group, **kw)
    exact_both_ways(p, art, inputs(prec, *shape))


@needs_gxx
@pytest.mark.emulation
def test_a_multicast_build_with_a_fused_epilogue_plans_without_the_epilogues_rings():
    """The fused store applies bias and relu from the accumulators, so a multicast build's residency check counts no
    rings for them — it counted them, found no block resident and refused the planner's own plan ("keeps 0 of this
    plan's blocks resident") for every multicast build with an epilogue the fused store applies."""
    from spatialc.frontend import bias, relu

    g = spatialc.gemm(256, 256, 160, "bf16", epilogue=[bias(), relu()])
    p = spatialc.build(g, "sm_90a", multicast=(2, 1), block=(8, 8, 2))
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and art.launch.cluster == 2 and art.launch.grid == 4
    assert spatialc.build(spatialc.gemm(2048, 2048, 2048, "bf16", epilogue=[bias()]), "sm_90a", multicast=(2, 1))
    x = inputs("bf16", 256, 256, 160) | {"bias": np.arange(256, dtype=np.float32) - 100}
    want = spatialc.evaluate(p, x)
    got = spatialc.emulate(art, x, timeout=120)
    assert got.dtype == want.dtype and np.array_equal(got, want)


# ---- planted faults ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grouped():
    """bf16 256×256×192, pairs of sites sharing A, K steps of 2 tiles over depth-2 rings: every stage refilled."""
    p, art = built("bf16", (256, 256, 192), (1, 2), block=(8, 2, 2), depth=2)
    assert p.plans[0].k_steps > 2
    return p, art, inputs("bf16", 256, 256, 192)


@needs_gxx
@pytest.mark.emulation
def test_a_sender_that_does_not_wait_for_its_receivers_races_with_their_readers(grouped):
    # The multicast refills a receiver's stage while its wgmma may still read the page before: nothing the sender
    # waited for told it the receiver had released it.
    text = re.sub(r"spatialc_mbar_wait_cluster\(&ready_0\[[^;]*;", "", grouped[1].program_cu, count=1)
    got = outcome(grouped, text)
    assert got.startswith(("race", "fault")) and ("RACE" in got or "more than its expect_tx" in got), got


@needs_gxx
@pytest.mark.emulation
def test_a_receiver_announcing_more_bytes_than_the_multicast_brings_hangs_with_the_bytes_named(grouped):
    sends = "  // the page the sender sends"
    text = replaced(grouped[1].program_cu, f"u);{sends}", f" + 16u);{sends}")
    got = outcome(grouped, text)
    assert got.startswith("deadlock") and "16 more bytes of TMA loads" in got and "cluster" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_multicast_that_leaves_out_the_receiver_hangs_it(grouped):
    text = re.sub(
        r"const unsigned short group = [^;]*;", "const unsigned short group = 1u << (site % 2);", grouped[1].program_cu
    )
    got = outcome(grouped, text)
    assert got.startswith("deadlock") and "more bytes of TMA loads" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_peer_using_barriers_before_the_cluster_barrier_after_their_initialisation_is_a_race(grouped):
    text = replaced(grouped[1].program_cu, "spatialc_cluster_sync();  // and before a peer", "// and before a peer")
    # The peer's use lands either after the barrier's initialisation (a race: no cluster barrier orders them) or,
    # where the interleaving runs the peer first, before it (a fault: a barrier never initialised); both name it.
    for mode in ("late", "early"):
        got = outcome(grouped, text, mode)
        raced = got.startswith("race") and "no cluster barrier since" in got
        assert raced or (got.startswith("fault") and "spatialc_mbar_init never initialised" in got), got


@needs_gxx
@pytest.mark.emulation
def test_barriers_a_peer_uses_without_the_cluster_fence_after_their_initialisation_are_a_race(grouped):
    # fence.mbarrier_init.release.cluster makes the initialised barriers visible to the cluster's other blocks; the
    # cluster barrier alone does not promise it.
    fence = "spatialc_fence_barrier_init();  // the initialised barriers, before any other thread's use"
    text = replaced(grouped[1].program_cu, fence, "// (no fence)")
    got = outcome(grouped, text)
    assert got.startswith("race") and "with no fence.mbarrier_init after it" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_consumer_waiting_at_cta_scope_for_a_page_a_peer_multicast_is_a_race(grouped):
    # The page's bytes came from the sender's block: only an acquire at cluster scope orders them before the
    # consumer's reads.
    text = grouped[1].program_cu
    assert "spatialc_mbar_wait_cluster(&full_" in text
    got = outcome(grouped, text.replace("spatialc_mbar_wait_cluster(&full_", "spatialc_mbar_wait(&full_"))
    assert got.startswith("race") and "acquiring at CTA scope only" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_block_exiting_while_a_peer_still_multicasts_into_it_is_caught(grouped):
    # The receivers' consumers stop a K step early: the last page their sender multicasts to them is never waited
    # for, so nothing orders its bytes before the receiver's exit — with or without the cluster barrier at exit.
    text = grouped[1].program_cu
    loop = re.search(r"for \(int k = 0; k < (\d+); \+\+k\) \{  // op:Loop\n(?:(?!for \(int k).)*wgmma", text, re.S)
    assert loop, "the consumers' K loop"
    at = loop.start(1)
    text = f"{text[:at]}{loop[1]} - (site % 2){text[loop.end(1) :]}"
    got = outcome(grouped, text)
    assert got.startswith("fault") and "exit" in got and "multicast" in got, got
    bare = replaced(text, "spatialc_cluster_sync();  // no block leaves", "// no block leaves")
    got = outcome(grouped, bare)
    assert got.startswith("fault") and "exit" in got and "multicast" in got, got


# ---- nvcc and SASS -----------------------------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("prec", ["bf16", "int8"])
def test_multicast_kernel_compiles_clean_and_its_sass_multicasts(prec, tmp_path):
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, prec), "sm_90a", multicast=(1, 2)))
    assert art.budget.form == "sm90a" and art.launch.cluster == 2
    instrs = compiled_clean(art, tmp_path)
    ops = Counter(i.base for i in instrs)
    assert any(i.op.startswith("UTMALDG") and "MULTICAST" in i.op for i in instrs), ops
    assert ops["UCGABAR_ARV"] >= 2 and ops["UCGABAR_WAIT"] >= 2, ops  # the cluster barriers
    assert ops["IGMMA" if prec == "int8" else "HGMMA"] >= 1 and ops["USETMAXREG"] == 2, ops


def test_sites_of_a_cluster_with_unequal_items_are_refused():
    p, _ = built("bf16", (256, 512, 64), (1, 2), block=(8, 1, 4), sites=4)
    assert p.placement is not None
    listed = list(p.placement.items_of_site)
    (s0, i0), (s1, i1) = listed[0], listed[1]
    uneven = [(s0, i0 + i1[:1]), (s1, i1[1:]), *listed[2:]]
    q = dataclasses.replace(p, placement=dataclasses.replace(p.placement, items_of_site=tuple(uneven)))
    with pytest.raises(Unsupported, match="every site of a cluster takes part"):
        clusters.check_items(q, 2)
    clusters.check_items(p, 2)  # the placement multicast builds: as many items on each


# ---- a cluster with an idle site ----------------------------------------------------------------------------------


def _with_idle_cluster(p, size: int):
    """The program with one more cluster of `size` sites, none with an item (a verified placement)."""
    from spatialc.ir import Site

    pl = p.placement
    n = len(pl.items_of_site)
    idle = tuple((Site(n + i), ()) for i in range(size))
    return spatialc.verify(
        dataclasses.replace(p, placement=dataclasses.replace(pl, items_of_site=pl.items_of_site + idle))
    )


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_a_cluster_kernel_leaves_early_only_as_a_whole_cluster(target):
    # `if (n_items == 0) return;` before the first cluster barrier is safe only while every site of the cluster has
    # work: the exit reads the counts of the whole cluster, and a kernel without clusters keeps its plain exit.
    p = spatialc.build(spatialc.gemm(128, 128, 64, "bf16"), target, multicast=(1, 2))
    art = spatialc.lower(p)
    assert art.budget.form == {"sm_90": "general", "sm_90a": "sm90a"}[target]
    text = art.kernel_cu
    assert "if (n_items == 0) { return; }" not in text
    assert "if (cluster_items == 0) { return; }" in text and "cluster_first = site - site % 2" in text
    plain = spatialc.lower(spatialc.build(spatialc.gemm(128, 128, 64, "bf16"), target)).kernel_cu
    assert "if (n_items == 0) { return; }" in plain and "cluster_items" not in plain


def test_the_launcher_refuses_a_busy_cluster_with_an_idle_site():
    p, art = built("bf16", (128, 128, 64), (1, 2))
    launch = art.launch.to_dict()
    sites, work = spatialc.work_list(launch)
    assert sites % 2 == 0
    counts = list(work[sites : 2 * sites])
    assert counts[0] == counts[1] > 0
    broken = dict(launch)
    items = list(work)
    items[sites + 1] = 0  # site 1 of cluster 0 given nothing while site 0 keeps its items
    broken["work"] = items
    with pytest.raises(LaunchError, match=r"cluster 0 \(sites 0-1\) has \d+, 0 items"):
        spatialc.work_list(broken)
    # A cluster wholly idle leaves together: accepted.
    idle = _with_idle_cluster(p, 2)
    sites2, work2 = spatialc.work_list(spatialc.lower(idle).launch)
    assert sites2 == sites + 2 and list(work2[2 * sites2 - 2 : 2 * sites2]) == [0, 0]


@needs_gxx
@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_a_wholly_idle_cluster_leaves_together_and_the_rest_compute_exactly(target):
    p = _with_idle_cluster(spatialc.build(spatialc.gemm(128, 128, 64, "bf16"), target, multicast=(1, 2)), 2)
    art = spatialc.lower(p)
    assert art.launch.cluster == 2 and art.launch.grid == len(p.placement.items_of_site)
    exact_both_ways(p, art, inputs("bf16", 128, 128, 64))

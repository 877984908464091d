"""The general form's multicast groups on their cluster's barriers (lower/cuda/common/clusters.py).

The first GPU run measured the general form with 2×1 groups at 4.1–5.0 µs a K step whatever the precision and size,
against 0.6–1.2 µs without groups (bench/README.md, "The first GPU run"): each page then crossed the group through
semaphores in global memory, in lock step — the receiver's raise and the sender's flags two round trips through L2,
polled with acquire loads; six device-scope fences a page; the receiver's reader waiting for the page before it could
offer the next stage, so one page was in flight per group whatever the ring's depth. These tests pin what replaced
it: no word of global memory, the receiver's reader waiting on nothing the sender does, and SASS without global
atomics, polls or the device-scope fences the old handshake put on every K step. The emulation's side (a remote
arrival releasing the arriving block's stores into the cluster's shared memory, and the faults it must catch) is in
tests/test_multicast.py and tests/runtime/test_emulation_blind_spots.py.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

import spatialc
from spatialc.runtime.nvcc import compile_cubin, find_nvcc, kernel_ptxas
from spatialc.runtime.sass import disassemble, find_cuobjdump

# The first GPU run's multicast row (mc2x1, bf16) at its smaller size: 2×1 groups share B down a group column.
GPU_ROW = spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16"), "sm_90", multicast=(2, 1))


@pytest.fixture(scope="module")
def art():
    a = spatialc.lower(GPU_ROW, "sm_90", form="general")
    assert a.budget.form == "general" and a.launch.cluster == 2
    return a


def kernel_body(text: str) -> str:
    """The kernel function, without the device helpers the text inlines before it."""
    return text[text.index('extern "C" __global__') :]


def receiver_reader(text: str) -> str:
    """The reader's program as the receivers (site class 1 of a 2×1 group) run it."""
    body = kernel_body(text)
    start = body.index("if (spatialc_site_class[site] == 1)")
    return body[start : body.index("else if (warp <", start)]


def test_a_group_hands_its_pages_over_with_no_word_of_global_memory(art):
    body = kernel_body(art.kernel_cu)
    assert art.launch.sync == () and "spatialc_sync" not in body
    assert not re.search(r"spatialc_grid_(add|wait)\(|__threadfence\(\)", body)
    # A stage free in the receiver is an arrival on the sender's ready barrier; a page landed, the sender's threads'
    # arrivals on the receiver's full barrier, waited for at cluster scope.
    assert "#define READY_COUNT_1 1u" in art.kernel_cu
    assert "spatialc_mbar_wait_cluster(&ready_1[snd_1 % DEPTH_1], (snd_1 / DEPTH_1) & 1);" in body
    assert "spatialc_mbar_arrive_cluster(&full_1[(snd_1 - 1) % DEPTH_1]," in body
    assert "spatialc_mbar_wait_cluster(&full_1[wt_1 % DEPTH_1]" in body
    assert body.count("spatialc_cluster_sync();") == 2  # after the barriers' initialisation, and before exit


def test_the_receiver_waits_for_nothing_the_sender_does(art):
    """Its reader waits only for its own consumers to free a stage, so it offers the next stages while the sender is
    still sending: the ring's depth, not a round trip between the blocks, sets the pace."""
    reader = receiver_reader(art.kernel_cu)
    waits = re.findall(r"spatialc_\w*wait\w*\(&?(\w+)", reader)
    assert waits and set(waits) == {"empty_0", "empty_1"}, waits
    assert "spatialc_mbar_arrive_cluster(&ready_1[((rsv_1 - 1) % DEPTH_1)]" in reader
    assert "++psh_1;  // op:Push (published by the sender's arrivals)" in reader


@pytest.mark.nvcc
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed")
def test_its_sass_has_no_global_atomic_poll_or_sequential_fence(art, tmp_path):
    """The old handshake in this kernel's SASS: 5 REDG and 4 LDG.E.STRONG.GPU (polls, with NANOSLEEP and CCTL.IVALL)
    on the semaphores, one MEMBAR.SC.GPU and five MEMBAR.ALL.GPU — in the K loops 3 REDG and 4 device fences a step in
    the sender, 2 and 2 in the receiver. Now four MEMBAR.ALL.GPU in all: a remote arrival's release, once a page in the
    sender and once in the receiver, and the two cluster barriers'."""
    cubin = compile_cubin(art.kernel_cu, "sm_90", cache=tmp_path)
    info = kernel_ptxas(cubin, "spatialc_general")
    assert info is not None and info.spill_stores == 0 and info.spill_loads == 0
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    ops = Counter(i.op for i in disassemble(cubin, tool).instrs if not i.never)
    old = [op for op in ops if op.startswith(("REDG", "ATOMG", "LDG.E.STRONG", "NANOSLEEP", "MEMBAR.SC"))]
    assert not old, ops
    assert ops["MEMBAR.ALL.GPU"] <= 4, ops
    assert ops["SYNCS.ARRIVE.TRANS64.RED.A1T0"] >= 2, ops  # the remote arrivals: a receiver's ready, a sender's page

"""What the emulation could not see (issue 30, point 8), each a fault planted in a printed kernel and now caught in
both modes, every run: a multicast sender that skips its handshake wait or arrives before it copies, or a receiver
acquiring its page at CTA scope (stores into a peer's shared memory are race-checked on the receiving side), a
grouped writer without its row mask or a row loop one block too long (C is poisoned as `spatialc.run` poisons it on
a GPU, and every global access is bounds-checked and race-checked between blocks), a split-K owner that skips its
wait and a relaxed add where a release is needed (global atomics order memory as far as release and acquire). The
kernels are small, so that each edit costs a second or two."""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.runtime.emulate import EmulationFault, EmulationRace

from ..test_grouped_gemm import grouped
from ..test_grouped_gemm import operands as grouped_operands
from ..test_multicast import FAULT_INPUTS as MULTICAST_INPUTS
from ..test_multicast import FAULT_PROGRAM as MULTICAST
from ..test_split_k import _released, split
from ..test_split_k import operands as split_operands

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++"),
]
MODES = ("late", "early")


def run(program, inputs, edit, mode: str):
    """The emulation of `program`'s kernel with its text edited by `edit` (which must change it)."""
    art = spatialc.lower(program)
    text = edit(art.program_cu)
    assert text != art.program_cu, "the planted edit found nothing to change"
    return spatialc.emulate(dataclasses.replace(art, program_cu=text), inputs, mode=mode, timeout=60)


# ---- global memory: a grouped GEMM's writer and row loops --------------------------------------------------------


@functools.cache
def grouped_case():
    """3 groups of at most 40 rows; group 1 holds 17 rows, so its rows 17-39 must be left alone."""
    p = grouped(3, 40, 32, 48)
    ins = grouped_operands("int8", 3, 40, 32, 48, 1) | {"sizes": np.array([40, 17, 33], np.int32)}
    return p, ins


def unmasked(text: str) -> str:
    """The writer stores every row of its page, past its group's count too."""
    return re.sub(r"if \([^{}]*< t3\[[^{}]*\]\) \{ (SPATIALC_OUT_ST\(.*\);) \}", r"\1", text)


@pytest.mark.parametrize("mode", MODES)
def test_a_grouped_writer_without_its_row_mask_is_caught(mode):
    """It writes zeros into the rows past a group's count, which C held before it was poisoned."""
    p, ins = grouped_case()
    with pytest.raises(EmulationFault, match="wrote row 17 .* of group 1 of C, at or past the group's count"):
        run(p, ins, unmasked, mode)


def longer(text: str, groups: str) -> str:
    """Every engine's row loop of the `groups` (a C condition on item_y, the group) runs one block more."""
    return text.replace("= spatialc_trip_per(", f"= ({groups}) + spatialc_trip_per(")


@pytest.mark.parametrize("mode", MODES)
def test_a_row_loop_one_block_too_long_writing_another_groups_rows_is_caught(mode):
    """Group 0's extra block is group 1's first: its writer's mask reads group 1's count, and it writes rows that
    group 1's writer writes too — every element of C is written once."""
    p, ins = grouped_case()
    with pytest.raises(EmulationRace, match=r"RACE on element \d+ of global tensor 'C' .* writes it again after"):
        run(p, ins, lambda t: longer(t, "item_y == 0"), mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_store_past_the_end_of_c_is_out_of_bounds(mode):
    """The last group's loop one block too long with the writer unmasked: its rows lie past the end of C."""
    p, ins = grouped_case()
    with pytest.raises(EmulationFault, match=r"OUT OF BOUNDS: a store .* of global tensor 'C', .* bytes past its end"):
        run(p, ins, lambda t: unmasked(longer(t, "item_y == 2")), mode)


# ---- global memory between blocks: split-K's partial sums ---------------------------------------------------------


@functools.cache
def split_case():
    p = split(64, 64, 2048, "int8", 3, "sm_86")
    return p, split_operands("int8", 64, 64, 2048, 5)


@pytest.mark.parametrize("mode", MODES)
def test_a_split_k_owner_that_skips_its_wait_on_the_partials_is_a_race(mode):
    p, ins = split_case()
    wait = re.compile(r"if \(etid == 0\) \{ spatialc_grid_wait\(spatialc_sync \+ 0 \+ site, 2\); \}")
    with pytest.raises(EmulationRace, match="RACE between blocks on element .* of global tensor 'partials'"):
        run(p, ins, lambda t: wait.sub("", t), mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_relaxed_raise_where_a_release_is_needed_is_a_race(mode):
    """Without the contributors' fence and with a relaxed add, nothing publishes their partial sums; a fence before
    the relaxed add releases them (the release pattern: no report)."""
    p, ins = split_case()
    with pytest.raises(EmulationRace, match="reads what block .* wrote, and nothing orders that write first"):
        run(p, ins, lambda t: _released(t, False, False), mode)
    assert np.array_equal(run(p, ins, lambda t: _released(t, True, False), mode), spatialc.evaluate(p, ins))


# ---- multicast: stores into a peer block's shared memory ----------------------------------------------------------


def _arrive_before_copying(text: str) -> str:
    """The sender's arrivals on the receiver's full barrier moved before its copy into that stage."""
    arrive = "spatialc_mbar_arrive_cluster(&full_0[(snd_0 - 1) % DEPTH_0], ((((site + 1)) % 2 + 2) % 2));"
    early = arrive.replace("(snd_0 - 1)", "snd_0")
    copy = "const char* src = (const char*)(ring_0 + "
    assert text.count(arrive) == 1 and text.count(copy) == 1
    return text.replace(arrive, "").replace(copy, f"{early}\n{copy}")


MULTICAST_FAULTS = {
    # The sender copies without waiting for the receiver's ready arrival: it overwrites a page the receiver has not
    # released (or stores before the receiver declared its ring).
    "sender-skips-ready": lambda t: re.sub(r"\n *spatialc_mbar_wait_cluster\(&ready_0\[.*", "", t),
    # Its threads arrive before they copy: the receiver's consumers read the stage unordered after the stores.
    "sender-arrives-before-copying": _arrive_before_copying,
    # The receiver's consumers pass the phase the sender's arrivals completed acquiring at CTA scope only.
    "consumer-acquires-at-cta-scope": lambda t: t.replace("_mbar_wait_cluster(&full_", "_mbar_wait(&full_"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", sorted(MULTICAST_FAULTS))
def test_a_multicast_handshake_out_of_order_is_a_race(mode, fault):
    """The 1×2 group's sender copies A pages into the receiver's ring (spatialc_dsmem_copy16) and each of its
    threads then arrives on that stage's full barrier in the receiver (clusters.py): a sender that skips its wait for
    the receiver's ready arrival, arrives before it copies, or a receiver whose consumers acquire at CTA scope, races
    — whichever access comes first in a run, it is a race between blocks."""
    between = r"RACE between blocks( on shared ring 'ring_0' .*|: .*|: distributed shared memory store)"
    with pytest.raises(EmulationRace, match=between):
        run(MULTICAST, MULTICAST_INPUTS, MULTICAST_FAULTS[fault], mode)


def test_the_unedited_kernels_equal_the_interpreter_in_both_modes():
    """No false report: the poison is left alone where it should be, and every handshake orders what it must."""
    for p, ins in (grouped_case(), split_case(), (MULTICAST, MULTICAST_INPUTS)):
        for mode in MODES:
            assert np.array_equal(spatialc.emulate(spatialc.lower(p), ins, mode=mode), spatialc.evaluate(p, ins))

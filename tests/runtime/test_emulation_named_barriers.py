"""The host emulation's named barriers with an arrival that does not wait (bar.arrive, `spatialc_engine_arrive`)
beside bar.sync (`spatialc_engine_sync`), on a hand-written ping-pong (tests/emu_fixtures/named_arrive.cu): two
groups of two warps take turns, each turn's value read from the other group's turn before it. Counted as the PTX
ISA states (a phase completes when its thread count has arrived, by either instruction — a thread's bar.arrive and
its bar.sync on the same barrier count twice, as the first group's first turn takes it; counts a multiple of 32;
barriers 0 to 15): an arrival left out hangs, and so does an arrival on the wrong barrier (the group gives itself
every turn, the other waits for ever), and the deadlock check reports each, naming the barriers; a barrier past 15,
barrier 0 (__syncthreads') and a count not a multiple of the warp are refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from spatialc.runtime.emulate import EmulationDeadlock, EmulationFault, compile_program, run_program

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++"),
]

FIXTURE = (Path(__file__).parents[1] / "emu_fixtures" / "named_arrive.cu").read_text()


@pytest.fixture(scope="module")
def program():
    return compile_program(FIXTURE, "late")


def turns(program, case: str) -> np.ndarray:
    return np.array(run_program(program, {"case.txt": case + "\n"}, 60).stdout.split(), dtype=np.int64)


def test_the_groups_take_turns_and_each_sees_the_others_write(program):
    # Every turn one more than the turn before, which the other group wrote (shared memory starts poisoned): the
    # turns alternated. (Plain loads and stores of shared memory are not race-checked: the values are the check.)
    np.testing.assert_array_equal(turns(program, "ok"), np.arange(1, 17))


def test_an_arrival_left_out_hangs_and_the_deadlock_names_the_barrier(program):
    with pytest.raises(EmulationDeadlock) as e:
        turns(program, "missing")
    said = str(e.value)
    assert "DEADLOCK in block 0" in said
    assert "64 threads (0-63) waits at named barrier 1 (bar.sync)" in said
    assert "64 threads (64-127) waits at named barrier 2 (bar.sync)" in said
    assert "named barrier 1 has 64 of 128 threads" in said and "named barrier 2 has 64 of 128 threads" in said


def test_an_arrival_on_the_wrong_barrier_hangs_the_other_group(program):
    with pytest.raises(EmulationDeadlock) as e:
        turns(program, "swapped")
    said = str(e.value)
    assert "64 threads (64-127) waits at named barrier 2 (bar.sync)" in said
    assert "named barrier 2 has 64 of 128 threads" in said


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("id16", r"spatialc_engine_sync at line \d+: barrier 16 \(a CTA has barriers 0 to 15\)"),
        # (both groups use the count: whichever thread comes first, an arriving or a syncing one, is reported)
        ("count100", r"spatialc_engine_(arrive|sync) at line \d+: 100 threads \(a multiple of 32"),
        # Barrier 0 is __syncthreads' own on a GPU (its arrivals would meet the block's); the emulation tracks that
        # one apart, so a named use of it is refused rather than counted as a barrier of its own.
        ("id0", r"spatialc_engine_sync at line \d+: barrier 0, which is __syncthreads'"),
    ],
)
def test_what_a_gpu_would_miscount_is_refused(program, case, says):
    with pytest.raises(EmulationFault, match=says):
        turns(program, case)

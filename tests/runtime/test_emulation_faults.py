"""Planted faults: each test breaks the emitted `program_cu` of a real artifact the way a lowering bug would, and
shows the host emulation catch it, every run, in the mode the test names: a race report, or C that no longer
equals `spatialc.evaluate`. The other mode's outcome is asserted too, so each test also records what that mode
cannot see (late mode lands a cp.async at its wait, early mode at its issue; see runtime/emu/emu_pipeline.h)."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.ir.ops import Loop, Wait
from spatialc.passes.verify import verify
from spatialc.runtime.emulate import EmulationError, EmulationRace

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++"),
]

RNG = np.random.default_rng(11)
INPUTS = {
    "A": RNG.integers(-128, 128, (64, 64)).astype(np.int8),
    "B": RNG.integers(-128, 128, (64, 64)).astype(np.int8),
}
EXACT = "exact"


@pytest.fixture(scope="module")
def fused():
    """64³ int8 on sm_86 (4 warps): 2×2-tile items, two per site, depth-2 rings, the fused epilogue."""
    program = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(2, 2, 1), depth=2, sites=2)
    assert "(fused output: no ring)" in spatialc.lower(program).program_cu
    return program


@pytest.fixture(scope="module")
def plain():
    """64³ int8 on sm_86: one-tile items and an output ring that the accumulator stores fill (no fused epilogue)."""
    return spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), depth=2, sites=4)


def outcome(program, text: str, mode: str) -> str:
    """'exact' when the emulation of `text` equals evaluate, else what caught it: 'race', 'mismatch', …"""
    art = spatialc.lower(program)
    broken = dataclasses.replace(art, program_cu=text)
    try:
        c = spatialc.emulate(broken, INPUTS, mode=mode, timeout=60)
    except EmulationRace:
        return "race"
    except EmulationError as e:
        return e.kind
    return EXACT if np.array_equal(c, spatialc.evaluate(program, INPUTS)) else "mismatch"


def k_loop(text: str) -> tuple[list[str], int]:
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("for (int k = 0;")]
    assert starts, "the emitted kernel has no K loop `for (int k = 0; …)`"
    return lines, starts[0]


def first_after(lines: list[str], start: int, marker: str) -> int:
    found = [i for i in range(start, len(lines)) if marker in lines[i]]
    assert found, f"the emitted kernel has no line with {marker!r} after line {start + 1}"
    return found[0]


def loop_end(lines: list[str], start: int) -> int:
    """The line that closes the loop opened on line `start`."""
    depth = 0
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if depth == 0 and i > start:
            return i
    raise AssertionError(f"the loop opened on line {start + 1} never closes")


def drop_on_line(text: str, marker: str, token: str, after_k_loop: bool = False) -> str:
    """`text` without `token` on the first line holding it and `marker`, inside the K loop (or after it)."""
    lines, start = k_loop(text)
    begin = loop_end(lines, start) if after_k_loop else start
    found = [i for i in range(begin, len(lines)) if marker in lines[i] and token in lines[i]]
    assert found, f"the emitted kernel has no line with {token!r} and {marker!r} after line {begin + 1}"
    lines[found[0]] = lines[found[0]].replace(token, "", 1)
    return "\n".join(lines)


def test_the_unbroken_artifacts_are_exact_in_both_modes(fused, plain):
    for program in (fused, plain):
        text = spatialc.lower(program).program_cu
        assert [outcome(program, text, m) for m in ("late", "early")] == [EXACT, EXACT]


def test_no_barrier_after_the_waits_is_a_race_in_both_modes(fused):
    # Every thread's copies land at its own wait; without the barrier, warps read pages other threads still fill.
    text = drop_on_line(spatialc.lower(fused).program_cu, "// op:Wait", "__syncthreads();")
    assert outcome(fused, text, "late") == "race"
    assert outcome(fused, text, "early") == "race"  # the prologue's copies and step 0's reads share interval 0


def test_a_prefetch_issued_before_the_wait_barrier_is_a_race_in_both_modes(fused):
    # The pops print no barrier because step k+1's copies are issued behind step k's wait barrier, when nobody
    # reads step k-1's depth-2 slot any more. Issued before the waits, they refill that slot while slower warps
    # still read it.
    lines, start = k_loop(spatialc.lower(fused).program_cu)
    prefetch = first_after(lines, start, "if (k + 1 < ")
    end = loop_end(lines, first_after(lines, prefetch, "else")) + 1
    first_wait = first_after(lines, start, "// op:Wait")
    assert first_wait < prefetch and not any("__syncthreads" in line for line in lines[end:] if "// op:Pop" in line)
    moved = lines[:first_wait] + lines[prefetch:end] + lines[first_wait:prefetch] + lines[end:]
    text = "\n".join(moved)
    # Early mode lands them at issue; late mode at the wait just after, whose wait_prior(0) covers them — both
    # before the barrier that slower warps reading step k-1 have not reached.
    assert [outcome(fused, text, m) for m in ("late", "early")] == ["race", "race"]


def test_no_wait_prior_reads_pages_not_yet_landed_in_late_mode(fused):
    lines, start = k_loop(spatialc.lower(fused).program_cu)
    end = first_after(lines, start, "// op:Compute")
    waits = [i for i in range(start, end) if "// op:Wait" in lines[i]]
    # The step's two waits print one wait_prior(2): a thread's wait completes all its groups, so a second one
    # would repeat it.
    assert len(waits) == 2 and ["__pipeline_wait_prior(" in lines[i] for i in waits] == [True, False]
    lines[waits[0]] = re.sub(r"__pipeline_wait_prior\(\d+\);", "", lines[waits[0]])
    text = "\n".join(lines)
    # Late mode lands a copy only at a wait that covers it: step k's land at step k+1's, while warps still read.
    assert outcome(fused, text, "late") == "race"
    assert outcome(fused, text, "early") == EXACT  # copies that land at issue need no wait


def test_rings_three_deep_print_no_pop_barrier_and_made_two_deep_race_in_early_mode():
    # Three deep, the prefetch refills the slot read two steps back, behind the last step's wait barrier: the K
    # loop's pops print none (persistent.order.barrier_free_pops). The same text with two-deep rings refills the slot
    # read one step back, which slower warps may still be reading, and the race check sees it.
    deep = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(2, 2, 1), depth=3, sites=2)
    text = spatialc.lower(deep).program_cu
    lines, start = k_loop(text)
    step = lines[start : loop_end(lines, start) + 1]
    assert not any("__syncthreads" in line for line in step if "// op:Pop" in line)
    assert [outcome(deep, text, m) for m in ("late", "early")] == [EXACT, EXACT]
    shallow = text.replace("#define DEPTH_0 3\n", "#define DEPTH_0 2\n").replace(
        "#define DEPTH_1 3\n", "#define DEPTH_1 2\n"
    )
    assert shallow.count("#define DEPTH_") == text.count("#define DEPTH_") and shallow != text
    assert outcome(deep, shallow, "early") == "race"


def test_a_ring_one_page_shallower_overwrites_the_page_being_read_in_both_modes(fused):
    text = spatialc.lower(fused).program_cu
    assert "#define DEPTH_0 2\n" in text
    text = text.replace("#define DEPTH_0 2\n", "#define DEPTH_0 1\n")
    # Step k+1's prefetch, issued behind step k's wait barrier, lands on step k's only page while it is read: at
    # issue (early) or at the next wait (late), before the barrier of step k+1.
    assert [outcome(fused, text, m) for m in ("late", "early")] == ["race", "race"]


def test_a_fused_store_that_misplaces_an_accumulator_element_is_a_race(fused):
    """The fused store writes each lane's own accumulator elements where the mma layout puts them; a store that
    takes element i's row from the wrong bit puts half of them in the wrong rows, in both modes: two lanes store one
    element of C, which the emulation reports (every output element is written once: runtime/emu/emu_global.h)."""
    text = spatialc.lower(fused).program_cu
    where = "const int el0 = lane_el + ((i >> 1) & 1) * 128 + (i >> 2) * 8;  // even: a pair"
    assert where in text
    broken = text.replace(where, where.replace("((i >> 1) & 1) * 128", "((i >> 2) & 1) * 128"))
    assert [outcome(fused, broken, mode) for mode in ("late", "early")] == ["race", "race"]


def test_a_paired_store_at_an_odd_element_is_refused_as_the_gpu_would_fault(fused):
    """The fused store writes adjacent columns as one store of twice their width, which a GPU makes only at an
    address aligned to both: one element off, the emulation refuses the store (misaligned), in both modes."""
    text = spatialc.lower(fused).program_cu
    where = "SPATIALC_OUT_ST2(&t2[tile * 256 + el0], pair[0], pair[1]);"
    assert where in text
    broken = dataclasses.replace(
        spatialc.lower(fused), program_cu=text.replace(where, where.replace("+ el0]", "+ el0 + 1]"))
    )
    for mode in ("late", "early"):
        with pytest.raises(EmulationError, match=r"MISALIGNED: a paired store \(SPATIALC_OUT_ST2\) at line \d+"):
            spatialc.emulate(broken, INPUTS, mode=mode, timeout=60)


def test_no_barrier_after_the_output_wait_reads_unstored_fragments_in_late_mode(plain):
    # The non-fused epilogue: accumulator stores into the output ring, then Wait C, whose barrier publishes it.
    text = drop_on_line(spatialc.lower(plain).program_cu, "// op:Wait", "__syncthreads();", after_k_loop=True)
    assert outcome(plain, text, "late") == "mismatch"


def test_a_corrupt_item_list_entry_is_a_race_in_both_modes(fused):
    """One item computed twice, another never: its tiles of C are stored twice, which the emulation reports (it used
    to be a wrong answer only, the missing item's tiles left at zero)."""
    text = spatialc.lower(fused).program_cu
    m = re.search(r"^( *)std::vector<int> work = .*$", text, re.M)
    assert m, "the host program builds no work list"
    # The first item's entry copied over the second's: one item computed twice, another never.
    text = text[: m.end()] + f"\n{m.group(1)}work[2 * GRID + 1] = work[2 * GRID];" + text[m.end() :]
    assert [outcome(fused, text, mode) for mode in ("late", "early")] == ["race", "race"]


def _consumers_first(program):
    """The schedule with its engine programs listed writer, compute, reader, and each step's two waits swapped."""

    def swap_waits(ops):
        out = []
        for op in ops:
            if isinstance(op, Loop):
                body = list(swap_waits(op.body))
                at = [i for i, o in enumerate(body) if isinstance(o, Wait)]
                if len(at) == 2:
                    body[at[0]], body[at[1]] = body[at[1]], body[at[0]]
                op = dataclasses.replace(op, body=tuple(body))
            out.append(op)
        return tuple(out)

    programs = tuple(dataclasses.replace(p, ops=swap_waits(p.ops)) for p in reversed(program.schedule.programs))
    return verify(program.evolve(schedule=dataclasses.replace(program.schedule, programs=programs)))


def test_engines_listed_consumers_first_are_serialised_producers_first(plain):
    # A hand-made schedule: verify and the lowering accept it, and the emulation finds the kernel exact — the
    # lowering orders a site's engines by dataflow, so the listed order cannot reach the kernel.
    bad = _consumers_first(plain)
    assert [p.engine.value for p in bad.schedule.programs[:3]] == ["writer", "compute", "reader"]
    text = spatialc.lower(bad).program_cu
    assert [outcome(bad, text, m) for m in ("late", "early")] == [EXACT, EXACT]


def test_a_consumer_printed_before_its_producer_is_caught_not_a_hang(fused):
    # Step 0's copies (printed before the K loop) removed: step 0 is consumed before anything produced it. A
    # __pipeline_wait_prior never blocks on other threads, so the kernel cannot hang; the slot counters now send step
    # 1's prefetch into the page step 0 is read from, while warps read it: the race check sees it in both modes.
    # (A run that does hang ends with the watchdog's TIMEOUT: tests/runtime/test_emulation.py, the spin probe.)
    lines = spatialc.lower(fused).program_cu.split("\n")
    pre = [i for i, line in enumerate(lines) if "// pre:" in line]
    assert pre, "the emitted kernel has no rotated prologue (`// pre:` lines)"
    _, start = k_loop("\n".join(lines))
    text = "\n".join(lines[: pre[0]] + lines[start:])
    assert [outcome(fused, text, m) for m in ("late", "early")] == ["race", "race"]

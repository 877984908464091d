"""Targets: the published figures they carry and the occupancy questions planner and lowering both ask."""

import dataclasses

import pytest

import spatialc
from spatialc.target import TARGETS, UnknownTarget


def test_the_targets_and_their_figures():
    assert set(TARGETS) == {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}
    h = spatialc.target("sm_90")
    assert (h.units, h.smem_per_unit, h.smem_per_site_max) == (132, 228 * 1024, 227 * 1024)
    hopper = spatialc.target("sm_90a")  # the same chip, with its architecture-specific instructions
    assert hopper.hopper and not h.hopper
    assert dataclasses.replace(hopper, name="sm_90", hopper=False) == h
    a = spatialc.target("sm_80")
    assert (a.units, a.smem_per_unit, a.threads_per_unit_max) == (108, 164 * 1024, 2048)
    assert spatialc.target("sm_86").threads_per_unit_max == 1536


def test_unknown_target_is_a_typed_error():
    with pytest.raises(UnknownTarget, match="unknown target 'sm_75'.*sm_80, sm_86, sm_89, sm_90"):
        spatialc.target("sm_75")


@pytest.mark.parametrize(
    ("name", "osh", "osw", "grid"),
    [
        ("sm_86", 4, 4, (2, 2)),  # 4 warps on a square block: 2x2 warps of 2x2 tiles
        ("sm_86", 1, 4, (1, 4)),  # a row block: every warp one tile of the row
        ("sm_86", 8, 2, (4, 1)),  # 4x1 warps of 2x2 tiles beats 2x2 warps of 4x1
        ("sm_90", 8, 8, (2, 4)),  # 8 warps on 8x8: 4x2-tile rectangles (a tie with 2x4 goes to fewer warp rows)
        ("sm_86", 3, 3, None),  # nothing divides
        ("sm_90", 1, 1, None),  # more warps than tiles
    ],
)
def test_accumulator_lane_grid_is_the_squarest_that_divides(name, osh, osw, grid):
    t = spatialc.target(name)
    got = t.accumulator_lane_grid(osh, osw)
    assert got == grid
    if got:
        wm, wn = got
        assert wm * wn == t.accumulator_lanes and osh % wm == 0 and osw % wn == 0


def test_resident_sites_fall_as_shared_memory_grows_and_stop_at_the_limits():
    t = spatialc.target("sm_90")
    counts = [t.resident_sites_per_unit(kib * 1024, 4, 4) for kib in (1, 16, 48, 100, 227)]
    assert counts == sorted(counts, reverse=True)
    assert counts[-1] == 1
    assert t.resident_sites_per_unit(228 * 1024, 4, 4) == 0  # over the per-block maximum
    # With shared memory to spare, registers cap it: 64 per thread (one fragment's 12 + 52), 2048 per warp, 8 warps
    # a block: 65536 // 16384 = 4 blocks (threads alone would allow 2048 / 256 = 8).
    assert t.registers_per_thread(1) == 64
    assert t.resident_sites_per_unit(1024, 1, 1) == 4
    # sm_86 has 4 warps a block and 1536 threads an SM: threads allow 12, registers 65536 // 8192 = 8.
    assert spatialc.target("sm_86").resident_sites_per_unit(1024, 1, 1) == 8
    # The estimate grows by 12 a fragment a warp holds, and stops at the 255 a thread can address.
    assert [t.registers_per_thread(8 * f) for f in (2, 4, 16, 32)] == [76, 100, 244, 255]
    # A big accumulator costs registers: fewer blocks fit.
    assert t.resident_sites_per_unit(1024, 8, 8, (2, 2)) < t.resident_sites_per_unit(1024, 1, 1)

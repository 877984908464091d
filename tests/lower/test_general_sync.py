"""Sites that hand over to each other: hand-written programs with a group barrier or a semaphore handshake, which
only the general form prints — a cooperative launch of blocks that all run at once, in the emulation too — and what
goes wrong when they cannot."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.ir.ids import LV_ITEM, GroupId, SemId, Site
from spatialc.ir.nodes import Engine, Group, Semaphore
from spatialc.ir.ops import Barrier, Loop, SemInc, SemWait
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.errors import NeedsGeneral, Unsupported
from spatialc.runtime import launch as L
from spatialc.runtime.emulate import EmulationError, EmulationFault, EmulationTimeout

from ..rewrite import edit
from ..stand_in import CooperativeStandIn, StandInDevice, product

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
RNG = np.random.default_rng(5)
INPUTS = {
    "A": RNG.integers(-128, 128, (64, 64)).astype(np.int8),
    "B": RNG.integers(-128, 128, (64, 64)).astype(np.int8),
}


def with_barrier(
    p, engine: Engine = Engine.WRITER, members: int | None = None, crossing: tuple[int, ...] | None = None
):
    """`p` with a group of its first `members` sites (all) and a Barrier of it at the end of each item of `engine`,
    on the `crossing` sites (all)."""
    n = len(p.placement.items_of_site)
    group = Group(GroupId(0), tuple(Site(s) for s in range(members or n)))
    q = p.evolve(placement=dataclasses.replace(p.placement, groups=(group,)), verified=False)

    def add(ops):
        if not any(isinstance(op, Loop) and op.var == LV_ITEM for op in ops):  # a site's only item: after it
            return (*ops, Barrier(GroupId(0))) if ops else ops
        return tuple(
            Loop(op.var, op.count, (*op.body, Barrier(GroupId(0))))
            if isinstance(op, Loop) and op.var == LV_ITEM
            else op
            for op in ops
        )

    return edit(q, engine, add, None if crossing is None else tuple(Site(s) for s in crossing))


def handshake(p, waiter: int = 1):
    """`p` with a semaphore: site 0's writer adds 1 to site `waiter`'s copy when it has stored all its items, and
    site `waiter`'s reader waits for it before it reads anything."""
    q = p.evolve(semaphores=(Semaphore(SemId(0), "done0"),), verified=False)
    q = edit(q, Engine.WRITER, lambda ops: (*ops, SemInc(SemId(0), Site(waiter), 1)), sites=(Site(0),))
    return edit(q, Engine.READER, lambda ops: (SemWait(SemId(0), 1), *ops), sites=(Site(waiter),))


@pytest.fixture(scope="module")
def program():
    """64³ int8, 16 one-tile items on 4 sites; each site's writer waits for every site after each item."""
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=4)
    return spatialc.verify(with_barrier(base))


def test_a_barrier_verifies_only_where_every_site_crosses_it_as_often():
    uneven = spatialc.build(spatialc.gemm(64, 48, 64, "int8"), "sm_86", block=(1, 1, 1), sites=5)  # 12 items
    with pytest.raises(spatialc.DeadlockError):
        spatialc.verify(with_barrier(uneven))


def test_only_the_general_form_prints_a_barrier_as_a_cooperative_launch(program):
    with pytest.raises(NeedsGeneral, match="a group barrier: the persistent kernel's blocks never wait on each other"):
        spatialc.lower(program, form="persistent")
    art = spatialc.lower(program)
    ls = art.launch
    assert art.budget.form == "general" and ls.cooperative and ls.sync == (0, 0, 0, 0) and ls.per_sm == 0
    assert ls.sites(132) == ls.sites(1) == ls.grid == 4  # the sites do not follow the device: they name each other
    assert "int* __restrict__ spatialc_sync)" in art.kernel_cu
    assert art.kernel_cu.count("spatialc_grid_add(spatialc_sync + 0 + site, 1);") == 1
    assert "spatialc_engine_sync(3, 32);" in art.kernel_cu  # the writer, third engine, one warp
    assert "cudaLaunchCooperativeKernel(spatialc_general, dim3(GRID)" in art.program_cu
    assert "cudaOccupancyMaxActiveBlocksPerMultiprocessor" in art.program_cu
    assert art.census.agrees and art.census.program["Barrier"] == 1


def test_a_barrier_crossed_by_some_sites_only_is_printed_for_those_sites():
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=4)
    # Sites outside the group may not cross its barrier: verify refuses that.
    with pytest.raises(spatialc.VerifyError, match="site 2 is not in group 0"):
        spatialc.verify(with_barrier(base, members=2))
    p = spatialc.verify(with_barrier(base, members=2, crossing=(0, 1)))
    art = spatialc.lower(p)
    assert "__device__ const int spatialc_site_class[4] = {0, 0, 1, 1};" in art.kernel_cu
    # Only the engine whose program differs by class (compute crosses the barrier) branches on it; the others run
    # alike everywhere and are printed once.
    assert art.kernel_cu.count("if (spatialc_site_class[site] == 0) {  // sites 0, 1") == 1
    assert art.launch.sync == (0, 0, 0, 0) and art.launch.per_sm == 0 and art.census.agrees
    assert art.census.program["Barrier"] == 1 and "for (int s = 0; s < 2; ++s)" in art.kernel_cu


def test_a_semaphore_handshake_is_printed_with_its_initial_value():
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=2)
    p = spatialc.verify(handshake(base))
    with pytest.raises(NeedsGeneral, match="a semaphore handshake"):
        spatialc.lower(p, form="persistent")
    art = spatialc.lower(p)
    assert art.budget.form == "general" and art.launch.cooperative and art.launch.sync == (0, 0)
    assert "spatialc_grid_add(spatialc_sync + 0 + 1, 1);" in art.kernel_cu
    assert "spatialc_grid_wait(spatialc_sync + 0 + site, 1);" in art.kernel_cu
    assert art.census.agrees and art.census.program["SemInc"] == art.census.program["SemWait"] == 1
    started = spatialc.verify(p.evolve(semaphores=(Semaphore(SemId(0), "done0", initial=3),), verified=False))
    assert spatialc.lower(started).launch.sync == (3, 3)
    assert "static const int sync_init[] = {3, 3};" in spatialc.lower(started).program_cu


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
def test_blocks_that_wait_on_each_other_run_at_once_and_equal_the_interpreter(program, mode):
    # Run one block after another, block 0 would wait at its first barrier for sites that never start.
    c = spatialc.emulate(spatialc.lower(program), INPUTS, mode=mode, timeout=60)
    np.testing.assert_array_equal(c, spatialc.evaluate(program, INPUTS))


@emulation
@pytest.mark.emulation
def test_an_arrival_at_the_wrong_sites_count_is_a_hang_the_watchdog_names(program):
    art = spatialc.lower(program)
    text = art.program_cu.replace(
        "spatialc_grid_add(spatialc_sync + 0 + site, 1);", "spatialc_grid_add(spatialc_sync, 1);"
    )
    assert text != art.program_cu
    with pytest.raises(EmulationTimeout) as info:
        spatialc.emulate(dataclasses.replace(art, program_cu=text), INPUTS, timeout=6)
    report = str(info.value)
    assert "TIMEOUT: no progress" in report and "waits for the count at global" in report
    assert "to reach 1 (it is 0)" in report and "waits at named barrier 3 (bar.sync)" in report


@emulation
@pytest.mark.emulation
def test_a_device_that_cannot_hold_every_site_refuses_before_launching():
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=16)
    p = spatialc.verify(with_barrier(base))
    art = spatialc.lower(p)
    # One emulated SM holds 2048 / 192 = 10 blocks of this kernel; its 16 sites need all of theirs at once.
    with pytest.raises(EmulationFault, match=r"the 16 sites of this kernel wait on each other.*holds 10 \(1 SMs x 10"):
        spatialc.emulate(art, INPUTS, sms=1, timeout=30)
    np.testing.assert_array_equal(spatialc.emulate(art, INPUTS, sms=2, timeout=60), spatialc.evaluate(p, INPUTS))


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
def test_a_handshake_and_a_partial_barrier_equal_the_interpreter(mode):
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=4)
    for p in (
        spatialc.verify(handshake(base, waiter=3)),
        spatialc.verify(with_barrier(base, members=2, crossing=(0, 1))),
    ):
        c = spatialc.emulate(spatialc.lower(p), INPUTS, mode=mode, timeout=60)
        np.testing.assert_array_equal(c, spatialc.evaluate(p, INPUTS))


@emulation
@pytest.mark.emulation
def test_a_semaphore_added_at_the_wrong_site_is_a_hang_the_watchdog_names():
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=2)
    art = spatialc.lower(spatialc.verify(handshake(base)))
    right = "spatialc_grid_add(spatialc_sync + 0 + 1, 1);"
    text = art.program_cu.replace(right, "spatialc_grid_add(spatialc_sync + 0 + 0, 1);")
    assert text != art.program_cu
    with pytest.raises(EmulationTimeout) as info:
        spatialc.emulate(dataclasses.replace(art, program_cu=text), INPUTS, timeout=6)
    report = str(info.value)
    assert "waits for the count at global" in report and "to reach 1 (it is 0)" in report
    assert "Threads of block 1:" in report


def test_the_launcher_zeroes_the_counts_launches_cooperatively_and_refuses_too_few_resident_blocks(program):
    art = spatialc.lower(program)
    dev = CooperativeStandIn(art, product, sms=4, per_sm=1)
    prep = L.prepare(art, dev)
    assert prep.grid == 4 and prep.sync is not None and prep.sync.shape == (4,)
    prep.sync[:] = 7  # a previous launch's counts
    out = prep.output_buffer()
    ins = [prep.tiled(a, INPUTS[a.name]) for a in prep.args if a.role == "input"]
    prep.run(prep.order(ins, out))
    ((grid, counts),) = dev.cooperative
    assert grid == 4 and not counts.any() and dev.launches
    np.testing.assert_array_equal(prep.result(out), INPUTS["A"].astype(np.int64) @ INPUTS["B"])
    with pytest.raises(L.LaunchError, match="the 4 sites of this kernel wait on each other.*holds 2 \\(2 SMs x 1"):
        L.prepare(art, CooperativeStandIn(art, product, sms=2, per_sm=1))
    plain = StandInDevice(art, product, sms=132)
    with pytest.raises(L.LaunchError, match="cannot launch a kernel whose sites wait on each other"):
        L.run_with(plain, art, INPUTS["A"], INPUTS["B"])
    assert EmulationError  # the emulation's errors are a family of their own, checked above


def test_a_barrier_two_engines_of_one_site_cross_is_refused_by_name():
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=2)
    both = with_barrier(with_barrier(base), engine=Engine.READER)
    with pytest.raises(Unsupported, match="a barrier of group 0 crossed by two engines of site 0"):
        general.lower(both.evolve(verified=True), spatialc.target("sm_86"))


@emulation
@pytest.mark.emulation
def test_the_emulated_cooperative_launch_itself_refuses_a_grid_the_device_cannot_hold():
    base = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=16)
    art = spatialc.lower(spatialc.verify(with_barrier(base)))  # 16 sites; one emulated SM holds 10
    lines = art.program_cu.split("\n")
    check = next(i for i, line in enumerate(lines) if "(long long)sms_here * per_sm < GRID" in line)
    unchecked = "\n".join([*lines[:check], "if (false) {", *lines[check + 1 :]])  # the host's own check gone
    with pytest.raises(EmulationFault, match="cooperative launch refused: 16 blocks, and the device holds 10 at once"):
        spatialc.emulate(dataclasses.replace(art, program_cu=unchecked), INPUTS, sms=1, timeout=30)

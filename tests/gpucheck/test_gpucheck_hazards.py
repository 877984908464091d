"""The hazards an expert read found in the GPU check before its first H200 run (issue 36, section 1), each with the
test that fails where its fix is missing: cluster kernels sized past what the device holds at once, a preflight that
is not the kernel it vouches for, semaphore words reset from a host copy inside a CUDA graph, builds that fight the
GPU thread for the GIL, hangs that cost a minute each; and a cooperative grid CuPy would shrink instead of refusing."""

from __future__ import annotations

import time
from pathlib import Path

from spatialc.gpucheck import builds as B
from spatialc.gpucheck import device as D
from spatialc.gpucheck.cases import Case, Deadline, kernel_path

from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture
from .test_gpucheck_restart_faults import by_name, supervise, workers

# ---- hazard 5: hangs that cost a minute each ------------------------------------------------------------------------


def test_a_wait_is_called_a_hang_after_seconds_not_a_minute():
    # The longest legitimate wait of a check launch is well under a second; a minute a hang is a quarter of the
    # budget, twice over when one handshake bug hangs in two rows.
    runner = D.GpuRunner.__new__(D.GpuRunner)  # no GPU: only its limit is asked
    assert 10.0 <= runner._hang(Deadline(1e9, lambda: 0.0)) <= 15.0
    assert runner._hang(Deadline(1.0, lambda: 0.0)) == D.HANG_MIN_S  # never shorter, the budget nearly spent


def test_a_forms_cluster_kernels_are_blamed_together_whatever_their_groups_shape():
    shapes = [Case(4096, 4096, 4096, "bf16", multicast=g) for g in ((2, 1), (2, 2), (1, 2))]
    assert len({kernel_path(c, "spatialc sm90a") for c in shapes}) == 1
    assert kernel_path(shapes[0], "spatialc sm90a") != kernel_path(Case(4096, 4096, 4096, "bf16"), "spatialc sm90a")


def test_one_multicast_hang_costs_one_restart_not_one_a_group_shape(fake_gpu, monkeypatch, tmp_path, capsys):
    # The general form's handshake hangs in every cluster kernel: the 2×1 row loses the GPU once, and the 2×2 row
    # after it runs without the form's cluster kernels instead of hanging again (which spent the second restart).
    hang = ("hang", "256x256", "spatialc_general")
    run_worker, seen = workers(fake_gpu, monkeypatch, [hang, hang, hang])
    status, header, rows = supervise(tmp_path, run_worker, ["mc2x1:256", "mc2x2:256", "48"])
    assert seen == [3, 1], (seen, header.get("restarts"))
    assert len(header["restarts"]) == 1 and "spatialc general (multicast)" in header["restarts"][0]
    for row in rows[:2]:
        general = by_name(row)["spatialc general"]
        assert general["note"].startswith("unavailable: lost the GPU on row 1/3"), general["note"]
    assert by_name(rows[2])["spatialc general"]["ok"]  # the plain general form is not a cluster kernel
    capsys.readouterr()


# ---- hazard 3: semaphore words reset from a host copy inside a CUDA graph ------------------------------------------


def _handover_prepared(fake_cp, state, art):
    """`art` prepared on the stand-in device with the stand-in kernel, which hangs on sync words not reset."""
    from spatialc.runtime import launch as L

    from .test_gpucheck_fakes import FakeDevice, FakeKernel, _Loading

    ls = art.launch
    kernel = FakeKernel(fake_cp, L.kernel_args(ls), None, ls.kernel_name, ls.dyn_smem, ls.sync, ls.trip_error)
    return L.prepare(art, _Loading(FakeDevice(fake_cp, state), kernel))


def test_a_captured_launch_resets_its_sync_words_on_the_device_at_every_replay(monkeypatch):
    # CuPy stages a host-to-device copy inside a capture through a pinned buffer it recycles afterwards, so a graph
    # that resets semaphores from host bytes replays stale ones: the reset must be a device-to-device copy.
    import numpy as np

    import spatialc

    from .test_gpucheck_fakes import FakeCupy, FakeEvent

    monkeypatch.setattr(FakeEvent, "hang", False)
    cp = FakeCupy()
    art = spatialc.lower(spatialc.build(spatialc.gemm(64, 64, 512, "bf16"), "sm_90", split_k=2))
    assert art.launch.sync and art.launch.cooperative  # split-K's semaphores
    prep = _handover_prepared(cp, {"grids": []}, art)
    ins = [prep.tiled(x, np.zeros(x.elems, np.uint16)) for x in prep.args if x.role == "input"]
    args = prep.order(ins, prep.output_buffer())
    stream = cp.cuda.Stream()
    stream.begin_capture()
    prep.run(args)  # captured: the reset and the kernel, nothing run yet
    graph = stream.end_capture()
    for _ in range(3):
        graph.launch(stream)
        assert not FakeEvent.hang  # each replay's kernel found its words at their initial values
    assert np.array_equal(prep.sync, np.asarray(art.launch.sync) + 1)  # the last replay's kernel moved them on


# ---- also: a cooperative grid CuPy would shrink, and a device that cannot say what it holds -----------------------


class _CupyFunction:
    """A cupy.cuda.Function as `cupy/cuda/function.pyx` launches one cooperatively: where its own count of resident
    blocks falls short of the grid it warns and launches fewer blocks, instead of refusing."""

    ptr = 0  # its CUfunction, which the occupancy is asked of

    def __init__(self, resident):
        self.resident, self.launched = resident, []

    def __call__(self, grid, block, args, shared_mem=0, stream=None, enable_cooperative_groups=False):
        import warnings

        blocks = grid[0]
        if enable_cooperative_groups and blocks > self.resident:
            warnings.warn(
                f"The grid size will be reduced from {blocks} to {self.resident}, as the specified grid size exceeds"
                " the limit.",
                stacklevel=2,
            )
            blocks = self.resident
        self.launched.append(blocks)


class _CupyKernel:
    """What a RawModule's get_function gives (`cupy/_core/raw.pyx`): a RawKernel, whose call passes its module's
    `enable_cooperative_groups` to the Function itself — so a caller's own flag is a TypeError (CuPy 14 on the
    first GPU run: "function() got multiple values for keyword argument 'enable_cooperative_groups'")."""

    enable_cooperative_groups = False

    def __init__(self, resident):
        self.kernel = _CupyFunction(resident)

    @property
    def launched(self):
        return self.kernel.launched

    def __call__(self, grid, block, args, **kwargs):
        self.kernel(grid, block, args, enable_cooperative_groups=self.enable_cooperative_groups, **kwargs)


def _cupy(sms, per_sm):
    from types import SimpleNamespace as NS

    def occupancy(func, block, smem):
        if per_sm is None:
            raise RuntimeError("cuOccupancyMaxActiveBlocksPerMultiprocessor: not supported")
        return per_sm

    device = NS(attributes={"MultiProcessorCount": sms}, compute_capability="90")
    return NS(cuda=NS(Device=lambda *a: device, driver=NS(occupancyMaxActiveBlocksPerMultiprocessor=occupancy)))


def test_the_cupy_device_refuses_a_cooperative_grid_cupy_would_shrink():
    import pytest

    from spatialc.runtime import launch as L

    device = L.CupyDevice(_cupy(sms=132, per_sm=1))
    fits = _CupyKernel(resident=132)
    device.launch_cooperative(fits, 132, 256, 0, ())
    assert fits.launched == [132]
    with pytest.raises(L.LaunchError, match="the 133 sites of this kernel wait on each other"):
        device.launch_cooperative(_CupyKernel(resident=132), 133, 256, 0, ())  # our own count refuses it first
    shrinks = _CupyKernel(resident=128)  # CuPy counts fewer than the occupancy we were told: its warning is fatal
    with pytest.raises(L.LaunchError, match="CuPy: The grid size will be reduced from 132 to 128"):
        device.launch_cooperative(shrinks, 132, 256, 0, ())
    assert shrinks.launched == []  # nothing ran with a shrunk grid
    unknown = _CupyKernel(resident=132)
    with pytest.raises(L.LaunchError, match="does not say how many of its blocks it holds"):
        L.CupyDevice(_cupy(sms=132, per_sm=None)).launch_cooperative(unknown, 132, 256, 0, ())
    assert unknown.launched == []


def _split_k_program():
    import spatialc

    p = spatialc.build(spatialc.gemm(32, 32, 8192, "bf16"), "sm_90")
    assert p.placement.splits > 1  # the planner splits K over sites that wait on each other
    return p


def _split_k():
    import spatialc

    return spatialc.lower(_split_k_program())


def test_a_split_k_launch_is_refused_where_the_device_cannot_say_how_many_blocks_it_holds():
    import pytest

    from spatialc.runtime import launch as L

    art = _split_k()

    class Device:
        xp = __import__("numpy")
        sms = 132

        def __init__(self, per_sm):
            self.per_sm = per_sm

        def load(self, *a):
            return "kernel"

        def occupancy(self, kernel, block, dyn_smem):
            return self.per_sm

        def launch_cooperative(self, *a):
            raise AssertionError("launched")

    assert L.prepare(art, Device(4)).grid == art.launch.grid
    with pytest.raises(L.LaunchError, match="does not say how many of its blocks it holds"):
        L.prepare(art, Device(None))


def test_a_split_k_row_runs_cooperatively_in_the_gpu_check_and_is_refused_without_an_occupancy(fake_gpu, tmp_path):
    # The GPU check's device (cuda.PreparedDevice) passes the cooperative launch and the occupancy through to
    # CuPy's: without them every split-K row failed ("this device cannot launch … cooperatively").
    from .test_gpucheck_device import run

    status, header, rows = run(tmp_path / "a", "--sizes", "32x32x8192", "--precisions", "bf16")
    general, hopper = rows[0]["by_name"]["spatialc general"], rows[0]["by_name"]["spatialc sm90a"]
    assert status == 0 and general["ok"] and general["check"]["correct"], general["note"]
    assert hopper["ok"] and hopper["check"]["correct"], hopper["note"]  # the sm_90a form splits K as many ways
    import spatialc

    splits = _split_k_program().placement.splits
    sm90a = spatialc.lower(spatialc.build(spatialc.gemm(32, 32, 8192, "bf16"), "sm_90a", split_k=splits))
    assert sm90a.budget.form == "sm90a" and sm90a.launch.cooperative
    assert set(fake_gpu["cooperative"]) == {_split_k().launch.grid, sm90a.launch.grid}
    fake_gpu["per_sm"] = None  # the driver gives no occupancy: refused, not risked
    status, header, rows = run(tmp_path / "b", "--sizes", "32x32x8192", "--precisions", "bf16")
    general = rows[0]["by_name"]["spatialc general"]
    assert status == 1 and "does not say how many of its blocks it holds" in general["note"], general["note"]


# ---- hazard 4: builds that fight the GPU thread for the GIL --------------------------------------------------------


def test_on_a_gpu_the_builds_plan_and_lower_in_processes_of_their_own(fake_gpu, monkeypatch):
    # In a thread of the timing process, 47 cases' planning and lowering (about 40 CPU-seconds) held the GIL while
    # the first rows were timed end to end. The runner's pool builds in processes: a build_case patched here to fail
    # is not the one that runs, and what comes back is the very build this process would have made.
    monkeypatch.setattr(D, "BUILD_IN_PROCESSES", True)
    runner = D.GpuRunner("sm_90", workers=1)
    pool = runner.builds
    assert pool.processes is not None
    case = Case(64, 64, 64, "int8")
    here = B.build_case(case, "sm_90")

    def not_here(case, target):
        raise AssertionError("built in the timing process")

    monkeypatch.setattr(B, "build_case", not_here)
    try:
        pool.start([case], Deadline(time.monotonic() + 120, time.monotonic))
        built = pool.result(case, Deadline(time.monotonic() + 120, time.monotonic))
    finally:
        pool.close()
    assert not built.error, built.error
    assert built.plan == here.plan
    assert [f.name for f in built.forms] == [f.name for f in here.forms]
    for mine, theirs in zip(built.forms, here.forms, strict=True):
        assert (mine.artifact is None) == (theirs.artifact is None)
        if mine.artifact is not None:
            assert mine.artifact.kernel_cu == theirs.artifact.kernel_cu


def test_a_closed_pool_leaves_no_build_process_behind():
    pool = B.BuildPool("sm_90", "sm_90", workers=1, processes=True)
    case = Case(64, 64, 64, "fp16")
    pool.start([case], Deadline(time.monotonic() + 120, time.monotonic))
    pool.result(case, Deadline(time.monotonic() + 120, time.monotonic))
    workers_ = list(pool.processes._processes.values())
    assert workers_
    pool.close()
    end = time.monotonic() + 60  # killed: it ends as soon as the kernel gets to it (a loaded machine took 10 s once)
    while any(_running(w) for w in workers_) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(_running(w) for w in workers_)


def _running(worker) -> bool:
    """Whether a worker process still runs: by the kernel's word where there is /proc (a killed process another
    thread has reaped, or one dead and not yet reaped, runs no more — though `is_alive` of a Process whose child
    another thread reaped answers True for ever), else by `is_alive`."""
    try:
        stat = Path(f"/proc/{worker.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return worker.is_alive()
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# ---- hazard 2: a preflight that is not the kernel it vouches for ---------------------------------------------------


def test_the_sm90a_preflight_kernel_is_the_plan_the_large_rows_run():
    from spatialc.gpucheck import builds as B
    from spatialc.gpucheck import preflight as pf
    from spatialc.gpucheck.cases import DEFAULT_SIZES, cases_of

    cases = cases_of(DEFAULT_SIZES, ["int8", "fp16", "bf16"])
    probe = pf.hopper_case(cases)
    (form,) = B.build_case(probe, "sm_90").forms
    large = next(f for f in B.build_case(cases[2], "sm_90").forms if f.name == "sm90a")  # bf16 4096³
    assert cases[2].precision == "bf16" and (cases[2].m, cases[2].k) == (4096, 4096)
    for f in (form, large):  # 128×256 items, K steps of 128-byte panels, B MN-major (a padded K × N matrix)
        assert f.facts["block"] == "8×16×4", f.facts["own_plan"]
        assert [m.swizzle for m in f.artifact.launch.tensor_maps][:2] == [128, 128]
        assert [p.order for p in f.artifact.launch.params[:2]] == ["rows", "rows"]
    assert form.artifact.launch.items == 4  # on a 2 × 2 grid of items: a quick launch
    assert (
        pf.spatialc_step("sm90a", probe) == "spatialc sm90a kernel: bf16 256x512x256 (128×256 items, 128-byte panels)"
    )
    int8 = pf.hopper_case(cases_of(["64"], ["int8"]))
    assert int8.hopper_block == (8, 16, 8)  # 128 int8 a K step: one 128-byte panel


def test_a_wrong_preflight_kernel_marks_its_form_and_every_row_still_runs_it(fake_gpu, tmp_path, capsys):
    from .test_gpucheck_device import probes, run

    fake_gpu["fault"] = ("miss", "256x512", "spatialc_hopper")  # the sm90a form's preflight kernel misses an element
    status, header, rows = run(tmp_path, "--sizes", "32", "--precisions", "bf16")
    step = probes(header)["spatialc sm90a kernel"]
    assert step["ok"] and step["marked"] and step["detail"].startswith("wrong result: max err nan, 1 element")
    hopper = rows[0]["by_name"]["spatialc sm90a"]
    assert status == 0 and hopper["ok"] and hopper["check"]["correct"], hopper["note"]  # its row's own C is right
    assert hopper["facts"]["preflight"].startswith("its preflight kernel (bf16 256x512x256) was wrong")
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| spatialc sm90a kernel: bf16 256x512x256 (128×256 items, 128-byte panels) | wrong, kept |" in md
    assert "- bf16 32x32x32 sm90a: its preflight kernel (bf16 256x512x256) was wrong" in md
    capsys.readouterr()


def test_the_graph_step_replays_the_cluster_kernel(fake_gpu, tmp_path, capsys):
    # The multicast rows' kernels are cluster kernels, timed in graphs too: the preflight's graph step replays one.
    from .test_gpucheck_device import probes, run

    status, header, rows = run(tmp_path, "--sizes", "32", "--precisions", "bf16")
    assert status == 0 and probes(header)["spatialc general kernel in clusters"]["ok"]
    graphs = probes(header)["CUDA graphs"]
    assert graphs["ok"] and "spatialc general (multicast)" in graphs["detail"], graphs["detail"]
    assert header["kernel_timing"] == "CUDA graphs"
    capsys.readouterr()


# ---- hazard 1: clusters that cannot all be resident ----------------------------------------------------------------


def test_a_board_holds_fewer_clusters_at_once_than_its_sms_divided_by_their_size():
    import spatialc

    h200 = spatialc.target("sm_90")
    assert [h200.clusters_at_once(n) for n in (2, 4, 8)] == [66, 30, 16]  # not 132 / 4 = 33
    assert h200.clusters_at_once(3) == 30 and h200.clusters_at_once(6) == 16  # held as often as the next size up
    assert h200.clusters_at_once(4, per_unit=2) == 60 and h200.clusters_at_once(1) is None
    assert spatialc.target("sm_90a").clusters_at_once(4) == 30 and spatialc.target("sm_86").clusters_at_once(4) is None


def test_multicast_groups_are_no_more_clusters_than_the_board_holds_at_once():
    # 2×2 groups of one-block-an-SM sites on 132 SMs were 33 clusters of 4, of which the first GPU run's H100 held
    # 30: the rest would run in a second wave, and the row would measure that.
    import spatialc

    gemm = spatialc.gemm(4096, 4096, 4096, "bf16")
    for target in ("sm_90", "sm_90a"):
        p = spatialc.build(gemm, target, multicast=(2, 2))
        sites = len(p.placement.items_of_site)
        assert sites == 120 and len(p.placement.groups) == 4 * 30, (target, sites)  # two rows, two columns each
    assert len(spatialc.build(gemm, "sm_90", multicast=(2, 1)).placement.items_of_site) == 132  # 66 of 2 fit


def test_the_dry_run_shows_no_plan_of_more_clusters_than_the_board_holds(capsys, monkeypatch):
    import re

    from spatialc.gpucheck import dryrun
    from spatialc.gpucheck.cases import DEFAULT_SIZES, cases_of
    from spatialc.runtime import nvcc

    monkeypatch.setattr(nvcc, "find_nvcc", lambda: None)
    sizes = [s for s in DEFAULT_SIZES if s.startswith("mc")]
    dryrun.dry_run(cases_of(sizes, ["bf16"]), "sm_90")
    said = re.findall(r"(\d+) clusters of \dx?×?\d sites \(H100/H200: (\d+) at once", capsys.readouterr().out)
    assert len(said) == 2 * len(sizes)  # the general form's plan and the sm_90a form's, each row
    assert all(int(launched) <= int(held) for launched, held in said), said


def _mc_artifact():
    import spatialc

    return spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16"), "sm_90", multicast=(2, 2)))


class _ClusterDevice:
    """A device whose driver says how many clusters of a kernel it holds at once."""

    xp = __import__("numpy")
    sms = 132

    def __init__(self, held):
        self.held, self.asked = held, []

    def load(self, *a):
        return "kernel"

    def clusters_at_once(self, kernel, grid, block, dyn_smem):
        self.asked.append((grid, block, dyn_smem))
        return self.held


def test_the_launcher_refuses_more_clusters_than_the_driver_says_the_device_holds():
    import pytest

    from spatialc.runtime import launch as L

    art = _mc_artifact()
    ls = art.launch
    assert ls.cluster == 4 and ls.grid == 120
    fits = _ClusterDevice(30)
    assert L.prepare(art, fits).clusters_held == 30 and fits.asked == [(120, ls.block, ls.dyn_smem)]
    with pytest.raises(L.LaunchError, match=r"launches 30 thread-block clusters of 4 sites.*holds 28 at once"):
        L.prepare(art, _ClusterDevice(28))  # a chip whose GPCs hold fewer: refused, naming sites=112
    assert L.prepare(art, _ClusterDevice(None)).clusters_held is None  # no answer: the plan's table stands


def test_the_cluster_question_goes_to_the_driver_as_cuda_h_lays_it_out():
    import ctypes

    from spatialc.runtime import launch as L

    class Libcuda:
        def cuOccupancyMaxActiveClusters(self, count, function, config):  # noqa: N802 - the driver's name
            cfg = ctypes.cast(config, ctypes.POINTER(L.LaunchConfig)).contents
            self.seen = (function.value, cfg.gridDimX, cfg.gridDimY, cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs)
            ctypes.cast(count, ctypes.POINTER(ctypes.c_int)).contents.value = 32
            return self.code

    lib = Libcuda()
    lib.code = 0
    assert L.max_active_clusters(lib, 0x1234, 128, 384, 230400) == 32
    assert lib.seen == (0x1234, 128, 1, 384, 230400, 0)
    assert ctypes.sizeof(L.LaunchConfig) == 56  # CUlaunchConfig on a 64-bit host
    lib.code = 1  # CUDA_ERROR_INVALID_VALUE: no answer
    assert L.max_active_clusters(lib, 0x1234, 128, 384, 230400) is None

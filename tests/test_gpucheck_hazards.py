"""The hazards an expert read found in the GPU check before its first H200 run (issue 36, section 1), each with the
test that fails where its fix is missing: cluster kernels sized past what the device holds at once, a preflight that
is not the kernel it vouches for, semaphore words reset from a host copy inside a CUDA graph, builds that fight the
GPU thread for the GIL, hangs that cost a minute each; and a cooperative grid CuPy would shrink instead of refusing."""

from __future__ import annotations

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

"""Timing without a GPU: batches between one pair of marks, graph replays and their fallback, the L2 rotation, and
the result check by output type. A fake timer keeps a simulated device clock that each launch advances."""

from __future__ import annotations

import numpy as np
import pytest

from spatialc.errors import SpatialError
from spatialc.gpucheck.agreement import agrees, check_result
from spatialc.gpucheck.timing import GraphUnavailable, copies_for, measure
from spatialc.runtime.tilize import bf16_bits, poison_value, tilize


class FakeTimer:
    """A simulated device clock: each launch advances it by the launch's duration; marks read it."""

    def __init__(self):
        self.now = 0.0
        self.waits = []

    def mark(self):
        return self.now

    def elapsed_s(self, start, end):
        return end - start

    def wait(self, mark, limit_s):
        self.waits.append(limit_s)

    @staticmethod
    def host_clock():
        """The host's clock for a fake host that issues launches instantly: it stands still (the real clock would
        make the host look as slow as the machine running the tests is loaded)."""
        return 0.0


def fake_launches(timer, durations):
    seen = []

    def launch(i):
        seen.append(i)
        timer.now += durations(len(seen), i)

    return launch, seen


class FakeGraphs:
    """Captures a batch by running it once with the launches recorded, and replays it."""

    def __init__(self, refuse=""):
        self.refuse, self.captured = refuse, []

    def capture(self, batch):
        if self.refuse:
            raise GraphUnavailable(self.refuse)
        self.captured.append(batch)
        return batch


def test_batches_between_one_pair_of_marks_and_the_median_per_launch():
    timer = FakeTimer()
    # 0.5 ms a launch, one slow outlier batch: the median ignores it
    launch, seen = fake_launches(timer, lambda n, i: 0.05 if n == 40 else 5e-4)
    t = measure(
        launch, 3, timer, clock=timer.host_clock, warmup=2, min_reps=10, max_reps=40, batch_s=2e-3, target_s=0.04
    )
    assert t.method == "events" and t.per_batch == 4  # 2 ms batches of 0.5 ms launches
    assert t.reps == 20  # 40 ms of 2 ms batches, within [10, 40]
    assert t.median_s == pytest.approx(5e-4) and t.max_s > 1e-3
    assert len(seen) == 2 + 3 + 20 * 4  # warm-up, the probe over every copy, the batches
    assert seen[5:13] == [0, 1, 2, 0, 1, 2, 0, 1]  # batches rotate on over the copies
    assert t.host_s is not None and not t.launch_bound  # the fake host issues instantly


def test_a_slow_kernel_gets_one_launch_a_batch_and_at_least_min_reps():
    timer = FakeTimer()
    launch, seen = fake_launches(timer, lambda n, i: 2.0)
    t = measure(launch, 2, timer, clock=timer.host_clock, min_reps=10, target_s=0.3)
    assert t.reps == 10 and t.per_batch == 1 and t.median_s == 2.0


def test_graphs_replay_a_batch_over_every_copy():
    timer, graphs = FakeTimer(), FakeGraphs()
    launch, seen = fake_launches(timer, lambda n, i: 1e-4)
    t = measure(launch, 50, timer, clock=timer.host_clock, graphs=graphs, min_reps=10, max_reps=10, batch_s=2e-3)
    assert t.method == "graph" and t.per_batch == 50  # 20 launches would fill 2 ms; every copy is in the graph
    assert t.median_s == pytest.approx(1e-4) and t.host_s is None
    assert len(graphs.captured) == 1


def test_a_graph_that_cannot_be_captured_is_timed_launch_by_launch_and_says_why():
    timer = FakeTimer()
    launch, _ = fake_launches(timer, lambda n, i: 1e-3)
    t = measure(
        launch,
        2,
        timer,
        clock=timer.host_clock,
        graphs=FakeGraphs(refuse="operation not permitted when stream is capturing"),
    )
    assert t.method == "events" and t.median_s == pytest.approx(1e-3)
    assert t.note == "graph capture failed (GraphUnavailable: operation not permitted when stream is capturing); " + (
        "timed launch by launch"
    )


def test_a_host_slower_than_the_device_is_launch_bound():
    timer = FakeTimer()
    host = [0.0]
    launch, _ = fake_launches(timer, lambda n, i: 1e-5)

    def clock():
        host[0] += 1e-5  # every clock reading costs 10 µs of host time: as slow as the launches
        return host[0]

    def slow_launch(i):
        clock()
        launch(i)

    t = measure(slow_launch, 2, timer, clock=clock, min_reps=10, max_reps=10)
    assert t.launch_bound


def test_timing_refuses_a_zero_time():
    timer = FakeTimer()
    launch, _ = fake_launches(timer, lambda n, i: 0.0)
    with pytest.raises(SpatialError, match="did nothing"):
        measure(launch, 2, timer)


def test_rotation_outgrows_the_l2_cache_within_limits():
    l2 = 50 << 20
    assert copies_for(256 << 20, l2) == 2  # big inputs: two sets are enough
    assert copies_for(1 << 20, l2) == 150  # 3 × L2 of 1 MiB sets
    assert copies_for(1 << 10, l2) == 512  # tiny inputs: capped
    assert copies_for(3 << 30, l2, cap_bytes=2 << 30) == 2


# ---- checking a result -----------------------------------------------------------------------------------------


def poisoned_output(c, storage, tiles):
    """The tiled buffer a kernel would leave: C written, padding written as zero."""
    return tilize(c.astype(storage), tiles, np)


def test_int_check_is_exact_and_counts_poison():
    ref = np.arange(12, dtype=np.float64).reshape(3, 4) - 5
    for elem in ("int32", "int64"):
        c = ref.astype(elem)
        out = poisoned_output(c, elem, (1, 1))
        good = check_result(c, ref, out, elem, np)
        assert good.correct and good.max_abs == 0 and good.unwritten == 0 and good.pad_unwritten == 0
        off = c.copy()
        off[1, 2] += 1
        assert not check_result(off, ref, out, elem, np).correct
        hole = c.copy()
        hole[2, 3] = poison_value(elem)
        bad = check_result(hole, ref, poisoned_output(hole, elem, (1, 1)), elem, np)
        assert not bad.correct and bad.unwritten == 1


def test_poison_left_in_the_padding_is_reported_but_c_is_still_right():
    ref = np.ones((3, 4))
    c = ref.astype(np.float32)
    out = poisoned_output(c, "float32", (1, 1))
    out[255] = np.nan  # a padding element the kernel never wrote
    check = check_result(c, ref, out, "float32", np)
    assert check.correct and check.pad_unwritten == 1 and check.unwritten == 0


@pytest.mark.parametrize(("elem", "close", "far"), [("float32", 1e-7, 1e-3), ("float16", 3e-4, 5e-3)])
def test_float_check_tolerance_follows_c_s_type(elem, close, far):
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((32, 32)) * 30
    near, off = (ref * (1 + close)).astype(elem), (ref * (1 + far)).astype(elem)
    out = poisoned_output(near, elem, (2, 2))
    assert check_result(near, ref, out, elem, np).correct
    assert not check_result(off, ref, out, elem, np).correct
    nan = near.copy()
    nan[0, 0] = np.nan
    check = check_result(nan, ref, poisoned_output(nan, elem, (2, 2)), elem, np)
    assert not check.correct and check.unwritten == 1 and check.nonfinite == 1


def test_bf16_results_are_checked_as_values_not_bits():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((32, 48)) * 10
    bits = bf16_bits(ref.astype(np.float32), np)  # rounded once to bf16: within its tolerance
    out = poisoned_output(bits, "uint16", (2, 3))
    assert check_result(bits, ref, out, "bfloat16", np).correct
    assert agrees(bits, "bfloat16", ref, np) == (True, pytest.approx(np.max(np.abs(ref)) * 2**-8, rel=1))
    doubled = bf16_bits((ref * 1.012).astype(np.float32), np)
    assert not check_result(doubled, ref, out, "bfloat16", np).correct
    assert agrees(doubled, "bfloat16", ref, np, library=True)[0]  # the libraries' bar is looser: 2e-2
    holed = bits.copy()
    holed[0, 0] = poison_value("uint16")
    assert check_result(holed, ref, poisoned_output(holed, "uint16", (2, 3)), "bfloat16", np).unwritten == 1

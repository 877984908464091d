"""Timing launches on a device without timing the launching: the GPU-free part.

One launch of a small product takes a few microseconds, as long as the host takes to issue it, so timing each
launch between its own pair of events measures the host. Instead every contestant is timed alike: batches of many
launches, each batch between one pair of events, and the median batch divided by its launches. For "kernel only"
the batch is captured once as a CUDA graph and replayed (`Graphs`), which takes the host out altogether; where a
capture fails the batch is issued launch by launch and the timing says so. The inputs rotate over several copies
so that the L2 cache does not flatter a small product. The device clock (`Timer`) and the graphs are injected:
CUDA events and CuPy's stream capture on a GPU, a simulated clock in the tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import SpatialError
from .cases import Timing, one_line

BATCH_S = 2e-3  # device time one batch should take at least …
MAX_PER_BATCH = 1000  # … with no more launches than this
TARGET_S = 0.2  # device time one timing should take in all …
MIN_REPS = 10  # … with at least this many batches …
MAX_REPS = 100  # … and at most this many


class Timer(Protocol):
    """Device-side timestamps: `mark` records one on the stream, `wait` blocks (within a limit) until it passes."""

    def mark(self) -> Any: ...

    def elapsed_s(self, start: Any, end: Any) -> float: ...

    def wait(self, mark: Any, limit_s: float) -> None: ...


class GraphUnavailable(Exception):
    """A batch could not be captured as a CUDA graph (the message says why)."""


class Graphs(Protocol):
    """Captures a batch of launches once; the returned function replays it (asynchronously)."""

    def capture(self, batch: Callable[[], None]) -> Callable[[], None]: ...


def measure(
    launch: Callable[[int], None],
    copies: int,
    timer: Timer,
    *,
    graphs: Graphs | None = None,
    clock: Callable[[], float] = time.perf_counter,
    warmup: int = 2,
    target_s: float = TARGET_S,
    min_reps: int = MIN_REPS,
    max_reps: int = MAX_REPS,
    batch_s: float = BATCH_S,
    max_per_batch: int = MAX_PER_BATCH,
    limit_s: float = 60.0,
) -> Timing:
    """The median device time of one `launch(i)`, i cycling over `copies` input sets.

    Warm-up first; then one probe batch estimates a launch; then batches of enough launches to last `batch_s`,
    replayed as a graph when `graphs` is given (and the capture works), each between one pair of marks, at least
    `min_reps` of them and more up to about `target_s` of device time (or of host time, where the host takes longer
    to issue the launches than the device to run them)."""
    for i in range(max(1, warmup)):
        launch(i % copies)
    probe = max(1, min(copies, 8))
    t0 = clock()
    start = timer.mark()
    for i in range(probe):
        launch(i % copies)
    end = timer.mark()
    host_once = (clock() - t0) / probe
    timer.wait(end, limit_s)
    once = timer.elapsed_s(start, end) / probe
    per_batch = max(1, min(max_per_batch, math.ceil(batch_s / once))) if once > 0 else max_per_batch
    batch, per_batch, method, note = _batch(launch, copies, per_batch, graphs)
    if method == "graph":
        batch(0)  # the first replay uploads the graph
    # As many batches as fill `target_s` of device time, or of host time where issuing takes longer.
    cost = per_batch * (once if method == "graph" else max(once, host_once))
    reps = max(min_reps, min(max_reps, round(target_s / cost))) if cost > 0 else min_reps
    marks, host = [], []
    for r in range(reps):
        t0 = clock()
        s = timer.mark()
        batch(r)
        marks.append((s, timer.mark()))
        host.append(clock() - t0)
    timer.wait(marks[-1][1], limit_s + reps * per_batch * max(once, 0.0))
    times = sorted(timer.elapsed_s(s, e) / per_batch for s, e in marks)
    median = _median(times)
    if median <= 0:
        raise SpatialError(f"the timer measured {median} s; a launch that did nothing?")
    host_s = _median(sorted(host)) / per_batch if method == "events" else None
    return Timing(median, reps, per_batch, times[0], times[-1], method, host_s, note)


def _batch(
    launch: Callable[[int], None], copies: int, per_batch: int, graphs: Graphs | None
) -> tuple[Callable[[int], None], int, str, str]:
    """One batch as a function of the batch's number, with its launch count, how it is issued and why not as a
    graph: a graph replay when one can be captured (then over every copy at least once, so that replays rotate the
    inputs too), else the launches one by one, rotating on from batch to batch."""

    def issue(r: int) -> None:
        for j in range(per_batch):
            launch((r * per_batch + j) % copies)

    if graphs is None:
        return issue, per_batch, "events", ""
    n = max(per_batch, min(copies, MAX_PER_BATCH))

    def captured() -> None:
        for j in range(n):
            launch(j % copies)

    try:
        replay = graphs.capture(captured)
    except GraphUnavailable as e:
        return issue, per_batch, "events", f"graph capture failed ({one_line(e)}); timed launch by launch"
    return (lambda r: replay()), n, "graph", ""


def _median(xs: list[float]) -> float:
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def copies_for(set_bytes: int, l2_bytes: int, *, cap_bytes: int = 2 << 30, most: int = 512) -> int:
    """How many input sets to rotate so that one pass over them is at least three times the L2 cache."""
    want = math.ceil(3 * l2_bytes / max(set_bytes, 1))
    return max(2, min(most, want, max(2, cap_bytes // max(set_bytes, 1))))

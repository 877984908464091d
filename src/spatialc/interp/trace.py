"""What `evaluate(..., trace=True)` records, so a tool can draw a site's timeline without running it again.

Time is in logical ticks, as soon as possible: an op starts when its engine's previous op ended, and ends
`op_ticks(op)` after that start — or one tick after what it waited for happened, if later (the Pop that freed the
pages a Reserve takes, the Push that published the pages a Wait needs, the last change of the semaphore a SemWait
reads, the last arrival at a Barrier). An op's ticks are a coarse cost: one per tile it moves (ReadTiles,
WriteTiles, PackAcc), one per tile product (MatmulTiles), one for anything else. A ring has one producer and one
consumer, so these ticks do not depend on how the interpreter interleaved the engines (semaphores written by
several engines excepted). A ring's occupancy is sampled after every Reserve / Push / Wait / Pop, in tick order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.ops import ChoreoOp, Compute, MatmulTiles, PackAcc, ReadTiles, WriteTiles
from .state import EngineState, Ring, SemCell


@dataclass(frozen=True, slots=True)
class OpSpan:
    """One op one engine ran, from tick `start` (it reached the op) to tick `end` (the op was done)."""

    site: int
    engine: str
    op: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class RingSample:
    """A ring's pages after an op on it: `reserved` (claimed, being filled) and `published` (pushed, not popped)."""

    tick: int
    reserved: int
    published: int

    @property
    def occupied(self) -> int:
        return self.reserved + self.published


@dataclass(frozen=True, slots=True)
class RingTrace:
    site: int
    ring: str
    depth: int
    samples: tuple[RingSample, ...]
    layout: str = "row"  # the ring's page layout (ir.nodes.PageLayout): row, col (K-major) or swizzled


@dataclass(frozen=True, slots=True)
class Trace:
    """Every op span of every engine (in the order they ran) and the occupancy of every ring."""

    spans: tuple[OpSpan, ...]
    rings: tuple[RingTrace, ...]

    @property
    def ticks(self) -> int:
        """The tick the last op ended."""
        return max((s.end for s in self.spans), default=0)

    def engine(self, site: int, engine: str) -> tuple[OpSpan, ...]:
        """One engine's spans, in program order."""
        return tuple(s for s in self.spans if s.site == site and s.engine == engine)

    def ring(self, site: int, name: str) -> RingTrace:
        """One site's ring."""
        return next(r for r in self.rings if r.site == site and r.ring == name)


class Recorder:
    """Collects spans while the program runs."""

    __slots__ = ("spans", "seq")

    def __init__(self) -> None:
        self.spans: list[tuple[int, str, str, int, int]] = []
        self.seq = 0

    def finish(self, rings: list[Ring]) -> Trace:
        """The trace, with each ring's events put in tick order and summed into occupancies."""
        spans = tuple(OpSpan(*s) for s in self.spans)
        return Trace(spans, tuple(_ring_trace(r) for r in rings))


def _ring_trace(r: Ring) -> RingTrace:
    reserved = published = 0
    samples = []
    for tick, _, dr, dp in sorted(r.events):
        reserved, published = reserved + dr, published + dp
        samples.append(RingSample(tick, reserved, published))
    return RingTrace(int(r.site), r.name, r.depth, tuple(samples), r.layout)


def op_ticks(op: ChoreoOp) -> int:
    """The ticks an op that waits for nothing takes."""
    match op:
        case ReadTiles(block_h=bh, block_w=bw) | WriteTiles(block_h=bh, block_w=bw):
            return max(1, bh * bw)
        case Compute(op=MatmulTiles(block=b, sub_blocks=(sh, sw))):
            return max(1, sh * b.osh * sw * b.osw * b.ibw)
        case PackAcc(tiles=n):
            return max(1, n)
    return 1


def span(E: EngineState, i: int, end: int) -> None:
    """Record op i of engine E as running from the engine's clock to `end`, and move the clock there."""
    E.rec.spans.append((int(E.site), E.engine.value, E.code.texts[i], E.clock, end))  # type: ignore[union-attr]
    E.clock = end


def ring_end(E: EngineState, r: Ring, kind: str, n: int) -> int:
    """End tick of a flow op on r; keeps the ring's per-page ticks and records its occupancy change."""
    start = E.clock
    free, pub = r.free_ticks, r.pub_ticks
    assert free is not None and pub is not None
    match kind:
        case "Reserve":
            end = max([start, *(free.popleft() for _ in range(n))]) + 1
            delta = (n, 0)
        case "Push":
            end, delta = start + 1, (-n, n)
            pub.extend([end] * n)
        case "Wait":
            end, delta = max([start, *(pub[k] for k in range(n))]) + 1, (0, 0)
        case _:
            end, delta = start + 1, (0, -n)
            for _ in range(n):
                pub.popleft()
            free.extend([end] * n)
    E.rec.seq += 1  # type: ignore[union-attr]
    r.events.append((end, E.rec.seq, *delta))  # type: ignore[union-attr]
    return end


def stamp(E: EngineState, cells: list[SemCell]) -> int:
    """End tick of an op that changes semaphores (SemSet / SemInc / McastSetValid), stamped on them."""
    for c in cells:
        c.tick = E.clock + 1
    return E.clock + 1


def waited(E: EngineState, tick: int) -> int:
    """End tick of an op that waited for something that happened at `tick` (SemWait, Barrier)."""
    return max(E.clock, tick) + 1

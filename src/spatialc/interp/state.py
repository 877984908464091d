"""Run-time state of the interpreted machine: rings, accumulators, semaphores, barriers, engines.

A ring is a circle of `depth` page slots with three running counts, as the CUDA lowering keeps its slot counters:
`tail` pages ever reserved, `pushed` ever published, `popped` ever freed. So from the front (slot `popped % depth`)
it holds `published = pushed - popped` pages the producer pushed, then `reserved = tail - pushed` pages the
producer claimed and is filling; the rest are free. Producer-side data ops write the newest reserved page (slot
`(tail - 1) % depth`, the one the last Reserve named); consumer-side ops read the front page. Slots keep their
value after a Pop, like memory.

The `*_ticks` fields exist only when tracing; they hold, per page, the logical tick it became free / published.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from ..ir.ids import Site
from ..ir.nodes import Engine

if TYPE_CHECKING:
    from .codegen import Code
    from .machine import Machine
    from .trace import Recorder


class Ring:
    __slots__ = (
        "name",
        "site",
        "depth",
        "page_tiles",
        "tail",
        "pushed",
        "popped",
        "slots",
        "free_ticks",
        "pub_ticks",
        "events",
        "layout",
    )

    def __init__(self, name: str, site: Site, depth: int, page_tiles: int, tracing: bool, layout: str = "row") -> None:
        self.name, self.site, self.depth, self.page_tiles = name, site, depth, page_tiles
        self.layout = layout  # how a page's tiles lie (PageLayout): the interpreter moves whole tiles, the trace says
        self.tail = self.pushed = self.popped = 0
        self.slots: list[object] = [None] * depth
        self.free_ticks: deque[int] | None = deque([0] * depth) if tracing else None
        self.pub_ticks: deque[int] | None = deque() if tracing else None
        self.events: list[tuple[int, int, int, int]] = []  # (tick, seq, Δreserved, Δpublished) when tracing

    @property
    def published(self) -> int:
        return self.pushed - self.popped

    @property
    def reserved(self) -> int:
        return self.tail - self.pushed

    def newest_reserved(self) -> int:
        """Slot index of the most recently reserved page (the caller checks there is one)."""
        return (self.tail - 1) % self.depth

    def front(self) -> int:
        """Slot index of the oldest published page (the caller checks there is one)."""
        return self.popped % self.depth

    def why_blocked(self, kind: str, n: int) -> str:
        """Why a Reserve / Wait of n pages cannot go on."""
        if kind == "Reserve":
            held = self.published + self.reserved
            extra = f"; the ring has only {self.depth}" if n > self.depth else ""
            return (
                f"{self.name}: needs {n} free page(s), but {held} of {self.depth} are held ({self.published}"
                f" published, {self.reserved} reserved{extra})"
            )
        return f"{self.name}: {self.published} of {n} pages published"


class Acc:
    """An accumulator: the A / B pages multiplied into it since it was acquired, and their geometry; or a row
    accumulator's pages and its value carried over a pack or a rescale (`support.row_value`)."""

    __slots__ = (
        "name",
        "tiles",
        "live",
        "a",
        "b",
        "geom",
        "parts",
        "rows",
        "carried",
        "reduction",
        "columns",
        "col_op",
    )

    def __init__(self, name: str, tiles: int) -> None:
        self.name, self.tiles, self.live = name, tiles, False
        self.a: list[object] = []
        self.b: list[object] = []
        self.parts: list[Any] = []  # partial sums added (split-K), in the order they were added
        self.geom: tuple[int, int, int, int, int] | None = None  # h, w, ibw, tile side, int8 elements per step
        # a row reduction's pages: (its op, the page, its rows of tiles, their width in tiles, the columns kept)
        self.rows: list[tuple[str, Any, int, int, int]] = []
        # a row accumulator's value before `rows`, where it was packed or rescaled since it was acquired: float64, one
        # value per row (a column); None: the reduction's identity (−inf for max, 0 for a sum)
        self.carried: Any = None
        self.reduction: str | None = None  # the row reduction the program runs into it (None: a matmul's)
        # a column reduction's pages: (the page, its rows of tiles, their width in tiles, the rows kept), and its op
        self.columns: list[tuple[Any, int, int, int]] = []
        self.col_op: str | None = None


class SemCell:
    """One site's copy of a semaphore; `tick` is the logical tick of its last change (tracing)."""

    __slots__ = ("name", "value", "tick")

    def __init__(self, name: str, value: int) -> None:
        self.name, self.value, self.tick = name, value, 0


class BarrierState:
    """Arrivals per site of a group's barrier, and per crossing the latest arrival tick."""

    __slots__ = ("sites", "count", "ticks")

    def __init__(self, sites: tuple[Site, ...]) -> None:
        self.sites = sites
        self.count = {s: 0 for s in sites}
        self.ticks: dict[int, int] = {}


class EngineState:
    """One engine of one site: its compiled code and the state bound to it, the op it is blocked on, and (when
    tracing) its logical clock and the tick its last Barrier waited for."""

    __slots__ = ("site", "engine", "m", "code", "args", "rec", "clock", "ready", "blocked")

    def __init__(self, site: Site, engine: Engine, m: Machine, rec: Recorder | None) -> None:
        self.site, self.engine, self.m, self.rec = site, engine, m, rec
        self.code: Code = None  # type: ignore[assignment]  # set when the engine is bound
        self.args: list[Any] = []
        self.clock = self.ready = 0
        self.blocked: int | None = None

    @property
    def label(self) -> str:
        return f"site {int(self.site)} {self.engine.value}"

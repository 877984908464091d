"""The semantic rule's run of one engine program (verify/engine.py), its ground floor: the errors it raises at an op,
the pages that move through rings — reserved, filled, pushed, sent, read at the front — and tile addresses as forms
in the engine's symbols. `engine_ops` builds the per-op handlers on it, `engine.EngineRun` the walk."""

from __future__ import annotations

import itertools
import math
from collections import ChainMap
from typing import TypeVar

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, LoopVar, loop_var_name
from ...ir.index import where
from ...ir.nodes import EngineProgram, Tensor
from ...ir.ops import ChoreoOp, Loop, McastSend, Push, TileAddr, Trip, ring_of
from .dataflow import ZERO, Acc, Entry, Seq, SiteRun
from .online import OnlineRun
from .symbolic import WITNESS_LIMIT, Aff, Page, Sym, split

_E = TypeVar("_E", SemanticError, StrongerCheckNeeded)


class EngineRunPages:
    """An engine's run, what every op handler stands on: its state, its errors, its pages and addresses."""

    def __init__(self, site: SiteRun, prog: EngineProgram) -> None:
        self.site, self.index, self.decl = site, site.index, site.decl
        self.engine = prog.engine.value
        self.frames: list[tuple[object, Sym | None, Loop]] = []  # open loops: a token, its symbol, the op
        self.env: dict[LoopVar, Aff] = {}
        self.item: Sym | None = None  # the ITEM loop the engine is in (None: the site's only item)
        self.part: tuple[int, int] | None = None  # that loop's items: (first, count) of the site's list
        self.reserved: dict[BufferId, Seq] = {}
        self.popped: dict[BufferId, Seq] = {}
        self.pending: dict[BufferId, list[list]] = {}  # reserved, unpushed pages: [position, value, filler]
        self.accs: dict[BufferId, Acc] = {}
        self.trips: list[tuple[Trip, Aff, Sym | None]] = []  # the run-time counted loops open here
        self.online: OnlineRun | None = None  # an online softmax's pass being followed (`online`)

    # ---- messages ------------------------------------------------------------------------------------------------

    def head(self, op: ChoreoOp) -> str:
        loops = ", ".join(loop_var_name(lp.var) for _, _, lp in self.frames)
        return f"{where(self.site.site, self.engine)}{f' [in {loops}]' if loops else ''}: {self.index.op(op)}"

    def wrong(self, op: ChoreoOp, why: str, buf: BufferId | None = None) -> SemanticError:
        """The schedule computes something else than the stages declare, at `op`."""
        return self._error(SemanticError, op, why, buf)

    def unsure(self, op: ChoreoOp, why: str, buf: BufferId | None = None) -> StrongerCheckNeeded:
        """The rule cannot follow what `op` does (refused by name, not judged wrong)."""
        return self._error(StrongerCheckNeeded, op, why, buf)

    def _error(self, cls: type[_E], op: ChoreoOp, why: str, buf: BufferId | None) -> _E:
        buf = ring_of(op) if buf is None else buf
        name = None if buf is None else self.index.name(buf)
        text = self.index.op(op)
        return cls(f"{self.head(op)} — {why}", site=int(self.site.site), engine=self.engine, op=text, buffer=name)

    def push(self, op: Push, ring: BufferId, n: int) -> None:
        pages = self.pending.get(ring, [])
        if len(pages) < n:  # rule 5 refuses this first; kept so a page is never invented
            raise self.wrong(op, f"it pushes {n} page(s) of {self.index.name(ring)} with {len(pages)} reserved", ring)
        for at, page, _ in pages[:n]:
            if page is None and ring in self.site.senders:
                page, why = self.site.receive(ring, at)
                if page is None:
                    raise self.unsure(
                        op, f"it publishes page {at.text()} of {self.index.name(ring)}, which {why}", ring
                    )
            self.site.pushed.setdefault(ring, []).append(Entry(at, page, self.engine, op))
        del pages[:n]

    def send(self, op: McastSend, ring: BufferId) -> None:
        """McastSend: the newest reserved page, as it is now, is what the group's other sites receive."""
        pages = self.pending.get(ring)
        sender = self.site.senders.get(ring)
        if sender is not None:
            raise self.unsure(
                op,
                f"it forwards pages of {self.index.name(ring)} that site {int(sender.site)} multicasts here; the"
                " semantic rule follows pages a site sends of what it read itself (no relays)",
                ring,
            )
        if not pages or pages[-1][1] is None:
            raise self.wrong(op, f"it sends a page of {self.index.name(ring)} that nothing filled", ring)
        at, page, _ = pages[-1]
        self.site.sent.setdefault(ring, []).append(Entry(at, page, self.engine, op))

    def fill(self, op: ChoreoOp, buf: BufferId, page: Page) -> None:
        """`page` into the newest reserved page of `buf`'s ring."""
        pages = self.pending.get(self.index.ring(buf))
        if not pages:  # rule 5 refuses this first
            raise self.wrong(op, f"it fills a page of {self.index.name(buf)} it has not reserved", buf)
        sender = self.site.senders.get(self.index.ring(buf))
        if sender is not None:
            raise self.wrong(
                op,
                f"it fills a page of {self.index.name(buf)}, whose pages site {int(sender.site)} multicasts here",
                buf,
            )
        pages[-1][1:] = [page, op]

    def front(self, op: ChoreoOp, buf: BufferId) -> Page:
        """The value of the front page of `buf`'s ring: the page its producer filled at the same position."""
        ring = self.index.ring(buf)
        at = self.popped.get(ring, ZERO)
        entries = self.site.pushed.get(ring, [])
        for entry in entries:
            if entry.seq.shape() != at.shape():
                continue
            if entry.page is None:
                raise self.wrong(
                    op,
                    f"it reads page {at.text()} of {self.index.name(ring)}, which {entry.engine}'s"
                    f" {self.index.op(entry.push)} pushed without anything filling it",
                    buf,
                )
            rename = self.site.renaming(self.site, entry.seq, at)
            return Page(entry.page.rows, entry.page.width, entry.page.cell.subst(rename))
        pushed = "; ".join(sorted({f"{e.seq.text()} by {e.engine}" for e in entries})) or "none"
        raise self.unsure(
            op,
            f"it reads page {at.text()} of {self.index.name(ring)}, and no op fills a page of it at that position in"
            f" the same loops (pages pushed at: {pushed}); the semantic rule matches producer and consumer loop for"
            " loop",
            buf,
        )

    def addr(self, op: ChoreoOp, at: TileAddr) -> Aff:
        """A tile address as a form in this engine's symbols."""
        iy, ix = self.site.item_coords(self.item)
        out = Aff(at.base)
        for var, stride in at.steps:
            if var == LV_ITEM and stride:
                raise self.unsure(
                    op, "its address uses the ITEM loop's index; the semantic rule follows items by item_y / item_x"
                )
            out = out + {LV_ITEM_Y: iy, LV_ITEM_X: ix}.get(var, self.env.get(var, Aff(0))) * stride
        return out

    def tile_of(self, op: ChoreoOp, t: Tensor, flat: Aff, extra: dict[Sym, int]) -> tuple[Aff, Aff]:
        """A flat tile index of `t` as (row, col), or refuse when a step of it crosses rows of the grid."""
        ranges = ChainMap(extra, self.site.ranges)
        rc = split(flat, t.tiles[1], ranges)
        if rc is None:
            raise self.unsure(
                op,
                f"its tiles {flat.text()} step across rows of {t.name}'s grid of {t.tiles[1]} tiles a row"
                f"{self.crossing(flat, t, ranges)}; the semantic rule follows tile rows and columns apart (tile (r, c)"
                f" of {t.name} is r · {t.tiles[1]} + c: is a row step missing?)",
            )
        return rc

    def crossing(self, flat: Aff, t: Tensor, ranges: ChainMap) -> str:
        """Where the tile index lands in another row than its steps say: ', e.g. at k 1, item_x 1: tile 8 is (1, 0)
        of B, not column 8 of row 0', or '' where too many points would have to be listed to find one."""
        syms = sorted(flat.syms(), key=repr)
        if math.prod(ranges[s] for s in syms) > WITNESS_LIMIT:
            return ""
        cols = t.tiles[1]
        row0, col0 = divmod(flat.const, cols)
        steps = {s: divmod(c, cols) for s, c in flat.terms.items()}  # each step: (rows, columns) it moves
        for values in itertools.product(*(range(ranges[s]) for s in syms)):
            point = dict(zip(syms, values, strict=True))
            n = flat.at(point)
            row = row0 + sum(steps[s][0] * v for s, v in point.items())
            moved = col0 + sum(steps[s][1] * v for s, v in point.items())
            if not 0 <= moved < cols:
                where_ = ", ".join(f"{s.label} {v}" for s, v in point.items() if v) or "the start"
                r, c = divmod(n, t.tiles[1])
                return f", e.g. at {where_}: tile {n} is ({r}, {c}) of {t.name}, not column {moved} of row {row}"
        return ""

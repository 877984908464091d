"""verify's rule 8, the proof at a write (verify/semantics.py states the rule), its first half: each item's block of
the output written once, a grouped output's rows as its counts leave them, and the witnesses — concrete items and
tiles — its messages name. `semantics_value` proves the value each tile gets."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import ItemId, Site
from .dataflow import SiteRun, Write
from .partials import Workspace
from .symbolic import WITNESS_LIMIT, Aff, Elem, RowTerm, Sym, TileRef, one_to_one, split


class _WriteProof:
    """The proof at the write, its part that does not follow values: the item's block written once, a grouped
    output's rows, and the witnesses a fault names (`_Proof` adds the value of each tile)."""

    def __init__(
        self,
        site: SiteRun,
        w: Write,
        space: Workspace | None = None,
        owner: Site | None = None,
        counts: Counter | None = None,
    ) -> None:
        self.site, self.w, self.decl = site, w, site.decl
        self.space, self.owner, self.counts = space, owner, counts
        self.ranges = site.ranges
        self.iy, self.ix = site.item_coords(w.item)
        # An item's block of the output: a row vector's output (one value a row) is the band's tile rows alone.
        self.block = (site.block[0], 1) if self.decl.vector else site.block
        self.through: list[tuple[int, str, str]] = []  # the maps and reductions the value being proved went through

    # ---- a grouped GEMM: the rows each group's count leaves ---------------------------------------------------------

    def group_of(self, row: Aff) -> Aff:
        """The group of a tile row of the (stacked) output, as a form."""
        out = self.decl.out
        parts = split(row, out.group_tiles[0], self.ranges)
        if parts is None:
            raise self.unsure(f"its rows {row.text()} cross the groups of {out.name} within a block")
        return parts[0]

    def unsure(self, why: str) -> StrongerCheckNeeded:
        return StrongerCheckNeeded(
            f"{self.w.head} — {why}",
            site=int(self.site.site),
            engine=self.w.engine,
            op=self.site.index.op(self.w.op),
            buffer=self.site.index.buffer_of(self.w.op),
        )

    def rows(self) -> None:
        """A grouped output is written in the loop its group's row count counts — ceil(count / rows a block) blocks
        — and past the count its rows are masked: so for any count, exactly the rows 0 … count − 1 of the group are
        written, each once (coverage above holds at the loop's bound, every row present)."""
        out, op = self.decl.out, self.w.op
        if out.groups == 1:
            if self.w.trips:
                raise self.unsure("it runs in a loop counted at run time, and only a grouped output's rows are")
            return
        if op.rows_from is None:
            raise self.fail(
                f"it writes every row of {out.name}'s groups; a grouped output's rows at or past its group's count"
                " must be left alone (rows_from)"
            )
        group = self.group_of(self.w.row)
        inner = split(self.w.row, out.group_tiles[0], self.ranges)[1]  # type: ignore[index]
        found = [(t, e, s) for t, e, s in self.w.trips if t.tensor == op.rows_from]
        if len(found) != 1 or len(self.w.trips) != 1:
            raise self.unsure(
                f"it writes {out.name} inside {len(self.w.trips)} loop(s) counted at run time; the rule follows one, "
                f"counting its group's rows from {self.site.index.tensors[op.rows_from].name}"
            )
        trip, element, sym = found[0]
        if element != group:
            raise self.fail(
                f"its loop counts rows of group {element.text()} ({self.site.index.tensors[trip.tensor].name}), but"
                f" it writes group {group.text()}"
            )
        tile = self.site.index.p.tile.rows
        step = trip.per // tile
        rest = inner - (Aff.of(sym, inner.coef(sym)) if sym is not None else Aff(0))
        ok = (
            trip.per % tile == 0
            and (sym is None or inner.coef(sym) == step)
            and one_to_one(rest, self.ranges) == (0, step)
            and trip.bound * trip.per >= out.elems[0]
        )
        if not ok:
            raise self.fail(
                f"its loop runs ceil(count / {trip.per}) times, at most {trip.bound}, and writes tile rows"
                f" {inner.text()} of the group: the blocks it writes must be {trip.per} rows each, one after"
                f" another from row 0, and reach the group's {out.elems[0]} rows"
            )

    # ---- witnesses, for messages ----------------------------------------------------------------------------------

    def base(self, item: ItemId | None = None) -> dict[Sym, int]:
        """Values for the item symbols: the coordinates of `item` (default: the site's first)."""
        items = self.w.items(self.site.items)  # (the items of the write's ITEM loop)
        if item is None:
            item = items[0] if items else ItemId(0)
        y, x = divmod(int(item), self.site.grid[1])
        values = {s: y for s in self.iy.syms()}
        values.update({s: x for s in self.ix.syms()})
        return values

    def item_text(self, values: dict[Sym, int]) -> str:
        """'item 5 (y 1, x 2)', and the site that holds it where that is not the site the message names (one run
        of a site's programs stands for every site that runs the same ones)."""
        y = self.iy.at(values)
        x = self.ix.at(values)
        item = y * self.site.grid[1] + x
        text = f"item {item} (y {y}, x {x})"
        if ItemId(item) in self.site.items:
            return text
        p = self.site.index.p
        holders = [int(s) for s, items in (p.placement.items_of_site if p.placement else ()) if ItemId(item) in items]
        return f"{text} of site {holders[0]} (whose programs are site {int(self.site.site)}'s)" if holders else text

    def tile_text(self, values: dict[Sym, int]) -> str:
        return f"{self.decl.out.name} tile ({self.w.row.at(values)}, {self.w.col.at(values)})"

    def differ(self, pairs: Sequence[tuple[Aff, Aff]], syms: set[Sym]) -> dict[Sym, int]:
        """Values (the site's first item, one symbol at 1 at most) where some pair of forms differs."""
        base = self.base()
        for sym in (None, *sorted(syms, key=repr)):
            values = dict(base)
            if sym is not None:
                values[sym] = 1
            if any(x.at(values) != y.at(values) for x, y in pairs):
                return values
        return base

    def fail(self, why: str, *reads: object) -> SemanticError:
        """The fault, at the write; `reads`: the tiles (TileRefs) whose reads it is about, and the maps and row
        reductions (Elem cells, RowTerms), named too."""
        origins = (getattr(r, "origin", None) for r in reads if isinstance(r, TileRef | Elem | RowTerm))
        related = tuple(dict.fromkeys(o for o in (*origins, *self.through) if o is not None))
        return SemanticError(
            f"{self.w.head} — {why}",
            site=int(self.site.site),
            engine=self.w.engine,
            op=self.site.index.op(self.w.op),
            buffer=self.site.index.buffer_of(self.w.op),
            related=related,
        )

    # ---- each item's block written once ------------------------------------------------------------------------

    def coverage(self) -> None:
        h, w = self.block
        r, c = self.w.row - self.iy * h, self.w.col - self.ix * w
        domain = (set(self.w.loops) - {self.w.item}) | self.w.block[0].syms() | self.w.block[1].syms()
        item_syms = self.iy.syms() | self.ix.syms()
        free = (r.syms() | c.syms()) - domain
        ok = (
            not free
            and not (r.syms() & c.syms())
            and r.syms() | c.syms() == domain
            and one_to_one(r, self.ranges) == (0, h)
            and one_to_one(c, self.ranges) == (0, w)
        )
        if not ok:
            raise self.fail(self.coverage_fault(domain, item_syms))

    def coverage_fault(self, domain: set[Sym], item_syms: set[Sym]) -> str:
        """What goes wrong, named by a concrete tile of a concrete item where the sample allows."""
        rows, cols = self.block
        syms = sorted(domain, key=repr)
        items = list(self.site.witnesses) or [ItemId(0)]
        if math.prod(self.ranges[s] for s in syms) * len(items) <= WITNESS_LIMIT:
            for item in items:
                fault = self.item_fault(self.base(item), syms)
                if fault is not None:
                    return fault
        extra = sorted(((self.w.row.syms() | self.w.col.syms()) - domain - item_syms), key=repr)
        if extra:
            return f"the C tile it writes depends on {', '.join(s.label for s in extra)}"
        return (
            f"it writes C tile rows {self.w.row.text()} and columns {self.w.col.text()}; each item must write its"
            f" own {rows}x{cols}-tile block exactly once"
        )

    def item_fault(self, base: dict[Sym, int], syms: list[Sym]) -> str | None:
        """The first tile of the item at `base` written twice, outside its block, or never (None: all well)."""
        rows, cols = self.block
        y, x = self.iy.at(base), self.ix.at(base)
        block = set(itertools.product(range(y * rows, (y + 1) * rows), range(x * cols, (x + 1) * cols)))
        seen: Counter[tuple[int, int]] = Counter()
        for combo in itertools.product(*(range(self.ranges[s]) for s in syms)):
            values = base | dict(zip(syms, combo, strict=True))
            seen[(self.w.row.at(values), self.w.col.at(values))] += 1
        who = self.item_text(base)
        for (r, c), n in sorted(seen.items()):
            if (r, c) not in block:
                return (
                    f"{who} writes {self.decl.out.name} tile ({r}, {c}), outside its block of tile rows"
                    f" {y * rows}..{(y + 1) * rows - 1}, columns {x * cols}..{(x + 1) * cols - 1}"
                )
            if n > 1:
                return f"{self.decl.out.name} tile ({r}, {c}) is written {n} times by {who}"
        missing = sorted(block - set(seen))
        name = self.decl.out.name
        return f"{name} tile ({missing[0][0]}, {missing[0][1]}) is never written (it is {who}'s)" if missing else None

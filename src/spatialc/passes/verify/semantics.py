"""verify's rule 8, semantics: the schedule computes what the stages declare.

The stages declare a function: C = e_n(…e_1(A @ B)) for a GEMM whose epilogue stages e_i follow the matmul
(`declared` refuses any other pipeline). The rule proves that running the schedule
gives exactly that, tile by tile: every tile of C is written once, by the item that owns it, with the declared
epilogue — each op equal to its stage's, in stage order, a bias at the tile's own column — applied to
Σ_k A[i, k]·B[k, j] over every k of K exactly once, A and B in their roles. Along the way: the accumulator is zeroed
before its first product and read only after its last, and no page is read that nothing filled.

How, without enumerating tiles or iterations. Each engine is run once, symbolically: a loop's variable is a symbol
ranging over its iterations, an item's coordinates are symbols over the grid, a tile's place in a block is a pair
of symbols. A ReadTiles fills its page with the formula "tile (row, col) of T", rows and columns affine in those
symbols; a matmul adds "Σ_{k-loop, kk} A-tile × B-tile" to its accumulator; PackAcc and the epilogue ops wrap the
formula; the WriteTiles finally says which tile of C receives which formula. Pages travel through rings in FIFO
order: the n-th page a producer reserves is the n-th page its consumer pops, and since rules 3–5 have shown every
ring to have one producer and one consumer that move equal pages per co-iterating loop, a page's position is an
affine form in the loops around its Reserve (and around the consumer's read), which is matched loop for loop. At
the write, the proof is a handful of comparisons of affine forms: the A tile's row is the C tile's row, the B tile's
column is its column, A's k-tile is B's, the k-tiles run one to one over 0..N-1 (a mixed-radix check on their
coefficients), and the write's (row, column) run one to one over each item's block. Together with rule 2 (every
item on exactly one site, each site's ITEM loop over exactly its items), every tile of C is written exactly once.

What it does not follow — and refuses with StrongerCheckNeeded rather than guess: loops whose trip count is read
from data (the result would depend on the data), multicast (pages crossing sites), a producer and consumer whose
loops around a ring differ in shape, pages whose layout a consumer reads differently, a matmul of two computed
operands.

A matmul may multiply one computed operand — a page an elementwise chain filled from another matmul's accumulator
(an MLP's gelu(X @ W1) @ W2). Its products then hold the computed tile's formula in place of a tensor tile; the
proof takes the k-tile from the tensor operand, shows the k-tiles whole as above, and then proves the computed tile
at (row, k) or (k, column) the way it proves a tile of C: its chain op for op, its own sum over its own K.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import BufferId, GroupId, ItemId, SemId, Site
from ...ir.index import ProgramIndex
from ...ir.nodes import ComputeStage, EngineProgram, ReadStage, Stage
from ...ir.ops import (
    Attention,
    ChoreoOp,
    Compute,
    Dequant,
    Loop,
    Map,
    MatmulTiles,
    McastSend,
    McastSetValid,
    ReadTiles,
    RowReduce,
    SemInc,
    Trip,
    VecAxis,
    cols,
    rewrite,
    walk,
)
from ...ir.printer import compute_text
from .attention import check_attention
from .blockscale import check_term
from .dataflow import Declared, MatmulDecl, SiteRun, Write, same_op
from .declared import declared_outputs
from .facts import Programs
from .handshake import multicast_senders
from .partials import Workspace, check_handshake, item_values, raises
from .symbolic import (
    WITNESS_LIMIT,
    AccSum,
    Aff,
    Cell,
    Copy,
    Elem,
    Partial,
    Product,
    RowTerm,
    RowVec,
    Sym,
    TileRef,
    one_to_one,
    split,
)

ENUM_LIMIT = 1 << 22  # k-tiles listed when interleaved products are not one mixed radix (an unrolled K loop)


# ---- the rule ----------------------------------------------------------------------------------------------------


def check_semantics(index: ProgramIndex, programs: Programs) -> None:
    """Rule 8 for every distinct set of site programs."""
    p = index.p
    if p.placement is None or p.schedule is None or p.plan is None:
        return  # nothing is computed yet
    for prog in programs.distinct():
        _followable(index, prog)
    if any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Attention) for s in p.stages):
        check_attention(index, programs)  # its own proof: the online recurrence (verify/attention.py)
        return
    for decl in declared_outputs(index):  # each output proved apart: its own formula, its own writes
        _check_output(index, programs, decl)


def _check_output(index: ProgramIndex, programs: Programs, decl: Declared) -> None:
    """Rule 8 for one output: every site's run, the proof at each of its writes."""
    p = index.p
    assert p.placement is not None and p.schedule is not None
    items = dict(p.placement.items_of_site)
    senders = multicast_senders(index, p.schedule.programs)  # (rule 7 has refused two senders into one ring)
    keys = _keys(programs, senders)
    shared: dict[tuple[object, ...], list[ItemId]] = {}
    for site, key in keys.items():
        shared.setdefault(key, []).extend(items.get(site, ()))
    idle: dict[tuple[object, ...], Site] = {}  # per set of programs, a site that runs it holding no item
    for site in sorted(keys):
        if not items.get(site):
            idle.setdefault(keys[site], site)
    first: dict[tuple[object, ...], Site] = {}
    for site in sorted(keys):
        first.setdefault(keys[site], site)
    made: dict[Site, tuple[SiteRun, Write | None]] = {}

    def run_of(site: Site, chain: tuple[Site, ...] = ()) -> SiteRun:
        """The site's run, after the runs of the sites that multicast into it."""
        if site not in made:
            if site in chain:
                raise StrongerCheckNeeded(
                    f"sites {', '.join(str(int(s)) for s in chain)} multicast pages to each other in a cycle; the"
                    " semantic rule follows pages sent from a site that read them",
                    site=int(site),
                )
            run = SiteRun(index, decl, site, programs.by_site[site], items.get(site, ()), _sample(shared[keys[site]]))
            run.senders = {ring: run_of(s, (*chain, site)) for ring, s in senders.get(site, {}).items()}
            made[site] = (run, run.run())
        return made[site][0]

    runs: list[tuple[SiteRun, Write | None]] = []
    for site in first.values():
        run_of(site)
        runs.append(made[site])
    _multicast_items(index, senders, {s: made[first[keys[s]]][0] for s in keys})
    if decl.out.groups > 1:
        _grouped_reads(index, decl, [w for _, w in runs if w is not None])
    space, counts = None, Counter[tuple[Site, SemId]]()
    if decl.split is not None:
        counts = raises(index)
        classes = {key: tuple(s for s in sorted(keys) if keys[s] == key) for key in shared}
        space = Workspace(index, [(run, classes[keys[run.site]]) for run, _ in runs])
        _one_writer_per_item(index, keys, runs)
    for run, write in runs:
        if write is None:
            continue
        other = idle.get(keys[run.site])
        if other is not None:  # it runs the same programs, so it writes the same tiles again
            raise SemanticError(
                f"{write.head} — site {int(other)} holds no item, yet runs site {int(run.site)}'s programs, which write"
                f" {decl.out.name}: each tile is written once, by the site that holds its item",
                site=int(other),
                engine=write.engine,
                op=index.op(write.op),
                buffer=index.buffer_of(write.op),
            )
        if space is None or not _has_partials(write.cell):
            _Proof(run, write).check()
            continue
        # A split owner: its sum is completed by other sites' partials, found item by item.
        _Proof(run, write).coverage()
        _Proof(run, write).rows()
        for site in sorted(s for s in keys if keys[s] == keys[run.site]):
            for item in items.get(site, ()):
                values = item_values(run, write.item, item)
                fixed = dataclasses.replace(
                    write, row=write.row.subst(values), col=write.col.subst(values), cell=write.cell.subst(values)
                )
                _Proof(run, fixed, space, site, counts).value(fixed.cell, decl.last)


def _grouped_reads(index: ProgramIndex, decl, writes: list[Write]) -> None:
    """A grouped output's row counts are one tensor, which no stage reads: every loop counted at run time counts
    rows with the writes' own count (`_Proof.rows` checks it there), every read of A masks its rows with it, and no
    other read masks anything. (Without these a count, or a mask, taken from another tensor — a bias — would pass
    the proof at the write unseen.)"""
    masks = {w.op.rows_from for w in writes}
    if None in masks:
        return  # `_Proof.rows` refuses an unmasked write by name
    if len(masks) > 1:
        names = ", ".join(sorted(index.tensors[m].name for m in masks if m is not None))
        raise SemanticError(
            f"the output's rows are masked by different tensors at different sites ({names}): a grouped GEMM's row"
            " counts are one tensor"
        )
    (counts,) = masks
    assert counts is not None
    name = index.tensors[counts].name
    for s in index.p.stages:
        op = getattr(s.kind, "op", None)
        reads = (
            {s.kind.tensor}
            if isinstance(s.kind, ReadStage)
            else {c.tensor for c in cols(op.expr)}
            if isinstance(op, Map)
            else set()
        )
        if counts in reads:
            raise SemanticError(
                f"the row counts come from {name}, which stage {s.name} also reads: a grouped GEMM's row counts are a"
                " tensor of their own"
            )
    trips = [t for w in writes for t, _, _ in w.trips]
    if len(set(trips)) > 1:
        raise SemanticError(
            "the output's rows are written in loops counted differently at different sites: a grouped GEMM's rows"
            " are counted one way"
        )
    for prog in index.p.schedule.programs:  # type: ignore[union-attr]
        for op in walk(prog.ops):
            why = None
            if isinstance(op, Loop) and isinstance(op.count, Trip) and trips and op.count != trips[0]:
                t = trips[0]
                shown = f"ceil({index.tensors[t.tensor].name}[…] / {t.per}), at most {t.bound}"
                why = f"its count is not the one the output's rows are written by ({shown})"
            elif isinstance(op, ReadTiles) and op.tensor == decl.a and op.rows_from != counts:
                why = f"it reads {index.tensors[op.tensor].name}'s rows without masking them with {name}"  # type: ignore[index]
            elif isinstance(op, ReadTiles) and op.tensor != decl.a and op.rows_from is not None:
                why = f"it masks rows of {index.tensors[op.tensor].name}, whose rows are not the output's"
            if why is not None:
                raise index.at_op(SemanticError, prog, op, why)


def _has_partials(cell: Cell) -> bool:
    match cell:
        case Elem(inners=inners):
            return any(_has_partials(c) for c in inners)
        case AccSum(terms):
            return any(isinstance(t, Partial) for t in terms)
    return False


def _keys(programs: Programs, senders: dict[Site, dict[BufferId, Site]]) -> dict[Site, tuple[object, ...]]:
    """Which sites the rule follows as one: those whose programs are the same but for the sites their SemIncs raise
    and the groups they multicast to (which compute nothing; split-K's contributors of one split, each raising its
    own owner; the senders of like multicast groups), and whose senders are alike so. The handshakes are checked
    site by site (`partials.check_handshake`, rule 7), with the concrete programs, and the items of each sender and
    receiver by `_multicast_items`."""
    norm: dict[int, int] = {}
    seen: dict[tuple[ChoreoOp, ...], int] = {}

    def anywhere(op: ChoreoOp) -> ChoreoOp:
        if isinstance(op, SemInc):
            return dataclasses.replace(op, at=Site(0))
        if isinstance(op, McastSend | McastSetValid):
            return dataclasses.replace(op, group=GroupId(0))
        return op

    def strip(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
        return rewrite(ops, anywhere)

    out: dict[Site, tuple[object, ...]] = {}
    for site, progs in programs.listed.items():
        key = []
        for q in progs:
            n = programs.number(q.ops)
            if n not in norm:
                norm[n] = seen.setdefault(strip(q.ops), len(seen))
            key.append((q.engine, norm[n]))
        out[site] = tuple(key)
    # A receiver's pages are its senders' (sorted by ring): its key names theirs, so sites alike receive alike.
    return {site: (*key, *((r, out[s]) for r, s in sorted(senders.get(site, {}).items()))) for site, key in out.items()}


def _multicast_items(index: ProgramIndex, senders: dict[Site, dict[BufferId, Site]], runs: dict[Site, SiteRun]) -> None:
    """A received page holds the tiles of the sender's item (its row of A, its column of B): for every receiver,
    every ring it receives and every item it runs, the sender's item in the same place of its ITEM loop agrees with
    the receiver's in the coordinates the page names. (The run of the receiver's programs followed the page with the
    sender's item coordinates renamed to its own; this is what makes the renaming right.)"""
    p = index.p
    assert p.placement is not None and p.plan is not None
    nx = p.plan.placed[1]
    items = dict(p.placement.items_of_site)
    for site, rings in sorted(senders.items()):
        for ring, sender in sorted(rings.items()):
            coords = runs[site].received.get(ring, set())
            mine, theirs = items.get(site, ()), items.get(sender, ())
            for j, (a, b) in enumerate(zip(mine, theirs, strict=False)):
                (ya, xa), (yb, xb) = divmod(int(a), nx), divmod(int(b), nx)
                wrong = [c for c, u, v in (("item_y", ya, yb), ("item_x", xa, xb)) if c in coords and u != v]
                if wrong:
                    name = "row" if wrong[0] == "item_y" else "column"
                    raise SemanticError(
                        f"site {int(site)}: {index.name(ring)} — its item {j} (y {ya}, x {xa}) receives the pages site"
                        f" {int(sender)} multicasts for its item {j} (y {yb}, x {xb}): tiles of another {name} than"
                        " the item needs",
                        site=int(site),
                        buffer=index.name(ring),
                    )


def _one_writer_per_item(
    index: ProgramIndex, keys: dict[Site, tuple[object, ...]], runs: list[tuple[SiteRun, Write | None]]
) -> None:
    """With items on several sites (split-K), exactly one of them writes each item's block of the output."""
    p = index.p
    assert p.placement is not None
    writes = {run.site for run, w in runs if w is not None}
    writing = {keys[s] for s in writes}
    by_item: dict[ItemId, list[Site]] = {}
    for site, items in p.placement.items_of_site:
        if keys.get(site) in writing:
            for item in items:
                by_item.setdefault(item, []).append(site)
    nx = p.plan.grid[1]  # type: ignore[union-attr]
    for i in range(p.plan.items):  # type: ignore[union-attr]
        item = ItemId(i)
        sites = by_item.get(item, [])
        if len(sites) != 1:
            who = f"sites {', '.join(str(int(s)) for s in sites)}" if sites else "no site"
            raise SemanticError(
                f"item {item} (y {item // nx}, x {item % nx}) is written to {index.p.output_tensor().name} by"  # type: ignore[union-attr]
                f" {who}; of the sites an item is split over, exactly one adds up the partial sums and writes it",
                site=int(sites[-1]) if sites else None,
            )


def _sample(items: list[ItemId], n: int = 16) -> tuple[ItemId, ...]:
    """Up to n items spread over `items` (sorted), first and last among them: the witnesses a message may name."""
    items = sorted(items)
    if len(items) <= n:
        return tuple(items)
    return tuple(items[i * (len(items) - 1) // (n - 1)] for i in range(n))


def _followable(index: ProgramIndex, prog: EngineProgram) -> None:
    """Refuse what the rule cannot follow, before following anything."""
    for op in walk(prog.ops):
        why = None
        if isinstance(op, Loop) and isinstance(op.count, Trip) and index.p.plan.groups == 1:  # type: ignore[union-attr]
            why = (
                "its trip count is read from data, so what the program computes would depend on the data; the"
                " semantic rule proves a fixed function of the inputs, or a grouped GEMM's rows counted at run time"
            )
        elif isinstance(op, Compute) and op.acc_reload is not None:
            why = "the semantic rule does not follow an accumulator spilled to a ring and reloaded"
        if why is not None:
            raise index.at_op(StrongerCheckNeeded, prog, op, why)


class _Proof:
    """The proof at the write: each item's block of C written once, each tile with the declared value. For a split
    owner, `space` resolves the partial sums it adds (of the concrete item written by `owner`)."""

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

    def check(self) -> None:
        self.coverage()
        self.rows()
        self.value(self.w.cell, self.decl.last)

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
        items = self.site.items
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

    # ---- the value of each tile --------------------------------------------------------------------------------

    def value(self, cell: Cell, ring: BufferId, at: tuple[Aff, Aff] | None = None, path: str = "") -> None:
        """`cell` is what the stages declare tile `at` (default: the C tile written) of `ring`'s value to be. `path`
        names, for messages, the computed operand the tile is part of."""
        row, col = at or (self.w.row, self.w.col)
        stage = self.decl.producer[ring]
        op = stage.kind.op if isinstance(stage.kind, ComputeStage) else None
        if isinstance(stage.kind, ReadStage):  # a map program's input: the same tile of the tensor read
            self.copied(cell, stage, row, col, path)
        elif isinstance(op, RowReduce):
            self.reduced(cell, stage, row, path)
        elif isinstance(op, MatmulTiles):
            if not isinstance(cell, AccSum):
                raise self.fail(
                    f"{self.tile_text(self.base())}{path} gets {_cell_text(cell)}, not the matmul of stage {stage.name}"
                )
            self.reduction(cell, self.decl.matmuls[stage.id], row, col, path)
        else:  # an elementwise stage: `declared` saw to it that the chain ends in a matmul
            assert op is not None
            if not isinstance(cell, Elem) or not same_op(cell.op, op):
                raise self.fail(
                    f"{self.tile_text(self.base())}{path} gets {_cell_text(cell)} where stage {stage.name} declares"
                    f" {compute_text(op, self.site.index.p)}"
                )
            axes = {c.axis for c in cols(op.expr)} if isinstance(op, Map) else set()
            if isinstance(op, Dequant):  # its scales and zero points at the weights tile's own (group, column)
                axes = {VecAxis.COL, VecAxis.ROW}
            for axis, got, want in ((VecAxis.COL, cell.bias_col, col), (VecAxis.ROW, cell.bias_row, row)):
                if axis in axes and got != want:
                    what = "column" if axis == VecAxis.COL else "row"
                    if got is None:
                        raise self.fail(f"{self.tile_text(self.base())}{path} reads no {what} vector's tile", cell)
                    values = self.differ([(got, want)], set(self.ranges))
                    vector = "bias" if axis == VecAxis.COL else "row vector"
                    if isinstance(op, Dequant):
                        vector = "scale and zero point" if op.zero is not None else "scale"
                    raise self.fail(
                        f"{self.tile_text(values)} ({self.item_text(values)}){path} gets {vector} tile {what}"
                        f" {got.at(values)}, not its own {what} {want.at(values)}",
                        cell,
                    )
            rings = [self.site.index.ring(b) for b in stage.ins]
            if len(cell.inners) != len(rings):
                raise self.fail(
                    f"{self.tile_text(self.base())}{path} gets {_cell_text(cell)} of {len(cell.inners)} page(s)"
                    f" where stage {stage.name} reads {len(rings)}"
                )
            for inner, ring_in in zip(cell.inners, rings, strict=True):
                with self.via(cell.origin):
                    self.value(inner, ring_in, (row, col), path)

    @contextlib.contextmanager
    def via(self, origin: tuple[int, str, str] | None) -> Iterator[None]:
        """Inside: the proof of a value the op `origin` computed (a map, a row reduction); a fault names it too."""
        if origin is not None:
            self.through.append(origin)
        try:
            yield
        finally:
            if origin is not None:
                self.through.pop()

    def copied(self, cell: Cell, stage: Stage, row: Aff, col: Aff, path: str) -> None:
        """A map's input page holds, at C tile (row, col), the same tile of the tensor its read stage reads."""
        tensor = stage.kind.tensor  # type: ignore[union-attr]
        name = self.site.index.tensors[tensor].name
        if not isinstance(cell, Copy) or cell.ref.tensor != tensor:
            raise self.fail(
                f"{self.tile_text(self.base())}{path} maps {_cell_text(cell)} where stage {stage.name} reads {name}"
            )
        ref = cell.ref
        if (ref.row, ref.col) != (row, col):
            values = self.differ([(ref.row, row), (ref.col, col)], set(self.ranges))
            raise self.fail(
                f"{self.tile_text(values)} ({self.item_text(values)}){path} maps {name} tile"
                f" ({ref.row.at(values)}, {ref.col.at(values)}), not its own",
                ref,
            )

    def reduced(self, cell: Cell, stage: Stage, row: Aff, path: str) -> None:
        """A row vector read at tile row `row`: stage `stage`'s reduction of that row — its terms the declared value
        of the ring it reduces at (row, column), the columns 0..N-1 each exactly once, N whole tiles of the row's
        values (the op masks the padding past them)."""
        op = stage.kind.op  # type: ignore[union-attr]
        assert isinstance(op, RowReduce)
        where = f"{self.tile_text(self.base())}{path}"
        if not isinstance(cell, RowVec) or not same_op(cell.op, op):
            raise self.fail(f"{where} reads {_cell_text(cell)} where stage {stage.name} declares {compute_text(op)}")
        (ring,) = stage.ins
        inside = f"{path}, in the row {op.op} of stage {stage.name}"
        spans, total = [], 0
        for t in cell.terms:
            if t.col.syms() - set(t.sums):
                moves = ", ".join(sorted(s.label for s in t.col.syms() - set(t.sums)))
                raise self.fail(
                    f"{where}: the columns stage {stage.name} reduces move with {moves}, a loop that does"
                    " not add into its accumulator"
                )
            with self.via(t.origin):
                self.value(t.cell, self.site.index.ring(ring), (row, t.col), inside)
            spans.append(one_to_one(t.col, self.ranges) if set(t.sums) == t.col.syms() else None)
            total += math.prod(self.ranges[s] for s in t.sums)
        tile = self.site.index.p.tile.cols
        need, most = math.ceil(op.cols / tile), self.decl.row_tiles or self.decl.out.tiles[1]
        end = 0
        for first, count in sorted(x for x in spans if x is not None):
            end = first + count if first == end else -1
        if None in spans or end != total or not need <= total <= most:
            lo = min((t.col.span(self.ranges)[0] for t in cell.terms), default=0)
            hi = max((t.col.span(self.ranges)[1] for t in cell.terms), default=-1)
            got = f"tile columns {lo}..{hi} ({total} tiles)" if cell.terms else "no tile column"
            raise self.fail(
                f"{where}: stage {stage.name}'s row {op.op} reduces {got} of the row; its {op.cols} values need tile"
                f" columns 0..{need - 1} each exactly once",
                *cell.terms,
            )

    def reduction(self, acc: AccSum, mm: MatmulDecl, row: Aff, col: Aff, path: str) -> None:
        """Σ_k A[row, k]·B[k, col] over k = 0..N-1, each k once, with k_need ≤ N ≤ k_max; a computed operand's
        tile (row, k) or (k, col) is followed to the matmul it starts from."""
        index = self.site.index
        ks: list[tuple[Aff, tuple[Sym, ...]]] = []
        top = mm.stage is self.decl.matmul
        mixed: list[tuple[Product, Aff]] = []  # products with a computed operand, followed once K is shown whole
        reads: list[object] = []  # the tiles summed, whose reads a fault in K names
        for t in self.resolved(acc) if top else self.products(acc, path):
            reads += [t.a, t.b]
            if None in mm.operands:
                k = self.k_of(t, mm, path)
                check_term(self, t, mm, row, col, k, path)
                mixed.append((t, k))
                ks.append((k, t.sums))
                continue
            if not isinstance(t.a, TileRef) or not isinstance(t.b, TileRef):
                raise self.fail(
                    f"{self.tile_text(self.base())}{path} sums products of computed tiles; stage {mm.stage.name}"
                    " multiplies tiles read from tensors"
                )
            if (t.a.tensor, t.b.tensor) != mm.operands:
                names = f"{index.tensors[t.a.tensor].name} × {index.tensors[t.b.tensor].name}"
                want = " @ ".join(index.tensors[x].name for x in mm.operands if x is not None)
                raise self.fail(
                    f"{self.tile_text(self.base())}{path} sums tiles of {names}; the matmul stage declares {want}"
                )
            a_name, b_name = index.tensors[t.a.tensor].name, index.tensors[t.b.tensor].name
            for what, got, want_form in ((f"{a_name} row", t.a.row, row), (f"{b_name} column", t.b.col, col)):
                if got != want_form:
                    values = self.differ([(got, want_form)], set(self.ranges))
                    raise self.fail(
                        f"{self.tile_text(values)} ({self.item_text(values)}){path} sums tiles of {what}"
                        f" {got.at(values)}, not {want_form.at(values)}",
                        t.a if what.endswith("row") else t.b,
                    )
            k = t.a.col
            b_k = t.b.row
            if self.decl.out.groups > 1:  # B's rows are stacked: group g's K tiles from g · (its tile rows)
                b = index.tensors[mm.operands[1]]  # type: ignore[index]
                b_k = t.b.row - self.group_of(self.w.row) * b.group_tiles[0]
            if b_k != k:
                values = self.differ([(b_k, k)], set(t.sums))
                raise self.fail(
                    f"{self.tile_text(values)}{path} multiplies A's k-tile {k.at(values)} by B's k-tile"
                    f" {b_k.at(values)}",
                    t.a,
                    t.b,
                )
            self.moves(k, t.sums, path, t.a, t.b)
            check_term(self, t, mm, row, col, k, path)  # a block-scaled product's promotion (verify/blockscale.py)
            ks.append((k, t.sums))
        fault = self.k_fault(ks, mm)
        if fault is not None:
            values = self.base()
            raise self.fail(
                f"{self.item_text(values)}: {self.tile_text(values)}{path} sums {fault} of 0..{mm.k_max - 1};"
                f" K needs 0..{mm.k_need - 1} each exactly once",
                *reads,
            )
        for t, k in mixed:
            self.computed(t, mm, row, col, k, path)

    def k_of(self, t: Product, mm: MatmulDecl, path: str) -> Aff:
        """The k-tile of a product with a computed operand: its tensor operand's (a column of A, a row of B)."""
        if not isinstance(t.a, TileRef) and not isinstance(t.b, TileRef):
            raise self.unsure(f"stage {mm.stage.name} multiplies two computed operands; the rule follows one")
        k = t.a.col if isinstance(t.a, TileRef) else t.b.row  # type: ignore[union-attr]
        self.moves(k, t.sums, path, t.a, t.b)
        return k

    def computed(self, t: Product, mm: MatmulDecl, row: Aff, col: Aff, k: Aff, path: str) -> None:
        """Each operand of a product with a computed operand is the declared tile at k-tile `k`: a tensor's tile
        (row, k) / (k, col), or the computed value's, followed to its own matmul."""
        for i, (x, at) in enumerate(((t.a, (row, k)), (t.b, (k, col)))):
            which = "AB"[i]
            tensor, ring = mm.operands[i], self.site.index.ring(mm.stage.ins[i])
            name = self.site.index.tensors[tensor].name if tensor is not None else None
            if tensor is None and isinstance(x, TileRef):
                raise self.fail(
                    f"{self.tile_text(self.base())}{path} multiplies tiles of {self.site.index.tensors[x.tensor].name}"
                    f" as operand {which} of stage {mm.stage.name}, which declares it computed"
                    f" ({self.site.index.name(ring)})"
                )
            if tensor is not None and (not isinstance(x, TileRef) or x.tensor != tensor):
                got = (
                    "computed tiles"
                    if not isinstance(x, TileRef)
                    else f"tiles of {self.site.index.tensors[x.tensor].name}"
                )
                raise self.fail(
                    f"{self.tile_text(self.base())}{path} multiplies {got} as operand {which} of stage"
                    f" {mm.stage.name}, which declares {name}"
                )
            if isinstance(x, TileRef):
                for what, got_form, want in (("row", x.row, at[0]), ("column", x.col, at[1])):
                    if got_form != want:
                        values = self.differ([(got_form, want)], set(self.ranges))
                        raise self.fail(
                            f"{self.tile_text(values)} ({self.item_text(values)}){path} multiplies {name}'s tile"
                            f" {what} {got_form.at(values)}, not {want.at(values)}",
                            x,
                        )
            else:
                self.value(x, ring, at, f"{path}, in its operand {which} of stage {mm.stage.name}")

    def moves(self, k: Aff, sums: tuple[Sym, ...], path: str, *reads: object) -> None:
        """A product's k-tile moves with its own reduction only."""
        if k.syms() - set(sums):
            moves = ", ".join(sorted(s.label for s in k.syms() - set(sums)))
            raise self.fail(
                f"{self.tile_text(self.base())}{path}: the k-tiles it sums move with {moves}, a loop that does not"
                " add into its accumulator",
                *reads,
            )

    def products(self, acc: AccSum, path: str) -> tuple[Product, ...]:
        """The products of a computed operand's accumulator (split-K's partial sums reach C's only)."""
        if any(isinstance(t, Partial) for t in acc.terms):
            raise self.fail(f"{self.tile_text(self.base())}{path} adds a partial sum into a computed operand")
        return tuple(t for t in acc.terms if isinstance(t, Product))

    def resolved(self, acc: AccSum) -> tuple[Product, ...]:
        """The accumulator's products, each partial sum replaced by the products its writer summed (split-K)."""
        out: list[Product] = []
        for t in acc.terms:
            if isinstance(t, Product):
                out.append(t)
                continue
            if self.space is None or self.owner is None or self.counts is None:
                raise self.fail(f"{self.tile_text(self.base())} adds a partial sum, but no stage declares split-K")
            for products, src in self.space.resolve(self.site, t, self.fail):
                check_handshake(self.site.index, self.owner, src, self.counts)
                out.extend(products)
        return tuple(out)

    def k_fault(self, ks: list[tuple[Aff, tuple[Sym, ...]]], mm: MatmulDecl) -> str | None:
        """What is wrong with the k-tiles the products run over (None: 0..N-1 each once, k_need ≤ N ≤ k_max).

        Each product's k-tile is affine in its own reduction symbols. Where each is one to one onto an interval
        (a mixed radix) the intervals must tile 0..N-1; otherwise — products interleaved, as an unrolled K loop
        makes them — the k-tiles are listed and counted, which is at most N ≤ k_max values."""
        total = sum(math.prod(self.ranges[s] for s in sums) for _, sums in ks)
        lo = min((k.span(self.ranges)[0] for k, _ in ks), default=0)
        hi = max((k.span(self.ranges)[1] for k, _ in ks), default=-1)
        what = f"k-tiles {lo}..{hi} ({total} products)" if ks else "no products"
        if not mm.k_need <= total <= mm.k_max:
            return what
        spans = [one_to_one(k, self.ranges) if set(sums) == k.syms() else None for k, sums in ks]
        if all(span is not None for span in spans):
            end = 0
            for first, count in sorted(span for span in spans if span is not None):
                end = first + count if first == end else -1
            if end == total:
                return None
        if total > ENUM_LIMIT:
            return f"{what} that the rule cannot show distinct without listing more than {ENUM_LIMIT}"
        counts = np.bincount(np.concatenate([self.k_values(k, sums) for k, sums in ks]) - lo)
        if lo == 0 and hi == total - 1 and (counts == 1).all():
            return None
        twice = int(np.argmax(counts > 1)) + lo if (counts > 1).any() else None
        never = int(np.argmax(counts == 0)) + lo if (counts == 0).any() else None
        parts = [f"k-tile {twice} {int(counts[twice - lo])} times" if twice is not None else ""]
        parts.append(f"k-tile {never} never" if never is not None else "")
        return f"{what} ({', '.join(p for p in parts if p) or 'not from 0'})"

    def k_values(self, k: Aff, sums: tuple[Sym, ...]) -> np.ndarray:
        """Every k-tile a product runs over, one per point of its reduction symbols' box."""
        values = np.array([k.const], dtype=np.int64)
        for s in sums:
            values = (values[:, None] + k.coef(s) * np.arange(self.ranges[s], dtype=np.int64)[None, :]).ravel()
        return values


def _cell_text(cell: Cell) -> str:
    match cell:
        case Elem(op=op):
            return compute_text(op)
        case AccSum():
            return "a sum of products"
        case Copy(ref):
            return f"a copy of tensor {int(ref.tensor)}'s tile"
        case RowVec(op=op):
            return f"a row vector ({compute_text(op)})"
    return "?"

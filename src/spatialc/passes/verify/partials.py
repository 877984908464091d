"""Rule 8 across sites: split-K's partial sums, followed from the site that writes them to the site that adds them.

A split item's owner adds pages it read from the workspace tensor (`symbolic.Partial`: "the workspace tile at
(row, col)"). Each such reference is replaced by what was written there — the products another site summed — so
that the owner's sum can be proved to run over every k-tile of K exactly once like any other (`semantics`).

How, for every item of every site concretely (split programs run one wave, so the items are few):

- every workspace write, its item's coordinates put in, writes a rectangle of tiles one to one; no two writes (of
  any sites) touch a tile twice, so each tile holds one value;
- a reference's tiles lie inside one write's rectangle; the write's block symbols are recovered from the reference's
  row and column by reading the rectangle's mixed radix off them (`invert`), which gives the written formula in the
  reader's symbols;
- the value is there when it is read: the reading engine waits, before its first read of the workspace, on a
  semaphore until the count reaches every raise any site makes of its copy, and the writer makes its write visible
  (`WriteBarrier` or `Flush`) and only then raises that copy. The count only rises, so when the wait passes every
  raise has happened, each after its write.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import LV_ITEM, ItemId, SemId, Site
from ...ir.index import ProgramIndex, where
from ...ir.nodes import EngineProgram
from ...ir.ops import Const, Flush, Loop, ReadTiles, SemInc, SemWait, WriteBarrier, walk
from .dataflow import SiteRun, Write
from .symbolic import AccSum, Aff, Partial, Product, Sym, one_to_one
from .wellformed_ops import raise_counts

MAX_SPLIT = 64  # iterations of a loop of partial adds the rule follows one by one


@dataclass(frozen=True, slots=True)
class Written:
    """One workspace write of one item: its tile rectangle, and the run, write and item values it came from."""

    rows: tuple[int, int]  # first row, count
    cols: tuple[int, int]
    run: SiteRun
    write: Write
    values: dict[Sym, Aff]  # the writer's item symbols → the item's coordinates
    sites: tuple[Site, ...]  # the sites of the writer's programs holding this item


def item_values(run: SiteRun, loop: Sym | None, item: ItemId) -> dict[Sym, Aff]:
    """The item symbols of the ITEM loop `loop` (None: the site's only item) → `item`'s coordinates."""
    y, x = divmod(int(item), run.grid[1])
    iy, ix = run.item_coords(loop)
    values = {s: Aff(y) for s in iy.syms()}
    values.update({s: Aff(x) for s in ix.syms()})
    return values


def invert(
    form: Aff, target: Aff, ranges: Mapping[Sym, int], target_ranges: Mapping[Sym, int]
) -> dict[Sym, Aff] | None:
    """The values of `form`'s symbols, as forms in `target`'s, for which `form` equals `target` everywhere on the
    target's box — or None where this reading cannot find them.

    `form` is one to one (a mixed radix of positive place values over its symbols' ranges). Each term and the
    constant of target − form.const go to the digit whose place value divides them; where every digit's form then
    stays in its range (no carry), Σ place·digit is target − const term by term, and the digits are the only ones."""
    digits = sorted(((c, s) for s, c in form.terms.items()), key=lambda cs: -cs[0])
    if any(c <= 0 for c, _ in digits):
        return None
    rest = target - form.const
    const = rest.const
    if const < 0:
        return None
    parts: dict[Sym, Aff] = {s: Aff(0) for _, s in digits}
    for c, s in digits:
        parts[s] = Aff(const // c)
        const %= c
    if const:
        return None
    for sym, coef in rest.terms.items():
        home = next(((c, s) for c, s in digits if coef % c == 0 and abs(coef) // c < ranges[s]), None)
        if home is None:
            return None
        parts[home[1]] = parts[home[1]] + Aff.of(sym, coef // home[0])
    for s, f in parts.items():
        lo, hi = f.span(target_ranges)
        if lo < 0 or hi >= ranges[s]:
            return None
    return parts


class Workspace:
    """Every workspace write of a split program, per item, and the reads' resolution (module docstring)."""

    def __init__(self, index: ProgramIndex, runs: list[tuple[SiteRun, tuple[Site, ...]]]) -> None:
        self.index = index
        split = runs[0][0].decl.split if runs else None
        assert split is not None
        self.tensor = index.tensors[split.work]
        self.written: list[Written] = []
        owner = np.full(self.tensor.tiles, -1, dtype=np.int64)
        items = dict(index.p.placement.items_of_site)  # type: ignore[union-attr]
        for run, sites in runs:
            for w in run.partials:
                idle = [s for s in sites if not items.get(s)]
                if idle:  # its write would land where no item says, unchecked: refused outright
                    raise SemanticError(
                        f"{w.head} — site {int(idle[0])} holds no item, yet runs programs that write the workspace:"
                        " a partial sum is written by a site of the item it belongs to",
                        site=int(idle[0]),
                        engine=w.engine,
                        op=self.index.op(w.op),
                        buffer=self.index.buffer_of(w.op),
                    )
                held: dict[ItemId, list[Site]] = {}
                for site in sites:
                    for item in w.items(items.get(site, ())):
                        held.setdefault(item, []).append(site)
                for item, at in sorted(held.items()):
                    self.add(run, w, item, tuple(at), owner)
        self.owner = owner

    def add(self, run: SiteRun, w: Write, item: ItemId, sites: tuple[Site, ...], owner: np.ndarray) -> None:
        values = item_values(run, w.item, item)
        row, col = w.row.subst(values), w.col.subst(values)
        domain = (set(w.loops) - {w.item}) | w.block[0].syms() | w.block[1].syms()
        rows = one_to_one(Aff(0, row.terms), run.ranges)
        cols = one_to_one(Aff(0, col.terms), run.ranges)
        if rows is None or cols is None or row.syms() & col.syms() or row.syms() | col.syms() != domain:
            raise StrongerCheckNeeded(
                f"{w.head} — it writes workspace tile rows {row.text()} and columns {col.text()}; the semantic rule"
                " follows workspace writes of whole rectangles, each tile once",
                site=int(sites[0]),
                engine=w.engine,
                op=self.index.op(w.op),
                buffer=self.index.buffer_of(w.op),
            )
        r0, c0 = row.const + rows[0], col.const + cols[0]
        box = owner[r0 : r0 + rows[1], c0 : c0 + cols[1]]
        if (box >= 0).any():
            r, c = (int(v) for v in np.argwhere(box >= 0)[0])
            other = self.written[int(box[r, c])]
            raise SemanticError(
                f"{w.head} — workspace tile ({r0 + r}, {c0 + c}) of item {int(item)} is also written by"
                f" {where(other.sites[0], other.write.engine)}: a partial sum is overwritten before it is added",
                site=int(sites[0]),
                engine=w.engine,
                op=self.index.op(w.op),
                buffer=self.index.buffer_of(w.op),
            )
        box[...] = len(self.written)
        self.written.append(Written((r0, rows[1]), (c0, cols[1]), run, w, values, sites))

    def resolve(self, reader: SiteRun, term: Partial, fail) -> list[tuple[tuple[Product, ...], Written]]:
        """The products the reference `term` stands for, in the reader's symbols, with the write they come from —
        one write, or (a partial added in a loop over the writers' slots) one per iteration of that loop."""
        ref = term.ref
        (r_lo, r_hi), (c_lo, c_hi) = ref.row.span(reader.ranges), ref.col.span(reader.ranges)
        inside = r_lo >= 0 and r_hi < self.owner.shape[0] and c_lo >= 0 and c_hi < self.owner.shape[1]
        at = int(self.owner[r_lo, c_lo]) if inside else -1
        if at < 0:
            raise fail(
                f"it adds workspace tiles rows {ref.row.text()}, columns {ref.col.text()} (from tile ({r_lo}, {c_lo}))"
                " that no site writes"
            )
        src = self.written[at]
        (r0, rn), (c0, cn) = src.rows, src.cols
        loops = [s for s in term.sums if s in ref.row.syms() | ref.col.syms()]
        if (r_hi >= r0 + rn or c_hi >= c0 + cn) and loops and math.prod(reader.ranges[s] for s in loops) <= MAX_SPLIT:
            out = []
            for combo in itertools.product(*(range(reader.ranges[s]) for s in loops)):
                fixed = {s: Aff(v) for s, v in zip(loops, combo, strict=True)}
                rest = tuple(s for s in term.sums if s not in fixed)
                out += self.resolve(reader, Partial(ref.subst(fixed), rest), fail)
            return out
        return [self.resolve_one(reader, term, src, fail)]

    def resolve_one(self, reader: SiteRun, term: Partial, src: Written, fail) -> tuple[tuple[Product, ...], Written]:
        ref = term.ref
        (r_lo, r_hi), (c_lo, c_hi) = ref.row.span(reader.ranges), ref.col.span(reader.ranges)
        (r0, rn), (c0, cn) = src.rows, src.cols
        if r_hi >= r0 + rn or c_hi >= c0 + cn:
            raise fail(
                f"it adds workspace tiles rows {r_lo}..{r_hi}, columns {c_lo}..{c_hi}, which no one write of a partial"
                f" sum covers ({where(src.sites[0], src.write.engine)} writes rows {r0}..{r0 + rn - 1}, columns"
                f" {c0}..{c0 + cn - 1})"
            )
        row, col = src.write.row.subst(src.values), src.write.col.subst(src.values)
        sigma = invert(row, ref.row, src.run.ranges, reader.ranges)
        sigma_c = invert(col, ref.col, src.run.ranges, reader.ranges)
        if sigma is None or sigma_c is None:
            raise StrongerCheckNeeded(
                f"{where(reader.site, 'compute')}: it adds workspace tiles rows {ref.row.text()}, columns"
                f" {ref.col.text()}, which the semantic rule cannot match tile for tile with what"
                f" {where(src.sites[0], src.write.engine)} writes there (rows {row.text()}, columns {col.text()})",
                site=int(reader.site),
            )
        sigma.update(sigma_c)
        cell = src.write.cell
        if not isinstance(cell, AccSum) or any(not isinstance(t, Product) for t in cell.terms):
            raise StrongerCheckNeeded(
                f"{src.write.head} — the partial sum it writes is no plain sum of products (the semantic rule follows"
                " one level of partial sums)",
                site=int(src.sites[0]),
                engine=src.write.engine,
            )
        out = []
        for t in cell.terms:
            assert isinstance(t, Product)
            rename = dict(sigma)
            for s in t.sums:  # the writer's reduction symbols, renamed apart from the reader's own
                rename[s] = reader.fresh(s.label, src.run.ranges[s])
            moved = t.subst(src.values).subst(rename)
            out.append(Product(moved.a, moved.b, (*cell_sums(t, rename), *term.sums), moved.scale))
        return tuple(out), src


def cell_sums(t: Product, rename: dict[Sym, Aff]) -> tuple[Sym, ...]:
    """The reduction symbols of a product after its renaming."""
    return tuple(x for s in t.sums for x in rename[s].syms())


# ---- the handshake ----------------------------------------------------------------------------------------------


def raises(index: ProgramIndex) -> Counter[tuple[Site, SemId]]:
    """How often every (site, semaphore) is raised, over every site's programs (`raise_counts`)."""
    return raise_counts(index.p.schedule.programs)  # type: ignore[union-attr]


def _once(op: object) -> bool:
    """Whether `op` is an ITEM loop over one item: its body runs once, as if outside any loop (a split tail's)."""
    return isinstance(op, Loop) and op.var == LV_ITEM and op.count == Const(1)


def reader_wait(index: ProgramIndex, prog: EngineProgram, work) -> SemWait | None:
    """The last SemWait of `prog` before its first read of the workspace, at its top level or in an ITEM loop of
    one item that holds the read (None: none, or no read)."""
    last = None
    ops = prog.ops
    while True:
        for op in ops:
            if isinstance(op, SemWait):
                last = op
            elif any(isinstance(x, ReadTiles) and x.tensor == work for x in walk((op,))):
                if not _once(op):
                    return last
                ops = op.body  # type: ignore[union-attr]
                break
        else:
            return None


def _levels_of(ops: tuple, target: object) -> list[tuple[tuple, int]]:
    """(the op list, the place) of each op equal to `target` among `ops`' top level or the body of an ITEM loop of
    one item there."""
    found = []
    for i, op in enumerate(ops):
        if op == target:
            found.append((ops, i))
        elif _once(op):
            found += _levels_of(op.body, target)  # type: ignore[union-attr]
    return found


def check_handshake(index: ProgramIndex, reader: Site, src: Written, counts: Counter) -> None:
    """The partial sums `reader` reads from `src` are written and visible before it reads them (module docstring)."""
    p = index.p
    work = src.write.op.tensor
    assert p.schedule is not None
    progs = [
        q
        for q in p.schedule.programs_of(reader)
        if any(isinstance(x, ReadTiles) and x.tensor == work for x in walk(q.ops))
    ]
    for prog in progs:
        wait = reader_wait(index, prog, work)
        head = where(reader, prog.engine.value)
        if wait is None:
            read = next(x for x in walk(prog.ops) if isinstance(x, ReadTiles) and x.tensor == work)
            raise SemanticError(
                f"{head}: {index.op(read)} — it reads the workspace {index.tensors[work].name} without first waiting"
                " (SemWait, outside any loop) for the sites that write it: it may add a partial sum before it is"
                " written",
                site=int(reader),
                engine=prog.engine.value,
                op=index.op(read),
                buffer=index.buffer_of(read),
            )
        start = index.sems[wait.sem].initial
        need = start + counts[(reader, wait.sem)]
        if wait.value < need:
            raised = f"it starts at {start} and {counts[(reader, wait.sem)]}" if start else f"{need}"
            raise SemanticError(
                f"{head}: {index.op(wait)} — {raised} raises of it come to site {int(reader)}, and it reads the"
                f" workspace at a count of only {wait.value}: it may add a partial sum before it is written",
                site=int(reader),
                engine=prog.engine.value,
                op=index.op(wait),
                buffer=index.buffer_of(wait),
            )
        for site in src.sites:
            _writer_raises(index, site, src, reader, wait.sem)


def _writer_raises(index: ProgramIndex, site: Site, src: Written, reader: Site, sem: SemId) -> None:
    """The writer's engine writes, makes the write visible, then raises `reader`'s copy of `sem` — in that order, in
    its top-level ops."""
    prog = next(q for q in index.p.schedule.programs_of(site) if q.engine.value == src.write.engine)  # type: ignore[union-attr]
    head = f"{where(site, prog.engine.value)}: {index.op(src.write.op)}"
    # Every write equal to it is checked (which of them wrote the sum read is not followed): each must be one the
    # rule follows, outside loops or in an ITEM loop of one item, and raise only after a barrier that follows it.
    levels = _levels_of(prog.ops, src.write.op)
    if not levels or len(levels) < sum(1 for op in walk(prog.ops) if op == src.write.op):
        raise StrongerCheckNeeded(
            f"{head} — it writes a partial sum inside a loop; the semantic rule follows the handshake of a write"
            " outside loops",
            site=int(site),
            engine=prog.engine.value,
        )
    for ops, at in levels:
        _raised_after(index, site, prog, head, ops[at + 1 :], src, reader, sem)


def _raised_after(
    index: ProgramIndex, site: Site, prog, head: str, after: tuple, src: Written, reader: Site, sem
) -> None:
    """The ops `after` a partial sum's write make it visible, then raise `reader`'s copy of `sem`."""
    visible = False
    source = index.ring(src.write.op.src)
    for op in after:
        if isinstance(op, WriteBarrier) or (isinstance(op, Flush) and index.ring(op.buf) == source):
            visible = True
        elif isinstance(op, SemInc) and op.sem == sem and op.at == reader and op.by >= 1:
            if not visible:
                raise SemanticError(
                    f"{head} — {index.op(op)} raises site {int(reader)}'s semaphore before a WriteBarrier makes the"
                    " partial sum visible: the owner may read it half written",
                    site=int(site),
                    engine=prog.engine.value,
                    op=index.op(op),
                    buffer=index.buffer_of(op),
                )
            return
    raise SemanticError(
        f"{head} — site {int(reader)} adds this partial sum, but nothing after the write raises its semaphore"
        f" {index.sems[sem].name}: it may read the workspace before the sum is there",
        site=int(site),
        engine=prog.engine.value,
    )


__all__ = ["Workspace", "check_handshake", "invert", "item_values", "raises"]

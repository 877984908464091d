"""The semantic rule's run of one engine program on formulas (verify's rule 8; `dataflow` says how pages flow).

Each op changes what the pages and the accumulator hold: ReadTiles fills the newest reserved page with "tile (row,
col) of T", a tile matmul adds "Σ A-tile × B-tile" to its accumulator (summed over the loops between its AcquireAcc
and itself), PackAcc and the elementwise ops wrap the formula, WriteTiles records which tile of C gets which formula.
Every Compute is checked against the stage that declares it, by the rings it reads and fills.
"""

from __future__ import annotations

import itertools
import math
from collections import ChainMap
from typing import TypeVar

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, LoopVar, loop_var_name
from ...ir.index import where
from ...ir.nodes import ComputeStage, EngineProgram, Stage, Tensor
from ...ir.ops import (
    AcquireAcc,
    AddPartial,
    ChoreoOp,
    Compute,
    Const,
    Dequant,
    Loop,
    Map,
    MatmulTiles,
    McastSend,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    RowReduce,
    TileAddr,
    Trip,
    VecAxis,
    WriteTiles,
    cols,
    ring_of,
    row_reads,
)
from ...ir.printer import compute_text
from .blockscale import step_scales
from .dataflow import ZERO, Acc, Entry, MatmulDecl, Seq, SiteRun, Write, same_op
from .online import OnlineRun, is_online, settle, start
from .symbolic import (
    PC,
    PR,
    WITNESS_LIMIT,
    AccSum,
    Aff,
    Cell,
    Copy,
    Elem,
    Page,
    Partial,
    Product,
    RowTerm,
    RowVec,
    Sym,
    TileRef,
    split,
)

# Symbols of an accumulator tile's row and column inside the item (replaced by the page's at PackAcc).
ACC_ROW = Sym("acc", "row", "acc row")
ACC_COL = Sym("acc", "col", "acc col")
_E = TypeVar("_E", SemanticError, StrongerCheckNeeded)


class EngineRun:
    """One engine program run once, symbolically (see the module docstring)."""

    def __init__(self, site: SiteRun, prog: EngineProgram) -> None:
        self.site, self.index, self.decl = site, site.index, site.decl
        self.engine = prog.engine.value
        self.frames: list[tuple[object, Sym | None, Loop]] = []  # open loops: a token, its symbol, the op
        self.env: dict[LoopVar, Aff] = {}
        self.item: Sym | None = None  # the ITEM loop the engine is in (None: the site's only item)
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

    # ---- walking -------------------------------------------------------------------------------------------------

    def body(self, ops: tuple[ChoreoOp, ...]) -> None:
        for op in ops:
            if isinstance(op, Loop):
                self.loop(op)
            else:
                self.leaf(op)

    def loop(self, op: Loop) -> None:
        # A loop counted at run time is followed at its bound: what every row present computes. The proof at the
        # write shows the count and the rows it masks leave exactly the rows the data asks for (`semantics`).
        n = op.count.n if isinstance(op.count, Const) else op.count.bound
        if n == 0:
            return
        per_reserve, per_pop, touched = self.site.per_iteration(op)
        sym = None
        if n > 1:
            sym = Sym("loop", next(self.site.counter), loop_var_name(op.var))
            self.site.ranges[sym] = n
            for ring in touched:
                if self.pending.get(ring):
                    raise self.unsure(
                        op,
                        f"pages of {self.index.name(ring)} reserved before the loop are filled or pushed inside it;"
                        " the semantic rule follows loops whose iterations reserve, fill and push their own pages",
                        ring,
                    )
        saved = (dict(self.reserved), dict(self.popped))
        if sym is not None:
            for ring, k in per_reserve.items():
                self.reserved[ring] = saved[0].get(ring, ZERO).inside(sym, n, k)
            for ring, k in per_pop.items():
                self.popped[ring] = saved[1].get(ring, ZERO).inside(sym, n, k)
        outer_item, outer_var = self.item, self.env.get(op.var)
        self.env[op.var] = Aff(0) if sym is None else Aff.of(sym)
        if op.var == LV_ITEM:
            self.item = sym
        self.frames.append((object(), sym, op))
        if isinstance(op.count, Trip):
            self.trips.append((op.count, self.addr(op, TileAddr(op.count.index, op.count.steps)), sym))
        online = start(self, op, self.accs) if self.online is None and is_online(op) else None
        self.online = online or self.online
        self.body(op.body)
        if online is not None:
            self.online = None
            self.close_online(online)
        if isinstance(op.count, Trip):
            self.trips.pop()
        self.frames.pop()
        self.item = outer_item
        if outer_var is None:
            del self.env[op.var]
        for ring, k in per_reserve.items():
            self.reserved[ring] = saved[0].get(ring, ZERO).shifted(k * n)
        for ring, k in per_pop.items():
            self.popped[ring] = saved[1].get(ring, ZERO).shifted(k * n)

    def close_online(self, online: OnlineRun) -> None:
        """An online pass's body ran: its step proved (`online.finish`), its sum's terms given M's final vector."""
        online.finish(("in", "m"), ("in", "l"))
        acc = self.accs[online.m_acc]
        settle(online, self.vector(acc, online.stages[0]), Aff.of(ACC_ROW) if acc.rows > 1 else Aff(0))

    def leaf(self, op: ChoreoOp) -> None:
        ring = self.index.ring
        if self.online is not None and self.online.takes(op):
            return
        match op:
            case Reserve(buf, n):
                r = ring(buf)
                at = self.reserved.get(r, ZERO)
                self.pending.setdefault(r, []).extend([at.shifted(i), None, None] for i in range(n))
                self.reserved[r] = at.shifted(n)
            case Push(buf, n):
                self.push(op, ring(buf), n)
            case Pop(buf, n):
                self.popped[ring(buf)] = self.popped.get(ring(buf), ZERO).shifted(n)
            case ReadTiles():
                self.read(op)
            case WriteTiles():
                self.write(op)
            case AcquireAcc(buf):
                self.accs[buf] = Acc(tuple(token for token, _, _ in self.frames))
            case ReleaseAcc(buf) if buf in self.accs:
                self.accs[buf].live = False
            case Compute(op=MatmulTiles()):
                self.matmul(op)
            case Compute(op=AddPartial()):
                self.add_partial(op)
            case Compute(op=RowReduce()):
                self.row_reduce(op)
            case Compute(op=Dequant()):
                self.dequant(op)
            case Compute():
                self.elementwise(op)
            case PackAcc():
                self.pack(op)
            case McastSend(buf):
                self.send(op, ring(buf))
            case _:
                pass  # Wait, semaphores, barriers and ordering points order the work; they compute nothing

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

    # ---- data ops ------------------------------------------------------------------------------------------------

    def read(self, op: ReadTiles) -> None:
        t = self.index.tensors[op.tensor]
        pr = Aff.of(PR) if op.block_h > 1 else Aff(0)
        pc = Aff.of(PC) if op.block_w > 1 else Aff(0)
        flat = self.addr(op, op.at) + pr * op.stride_h + pc * op.stride_w
        row, col = self.tile_of(op, t, flat, {PR: op.block_h, PC: op.block_w})
        origin = (int(self.site.site), self.engine, self.index.op(op))
        self.fill(op, op.into, Page(op.block_h, op.block_w, Copy(TileRef(t.id, row, col, origin))))

    def declared_ring(self, op: ChoreoOp, buf: BufferId, want: BufferId | None) -> None:
        """`buf` is the ring the stages say this op's data flows through (the kernel keeps only declared rings)."""
        if want is not None and self.index.ring(buf) != self.index.ring(want):
            raise self.wrong(
                op,
                f"its data goes through {self.index.name(buf)}, but the stages send it through {self.index.name(want)}",
                buf,
            )

    def write(self, op: WriteTiles) -> None:
        if op.tensor in self.decl.others:
            return  # another output's write: its own run of the rule proves it (`semantics.check_semantics`)
        split = self.decl.split
        partial = split is not None and op.tensor == split.work
        self.declared_ring(op, op.src, split.out_ring if partial else self.decl.last)  # type: ignore[union-attr]
        page = self.front(op, op.src)
        cell = page.view(op.block_h, op.block_w)
        if cell is None:
            raise self.unsure(
                op,
                f"it writes {op.block_h}x{op.block_w} tiles from a page of {page.rows} rows of {page.width} tiles;"
                " the semantic rule follows blocks read in the layout they were filled in",
                op.src,
            )
        bh, bw = self.site.fresh("block row", op.block_h), self.site.fresh("block col", op.block_w)
        flat = self.addr(op, op.at) + bh * op.stride_h + bw * op.stride_w
        row, col = self.tile_of(op, self.index.tensors[op.tensor], flat, {})
        loops = tuple(sym for _, sym, _ in self.frames if sym is not None)
        w = Write(
            op,
            self.head(op),
            self.engine,
            loops,
            self.item,
            row,
            col,
            cell.subst({PR: bh, PC: bw}),
            (bh, bw),
            tuple(self.trips),
        )
        (self.site.partials if partial else self.site.writes).append(w)

    def stage_of(self, op: Compute) -> Stage:
        """The stage `op` runs, by the rings it reads and fills, after checking it does what that stage declares."""
        ring, name = self.index.ring, self.index.name
        ins, outs = tuple(map(ring, op.ins)), tuple(map(ring, op.outs))
        # Rule 1 saw to it that a matmul and a row reduction fill no ring: their stages are found by what they read.
        is_mm = isinstance(op.op, MatmulTiles | RowReduce)
        kin = [
            (s, s.kind.op)
            for s in self.index.p.stages
            if isinstance(s.kind, ComputeStage) and _kind(s.kind.op) == _kind(op.op)
        ]
        found = [
            (s, d) for s, d in kin if tuple(map(ring, s.ins)) == ins and (is_mm or tuple(map(ring, s.outs)) == outs)
        ]
        if not found:
            joined = " by ".join if is_mm else ", ".join
            verb = "reduces" if isinstance(op.op, RowReduce) else "multiplies" if is_mm else "reads"
            said = "; ".join(
                f"stage {s.name} {verb} {joined(map(name, s.ins))}"
                + ("" if is_mm else f" into {', '.join(map(name, s.outs))}")
                for s, _ in kin
            )
            did = f"{verb} {joined(map(name, op.ins))}" + ("" if is_mm else " into")
            did += "" if is_mm else f" {', '.join(map(name, op.outs)) or 'nothing'}"
            raise self.wrong(op, f"it {did}; {said or 'no stage does'}")
        stage, declared_op = found[0]
        if not same_op(op.op, declared_op):
            raise self.wrong(
                op,
                f"schedule op {compute_text(op.op, self.index.p)} where stage {stage.name} declares"
                f" {compute_text(declared_op, self.index.p)}",
            )
        return stage

    @property
    def top(self) -> MatmulDecl:
        """The matmul whose result reaches C."""
        assert self.decl.matmul is not None
        return self.decl.matmuls[self.decl.matmul.id]

    def live_acc(self, op: ChoreoOp, buf: BufferId) -> Acc:
        acc = self.accs.get(buf)
        name = self.index.name(buf)
        if acc is None or not acc.live:
            raise self.wrong(op, f"{name} is not acquired here: no AcquireAcc zeroes it before this op", buf)
        tokens = tuple(token for token, _, _ in self.frames)
        if tokens[: len(acc.opened)] != acc.opened:
            raise self.unsure(
                op,
                f"{name} was zeroed inside a loop that has ended; the semantic rule follows an accumulator acquired,"
                " used and released in one loop body",
                buf,
            )
        return acc

    def matmul(self, op: Compute) -> None:
        stage = self.stage_of(op)
        assert op.acc is not None and isinstance(op.op, MatmulTiles)
        acc = self.live_acc(op, op.acc)
        if acc.packed:
            raise self.wrong(op, f"it adds a product after PackAcc has read {self.index.name(op.acc)}", op.acc)
        mm = self.decl.matmuls[stage.id]  # (`declared` saw to it that every stage is on the way to C)
        if acc.stage is not None and acc.stage is not mm:
            raise self.wrong(
                op,
                f"{self.index.name(op.acc)} already sums products of stage {acc.stage.stage.name}, and this op adds"
                f" stage {stage.name}'s",
                op.acc,
            )
        if acc.reduce is not None:
            raise self.wrong(op, f"{self.index.name(op.acc)} already reduces rows for stage {acc.reduce.name}", op.acc)
        acc.stage = mm
        h, w, ibw = mm.shape
        if self.index.page_tiles(op.acc) < h * w:
            raise self.wrong(
                op,
                f"{self.index.name(op.acc)} holds {self.index.page_tiles(op.acc)} tiles, the matmul's {h}x{w}",
                op.acc,
            )
        cells: list[TileRef | Cell] = []
        for buf, shape in ((op.ins[0], (h, ibw)), (op.ins[1], (ibw, w))):
            page = self.front(op, buf)
            cell = page.view(*shape)
            if cell is None:
                raise self.unsure(
                    op,
                    f"it multiplies {shape[0]}x{shape[1]} tiles of a page of {page.rows} rows of {page.width}; the"
                    " semantic rule follows pages read in the layout they were filled in",
                    buf,
                )
            cells.append(cell.ref if isinstance(cell, Copy) else cell)  # read tiles, or computed ones
        kk = self.site.fresh("kk", ibw)
        row = Aff.of(ACC_ROW) if h > 1 else Aff(0)
        col = Aff.of(ACC_COL) if w > 1 else Aff(0)
        a, b = cells[0].subst({PR: row, PC: kk}), cells[1].subst({PR: kk, PC: col})
        summed = [(sym, lp) for token, sym, lp in self.frames[len(acc.opened) :] if sym is not None]
        self.fixed_sum(op, [lp for _, _, lp in self.frames[len(acc.opened) :]])
        scale = step_scales(op.op, lambda at: self.addr(op, at), row, col, kk)  # a block-scaled step's promotion
        acc.terms.append(Product(a, b, (*(s for s, _ in summed), *kk.syms()), scale))
        acc.summed.update(summed)

    def fixed_sum(self, op: ChoreoOp, loops: list[Loop]) -> None:
        """A sum must not run in a loop counted at run time: followed at its bound it would be proved whole, yet run
        only as often as the data says."""
        counted = [lp for lp in loops if isinstance(lp.count, Trip)]
        if counted:
            raise self.unsure(
                op,
                f"it adds to an accumulator inside {self.index.op(counted[0])}, whose count is read at run time: the"
                " sum's length would depend on the data (only whole rows may be counted so)",
            )

    def pack(self, op: PackAcc) -> None:
        acc = self.live_acc(op, op.acc)
        still = [lp for _, sym, lp in self.frames if sym in acc.summed]
        if still:
            raise self.wrong(
                op,
                f"it reads a partial sum: the loop {self.index.op(still[0])} around it still adds products to"
                f" {self.index.name(op.acc)}",
                op.acc,
            )
        if acc.reduce is not None or self.decl.rows:
            self.pack_rows(op, acc)
            return
        split = self.decl.split
        to_partial = split is not None and self.index.ring(op.to) == split.out_ring
        mm = acc.stage or next(
            (m for m in self.decl.matmuls.values() if m.ring == self.index.ring(op.to)), self.top
        )  # no product yet: the shape of the matmul whose ring it fills
        h, w, _ = mm.shape
        if op.tiles % w or op.tiles > h * w or (op.accumulate and op.tiles != h * w):
            raise self.unsure(
                op,
                f"it packs {op.tiles} tiles of the {h}x{w}-tile accumulator; the semantic rule follows packs of whole"
                " rows, and accumulating packs of all of it",
                op.to,
            )
        self.declared_ring(op, op.to, split.out_ring if to_partial else mm.ring)  # type: ignore[union-attr]
        rename: dict[Sym, Aff] = {ACC_ROW: Aff.of(PR), ACC_COL: Aff.of(PC)}
        for t in acc.terms:
            for s in t.sums:
                if s not in rename:
                    rename[s] = self.site.fresh(s.label, self.site.ranges[s])
        terms = tuple(renamed(t, rename) for t in acc.terms)
        if op.accumulate:
            base = self.pending.get(self.index.ring(op.to), [[None, None]])[-1][1]
            shape = (op.tiles // w, w)
            if not isinstance(base, Page) or not isinstance(base.cell, AccSum) or (base.rows, base.width) != shape:
                raise self.unsure(op, "it adds onto a page that does not hold an accumulator of its shape", op.to)
            terms = base.cell.terms + terms
        self.fill(op, op.to, Page(op.tiles // w, w, AccSum(terms)))
        acc.packed = True

    def row_reduce(self, op: Compute) -> None:
        """acc ⊕= each row of the front page: recorded as the page's tiles at their tile columns of the row, summed
        over the loops between the AcquireAcc and here and over the page's columns."""
        stage = self.stage_of(op)
        assert op.acc is not None and isinstance(op.op, RowReduce)
        acc = self.live_acc(op, op.acc)
        name = self.index.name(op.acc)
        if acc.packed:
            raise self.wrong(op, f"it reduces into {name} after PackAcc has read it", op.acc)
        if acc.stage is not None or acc.reduce not in (None, stage):
            other = acc.reduce.name if acc.reduce is not None else acc.stage.stage.name  # type: ignore[union-attr]
            raise self.wrong(op, f"{name} already holds stage {other}'s values, and this op adds stage {stage.name}'s")
        page = self.front(op, op.ins[0])
        if page.width != op.op.width or (acc.rows and page.rows != acc.rows):
            raise self.unsure(
                op,
                f"it reduces rows of {op.op.width} tiles from a page of {page.rows} rows of {page.width}; the semantic"
                " rule follows reductions of whole page rows, one page shape an accumulator",
                op.ins[0],
            )
        if self.index.page_tiles(op.acc) < page.rows:
            raise self.wrong(
                op, f"{name} holds {self.index.page_tiles(op.acc)} tiles, the page's {page.rows} rows", op.acc
            )
        kk = self.site.fresh("kk", page.width)
        row = Aff.of(ACC_ROW) if page.rows > 1 else Aff(0)
        summed = [(sym, lp) for _, sym, lp in self.frames[len(acc.opened) :] if sym is not None]
        self.fixed_sum(op, [lp for _, _, lp in self.frames[len(acc.opened) :]])
        col = self.addr(op, op.op.at) + kk
        origin = (int(self.site.site), self.engine, self.index.op(op))
        sums = (*(s for s, _ in summed), *kk.syms())
        acc.row_terms.append(RowTerm(page.cell.subst({PR: row, PC: kk}), col, sums, origin))
        acc.summed.update(summed)
        acc.reduce, acc.rows = stage, page.rows

    def pack_rows(self, op: PackAcc, acc: Acc) -> None:
        """PackAcc of a row accumulator: a row vector, one tile a row, each row's reduction (in every column)."""
        stage = acc.reduce or next(
            (s for s in self.index.p.stages if tuple(map(self.index.ring, s.outs)) == (self.index.ring(op.to),)), None
        )  # nothing reduced yet: the stage whose ring it fills
        if stage is None or not isinstance(stage.kind, ComputeStage) or not isinstance(stage.kind.op, RowReduce):
            raise self.wrong(
                op, f"it packs a row accumulator into {self.index.name(op.to)}, which no row reduction fills"
            )
        rows = acc.rows or op.tiles
        if op.tiles != rows or op.accumulate:
            raise self.unsure(
                op,
                f"it packs {op.tiles} tiles of a row accumulator of {rows} rows; the semantic rule follows a pack of"
                " every row, one tile each",
                op.to,
            )
        self.declared_ring(op, op.to, stage.outs[0])
        self.fill(op, op.to, Page(rows, 1, self.vector(acc, stage)))
        acc.packed = True

    def vector(self, acc: Acc, stage: Stage) -> RowVec:
        """A row accumulator's value as a row vector: its terms, each page row at PR, their sums over fresh symbols."""
        rename: dict[Sym, Aff] = {ACC_ROW: Aff.of(PR)}
        for t in acc.row_terms:
            for s in t.sums:
                if s not in rename:
                    rename[s] = self.site.fresh(s.label, self.site.ranges[s])
        terms = tuple(
            RowTerm(
                t.cell.subst(rename), t.col.subst(rename), tuple(x for s in t.sums for x in rename[s].syms()), t.origin
            )
            for t in acc.row_terms
        )
        return RowVec(stage.kind.op, terms)  # type: ignore[union-attr]

    def add_partial(self, op: Compute) -> None:
        """acc += a page of partial sums read from the workspace: recorded as a reference to the workspace's tiles,
        which the proof at the write replaces by what the site that wrote them summed there."""
        self.stage_of(op)
        assert op.acc is not None
        acc = self.live_acc(op, op.acc)
        if acc.packed:
            raise self.wrong(op, f"it adds a partial sum after PackAcc has read {self.index.name(op.acc)}", op.acc)
        h, w, _ = self.decl.acc_shape
        page = self.front(op, op.ins[0])
        held = self.index.page_tiles(op.acc)
        if page.rows * page.width < held:  # the add covers the whole accumulator: the page's tiles, then past them
            raise self.wrong(
                op,
                f"it adds a page of {page.rows * page.width} tile(s) to {self.index.name(op.acc)}, which holds {held}:"
                " a partial sum is added to every tile of the accumulator, so its page holds as many",
                op.ins[0],
            )
        cell = page.view(h, w)
        if cell is None:
            raise self.unsure(
                op,
                f"it adds {h}x{w} tiles from a page of {page.rows} rows of {page.width}; the semantic rule follows"
                " pages read in the layout they were filled in",
                op.ins[0],
            )
        split = self.decl.split
        if not isinstance(cell, Copy) or split is None or cell.ref.tensor != split.work:
            raise self.unsure(op, "it adds a page that holds no tiles read from the workspace", op.ins[0])
        row = Aff.of(ACC_ROW) if h > 1 else Aff(0)
        col = Aff.of(ACC_COL) if w > 1 else Aff(0)
        summed = [(sym, lp) for token, sym, lp in self.frames[len(acc.opened) :] if sym is not None]
        self.fixed_sum(op, [lp for _, _, lp in self.frames[len(acc.opened) :]])
        acc.terms.append(Partial(cell.ref.subst({PR: row, PC: col}), tuple(s for s, _ in summed)))
        acc.summed.update(summed)

    def elementwise(self, op: Compute) -> None:
        self.stage_of(op)
        pages = [self.front(op, b) for b in op.ins]
        by_row = set(row_reads(op.op.expr)) if isinstance(op.op, Map) else set()
        whole = [i for i in range(len(pages)) if i not in {i for i, _ in by_row}]
        if not whole:
            self.vector_map(op, pages)
            return
        page = pages[whole[0]]
        for i, width in sorted(by_row):
            vec = pages[i]
            if (vec.rows, vec.width) != (page.rows, 1) or width != page.width:
                raise self.unsure(
                    op,
                    f"it reads a row vector of {vec.rows}x{vec.width} tiles as rows {width} tiles wide against a page"
                    f" of {page.rows} rows of {page.width}; the semantic rule follows a row vector of one tile a page"
                    " row",
                    op.ins[i],
                )
        for other, buf in ((pages[i], op.ins[i]) for i in whole[1:]):
            if (other.rows, other.width) != (page.rows, page.width):
                raise self.unsure(
                    op,
                    f"its pages are {page.rows}x{page.width} and {other.rows}x{other.width} tiles; the semantic rule"
                    " follows a map of pages of one shape",
                    buf,
                )
        found: dict[VecAxis, Aff] = {}
        for axis in VecAxis:
            vectors = {(c.at, c.width) for c in cols(op.op.expr) if c.axis == axis} if isinstance(op.op, Map) else set()
            what = "column" if axis == VecAxis.COL else "row"
            if len(vectors) > 1:
                raise self.unsure(
                    op,
                    f"its {what} vectors are read at different tile {what}s; the semantic rule follows {what} vectors"
                    " read together, at one address",
                    op.ins[0],
                )
            if vectors:
                ((at, width),) = vectors
                if width != page.width:
                    raise self.unsure(
                        op,
                        f"its {what} vector is read against rows {width} tiles wide and the page's rows are"
                        f" {page.width}; the semantic rule follows a vector laid over whole page rows",
                        op.ins[0],
                    )
                # a column vector's tile s is the page's column s mod width; a row vector's, its row s // width
                found[axis] = self.addr(op, at) + Aff.of(PC if axis == VecAxis.COL else PR)
        inners = tuple(p.cell for p in pages)
        origin = (int(self.site.site), self.engine, self.index.op(op))
        cell = Elem(op.op, inners, found.get(VecAxis.COL), origin, found.get(VecAxis.ROW))
        self.fill(op, op.outs[0], Page(page.rows, page.width, cell))

    def dequant(self, op: Compute) -> None:
        """A dequant prologue (W4A16): each tile of the page it fills is its op of the same tile of the page it
        reads, its scales and zero points read at tile row `rows + page row` and tile column `cols + page col` of
        the weights (verify/dequant.py; the proof at the write holds them to the weights tile's own)."""
        self.stage_of(op)
        dq = op.op
        assert isinstance(dq, Dequant)
        page = self.front(op, op.ins[0])
        if dq.width != page.width:
            raise self.unsure(
                op,
                f"it reads a page of rows {page.width} tiles wide as rows of {dq.width}; the semantic rule follows a"
                " dequant laid over whole page rows",
                op.ins[0],
            )
        row, col = self.addr(op, dq.rows) + Aff.of(PR), self.addr(op, dq.cols) + Aff.of(PC)
        origin = (int(self.site.site), self.engine, self.index.op(op))
        self.fill(op, op.outs[0], Page(page.rows, page.width, Elem(dq, (page.cell,), col, origin, row)))

    def vector_map(self, op: Compute, pages: list[Page]) -> None:
        """A map of row vectors alone (mean = Σ / n): a row vector, each row's value of the same rows' values."""
        vecs = {(p.rows, p.width) for p in pages}
        widths = {w for _, w in row_reads(op.op.expr)} if isinstance(op.op, Map) else set()
        if not pages or len(vecs) != 1 or next(iter(vecs))[1] != 1 or widths != {1}:
            raise self.unsure(
                op,
                "it maps row vectors of other shapes than one tile a page row, or reads them as rows of pages; the"
                " semantic rule follows a map of row vectors of one shape into one",
                op.ins[0] if op.ins else None,
            )
        rows = pages[0].rows
        origin = (int(self.site.site), self.engine, self.index.op(op))  # (named by a fault in what it computed)
        self.fill(op, op.outs[0], Page(rows, 1, Elem(op.op, tuple(p.cell for p in pages), None, origin)))


def _kind(op: object) -> type:
    """Which stages a scheduled compute op may run: those of its class (a map's, a requant's: any elementwise)."""
    return type(op) if isinstance(op, MatmulTiles | RowReduce | AddPartial | Dequant) else Map


def renamed(term: Product | Partial, rename: dict[Sym, Aff]) -> Product | Partial:
    """A term of an accumulator with its symbols renamed (its summed ones to the symbols they become)."""
    sums = tuple(x for s in term.sums for x in rename[s].syms())
    if isinstance(term, Partial):
        return Partial(term.ref.subst(rename), sums)
    return Product(term.a.subst(rename), term.b.subst(rename), sums, term.scale and term.scale.subst(rename))

"""The semantic rule's run of one engine program (verify/engine.py), its handlers of the data ops: ReadTiles and
WriteTiles, each Compute checked against its stage (tile matmuls, row reductions, partial sums, elementwise maps,
dequants) and PackAcc, each turning the pages' and the accumulator's formulas into the next."""

from __future__ import annotations

from ...ir.ids import BufferId
from ...ir.nodes import ComputeStage, Stage
from ...ir.ops import (
    AddPartial,
    ChoreoOp,
    Compute,
    Dequant,
    Loop,
    Map,
    MatmulTiles,
    PackAcc,
    ReadTiles,
    RowReduce,
    Trip,
    VecAxis,
    WriteTiles,
    cols,
    row_reads,
)
from ...ir.printer import compute_text
from .blockscale import step_scales
from .dataflow import Acc, MatmulDecl, Write, same_op
from .engine_pages import EngineRunPages
from .symbolic import PC, PR, AccSum, Aff, Cell, Copy, Elem, Page, Partial, Product, RowTerm, RowVec, Sym, TileRef

# Symbols of an accumulator tile's row and column inside the item (replaced by the page's at PackAcc).
ACC_ROW = Sym("acc", "row", "acc row")
ACC_COL = Sym("acc", "col", "acc col")


class EngineRunOps(EngineRunPages):
    """An engine's run, its handler of each data op."""

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
            self.part,
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

"""verify's rule 8, the proof at a write (verify/semantics.py states the rule), its second half: the value of each
tile — the declared epilogue, op for op, of Σ_k A·B over every k exactly once, a computed operand followed to its
own matmul."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np

from ...ir.ids import BufferId
from ...ir.nodes import ComputeStage, ReadStage, Stage
from ...ir.ops import Dequant, Map, MatmulTiles, RowReduce, VecAxis, cols
from ...ir.printer import compute_text
from .blockscale import check_term
from .dataflow import MatmulDecl, same_op
from .partials import check_handshake
from .semantics_write import _WriteProof
from .symbolic import AccSum, Aff, Cell, Copy, Elem, Partial, Product, RowVec, Sym, TileRef, one_to_one

ENUM_LIMIT = 1 << 22  # k-tiles listed when interleaved products are not one mixed radix (an unrolled K loop)


class _Proof(_WriteProof):
    """The proof at the write: each item's block of C written once, each tile with the declared value. For a split
    owner, `space` resolves the partial sums it adds (of the concrete item written by `owner`)."""

    def check(self) -> None:
        self.coverage()
        self.rows()
        self.value(self.w.cell, self.decl.last)

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

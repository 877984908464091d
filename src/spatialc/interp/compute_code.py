"""The engine code generator's lines for a Compute op (`codegen.Emitter`): matmuls, dequantisation, accumulator
scaling, split-K partials, row reductions and elementwise maps."""

from __future__ import annotations

from ..ir.nodes import Accumulator, Fifo, Interm
from ..ir.ops import (
    AddPartial,
    Apply,
    ColReduce,
    Compute,
    Dequant,
    Map,
    MatmulTiles,
    PackAcc,
    Pos,
    Precision,
    Requant,
    RowReduce,
    ScaleAcc,
    TileAddr,
    VecAxis,
    arg_indices,
    cols,
)
from .emitter import EmitterBase
from .errors import EvalError, UnsupportedOp
from .mapped import MapKernel


class ComputeEmitter(EmitterBase):
    """The Compute arms of the engine code generator."""

    def compute(self, op: Compute, i: int) -> None:
        mm = op.op
        if isinstance(mm, Map | Requant):
            self.elementwise(op, mm, i)
            return
        if isinstance(mm, AddPartial):
            self.add_partial(op, i)
            return
        if isinstance(mm, RowReduce):
            self.row_reduce(op, mm, i)
            return
        if isinstance(mm, ColReduce):
            self.col_reduce(op, mm, i)
            return
        if isinstance(mm, ScaleAcc):
            self.scale_acc(op, i)
            return
        if isinstance(mm, Dequant):
            self.dequant(op, mm, i)
            return
        if not isinstance(mm, MatmulTiles):
            raise UnsupportedOp(f"{self.where(op)}: the interpreter does not run {type(mm).__name__} yet")
        if op.acc_reload is not None:
            raise UnsupportedOp(f"{self.where(op)}: the interpreter does not run accumulator reloads yet")
        if len(op.ins) != 2 or op.acc is None:
            raise EvalError(f"{self.where(op)}: a tile matmul takes two input rings and an accumulator")
        ra, rb = self.ring(op.ins[0], op, "consume"), self.ring(op.ins[1], op, "consume")
        a = self.acc(op.acc, op)
        geom = self.geometry(op, mm)
        g = self.const(geom, "g")
        self.emit(f"if not {a}.live:", f"    fail(E, {i}, {a}.name + ' is not acquired')")
        self.front("x", ra, op.ins[0], i, geom[0] * geom[2])
        self.front("y", rb, op.ins[1], i, geom[2] * geom[1])
        prec = str(mm.operand.value)  # a computed page is rounded to it, a tensor's tiles are taken as they are
        for name, buf in (("x", op.ins[0]), ("y", op.ins[1])):
            if self.m.buffers[buf].ring in self.m.computed:
                self.emit(f"{name} = operand(E, {i}, {name}, {prec!r})")
        if mm.transpose_b:  # the page holds Bᵀ (w × ibw tiles): the product reads it as B
            self.emit(f"y = transposed(y, {geom[1]}, {geom[2]})")
        if mm.scales is not None:  # block-scaled: the step promoted at once (interp/blockscale.py)
            sc, where = mm.scales, (lambda: self.where(op))
            sa, sb = (self.const(self.m.store(s.tensor, where), "t") for s in (sc.a, sc.b))
            at = ", ".join(self.addr(x, op) for x in (sc.rows, sc.cols, sc.k, sc.group or TileAddr(0)))
            self.emit(f"scaled_step(E, {i}, x, y, {a}, {g}, {self.const(sc, 's')}, {sa}, {sb}, {at})")
            return
        self.emit(f"if {a}.geom is not {g}:", f"    set_geom(E, {i}, {a}, {g})", f"{a}.a.append(x)", f"{a}.b.append(y)")

    def dequant(self, op: Compute, dq: Dequant, i: int) -> None:
        """A dequant prologue: the front page of 4-bit weights into the reserved operand page (`interp/dequant.py`)."""
        if len(op.ins) != 1 or len(op.outs) != 1 or op.acc is not None:
            raise EvalError(f"{self.where(op)}: a dequant reads one ring of weights and fills one")
        if dq.group < 1 or dq.width < 1 or dq.operand not in (Precision.BF16, Precision.FP16):
            raise EvalError(
                f"{self.where(op)}: a dequant takes groups of ≥ 1 row and pages ≥ 1 tile wide, into bf16 or fp16"
            )
        self.front("x", self.ring(op.ins[0], op, "consume"), op.ins[0], i, 1)
        slot = self.newest_reserved(self.ring(op.outs[0], op, "produce"), op.outs[0], i)
        stores = [
            "None" if t is None else self.const(self.m.store(t, lambda: self.where(op)), "t")
            for t in (dq.scale, dq.zero)
        ]
        rows, cols = self.addr(dq.rows, op), self.addr(dq.cols, op)
        self.emit(
            f"{slot} = dequant(x, {self.const(dq, 'e')}, {stores[0]}, {stores[1]}, {rows}, {cols},"
            f" {self.const(self.where(op), 'w')})"
        )

    def scale_acc(self, op: Compute, i: int) -> None:
        """acc[row] ·= the row's value of its one ring's front page (a row vector): what the accumulator holds now."""
        if len(op.ins) != 1 or op.outs or op.acc is None:
            raise EvalError(f"{self.where(op)}: rescaling an accumulator reads one ring (a row vector)")
        role = self.roles.get(op.acc)
        if role is None:
            raise EvalError(
                f"{self.where(op)} rescales {self.m.buffers[op.acc].name}, which no matmul or row reduction of this"
                " engine accumulates into"
            )
        geom = self.geometry(role, role.op) if isinstance(role.op, MatmulTiles) else None
        r = self.ring(op.ins[0], op, "consume")
        a = self.acc(op.acc, op)
        self.front("x", r, op.ins[0], i, 1)
        self.emit(f"scale_acc(E, {i}, x, {a}, {self.const(geom, 'g') if geom is not None else None})")

    def add_partial(self, op: Compute, i: int) -> None:
        """acc += the front page of its one ring: kept beside the products, added in order when it is packed."""
        if len(op.ins) != 1 or op.outs or op.acc is None:
            raise EvalError(f"{self.where(op)}: adding a partial sum reads one ring into an accumulator")
        r = self.ring(op.ins[0], op, "consume")
        a = self.acc(op.acc, op)
        n = self.m.buffers[op.acc].kind.tiles  # type: ignore[union-attr]
        self.emit(f"if not {a}.live:", f"    fail(E, {i}, {a}.name + ' is not acquired')")
        self.front("x", r, op.ins[0], i, 1)
        self.emit(f"{a}.parts.append(partial(E, {i}, x, {n}))")

    def row_reduce(self, op: Compute, rr: RowReduce, i: int) -> None:
        """acc ⊕= each row of its one ring's front page, the columns at or past the row's width left out: the pages
        kept, reduced when the accumulator is packed (`support.pack`)."""
        if len(op.ins) != 1 or op.outs or op.acc is None:
            raise EvalError(f"{self.where(op)}: a row reduction reads one ring into an accumulator")
        r = self.ring(op.ins[0], op, "consume")
        a = self.acc(op.acc, op)
        self.front("x", r, op.ins[0], i, rr.width)
        self.emit(f"row_reduce(E, {i}, x, {a}, {self.const(rr, 'e')}, {self.addr(rr.at, op)})")

    def col_reduce(self, op: Compute, cr: ColReduce, i: int) -> None:
        """acc ⊕= each column of its one ring's front page, the rows at or past the column's height left out: the
        pages kept, reduced when the accumulator is packed (`colpacks.packed_cols`)."""
        if len(op.ins) != 1 or op.outs or op.acc is None:
            raise EvalError(f"{self.where(op)}: a column reduction reads one ring into an accumulator")
        r = self.ring(op.ins[0], op, "consume")
        a = self.acc(op.acc, op)
        self.front("x", r, op.ins[0], i, cr.width)
        self.emit(f"col_reduce(E, {i}, x, {a}, {self.const(cr, 'e')}, {self.addr(cr.at, op)})")

    def elementwise(self, op: Compute, cop: Map | Requant, i: int) -> None:
        """An elementwise stage: the front pages of its input rings, element by element, into its output ring."""
        arity = 1 if isinstance(cop, Requant) else max(arg_indices(cop.expr), default=-1) + 1
        if len(op.ins) != max(arity, 1) or len(op.outs) != 1 or op.acc is not None:
            raise EvalError(
                f"{self.where(op)}: an elementwise stage reads the rings its expression names"
                f" ({max(arity, 1)}) and writes one"
            )
        dst = op.outs[0]
        pages = []
        for j, src in enumerate(op.ins):
            self.front(f"x{j}", self.ring(src, op, "consume"), src, i, 1)
            pages.append(f"x{j}")
        slot = self.newest_reserved(self.ring(dst, op, "produce"), dst, i)
        integer = self.m.p.precision == Precision.INT8
        c = self.const(MapKernel(cop, integer, (self.m.p.tile.rows, self.m.p.tile.cols), len(op.ins)), "e")
        columns = cols(cop.expr) if isinstance(cop, Map) else ()
        vectors = []
        for col in columns:
            store = self.const(self.m.store(col.tensor, lambda: self.where(op)), "t")
            vectors.append(f"({store}, {self.addr(col.at, op)}, {col.width}, {col.axis == VecAxis.ROW})")
        places = [f"({self.const(node, 'p')}, {self.addr(node.at, op)})" for node in _places(cop)]
        at = f", ({', '.join(places)},)" if places else ""
        self.emit(f"{slot} = elementwise(E, {i}, [{', '.join(pages)}], {c}, [{', '.join(vectors)}]{at})")

    def geometry(self, op: Compute, mm: MatmulTiles) -> tuple[int, int, int, int, int]:
        """(h, w, ibw, tile side, int8 elements per product or 0), checked against the pages and accumulator."""
        h, w, ibw = mm.sub_blocks[0] * mm.block.osh, mm.sub_blocks[1] * mm.block.osw, mm.block.ibw
        tile = self.m.p.tile
        if tile.rows != tile.cols:
            raise UnsupportedOp(f"{self.where(op)}: tile matmuls need square tiles, not {tile.rows}x{tile.cols}")
        for bid, n in ((op.ins[0], h * ibw), (op.ins[1], ibw * w)):
            buf = self.m.buffers[bid]
            if n > buf.kind.page_tiles:  # type: ignore[union-attr]
                raise EvalError(
                    f"{self.where(op)} needs {n} tiles per page of {buf.name}, whose pages hold {buf.kind.page_tiles}"
                )  # type: ignore[union-attr]
        acc = self.m.buffers[op.acc]  # type: ignore[index]
        if h * w > acc.kind.tiles:  # type: ignore[union-attr]
            raise EvalError(f"{self.where(op)} needs {h * w} accumulator tiles, {acc.name} has {acc.kind.tiles}")  # type: ignore[union-attr]
        return (h, w, ibw, tile.rows, ibw * tile.cols if mm.operand == Precision.INT8 else 0)

    def pack_checks(self, op: PackAcc) -> None:
        page = self.buffer(op.to, op, (Fifo, Interm)).kind.page_tiles  # type: ignore[union-attr]
        acc = self.buffer(op.acc, op, (Accumulator,))
        if op.tiles > page or op.tiles > acc.kind.tiles:  # type: ignore[union-attr]
            raise EvalError(
                f"{self.where(op)} packs {op.tiles} tiles: pages of {self.m.buffers[op.to].name}"
                f" hold {page}, {acc.name} has {acc.kind.tiles}"
            )  # type: ignore[union-attr]


def _places(op: Map | Requant) -> list[Pos]:
    """The positions (`Pos`) a map reads, each once."""
    found: dict[Pos, None] = {}
    stack = [op.expr] if isinstance(op, Map) else []
    while stack:
        node = stack.pop()
        if isinstance(node, Pos):
            found[node] = None
        elif isinstance(node, Apply):
            stack.extend(node.args)
    return list(found)

"""The general form's column reductions (`spatialc.col_reduce`): the column accumulators, the ColReduce that folds a
page into them, and the PackAcc that stores them as a column vector — what `interp.colpacks` defines.

A band of bw tile columns has bw·16 element columns. Compute thread t (of the NWARP·32) holds columns t, t + NWARP·32,
… (CCOLS of them), one float each (`cacc_<acc>[q]`): the column's whole value, so no thread's is combined with
another's. AcquireAcc sets each to the reduction's identity; a ColReduce combines into it, row after row, the column's
elements of the page, leaving out those at or past the column's logical height (the padding rows). PackAcc stores
each column's value into every row of its column of the vector page: bw tiles, tile c the columns of tile column c.

Each reduction's C (its identity, the `pre` of an element, the combine) is `numerics.reductions.REDUCTIONS`'s, the
combine the elementwise table's add, max or min. A float32 sum down a column, in row order, lies within the bound the
tolerance gives every kernel's (`reductions.reduce_bound` of the transpose); max, min and absmax are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ....ir.ids import LoopVar
from ....ir.nodes import Accumulator, DType, Plan, SpatialProgram, Stage, TensorRole
from ....ir.ops import AcquireAcc, ChoreoOp, ColReduce, Compute, PackAcc, Precision, ReleaseAcc
from ....numerics.elementwise import ElementwiseError
from ....numerics.reductions import Reduction, reduction_named
from ....passes.cols import col_shape
from ....target import WARP
from ...errors import Unsupported, UnsupportedPrecision
from . import epilogue
from .cwriter import Writer, addr_expr
from .program import _check_row_major_pages, all_ops, operand_types
from .rings import TILE_ELEMS, MmaTypes, Ring, Rings
from .rows import row_registers


@dataclass(frozen=True, slots=True)
class ColAccumulators:
    """The column accumulators of a kernel: the band's element columns, the compute threads, the columns each holds,
    each accumulator's reduction by its template id, and the estimate of a thread's registers."""

    band_cols: int
    threads: int
    per_thread: int
    reductions: dict[int, Reduction]
    registers: int

    def within(self, col: str) -> list[str]:
        """The C condition that `col` is one of the band's, where the threads' columns run past them (else none)."""
        return [] if self.threads * self.per_thread == self.band_cols else [f"{col} < {self.band_cols}"]


def col_accumulators(p: SpatialProgram, plan: Plan, rings: Rings, warps: int) -> ColAccumulators | None:
    """The accumulators `p`'s ColReduce ops fold into, held by `warps` compute warps (None where it has none) —
    after checking that each is an accumulator of the band's bw tiles that one reduction folds pages of bh × bw
    tiles into, and packs whole into a vector page of bw tiles."""
    bh, bw = plan.block.ibw, plan.block.osw
    reductions: dict[int, Reduction] = {}
    ops = all_ops(p)
    for op in ops:
        match op:
            case Compute(op=ColReduce() as cr, ins=(src,), acc=acc) if acc is not None:
                kind = p.buffer(acc).kind
                if not isinstance(kind, Accumulator) or kind.tiles != bw or cr.width != bw:
                    raise Unsupported(
                        f"column accumulator {p.buffer(acc).name}", f"it holds the band's {bw} tile columns (bw tiles)"
                    )
                try:
                    r = reduction_named(cr.op)
                except ElementwiseError as e:
                    raise Unsupported(f"a column reduction {cr.op!r}", str(e)) from None
                if reductions.setdefault(int(p.buffer(acc).ring), r) != r:
                    raise Unsupported(
                        f"accumulator {p.buffer(acc).name} folded by two reductions",
                        "each holds one reduction's columns",
                    )
                page = rings.kept(src)
                if page is None or page.page != bh * bw * TILE_ELEMS:
                    raise Unsupported(
                        f"a column reduction of {p.buffer(src).name}'s pages into {bw} tile columns",
                        f"a page of the band holds {bh} tile rows of its {bw} tile columns",
                    )
            case Compute(op=ColReduce()):
                raise Unsupported("a column reduction without one input page and an accumulator", "verify says why")
    if not reductions:
        return None
    for op in ops:
        if isinstance(op, PackAcc) and int(p.buffer(op.acc).ring) in reductions:
            vector = rings.kept(op.to)
            if op.tiles != bw or vector is None or vector.page != bw * TILE_ELEMS or op.accumulate:
                raise Unsupported(
                    f"a column accumulator packed into {op.tiles} tiles of {p.buffer(op.to).name}",
                    f"a column vector is a page of the band's {bw} tile columns, packed whole",
                )
    threads = warps * WARP
    per_thread = math.ceil(bw * 16 / threads)
    registers = row_registers(per_thread * len(reductions), bh * bw)
    return ColAccumulators(bw * 16, threads, per_thread, reductions, registers)


class ColPrinter:
    """Prints the column accumulators' ops on the compute threads (a mixin of the general form's `EnginePrinter`,
    whose kernel `k` — its `cols` — writer `w`, thread index `tid`, ring slots, page loads and `kept` it uses)."""

    k: Any
    w: Writer
    tid: str
    kept: Any  # (annotations only: the methods are EnginePrinter's and TilePrinter's)
    read_slot: Any
    write_slot: Any
    load: Any

    def col_accumulator(self, op: ChoreoOp) -> Reduction | None:
        """The reduction of the column accumulator `op` acquires, folds into, packs or releases; None for any other."""
        cols: ColAccumulators | None = getattr(self.k, "cols", None)
        if cols is None:
            return None
        match op:
            case AcquireAcc(buf) | ReleaseAcc(buf) | PackAcc(acc=buf) | Compute(acc=buf) if buf is not None:
                return cols.reductions.get(int(self.k.program.buffer(buf).ring))
        return None

    def col_op(self, op: ChoreoOp, env: dict[LoopVar, str], mark: str) -> bool:
        """Print `op` if it is an op on a column accumulator, and say whether it was."""
        r = self.col_accumulator(op)
        if r is None:
            return False
        w = self.w
        match op:
            case AcquireAcc(buf):
                w.line("#pragma unroll")
                with w.block("for (int q = 0; q < CCOLS; ++q)", mark):
                    w.line(f"{self.cacc(buf)}[q] = {r.c_identity};")
            case ReleaseAcc():
                w.line("", f"{mark} (the column accumulator stays in registers)")
            case Compute(op=ColReduce() as cr, ins=(src,), acc=acc):
                self.fold_cols(cr, r, self.kept(src), self.cacc(acc), env, mark)
            case PackAcc(acc=acc, to=to):
                self.pack_cols(self.cacc(acc), self.kept(to), mark)
            case _:
                return False
        return True

    def cacc(self, buf) -> str:
        """The C array of accumulator `buf`'s columns (its template's)."""
        return f"cacc_{int(self.k.program.buffer(buf).ring)}"

    def fold_cols(self, cr: ColReduce, r: Reduction, src: Ring, cacc: str, env: dict[LoopVar, str], mark: str) -> None:
        """ColReduce: each thread folds each of its columns of the front page into its value, row after row, the
        rows at or past the column's height left out."""
        w = self.w
        cols: ColAccumulators = self.k.cols
        rows = src.page // (cr.width * TILE_ELEMS) * 16  # the page's element rows
        page = f"ring_{src.id} + {self.read_slot(src.id)} * PAGE_{src.id}"
        with w.block("", mark):
            w.line(f"const long long row0 = (long long)({addr_expr(cr.at, env)}) * 16;  // the page's first row")
            w.line(f"const int rows = row0 + {rows} <= {cr.rows} ? {rows} : (int)({cr.rows} - row0);  // no padding")
            w.line("#pragma unroll")
            with w.block("for (int q = 0; q < CCOLS; ++q)"):
                w.line(f"const int col = {self.tid} + q * {cols.threads};  // the band's element column")
                cond = cols.within("col")
                with w.block(f"if ({cond[0]})") if cond else w.block(""):
                    w.line(f"const {src.c_type}* at_col = {page} + (col / 16) * {TILE_ELEMS} + col % 16;")
                    w.line("#pragma unroll 1")
                    with w.block("for (int r = 0; r < rows; ++r)"):
                        load = self.load(f"at_col + (r / 16) * {cr.width * TILE_ELEMS} + (r % 16) * 16", "")
                        w.line(f"const float x = (float){load};")
                        w.line(f"{cacc}[q] = {r.c_combine(f'{cacc}[q]', r.c_pre('x'))};")

    def pack_cols(self, cacc: str, vector: Ring, mark: str) -> None:
        """PackAcc of a column accumulator: each column's value stored into each of its 16 rows of the vector page."""
        w = self.w
        cols: ColAccumulators = self.k.cols
        page = f"ring_{vector.id} + {self.write_slot(vector.id)} * PAGE_{vector.id}"
        with w.block("", mark):
            w.line("#pragma unroll")
            with w.block("for (int q = 0; q < CCOLS; ++q)"):
                w.line(f"const int col = {self.tid} + q * {cols.threads};")
                cond = cols.within("col")
                with w.block(f"if ({cond[0]})") if cond else w.block(""):
                    w.line("#pragma unroll")
                    with w.block("for (int r = 0; r < 16; ++r)"):
                        at = f"{page} + (col / 16) * {TILE_ELEMS} + r * 16 + col % 16"
                        w.line(f"SPATIALC_PAGE_ST({at}, (EPIT){cacc}[q]);")


def checked_cols(p: SpatialProgram) -> tuple[MmaTypes, tuple[Stage, ...]]:
    """A program that reduces columns (`spatialc.col_reduce`): the C types of its input and its compute stages in
    order (the reduction, then the maps of its vector) — after checking that it is a float program (the kernel's
    column accumulators are float32), its pages laid out by rows and its maps ones the printers spell."""
    if p.precision == Precision.INT8:
        raise UnsupportedPrecision("int8", "a column program's reductions are float arithmetic: use fp16 or bf16")
    shape = col_shape(p)
    _check_row_major_pages(p)
    maps = tuple(s.kind.op for s in shape.maps)  # type: ignore[union-attr]
    epilogue.check_maps(p, maps, False)  # type: ignore[arg-type]
    for t in p.tensors:
        if t.role == TensorRole.OUTPUT and t.dtype not in (DType.FLOAT32, DType.FP16, DType.BF16):
            raise UnsupportedPrecision(t.dtype.value, f"a column program's output {t.name} holds float32, fp16 or bf16")
    return operand_types(p, p.precision), (shape.reduce, *shape.maps)

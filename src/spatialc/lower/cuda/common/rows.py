"""The general form's row reductions (`spatialc.rows`: softmax, RMSNorm): the row accumulators, the RowReduce that
folds a page into them, the PackAcc that stores them as a row vector, and a map's read of that vector (RowArg) —
what `interp.support.row_reduce` and `packed_rows` define.

A band of bh tile rows has bh·16 element rows. Compute warp w holds rows w, w + NWARP, w + 2·NWARP, … (RROWS of
them), one float a row in each lane (`racc_<acc>[q]`): the lane's share of that row. AcquireAcc sets every share to
the reduction's identity; a RowReduce combines into it the row's elements of the page in the columns lane,
lane + 32, …, leaving out those at or past the row's logical width (the padding, which a map before the reduction
may have made other than zero). PackAcc combines the 32 shares of each row with butterfly shuffles and stores the
row's value into every column of its row of the vector page: bh tiles, tile r the rows of tile row r. A map reads
the vector at its element's own row and column.

Each reduction's C (its identity, the `pre` of an element, the combine) is `numerics.reductions.REDUCTIONS`'s, the
combine the elementwise table's add, max or min. A float32 sum in the warps' order lies within the bound the
tolerance gives every kernel's (`reductions.reduce_bound`); max, min and absmax are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ....ir.ids import LoopVar
from ....ir.nodes import Accumulator, Plan, SpatialProgram
from ....ir.ops import AcquireAcc, ChoreoOp, Compute, PackAcc, ReleaseAcc, RowReduce, ScaleAcc
from ....numerics.elementwise import ElementwiseError
from ....numerics.reductions import Reduction, reduction_named
from ....target import WARP
from ...errors import Unsupported
from .cwriter import Writer, addr_expr
from .program import all_ops
from .rings import TILE_ELEMS, Ring, Rings

FULL_MASK = "0xffffffffu"
# Registers a thread of a row program's kernel uses: a base, two for each share of a row a lane holds, one for each
# tile of a page (the reader's unrolled copies). Calibrated with ptxas -v (nvcc 13, sm_90, without a minimum of blocks
# per SM) on softmax and RMSNorm in bands of 1, 2, 4 and 8 tile rows read 1, 4 and 8 tiles a page: they used 56 to
# 130 registers, each at or below this estimate. The blocks an SM holds follow from it, and so the register cap
# `__launch_bounds__` gives ptxas, which must leave the kernel room not to spill.
BASE_REGISTERS, SHARE_REGISTERS, TILE_REGISTERS = 80, 2, 1


@dataclass(frozen=True, slots=True)
class RowAccumulators:
    """The row accumulators of a kernel: the band's element rows, the rows each compute warp holds of them, and each
    accumulator's reduction by its template id."""

    band_rows: int
    warps: int
    per_warp: int
    reductions: dict[int, Reduction]
    registers: int  # the estimate of a thread's registers (BASE_REGISTERS)

    def within(self, row: str) -> list[str]:
        """The C condition that `row` is one of the band's, where the warps' rows run past them (else none)."""
        return [] if self.warps * self.per_warp == self.band_rows else [f"{row} < {self.band_rows}"]


def row_accumulators(p: SpatialProgram, plan: Plan, rings: Rings, warps: int) -> RowAccumulators:
    """The accumulators `p`'s RowReduce ops fold into, held by `warps` compute warps — after checking that each is
    an accumulator of the band's bh tiles that one reduction folds pages of bh rows into, and packs into a vector
    page of bh tiles."""
    bh = plan.block.osh
    reductions: dict[int, Reduction] = {}
    ops = all_ops(p)
    for op in ops:
        match op:
            case Compute(op=RowReduce() as rr, ins=(src,), acc=acc) if acc is not None:
                _check_accumulator(p, acc, bh)
                t = int(p.buffer(acc).ring)
                try:
                    r = reduction_named(rr.op)
                except ElementwiseError as e:
                    raise Unsupported(f"a row reduction {rr.op!r}", str(e)) from None
                if reductions.setdefault(t, r) != r:
                    raise Unsupported(
                        f"accumulator {p.buffer(acc).name} folded by two reductions", "each holds one reduction's rows"
                    )
                page = rings.kept(src)
                if page is None or page.page != bh * rr.width * TILE_ELEMS:
                    raise Unsupported(
                        f"a row reduction of {p.buffer(src).name}'s pages into {bh} tile rows of {rr.width} tiles",
                        "a page of the band holds its bh tile rows, each the reduction's width",
                    )
            case Compute(op=RowReduce()):
                raise Unsupported("a row reduction without one input page and an accumulator", "verify says why")
    for op in ops:
        if isinstance(op, PackAcc) and int(p.buffer(op.acc).ring) in reductions:
            vector = rings.kept(op.to)
            if op.tiles != bh or vector is None or vector.page != bh * TILE_ELEMS:
                raise Unsupported(
                    f"a row accumulator packed into {op.tiles} tiles of {p.buffer(op.to).name}",
                    f"a row vector is a page of the band's {bh} tile rows",
                )
    per_warp = math.ceil(bh * 16 / warps)
    registers = row_registers(per_warp * len(reductions), bh * plan.block.ibw)
    return RowAccumulators(bh * 16, warps, per_warp, reductions, registers)


def row_registers(shares: int, page_tiles: int) -> int:
    """The estimate of a thread's registers in a kernel whose compute lanes hold `shares` row shares each and read
    pages of `page_tiles` tiles (`BASE_REGISTERS`)."""
    return BASE_REGISTERS + SHARE_REGISTERS * shares + TILE_REGISTERS * page_tiles


def _check_accumulator(p: SpatialProgram, acc, bh: int) -> None:
    kind = p.buffer(acc).kind
    if not isinstance(kind, Accumulator) or kind.tiles != bh:
        raise Unsupported(
            f"row accumulator {p.buffer(acc).name}", f"a row accumulator holds the band's {bh} tile rows (bh tiles)"
        )


class RowPrinter:
    """Prints the row accumulators' ops on the compute warps (a mixin of the general form's `EnginePrinter` and the
    persistent form's page printer, whose kernel `k` — its `rows` — writer `w`, thread index `tid`, ring slots, page
    loads and `kept` it uses)."""

    k: Any
    w: Writer
    tid: str
    kept: Any  # (annotations only: the methods are EnginePrinter's and TilePrinter's)
    read_slot: Any
    write_slot: Any
    load: Any
    lean: bool  # whether the engine is printed lean on registers (`TilePrinter.lean`): its page loops rolled

    def row_accumulator(self, op: ChoreoOp) -> Reduction | None:
        """The reduction of the row accumulator `op` acquires, folds into, packs or releases; None for any other
        op."""
        rows: RowAccumulators | None = self.k.rows
        if rows is None:
            return None
        match op:
            case AcquireAcc(buf) | ReleaseAcc(buf) | PackAcc(acc=buf) | Compute(acc=buf) if buf is not None:
                return rows.reductions.get(int(self.k.program.buffer(buf).ring))
        return None

    def row_op(self, op: ChoreoOp, env: dict[LoopVar, str], mark: str) -> bool:
        """Print `op` if it is an op on a row accumulator, and say whether it was."""
        r = self.row_accumulator(op)
        if r is None:
            return False
        w = self.w
        match op:
            case AcquireAcc(buf):
                w.line("#pragma unroll")
                with w.block("for (int q = 0; q < RROWS; ++q)", mark):
                    w.line(f"{self.racc(buf)}[q] = {r.c_identity};")
            case ReleaseAcc():
                w.line("", f"{mark} (the row accumulator stays in registers)")
            case Compute(op=RowReduce() as rr, ins=(src,), acc=acc):
                self.fold(rr, r, self.kept(src), self.racc(acc), env, mark)
            case Compute(op=ScaleAcc(), ins=(src,), acc=acc):
                self.scale_rows(r, self.racc(acc), self.kept(src), mark)
            case PackAcc(acc=acc, to=to):
                self.pack_rows(r, self.racc(acc), self.kept(to), mark)
            case _:
                return False
        return True

    def racc(self, buf) -> str:
        """The C array of accumulator `buf`'s shares (its template's)."""
        return f"racc_{int(self.k.program.buffer(buf).ring)}"

    def warp_rows(self) -> None:
        """The warp's index among the compute warps and the lane's, which place its rows and columns."""
        self.w.line(f"const int rw = {self.tid} / {WARP}, lane = {self.tid} % {WARP};")

    def fold(self, rr: RowReduce, r: Reduction, src: Ring, racc: str, env: dict[LoopVar, str], mark: str) -> None:
        """RowReduce: each lane folds its columns of each of its warp's rows of the front page into its shares."""
        w = self.w
        rows: RowAccumulators = self.k.rows
        width = rr.width * 16  # the page's columns of a row
        page = f"ring_{src.id} + {self.read_slot(src.id)} * PAGE_{src.id}"
        with w.block("", mark):
            self.warp_rows()
            w.line(f"const long long col0 = (long long)({addr_expr(rr.at, env)}) * 16;  // the page's first column")
            w.line("#pragma unroll")
            with w.block("for (int q = 0; q < RROWS; ++q)"):
                w.line("const int row = rw + q * NWARP;  // the band's element row")
                w.line(f"const {src.c_type}* at_row = {page} + (row / 16) * {rr.width * TILE_ELEMS} + (row % 16) * 16;")
                cond = " && ".join([*rows.within("row"), f"col0 + c < {rr.cols}"])
                if self.lean:  # (TilePrinter.lean: the registers of an unrolled column loop are not there)
                    w.line("#pragma unroll 1")
                column = w.block(f"for (int c = lane; c < {width}; c += {WARP})")
                with column, w.block(f"if ({cond})", "// the row's padding is left out"):
                    load = self.load(f"at_row + (c / 16) * {TILE_ELEMS} + c % 16", "")
                    w.line(f"const float x = (float){load};")
                    w.line(f"{racc}[q] = {r.c_combine(f'{racc}[q]', r.c_pre('x'))};")

    def scale_rows(self, r: Reduction, racc: str, vector: Ring, mark: str) -> None:
        """ScaleAcc of a row accumulator: each of the lane's shares of a row times the row's value in the front page
        of `vector` (a row vector of the band's tile rows, each row's value in every column: column 0 is read). A
        sum's shares add up to the row's value, so scaling each scales it; no other reduction is scaled so."""
        w = self.w
        rows: RowAccumulators = self.k.rows
        if r.combine != "add":
            raise Unsupported(
                f"scaling a row accumulator of a {r.name} reduction",
                "only a sum's shares scale with the row's value (online softmax rescales its running sum)",
            )
        if vector.page != rows.band_rows // 16 * TILE_ELEMS:
            raise Unsupported(
                f"scaling a row accumulator by {vector.name}'s pages of {vector.page // TILE_ELEMS} tiles",
                f"a row vector is a page of the band's {rows.band_rows // 16} tile rows",
            )
        page = f"ring_{vector.id} + {self.read_slot(vector.id)} * PAGE_{vector.id}"
        with w.block("", mark):
            self.warp_rows()
            w.line("(void)lane;")
            w.line("#pragma unroll")
            with w.block("for (int q = 0; q < RROWS; ++q)"):
                w.line("const int row = rw + q * NWARP;  // the band's element row")
                at = f"{page} + (row / 16) * {TILE_ELEMS} + (row % 16) * 16"
                scale = f"{racc}[q] *= (float){self.load(at, '')};"
                w.line(f"if ({rows.within('row')[0]}) {scale}" if rows.within("row") else scale)

    def pack_rows(self, r: Reduction, racc: str, vector: Ring, mark: str) -> None:
        """PackAcc of a row accumulator: each row's 32 shares combined across the warp, the row's value stored into
        each of its 16 columns of the vector page."""
        w = self.w
        rows: RowAccumulators = self.k.rows
        page = f"ring_{vector.id} + {self.write_slot(vector.id)} * PAGE_{vector.id}"
        with w.block("", mark):
            self.warp_rows()
            w.line("#pragma unroll")
            with w.block("for (int q = 0; q < RROWS; ++q)"):
                w.line(f"float v = {racc}[q];")
                w.line("#pragma unroll")
                with w.block("for (int m = 16; m > 0; m >>= 1)"):
                    w.line(f"v = {r.c_combine('v', f'__shfl_xor_sync({FULL_MASK}, v, m)')};")
                # Every lane now holds the row's value; lane 0's is taken, so that a max of +0 and -0, which
                # depends on the order of its operands, puts one value into every column.
                w.line(f"v = __shfl_sync({FULL_MASK}, v, 0);")
                w.line("const int row = rw + q * NWARP;")
                with w.block(f"if ({' && '.join([*rows.within('row'), 'lane < 16'])})"):
                    at = f"{page} + (row / 16) * {TILE_ELEMS} + (row % 16) * 16 + lane"
                    w.line(f"SPATIALC_PAGE_ST({at}, (EPIT)v);")


def row_read(tile: str, el: str, width: int) -> str:
    """The offset in a row vector's page of the value of page tile `tile`'s element `el` of a map's other pages
    (rows of `width` tiles): the same element of the vector's tile of its tile row."""
    return f"({tile} / {width}) * {TILE_ELEMS} + {el}"

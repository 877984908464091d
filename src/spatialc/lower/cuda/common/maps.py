"""The page-to-page map every form that runs stages on pages prints alike: an elementwise stage (a `Map` of the
front pages of several rings, with column and row vectors, or a requant) filling the newest page of its output ring.
The general form runs it on its compute engine's warps (an epilogue stage, a map program's map, a row program's
maps), the persistent form on the whole block, serialised with the site's other engines. The C of each op is the
elementwise table's (`epilogue.value`); a row vector is read as `rows.row_read` places it.

A mixin: the printer it is mixed into gives the kernel `k` (its program, whether it is int8, its operand types), the
writer `w`, the engine's thread index `tid` and count `nthreads`, and the ring slots `read_slot` / `write_slot`.
Page elements are read and written through SPATIALC_PAGE_LD / SPATIALC_PAGE_ST (`cwriter.PAGE_MACROS`), which the
host emulation checks for races.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ....ir.ids import LoopVar
from ....ir.nodes import PageLayout
from ....ir.ops import Apply, Col, Compute, Expr, Map, Pos, VecAxis, row_reads
from ....ir.ops import cols as expr_cols
from ....ir.printer import compute_text
from ....numerics.cexpr import c_position
from ...errors import Unsupported
from . import epilogue
from .cwriter import Writer, addr_expr
from .rings import TILE_ELEMS, Ring
from .rows import row_read


class MapPrinter:
    """Prints a stage page to page (a mixin; see the module's docstring for what it reads of its host)."""

    k: Any
    w: Writer
    tid: str
    nthreads: str
    read_slot: Any  # (annotations only: the methods are the host printer's)
    write_slot: Any
    lean: bool  # whether the engine is printed lean on registers (`TilePrinter.lean`): its page loops rolled

    @contextmanager
    def element_loop(self, n: int) -> Iterator[None]:
        """The loop over a page's `n` elements, each thread a strided share."""
        if self.lean:
            self.w.line("#pragma unroll 1")
        with self.w.block(f"for (int e = {self.tid}; e < {n}; e += {self.nthreads})"):
            yield

    def elementwise(self, op: Compute, stage, srcs: list[Ring], dst: Ring, env: dict[LoopVar, str], mark: str) -> None:
        """A stage page to page — an epilogue stage of the one page before it, a map program's map of its input
        pages, a row program's maps — each thread of the engine a strided share of the elements. Element e of every
        page is the same element of the item (verify's rule 8 follows each page to its tile), read from each input
        ring's front page as the stage's value type (`long long` in an int8 program, `float` otherwise: an operand
        page's int8, fp16 or bf16 converts exactly), and the stage's value is stored into the output ring's newest
        page. A row vector (RowArg: a page of the band's tile rows, the other pages rows of `width` tiles) is read at
        the element's own row and column (`rows.row_read`)."""
        if not epilogue.page_to_page(stage):
            raise Unsupported(f"a {compute_text(stage, self.k.program)} stage", "no form prints it page to page")
        n = dst.page
        for ring in (*srcs, dst):  # element e of a page is the same element of the item in row-major tiles only
            if ring.layout != PageLayout.ROW:
                raise Unsupported(
                    f"stage {compute_text(stage, self.k.program)} on {ring.name}'s pages in {ring.layout.value} layout",
                    "a stage reads and writes its pages element by element in row-major tiles (the row layout)",
                )
        by_row = dict(row_reads(stage.expr)) if isinstance(stage, Map) else {}
        for i, src in enumerate(srcs):
            if i in by_row and src.page * by_row[i] != n:
                raise Unsupported(
                    f"stage {compute_text(stage, self.k.program)} reading {src.name}'s pages of {src.page} elements"
                    f" as a row vector of pages of {n} in rows of {by_row[i]} tiles",
                    "a row vector holds one tile for each tile row of the pages it is read against",
                )
            if i not in by_row and src.page != n:
                raise Unsupported(
                    f"stage {compute_text(stage, self.k.program)} of {src.name}'s pages of {src.page} elements into"
                    f" {dst.name}'s of {n}",
                    "a stage maps pages of one shape, element by element",
                )
        value = "long long" if self.k.integer else "float"
        columns = expr_cols(stage.expr) if isinstance(stage, Map) else ()
        places = position_nodes(stage.expr) if isinstance(stage, Map) else ()
        for node in places:  # a position counts the page's tiles in rows of its width
            if n % (node.width * TILE_ELEMS):
                raise Unsupported(
                    f"stage {compute_text(stage, self.k.program)} placing elements in rows of {node.width} tiles"
                    f" on {dst.name}'s pages of {n // TILE_ELEMS} tiles",
                    "a position's page holds whole rows of its width",
                )

        def col_at(c: Col) -> str:
            at = addr_expr(c.at, env)
            lead = f"{at} + " if at != "0" else ""
            if c.axis == VecAxis.ROW:  # the page's tile row tl / width, the element's row in it: column 0 of each
                return f"(long long)({lead}tl / {c.width}) * {TILE_ELEMS} + (el / 16) * 16"
            return f"(long long)({lead}tl % {c.width}) * {TILE_ELEMS} + el % 16"

        def pos_at(node: Pos) -> str:
            return c_position(node, addr_expr(node.at, env), "tl", "el")

        with self.w.block("", mark), self.element_loop(n):
            if columns or by_row or places:
                self.w.line(f"const int tl = e / {TILE_ELEMS}, el = e % {TILE_ELEMS};")
            for i, src in enumerate(srcs):
                at = row_read("tl", "el", by_row[i]) if i in by_row else "e"
                page = f"ring_{src.id} + {self.read_slot(src.id)} * PAGE_{src.id} + {at}"
                self.w.line(f"const {value} v{i} = ({value})SPATIALC_PAGE_LD({page});")
            loaded = "v{}".format  # a page's value and a row vector's, each loaded above
            self.w.line(f"const {value} v = {epilogue.value(stage, self.k.integer, col_at, loaded, loaded, pos_at)};")
            # A page a matmul reads holds operands: the value converted to their type (float32 rounded to nearest
            # even, `MmaTypes.to_operand`), as the interpreter rounds a computed operand page where a matmul reads it.
            stored = f"{self.k.types.to_operand}(v)" if dst.c_type == "OPT" else "(EPIT)v"
            self.w.line(f"SPATIALC_PAGE_ST(ring_{dst.id} + {self.write_slot(dst.id)} * PAGE_{dst.id} + e, {stored});")


def position_nodes(expr: Expr) -> tuple[Pos, ...]:
    """The positions (`Pos`: a mask's rows and columns) `expr` reads, in order."""
    match expr:
        case Pos():
            return (expr,)
        case Apply(_, args):
            return tuple(node for a in args for node in position_nodes(a))
    return ()

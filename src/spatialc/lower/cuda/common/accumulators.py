"""The accumulators' printers every CUDA backend shares: zeroing the fragments a warp holds, scaling them by a row
vector, adding partial sums into them, packing them into a page, and the fused store that takes each lane's
elements through the epilogue chain straight to global memory.

`AccumulatorPrinter` is a base of `tiles.TilePrinter`, whose plan, writer, lane grid, fragment names, page
references and loops it prints with (annotated below); the tile copies and the matmul are `tiles.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from ....ir.ids import BufferId, LoopVar
from ....ir.nodes import PageLayout, Plan
from ....ir.ops import Col, Compute, Map, ReadTiles, VecAxis, WriteTiles
from ....ir.ops import cols as expr_cols
from ...census import marker
from ...errors import Unsupported
from . import epilogue
from .cwriter import Writer, addr_expr, c_mod, c_mul, c_sum
from .rings import TILE_ELEMS, Ring


class AccumulatorPrinter:
    """Prints the accumulator fragments' ops: fill, scale, partial sums, pack and the fused store (a base of
    `TilePrinter`, whose attributes and loops below it uses)."""

    plan: Plan
    w: Writer
    tid: str
    lane_grid: tuple[int, int] | None
    accf: str
    perw: str
    integer: bool
    unrolled: Any  # (annotations only: the methods are TilePrinter's)
    warp_coords: Any
    owned_tile: Any
    read_page: Any
    write_page: Any
    load: Any
    kept: Any

    def pack(self, ring: Ring, mark: str) -> None:
        """Store every accumulator fragment into its tile of the reserved page (row-major tiles of the item)."""
        h, w = self.plan.item_tiles
        r = ring.id
        if ring.layout != PageLayout.ROW:
            raise Unsupported(f"a PackAcc into {ring.name}'s {ring.layout.value} pages", "accumulators pack row-major")
        store = f"spatialc_store_acc({self.write_page(r)} + {{}} * {TILE_ELEMS}, {self.accf}[q]);"
        with self.w.block("", mark):
            if self.lane_grid is None:
                with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
                    self.w.line("const int ot = warp + q * NWARP;")
                    with self.w.block(f"if (ot < {h * w})"):
                        self.w.line(store.format("ot"))
                return
            self.warp_coords()
            with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
                self.w.line(self.owned_tile())
                self.w.line(store.format(f"(bh * {w} + bw)"))

    def scale_acc(self, vector: Ring, mark: str) -> None:
        """ScaleAcc: every element of every accumulator fragment times its row's value in the front page of `vector`,
        a row vector (one tile a tile row of the item, each row's value in every column: column 0 is read). Element i
        of a lane's fragment is in row lane / 4 + 8·((i / 2) mod 2) of its tile (tensor_core.cuh), so each lane reads
        the two rows it holds and needs no other lane's."""
        h, w = self.plan.item_tiles
        r = vector.id
        if vector.layout != PageLayout.ROW or vector.page != h * TILE_ELEMS:
            raise Unsupported(
                f"scaling an accumulator of {h} tile rows by {vector.name}'s pages of"
                f" {vector.page // TILE_ELEMS} tiles",
                "a row vector holds one tile for each tile row of the accumulator",
            )

        def scale(tile_row: str) -> None:
            # Elements 0, 1, 4, 5 lie in row lane / 4 of the tile, elements 2, 3, 6, 7 in row lane / 4 + 8.
            for half, rows in (("lo", "(lane >> 2)"), ("hi", "(lane >> 2) + 8")):
                pointer = f"{self.read_page(r)} + ({tile_row}) * {TILE_ELEMS} + ({rows}) * 16"
                self.w.line(f"const float {half} = (float){self.load(pointer, f'*({pointer})')};")
            with self.unrolled("for (int i = 0; i < 8; ++i)"):
                self.w.line(f"{self.accf}[q].x[i] *= (i >> 1) & 1 ? hi : lo;")

        with self.w.block("", mark):
            self.w.line(f"const int lane = {self.tid} % 32;")
            if self.lane_grid is None:
                with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
                    self.w.line("const int ot = warp + q * NWARP;")
                    with self.w.block(f"if (ot < {h * w})"):
                        scale(f"ot / {w}")
                return
            self.warp_coords()
            with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
                self.w.line(self.owned_tile())
                self.w.line("(void)bw;")
                scale("bh")

    def add_partial(self, ring: Ring, mark: str) -> None:
        """Add the front page of `ring` (partial sums of the item's tiles, row-major as `pack` stores them) to every
        accumulator fragment."""
        h, w = self.plan.item_tiles
        r = ring.id
        if ring.layout != PageLayout.ROW or ring.c_type != "ACCT":
            raise Unsupported(f"adding {ring.name}'s pages to accumulators", "partial sums are row-major ACCT pages")
        add = f"spatialc_add_acc({self.accf}[q], {self.read_page(r)} + {{}} * {TILE_ELEMS});"
        with self.w.block("", mark):
            if self.lane_grid is None:
                with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
                    self.w.line("const int ot = warp + q * NWARP;")
                    with self.w.block(f"if (ot < {h * w})"):
                        self.w.line(add.format("ot"))
                return
            self.warp_coords()
            with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
                self.w.line(self.owned_tile())
                self.w.line(add.format(f"(bh * {w} + bw)"))

    def direct_partials(self, op: ReadTiles | WriteTiles, env: dict[LoopVar, str], mark: str) -> None:
        """Split-K's partial sums between the accumulators and the workspace with no page between: a WriteTiles
        (`op`, of the item's block from the page PackAcc would have filled) stores each lane's own elements; a
        ReadTiles (into the page AddPartial would have added) adds them to each lane's elements. The workspace is
        tiled, as pages are: element i of a lane's fragment lies at `el` of its tile (`fused_store`), and elements
        2j, 2j + 1 are adjacent, so each pair moves as one 8-byte access (SPATIALC_GLOBAL_ST2 / _ADD2, `cwriter`);
        loads go through L2, as other sites stored them in this launch."""
        tensor = f"t{int(op.tensor)}"
        pairs = "for (int i = 0; i < 8; i += 2)"  # elements i, i + 1: adjacent columns
        with self.w.block("", mark), self.fragment_tiles(op, env), self.unrolled(pairs):
            self.w.line("const int el = lane_el + ((i >> 1) & 1) * 128 + (i >> 2) * 8;  // even: a pair")
            at, acc = f"&{tensor}[tile * {TILE_ELEMS} + el]", f"{self.accf}[q].x"
            macro = "SPATIALC_GLOBAL_ST2" if isinstance(op, WriteTiles) else "SPATIALC_GLOBAL_ADD2"
            self.w.line(f"{macro}({at}, {acc}[i], {acc}[i + 1]);")

    @contextmanager
    def fragment_tiles(self, op: ReadTiles | WriteTiles, env: dict[LoopVar, str]) -> Iterator[None]:
        """The lane's place (`lane`, `lane_el`: its first element of a tile) and, around the body, a loop over the
        warp's fragments q, each with `tile`: the tensor's tile where `op`'s page puts fragment q's tile."""
        self.warp_coords()
        self.w.line("const int lane = tid % 32;")
        self.w.line("const int lane_el = (lane >> 2) * 16 + 2 * (lane & 3);  // the lane's first element")
        with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
            self.w.line(self.owned_tile())
            base = addr_expr(op.at, env)
            rows, cols = c_mul("(long long)bh", op.stride_h), c_mul("(long long)bw", op.stride_w)
            self.w.line(f"const long long tile = {c_sum(f'(long long)({base})', rows, cols)};")
            yield

    def fused_store(
        self, op: WriteTiles, env: dict[LoopVar, str], mark: str, chain: list[tuple[Compute, dict[LoopVar, str]]]
    ) -> None:
        """The fused epilogue: each lane takes its own accumulator elements through the `chain` of elementwise stages
        (each with the loop variables of where it stood) and stores them where `op` would have written its page.

        Element i of a lane's fragment is row lane/4 + 8·((i/2) mod 2), column 8·(i/4) + 2·(lane mod 4) + i mod 2 of
        its tile (tensor_core.cuh): no lane needs another's, so nothing is staged through shared memory. Elements 2j
        and 2j + 1 are adjacent columns from an even one, so they go out as one store of twice their width
        (SPATIALC_OUT_ST2: 32 bits for bf16 / fp16 C, where single stores would write two bytes at a time)."""
        with self.w.block("", mark), self.fragment_tiles(op, env):
            if chain:
                # A chain unrolled over every element of every fragment (its bias addresses, an integer chain's
                # 64-bit arithmetic) needs more registers than the accumulators leave: the fragment's pairs
                # go through it one at a time, from a private copy (eight words of the thread's stack, not a
                # spill). A bare store stays unrolled, straight from the registers.
                self.w.line("ACCT frag[8];")
                with self.unrolled("for (int i = 0; i < 8; ++i)"):
                    self.w.line(f"frag[i] = {self.accf}[q].x[i];")
                self.w.line("#pragma unroll 1")
                value = "frag[i + j]"
                loop = self.w.block("for (int i = 0; i < 8; i += 2)")
            else:
                value = f"{self.accf}[q].x[i + j]"
                loop = self.unrolled("for (int i = 0; i < 8; i += 2)")
            with loop:
                self.w.line("const int el0 = lane_el + ((i >> 1) & 1) * 128 + (i >> 2) * 8;  // even: a pair")
                self.w.line("OUT_T pair[2];")
                with self.unrolled("for (int j = 0; j < 2; ++j)"):
                    if any(
                        isinstance(s.op, Map) and (expr_cols(s.op.expr) or len(s.ins) > 1) for s, _ in chain
                    ):  # a bias reads its column, a residual its element
                        self.w.line("const int el = el0 + j;")
                    self.read_out(op, chain, value, "pair[j] = {};")
                self.w.line(f"SPATIALC_OUT_ST2(&t{int(op.tensor)}[tile * {TILE_ELEMS} + el0], pair[0], pair[1]);")

    def read_out(
        self, op: WriteTiles, chain: list[tuple[Compute, dict[LoopVar, str]]], value: str, store: str | None = None
    ) -> None:
        """Accumulator element i, through the epilogue chain, to the output — or to where `store` (a format string
        of the value) puts it.

        It is page tile (bh, bw)'s element `el`, at row el / 16 and column el % 16; only the bias needs the column.
        Each stage's statement is its op's image and carries its census marker.
        """
        if store is None:
            store = f"SPATIALC_OUT_ST(&t{int(op.tensor)}[tile * {TILE_ELEMS} + el], {{}});"
        if not chain:
            self.w.line(store.format(f"(OUT_T){value}"))
            return
        self.w.line(f"{'long long' if self.integer else 'float'} v = {value};")
        for stage, env in chain:
            ins = stage.ins

            def page(i: int, ins=ins) -> str:  # the chain's value, or a page beside it (a residual's)
                return "v" if i == 0 else self.side_page(ins[i])

            line = epilogue.statement(stage.op, self.integer, partial(self.col_at, env=env), page)
            self.w.line(line, marker(stage))
        self.w.line(store.format("(OUT_T)v"))

    def side_page(self, buf: BufferId) -> str:
        """The element `el` of page tile (bh, bw) in the front page of `buf` — a page a read stage fills (a residual's)
        that a fused stage reads beside the chain's value, its tiles in the item's row-major order — as the value
        type."""
        ring = self.kept(buf)
        h, w = self.plan.item_tiles
        if ring.page != h * w * TILE_ELEMS or ring.layout != PageLayout.ROW:
            raise Unsupported(
                f"a fused stage reading {ring.name}'s pages of {ring.page // TILE_ELEMS} tiles ({ring.layout.value})",
                f"the fused store reads a page of the item's {h}x{w} tiles in row-major order beside its value",
            )
        pointer = f"{self.read_page(ring.id)} + (bh * {w} + bw) * {TILE_ELEMS} + el"
        value = "long long" if self.integer else "float"
        return f"(({value}){self.load(pointer, f'*({pointer})')})"

    def col_at(self, col: Col, env: dict[LoopVar, str]) -> str:
        """The flat index of the element's value in column vector `col` (a bias): tile column `at + s mod width` of
        page tile s, row 0, column el % 16 — or in row vector `col` (a per-row scale): tile row `at + s // width`,
        row el / 16, column 0.

        The page is the item's h x w tiles in row-major order, so page tile s = bh * w + bw.
        """
        w = self.plan.item_tiles[1]
        if col.axis == VecAxis.ROW:
            r = "bh" if col.width == w else f"((bh * {w} + bw) / {col.width})"
            at = addr_expr(col.at, env)
            return f"(long long)({c_sum(at if at != '0' else '', r)}) * {TILE_ELEMS} + (el / 16) * 16"
        s = "bw" if col.width == w else (c_mod(f"(bh * {w} + bw)", col.width) or "0")
        at = addr_expr(col.at, env)
        return f"(long long)({c_sum(at if at != '0' else '', s)}) * {TILE_ELEMS} + el % 16"

    def acquire(self, mark: str) -> None:
        """Zero the warp's accumulator fragments."""
        with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)", mark):
            self.w.line(f"spatialc_acc_zero({self.accf}[q]);")

"""The tile printers every CUDA backend shares: a page of tiles copied in with cp.async, stored out to global
memory, multiplied on the tensor cores (ldmatrix fragments, mma.sync; `tensor_core.cuh`) into accumulators held per
warp, and packed back into a page (the accumulators' own ops — fill, scale, partial sums, pack, the fused store — are
`accumulators.py`'s).

Each printer is written against a page reference — `read_page(ring)` for the front page a consumer reads,
`write_page(ring)` for the newest page a producer reserved — and against the thread index and count of the engine
that runs it; a backend decides what those are (slot counters of a serialised block, or the counters of an engine
on its own warps) and owns all flow control.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ....ir.ids import LoopVar
from ....ir.nodes import PageLayout, Plan, Tensor
from ....ir.ops import (
    AcquireAcc,
    ChoreoOp,
    Compute,
    Flush,
    MatmulTiles,
    Precision,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    WriteBarrier,
    WriteTiles,
)
from ....passes.footprint import operand_layouts, sized_as
from ....target import WARP
from ...errors import Unsupported
from .accumulators import AccumulatorPrinter
from .blockscale import promoted_step
from .cwriter import FP8_TYPES, Writer, addr_expr, c_div, c_mod, c_mul, c_sum, inlined_lines
from .dequant import PACKED_RING, PACKED_TILE
from .rings import TILE_ELEMS, MmaTypes, Ring, Rings


@dataclass(frozen=True, slots=True)
class Fragments:
    """One accumulator as the compute warps hold it (an MLP holds one per layer): `plan` is the program's plan with
    the block and sub-blocks of the matmul that adds into it (what the tile printers read of a plan), `lane_grid` the
    warps over that block (None: its tiles dealt round them), `perw` the fragments each warp holds; `name` is its
    fragment array in C and `count` the macro of the array's length."""

    plan: Plan
    lane_grid: tuple[int, int] | None
    perw: int
    name: str
    count: str

    @property
    def tiles(self) -> int:
        h, w = self.plan.item_tiles
        return h * w


class TilePrinter(AccumulatorPrinter):
    """Prints tile copies and the matmul into a Writer; the accumulators' fills, packs and fused store are its base's
    (`accumulators.AccumulatorPrinter`)."""

    def __init__(
        self,
        plan: Plan,
        rings: Rings,
        lane_grid: tuple[int, int] | None,
        w: Writer,
        tid: str = "tid",
        nthreads: str = "NTHREAD",
    ):
        self.plan = plan
        self.rings = rings
        self.lane_grid = lane_grid
        self.w = w
        self.tid = tid  # the thread's index among the threads that run the op
        self.nthreads = nthreads  # how many threads run it
        self.workspace: frozenset[int] = frozenset()  # tensors of partial sums (ACCT), read and written as such
        self.tensors: dict[int, Tensor] = {}  # the program's tensors, where an op limits a grouped tensor's rows
        self.out_types: dict[int, str] = {}  # outputs (by tensor id) stored as a C type of their own, not OUT_T
        self.integer = False  # the fused epilogue's arithmetic: exact int64 (int8 programs) or float32
        self.accf = "accf"  # the accumulator fragments the printers name, and the macro of their count
        self.perw = "PERW"
        # Whether the engine is printed lean on registers: its loops over a page (a map's elements, a fold's columns,
        # a matmul's K tiles) rolled, and (the general form) one counter for each ring it alone cycles. Where its
        # warps hold accumulator fragments and row accumulators at once and hand pages to themselves through shared
        # memory (attention's compute warps where its rings keep their pages: registers.py says when they do not),
        # the operands nvcc keeps in flight for an unrolled loop and four counters a ring need registers a block of
        # 10 warps does not have (ptxas spilled at head_dim 128 on sm_80 and sm_90).
        self.lean = False

    @contextmanager
    def holding(self, frags: Fragments | None) -> Iterator[None]:
        """Print ops on the accumulator `frags`: its matmul's block, lane grid and names stand for the plan's (None:
        the plan's one accumulator)."""
        if frags is None:
            yield
            return
        kept = self.plan, self.lane_grid, self.accf, self.perw
        self.plan, self.lane_grid, self.accf, self.perw = frags.plan, frags.lane_grid, frags.name, frags.count
        try:
            yield
        finally:
            self.plan, self.lane_grid, self.accf, self.perw = kept

    def item_header(self, index: str) -> None:
        """The current item and its grid coordinates, read from the work list at `index`."""
        nx = self.plan.grid[1]
        self.w.line(f"const int item_id = {index};")
        self.w.line(f"const int item_y = item_id / {nx}, item_x = item_id % {nx};")
        self.w.line("(void)item_y; (void)item_x;")

    def common(self, op: ChoreoOp, env: dict[LoopVar, str], mark: str, ordered_by: str) -> bool:
        """Print `op` if it is one every backend prints alike — tile copies in and out, the accumulators' fill,
        release and matmul step, the fences (`ordered_by` says what orders them) — and say whether it was."""
        match op:
            case ReadTiles():
                self.read_tiles(op, env, mark)
            case WriteTiles():
                self.write_tiles(op, env, mark)
            case AcquireAcc():
                self.acquire(mark)
            case ReleaseAcc():
                self.w.line("", f"{mark} (accumulators stay in registers)")
            case ReadBarrier() | WriteBarrier() | Flush():
                self.w.line("", f"{mark} ({ordered_by})")
            case Compute(op=MatmulTiles() as mm, ins=(a, b)):
                self.matmul(mm, self.kept(a), self.kept(b), mark, env)
            case _:
                return False
        return True

    def read_slot(self, r: int) -> str:
        """The slot of ring `r`'s front page (what Wait made visible and Pop frees)."""
        return f"rslot_{r}"

    def write_slot(self, r: int) -> str:
        """The slot of ring `r`'s newest reserved page."""
        return f"wslot_{r}"

    def load(self, pointer: str, element: str) -> str:
        """A plain read of one page element (`element`, at `pointer`): the element itself, here."""
        return element

    def read_page(self, r: int) -> str:
        return f"ring_{r} + {self.read_slot(r)} * PAGE_{r}"

    def write_page(self, r: int) -> str:
        return f"ring_{r} + {self.write_slot(r)} * PAGE_{r}"

    def kept(self, buf) -> Ring:
        """The ring of `buf`, which the checks before printing guarantee is kept."""
        ring = self.rings.kept(buf)
        assert ring is not None
        return ring

    def ring(self, buf) -> int:
        """The id of `buf`'s ring, the suffix of its names in the kernel."""
        return self.kept(buf).id

    # ---- data movement -------------------------------------------------------------------------------------

    def read_tiles(self, op: ReadTiles, env: dict[LoopVar, str], mark: str) -> None:
        """Every thread issues its share of the page as 16-byte copies, the width one cp.async moves."""
        ring = self.kept(op.into)
        r, bw = ring.id, op.block_w
        if int(op.tensor) in self.workspace and ring.c_type == "ACCT" and ring.layout == PageLayout.ROW:
            self.read_chunks(op, ring, "ACCT", env, mark)
            return
        if ring.c_type not in ("OPT", PACKED_RING):
            raise Unsupported(f"a ReadTiles into {ring.name}", "only operand rings are filled from global memory")
        if ring.c_type == "OPT" and ring.elem_bytes * TILE_ELEMS // 16 > WARP:
            self.read_chunks(op, ring, "OPT", env, mark)  # a float32 tile: 64 chunks, more than a warp's threads
            return
        # A tile: TILE_ELEMS operands, or PACKED_TILE bytes of packed 4-bit weights (common/dequant.py).
        elem, per = ("OPT", TILE_ELEMS) if ring.c_type == "OPT" else (PACKED_RING, PACKED_TILE)
        # A swizzled page exchanges the two 16-byte chunks of row r (chunks 2r, 2r + 1) when bit 2 of r is set.
        dst = "(off ^ ((off >> 3) & 1))" if ring.layout.swizzled else "off"
        # Every thread count here is a multiple of 32 and a tile is 16 or 32 chunks, so a thread copies the same
        # chunk of every tile it visits: its offsets are fixed once, and the loop steps over whole tiles.
        n = f"({self.nthreads})"
        with self.w.block("", mark):
            self.w.line(f"constexpr int CHUNKS = (int)(sizeof({elem}) * {per} / 16);")
            self.w.line(
                f'static_assert(sizeof({elem}) * {per} % 16 == 0, "a tile is a whole number of 16-byte chunks");'
            )
            self.w.line(f'static_assert({n} % CHUNKS == 0, "a thread copies one chunk of each tile it visits");')
            self.w.line(f"const int off = {self.tid} % CHUNKS;")
            self.w.line(f"char* page = reinterpret_cast<char*>({self.write_page(r)}) + {dst} * 16;")
            self.w.line(f"const char* src = reinterpret_cast<const char*>(t{int(op.tensor)}) + off * 16;")
            self.w.line(f"const int base = {addr_expr(op.at, env)};")
            self.w.line(f"constexpr int STEP = {n} / CHUNKS, TILES = {op.block_h * bw};")
            self.w.line("#pragma unroll")
            with self.w.block("for (int i = 0; i < (TILES + STEP - 1) / STEP; ++i)"):
                self.w.line(f"const int tl = {self.tid} / CHUNKS + i * STEP;")
                with self.w.block("if (TILES % STEP == 0 || tl < TILES)"):
                    index = self.tile_index(bw, op.stride_h, op.stride_w)
                    self.w.line(f"const int tile = {index};")
                    zfill = ""
                    if op.rows_from is not None:  # rows past their group's count: zeros, not read
                        self.w.line(f"const bool keep = {self.row_kept(op, 'tile', 'off / (CHUNKS / 16)')};")
                        zfill = ", keep ? 0 : 16"
                    self.w.line(
                        f"__pipeline_memcpy_async(page + tl * (int)sizeof({elem}) * {per}, src + (long long)tile"
                        f" * (long long)sizeof({elem}) * {per}, 16{zfill});"
                    )

    def read_chunks(self, op: ReadTiles, ring: Ring, elem: str, env: dict[LoopVar, str], mark: str) -> None:
        """A block of 4-byte tiles (of `elem`: ACCT, OPT) into a row-major page: 16-byte copies dealt round the
        threads, however many chunks a tile has. Partial sums from a workspace (which the sites that wrote them made
        visible before the semaphore this engine waited on was raised), and float32 operands, whose tile of 64 chunks
        is more than `read_tiles`' one chunk a thread of a warp."""
        r, bw = ring.id, op.block_w
        if ring.layout != PageLayout.ROW or op.rows_from is not None:
            raise Unsupported(f"a ReadTiles of 4-byte tiles into {ring.name}", "such pages are row-major, ungrouped")
        with self.w.block("", mark):
            self.w.line(f"constexpr int CHUNKS = (int)(sizeof({elem}) * {TILE_ELEMS} / 16), TILES = {op.block_h * bw};")
            self.w.line(f"char* page = reinterpret_cast<char*>({self.write_page(r)});")
            self.w.line(f"const char* src = reinterpret_cast<const char*>(t{int(op.tensor)});")
            self.w.line(f"const int base = {addr_expr(op.at, env)};")
            with self.w.block(f"for (int c = {self.tid}; c < TILES * CHUNKS; c += {self.nthreads})"):
                self.w.line("const int tl = c / CHUNKS, off = c % CHUNKS;")
                self.w.line(f"const int tile = {self.tile_index(bw, op.stride_h, op.stride_w)};")
                self.w.line(
                    f"__pipeline_memcpy_async(page + (tl * (int)sizeof({elem}) * {TILE_ELEMS} + off * 16), src +"
                    f" ((long long)tile * (long long)sizeof({elem}) * {TILE_ELEMS} + off * 16), 16);"
                )

    def row_kept(self, op: ReadTiles | WriteTiles, tile: str, row: str) -> str:
        """Whether row `row` of tile `tile` of a grouped tensor lies below its group's row count (a C expression):
        the stacked tile row gives the group and the row within it; the count is element `group` of `rows_from`."""
        t = self.tensors[int(op.tensor)]
        ti = f"({tile} / {t.tiles[1]})"
        group = f"({ti} / {t.group_tiles[0]})"
        at = f"({group} / 16) * {TILE_ELEMS} + {group} % 16"  # element (0, group) of a 1 × groups tensor
        return f"({ti} % {t.group_tiles[0]}) * 16 + {row} < t{int(op.rows_from)}[{at}]"

    @staticmethod
    def tile_index(bw: int, sh: int, sw: int) -> str:
        """The tensor's tile index of page tile `tl` of a `? × bw` block whose first tile is `base`, with strides
        (sh, sw). Tile indices fit a C int (verify's rule 1 bounds every tensor's grid); bytes are counted in 64 bits
        where it is used."""
        return c_sum("base", c_mul(c_div("tl", bw), sh), c_mul(f"(tl % {bw})" if bw > 1 else "", sw))

    def a_slot(self, ring: Ring, row: str, kk: str) -> str:
        """The page slot of A's tile (row, kk): row-major over the page's ibw columns."""
        return f"({c_mul(f'({row})', self.plan.block.ibw)} + {kk})"

    def write_tiles(self, op: WriteTiles, env: dict[LoopVar, str], mark: str) -> None:
        """The front page of a ring to global memory, every thread a strided share of its elements."""
        ring = self.kept(op.src)
        r = ring.id
        if ring.layout != PageLayout.ROW:
            raise Unsupported(
                f"a WriteTiles from {ring.name}'s {ring.layout.value} pages", "output pages are row-major"
            )
        n = op.block_h * op.block_w * TILE_ELEMS
        with self.w.block("", mark):
            self.w.line(f"const int base = {addr_expr(op.at, env)};")
            with self.w.block(f"for (int e = {self.tid}; e < {n}; e += {self.nthreads})"):
                self.w.line(f"const int tl = e / {TILE_ELEMS}, el = e % {TILE_ELEMS};")
                self.w.line(f"const int tile = {self.tile_index(op.block_w, op.stride_h, op.stride_w)};")
                page = self.load(
                    f"ring_{r} + {self.read_slot(r)} * PAGE_{r} + e", f"ring_{r}[{self.read_slot(r)} * PAGE_{r} + e]"
                )
                at = f"t{int(op.tensor)}[(long long)tile * {TILE_ELEMS} + el]"
                if int(op.tensor) in self.workspace:  # read by other sites in this launch (`PAGE_MACROS`)
                    store = f"SPATIALC_GLOBAL_ST(&{at}, (ACCT){page});"
                else:  # (SPATIALC_OUT_ST: the emulation checks it)
                    store = f"SPATIALC_OUT_ST(&{at}, ({self.out_types.get(int(op.tensor), 'OUT_T')}){page});"
                if op.rows_from is not None:  # rows past their group's count are left alone
                    store = f"if ({self.row_kept(op, 'tile', 'el / 16')}) {{ {store} }}"
                self.w.line(store)

    # ---- the tile matmul and its accumulators --------------------------------------------------------------

    def warp_coords(self) -> None:
        """Declare the warp's place in the lane grid (only the coordinates that vary, so none is unused)."""
        wm, wn = self.lane_grid  # type: ignore[misc]
        if wm > 1:
            self.w.line(f"const int wi = warp / {wn};")
        if wn > 1:
            self.w.line(f"const int wj = warp % {wn};")

    def rect(self) -> tuple[int, int, int, int, int, int]:
        """(wm, wn, rm, rn, sh, sw): the lane grid, each warp's rectangle, the sub-blocks."""
        wm, wn = self.lane_grid  # type: ignore[misc]
        blk, (sh, sw) = self.plan.block, self.plan.sub_blocks
        return wm, wn, blk.osh // wm, blk.osw // wn, sh, sw

    def place(self, a: str, b: str, i: str, j: str) -> tuple[str, str, str]:
        """Item row, item column and fragment index of row i, column j of this warp's rectangle in sub-block (a, b).

        Fragments are numbered q = ((a·sw + b)·rm + i)·rn + j: by sub-block first, so no two sub-blocks share one.
        """
        wm, wn, rm, rn, _, sw = self.rect()
        blk = self.plan.block
        row = c_sum(c_mul(a, blk.osh), c_mul("wi" if wm > 1 else "", rm), i)
        col = c_sum(c_mul(b, blk.osw), c_mul("wj" if wn > 1 else "", rn), j)
        return row, col, c_sum(c_mul(a, sw * rm * rn), c_mul(b, rm * rn), c_mul(i, rn), j)

    def owned_tile(self) -> str:
        """`bh`, `bw`: the item tile that fragment `q` of this warp holds."""
        _, _, rm, rn, sh, sw = self.rect()
        a = c_div("q", sw * rm * rn) if sh > 1 else ""
        row, col, _ = self.place(a, c_mod(c_div("q", rm * rn), sw), c_mod(c_div("q", rn), rm), c_mod("q", rn))
        return f"const int bh = {row}, bw = {col};"

    def matmul(self, mm: MatmulTiles, a: Ring, b: Ring, mark: str, env: dict[LoopVar, str] | None = None) -> None:
        """One K step for every sub-block of the item, accumulating in registers (a block-scaled step: into partial
        fragments, then promoted, `blockscale.promoted_step`)."""
        check_operand_layouts(mm.operand, a, b, mm.transpose_b)
        with self.w.block("", mark):
            if mm.scales is not None:
                promoted_step(self, mm, a, b, env or {})
            elif self.lane_grid is None:
                self.matmul_strided(mm, a, b)
            else:
                self.matmul_grid(mm, a, b)

    @staticmethod
    def k_pairs(mm: MatmulTiles) -> int:
        """K tiles taken two at a time: the 8-bit operands' (int8, e4m3, e5m2) native MMA is k32, two 16-wide tiles
        (the rest goes one at a time)."""
        return 2 if sized_as(mm.operand) == Precision.INT8 and mm.block.ibw >= 2 else 1

    def k_loop(self, mm: MatmulTiles, body) -> None:
        """`body(kk, step)` for each K step of the page: steps of two tiles where the MMA takes them, then one."""
        ibw, pair = mm.block.ibw, self.k_pairs(mm)
        whole = ibw - ibw % pair
        if self.lean:
            self.w.line("#pragma unroll 1")
        loop = self.w.block if self.lean else self.unrolled
        with loop(f"for (int kk = 0; kk < {whole}; kk += {pair})"):
            body("kk", pair)
        if whole < ibw:
            with self.w.block(""):
                self.w.line(f"const int kk = {whole};")
                body("kk", 1)

    @staticmethod
    def a_loader(mm: MatmulTiles, a: Ring) -> str:
        """How A's fragments are loaded (`operand_load`'s `which`): from swizzled 16-bit tiles or plain 8-bit ones
        (a: 8-bit A pages are row-major), from plain 16-bit ones (a_row: a page an engine computed, stored as the
        accumulator's rows), or from plain float32 ones rounded as they are loaded (a_float: a page other ops read
        unrounded, attention's P)."""
        wide = sized_as(mm.operand) != Precision.INT8
        if a.c_type == "EPIT" and wide:
            return "a_float"
        return "a_row" if wide and not a.layout.swizzled else "a"

    @staticmethod
    def b_loader(mm: MatmulTiles, b: Ring) -> str:
        """How B's fragments are loaded (`operand_load`'s `which`): from swizzled 16-bit tiles or K-major 8-bit ones
        (b); from plain row-major 16-bit tiles (b_row: a tensor's tiles as stored); or, where the page holds Bᵀ
        (`transpose_b`: K's rows as stored, a K-major B), from its 16-bit tiles without the transposing load (bt,
        swizzled; bt_row, plain)."""
        if mm.transpose_b:
            return "bt" if b.layout.swizzled else "bt_row"
        return "b_row" if sized_as(mm.operand) != Precision.INT8 and b.layout == PageLayout.ROW else "b"

    def b_fragment(self, mm: MatmulTiles, b: Ring, frag: str, tile: Callable[[str], str], slot: str, kk: str) -> None:
        """Print the load of one B fragment, page slot `slot` at `tile(kk)` (a form's mixin may read it otherwise:
        the general form's W4A16 register path, common/dequant.py)."""
        self.w.line(self.operand_load(self.b_loader(mm, b), frag, tile, kk, 1))

    @staticmethod
    def b_slot(mm: MatmulTiles, col: str, kk: str, rows: str) -> str:
        """The page slot of B's tile (kk, col): `rows` (row-major over the page's sw·osw columns) — or, where the
        page holds Bᵀ (`transpose_b`), tile (col, kk) of its ibw columns."""
        if mm.transpose_b:
            return f"({c_mul(f'({col})', mm.block.ibw)} + {kk})"
        return rows

    @staticmethod
    def operand_load(which: str, frag: str, tile, kk: str, step: int) -> str:
        """A fragment load of `step` K tiles from page tile `tile(kk)` on (`which`: a, a_row or b)."""
        if step == 1:
            return f"spatialc_load_{which}({frag}, {tile(kk)});"
        return f"spatialc_load_{which}2({frag}, {tile(kk)}, {tile(f'({kk} + 1)')});"

    @staticmethod
    def mma(acc: str, a: str, b: str, step: int) -> str:
        return f"spatialc_mma{'2' if step == 2 else ''}({acc}, {a}, {b});"

    def matmul_grid(self, mm: MatmulTiles, a_ring: Ring, b_ring: Ring) -> None:
        """A warp owns one rectangle of every sub-block: per K step it loads each B fragment of its columns once and
        each A fragment of its rows once, and makes every product of them."""
        _, _, rm, rn, sh, sw = self.rect()
        blk = mm.block
        a, i = (c_div("r", rm) if sh > 1 else ""), c_mod("r", rm)
        b, j = (c_div("c", rn) if sw > 1 else ""), c_mod("c", rn)
        row, col, q = self.place(a, b, i, j)
        self.warp_coords()

        def a_tile(kk: str) -> str:
            return f"{self.read_page(a_ring.id)} + {self.a_slot(a_ring, row, kk)} * {TILE_ELEMS}"

        def b_tile(kk: str) -> str:
            slot = self.b_slot(mm, col, kk, f"({kk} * {sw * blk.osw} + {col})")
            return f"{self.read_page(b_ring.id)} + {slot} * {TILE_ELEMS}"

        def step(kk: str, n: int) -> None:
            self.w.line(f"spatialc_frag<OPT> bf[{sw * rn}];")
            with self.unrolled(f"for (int c = 0; c < {sw * rn}; ++c)"):
                if n == 1:
                    slot = self.b_slot(mm, col, kk, f"({kk} * {sw * blk.osw} + {col})")
                    self.b_fragment(mm, b_ring, "bf[c]", b_tile, slot, kk)
                else:
                    self.w.line(self.operand_load(self.b_loader(mm, b_ring), "bf[c]", b_tile, kk, n))
            with self.unrolled(f"for (int r = 0; r < {sh * rm}; ++r)"):
                self.w.line("spatialc_frag<OPT> af;")
                self.w.line(self.operand_load(self.a_loader(mm, a_ring), "af", a_tile, kk, n))
                with self.unrolled(f"for (int c = 0; c < {sw * rn}; ++c)"):
                    self.w.line(f"const int q = {q};")
                    self.w.line(self.mma(f"{self.accf}[q]", "af", "bf[c]", n))

        self.k_loop(mm, step)

    def matmul_strided(self, mm: MatmulTiles, a: Ring, b: Ring) -> None:
        """No lane grid divides the block: warp w owns item tiles w, w + NWARP, … — correct, and slower."""
        h, w = self.plan.item_tiles

        def a_tile(kk: str) -> str:
            return f"{self.read_page(a.id)} + {self.a_slot(a, 'oi', kk)} * {TILE_ELEMS}"

        def b_tile(kk: str) -> str:
            slot = self.b_slot(mm, "oj", kk, f"({c_mul(kk, w)} + oj)")
            return f"{self.read_page(b.id)} + {slot} * {TILE_ELEMS}"

        def step(kk: str, n: int) -> None:
            self.w.line("spatialc_frag<OPT> af, bf;")
            self.w.line(self.operand_load(self.a_loader(mm, a), "af", a_tile, kk, n))
            if n == 1:
                slot = self.b_slot(mm, "oj", kk, f"({c_mul(kk, w)} + oj)")
                self.b_fragment(mm, b, "bf", b_tile, slot, kk)
            else:
                self.w.line(self.operand_load(self.b_loader(mm, b), "bf", b_tile, kk, n))
            self.w.line(self.mma(f"{self.accf}[q]", "af", "bf", n))

        with self.unrolled(f"for (int q = 0; q < {self.perw}; ++q)"):
            self.w.line("const int ot = warp + q * NWARP;")
            with self.w.block(f"if (ot < {h * w})"):
                self.w.line(f"const int oi = ot / {w}, oj = ot % {w};")
                self.k_loop(mm, step)

    @contextmanager
    def unrolled(self, head: str, mark: str = "") -> Iterator[None]:
        """A loop fully unrolled, so fragment arrays are indexed by constants and stay in registers."""
        self.w.line("#pragma unroll")
        with self.w.block(head, mark):
            yield


def tensor_core_lines(rings: Rings, types: MmaTypes, more_loads: bool = False) -> list[str]:
    """The tensor-core layer a kernel inlines: `tensor_core.cuh`, `tensor_core_row.cuh` where a 16-bit operand page
    is plain row-major (a page an engine computed, or a tensor's tiles as stored) or, `more_loads`, a matmul reads A
    from float32 values or a page of Bᵀ (attention's P and K), which `a_loader` and `b_loader` read with its loads,
    and `tensor_core_fp8.cuh` where the operands are 8-bit floats."""
    rows = types.operand_bytes == 2 and (
        more_loads or any(r.c_type == "OPT" and r.layout == PageLayout.ROW for r in rings.rings.values())
    )
    fp8 = types.operand in FP8_TYPES
    extra = ["common/tensor_core_row.cuh"] * rows + ["common/tensor_core_fp8.cuh"] * fp8
    return inlined_lines("common/tensor_core.cuh", *extra)


def check_operand_layouts(operand: Precision, a: Ring, b: Ring, transpose_b: bool = False) -> None:
    """Refuse operand pages the fragment loads cannot read (verify has shown each page matches its tensor). 16-bit
    pages may also be plain row-major (`a_loader`, `b_loader`: a page an engine computed, or a tensor's tiles as
    stored); a page holding Bᵀ (`transpose_b`) is read from 16-bit row-major tiles, swizzled or plain."""
    want = operand_layouts(operand)
    wide = sized_as(operand) != Precision.INT8
    also = {"A": (PageLayout.ROW,), "B": (PageLayout.ROW,) if wide else ()}
    for ring, layout, what in ((a, want[0], "A"), (b, want[1], "B")):
        if ring.layout.panels:
            raise Unsupported(
                f"{operand.value} operand {what} in {ring.layout.value} pages ({ring.name})",
                "those are the sm_90a form's swizzled panels, which only it reads; build the program for this"
                " form (form='persistent' or 'general'; --form on the command line)",
            )
        if ring.layout != layout and ring.layout not in also[what]:
            raise Unsupported(
                f"{operand.value} operand {what} in {ring.layout.value} pages ({ring.name})",
                f"the tensor-core loads read {what} from {layout.value} pages; build the program with spatialc.build",
            )
    if transpose_b and (not wide or b.layout not in (PageLayout.ROW, PageLayout.SWIZZLED)):
        raise Unsupported(
            f"a {operand.value} matmul reading Bᵀ from {b.layout.value} pages ({b.name})",
            "a page holding Bᵀ (K's rows as stored) is read from row-major 16-bit tiles, swizzled or plain, only",
        )

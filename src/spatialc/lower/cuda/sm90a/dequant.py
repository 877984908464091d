"""A W4A16 GEMM in the sm_90a form (issue 34, item 6): the packed weights by bulk copy, dequantised by the consumer
warpgroups into B's operand page of swizzled panels, which wgmma reads from shared memory.

The design is the consumer-side dequant (docs/design.md §6, the sm_90a form), not Machete's transposed product
(C^T = W^T X^T, the weights wgmma's A operand straight from registers). wgmma takes only A from registers: with the
weights as A the activations would be B, the accumulators C^T, and the epilogue, the staged TMA store, the fused
chain and the plan (items of 64 weight rows × a few activation columns) would all be printed transposed — a second
GEMM kernel.
The consumer-side dequant keeps the form's kernel whole: the IR's own W4A16 schedule (`passes/dequant.py`: Wait Bq;
Reserve B; Dequant Bq → B; Push B; Pop Bq; Wait B; matmul; Pop B) prints as it stands, B's ring the one the plain
GEMM's copy engine would have filled, now written by the consumers.

- The packed page (`PackedRows`). B's packed tensor stays tiled as the general form stores it (128 bytes a tile;
  common/dequant.py), so a page's tile row of `block_w` tiles is `block_w` × 128 contiguous bytes: the producer
  lands each with one bulk copy (cp.async.bulk, no tensor map), all announced on the slot's full barrier with its
  one arrival, exactly as a TMA page is (`spatialc_bulk_load`, dequant90.cuh). Beside it, into the slot of a side
  stage (`w4_side`), the producer lands the page's scales and zero points — each group's row of each tile column's
  tile of the tiled tensors, 16 values, one bulk copy each, counted on the same barrier — so the consumers read no
  global memory in the K loop. A page's K rows are whole groups, or lie in one (refused by name otherwise).
- The dequant (`W4HopperPrinter.dequant`). Every consumer thread takes 32-bit words of the front packed page in
  turn: word L of a tile holds what lane L of an mma.sync would hold of it (rows 2t, 2t + 1, 2t + 8, 2t + 9 of
  columns n and n + 8), which common/dequant.cuh's `spatialc_w4_regs` — the register path's one text of the nibble
  → float conversion and the scale and zero point — turns into four registers of two operand values; each value is
  stored at its place in B's N-major panels, swizzled as the copy engine would have landed it (ir/nodes.py's
  `panel_offset`, `spatialc_panel_byte`). The tile's scales and zero points are one group's (a group is whole tiles
  of K), read from the side slot as 32-bit words.
- The handover. wgmma reads shared memory through the async proxy: each thread's stores are made visible to it by a
  `fence.proxy.async` of its own before it arrives on B's full barrier (the Push), and the consumers wait on that
  barrier (the Wait) before any wgmma reads the page. The emulation checks both (`check_proxy_read`): a store with
  no fence since, or a fence no barrier orders before the wgmma, is a race.
- The K loop keeps one wgmma group in flight, as the plain GEMM's (`k_loop_dequant`): a step's A and B stages go
  back a step late, once `wait_group 1` says their group retired, so the next step's waits and dequant run under this
  step's wgmma — into the other B stage (B's ring at least two pages deep: the stage it reserves is one whose group
  has retired). The dequant itself is still on the consumers' one path (bench/README.md weighs what that costs).
"""

from __future__ import annotations

from dataclasses import dataclass

from ....ir.ids import LoopVar
from ....ir.names import plain
from ....ir.nodes import DType, PageLayout, SpatialProgram, panel_bytes
from ....ir.ops import ChoreoOp, Compute, Dequant, Loop, MatmulTiles, Pop, Push, ReadTiles, Trip
from ....ir.traffic import DTYPE_BYTES
from ...errors import NeedsGeneral, Unsupported
from ..common.cwriter import addr_expr
from ..common.dequant import PACKED_RING, PACKED_TILE, REG_FORMAT, is_packed
from ..common.program import W4_PROGRAM
from ..common.rings import Ring, Rings
from .printer import HopperPrinter
from .tma import Panels

OPERANDS = ("__nv_bfloat16", "__half")  # the 16-bit operands the weights dequantise to
# A scale's and a zero point's reads from the side slot (`side`: its scales', or its zero points', first byte; `at`:
# the value's place there), through 32-bit words (dequant90.cuh), as float and int.
SIDE_SCALE = {
    DType.FLOAT32: "SPATIALC_PAGE_LD(reinterpret_cast<const float*>({side}) + {at})",
    DType.BF16: "spatialc_w4_scale16(spatialc_w4_stage_half({side}, {at}), (const __nv_bfloat16*)nullptr)",
    DType.FP16: "spatialc_w4_scale16(spatialc_w4_stage_half({side}, {at}), (const __half*)nullptr)",
    DType.E8M0: "spatialc_e8m0_value((unsigned char)spatialc_w4_stage_byte({side}, {at}))",
}
SIDE_ZERO = {
    DType.INT4: "(int)(signed char)spatialc_w4_stage_byte({side}, {at})",
    DType.UINT4: "(int)spatialc_w4_stage_byte({side}, {at})",
}


@dataclass(frozen=True, slots=True)
class PackedRows:
    """How a packed page lands: `block_h` rows of `block_w` packed tiles, each row one bulk copy of contiguous bytes
    of the tiled tensor (its tiles one after another), row i at byte i × block_w × PACKED_TILE of the page; and beside
    it, in the slot of the side stage (`w4_side`), the page's scales and zero points: for each of its `groups` groups
    and `block_w` tile columns the 16 values of that group's row of the tile (one bulk copy each, `scale_elem` bytes a
    scale), the scales first, then the zero points (a byte each) where there are any."""

    block_h: int
    block_w: int
    dequant: Dequant  # the page's dequant: its scale and zero tensors, its group
    groups: int  # the groups of K a page spans (a K step of whole groups, or one group of whole K steps)
    scale_elem: int  # bytes of a scale

    width = 0  # no swizzle
    transposed = False

    @property
    def row_bytes(self) -> int:
        return self.block_w * PACKED_TILE

    @property
    def scale_row(self) -> int:
        """Bytes of one group's row of a scale tile: 16 scales."""
        return 16 * self.scale_elem

    @property
    def zero_at(self) -> int:
        """Where the zero points start in a side slot."""
        return self.groups * self.block_w * self.scale_row

    @property
    def side_bytes(self) -> int:
        """Bytes of a side slot: the scales, then the zero points (16 bytes a group's row of a tile)."""
        return self.zero_at + (self.groups * self.block_w * 16 if self.dequant.zero is not None else 0)

    @property
    def period(self) -> int:
        """The alignment a page keeps: a bulk copy's destination is on 16 bytes; a stage on 128 reads as any."""
        return 128


def packed_reads(
    p: SpatialProgram, rings: Rings, reader_ops: list[ChoreoOp], compute_ops: list[ChoreoOp]
) -> dict[int, PackedRows]:
    """Each ring of packed pages the reader fills, and how its page and its scales land; refused by name where a page
    is not rows of whole tiles of the tiled tensor, or its K rows are not whole groups (nor within one)."""
    dequants = {
        rings.template[o.ins[0]]: o.op for o in compute_ops if isinstance(o, Compute) and isinstance(o.op, Dequant)
    }
    found: dict[int, PackedRows] = {}
    for op in reader_ops:
        if not (isinstance(op, ReadTiles) and is_packed(p.tensor(op.tensor))):
            continue
        ring = rings.kept(op.into)
        assert ring is not None and ring.c_type == PACKED_RING, "a packed ring (common/dequant.py packed_rings)"
        if op.stride_w != 1 or op.block_h * op.block_w * PACKED_TILE != ring.page:
            raise Unsupported(
                f"a read of {p.tensor(op.tensor).name}'s packed tiles with strides ({op.stride_h}, {op.stride_w})",
                "a bulk copy lands a row of consecutive tiles",
            )
        dq = dequants[ring.id]
        tiles = dq.group // 16  # a group's tile rows
        if op.block_h % tiles and tiles % op.block_h:
            raise Unsupported(
                f"a K step of {op.block_h * 16} rows and groups of {dq.group}",
                "the producer lands a page's scales a group's row at a time: a K step of whole groups, or a group of"
                " whole K steps (force a block whose ibw does)",
            )
        scale = p.tensor(dq.scale)
        elem = DTYPE_BYTES[scale.dtype]
        rows = PackedRows(op.block_h, op.block_w, dq, max(1, op.block_h // tiles), elem)
        if found.setdefault(ring.id, rows) != rows:
            raise Unsupported(f"pages of two shapes in {ring.name}", "each stage is laid out for one shape")
    return found


def operand_panels(p: SpatialProgram, rings: Rings, compute_ops: list[ChoreoOp], operand: str) -> dict[int, Panels]:
    """B's operand ring each dequant writes, as the panels wgmma reads (16-bit B N-major: its K rows panel rows, as
    a TMA load of the plain GEMM would have landed them); refused by name where the program was planned for the
    general form (its B pages are not panels) or the operand is not 16-bit."""
    found: dict[int, Panels] = {}
    for op in compute_ops:
        if not (isinstance(op, Compute) and isinstance(op.op, Dequant)):
            continue
        src, dst = rings.kept(op.ins[0]), rings.kept(op.outs[0])
        assert src is not None and dst is not None
        if dst.layout != PageLayout.PANELS:
            raise NeedsGeneral(
                f"{W4_PROGRAM} planned for the general form ({dst.name} in {dst.layout.value} pages) in the sm_90a"
                " form",
                "build it with form='sm90a' (--form sm90a) for its B pages in panels",
            )
        if operand not in OPERANDS:
            raise Unsupported(f"a dequant to {operand}", "4-bit weights dequantise to bf16 or fp16")
        if src.page * 2 != dst.page:  # a packed tile is half an operand tile's bytes (common/dequant.py)
            raise Unsupported(
                f"a dequant of {src.name}'s pages of {src.page // PACKED_TILE} tiles into {dst.name}'s of"
                f" {dst.page // (2 * PACKED_TILE)}",
                "the consumers dequantise a packed page into a page of panels of as many tiles, which wgmma reads"
                " whole",
            )
        cols = op.op.width * 16
        rows = dst.page // cols
        width = panel_bytes(cols * 2)
        if width is None:
            raise Unsupported(f"rows of {cols * 2} bytes in {dst.name}'s pages", "a swizzled panel is 32 to 128 wide")
        found[dst.id] = Panels(rows, cols * 2, width, False, 2)
    return found


def check_dequant_pages(rings: Rings, offsets: dict[str, int], panels: dict[int, Panels]) -> None:
    """Each dequantised page on its swizzle's period (offset swizzle = address swizzle: the stage base is on 1024)."""
    for rid, pan in panels.items():
        ring = rings.rings[rid]
        off = offsets[f"ring_{rid}"]
        if off % 1024 or (ring.page * ring.elem_bytes) % pan.period:
            raise Unsupported(
                f"{ring.name}'s pages of {ring.page * ring.elem_bytes} bytes at byte {off}",
                f"the dequant's swizzled stores need every page on {pan.period} bytes and the ring on 1024",
            )


class W4HopperPrinter(HopperPrinter):
    """The sm_90a engine printer with a W4A16 GEMM's packed pages (bulk copies) and its dequant into B's panels."""

    def op(self, op: ChoreoOp, env: dict[LoopVar, str]) -> None:
        match op:
            case ReadTiles(into=buf) if not self.k.rings.is_direct(buf) and isinstance(
                self.hk.panels.get(self.kept(buf).id), PackedRows
            ):
                self.bulk_rows(op, env)
            case Loop() if self.dequant_k_loop(op):
                self.k_loop_dequant(op, env)
            case _:
                super().op(op, env)

    def counters(self) -> None:
        """The engine's counters, and the side stage where it lands or reads a packed page's scales."""
        super().counters()
        side = [(r, pan) for r, pan in self.hk.panels.items() if isinstance(pan, PackedRows)]
        uses = any(
            (isinstance(o, ReadTiles) and any(self.kept(o.into).id == r for r, _ in side))
            or (isinstance(o, Compute) and isinstance(o.op, Dequant))
            for o in self.role.walk()
        )
        for r, pan in side if uses else ():
            self.w.line(
                f"SPATIALC_DYNAMIC_RING(unsigned char, w4_side, spatialc_dyn_smem, SMEM_OFF_W4_SIDE, DEPTH_{r}, "
                f"{pan.side_bytes});  // each packed page's scales and zero points, slot for slot"
            )

    def dequant_k_loop(self, loop: Loop) -> bool:
        """Whether `loop` is a W4A16 K loop whose releases can wait a step: a fixed count, its body a dequant and
        then one matmul (no scales) followed only by the Pops of exactly the matmul's rings, each at least two pages
        deep — the plain GEMM's condition (`HopperPrinter.pipelined`) with the dequant's ops before the matmul."""
        if isinstance(loop.count, Trip) or loop.count.n < 1:  # type: ignore[union-attr]
            return False
        body = loop.body
        mms = [i for i, o in enumerate(body) if isinstance(o, Compute) and isinstance(o.op, MatmulTiles)]
        dqs = [i for i, o in enumerate(body) if isinstance(o, Compute) and isinstance(o.op, Dequant)]
        if len(mms) != 1 or len(dqs) != 1 or dqs[0] > mms[0]:
            return False
        mm = body[mms[0]]
        assert isinstance(mm, Compute) and isinstance(mm.op, MatmulTiles)
        pops = body[mms[0] + 1 :]
        if mm.op.scales is not None or not all(isinstance(o, Pop) for o in pops):
            return False
        popped = sorted(self.kept(o.buf).id for o in pops)  # type: ignore[union-attr]
        return popped == sorted(self.kept(b).id for b in mm.ins) and all(self.kept(b).depth >= 2 for b in mm.ins)

    def k_loop_dequant(self, loop: Loop, env: dict[LoopVar, str]) -> None:
        """The K loop with the matmul's releases a step late, as the plain GEMM's (`k_loop_pipelined`): a step's
        waits and dequant run while the previous step's wgmma group is in flight — it reads the other stages (depth
        ≥ 2: the B page being written is one the group before last read, released once it retired)."""
        from ...census import marker

        self.k_loop_pipelined(loop, env, marker(loop))

    def bulk_rows(self, op: ReadTiles, env: dict[LoopVar, str]) -> None:
        """The packed page's bytes announced on the slot's full barrier (with the Push's arrival where it follows at
        once), then one bulk copy a tile row of the page.

        Every address is the tensor's grid's, as verify proves it, never the op's `stride_h`: tile `at` is (at /
        cols, at % cols) of the grid of `cols` tiles a row (rule 8 holds that tile to the dequant's own k-tile and
        column), and row i of a block of several is at + i · cols (rule 8 holds row i to k-tile + i). A one-row
        block's `stride_h` moves no tile (the interpreter never reads it; verify cannot hold it to anything), so a
        copy that read it would go where the proof never looked."""
        from ...census import marker

        t = self.k.program.tensor(op.tensor)
        r = self.kept(op.into).id
        rows = self.hk.panels[r]
        assert isinstance(rows, PackedRows)
        slot, nbytes = self.write_slot(r), rows.block_h * rows.row_bytes + rows.side_bytes
        pushed = isinstance(self.after, Push) and self.kept(self.after.buf).id == r
        cols = t.tiles[1]
        with self.w.block("", marker(op)):
            self.w.line(f"const int at = {addr_expr(op.at, env)};  // the page's first tile of {plain(t.name)}")
            self.expect_bytes(r, slot, nbytes, pushed)
            page, bar = f"(char*)({self.write_page(r)})", f"&full_{r}[{slot}]"
            with self.w.block(f"for (int i = 0; i < {rows.block_h}; ++i)", "// a tile row: consecutive tiles"):
                src = f"(const char*)t{int(t.id)} + (size_t)(at + i * {cols}) * {PACKED_TILE}"
                self.w.line(f"spatialc_bulk_load({page} + i * {rows.row_bytes}, {src}, {rows.row_bytes}u, {bar});")
            self.side_rows(rows, f"at / {cols}", f"at % {cols}", f"(w4_side + {slot} * {rows.side_bytes})", bar)

    def side_rows(self, rows: PackedRows, k_tile: str, col: str, side: str, bar: str) -> None:
        """The page's scales and zero points into its side slot: a group's row of each of its tile columns' tiles
        of the tiled tensors (16 values, contiguous), one bulk copy each (`PackedRows`)."""
        dq = rows.dequant
        w = self.w
        w.line(f"const int g0 = {k_tile} * 16 / {dq.group};  // the page's first group of K")
        tensors = [(self.tensors[int(dq.scale)], rows.scale_elem, 0)]
        if dq.zero is not None:
            tensors.append((self.tensors[int(dq.zero)], 1, rows.zero_at))
        with w.block(f"for (int s = 0; s < {rows.groups * rows.block_w}; ++s)", "// group s / width, column s % width"):
            w.line(f"const int g = g0 + s / {rows.block_w}, jt = {col} + s % {rows.block_w};")
            for t, elem, at in tensors:
                row = f"((size_t)((g / 16) * {t.tiles[1]} + jt) * 256 + (g % 16) * 16) * {elem}"
                dst = f"(char*){side} + {at} + s * {16 * elem}" if at else f"(char*){side} + s * {16 * elem}"
                w.line(f"spatialc_bulk_load({dst}, (const char*)t{int(t.id)} + {row}, {16 * elem}u, {bar});")

    def group_operands(self, op: Dequant, rows: PackedRows, side: str) -> None:
        """s0, s1 and b0, b1: the scales and spatialc_w4_bias of the zero points of the word's two columns (lane / 4
        and 8 more) in group g, from the side slot `side` the producer landed with the page, read as 32-bit words."""
        scale = self.tensors[int(op.scale)]
        self.w.line(f"const unsigned at = ((g - g0) * {rows.block_w}u + tl % {rows.block_w}u) * 16u + lane / 4u;")
        for h, plus in enumerate(("", " + 8u")):
            self.w.line(f"const float s{h} = {SIDE_SCALE[scale.dtype].format(side=side, at='at' + plus)};")
        for h, plus in enumerate(("", " + 8u")):
            read = "0"
            if op.zero is not None:
                zero = self.tensors[int(op.zero)]
                read = SIDE_ZERO[zero.dtype].format(side=f"{side} + {rows.zero_at}", at="at" + plus)
            self.w.line(f"const float b{h} = spatialc_w4_bias<{REG_FORMAT[op.weights]}>({read});")

    def dequant(self, op: Dequant, src: Ring, dst: Ring, env: dict[LoopVar, str], mark: str) -> None:
        """The front packed page into the reserved page of B's panels, a 32-bit word a thread at a time (see the
        module), then the thread's fence.proxy.async: its stores visible to wgmma before the Push's arrival."""
        pan, rows = self.hk.panels[dst.id], self.hk.panels[src.id]
        assert isinstance(pan, Panels) and isinstance(rows, PackedRows)
        assert src.c_type == PACKED_RING  # (`packed_reads`; pages of as many tiles: `operand_panels`)
        fmt, low = REG_FORMAT[op.weights], "true" if op.low_first else "false"
        w = self.w
        with w.block("", mark):
            page = f"ring_{src.id} + {self.read_slot(src.id)} * PAGE_{src.id}"
            w.line(f"const unsigned* q = reinterpret_cast<const unsigned*>({page});")
            w.line(f"char* d = (char*)(ring_{dst.id} + {self.write_slot(dst.id)} * PAGE_{dst.id});")
            w.line(f"const unsigned rows_at = {addr_expr(op.rows, env)};  // the page's first tile row (of K)")
            w.line(f"const unsigned g0 = rows_at * 16u / {op.group}u;  // its first group: its side slot's first")
            side = f"(w4_side + {self.read_slot(src.id)} * {rows.side_bytes})"
            words = f"PAGE_{src.id} / 4"
            with w.block(f"for (int e = {self.tid}; e < {words}; e += {self.nthreads})"):
                w.line("const unsigned tl = (unsigned)e / 32u, lane = (unsigned)e % 32u;  // tile tl's word `lane`")
                w.line(f"const unsigned g = (rows_at + tl / {op.width}u) * 16u / {op.group}u;  // its group of scales")
                self.group_operands(op, rows, side)
                w.line("unsigned r[4];")
                w.line(f"spatialc_w4_regs<{fmt}, {low}, OPT>(r, SPATIALC_PAGE_LD(q + e), s0, s1, b0, b1);")
                w.line(f"const unsigned k0 = (tl / {op.width}u) * 16u + 2u * (lane % 4u);  // the word's first row")
                w.line(f"const unsigned j0 = (tl % {op.width}u) * 16u + lane / 4u;  // and column, in the page")
                w.line(f"spatialc_w4_store_panels<{pan.width}u, {pan.bytes}u, OPT>(d, r, k0, j0);")
            w.line("spatialc_fence_proxy_async();  // the thread's operand values, visible to wgmma before its Push")

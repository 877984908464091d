"""Printing a W4A16 GEMM's dequant prologue (numerics/w4.py defines it; the general form prints it): the packed
weights' storage and ring, their kernel parameters' types, and the Dequant op page to page on the compute engine.

Storage. B (K × N 4-bit values) is held as `pack_int4` packs it — two values a byte along K, the even row in the low
nibble — and tiled like any tensor, a tile of B (16 rows of K by 16 columns) being 128 bytes: tile (ti, tj) starts
at byte (ti · cols_t + tj) · 128, and byte p · 16 + c of it holds rows 2p (low nibble) and 2p + 1 (high) of column c
(`w4_host.cuh` packs it so from the values the host program reads). A ring of packed pages holds `page_tiles` such
tiles a page, of `unsigned char`, copied in by cp.async as any page is (`TilePrinter.read_tiles`). Zero points are a
byte each (int4 `signed char`, uint4 `unsigned char`) and e8m0 scales their codes, tiled as any tensor.

The kernel names these element types by typedefs of dequant.cuh (`spatialc_int4x2`: a byte of two int4 values, …),
which `runtime.tilize.C_TYPES` reads back as the tensor's element type: the launch contract says what each holds.

The op. Every thread of the compute engine takes bytes of the front packed page in turn; byte e of tile tl holds the
elements (2p, c) and (2p + 1, c) of that tile, B's rows k = (rows + tl / width) · 16 + 2p (+ 1) and column
j = (cols + tl mod width) · 16 + c. Each is dequantised by dequant.cuh with the scale and zero point at its own
(k / group, j) and stored into the reserved operand page where a copy of the tile would have put it (its row-major
place, or the swizzled one: the two 16-byte halves of tile row r exchanged when bit 2 of r is set).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ....ir.ids import LoopVar
from ....ir.nodes import (
    FOUR_BIT,
    ComputeStage,
    DType,
    PageLayout,
    ReadStage,
    SpatialProgram,
    Tensor,
    TensorRole,
    TileOrder,
)
from ....ir.ops import Dequant, WeightFormat
from ...errors import Unsupported
from .cwriter import C_TYPES, Writer, addr_expr
from .rings import TILE_ELEMS, Ring, Rings

PACKED_TILE = TILE_ELEMS // 2  # bytes of a tile of packed 4-bit weights
PACKED_RING = "unsigned char"  # the c_type of a ring of packed pages
# The kernel's C types of 4-bit tensors (typedefs of dequant.cuh): packed weights, then zero points and e8m0 scales
# one a byte. runtime/tilize.py's C_TYPES names them back.
PACKED_C_TYPES = {DType.INT4: "spatialc_int4x2", DType.UINT4: "spatialc_uint4x2", DType.E2M1: "spatialc_e2m1x2"}
BYTE_C_TYPES = {DType.INT4: "spatialc_int4", DType.UINT4: "spatialc_uint4", DType.E8M0: "spatialc_e8m0"}
VALUE_OF = {
    WeightFormat.INT4: "spatialc_w4_int4",
    WeightFormat.UINT4: "spatialc_w4_uint4",
    WeightFormat.MXFP4: "spatialc_w4_e2m1",
}
ROUND_TO = {"__nv_bfloat16": "spatialc_dequant_bf16", "__half": "spatialc_dequant_fp16"}
SCALE_READ = {
    DType.FLOAT32: "{}",
    DType.BF16: "__bfloat162float({})",
    DType.FP16: "__half2float({})",
    DType.E8M0: "spatialc_e8m0_value({})",
}
HOST_FORMAT = {DType.INT4: 0, DType.UINT4: 1, DType.E2M1: 2}  # w4_host.cuh's spatialc_tilize_w4 `format`


def is_packed(t: Tensor) -> bool:
    """Whether `t` is a tensor of packed 4-bit weights (an input read through a dequant)."""
    return t.role == TensorRole.INPUT and t.dtype in FOUR_BIT


def param_c_type(t: Tensor, operand: str) -> str:
    """The C type of tensor `t`'s elements as the kernel takes it: packed weights and 4-bit or e8m0 parameters by
    dequant.cuh's typedefs, any other input the operand type, any other parameter its own."""
    if is_packed(t):
        return PACKED_C_TYPES[t.dtype]
    if t.dtype in BYTE_C_TYPES:
        return BYTE_C_TYPES[t.dtype]
    return operand if t.role == TensorRole.INPUT else C_TYPES[t.dtype]


def has_dequant(p: SpatialProgram) -> bool:
    """Whether `p` dequantises 4-bit weights (a W4A16 GEMM: its kernel inlines dequant.cuh)."""
    return any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Dequant) for s in p.stages)


def packed_rings(p: SpatialProgram, rings: Rings) -> Rings:
    """`rings` with each ring a read of packed weights fills made a ring of bytes: `page_tiles` tiles of
    PACKED_TILE bytes a page, in row layout (the dequant reads its bytes as copied)."""
    table = dict(rings.rings)
    for s in p.stages:
        if not (isinstance(s.kind, ReadStage) and is_packed(p.tensor(s.kind.tensor))):
            continue
        t = p.tensor(s.kind.tensor)
        if t.order != TileOrder.ROW:
            raise Unsupported(
                f"packed weights {t.name} in {t.order.value}-major tiles", "they are packed along K by rows"
            )
        for b in s.outs:
            r = rings.template[b]
            ring = table[r]
            if ring.layout != PageLayout.ROW:
                raise Unsupported(
                    f"ring {ring.name} of packed weights in {ring.layout.value} layout", "its bytes are read as copied"
                )
            table[r] = dataclasses.replace(ring, page=ring.page // 2, c_type=PACKED_RING, elem_bytes=1)
    return dataclasses.replace(rings, rings=table)


class DequantPrinter:
    """The Dequant op, page to page (mixed into a form's engine printer, which has what is declared here)."""

    w: Writer
    tid: str
    nthreads: str
    tensors: dict[int, Tensor]
    k: Any  # the form's kernel: its `types` (MmaTypes)
    read_slot: Callable[[int], str]
    write_slot: Callable[[int], str]

    def dequant(self, op: Dequant, src: Ring, dst: Ring, env: dict[LoopVar, str], mark: str) -> None:
        """The front page of packed weights `src` into the reserved operand page of `dst` (see the module)."""
        if src.c_type != PACKED_RING or dst.c_type != "OPT" or src.page * 2 != dst.page:
            raise Unsupported(
                f"a dequant of {src.name}'s pages into {dst.name}'s",
                "it turns a page of packed tiles into one of operands",
            )
        if dst.layout not in (PageLayout.ROW, PageLayout.SWIZZLED):
            raise Unsupported(
                f"a dequant into {dst.name}'s pages in {dst.layout.value} layout", "it writes row-major tiles"
            )
        round_to = ROUND_TO.get(self.k.types.operand)
        if round_to is None:
            raise Unsupported(f"a dequant to {self.k.types.operand}", "4-bit weights dequantise to bf16 or fp16")
        scale = self.tensors[int(op.scale)]
        zero = None if op.zero is None else self.tensors[int(op.zero)]
        w = self.w
        rid, did = src.id, dst.id
        with w.block("", mark):
            w.line(f"const unsigned char* q = ring_{rid} + {self.read_slot(rid)} * PAGE_{rid};")
            w.line(f"OPT* d = ring_{did} + {self.write_slot(did)} * PAGE_{did};")
            w.line(f"const int rows_at = {addr_expr(op.rows, env)}, cols_at = {addr_expr(op.cols, env)};")
            w.line("(void)rows_at; (void)cols_at;")
            with w.block(f"for (int e = {self.tid}; e < PAGE_{rid}; e += {self.nthreads})"):
                w.line(f"const int tl = e / {PACKED_TILE}, p = (e % {PACKED_TILE}) / 16, c = e % 16;")
                w.line("const unsigned b = SPATIALC_PAGE_LD(q + e);")
                rows, cols = f"(rows_at + tl / {op.width})", f"(cols_at + tl % {op.width})"
                w.line(f"const int k0 = {rows} * 16 + 2 * p, j = {cols} * 16 + c;")
                nibbles = ("b & 15u", "b >> 4") if op.low_first else ("b >> 4", "b & 15u")
                for h, nibble in enumerate(nibbles):
                    r = f"(2 * p + {h})" if h else "(2 * p)"
                    w.line(f"const int g{h} = (k0 + {h}) / {op.group};  // row k0 + {h}'s group of scales")
                    s = SCALE_READ[scale.dtype].format(f"t{int(scale.id)}[{tiled_at(scale, f'g{h}', 'j')}]")
                    z = "0.0f" if zero is None else f"(float)t{int(zero.id)}[{tiled_at(zero, f'g{h}', 'j')}]"
                    col = "c" if dst.layout == PageLayout.ROW else f"(c ^ ((({r} >> 2) & 1) << 3))"
                    value = f"{round_to}({VALUE_OF[op.weights]}({nibble}), {s}, {z})"
                    w.line(f"SPATIALC_PAGE_ST(d + tl * {TILE_ELEMS} + {r} * 16 + {col}, {value});")


def tiled_at(t: Tensor, row: str, col: str) -> str:
    """Where element (row, col) of tensor `t` lies in its tiled buffer, as a C expression."""
    return f"(({row} / 16) * {t.tiles[1]} + {col} / 16) * {TILE_ELEMS} + ({row} % 16) * 16 + {col} % 16"

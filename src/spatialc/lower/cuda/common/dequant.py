"""Printing a W4A16 GEMM's dequant prologue (numerics/w4.py defines it; the general form prints it): the packed
weights' storage and ring, their kernel parameters' types, and the Dequant op — in registers at the matmul's B loads
(the register path, the default) or page to page into a B operand page (the shared path).

Storage. B (K × N 4-bit values) is held as `pack_int4` packs it — two values a byte along K, the even row in the low
nibble — and tiled like any tensor, a tile of B (16 rows of K by 16 columns) being 128 bytes: tile (ti, tj) starts
at byte (ti · cols_t + tj) · 128, and the byte of rows 2p (low nibble) and 2p + 1 (high) of column c lies at
16 (c mod 8) + 4 (p mod 4) + 2 (c / 8) + p / 4 of it, so that 32-bit word L holds lane L's four mma.sync B registers'
bytes (`w4_host.cuh`'s spatialc_w4_tile_byte packs it so from the values the host program reads; runtime/w4_args.py
from the caller's arrays). A ring of packed pages holds `page_tiles` such tiles a page, of `unsigned char`, copied in
by cp.async as any page is (`TilePrinter.read_tiles`). Zero points are a byte each (int4 `signed char`, uint4
`unsigned char`) and e8m0 scales their codes, tiled as any tensor.

The kernel names these element types by typedefs of dequant.cuh (`spatialc_int4x2`: a byte of two int4 values, …),
which `runtime.tilize.C_TYPES` reads back as the tensor's element type: the launch contract says what each holds.

The register path (`register_fusion`, `DequantPrinter.fuse`). Where the compute engine's body reserves a B page,
dequantises a packed page into it and hands it only to its next matmul, the page is never written: the matmul's
lanes each load one 32-bit word of each packed tile they need (`spatialc_w4_load_b`) and dequantise its eight weights
in float32 registers into their four B registers, with the scales and zero points of their two columns (read as
32-bit words). The B page's ring ops and the dequant print as comments carrying their census markers, and the packed
page's Pop moves after the matmul: holding a page longer is safe, and the engine waits on no other between.

The shared path. Every thread of the compute engine takes bytes of the front packed page in turn; byte e of tile tl
holds the elements (2p, c) and (2p + 1, c) of that tile, B's rows k = (rows + tl / width) · 16 + 2p (+ 1) and column
j = (cols + tl mod width) · 16 + c. Each is dequantised by dequant.cuh with the scale and zero point at its own
(k / group, j) and stored into the reserved operand page where a copy of the tile would have put it (its row-major
place, or the swizzled one: the two 16-byte halves of tile row r exchanged when bit 2 of r is set).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from ....ir.ids import BufferId, LoopVar
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
from ....ir.ops import ChoreoOp, Compute, Dequant, Loop, MatmulTiles, Pop, Push, Reserve, Wait, WeightFormat
from ...census import marker
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
REG_FORMAT = {WeightFormat.INT4: 0, WeightFormat.UINT4: 1, WeightFormat.MXFP4: 2}  # dequant.cuh's FORMAT
# The register path's reads of a scale and a zero point (`at`: the element's tiled index), through 32-bit words.
REG_SCALE_READ = {
    DType.FLOAT32: "t{id}[{at}]",
    DType.BF16: "spatialc_w4_scale16(spatialc_w4_half_at(t{id}, {at}), (const __nv_bfloat16*)nullptr)",
    DType.FP16: "spatialc_w4_scale16(spatialc_w4_half_at(t{id}, {at}), (const __half*)nullptr)",
    DType.E8M0: "spatialc_e8m0_value((unsigned char)spatialc_w4_byte_at(t{id}, {at}))",
}
REG_ZERO_READ = {  # … as an int
    DType.INT4: "(int)(signed char)spatialc_w4_byte_at(t{id}, {at})",
    DType.UINT4: "(int)spatialc_w4_byte_at(t{id}, {at})",
}
DEQUANT_IN = ("registers", "shared")  # where the general form dequantises (GeneralKernel.dequant)


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

    register_b: dict[int, RegisterB]  # operand ring id → its packed source, where the register path prints it

    kept: Callable[[BufferId], Ring]  # (TilePrinter's)

    def fuse(self, ops: tuple[ChoreoOp, ...], env: dict[LoopVar, str]) -> tuple[Any, ...]:
        """`ops` as the register path prints them (GeneralKernel.dequant "registers"): the operand page's Reserve,
        Push, Wait and Pop and the dequant itself as comments (`InRegisters`), the packed page's Pop moved after the
        matmul, which reads B's fragments from the packed page (`b_fragment`). `ops` as they are where the body is
        not the dequant-then-matmul pattern (`register_fusion`) or the shared path is asked for."""
        at = register_fusion(ops) if getattr(self.k, "dequant", "registers") == "registers" else None
        if at is None:
            return ops
        dq = ops[at[1]]
        assert isinstance(dq, Compute)
        self.hold(dq, env)
        return fused_order(ops, at)

    def hold(self, dq: Compute, env: dict[LoopVar, str]) -> None:
        """Note that the next matmul reads the B page dequant `dq` fills from its packed page, dequantised in
        registers (`b_fragment`), at the page's place as `env` gives it where the dequant stands."""
        assert isinstance(dq.op, Dequant)
        (src,), (dst,) = dq.ins, dq.outs
        dop = dq.op
        self.register_b = getattr(self, "register_b", {})
        rows = self.kept(src).page // PACKED_TILE // dop.width  # the page's tiles of K
        tiles = dop.group // 16  # a group's
        one = tiles % rows == 0 and dop.rows.base % rows == 0 and all(s % rows == 0 for _, s in dop.rows.steps)
        reg = RegisterB(dop, src, addr_expr(dop.rows, env), addr_expr(dop.cols, env), one)
        self.register_b[self.kept(dst).id] = reg

    def register_rings(self, programs: tuple[tuple[ChoreoOp, ...], ...]) -> frozenset[int]:
        """The operand rings the register path does without in `programs` (their counters are never declared)."""
        return register_rings(self.k, programs)

    def elided(self, op: InRegisters) -> None:
        """An op the register path does without: a comment carrying its census marker."""
        self.w.line(f"// {op.why}", marker(op.op))

    def b_fragment(self, mm: MatmulTiles, b: Ring, frag: str, tile: Callable[[str], str], slot: str, kk: str) -> None:
        """Print a B fragment load of page slot `slot` (`tile(kk)` its address): from the packed page, dequantised in
        registers (dequant.cuh's spatialc_w4_load_b), where `b` is an operand ring the register path replaced. The
        tile's scales and zero points are one group's (a group is whole tiles of K), of the lane's two columns."""
        reg = getattr(self, "register_b", {}).get(b.id)
        if reg is None:
            super().b_fragment(mm, b, frag, tile, slot, kk)  # type: ignore[misc]
            return
        op, src, w = reg.op, self.kept(reg.src), self.w
        scale = self.tensors[int(op.scale)]
        zero = None if op.zero is None else self.tensors[int(op.zero)]
        fmt = REG_FORMAT[op.weights]
        with w.block(""):
            w.line(f"const unsigned tl = {slot};  // the tile's place in the page")
            if reg.one_group:  # the page's first row of tiles says (the same for every K step: loaded once)
                w.line(f"const unsigned g = ({reg.rows_at}) * 16u / {op.group};  // the page's group of scales")
            else:
                w.line(f"const unsigned g = ({reg.rows_at} + tl / {op.width}) * 16u / {op.group};  // its group")
            w.line(f"const unsigned jt = {reg.cols_at} + tl % {op.width};  // its column of tiles")
            lane_at = "(threadIdx.x & 31u) / 4u"  # the lane's column n in the tile
            ats: dict[int, str] = {}
            for t in (scale, zero) if zero is not None else (scale,):
                if t.tiles[1] not in ats:  # scales and zero points of one shape share the index
                    name = f"at{len(ats)}"
                    at = f"((g / 16u) * {t.tiles[1]}u + jt) * {TILE_ELEMS}u + (g % 16u) * 16u + {lane_at}"
                    w.line(f"const unsigned {name} = {at};  // (g, column n) in the tiled tensor")
                    ats[t.tiles[1]] = name
            at = ats[scale.tiles[1]]
            w.line(f"const float s0 = {REG_SCALE_READ[scale.dtype].format(id=int(scale.id), at=at)};")
            w.line(f"const float s1 = {REG_SCALE_READ[scale.dtype].format(id=int(scale.id), at=at + ' + 8u')};")
            for h, plus in enumerate(("", " + 8u")):
                z = (
                    "0"
                    if zero is None
                    else REG_ZERO_READ[zero.dtype].format(id=int(zero.id), at=ats[zero.tiles[1]] + plus)
                )
                w.line(f"const float b{h} = spatialc_w4_bias<{fmt}>({z});")
            low = "true" if op.low_first else "false"
            page = f"ring_{src.id} + {self.read_slot(src.id)} * PAGE_{src.id} + tl * {PACKED_TILE}"
            w.line(f"spatialc_w4_load_b<{fmt}, {low}, OPT>({frag}, {page}, s0, s1, b0, b1);")

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
                # byte e of tile tl: rows 2p, 2p + 1 of column c (w4_host.cuh's spatialc_w4_tile_byte, inverted)
                w.line(f"const int tl = e / {PACKED_TILE};")
                w.line("const int p = ((e >> 2) & 3) + 4 * (e & 1), c = ((e >> 4) & 7) + 8 * ((e >> 1) & 1);")
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


@dataclasses.dataclass(frozen=True, slots=True)
class InRegisters:
    """An op the register path does without (the operand page's ring ops, the dequant itself): printed as a comment
    that carries its census marker."""

    op: ChoreoOp
    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class RegisterB:
    """A matmul's B operand read from packed pages and dequantised in registers: the dequant `op`, its packed ring
    `src`, and where its page lies (C expressions of the tile row and column, worked out where the dequant stood)."""

    op: Dequant
    src: BufferId
    rows_at: str
    cols_at: str
    one_group: bool  # every tile of the page lies in one group of scales (then the matmul's K steps share them)


def fused_order(ops: tuple[ChoreoOp, ...], at: tuple[int, int, int, int, int, int]) -> tuple[Any, ...]:
    """`ops` with the register path's fusion `at` (`register_fusion`'s positions) made: the operand page's Reserve,
    Push, Wait and Pop and the dequant as `InRegisters`, the packed page's Pop moved right after the matmul. Moving a
    Pop later only holds a page longer: between its place and the matmul's end the engine waits on no other engine."""
    reserve, i, push, wait, mm, pop = at
    src = ops[i].ins[0]  # type: ignore[union-attr]
    src_pop = next(j for j in range(i + 1, mm) if j not in (push, wait))
    assert _ring_op(ops[src_pop], Pop, src)
    page = "the B operand page: its weights are dequantised in registers as the matmul loads them"
    why = {reserve: page, push: page, wait: page, pop: page, i: "dequantised in registers at the matmul's B loads"}
    out: list[Any] = []
    for j, each in enumerate(ops):
        if j in why:
            out.append(InRegisters(each, why[j]))
        elif j != src_pop:
            out.append(each)
        if j == mm:
            out.append(ops[src_pop])  # the packed page, held until the matmul has read it
    return tuple(out)


def register_fusion(ops: tuple[ChoreoOp, ...]) -> tuple[int, int, int, int, int, int] | None:
    """(Reserve, Dequant, Push, Wait, Matmul, Pop of the operand page; as positions in `ops`) where the body dequantises
    a page of packed weights that only its own next matmul reads as B: Reserve(dst) … Dequant(src → dst), then only
    Push(dst), Wait(dst) and Pop(src) before the matmul, then Pop(dst). None where the body is not so."""
    for i, op in enumerate(ops):
        if not (isinstance(op, Compute) and isinstance(op.op, Dequant)):
            continue
        (src,), (dst,) = op.ins, op.outs
        reserve = next((j for j in range(i - 1, -1, -1) if _ring_op(ops[j], Reserve, dst)), None)
        mm = next((j for j in range(i + 1, len(ops)) if isinstance(ops[j], Compute)), None)
        if reserve is None or mm is None:
            return None
        between = ops[i + 1 : mm]
        kinds = sorted(type(o).__name__ for o in between if isinstance(o, Push | Wait | Pop))
        if len(between) != 3 or kinds != ["Pop", "Push", "Wait"]:
            return None
        if not all((o.buf == src) if isinstance(o, Pop) else (o.buf == dst) for o in between):  # type: ignore[union-attr]
            return None
        matmul = ops[mm]
        if not (
            isinstance(matmul, Compute)
            and isinstance(matmul.op, MatmulTiles)
            and matmul.ins[1:] == (dst,)
            and dst not in matmul.ins[:1]
            and not matmul.op.transpose_b
            and matmul.op.scales is None
        ):
            return None
        pop = next((j for j in range(mm + 1, len(ops)) if _ring_op(ops[j], Pop, dst)), None)
        touched = [j for j, o in enumerate(ops) if j not in (reserve, i, mm) and _touches(o, dst)]
        if pop is None or len(touched) != 3:  # Push, Wait, Pop(dst) … and nothing else
            return None
        push = next(j for j in range(i + 1, mm) if isinstance(ops[j], Push))
        wait = next(j for j in range(i + 1, mm) if isinstance(ops[j], Wait))
        return reserve, i, push, wait, mm, pop
    return None


def _ring_op(op: ChoreoOp, kind: type, buf: BufferId) -> bool:
    """Whether `op` is a ring op of `kind` (Reserve, Push, Wait, Pop) on buffer `buf`."""
    return isinstance(op, kind) and isinstance(op, Reserve | Push | Wait | Pop) and op.buf == buf


def _touches(op: ChoreoOp, buf: BufferId) -> bool:
    """Whether `op` names buffer `buf` (a ring op of it, or a compute or loop that reads or writes it)."""
    if isinstance(op, Reserve | Push | Wait | Pop):
        return op.buf == buf
    if isinstance(op, Compute):
        return buf in op.ins or buf in op.outs
    if isinstance(op, Loop):
        return any(_touches(o, buf) for o in op.body)
    return False


def fused_bodies(ops: tuple[ChoreoOp, ...]) -> list[tuple[ChoreoOp, ...]]:
    """Every body (`ops` and each loop's, recursively) the register path fuses."""
    found = [ops] if register_fusion(ops) is not None else []
    for op in ops:
        if isinstance(op, Loop):
            found += fused_bodies(op.body)
    return found


def register_rings(k: Any, programs: Iterable[tuple[ChoreoOp, ...]]) -> frozenset[int]:
    """The operand rings (ids) the register path of kernel `k` (a GeneralKernel) does without in `programs`: no op
    writes or reads their pages."""
    if getattr(k, "dequant", "registers") != "registers":
        return frozenset()
    found = set()
    for ops in programs:
        for body in fused_bodies(ops):
            at = register_fusion(body)
            assert at is not None
            dq = body[at[1]]
            assert isinstance(dq, Compute)
            found.add(k.rings.template[dq.outs[0]])
    return frozenset(found)

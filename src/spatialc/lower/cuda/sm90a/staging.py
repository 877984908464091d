"""The sm_90a form's fused store in warpgroup boxes (`plan.SWIZZLED`, the default epilogue): each consumer warpgroup
stages `chunk` tiles of its 64 rows of the item at a time in one of its STORE_BUFFERS boxes, in turn — 64 rows of
`chunk` × 16 columns of C, a row `OUT_BOX_ROW` bytes (128 where the item is that wide), its 16-byte chunks swizzled
by the row's place in its 1024 bytes as the copy engine's pattern of that span reads them (`OUT_SWZ`) — then each
thread fences its writes over to the async proxy, the warpgroup meets at its named barrier, and its first thread
stores the box with one TMA store of the map's 64-row box and commits it as a bulk group.

16-bit C is written by stmatrix: each lane gives the address of one row of one of the four 8 × 8 matrices of a tile,
which in a 128-byte-swizzled row is 16 contiguous bytes, and the eight rows of a matrix fall in eight different
chunks of the 32 banks — a conflict-free store. Other types are written a lane's element at a time at its swizzled
address.

A box is written again only once its last store has read it: before the barrier that ends a box, the first thread
waits until none of its stores is still reading (`bulk_wait_read<0>`: the box before this one, which the next box
will be written over), so the next box's writes, after that barrier, find their box free. The warpgroup's last
stores are waited for before its threads end (`last_wait`). Against the one-box-a-tile epilogue (`plan.TILES`,
printer.py), a 128 × 256 item of bf16 C goes out in 8 TMA stores instead of 128.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ....ir.ids import LoopVar
from ....ir.ops import Compute, WriteTiles
from ..common.cwriter import Writer, addr_expr, c_mul, c_sum
from .plan import OUT_BYTES, STORE_BUFFERS, WARPGROUP, WARPGROUP_ROWS, box_swizzle

if TYPE_CHECKING:
    from .kernel import HopperKernel
    from .printer import HopperPrinter

OUT_BARRIER = (
    8  # the first warpgroup's named barrier for its boxes (the engines' are 1 + their index; 0 is the block's)
)
GROUP_THREADS = WARPGROUP * 32


def defines(hk: HopperKernel) -> list[str]:
    """The box's row bytes, its swizzle's chunk mask, the swizzle itself, and the warpgroups' first named barrier."""
    row = hk.chunk * 16 * OUT_BYTES[hk.base.out_type]
    span = box_swizzle(hk.chunk, hk.base.out_type)
    return [
        f"#define OUT_BOX_ROW {row}",
        f"#define OUT_SWIZZLE {span // 16 - 1 if span else 0}",
        "#define OUT_SWZ(b) ((b) ^ ((((b) >> 7) & OUT_SWIZZLE) << 4))",
        f"#define OUT_BAR {OUT_BARRIER}",
    ]


def declare(hk: HopperKernel, w: Writer) -> None:
    boxes = hk.wg.consumers * STORE_BUFFERS
    w.line(
        f"SPATIALC_DYNAMIC_RING(OUT_T, out_stage, spatialc_dyn_smem, SMEM_OFF_OUT_STAGE, {boxes}, "
        f"{WARPGROUP_ROWS} * OUT_CHUNK * 16);  // each consumer warpgroup's {STORE_BUFFERS} output boxes"
    )


def last_wait(w: Writer) -> None:
    """The shared memory a store reads must outlive its reading: the warpgroup's last stores, before it ends."""
    last = f"if ((threadIdx.x & {GROUP_THREADS - 1}) == 0) {{ spatialc_bulk_wait_read<0>(); }}"
    w.line(f"{last}  // the last boxes' stores have read them")


def swizzled_store(
    pr: HopperPrinter,
    op: WriteTiles,
    env: dict[LoopVar, str],
    mark: str,
    chain: list[tuple[Compute, dict[LoopVar, str]]],
    value: Callable[[str], str] = lambda i: f"accf[q].x[{i}]",
    perw: str = "PERW",
) -> None:
    """The consumers' fused store through their warpgroups' swizzled boxes (the module's docstring). `value(i)` is
    element i of the lane's fragment q (a GEMM's accumulator, or attention's O / l: `attention.py`), `perw` the
    fragments a warp holds."""
    w = pr.w
    hk = pr.hk
    cols = pr.k.program.tensor(op.tensor).tiles[1]
    m = hk.maps[-1]
    matrix = OUT_BYTES[pr.k.out_type] == 2  # 16-bit values go out by stmatrix, a tile a warp at once
    with w.block("", mark):
        pr.warp_coords()
        w.line("const int lane = tid % 32;")
        w.line(f"const int g = warp % {WARPGROUP};  // the warp's 16 rows of its warpgroup's {WARPGROUP_ROWS}")
        w.line(f"const bool elected = (threadIdx.x & {GROUP_THREADS - 1}) == 0;  // it issues the warpgroup's stores")
        if chain or not matrix:
            w.line("const int lane_el = (lane >> 2) * 16 + 2 * (lane & 3);  // the lane's first element")
        if matrix:
            w.line(
                "const int m_row = 16 * g + (lane & 7) + 8 * ((lane >> 3) & 1), m_col = 8 * (lane >> 4);"
                "  // the row of an 8 x 8 matrix of a tile the lane addresses for stmatrix"
            )
        pairs = not chain and OUT_BYTES[pr.k.out_type] == 4  # a lane's two adjacent columns, one 8-byte store
        if pairs:
            w.line("struct __align__(8) out_pair { OUT_T a, b; };  // two adjacent columns, stored at once")
        base = addr_expr(op.at, env)
        with pr.unrolled(f"for (int q0 = 0; q0 < {perw}; q0 += OUT_CHUNK)"):
            turn = "q0 / OUT_CHUNK" if not hk.odd_turns else "boxes_out"
            w.line(
                f"char* const staged = (char*)(out_stage + ((warp / {WARPGROUP}) * {STORE_BUFFERS} + ({turn}) % "
                f"{STORE_BUFFERS}) * ({WARPGROUP_ROWS} * OUT_CHUNK * 16));  // the warpgroup's box in turn"
            )
            with pr.unrolled("for (int c = 0; c < OUT_CHUNK; ++c)"):
                w.line("const int q = q0 + c;")
                if pairs:
                    _stage_pairs(w, pr, value)
                else:
                    _stage_tile(pr, op, chain, matrix, value)
            w.line("spatialc_fence_proxy_async();  // the thread's staged values, visible to the copy engine")
            w.line(
                "if (elected) { spatialc_bulk_wait_read<0>(); }  // the box before this one has been read: the next"
                " box, written after the barrier, is free"
            )
            w.line(
                f"spatialc_engine_sync(OUT_BAR + warp / {WARPGROUP}, {GROUP_THREADS});  // the warpgroup's box is whole"
            )
            with w.block("if (elected)", f"// one box: the warpgroup's {WARPGROUP_ROWS} rows, tile columns q0 …"):
                rows, cols_at = c_mul("(long long)(wi - g)", op.stride_h), c_mul("(long long)q0", op.stride_w)
                w.line(f"const long long tile = {c_sum(f'(long long)({base})', rows, cols_at)};")
                w.line(f"const int row = (int)(tile / {cols}) * 16, col = (int)(tile % {cols}) * 16;")
                w.line(f"spatialc_tma_store_2d(&spatialc_tmap_{m.index}, col, row, staged);")
                w.line("spatialc_bulk_commit();")
            if hk.odd_turns:
                w.line("++boxes_out;")


def _stage_pairs(w: Writer, pr: HopperPrinter, value: Callable[[str], str]) -> None:
    """Tile q's elements of 4 bytes, a lane's two adjacent columns at a time: one 8-byte store (on 8 bytes, which
    the swizzle keeps: it moves 16-byte chunks)."""
    with pr.unrolled("for (int i = 0; i < 8; i += 2)"):
        w.line("const int el = lane_el + ((i >> 1) & 1) * 128 + (i >> 2) * 8;")
        w.line(
            "const int at = (16 * g + (el >> 4)) * OUT_BOX_ROW + (c * 16 + (el & 15)) * (int)sizeof(OUT_T);"
            "  // the pair's byte in the box, unswizzled"
        )
        w.line(
            f"SPATIALC_PAGE_ST((out_pair*)(staged + OUT_SWZ(at)), (out_pair{{(OUT_T){value('i')}, "
            f"(OUT_T){value('i + 1')}}}));"
        )


def _stage_tile(
    pr: HopperPrinter,
    op: WriteTiles,
    chain: list[tuple[Compute, dict[LoopVar, str]]],
    matrix: bool,
    value_of: Callable[[str], str],
) -> None:
    """Tile q's elements through the chain: into stmatrix's registers (16-bit C) or one at a time at their swizzled
    bytes."""
    w = pr.w
    if matrix:
        w.line("OUT_T out[8];")
    value = value_of("i")
    if chain:  # one element at a time, as the direct fused store does (registers)
        w.line(pr.owned_tile() + "  // (a bias reads its column)")
        w.line("(void)bh; (void)bw;")
        w.line("ACCT frag[8];")
        with pr.unrolled("for (int i = 0; i < 8; ++i)"):
            w.line(f"frag[i] = {value};")
        w.line("#pragma unroll 1")
        value = "frag[i]"
    with w.block("for (int i = 0; i < 8; ++i)") if chain else pr.unrolled("for (int i = 0; i < 8; ++i)"):
        if chain or not matrix:  # (a bias reads the element's column)
            w.line("const int el = lane_el + ((i >> 1) & 1) * 128 + (i >> 2) * 8 + (i & 1);")
        if matrix:
            if chain:
                w.line("(void)el;")
            pr.read_out(op, chain, value, "out[i] = {};")
        else:
            w.line(
                "const int at = (16 * g + (el >> 4)) * OUT_BOX_ROW + (c * 16 + (el & 15)) * (int)sizeof(OUT_T);"
                "  // the element's byte in the box, unswizzled"
            )
            pr.read_out(op, chain, value, "SPATIALC_PAGE_ST((OUT_T*)(staged + OUT_SWZ(at)), {});")
    if matrix:
        w.line(
            "spatialc_stmatrix_rows((OUT_T*)(staged + OUT_SWZ(m_row * OUT_BOX_ROW + (c * 16 + m_col) * 2)), out);"
            "  // the lane's row of one of the tile's four 8 x 8 matrices"
        )

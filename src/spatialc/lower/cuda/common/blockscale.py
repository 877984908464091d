"""A block-scaled K step printed (`MatmulTiles.scales`; `numerics.blockscale` defines it): DeepGEMM's promotion.

The step's MMAs accumulate into partial fragments of their own, zeroed first; then every element of every partial
fragment is added to its accumulator element times sa · sb — A's scale of the element's row and B's of its column,
for the step's K group — as one float32 fused multiply-add (sa · sb one rounding before it). An MX program's e8m0
scales are read as their codes and promoted by their exponents, combined as integers (mx_promote.cuh): their
product 2^(ca + cb − 254) may lie past float32's range where the promoted partial sum does not. Element i of a lane's
fragment is row lane/4 + 8·((i/2) mod 2), column 8·(i/4) + 2·(lane mod 4) + i mod 2 of its tile (tensor_core.cuh),
so each lane reads the scales of its own two rows and four columns straight from global memory (a scale tensor is
a few values an item: rows of A × groups, groups × column blocks of B), tiled as every tensor is. A row or a
column past the tensor's (an item's padding) has partial sums of zero and reads no scale. A grouped GEMM's step
reads its group's matrices of the scale tensors (each group on its own tile rows, stacked as A, B and C are).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ....ir.ids import LoopVar
from ....ir.nodes import DType, Plan, SpatialProgram, Tensor
from ....ir.ops import BlockScales, MatmulTiles
from ....numerics.blockscale import is_mx, program_scales
from ....target import SpatialTarget
from ...errors import MX_PROGRAM as MX_PROGRAM  # (the sm_90a form's name of an MX program, in its refusal)
from .cwriter import addr_expr, inlined_lines

if TYPE_CHECKING:
    from .rings import Ring
    from .tiles import TilePrinter

TILE_ELEMS = 256


# What a block-scaled step costs in registers, in accumulator fragments per fragment held: its partial fragment, and
# the promotion's scale lookups. ptxas -v on the planned 4096³ kernels for sm_89 and sm_90 (nvcc 13) spilled at
# twice the estimate for the plain accumulators and does not at three times.
SCALED_FRAGMENTS = 3


def held_sub_blocks(p: SpatialProgram, plan: Plan) -> tuple[int, int]:
    """The sub-blocks whose accumulator fragments a block's registers hold at once, as `resident_sites_per_unit`
    counts them: a block-scaled step's partial fragments and scale lookups cost SCALED_FRAGMENTS times as many."""
    sh, sw = plan.sub_blocks
    return (SCALED_FRAGMENTS * sh, sw) if program_scales(p) is not None else (sh, sw)


# The most accumulator tiles a warp of the general form holds in a block-scaled plan: ptxas -v (nvcc 13) spilled the
# planned 4096³ kernel of 4 a warp on sm_90 (as it spills the plain fp8 kernel of that plan's 8-tile K steps, which
# the general form is otherwise never planned with), and none of 2 on sm_89 or sm_90.
GENERAL_SCALED_TILES = 2


def mx_lines(p: SpatialProgram) -> list[str]:
    """What an MX program's preamble inlines after dequant.cuh (the e8m0 type's one definition, `spatialc_e8m0`):
    mx_promote.cuh, its promotion by the scales' exponents; nothing for any other program."""
    return [*inlined_lines("common/mx_promote.cuh"), ""] if is_mx(p) else []


def scaled_units(target: SpatialTarget, plan: Plan, form: str, smem: int, per_unit: int) -> int:
    """The planner's blocks an SM for a block-scaled plan: at most what holds the partial fragments too."""
    h, w = plan.item_tiles
    if form == "sm90a":  # the wgmma accumulators' registers and A's scales' stage: the form's own rule
        from ..sm90a.plan import scaled_fits

        return per_unit if scaled_fits(target, plan, smem) else 0
    if form == "general" and math.ceil(h * w / target.accumulator_lanes) > GENERAL_SCALED_TILES:
        return 0
    warps = None if form != "general" else target.accumulator_lanes + 2  # the general form's reader and writer warps
    sh, sw = plan.sub_blocks
    held = (SCALED_FRAGMENTS * sh, sw)
    return min(per_unit, target.resident_sites_per_unit(smem, plan.block.osh, plan.block.osw, held, warps))


def promoted_step(tc: TilePrinter, mm: MatmulTiles, a: Ring, b: Ring, env: dict[LoopVar, str]) -> None:
    """The step's products into zeroed partial fragments, then promoted into the accumulators."""
    assert mm.scales is not None
    tc.w.line(f"spatialc_acc<ACCT> part[{tc.perw}];")
    with tc.unrolled(f"for (int q = 0; q < {tc.perw}; ++q)"):
        tc.w.line("spatialc_acc_zero(part[q]);")
    kept = tc.accf
    tc.accf = "part"
    try:
        if tc.lane_grid is None:
            tc.matmul_strided(mm, a, b)
        else:
            tc.matmul_grid(mm, a, b)
    finally:
        tc.accf = kept
    with tc.w.block(""):  # (a scope of its own: the MMAs above declared the warp's coordinates too)
        promotion(tc, mm.scales, env)


def promotion(
    tc: TilePrinter, s: BlockScales, env: dict[LoopVar, str], a_scale: Callable[[str], str] | None = None
) -> None:
    """acc[q].x[i] += part[q].x[i] · (sa · sb) for each element this lane holds: the one printing of the promotion,
    which every form's block-scaled step ends with. `a_scale`, where given, is A's scale of a row (a C expression of
    the row) where a form has landed them (the sm_90a form's TMA boxes of the group's scales, zero past the tensor's
    rows); else read from global memory. (`scale_loads` and `promoted_fmas` print the same in two places.)"""
    look = _Lookups(tc, s, env, a_scale)

    def promote(tile_row: str, tile_col: str) -> None:
        rows, cols = look.fragment(tile_row, tile_col)
        tc.w.line(f"const {look.ctype} sa[{len(rows)}] = {{{', '.join(rows)}}};")
        tc.w.line(f"const {look.ctype} sb[{len(cols)}] = {{{', '.join(cols)}}};")
        _fmas(tc, look, "sa", "sb")

    _each_fragment(tc, promote)


def scale_loads(
    tc: TilePrinter, s: BlockScales, env: dict[LoopVar, str], a_scale: Callable[[str], str] | None = None
) -> tuple[int, int, bool]:
    """The promotion's scales of every fragment of the lane, read into `psa[q][…]` and `psb[q][…]` (declared here, at
    the printer's scope) — where a form reads them before the step's MMAs are issued, so that their latency is spent
    under them (the sm_90a form); `promoted_fmas` then promotes with them. Returns their counts a fragment and
    whether they are e8m0 codes. Where
    B's scale block holds whole items (DeepGEMM's 128 × 128 with items of at most 128 columns, items starting on
    their width), every fragment's B scale is the item's first column's: one expression, which the compiler reads
    once (and sa · sb once a row) where the lookup by column it could not prove the same."""
    assert tc.lane_grid is not None, "the grid layouts' fragments (the sm_90a form's)"
    w = tc.plan.item_tiles[1]
    look = _Lookups(tc, s, env, a_scale, declare=False, item_b=s.b.outer % (w * 16) == 0)
    na, nb = len(look.a_rows), len(look.b_cols)
    ct = look.ctype
    tc.w.line(f"{ct} psa[{tc.perw}][{na}], psb[{tc.perw}][{nb}];  // the step's scales of each fragment")
    with tc.w.block(""):
        look.declare()

        def load(tile_row: str, tile_col: str) -> None:
            rows, cols = look.fragment(tile_row, tile_col)
            for j, v in enumerate(rows):
                tc.w.line(f"psa[q][{j}] = {v};")
            for j, v in enumerate(cols):
                tc.w.line(f"psb[q][{j}] = {v};")

        _each_fragment(tc, load)
    return na, nb, look.mx


def promoted_fmas(tc: TilePrinter, counts: tuple[int, int, bool]) -> None:
    """The promotion's fused multiply-adds with the scales `scale_loads` read."""
    with tc.unrolled(f"for (int q = 0; q < {tc.perw}; ++q)"):
        _fmas(tc, _Counts(*counts), "psa[q]", "psb[q]")


class _Counts:
    """How many scales of A's rows and of B's columns a fragment's elements take, and whether they are e8m0 codes
    (`mx`: an MX program's, promoted by their exponents) or float32 values."""

    def __init__(self, na: int, nb: int, mx: bool) -> None:
        self.a_rows, self.b_cols, self.mx = tuple(range(na)), tuple(range(nb)), mx

    @property
    def ctype(self) -> str:
        """The C type of a looked-up scale: an e8m0 code as an int, else a float."""
        return "int" if self.mx else "float"


class _Lookups(_Counts):
    """The promotion's scale lookups for one step: its header (the lane, the item's first row and column, the step's
    K groups) and each fragment's scales as C expressions."""

    def __init__(
        self,
        tc: TilePrinter,
        s: BlockScales,
        env: dict[LoopVar, str],
        a_scale: Callable[[str], str] | None,
        declare: bool = True,
        item_b: bool = False,
    ) -> None:
        h, w = tc.plan.item_tiles
        self.tc, self.s, self.env, self.a_scale = tc, s, env, a_scale
        self.item_b = item_b  # B's scale of every column of the item: its first column's (`scale_loads`)
        self.ta, self.tb = tc.tensors[int(s.a.tensor)], tc.tensors[int(s.b.tensor)]
        self.mx = self.ta.dtype == DType.E8M0  # (verify's rule 8: both e8m0 or neither)
        # A row (column) of the items past the scale tensor's — the padding of the last items — reads no scale; the
        # group is always inside (every step starts below K). A block of 16 or more rows (columns) gives a lane one
        # scale.
        self.rows_past = tc.plan.grid[0] * h * 16 > self.ta.elems[0] * s.a.outer
        self.cols_past = tc.plan.grid[1] * w * 16 > self.tb.elems[1] * s.b.outer
        self.group = None if s.group is None else "sg"  # a grouped GEMM's step's group (`declare`)
        self.a_rows = (0,) if s.a.outer % 16 == 0 else (0, 8)
        self.b_cols = (0,) if s.b.outer % 16 == 0 else (0, 1, 8, 9)
        if declare:
            self.declare()

    def declare(self) -> None:
        tc, s, env = self.tc, self.s, self.env
        tc.w.line(f"const int lane = {tc.tid} % 32;")
        tc.w.line(
            f"const int sr0 = ({addr_expr(s.rows, env) or '0'}) * 16, sc0 = ({addr_expr(s.cols, env) or '0'}) * 16;"
        )
        tc.w.line(f"const int sk0 = ({addr_expr(s.k, env) or '0'}) * 16;")
        if s.group is not None:  # a grouped GEMM's: the scale tensors' matrices of the step's group (expert)
            tc.w.line(f"const int sg = {addr_expr(s.group, env) or '0'};  // the step's group")
        if self.a_scale is None:
            tc.w.line(
                f"const int ga = sk0 / {s.a.k}, gb = sk0 / {s.b.k};  // the step's K group of A's and of B's scales"
            )
        else:
            tc.w.line(f"const int gb = sk0 / {s.b.k};  // the step's K group of B's scales")

    def fragment(self, tile_row: str, tile_col: str) -> tuple[list[str], list[str]]:
        """Print the fragment's row and column; its scales of A's rows and of B's columns, as C expressions."""
        s = self.s
        # A lane's elements lie in two rows of the tile (i / 2 mod 2) and four columns (2·(i / 4) + i mod 2).
        if self.item_b:  # (the column is not looked at)
            self.tc.w.line(f"const int r = sr0 + ({tile_row}) * 16 + (lane >> 2);")
            self.tc.w.line(f"(void)({tile_col});  // B's scale is the item's")
        else:
            self.tc.w.line(
                f"const int r = sr0 + ({tile_row}) * 16 + (lane >> 2), c = sc0 + ({tile_col}) * 16 + 2 * (lane & 3);"
            )
        if self.a_scale is not None:
            rows = [self.a_scale(f"(r + {d})") for d in self.a_rows]
        else:
            rows = [
                _element(self.ta, f"(r + {d}) / {s.a.outer}", "ga", self.rows_past, False, self.group)
                for d in self.a_rows
            ]
        if self.item_b:
            return rows, [_element(self.tb, "gb", f"sc0 / {s.b.outer}", False, self.cols_past, self.group)]
        cols = [
            _element(self.tb, "gb", f"(c + {d}) / {s.b.outer}", False, self.cols_past, self.group) for d in self.b_cols
        ]
        return rows, cols


def _fmas(tc: TilePrinter, look: _Counts, sa_name: str, sb_name: str) -> None:
    sa = f"{sa_name}[(i >> 1) & 1]" if len(look.a_rows) > 1 else f"{sa_name}[0]"
    sb = f"{sb_name}[2 * (i >> 2) + (i & 1)]" if len(look.b_cols) > 1 else f"{sb_name}[0]"
    with tc.unrolled("for (int i = 0; i < 8; ++i)"):
        if look.mx:  # e8m0 codes: their exponents combined as integers, applied exactly (mx_promote.cuh)
            tc.w.line(f"{tc.accf}[q].x[i] = spatialc_mx_promote(part[q].x[i], {sa}, {sb}, {tc.accf}[q].x[i]);")
        else:
            tc.w.line(f"{tc.accf}[q].x[i] = fmaf(part[q].x[i], {sa} * {sb}, {tc.accf}[q].x[i]);")


def _each_fragment(tc: TilePrinter, body: Callable[[str, str], None]) -> None:
    """`body(tile row, tile column)` for each accumulator fragment q of the lane, in an unrolled loop over q."""
    h, w = tc.plan.item_tiles
    if tc.lane_grid is None:
        with tc.unrolled(f"for (int q = 0; q < {tc.perw}; ++q)"):
            tc.w.line("const int ot = warp + q * NWARP;")
            with tc.w.block(f"if (ot < {h * w})"):
                body(f"ot / {w}", f"ot % {w}")
        return
    tc.warp_coords()
    with tc.unrolled(f"for (int q = 0; q < {tc.perw}; ++q)"):
        tc.w.line(tc.owned_tile())
        body("bh", "bw")


def _element(t: Tensor, row: str, col: str, row_past: bool, col_past: bool, group: str | None = None) -> str:
    """Element (row, col) of the float32 (or e8m0) tensor t, tiled as every tensor is (of a grouped tensor's matrix
    `group`, its groups stacked, each on its own tile rows), as a float; 0 where a row (col) may lie past its
    elements (`row_past`, `col_past`) and does. An e8m0 scale (MX's) is read as its byte, the code as an int, which
    the promotion combines with the other operand's (mx_promote.cuh)."""
    rows, cols = t.elems
    tile_row = f"({row}) / 16" if group is None else f"(({group}) * {t.group_tiles[0]} + ({row}) / 16)"
    at = f"t{int(t.id)}[({tile_row} * {t.tiles[1]} + ({col}) / 16) * {TILE_ELEMS} + ({row}) % 16 * 16 + ({col}) % 16]"
    zero = "0.0f"
    if t.dtype == DType.E8M0:  # (its code 0 past the tensor: any scale of a zero partial sum adds zero)
        at, zero = f"(int){at}", "0"
    checks = [f"({row}) < {rows}"] * row_past + [f"({col}) < {cols}"] * col_past
    return f"({' && '.join(checks)} ? {at} : {zero})" if checks else at

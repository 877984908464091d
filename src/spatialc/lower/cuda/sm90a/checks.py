"""What the sm_90a form takes (`refuse`, before anything is laid out) and the static checks of its laid-out kernel
before printing (`check_resources`), each refusal naming the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....ir.nodes import SpatialProgram
from ....ir.ops import Loop, ReadTiles, Trip
from ....numerics.blockscale import is_mx, program_scales
from ....passes.attention import is_attention_program
from ....passes.cols import is_col_program
from ....passes.footprint import in_panels
from ....passes.maps import is_map_program
from ....passes.rows import is_row_program
from ....target import WARP, SpatialTarget
from ...errors import NeedsGeneral, TooBig, Unsupported
from ..common.blockscale import MX_PROGRAM
from ..common.dequant import has_dequant
from ..common.program import COL_PROGRAM, MAP_PROGRAM, ROW_PROGRAM, W4_PROGRAM, all_ops, matmul_stages
from ..general import checks as general_checks
from .attention import check_attention_plan
from .barriers import check_barriers
from .plan import CONSUMER_REGS, PRODUCER_REGS, STAGE_ALIGN, WARPGROUP, check_plan

if TYPE_CHECKING:
    from .kernel import HopperKernel


TMA_COORD_MAX = 2**31 - 1


def refuse(p: SpatialProgram, target: SpatialTarget) -> None:
    """Raise the first reason the sm_90a form cannot print `p`."""
    if not target.hopper:
        raise Unsupported(
            f"the sm_90a form on {target.name}", "its TMA, wgmma and setmaxnreg instructions exist on sm_90a only"
        )
    attention = is_attention_program(p)
    if not attention and (is_map_program(p) or is_row_program(p) or is_col_program(p)):
        what = COL_PROGRAM if is_col_program(p) else ROW_PROGRAM if is_row_program(p) else MAP_PROGRAM
        raise NeedsGeneral(
            f"{what} in the sm_90a form",
            "its TMA producer feeds wgmma consumers, which only a tile matmul has",
        )
    general_checks.refuse(p)
    if has_dequant(p) and not in_panels(p):  # its consumers dequantise into B's panels (sm90a/dequant.py)
        raise NeedsGeneral(
            f"{W4_PROGRAM} planned for the other forms, in the sm_90a form",
            "its B pages are not panels: build it with form='sm90a' (--form sm90a) to plan it for this form",
        )
    if is_mx(p):
        raise NeedsGeneral(
            f"{MX_PROGRAM} in the sm_90a form",
            "a wgmma k32 promoted every instruction would wait on each one (no MMA overlaps its promotion)",
        )
    if not attention and len(matmul_stages(p)) > 1:
        raise Unsupported("several tile matmuls", "the consumer warpgroups hold one wgmma accumulator block per item")
    for op in all_ops(p):
        match op:
            case Loop(count=Trip()):
                raise Unsupported("a loop count read from data", "the sm_90a form prints fixed loops so far")
            case ReadTiles(rows_from=rows) if rows is not None:
                raise Unsupported("a grouped tensor's row limit", "a TMA box reads whole tiles")
    for t in p.tensors:  # a TMA map's dimensions and every coordinate in it are signed 32-bit (PTX's tensor ops)
        rows, cols = t.tiles[0] * p.tile.rows, t.tiles[1] * p.tile.cols
        if max(rows, cols) > TMA_COORD_MAX:
            raise Unsupported(
                f"tensor {t.name} of {rows} x {cols} elements (padded)",
                f"a TMA coordinate is a signed 32-bit int, at most {TMA_COORD_MAX}: the general form (64-bit"
                " addresses) prints it",
            )
    plan = p.plans[0]
    if attention:
        check_attention_plan(plan)
    else:
        check_plan(plan, p.precision, program_scales(p) is not None)


def check_resources(k: HopperKernel, target: SpatialTarget) -> None:
    """The static checks before printing, each refusal naming the fix."""
    check_barriers(k)  # the named barriers' ids: disjoint, 1 to 15
    wg = k.wg
    # At launch every thread has what `__launch_bounds__(threads, blocks)` leaves it; setmaxnreg.dec must lower
    # that and .inc raise it (a paired block moves none: its consumers need no more than the launch gives).
    at_launch = wg.at_launch(target)
    if wg.moves_registers and not PRODUCER_REGS <= at_launch <= CONSUMER_REGS:
        raise Unsupported(
            f"{at_launch} registers a thread at launch ({wg.threads} threads)",
            f"setmaxnreg moves the producer down to {PRODUCER_REGS} and the consumers up to {CONSUMER_REGS}",
        )
    split = WARPGROUP * WARP * (PRODUCER_REGS + wg.consumers * CONSUMER_REGS)
    if wg.moves_registers and split > target.regs_per_unit:
        raise TooBig("registers after setmaxnreg", split, target.regs_per_unit, "lower the consumers' setmaxnreg")
    if k.base.dyn_bytes > wg.smem_max(target):
        blocks = f", {wg.blocks} blocks an SM" if wg.paired else ""
        raise TooBig(
            f"shared memory of one block of the sm_90a form on {target.name}{blocks} (stages and barriers)",
            k.base.dyn_bytes,
            wg.smem_max(target),
            "choose fewer stages (depth) or a narrower block",
        )
    for rid in k.tma_rings:
        off = k.base.offsets[f"ring_{rid}"]
        if off % STAGE_ALIGN:
            raise Unsupported(f"ring {rid} at byte {off}", f"a swizzled stage starts on {STAGE_ALIGN} bytes")
        ring = k.base.rings.rings[rid]
        period = k.panels[rid].period  # a panel's swizzle repeats every 8 of its rows; a tile box starts on 128 bytes
        if (ring.page * ring.elem_bytes) % period:
            raise Unsupported(
                f"pages of {ring.page * ring.elem_bytes} bytes on {ring.name}",
                f"every page of {k.panels[rid].width}-byte panels starts on {period} bytes"
                if k.panels[rid].width
                else f"every page of unswizzled tile boxes starts on {period} bytes",
            )

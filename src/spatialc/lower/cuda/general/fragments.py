"""What the general form's compute warps hold: each accumulator's fragments, and the registers they take.

`accumulator_layers` lays the compute warps over each accumulator's block (an MLP's layers); the `held_*` and
`*_registers` estimates are what `kernel.GeneralKernel.registers` and the planner's resource questions count.
"""

from __future__ import annotations

import dataclasses

from ....ir.nodes import Plan, SpatialProgram
from ....ir.ops import Compute, MatmulTiles, RowReduce
from ....target import SpatialTarget
from ...errors import Unsupported
from ..common.program import all_ops, fragments_per_warp
from ..common.rows import RowAccumulators
from ..common.tiles import Fragments
from .printer import accumulator_of


def accumulator_layers(
    p: SpatialProgram, target: SpatialTarget, plan: Plan, rows: frozenset[int] = frozenset(), by_rows: int = 0
) -> dict[int, Fragments]:
    """Each accumulator's fragments by template where the program has several (`GeneralKernel.layers`): the block
    and sub-blocks of the matmul whose Compute ops add into it, the compute warps split over that block as over the
    plan's — and {} where it has one. Row accumulators (templates `rows`) are no fragments. `by_rows` > 0 lays that
    many warps over each block by rows alone (the register path's grid, (by_rows, 1))."""
    served: dict[int, MatmulTiles] = {}
    accs: set[int] = set()
    for op in all_ops(p):
        acc = accumulator_of(op)
        if acc is None or int(p.buffer(acc).ring) in rows:
            continue
        t = int(p.buffer(acc).ring)
        accs.add(t)
        if isinstance(op, Compute) and isinstance(op.op, MatmulTiles):
            mm = served.setdefault(t, op.op)
            if (mm.block, mm.sub_blocks) != (op.op.block, op.op.sub_blocks):
                raise Unsupported(
                    f"accumulator {p.buffer(acc).name} added into by matmuls of two block shapes",
                    "an accumulator's fragments have its matmul's shape",
                )
    if len(accs) < 2:
        return {}
    layers = {}
    for t in sorted(accs):
        serves = served.get(t)
        shaped = dataclasses.replace(plan, block=serves.block, sub_blocks=serves.sub_blocks) if serves else plan
        if by_rows:
            grid = (by_rows, 1)
            layers[t] = Fragments(shaped, grid, fragments_per_warp(shaped, by_rows, grid), f"accf_{t}", f"PERW_{t}")
        else:
            layers[t] = fragments_of(shaped, target, f"accf_{t}", f"PERW_{t}")
    return layers


def fragments_of(plan: Plan, target: SpatialTarget, name: str = "accf", count: str = "PERW") -> Fragments:
    """The fragments of an accumulator of `plan`'s block: the compute warps laid over it, the tiles each holds."""
    grid = target.accumulator_lane_grid(plan.block.osh, plan.block.osw)
    return Fragments(plan, grid, fragments_per_warp(plan, target.accumulator_lanes, grid), name, count)


def attention_lanes(target: SpatialTarget, bh: int) -> int:
    """The compute warps of an attention's kernel: the most, up to the target's accumulator lanes, that split a band
    of `bh` tile rows by rows alone — each warp whole rows of S and O, so that its rings live in its registers
    (registers.py; 4 at bh = 4: 16 query rows a warp, as FlashAttention-2's)."""
    return max(d for d in range(1, min(bh, target.accumulator_lanes) + 1) if bh % d == 0)


def held_tiles(plan: Plan, layers: dict[int, Fragments]) -> int:
    """Accumulator tiles the compute warps hold at once: every layer's, or the plan's item."""
    h, w = plan.item_tiles
    return sum(f.tiles for f in layers.values()) if layers else h * w


def held_registers(
    target: SpatialTarget, acc_tiles: int, rows: RowAccumulators, lanes: int | None = None, score_tiles: int = 0
) -> int:
    """The estimate of a thread's registers where the compute warps hold accumulator fragments and row accumulators
    at once (attention): a row program's kernel's (`rows.BASE_REGISTERS`, its shares and page tiles), the 12 a
    fragment a warp holds that `SpatialTarget.registers_needed` counts, and where the scores' pages live in registers
    (`score_tiles` of them) `scores_registers`. Calibrated with ptxas -v (nvcc 13) on attention, its recurrence in
    registers, none spilled: (bh, bw, dt) = (4, 4, 8) on sm_90 used 246 registers (estimate 255), on sm_80 250 (255),
    (4, 2, 8) on sm_86 239 (255), (2, 4, 8) on sm_80 254 (255), (2, 2, 4) on sm_86 207 (196: two blocks an SM,
    which leave ptxas 255)."""
    return fragments_and_rows(target, acc_tiles, rows.registers, lanes) + scores_registers(score_tiles, lanes or 1)


def scores_registers(score_tiles: int, lanes: int) -> int:
    """A thread's registers for the scores' values its warp holds (a page of `score_tiles` tiles over `lanes`
    warps): 16 a tile, X's and P's eight each, which the P map holds at once."""
    return 16 * -(-score_tiles // lanes)


def fragments_and_rows(target: SpatialTarget, acc_tiles: int, row_registers: int, lanes: int | None = None) -> int:
    """`held_registers` of a kernel whose row shares and pages alone would take `row_registers`, its fragments held
    by `lanes` compute warps (the target's accumulator lanes unless given)."""
    return row_registers + 12 * max(1, -(-acc_tiles // (lanes or target.accumulator_lanes)))


def row_templates(p: SpatialProgram) -> frozenset[int]:
    """The accumulators (by template) that row reductions fold into: row accumulators, not fragments."""
    return frozenset(
        int(p.buffer(op.acc).ring)
        for op in all_ops(p)
        if isinstance(op, Compute) and isinstance(op.op, RowReduce) and op.acc is not None
    )

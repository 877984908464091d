"""What the sm_90a form takes and what it costs: its shape constants, the item shapes wgmma's layout takes, and the
tile planner's two questions of it — a plan's shared memory and resident blocks (`plan_resources`, the backend answer
`passes.tile.resources` asks every form for) and its estimated time (`plan_cost`, rates guessed until the first GPU
table). The lowering itself is `hopper.py`.
"""

from __future__ import annotations

import math

from ...ir.nodes import Plan
from ...ir.ops import Precision
from ...target import SpatialTarget
from ..errors import Unsupported
from . import general
from .rings import MMA_TYPES, TILE_ELEMS, Ring

WARPGROUP = 4  # warps that issue one wgmma together
CONSUMER_GROUPS = 2  # warpgroups of the compute engine: its eight accumulator warps
PRODUCER_REGS = 40  # registers a producer-warpgroup thread keeps after setmaxnreg.dec
CONSUMER_REGS = 232  # registers a consumer thread gets with setmaxnreg.inc
STAGE_ALIGN = 1024  # bytes: every ring starts on the largest swizzle pattern's period
BARRIER_ALIGN = 16  # each barrier array: the emulation's (and the layout's) least region alignment
WGMMA_N_MAX = 256
STORE_STAGE = 4096  # bytes of shared memory each consumer warp stages its output in, for the TMA store
STORE_BUFFERS = 2  # the staging's halves, used in turn: a box is staged while the store of the one before reads
STAGING_BOXES = CONSUMER_GROUPS * WARPGROUP * STORE_BUFFERS  # the output boxes of a block: each consumer warp's
OUT_BYTES = {"signed char": 1, "__half": 2, "__nv_bfloat16": 2, "float": 4, "int": 4, "long long": 8}


def check_plan(plan: Plan, precision: Precision) -> None:
    """The item shapes the wgmma layout takes: 128 rows (two warpgroups of 64), at most 256 columns, K steps whole
    MMAs."""
    h, w = plan.item_tiles
    if plan.sub_blocks != (1, 1):
        raise Unsupported(f"sub-blocks {plan.sub_blocks}", "an sm_90a item is one block of accumulators")
    if h != CONSUMER_GROUPS * WARPGROUP:
        raise Unsupported(
            f"items of {h * 16} rows", "the two consumer warpgroups hold 64 rows each: use blocks of 8 tile rows"
        )
    if w * 16 > WGMMA_N_MAX:
        raise Unsupported(f"items of {w * 16} columns", f"one wgmma is at most {WGMMA_N_MAX} columns wide")
    if precision == Precision.INT8 and plan.block.ibw % 2:
        raise Unsupported(f"int8 K steps of {plan.block.ibw} tiles", "an int8 wgmma takes K in pairs of tiles (k32)")


# ---- resources -------------------------------------------------------------------------------------------------


def plan_resources(target: SpatialTarget, plan: Plan, precision: Precision, stages: int = 0) -> tuple[int, int]:
    """(shared memory bytes, blocks per SM) of the sm_90a form for `plan`, as the tile planner asks: A's and B's
    stages, `depth` deep on 1024-byte boundaries, and their barriers (a multicast's ready ones too), then the fused
    store's staging — or, where the epilogue keeps `stages` rings (a chain with an activation, which the fused store
    does not apply; the planner passes 0 otherwise), the output's ring and those, two deep, as the general form's;
    0 blocks where the wgmma layout does not take the plan."""
    try:
        check_plan(plan, precision)
    except Unsupported:
        return 0, 0
    types = MMA_TYPES[precision]
    h, w = plan.item_tiles
    ibw = plan.block.ibw
    shapes = [(plan.depth, h * ibw, types.operand_bytes), (plan.depth, ibw * w, types.operand_bytes)]
    out = min(plan.depth, 2)
    if stages:
        epit = general.epit_bytes(precision == Precision.INT8)
        shapes += [(out, h * w, types.acc_bytes)] + [(out, h * w, epit)] * stages
    rings = {i: Ring(i, f"ring{i}", d, tiles * TILE_ELEMS, "", size) for i, (d, tiles, size) in enumerate(shapes)}
    # Both operands' ready barriers are counted: the plan is made before the placement says whether they multicast.
    smem = general.layout(rings, STAGE_ALIGN, BARRIER_ALIGN, ready=(0, 1))[1] + (0 if stages else store_stage_bytes())
    if smem > target.smem_per_site_max:
        return smem, 0
    return smem, 1


# How much of the tensor cores' rate a wgmma of width N keeps busy (B is read from shared memory for 64 rows of A:
# narrow ones are bound by that traffic), and a pipeline of `depth` stages (one in the MMA, one in flight, the rest
# hiding the copy engine's latency). Guesses from published Hopper GEMM progressions, to be fitted to the first GPU
# table (bench/README.md, "The sm_90a form").
WGMMA_N_RATE = {16: 0.35, 32: 0.55, 64: 0.75, 128: 0.92, 256: 1.0}
DEPTH_RATE = {1: 0.5, 2: 0.8, 3: 0.93, 4: 1.0, 5: 1.0}
K_STEP_RATE = {32: 0.8, 64: 0.93, 128: 1.0}  # K steps of 32, 64, 128 bytes: a wait and a release per step


def store_stage_bytes() -> int:
    """The fused store's staging: STORE_STAGE bytes for each consumer warp, on a 1024-byte boundary (the planner
    counts it whatever the epilogue; a chain the fused store cannot apply keeps rings instead, checked when
    lowered)."""
    return CONSUMER_GROUPS * WARPGROUP * STORE_STAGE + STAGE_ALIGN


def staging_bytes(chunk: int, out_type: str) -> int:
    """Shared memory of the output staging: every consumer warp's boxes of `chunk` tiles of `out_type` (0: none)."""
    return STAGING_BOXES * chunk * TILE_ELEMS * OUT_BYTES[out_type]


def store_chunk(w: int, out_type: str) -> int:
    """Tiles of its row a consumer warp stages at a time, one box: the most (a power of two dividing the item's `w`
    columns of tiles) whose `out_type` elements fit one of its STORE_BUFFERS halves of STORE_STAGE bytes."""
    chunk = 1
    while w % (2 * chunk) == 0 and 2 * chunk * TILE_ELEMS * OUT_BYTES[out_type] <= STORE_STAGE // STORE_BUFFERS:
        chunk *= 2
    return chunk


def plan_cost(target: SpatialTarget, plan: Plan, precision: Precision) -> float:
    """Estimated run time (arbitrary units) of `plan` in the sm_90a form: waves of items over the SMs (one block
    each) × one item's multiply-accumulates (in padded tiles) / the rate its wgmma width, stage depth and K step
    keep."""
    h, w = plan.item_tiles
    waves = math.ceil(plan.items / target.units)
    step = plan.block.ibw * 16 * MMA_TYPES[precision].operand_bytes  # bytes of K a step: its panels' width
    rate = WGMMA_N_RATE.get(w * 16, 0.9) * DEPTH_RATE.get(plan.depth, 1.0) * K_STEP_RATE.get(step, 1.0)
    return waves * h * w * plan.k_tiles / rate

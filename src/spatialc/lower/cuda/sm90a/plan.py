"""What the sm_90a form takes and what it costs: its shape constants, the item shapes wgmma's layout takes, and the
tile planner's two questions of it — a plan's shared memory and resident blocks (`plan_resources`, the backend
answer `passes.footprint.resources` asks every form for) and its estimated time (`plan_cost`, rates guessed before
the first GPU table; the paired blocks' fitted to it). The lowering itself is `kernel.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ....ir.nodes import Plan
from ....ir.ops import Precision
from ....passes.footprint import sized_as
from ....target import WARP, SpatialTarget
from ...errors import Unsupported
from ..common.rings import MMA_TYPES, TILE_ELEMS, Ring
from ..general import kernel as general

WARPGROUP = 4  # warps that issue one wgmma together
WARPGROUP_ROWS = 64  # rows of the item one consumer warpgroup holds: its m64 wgmma
PRODUCER_REGS = 40  # registers a producer-warpgroup thread keeps after setmaxnreg.dec
CONSUMER_REGS = 232  # registers a consumer thread gets with setmaxnreg.inc (two consumer warpgroups)
PAIRED_N_MAX = 128  # the widest item of one consumer warpgroup: its accumulators within 128 registers a thread
STAGE_ALIGN = 1024  # bytes: every ring starts on the largest swizzle pattern's period
BARRIER_ALIGN = 16  # each barrier array: the emulation's (and the layout's) least region alignment
WGMMA_N_MAX = 256
# A block-scaled item's widest wgmma: each K group's wgmma write a partial accumulator beside the item's (numerics/
# blockscale.py), N / 2 more registers a thread — two consumer warpgroups' 232 hold both at N = 128 (64 + 64, with
# the scales and addresses); a paired block's 128 at N = 64.
SCALED_N_MAX = 128
STORE_STAGE = 4096  # bytes of shared memory each consumer warp stages its output in, for the TMA store
STORE_BUFFERS = 2  # the staging's halves, used in turn: a box is staged while the store of the one before reads
SWIZZLED, TILES = "swizzled", "tiles"
# How the fused store's staged output goes out (`kernel.lower`'s `epilogue`): "swizzled" — each consumer warpgroup
# stages `store_chunk` tiles of its 64 rows at a time in one box, its rows as wide as the chunk (128 bytes where the
# item is that wide) and swizzled as wide, written by stmatrix (16-bit C) or a lane's elements, one fence, one
# warpgroup barrier and one TMA store a box (staging.py); "tiles" — each consumer warp stages the chunk of its 16
# rows, unswizzled, and stores it a 16 × 16 box a tile (the form's first epilogue, kept as the GPU check's neighbour).
EPILOGUES = (SWIZZLED, TILES)
OUT_BYTES = {"signed char": 1, "__half": 2, "__nv_bfloat16": 2, "float": 4, "int": 4, "long long": 8}


@dataclass(frozen=True, slots=True)
class Warpgroups:
    """How a block of the sm_90a form is made: `consumers` warpgroups of the compute engine (one per 64 rows of the
    item) and one producer warpgroup, `blocks` of them resident on an SM, which share its register file.

    Items of 128 rows take two consumer warpgroups and the SM alone; setmaxnreg moves the producer's registers to
    them. Items of 64 rows take one, and two blocks share each SM (`paired`): while one block's consumers store an
    item, the other's keep the tensor cores busy — the overlap CUTLASS's ping-pong kernel gets from two consumer
    warpgroups on alternating tiles, here from two blocks, with no second compute engine in a site (each ring keeps
    one producer and one consumer, as verify proves them). A paired block keeps the 128 registers a thread its launch
    gives it, and no setmaxnreg: ptxas counts the registers of a kernel that has one at the launch bounds' cap, and
    lets no instruction use more — a wgmma wider than 128 columns (128 accumulators a thread and its operands) does
    not compile there, and a kernel whose count came out lower would wait forever in the increase."""

    consumers: int
    blocks: int

    @property
    def warps(self) -> int:
        """Warps of a block: the consumers' and the producer warpgroup's."""
        return (self.consumers + 1) * WARPGROUP

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def paired(self) -> bool:
        """Whether two blocks share an SM (one consumer warpgroup each, no setmaxnreg)."""
        return self.blocks > 1

    @property
    def moves_registers(self) -> bool:
        """Whether setmaxnreg moves the producer warpgroup's registers to the consumers: two consumer warpgroups.
        A block of one keeps what its launch gives it (paired: 128 a thread; alone on its SM: 255)."""
        return self.consumers > 1

    @property
    def staging_boxes(self) -> int:
        """The output boxes of a block: each consumer warp's STORE_BUFFERS."""
        return self.consumers * WARPGROUP * STORE_BUFFERS

    def smem_max(self, target: SpatialTarget) -> int:
        """The most shared memory a block may have: the per-block maximum, or, for paired blocks, each one's share
        of the SM's less the system's reserve."""
        return min(target.smem_per_site_max, target.smem_per_unit // self.blocks - target.smem_reserved_per_site)

    def at_launch(self, target: SpatialTarget) -> int:
        """Registers a thread holds at launch: what `__launch_bounds__(threads, blocks)` leaves it of the SM's file,
        in whole multiples of 8, at most the target's per-thread cap."""
        return min(target.regs_per_thread_max, target.regs_per_unit // (self.threads * self.blocks)) // 8 * 8

    def consumer_regs(self, target: SpatialTarget) -> int:
        """Registers a consumer thread holds while it multiplies: CONSUMER_REGS after setmaxnreg.inc, or a paired
        block's registers at launch."""
        return CONSUMER_REGS if self.moves_registers else self.at_launch(target)


def pairs(tile_rows: int) -> bool:
    """Whether items of `tile_rows` rows of tiles run in paired blocks (one consumer warpgroup, two blocks an SM)."""
    return tile_rows * 16 == WARPGROUP_ROWS


def warpgroups(plan: Plan) -> Warpgroups:
    """The block `plan`'s items take (`check_plan` has taken the plan): a consumer warpgroup per 64 rows, two
    blocks an SM where one warpgroup consumes."""
    h = plan.item_tiles[0]
    return Warpgroups(h * 16 // WARPGROUP_ROWS, 2 if pairs(h) else 1)


def scaled_n_max(plan: Plan) -> int:
    """The widest item a block-scaled plan takes: its partial accumulators beside the item's (SCALED_N_MAX; half
    that in a paired block)."""
    return SCALED_N_MAX // 2 if pairs(plan.item_tiles[0]) else SCALED_N_MAX


def scaled_fits(target: SpatialTarget, plan: Plan, smem: int) -> bool:
    """Whether a block-scaled GEMM takes `plan` whose block needs `smem` bytes without A's scales: items at most
    `scaled_n_max` wide, and A's scales' stage (blockscale.py) beside the rest in shared memory."""
    from .blockscale import stage_bytes

    h, w = plan.item_tiles
    return (
        w * 16 <= scaled_n_max(plan) and fits(target, smem + stage_bytes(h * 16, plan.depth), warpgroups(plan)) is None
    )


def check_plan(plan: Plan, precision: Precision, scaled: bool = False) -> None:
    """The item shapes the wgmma layout takes: 64 or 128 rows (one or two warpgroups of 64), at most 256 columns
    (128 for a paired block of 64 rows; a block-scaled item half as many, `scaled_n_max`), K steps whole MMAs."""
    h, w = plan.item_tiles
    if plan.sub_blocks != (1, 1):
        raise Unsupported(f"sub-blocks {plan.sub_blocks}", "an sm_90a item is one block of accumulators")
    if h * 16 not in (WARPGROUP_ROWS, 2 * WARPGROUP_ROWS):
        raise Unsupported(
            f"items of {h * 16} rows",
            "a consumer warpgroup holds 64 rows and a block one or two: use blocks of 4 or 8 tile rows",
        )
    if w * 16 > WGMMA_N_MAX:
        raise Unsupported(f"items of {w * 16} columns", f"one wgmma is at most {WGMMA_N_MAX} columns wide")
    if pairs(h) and w * 16 > PAIRED_N_MAX:
        raise Unsupported(
            f"items of 64 rows and {w * 16} columns",
            f"two blocks share an SM's registers, 128 a thread, which hold a wgmma of {PAIRED_N_MAX} columns at most:"
            " use blocks of 8 tile rows, or at most 8 tile columns",
        )
    if scaled and w * 16 > scaled_n_max(plan):
        raise Unsupported(
            f"block-scaled items of {h * 16} rows and {w * 16} columns",
            f"each K group's partial accumulators double the consumers' float32 registers, which hold"
            f" {scaled_n_max(plan)} columns at most: use blocks of at most {scaled_n_max(plan) // 16} tile columns",
        )
    if sized_as(precision) == Precision.INT8 and plan.block.ibw % 2:
        raise Unsupported(
            f"{precision.value} K steps of {plan.block.ibw} tiles", "an 8-bit wgmma takes K in pairs of tiles (k32)"
        )


# ---- resources -------------------------------------------------------------------------------------------------


def plan_resources(
    target: SpatialTarget, plan: Plan, precision: Precision, stages: int = 0, reads: int = 0
) -> tuple[int, int]:
    """(shared memory bytes, blocks per SM) of the sm_90a form for `plan`, as the tile planner asks: A's and B's
    stages, `depth` deep on 1024-byte boundaries, and their barriers (a multicast's ready ones too), then the fused
    store's staging — or, where the epilogue keeps `stages` rings (a chain with an activation, which the fused store
    does not apply; the planner passes 0 otherwise), the output's ring and those, two deep, as the general form's;
    and the `reads` rings of item-sized operand pages (a residual's) the fused store reads, two deep; 0 blocks where
    the wgmma layout does not take the plan."""
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
        epit = general.epit_bytes(sized_as(precision) == Precision.INT8)
        shapes += [(out, h * w, types.acc_bytes)] + [(out, h * w, epit)] * stages
    shapes += [(out, h * w, types.operand_bytes)] * reads
    rings = {i: Ring(i, f"ring{i}", d, tiles * TILE_ELEMS, "", size) for i, (d, tiles, size) in enumerate(shapes)}
    # Both operands' ready barriers are counted: the plan is made before the placement says whether they multicast.
    wg = warpgroups(plan)
    smem = general.layout(rings, STAGE_ALIGN, BARRIER_ALIGN, ready=(0, 1))[1]
    if not stages:  # the fused store's staging starts on the next 1024-byte boundary, as the lowering lays it out
        smem = -(-smem // STAGE_ALIGN) * STAGE_ALIGN + store_stage_bytes(wg)
    return smem, (wg.blocks if fits(target, smem, wg) is None else 0)


def fits(target: SpatialTarget, smem: int, wg: Warpgroups) -> str | None:
    """Why `wg.blocks` blocks of `smem` bytes do not fit an SM's shared memory (what to force instead), or None."""
    most = wg.smem_max(target)
    if smem <= most:
        return None
    if not wg.paired:
        return f"it needs {smem} bytes of shared memory per block and {target.name} has {most}"
    return (
        f"its items of {WARPGROUP_ROWS} rows run {wg.blocks} blocks an SM, each within {most} bytes of shared memory,"
        f" and it needs {smem}"
    )


# How much of the tensor cores' rate a wgmma of width N keeps busy (B is read from shared memory for 64 rows of A:
# narrow ones are bound by that traffic), and a pipeline of `depth` stages (one in the MMA, one in flight, the rest
# hiding the copy engine's latency). Guesses from published Hopper GEMM progressions, to be fitted to the first GPU
# table (bench/README.md, "The sm_90a form").
WGMMA_N_RATE = {16: 0.35, 32: 0.55, 64: 0.75, 128: 0.92, 256: 1.0}
DEPTH_RATE = {1: 0.5, 2: 0.8, 3: 0.93, 4: 1.0, 5: 1.0}
K_STEP_RATE = {32: 0.8, 64: 0.93, 128: 1.0}  # K steps of 32, 64, 128 bytes: a wait and a release per step
# Paired blocks (items of 64 rows, two blocks an SM) keep PAIRED_RATE of the tensor cores' rate beside wgmma's width:
# fitted to the first GPU run's sweep (H100 SXM, 2026-12-06, bench/README.md), where the 64 × 128 plan measured
# 0.78× of the 128 × 256 one for int8 at 4096³, 0.70–0.72× for fp16 / bf16 at 4096³ and 0.54–0.58× at 8192³ — the
# guess before (0.9 for the rows' L2 bytes, 1.04 for the epilogue one block hides behind the other's K loop) priced
# 0.86× in all six. The loss grows with the operands: a 64 × 128 item loads 192 rows a K step for 8,192 products, a
# 128 × 256 one 384 for 32,768 — twice the operand bytes a MAC — which the L2 serves while A and B fit it (int8
# 4096³: 32 MiB) and the memory behind it less and less as they outgrow it. PAIRED_RATE falls from its first figure
# (the operands within the L2) towards its second by (L2 / operand bytes)², which gives 0.78×, 0.69×, 0.59× and
# 0.56× at those rows (int8 4096³, 16-bit 4096³, int8 8192³, 16-bit 8192³). A fit of six timings, not a model of
# the L2; the planner still takes paired blocks only when forced.
PAIRED_RATE = (0.85, 0.6)
L2_BYTES = 50 * 2**20  # an H100's or H200's L2: the boards of target sm_90a


def store_stage_bytes(wg: Warpgroups) -> int:
    """The most the fused store's staging takes: STORE_STAGE bytes for each consumer warp (the planner counts it
    whatever the epilogue; a chain the fused store cannot apply keeps rings instead, checked when lowered)."""
    return wg.consumers * WARPGROUP * STORE_STAGE


def staging_bytes(chunk: int, out_type: str, wg: Warpgroups) -> int:
    """Shared memory of the output staging: every consumer warp's boxes of `chunk` tiles of `out_type` (0: none)."""
    return wg.staging_boxes * chunk * TILE_ELEMS * OUT_BYTES[out_type]


def store_chunk(w: int, out_type: str) -> int:
    """Tiles of its row a consumer warp stages at a time, one box: the most (a power of two dividing the item's `w`
    columns of tiles) whose `out_type` elements fit one of its STORE_BUFFERS halves of STORE_STAGE bytes."""
    chunk = 1
    while w % (2 * chunk) == 0 and 2 * chunk * TILE_ELEMS * OUT_BYTES[out_type] <= STORE_STAGE // STORE_BUFFERS:
        chunk *= 2
    return chunk


def box_swizzle(chunk: int, out_type: str) -> int:
    """The swizzle span (bytes; 0: none) of a warpgroup's staging box of `chunk` tiles of `out_type`: its row's
    bytes, 32 to 128, which the copy engine's swizzle patterns take; a row of 16 bytes is not swizzled."""
    row = chunk * 16 * OUT_BYTES[out_type]
    return row if row >= 32 else 0


def plan_cost(target: SpatialTarget, plan: Plan, precision: Precision) -> float:
    """Estimated run time (arbitrary units) of `plan` in the sm_90a form: waves of items over the resident blocks ×
    the blocks that share an SM's tensor cores × one item's multiply-accumulates (in padded tiles) / the rate its
    wgmma width, stage depth and K step keep — and, for paired blocks, `paired_rate`.

    Items that all run in one wave cost one item's time, so a small product is split into the narrowest items over
    more SMs: at 128 × 256 × 512, sixteen items of 128 × 16 on sixteen SMs (8 · 1 · 32 tile-MACs at N=16's rate 0.35:
    731) beat one of 128 × 256 on one SM (8 · 16 · 32 at 1.0: 4096). The L2 all SMs share is not priced: where such
    items fill the machine (512³: 128 items of 128 × 16, each rereading its A strip) their reads may bind instead."""
    h, w = plan.item_tiles
    blocks = warpgroups(plan).blocks
    waves = math.ceil(plan.items / (target.units * blocks))
    sharing = min(blocks, math.ceil(plan.items / target.units))
    step = plan.block.ibw * 16 * MMA_TYPES[precision].operand_bytes  # bytes of K a step: its panels' width
    rate = WGMMA_N_RATE.get(w * 16, 0.9) * DEPTH_RATE.get(plan.depth, 1.0) * K_STEP_RATE.get(step, 1.0)
    if pairs(h):
        rate *= paired_rate(plan, precision)
    return waves * sharing * h * w * plan.k_tiles / rate


def paired_rate(plan: Plan, precision: Precision) -> float:
    """What a paired block of `plan` keeps of the rate (PAIRED_RATE): less the more A and B (padded as the plan pads
    them) outgrow the L2."""
    h, w = plan.item_tiles
    rows, cols, k = plan.grid[0] * h * 16, plan.grid[1] * w * 16, plan.k_tiles * 16
    operands = (rows + cols) * k * MMA_TYPES[precision].operand_bytes
    within, beyond = PAIRED_RATE
    return beyond + (within - beyond) * min(1.0, L2_BYTES / operands) ** 2

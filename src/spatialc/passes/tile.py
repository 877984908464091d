"""tile: choose a Plan — block shape, sub-blocks, item grid, ring depth — and size the rings and tensors by it.

Every candidate whose shared memory does not fit the target is dropped (a block's shared memory and residency, as the
backend answers them, are `footprint.py`'s); the rest are ranked by `plan_cost`, an estimate of run time written out
below. Any field can be forced by the caller.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import PlanError, ProgramError
from ..ir.nodes import Accumulator, ComputeStage, Fifo, Interm, Plan, ReadStage, SpatialProgram, TensorRole
from ..ir.ops import BlockShape, Map, MatmulTiles, Precision, VecAxis, cols
from ..numerics.blockscale import promotion_k
from ..target import SpatialTarget
from .footprint import (
    OPERAND_BYTES,
    check_form,
    epilogue_reads,
    fused_output,
    matmul_stage,
    operand_layouts,
    resources,
    ring_stages,
    scaled,
    side_rings,
    sites_per_unit,
    sized_as,
    smem_bytes,
)
from .verify.limits import MAX_ITEMS

BLOCK_SIDES = (1, 2, 4, 8)
IBWS = (1, 2, 4)  # K steps in tiles, every form's; `candidates` adds 8 for the persistent kernel and sm_90a int8
SUB_BLOCKS = ((1, 1), (1, 2), (2, 1), (2, 2))
DEPTHS = (2, 3, 4)
K_STEP_OVERHEAD = 0.5  # a K step's fixed cost (wait, barrier, loop) in K tiles of MMAs (plan_cost; fitted)
# A W4A16 GEMM plans as its plain GEMM (passes/dequant.py `build_w4`), which sets this while it does: its kernel
# dequantises each B tile in the registers of every warp that multiplies it (`dequant_cost`).
DEQUANT_PROLOGUE: ContextVar[bool] = ContextVar("DEQUANT_PROLOGUE", default=False)
# One B tile's dequant in tile products: ~67 instructions a warp (bench/README.md, SASS at sm_90) at 4 a clock per SM,
# against a tile product's 4 clocks (4096 MACs at the tensor cores' dense 1024 a clock per SM).
DEQUANT_TILE = 4.0


@dataclass(frozen=True, slots=True)
class Candidate:
    plan: Plan
    smem: int
    sites_per_unit: int
    cost: float


def plan_cost(
    target: SpatialTarget,
    plan: Plan,
    m_t: int,
    n_t: int,
    k_t: int,
    prec: Precision,
    per_unit: int,
) -> float:
    """Estimated run time (arbitrary units) of `plan`, whose kernel keeps `per_unit` blocks resident per SM
    (infinite when 0: one does not fit).

    time = waves × sharing × item_work × traffic × latency × k_step × fallback / (occupancy × issue), where
    - item_work: multiply-accumulates of one item in padded tiles, h·w·k_tiles (padding is paid for, not free);
    - waves: rounds of items over every resident site, ceil(items / (SMs × blocks per SM));
    - sharing: resident blocks that really share an SM's tensor cores, min(blocks per SM, items per SM);
    - traffic: 1 + operand bytes loaded per MAC / 0.02 — a K step loads (h + w)·ibw tiles for h·w·ibw tile
      products, so small or skinny blocks are bound by memory, square large ones by math;
    - latency: 1.5 for a single-page ring (no prefetch can overlap the loads), 0.98 where the K loop is fetched
      one step ahead, 0.95 where two or more (the persistent kernel prefetches depth − 1 steps, never more than the
      K steps less one);
    - k_step: 1 + 0.5 / ibw — each K step pays a wait, a block barrier and its loop overhead, about half of one
      K tile's MMAs, amortised over the ibw tiles of the step; ×1.25 more for int8 with an odd ibw, whose last
      tile goes through the k16 MMA at half the rate of the native k32 one. Fitted to the first GPU run's sweep
      (H100, 4×8 blocks of 2×2 sub-blocks at 4096³ and 8192³): K steps of 8 tiles measured 1.02–1.08× those of 4
      (priced 1.03× for fp16 / bf16 at 2 stages, 1.06× for int8 at 3), steps of 2 with twice the stages 0.77–0.94×
      (priced 0.90×); a quarter had priced them 1.00×, 1.03× and 0.94×;
    - occupancy: sqrt(min(1, resident warps / 8)), too few warps per SM leave the load latency exposed;
    - issue: min(1, warps that issue MMAs per SM / 8) — a block of osh·osw tiles keeps at most that many of its
      warps multiplying, so a 1×1 block on 8 warps leaves 7 idle and the tensor cores mostly waiting;
    - fallback: 1.3 when no warp grid divides the block: the kernel then gives warps single tiles, loading both
      operand fragments for every product instead of reusing them across a rectangle.
    """
    h, w = plan.item_tiles
    if per_unit == 0:
        return math.inf
    items = plan.items
    waves = math.ceil(items / (target.units * per_unit))
    sharing = min(per_unit, math.ceil(items / target.units))
    item_work = h * w * plan.k_tiles
    bytes_per_mac = (h + w) * OPERAND_BYTES[prec] / (16 * h * w)
    traffic = 1 + bytes_per_mac / 0.02
    ahead = min(plan.depth - 1, plan.k_steps - 1)  # the steps the persistent kernel prefetches
    latency = 1.5 if plan.depth == 1 else 0.95 if ahead >= 2 else 0.98
    k_step = (1 + K_STEP_OVERHEAD / plan.block.ibw) * (1.25 if prec == Precision.INT8 and plan.block.ibw % 2 else 1)
    occupancy = math.sqrt(min(1.0, sharing * target.accumulator_lanes / 8))
    busy = min(target.accumulator_lanes, plan.block.osh * plan.block.osw)
    issue = min(1.0, sharing * busy / 8)
    fallback = 1.0 if target.accumulator_lane_grid(plan.block.osh, plan.block.osw) else 1.3
    return waves * sharing * item_work * traffic * latency * k_step * fallback / (occupancy * issue)


def dequant_cost(target: SpatialTarget, plan: Plan, m_t: int, prec: Precision, splits: int, cost: float) -> float:
    """`cost` (plan_cost's) of a plan for a GEMM whose B tiles each multiplying warp dequantises in its registers.

    - traffic: plan_cost's, with B's bytes those of 4-bit weights (a quarter of A's) and A's rows only the `m_t`
      real ones (a decode row's padding is not loaded), per real multiply-accumulate;
    - dequant: a warp dequantises each B tile of its columns once per K tile for all its `rm` rows of the item,
      every sub-block's (the SASS of `tests/w4a16/test_w4_sass.py`: four pair conversions per B tile a trip, however
      many rows it feeds); 1 where no warp grid divides the block (single tiles). The other warps of its column do
      it again: a tile product's issue work grows by DEQUANT_TILE / rm, × (1 + 1/ibw) / 1.25 for the K step's own
      work (its scale and zero-point words, a column's, and ring waits): 68 instructions a B tile at ibw 4 and 83 at
      ibw 2 in that SASS (16 × 4096 × 4096), 1.22 apart, priced 1.2;
    - fill: a W4A16 GEMM's items rarely fill the SMs (decode: one M tile row) and split-K then gives each item
      `splits` sites (`auto_splits`, where the split's rings fit), which share its time while the SMs are not
      full: × items / min(SMs, items × splits) — what plan_cost, pricing one item on one site, does not see.
    """
    h, w = plan.item_tiles
    was = 1 + (h + w) * OPERAND_BYTES[prec] / (16 * h * w) / 0.02
    real = min(h, m_t)
    traffic = 1 + (real + w / 4) * OPERAND_BYTES[prec] / (16 * real * w) / 0.02
    grid = target.accumulator_lane_grid(plan.block.osh, plan.block.osw)
    rm = h // grid[0] if grid else 1
    fill = plan.items / min(target.units, plan.items * splits)
    dequant = DEQUANT_TILE * (1 + 1 / plan.block.ibw) / (1 + 1 / 4) / rm
    return cost / was * traffic * (1 + dequant) * fill


def make_plan(block: BlockShape, sub: tuple[int, int], depth: int, m_t: int, n_t: int, k_t: int) -> Plan:
    h, w = sub[0] * block.osh, sub[1] * block.osw
    k_tiles = math.ceil(k_t / block.ibw) * block.ibw
    return Plan(block, sub, (math.ceil(m_t / h), math.ceil(n_t / w)), k_tiles, depth)


def _positive(name: str, values: tuple[int, ...] | None, n: int) -> None:
    if values is None:
        return
    if len(values) != n or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        what = "a whole number ≥ 1" if n == 1 else f"{n} whole numbers ≥ 1"
        shown = values[0] if n == 1 and len(values) == 1 else values
        raise ProgramError(f"{name} must be {what}, not {shown!r}")


def candidates(
    p: SpatialProgram,
    target: SpatialTarget,
    block: tuple[int, int, int] | None = None,
    sub_blocks: tuple[int, int] | None = None,
    depth: int | None = None,
    form: str = "persistent",
    extra: int = 0,
) -> list[Candidate]:
    """Every plan that fits the `form` kernel, best first. Forced fields are taken as given. A plan of more than
    MAX_ITEMS items is never offered: verify would refuse it, after place had spent minutes and gigabytes listing
    its items."""
    form = check_form(form, target)
    _positive("block", block, 3)
    _positive("sub_blocks", sub_blocks, 2)
    _positive("depth", None if depth is None else (depth,), 1)
    a = next(t for t in p.tensors if t.role == TensorRole.INPUT)
    out = p.output_tensor()
    assert out is not None
    m_t, k_t, n_t = a.group_tiles[0], a.tiles[1], out.tiles[1]
    groups = a.groups
    sides = (*BLOCK_SIDES, 16) if form == "sm90a" else BLOCK_SIDES  # a wgmma is up to 256 columns wide
    # K steps of 8 tiles (128 elements): the persistent kernel's wherever shared memory holds its rings (the first GPU
    # run timed its 4×8×8 blocks 1.02–1.08× faster than 4×8×4 at 4096³ and 8192³, bench/README.md); an sm_90a one
    # of int8 only: 128 bytes, its panels' widest swizzle, as 64 16-bit ones are. The general form's were never
    # timed past 4 tiles.
    wide = form == "persistent" or (form == "sm90a" and sized_as(p.precision) == Precision.INT8)
    ibws: tuple[int, ...] = (*IBWS, 8) if wide else IBWS
    if scaled(p):  # a block-scaled matmul's K step is its promotion interval (numerics/blockscale.py)
        step = promotion_k(p)  # 128 of K, or an MX program's 32 (its e8m0 scales' group)
        ibws = (step // p.tile.cols,)
        if block and block[2] != ibws[0]:
            raise ProgramError(
                f"a block-scaled program's K step is its promotion interval, {ibws[0]} tiles ({step}"
                f" elements): block {tuple(block)} reduces {block[2]}"
            )
    blocks = (
        [BlockShape(*block)]
        if block
        else [BlockShape(h, w, i) for h, w, i in itertools.product(BLOCK_SIDES, sides, ibws)]
    )
    subs = [tuple(sub_blocks)] if sub_blocks else list(SUB_BLOCKS)
    depths = [depth] if depth else list(DEPTHS)
    # The persistent kernel applies an epilogue where the accumulators are, in the fused store, which needs a warp
    # grid dividing the block: unless the block is forced, plans it would leave to the general form are not offered.
    stages, reads = ring_stages(p, form, extra), side_rings(p, form)
    fuse_only = block is None and stages > 0 and form == "persistent"
    own_cost = (
        None  # the sm_90a form's own time model: wgmma's width and the stages in flight (lower/cuda/sm90a/plan.py)
    )
    if form == "sm90a":
        from ..lower.cuda.sm90a import plan as sm90a_plan

        own_cost = sm90a_plan.plan_cost
        if not block:
            # Paired blocks (items of 64 rows, two blocks an SM) are taken when forced, and timed by the GPU check's
            # sweep; the planner's own choice stays two consumer warpgroups (the first GPU run measured paired blocks
            # at 0.54–0.78× of them at 4096³ and 8192³).
            blocks = [b for b in blocks if not sm90a_plan.pairs(b.osh)]
    is_scaled, dequant = scaled(p), DEQUANT_PROLOGUE.get()  # (asked once: the same for every plan of the program)
    found = []
    for b, s, d in itertools.product(blocks, subs, depths):
        if fuse_only and not fused_output(target, b):
            continue
        plan = make_plan(b, s, d, m_t, n_t, k_t)  # type: ignore[arg-type]
        if plan.items * groups > MAX_ITEMS:
            continue
        smem, per_unit = resources(target, plan, p.precision, form, stages, reads)  # the backend asked once a plan
        if is_scaled:  # its step's partial fragments beside the accumulators (lower/cuda/common/blockscale.py)
            from ..lower.cuda.common.blockscale import scaled_units

            per_unit = scaled_units(target, plan, form, smem, per_unit)
        if per_unit:
            cost = plan_cost(target, plan, m_t, n_t, k_t, p.precision, per_unit)
            if own_cost is not None:
                cost = own_cost(target, plan, sized_as(p.precision))
            if groups > 1:
                # A grouped GEMM's placement deals strips (a group's column of items) and each runs its group's
                # row blocks one after another: waves of strips, each ny items long (every row present).
                strips = dataclasses.replace(plan, grid=(groups, plan.grid[1]))
                cost = plan.grid[0] * plan_cost(target, strips, m_t, n_t, k_t, p.precision, per_unit)
            if dequant:
                from .split import auto_splits, extra_ring_stages  # (split's verifier imports this module)

                split_units = sites_per_unit(
                    target, plan, p.precision, "general", ring_stages(p, "general", extra_ring_stages())
                )
                splits = auto_splits(plan, target.units * split_units) if split_units else 1
                cost = dequant_cost(target, plan, m_t, p.precision, splits, cost)
            grouped = plan if groups == 1 else dataclasses.replace(plan, groups=groups)
            found.append(Candidate(grouped, smem, per_unit, cost))
    # Ties go to the smaller block, then the shallower ring: less padding and less shared memory for the same time;
    # then the plan's text, spelled out only for the plans still tied.
    found.sort(key=lambda c: (c.cost, c.plan.block.osh * c.plan.block.osw, c.plan.depth, _Spelled(c.plan)))
    return found


class _Spelled:
    """A plan compared by its `repr`, spelled out only when a sort reaches it (a tie on everything before it), and
    then once."""

    __slots__ = ("plan", "_text")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._text: str | None = None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = repr(self.plan)
        return self._text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Spelled) and self.text == other.text

    def __lt__(self, other: _Spelled) -> bool:
        return self.text < other.text

    __hash__ = None  # type: ignore[assignment]


def choose(
    p: SpatialProgram,
    target: SpatialTarget,
    block=None,
    sub_blocks=None,
    depth=None,
    form: str = "persistent",
    extra: int = 0,
) -> Candidate:
    """The best candidate, or PlanError saying why none fits. `extra`: output-sized rings the kernel keeps beyond
    the epilogue's (split-K's partial rings)."""
    found = candidates(p, target, block, sub_blocks, depth, form, extra)
    if not found:
        forced = {"block": block, "sub_blocks": sub_blocks, "depth": depth}
        shown = ", ".join(f"{k}={v}" for k, v in forced.items() if v is not None) or "any block"
        why = _why_not(p, target, block, sub_blocks, depth, check_form(form, target), extra)
        raise PlanError(f"no plan with {shown} fits {target.name}: {why}")
    return found[0]


def _why_not(p: SpatialProgram, target: SpatialTarget, block, sub_blocks, depth, form: str, extra: int = 0) -> str:
    """What the smallest plan with the forced fields runs out of, and what to do about it."""
    too_many = _too_many_items(p, block, sub_blocks)
    if too_many:
        return too_many
    a = next(t for t in p.tensors if t.role == TensorRole.INPUT)
    # The smallest block of the form with a whole SM's shared memory: the sm_90a form's of 8 tile rows (its paired
    # blocks of 4 have half), an int8 K step two tiles.
    least = (8, 1, 2 if sized_as(p.precision) == Precision.INT8 else 1) if form == "sm90a" else (1, 1, 1)
    b = BlockShape(*(block or least))
    probe = make_plan(b, tuple(sub_blocks or (1, 1)), depth or 2, a.group_tiles[0], 1, a.tiles[1])  # type: ignore[arg-type]
    if form == "sm90a":
        from ..lower.cuda.sm90a import plan as sm90a_plan
        from ..lower.errors import Unsupported

        try:
            sm90a_plan.check_plan(probe, p.precision, scaled(p))
        except Unsupported as e:
            return f"the sm_90a form takes no plan of {e.what}: {e.why}"
    tiles = b.osh * b.osw * probe.sub_blocks[0] * probe.sub_blocks[1]
    regs = target.registers_needed(tiles)
    if scaled(p):  # its partial fragments beside the accumulators (lower/cuda/common/blockscale.py)
        from ..lower.cuda.common.blockscale import scaled_units

        smem = smem_bytes(target, probe, p.precision, form, ring_stages(p, form, extra), side_rings(p, form))
        if not scaled_units(target, probe, form, smem, 1):
            return (
                f"a block-scaled step's partial fragments beside its accumulator of {tiles} tiles need more registers"
                f" than {target.name}'s threads have in the {form} form; force a smaller block or fewer sub-blocks"
            )
    if regs > target.regs_per_thread_max:
        return (
            f"its accumulator of {tiles} tiles needs about {regs} registers a thread and {target.name} has"
            f" {target.regs_per_thread_max}; force a smaller block or fewer sub-blocks"
        )
    need = smem_bytes(target, probe, p.precision, form, ring_stages(p, form, extra), side_rings(p, form))
    if form == "sm90a":
        crowded = sm90a_plan.fits(target, need, sm90a_plan.warpgroups(probe))
        if crowded is not None:
            return f"{crowded}; force a smaller block or depth"
    return (
        f"it needs {need} bytes of shared memory per block and {target.name} has {target.smem_per_site_max};"
        " force a smaller block or depth"
    )


def _too_many_items(p: SpatialProgram, block, sub_blocks) -> str | None:
    """Why even the largest items the forced fields allow are more than MAX_ITEMS, or None."""
    a, out = next(t for t in p.tensors if t.role == TensorRole.INPUT), p.output_tensor()
    assert out is not None
    side = max(BLOCK_SIDES)
    b = BlockShape(*(block or (side, side, 1)))
    sub = sub_blocks or max(SUB_BLOCKS, key=lambda s: s[0] * s[1])
    plan = make_plan(b, tuple(sub), 1, a.group_tiles[0], out.tiles[1], a.tiles[1])  # type: ignore[arg-type]
    return too_many_items(dataclasses.replace(plan, grid=(plan.grid[0] * a.groups, plan.grid[1])))


def too_many_items(plan: Plan) -> str | None:
    """What is wrong with a plan of more than MAX_ITEMS items (place lists every one), or None."""
    if plan.items <= MAX_ITEMS:
        return None
    h, w = plan.item_tiles
    return (
        f"its grid of {plan.grid[0]}x{plan.grid[1]} items of {h}x{w} tiles has {plan.items} items, and at most"
        f" {MAX_ITEMS} are allowed (each is listed); force a larger block or more sub-blocks, or split the problem"
    )


def apply_plan(p: SpatialProgram, plan: Plan, form: str = "persistent") -> SpatialProgram:
    """Size rings, accumulator and tensors (padded to whole blocks) by `plan`, the operand pages laid out for the
    `form` kernel (`operand_layouts`)."""
    mm = matmul_stage(p)
    a_buf, b_buf = mm.ins
    h, w = plan.item_tiles
    ibw = plan.block.ibw
    ny, nx = plan.grid
    rows_t, cols_t = ny * h, nx * w
    pages = {a_buf: h * ibw, b_buf: ibw * w}
    for out in mm.outs:
        pages[out] = h * w
    a_t = mm.kind.op  # type: ignore[union-attr]
    buffers = []
    for b in p.buffers:
        match b.kind:
            case Fifo() | Interm() if b.ring in pages:
                depth = plan.depth if b.ring in (a_buf, b_buf) else min(plan.depth, 2)
                b = dataclasses.replace(
                    b, kind=dataclasses.replace(b.kind, depth_pages=depth, page_tiles=pages[b.ring])
                )
            case Fifo() | Interm():
                b = dataclasses.replace(
                    b, kind=dataclasses.replace(b.kind, depth_pages=min(plan.depth, 2), page_tiles=h * w)
                )
            case Accumulator():
                b = dataclasses.replace(b, kind=Accumulator(h * w))
        buffers.append(b)
    new_op = MatmulTiles(plan.block, plan.sub_blocks, a_t.operand, scales=a_t.scales)
    stages = tuple(dataclasses.replace(s, kind=ComputeStage(new_op)) if s.id == mm.id else s for s in p.stages)
    inputs = [t for t in p.tensors if t.role == TensorRole.INPUT]
    out_cols = p.output_tensor().elems[1]  # type: ignore[union-attr]
    padded = {inputs[0].id: (rows_t, plan.k_tiles), inputs[1].id: (plan.k_tiles, cols_t)}
    vectors = {
        c.tensor: c.axis
        for s in p.stages
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map)
        for c in cols(s.kind.op.expr)
    }
    for tid, axis in vectors.items():  # a per-row vector: one column of tiles, a per-column vector one row
        padded[tid] = (rows_t, 1) if axis == VecAxis.ROW else (1, cols_t)
    for tid in epilogue_reads(p):  # a tensor an epilogue stage reads beside C's value (a residual): C's tiles
        padded[tid] = (rows_t, cols_t)
    tensors = []
    for t in p.tensors:  # a grouped tensor: each group padded so, stacked
        if t.id in padded:
            t = dataclasses.replace(t, tiles=(padded[t.id][0] * t.groups, padded[t.id][1]))
        elif t.role == TensorRole.OUTPUT:
            t = dataclasses.replace(t, tiles=(rows_t * t.groups, cols_t))
        elif t.role == TensorRole.PARAMETER and tuple(t.elems) == (1, out_cols) and t.groups == 1:  # a column vector
            t = dataclasses.replace(t, tiles=(1, cols_t))
        tensors.append(t)
    planned = p.evolve(plans=(plan,), buffers=tuple(buffers), stages=stages, tensors=tuple(tensors))
    return lay_out_operands(planned, form)


def _sized(kind: Fifo | Interm, depth: int, page_tiles: int) -> Fifo | Interm:
    return dataclasses.replace(kind, depth_pages=depth, page_tiles=page_tiles)


def lay_out_operands(p: SpatialProgram, form: str = "persistent") -> SpatialProgram:
    """The matmul's A and B rings (and their per-site copies) laid out for the fragment loads (`operand_layouts`),
    and each tensor read into them stored in the tile order its pages hold."""
    mm = matmul_stage(p)
    layouts = operand_layouts(mm.kind.op.operand, form)  # type: ignore[union-attr]
    layout_of = {p.buffer(buf).ring: layout for buf, layout in zip(mm.ins, layouts, strict=True)}
    buffers = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, layout=layout_of[b.ring]))
        if b.ring in layout_of and isinstance(b.kind, Fifo | Interm)
        else b
        for b in p.buffers
    )
    order = {
        s.kind.tensor: layout_of[p.buffer(out).ring].order
        for s in p.stages
        if isinstance(s.kind, ReadStage)
        for out in s.outs
        if p.buffer(out).ring in layout_of
    }
    tensors = tuple(dataclasses.replace(t, order=order[t.id]) if t.id in order else t for t in p.tensors)
    return p.evolve(buffers=buffers, tensors=tensors)


def tile(
    p: SpatialProgram,
    target: SpatialTarget,
    block=None,
    sub_blocks=None,
    depth=None,
    form: str = "persistent",
    extra: int = 0,
) -> SpatialProgram:
    """The program with its best (or forced) plan for the `form` kernel applied."""
    return apply_plan(p, choose(p, target, block, sub_blocks, depth, form, extra).plan, check_form(form, target))

"""The sm_90a form: the general form's engines on warps of their own, with Hopper's data path.

- The reader is one thread of a producer warpgroup. The operands it loads are not tiled in global memory but stored
  as matrices (`KernelParam.order` "rows"; 8-bit B "cols", its transpose), and each page lands as the IR's
  `panels` layout says (`panels_t` for 8-bit B: int8, e4m3, e5m2): one row-major matrix in panels as wide as its
  rows allow, up to 128 bytes, swizzled by the copy engine as wgmma reads them — the layout of every fast Hopper
  GEMM. Each `ReadTiles` is one 2-D TMA box a panel (`Panels`), all announced on the slot's full barrier by one
  `expect_tx` of exactly the page's bytes; `Push` is the reader's one arrival on it, made with the `expect_tx`
  (`mbarrier.arrive.expect_tx`) where the Push follows the load at once. The phase completes when the arrival and
  every byte are in. Each stage starts on 1024 bytes, so the swizzle by address is the page's own.
- The compute engine is a consumer warpgroup per 64 rows of the item (`plan.Warpgroups`): two for items of
  128 rows (the eight accumulator warps), their block alone on its SM; one for items of 64 rows (a forced block of 4
  tile rows: the planner does not choose them), two blocks sharing each SM, so that one block's epilogue runs while
  the other's wgmma keep the tensor cores busy — what a ping-pong kernel's alternating consumers do, with one
  compute engine a site. Warp w holds the item's tile row w, every
  column, in wgmma's accumulator layout, which is the m16n8 layout `spatialc_acc` already names. A K step
  issues one `wgmma.mma_async` per 32 bytes of K (16 elements; 8-bit 32) with both operands read from shared memory
  through matrix descriptors of the panels' swizzle: A K-major (a warpgroup's 64 rows, 8-row groups a panel row ×
  8 apart), 16-bit B N-major (transposed: its K rows are panel rows, the next panel of columns the leading
  offset on), 8-bit B K-major like A (the 8-bit floats as int8, into float32 accumulators). Where the K loop is
  not pipelined (below), the first `Pop` after a step waits for its group (`wgmma.wait_group 0`) before it releases
  the slot: until then the MMA may still read it.
- The K loop keeps one wgmma group in flight where the operand rings are at least two pages deep: a step issues
  its MMAs, waits until only they are in flight (`wait_group 1`) and then releases the previous step's stages; the
  last step's are released after the loop, once its group has retired. Each release is the IR's `Pop`, one step
  late: the producer then runs at most depth − 1 pages ahead instead of depth, which cannot deadlock as long as
  depth ≥ 2 (the stage the producer waits for was released no later than the step the consumer has finished).
  Pages are read at the slot of the last `Wait` (`wt − 1`), which with the release deferred is no longer `pop`'s.
- The epilogue is fused where it can be (`fused_output`): where the writer only waits for each output page, stores
  it and frees it, and the chain is one the fused store applies (bias, relu, scalar, requant), the consumers apply
  it to their own accumulator elements, and the output and epilogue rings leave shared memory. Where the output's
  page is a run of whole tiles of its row-major tile grid (`staged`), C is stored as a row-major matrix ("rows")
  and each consumer warp stages `chunk` tiles of its row at a time in one of its two boxes of shared memory, in
  turn, fences them over to the async proxy and its first lane stores them with a TMA store a tile (one bulk group,
  waited for before that box is written again — the next item's K loop runs meanwhile — and before the warp ends);
  otherwise the lanes store their elements to global memory themselves (the tile printers' `fused_store`, the
  persistent kernel's). A stage of the chain may read a page beside the chain's value — a residual's, a gate's, from
  the ring a read stage fills, which the copy engine lands a 16 x 16 box a tile (`tma.TileBoxes`): the fused
  store reads the lane's elements of its front page, between that ring's Wait and Pop, which the schedule places
  after the chain's last Push — the place the store stands (checked: otherwise the chain stays page to page, as the
  producer could refill the slot under the store). Otherwise (an activation) the writer, the epilogue stages page to
  page and their rings are the general form's.
- `setmaxnreg` gives two consumer warpgroups the producer warpgroup's registers (a paired block keeps what its
  launch gives it); every other flow op is the general form's.

- A block-scaled GEMM (`MatmulTiles.scales`) is DeepGEMM's kernel: each K step is one 128-element group; it reads
  its scales (A's per-row ones came by TMA with A's page: `blockscale.py`), its wgmma write fresh partial
  accumulators (scale-d 0 on the first: the "sd" variant), it waits for its group, releases its stages and promotes
  the partials into the accumulators (`common.blockscale`). Items are at most 128 columns wide: the partials double
  the consumers' registers.

Rule 7 of `verify` proves the engines' handover free of deadlock and overrun exactly as for the general form; what is
new here is checked before printing (`check_resources`): threads × registers, the setmaxnreg split, stage bytes
against shared memory, 1024-byte stage bases and pages on their swizzle's period, and transaction counts equal to
the bytes each page receives. Since only this form reads panels, `build` plans for it only where it prints the
program (`passes.pipeline.sm90a_refusal`); the general form does not ride along with its artifacts.

Beside this module: the form's shape constants, the plans it takes and what they cost (`plan.py`), its pages'
panels and tensor maps (`tma.py`), its engine printer (`printer.py`) and attention's kernel — these engines with two
wgmma shapes around the general form's register path, one consumer warpgroup (`attention.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ....ir.names import plain
from ....ir.nodes import PageLayout, SpatialProgram
from ....ir.ops import (
    AcquireAcc,
    ChoreoOp,
    Compute,
    Loop,
    MatmulTiles,
    McastSend,
    Pop,
    Push,
    ReadTiles,
    Trip,
    Wait,
    WriteTiles,
    walk,
)
from ....numerics.blockscale import is_mx, program_scales
from ....passes.attention import is_attention_program
from ....passes.footprint import in_panels
from ....passes.maps import is_map_program
from ....passes.rows import is_row_program
from ....passes.verify import derived
from ....target import WARP, SpatialTarget
from ...artifact import Budget, CudaArtifact, TensorMap
from ...errors import LowerError, NeedsGeneral, TooBig, Unsupported
from ..common import epilogue
from ..common.blockscale import MX_PROGRAM
from ..common.clusters import Multicast, check_cluster, check_items, multicast
from ..common.cwriter import Writer, inlined_lines, site_prologue
from ..common.dequant import has_dequant, packed_rings
from ..common.host import assemble
from ..common.program import (
    MAP_PROGRAM,
    ROW_PROGRAM,
    W4_PROGRAM,
    all_ops,
    checked_gemm,
    launch_for,
    matmul_stages,
)
from ..common.rings import TILE_ELEMS, Rings, ring_table
from ..general import checks as general_checks
from ..general import kernel as general
from ..general import printer as general_printer
from . import dequant as w4
from . import partials, staging
from .attention import AttentionPrinter, check_attention_plan, declare, make_attention_kernel
from .barriers import check_barriers
from .blockscale import SCALE_ALIGN, ScaleStage, scale_stage
from .overlap import PINGPONG
from .partials import PartialSide
from .plan import (
    BARRIER_ALIGN,
    CONSUMER_REGS,
    EPILOGUES,
    PRODUCER_REGS,
    STAGE_ALIGN,
    STORE_BUFFERS,
    SWIZZLED,
    WARPGROUP,
    WARPGROUP_ROWS,
    Warpgroups,
    box_swizzle,
    check_plan,
    staging_bytes,
    store_chunk,
    warpgroups,
)
from .printer import HopperPrinter
from .tma import Panels, TileBoxes, param_at, tensor_maps

KERNEL_NAME = "spatialc_hopper"


@dataclass(frozen=True, slots=True)
class HopperKernel:
    """The general form's kernel, re-laid-out for sm_90a, with what only this form needs."""

    base: general.GeneralKernel
    maps: tuple[TensorMap, ...]  # one per (tensor, box) a ReadTiles loads, then the TMA store's (a tile), in order
    tma_rings: frozenset[int]  # rings filled by the copy engine (full barrier: one arrival + bytes)
    wg: Warpgroups  # the consumer warpgroups and blocks an SM
    n: int  # the wgmma width: the item's columns
    store: WriteTiles | None = None  # the writer's store the fused epilogue takes over (None: not fused)
    chunk: int = 0  # tiles a consumer warp stages at a time for the fused store's TMA store (0: stored directly)
    multicast: Multicast | None = None  # the multicast handshake (clusters.py), None without groups
    panels: dict[int, Panels | TileBoxes] = dataclasses.field(default_factory=dict)  # each TMA-filled ring's boxes
    stored: dict[int, str] = dataclasses.field(default_factory=dict)  # parameter → "rows" / "cols" (KernelParam)
    warp_freed: frozenset[int] = frozenset()  # rings whose stages a consumer warp frees with one arrival (`release`)
    epilogue: str = SWIZZLED  # how the staged store goes out (plan.EPILOGUES): warpgroup boxes, or a box a tile
    # The wgmma the consumers issue, (width, variant) each (`WGMMA_VARIANTS`); () for a GEMM's one, ((n, "ss"),).
    wgmmas: tuple[tuple[int, str], ...] = ()
    scales: ScaleStage | None = None  # a block-scaled GEMM's A scales landed by TMA beside A's page (blockscale.py)
    schedule: str = ""  # attention's KV loop (`overlap.SCHEDULES`); "" for a GEMM
    # Split-K's partial sums by site class: where each class stores or reads them (partials.py); () unsplit.
    partials: tuple[PartialSide, ...] = ()

    @property
    def program(self) -> SpatialProgram:
        return self.base.program

    @property
    def threads(self) -> int:
        return self.wg.threads

    @property
    def attention(self) -> bool:
        """Whether the kernel is attention's (`attention.py`): two matmuls, its recurrence in registers."""
        return is_attention_program(self.program)

    @property
    def odd_turns(self) -> bool:
        """Whether a consumer warp's output boxes of one item are not a whole number of turns of its STORE_BUFFERS
        staging boxes: then the turn is counted over all its items, else it restarts with each item."""
        return bool(self.chunk) and (self.n // 16 // self.chunk) % STORE_BUFFERS != 0


# ---- what the form takes ------------------------------------------------------------------------------------


TMA_COORD_MAX = 2**31 - 1


def refuse(p: SpatialProgram, target: SpatialTarget) -> None:
    """Raise the first reason the sm_90a form cannot print `p`."""
    if not target.hopper:
        raise Unsupported(
            f"the sm_90a form on {target.name}", "its TMA, wgmma and setmaxnreg instructions exist on sm_90a only"
        )
    attention = is_attention_program(p)
    if not attention and (is_map_program(p) or is_row_program(p)):
        raise NeedsGeneral(
            f"{ROW_PROGRAM if is_row_program(p) else MAP_PROGRAM} in the sm_90a form",
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


def staged(p: SpatialProgram, store: WriteTiles) -> bool:
    """Whether the fused store can go out by TMA: a page of whole tiles in the output's row-major tile grid (a box
    of one tile row and consecutive tile columns)."""
    t = p.tensor(store.tensor)
    return (store.stride_h, store.stride_w) == (t.tiles[1], 1) and t.groups == 1


def fused_output(
    p: SpatialProgram, k: general.GeneralKernel, apart: frozenset[int] = frozenset()
) -> tuple[WriteTiles, Rings] | None:
    """The writer's store of the matmul's output (after its elementwise epilogue), where the consumers can make it
    themselves from their accumulators — a chain of stages the fused store applies, run by the compute engine at
    its item level, and a writer that only waits for each page, stores it and frees it — and the kernel's rings
    without that chain's. None otherwise (the general form's output ring and writer stay). The site classes in
    `apart` (split-K's contributors, which store partial sums instead: partials.py) are left out of the programs
    compared."""
    try:
        mm, types, integer, chain = checked_gemm(p, epilogue.EPILOGUE_OPS)
    except LowerError:
        return None  # a stage the fused store does not apply (an activation): page to page, as the general form
    last = int(p.buffer((chain[-1] if chain else mm).outs[0]).ring)
    compute, *side = k.roles
    writers = [r for r in side if any(isinstance(op, WriteTiles) for op in r.walk())]

    def printed(role: general.Role) -> set[tuple[ChoreoOp, ...]]:
        return {ops for i, ops in enumerate(role.programs) if i not in apart}

    if len(writers) != 1 or len(printed(writers[0])) != 1 or len(printed(compute)) != 1:
        return None
    (body,) = printed(writers[0])
    if len(body) == 1 and isinstance(body[0], Loop):
        body = body[0].body
    if len(body) != 3 or not isinstance(body[1], WriteTiles):
        return None
    wait, store, pop = body
    ring = int(p.buffer(store.src).ring)
    if not (isinstance(wait, Wait) and isinstance(pop, Pop) and ring == last):
        return None
    # The compute engine pushes the last ring at its item level, where the writer's store has its loop variables.
    (top,) = printed(compute)
    level = top[0].body if len(top) == 1 and isinstance(top[0], Loop) else top
    pushed = [i for i, op in enumerate(level) if isinstance(op, Push) and int(p.buffer(op.buf).ring) == last]
    if not pushed:
        return None
    # A page a stage reads beside the chain's (a residual's) is read by the fused store, which stands at that Push:
    # the schedule must pop it after, or its slot could be refilled while the consumers read it.
    beside = {int(p.buffer(b).ring) for s in chain for b in s.ins[1:]}
    popped = [i for i, op in enumerate(level) if isinstance(op, Pop) and int(p.buffer(op.buf).ring) in beside]
    if any(i < pushed[0] for i in popped) or len(popped) != len(beside):
        return None
    fused = tuple(int(p.buffer(b).ring) for b in (mm.outs[0], *(s.outs[0] for s in chain)))
    return store, packed_rings(p, general.epilogue_rings(p, ring_table(p, types, fused), integer))


def make_kernel(
    p: SpatialProgram, target: SpatialTarget, epilogue: str = SWIZZLED, schedule: str | None = None
) -> HopperKernel:
    """The sm_90a kernel of `p`, or the form's refusal; made once for a program verify remembers (build makes it to
    see whether the form takes the plan, then lower asks again). `epilogue` picks the staged store's boxes
    (`plan.EPILOGUES`), `schedule` attention's KV loop (`overlap.SCHEDULES`)."""
    if epilogue not in EPILOGUES:
        raise Unsupported(f"the sm_90a epilogue {epilogue!r}", f"it is one of {', '.join(EPILOGUES)}")
    memo = derived(p)
    if memo is None:
        return _make_kernel(p, target, epilogue, schedule)
    key = ("sm90a kernel", target, epilogue, schedule)
    if key not in memo:
        memo[key] = _make_kernel(p, target, epilogue, schedule)
    return memo[key]


def _make_kernel(p: SpatialProgram, target: SpatialTarget, epilogue: str, schedule: str | None) -> HopperKernel:
    refuse(p, target)
    if is_attention_program(p):
        return make_attention_kernel(p, target, schedule)
    if schedule is not None:
        raise Unsupported(f"schedule={schedule!r} for a GEMM", "it picks attention's KV loop")
    wg = warpgroups(p.plans[0])
    # The compute engine is the consumer warpgroups' warps, one tile row of the item each.
    lanes = dataclasses.replace(target, accumulator_lanes=wg.consumers * WARPGROUP)
    k = general.make_kernel(p, lanes, fit=False)  # its shared memory is laid out again below, and checked then
    if has_dequant(p):  # a W4A16 GEMM's consumers dequantise into B's page of panels (sm90a/dequant.py)
        k = dataclasses.replace(k, dequant="shared")
    split = partials.sides(p, k)
    apart = frozenset(i for i, side in enumerate(split[1]) if side.store is not None) if split else frozenset()
    fused = fused_output(p, k, apart)
    store = None
    if fused is not None:  # the output and epilogue rings leave shared memory: the consumers store from registers
        store, rings = fused
        kept = {r: n for r, n in k.full_count.items() if r in rings.rings}
        k = dataclasses.replace(k, rings=rings, full_count=kept, empty_count={r: k.empty_count[r] for r in kept})
    if split is not None:  # split-K's partial sums go between the accumulators and the workspace (partials.py)
        crowded = partials.adds_fit(p.plans[0], target)
        if crowded is not None:
            raise Unsupported(crowded, "the loads in flight would spill the accumulators")
        direct = split[0]
        kept = {r: g for r, g in k.rings.rings.items() if r not in direct}
        rings = dataclasses.replace(k.rings, rings=kept, direct=direct)
        k = dataclasses.replace(
            k,
            rings=rings,
            full_count={r: n for r, n in k.full_count.items() if r in kept},
            empty_count={r: n for r, n in k.empty_count.items() if r in kept},
        )
    compute = k.roles[0]
    if compute.warps != wg.consumers * WARPGROUP or compute.first_warp != 0:
        raise Unsupported(
            f"a compute engine on {compute.warps} warps",
            f"the sm_90a form's consumers for items of {k.plan.item_tiles[0] * 16} rows are {wg.consumers * WARPGROUP}"
            " warps",
        )
    side = k.roles[1:]
    if len(side) > WARPGROUP:
        raise Unsupported(f"{len(side)} engines beside the compute engine", "they share one producer warpgroup")
    reader = [r for r in side if any(isinstance(op, ReadTiles) for op in r.walk())]
    reads = [op for r in reader for op in r.walk()]
    packed = w4.packed_reads(p, k.rings, reads, list(compute.walk()))  # a W4A16 GEMM's packed pages: bulk copies
    dequantised = w4.operand_panels(p, k.rings, list(compute.walk()), k.types.operand)
    reads = [
        op
        for op in reads
        if not (isinstance(op, ReadTiles) and (k.rings.template[op.into] in packed or k.rings.is_direct(op.into)))
    ]
    maps, filled, panels, stored = tensor_maps(p, k.rings, reads)
    # A packed ring's PackedRows has what check_resources reads of a stage (width, period); only bulk_rows prints it.
    filled, panels = filled | set(packed), {**panels, **packed, **dequantised}  # type: ignore[dict-item]
    for b in p.buffers:  # only the copy engine lands panels (and a W4A16 GEMM's consumers dequantise into B's)
        layout = getattr(b.kind, "layout", PageLayout.ROW)
        if layout.panels and k.rings.template.get(b.id) not in filled | set(dequantised):
            raise Unsupported(f"{b.name}'s pages in {layout.value} layout", "panels are operand pages TMA fills")
    mc = multicast(p, k.rings.template) if split is None else None  # (split-K's semaphore: partials.sides)
    if mc is not None:
        check_cluster(k.cluster)
        check_items(p, k.cluster)
        if not set(mc.rings) <= filled:
            raise Unsupported("a multicast ring the copy engine does not fill", "only operand pages are multicast")
    ready = mc.rings if mc is not None else ()
    offsets, dyn, barrier_bytes = general.layout(k.rings.rings, STAGE_ALIGN, BARRIER_ALIGN, ready)
    w4.check_dequant_pages(k.rings, offsets, dequantised)
    for r, rows in packed.items():  # their scales and zero points, landed beside each page (one packed ring)
        offsets["w4_side"] = -(-dyn // STAGE_ALIGN) * STAGE_ALIGN
        dyn = offsets["w4_side"] + k.rings.rings[r].depth * rows.side_bytes
    scales = program_scales(p)
    sa = scale_stage(p, k, scales, len(maps)) if scales is not None else None
    if sa is not None:  # A's scales: a box a K group, slot for slot with A's ring, stored transposed
        maps = (*maps, sa.map)
        stored[sa.map.tensor] = "cols"
        offsets["sa_stage"] = -(-dyn // SCALE_ALIGN) * SCALE_ALIGN
        dyn = offsets["sa_stage"] + k.rings.rings[sa.ring].depth * sa.bytes
    h, w = k.plan.item_tiles
    chunk = 0
    if store is not None and staged(p, store):
        # The consumers' output goes out by TMA store: each warp stages `chunk` tiles at a time.
        chunk = store_chunk(w, k.out_type)
        offsets["out_stage"] = -(-dyn // STAGE_ALIGN) * STAGE_ALIGN
        dyn = offsets["out_stage"] + staging_bytes(chunk, k.out_type, wg)
        # C is stored as a row-major matrix (what the caller gets needs no untilize): a warpgroup's box of `chunk`
        # tiles of its 64 rows, swizzled as wide as its rows (staging.py), or a tile a box.
        box, swizzle = (
            ((WARPGROUP_ROWS, chunk * 16), box_swizzle(chunk, k.out_type)) if epilogue == SWIZZLED else ((16, 16), 0)
        )
        maps = (*maps, TensorMap(len(maps), param_at(p, store.tensor), box, swizzle))
        stored[param_at(p, store.tensor)] = "rows"
    full = {r: (1 if r in filled else n) for r, n in k.full_count.items()}
    # A stage the copy engine fills and only the consumers' wgmma read has all its reads retired, warp by warp, once
    # a warp's wait_group returns: one arrival a consumer warp frees it (`release`), not one a thread.
    template = k.rings.template
    wgmma_read = {
        template[b]
        for op in compute.walk()
        if isinstance(op, Compute) and isinstance(op.op, MatmulTiles)
        for b in op.ins
    }
    popped_elsewhere = {template[op.buf] for r in side for op in r.walk() if isinstance(op, Pop)}
    warp_freed = frozenset((set(filled) & wgmma_read) - popped_elsewhere)
    empty = {r: (n // WARP if r in warp_freed else n) for r, n in k.empty_count.items()}
    base = dataclasses.replace(
        k,
        lane_grid=(h, 1),
        perw=w,
        full_count=full,
        empty_count=empty,
        offsets=offsets,
        dyn_bytes=dyn,
        barrier_bytes=barrier_bytes,
        blocks_per_sm=wg.blocks,
    )
    # A block-scaled step's wgmma write fresh partial accumulators (scale-d 0 on the group's first): "sd".
    wgmmas = ((w * 16, "sd"),) if program_scales(p) is not None else ()
    hk = HopperKernel(
        base,
        maps,
        filled,
        wg,
        w * 16,
        store,
        chunk,
        mc,
        panels,
        stored,
        warp_freed,
        epilogue,
        wgmmas,
        sa,
        partials=split[1] if split is not None else (),
    )
    check_resources(hk, target)
    return hk


def _consumers(wg: Warpgroups) -> str:
    """The compute engine as the kernel's first line names it."""
    if wg.consumers == 1:
        return f"one wgmma consumer warpgroup, {wg.blocks} block{'s' if wg.paired else ''} an SM"
    return "two wgmma consumer warpgroups"


# The PTX type of a wgmma's 8-bit float operands, by their C type.
FP8_PTX = {"__nv_fp8_e4m3": "e4m3", "__nv_fp8_e5m2": "e5m2"}


# The wgmma variants the kernels print, by name: both operands from shared memory with B as a GEMM's (16-bit
# MN-major, imm-trans-b 1; 8-bit K-major), 16-bit B K-major (imm-trans-b 0: attention's K, whose rows are S's
# columns), and A from registers with B MN-major (the RS form: attention's P · V).
# "sd" is "ss" with scale-d an operand: 0 makes D = A · B, the accumulators not read (a block-scaled group's first).
WGMMA_VARIANTS = {
    "ss": "spatialc_wgmma",
    "kb": "spatialc_wgmma_kb",
    "rs": "spatialc_wgmma_rs",
    "sd": "spatialc_wgmma_sd",
}


def wgmma_specialisations(n: int, operand: str, integer: bool, variant: str = "ss") -> list[str]:
    """The wgmma of width `n` for the kernel's operand type, as inline PTX: its accumulator list is `n / 2` registers
    long, which is why it is printed rather than written out in sm90a.cuh. In the "ss" variant A and B both come
    from shared memory; 16-bit B is N-major (transposed), 8-bit operands (int8, e4m3, e5m2) are K-major — the only
    way the PTX ISA lets a wgmma of them read B (its transposes are the 16-bit types' alone). The 8-bit floats' wgmma
    (k32, float32 accumulators) takes the floating-point variants' operand scales, here 1 and 1 (no negation). "kb"
    reads 16-bit B K-major; "rs" takes A from four registers a thread (mma.m16n8k16's A fragment, of the warp's 16
    rows), B N-major; "sd" is the 8-bit floats' "ss" with scale-d an operand (0: D = A · B, a block-scaled K group's
    first wgmma into its fresh partial accumulators) (`WGMMA_VARIANTS`)."""
    regs = n // 2
    acc = ", ".join(f"%{i}" for i in range(regs))
    if integer:
        shape, dtype, tail, out = f"m64n{n}k32", "s32.s8.s8", "p", '"+r"'
    elif operand in FP8_PTX:
        ty = FP8_PTX[operand]
        shape, dtype, tail, out = f"m64n{n}k32", f"f32.{ty}.{ty}", "p, 1, 1", '"+f"'
    else:
        ty = "bf16" if "bfloat16" in operand else "f16"
        trans_b = {"ss": "1", "kb": "0", "rs": "1"}[variant]
        tail = f"p, 1, 1, {trans_b}" if variant == "rs" else f"p, 1, 1, 0, {trans_b}"
        shape, dtype, out = f"m64n{n}k16", f"f32.{ty}.{ty}", '"+f"'
    if variant == "sd" and operand not in FP8_PTX:
        raise Unsupported(f"a {variant} wgmma of {operand}", "only the 8-bit floats' GEMMs are block-scaled")
    if variant not in ("ss", "sd") and (integer or operand in FP8_PTX):
        raise Unsupported(f"a {variant} wgmma of {operand}", "only 16-bit operands are transposed or held in registers")
    accum = "int" if integer else "float"
    name = WGMMA_VARIANTS[variant]
    outs = ", ".join(f"{out}(d[{i // 8}].x[{i % 8}])" for i in range(regs))
    if variant == "rs":
        a_param, a_ops = "const spatialc_frag<T>& a", f"{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}"
        ins, b_at = '"r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "l"(b)', regs + 4
        a_spec = f"const spatialc_frag<{operand}>& a"
    else:
        a_param, a_ops, ins, b_at = "unsigned long long a", f"%{regs}", '"l"(a), "l"(b)', regs + 1
        a_spec = "unsigned long long a"
    b_param, scale_d = "unsigned long long b", "1"
    if variant == "sd":
        b_param, scale_d, ins = "unsigned long long b, int scale_d", f"%{b_at + 1}", f'{ins}, "r"(scale_d)'
    return [
        "#ifndef SPATIALC_SM90A_EMULATED",
        "template <int N, class T, class A>",
        f"__device__ void {name}(spatialc_acc<A> (&d)[N / 16], {a_param}, {b_param});",
        "template <>",
        f"__device__ __forceinline__ void {name}<{n}, {operand}, {accum}>(",
        f"    spatialc_acc<{accum}> (&d)[{n // 16}], {a_spec}, {b_param})",
        "{",
        "    asm volatile(",
        f'        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, {scale_d}, 0;\\n"',
        f'        "wgmma.mma_async.sync.aligned.{shape}.{dtype} {{{acc}}}, {a_ops}, %{b_at}, {tail};\\n}}"',
        f"        : {outs}",
        f"        : {ins});",
        "}",
        "#endif",
    ]


def preamble(hk: HopperKernel) -> list[str]:
    k = hk.base
    types = (k.types.operand, k.integer)
    lines = general_printer.preamble(k)
    head, rest = lines[0], lines[1:]
    head = (
        f"// {plain(k.program.name)}: the sm_90a CUDA form printed by spatialc from the spatial IR; each block is one"
        f" site, its reader a TMA producer, its compute engine {_consumers(hk.wg)}."
    )
    at = rest.index("#include <cstring>") + 1
    rest = [*rest[:at], "#include <cuda.h>", "#include <cudaTypedefs.h>", *rest[at:]]
    at = rest.index("typedef " + f"{k.types.operand} OPT;")
    wgmmas = [line for n, kind in hk.wgmmas or ((hk.n, "ss"),) for line in wgmma_specialisations(n, *types, kind)]
    w4a16 = ["sm90a/dequant90.cuh"] if has_dequant(k.program) else []  # its bulk copies and panel stores
    extra = [*inlined_lines("sm90a/sm90a.cuh", *w4a16), *wgmmas, ""]
    if hk.schedule == PINGPONG:  # the two consumer warpgroups' turns: bar.arrive beside bar.sync
        extra += [*inlined_lines("sm90a/pingpong.cuh"), ""]
    rest = [*rest[:at], *extra, *rest[at:]]
    if hk.chunk:  # tiles of the output box each consumer warp stages for the TMA store
        at = next(i for i, line in enumerate(rest) if line.startswith("#define SMEM_OFF_"))
        rest = [*rest[:at], f"#define OUT_CHUNK {hk.chunk}", *staging.defines(hk), *rest[at:]]
    # (each multicast ring's ready barriers count its receivers: READY_COUNT_r, the general preamble's)
    return [head, *(line.replace(f"#define NTHREAD {k.threads}", f"#define NTHREAD {hk.threads}") for line in rest)]


def kernel_text(hk: HopperKernel) -> str:
    k = hk.base
    w = Writer()
    for line in preamble(hk):
        w.line(line)
    params = ", ".join(
        [f"{general_printer._param_head(k, t)}* __restrict__ t{int(t.id)}" for t in k.program.tensors]
        + ["const int* __restrict__ spatialc_work"]
        + (["int* __restrict__ spatialc_sync"] if hk.partials else [])
        + [f"const __grid_constant__ CUtensorMap spatialc_tmap_{m.index}" for m in hk.maps]
    )
    general_printer.class_table(k, w)
    mc = hk.multicast
    # Multicast groups are clusters of `cluster` consecutive sites: a page lands in each of its group's blocks.
    dims = f" __cluster_dims__({k.cluster}, 1, 1)" if mc is not None else ""
    w.line(f'extern "C" __global__ __launch_bounds__(NTHREAD, {hk.wg.blocks}){dims} void {KERNEL_NAME}({params})')
    with w.block():
        site_prologue(w, k.cluster if mc is not None else 1)
        w.line("extern __shared__ __align__(1024) char spatialc_dyn_smem[];")
        w.line("spatialc_check_stage_base(spatialc_dyn_smem);")
        general_printer.declare_rings(k, w)
        if hk.scales is not None:
            sa = hk.scales
            w.line(
                f"SPATIALC_DYNAMIC_RING(float, sa_stage, spatialc_dyn_smem, SMEM_OFF_SA_STAGE, DEPTH_{sa.ring}, "
                f"{sa.rows});  // A's scales of each stage's K group, with A's page"
            )
        if hk.chunk and hk.epilogue == SWIZZLED:
            staging.declare(hk, w)
        elif hk.chunk:
            boxes = hk.wg.staging_boxes
            w.line(
                f"SPATIALC_DYNAMIC_RING(OUT_T, out_stage, spatialc_dyn_smem, SMEM_OFF_OUT_STAGE, {boxes}, "
                f"OUT_CHUNK * {TILE_ELEMS});  // each consumer warp's {STORE_BUFFERS} output boxes"
            )
        for r in mc.rings if mc is not None else ():
            w.line(
                f"SPATIALC_DYNAMIC_RING(unsigned long long, ready_{r}, spatialc_dyn_smem, SMEM_OFF_READY_{r}, "
                f"DEPTH_{r}, 1);"
            )
        with w.block("if (tid == 0)"):
            general_printer.init_barriers(k, w)
            for r in mc.rings if mc is not None else ():
                with w.block(f"for (unsigned s = 0; s < DEPTH_{r}; ++s)", "// a stage free in every receiver"):
                    w.line(f"spatialc_mbar_init(&ready_{r}[s], READY_COUNT_{r});")
            w.line("spatialc_fence_barrier_init();  // the initialised barriers, before any other thread's use")
            w.line("spatialc_fence_proxy_async();  // and before the copy engine's transaction counts on them")
        w.line("__syncthreads();")
        if mc is not None:
            w.line("spatialc_cluster_sync();  // and before a peer block arrives on them or multicasts into this one")
        consumers = hk.wg.consumers * WARPGROUP
        with w.block(f"if (warp >= {consumers})", "// the producer warpgroup"):
            if hk.wg.moves_registers:  # a block of one consumer warpgroup keeps what the launch gave it
                w.line(f"spatialc_regs_dec<{PRODUCER_REGS}>();")
            for i, role in enumerate(k.roles[1:]):
                with w.block(f"{'if' if i == 0 else 'else if'} (warp == {role.first_warp})", f"// {role.engine.value}"):
                    _engine(hk, role, w)
        who = "the consumer warpgroup (two blocks an SM)" if hk.wg.paired else "the consumer warpgroups"
        with w.block("else", f"// {k.roles[0].engine.value}: {who}"):
            if hk.wg.moves_registers:
                w.line(f"spatialc_regs_inc<{CONSUMER_REGS}>();")
            _engine(hk, k.roles[0], w)
        if mc is not None:
            # Every page a peer sends this block was waited for, and every arrival it made on a peer's barrier was
            # waited for there; CUDA still asks that no block of a cluster exits while a peer may use its shared
            # memory, which this barrier makes true whatever the schedule.
            w.line("spatialc_cluster_sync();  // no block leaves while its peers may still reach its shared memory")
    if mc is not None:
        w.line(f"SPATIALC_CLUSTER_KERNEL({KERNEL_NAME}, {k.cluster})")
    return w.text()


def _engine(hk: HopperKernel, role: general.Role, w: Writer) -> None:
    """One engine's branch. The reader runs on one thread: the copy engine moves its pages."""
    k = hk.base
    w.line(f"const int etid = tid - {role.first_warp * WARP};")
    w.line("(void)etid;")
    kind = AttentionPrinter if hk.attention else w4.W4HopperPrinter if has_dequant(k.program) else HopperPrinter
    printer = kind(hk, role, w)
    printer.tensors = {int(t.id): t for t in k.program.tensors}
    printer.counters()
    if isinstance(printer, AttentionPrinter):
        declare(printer, w)
    stores = hk.chunk and role is k.roles[0]  # the consumers' fused store, through the staging boxes
    if stores and hk.odd_turns:
        w.line("unsigned boxes_out = 0;  // output boxes this warp has staged (its boxes are used in turn)")
    if any(isinstance(op, AcquireAcc) for op in role.walk()) and not hk.attention:
        w.line(f"spatialc_acc<ACCT> accf[{hk.n // 16}];")
        if program_scales(k.program) is not None:  # a K group's products, before their promotion into accf
            w.line(f"spatialc_acc<ACCT> part[{hk.n // 16}];")
    single = any(isinstance(op, ReadTiles) for op in role.walk())
    if single:
        printer.nthreads = "1"

    def body(ops: tuple[ChoreoOp, ...], index: int | None) -> None:
        printer.sends = frozenset(k.rings.template[op.buf] for op in walk(ops) if isinstance(op, McastSend))
        printer.partials = hk.partials[index] if hk.partials and index is not None else None
        printer.partials_added = 0
        if single:
            with w.block("if (etid == 0)", "// the copy engine moves the pages; one thread issues"):
                for m in hk.maps:  # every map this block's copies use (the loads' and the store's)
                    w.line(f"spatialc_prefetch_tensormap(&spatialc_tmap_{m.index});")
                general_printer._program(printer, ops)
        else:
            general_printer._program(printer, ops)
        assert not printer.deferred, "a sender's load with no send"
        assert not printer.arrived, "an arrival made with a load's expect_tx and no Push after it"

    general_printer.by_class(k, role, w, body, indexed=True)
    if stores and hk.epilogue == SWIZZLED:
        staging.last_wait(w)
    elif stores:
        # The shared memory a store reads must outlive its reading: the warp's last stores, before it ends.
        last = "if ((threadIdx.x & 31) == 0) { spatialc_bulk_wait_read<0>(); }"
        w.line(f"{last}  // the last boxes' stores have read them")


def budget_of(hk: HopperKernel, target: SpatialTarget) -> Budget:
    k = hk.base
    bud = general.budget_of(k, target)
    rings = sum(r.bytes for r in k.rings.rings.values())
    staging = staging_bytes(hk.chunk, k.out_type, hk.wg)
    return dataclasses.replace(
        bud,
        staging_bytes=staging,
        ring_bytes=rings,
        padding_bytes=k.dyn_bytes - rings - k.barrier_bytes - staging,
        dynamic_opt_in=k.dyn_bytes > target.smem_static_max,
        regs_est=hk.wg.consumer_regs(target),
        regs_entry=hk.wg.at_launch(target) if hk.wg.moves_registers else 0,
        blocks_per_sm=hk.wg.blocks,
        threads=hk.threads,
        form="sm90a",
    )


def lower(
    program: SpatialProgram, target: SpatialTarget, epilogue: str = SWIZZLED, schedule: str | None = None
) -> CudaArtifact:
    """The sm_90a CUDA artifact of a verified program, or a typed error saying what the form cannot print; `epilogue`
    picks how the fused store's staged boxes go out (`plan.EPILOGUES`), `schedule` attention's KV loop
    (`overlap.SCHEDULES`: its softmax overlapping the next S, the default for one consumer warpgroup; each matmul
    waited for; or two warpgroups' matmuls in turns, `pingpong.py`, the default for two)."""
    hk = make_kernel(program, target, epilogue, schedule)
    k = hk.base
    clustered = hk.multicast is not None
    launch = launch_for(
        program,
        target,
        KERNEL_NAME,
        k.types,
        hk.threads,
        k.dyn_bytes,
        k.dyn_bytes > target.smem_static_max,
        hk.wg.blocks,
        k.sync if hk.partials else (),  # split-K's semaphores (a multicast's handshake is the cluster's barriers)
        fixed=clustered or len(k.classes) > 1,
        cooperative=bool(hk.partials),  # an owner waits on its contributors: every site resident at once
        cluster=k.cluster if clustered else 1,
    )
    # The operands the copy engine loads are stored as matrices (row-major, or transposed), not tiled.
    params = tuple(
        dataclasses.replace(param, order=hk.stored[i]) if i in hk.stored else param
        for i, param in enumerate(launch.params)
    )
    launch = dataclasses.replace(launch, params=params, tensor_maps=hk.maps)
    programs = tuple(ops for role in k.roles for ops in general_printer.printed(role))
    return assemble(program, target.name, kernel_text(hk), programs, launch, budget_of(hk, target))

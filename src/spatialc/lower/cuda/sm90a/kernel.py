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
- The epilogue is fused where it can be (`fused.fused_output`): where the writer only waits for each output page, stores
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
new here is checked before printing (`checks.check_resources`): threads × registers, the setmaxnreg split, stage bytes
against shared memory, 1024-byte stage bases and pages on their swizzle's period, and transaction counts equal to
the bytes each page receives. Since only this form reads panels, `build` plans for it only where it prints the
program (`passes.pipeline.sm90a_refusal`); the general form does not ride along with its artifacts.

This module describes the kernel (`HopperKernel`), makes it (`make_kernel`) and lowers it (`lower`). Beside it: what
the form takes and the checks before printing (`checks.py`), the fused epilogue's detection (`fused.py`), the kernel
text and budget (`text.py`) with its wgmma specialisations (`wgmma.py`), the form's shape constants, the plans it
takes and what they cost (`plan.py`), its pages' panels and tensor maps (`tma.py`), its engine printer
(`printer.py`) and attention's kernel — these engines with two wgmma shapes around the general form's register
path, one consumer warpgroup (`attention.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ....ir.nodes import PageLayout, SpatialProgram
from ....ir.ops import Compute, MatmulTiles, Pop, ReadTiles, WriteTiles
from ....numerics.blockscale import program_scales
from ....passes.attention import is_attention_program
from ....passes.verify import derived
from ....target import WARP, SpatialTarget
from ...artifact import CudaArtifact, TensorMap
from ...errors import Unsupported
from ..common.clusters import Multicast, check_cluster, check_items, multicast
from ..common.dequant import has_dequant
from ..common.host import assemble
from ..common.launch import launch_for
from ..common.rings import Rings
from ..general import kernel as general
from ..general import printer as general_printer
from . import dequant as w4
from . import partials
from .attention import make_attention_kernel
from .blockscale import SCALE_ALIGN, ScaleStage, scale_stage
from .checks import check_resources, refuse
from .fused import fused_output, staged
from .partials import PartialSide
from .plan import (
    BARRIER_ALIGN,
    EPILOGUES,
    STAGE_ALIGN,
    STORE_BUFFERS,
    SWIZZLED,
    WARPGROUP,
    WARPGROUP_ROWS,
    Warpgroups,
    box_swizzle,
    staging_bytes,
    store_chunk,
    warpgroups,
)
from .text import KERNEL_NAME, budget_of, kernel_text
from .tma import Panels, TileBoxes, param_at, tensor_maps


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


def _with_rings(k: general.GeneralKernel, rings: Rings) -> general.GeneralKernel:
    """`k` with fewer rings in shared memory (the fused store's, split-K's direct partial sums): `rings`, and the
    barriers' arrival counts of the rings it keeps."""
    full = {r: n for r, n in k.full_count.items() if r in rings.rings}
    return dataclasses.replace(k, rings=rings, full_count=full, empty_count={r: k.empty_count[r] for r in full})


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
        k = _with_rings(k, rings)
    if split is not None:  # split-K's partial sums go between the accumulators and the workspace (partials.py)
        crowded = partials.adds_fit(p.plans[0], target)
        if crowded is not None:
            raise Unsupported(crowded, "the loads in flight would spill the accumulators")
        direct = split[0]
        kept = {r: g for r, g in k.rings.rings.items() if r not in direct}
        k = _with_rings(k, dataclasses.replace(k.rings, rings=kept, direct=direct))
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
        k.sync,  # split-K's semaphores; none otherwise (the form prints no trip loop; a multicast's handshake is the
        # cluster's barriers)
        fixed=clustered or len(k.classes) > 1,
        cooperative=k.cooperative,  # an owner waits on its contributors: every site resident at once
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

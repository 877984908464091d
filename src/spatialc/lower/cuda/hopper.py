"""The sm_90a form: the general form's engines on warps of their own, with Hopper's data path.

- The reader is one thread of a producer warpgroup. The operands it loads are not tiled in global memory but stored
  as matrices (`KernelParam.order` "rows"; int8 B "cols", its transpose), and each page lands as the IR's
  `panels` layout says (`panels_t` for int8 B): one row-major matrix in panels as wide as its rows allow, up to 128
  bytes, swizzled by the copy engine as wgmma reads them — the layout of every fast Hopper GEMM. Each `ReadTiles`
  is one 2-D TMA box a panel (`Panels`), all announced on the slot's full barrier by one `expect_tx` of exactly the
  page's bytes; `Push` is the reader's one arrival on it. The phase completes when the arrival and every byte are
  in. Each stage starts on 1024 bytes, so the swizzle by address is the page's own.
- The compute engine is two consumer warpgroups (the eight accumulator warps). Warp w holds the item's tile row w,
  every column, in wgmma's accumulator layout, which is the m16n8 layout `spatialc_acc` already names. A K step
  issues one `wgmma.mma_async` per 32 bytes of K (16 elements; int8 32) with both operands read from shared memory
  through matrix descriptors of the panels' swizzle: A K-major (a warpgroup's 64 rows, 8-row groups a panel row ×
  8 apart), 16-bit B N-major (transposed: its K rows are panel rows, the next panel of columns the leading
  offset on), int8 B K-major like A. Where the K loop is not pipelined (below), the first `Pop` after a step
  waits for its group (`wgmma.wait_group 0`) before it releases the slot: until then the MMA may still read it.
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
  persistent kernel's). Otherwise (an activation) the writer, the epilogue stages page to page and their rings are
  the general form's.
- `setmaxnreg` gives the consumers the producer warpgroup's registers; every other flow op is the general form's.

Rule 7 of `verify` proves the engines' handover free of deadlock and overrun exactly as for the general form; what is
new here is checked before printing (`check_resources`): threads × registers, the setmaxnreg split, stage bytes
against shared memory, 1024-byte stage bases and pages on their swizzle's period, and transaction counts equal to
the bytes each page receives. Since only this form reads panels, `build` plans for it only where it prints the
program (`passes.pipeline.sm90a_refusal`); the general form does not ride along with its artifacts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ...ir.ids import LoopVar, loop_var_name
from ...ir.nodes import PageLayout, Plan, SpatialProgram, TensorRole, panel_bytes
from ...ir.ops import (
    AcquireAcc,
    ChoreoOp,
    Compute,
    Loop,
    MatmulTiles,
    McastSend,
    PackAcc,
    Pop,
    Precision,
    Push,
    ReadBarrier,
    ReadTiles,
    Reserve,
    SemSet,
    Trip,
    Wait,
    WriteTiles,
    walk,
)
from ...ir.printer import compute_text
from ...passes.tile import operand_layouts
from ...target import WARP, SpatialTarget
from ..artifact import Budget, CudaArtifact, TensorMap
from ..census import POST, marker
from ..errors import LowerError, TooBig, Unsupported
from . import epilogue, general
from .clusters import ClusterPrinter, Multicast, check_cluster, check_items, multicast
from .cwriter import Writer, addr_expr, c_mul, c_sum, inlined_lines, site_prologue
from .host import assemble
from .program import all_ops, checked_gemm, launch_for, matmul_stages
from .rings import MMA_TYPES, TILE_ELEMS, Ring, Rings, ring_table

KERNEL_NAME = "spatialc_hopper"
WARPGROUP = 4  # warps that issue one wgmma together
CONSUMER_GROUPS = 2  # warpgroups of the compute engine: its eight accumulator warps
PRODUCER_REGS = 40  # registers a producer-warpgroup thread keeps after setmaxnreg.dec
CONSUMER_REGS = 232  # registers a consumer thread gets with setmaxnreg.inc
STAGE_ALIGN = 1024  # bytes: every ring starts on the largest swizzle pattern's period
BARRIER_ALIGN = 16  # each barrier array: the emulation's (and the layout's) least region alignment
WGMMA_N_MAX = 256
DESC_SWIZZLE = {128: 1, 64: 2, 32: 3}  # a matrix descriptor's swizzle mode, by the panels' width in bytes
STORE_STAGE = 4096  # bytes of shared memory each consumer warp stages its output in, for the TMA store
STORE_BUFFERS = 2  # the staging's halves, used in turn: a box is staged while the store of the one before reads
STAGING_BOXES = CONSUMER_GROUPS * WARPGROUP * STORE_BUFFERS  # the output boxes of a block: each consumer warp's
OUT_BYTES = {"signed char": 1, "__half": 2, "__nv_bfloat16": 2, "float": 4, "int": 4, "long long": 8}
ACC_FENCE = "spatialc_acc_fence(accf);"  # the accumulators' registers pinned there (sm90a.cuh)


@dataclass(frozen=True, slots=True)
class HopperKernel:
    """The general form's kernel, re-laid-out for sm_90a, with what only this form needs."""

    base: general.GeneralKernel
    maps: tuple[TensorMap, ...]  # one per (tensor, box) a ReadTiles loads, then the TMA store's (a tile), in order
    tma_rings: frozenset[int]  # rings filled by the copy engine (full barrier: one arrival + bytes)
    threads: int  # warpgroups × 128
    n: int  # the wgmma width: the item's columns
    store: WriteTiles | None = None  # the writer's store the fused epilogue takes over (None: not fused)
    chunk: int = 0  # tiles a consumer warp stages at a time for the fused store's TMA store (0: stored directly)
    multicast: Multicast | None = None  # the multicast handshake (clusters.py), None without groups
    panels: dict[int, Panels] = dataclasses.field(default_factory=dict)  # each TMA-filled ring's panels
    stored: dict[int, str] = dataclasses.field(default_factory=dict)  # parameter → "rows" / "cols" (KernelParam)
    warp_freed: frozenset[int] = frozenset()  # rings whose stages a consumer warp frees with one arrival (`release`)

    @property
    def program(self) -> SpatialProgram:
        return self.base.program

    @property
    def odd_turns(self) -> bool:
        """Whether a consumer warp's output boxes of one item are not a whole number of turns of its STORE_BUFFERS
        staging boxes: then the turn is counted over all its items, else it restarts with each item."""
        return bool(self.chunk) and (self.n // 16 // self.chunk) % STORE_BUFFERS != 0


# ---- what the form takes ------------------------------------------------------------------------------------


def refuse(p: SpatialProgram, target: SpatialTarget) -> None:
    """Raise the first reason the sm_90a form cannot print `p`."""
    if not target.hopper:
        raise Unsupported(
            f"the sm_90a form on {target.name}", "its TMA, wgmma and setmaxnreg instructions exist on sm_90a only"
        )
    general.refuse(p)
    if len(matmul_stages(p)) > 1:
        raise Unsupported("several tile matmuls", "the consumer warpgroups hold one wgmma accumulator block per item")
    for op in all_ops(p):
        match op:
            case Loop(count=Trip()):
                raise Unsupported("a loop count read from data", "the sm_90a form prints fixed loops so far")
            case ReadTiles(rows_from=rows) if rows is not None:
                raise Unsupported("a grouped tensor's row limit", "a TMA box reads whole tiles")
    if any(t.role == TensorRole.WORKSPACE for t in p.tensors):
        raise Unsupported("split-K's workspace", "the sm_90a form reads operand pages only")
    plan = p.plans[0]
    check_plan(plan, p.precision)


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


def check_resources(k: HopperKernel, target: SpatialTarget) -> None:
    """The static checks before printing, each refusal naming the fix."""
    threads = k.threads
    # At launch every thread has what `__launch_bounds__(threads, 1)` leaves it (whole multiples of 8, at most the
    # target's per-thread cap); setmaxnreg.dec must lower that and .inc raise it.
    at_launch = min(target.regs_per_thread_max, target.regs_per_unit // threads) // 8 * 8
    if not PRODUCER_REGS <= at_launch <= CONSUMER_REGS:
        raise Unsupported(
            f"{at_launch} registers a thread at launch ({threads} threads)",
            f"setmaxnreg moves the producer down to {PRODUCER_REGS} and the consumers up to {CONSUMER_REGS}",
        )
    split = WARPGROUP * WARP * (PRODUCER_REGS + CONSUMER_GROUPS * CONSUMER_REGS)
    if split > target.regs_per_unit:
        raise TooBig("registers after setmaxnreg", split, target.regs_per_unit, "lower the consumers' setmaxnreg")
    if k.base.dyn_bytes > target.smem_per_site_max:
        raise TooBig(
            f"shared memory of one block of the sm_90a form on {target.name} (stages and barriers)",
            k.base.dyn_bytes,
            target.smem_per_site_max,
            "choose fewer stages (depth) or a narrower block",
        )
    for rid in k.tma_rings:
        off = k.base.offsets[f"ring_{rid}"]
        if off % STAGE_ALIGN:
            raise Unsupported(f"ring {rid} at byte {off}", f"a swizzled stage starts on {STAGE_ALIGN} bytes")
        ring = k.base.rings.rings[rid]
        period = 8 * k.panels[rid].width  # the swizzle repeats every 8 rows of a panel
        if (ring.page * ring.elem_bytes) % period:
            raise Unsupported(
                f"pages of {ring.page * ring.elem_bytes} bytes on {ring.name}",
                f"every page of {k.panels[rid].width}-byte panels starts on {period} bytes",
            )


def param_at(p: SpatialProgram, tensor) -> int:
    """The position of `tensor`'s parameter among the kernel's (Launch.params: tensor order), what TensorMap names."""
    return [t.id for t in p.tensors].index(tensor)


@dataclass(frozen=True, slots=True)
class Panels:
    """How a ring's page lies as the copy engine lands it: `rows` rows of `row_bytes` (the page, or its transpose
    for `panels_t`), in panels `width` bytes wide, each one TMA box."""

    rows: int
    row_bytes: int
    width: int
    transposed: bool
    elem: int  # bytes of an element

    @property
    def count(self) -> int:
        return self.row_bytes // self.width

    @property
    def box(self) -> tuple[int, int]:
        """The TMA box of one panel: (rows, columns) of the stored matrix."""
        return self.rows, self.width // self.elem

    @property
    def bytes(self) -> int:
        """Bytes of one panel: where the next one starts."""
        return self.rows * self.width


def panels_of(op: ReadTiles, layout: PageLayout, elem: int, name: str) -> Panels:
    """The panels of a page of `op`'s tiles in `layout` (`panels`, or `panels_t`: stored transposed), refused by
    name where its rows take no swizzle span."""
    rows, cols = op.block_h * 16, op.block_w * 16
    if layout == PageLayout.PANELS_T:
        rows, cols = cols, rows
    width = panel_bytes(cols * elem)
    if width is None:
        raise Unsupported(f"rows of {cols * elem} bytes in {name}'s pages", "a swizzled panel is 32, 64 or 128 wide")
    return Panels(rows, cols * elem, width, layout == PageLayout.PANELS_T, elem)


def _maps(
    p: SpatialProgram, rings, reader_ops
) -> tuple[tuple[TensorMap, ...], frozenset[int], dict[int, Panels], dict[int, str]]:
    """One tensor map per (tensor, box) the reader loads, the rings the copy engine fills, each one's panels, and
    the stored layout (`KernelParam.order`) of each tensor the maps read: "rows" (row-major), "cols" (transposed)."""
    maps: dict[tuple[int, int, int, int], TensorMap] = {}
    filled: set[int] = set()
    panels: dict[int, Panels] = {}
    stored: dict[int, str] = {}
    for op in reader_ops:
        if not isinstance(op, ReadTiles):
            continue
        t = p.tensor(op.tensor)
        ring = rings.kept(op.into)
        if t.role != TensorRole.INPUT or ring is None or ring.c_type != "OPT":
            raise Unsupported(f"a ReadTiles of {t.name}", "the copy engine fills operand pages only")
        if not ring.layout.panels:
            raise Unsupported(
                f"{t.name}'s pages in {ring.layout.value} layout ({ring.name}), planned for the other forms",
                "the sm_90a form's copy engine lands swizzled panels; build with form='sm90a' (--form sm90a) to"
                " plan for it, or to see why it is not",
            )
        if (op.stride_h, op.stride_w) != (t.tiles[1], 1) or t.tiles[1] % op.block_w:
            raise Unsupported(
                f"a ReadTiles of {t.name} with strides ({op.stride_h}, {op.stride_w})",
                "a TMA box is a rectangle of the tensor's tile grid",
            )
        if op.block_h * op.block_w * TILE_ELEMS != ring.page:
            raise Unsupported(
                f"a ReadTiles of {op.block_h}x{op.block_w} tiles into {ring.name}'s pages of {ring.page // TILE_ELEMS}",
                "the full barrier expects the whole page's bytes, and the boxes must bring exactly those",
            )
        pan = panels_of(op, ring.layout, ring.elem_bytes, t.name)
        if pan.rows > 256:
            raise Unsupported(f"pages of {pan.rows} rows of {t.name}", "a TMA box side is at most 256")
        at = param_at(p, op.tensor)
        order = "cols" if pan.transposed else "rows"
        if stored.setdefault(at, order) != order:
            raise Unsupported(f"{t.name} read both as it is and transposed", "a tensor is stored one way")
        maps.setdefault((at, *pan.box, pan.width), TensorMap(len(maps), at, pan.box, pan.width, pan.transposed))
        if panels.setdefault(ring.id, pan) != pan:
            raise Unsupported(f"pages of two shapes in {ring.name}", "each stage is laid out for one box")
        filled.add(ring.id)
    return tuple(maps.values()), frozenset(filled), panels, stored


def staged(p: SpatialProgram, store: WriteTiles) -> bool:
    """Whether the fused store can go out by TMA: a page of whole tiles in the output's row-major tile grid (a box
    of one tile row and consecutive tile columns)."""
    t = p.tensor(store.tensor)
    return (store.stride_h, store.stride_w) == (t.tiles[1], 1) and t.groups == 1


def fused_output(p: SpatialProgram, k: general.GeneralKernel) -> tuple[WriteTiles, Rings] | None:
    """The writer's store of the matmul's output (after its elementwise epilogue), where the consumers can make it
    themselves from their accumulators — a chain of stages the fused store applies, run by the compute engine at
    its item level, and a writer that only waits for each page, stores it and frees it — and the kernel's rings
    without that chain's. None otherwise (the general form's output ring and writer stay)."""
    try:
        mm, types, integer, chain = checked_gemm(p, epilogue.EPILOGUE_OPS)
    except LowerError:
        return None  # a stage the fused store does not apply (an activation): page to page, as the general form
    last = int(p.buffer((chain[-1] if chain else mm).outs[0]).ring)
    compute, *side = k.roles
    writers = [r for r in side if any(isinstance(op, WriteTiles) for op in r.walk())]
    if len(writers) != 1 or len(general.printed(writers[0])) != 1 or len(general.printed(compute)) != 1:
        return None
    body = writers[0].programs[0]
    if len(body) == 1 and isinstance(body[0], Loop):
        body = body[0].body
    if len(body) != 3 or not isinstance(body[1], WriteTiles):
        return None
    wait, store, pop = body
    ring = int(p.buffer(store.src).ring)
    if not (isinstance(wait, Wait) and isinstance(pop, Pop) and ring == last):
        return None
    # The compute engine pushes the last ring at its item level, where the writer's store has its loop variables.
    top = general.printed(compute)[0]
    level = top[0].body if len(top) == 1 and isinstance(top[0], Loop) else top
    if not any(isinstance(op, Push) and int(p.buffer(op.buf).ring) == last for op in level):
        return None
    fused = tuple(int(p.buffer(b).ring) for b in (mm.outs[0], *(s.outs[0] for s in chain)))
    return store, general.epilogue_rings(p, ring_table(p, types, fused), integer)


def make_kernel(p: SpatialProgram, target: SpatialTarget) -> HopperKernel:
    refuse(p, target)
    k = general.make_kernel(p, target, fit=False)  # its shared memory is laid out again below, and checked then
    fused = fused_output(p, k)
    store = None
    if fused is not None:  # the output and epilogue rings leave shared memory: the consumers store from registers
        store, rings = fused
        kept = {r: n for r, n in k.full_count.items() if r in rings.rings}
        k = dataclasses.replace(k, rings=rings, full_count=kept, empty_count={r: k.empty_count[r] for r in kept})
    compute = k.roles[0]
    if compute.warps != CONSUMER_GROUPS * WARPGROUP or compute.first_warp != 0:
        raise Unsupported(f"a compute engine on {compute.warps} warps", "the sm_90a form's consumers are 8 warps")
    side = k.roles[1:]
    if len(side) > WARPGROUP:
        raise Unsupported(f"{len(side)} engines beside the compute engine", "they share one producer warpgroup")
    reader = [r for r in side if any(isinstance(op, ReadTiles) for op in r.walk())]
    maps, filled, panels, stored = _maps(p, k.rings, [op for r in reader for op in r.walk()])
    for b in p.buffers:  # only the copy engine lands panels
        layout = getattr(b.kind, "layout", PageLayout.ROW)
        if layout.panels and k.rings.template.get(b.id) not in filled:
            raise Unsupported(f"{b.name}'s pages in {layout.value} layout", "panels are operand pages TMA fills")
    mc = multicast(p, k.rings.template)
    if mc is not None:
        check_cluster(k.cluster)
        check_items(p, k.cluster)
        if not set(mc.rings) <= filled:
            raise Unsupported("a multicast ring the copy engine does not fill", "only operand pages are multicast")
    ready = mc.rings if mc is not None else ()
    offsets, dyn, barrier_bytes = general.layout(k.rings.rings, STAGE_ALIGN, BARRIER_ALIGN, ready)
    h, w = k.plan.item_tiles
    chunk = 0
    if store is not None and staged(p, store):
        # The consumers' output goes out by TMA store: each warp stages `chunk` tiles at a time.
        chunk = store_chunk(w, k.out_type)
        offsets["out_stage"] = -(-dyn // STAGE_ALIGN) * STAGE_ALIGN
        dyn = offsets["out_stage"] + staging_bytes(chunk, k.out_type)
        # C is stored as a row-major matrix (what the caller gets needs no untilize), a tile a box.
        maps = (*maps, TensorMap(len(maps), param_at(p, store.tensor), (16, 16)))
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
        blocks_per_sm=1,
    )
    threads = (CONSUMER_GROUPS + 1) * WARPGROUP * WARP
    hk = HopperKernel(base, maps, filled, threads, w * 16, store, chunk, mc, panels, stored, warp_freed)
    check_resources(hk, target)
    return hk


# ---- printing --------------------------------------------------------------------------------------------------


class HopperPrinter(ClusterPrinter, general.EnginePrinter):
    """The general form's engine printer, with operand pages loaded by the copy engine and multiplied by wgmma."""

    counts_sends = False  # a multicast page lands at the sender's own stage in every block

    def __init__(self, hk: HopperKernel, role: general.Role, w: Writer):
        super().__init__(hk.base, role, w)
        self.hk = hk
        self.sends: frozenset[int] = frozenset()  # rings the program being printed multicasts
        self.deferred: dict[int, tuple[ChoreoOp, dict[LoopVar, str]]] = {}  # a sender's loads, issued at the send
        self.in_flight = False  # a wgmma group issued and not yet waited for (printing order is program order)
        self.integer = hk.base.integer
        self.chain: list[tuple[Compute, dict[LoopVar, str]]] = []  # epilogue stages met since the last store
        self.arrived: set[int] = set()  # rings whose next Push already arrived, with its load's expect_tx

    def read_slot(self, r: int) -> str:
        """The front page: the slot of the engine's last Wait (its release may come a step later)."""
        if any(isinstance(op, Wait) and self.k.rings.template[op.buf] == r for op in self.role.walk()):
            return f"((wt_{r} - 1) % DEPTH_{r})"
        return super().read_slot(r)

    def op(self, op: ChoreoOp, env: dict[LoopVar, str]) -> None:
        mark = marker(op)
        rings = self.k.rings
        match op:
            case Pop() | PackAcc() if self.in_flight:
                # The slot (or the accumulators) stay the MMA's until its group has retired.
                self.w.line("spatialc_wgmma_wait<0>();  // the K step's wgmma have read the stage")
                self.w.line(ACC_FENCE + "  // and written the accumulators: nothing reads them before")
                self.in_flight = False
                self.op(op, env)
            case Push(buf) if rings.is_fused(buf) and rings.chain_step(buf) == len(rings.fused) - 1:
                # The last page of the chain is the one the writer would store: the consumers store it themselves.
                assert self.hk.store is not None
                chain, self.chain = self.chain, []
                self.fused_store(self.hk.store, env, marker(self.hk.store), chain)
                self.w.line("", f"{mark} (fused output: no ring)")
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) | PackAcc(to=buf) if rings.is_fused(buf):
                self.w.line("", f"{mark} (fused output: no ring)")
            case Compute(op=stage, ins=(buf,)) if rings.is_fused(buf):
                self.w.line(f"// {compute_text(stage, self.k.program)}: applied in the fused store below")
                self.chain.append((op, env))
            case WriteTiles(src=buf) if rings.is_fused(buf):
                pass  # its image, with its census marker, is the consumers' fused store
            case Loop() if self.pipelined(op):
                self.k_loop_pipelined(op, env, mark)
            case ReadTiles(into=buf) if self.kept(buf).id in self.sends:
                # The sender's page goes to every block of its group at once: loaded where the IR sends it.
                self.deferred[self.kept(buf).id] = (op, env)
                self.w.line("", f"{mark} (loaded into the group's blocks by the multicast below)")
            case ReadTiles(into=buf) if self.kept(buf).id in self.hk.tma_rings:
                self.tma(op, env, mark)
            case ReadBarrier() if self.role.first_warp >= CONSUMER_GROUPS * WARPGROUP:
                self.w.line("", f"{mark} (no cp.async: the copy engine's bytes count on the full barrier)")
            case _ if self.handshake(op, env, mark):
                pass
            case Pop(buf) if self.kept(buf).id in self.hk.warp_freed:
                self.release(op, mark)
            case Push(buf) if self.kept(buf).id in self.arrived:
                r = self.kept(buf).id
                self.arrived.discard(r)
                self.w.line(f"++psh_{r};", f"{mark} (its arrival went with the expect_tx above)")
            case Push(buf) if self.kept(buf).id in self.hk.tma_rings:
                r = self.kept(buf).id
                self.w.line(f"spatialc_mbar_arrive(&full_{r}[psh_{r} % DEPTH_{r}]); ++psh_{r};", mark)
            case Compute(op=MatmulTiles() as mm, ins=(a, b)):
                self.wgmma(mm, self.kept(a), self.kept(b), mark)
            case _:
                super().op(op, env)

    def pipelined(self, loop: Loop) -> bool:
        """Whether `loop` is a K loop whose releases can wait a step: its body waits, multiplies once and pops exactly
        the matmul's rings, each at least two pages deep, and its count is fixed."""
        if isinstance(loop.count, Trip) or loop.count.n < 1:  # type: ignore[union-attr]
            return False
        body = loop.body
        mms = [i for i, op in enumerate(body) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles)]
        if len(mms) != 1:
            return False
        at = mms[0]
        waits, pops = body[:at], body[at + 1 :]
        mm = body[at]
        assert isinstance(mm, Compute)
        if not all(isinstance(o, Wait) for o in waits) or not all(isinstance(o, Pop) for o in pops):
            return False
        rings = {self.kept(b).id for b in mm.ins}
        popped = [self.kept(o.buf).id for o in pops]  # type: ignore[union-attr]
        return sorted(popped) == sorted(rings) and all(self.kept(b).depth >= 2 for b in mm.ins)

    def k_loop_pipelined(self, loop: Loop, env: dict[LoopVar, str], mark: str) -> None:
        """The K loop with each step's releases printed one step late (one wgmma group in flight)."""
        v = loop_var_name(loop.var)
        at = next(i for i, op in enumerate(loop.body) if isinstance(op, Compute))
        waits, mm, pops = loop.body[:at], loop.body[at], loop.body[at + 1 :]
        with self.w.block(f"for (int {v} = 0; {v} < {loop.count.n}; ++{v})", mark):  # type: ignore[union-attr]
            inner = env | {loop.var: v}
            for op in waits:
                self.op(op, inner)
            self.op(mm, inner)
            self.w.line("spatialc_wgmma_wait<1>();  // the previous K step's group has retired; this one runs on")
            self.in_flight = False
            with self.w.block(f"if ({v} > 0)", "// the previous K step's stages go back to the producer"):
                for op in pops:
                    self.release(op, marker(op))
        self.w.line("spatialc_wgmma_wait<0>();  // the last K step's group")
        self.w.line(ACC_FENCE + "  // the accumulators are whole: nothing reads them before")
        for op in pops:
            self.release(op, marker(op, POST))

    def fused_store(
        self, op: WriteTiles, env: dict[LoopVar, str], mark: str, chain: list[tuple[Compute, dict[LoopVar, str]]]
    ) -> None:
        """The fused store through shared memory: each consumer warp takes `chunk` tiles of its row at a time
        through the chain into one of its STORE_BUFFERS staging boxes, in turn (the tiles one after another, each
        row-major: the output map's box), fences them over to the async proxy, and its first lane stores them by
        TMA, a tile a box, as one bulk group. A box is written again only once the group that last read it has
        (`bulk_wait_read<STORE_BUFFERS - 1>`: the groups after it may still be reading the other box) — across
        items too, so the item's last stores go on while the next item's K loop runs; the engine waits for the
        last of them before it ends (`_engine`)."""
        chunk = self.hk.chunk
        if not chunk:
            super().fused_store(op, env, mark, chain)
            return
        cols = self.k.program.tensor(op.tensor).tiles[1]
        m = self.hk.maps[-1]
        with self.w.block("", mark):
            self.warp_coords()
            self.w.line("const int lane = tid % 32;")
            matrix = OUT_BYTES[self.k.out_type] == 2  # 16-bit values go out by stmatrix, a tile a warp at once
            if chain or not matrix:
                self.w.line("const int lane_el = (lane >> 2) * 16 + 2 * (lane & 3);  // the lane's first element")
            base = addr_expr(op.at, env)
            with self.unrolled("for (int q0 = 0; q0 < PERW; q0 += OUT_CHUNK)"):
                # An item of a whole number of turns starts on the first box: the box is known where printed.
                turn = "q0 / OUT_CHUNK" if not self.hk.odd_turns else "boxes_out"
                self.w.line(
                    f"OUT_T* const staged = out_stage + (warp * {STORE_BUFFERS} + ({turn}) % {STORE_BUFFERS}) * "
                    f"(OUT_CHUNK * {TILE_ELEMS});  // this warp's box in turn"
                )
                wait = f"spatialc_bulk_wait_read<{STORE_BUFFERS - 1}>();"
                self.w.line(f"if (lane == 0) {{ {wait} }}  // the store that last read this box has read it")
                self.w.line("__syncwarp();")
                with self.unrolled("for (int c = 0; c < OUT_CHUNK; ++c)"):
                    self.w.line("const int q = q0 + c;")
                    if matrix:
                        self.w.line("OUT_T out[8];")
                    value = "accf[q].x[i]"
                    if chain:  # one element at a time, as the direct fused store does (registers)
                        self.w.line(self.owned_tile() + "  // (a bias reads its column)")
                        self.w.line("(void)bh; (void)bw;")
                        self.w.line("ACCT frag[8];")
                        with self.unrolled("for (int i = 0; i < 8; ++i)"):
                            self.w.line("frag[i] = accf[q].x[i];")
                        self.w.line("#pragma unroll 1")
                        value = "frag[i]"
                    with (
                        self.w.block("for (int i = 0; i < 8; ++i)")
                        if chain
                        else self.unrolled("for (int i = 0; i < 8; ++i)")
                    ):
                        if chain or not matrix:  # (a bias reads the element's column)
                            self.w.line("const int el = lane_el + ((i >> 1) & 1) * 128 + (i >> 2) * 8 + (i & 1);")
                        if matrix:
                            if chain:
                                self.w.line("(void)el;")
                            self.read_out(op, chain, value, "out[i] = {};")
                        else:
                            self.read_out(op, chain, value, f"SPATIALC_PAGE_ST(staged + c * {TILE_ELEMS} + el, {{}});")
                    if matrix:
                        self.w.line(f"spatialc_stmatrix_tile(staged + c * {TILE_ELEMS}, out);")
                self.w.line("spatialc_fence_proxy_async();  // the lane's staged values, visible to the copy engine")
                self.w.line("__syncwarp();")
                with self.w.block("if (lane == 0)", "// a box a tile: the warp's tile row, tile columns q0 …"):
                    rows, cols_at = c_mul("(long long)wi", op.stride_h), c_mul("(long long)q0", op.stride_w)
                    self.w.line(f"const long long tile = {c_sum(f'(long long)({base})', rows, cols_at)};")
                    self.w.line(f"const int row = (int)(tile / {cols}) * 16, col = (int)(tile % {cols}) * 16;")
                    with self.unrolled("for (int c = 0; c < OUT_CHUNK; ++c)"):
                        at = f"col + c * 16, row, staged + c * {TILE_ELEMS}"
                        self.w.line(f"spatialc_tma_store_2d(&spatialc_tmap_{m.index}, {at});")
                    self.w.line("spatialc_bulk_commit();")
                if self.hk.odd_turns:
                    self.w.line("++boxes_out;")

    def full_wait(self, r: int) -> str:
        # A multicast ring's page may come from a peer, whose bytes complete the barrier at cluster scope.
        if self.hk.multicast is not None and r in self.hk.multicast.rings:
            return "spatialc_mbar_wait_cluster"
        return super().full_wait(r)

    def reset(self, op: SemSet, before: ChoreoOp | None) -> None:
        if not self.handshake_reset(op):
            super().reset(op, before)

    def release(self, op: ChoreoOp, mark: str) -> None:
        """A Pop: where only wgmma reads the stage (`warp_freed`), one arrival of the warp on the slot's empty
        barrier — the wait_group that retired the wgmma reading it is warp-synchronous (.sync.aligned): when lane 0
        is past it, so is every lane; otherwise one arrival a thread."""
        assert isinstance(op, Pop)
        r = self.kept(op.buf).id
        if r not in self.hk.warp_freed:
            self.w.line(f"spatialc_mbar_arrive(&empty_{r}[pop_{r} % DEPTH_{r}]); ++pop_{r};", mark)
            return
        with self.w.block("if ((threadIdx.x & 31) == 0)", "// one arrival a warp (EMPTY_COUNT: the consumer warps)"):
            self.w.line(f"spatialc_mbar_arrive(&empty_{r}[pop_{r} % DEPTH_{r}]);", mark)
        self.w.line(f"++pop_{r};")

    def tma(self, op: ReadTiles, env: dict[LoopVar, str], mark: str, mask: str | None = None) -> None:
        """The whole page's bytes announced on the slot's full barrier, then one box a panel — multicast to the
        blocks of `mask` where one is given."""
        t = self.k.program.tensor(op.tensor)
        ring = self.kept(op.into)
        r = ring.id
        pan = self.hk.panels[r]
        at = param_at(self.k.program, op.tensor)
        m = next(m for m in self.hk.maps if (m.tensor, m.box, m.swizzle) == (at, pan.box, pan.width))
        nbytes = op.block_h * op.block_w * TILE_ELEMS * ring.elem_bytes
        slot = self.write_slot(r)
        # A load its ring's Push follows at once makes that Push's arrival with its expect_tx, in one instruction.
        pushed = mask is None and isinstance(self.after, Push) and self.kept(self.after.buf).id == r
        with self.w.block("", mark):
            self.w.line(f"const int at = {addr_expr(op.at, env)};  // the page's first tile of {t.name}")
            if pushed:
                self.w.line(f"spatialc_mbar_arrive_expect_tx(&full_{r}[{slot}], {nbytes}u);  // and the Push below")
                self.arrived.add(r)
            else:
                self.w.line(f"spatialc_mbar_expect_tx(&full_{r}[{slot}], {nbytes}u);")
            row, col = f"(at / {t.tiles[1]}) * 16", f"(at % {t.tiles[1]}) * 16"
            inner, outer = (row, col) if pan.transposed else (col, row)  # the stored matrix's column, row
            page, bar = f"(char*)({self.write_page(r)})", f"&full_{r}[{slot}]"
            if mask is not None:
                self.w.line(f"const unsigned short group = {mask};")
            for i in range(pan.count):
                dst = f"{page} + {i * pan.bytes}" if i else page
                c0 = f"{inner} + {i * pan.box[1]}" if i else inner
                if mask is None:
                    self.w.line(f"spatialc_tma_load_2d({dst}, &spatialc_tmap_{m.index}, {c0}, {outer}, {bar});")
                else:
                    load = (
                        f"spatialc_tma_load_2d_multicast({dst}, &spatialc_tmap_{m.index}, {c0}, {outer}, {bar}, group);"
                    )
                    self.w.line(load)

    def wgmma(self, mm: MatmulTiles, a: Ring, b: Ring, mark: str) -> None:
        """One K step: a wgmma per 16 (int8: 32) K elements — 32 bytes of K — each warpgroup's 64 rows of A and the
        whole B page read from shared memory through descriptors, committed as one group. A (and int8 B) K-major:
        an instruction's K is 32 bytes of a panel row, the next 8 rows a panel row × 8 on; 16-bit B N-major: its
        16 K rows are panel rows, the next 8 K rows 8 panel rows on, the next panel of N columns a panel on."""
        check_page_layouts(mm.operand, a, b)
        ibw = mm.block.ibw
        step = 2 if mm.operand == Precision.INT8 else 1  # tiles of K an instruction takes: 32 bytes
        pa, pb = self.hk.panels[a.id], self.hk.panels[b.id]
        kb = "(kk * 16 * (int)sizeof(OPT))"  # the instruction's first byte of K

        def k_major(page: str, pan: Panels, first_row: str) -> str:
            at = f"{page} + ({kb} / {pan.width}) * {pan.bytes} + {first_row} * {pan.width} + {kb} % {pan.width}"
            return f"spatialc_wgmma_desc({at}, 16u, {8 * pan.width}u, {DESC_SWIZZLE[pan.width]}u)"

        a_page, b_page = f"(const char*)({self.read_page(a.id)})", f"(const char*)({self.read_page(b.id)})"
        a_of = k_major(a_page, pa, f"(warp / {WARPGROUP}) * 64")  # the warpgroup's 64 rows
        if pb.transposed:  # int8 B: its rows are N, K-major like A
            b_of = k_major(b_page, pb, "0")
        else:
            at = f"{b_page} + kk * 16 * {pb.width}"
            b_of = f"spatialc_wgmma_desc({at}, {pb.bytes}u, {8 * pb.width}u, {DESC_SWIZZLE[pb.width]}u)"
        with self.w.block("", mark):
            self.w.line(ACC_FENCE + "  // their last plain writes (the zeroing) stay before the fence")
            self.w.line("spatialc_wgmma_fence();  // the accumulators were last written by plain instructions")
            with self.unrolled(f"for (int kk = 0; kk < {ibw}; kk += {step})"):
                self.w.line(f"spatialc_wgmma<{self.hk.n}, OPT>(accf, {a_of}, {b_of});")
            self.w.line("spatialc_wgmma_commit();")
        self.in_flight = True


def check_page_layouts(operand: Precision, a: Ring, b: Ring) -> None:
    """Refuse operand pages the descriptors cannot describe: swizzled panels, int8 B transposed."""
    want = operand_layouts(operand, "sm90a")
    for ring, layout, what in ((a, want[0], "A"), (b, want[1], "B")):
        if ring.layout != layout:
            raise Unsupported(
                f"{operand.value} operand {what} in {ring.layout.value} pages ({ring.name})",
                f"the sm_90a form's wgmma reads {what} from {layout.value} pages; build the program for sm_90a",
            )


def wgmma_specialisations(n: int, operand: str, integer: bool) -> list[str]:
    """The wgmma of width `n` for the kernel's operand type, as inline PTX: its accumulator list is `n / 2` registers
    long, which is why it is printed rather than written out in sm90a.cuh. A and B both come from shared memory;
    16-bit B is N-major (transposed), int8 operands are K-major (the only way int8 wgmma reads them)."""
    regs = n // 2
    acc = ", ".join(f"%{i}" for i in range(regs))
    if integer:
        shape, dtype, tail, out = f"m64n{n}k32", "s32.s8.s8", "p", '"+r"'
    else:
        ty = "bf16" if "bfloat16" in operand else "f16"
        shape, dtype, tail, out = f"m64n{n}k16", f"f32.{ty}.{ty}", "p, 1, 1, 0, 1", '"+f"'
    accum = "int" if integer else "float"
    outs = ", ".join(f"{out}(d[{i // 8}].x[{i % 8}])" for i in range(regs))
    return [
        "#ifndef SPATIALC_SM90A_EMULATED",
        "template <int N, class T, class A>",
        "__device__ void spatialc_wgmma(spatialc_acc<A> (&d)[N / 16], unsigned long long a, unsigned long long b);",
        "template <>",
        f"__device__ __forceinline__ void spatialc_wgmma<{n}, {operand}, {accum}>(",
        f"    spatialc_acc<{accum}> (&d)[{n // 16}], unsigned long long a, unsigned long long b)",
        "{",
        "    asm volatile(",
        '        "{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"',
        f'        "wgmma.mma_async.sync.aligned.{shape}.{dtype} {{{acc}}}, %{regs}, %{regs + 1}, {tail};\\n}}"',
        f"        : {outs}",
        '        : "l"(a), "l"(b));',
        "}",
        "#endif",
    ]


def preamble(hk: HopperKernel) -> list[str]:
    k = hk.base
    lines = general.preamble(k)
    head, rest = lines[0], lines[1:]
    head = (
        f"// {k.program.name}: the sm_90a CUDA form printed by spatialc from the spatial IR; each block is one site, "
        "its reader a TMA producer, its compute engine two wgmma consumer warpgroups."
    )
    at = rest.index("#include <cstring>") + 1
    rest = [*rest[:at], "#include <cuda.h>", "#include <cudaTypedefs.h>", *rest[at:]]
    at = rest.index("typedef " + f"{k.types.operand} OPT;")
    extra = [*inlined_lines("sm90a.cuh"), *wgmma_specialisations(hk.n, k.types.operand, k.integer), ""]
    rest = [*rest[:at], *extra, *rest[at:]]
    if hk.chunk:  # tiles of the output box each consumer warp stages for the TMA store
        at = next(i for i, line in enumerate(rest) if line.startswith("#define SMEM_OFF_"))
        rest = [*rest[:at], f"#define OUT_CHUNK {hk.chunk}", *rest[at:]]
    if hk.multicast is not None:  # each multicast ring's ready barriers count its receivers
        at = next(i for i, line in enumerate(rest) if line.startswith("#define SMEM_OFF_"))
        counts = [f"#define READY_COUNT_{r} {n}u" for r, n in sorted(hk.multicast.receivers.items())]
        rest = [*rest[:at], *counts, *rest[at:]]
    return [head, *(line.replace(f"#define NTHREAD {k.threads}", f"#define NTHREAD {hk.threads}") for line in rest)]


def kernel_text(hk: HopperKernel) -> str:
    k = hk.base
    w = Writer()
    for line in preamble(hk):
        w.line(line)
    params = ", ".join(
        [f"{general._param_head(k, t)}* __restrict__ t{int(t.id)}" for t in k.program.tensors]
        + ["const int* __restrict__ spatialc_work"]
        + [f"const __grid_constant__ CUtensorMap spatialc_tmap_{m.index}" for m in hk.maps]
    )
    general.class_table(k, w)
    mc = hk.multicast
    # Multicast groups are clusters of `cluster` consecutive sites: a page lands in each of its group's blocks.
    dims = f" __cluster_dims__({k.cluster}, 1, 1)" if mc is not None else ""
    w.line(f'extern "C" __global__ __launch_bounds__(NTHREAD, 1){dims} void {KERNEL_NAME}({params})')
    with w.block():
        site_prologue(w)
        w.line("extern __shared__ __align__(1024) char spatialc_dyn_smem[];")
        w.line("spatialc_check_stage_base(spatialc_dyn_smem);")
        general.declare_rings(k, w)
        if hk.chunk:
            w.line(
                f"SPATIALC_DYNAMIC_RING(OUT_T, out_stage, spatialc_dyn_smem, SMEM_OFF_OUT_STAGE, {STAGING_BOXES}, "
                f"OUT_CHUNK * {TILE_ELEMS});  // each consumer warp's {STORE_BUFFERS} output boxes"
            )
        for r in mc.rings if mc is not None else ():
            w.line(
                f"SPATIALC_DYNAMIC_RING(unsigned long long, ready_{r}, spatialc_dyn_smem, SMEM_OFF_READY_{r}, "
                f"DEPTH_{r}, 1);"
            )
        with w.block("if (tid == 0)"):
            general.init_barriers(k, w)
            for r in mc.rings if mc is not None else ():
                with w.block(f"for (unsigned s = 0; s < DEPTH_{r}; ++s)", "// a stage free in every receiver"):
                    w.line(f"spatialc_mbar_init(&ready_{r}[s], READY_COUNT_{r});")
            w.line("spatialc_fence_barrier_init();  // the initialised barriers, before any other thread's use")
            w.line("spatialc_fence_proxy_async();  // and before the copy engine's transaction counts on them")
        w.line("__syncthreads();")
        if mc is not None:
            w.line("spatialc_cluster_sync();  // and before a peer block arrives on them or multicasts into this one")
        consumers = CONSUMER_GROUPS * WARPGROUP
        with w.block(f"if (warp >= {consumers})", "// the producer warpgroup"):
            w.line(f"spatialc_regs_dec<{PRODUCER_REGS}>();")
            for i, role in enumerate(k.roles[1:]):
                with w.block(f"{'if' if i == 0 else 'else if'} (warp == {role.first_warp})", f"// {role.engine.value}"):
                    _engine(hk, role, w)
        with w.block("else", f"// {k.roles[0].engine.value}: the consumer warpgroups"):
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
    printer = HopperPrinter(hk, role, w)
    printer.tensors = {int(t.id): t for t in k.program.tensors}
    printer.counters()
    stores = hk.chunk and role is k.roles[0]  # the consumers' fused store, through the staging boxes
    if stores and hk.odd_turns:
        w.line("unsigned boxes_out = 0;  // output boxes this warp has staged (its boxes are used in turn)")
    if any(isinstance(op, AcquireAcc) for op in role.walk()):
        w.line(f"spatialc_acc<ACCT> accf[{hk.n // 16}];")
    single = any(isinstance(op, ReadTiles) for op in role.walk())
    if single:
        printer.nthreads = "1"

    def body(ops: tuple[ChoreoOp, ...]) -> None:
        printer.sends = frozenset(k.rings.template[op.buf] for op in walk(ops) if isinstance(op, McastSend))
        if single:
            with w.block("if (etid == 0)", "// the copy engine moves the pages; one thread issues"):
                for m in hk.maps:  # every map this block's copies use (the loads' and the store's)
                    w.line(f"spatialc_prefetch_tensormap(&spatialc_tmap_{m.index});")
                general._program(printer, ops)
        else:
            general._program(printer, ops)
        assert not printer.deferred, "a sender's load with no send"
        assert not printer.arrived, "an arrival made with a load's expect_tx and no Push after it"

    general.by_class(k, role, w, body)
    if stores:
        # The shared memory a store reads must outlive its reading: the warp's last stores, before it ends.
        last = "if ((threadIdx.x & 31) == 0) { spatialc_bulk_wait_read<0>(); }"
        w.line(f"{last}  // the last boxes' stores have read them")


def budget_of(hk: HopperKernel, target: SpatialTarget) -> Budget:
    k = hk.base
    bud = general.budget_of(k, target)
    return dataclasses.replace(
        bud,
        staging_bytes=staging_bytes(hk.chunk, k.out_type),
        smem_bytes=sum(r.bytes for r in k.rings.rings.values()),
        dynamic_opt_in=k.dyn_bytes > target.smem_static_max,
        regs_est=CONSUMER_REGS,
        blocks_per_sm=1,
        threads=hk.threads,
        form="sm90a",
    )


def lower(program: SpatialProgram, target: SpatialTarget) -> CudaArtifact:
    """The sm_90a CUDA artifact of a verified program, or a typed error saying what the form cannot print."""
    hk = make_kernel(program, target)
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
        1,
        fixed=clustered or len(k.classes) > 1,
        cluster=k.cluster if clustered else 1,
    )
    # The operands the copy engine loads are stored as matrices (row-major, or transposed), not tiled.
    params = tuple(
        dataclasses.replace(param, order=hk.stored[i]) if i in hk.stored else param
        for i, param in enumerate(launch.params)
    )
    launch = dataclasses.replace(launch, params=params, tensor_maps=hk.maps)
    programs = tuple(ops for role in k.roles for ops in general.printed(role))
    return assemble(program, target.name, kernel_text(hk), programs, launch, budget_of(hk, target))

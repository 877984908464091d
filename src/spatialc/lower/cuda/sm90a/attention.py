"""Attention in the sm_90a form: the general form's attention engines (`passes/attention.py`'s schedule, its
recurrence's rings in the compute warps' registers: `common/registers.py`) with Hopper's data path.

- The reader is one thread of the producer warpgroup: Q's band once an item (and head), K's and V's blocks into
  their rings of `plan.depth` stages, each page one TMA box a 128-byte panel (`tma.py`), announced on the slot's
  full barrier with one `arrive.expect_tx` of the page's bytes. Q, K and V are stored as row-major matrices, a head
  after another.
- The compute engine is one consumer warpgroup holding a band of 64 query rows (warp w: rows 16w …, in wgmma's
  accumulator layout, which is `spatialc_acc`'s m16n8 layout — so the register path's fragments are wgmma's).
  S = Q·Kᵀ is a wgmma per 16 of head_dim with both operands read from shared memory, K-major: Q as a GEMM's A, K's
  rows (S's columns) as B with imm-trans-b 0 (`spatialc_wgmma_kb`). O += P·V is a wgmma per 16 keys with A from
  registers — P's fragments packed to the operand type, `spatialc_load_a_acc`, mma.m16n8k16's A layout, which is
  wgmma's register A — and V from shared memory MN-major, imm-trans-b 1 (`spatialc_wgmma_rs`). Each matmul's group
  is waited for before the op after it: the stage it read goes back to the producer (one arrival a warp), and the
  softmax reads S, when it has retired.
- Everything between the two matmuls — the mask, the scale, the running max and sum, α, the rescale of l and O,
  P — and the epilogue's values O / l, LSE = m + log l are the register path's printers, the general form's own.
- The epilogue leaves from the consumers' registers; O's and LSE's pages and the writer's work are gone (`epilogue`):
  O = acc / l is computed element by element into the warpgroup's swizzled staging box (16-bit O by stmatrix) and
  goes out by one fence, one named barrier and one TMA store a box — the GEMM's store of C (`staging.py`), O stored
  as a row-major matrix (each head's rows padded to whole bands). The boxes are a region of their own, not Q's
  stage: shared memory is not what binds one warpgroup (176 KB at head_dim 256), and Q's stage reused would hold
  the next item's Q until the last box had been read. LSE (64 floats an item) is stored by the lanes, each its rows'
  four columns of the tiled page.

- The KV loop overlaps each block's softmax with the next block's S where ptxas fits the second set of S registers
  (`overlap.py`, the schedule "overlapped"); "serial" waits for each matmul before the op after it; "pingpong"
  (`pingpong.py`, the default for two consumer warpgroups) is FlashAttention-3's: the two warpgroups issue their
  matmuls in turns, ordered by two named barriers, each softmax running under the other warpgroup's matmuls.

- A forced block of 8 query tile rows makes bands of 128 rows: two consumer warpgroups, 64 rows each (Q's descriptor
  starting at the warpgroup's 64 rows of the band's page), K's and V's stages shared and freed once both have read
  them (one arrival a warp), setmaxnreg giving them the producer's registers, each its own staging boxes. The
  planner does not choose them (nothing has timed them yet).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ....ir.ids import BufferId, LoopVar
from ....ir.nodes import Plan, SpatialProgram, TensorRole
from ....ir.ops import AcquireAcc, ChoreoOp, Compute, Loop, Map, MatmulTiles, Pop, Push, ReadTiles, WriteTiles, walk
from ....target import WARP, SpatialTarget
from ...artifact import TensorMap
from ...census import marker, stage_kind
from ...errors import Unsupported
from ..common import epilogue
from ..common.cwriter import addr_expr, c_mul, c_sum
from ..common.program import other_outputs
from ..common.rings import TILE_ELEMS, Ring
from ..general import kernel as general
from . import staging
from .overlap import (
    OVERLAP_HEAD_DIM_MAX,
    OVERLAPPED,
    PINGPONG,
    SCHEDULES,
    SERIAL,
    kv_loops,
    kv_step,
    least_trip,
    overlapped_loop,
)
from .pingpong import first_turn, pingpong_loop
from .plan import (
    BARRIER_ALIGN,
    STAGE_ALIGN,
    WARPGROUP,
    WARPGROUP_ROWS,
    WGMMA_N_MAX,
    Warpgroups,
    box_swizzle,
    staging_bytes,
    store_chunk,
)
from .printer import DESC_SWIZZLE, HopperPrinter
from .tma import Panels, param_at, tensor_maps

if TYPE_CHECKING:
    from ..cwriter import Writer
    from .kernel import HopperKernel


def attention_warpgroups(plan: Plan) -> Warpgroups:
    """The consumer warpgroups of a band: one of 64 query rows (the planner's bands; the SM's registers its alone),
    or two of 128 (a forced block of 8 query tile rows: setmaxnreg moves the producer's registers to them)."""
    return Warpgroups(plan.block.osh * 16 // WARPGROUP_ROWS, 1)


def check_attention_plan(plan: Plan) -> None:
    """The bands and blocks the form takes: 64 or 128 query rows (one or two consumer warpgroups), blocks of keys and
    head_dim each at most one wgmma wide."""
    bh, dt, bw = plan.block.osh, plan.block.osw, plan.block.ibw
    if bh * 16 not in (WARPGROUP_ROWS, 2 * WARPGROUP_ROWS):
        raise Unsupported(
            f"attention bands of {bh * 16} query rows",
            f"the sm_90a form's consumer warpgroups hold {WARPGROUP_ROWS} each, one or two: use a block of 4 or 8"
            " query tile rows",
        )
    for what, tiles in (("blocks of keys", bw), ("head_dim", dt)):
        if tiles * 16 > WGMMA_N_MAX:
            raise Unsupported(f"{what} of {tiles * 16}", f"one wgmma is at most {WGMMA_N_MAX} columns wide")


def make_attention_kernel(p: SpatialProgram, target: SpatialTarget, schedule: str | None = None) -> HopperKernel:
    """The general form's attention kernel re-laid-out for sm_90a: Q, K and V landed by the copy engine in panels,
    one consumer warpgroup; its KV loop as `schedule` says (`overlap.SCHEDULES`; None: overlapped where its registers
    fit, `OVERLAP_HEAD_DIM_MAX`, and the plan's K and V have two stages)."""
    from .checks import check_resources
    from .kernel import HopperKernel

    if schedule is not None and schedule not in SCHEDULES:
        raise Unsupported(f"the attention schedule {schedule!r}", f"it is one of {', '.join(SCHEDULES)}")

    check_attention_plan(p.plans[0])
    wg = attention_warpgroups(p.plans[0])
    lanes = dataclasses.replace(target, accumulator_lanes=WARPGROUP * wg.consumers)
    k = general.make_kernel(p, lanes, fit=False)  # its shared memory is laid out again below, and checked then
    compute, *side = k.roles
    if compute.warps != WARPGROUP * wg.consumers or compute.first_warp != 0 or not k.in_registers:
        raise Unsupported(
            f"an attention compute engine on {compute.warps} warps, its recurrence in shared memory",
            "the sm_90a form's consumer warpgroups hold the band's rows, 64 each, its recurrence in registers",
        )
    if sum(r.warps for r in side) > WARPGROUP:
        raise Unsupported(f"{len(side)} engines beside the compute engine", "they share one producer warpgroup")
    reader = [op for r in side for op in r.walk() if isinstance(op, ReadTiles)]
    maps, filled, panels, stored = tensor_maps(p, k.rings, reader)
    # O and LSE leave shared memory: the consumers store them from their registers (`AttentionPrinter.epilogue`).
    o_store, lse_store = written(p, side)
    out = (k.rings.template[o_store.src], k.rings.template[lse_store.src])
    rings = dataclasses.replace(k.rings, rings={r: v for r, v in k.rings.rings.items() if r not in out}, fused=out)
    k = dataclasses.replace(
        k,
        rings=rings,
        full_count={r: n for r, n in k.full_count.items() if r not in out},
        empty_count={r: n for r, n in k.empty_count.items() if r not in out},
    )
    offsets, dyn, barrier_bytes = general.layout(k.rings.rings, STAGE_ALIGN, BARRIER_ALIGN)
    # O goes out through the consumer warpgroup's two swizzled staging boxes, a TMA store a box (`staging.py`).
    dim_tiles = k.plan.block.osw  # O's columns: head_dim
    chunk = store_chunk(dim_tiles, k.out_type)
    offsets["out_stage"] = -(-dyn // STAGE_ALIGN) * STAGE_ALIGN
    dyn = offsets["out_stage"] + staging_bytes(chunk, k.out_type, wg)
    o_at = param_at(p, o_store.tensor)
    maps = (*maps, TensorMap(len(maps), o_at, (WARPGROUP_ROWS, chunk * 16), box_swizzle(chunk, k.out_type)))
    stored = {**stored, o_at: "rows"}
    # Q's, K's and V's stages are read by the consumers' wgmma alone and freed once a warp's wait_group returns.
    template = k.rings.template
    popped = {template[op.buf] for op in compute.walk() if isinstance(op, Pop)}
    warp_freed = frozenset(set(filled) & popped)
    base = dataclasses.replace(
        k,
        full_count={r: (1 if r in filled else n) for r, n in k.full_count.items()},
        empty_count={r: (n // WARP if r in warp_freed else n) for r, n in k.empty_count.items()},
        lane_grid=(WARPGROUP * wg.consumers, 1),  # each consumer warp a tile row of O, as the staged store takes it
        perw=dim_tiles,
        offsets=offsets,
        dyn_bytes=dyn,
        barrier_bytes=barrier_bytes,
        blocks_per_sm=wg.blocks,
    )
    plan = k.plan
    widths = ((plan.block.ibw * 16, "kb"), (plan.block.osw * 16, "rs"))
    hk = HopperKernel(
        base,
        maps,
        filled,
        wg,
        dim_tiles * 16,
        store=o_store,
        chunk=chunk,
        panels=panels,
        stored=stored,
        warp_freed=warp_freed,
    )
    if schedule == OVERLAPPED and dim_tiles * 16 > OVERLAP_HEAD_DIM_MAX:
        raise Unsupported(
            f"the overlapped attention schedule at head_dim {dim_tiles * 16}",
            f"its second set of S registers spills past 255 a thread above head_dim {OVERLAP_HEAD_DIM_MAX}: lower"
            " with schedule='serial'",
        )
    if schedule == PINGPONG and dim_tiles * 16 > OVERLAP_HEAD_DIM_MAX:
        raise Unsupported(
            f"the ping-pong attention schedule at head_dim {dim_tiles * 16}",
            f"ptxas spills its registers above head_dim {OVERLAP_HEAD_DIM_MAX} (8 bytes a thread at 256, where the"
            " serial schedule spills none): lower with schedule='serial'",
        )
    if schedule == PINGPONG and wg.consumers != 2:
        raise Unsupported(
            f"the ping-pong attention schedule with {wg.consumers} consumer warpgroup",
            "it alternates two warpgroups' matmuls: force bands of 128 rows (a block of 8 query tile rows), or lower"
            " with schedule='overlapped'",
        )
    loops = [loop for ops in compute.programs for loop in kv_loops(ops)]
    if schedule in (OVERLAPPED, PINGPONG) and any(least_trip(loop) < 1 for loop in loops):
        raise Unsupported(
            f"the {schedule} attention schedule where an item may run no KV block",
            "its first S is issued before the loop: lower with schedule='serial'",
        )
    if schedule is None:
        schedule = default_schedule(wg, dim_tiles * 16, k.plan.depth, loops)
    hk = dataclasses.replace(hk, wgmmas=widths, schedule=schedule)
    check_resources(hk, target)
    return hk


def default_schedule(wg: Warpgroups, head_dim: int, depth: int, loops: list[Loop]) -> str:
    """The KV loop's schedule where none is asked for: where the registers fit (`OVERLAP_HEAD_DIM_MAX`), K and V
    have two stages and every item runs a step, the ping-pong for two consumer warpgroups (what FlashAttention-3
    gives its two: with the warp schedulers left to interleave them the two softmaxes contend with each other and
    the tensor cores wait; in turns each softmax runs under the other's matmuls) and the overlapped one for one;
    else the serial one."""
    fits = head_dim <= OVERLAP_HEAD_DIM_MAX and depth >= 2 and all(least_trip(loop) >= 1 for loop in loops)
    if not fits:
        return SERIAL
    return PINGPONG if wg.consumers == 2 else OVERLAPPED


def written(p: SpatialProgram, side: list[general.Role]) -> tuple[WriteTiles, WriteTiles]:
    """The writer's stores of O and of LSE (the program's two outputs, in that order), which the consumers make."""
    stores = {op.tensor: op for r in side for op in r.walk() if isinstance(op, WriteTiles)}
    outs = [t.id for t in p.tensors if t.role == TensorRole.OUTPUT]
    if len(outs) != 2 or set(stores) != set(outs):
        raise Unsupported(f"attention writing {len(stores)} of {len(outs)} outputs", "its writer stores O and LSE")
    o, lse = (stores[t] for t in outs)
    if not staged_page(p, o):
        raise Unsupported("O's pages off its tile grid's rows", "a TMA store box is a rectangle of whole tiles")
    return o, lse


def staged_page(p: SpatialProgram, store: WriteTiles) -> bool:
    """Whether `store`'s page is a box of its tensor's row-major tile grid (a grouped tensor's groups each padded
    to whole bands, as attention's are: a band never straddles two)."""
    t = p.tensor(store.tensor)
    return (store.stride_h, store.stride_w) == (t.tiles[1], 1)


class AttentionPrinter(HopperPrinter):
    """The sm_90a engine printer with attention's two matmuls as wgmma: S from shared memory (K-major B), P·V with
    P from registers. Every other op of the recurrence is the register path's (`register_op`)."""

    overlapping = False  # printing the overlapped KV loop (`overlap.py`): each matmul only committed, not waited for

    def pipelined(self, loop: Loop) -> bool:
        return False  # (the GEMM's K loop; attention's KV loop is `overlap.py`'s)

    def op(self, op: ChoreoOp, env: dict[LoopVar, str]) -> None:
        mark = marker(op)
        match op:
            case Loop() if self.hk.schedule in (OVERLAPPED, PINGPONG) and (step := kv_step(op)) is not None:
                self.overlapping = True
                (pingpong_loop if self.hk.schedule == PINGPONG else overlapped_loop)(self, op, step, env, mark)
                self.overlapping = False
            case Compute(op=MatmulTiles() as mm, ins=(a, b), acc=acc) if acc is not None and self.held(a):
                self.wgmma_rs(mm, a, self.kept(b), acc, mark)
            case Compute(op=MatmulTiles() as mm, ins=(a, b), acc=acc) if acc is not None:
                self.wgmma_kb(mm, self.kept(a), self.kept(b), acc, mark)
            case Compute(op=Map() as m, ins=ins, outs=(dst,)) if self.k.rings.is_fused(dst):
                self.epilogue(m, ins, dst, env, mark)
            case Push(buf) if self.k.rings.is_fused(buf):
                self.w.line("", f"{mark} (stored from registers: no ring)")
            case _ if self.register_op(op, env, mark):
                pass
            case _:
                super().op(op, env)

    def epilogue(self, m: Map, ins: tuple[BufferId, ...], dst: BufferId, env: dict[LoopVar, str], mark: str) -> None:
        """The map that makes O (O = acc / l) or LSE (m + log l), stored from the consumers' registers: O through
        the warpgroup's swizzled staging boxes and a TMA store a box (`staging.swizzled_store`, the GEMM's store of
        C), each element computed where it is staged; LSE by the lanes themselves, each its rows' four columns of
        the tiled page (a row's value in each of its 16), as the writer stored the page."""
        rings = self.k.rings
        if rings.template[dst] == rings.fused[0]:
            assert self.hk.store is not None
            f = self.frags_of(next(b for b in ins if self.k.in_registers[rings.template[b]] is not None))

            def no_pos(node: object) -> str:
                raise Unsupported("a position in attention's final map", "O / l places no element")

            def value(i: str) -> str:
                e = i if i.isidentifier() else f"({i})"
                return self.fragment_value(m, ins, f, epilogue.value, no_pos, e)

            self.w.line(f"// {stage_kind(m)}: each element computed where it is staged", mark)
            staging.swizzled_store(self, self.hk.store, env, marker(self.hk.store), [], value, str(f.count))
            return
        store = next(
            op
            for r in self.k.roles[1:]
            for op in r.walk()
            if isinstance(op, WriteTiles) and rings.template[op.src] == rings.template[dst]
        )
        ty = self.out_types.get(int(store.tensor), "OUT_T")
        with self.w.block("", mark):
            self.w.line(f"{ty}* const lse = t{int(store.tensor)};  // (t4 is the lane's place in its quad below)")
            self.lane_place()
            base = f"const long long base = (long long)({addr_expr(store.at, env)});"
            self.w.line(base, f"{marker(store)} (the lanes' own rows, from registers)")
            with self.unrolled("for (int s = 0; s < RROWS; ++s)"):
                self.w.line(f"const float v = {self.row_value(m, ins, epilogue.value)};")
                self.w.line(f"const int row = {self.vector_row()};")
                self.w.line(f"const long long tile = {c_sum('base', c_mul('(long long)(row / 16)', store.stride_h))};")
                with self.unrolled("for (int c = 0; c < 4; ++c)"):
                    at = f"tile * {TILE_ELEMS} + (row % 16) * 16 + 4 * t4 + c"
                    self.w.line(f"SPATIALC_OUT_ST(&lse[{at}], ({ty})v);")

    def acc_of(self, acc: BufferId, n: int):
        """The fragments of accumulator `acc`, which must be one wgmma's of width `n`: the warp's one tile row."""
        f = self.k.layers[self.k.rings.template[acc]]
        if f.lane_grid != (self.hk.wg.consumers * WARPGROUP, 1) or f.perw != n // 16:
            raise Unsupported(f"an accumulator of {f.perw} tiles a warp", f"a wgmma of {n} columns writes {n // 16}")
        return f

    def retire(self, name: str) -> None:
        """Commit the group and wait for it: the stages it read may go back, its accumulators be read (overlapped:
        commit it only; the loop waits)."""
        self.w.line("spatialc_wgmma_commit();")
        if self.overlapping:
            return
        self.w.line("spatialc_wgmma_wait<0>();  // retired: its stage may go back, its accumulators be read")
        self.w.line(f"spatialc_acc_fence({name});  // nothing reads them before the wait")

    def wgmma_kb(self, mm: MatmulTiles, a: Ring, b: Ring, acc: BufferId, mark: str) -> None:
        """S = Q·Kᵀ: a wgmma per 16 of head_dim, Q's 64 rows and K's rows (S's columns) both K-major panels."""
        if not mm.transpose_b:
            raise Unsupported("an attention matmul of pages with B as stored", "Q·Kᵀ reads K's rows as B's columns")
        n = mm.block.osw * 16
        f = self.acc_of(acc, n)
        pa, pb = self.panels(a), self.panels(b)
        kb = "(kk * 16 * (int)sizeof(OPT))"  # the instruction's first byte of K

        def k_major(ring: Ring, pan: Panels, band: str = "") -> str:
            page = f"(const char*)({self.read_page(ring.id)})"
            at = f"{page} + ({kb} / {pan.width}) * {pan.bytes} + {kb} % {pan.width}{band}"
            return f"spatialc_wgmma_desc({at}, 16u, {8 * pan.width}u, {DESC_SWIZZLE[pan.width]}u)"

        band = f" + (warp / {WARPGROUP}) * {WARPGROUP_ROWS * pa.width}" if self.hk.wg.consumers > 1 else ""
        with self.w.block("", mark):
            self.w.line(f"spatialc_acc_fence({f.name});  // their zeroing stays before the fence")
            self.w.line("spatialc_wgmma_fence();")
            with self.unrolled(f"for (int kk = 0; kk < {mm.block.ibw}; ++kk)"):
                self.w.line(f"spatialc_wgmma_kb<{n}, OPT>({f.name}, {k_major(a, pa, band)}, {k_major(b, pb)});")
            self.retire(f.name)

    def wgmma_rs(self, mm: MatmulTiles, a: BufferId, b: Ring, acc: BufferId, mark: str) -> None:
        """O += P·V: a wgmma per 16 keys, A the warp's P fragments of those keys packed to the operand type in
        registers (held until the group retires), V's page MN-major: its 16 key rows panel rows, the next 8 rows
        8 panel rows on, the next panel of head_dim a panel on."""
        n, keys = mm.block.osw * 16, mm.block.ibw
        f = self.acc_of(acc, n)
        fa = self.frags_of(a)
        if fa.lane_grid != (self.hk.wg.consumers * WARPGROUP, 1) or fa.perw != keys:
            raise Unsupported(f"P in {fa.perw} fragments a warp", f"its K is the block's {keys} key tiles")
        pb = self.panels(b)
        page = f"(const char*)({self.read_page(b.id)})"
        desc = f"spatialc_wgmma_desc({page} + kk * 16 * {pb.width}, {pb.bytes}u, {8 * pb.width}u, "
        desc += f"{DESC_SWIZZLE[pb.width]}u)"
        with self.w.block("", mark):
            if not self.overlapping:  # (else declared before the loop: held into the next step)
                self.w.line(f"spatialc_frag<OPT> af[{keys}];  // P of each 16 keys, wgmma's A: held until it retires")
            with self.unrolled(f"for (int kk = 0; kk < {keys}; ++kk)"):
                self.w.line(f"spatialc_load_a_acc(af[kk], {self.rr(a)} + kk * 8);")
                self.w.line("spatialc_frag_fence(af[kk]);")
            self.w.line(f"spatialc_acc_fence({f.name});  // their rescale stays before the fence")
            self.w.line("spatialc_wgmma_fence();")
            with self.unrolled(f"for (int kk = 0; kk < {keys}; ++kk)"):
                self.w.line(f"spatialc_wgmma_rs<{n}, OPT>({f.name}, af[kk], {desc});")
            self.retire(f.name)

    def panels(self, ring: Ring) -> Panels:
        pan = self.hk.panels[ring.id]
        if not isinstance(pan, Panels) or pan.transposed:
            raise Unsupported(f"{ring.name}'s pages", "attention's operands are row-major panels")
        return pan


def declare(printer: AttentionPrinter, w: Writer) -> None:
    """The compute engine's fragments, row accumulators and register rings (the general form's `_engine`'s)."""
    k = printer.k
    printer.out_types = other_outputs(k.program, k.out_type)
    if not any(isinstance(op, AcquireAcc) for op in walk(printer.role.programs[0])):
        return
    for f in k.fragments:
        w.line(f"spatialc_acc<ACCT> {f.name}[{f.count}];")
    for t in sorted(k.rows.reductions if k.rows is not None else ()):
        w.line(f"float racc_{t}[RROWS];  // the lane's share of each of the warp's rows")
    printer.declare_registers()
    if printer.hk.schedule == PINGPONG:
        w.line(first_turn() + "  // the first turn is warpgroup 0's (`pingpong.py`)")

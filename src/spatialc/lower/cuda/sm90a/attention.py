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
  P — and the epilogue O / l, LSE = m + log l are the register path's printers, the general form's own; the writer
  is the general form's, O and LSE from their pages.

What it does not do (yet): a second consumer warpgroup (FlashAttention-3's 128-row bands and ping-pong between two
warpgroups on named barriers), the overlap of one block's softmax with the next block's S inside a warpgroup, and a
TMA store of O. A block holds one warpgroup of 64 rows and the SM one block (its registers: the general form's
246 a thread at head_dim 128), so the tensor cores wait while the softmax runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ....ir.ids import BufferId, LoopVar
from ....ir.nodes import Plan, SpatialProgram
from ....ir.ops import AcquireAcc, ChoreoOp, Compute, Loop, MatmulTiles, Pop, ReadTiles, walk
from ....target import WARP, SpatialTarget
from ...census import marker
from ...errors import Unsupported
from ..common.program import other_outputs
from ..common.rings import Ring
from ..general import kernel as general
from .plan import BARRIER_ALIGN, STAGE_ALIGN, WARPGROUP, WARPGROUP_ROWS, WGMMA_N_MAX, Warpgroups
from .printer import DESC_SWIZZLE, HopperPrinter
from .tma import Panels, tensor_maps

if TYPE_CHECKING:
    from ..cwriter import Writer
    from .kernel import HopperKernel

ONE_WARPGROUP = Warpgroups(1, 1)  # one consumer warpgroup and the producer's, the SM's registers alone


def check_attention_plan(plan: Plan) -> None:
    """The bands and blocks the form takes: 64 query rows (one consumer warpgroup), blocks of keys and head_dim
    each at most one wgmma wide."""
    bh, dt, bw = plan.block.osh, plan.block.osw, plan.block.ibw
    if bh * 16 != WARPGROUP_ROWS:
        raise Unsupported(
            f"attention bands of {bh * 16} query rows",
            f"the sm_90a form's one consumer warpgroup holds {WARPGROUP_ROWS}: use a block of 4 query tile rows",
        )
    for what, tiles in (("blocks of keys", bw), ("head_dim", dt)):
        if tiles * 16 > WGMMA_N_MAX:
            raise Unsupported(f"{what} of {tiles * 16}", f"one wgmma is at most {WGMMA_N_MAX} columns wide")


def make_attention_kernel(p: SpatialProgram, target: SpatialTarget) -> HopperKernel:
    """The general form's attention kernel re-laid-out for sm_90a: Q, K and V landed by the copy engine in panels,
    one consumer warpgroup."""
    from .kernel import HopperKernel, check_resources

    check_attention_plan(p.plans[0])
    lanes = dataclasses.replace(target, accumulator_lanes=WARPGROUP)
    k = general.make_kernel(p, lanes, fit=False)  # its shared memory is laid out again below, and checked then
    compute, *side = k.roles
    if compute.warps != WARPGROUP or compute.first_warp != 0 or not k.in_registers:
        raise Unsupported(
            f"an attention compute engine on {compute.warps} warps, its recurrence in shared memory",
            "the sm_90a form's consumer warpgroup holds the band's 64 rows, its recurrence in registers",
        )
    if sum(r.warps for r in side) > WARPGROUP:
        raise Unsupported(f"{len(side)} engines beside the compute engine", "they share one producer warpgroup")
    reader = [op for r in side for op in r.walk() if isinstance(op, ReadTiles)]
    maps, filled, panels, stored = tensor_maps(p, k.rings, reader)
    offsets, dyn, barrier_bytes = general.layout(k.rings.rings, STAGE_ALIGN, BARRIER_ALIGN)
    # Q's, K's and V's stages are read by the consumers' wgmma alone and freed once a warp's wait_group returns.
    template = k.rings.template
    popped = {template[op.buf] for op in compute.walk() if isinstance(op, Pop)}
    warp_freed = frozenset(set(filled) & popped)
    base = dataclasses.replace(
        k,
        full_count={r: (1 if r in filled else n) for r, n in k.full_count.items()},
        empty_count={r: (n // WARP if r in warp_freed else n) for r, n in k.empty_count.items()},
        offsets=offsets,
        dyn_bytes=dyn,
        barrier_bytes=barrier_bytes,
        blocks_per_sm=ONE_WARPGROUP.blocks,
    )
    plan = k.plan
    widths = ((plan.block.ibw * 16, "kb"), (plan.block.osw * 16, "rs"))
    hk = HopperKernel(base, maps, filled, ONE_WARPGROUP, 0, panels=panels, stored=stored, warp_freed=warp_freed)
    hk = dataclasses.replace(hk, wgmmas=widths)
    check_resources(hk, target)
    return hk


class AttentionPrinter(HopperPrinter):
    """The sm_90a engine printer with attention's two matmuls as wgmma: S from shared memory (K-major B), P·V with
    P from registers. Every other op of the recurrence is the register path's (`register_op`)."""

    def pipelined(self, loop: Loop) -> bool:
        return False  # each matmul waits for its own group: the softmax reads S, and P's registers are V's A

    def op(self, op: ChoreoOp, env: dict[LoopVar, str]) -> None:
        mark = marker(op)
        match op:
            case Compute(op=MatmulTiles() as mm, ins=(a, b), acc=acc) if acc is not None and self.held(a):
                self.wgmma_rs(mm, a, self.kept(b), acc, mark)
            case Compute(op=MatmulTiles() as mm, ins=(a, b), acc=acc) if acc is not None:
                self.wgmma_kb(mm, self.kept(a), self.kept(b), acc, mark)
            case _ if self.register_op(op, env, mark):
                pass
            case _:
                super().op(op, env)

    def acc_of(self, acc: BufferId, n: int):
        """The fragments of accumulator `acc`, which must be one wgmma's of width `n`: the warp's one tile row."""
        f = self.k.layers[self.k.rings.template[acc]]
        if f.lane_grid != (WARPGROUP, 1) or f.perw != n // 16:
            raise Unsupported(f"an accumulator of {f.perw} tiles a warp", f"a wgmma of {n} columns writes {n // 16}")
        return f

    def retire(self, name: str) -> None:
        """Commit the group and wait for it: the stages it read may go back, its accumulators be read."""
        self.w.line("spatialc_wgmma_commit();")
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

        def k_major(ring: Ring, pan: Panels) -> str:
            page = f"(const char*)({self.read_page(ring.id)})"
            at = f"{page} + ({kb} / {pan.width}) * {pan.bytes} + {kb} % {pan.width}"
            return f"spatialc_wgmma_desc({at}, 16u, {8 * pan.width}u, {DESC_SWIZZLE[pan.width]}u)"

        with self.w.block("", mark):
            self.w.line(f"spatialc_acc_fence({f.name});  // their zeroing stays before the fence")
            self.w.line("spatialc_wgmma_fence();")
            with self.unrolled(f"for (int kk = 0; kk < {mm.block.ibw}; ++kk)"):
                self.w.line(f"spatialc_wgmma_kb<{n}, OPT>({f.name}, {k_major(a, pa)}, {k_major(b, pb)});")
            self.retire(f.name)

    def wgmma_rs(self, mm: MatmulTiles, a: BufferId, b: Ring, acc: BufferId, mark: str) -> None:
        """O += P·V: a wgmma per 16 keys, A the warp's P fragments of those keys packed to the operand type in
        registers (held until the group retires), V's page MN-major: its 16 key rows panel rows, the next 8 rows
        8 panel rows on, the next panel of head_dim a panel on."""
        n, keys = mm.block.osw * 16, mm.block.ibw
        f = self.acc_of(acc, n)
        fa = self.frags_of(a)
        if fa.lane_grid != (WARPGROUP, 1) or fa.perw != keys:
            raise Unsupported(f"P in {fa.perw} fragments a warp", f"its K is the block's {keys} key tiles")
        pb = self.panels(b)
        page = f"(const char*)({self.read_page(b.id)})"
        desc = f"spatialc_wgmma_desc({page} + kk * 16 * {pb.width}, {pb.bytes}u, {8 * pb.width}u, "
        desc += f"{DESC_SWIZZLE[pb.width]}u)"
        with self.w.block("", mark):
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

"""Print the persistent kernel: its preamble, the work list, and one small printer per choreography op.

Each op's image starts with a line ending in its census marker (`spatialc.lower.census`). Every name the kernel
uses follows from ids and loop variables, so the same program always prints the same text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LoopVar, loop_var_name
from ....ir.names import plain
from ....ir.nodes import Plan, SpatialProgram, TensorRole
from ....ir.ops import (
    Compute,
    Dequant,
    PackAcc,
    Pop,
    Push,
    Reserve,
    Wait,
    WriteTiles,
)
from ....ir.printer import compute_text
from ....numerics.blockscale import is_mx
from ...census import OP, PAD, PRE, marker
from ...errors import Unsupported
from ..common import epilogue
from ..common.blockscale import mx_lines
from ..common.cols import ColAccumulators, ColPrinter
from ..common.cwriter import (
    CHECK_MACRO,
    PAGE_MACROS,
    RING_MACROS,
    STORE_MACRO,
    Writer,
    includes,
    inlined_lines,
    site_prologue,
)
from ..common.dequant import DequantPrinter, InRegisters, has_dequant
from ..common.maps import MapPrinter
from ..common.rings import MmaTypes, Rings
from ..common.rows import RowAccumulators, RowPrinter
from ..common.tiles import TilePrinter, tensor_core_lines
from .merge import SerialLoop, SerialOp
from .order import Rotation, SmemLayout, barrier_free_pops, commits, rotation

KERNEL_NAME = "spatialc_persistent"
POP_PROOF = "these slots are refilled only after the next wait barrier"


@dataclass(frozen=True, slots=True)
class Kernel:
    """Everything the printers read, decided and proved before a line is printed."""

    program: SpatialProgram
    plan: Plan
    types: MmaTypes
    out_type: str  # OUT_T, the output tensor's element type
    param_types: tuple[str, ...]  # each tensor's pointee type, in tensor-id order
    rings: Rings
    smem: SmemLayout
    lane_grid: tuple[int, int] | None
    lanes: int
    perw: int
    blocks_per_sm: int
    items: tuple[tuple[int, ...], ...]  # each site's items, in blockIdx order
    integer: bool  # the epilogue's arithmetic: exact int64 (int8 programs) or float32
    has_epilogue: bool  # elementwise stages are fused into the store (their helpers are printed)
    # A program without a tile matmul (a map program, a row program): its block moves and maps pages and holds no
    # fragments; a row program's row accumulators are `rows` (rows.py).
    pages: bool = False
    rows: RowAccumulators | None = None
    cols: ColAccumulators | None = None  # a column program's column accumulators (cols.py)
    # A W4A16 GEMM's B rings its dequant in registers does without (kernel.in_registers): never declared.
    registers: frozenset[int] = frozenset()

    @property
    def item_tiles(self) -> tuple[int, int]:
        """Output tiles of one item: (sh·osh, sw·osw)."""
        return self.plan.item_tiles


class OpPrinter(DequantPrinter, TilePrinter):
    """Prints a serial program's ops into a Writer; one method per op kind (a W4A16 GEMM's B fragments dequantised
    in registers by the general form's printer of them, `DequantPrinter`)."""

    def __init__(self, k: Kernel, w: Writer, free_pops: frozenset[int] = frozenset()):
        super().__init__(k.plan, k.rings, k.lane_grid, w)
        self.k = k
        self.integer = k.integer
        self.tensors = {int(t.id): t for t in k.program.tensors}  # (a block-scaled step reads its scale tensors)
        # Outputs stored as a C type of their own (a row program's vectors beside its out): their `param_types`.
        self.out_types = {
            int(t.id): ty
            for t, ty in zip(k.program.tensors, k.param_types, strict=True)
            if t.role == TensorRole.OUTPUT and ty != "OUT_T"
        }
        # The rings whose pops need no barrier (`order.barrier_free_pops` proves it from the printed order).
        self.free_pops = free_pops
        # The fused chain's stages met since the last store: (op, its addresses' variables, its C scope depth).
        self.chain: list[tuple[Compute, dict[LoopVar, str], int]] = []
        self.body: tuple[SerialOp, ...] = ()  # the ops being printed, of which the op being printed is one
        self.stored = False  # the fused store printed at the chain's last Push, its WriteTiles still to come

    def ops(self, ops: tuple[SerialOp, ...], env: dict[LoopVar, str], in_flight: int = 0, tag: str = OP) -> None:
        """Print `ops`; `in_flight` commit groups issued ahead stay pending at their waits; `tag` marks copies."""
        outer, self.body = self.body, ops
        for i, op in enumerate(ops):
            first = i == 0 or not self.same_run(ops[i - 1], op)
            run = () if i + 1 < len(ops) and self.same_run(ops[i + 1], op) else self.run_ending(ops, i)
            self.op(op, first, run, env, in_flight, tag)
        self.body = outer

    def op(
        self, op: SerialOp, first: bool, run: tuple[SerialOp, ...], env: dict[LoopVar, str], in_flight: int, tag: str
    ) -> None:
        """Print the image of one op; a Wait or Pop learns whether it starts its run, and the run it ends (or ())."""
        mark = marker(op, tag)
        rings = self.k.rings
        match op:
            case SerialLoop():
                self.loop(op, env, tag)
            case InRegisters():
                if isinstance(op.op, Compute) and isinstance(op.op.op, Dequant):
                    self.hold(op.op, env)  # the next matmul's B fragments, from the packed page at this place
                self.w.line(f"// {op.why}", marker(op.op, tag))
            case Push(buf) if rings.is_fused(buf) and self.reads_beside(buf):
                # A chain reading a page beside its value (a residual's) is stored at its last Push, while that page
                # is still waited for and not popped (the occupancy proof checks it); its WriteTiles prints nothing.
                store = self.store_of(buf)
                self.fused_store(store, env, marker(store, tag), self.fused_chain())
                self.w.line("", f"{mark} (fused output: no ring; the store above is the WriteTiles')")
                self.stored = True
            case WriteTiles(src=buf) if rings.is_fused(buf) and self.stored:
                self.stored = False  # its image, with its census marker, is the fused store at the Push above
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) | PackAcc(to=buf) if rings.is_fused(buf):
                # The fused output has no ring: the accumulators already are the page its flow control governs.
                self.w.line("", f"{mark} (fused output: no ring)")
            case Reserve(buf):
                r = self.ring(buf)
                self.w.line(f"wslot_{r} = (wslot_{r} + 1) % DEPTH_{r};", mark)
            case Push():
                self.w.line("__pipeline_commit();", mark)
            case Wait():
                # A thread's wait completes only its own copies: the run's first wait_prior(n) completes all of
                # them, and the later ones would repeat it. The barrier after the run publishes everyone's.
                wait = [f"__pipeline_wait_prior({in_flight});"] if first else []
                sync = ["__syncthreads();"] if run else []
                self.w.line(" ".join(wait + sync), mark if wait or sync else f"{mark} (the wait above covers it)")
            case Pop(buf):
                # No thread may refill a slot another still reads: one barrier after a run of pops, unless the
                # next refill of every slot the run frees is proved to follow another barrier.
                r = self.ring(buf)
                line = f"rslot_{r} = (rslot_{r} + 1) % DEPTH_{r};"
                if not run:
                    self.w.line(line, mark)
                elif all(self.ring(p.buf) in self.free_pops for p in run if isinstance(p, Pop)):
                    self.w.line(line, f"{mark} (no barrier: {POP_PROOF})")
                else:
                    self.w.line(f"{line} __syncthreads();", mark)
            case WriteTiles(src=buf) if rings.is_fused(buf):
                self.fused_store(op, env, mark, self.fused_chain())
            case _ if self.common(op, env, mark, "ordered by the pipeline waits and barriers"):
                pass
            case Compute(op=stage, ins=(buf, *_)) if rings.is_fused(buf):
                # Applied element by element where the store reads the accumulators back; its image is there.
                self.w.line(f"// {plain(compute_text(stage, self.k.program))}: applied in the fused store below")
                self.chain.append((op, env, self.w.depth))
            case PackAcc(to=buf):
                self.pack(self.kept(buf), mark)
            case _:
                raise Unsupported(f"a {type(op).__name__} op", "the persistent tile kernel has no image for it")

    def reads_beside(self, buf) -> bool:
        """Whether `buf` is the fused chain's last page and a stage of the chain met since the last store reads a
        page beside the chain's value."""
        rings = self.k.rings
        last = rings.chain_step(buf) == len(rings.fused) - 1
        return last and any(len(stage.ins) > 1 for stage, _, _ in self.chain)

    def store_of(self, buf) -> WriteTiles:
        """The writer's store of the fused chain's last page, in the same loop body as its Push (the merge keeps one
        item loop for every engine): its address has the Push's loop variables."""
        stores = [op for op in self.body if isinstance(op, WriteTiles) and self.k.rings.is_fused(op.src)]
        if len(stores) != 1:
            raise Unsupported(
                "a fused chain reading a page beside its value, its store not beside its last Push",
                "the fused store applies the chain where its last page is pushed, at the writer's address there",
            )
        return stores[0]

    def run_kind(self, op: SerialOp) -> type | None:
        """Wait or Pop for such an op on a kept ring (the ops that run together under one barrier), else None."""
        if isinstance(op, Wait | Pop) and self.k.rings.kept(op.buf) is not None:
            return type(op)
        return None

    def same_run(self, other: SerialOp, op: SerialOp) -> bool:
        """Whether `other`, next to `op`, is in the same run: both Waits (or both Pops) on kept rings."""
        kind = self.run_kind(op)
        return kind is not None and self.run_kind(other) is kind

    def run_ending(self, ops: tuple[SerialOp, ...], i: int) -> tuple[SerialOp, ...]:
        """The run of Waits or Pops that ends with `ops[i]` (its image prints the run's barrier), or () if none."""
        if self.run_kind(ops[i]) is None:
            return ()
        start = i
        while start > 0 and self.same_run(ops[start - 1], ops[i]):
            start -= 1
        return ops[start : i + 1]

    # ---- loops -------------------------------------------------------------------------------------------

    def loop(self, lp: SerialLoop, env: dict[LoopVar, str], tag: str) -> None:
        """A `for` over the loop's variable (the ITEM loop over the site's share of the work list)."""
        v = loop_var_name(lp.var)
        bound = "n_items" if lp.var == LV_ITEM else str(lp.count.n)  # type: ignore[union-attr]
        mark = marker("Loop", tag, lp.merged)
        rot = rotation(self.k.rings, lp)
        if rot is not None:
            self.rotated(lp, rot, env, mark)
            return
        with self.w.block(f"for (int {v} = 0; {v} < {bound}; ++{v})", mark):
            inner = env | {lp.var: v}
            if lp.var == LV_ITEM:
                self.item_header(f"ITEM_LIST[item_off + {v}]")
                inner |= {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
            self.ops(lp.body, inner, 0, tag)

    def rotated(self, lp: SerialLoop, rot: Rotation, env: dict[LoopVar, str], mark: str) -> None:
        """The loop software-pipelined: step i+a's producer half is issued right after step i's waits.

        Without it each step would issue its copies and wait for them at once, exposing the whole load latency
        every step. The producer's addresses are functions of the loop variable, so issuing it ahead needs only
        that variable rebound; behind the waits' barrier it may refill the slot step i − 1 read (order.rotation).
        The last a steps have nothing to fetch and commit empty groups instead, so the waits' `wait_prior(n)` leaves
        exactly the a − 1 steps issued ahead of step i in flight on every step.
        """
        v, n, a = loop_var_name(lp.var), lp.count.n, rot.ahead  # type: ignore[union-attr]
        groups = commits(self.k.rings, rot.prod)
        if a == 1:
            self.w.line(f"// the loop over {v} is pipelined: step 0's copies are issued before it")
            self.ops(rot.prod, env | {lp.var: "0"}, 0, PRE)
        else:
            self.w.line(f"// the loop over {v} is pipelined {a} steps deep: steps 0 to {a - 1}'s copies go first")
            with self.unrolled(f"for (int {v}_pre = 0; {v}_pre < {a}; ++{v}_pre)"):
                self.ops(rot.prod, env | {lp.var: f"{v}_pre"}, 0, PRE)
        with self.w.block(f"for (int {v} = 0; {v} < {n}; ++{v})", mark):
            self.ops(rot.head, env | {lp.var: v}, (a - 1) * groups, OP)
            with self.w.block(f"if ({v} + {a} < {n})"):
                self.ops(rot.prod, env | {lp.var: f"({v} + {a})"}, 0, OP)
            with self.w.block("else"):
                for _ in range(groups):
                    self.w.line("__pipeline_commit();", marker("Push", PAD))
            self.ops(rot.rest, env | {lp.var: v}, 0, OP)

    def fused_chain(self) -> list[tuple[Compute, dict[LoopVar, str]]]:
        """The epilogue stages to apply in this store, taken from the printer's pending list."""
        chain, self.chain = self.chain, []
        if any(depth != self.w.depth for _, _, depth in chain):
            raise Unsupported(
                "an epilogue stage in another loop than the store of its chain",
                "the fused store applies the stages where it reads the accumulators back",
            )
        return [(stage, env) for stage, env, _ in chain]


class PagePrinter(RowPrinter, ColPrinter, MapPrinter, OpPrinter):
    """The op printer of a program without a tile matmul: a map program's map and a row program's maps and row
    accumulators are printed by the printers the general form runs them with (`maps.py`, `rows.py`), here on every
    thread of the block, between the serialised order's waits and barriers; page elements are read and written
    through SPATIALC_PAGE_LD / ST, which the host emulation checks for races."""

    def load(self, pointer: str, element: str) -> str:
        return f"SPATIALC_PAGE_LD({pointer})"

    def op(
        self, op: SerialOp, first: bool, run: tuple[SerialOp, ...], env: dict[LoopVar, str], in_flight: int, tag: str
    ) -> None:
        mark = marker(op, tag)
        match op:
            case SerialLoop():
                super().op(op, first, run, env, in_flight, tag)
            case _ if self.row_op(op, env, mark) or self.col_op(op, env, mark):
                pass
            case Compute(op=stage, ins=ins, outs=(dst,)) if ins:
                self.elementwise(op, stage, [self.kept(b) for b in ins], self.kept(dst), env, mark)
            case _:
                super().op(op, first, run, env, in_flight, tag)


# ---- the kernel text ---------------------------------------------------------------------------------------


def preamble(k: Kernel) -> list[str]:
    """Includes, the ABI's macros, type and size definitions, and the work list (docs/kernel-abi.md)."""
    p = k.program
    lines = [
        f"// {plain(p.name)}: a persistent CUDA kernel printed by spatialc from the spatial IR; each block is one site."
    ]
    lines += [f"#include <{h}>" for h in includes(k.types.operand)]
    if k.pages:  # no tensor cores, no fragments: pages read and written element by element, in EPIT values
        lines += ["", RING_MACROS, PAGE_MACROS, STORE_MACRO, CHECK_MACRO, ""]
        epit = "long long" if k.integer else "float"
        lines += [f"typedef {k.types.operand} OPT;", f"typedef {k.out_type} OUT_T;", f"typedef {epit} EPIT;"]
    else:
        # B fragments dequantised from packed pages, or MXFP8's e8m0 scales: dequant.cuh, which reads pages by
        # PAGE_MACROS (after the tensor-core layer)
        dq = has_dequant(p) or is_mx(p)
        lines += ["", RING_MACROS, *[PAGE_MACROS] * dq, STORE_MACRO, CHECK_MACRO, ""]
        lines += [*tensor_core_lines(k.rings, k.types), ""]
        lines += [*inlined_lines("common/dequant.cuh"), "", *mx_lines(p)] if dq else []
    if not k.pages:
        lines += [f"typedef {k.types.operand} OPT;", f"typedef {k.types.acc} ACCT;", f"typedef {k.out_type} OUT_T;"]
    if k.has_epilogue:
        lines += ["", *epilogue.helpers(k.integer).rstrip("\n").split("\n"), ""]
    lines += [f"#define NTHREAD {k.lanes * 32}", f"#define NWARP {k.lanes}"]
    if k.rows is not None:  # each warp's rows of the band, one share of each a lane (rows.py)
        lines.append(f"#define RROWS {k.rows.per_warp}")
    if k.cols is not None:  # each thread's columns of the band, the whole value of each (cols.py)
        lines.append(f"#define CCOLS {k.cols.per_thread}")
    if not k.pages:
        lines.append(f"#define PERW {k.perw}")
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        lines += [f"#define DEPTH_{rid} {ring.depth}", f"#define PAGE_{rid} {ring.page}"]
    lines += [f"#define SMEM_OFF_{rid} {off}" for rid, off in sorted(k.smem.ring_off.items())]
    if k.smem.dyn_bytes:
        lines.append(f"#define DYN_SMEM {k.smem.dyn_bytes}")
    return lines + [""]


def kernel_text(k: Kernel, ops: tuple[SerialOp, ...]) -> str:
    """The kernel source (`kernel_cu`): preamble, work list and the `__global__` function, no host code."""
    w = Writer()
    for line in preamble(k):
        w.line(line)
    params = ", ".join(
        [
            f"{ty if t.role == TensorRole.OUTPUT else 'const ' + ty}* __restrict__ t{int(t.id)}"
            for t, ty in zip(k.program.tensors, k.param_types, strict=True)
        ]
        + ["const int* __restrict__ spatialc_work"]
    )
    # extern "C": the symbol in the module is KERNEL_NAME itself, the name launch.json gives (not a C++ mangling).
    w.line(f'extern "C" __global__ __launch_bounds__(NTHREAD, {k.blocks_per_sm}) void {KERNEL_NAME}({params})')
    with w.block():
        kernel_prologue(k, w)
        env: dict[LoopVar, str] = {}
        if not any(isinstance(op, SerialLoop) and op.var == LV_ITEM for op in ops):
            # No ITEM loop (no site holds two items): the site's one item is implicit.
            OpPrinter(k, w).item_header("ITEM_LIST[item_off]")
            env = {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
        printer = PagePrinter if k.pages else OpPrinter
        printer(k, w, barrier_free_pops(k.rings, ops)).ops(ops, env)
    return w.text()


def kernel_prologue(k: Kernel, w: Writer) -> None:
    """Thread coordinates, the site's slice of the work list, rings, counters and accumulators."""
    site_prologue(w)
    if k.pages:  # no fragments to place by warp (a row printer finds its warp from tid itself)
        w.line("(void)warp;")
    if k.smem.dyn_bytes:
        w.line("extern __shared__ __align__(32) char spatialc_dyn_smem[];")
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        if rid in k.registers:
            w.line(f"// ring_{rid}: a W4A16 operand page the dequant in registers never writes (common/dequant.py)")
            continue
        if k.smem.rings_dynamic:
            w.line(
                f"SPATIALC_DYNAMIC_RING({ring.c_type}, ring_{rid}, spatialc_dyn_smem, SMEM_OFF_{rid}, DEPTH_{rid}, "
                f"PAGE_{rid});"
            )
        else:
            w.line(f"SPATIALC_SHARED_RING({ring.c_type}, ring_{rid}, DEPTH_{rid}, PAGE_{rid});")
        # wslot names the page the last Reserve claimed (so it starts one before slot 0); rslot the front page.
        w.line(f"int wslot_{rid} = DEPTH_{rid} - 1, rslot_{rid} = 0;")
    if not k.pages:
        w.line("spatialc_acc<ACCT> accf[PERW];")
    for t in sorted(k.rows.reductions if k.rows is not None else ()):
        w.line(f"float racc_{t}[RROWS];  // the lane's share of each of the warp's rows")
    for t in sorted(k.cols.reductions if k.cols is not None else ()):
        w.line(f"float cacc_{t}[CCOLS];  // the thread's columns of the band")

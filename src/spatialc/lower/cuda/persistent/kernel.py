"""The persistent tile kernel: a verified GEMM program as one CUDA block per site, looping over its items.

Each ring is a shared-memory array of pages filled by 16-byte cp.async copies; the tile matmul is tensor-core fragments
held per warp across the whole reduction; the K loop is software-pipelined when the rings are deep enough; the
output is stored straight from the accumulators where they live in registers, through the chain of elementwise
epilogue stages (bias, relu, scalar, requant; a residual's or a gate's page read from its ring, the store then printed
at the chain's last Push, before that page is popped) applied element by element on the way. Before a line is
printed the lowering proves that the site's engine programs serialise onto one block, that no ring is filled past its
depth, and that an int8 reduction cannot overflow int32 — and refuses, with a typed error, what it cannot print.
"""

from __future__ import annotations

import dataclasses

from ....ir.nodes import ComputeStage, Plan, SpatialProgram, Stage, TensorRole, Tile
from ....ir.ops import (
    AcquireAcc,
    Barrier,
    Compute,
    Dequant,
    Loop,
    MatmulTiles,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Precision,
    Push,
    ReadTiles,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    Trip,
    Wait,
    WriteTiles,
)
from ....ir.printer import compute_text
from ....ir.traffic import global_read_bytes
from ....passes.attention import is_attention_program
from ....passes.cols import is_col_program
from ....passes.maps import is_map_program
from ....passes.rows import is_row_program
from ....target import SpatialTarget
from ...artifact import Budget, CudaArtifact, Launch
from ...errors import GroupSpansSites, NeedsGeneral, TooBig, Unsupported
from ..common import epilogue
from ..common.blockscale import held_sub_blocks
from ..common.cwriter import C_TYPES
from ..common.dequant import InRegisters, fused_order, has_dequant, packed_rings, param_c_type, register_fusion
from ..common.host import assemble
from ..common.launch import launch_for, site_items
from ..common.program import (
    ATTENTION_PROGRAM,
    W4_PROGRAM,
    all_ops,
    check_printable,
    checked_gemm,
    fragments_per_warp,
)
from ..common.rings import MMA_TYPES, TILE_ELEMS, MmaTypes, Ring, Rings, ring_table
from ..common.sites import printed_site_programs
from . import pages
from .merge import SerialLoop, SerialOp, serial_walk, serialise
from .order import prove, smem_layout
from .printer import KERNEL_NAME, Kernel, kernel_text

MMA_TILE = Tile(16, 16)
# Why the persistent kernel leaves attention to the general form.
ATTENTION_WHY = (
    "its serialised block holds one accumulator block an item, and attention's compute engine holds two (S and O)"
    " and its row maxima and sums at once"
)


def lower(program: SpatialProgram, target: SpatialTarget) -> CudaArtifact:
    """The CUDA artifact of a verified program, or a typed error saying what the persistent kernel cannot hold."""
    check_printable(program, dequant=True)
    if is_attention_program(program):
        raise NeedsGeneral(ATTENTION_PROGRAM, ATTENTION_WHY)
    if (
        is_map_program(program) or is_row_program(program) or is_col_program(program)
    ):  # no tile matmul: its block moves and maps pages
        return pages.lower(program, target)
    refuse(program)
    plan = program.plans[0]
    mm, types, integer, chain = checked_gemm(program, epilogue.EPILOGUE_OPS)
    programs = printed_site_programs(program)
    lane_grid = target.accumulator_lane_grid(plan.block.osh, plan.block.osw)
    rings = ring_table(program, types, fused_chain(program, target, mm, chain, lane_grid))
    rings = packed_rings(program, rings) if has_dequant(program) else rings
    ops, registers = in_registers(serialise(programs), rings)
    check_shapes(ops, plan, mm, rings)
    prove(rings, ops)
    kernel = make_kernel(program, target, plan, types, rings, lane_grid, integer, bool(chain), registers)
    kernel_cu = kernel_text(kernel, ops)
    return assemble(program, target.name, kernel_cu, programs, launch_of(kernel, target), budget_of(kernel, target))


# ---- refusals ----------------------------------------------------------------------------------------------


def refuse(p: SpatialProgram) -> None:
    """Raise the first reason the persistent tile kernel cannot hold `p`."""
    check_printable(p, dequant=True)
    general = needs_general(p)
    if general is not None:
        raise NeedsGeneral(*general)
    ops = all_ops(p)
    if any(isinstance(op, McastSend | McastSetValid) for op in ops):
        raise NeedsGeneral("a multicast", "the blocks of a persistent kernel share no pages")
    for g in p.placement.groups:
        if len(g.sites) > 1:
            raise GroupSpansSites(int(g.id), tuple(int(s) for s in g.sites))
    accs = {op.buf for op in ops if isinstance(op, AcquireAcc)} | {op.acc for op in ops if isinstance(op, PackAcc)}
    accs |= {op.acc for op in ops if isinstance(op, Compute) and op.acc is not None}
    if len({p.buffer(b).ring for b in accs}) > 1:
        raise Unsupported(
            f"{len(accs)} accumulators", "the kernel holds one accumulator block per warp, in its fragments"
        )
    if p.tile != MMA_TILE:
        raise Unsupported(f"tiles of {p.tile.rows}x{p.tile.cols}", "MMA fragments are 16x16; tile the program 16x16")


def needs_general(p: SpatialProgram) -> tuple[str, str] | None:
    """(what, why) when `p` (a program with a tile matmul: `lower` sends the others to `pages`) has
    something the persistent kernel leaves to the general form, else None."""
    if len(p.plans) > 1:
        return f"a program with {len(p.plans)} plans", "the persistent kernel prints one block shape for every site"
    if p.placement is not None and p.placement.splits > 1:
        whose = f"a split tail's last {p.placement.tail} items" if p.placement.tail else "item"
        return (
            f"split-K over {p.placement.splits} sites per {whose}",
            "its sites wait on each other's partial sums, and the persistent kernel's blocks never wait on each other",
        )
    if sum(1 for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles)) > 1:
        return "several tile matmuls", "the tile kernel holds one accumulator block per item"
    compute = [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage)]
    compute += [op.op for op in all_ops(p) if isinstance(op, Compute)]
    for c in compute:
        if not (isinstance(c, MatmulTiles | Dequant) or epilogue.fused(c)):  # a dequant: `in_registers` decides
            return (
                f"a {compute_text(c, p)} stage",
                "the tile kernel computes tensor-core tile matmuls and fuses elementwise epilogue stages into their "
                "store, nothing else",
            )
    ops = all_ops(p)
    if any(isinstance(op, Loop) and isinstance(op.count, Trip) for op in ops):
        return "a loop whose trip count is read from data", "the tile kernel's loop bounds are fixed when printed"
    if p.semaphores or any(isinstance(op, SemSet | SemInc | SemWait) for op in ops):
        return "a semaphore handshake", "the tile kernel's engines hand pages over only in the order it proves"
    if any(isinstance(op, Barrier) for op in ops):
        return "a group barrier", "the persistent kernel's blocks never wait on each other"
    return None


def fused_chain(
    p: SpatialProgram, target: SpatialTarget, mm: Stage, chain: tuple[Stage, ...], lane_grid: tuple[int, int] | None
) -> tuple[int, ...]:
    """The ring templates the fused epilogue replaces (the matmul's output, then each stage's), or () unfused.

    Fused only where the accumulators are in registers and each warp owns a rectangle of the block it can read
    back itself; an epilogue anywhere else would need its stages printed ring to ring, which is the general
    lowering's business.
    """
    if target.accumulator_in_registers and lane_grid:
        return tuple(int(p.buffer(b).ring) for b in (mm.outs[0], *(s.outs[0] for s in chain)))
    if chain:
        why = (
            "no warp grid divides the accumulator block, so the warps cannot each read back a rectangle of it"
            if target.accumulator_in_registers
            else f"{target.name} keeps accumulators out of registers"
        )
        raise NeedsGeneral(
            f"the epilogue {epilogue.names(p, chain)}",
            f"the fused epilogue applies where each warp reads back its own accumulators, and {why}",
        )
    return ()


def in_registers(ops: tuple[SerialOp, ...], rings: Rings) -> tuple[tuple[SerialOp, ...], frozenset[int]]:
    """`ops` with each body that dequantises a page of packed weights for its own next matmul fused as the general
    form's register path fuses it (`common/dequant.py`'s `register_fusion` and `fused_order`: the B page's ring ops
    and the dequant as `InRegisters`, the packed page popped after the matmul, whose B fragments are dequantised from
    it), and the B rings so replaced: no op but the matmul names them, and the kernel never declares them. Fused
    before the order is proved and rotated, so that the proof and the software pipeline see the printed order.
    NeedsGeneral for a dequant that cannot be so fused (the general form's shared path prints it)."""
    fused, registers = _fuse(ops, rings)
    for op in serial_walk(fused):
        if isinstance(op, Compute) and isinstance(op.op, Dequant):
            raise NeedsGeneral(
                f"{W4_PROGRAM} whose dequant of {rings.name(op.ins[0])} does not feed its own next matmul's B alone",
                "the persistent form dequantises 4-bit weights only in registers, as that matmul loads its B"
                " fragments, and has no B operand page to write",
            )
        names = () if isinstance(op, InRegisters) else _buffers(op)
        if isinstance(op, Compute) and isinstance(op.op, MatmulTiles):
            names = names[:1]  # its B is read from the packed page (DequantPrinter.b_fragment)
        for buf in names:
            if rings.template[buf] in registers:
                raise NeedsGeneral(
                    f"{W4_PROGRAM} whose B page {rings.name(buf)} is also read by a {type(op).__name__}",
                    "the persistent form's dequant in registers feeds only its matmul's B fragments",
                )
    return fused, registers


def _fuse(ops: tuple[SerialOp, ...], rings: Rings) -> tuple[tuple[SerialOp, ...], frozenset[int]]:
    """`in_registers`' fusion of `ops` and every loop body in it, and the B rings it did without."""
    registers: set[int] = set()
    body: list[SerialOp] = []
    for op in ops:
        if isinstance(op, SerialLoop):
            inner, found = _fuse(op.body, rings)
            registers |= found
            op = dataclasses.replace(op, body=inner)
        body.append(op)
    out = tuple(body)
    while (at := register_fusion(out)) is not None:  # type: ignore[arg-type]
        registers.add(rings.template[out[at[1]].outs[0]])  # type: ignore[union-attr]
        out = fused_order(out, at)  # type: ignore[arg-type]
    return out, frozenset(registers)


def _buffers(op: SerialOp) -> tuple:
    """The buffers `op` names (a ring op's, a compute's ins then outs, a copy's page); () for a loop."""
    match op:
        case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf):
            return (buf,)
        case Compute(ins=ins, outs=outs):
            return (*ins, *outs)
        case ReadTiles(into=buf) | WriteTiles(src=buf) | PackAcc(to=buf):
            return (buf,)
    return ()


def check_shapes(ops: tuple[SerialOp, ...], plan: Plan, mm: Stage, rings: Rings) -> None:
    """Refuse ops whose page layout the printers do not share with the matmul (they would read wrong tiles)."""
    h, w = plan.item_tiles
    ibw = plan.block.ibw
    a, b, c = (rings.template[x] for x in (*mm.ins, *mm.outs))
    pages = {a: (h, ibw), b: (ibw, w), c: (h, w)}
    for op in serial_walk(ops):
        match op:
            case Compute(acc_reload=reload) if reload is not None:
                raise Unsupported("an accumulator spill (acc_reload)", "accumulators never leave the registers")
            case Compute(op=MatmulTiles(block, sub)) if (block, sub) != (plan.block, plan.sub_blocks):
                raise Unsupported(f"a matmul of block {block} x {sub}", "it differs from the plan's block")
            case PackAcc(accumulate=True):
                raise Unsupported("an accumulating PackAcc", "accumulator fragments are stored, never added to a page")
            case PackAcc(tiles=n) if n != h * w:
                raise Unsupported(f"a PackAcc of {n} tiles", f"the accumulator holds the item's {h * w} tiles")
            case ReadTiles(into=buf, block_h=bh, block_w=bw) | WriteTiles(src=buf, block_h=bh, block_w=bw):
                want = pages.get(rings.template[buf])
                if want is not None and (bh, bw) != want:
                    raise Unsupported(
                        f"a {type(op).__name__} of {bh}x{bw} tiles on {rings.name(buf)}",
                        f"the matmul's page there is {want[0]}x{want[1]} tiles",
                    )


# ---- the kernel's resources --------------------------------------------------------------------------------


def make_kernel(
    p: SpatialProgram,
    target: SpatialTarget,
    plan: Plan,
    types: MmaTypes,
    rings: Rings,
    lane_grid: tuple[int, int] | None,
    integer: bool,
    has_epilogue: bool,
    registers: frozenset[int] = frozenset(),
) -> Kernel:
    """Everything the printers need, with the shared memory laid out and the work list sized (none for the B rings
    a W4A16 GEMM's dequant in `registers` does without)."""
    lanes = target.accumulator_lanes
    perw = fragments_per_warp(plan, lanes, lane_grid)
    smem = smem_layout(without(rings, registers), target)
    total = smem.static_bytes + smem.dyn_bytes
    blocks = target.resident_sites_per_unit(total, plan.block.osh, plan.block.osw, held_sub_blocks(p, plan))
    if blocks == 0:
        raise TooBig(
            f"shared memory of one block on {target.name} (its rings)",
            total,
            target.smem_per_site_max,
            "choose a smaller block, fewer sub-blocks or shallower rings",
        )
    items = site_items(p)
    out = p.output_tensor()
    assert out is not None
    # (`param_c_type`, the general form's too: a W4A16 GEMM's packed weights, zero points and e8m0 scales, and an
    # MXFP8 GEMM's e8m0 scales, by dequant.cuh's typedefs — read as their bytes)
    param_types = tuple("OUT_T" if t.role == TensorRole.OUTPUT else param_c_type(t, "OPT") for t in p.tensors)
    return Kernel(
        p,
        plan,
        types,
        C_TYPES[out.dtype],
        param_types,
        rings,
        smem,
        lane_grid,
        lanes,
        perw,
        blocks,
        items,
        integer,
        has_epilogue,
        registers=registers,
    )


def without(rings: Rings, templates: frozenset[int]) -> Rings:
    """`rings` less the rings of `templates` (the B rings a dequant in registers does without: no shared memory)."""
    return dataclasses.replace(rings, rings={r: v for r, v in rings.rings.items() if r not in templates})


def budget_of(k: Kernel, target: SpatialTarget) -> Budget:
    """The resource budget, from the same layout the kernel was printed with."""
    held = held_sub_blocks(k.program, k.plan)  # a block-scaled step's partials counted, as for the blocks an SM
    acc_tiles = k.plan.block.osh * k.plan.block.osw * held[0] * held[1]
    kept = without(k.rings, k.registers).rings
    return Budget(
        k.smem.ring_bytes,
        k.smem.opt_in,
        k.smem.rings_dynamic,
        k.smem.dyn_bytes,
        k.smem.static_bytes,
        target.registers_per_thread(acc_tiles),
        k.blocks_per_sm,
        k.lanes * 32,
        tuple((r.name, r.bytes) for r in sorted(kept.values(), key=lambda r: r.id)),
        tuple(k.rings.names[t] for t in k.rings.fused),
        layouts=tuple((r.name, r.layout.value) for r in sorted(kept.values(), key=lambda r: r.id)),
        global_read_bytes=global_read_bytes(k.program),
    )


def launch_of(k: Kernel, target: SpatialTarget) -> Launch:
    """How a host language launches `kernel_cu` (`launch.launch_for`)."""
    return launch_for(
        k.program, target, KERNEL_NAME, k.types, k.lanes * 32, k.smem.dyn_bytes, k.smem.opt_in, k.blocks_per_sm
    )


def plan_resources(
    target: SpatialTarget, plan: Plan, precision: Precision, stages: int = 0, reads: int = 0
) -> tuple[int, int]:
    """What one block of the persistent kernel for `plan` costs, as the tile planner asks before it offers a plan:
    (shared memory bytes, blocks resident per SM — 0 when one does not fit), the same figures `make_kernel` finds.
    The epilogue's `stages` cost nothing here: fused, they live in registers; the `reads` rings of item-sized operand
    pages its fused store reads (a residual's) are in shared memory."""
    smem = plan_smem(target, plan, precision, reads)
    return smem, target.resident_sites_per_unit(smem, plan.block.osh, plan.block.osw, plan.sub_blocks)


def plan_smem(target: SpatialTarget, plan: Plan, precision: Precision, reads: int = 0) -> int:
    """Shared memory of one block of the persistent kernel for `plan`. The rings are the ones `passes/tile.apply_plan`
    sizes (A and B `depth` deep, the output two deep), laid out by the same `smem_layout` the kernel is printed with;
    where the lane grid divides the block the output ring is fused away (the store reads the accumulators)."""
    types = MMA_TYPES[precision]
    h, w = plan.item_tiles
    ibw = plan.block.ibw
    shapes = {0: (plan.depth, h * ibw, "OPT"), 1: (plan.depth, ibw * w, "OPT"), 2: (min(plan.depth, 2), h * w, "ACCT")}
    shapes |= {3 + i: (min(plan.depth, 2), h * w, "OPT") for i in range(reads)}  # a residual's pages (`side_rings`)
    fused = target.accumulator_in_registers and target.accumulator_lane_grid(plan.block.osh, plan.block.osw)
    rings = {
        rid: Ring(
            rid, f"ring{rid}", depth, pages * TILE_ELEMS, ty, types.acc_bytes if ty == "ACCT" else types.operand_bytes
        )
        for rid, (depth, pages, ty) in shapes.items()
        if not (fused and rid == 2)
    }
    layout = smem_layout(Rings(rings, {}), target)
    return layout.static_bytes + layout.dyn_bytes

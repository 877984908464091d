"""The persistent form of a program without a tile matmul: a map program (`spatialc.elementwise`), a row program
(softmax, RMSNorm, LayerNorm) or a column program (`spatialc.col_reduce`: its column accumulators printed by
`cols.ColPrinter`, a thread a column of the band, as in the general form).

The block is a site, as for a GEMM: the site's reader, compute and writer programs serialised onto one instruction
stream (`merge.py`, which leaves a later pass's loop out of an earlier one's: a row program's writer stores what the
compute engine's last pass fills), the order proved to fill no ring past its depth before a line is printed
(`order.prove`), and every thread of the block running each op in turn: the reader's copies (cp.async), the map of a
page (`maps.MapPrinter`, the general form's printer), a row reduction's fold into the row accumulators and its pack
into a row vector with warp shuffles (`rows.RowPrinter`, likewise), the writer's stores. The warps are the target's
accumulator lanes: the row accumulators are spread over them as over the general form's compute warps.

What it gives up against the general form, which runs the engines on warps of their own: the next item's copies are
not issued while this one is mapped — only a reduction's pass over a row, whose loop holds nothing but the copies and
the fold, is software-pipelined. `form="auto"` keeps such programs in the general form (`forms.py`); this one is the
second form the host emulation checks them in, printed from the same per-op printers through another flow control.
"""

from __future__ import annotations

from ....ir.nodes import Plan, SpatialProgram, Stage, TensorRole
from ....ir.ops import (
    AcquireAcc,
    Barrier,
    Compute,
    Loop,
    McastSend,
    McastSetValid,
    PackAcc,
    ReadTiles,
    ReleaseAcc,
    SemInc,
    SemSet,
    SemWait,
    Trip,
    WriteTiles,
)
from ....ir.traffic import global_read_bytes
from ....passes.cols import is_col_program
from ....passes.rows import is_row_program
from ....target import SpatialTarget
from ...artifact import Budget, CudaArtifact, Launch
from ...errors import GroupSpansSites, NeedsGeneral, TooBig, Unsupported
from ..common.cols import ColAccumulators, checked_cols, col_accumulators
from ..common.cwriter import C_TYPES
from ..common.host import assemble
from ..common.launch import launch_for, site_items
from ..common.program import all_ops, check_printable, checked_map, checked_rows, other_outputs, out_c_type
from ..common.rings import TILE_ELEMS, MmaTypes, Rings, epilogue_rings, ring_table
from ..common.rows import RowAccumulators, row_accumulators
from ..common.sites import printed_site_programs
from .merge import SerialOp, serial_walk, serialise
from .order import prove, smem_layout
from .printer import KERNEL_NAME, Kernel, kernel_text


def lower(program: SpatialProgram, target: SpatialTarget) -> CudaArtifact:
    """The persistent CUDA artifact of a verified map or row program, or a typed error saying what it cannot hold."""
    refuse(program)
    plan = program.plans[0]
    types, integer, stages = page_stages(program)
    rings = epilogue_rings(program, ring_table(program, types, ()), integer)
    lanes = target.accumulator_lanes
    rows = row_accumulators(program, plan, rings, lanes) if is_row_program(program) else None
    cols = col_accumulators(program, plan, rings, lanes) if is_col_program(program) else None
    programs = printed_site_programs(program)
    ops = serialise(programs)
    check_pages(program, ops, rings, rows, cols)
    prove(rings, ops)
    kernel = make_kernel(program, target, plan, types, rings, integer, bool(stages), rows, cols)
    kernel_cu = kernel_text(kernel, ops)
    return assemble(program, target.name, kernel_cu, programs, launch_of(kernel, target), budget_of(kernel, target))


def page_stages(p: SpatialProgram) -> tuple[MmaTypes, bool, tuple[Stage, ...]]:
    """The input types, whether the program is int8 (exact `long long` values) and its compute stages — a map
    program's maps (`checked_map`), a row program's reductions and maps (`checked_rows`) — checked as those say."""
    if is_col_program(p):
        types, stages = checked_cols(p)
        return types, False, stages
    if is_row_program(p):
        types, stages = checked_rows(p)
        return types, False, stages
    types, integer, maps = checked_map(p)
    return types, integer, maps


def refuse(p: SpatialProgram) -> None:
    """Raise the first reason one block per site, its engines serialised, cannot run `p`: handshakes between sites,
    loop counts read at run time, more than one plan, tiles other than 16 × 16."""
    check_printable(p)
    ops = all_ops(p)
    waits = (
        ("a multicast", (McastSend, McastSetValid)),
        ("a semaphore handshake", (SemSet, SemInc, SemWait)),
        ("a group barrier", (Barrier,)),
    )
    for what, kinds in waits:
        if any(isinstance(op, kinds) for op in ops) or (kinds[0] is SemSet and p.semaphores):
            raise NeedsGeneral(what, "the persistent kernel's blocks never wait on each other")
    if any(isinstance(op, Loop) and isinstance(op.count, Trip) for op in ops):
        raise NeedsGeneral("a loop whose trip count is read from data", "its loop bounds are fixed when printed")
    for g in p.placement.groups if p.placement is not None else ():
        if len(g.sites) > 1:
            raise GroupSpansSites(int(g.id), tuple(int(s) for s in g.sites))
    if len(p.plans) > 1:
        raise Unsupported(f"a program with {len(p.plans)} plans", "the persistent kernel prints one block shape")
    if p.tile.rows != 16 or p.tile.cols != 16:
        raise Unsupported(f"tiles of {p.tile.rows}x{p.tile.cols}", "the kernel's pages are of 16x16 tiles")


def check_pages(
    p: SpatialProgram,
    ops: tuple[SerialOp, ...],
    rings: Rings,
    rows: RowAccumulators | None,
    cols: ColAccumulators | None = None,
) -> None:
    """Refuse ops the page printers would run on the wrong elements: a copy in or out of other than a whole page of
    its ring, and an accumulator that is not a row or column reduction's (`row_accumulators` and `col_accumulators`
    checked those)."""
    reduced = {**(rows.reductions if rows is not None else {}), **(cols.reductions if cols is not None else {})}
    for op in serial_walk(ops):
        match op:
            case ReadTiles(into=buf, block_h=bh, block_w=bw) | WriteTiles(src=buf, block_h=bh, block_w=bw):
                ring = rings.kept(buf)
                if ring is None or bh * bw * TILE_ELEMS != ring.page:
                    raise Unsupported(
                        f"a {type(op).__name__} of {bh}x{bw} tiles on {rings.name(buf)}",
                        "a copy in or out moves one whole page of its ring",
                    )
            case AcquireAcc(buf) | ReleaseAcc(buf) | PackAcc(acc=buf) | Compute(acc=buf) if buf is not None:
                if int(p.buffer(buf).ring) not in reduced:
                    raise Unsupported(
                        f"accumulator {p.buffer(buf).name}, which no row or column reduction folds into",
                        "a program without a tile matmul holds row or column accumulators only",
                    )
            case Compute(acc_reload=reload) if reload is not None:
                raise Unsupported("an accumulator spill (acc_reload)", "row accumulators never leave the registers")
            case PackAcc(accumulate=True):
                raise Unsupported("an accumulating PackAcc", "a row vector is stored, never added to a page")


def make_kernel(
    p: SpatialProgram,
    target: SpatialTarget,
    plan: Plan,
    types: MmaTypes,
    rings: Rings,
    integer: bool,
    has_stages: bool,
    rows: RowAccumulators | None,
    cols: ColAccumulators | None = None,
) -> Kernel:
    """The kernel's block: the rings laid out as the GEMM kernel's are, the accumulator lanes for its warps, and the
    blocks an SM holds — by its shared memory and, for a row program, its own register estimate."""
    lanes = target.accumulator_lanes
    smem = smem_layout(rings, target)
    total = smem.static_bytes + smem.dyn_bytes
    held = rows if rows is not None else cols
    regs = min(held.registers, target.regs_per_thread_max) if held is not None else None
    blocks = target.resident_sites_per_unit(total, 0, 1, (1, 1), lanes, regs)
    if blocks == 0:
        raise TooBig(
            f"shared memory of one block on {target.name} (its rings)",
            total,
            target.smem_per_site_max,
            "choose a smaller block or shallower rings",
        )
    out = out_c_type(p, "the persistent form", mixed=held is not None)  # a row program's vectors: float32 beside out
    others = other_outputs(p, out)
    param_types = tuple(
        "OPT"
        if t.role == TensorRole.INPUT
        else others.get(int(t.id), "OUT_T")
        if t.role == TensorRole.OUTPUT
        else C_TYPES[t.dtype]
        for t in p.tensors
    )
    items = site_items(p)
    lane_grid, perw = None, 0  # no fragments
    return Kernel(
        p,
        plan,
        types,
        out,
        param_types,
        rings,
        smem,
        lane_grid,
        lanes,
        perw,
        blocks,
        items,
        integer,
        has_stages,
        pages=True,
        rows=rows,
        cols=cols,
    )


def budget_of(k: Kernel, target: SpatialTarget) -> Budget:
    """The resource budget, from the layout the kernel was printed with."""
    held = k.rows if k.rows is not None else k.cols
    regs = min(held.registers, target.regs_per_thread_max) if held is not None else target.registers_per_thread(0)
    by_id = sorted(k.rings.rings.values(), key=lambda r: r.id)
    return Budget(
        k.smem.ring_bytes,
        k.smem.opt_in,
        k.smem.rings_dynamic,
        k.smem.dyn_bytes,
        k.smem.static_bytes,
        regs,
        k.blocks_per_sm,
        k.lanes * 32,
        tuple((r.name, r.bytes) for r in by_id),
        layouts=tuple((r.name, r.layout.value) for r in by_id),
        global_read_bytes=global_read_bytes(k.program),
    )


def launch_of(k: Kernel, target: SpatialTarget) -> Launch:
    """How a host language launches the kernel (`launch.launch_for`)."""
    return launch_for(
        k.program, target, KERNEL_NAME, k.types, k.lanes * 32, k.smem.dyn_bytes, k.smem.opt_in, k.blocks_per_sm
    )

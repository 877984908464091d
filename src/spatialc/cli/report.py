"""What the commands print about a program and its kernel, and the random inputs they run it on."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.nodes import ComputeStage, Fifo, Interm, PageLayout, SpatialProgram
from ..ir.ops import Precision, RowReduce
from ..ir.printer import plural
from ..ir.traffic import global_read_bytes, read_bytes
from ..numerics.blockscale import program_scales
from ..passes.attention import attention_shape, is_attention_program
from ..passes.cols import is_col_program
from ..passes.dequant import is_w4_program
from ..passes.footprint import sized_as
from ..passes.maps import is_map_program
from ..passes.rows import is_row_program
from ..passes.split import split_ranges, workspace_bytes
from ..target import target


def random_inputs(p: SpatialProgram, seed: int, sample: Any = None, operands: bool = True) -> dict[str, np.ndarray]:
    """Inputs for a GEMM: int8 over its whole range, fp16/bf16 standard normal rounded to the operand type (float16
    and float32 arrays: they were chosen at random, so they are not rounded again, with a warning, on the way
    in), a residual or a gate as such an operand; a bias or a scale vector of n (or m) values (int32 within ±2^15
    for int8 programs); a grouped GEMM's row counts uniform in 0..max_rows. With a `sample` (an interpreter
    Sample), its tensors (A) are made as just the sampled rows (in each group); without `operands`, only the
    parameters (nothing will multiply A and B)."""
    from ..inputs import W4_TYPES, row_limits
    from ..numerics.blockscale import program_scales

    rng = np.random.default_rng(seed)
    out = {}
    integer = p.precision.value == "int8"
    counts = row_limits(p)
    scales = program_scales(p)
    scale_tensors = {scales.a.tensor, scales.b.tensor} if scales is not None else set()
    for t in p.tensors:
        if t.dtype in W4_TYPES and t.id not in scale_tensors:  # made below, by the format's own rule
            continue
        rows = len(sample.rows) if sample is not None and t.name in sample.given else t.elems[0]
        shape = (t.groups, rows, t.elems[1]) if t.groups > 1 else (rows, t.elems[1])
        if t.role.value == "input" and not operands:
            continue
        if t.role.value == "input":
            out[t.name] = (
                rng.integers(-128, 128, size=shape, dtype=np.int8) if integer else _normal(rng, shape, t.name, t.dtype)
            )
        elif t.name in counts:  # a grouped GEMM's row counts: anything from none to all of a group's rows
            out[t.name] = rng.integers(0, counts[t.name] + 1, size=t.elems[1]).astype(np.int32)
        elif t.role.value == "parameter" and t.id in scale_tensors:  # block scales: positive, of their shape
            size = (t.groups, *t.elems) if t.groups > 1 else t.elems  # a grouped GEMM's: a matrix a group
            mx = t.dtype.value == "e8m0"  # MX's: powers of two 2^-1 … 2^1
            out[t.name] = (
                2.0 ** rng.integers(-1, 2, size=size) if mx else rng.uniform(0.5, 2.0, size=size).astype(np.float32)
            )
        elif t.role.value == "parameter":
            n = t.elems[0] * t.elems[1]  # a column vector's n values, a row vector's m
            out[t.name] = rng.integers(-(2**15), 2**15, size=n).astype(np.int32) if integer else rng.standard_normal(n)
    from ..numerics.w4 import random_inputs as w4_inputs

    out.update(w4_inputs(p, rng, operands))  # a W4A16 GEMM's packed weights (with `operands`), scales, zero points
    return out


NORMAL_CHUNK = 1 << 20  # values drawn at once: the float64 draws of a whole operand would take gigabytes


def _normal(rng: np.random.Generator, shape: tuple[int, ...], name: str, dtype: Any) -> np.ndarray:
    """Standard normal values rounded to `dtype`, drawn a block of rows at a time (the same values as one draw of
    the whole shape: the generator fills row-major): fp16 as float16, bf16 as float32 — each the type the
    interpreter stores that operand in, so it reads the array in place."""
    from ..inputs import operand_values
    from ..ir.nodes import DType

    out = np.empty(shape, np.float16 if dtype == DType.FP16 else np.float32)
    flat = out.reshape(-1, shape[-1])
    per = max(1, NORMAL_CHUNK // max(shape[-1], 1))
    for r in range(0, flat.shape[0], per):
        block = rng.standard_normal((min(per, flat.shape[0] - r), shape[-1]))
        # numpy casts float64 to float16 in one rounding, to nearest even: numerics.narrow.round_fp16 itself
        flat[r : r + per] = block if out.dtype == np.float16 else operand_values(name, block, dtype)
    return out


def _layout_note(layout: PageLayout) -> str:
    """The layout in brackets beside a ring (" (K-major)", " (swizzled)"), nothing for plain row-major pages."""
    return f" ({layout.note})" if layout.note else ""


def program_lines(p: SpatialProgram) -> list[str]:
    """The plan, the placement and the IR's rings, a line each."""
    plan = p.plan
    assert plan is not None and p.placement is not None
    b = plan.block
    h, w = plan.item_tiles
    counts = [len(items) for _, items in p.placement.items_of_site]
    held = f"{min(counts)}..{max(counts)}" if min(counts) != max(counts) else str(counts[0])
    rings = [
        f"{buf.name} {plural(buf.kind.depth_pages, 'page')} of {plural(buf.kind.page_tiles, 'tile')}"
        + _layout_note(buf.kind.layout)
        for buf in p.buffers
        if isinstance(buf.kind, Fifo | Interm)
    ]
    placement = p.placement.kind + (f", bands of {p.placement.band} rows" if p.placement.kind == "grouped" else "")
    split = []
    if p.placement.splits > 1:
        most = max(n for _, n in split_ranges(plan.k_steps, p.placement.splits))
        who = "per item"
        if p.placement.tail:  # a split tail: only the last wave's items are split
            whole = plan.items - p.placement.tail
            kept = {0: "none whole", 1: "item 0 whole"}.get(whole, f"items 0 … {whole - 1} whole")
            who = f"per item of the split tail (its last {p.placement.tail} items; {kept})"
        split = [
            f"  split-K   {p.placement.splits} sites {who}, at most {plural(most, 'K step')} each; the owner adds"
            f" the others' partial sums in split order from a workspace of {workspace_bytes(p)} bytes"
        ]
    if p.placement.multicast != (1, 1):
        gy, gx = p.placement.multicast
        reads = read_bytes(p)
        said = ", ".join(f"{name} {n / 2**20:.1f} MiB" for name, n in reads.items())
        rows_cols = (("each group row shares its A pages", gx), ("each group column shares its B pages", gy))
        shared = [what for what, n in rows_cols if n > 1]
        split = [
            f"  multicast {gy}x{gx} sites a group: {', '.join(shared)}, each read once and multicast; global reads"
            f" {said} ({global_read_bytes(p)} bytes)"
        ]
    if plan.groups > 1:
        split = [
            f"  groups    {plan.groups}, each up to {plan.grid[0]}x{plan.grid[1]} items; a site takes strips (one"
            f" group, one column of items) and runs as many of a strip's {plan.grid[0]} items as its row count"
            " fills, read at run time"
        ]
    if is_attention_program(p):
        op = attention_shape(p).op
        heads = f", {op.group} query heads a KV head in turn" if op.group > 1 else ""
        steps = plural(plan.k_steps, "step")
        steps = f"at most {steps}: those at or left of its diagonal" if op.causal else steps
        head = (
            f"  plan      attention: bands of {plural(b.osh, 'query tile row')} ({b.osh * p.tile.rows} rows), each"
            f" walking its head's keys {plural(b.ibw, 'tile row')} ({b.ibw * p.tile.rows} keys) a step ({steps}),"
            f" grid {plural(plan.grid[0], 'band')} x {plural(plan.grid[1], 'KV head')}{heads}, K and V rings"
            f" {plural(plan.depth, 'page')} deep"
        )
    elif is_col_program(p):
        head = (
            f"  plan      columns: bands of {plural(b.osw, 'tile column')} ({w * p.tile.cols} columns of"
            f" {h * p.tile.rows} elements), read a page of {b.ibw} tile rows at a time"
            f" ({plural(plan.k_steps, 'page')} a band), grid {plan.grid[1]} bands,"
            f" rings {plural(plan.depth, 'page')} deep"
        )
    elif is_row_program(p):
        passes = 1 + sum(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce) for s in p.stages)
        head = (
            f"  plan      rows: bands of {b.osh} tile rows ({h * p.tile.rows} rows of {w * p.tile.cols} elements),"
            f" read {plural(passes, 'time')} a page of {b.ibw} tiles at a time ({plural(plan.k_steps, 'page')} a"
            f" row), grid {plan.grid[0]} bands, rings {plural(plan.depth, 'page')} deep"
        )
    elif is_map_program(p):
        head = (
            f"  plan      a map: blocks of {b.osh}x{b.osw} tiles (items of {h * p.tile.rows}x{w * p.tile.cols}"
            f" elements), grid {plan.grid[0]}x{plan.grid[1]} items, rings {plural(plan.depth, 'page')} deep"
        )
    else:
        head = (
            f"  plan      block {b.osh}x{b.osw}x{b.ibw} tiles, sub-blocks {plan.sub_blocks[0]}x{plan.sub_blocks[1]}"
            f" (items of {h * p.tile.rows}x{w * p.tile.cols} outputs), grid {plan.grid[0]}x{plan.grid[1]} items,"
            f" {plural(plan.k_steps, 'K step')}, operand rings {plural(plan.depth, 'page')} deep"
        )
    return [
        head,
        f"  sites     {len(counts)} ({placement}), {held} {_unit(plan, held)} per site",
        f"  rings     {', '.join(rings)} (the program's; the kernel's are below)",
        *split,
        *_padding_note(p, plan),
    ]


PADDING_NOTED = 0.10  # padding past this share of a side is said: the kernel multiplies those zeros too


def _padding_note(p: SpatialProgram, plan) -> list[str]:
    """A note where the plan's whole items and K steps pad a side of the product by more than PADDING_NOTED."""
    out = p.output_tensor()
    a = next((t for t in p.tensors if t.role.value == "input"), None)
    if out is None or a is None or a.elems[0] != out.elems[0] or is_attention_program(p):
        return []
    h, w = plan.item_tiles
    mapped, rows = is_map_program(p), is_row_program(p)  # no matmul: no K to pad (a row program's K is its width)
    width = a.elems[1] if rows else out.elems[1]  # a row program's pages span x's rows (row_reduce's out is m x 1)
    sides = (
        ("M", -(-out.elems[0] // p.tile.rows), plan.grid[0] * h),
        ("N", -(-width // p.tile.cols), plan.grid[1] * w),
        ("K", -(-a.elems[1] // p.tile.cols), plan.k_tiles),
    )
    padded = [
        f"{side} from {need} to {have} tiles (+{(have - need) / need:.0%})"
        for side, need, have in (sides[:2] if mapped or rows else sides)
        if have > need * (1 + PADDING_NOTED)
    ]
    if not padded:
        return []
    if rows:
        return [
            f"  note      the plan pads {', '.join(padded)}: tiles each pass reads too (the reductions leave their"
            " columns out); a band and page that divide the sizes pad less"
        ]
    if mapped:
        return [f"  note      the plan pads {', '.join(padded)}: tiles the kernel maps too; a smaller block pads less"]
    return [
        f"  note      the plan pads {', '.join(padded)}: zeros the kernel multiplies too; a block whose items and"
        " K step divide the sizes pads less"
    ]


def _unit(plan, held: str) -> str:
    word = "strip" if plan.groups > 1 else "item"
    return word if held == "1" else word + "s"


def _staging(bud, scales: int = 0) -> str:
    """The sm_90a form's shared memory past its rings and barriers: the output staging, A's scales' stage (a
    block-scaled GEMM's, `scales` bytes), and the padding that puts each stage on its 1024-byte boundary."""
    said = f", output staging {bud.staging_bytes} B" if bud.staging_bytes else ""
    said += f", A's scales {scales} B" if scales else ""
    padding = bud.padding_bytes - scales
    return said + (f", alignment {padding} B" if padding else "")


def _attention_sm90a(plan, maps: str) -> list[str]:
    """The sm_90a form's attention kernel, in the two lines that describe a GEMM's there."""
    keys, dim = plan.block.ibw * 16, plan.block.osw * 16
    two = plan.block.osh * 16 == 128  # bands of 128 rows: two consumer warpgroups
    who = "two consumer warpgroups of 64 query rows each run" if two else "one consumer warpgroup of 64 query rows runs"
    return [
        "  kernel    sm_90a form: one thread of a producer warpgroup loads Q once a band and K and V a stage at a"
        f" time by TMA, a box a panel ({maps}); {who}",
        f"            S = Q·Kᵀ as wgmma m64n{keys}k16 (K-major B from shared memory), the softmax in registers,"
        f" O += P·V as wgmma m64n{dim}k16 with P from registers",
    ]


def kernel_lines(p: SpatialProgram, art) -> list[str]:
    """The kernel's memory as budget.json has it: its rings, the ones fused away, its shared memory and occupancy;
    then a `note` line for each of the artifact's notes."""
    bud = art.budget
    layout = dict(bud.layouts)
    kept = ", ".join(f"{name} {size} B{_layout_note(PageLayout(layout.get(name, 'row')))}" for name, size in bud.rings)
    kept = kept or "no rings"
    fused = f"; fused into the store (no ring): {', '.join(bud.fused)}" if bud.fused else ""
    opt_in = ", opt-in" if bud.dynamic_opt_in else ""
    if bud.form == "general":
        warps = ", ".join(f"{name} {plural(n, 'warp')}" for name, n in bud.engines)
        memory = [
            f"  kernel    general form: each engine on its own warps ({warps}), rings handed over by mbarriers",
            f"            shared memory {bud.total_bytes} bytes a block (budget.json: all dynamic{opt_in}):"
            f" {kept}, barriers {bud.barrier_bytes} B",
        ]
        if bud.workspace_bytes:
            memory.append(
                f"            workspace {bud.workspace_bytes} bytes of global memory (split-K's partial sums)"
            )
        if art.launch.cooperative:
            memory.append(
                f"            its {art.launch.grid} sites hand over to each other: a cooperative launch, every site"
                f" resident at once ({plural(art.launch.sync_words, 'sync word')} in global memory)"
            )
    elif bud.form == "sm90a":
        from ..lower.cuda.sm90a.blockscale import scale_stage_bytes

        plan = p.plans[0]
        h, w = plan.item_tiles
        k_per = 32 if sized_as(p.precision) == Precision.INT8 else 16  # K elements a wgmma: 32 bytes
        params = art.launch.params
        loads = [m for m in art.launch.tensor_maps if params[m.tensor].role != "output"]
        stores = [m for m in art.launch.tensor_maps if params[m.tensor].role == "output"]
        maps = ", ".join(
            f"{params[m.tensor].name}{'ᵀ' if m.transposed else ''} {m.box[0]}x{m.box[1]}"
            f" {f'{m.swizzle}-byte swizzled' if m.swizzle else 'unswizzled'}"
            for m in loads
        )
        out = ""
        if stores and stores[0].box == (16, 16):  # the first epilogue (`spatialc.lower(..., epilogue="tiles")`)
            out = "; each consumer warp stages its output in shared memory and stores it by TMA, a tile a box"
        elif stores:  # the default: a warpgroup's rows a box (lower/cuda/sm90a/staging.py)
            box, swizzle = stores[0].box, stores[0].swizzle
            shaped = f"{swizzle}-byte swizzled" if swizzle else "unswizzled"
            out = (
                f"; each consumer warpgroup stages its output in shared memory, {shaped} boxes of {box[0]}x{box[1]},"
                " and stores each by TMA"
            )
        in_flight = "one group in flight"
        if program_scales(p) is not None:  # DeepGEMM's promotion (sm90a/blockscale.py)
            in_flight = "into fresh partials, each group waited for and promoted by its scales"
        if is_w4_program(p):  # a W4A16 GEMM (sm90a/dequant.py)
            in_flight = "each step's group waited for; B dequantised into its panels by the consumers"
            maps += ", B's packed tiles a bulk copy a tile row"
        two = bud.blocks_per_sm == 1  # items of 128 rows: two consumer warpgroups; of 64: one, two blocks an SM
        who = "two consumer warpgroups multiply" if two else "one consumer warpgroup multiplies"
        rows = "the two warpgroups' 64 rows each" if two else "one warpgroup's, two blocks sharing an SM"
        memory = [
            "  kernel    sm_90a form: one thread of a producer warpgroup loads each page by TMA, a box a panel (boxes: "
            f"{maps}), {who} with wgmma m64n{w * 16}k{k_per}",
            f"            ({plan.block.ibw * 16 // k_per} a K step, A and B from shared memory by descriptor,"
            f" {in_flight}),"
            f"{' setmaxnreg moves registers to them;' if two else ''} items of {h * 16}x{w * 16}: {rows}{out}",
            f"            shared memory {bud.total_bytes} bytes a block (budget.json: all dynamic{opt_in}, stages on"
            f" 1024 bytes): {kept}, barriers {bud.barrier_bytes} B{_staging(bud, scale_stage_bytes(p))}",
        ]
        if is_attention_program(p):  # one consumer warpgroup a band, alone on its SM
            memory[:2] = _attention_sm90a(plan, maps)
    else:
        memory = [
            f"  kernel    shared memory {bud.total_bytes} bytes a block (budget.json: {bud.static_bytes} static +"
            f" {bud.dyn_bytes} dynamic{opt_in})",
            f"            {kept} ({'dynamic' if bud.rings_dynamic else 'static'}){fused}",
        ]
    if bud.form == "sm90a":  # ptxas allocates for the launch; setmaxnreg then moves registers to the consumers
        from ..lower.cuda.sm90a.plan import PRODUCER_REGS

        if bud.blocks_per_sm > 1:  # paired blocks: no setmaxnreg, each keeps what the launch gives it
            regs = f"at most {bud.regs_est} registers a thread (the blocks share the register file; no setmaxnreg)"
        elif not bud.regs_entry:  # one consumer warpgroup alone on its SM (attention): what the launch gives it
            regs = f"at most {bud.regs_est} registers a thread (one consumer warpgroup; no setmaxnreg)"
        else:
            regs = f"{bud.regs_est} registers a consumer thread and {PRODUCER_REGS} a producer thread after setmaxnreg"
        at = " a thread at launch"
    else:
        regs, at = f"~{bud.regs_est} registers a thread", ""
    return [
        *memory,
        f"  occupancy {plural(bud.blocks_per_sm, 'block')} per SM of {target(p.target).name},"
        f" {bud.threads} threads each, {regs}"
        + (
            f" (ptxas: {bud.regs_ptxas}{at}, spills {bud.spills_ptxas} B"
            + (f", stack {bud.stack_ptxas} B" if bud.stack_ptxas else "")
            + ")"
            if bud.regs_ptxas is not None
            else ""
        ),
        *(
            [
                f"  clusters  {art.launch.cluster} sites each (__cluster_dims__): a multicast group's pages "
                + (
                    "land in each of its blocks from one TMA load (.multicast::cluster)"
                    if bud.form == "sm90a"
                    else "travel through distributed shared memory"
                )
                + f"; the kernel reads {bud.global_read_bytes} bytes from global memory"
            ]
            if getattr(art.launch, "cluster", 1) > 1
            else []
        ),
        f"  census    {sum(art.census.program.values())} ops, printed kernel"
        f" {'agrees' if art.census.agrees else 'DISAGREES'} (each op printed as its own statement)",
        # Every fallback or omission is said: another form than the first choice, no general form beside it.
        *(f"  note      {note}" for note in art.notes),
    ]

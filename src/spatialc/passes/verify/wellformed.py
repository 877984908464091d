"""verify's rule 1, well-formed: everything the other rules, the interpreter and the lowering take for granted.

On the tables: a known target, names that are identifier-like and unique within their kind (ir/names.py), a sane
tile, each tensor's shape and padding, the plan, unique ids, buffers that are whole rings or accumulators, stages
that read inputs and write the output with compute ops the machine knows. On every op: ids that resolve, counts and
pages of at least one, loop variables bound where they are read, loop bounds the kernel's `int` counters hold,
reads from input, parameter or workspace tensors, writes to the output or a workspace, Trip loops that read a
parameter tensor, sites and groups the placement has. All of it is checked before any later rule walks an op, so
no later rule (and nothing after verify) meets an id it cannot resolve or a size it cannot hold.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from ...errors import CoverageError, IllFormedError
from ...ir.ids import LV_ITEM_X, LV_ITEM_Y, LoopVar, SemId, Site, loop_var_name
from ...ir.index import ProgramIndex, where
from ...ir.names import names_fault
from ...ir.nodes import (
    MAX_SEMAPHORES,
    Accumulator,
    ComputeStage,
    DType,
    EngineProgram,
    Plan,
    ReadStage,
    SpatialProgram,
    Tensor,
    TensorRole,
    TileOrder,
    WriteStage,
    accumulator_dtype,
    per_op_list,
)
from ...ir.ops import (
    ACTIVATION_OPS,
    CHOREO_OPS,
    MAX_EXPR_NODES,
    REDUCE_OPS,
    AcquireAcc,
    AddPartial,
    Apply,
    Arg,
    Attention,
    Barrier,
    ChoreoOp,
    Col,
    Compute,
    ComputeOp,
    Const,
    Dequant,
    Expr,
    Flush,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Precision,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Requant,
    Reserve,
    RowArg,
    RowReduce,
    ScaleAcc,
    SemInc,
    SemSet,
    SemWait,
    Span,
    TileAddr,
    Trip,
    VecAxis,
    Wait,
    WriteBarrier,
    WriteTiles,
    arg_indices,
    cols,
    expr_size_fault,
    positions,
    walk,
)
from ...ir.printer import PRINTED_BITS, op_text, plural
from ...ir.validate import op_fault, type_fault
from ...ir.worklist import MAX_SITES
from ...numerics.elementwise import EXACT_LIMIT, OPS
from ...target import TARGETS, SpatialTarget

FLOAT32_MAX = 3.4028234663852886e38
# The frontend's scalar ops; the interpreter, the host emulation and the kernel's epilogue know no others.
# quantize_multiplier's ranges: a Q31 multiplier, a shift of at most 30 left or 31 right, an int8 zero point.
REQUANT_MULTIPLIER = (0, 2**31 - 1)
REQUANT_SHIFT = (-31, 30)
REQUANT_ZERO_POINT = (-128, 127)
# More items than any placement could list (the coverage rule builds a list of them).
MAX_ITEMS = 2**24
# The kernel counts loops, tiles of a tensor and item ids in C `int`s: every bound it prints must fit one.
MAX_INT = 2**31 - 1
MAX_NESTING = 32  # loops inside loops: far more than any schedule needs, few enough for any walk of them
# An item's side or K step, in tiles: above what any target's shared memory can stage one K step of (about 900
# one-byte tiles), so no plan the tile pass makes is refused, yet an item — and with it a tensor's padding — is small.
MAX_ITEM_SIDE = 1024
# A ring's pages: above the ~900 one-tile pages of one-byte elements the largest shared memory of any target holds.
MAX_RING_DEPTH = 1024
# A page's or an accumulator's tiles: at most an item's, MAX_ITEM_SIDE a side (nothing holds more at once).
MAX_BUFFER_TILES = MAX_ITEM_SIDE * MAX_ITEM_SIDE
MAX_REDUCE_COLS = 2**31 - 1  # a row's logical width: what a tensor's side may be


def check_target(p: SpatialProgram, target: SpatialTarget | None = None) -> None:
    """The program names a target spatialc knows, or the one it is verified for."""
    if p.target not in TARGETS and (target is None or target.name != p.target):
        raise IllFormedError(f"the program's target is {p.target!r}; spatialc knows {', '.join(TARGETS)}")


def check_tile(p: SpatialProgram) -> None:
    """The tile has at least one row and one column."""
    if p.tile.rows < 1 or p.tile.cols < 1:
        raise IllFormedError(f"the tile must be at least 1x1 elements, not {p.tile.rows}x{p.tile.cols}")


def _positive(what: str, values: tuple[int, ...]) -> None:
    if any(v < 1 for v in values):
        shown = "x".join(map(str, values)) if len(values) > 1 else str(values[0])
        raise IllFormedError(f"{what} must be ≥ 1, not {shown}")


def _attention_plan(name: str, plan, out, op: Attention) -> None:
    """An attention plan's items — bands of query rows by KV heads — cover its output O: each KV head's `group`
    query heads, each head's rows whole bands."""
    h, w = plan.item_tiles
    if plan.groups != 1 or out.groups != plan.grid[1] * op.group:
        raise IllFormedError(
            f"{name} plans {plan.grid[1]} KV heads of {op.group} query heads, but the output {out.name} holds"
            f" {out.groups} heads"
        )
    if out.tiles != (out.groups * plan.grid[0] * h, w):
        raise IllFormedError(
            f"{name}'s bands of {h} tile rows, {plan.grid[0]} a head, cover {plan.grid[0] * h}x{w} tiles a head, but"
            f" the output tensor {out.name} has {out.tiles[0]}x{out.tiles[1]} for {out.groups} heads"
        )


def check_plans(p: SpatialProgram) -> None:
    """Each plan's fields are ≥ 1, its item (a row program's band: its height) and K step are at most MAX_ITEM_SIDE
    tiles a side, its K is whole K steps, it has at most MAX_ITEMS items, and its grid of items is the output
    tensor's tile grid."""
    out = p.output_tensor()
    # A row program's item is a band of whole rows, never held at once: a site holds a page of it (a K step) and
    # one accumulator tile a row, so its width is bounded only by K (a softmax over a vocabulary of 128k values).
    rows = any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce) for s in p.stages)
    declared = [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Attention)]
    attention = declared[0] if declared else None
    for i, plan in enumerate(p.plans):
        name = f"plan {i}"
        b = plan.block
        _positive(f"{name}'s block (osh x osw x ibw)", (b.osh, b.osw, b.ibw))
        _positive(f"{name}'s sub_blocks", plan.sub_blocks)
        _positive(f"{name}'s grid", plan.grid)
        _positive(f"{name}'s k_tiles", (plan.k_tiles,))
        _positive(f"{name}'s depth", (plan.depth,))
        _positive(f"{name}'s groups", (plan.groups,))
        if plan.depth > MAX_RING_DEPTH:
            raise IllFormedError(f"{name}'s depth is {plan.depth} pages; a ring holds at most {MAX_RING_DEPTH}")
        if plan.groups > MAX_ITEMS or plan.k_tiles > MAX_INT:
            raise IllFormedError(
                f"{name} has {plan.groups} groups and {plan.k_tiles} K tiles; at most {MAX_ITEMS} and {MAX_INT}"
            )
        h, w = plan.item_tiles
        if max(h, b.ibw) > MAX_ITEM_SIDE or w > (MAX_INT if rows else MAX_ITEM_SIDE):
            wide = f", and its bands at most {MAX_INT} wide" if rows else ""
            raise IllFormedError(
                f"{name}'s items are {h}x{w} tiles with K steps of {b.ibw}; no side may exceed"
                f" {MAX_ITEM_SIDE} tiles (no target holds such an item or K step){wide}"
            )
        if plan.k_tiles % b.ibw:
            raise IllFormedError(f"{name} has {plan.k_tiles} K tiles, not a whole number of K steps of {b.ibw}")
        if plan.items > MAX_ITEMS:
            raise IllFormedError(
                f"{name}'s grid of {plan.grid[0]}x{plan.grid[1]} items has {plan.items}; at most"
                f" {MAX_ITEMS} are allowed"
            )
        if out is None:
            raise IllFormedError(f"{name} lays out an output tensor, but the program has none")
        if attention is not None:  # its items are (band, KV head), each running the KV head's query heads in turn
            _attention_plan(name, plan, out, attention)
            continue
        if out.groups != plan.groups:
            raise IllFormedError(f"{name} plans {plan.groups} group(s), but the output {out.name} holds {out.groups}")
        if out.tiles != (plan.groups * plan.grid[0] * h, plan.grid[1] * w):
            each = f" in each of {plan.groups} groups" if plan.groups > 1 else ""
            raise IllFormedError(
                f"{name}'s {plan.grid[0]}x{plan.grid[1]} items of {h}x{w} tiles cover"
                f" {plan.grid[0] * h}x{plan.grid[1] * w} tiles{each}, but the output tensor {out.name} has"
                f" {out.tiles[0]}x{out.tiles[1]}"
            )


def _padding(plans: tuple[Plan, ...]) -> tuple[int, int]:
    """The most tiles whole blocks add to a tensor's rows and columns: rows are padded to whole items (A, C) or
    K steps (B), columns to whole items (B, C, a bias row) or K steps (A). None without a plan."""
    rows = max((max(q.item_tiles[0], q.block.ibw) - 1 for q in plans), default=0)
    cols = max((max(q.item_tiles[1], q.block.ibw) - 1 for q in plans), default=0)
    return rows, cols


def check_tensors(p: SpatialProgram) -> None:
    """Each tensor has elements, a tile grid that holds them, no more padding than whole blocks add, and no more
    tiles than a C int counts."""
    pad = _padding(p.plans)
    tile = (p.tile.rows, p.tile.cols)
    for t in p.tensors:
        _positive(f"tensor {t.name}'s elements", t.elems)
        _positive(f"tensor {t.name}'s tile grid", t.tiles)
        _positive(f"tensor {t.name}'s groups", (t.groups,))
        if t.tiles[0] % t.groups:
            raise IllFormedError(
                f"tensor {t.name} stacks {t.groups} groups in {t.tiles[0]} rows of tiles, not a whole number each"
            )
        need = tuple(math.ceil(e / s) for e, s in zip(t.elems, tile, strict=True))
        for dim in (0, 1):
            if not need[dim] <= t.group_tiles[dim] <= need[dim] + pad[dim]:
                raise IllFormedError(_grid_fault(t, tile, need, pad, dim, bool(p.plans)))
        if t.tiles[0] * t.tiles[1] > MAX_INT:
            raise IllFormedError(
                f"tensor {t.name} has {t.tiles[0]}x{t.tiles[1]} tiles; the kernel indexes tiles with a C int,"
                f" so at most {MAX_INT}"
            )


def _grid_fault(
    t: Tensor, tile: tuple[int, int], need: tuple[int, ...], pad: tuple[int, int], dim: int, planned: bool
) -> str:
    side = ("rows", "columns")[dim]
    grid = t.group_tiles
    each = f" (each of its {t.groups} groups)" if t.groups > 1 else ""
    head = (
        f"tensor {t.name}{each}: {t.elems[0]}x{t.elems[1]} elements in {tile[0]}x{tile[1]} tiles take {need[0]}x"
        f"{need[1]} tiles, but its tile grid is {grid[0]}x{grid[1]}"
    )
    if grid[dim] < need[dim]:
        return f"{head}, too few {side} of tiles to hold it"
    if pad[dim]:
        return f"{head}; whole blocks pad at most {pad[dim]} more {side} of tiles"
    return f"{head}; {'the plan' if planned else 'a program without a plan'} pads no {side} of tiles"


def role_text(t: Tensor) -> str:
    """'the output tensor', 'an input tensor', 'a workspace tensor', 'a parameter tensor'."""
    texts = {
        TensorRole.OUTPUT: "the output tensor",
        TensorRole.INPUT: "an input tensor",
        TensorRole.WORKSPACE: "a workspace tensor",
    }
    return texts.get(t.role, "a parameter tensor")


def compute_fault(op: ComputeOp, precision: Precision) -> str | None:
    """Why compute op `op` of a `precision` program cannot run, or None."""
    match op:
        case Map(expr):
            return expr_fault(expr, precision)
        case Requant(multiplier, shift, zero_point):
            for what, v, (lo, hi) in (
                ("multiplier", multiplier, REQUANT_MULTIPLIER),
                ("shift", shift, REQUANT_SHIFT),
                ("zero point", zero_point, REQUANT_ZERO_POINT),
            ):
                if not lo <= v <= hi:
                    return f"a requant {what} lies in [{lo}, {hi}], not {v}"
        case RowReduce(name, n, _, width):
            if name not in REDUCE_OPS:
                return f"no row reduction {name!r}: the reductions are {', '.join(REDUCE_OPS)}"
            if not 1 <= n <= MAX_REDUCE_COLS or not 1 <= width <= MAX_ITEM_SIDE:
                return (
                    f"a row reduction reduces 1 to {MAX_REDUCE_COLS} columns in pages 1 to {MAX_ITEM_SIDE} tiles wide,"
                    f" not {n} columns in pages {width} wide"
                )
        case MatmulTiles(block, sub_blocks, _):
            if min(block.osh, block.osw, block.ibw, *sub_blocks) < 1:
                return (
                    f"a tile matmul's block ({block.osh}x{block.osw}x{block.ibw}) and sub-blocks"
                    f" ({sub_blocks[0]}x{sub_blocks[1]}) must be ≥ 1"
                )
    return None


# ---- rule 1 on the tables: ids unique and resolving, sizes sane -----------------------------------------------


def _unique(kind: str, ids: Iterable[int]) -> None:
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            raise IllFormedError(f"two {kind}s have id {int(i)}")
        seen.add(i)


def check_types(p: SpatialProgram) -> None:
    """Values of the IR's types everywhere (`ir.validate`: the tables, then each op of each distinct op list), and
    loops nested at most MAX_NESTING deep: checked without recursion, before anything hashes or walks an op tree."""
    fault = type_fault(p)
    if fault is not None:
        raise IllFormedError(f"{fault}: the program must hold the IR's own types (spatialc.ir)")
    seen: set[int] = set()
    for prog in p.schedule.programs if p.schedule else ():
        if id(prog.ops) in seen:
            continue
        seen.add(id(prog.ops))
        stack = [(prog.ops, 0)]
        while stack:
            ops, depth = stack.pop()
            fault = f"loops nested more than {MAX_NESTING} deep" if depth > MAX_NESTING else None
            bad = None  # the op holding the fault, where one does
            for op in ops:
                if fault is None:
                    fault = op_fault(op, type(op).__name__ if isinstance(op, CHOREO_OPS) else "an op")
                    bad = op if fault is not None else None
                if fault is None and isinstance(op, Loop):
                    if not isinstance(op.body, tuple):
                        fault, bad = f"Loop.body: expected a tuple, found {type(op.body).__name__}", op
                    else:
                        stack.append((op.body, depth + 1))
            if fault is not None:
                raise IllFormedError(
                    f"{where(prog.site, prog.engine.value)}: {fault}: ops must hold the IR's own types (spatialc.ir)",
                    site=int(prog.site),
                    engine=prog.engine.value,
                    op=_shown(p, bad),
                )


def _shown(p: SpatialProgram, op: object) -> str | None:
    """The op's text as the printer gives it (what errors name ops by), where an op of ill-typed fields prints."""
    if op is None:
        return None
    try:
        return op_text(p, op)  # type: ignore[arg-type]
    except Exception:  # fields of no type the printer knows: the error names the engine only
        return None


def check_tables(p: SpatialProgram, target: SpatialTarget | None = None) -> None:
    """Rule 1 for everything but the ops: a known target, sane shapes and plan, unique ids, resolving references,
    sane buffer sizes, stages that read inputs and write the output with sane compute ops."""
    check_target(p, target)
    check_tile(p)
    check_plans(p)
    check_tensors(p)
    _unique("tensor", (t.id for t in p.tensors))
    _unique("buffer", (b.id for b in p.buffers))
    _unique("semaphore", (s.id for s in p.semaphores))
    for sem in p.semaphores:
        if not -MAX_INT <= sem.initial <= MAX_INT:
            raise IllFormedError(f"semaphore {sem.name} starts at {sem.initial}; a count is kept in a C int")
    _unique("stage", (s.id for s in p.stages))
    fault = names_fault(p)
    if fault is not None:
        raise IllFormedError(fault)
    _check_buffers(p)
    _check_stages(p)
    _check_layout(p)


def _check_buffers(p: SpatialProgram) -> None:
    buffers = {b.id: b for b in p.buffers}
    for b in p.buffers:
        match b.kind:
            case Accumulator(tiles) if not 1 <= tiles <= MAX_BUFFER_TILES:
                raise IllFormedError(
                    f"accumulator {b.name} must hold 1 to {MAX_BUFFER_TILES} tiles (an item's), not {tiles}",
                    buffer=b.name,
                )
            case Accumulator():
                pass
            case kind if not (1 <= kind.depth_pages <= MAX_RING_DEPTH and 1 <= kind.page_tiles <= MAX_BUFFER_TILES):
                raise IllFormedError(
                    f"ring {b.name} must have 1 to {MAX_RING_DEPTH} pages of 1 to {MAX_BUFFER_TILES} tiles (no"
                    f" target holds more), not {kind.depth_pages} x {kind.page_tiles}",
                    buffer=b.name,
                )
        if b.origin is None:
            continue
        template = buffers.get(b.origin)
        if template is None or template.origin is not None:
            raise IllFormedError(
                f"buffer {b.name} is a copy of buffer {int(b.origin)}, which is not a template buffer", buffer=b.name
            )
        if template.kind != b.kind:
            raise IllFormedError(
                f"buffer {b.name} is a copy of {template.name} but is {b.kind}, not"
                f" {template.kind}: the copies of a template are one ring",
                buffer=b.name,
            )


def expr_fault(expr: Expr, precision: Precision) -> str | None:
    """Why an elementwise expression of a `precision` program cannot run, or None: no more nodes, nor ops nested
    deeper, than `ir.ops.expr_size_fault` allows, ops the table has, with their arity and parameters, constants the
    program's values hold, integer ops in an integer program."""
    too_large = expr_size_fault(expr)
    if too_large is not None:
        return too_large
    nodes = list(_expr_nodes(expr, MAX_EXPR_NODES + 1))
    integer = precision == Precision.INT8
    for node in nodes:
        match node:
            case Apply(name, args, params):
                op = OPS.get(name)
                if op is None:
                    return f"elementwise op {name!r} is none of the table's ({', '.join(OPS)})"
                if len(args) != op.arity or len(params) != len(op.params):
                    want = f"{op.arity} operand(s)" + (f" and parameters {', '.join(op.params)}" if op.params else "")
                    return f"{name} takes {want}, not {len(args)} and {len(params)} parameter(s)"
                if any(not math.isfinite(v) for v in params):
                    return f"{name}'s parameters must be finite numbers, not {list(params)}"
                if integer and not op.integer:
                    what = f"activation {name}" if name in ACTIVATION_OPS.values() else name
                    return f"{what} is float arithmetic; an int8 program's epilogue is integer arithmetic"
                if integer and any(v != int(v) or abs(v) >= EXACT_LIMIT for v in params):
                    return f"an int8 program's {name} takes whole-number parameters within ±2^62, not {list(params)}"
                if name == "clamp" and params[0] > params[1]:
                    return f"clamp's bounds are in order, lo ≤ hi, not {params[0]!r} > {params[1]!r}"
            case Lit(value):
                if not math.isfinite(value):
                    return f"an elementwise constant must be a finite number, not {value!r}"
                if integer and (value != int(value) or abs(value) >= EXACT_LIMIT):
                    return (
                        f"an int8 program's epilogue is integer arithmetic, exact: a constant needs a whole number"
                        f" within ±2^62, not {value!r}"
                    )
                if not integer and abs(value) > FLOAT32_MAX:
                    return (
                        f"a {precision.value} program's epilogue is float32: the constant {value!r} is beyond float32"
                    )
            case Arg(i) if i < 0:
                return f"an expression reads input page {i}"
            case RowArg(i, width) if i < 0 or width < 1:
                return f"an expression reads row vector {i} against pages {width} tiles wide"
            case Col(_, _, width) if width < 1:
                return f"a column vector is at least 1 tile wide, not {width}"
    return None


def _expr_nodes(expr: Expr, limit: int):
    """The nodes of `expr`, depth first, at most `limit` of them."""
    stack, seen = [expr], 0
    while stack and seen < limit:
        node = stack.pop()
        seen += 1
        yield node
        if isinstance(node, Apply):
            stack.extend(reversed(node.args))


def _check_stages(p: SpatialProgram) -> None:
    buffers, tensors = {b.id for b in p.buffers}, {t.id: t for t in p.tensors}
    for s in p.stages:
        for b in (*s.ins, *s.outs):
            if b not in buffers:
                raise IllFormedError(f"stage {s.name} names buffer {int(b)}, which does not exist")
        match s.kind:
            case ReadStage(t) | WriteStage(t) if t not in tensors:
                raise IllFormedError(f"stage {s.name} names tensor {int(t)}, which does not exist")
            case ComputeStage(Map(expr)) if any(c.tensor not in tensors for c in cols(expr)):
                t = next(c.tensor for c in cols(expr) if c.tensor not in tensors)
                raise IllFormedError(f"stage {s.name} names tensor {int(t)}, which does not exist")
            case ReadStage(t) if tensors[t].role == TensorRole.OUTPUT:
                raise IllFormedError(
                    f"stage {s.name} reads {tensors[t].name}, the output tensor; a read stage reads"
                    " an input, a parameter or a workspace tensor"
                )
            case WriteStage(t) if tensors[t].role not in (TensorRole.OUTPUT, TensorRole.WORKSPACE):
                raise IllFormedError(
                    f"stage {s.name} writes {tensors[t].name}, {role_text(tensors[t])}; a write"
                    " stage writes the output tensor or a workspace tensor"
                )
            case ComputeStage(op) if (why := compute_fault(op, p.precision)) is not None:
                raise IllFormedError(f"stage {s.name}: {why}")
    want = accumulator_dtype(p.precision)
    for w in p.tensors:
        if w.role == TensorRole.WORKSPACE and (w.dtype != want or w.order != TileOrder.ROW):
            raise IllFormedError(
                f"workspace tensor {w.name} holds {w.dtype.value} tiles stored {w.order.value}-major; a"
                f" {p.precision.value} program's partial sums are {want.value}, stored row-major like its accumulator"
            )


def _check_layout(p: SpatialProgram) -> None:
    if p.placement is None:
        if p.schedule is not None:
            raise IllFormedError("the program has a schedule but no placement")
        return
    if p.plan is None:
        raise IllFormedError(f"a placed program needs exactly one plan, not {len(p.plans)}")
    # The kind names the rule the items follow (ir/worklist.py), else it is a label and the items run as listed.
    if not 0 <= p.placement.band <= MAX_ITEMS:
        raise IllFormedError(
            f"a placement of band {p.placement.band}: a grouped placement's rows a band, 0 to {MAX_ITEMS}"
        )
    gy, gx = p.placement.multicast
    if gy < 1 or gx < 1 or gy * gx > MAX_SITES:
        raise IllFormedError(f"a placement of multicast groups {gy}x{gx}: each side ≥ 1, at most {MAX_SITES} sites")
    if len(p.placement.items_of_site) > MAX_SITES:  # as many sites as `build` takes
        raise IllFormedError(f"a placement of {len(p.placement.items_of_site)} sites; at most {MAX_SITES}")
    if len(p.semaphores) > MAX_SEMAPHORES:
        raise IllFormedError(f"a program of {len(p.semaphores)} semaphores; at most {MAX_SEMAPHORES}")
    sites = set(p.placement.sites)
    if len(sites) != len(p.placement.items_of_site):
        dup = next(s for s in p.placement.sites if p.placement.sites.count(s) > 1)
        raise CoverageError(f"site {int(dup)} is listed twice in the placement", site=int(dup))
    _unique("group", (g.id for g in p.placement.groups))
    for g in p.placement.groups:
        for s in g.sites:
            if s not in sites:
                raise IllFormedError(
                    f"group {int(g.id)} names site {int(s)}, which the placement does not have", site=int(s)
                )
            if g.sites.count(s) > 1:  # a multicast would set its flag twice, a barrier count it twice
                raise IllFormedError(f"group {int(g.id)} names site {int(s)} twice", site=int(s))
    seen: set[tuple[Site, str]] = set()
    for prog in p.schedule.programs if p.schedule else ():
        if prog.site not in sites:
            raise IllFormedError(
                f"{where(prog.site, prog.engine.value)}: the placement has no site {int(prog.site)}",
                site=int(prog.site),
                engine=prog.engine.value,
            )
        if (prog.site, prog.engine.value) in seen:
            raise IllFormedError(
                f"{where(prog.site, prog.engine.value)}: two programs for one engine",
                site=int(prog.site),
                engine=prog.engine.value,
            )
        seen.add((prog.site, prog.engine.value))


# ---- rule 1 on the ops ----------------------------------------------------------------------------------------


def check_ops(index: ProgramIndex, programs: Iterable[EngineProgram]) -> None:
    """Rule 1 on every op of `programs` (one program per distinct op tuple is enough)."""
    for prog in programs:
        _OpCheck(index, prog).body(prog.ops, ())


def raise_counts(programs: Iterable[EngineProgram]) -> Counter[tuple[Site, SemId]]:
    """How far every (site, semaphore) is raised over `programs`, at most: loops run their counts, run-time counts
    their bounds."""
    total: Counter[tuple[Site, SemId]] = Counter()

    def walk_ops(ops: tuple[ChoreoOp, ...], times: int) -> None:
        for op in ops:
            if isinstance(op, Loop):
                n = op.count.n if isinstance(op.count, Const) else op.count.bound
                walk_ops(op.body, times * max(n, 0))
            elif isinstance(op, SemInc) and op.by > 0:
                total[(op.at, op.sem)] += op.by * times

    # An op list with no SemInc adds nothing (each shared list looked into once).
    for prog, raises in per_op_list(programs, lambda ops: any(isinstance(op, SemInc) for op in walk(ops))):
        if raises:
            walk_ops(prog.ops, 1)
    return total


def check_sem_counts(index: ProgramIndex, programs: Iterable[EngineProgram]) -> None:
    """No site's copy of a semaphore can pass what a C int holds: its start plus every raise any site makes of it
    (`raise_counts`) — the kernel keeps the count in an `int`."""
    total = raise_counts(programs)
    for (site, sem), raised in total.items():
        start = index.sems[sem].initial  # type: ignore[index]
        if start + raised > MAX_INT:
            raise IllFormedError(
                f"site {int(site)}'s copy of semaphore {index.sems[sem].name} can reach {start + raised}"  # type: ignore[index]
                f" ({start} and the raises of it); the kernel keeps a count in a C int, at most {MAX_INT}",
                site=int(site),
            )


_GroupOp = McastSetValid | McastSend | Barrier  # the ops that name a group


def check_site_groups(index: ProgramIndex, programs: Iterable[EngineProgram]) -> None:
    """A site names only groups it belongs to (the one part of rule 1 that depends on the site, not the ops)."""
    for prog, named in per_op_list(programs, lambda ops: tuple(_group_ops(ops))):  # each shared list walked once
        for op in named:
            if prog.site not in index.groups[op.group].sites:
                raise index.at_op(IllFormedError, prog, op, f"site {int(prog.site)} is not in group {int(op.group)}")


def _group_ops(ops: tuple[ChoreoOp, ...]) -> Iterable[_GroupOp]:
    for op in ops:
        if isinstance(op, Loop):
            yield from _group_ops(op.body)
        elif isinstance(op, McastSetValid | McastSend | Barrier):
            yield op


class _OpCheck:
    """One walk over one engine program, raising IllFormedError at the first op that is not well-formed."""

    def __init__(self, index: ProgramIndex, prog: EngineProgram):
        self.index, self.prog = index, prog

    def fail(self, op: ChoreoOp, why: str, buf=None) -> IllFormedError:
        text = self.index.op(op)
        return IllFormedError(
            f"{where(self.prog.site, self.prog.engine.value)}: {text} — {why}",
            site=int(self.prog.site),
            engine=self.prog.engine.value,
            op=text,
            buffer=self.index.buffer_of(op) if buf is None else self.index.name(buf),
        )

    def body(self, ops: tuple[ChoreoOp, ...], bound: tuple[LoopVar, ...]) -> None:
        for op in ops:
            if isinstance(op, Loop):
                self.loop(op, bound)
                self.body(op.body, (*bound, op.var))
            else:
                self.leaf(op, bound)

    def loop(self, op: Loop, bound: tuple[LoopVar, ...]) -> None:
        if op.var in (LV_ITEM_Y, LV_ITEM_X):
            raise self.fail(op, f"{loop_var_name(op.var)} stands for the item's coordinate; no loop may bind it")
        if op.var in bound:
            raise self.fail(op, f"loop variable {loop_var_name(op.var)} is already bound by an enclosing loop")
        match op.count:
            case Const(n) if n < 0:
                raise self.fail(op, f"a loop count must be ≥ 0, not {n}")
            case Const(n) if n > MAX_INT:
                shown = n if n.bit_length() <= PRINTED_BITS else f"a number of {n.bit_length()} bits"
                raise self.fail(
                    op, f"a loop count must be at most {MAX_INT} (the kernel counts in a C int), not {shown}"
                )
            case Trip(tid, index, limit):
                t = self.index.tensors.get(tid)
                if t is None:
                    raise self.fail(op, f"its trip count reads tensor {int(tid)}, which does not exist")
                if t.role != TensorRole.PARAMETER:
                    raise self.fail(
                        op,
                        f"its trip count reads {t.name}, an {t.role.value} tensor; trip counts come from a"
                        " parameter tensor",
                    )
                lo, hi = index, index
                placed = self.index.p.plan.placed if self.index.p.plan is not None else (1, 1)
                for var, stride in op.count.steps:
                    if var not in (LV_ITEM_Y, LV_ITEM_X):
                        raise self.fail(
                            op, f"its trip count's element steps with {loop_var_name(var)}; only item_y and item_x may"
                        )
                    reach = stride * (placed[0 if var == LV_ITEM_Y else 1] - 1)
                    lo, hi = lo + min(reach, 0), hi + max(reach, 0)
                if not 0 <= lo <= hi < t.elems[0] * t.elems[1]:
                    raise self.fail(
                        op,
                        f"its trip count reads elements {lo}..{hi} of {t.name}, which has {t.elems[0] * t.elems[1]}",
                    )
                if not 0 <= limit <= MAX_INT:
                    raise self.fail(op, f"a trip bound must be ≥ 0 and at most {MAX_INT}, not {limit}")
                if not 1 <= op.count.per <= MAX_INT:
                    raise self.fail(op, f"a trip count's divisor must be ≥ 1 and at most {MAX_INT}, not {op.count.per}")
            case Span(base, per, limit, steps):
                if not 0 <= limit <= MAX_INT or not 1 <= per <= MAX_INT or abs(base) > MAX_INT:
                    raise self.fail(
                        op,
                        f"a per-item count's bound (0..{MAX_INT}), divisor (1..{MAX_INT}) and base (within"
                        f" ±{MAX_INT}) are out of range: {limit}, {per}, {base}",
                    )
                for var, stride in steps:
                    if var not in (LV_ITEM_Y, LV_ITEM_X) or abs(stride) > MAX_INT:
                        raise self.fail(
                            op,
                            f"a per-item count steps with the item's coordinates (item_y, item_x) by at most"
                            f" {MAX_INT}, not {loop_var_name(var)} by {stride}",
                        )

    def buf(self, op: ChoreoOp, bid) -> None:
        if bid not in self.index.buffers:
            raise self.fail(op, f"buffer {int(bid)} does not exist (the program has {len(self.index.buffers)})", bid)

    def tensor(self, op: ChoreoOp, tid) -> Tensor:
        t = self.index.tensors.get(tid)
        if t is None:
            raise self.fail(op, f"tensor {int(tid)} does not exist")
        return t

    def leaf(self, op: ChoreoOp, bound: tuple[LoopVar, ...]) -> None:
        match op:
            case Reserve(buf, n) | Push(buf, n) | Wait(buf, n) | Pop(buf, n):
                self.buf(op, buf)
                if not 1 <= n <= MAX_RING_DEPTH:
                    raise self.fail(op, f"an op moves 1 to {MAX_RING_DEPTH} pages (a ring's most), not {n}", buf)
            case ReadTiles() | WriteTiles():
                self.block(op, bound)
            case AcquireAcc(buf) | ReleaseAcc(buf) | Flush(buf) | McastSend(buf=buf):
                self.buf(op, buf)
            case PackAcc(acc, to, tiles, _):
                self.buf(op, acc)
                self.buf(op, to)
                if not 1 <= tiles <= MAX_BUFFER_TILES:
                    raise self.fail(op, f"a pack moves 1 to {MAX_BUFFER_TILES} tiles, not {tiles}", to)
            case Compute():
                self.compute(op, bound)
            case ReadBarrier() | WriteBarrier():
                pass
            case SemSet(_, v) | SemWait(_, v) | McastSetValid(_, _, v) if not -MAX_INT <= v <= MAX_INT:
                raise self.fail(op, f"a semaphore count must be within ±{MAX_INT} (the kernel keeps it in a C int)")
            case SemInc(_, _, by) if not -MAX_INT <= by <= MAX_INT:
                raise self.fail(op, f"a semaphore raise must be within ±{MAX_INT} (the kernel adds it to a C int)")
            case SemSet() | SemInc() | SemWait() | McastSetValid() | Barrier():
                pass
            case _:
                raise self.fail(op, "not a choreography op")
        if isinstance(op, SemSet | SemInc | SemWait | McastSetValid) and op.sem not in self.index.sems:
            raise self.fail(op, f"semaphore {int(op.sem)} does not exist")
        if isinstance(op, McastSetValid | McastSend | Barrier) and op.group not in self.index.groups:
            raise self.fail(op, f"group {int(op.group)} does not exist")
        if isinstance(op, SemInc) and op.at not in self.index.sites:
            raise self.fail(op, f"site {int(op.at)} is not a site of the placement")

    def block(self, op: ReadTiles | WriteTiles, bound: tuple[LoopVar, ...]) -> None:
        """A read from an input, parameter or workspace tensor, a write to the output or a workspace, of a block of at
        least one tile."""
        buf = op.into if isinstance(op, ReadTiles) else op.src
        self.buf(op, buf)
        t = self.tensor(op, op.tensor)
        if isinstance(op, ReadTiles) and t.role == TensorRole.OUTPUT:
            raise self.fail(
                op,
                f"it reads {t.name}, the output tensor, into {self.index.name(buf)}; a read comes"
                " from an input, a parameter or a workspace tensor",
                buf,
            )
        if isinstance(op, WriteTiles) and t.role not in (TensorRole.OUTPUT, TensorRole.WORKSPACE):
            raise self.fail(
                op,
                f"it writes {self.index.name(buf)} to {t.name}, {role_text(t)}; only the output tensor and workspace"
                " tensors are written",
                buf,
            )
        self.addr(op, op.at, bound)
        if not (1 <= op.block_h <= MAX_ITEM_SIDE and 1 <= op.block_w <= MAX_ITEM_SIDE):
            raise self.fail(
                op, f"a block must be 1x1 to {MAX_ITEM_SIDE}x{MAX_ITEM_SIDE} tiles, not {op.block_h}x{op.block_w}"
            )
        if op.rows_from is not None:
            sizes = self.tensor(op, op.rows_from)
            if sizes.role != TensorRole.PARAMETER or sizes.dtype != DType.INT32 or sizes.elems != (1, t.groups):
                raise self.fail(
                    op,
                    f"its row counts come from {sizes.name}, {role_text(sizes)} of {sizes.elems[0]}x{sizes.elems[1]}"
                    f" {sizes.dtype.value}; they are an int32 parameter of one value per group of {t.name}"
                    f" (1x{t.groups})",
                    buf,
                )
            if t.order != TileOrder.ROW:
                raise self.fail(op, f"it limits the rows of {t.name}, whose tiles are column-major", buf)

    def addr(self, op: ChoreoOp, at: TileAddr, bound: tuple[LoopVar, ...]) -> None:
        """Every variable of an address is an item coordinate or bound by an enclosing loop."""
        for var, _ in at.steps:
            if var not in (LV_ITEM_Y, LV_ITEM_X) and var not in bound:
                raise self.fail(op, f"its address uses {loop_var_name(var)}, which no enclosing loop binds")

    def compute(self, op: Compute, bound: tuple[LoopVar, ...]) -> None:
        for b in (*op.ins, *op.outs, *(x for x in (op.acc, op.acc_reload) if x is not None)):
            self.buf(op, b)
        if isinstance(op.op, MatmulTiles) and (len(op.ins) != 2 or op.outs or op.acc is None):
            raise self.fail(op, "a tile matmul reads two rings (A, B) and adds into an accumulator; it fills no ring")
        if isinstance(op.op, AddPartial) and (len(op.ins) != 1 or op.outs or op.acc is None):
            raise self.fail(op, "adding a partial sum reads one ring into an accumulator; it fills no ring")
        if isinstance(op.op, RowReduce) and (len(op.ins) != 1 or op.outs or op.acc is None):
            raise self.fail(op, "a row reduction reads one ring into an accumulator; it fills no ring")
        if isinstance(op.op, ScaleAcc) and (len(op.ins) != 1 or op.outs or op.acc is None):
            raise self.fail(op, "rescaling an accumulator reads one ring (a row vector) into it; it fills no ring")
        if isinstance(op.op, Attention):
            raise self.fail(
                op,
                "attention is a stage's declaration, not an op an engine runs (its schedule runs the"
                " online recurrence)",
            )
        why = compute_fault(op.op, self.index.p.precision)
        if why is not None:
            raise self.fail(op, why)
        elementwise = not isinstance(op.op, MatmulTiles | AddPartial | RowReduce | ScaleAcc)
        pages = max(arg_indices(op.op.expr), default=0) + 1 if isinstance(op.op, Map) else 1
        if elementwise and (len(op.ins) != pages or len(op.outs) != 1 or op.acc is not None):
            raise self.fail(
                op,
                f"an elementwise compute reads the {plural(pages, 'ring')} its expression names and fills one; it"
                " names no accumulator",
            )
        if isinstance(op.op, Map):
            for c in cols(op.op.expr):
                self.bias(op, c, bound)
            for at in positions(op.op.expr):
                self.addr(op, at, bound)
        if isinstance(op.op, RowReduce):
            self.addr(op, op.op.at, bound)
        if isinstance(op.op, Dequant):
            self.dequant(op, op.op, bound)

    def dequant(self, op: Compute, dq: Dequant, bound: tuple[LoopVar, ...]) -> None:
        """A dequant's scales and zero points are parameter tensors, read at addresses of bound variables (that
        they hold one value per group and column of the weights is rule 8's `declared`)."""
        for tid in (dq.scale, dq.zero):
            if tid is None:
                continue
            t = self.tensor(op, tid)
            if t.role != TensorRole.PARAMETER:
                raise self.fail(op, f"a dequant's scales and zero points are parameter tensors; {t.name} is {t.role}")
        if dq.width < 1 or dq.group < 1:
            raise self.fail(
                op, f"a dequant's pages are ≥ 1 tile wide and its groups ≥ 1 row, not {dq.width}, {dq.group}"
            )
        self.addr(op, dq.rows, bound)
        self.addr(op, dq.cols, bound)

    def bias(self, op: Compute, bias: Col, bound: tuple[LoopVar, ...]) -> None:
        """A bias names a parameter row, read at an address of bound variables (that it holds one value per column
        of the values it is added to — C's, or a computed operand's — is rule 8's `declared`)."""
        t = self.tensor(op, bias.tensor)
        if bias.axis == VecAxis.ROW and (t.role != TensorRole.PARAMETER or t.elems[1] != 1 or t.tiles[1] != 1):
            raise self.fail(
                op,
                f"a row vector (a per-row scale) is a parameter tensor of one column of values in one column of tiles;"
                f" {t.name} is a {t.role.value} tensor of {t.elems[0]}x{t.elems[1]} in {t.tiles[0]}x{t.tiles[1]}"
                " tiles",
            )
        if bias.axis == VecAxis.COL and (t.role != TensorRole.PARAMETER or t.elems[0] != 1 or t.tiles[0] != 1):
            raise self.fail(
                op,
                f"a column vector (a bias) is a parameter tensor of one row of values in one row of tiles; {t.name} is"
                " a"
                f" {t.role.value} tensor of {t.elems[0]}x{t.elems[1]} in {t.tiles[0]}x{t.tiles[1]} tiles",
            )
        if bias.width < 1:
            raise self.fail(op, f"a column vector is at least 1 tile wide, not {bias.width}")
        self.addr(op, bias.at, bound)

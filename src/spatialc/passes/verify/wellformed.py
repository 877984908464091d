"""verify's rule 1, well-formed: everything the other rules, the interpreter and the lowering take for granted.

On the tables: a known target, names that are identifier-like and unique within their kind (ir/names.py), a sane
tile, each tensor's shape and padding, the plan, unique ids, buffers that are whole rings or accumulators, stages
that read inputs and write the output with compute ops the machine knows. On every op: ids that resolve, counts and
pages of at least one, loop variables bound where they are read, loop bounds the kernel's `int` counters hold,
reads from input, parameter or workspace tensors, writes to the output or a workspace, Trip loops that read a
parameter tensor, sites and groups the placement has. All of it is checked before any later rule walks an op, so
no later rule (and nothing after verify) meets an id it cannot resolve or a size it cannot hold.

This module checks the tables; `wellformed_ops` the ops, `wellformed_compute` the compute ops and expressions, both
against the bounds in `limits`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ...errors import CoverageError, IllFormedError
from ...ir.ids import Site
from ...ir.index import where
from ...ir.names import names_fault, shown_name
from ...ir.nodes import (
    MAX_SEMAPHORES,
    Accumulator,
    ComputeStage,
    Placement,
    Plan,
    ReadStage,
    SpatialProgram,
    Tensor,
    TensorRole,
    TileOrder,
    WriteStage,
    accumulator_dtype,
)
from ...ir.ops import CHOREO_OPS, Attention, ColReduce, Loop, Map, RowReduce, cols
from ...ir.printer import op_text
from ...ir.serde import MAX_PLANS, MAX_TABLE
from ...ir.validate import ID_RANGE, op_fault, type_fault
from ...ir.worklist import MAX_SITES
from ...target import TARGETS, SpatialTarget
from .limits import MAX_BUFFER_TILES, MAX_INT, MAX_ITEM_SIDE, MAX_ITEMS, MAX_NESTING, MAX_RING_DEPTH
from .wellformed_compute import compute_fault


def check_target(p: SpatialProgram, target: SpatialTarget | None = None) -> None:
    """The program names a target spatialc knows, or the one it is verified for."""
    if p.target not in TARGETS and (target is None or target.name != p.target):
        raise IllFormedError(f"the program's target is {shown_name(p.target)}; spatialc knows {', '.join(TARGETS)}")


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
    out, what = p.output_tensor(), "the output tensor"
    # A row program's item is a band of whole rows, never held at once: a site holds a page of it (a K step) and
    # one accumulator tile a row, so its width is bounded only by K (a softmax over a vocabulary of 128k values).
    rows = any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce) for s in p.stages)
    # A column program's item is a band of whole columns, walked down a page at a time: its height, K, is bounded so.
    columns = any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, ColReduce) for s in p.stages)
    if (
        rows or columns
    ):  # its bands cover the rows it reads, which an output of pages shares (one of row vectors is m × 1)
        tensors = {t.id: t for t in p.tensors}  # (stages' references are checked after the plans)
        read = [tensors.get(s.kind.tensor) for s in p.stages if isinstance(s.kind, ReadStage)]  # type: ignore[union-attr]
        if read and read[0] is not None:
            out, what = read[0], "the rows' tensor"
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
        if (
            h > (MAX_INT if columns else MAX_ITEM_SIDE)
            or b.ibw > MAX_ITEM_SIDE
            or w > (MAX_INT if rows else MAX_ITEM_SIDE)
        ):
            wide = (
                f", and its bands at most {MAX_INT} wide"
                if rows
                else f", and its bands at most {MAX_INT} high"
                if columns
                else ""
            )
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
                f" {plan.grid[0] * h}x{plan.grid[1] * w} tiles{each}, but {what} {out.name} has"
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


# ---- rule 1 on the tables: ids unique and resolving, sizes sane -----------------------------------------------


def _unique(kind: str, ids: Iterable[int]) -> None:
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            raise IllFormedError(f"two {kind}s have id {int(i)}")
        seen.add(i)


def _of_types(fault: str, whose: str) -> str:
    """`fault` as rule 1 states it: a value of a wrong type asks for the IR's own types; an id past 64 bits, loops or
    an expression's ops nested too deep, a list or a formula too long are faults of size, said as they are."""
    if ID_RANGE in fault or " more than " in fault:
        return fault
    return f"{fault}: {whose} must hold the IR's own types (spatialc.ir)"


def check_types(p: SpatialProgram) -> None:
    """Values of the IR's types everywhere (`ir.validate`: the tables, then each op of each distinct op list), and
    loops nested at most MAX_NESTING deep: checked without recursion, before anything hashes or walks an op tree."""
    _check_counts(p)
    fault = type_fault(p)
    if fault is not None:
        raise IllFormedError(_of_types(fault, "the program"))
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
                    f"{where(prog.site, prog.engine.value)}: {_of_types(fault, 'ops')}",
                    site=int(prog.site),
                    engine=prog.engine.value,
                    op=_shown(p, bad),
                )


def _check_counts(p: SpatialProgram) -> None:
    """The tables within the bounds a saved file's reader holds them to (ir/serde.py), before the types of their
    entries are checked one by one, or a rule looks one up (100,000 tensors took verify half a minute)."""
    if not isinstance(p, SpatialProgram):
        return  # (type_fault says what it is)
    groups = p.placement.groups if isinstance(p.placement, Placement) else ()
    tables = (("tensors", p.tensors, MAX_TABLE), ("stages", p.stages, MAX_TABLE), ("buffers", p.buffers, MAX_TABLE))
    for what, table, most in (*tables, ("plans", p.plans, MAX_PLANS), ("multicast groups", groups, MAX_SITES)):
        count = len(table) if isinstance(table, tuple) else 0
        if count > most:
            raise IllFormedError(f"a program of {count} {what}; at most {most}")


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
            case ReadStage(t) if tensors[t].role not in (TensorRole.INPUT, TensorRole.WORKSPACE):
                # (an operand's tiles come through a ring from an input; a parameter — a bias, a scale, row counts —
                # is read by the compute op that names it, and lowering passes operands as the inputs)
                raise IllFormedError(
                    f"stage {s.name} reads {tensors[t].name}, {role_text(tensors[t])}; a read stage reads"
                    " an input or a workspace tensor (mark an operand's role input)"
                )
            case WriteStage(t) if tensors[t].role not in (TensorRole.OUTPUT, TensorRole.WORKSPACE):
                raise IllFormedError(
                    f"stage {s.name} writes {tensors[t].name}, {role_text(tensors[t])}; a write"
                    " stage writes the output tensor or a workspace tensor"
                )
            case ComputeStage(op) if (why := compute_fault(op, p.precision, p.tile)) is not None:
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
    if p.placement.kind == "hilbert" and p.placement.band:  # the launch would deal the curve with a band it ignores
        raise IllFormedError(f"a hilbert placement of band {p.placement.band}: the curve has no bands (band 0)")
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

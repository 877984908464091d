"""What every CUDA backend reads of a verified program: its tile matmuls and operand types, the engine programs
every site runs, the checks that hold whatever the kernel's shape (an int8 reduction that fits int32), and the
launch contract of a kernel printed from it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from ....inputs import row_limits
from ....ir.ids import LV_ITEM, GroupId, Site
from ....ir.nodes import (
    FOUR_BIT,
    ComputeStage,
    Engine,
    Fifo,
    Interm,
    PageLayout,
    Plan,
    ReadStage,
    SpatialProgram,
    Stage,
    TensorRole,
    TileOrder,
    per_op_list,
)
from ....ir.ops import (
    Attention,
    ChoreoOp,
    Compute,
    ComputeOp,
    Const,
    Dequant,
    Loop,
    Map,
    MatmulTiles,
    McastSend,
    McastSetValid,
    Precision,
    SemInc,
    rewrite,
    walk,
)
from ....ir.worklist import RULES, launch_sites, split_items, work_table
from ....numerics.epilogue import dot_range
from ....passes.attention import attention_shape
from ....passes.rows import row_shape
from ....target import SpatialTarget
from ...artifact import KernelParam, Launch
from ...errors import NeedsGeneral, TooBig, Unsupported, UnsupportedPrecision, Unverified
from . import epilogue
from .cwriter import C_TYPES
from .dequant import param_c_type
from .rings import MMA_TYPES, MmaTypes

# What the sm_90a form's refusal and auto's note (forms.PAGES_NOTE) call such programs.
MAP_PROGRAM = "a program without a tile matmul (an elementwise map)"
ROW_PROGRAM = "a program that reduces rows (softmax, RMSNorm)"
W4_PROGRAM = "a W4A16 GEMM's dequant prologue (4-bit weights)"
ATTENTION_PROGRAM = "attention (its online softmax: two matmuls a KV block beside running row maxima and sums)"


def check_printable(p: SpatialProgram, dequant: bool = False) -> None:
    """Refuse a program no backend prints: one not verified, or without its plan, placement or schedule — and a W4A16
    GEMM's dequant prologue unless the form prints it (`dequant`: the general form)."""
    if not p.verified:
        raise Unverified(p.name)
    if p.placement is None or p.schedule is None or not p.plans:
        raise Unsupported("a program without a plan, placement or schedule", "the kernel is printed from all three")
    # A kernel's block i is site i — its work list, and every site a semaphore or a multicast group names.
    sites = [int(s) for s, _ in p.placement.items_of_site]
    if sites != list(range(len(sites))):
        at = next(i for i, s in enumerate(sites) if s != i)
        raise Unsupported(
            f"a placement whose site {at} is numbered {sites[at]}",
            "the kernel runs site i as its block i: number the sites 0, 1, … in the order placed",
        )
    if not dequant and any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Dequant) for s in p.stages):
        raise NeedsGeneral(W4_PROGRAM, "this form does not print its dequant prologue yet")
    read = {s.kind.tensor for s in p.stages if isinstance(s.kind, ReadStage)}
    for t in p.tensors:
        if t.order != TileOrder.ROW and t.id not in read:
            raise Unsupported(
                f"{t.role.value} tensor {t.name} stored {t.order.value}-major",
                "only tensors read through rings into operand pages may be column-major",
            )


def all_ops(p: SpatialProgram) -> list[ChoreoOp]:
    """Every op of every engine program of every site (each op list walked once: sites share them)."""
    assert p.schedule is not None
    return [op for _, ops in per_op_list(p.schedule.programs, lambda ops: list(walk(ops))) for op in ops]


def distinct_lists(p: SpatialProgram) -> list[tuple[ChoreoOp, ...]]:
    """The engine programs' op lists, each object once, in schedule order: what depends on a list alone is found
    once for the hundreds of sites that share it."""
    assert p.schedule is not None
    return list({id(prog.ops): prog.ops for prog in p.schedule.programs}.values())


def matmul_stages(p: SpatialProgram) -> tuple[Stage, ...]:
    """The program's tile-matmul stages, in the order declared: one in a GEMM, a layer each in an MLP."""
    outs = 2 if any(t.role == TensorRole.WORKSPACE for t in p.tensors) else 1  # split-K: partial sums too
    found = tuple(s for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles))
    for s in found:
        if len(s.ins) != 2 or len(s.outs) != outs:
            raise Unsupported(
                f"matmul stage {s.name} with {len(s.ins)} inputs and {len(s.outs)} outputs",
                "a tile matmul reads an A and a B ring and fills one output (and split-K's partial sums)",
            )
    if not found:
        raise Unsupported("a program without a tile matmul", "the persistent kernel is a tensor-core tile GEMM")
    return found


def matmul_stage(p: SpatialProgram) -> Stage:
    """The program's first tile-matmul stage: a GEMM's one."""
    return matmul_stages(p)[0]


def logical_k(p: SpatialProgram, mm: Stage | None = None) -> int:
    """The length of matmul `mm`'s reduction (the program's first by default): the columns of its A operand's
    tensor, or where A is a page the site computes (an MLP's hidden layer) the rows of B's — the zero padding adds
    nothing — found through the stage that fills the operand's ring, not by the order tensors are listed in."""
    mm = mm or matmul_stage(p)
    for buf, axis in zip(mm.ins, (1, 0), strict=True):
        ring = p.buffer(buf).ring
        for s in p.stages:
            if isinstance(s.kind, ReadStage) and any(p.buffer(b).ring == ring for b in s.outs):
                return p.tensor(s.kind.tensor).elems[axis]
    raise Unsupported(f"matmul stage {mm.name} with neither operand read from a tensor", "K is an operand's length")


def operand_types(p: SpatialProgram, operand: Precision) -> MmaTypes:
    """The C types of `operand` values (a matmul's operands, a map program's inputs: the MMA fragment types of the
    precision); the input tensors must hold that type (4-bit weights aside: a dequant reads them, common/dequant.py)."""
    types = MMA_TYPES.get(operand)
    if types is None:
        raise UnsupportedPrecision(operand, "the kernels have types for int8, fp16, bf16, e4m3 and e5m2 operands only")
    for t in p.tensors:
        if t.role == TensorRole.INPUT and t.dtype not in FOUR_BIT and t.dtype.value != operand.value:
            raise UnsupportedPrecision(
                t.dtype.value,
                f"input {t.name} must hold the program's {operand.value} operands: "
                "tiles are copied into the operand rings byte for byte",
            )
    out = p.output_tensor()
    if out is None:
        raise Unsupported("a program without an output tensor", "the kernel stores its result into one")
    return types  # the output's element type is `epilogue.check`'s, with or without an epilogue


def check_int8_reduction(p: SpatialProgram, mm: Stage) -> None:
    """Refuse an int8 GEMM whose int32 fragment accumulators could overflow where the IR's int64 would not.

    The largest sum a K-long int8 dot product reaches is K·128·128, every product being (−128)·(−128); the most
    negative, K·(−128)·127, is smaller in size. The logical K counts: the zero padding adds nothing. That every
    accumulator sums exactly K products — each k-tile once, whatever loops the schedule wraps around its K step — is
    what verify's rule 8 proved before this program reached the lowering.
    """
    if mm.kind.op.operand.value != "int8":  # type: ignore[union-attr]
        return
    k = logical_k(p, mm)
    need = dot_range(k)[1]
    if need > 2**31 - 1:
        raise TooBig(
            f"the largest int8 dot product over K = {k} (K·128·128) in an int32 accumulator",
            need,
            2**31 - 1,
            "int8 MMA accumulates in int32; keep K ≤ 131071 or use fp16",
        )


def _normal(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    """`ops` with every ITEM loop's count erased: the one thing the kernel reads per site at run time."""
    return tuple(
        Loop(op.var, Const(0) if op.var == LV_ITEM else op.count, _normal(op.body)) if isinstance(op, Loop) else op
        for op in ops
    )


@dataclass(frozen=True, slots=True)
class SiteClass:
    """Sites that run the same engine programs (their ITEM loop counts aside), in blockIdx order, and those programs
    (each in an ITEM loop)."""

    sites: tuple[int, ...]
    engines: tuple[tuple[Engine, tuple[ChoreoOp, ...]], ...]


def site_classes(p: SpatialProgram, relative_sems: bool = False):
    """The sites with items, grouped by the engine programs they run, in the order of their first site — after
    checking that every site's ITEM loops run its share of the items and that a site without items runs nothing
    (the kernel returns at once for it).

    With `relative_sems`, returns (classes, relative): where reading every SemInc's site as an offset from the
    site that runs it makes fewer classes (split-K: every contributor raises the owner a fixed number of sites
    before it), the classes hold those offsets and `relative` is True."""
    if not relative_sems:
        return _classes(p, lambda site, ops: ops)
    # Multicast groups are named by their place in `relative_groups` either way (the printer reads them so).
    table = {offsets: i for i, offsets in enumerate(relative_groups(p))}
    absolute = _classes(p, lambda site, ops: _relative_view(p, table, site, ops, sems=False))
    relative = _classes(p, lambda site, ops: _relative_view(p, table, site, ops))
    return (relative, True) if len(relative) < len(absolute) else (absolute, False)


def relative_groups(p: SpatialProgram) -> tuple[tuple[int, ...], ...]:
    """Every multicast group a McastSend or McastSetValid names, seen from each site that names it: the offsets of
    its sites from that site, sorted; relative classes name a group by its place in this list."""
    assert p.placement is not None and p.schedule is not None
    groups = {g.id: g.sites for g in p.placement.groups}
    mcast = (McastSend, McastSetValid)
    named = {id(ops): [op.group for op in walk(ops) if isinstance(op, mcast)] for ops in distinct_lists(p)}
    seen = {
        tuple(int(t) - int(q.site) for t in groups[group]) for q in p.schedule.programs for group in named[id(q.ops)]
    }
    return tuple(sorted(seen))


def _relative_view(
    p: SpatialProgram, table: dict[tuple[int, ...], int], site: int, ops: tuple[ChoreoOp, ...], sems: bool = True
):
    """The view of `ops` site classes compare: every multicast group as its place in `relative_groups` and (with
    `sems`) every SemInc's site given as its offset from `site`."""
    assert p.placement is not None
    groups = {g.id: g.sites for g in p.placement.groups}

    def relative(op: ChoreoOp) -> ChoreoOp:
        if isinstance(op, SemInc) and sems:
            return dataclasses.replace(op, at=Site(int(op.at) - site))
        if isinstance(op, McastSend | McastSetValid):
            return dataclasses.replace(op, group=GroupId(table[tuple(int(t) - site for t in groups[op.group])]))
        return op

    return rewrite(ops, relative)


def _classes(p: SpatialProgram, view) -> tuple[SiteClass, ...]:
    assert p.placement is not None and p.schedule is not None
    groups: dict[tuple, list[int]] = {}
    programs: dict[tuple, tuple] = {}
    by_site = p.schedule.by_site()
    # Sites share their op lists (a few distinct ones among hundreds of sites): what depends only on the list is
    # found once per list, and the normal forms are interned so that a class key compares by identity.
    once = _PerList(view)
    for s, items in p.placement.items_of_site:
        progs = by_site.get(s, ())
        counts = set().union(*(once.item_counts(prog.ops) for prog in progs))
        if counts - {Const(len(items))} or (not counts and len(items) > 1):
            raise Unsupported(
                f"site {int(s)} with {len(items)} items and ITEM loops of {sorted(map(str, counts))}",
                "the kernel's ITEM loop runs the site's share of the work list",
            )
        if not items:  # the kernel returns at once for it: nothing outside an ITEM loop (run no times) may be lost
            if any(not (isinstance(op, Loop) and op.var == LV_ITEM) for prog in progs for op in prog.ops):
                raise Unsupported(
                    f"site {int(s)}, which has no items and ops outside its ITEM loops", "it returns at once"
                )
            continue
        seen = tuple((prog.engine, once.view(int(s), prog.ops)) for prog in progs)
        key = tuple((engine, once.normal(ops)) for engine, ops in seen)
        groups.setdefault(key, []).append(int(s))
        programs.setdefault(key, seen)
    return tuple(
        SiteClass(tuple(sites), tuple((engine, _per_item(ops)) for engine, ops in programs[key]))
        for key, sites in groups.items()
    )


_SITE_NAMING = (SemInc, McastSend, McastSetValid)  # the only ops a class view may read relative to their site


class _PerList:
    """`_classes`' look-ups, each made once per op list (by identity; the lists outlive the call): the ITEM loop
    counts, the view (the same for every site where the list names no site or group), and the id of the interned
    normal form."""

    def __init__(self, view) -> None:
        self._view = view
        self._counts: dict[int, frozenset] = {}
        self._views: dict[int, tuple[ChoreoOp, ...]] = {}
        self._normals: dict[int, int] = {}
        self._kept: set[int] = set()
        self._interned: dict[tuple[ChoreoOp, ...], tuple[ChoreoOp, ...]] = {}

    def item_counts(self, ops: tuple[ChoreoOp, ...]) -> frozenset:
        found = self._counts.get(id(ops))
        if found is None:
            found = frozenset(op.count for op in walk(ops) if isinstance(op, Loop) and op.var == LV_ITEM)
            self._counts[id(ops)] = found
        return found

    def view(self, site: int, ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
        found = self._views.get(id(ops))
        if found is not None:
            return found
        seen = self._view(site, ops)
        if not any(isinstance(op, _SITE_NAMING) for op in walk(ops)):
            self._views[id(ops)] = seen
            self._kept.add(id(seen))
        return seen

    def normal(self, ops: tuple[ChoreoOp, ...]) -> int:
        found = self._normals.get(id(ops))
        if found is None:
            normal = _normal(ops)
            found = id(self._interned.setdefault(normal, normal))
            if id(ops) in self._kept:  # a view held in `_views`: its id names no other list while the call lasts
                self._normals[id(ops)] = found
        return found


def site_engines(p: SpatialProgram) -> tuple[tuple[Engine, tuple[ChoreoOp, ...]], ...]:
    """Each engine and its program (in an ITEM loop), which every site with items runs: one kernel text, whose
    flow every site shares, runs them all."""
    classes = site_classes(p)
    if len(classes) > 1:
        raise Unsupported(
            f"site {classes[1].sites[0]}, whose engine programs differ from site {classes[0].sites[0]}'s",
            "one kernel text runs every site; only the number of items may differ",
        )
    return classes[0].engines


def printed_site_programs(p: SpatialProgram) -> tuple[tuple[ChoreoOp, ...], ...]:
    """The engine programs every site runs (`site_engines` without the engines)."""
    return tuple(ops for _, ops in site_engines(p))


def _per_item(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    """`ops` inside an ITEM loop when they have none: a program without one is the work of a site's only item, and
    the kernel runs whatever share of the items the device's sites get at launch — one, none or several."""
    if not ops or any(isinstance(op, Loop) and op.var == LV_ITEM for op in walk(ops)):
        return ops
    return (Loop(LV_ITEM, Const(0), ops),)


Layer = tuple[Stage, tuple[Stage, ...]]  # a matmul stage and its epilogue chain


def checked_layers(
    p: SpatialProgram, elementwise: Callable[[ComputeOp], bool]
) -> tuple[MmaTypes, bool, tuple[Layer, ...]]:
    """The fragment types, whether the program is int8 (exact integer epilogue), and each matmul stage with its
    epilogue chain (to the written output, or to the page the next matmul reads) — after the checks every backend
    makes: one operand type for every matmul, held by the inputs, int8 reductions that fit int32, chains of
    `elementwise` ops whose C computes what `spatialc.numerics.epilogue` defines, integer chains that stay in int64."""
    layers = tuple((mm, epilogue.chain(p, mm, elementwise)) for mm in matmul_stages(p))
    operands = {mm.kind.op.operand for mm, _ in layers}  # type: ignore[union-attr]
    if len(operands) > 1:
        raise UnsupportedPrecision(
            " and ".join(sorted(o.value for o in operands)),
            "the kernel's fragments hold one operand type: every matmul of a program multiplies the same",
        )
    first = layers[0][0].kind.op  # type: ignore[union-attr]
    assert isinstance(first, MatmulTiles)
    types = operand_types(p, first.operand)
    integer = first.operand.value == "int8"
    for mm, chain in layers:
        check_int8_reduction(p, mm)
        epilogue.check(p, chain, integer, mm)
        if integer:
            epilogue.check_int64(p, chain, dot_range(logical_k(p, mm)))
    return types, integer, layers


def checked_map(p: SpatialProgram) -> tuple[MmaTypes, bool, Stage]:
    """A program without a tile matmul (an elementwise map, `spatialc.elementwise`): the C types of its inputs (the
    precision's operand type, loaded into their rings as they are stored), whether it is int8 (exact `long long`
    arithmetic) and its one Map stage — after the checks `checked_layers` makes of an epilogue chain: the table's
    ops, constants the values hold, column vectors the kernel reads, the output's type, and in an int8 program
    values that stay in int64 whatever the int8 inputs and int32 column vectors."""
    stages = [s for s in p.stages if isinstance(s.kind, ComputeStage)]
    if len(stages) != 1 or not isinstance(stages[0].kind.op, Map):  # type: ignore[union-attr]
        raise Unsupported(
            f"a program without a tile matmul and with {len(stages)} compute stage(s)",
            "such a program is one Map of its inputs (spatialc.elementwise)",
        )
    (stage,) = stages
    _check_row_major_pages(p)
    types = operand_types(p, p.precision)
    integer = p.precision == Precision.INT8
    epilogue.check(p, (stage,), integer, None)
    if integer:
        epilogue.check_int64(p, (stage,), epilogue.INT8_RANGE)
    return types, integer, stage


def checked_rows(p: SpatialProgram) -> tuple[MmaTypes, tuple[Stage, ...]]:
    """A program that reduces rows (`spatialc.rows`): the C types of its inputs and its compute stages in order (row
    reductions and maps) — after the checks `checked_map` makes of its maps, and that it is a float program (the
    kernel's row accumulators are float32)."""
    if p.precision == Precision.INT8:
        raise UnsupportedPrecision("int8", "a row program's reductions and maps are float arithmetic: use fp16 or bf16")
    shape = row_shape(p)
    last = shape.producer.get(shape.write.ins[0])
    if last is None or not isinstance(last.kind, ComputeStage) or not isinstance(last.kind.op, Map):
        raise Unsupported("a row program whose output is not a map's pages", "its writer stores the last map's pages")
    _check_row_major_pages(p)
    types = operand_types(p, p.precision)
    maps = tuple(s for s in shape.computes if isinstance(s.kind.op, Map))  # type: ignore[union-attr]
    epilogue.check(p, maps, False, None)
    return types, shape.computes


def checked_attention(p: SpatialProgram) -> tuple[MmaTypes, tuple[Map, ...]]:
    """An attention program (`spatialc.attention`): the C types of its inputs (Q, K and V, the operands of both its
    matmuls) and the maps its schedule runs (each once, in the order first run) — after the checks `checked_rows`
    makes: a float program, pages laid out by rows (Q's, K's and V's as the matmuls' loads read them), maps the
    printers spell exactly."""
    if p.precision == Precision.INT8:
        raise UnsupportedPrecision("int8", "attention is float arithmetic (exp, a softmax): use fp16 or bf16")
    _check_row_major_pages(p, frozenset(p.buffer(ring).ring for _, ring in attention_shape(p).reads))
    types = operand_types(p, p.precision)
    maps = tuple(dict.fromkeys(op.op for op in all_ops(p) if isinstance(op, Compute) and isinstance(op.op, Map)))
    epilogue.check_maps(p, maps, False)
    return types, maps


def _check_row_major_pages(p: SpatialProgram, operands: frozenset = frozenset()) -> None:
    """Every ring's pages hold their tiles row by row: a map (and a row reduction) reads and writes element e of a
    page at e, as the tensors store them — but the `operands` rings, which only matmuls read (laid out for them)."""
    for b in p.buffers:
        kind = b.kind
        if isinstance(kind, Fifo | Interm) and kind.layout != PageLayout.ROW and b.ring not in operands:
            raise Unsupported(
                f"ring {b.name} laid out {kind.layout.value}",
                "a map's pages hold their tiles row by row, as the tensors store them: lay the ring out by rows",
            )


def out_c_type(p: SpatialProgram, form: str, mixed: bool = False) -> str:
    """OUT_T, the C type a kernel stores every output through (the first output's, where `mixed` lets the others
    have types of their own: `other_outputs`) — after checking that the outputs have one type otherwise (`form` names
    the kernel in the refusal)."""
    kinds = sorted({t.dtype.value for t in p.tensors if t.role == TensorRole.OUTPUT})
    if len(kinds) > 1 and not mixed:
        raise Unsupported(
            f"outputs of different element types ({', '.join(kinds)})",
            f"{form} stores this program's outputs in one type (only a row program's and attention's may differ):"
            " give them one",
        )
    out = p.output_tensor()
    if out is None:
        raise Unsupported("a program without an output tensor", "the kernel stores its result into one")
    return C_TYPES[out.dtype]


def other_outputs(p: SpatialProgram, out_type: str) -> dict[int, str]:
    """The C type of each output tensor (by id) whose elements are not OUT_T's (`out_type`): attention's LSE, float32
    beside an O of bf16 or fp16; a row program's vectors (a LayerNorm's mean and rstd), float32 beside an out of bf16
    or fp16."""
    return {
        int(t.id): C_TYPES[t.dtype] for t in p.tensors if t.role == TensorRole.OUTPUT and C_TYPES[t.dtype] != out_type
    }


def checked_gemm(
    p: SpatialProgram, elementwise: Callable[[ComputeOp], bool]
) -> tuple[Stage, MmaTypes, bool, tuple[Stage, ...]]:
    """The matmul stage of a one-matmul program, its fragment types, whether it is int8 and its epilogue chain,
    checked as `checked_layers` checks them."""
    types, integer, ((mm, chain), *_) = checked_layers(p, elementwise)
    return mm, types, integer, chain


def fragments_per_warp(plan: Plan, lanes: int, lane_grid: tuple[int, int] | None) -> int:
    """Accumulator fragments each of the `lanes` compute warps holds: a rectangle of every sub-block where the lane
    grid divides the block, else the item's tiles dealt round the warps."""
    h, w = plan.item_tiles
    if lane_grid is None:
        return math.ceil(h * w / lanes)
    rect = (plan.block.osh // lane_grid[0]) * (plan.block.osw // lane_grid[1])
    return plan.sub_blocks[0] * plan.sub_blocks[1] * rect


def site_items(p: SpatialProgram) -> tuple[tuple[int, ...], ...]:
    """Each site's items, in blockIdx order."""
    assert p.placement is not None
    return tuple(tuple(int(i) for i in items) for _, items in p.placement.items_of_site)


def launch_for(
    p: SpatialProgram,
    target: SpatialTarget,
    kernel_name: str,
    types: MmaTypes,
    threads: int,
    dyn_smem: int,
    opt_in: bool,
    blocks_per_sm: int,
    sync: tuple[int, ...] = (),
    fixed: bool = False,
    cooperative: bool = False,
    trip_error: int = -1,
    cluster: int = 1,
) -> Launch:
    """How a host language launches a kernel printed from `p`. A placement the rules make, over as many sites as the
    target keeps resident, follows the device at launch (its multiprocessors × the blocks each holds); any other
    keeps its list. Inputs hold the operand type, the output the output tensor's type, parameters their own. A kernel
    `fixed` to its sites (they run different programs), or `cooperative` (they hand over to each other through its
    `sync` words), runs exactly its sites."""
    heads = any(isinstance(getattr(s.kind, "op", None), Attention) for s in p.stages)  # Q, K, V by (batch, heads)
    params = tuple(
        KernelParam(
            t.name,
            param_c_type(t, types.operand),
            t.role.value,
            t.elems,
            t.tiles,
            t.order.value,
            t.groups,
            heads and t.role == TensorRole.INPUT,
        )
        for t in p.tensors
    )
    placement = p.placement
    assert placement is not None and p.plans
    items = site_items(p)
    n_items = p.plans[0].items
    grid = p.plans[0].placed
    try:
        rule = split_items(n_items, len(items), placement.kind, grid, placement.band)
    except ValueError:  # no rule's kind, or a rule without its grid or band: its list is passed as it stands
        rule = None
    ruled = placement.kind in RULES and [list(i) for i in items] == rule
    follows = ruled and not (fixed or cooperative) and len(items) == launch_sites(n_items, target.units, blocks_per_sm)
    return Launch(
        kernel_name,
        len(items),
        threads,
        dyn_smem,
        params,
        (p.tile.rows, p.tile.cols),
        opt_in,
        n_items,
        placement.kind if ruled else "listed",
        blocks_per_sm if follows else 0,
        () if ruled else tuple(work_table([list(i) for i in items])),
        sync,
        cooperative,
        trip_error,
        grid if ruled else (0, 0),
        placement.band if ruled else 0,
        tuple(sorted(row_limits(p).items())),
        cluster,
    )

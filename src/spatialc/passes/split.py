"""split-K: an item's K range reduced on several sites, its partial sums meeting in a workspace tensor.

A GEMM with few output items and a long K leaves most of the machine idle: 4 items of 128×128 on 132 SMs. Split-K
gives each item `S` sites. Site s of an item reduces the s-th run of K steps; the *owner* (s = 0) waits until the
other S − 1 have left their partial sums in the workspace, adds them to its own accumulator one after another in
split order (so a float result is the same on every run, and an int8 one stays exact), runs the epilogue and writes
C. Each contributor packs its accumulator, writes it to its slot of the workspace, makes the write visible and
raises the owner's `partials` semaphore. The owner's reader waits until the count reaches S − 1 before it reads a
partial. The counter only ever rises, so one run of the deadlock rule decides the handshake (DESIGN §5). (The
interpreter, the float64 reference, adds the partials to each other and then to the owner's products: another order,
whose difference is float64 rounding, far inside the float32 bound a kernel is held to.)

The program's stages say so: the matmul stage fills the output ring and `partial_out`; `write_partials` empties
`partial_out` into the workspace; `read_partials` fills `partial_in` from it; `add_partials` adds `partial_in` to
the accumulator. The workspace holds S − 1 slots of the output's padded tile grid: contributor s writes its item's
block at tile row (s − 1)·rows + item_y·h, column item_x·w — the same place the owner reads it from.
"""

from __future__ import annotations

import dataclasses

from ..errors import PlanError, ProgramError
from ..ir.ids import LV_ITEM_X, LV_ITEM_Y, BufferId, ItemId, SemId, Site, StageId, TensorId
from ..ir.nodes import (
    Buffer,
    ComputeStage,
    Engine,
    Fifo,
    Placement,
    Plan,
    ReadStage,
    Semaphore,
    SpatialProgram,
    Stage,
    Tensor,
    TensorRole,
    WriteStage,
    accumulator_dtype,
)
from ..ir.ops import AddPartial, TileAddr
from ..ir.worklist import grid_order
from ..target import SpatialTarget

MAX_SPLITS = 32  # sites per item: past this the owner's serial adds cost more than the split saves
# The planner splits only where each split keeps this many K steps: short splits spend their time on the handshake.
MIN_SPLIT_STEPS = 16
SEM_PARTIALS = SemId(0)
WORKSPACE_NAME = "partials"


def split_ranges(k_steps: int, splits: int) -> tuple[tuple[int, int], ...]:
    """(first K step, steps) of each split: as equal as whole steps allow, the longer ones last."""
    return tuple((s * k_steps // splits, (s + 1) * k_steps // splits - s * k_steps // splits) for s in range(splits))


def asked(splits: int) -> str:
    """A split count as the API and the command line each spell it, for the head of a refusal."""
    return f"split_k={splits} (--split-k {splits})"


def check_splits(splits: object, plan: Plan | None = None) -> int:
    """`splits` as a count of sites per item, or ProgramError: a whole number from 1 to MAX_SPLITS and to the
    plan's K steps."""
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ProgramError(f"split_k must be a whole number ≥ 1, not {splits!r}")
    if splits > MAX_SPLITS:
        raise ProgramError(f"{asked(splits)}: at most {MAX_SPLITS} sites share an item")
    if plan is not None and splits > plan.k_steps:
        raise ProgramError(
            f"{asked(splits)}: the plan reduces K in {plan.k_steps} step(s) of {plan.block.ibw} tile(s); each split"
            f" needs at least one (use split_k ≤ {plan.k_steps}, --split-k {plan.k_steps}, or a smaller block ibw)"
        )
    return splits


def auto_splits(plan: Plan, resident: int) -> int:
    """How many sites the planner gives each item: 1 unless the items fill at most half of the `resident` sites
    and K is long; then as many as fill the sites, each split keeping MIN_SPLIT_STEPS K steps."""
    if plan.items * 2 > resident:
        return 1
    return max(1, min(resident // plan.items, plan.k_steps // MIN_SPLIT_STEPS, MAX_SPLITS))


def add_split(p: SpatialProgram, splits: int, tail: int = 0) -> SpatialProgram:
    """The tiled program with split-K's workspace tensor, rings, semaphore and stages (see the module docstring);
    with a `tail`, a split tail's: S − 1 slots of an item for each of the `tail` items split (`tail_slot`)."""
    from .tile import matmul_stage  # (the verifier imports this module, and tile imports the verifier)

    plan = p.plan
    if plan is None:
        raise PlanError("split-K needs a tiled program (run tile first)")
    mm = matmul_stage(p)
    if len(mm.outs) != 1 or any(t.role == TensorRole.WORKSPACE for t in p.tensors):
        raise PlanError(f"program {p.name} is already split")
    out = p.output_tensor()
    assert out is not None
    h, w = plan.item_tiles
    rows, cols = out.tiles
    tid = TensorId(max(int(t.id) for t in p.tensors) + 1)
    grid = ((splits - 1) * tail * h, w) if tail else ((splits - 1) * rows, cols)
    work = Tensor(
        tid,
        WORKSPACE_NAME,
        TensorRole.WORKSPACE,
        (grid[0] * p.tile.rows, grid[1] * p.tile.cols),
        grid,
        accumulator_dtype(p.precision),
    )
    first = max(int(b.id) for b in p.buffers) + 1
    p_out, p_in = BufferId(first), BufferId(first + 1)
    buffers = (
        *p.buffers,
        Buffer(p_out, "partial_out", Fifo(1, h * w)),
        Buffer(p_in, "partial_in", Fifo(1, h * w)),
    )
    sid = max(int(s.id) for s in p.stages) + 1
    stages = tuple(dataclasses.replace(s, outs=(*s.outs, p_out)) if s.id == mm.id else s for s in p.stages)
    stages += (
        Stage(StageId(sid), "write_partials", WriteStage(tid), Engine.WRITER, ins=(p_out,)),
        Stage(StageId(sid + 1), "read_partials", ReadStage(tid), Engine.READER, outs=(p_in,)),
        Stage(StageId(sid + 2), "add_partials", ComputeStage(AddPartial()), Engine.COMPUTE, ins=(p_in,)),
    )
    if any(s.id == SEM_PARTIALS for s in p.semaphores):
        raise PlanError(f"program {p.name} already has semaphore {int(SEM_PARTIALS)}")
    sems = (*p.semaphores, Semaphore(SEM_PARTIALS, "partials", 0))
    return p.evolve(tensors=(*p.tensors, work), buffers=buffers, stages=stages, semaphores=sems)


def split_placement(plan: Plan, splits: int, sites: int | None = None) -> Placement:
    """Site i·S + s holds item i as its split s (the owner first); sites past items·S hold nothing. Every site
    waited on must be resident at once, so a split program runs exactly these sites, in one wave."""
    need = plan.items * splits
    if sites is not None and sites < need:
        raise ProgramError(
            f"{asked(splits)} places each of the plan's {plan.items} items on {splits} sites: {need} sites, not {sites}"
        )
    total = need if sites is None else sites
    items: list[tuple[Site, tuple[ItemId, ...]]] = [
        (Site(i * splits + s), (ItemId(i),)) for i in range(plan.items) for s in range(splits)
    ]
    items += [(Site(s), ()) for s in range(need, total)]
    return Placement(tuple(items), (), "split", 0, splits)


SPLIT_TAIL = "split_tail"  # the placement rule: whole waves of items unsplit, the last wave's items split


def tail_split(items: int, sites: int, k_steps: int) -> tuple[int, int] | str:
    """(tail, splits) of a split tail on `sites` sites: the items past the last whole wave, and the sites each of
    them is split over (as many as the sites hold, each keeping a K step) — or why there is nothing to split."""
    tail = items % sites
    if tail == 0:
        return f"its {items} items fill {items // sites} whole wave(s) of {sites} sites: there is no tail to split"
    splits = min(sites // tail, MAX_SPLITS, k_steps)
    if splits < 2:
        why = f"{sites // tail} site(s)" if sites // tail < 2 else f"{k_steps} K step(s)"
        return f"its last wave has {tail} items on {sites} sites, and {why} would split each"
    return tail, splits


# An owner's add of one partial sum after its split, in items' time: a read of h·w accumulator tiles from the L2 and
# an add, against an item's K loop of many steps (bench/split_tail.py, bench/README.md "Prediction for the split tail").
FIXUP = 0.02


def tail_waves(items: int, sites: int, k_steps: int) -> float | None:
    """The waves a split tail of `items` on `sites` takes, in items' time: its whole waves, one split of a tail
    item (1 / S) and the owner's S − 1 adds (FIXUP each) — or None where the last wave does not split."""
    found = tail_split(items, sites, k_steps)
    if isinstance(found, str):
        return None
    tail, splits = found
    return (items - tail) // sites + 1 / splits + FIXUP * (splits - 1)


def tail_priced(cost: float, items: int, sites: int, k_steps: int) -> float | None:
    """`cost` — a planner's price of a plan, which counts its ceil(items / sites) waves whole — for the waves a split
    tail of that plan takes (`tail_waves`); None where its last wave does not split."""
    waves = tail_waves(items, sites, k_steps)
    return None if waves is None else cost / -(-items // sites) * waves


def split_tail_placement(plan: Plan, sites: int, band: int = 0) -> Placement:
    """Stream-K's hybrid of whole items and one split each: the items of the whole waves — every item but the last
    T of the grid in row-major order — dealt round-robin in grouped order (`band` rows a band; 0: row-major), W to
    every site; then tail item D + t (D = items − T) on sites t·S … t·S + S − 1, site t·S + s running its split s
    after its whole items (t·S + 0 owns it). Every site is resident at once (the owners wait): a split tail runs
    exactly `sites` sites, one wave of them. ValueError (the reason) where `tail_split` finds no tail to split."""
    found = tail_split(plan.items, sites, plan.k_steps)
    if isinstance(found, str):
        raise ValueError(found)
    tail, splits = found
    whole = plan.items - tail
    order = grid_order("grouped", plan.grid, band) if band else list(range(plan.items))
    order = [i for i in order if i < whole]
    items = [[ItemId(i) for i in order[s::sites]] for s in range(sites)]
    for t in range(tail):
        for s in range(splits):
            items[t * splits + s].append(ItemId(whole + t))
    held = tuple((Site(s), tuple(mine)) for s, mine in enumerate(items))
    return Placement(held, (), SPLIT_TAIL, band, splits, tail=tail)


def tail_slot(plan: Plan, splits: int, tail: int, j: int) -> TileAddr:
    """Where split j (≥ 1) of a tail item leaves its partial sum in a split tail's workspace: the item's t-th slot of
    S − 1 blocks (t its place among the tail items, D + t its id), flat tile (t·(S − 1) + j − 1)·h·w — in item
    coordinates, base and strides (the tensor is a column of blocks h × w tiles each)."""
    h, w = plan.item_tiles
    block = h * w
    whole = plan.items - tail
    nx = plan.grid[1]
    base = (j - 1 - whole * (splits - 1)) * block
    return TileAddr(base, ((LV_ITEM_Y, nx * (splits - 1) * block), (LV_ITEM_X, (splits - 1) * block)))


def split_of(placement: Placement, site: Site) -> int:
    """Which split of its item `site` reduces (0: the owner)."""
    return int(site) % placement.splits


def owner_of(placement: Placement, site: Site) -> Site:
    """The site that adds up `site`'s item."""
    return Site(int(site) - split_of(placement, site))


def partial_rings(p: SpatialProgram) -> tuple[BufferId, BufferId] | None:
    """(partial_out, partial_in) of a split program, None for any other."""
    work = {t.id for t in p.tensors if t.role == TensorRole.WORKSPACE}
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage) and s.kind.tensor in work]
    reads = [s for s in p.stages if isinstance(s.kind, ReadStage) and s.kind.tensor in work]
    if len(writes) != 1 or len(reads) != 1:
        return None
    return writes[0].ins[0], reads[0].outs[0]


def workspace_bytes(p: SpatialProgram) -> int:
    """Bytes of the program's workspace tensors (4 per element: int32 or float32 partial sums)."""
    return sum(t.tiles[0] * t.tiles[1] * p.tile.elems * 4 for t in p.tensors if t.role == TensorRole.WORKSPACE)


def fits_at_once(
    target: SpatialTarget, sites: int, per_unit: int, who: str = "split-K", fix: str = "a smaller split_k"
) -> str | None:
    """Why `sites` blocks that wait on each other cannot all be resident on `target`, or None."""
    room = target.units * per_unit
    if sites <= room:
        return None
    return (
        f"{who} runs its {sites} sites at once (they wait on each other) and {target.name} keeps {room} of this"
        f" plan's blocks resident ({target.units} SMs × {per_unit}); use {fix} or a larger block"
    )


def extra_ring_stages(form: str = "general") -> int:
    """The `form` kernel's rings of split-K beyond a GEMM's, in the tile planner's unit (a 2-deep output-sized
    ring): the general form's partial_out and partial_in, one page each; none in the sm_90a form, whose consumers
    move partial sums between their accumulators and the workspace directly (lower/cuda/sm90a/partials.py)."""
    return 0 if form == "sm90a" else 1


__all__ = [
    "MAX_SPLITS",
    "FIXUP",
    "SPLIT_TAIL",
    "add_split",
    "auto_splits",
    "check_splits",
    "fits_at_once",
    "owner_of",
    "partial_rings",
    "split_of",
    "split_placement",
    "split_ranges",
    "split_tail_placement",
    "tail_slot",
    "tail_priced",
    "tail_split",
    "tail_waves",
    "workspace_bytes",
]

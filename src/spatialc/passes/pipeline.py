"""The pass list: tile → place → schedule → verify. Each step is a pure function of the one before."""

from __future__ import annotations

import contextlib
import dataclasses

from ..errors import PlanError, ProgramError
from ..ir.nodes import Plan, SpatialProgram, TensorRole
from ..ir.ops import MATMUL_PRECISIONS, NO_FP32_MATMUL
from ..target import SpatialTarget
from .attention import apply_attention_plan, is_attention_program, place_attention, plan_attention, schedule_attention
from .cols import apply_col_plan, is_col_program, place_cols, plan_cols, schedule_cols
from .dequant import build_w4, is_w4_program
from .footprint import check_form, fused_by_persistent, in_panels, ring_stages, side_rings, sites_per_unit
from .maps import apply_map_plan, is_map_program, place_map, plan_map, schedule_map
from .multicast import add_semaphores, check_multicast, multicast_placement, say_reads
from .multicast import asked as asked_multicast
from .place import check_sites, default_band, default_sites, place
from .rows import apply_row_plan, is_row_program, place_rows, plan_rows, schedule_rows
from .schedule import schedule
from .split import (
    SPLIT_TAIL,
    add_split,
    asked,
    auto_splits,
    check_splits,
    extra_ring_stages,
    fits_at_once,
    split_placement,
    split_tail_placement,
    tail_priced,
    tail_split,
)
from .tile import IBWS, apply_plan, candidates, tile
from .verify import verify


def build(
    program: SpatialProgram,
    target: SpatialTarget,
    *,
    block: tuple[int, int, int] | None = None,
    sub_blocks: tuple[int, int] | None = None,
    depth: int | None = None,
    sites: int | None = None,
    placement: str | None = None,
    form: str = "auto",
    split_k: int | None = None,
    multicast: tuple[int, int] | None = None,
) -> SpatialProgram:
    """Run every pass in order and return the verified program, planned for the `form` CUDA kernel. `split_k`
    gives each item that many sites (`passes/split.py`); None lets the planner split a GEMM whose items fill at most
    half the machine while K is long. `multicast=(gy, gx)` shares operand pages over groups of gy × gx sites
    (`passes/multicast.py`).

    On a Hopper target "auto" plans for the sm_90a form first, whose operand pages only that form reads (swizzled
    panels); where that form then refuses the program (an activation's rings past shared memory, a placement its
    clusters cannot take), the program is planned again for the other forms (`sm90a_refusal`)."""
    multiplies = not (is_row_program(program) or is_map_program(program) or is_col_program(program))
    if program.precision not in MATMUL_PRECISIONS and multiplies:
        raise ProgramError(f"program {program.name}: {NO_FP32_MATMUL}")
    if is_attention_program(program):
        return _build_attention(program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast)
    if is_col_program(program):
        return _build_cols(program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast)
    if is_row_program(program):
        return _build_rows(program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast)
    if is_map_program(program):
        return _build_map(program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast)
    if is_w4_program(program):  # its plan is the plain GEMM's, the dequant prologue put back (passes/dequant.py)

        def planned(q: SpatialProgram, f: str) -> SpatialProgram:
            return _passes((q, target, block, sub_blocks, depth, sites, placement, f, split_k, None), verified=False)

        return verify(build_w4(program, target, planned, form, split_k, multicast), target)
    args = (program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast)
    p = _passes(args)
    if p.placement is not None and p.placement.multicast != (1, 1):
        # The same request without groups (its own plan, unverified: only its reads are counted).
        plain = (program, target, block, sub_blocks, depth, sites, placement, form, split_k, None)
        with contextlib.suppress(PlanError, ProgramError):
            say_reads(p, _passes(plain, verified=False))
    return p


PAGE_FORMS = ("auto", "general", "persistent")  # the forms that print a program without a tile matmul


def _page_request(what: str, form: str, **matmul_only: object) -> None:
    """ProgramError where a build of a program without a tile matmul (`what`) is asked for what shapes a matmul's
    work, or for a form that does not print it."""
    for name, given in matmul_only.items():
        if given is not None:
            raise ProgramError(f"{name} shapes a matmul's work; this program has no matmul")
    if form not in PAGE_FORMS:
        raise ProgramError(f"{what} is printed in the general and the persistent forms only, not {form!r}")


def _build_map(program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast) -> SpatialProgram:
    """A program with no matmul: one map of its inputs (`passes/maps.py`), planned for the general form; the
    persistent form prints the same plan (its block keeps the same rings, without their barriers)."""
    _page_request("a program without a matmul", form, sub_blocks=sub_blocks, split_k=split_k, multicast=multicast)
    p = program.evolve(target=target.name)
    plan = plan_map(p, target, _page_block(block, "a map's block is (rows, columns, 1) of tiles, with no K"), depth)
    p = place_map(apply_map_plan(p, plan), target, sites, placement)
    return verify(schedule_map(p), target)


def _build_rows(
    program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast
) -> SpatialProgram:
    """A program that reduces rows (softmax, RMSNorm: `passes/rows.py`), planned for the general form; the
    persistent form prints the same plan (its block keeps the same rings, without their barriers)."""
    _page_request("a program that reduces rows", form, sub_blocks=sub_blocks, split_k=split_k, multicast=multicast)
    said = "a row program's block is (rows, columns, 1) of tiles — a band of rows walked a page of columns at a time"
    p = program.evolve(target=target.name)
    plan = plan_rows(p, target, _page_block(block, said), depth)
    p = place_rows(apply_row_plan(p, plan), target, sites, placement)
    return verify(schedule_rows(p), target)


def _build_cols(
    program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast
) -> SpatialProgram:
    """A program that reduces columns (`passes/cols.py`), planned for the general form."""
    _page_request("a program that reduces columns", form, sub_blocks=sub_blocks, split_k=split_k, multicast=multicast)
    said = "a column program's block is (rows, columns, 1) of tiles — a band of columns walked a page of rows at a time"
    p = program.evolve(target=target.name)
    plan = plan_cols(p, target, _page_block(block, said), depth)
    p = place_cols(apply_col_plan(p, plan), target, sites, placement)
    return verify(schedule_cols(p), target)


def _build_attention(
    program, target, block, sub_blocks, depth, sites, placement, form, split_k, multicast
) -> SpatialProgram:
    """An attention program (`passes/attention.py`): bands of query rows, each running the online softmax over the
    blocks of its head's keys. Planned for the sm_90a form (Q, K and V in panels) where it is asked for, or on a
    Hopper target where auto's sm_90a plan prints (`sm90a_refusal`); for the general form otherwise — which the
    persistent form, refusing attention by name, shares."""
    _page_request("attention", "auto", sub_blocks=sub_blocks, split_k=split_k, multicast=multicast)
    planned = check_form(form, target)  # a form that is none is refused, and sm90a off a Hopper target
    said = "an attention's block is (query rows, key rows, 1) of tiles — a band of queries, a block of keys a step"
    forced = _page_block(block, said)

    def built(kind: str) -> SpatialProgram:
        p = program.evolve(target=target.name)
        plan = plan_attention(p, target, forced, depth, kind)
        p = place_attention(apply_attention_plan(p, plan, kind), target, sites, placement)
        return verify(schedule_attention(p), target)

    if planned != "sm90a":
        return built("general")
    if form == "sm90a":
        return built("sm90a")
    try:
        p = built("sm90a")
    except (PlanError, ProgramError):
        return built("general")
    return built("general") if sm90a_refusal(p, target) is not None else p


def _page_block(block: object, said: str) -> tuple[int, int] | None:
    """A map's or a row program's forced block, (rows, columns, 1) tiles, as (rows, columns); ProgramError (`said`,
    and what was given) for anything else."""
    if block is None:
        return None
    whole = isinstance(block, tuple | list) and all(isinstance(v, int) and not isinstance(v, bool) for v in block)
    if not whole or len(block) != 3 or block[2] != 1:  # type: ignore[arg-type, index]
        raise ProgramError(f"{said}, not {block!r}")
    return block[0], block[1]  # type: ignore[index]


def _passes(args: tuple, verified: bool = True) -> SpatialProgram:
    """`_build` of `args` planned for the sm_90a form first where the form is "auto", and again for the others where
    that form refuses its own plan."""
    form = args[7]
    p = _build(*args, sm90a=True, verified=verified)
    why = sm90a_refusal(p, args[1]) if form == "auto" else None
    if why is None:
        return p
    try:
        return _build(*args, sm90a=False, verified=verified)
    except (PlanError, ProgramError) as e:
        raise type(e)(f"{e} (planned for the other forms because the sm_90a form refused its own plan: {why})") from e


def sm90a_refusal(p: SpatialProgram, target: SpatialTarget) -> str | None:
    """Why the sm_90a form cannot print `p`, planned for it (its pages in panels); None where it can, or where `p`
    was planned for another form."""
    from ..errors import SpatialError
    from ..lower.cuda.sm90a import kernel as sm90a_kernel

    if not target.hopper or not in_panels(p):
        return None
    try:
        sm90a_kernel.make_kernel(p, target)
    except SpatialError as why:
        return str(why)
    return None


def _build(
    program: SpatialProgram,
    target: SpatialTarget,
    block,
    sub_blocks,
    depth,
    sites: int | None,
    placement: str | None,
    form: str,
    split_k: int | None,
    multicast: tuple[int, int] | None,
    *,
    sm90a: bool,
    verified: bool = True,
) -> SpatialProgram:
    """`build`, the sm_90a form's plan tried first on a Hopper target where `sm90a` (and form is "auto"); not
    verified where `verified` is False (a plan only compared with another)."""
    group = (1, 1) if multicast is None else check_multicast(multicast)
    if group != (1, 1):
        return _multicast(program, target, group, block, sub_blocks, depth, sites, placement, form, split_k, sm90a)
    if placement == SPLIT_TAIL:
        return _split_tail(program, target, block, sub_blocks, depth, sites, form, split_k, verified, sm90a)
    p = program.evolve(target=target.name)
    if any(t.groups > 1 for t in p.tensors):  # rows counted at run time: only the general form prints them
        if form == "persistent":
            raise ProgramError(
                "a grouped GEMM's rows are counted at run time, which the persistent kernel cannot print; use"
                " form='general' or 'auto' (--form general)"
            )
        form = "general"
    # The plan comes first: the item grid it fixes is what placement distributes. A forced block the wgmma layout
    # does not take gets the persistent kernel's plan, which sm_90a also runs.
    # A split asked for falls back to the general form: only its sites may wait on each other besides sm_90a's.
    fallback = "general" if split_k is not None and split_k > 1 else "persistent"
    p, form = _tile_hopper_first(p, target, block, sub_blocks, depth, form, fallback, sm90a)
    splits = _splits(p, target, split_k, form, sites, placement, forced=block is not None)
    split = None
    if splits > 1:
        # Split-K's sites wait on each other: the general form, with room for the partial rings.
        split_form = "sm90a" if form == "sm90a" else "general"
        split = _split_plan(program.evolve(target=target.name), target, block, sub_blocks, depth, splits, split_form)
        assert split.plan is not None
        per_unit = sites_per_unit(
            target, split.plan, p.precision, split_form, ring_stages(p, split_form, extra_ring_stages(split_form))
        )
        if split_k is None:  # the planner's own choice, made again on the plan made for it; never a refusal
            splits = min(splits, auto_splits(split.plan, target.units * per_unit))
            split = split if splits > 1 else None
    if split is not None and split.plan is not None:
        splits = check_splits(splits, split.plan)
        crowded = fits_at_once(target, split.plan.items * splits, per_unit)
        if crowded:
            raise ProgramError(crowded)
        p = add_split(split, splits)
        p = p.evolve(placement=split_placement(split.plan, splits, sites))
    else:
        # Placement before schedule: each site's ITEM loop count is the number of items placed on it.
        p = place(p, target, sites=sites, placement=placement, form=form)
    p = schedule(p)
    # Last, and the only pass that sets `verified`: everything after this (eval, lower) may rely on it.
    return verify(p, target) if verified else p


def _split_tail(
    program: SpatialProgram, target: SpatialTarget, block, sub_blocks, depth, sites, form, split_k, verified, sm90a
) -> SpatialProgram:
    """build with a split tail (`passes/split.split_tail_placement`): planned for the sm_90a form on a Hopper target
    (where `sm90a`, and form is "auto" or "sm90a"), else for the general form with split-K's rings, on every site the
    form keeps resident (or `sites`), the items of the last wave split over the sites it leaves."""
    said = "placement='split_tail' (--placement split_tail)"
    if any(t.groups > 1 for t in program.tensors):
        raise ProgramError(f"{said}: a grouped GEMM's row counts arrive at run time; its items are not split")
    if split_k is not None:
        raise ProgramError(f"{said} splits the last wave's items itself; it takes no split_k ({split_k!r})")
    if form not in ("auto", "general", "sm90a"):
        raise ProgramError(
            f"{said}: the sites of a split item wait on each other, which the persistent kernel cannot print; use"
            " form='general' or 'auto' (--form general)"
        )
    planned = check_form("sm90a", target) if form == "sm90a" else "general"
    if form == "auto" and target.hopper and sm90a:
        planned = "sm90a"
    if sites is not None:
        check_sites(sites)
    args = (program.evolve(target=target.name), target, block, sub_blocks, depth, sites, said)
    if form == "auto" and planned == "sm90a":  # where the sm_90a form has no plan for it, the general form's
        try:
            p = _split_tail_for(*args, "sm90a")
        except (PlanError, ProgramError):
            p = _split_tail_for(*args, "general")
    else:
        p = _split_tail_for(*args, planned)
    return verify(p, target) if verified else p


def _split_tail_for(
    base: SpatialProgram, target: SpatialTarget, block, sub_blocks, depth, sites, said: str, planned: str
) -> SpatialProgram:
    """`_split_tail`'s program planned for the form `planned` and scheduled (not verified)."""
    extra = extra_ring_stages(planned)
    found = candidates(base, target, block, sub_blocks, depth, planned, extra)
    if not found:
        tile(base, target, block, sub_blocks, depth, planned, extra)  # its refusal says why no plan fits
    best = found[0]

    def on(c) -> int:  # the sites a plan runs: `sites`, or every block the form keeps resident
        return sites if sites is not None else max(1, target.units * c.sites_per_unit)

    # The plan whose last wave splits that the planner's cost prices least with its whole waves and the split's
    # (`split.tail_priced`) and, in the sm_90a form, whose owners add partial sums without spilling
    # (lower/cuda/sm90a/partials.py).
    if planned == "sm90a":
        from ..lower.cuda.sm90a.partials import adds_fit

        found = [c for c in found if adds_fit(c.plan, target) is None] or found
    priced = [
        (cost, c) for c in found if (cost := tail_priced(c.cost, c.plan.items, on(c), c.plan.k_steps)) is not None
    ]
    fit = min(priced, key=lambda pc: pc[0])[1] if priced else None
    if fit is None:
        plan = best.plan
        why = tail_split(plan.items, on(best), plan.k_steps)
        raise ProgramError(f"{said}: the plan's {plan.grid[0]}x{plan.grid[1]} items on {on(best)} sites — {why}")
    p = apply_plan(base, fit.plan, planned)
    plan = fit.plan
    sites = on(fit)
    crowded = fits_at_once(target, sites, fit.sites_per_unit, f"a {said} build", "fewer sites")
    if crowded:
        raise ProgramError(crowded)
    found_split = tail_split(plan.items, sites, plan.k_steps)
    assert not isinstance(found_split, str)  # (the plan was chosen for it)
    tail, splits = found_split
    band = default_band(plan, sites) if plan.items > sites else 0
    p = add_split(p, splits, tail).evolve(placement=split_tail_placement(plan, sites, band))
    return schedule(p)


def _multicast(
    program: SpatialProgram,
    target: SpatialTarget,
    group: tuple[int, int],
    block,
    sub_blocks,
    depth,
    sites: int | None,
    placement: str | None,
    form: str,
    split_k: int | None,
    sm90a: bool = True,
) -> SpatialProgram:
    """build with multicast groups: planned for the general form (a group's sites wait on each other), placed by
    groups, the handshake scheduled."""
    gy, gx = group
    said = asked_multicast(gy, gx)
    if any(t.groups > 1 for t in program.tensors):
        raise ProgramError(f"{said}: a grouped GEMM's row counts arrive at run time; its sites are not grouped")
    if split_k is not None and split_k > 1:
        raise ProgramError(f"{said} and {asked(split_k)}: a build takes one of them")
    if placement is not None:
        raise ProgramError(f"{said} places items itself; it takes no placement rule ({placement!r})")
    if form == "persistent":
        raise ProgramError(
            f"{said}: a group's sites wait on each other, which the persistent kernel cannot print; use"
            " form='general' or 'auto' (--form general)"
        )
    # On a Hopper target the groups are the sm_90a form's clusters, whose TMA loads multicast (as `build`, falling
    # back to the general form's plan where a forced block does not take the wgmma layout).
    wanted = form if target.hopper and form in ("auto", "sm90a") else "general"
    p, planned = _tile_hopper_first(
        program.evolve(target=target.name), target, block, sub_blocks, depth, wanted, "general", sm90a
    )
    assert p.plan is not None
    if block is None and (p.plan.grid[0] % gy or p.plan.grid[1] % gx):
        # The group is the user's, the block the planner's: the best plan whose grid of items falls into groups.
        base = program.evolve(target=target.name)
        found = candidates(base, target, None, sub_blocks, depth, planned)
        fit = next((c.plan for c in found if c.plan.grid[0] % gy == 0 and c.plan.grid[1] % gx == 0), None)
        if fit is not None:
            p = apply_plan(base, fit, planned)
    assert p.plan is not None
    if sites is not None and sites % (gy * gx):  # a kernel's grid is whole clusters: no group left short
        raise ProgramError(f"{said}: sites={sites} is not a whole number of groups of {gy * gx} sites")
    resident = default_sites(p, target, planned) if sites is None else sites
    per_unit = sites_per_unit(target, p.plan, p.precision, planned, ring_stages(p, planned), side_rings(p, planned))
    crowded = fits_at_once(target, resident, per_unit, f"a {said} build", "fewer sites")
    if crowded:
        raise ProgramError(crowded)
    held = target.clusters_at_once(gy * gx, per_unit)  # a group is a cluster: no more than fit at once
    p = add_semaphores(p).evolve(placement=multicast_placement(p.plan, gy, gx, resident, held))
    return verify(schedule(p), target)


def _tile_hopper_first(
    p: SpatialProgram, target: SpatialTarget, block, sub_blocks, depth, form: str, fallback: str, sm90a: bool = True
) -> tuple[SpatialProgram, str]:
    """`p` planned for `form` — "auto" on a Hopper target being the sm_90a form where `sm90a` — and the form it was
    planned for: `fallback` where the form was chosen for the user ("auto") and a forced block or sub-blocks do not
    take the wgmma layout, or `sm90a` is False — the general form where an activation needs it."""
    if form == "auto" and not fused_by_persistent(p):  # only the general form prints it: plan for its rings
        fallback = "general"
        if not target.hopper:
            return tile(p, target, block=block, sub_blocks=sub_blocks, depth=depth, form=fallback), fallback
    if form == "auto" and target.hopper and not sm90a:
        return tile(p, target, block=block, sub_blocks=sub_blocks, depth=depth, form=fallback), fallback
    planned = "sm90a" if form == "auto" and target.hopper else form
    try:
        return tile(p, target, block=block, sub_blocks=sub_blocks, depth=depth, form=planned), planned
    except PlanError:
        if form != "auto" or planned != "sm90a" or (block is None and sub_blocks is None):
            raise
        return tile(p, target, block=block, sub_blocks=sub_blocks, depth=depth, form=fallback), fallback


def _split_plan(
    program: SpatialProgram, target: SpatialTarget, block, sub_blocks, depth, splits: int, form: str = "general"
) -> SpatialProgram:
    """The program planned for the general form with split-K's rings: the best plan whose K steps each of the
    `splits` sites can have one of (a shorter K step where the best has too few), else the best (refused by name)."""
    found = candidates(program, target, block, sub_blocks, depth, form, extra_ring_stages(form))
    # The best plan whose items × splits sites fit at once (the planners favour small items that fill the machine
    # unsplit), and in the sm_90a form whose owners add partial sums without spilling (lower/cuda/sm90a/partials.py);
    # where none does, the best all the same, refused by name below.
    resident = [c for c in found if c.plan.items * splits <= target.units * c.sites_per_unit]
    if form == "sm90a":
        from ..lower.cuda.sm90a.partials import adds_fit

        resident = [c for c in resident if adds_fit(c.plan, target) is None] or resident
    found = resident or found
    fit = next((c.plan for c in found if c.plan.k_steps >= splits), None)
    if fit is not None:
        return apply_plan(program, fit, form)
    if not found:  # no plan fits at all: the planner's own refusal says why
        return tile(program, target, block, sub_blocks, depth, form, extra_ring_stages(form))
    most = max(c.plan.k_steps for c in found)
    forced = " with the forced block" if block else ""
    raise ProgramError(
        f"{asked(splits)}: every plan that fits{forced} has at most {most} K step(s), and each split needs one"
        f" (use split_k ≤ {most}, --split-k {most})"
    )


def _splits(
    p: SpatialProgram,
    target: SpatialTarget,
    split_k: int | None,
    form: str,
    sites: int | None,
    placement: str | None,
    forced: bool = False,
) -> int:
    """The sites per item: `split_k` as asked (checked against the plan), or the planner's choice (`auto_splits`)
    where nothing forces a form, a site count or a placement — judged on the plan as a split would run it
    (`_as_split_runs`) unless the block was `forced`."""
    assert p.plan is not None
    if p.plan.groups > 1:
        if split_k is not None and split_k > 1:
            raise ProgramError(f"{asked(split_k)}: a grouped GEMM's row counts arrive at run time; it is not split")
        return 1
    if split_k is not None:
        check_splits(split_k)  # against the K steps of the plan made for it, below
        if split_k > 1 and form == "persistent":
            raise ProgramError(
                f"{asked(split_k)}: split-K's sites wait on each other, which the persistent kernel cannot print;"
                " use form='general' or 'auto' (--form general)"
            )
        if split_k > 1 and placement is not None:
            raise ProgramError(f"{asked(split_k)} places items itself; it takes no placement rule ({placement!r})")
        return split_k
    if form in ("persistent", "sm90a") or sites is not None or placement is not None:
        return 1
    plan = p.plan if forced else _as_split_runs(p)
    per_unit = sites_per_unit(target, plan, p.precision, "general", ring_stages(p, "general", extra_ring_stages()))
    return auto_splits(plan, target.units * per_unit) if per_unit else 1


def _as_split_runs(p: SpatialProgram) -> Plan:
    """`p`'s plan as a split of it would run: split-K's general form takes K steps of at most IBWS[-1] tiles, so a
    persistent plan of longer ones (`tile.candidates` offers it 8) is judged with that step — its K steps counted,
    and its rings sized, as the planner judged it before it offered 8. The split's own plan decides again (`_build`)."""
    plan = p.plan
    assert plan is not None
    ibw = IBWS[-1]
    if plan.block.ibw <= ibw:
        return plan
    a = next(t for t in p.tensors if t.role == TensorRole.INPUT)
    k_t = -(-a.elems[1] // p.tile.cols)  # the K of A's tiles before the plan padded it
    return dataclasses.replace(plan, block=dataclasses.replace(plan.block, ibw=ibw), k_tiles=-(-k_t // ibw) * ibw)

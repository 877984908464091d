"""place: assign items (output blocks of the plan's grid) to sites, as contiguous runs, round-robin, or grouped:
round-robin over the grid taken in bands of a few rows, so that the items the sites run at one time form a compact
patch whose A and B strips they share in L2 (the default where the sites take more than one wave of items)."""

from __future__ import annotations

import math

from ..errors import PlanError, ProgramError
from ..ir.ids import ItemId, Site
from ..ir.nodes import Placement, Plan, SpatialProgram
from ..ir.worklist import MAX_SITES, RULES, split_items
from ..target import SpatialTarget
from .tile import check_form, matmul_stage, ring_stages, side_rings, sites_per_unit, too_many_items

PLACEMENTS = RULES


def default_sites(p: SpatialProgram, target: SpatialTarget, form: str = "persistent") -> int:
    """What the target keeps resident for this plan's `form` kernel (SMs × blocks per SM), capped at the number of
    items."""
    plan = p.plan
    assert plan is not None
    form = check_form(form, target)
    per_unit = sites_per_unit(target, plan, p.precision, form, ring_stages(p, form), side_rings(p, form))
    return max(1, min(plan.items, target.units * max(per_unit, 1)))


def split(
    items: int, sites: int, kind: str, grid: tuple[int, int] | None = None, band: int = 0
) -> tuple[tuple[Site, tuple[ItemId, ...]], ...]:
    """Items 0..items-1 over `sites` sites by the placement rule `kind` (`ir.worklist.split_items`), as ids."""
    parts = split_items(items, sites, kind, grid, band)
    return tuple((Site(s), tuple(ItemId(i) for i in part)) for s, part in enumerate(parts))


def default_band(plan: Plan, sites: int) -> int:
    """Rows per band of a grouped placement: a wave of `sites` items as `band` rows × sites / band columns reads
    band·h + (sites / band)·w tiles of A and B strips, least at band = √(sites · w / h).

    The band is chosen for the sites placed here and kept when a launch follows a device with other counts of
    multiprocessors: the work list is right for any band, only L2 reuse is less than it could be there."""
    h, w = plan.placed_tiles
    return max(1, min(plan.placed[0], round(math.sqrt(sites * w / h))))


def place(
    p: SpatialProgram,
    target: SpatialTarget,
    sites: int | None = None,
    placement: str | None = None,
    form: str = "persistent",
) -> SpatialProgram:
    """The program with a placement (by default over what the `form` kernel keeps resident). More sites than items
    leaves the extra sites empty."""
    if placement is not None and placement not in PLACEMENTS:
        raise ProgramError(f"unknown placement {placement!r}; use {', '.join(PLACEMENTS)}")
    if p.plan is None:
        raise PlanError("place needs a program with one plan (run tile first)")
    matmul_stage(p)
    too_many = too_many_items(p.plan)
    if too_many:  # refused before split() lists the items, which would take minutes and gigabytes
        raise PlanError(f"place cannot list this plan's items: {too_many}")
    if sites is None:
        sites = default_sites(p, target, form)
    if isinstance(sites, bool) or not isinstance(sites, int) or not 1 <= sites <= MAX_SITES:
        raise ProgramError(f"sites must be a whole number from 1 to {MAX_SITES}, not {sites!r}")
    plan = p.plan
    kind = placement or ("grouped" if plan.items > sites else "contiguous")
    band = default_band(plan, sites) if kind == "grouped" else 0
    return p.evolve(placement=Placement(split(plan.items, sites, kind, plan.placed, band), (), kind, band))

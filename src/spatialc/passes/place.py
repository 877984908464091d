"""place: assign items (output blocks of the plan's grid) to sites, as contiguous runs, round-robin, grouped:
round-robin over the grid taken in bands of a few rows, so that the items the sites run at one time form a compact
patch whose A and B strips they share in L2 (the default where the sites take more than one wave of items), or
hilbert: round-robin along a generalized Hilbert curve over the grid (`ir.worklist.hilbert_order`).

Hilbert order is never the default. It was meant for where a grouped band's wave reads more A and B strips than the
L2 holds (bf16 at 8192³ on 132 SMs: bands of 16 rows of 128 × 256 items, 73 MiB a wave on average), but
there its waves touch more strips, not fewer (83 MiB: a Hilbert patch is as tall as wide, where the band's shape
is chosen for B strips twice A's), and in a model of the L2 (least recently used, waves in lock step) it reads
1,328 MiB from memory to grouped's 1,168 (bench/hilbert_order.py; bench/README.md, "Prediction for Hilbert order").
It stays an option (`placement="hilbert"`, `--placement hilbert`) and a neighbour in the GPU check's sweep."""

from __future__ import annotations

import math

from ..errors import PlanError, ProgramError
from ..ir.ids import ItemId, Site
from ..ir.nodes import Placement, Plan, SpatialProgram
from ..ir.ops import Precision
from ..ir.worklist import GRID_RULES, MAX_SITES, RULES, grid_order, split_items, wave_strips
from ..target import SpatialTarget
from .footprint import OPERAND_BYTES, check_form, matmul_stage, ring_stages, side_rings, sites_per_unit
from .tile import too_many_items

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


def wave_bytes(plan: Plan, precision: Precision, sites: int, kind: str, band: int = 0) -> float:
    """The bytes of A row strips and B column strips (each the whole K) that a wave of `sites` items reads, on
    average over the waves of the grid rule `kind` (`GRID_RULES`): what the L2 must hold for the sites of one wave
    to share their strips, and, if it holds it, for the next wave to reuse them."""
    if kind not in GRID_RULES:
        raise ValueError(f"wave_bytes takes a grid rule ({', '.join(GRID_RULES)}), not {kind!r}")
    h, w = plan.placed_tiles
    k = plan.k_tiles * 16 * OPERAND_BYTES[precision]
    strips = wave_strips(grid_order(kind, plan.placed, band), plan.placed[1], sites)
    return sum(rows * h * 16 * k + cols * w * 16 * k for rows, cols in strips) / len(strips)


def check_sites(sites: object) -> None:
    """ProgramError unless `sites` is a whole number of sites from 1 to MAX_SITES."""
    if isinstance(sites, bool) or not isinstance(sites, int) or not 1 <= sites <= MAX_SITES:
        raise ProgramError(f"sites must be a whole number from 1 to {MAX_SITES}, not {sites!r}")


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
    check_sites(sites)
    plan = p.plan
    kind = placement or ("grouped" if plan.items > sites else "contiguous")  # hilbert: asked for only (see above)
    band = default_band(plan, sites) if kind == "grouped" else 0
    return p.evolve(placement=Placement(split(plan.items, sites, kind, plan.placed, band), (), kind, band))

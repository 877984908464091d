"""The placement rules, as plain arithmetic: which items each site runs. `passes/place.py` places a program by them,
and the GPU launcher and the printed host programs apply the same rule again at launch, for the sites the device
really has — so a kernel planned for 132 SMs runs right (and fills the device) on any other number of them."""

from __future__ import annotations

RULES = ("contiguous", "round_robin", "grouped")
MAX_SITES = 1 << 16  # far more sites than any device has multiprocessors (the work list follows the device)


def grouped_order(grid: tuple[int, int], band: int) -> list[int]:
    """The items of a `grid` (ny, nx) in bands of `band` rows, each band column by column: consecutive items then
    make a compact `band` × k patch of the grid, whose A and B strips a wave of sites shares in L2."""
    ny, nx = grid
    out = []
    for top in range(0, ny, band):
        rows = min(band, ny - top)
        out += [(top + r) * nx + x for x in range(nx) for r in range(rows)]
    return out


def split_items(
    items: int, sites: int, kind: str, grid: tuple[int, int] | None = None, band: int = 0
) -> list[list[int]]:
    """Items 0..items-1 over `sites` sites: near-equal contiguous runs (the first items % sites sites get one more),
    item i on site i mod sites, or (grouped) the `grouped_order` of the item `grid` dealt round-robin, so the sites
    work on one patch of it at a time."""
    if kind == "round_robin":
        return [list(range(s, items, sites)) for s in range(sites)]
    if kind == "grouped":
        if grid is None or grid[0] * grid[1] != items or band < 1:
            raise ValueError(f"a grouped placement needs the item grid and a band of ≥ 1 rows, not {grid}, {band}")
        order = grouped_order(grid, band)
        return [order[s::sites] for s in range(sites)]
    q, r = divmod(items, sites)
    out, start = [], 0
    for s in range(sites):
        n = q + (1 if s < r else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def work_table(parts: list[list[int]]) -> list[int]:
    """The kernel's work list: each site's offset into the flat item list, then each site's count, then the items
    themselves (docs/kernel-abi.md): `2 · sites + items` ints."""
    offs, at = [], 0
    for items in parts:
        offs.append(at)
        at += len(items)
    return offs + [len(items) for items in parts] + [i for items in parts for i in items]


def launch_sites(items: int, sms: int, per_sm: int) -> int:
    """How many sites a kernel that follows the device runs: every resident block busy, none without an item."""
    return max(1, min(items, sms * per_sm))

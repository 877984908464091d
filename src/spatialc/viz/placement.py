"""placement.svg: which site computes each item of the output grid, with the placement's rule in the title."""

from __future__ import annotations

import itertools
import math

from ..ir.nodes import SpatialProgram, TensorRole
from ..ir.printer import plural
from ..ir.worklist import GRID_RULES, split_items
from .svg import CHAR_W, Entry, _colour, _legend, _open, _text

_KEY_SITES = 12  # beyond this many sites the key would be a wall of swatches; the cells carry the numbers


def _placement_key(p: SpatialProgram, holes: bool, numbered: bool) -> list[Entry]:
    """A swatch per site with its item count (the first few, where there are many), and white if an item has none."""
    assert p.placement is not None
    sites = p.placement.items_of_site
    entries = [("box", _colour(int(s)), f"site {s}: {plural(len(i), 'item')}") for s, i in sites]
    if len(entries) > _KEY_SITES:
        which = "the number in a cell is its site" if numbered else "a cell's tooltip names its site"
        more = f"... and {len(entries) - _KEY_SITES} more sites: {which}"
        entries = [*entries[:_KEY_SITES], ("hollow", "", more)]
    if p.placement.multicast != (1, 1):
        gy, gx = p.placement.multicast
        entries.append(
            (
                "frame",
                GROUP_FRAME,
                f"a multicast group's {gy}x{gx} items at one time: A shared along rows, B down columns",
            )
        )
    return entries + ([("box", "#ffffff", "no site (computed by nobody)")] if holes else [])


GROUP_FRAME = "#111111"


def _group_frames(p: SpatialProgram, left: float, top: float, cell: int) -> list[str]:
    """A frame around each block of items a multicast group runs at one time (its sites' j-th items), naming the
    sites that send A along its rows and B down its columns."""
    assert p.placement is not None and p.plan is not None
    gy, gx = p.placement.multicast
    per, nx = gy * gx, p.plan.grid[1]
    listed = p.placement.items_of_site
    out = []
    for first in range(0, len(listed) - per + 1, per):
        sites = [int(listed[first + i][0]) for i in range(per)]
        for j, item in enumerate(listed[first][1]):
            y, x = divmod(int(item), nx)
            senders = []
            if gx > 1:
                senders.append(f"A from sites {', '.join(str(sites[r * gx]) for r in range(gy))} along their rows")
            if gy > 1:
                senders.append(f"B from sites {', '.join(str(sites[c]) for c in range(gx))} down their columns")
            out.append(
                f'<rect class="group" x="{left + x * cell}" y="{top + y * cell}" width="{gx * cell}"'
                f' height="{gy * cell}" fill="none" stroke="{GROUP_FRAME}" stroke-width="3"><title>multicast group of'
                f" sites {sites[0]}-{sites[-1]}, block {j}: {'; '.join(senders)}</title></rect>"
            )
    return out


def placement_rule(p: SpatialProgram) -> str:
    """How the items went to sites, read from the list itself: the rule of ir/worklist.py it follows, whatever its
    `kind` claims ("round-robin", "grouped, bands of 2 rows", "along a Hilbert curve"), else "as listed" (a
    hand-written list)."""
    pl, plan = p.placement, p.plan
    assert pl is not None and plan is not None
    if pl.tail:
        return f"a split tail: the last {pl.tail} items {pl.splits} sites each, every other item whole, grouped"
    if pl.splits > 1:
        return f"split-K: {pl.splits} sites an item"
    if pl.multicast != (1, 1):
        return f"multicast groups of {pl.multicast[0]}x{pl.multicast[1]} sites"
    listed = [[int(i) for i in items] for _, items in pl.items_of_site]
    items, sites = sum(map(len, listed)), len(listed)
    rules = [("contiguous", 0), ("round_robin", 0)] + ([("grouped", pl.band)] if pl.band > 0 else [])
    rules.append(("hilbert", 0))
    rules.sort(key=lambda r: r[0] != pl.kind)  # the rule it claims first, where the list fits several
    for rule, band in rules if items == plan.items else ():
        grid = plan.placed if rule in GRID_RULES else None
        if split_items(items, sites, rule, grid, band) == listed:
            named = {"round_robin": "round-robin", "grouped": f"grouped, bands of {plural(band, 'row')}"}
            return named.get(rule, "along a Hilbert curve" if rule == "hilbert" else rule)
    runs = all(part == list(range(part[0], part[0] + len(part))) for part in listed if part)
    return "as listed, each site's items one run" if runs else "as listed"


def placement_svg(p: SpatialProgram, cell: int = 40) -> str:
    """The item grid, each item coloured by and labelled with the site that computes it."""
    if p.plan is None or p.placement is None:
        raise ValueError("a placement picture needs a tiled and placed program")
    (ny, nx), sites = p.plan.grid, len(p.placement.items_of_site)
    digits = len(str(max(sites - 1, 0)))
    cell = max(6, min(cell, 900 // max(ny, nx)))
    fits = math.ceil(digits * 0.62 * 8 + 4)  # the least cell an 8px site number fits in
    cell = fits if cell < fits and fits * max(ny, nx) <= 1800 else cell  # a bigger picture rather than no numbers
    font = min(12, cell // 2, int((cell - 4) / (0.62 * digits)))  # a monospace digit is about 0.6 of its size
    owner: dict[int, int] = {}  # item → its site (split-K: the owner, the first of its sites)
    for site, items in p.placement.items_of_site:
        for i in items:
            owner.setdefault(int(i), int(site))
    splits = p.placement.splits
    c = next((t for t in p.tensors if t.role == TensorRole.OUTPUT), None)
    ih, iw = p.plan.item_tiles[0] * p.tile.rows, p.plan.item_tiles[1] * p.tile.cols
    title = f"Placement of {p.name}: which of {sites} sites computes each item ({placement_rule(p)})"
    subtitle = (
        f"{f'{c.name} ({c.elems[0]}x{c.elems[1]})' if c else 'The output'} is cut into {ny}x{nx} items of {ih}x{iw}"
        " outputs; one cell per item, coloured and numbered by the site that computes it"
        + (f" (split-K: by the first of its {splits} sites, which adds the others' partial sums)" if splits > 1 else "")
        + (f"; only the last {p.placement.tail} items, framed, are split" if p.placement.tail else "")
    )
    width = max(nx * cell + 90, len(subtitle) * CHAR_W + 40, 520)
    legend, legend_h = _legend(10, 50, width - 20, _placement_key(p, len(owner) < ny * nx, font >= 7))
    top = 50 + legend_h + 30  # room for the column numbers above the grid
    out = [*_open(width, top + ny * cell + 20, title, subtitle), *legend]
    out.append(_text(10, top - 18, f"item y ↓   item x (columns of {iw} outputs) →", "axis-title"))
    every = max(1, math.ceil(24 / cell))  # a number per column or row only where there is room for it
    out += [_text(60 + x * cell + cell / 2, top - 4, str(x), "axis", text_anchor="middle") for x in range(0, nx, every)]
    out += [_text(50, top + y * cell + cell / 2 + 4, str(y), "axis", text_anchor="end") for y in range(0, ny, every)]
    for y, x in itertools.product(range(ny), range(nx)):
        s = owner.get(y * nx + x)
        px, py = 60 + x * cell, top + y * cell
        split = _item_splits(p, y * nx + x)
        out.append(
            f'<rect class="item" x="{px}" y="{py}" width="{cell}" height="{cell}" stroke="#333"'
            f' fill="{"#ffffff" if s is None else _colour(s)}"><title>item ({y}, {x}): {_sites_text(s, split)}</title>'
            "</rect>"
        )
        if p.placement.tail and split > 1 and cell >= 12:  # a split tail's split item: a dashed frame inside
            out.append(
                f'<rect x="{px + 3}" y="{py + 3}" width="{cell - 6}" height="{cell - 6}" fill="none" stroke="#000"'
                ' stroke-dasharray="3,2"/>'
            )
        if font >= 7 and s is not None:
            out.append(_text(px + cell / 2, py + cell / 2 + font / 3, str(s), "site", text_anchor="middle",
                             font_size=str(font)))  # fmt: skip
    if p.placement.multicast != (1, 1):
        out += _group_frames(p, 60, top, cell)
    return "\n".join([*out, "</svg>"]) + "\n"


def _item_splits(p: SpatialProgram, item: int) -> int:
    """The sites item `item` is split over: the placement's splits, or 1 for a whole item of a split tail."""
    pl, plan = p.placement, p.plan
    assert pl is not None and plan is not None
    return pl.splits if not pl.tail or item >= plan.items - pl.tail else 1


def _sites_text(s: int | None, splits: int) -> str:
    if s is None or splits == 1:
        return f"site {s}"
    return f"sites {s}-{s + splits - 1} (split-K; site {s} adds the partial sums and writes it)"

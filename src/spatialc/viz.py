"""Pictures, as standalone SVG text (no dependencies): where the items went, and how the rings filled over time."""

from __future__ import annotations

import colorsys
from html import escape

from .ir.nodes import SpatialProgram


def _colour(i: int, n: int) -> str:
    # Golden-ratio hue steps keep neighbouring sites apart in colour even when there are hundreds of them.
    h = (i * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(h, 0.62, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def placement_svg(p: SpatialProgram, cell: int = 28) -> str:
    """The item grid, each item coloured by and labelled with the site that computes it."""
    if p.plan is None or p.placement is None:
        raise ValueError("a placement picture needs a tiled and placed program")
    ny, nx = p.plan.grid
    cell = max(6, min(cell, 900 // max(ny, nx)))
    owner = {int(i): int(s) for s, items in p.placement.items_of_site for i in items}
    sites = len(p.placement.items_of_site)
    w, h = max(nx * cell + 20, 480), ny * cell + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" font-size="10">',
           f'<text x="10" y="16">{escape(p.name)}: {ny}x{nx} items on {sites} sites ({p.placement.kind})</text>',
           f'<text x="10" y="30">item = {p.plan.item_tiles[0] * 16}x{p.plan.item_tiles[1] * 16} outputs;'
           ' colour and number = site</text>']
    for y in range(ny):
        for x in range(nx):
            s = owner.get(y * nx + x)
            fill = "#ffffff" if s is None else _colour(s, sites)
            px, py = 10 + x * cell, 40 + y * cell
            out.append(f'<rect x="{px}" y="{py}" width="{cell}" height="{cell}" fill="{fill}" stroke="#333"/>')
            if cell >= 16 and s is not None:
                out.append(f'<text x="{px + 3}" y="{py + cell // 2 + 4}">{s}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

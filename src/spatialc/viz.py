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
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" font-size="10">',
        f'<text x="10" y="16">{escape(p.name)}: {ny}x{nx} items on {sites} sites ({p.placement.kind})</text>',
        f'<text x="10" y="30">item = {p.plan.item_tiles[0] * 16}x{p.plan.item_tiles[1] * 16} outputs;'
        " colour and number = site</text>",
    ]
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


_OP_FILL = {
    "ReadTiles": "#4e79a7",
    "WriteTiles": "#59a14f",
    "Compute": "#e15759",
    "PackAcc": "#f28e2b",
    "Wait": "#d3d3d3",
    "Reserve": "#d3d3d3",
}


def timeline_svg(trace, site: int = 0, max_ticks: int | None = None, width: int = 1000) -> str:
    """One site's engines as lanes of op spans, and each of its rings' occupancy against its depth, over ticks.

    `trace` is what `spatialc.evaluate(..., trace=True)` returns beside C. Waits and reserves that blocked show as
    long grey spans: that is where an engine starved or a ring was full."""
    engines = [e for e in ("reader", "compute", "writer") if trace.engine(site, e)]
    rings = [r for r in trace.rings if r.site == site]
    end = min(trace.ticks, max_ticks) if max_ticks else trace.ticks
    scale = (width - 110) / max(end, 1)
    lane, ring_h = 26, 46
    height = 40 + lane * len(engines) + (ring_h + 12) * len(rings) + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace"'
        ' font-size="10">',
        f'<text x="10" y="16">site {site}: ticks 0..{end} (engine ops above, ring pages'
        " below; grey = blocked or waiting)</text>",
    ]
    for row, eng in enumerate(engines):
        y = 30 + row * lane
        out.append(f'<text x="10" y="{y + 15}">{eng}</text>')
        for s in trace.engine(site, eng):
            if s.start >= end:
                break
            kind = s.op.split()[0]
            fill = _OP_FILL.get(kind, "#bab0ac")
            x0, x1 = 100 + s.start * scale, 100 + min(s.end, end) * scale
            out.append(
                f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" height="{lane - 6}"'
                f' fill="{fill}"><title>{escape(s.op)} [{s.start}, {s.end})</title></rect>'
            )
    top = 30 + lane * len(engines) + 10
    for i, r in enumerate(rings):
        y0 = top + i * (ring_h + 12)
        unit = (ring_h - 4) / max(r.depth, 1)
        out.append(f'<text x="10" y="{y0 + ring_h // 2}">{escape(r.ring)}</text>')
        out.append(
            f'<line x1="100" y1="{y0 + 2}" x2="{width - 10}" y2="{y0 + 2}" stroke="#c00"'
            f' stroke-dasharray="4 3"><title>depth {r.depth}</title></line>'
        )
        out.append(f'<line x1="100" y1="{y0 + ring_h - 2}" x2="{width - 10}" y2="{y0 + ring_h - 2}" stroke="#999"/>')
        points, level = [f"100,{y0 + ring_h - 2}"], 0
        for smp in r.samples:
            if smp.tick > end:
                break
            x = 100 + smp.tick * scale
            points.append(f"{x:.1f},{y0 + ring_h - 2 - level * unit:.1f}")
            level = smp.occupied
            points.append(f"{x:.1f},{y0 + ring_h - 2 - level * unit:.1f}")
        points.append(f"{100 + end * scale:.1f},{y0 + ring_h - 2 - level * unit:.1f}")
        out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def deadlock_svg(p: SpatialProgram, blocked: tuple[tuple[int, str, str], ...], size: int = 640) -> str:
    """The wait-for graph of a deadlock: each blocked engine, and an arrow to the engine it waits on (the producer
    of the ring it waits for data from, the consumer of the ring it waits for room in)."""
    import math

    from .ir.ops import Pop, Push, walk

    makers: dict[tuple[int, str, str], str] = {}  # (site, ring name, "push" | "pop") -> engine
    if p.schedule is not None:
        for prog in p.schedule.programs:
            for op in walk(prog.ops):
                if isinstance(op, Push | Pop):
                    name = p.buffer(op.buf).name
                    makers[(int(prog.site), name, "push" if isinstance(op, Push) else "pop")] = prog.engine.value
    nodes = [f"site {s} {e}" for s, e, _ in blocked]
    edges = []
    for s, e, text in blocked:
        words = text.split()
        if len(words) >= 2 and words[0] in ("Wait", "Reserve"):
            other = makers.get((s, words[1], "push" if words[0] == "Wait" else "pop"))
            if other is not None:
                edges.append((f"site {s} {e}", f"site {s} {other}", text))
    r, cx, cy = size / 2 - 110, size / 2 + 60, size / 2
    pos = {
        n: (
            cx + r * math.cos(2 * math.pi * i / max(len(nodes), 1) - math.pi / 2),
            cy + r * math.sin(2 * math.pi * i / max(len(nodes), 1) - math.pi / 2),
        )
        for i, n in enumerate(nodes)
    }
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 260}" height="{size}" font-family="monospace"'
        ' font-size="11">',
        '<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="9" refY="4"'
        ' orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#c00"/></marker></defs>',
        f'<text x="10" y="16">deadlock in {escape(p.name)}: an arrow points at the engine that would unblock it</text>',
    ]
    for a, b, text in edges:
        (x0, y0), (x1, y1) = pos[a], pos.get(b, pos[a])
        # Shift each edge a little to its left, so the two arrows of a two-engine cycle do not lie on each other.
        length = max(math.hypot(x1 - x0, y1 - y0), 1.0)
        nx, ny = -(y1 - y0) / length * 7, (x1 - x0) / length * 7
        x0, y0, x1, y1 = x0 + nx, y0 + ny, x1 + nx, y1 + ny
        out.append(
            f'<line x1="{x0:.0f}" y1="{y0:.0f}" x2="{(x0 + 6 * x1) / 7:.0f}" y2="{(y0 + 6 * y1) / 7:.0f}"'
            f' stroke="#c00" marker-end="url(#arrow)"><title>{escape(text)}</title></line>'
        )
        out.append(
            f'<text x="{(3 * x0 + x1) / 4 + nx:.0f}" y="{(3 * y0 + y1) / 4 + ny:.0f}" fill="#c00">'
            f"{escape(text.split(' — ')[0])}</text>"
        )
    for n in nodes:
        x, y = pos[n]
        out.append(f'<circle cx="{x:.0f}" cy="{y:.0f}" r="8" fill="#f2c14e" stroke="#333"/>')
        out.append(f'<text x="{x + 12:.0f}" y="{y - 6:.0f}" font-weight="bold">{escape(n)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

"""Pictures, as standalone SVG text (no dependencies): where the items went, how a site's engines and rings went
over time, and which engines a deadlock left waiting on which. Each has a title saying what it shows, a colour
key, and (the timeline) axes with numbers, so that it can be read without the source."""

from __future__ import annotations

import colorsys
import itertools
import math
import re
import textwrap
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path

from .errors import DeadlockError
from .interp.trace import RingTrace, Trace
from .ir.nodes import Engine, PageLayout, SpatialProgram, TensorRole
from .ir.ops import ChoreoOp, Pop, Push, Reserve, SemInc, SemWait, Wait, walk
from .ir.printer import op_text, plural

CHAR_W = 7  # the width of a character of the 11px monospace font, a little over, to lay text out without measuring
Entry = tuple[str, str, str]  # a colour key's (swatch kind, colour, label)
Point = tuple[float, float]
Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def _colour(i: int) -> str:
    # Golden-ratio hue steps keep neighbouring sites apart in colour even when there are hundreds of them.
    h = (i * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(h, 0.62, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _text(x: float, y: float, s: str, cls: str = "", **attrs: str) -> str:
    more = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    klass = f' class="{cls}"' if cls else ""
    return f'<text{klass} x="{x:.1f}" y="{y:.1f}"{more}>{escape(s)}</text>'


def _open(width: float, height: float, title: str, *subtitles: str) -> list[str]:
    """The root element, a white page (viewers show transparency as black or chequers) and the title lines."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}"'
        f' viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="11">',
        f"<title>{escape(title)}</title>",
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        _text(10, 20, title, "title", font_size="14", font_weight="bold"),
        *(_text(10, 38 + 16 * i, line, "subtitle") for i, line in enumerate(subtitles)),
    ]


def _swatch(x: float, y: float, kind: str, colour: str) -> str:
    """A key's sample: a filled box, a dashed hollow box, a line, a dashed line or an arrow."""
    line = f'<line x1="{x}" y1="{y + 5}" x2="{x + 18}" y2="{y + 5}" stroke="{colour}" stroke-width="2"'
    match kind:
        case "line" | "dash":
            return line + (' stroke-dasharray="4 3"/>' if kind == "dash" else "/>")
        case "arrow":
            return line + f'/><path d="M{x + 12},{y} L{x + 19},{y + 5} L{x + 12},{y + 10} z" fill="{colour}"/>'
        case "hollow":
            return f'<rect x="{x}" y="{y}" width="18" height="10" fill="#fff" stroke="#555" stroke-dasharray="3 2"/>'
        case "frame":
            return f'<rect x="{x}" y="{y}" width="18" height="10" fill="#fff" stroke="{colour}" stroke-width="3"/>'
    return f'<rect x="{x}" y="{y}" width="18" height="10" fill="{colour}" stroke="#555" stroke-width="0.5"/>'


def _legend(x: float, y: float, width: float, entries: Sequence[Entry]) -> tuple[list[str], float]:
    """A colour key, its entries flowed into rows `width` wide; returns it and its height."""
    out = ['<g class="legend">', _text(x, y + 9, "key:", "legend-head", font_weight="bold")]
    cx, cy, left = x + 40, y, x + 40
    for kind, colour, label in entries:
        w = 26 + len(label) * CHAR_W + 18
        if cx > left and cx + w > x + width:
            cx, cy = left, cy + 16
        out.append(f'<g class="legend-entry">{_swatch(cx, cy, kind, colour)}{_text(cx + 24, cy + 9, label)}</g>')
        cx += w
    return [*out, "</g>"], cy - y + 16


# ---- placement ---------------------------------------------------------------------------------------------------

_KEY_SITES = 12  # beyond this many sites the key would be a wall of swatches; the cells carry the numbers


def _placement_key(p: SpatialProgram, holes: bool) -> list[Entry]:
    """A swatch per site with its item count (the first few, where there are many), and white if an item has none."""
    assert p.placement is not None
    sites = p.placement.items_of_site
    entries = [("box", _colour(int(s)), f"site {s}: {plural(len(i), 'item')}") for s, i in sites]
    if len(entries) > _KEY_SITES:
        more = f"... and {len(entries) - _KEY_SITES} more sites: the number in a cell is its site"
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


def placement_svg(p: SpatialProgram, cell: int = 40) -> str:
    """The item grid, each item coloured by and labelled with the site that computes it."""
    if p.plan is None or p.placement is None:
        raise ValueError("a placement picture needs a tiled and placed program")
    (ny, nx), sites = p.plan.grid, len(p.placement.items_of_site)
    cell = max(6, min(cell, 900 // max(ny, nx)))
    owner: dict[int, int] = {}  # item → its site (split-K: the owner, the first of its sites)
    for s, items in p.placement.items_of_site:
        for i in items:
            owner.setdefault(int(i), int(s))
    splits = p.placement.splits
    c = next((t for t in p.tensors if t.role == TensorRole.OUTPUT), None)
    ih, iw = p.plan.item_tiles[0] * p.tile.rows, p.plan.item_tiles[1] * p.tile.cols
    title = f"Placement of {p.name}: which of {sites} sites computes each item ({p.placement.kind})"
    subtitle = (
        f"{f'{c.name} ({c.elems[0]}x{c.elems[1]})' if c else 'The output'} is cut into {ny}x{nx} items of {ih}x{iw}"
        " outputs; one cell per item, coloured and numbered by the site that computes it"
        + (f" (split-K: by the first of its {splits} sites, which adds the others' partial sums)" if splits > 1 else "")
    )
    width = max(nx * cell + 90, len(subtitle) * CHAR_W + 40, 520)
    legend, legend_h = _legend(10, 50, width - 20, _placement_key(p, len(owner) < ny * nx))
    top = 50 + legend_h + 30  # room for the column numbers above the grid
    out = [*_open(width, top + ny * cell + 20, title, subtitle), *legend]
    out.append(_text(10, top - 18, f"item y ↓   item x (columns of {iw} outputs) →", "axis-title"))
    every = max(1, math.ceil(24 / cell))  # a number per column or row only where there is room for it
    out += [_text(60 + x * cell + cell / 2, top - 4, str(x), "axis", text_anchor="middle") for x in range(0, nx, every)]
    out += [_text(50, top + y * cell + cell / 2 + 4, str(y), "axis", text_anchor="end") for y in range(0, ny, every)]
    font = max(7, min(12, cell // 2))
    for y, x in itertools.product(range(ny), range(nx)):
        s = owner.get(y * nx + x)
        px, py = 60 + x * cell, top + y * cell
        out.append(
            f'<rect class="item" x="{px}" y="{py}" width="{cell}" height="{cell}" stroke="#333"'
            f' fill="{"#ffffff" if s is None else _colour(s)}"><title>item ({y}, {x}): {_sites_text(s, splits)}</title>'
            "</rect>"
        )
        if cell >= 14 and s is not None:
            out.append(_text(px + cell / 2, py + cell / 2 + font / 3, str(s), "site", text_anchor="middle",
                             font_size=str(font)))  # fmt: skip
    if p.placement.multicast != (1, 1):
        out += _group_frames(p, 60, top, cell)
    return "\n".join([*out, "</svg>"]) + "\n"


def _sites_text(s: int | None, splits: int) -> str:
    if s is None or splits == 1:
        return f"site {s}"
    return f"sites {s}-{s + splits - 1} (split-K; site {s} adds the partial sums and writes it)"


# ---- timeline ----------------------------------------------------------------------------------------------------

# Op kind -> (fill, key label). Waiting ops are grey so that long grey spans read as "idle" at a glance.
_OP_FILL = {
    "ReadTiles": ("#4e79a7", "ReadTiles: load tiles into a ring"),
    "Compute": ("#e15759", "Compute: multiply / epilogue"),
    "PackAcc": ("#f28e2b", "PackAcc: accumulator into a ring"),
    "WriteTiles": ("#59a14f", "WriteTiles: ring to the output"),
    "Wait": ("#c7c7c7", "Wait: for pages (long = starved)"),
    "Reserve": ("#7f7f7f", "Reserve: for room (long = ring full)"),
    "SemWait": ("#b07aa1", "SemWait / Barrier: for other sites"),
}
_OTHER = "#e6d5b8"
_RING_KEY = [("box", "#1f77b4", "ring pages published (ready)"), ("box", "#aec7e8", "ring pages reserved"),
             ("dash", "#c00", "ring depth")]  # fmt: skip
_LEFT, _LANE, _RING = 150, 24, 50
Scale = Callable[[float], float]  # tick -> x


def _kind(op: str) -> str:
    word = op.split()[0] if op else ""
    return "SemWait" if word == "Barrier" else word if word in _OP_FILL else "other"


def _nice_ticks(end: int, most: int = 10) -> list[int]:
    """0, a round step (1, 2 or 5 times a power of ten) and `end` itself, so the axis ends on the last tick drawn."""
    if end <= 0:
        return [0]
    raw = end / most
    mag = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    ticks = list(range(0, end, step))
    if len(ticks) > 1 and end - ticks[-1] < 0.4 * step:
        ticks.pop()  # a label just before `end` would overprint it
    return [*ticks, end]


def _step_polygon(steps: list[tuple[int, int]], end: int, x: Scale, base: float, unit: float, fill: str) -> str:
    """A filled step curve: level steps[i][1] from tick steps[i][0] until the next step, up to `end`."""
    pts, level = [f"{x(0):.1f},{base:.1f}"], 0
    for t, v in steps:
        pts += [f"{x(t):.1f},{base - level * unit:.1f}", f"{x(t):.1f},{base - v * unit:.1f}"]
        level = v
    pts += [f"{x(end):.1f},{base - level * unit:.1f}", f"{x(end):.1f},{base:.1f}"]
    return f'<polygon points="{" ".join(pts)}" fill="{fill}" stroke="none"/>'


def _ring_row(r: RingTrace, y0: float, end: int, x: Scale) -> list[str]:
    """One ring: published pages (dark) under reserved ones (light), the depth as a dashed red line, a 0..depth axis."""
    base, unit, right = y0 + _RING - 4, (_RING - 10) / max(r.depth, 1), x(end)
    # The last sample of a tick is where the ring stands after it.
    levels = {0: (0, 0)} | {s.tick: (s.reserved, s.published) for s in r.samples if s.tick <= end}
    occ = sorted(levels.items())
    out = [
        _text(10, y0 + _RING / 2, r.ring, "lane"),
        _text(10, y0 + _RING / 2 + 13, _depth_text(r), "lane", fill="#666"),
        _step_polygon([(t, a + b) for t, (a, b) in occ], end, x, base, unit, "#aec7e8"),
        _step_polygon([(t, b) for t, (_, b) in occ], end, x, base, unit, "#1f77b4"),
        f'<line x1="{_LEFT}" y1="{base}" x2="{right:.1f}" y2="{base}" stroke="#999"/>',
        f'<line x1="{_LEFT}" y1="{base - r.depth * unit:.1f}" x2="{right:.1f}" y2="{base - r.depth * unit:.1f}"'
        f' stroke="#c00" stroke-dasharray="4 3"><title>depth {r.depth}</title></line>',
        f'<line x1="{_LEFT}" y1="{base}" x2="{_LEFT}" y2="{base - r.depth * unit:.1f}" stroke="#333"/>',
    ]
    every = 1 if r.depth <= 4 else r.depth  # a label on each page level only where they do not collide
    levels_text = [
        _text(_LEFT - 4, base - v * unit + 4, str(v), "", text_anchor="end") for v in range(0, r.depth + 1, every)
    ]
    return [f'<g class="ring" data-ring="{escape(r.ring)}">', *out, '<g class="ring-axis">', *levels_text, "</g></g>"]


def _tick_axis(y: float, end: int, x: Scale, top: float) -> list[str]:
    """The tick axis along the bottom, with light grid lines up through the lanes."""
    out = ['<g class="axis">', f'<line x1="{x(0)}" y1="{y}" x2="{x(end):.1f}" y2="{y}" stroke="#333"/>']
    for t in _nice_ticks(end):
        out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{y}" stroke="#000" stroke-opacity="0.08"/>')
        out.append(f'<line x1="{x(t):.1f}" y1="{y}" x2="{x(t):.1f}" y2="{y + 4}" stroke="#333"/>')
        out.append(_text(x(t), y + 15, str(t), "tick", text_anchor="middle"))
    axis_title = "logical tick (one tick ~ one tile moved or multiplied)"
    return [*out, "</g>", _text(x(end / 2), y + 31, axis_title, "axis-title", text_anchor="middle")]


def _depth_text(r) -> str:
    """A ring's depth, with its page layout where that is not plain row-major (ir.nodes.PageLayout.note)."""
    note = PageLayout(r.layout).note
    return f"depth {r.depth}" + (f", {note}" if note else "")


def timeline_svg(
    trace: Trace, site: int = 0, max_ticks: int | None = None, width: int = 1000, *, name: str = ""
) -> str:
    """One site's engines as lanes of op spans, and each of its rings' occupancy against its depth, over ticks.

    `trace` is what `spatialc.evaluate(..., trace=True)` returns beside C; `name` (the program's) goes in the title.
    Waits and reserves that blocked show as long grey spans: that is where an engine starved or a ring was full."""
    engines = [e.value for e in Engine if trace.engine(site, e.value)]
    rings = [r for r in trace.rings if r.site == site]
    total = trace.ticks
    end = min(total, max_ticks) if max_ticks else total
    shown = "the whole run" if end == total else f"only the first {end} drawn"
    title = f"Timeline of site {site}{f' of {name}' if name else ''}: ticks 0..{end} of {total} ({shown})"
    subtitle = "top: what each engine ran, tick by tick; bottom: the pages held in each ring against its depth"
    spans = [s for e in engines for s in trace.engine(site, e) if s.start < end]
    kinds = {_kind(s.op) for s in spans}
    others = sorted({s.op.split()[0] for s in spans if _kind(s.op) == "other"})
    entries = [("box", fill, label) for k, (fill, label) in _OP_FILL.items() if k in kinds]
    entries += [("box", _OTHER, f"{', '.join(others)}: bookkeeping")] if others else []
    legend, legend_h = _legend(10, 50, width - 20, entries + (_RING_KEY if rings else []))
    top = 50 + legend_h + 12
    rings_top = top + 16 + _LANE * len(engines) + 10
    axis_y = rings_top + 16 + (_RING + 10) * len(rings) + 4

    def x(t: float) -> float:
        return _LEFT + t * (width - 20 - _LEFT) / max(end, 1)

    out = [*_open(width, axis_y + 42, title, subtitle), *legend]
    out.append(_text(10, top + 10, "engines", "section", font_weight="bold"))
    out += [] if engines else [_text(_LEFT, top + 10, f"site {site} runs nothing", "section")]
    for row, eng in enumerate(engines):
        y = top + 16 + row * _LANE
        out.append(_text(10, y + 14, eng, "lane"))
        for s in (s for s in spans if s.engine == eng):
            x0, x1 = x(s.start), x(min(s.end, end))
            out.append(
                f'<rect class="span" x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" height="{_LANE - 6}"'
                f' fill="{_OP_FILL.get(_kind(s.op), (_OTHER, ""))[0]}"><title>{escape(s.op)} [{s.start}, {s.end})'
                "</title></rect>"
            )
    out += [_text(10, rings_top + 10, "rings (pages)", "section", font_weight="bold")] if rings else []
    for i, r in enumerate(rings):
        out += _ring_row(r, rings_top + 16 + i * (_RING + 10), end, x)
    out += _tick_axis(axis_y, end, x, top + 14)
    return "\n".join([*out, "</svg>"]) + "\n"


# ---- deadlock ----------------------------------------------------------------------------------------------------

_HEAD = r"site (\d+) (\w+)(?: \[[^\]]*\])?: "
# One blocked engine in either message: verify's "deadlock: HEAD: op — why; HEAD: …" or the interpreter's lines.
_ENTRY = re.compile(_HEAD + r"(.+?) — (.+?)(?=; " + _HEAD + r"| \(and on \d+ other|\n|$)")
_OTHER_SITES = re.compile(r"\(and on (\d+) other site\(s\)[^)]*\)")

Node = tuple[int, str]  # (site, engine)
_ENGINE_COL = {"reader": 0, "compute": 1, "writer": 2}  # any other engine (a mover) in a fourth column
_EDGE = {  # blocking op -> (colour, what the blocked engine waits for, key label)
    "Wait": ("#1f5fa8", "data in", "Wait: for pages the engine pointed at has not published"),
    "Reserve": ("#c0392b", "room in", "Reserve: for room the engine pointed at has not freed"),
    "SemWait": ("#7b4ea3", "", "SemWait: for a semaphore the engine pointed at raises"),
}
_NODE_W, _NODE_H, _COL_W, _ROW_H = 170, 40, 330, 250
# An arrowhead per colour: in SVG 1.1 a marker does not take the colour of the path it ends.
_MARKER = '<marker id="arrow{0}" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto"'
_MARKER += ' markerUnits="userSpaceOnUse"><path d="M0,0 L10,4 L0,8 z" fill="#{0}"/></marker>'
_MARKERS = "<defs>" + "".join(_MARKER.format(c[1:]) for c, _, _ in _EDGE.values()) + "</defs>"


def reasons_of(error: DeadlockError) -> list[str]:
    """Why each engine of `error.blocked` is stuck ("0 of 1 page(s) published"), read from the error's message;
    "" for an engine the message does not list (the interpreter's lists only the first few)."""
    found = {(int(m[1]), m[2], m[3]): m[4].strip() for m in _ENTRY.finditer(str(error))}
    return [found.get((int(s), e, op), "") for s, e, op in error.blocked]


def _note_of(error: DeadlockError) -> str:
    m = _OTHER_SITES.search(str(error))
    return f"the same deadlock happens on {m[1]} other site(s) with the same programs" if m else ""


def _blocking_ops(p: SpatialProgram, blocked: Sequence[tuple[int, str, str]], sites: list[int]) -> dict[Node, ChoreoOp]:
    """The op each blocked engine of `sites` is stuck at, found by its text in the engine's program."""
    want = {(int(s), e): text for s, e, text in blocked if int(s) in sites}
    found: dict[Node, ChoreoOp] = {}
    for prog in p.schedule.programs if p.schedule else ():
        key = (int(prog.site), prog.engine.value)
        op = next((o for o in walk(prog.ops) if op_text(p, o) == want[key]), None) if key in want else None
        found.update({key: op} if op is not None else {})
    return found


def _waited_on(p: SpatialProgram, node: Node, op: ChoreoOp) -> list[Node]:
    """The engines whose next move would unblock `op`: a ring's producer (Wait), its consumer (Reserve), or the
    engines that raise a semaphore at this site (SemWait). A Barrier waits on sites, not engines: none."""
    site, out = node[0], []
    for prog in p.schedule.programs if p.schedule else ():
        for o in walk(prog.ops):
            match op, o:
                case (Wait(buf), Push(b)) | (Reserve(buf), Pop(b)) if b == buf and int(prog.site) == site:
                    out.append((site, prog.engine.value))
                case (SemWait(sem), SemInc(s, at)) if s == sem and int(at) == site:
                    out.append((int(prog.site), prog.engine.value))
    return list(dict.fromkeys(out))


def _on_cycle(edges: list[tuple[Node, Node]]) -> set[tuple[Node, Node]]:
    """The edges a→b where b reaches a: those are the deadlock itself; the others are engines waiting on it."""
    succ: dict[Node, list[Node]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)

    def reached(n: Node) -> set[Node]:
        seen, todo = set(), [n]
        while todo:
            new = [m for m in succ.get(todo.pop(), []) if m not in seen]
            seen.update(new)
            todo += new
        return seen

    return {(a, b) for a, b in edges if a == b or a in reached(b)}


def _curve(a: Point, b: Point) -> tuple[str, Callable[[float], Point], Point]:
    """An arrow's path from box a to box b bent to its left (so a→b and b→a never overlap), its point at t in
    [0, 1], and the outward normal of the bend."""
    if a == b:  # an engine waiting on itself: a loop over the top of its box
        x, y = a[0], a[1] - _NODE_H / 2
        return f"M{x - 30},{y} C{x - 50},{y - 70} {x + 50},{y - 70} {x + 30},{y + 2}", lambda t: (x, y - 52), (0, -1)
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = math.hypot(dx, dy)
    n = (dy / length, -dx / length)
    c = ((a[0] + b[0]) / 2 + n[0] * max(0.3 * length, 50), (a[1] + b[1]) / 2 + n[1] * max(0.3 * length, 50))

    def border(m: Point, pad: float) -> Point:  # where the ray from box centre m toward c leaves the box
        ex, ey = c[0] - m[0], c[1] - m[1]
        t = min((_NODE_W / 2 + pad) / abs(ex) if ex else math.inf, (_NODE_H / 2 + pad) / abs(ey) if ey else math.inf)
        return m[0] + ex * t, m[1] + ey * t

    p0, p1 = border(a, 0), border(b, 3)

    def at(t: float) -> Point:
        u = 1 - t
        return u * u * p0[0] + 2 * u * t * c[0] + t * t * p1[0], u * u * p0[1] + 2 * u * t * c[1] + t * t * p1[1]

    return f"M{p0[0]:.1f},{p0[1]:.1f} Q{c[0]:.1f},{c[1]:.1f} {p1[0]:.1f},{p1[1]:.1f}", at, n


def _label_spot(at: Callable[[float], Point], n: Point, lines: list[str], taken: list[Box]) -> Box:
    """The box a label goes in, added to `taken`: just off the curve, outside its bend and mid-way if that is free,
    else the first of a few points along it, on either side, that overlaps no box already taken (crossing arrows
    cross mid-way)."""
    w, h = max(len(line) for line in lines) * CHAR_W + 6, 13 * len(lines) + 4
    reach = (abs(n[0]) * w + abs(n[1]) * h) / 2 + 6  # from the box's centre to the curve: its near side 6px off
    boxes = []
    for side, t in itertools.product((1, -1), (0.5, 0.35, 0.65, 0.2, 0.8)):
        x, y = at(t)
        cx, cy = x + side * n[0] * reach, y + side * n[1] * reach
        boxes.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
    free = (b for b in boxes if not any(b[0] < o[2] and o[0] < b[2] and b[1] < o[3] and o[1] < b[3] for o in taken))
    taken.append(next(free, boxes[0]))
    return taken[-1]


def _edge_svg(a: Point, b: Point, colour: str, label: list[str], strong: bool, taken: list[Box]) -> tuple[str, str]:
    """A curved arrow a→b, and apart its label on a white ground (drawn after every arrow, so none runs through it)."""
    d, at, n = _curve(a, b)
    style = 'stroke-width="2.5"' if strong else 'stroke-width="1.5" stroke-dasharray="6 4"'
    path = (
        f'<path d="{d}" fill="none" stroke="{colour}" {style} marker-end="url(#arrow{colour[1:]})">'
        f"<title>{escape(' '.join(label))}</title></path>"
    )
    x0, y0, x1, y1 = _label_spot(at, n, label, taken)
    ground = f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0}" fill="#fff" fill-opacity="0.85"'
    ground += f' stroke="{colour}" stroke-width="0.5" rx="3"/>'
    lines = [_text((x0 + x1) / 2, y0 + 13 * (i + 1), s, text_anchor="middle", fill=colour) for i, s in enumerate(label)]
    return path, ground + "".join(lines)


def _edge_label(p: SpatialProgram, op: ChoreoOp, reason: str) -> list[str]:
    """'waits for room in A_ring' and the reason from the error ('needs 1 free page(s), but 1 of 1 are held')."""
    kind, what, *_ = [*op_text(p, op).split(), ""]
    reason = reason.removeprefix(f"{what}: ")  # the interpreter starts its reasons with the ring's name
    return [" ".join(w for w in ("waits for", _EDGE[kind][1], what) if w), *textwrap.wrap(reason, 44)]


class _Graph:
    """The wait-for graph of a deadlock's first `max_sites` sites: the blocked engines, the engines they wait on
    (blocked too, or finished), the op each is stuck at, and which edges lie on a cycle."""

    def __init__(self, p: SpatialProgram, blocked: Sequence[tuple[int, str, str]], max_sites: int):
        self.sites = list(dict.fromkeys(int(s) for s, _, _ in blocked))[:max_sites]
        self.ops = _blocking_ops(p, blocked, self.sites)
        self.edges = [
            (node, other)
            for node, op in self.ops.items()
            if type(op).__name__ in _EDGE
            for other in _waited_on(p, node, op)
            if other[0] in self.sites
        ]
        # Arrows within a site first: they have the natural places for their labels; arrows between sites cross.
        self.edges.sort(key=lambda e: e[0][0] != e[1][0])
        self.stuck = [(int(s), e) for s, e, _ in blocked if int(s) in self.sites]
        self.done = [n for _, n in self.edges if n not in self.stuck]  # waited on, not blocked: it has finished
        self.cycle = _on_cycle(self.edges)
        self.not_drawn = sum(1 for s, _, _ in blocked if int(s) not in self.sites)

    def subtitles(self, note: str) -> list[str]:
        """What the title leaves out: `note`, the sites not drawn, how to read an arrow."""
        lines = [note] if note else []
        if self.not_drawn:
            drawn = ", ".join(map(str, self.sites))
            lines.append(f"drawn: site(s) {drawn} ({self.not_drawn} more blocked engines on other sites are not)")
        if self.edges:
            lines.append("an arrow points from a blocked engine to the engine that must move first to unblock it")
        return lines

    def key(self) -> list[Entry]:
        """The colour key: only what this picture shows."""
        hot = {a for a, _ in self.cycle}
        entries = [("box", "#f2a541", "blocked, on the cycle")] if hot else []
        if any(n not in hot for n in self.stuck):
            entries.append(("box", "#f7e08a", "blocked, waiting on the cycle" if hot else "blocked"))
        entries += [("hollow", "", "finished")] if self.done else []
        kinds = {type(self.ops[a]).__name__ for a, _ in self.edges}
        entries += [("arrow", c, label) for k, (c, _, label) in _EDGE.items() if k in kinds]
        entries += [("line", "#333", "solid: the cycle itself")] if hot else []
        return entries + ([("dash", "#333", "dashed: not on a cycle")] if len(self.cycle) < len(self.edges) else [])


def deadlock_svg(
    p: SpatialProgram,
    blocked: Sequence[tuple[int, str, str]],
    size: int = 640,
    *,
    reasons: Sequence[str] | None = None,
    note: str = "",
    max_sites: int = 4,
    where: dict[tuple[int, str], tuple[str, int]] | None = None,
) -> str:
    """The wait-for graph of a deadlock: each blocked engine, and an arrow to the engine it waits on (the producer
    of the ring it waits for data from, the consumer of the ring it waits for room in, the raiser of the semaphore
    it waits on), labelled with what it waits for and, given `reasons` (parallel to `blocked`, see `reasons_of`),
    the page counts. The first `max_sites` sites are drawn; `note` goes under the title; `size` is the least width;
    `where` gives, by (site, engine), the file and line of the op it is stuck at (a program written with
    spatialc.lang), named beside the op."""
    why = dict(zip(((int(s), e) for s, e, _ in blocked), reasons or [""] * len(blocked), strict=True))
    g = _Graph(p, blocked, max_sites)
    width = max(size, 110 + 2 * _COL_W + _NODE_W / 2 + 150)
    lines = g.subtitles(note)
    legend, legend_h = _legend(10, 30 + 16 * len(lines), width - 20, g.key())
    top = 30 + 16 * len(lines) + legend_h + 16
    pos = {n: (110.0 + _ENGINE_COL.get(n[1], 3) * _COL_W, top + (g.sites.index(n[0]) + 0.5) * _ROW_H)
           for n in [*g.stuck, *g.done]}  # fmt: skip
    engines = plural(len(blocked), "engine")
    title = f"Deadlock in {p.name}: {engines} can never go on (who waits on whom)"
    out = [*_open(width, top + _ROW_H * len(g.sites) + 10, title, *lines), *legend, _MARKERS]
    for i, s in enumerate(g.sites):
        y = top + i * _ROW_H
        out.append(f'<rect x="4" y="{y + 4}" width="{width - 8}" height="{_ROW_H - 8}" fill="#f4f4f4" rx="6"/>')
        out.append(_text(12, y + 20, f"site {s}", "site-label", font_weight="bold"))
    taken = [(x - _NODE_W / 2, y - _NODE_H / 2, x + _NODE_W / 2, y + _NODE_H / 2) for x, y in pos.values()]
    labels = []
    for a, b in g.edges:
        colour, label = _EDGE[type(g.ops[a]).__name__][0], _edge_label(p, g.ops[a], why.get(a, ""))
        path, text = _edge_svg(pos[a], pos[b], colour, label, (a, b) in g.cycle, taken)
        ends = f'data-from="{a[0]} {a[1]}" data-to="{b[0]} {b[1]}"'
        out.append(f'<g class="edge" {ends}>{path}</g>')
        labels.append(f'<g class="edge-label" {ends}>{text}</g>')
    hot, waits = {a for a, _ in g.cycle}, {a for a, _ in g.edges}
    for n, at in pos.items():
        state = "done" if n in g.done else "hot" if n in hot else "stuck"
        op = op_text(p, g.ops[n]) if n in g.ops else ""
        if where and (n[0], n[1]) in where:
            file, line = where[(n[0], n[1])]
            op += f" ({Path(file).name}:{line})"
        labels += _node_svg(n, at, op, "" if n in waits else why.get(n, ""), state)
    return "\n".join([*out, *labels, "</svg>"]) + "\n"


def _node_svg(n: Node, at: Point, op: str, reason: str, state: str) -> list[str]:
    """A box naming the engine and the op it is stuck at, and under it the reason when no arrow carries it."""
    x, y = at[0] - _NODE_W / 2, at[1] - _NODE_H / 2
    fill = {"done": "#ffffff", "hot": "#f2a541", "stuck": "#f7e08a"}[state]
    dash = ' stroke-dasharray="4 3"' if state == "done" else ""
    return [
        f'<g class="node" data-node="{n[0]} {n[1]}">',
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{_NODE_W}" height="{_NODE_H}" rx="6" fill="{fill}"'
        f' stroke="#333"{dash}/>',
        _text(at[0], y + 16, f"site {n[0]} {n[1]}", "node-label", text_anchor="middle", font_weight="bold"),
        _text(at[0], y + 31, "finished" if state == "done" else f"at: {op}", "node-op", text_anchor="middle"),
        *(_text(at[0], y + _NODE_H + 14 + 13 * i, line, "node-reason", text_anchor="middle")
          for i, line in enumerate(textwrap.wrap(reason, 44))),
        "</g>",
    ]  # fmt: skip


# ---- files -------------------------------------------------------------------------------------------------------


def write_pictures(
    folder: str | Path, program: SpatialProgram, trace: Trace | None = None, site: int = 0, max_ticks: int = 400
) -> list[Path]:
    """Write placement.svg, and timeline.svg (site `site`, at most `max_ticks` ticks) when a trace is given, into
    `folder` (made if missing); returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pictures = {"placement.svg": placement_svg(program)}
    if trace is not None:
        pictures["timeline.svg"] = timeline_svg(trace, site, max_ticks=max_ticks, name=program.name)
    for name, svg in pictures.items():
        (folder / name).write_text(svg)
    return [folder / name for name in pictures]


def write_deadlock(folder: str | Path, program: SpatialProgram, error: DeadlockError) -> Path:
    """Write deadlock.svg, the wait-for graph of `error` with the page counts its message gives, into `folder`
    (made if missing); returns its path."""
    path = Path(folder) / "deadlock.svg"
    path.parent.mkdir(parents=True, exist_ok=True)
    where = getattr(error, "where", None)  # the user's lines, for a program written with spatialc.lang
    path.write_text(deadlock_svg(program, error.blocked, reasons=reasons_of(error), note=_note_of(error), where=where))
    return path

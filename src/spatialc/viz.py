"""Pictures, as standalone SVG text (no dependencies): where the items went, how a site's engines and rings went
over time, and which engines a deadlock left waiting on which. Each has a title saying what it shows, a colour
key, and (the timeline) axes with numbers, so that it can be read without the source."""

from __future__ import annotations

import colorsys
import itertools
import math
import re
import textwrap
from collections.abc import Callable, Iterator, Sequence
from html import escape
from pathlib import Path

from .errors import DeadlockError, SpatialError
from .interp.trace import OpSpan, RingTrace, Trace
from .ir.nodes import Engine, PageLayout, SpatialProgram, TensorRole
from .ir.ops import ChoreoOp, Pop, Push, Reserve, SemInc, SemWait, Wait, walk
from .ir.printer import op_text, plural
from .ir.worklist import split_items

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
    `kind` claims ("round-robin", "grouped, bands of 2 rows"), else "as listed" (a hand-written list)."""
    pl, plan = p.placement, p.plan
    assert pl is not None and plan is not None
    if pl.splits > 1:
        return f"split-K: {pl.splits} sites an item"
    if pl.multicast != (1, 1):
        return f"multicast groups of {pl.multicast[0]}x{pl.multicast[1]} sites"
    listed = [[int(i) for i in items] for _, items in pl.items_of_site]
    items, sites = sum(map(len, listed)), len(listed)
    rules = [("contiguous", 0), ("round_robin", 0)] + ([("grouped", pl.band)] if pl.band > 0 else [])
    rules.sort(key=lambda r: r[0] != pl.kind)  # the rule it claims first, where the list fits several
    for rule, band in rules if items == plan.items else ():
        grid = plan.placed if rule == "grouped" else None
        if split_items(items, sites, rule, grid, band) == listed:
            return {"round_robin": "round-robin", "grouped": f"grouped, bands of {plural(band, 'row')}"}.get(rule, rule)
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
        out.append(
            f'<rect class="item" x="{px}" y="{py}" width="{cell}" height="{cell}" stroke="#333"'
            f' fill="{"#ffffff" if s is None else _colour(s)}"><title>item ({y}, {x}): {_sites_text(s, splits)}</title>'
            "</rect>"
        )
        if font >= 7 and s is not None:
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
# A column's shares stack bottom up: the work, the bookkeeping, then the waits, so the grey sits on top.
_STACK = ["ReadTiles", "Compute", "PackAcc", "WriteTiles", "other", "Wait", "Reserve", "SemWait"]
_LEFT, _LANE, _RING = 150, 24, 50
_COLUMN_PX = 3  # a column of ticks is at least this wide: past that many ticks a picture shows shares, not spans
Scale = Callable[[float], float]  # tick -> x
Window = tuple[int, int]  # ticks [start, end)


class PictureError(SpatialError, ValueError):
    """A picture of what is not there: a site the program does not have, a window of ticks outside the run."""


def _ring_key(columns: bool) -> list[Entry]:
    mean = " (mean per column)" if columns else ""
    most = [("line", _MOST, "most ring pages held in a column")] if columns else []
    return [("box", "#1f77b4", f"ring pages published (ready){mean}"), ("box", "#aec7e8", f"ring pages reserved{mean}"),
            *most, ("dash", "#c00", "ring depth")]  # fmt: skip


_MOST = "#0b2e59"


def _kind(op: str) -> str:
    word = op.split()[0] if op else ""
    return "SemWait" if word == "Barrier" else word if word in _OP_FILL else "other"


def _fill(kind: str) -> str:
    return _OP_FILL[kind][0] if kind in _OP_FILL else _OTHER


def _round_up(raw: float) -> int:
    """The least of 1, 2 or 5 times a power of ten that is at least `raw`."""
    mag = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _nice_ticks(start: int, end: int, most: int = 10) -> list[int]:
    """`start`, the multiples of a round step between, and `end` itself, so the axis ends on the last tick drawn."""
    if end <= start:
        return [start]
    step = _round_up((end - start) / most)
    ticks = [start, *range((start // step + 1) * step, end, step)]
    if len(ticks) > 1 and ticks[1] - start < 0.4 * step:
        ticks.pop(1)  # a label just after `start` would overprint it
    if len(ticks) > 1 and end - ticks[-1] < 0.4 * step:
        ticks.pop()  # and one just before `end`
    return [*ticks, end]


def check_site(p: SpatialProgram, site: int) -> None:
    """Refuse a timeline of a site the program does not have (before a long run is traced for it)."""
    sites = len(p.placement.items_of_site) if p.placement else 0
    if not 0 <= site < sites:
        raise PictureError(f"the timeline's site is one of the program's sites 0..{sites - 1}, not {site}")


def _window(trace: Trace, site: int, window: Window | None) -> Window:
    """The ticks to draw: all of the run, or `window` where it lies inside it."""
    sites = {s.site for s in trace.spans} | {r.site for r in trace.rings}
    if sites and not 0 <= site <= max(sites):
        raise PictureError(f"the timeline's site is one of the run's sites 0..{max(sites)}, not {site}")
    total = trace.ticks
    if window is None:
        return 0, total
    start, end = window
    if not 0 <= start < end <= total:
        raise PictureError(
            f"the timeline's window {start}:{end} is not within the run's {total} ticks: START:END with"
            f" 0 ≤ START < END ≤ {total}"
        )
    return start, end


def _cut(a: int, b: int, start: int, c: int) -> Iterator[tuple[int, int]]:
    """Ticks [a, b) as (column, ticks in it), the columns `c` ticks wide from `start`."""
    while a < b:
        i = (a - start) // c
        stop = min(b, start + (i + 1) * c)
        yield i, stop - a
        a = stop


def _shares(spans: Sequence[OpSpan], w: Window, c: int) -> list[dict[str, int]]:
    """Per column of `c` ticks: the ticks the engine spent on each kind of op in it."""
    cols: list[dict[str, int]] = [{} for _ in range(math.ceil((w[1] - w[0]) / c))]
    for s in spans:
        kind = _kind(s.op)
        for i, n in _cut(max(s.start, w[0]), min(s.end, w[1]), w[0], c):
            cols[i][kind] = cols[i].get(kind, 0) + n
    return cols


def _ring_means(r: RingTrace, w: Window, c: int) -> list[tuple[float, float, int]]:
    """Per column of `c` ticks: the mean pages the ring held reserved and published, and the most it held (a
    tick's last sample holds from that tick on)."""
    start, end = w
    sums = [[0.0, 0.0, 0] for _ in range(math.ceil((end - start) / c))]
    level, at = (0, 0), start

    def hold(a: int, b: int) -> None:
        for i, n in _cut(a, b, start, c):
            sums[i][0] += level[0] * n
            sums[i][1] += level[1] * n
            sums[i][2] = max(sums[i][2], level[0] + level[1])

    for tick, now in sorted({s.tick: (s.reserved, s.published) for s in r.samples}.items()):
        if tick >= end:
            break
        hold(at, max(at, tick))
        level, at = now, max(at, tick)
    hold(at, end)
    ticks = [min(c, end - start - i * c) for i in range(len(sums))]
    return [(a / n, b / n, int(most)) for (a, b, most), n in zip(sums, ticks, strict=True)]


def _steps(levels: Sequence[float], w: Window, c: int, x: Scale, base: float, unit: float) -> list[str]:
    """The points of a step curve: level levels[i] over column i (`c` ticks from w[0])."""
    pts = []
    for i, v in enumerate(levels):
        t0, t1 = w[0] + i * c, min(w[1], w[0] + (i + 1) * c)
        pts += [f"{x(t0):.1f},{base - v * unit:.1f}", f"{x(t1):.1f},{base - v * unit:.1f}"]
    return pts


def _step_polygon(levels: Sequence[float], w: Window, c: int, x: Scale, base: float, unit: float, fill: str) -> str:
    """A filled step curve down to `base`."""
    pts = [f"{x(w[0]):.1f},{base:.1f}", *_steps(levels, w, c, x, base, unit), f"{x(w[1]):.1f},{base:.1f}"]
    return f'<polygon points="{" ".join(pts)}" fill="{fill}" stroke="none"/>'


def _ring_row(r: RingTrace, y0: float, w: Window, c: int, x: Scale) -> list[str]:
    """One ring: published pages (dark) under reserved ones (light), the depth as a dashed red line, a 0..depth axis."""
    base, unit, left, right = y0 + _RING - 4, (_RING - 10) / max(r.depth, 1), x(w[0]), x(w[1])
    means = _ring_means(r, w, c)
    out = [
        _text(10, y0 + _RING / 2, r.ring, "lane"),
        _text(10, y0 + _RING / 2 + 13, _depth_text(r), "lane", fill="#666"),
        _step_polygon([a + b for a, b, _ in means], w, c, x, base, unit, "#aec7e8"),
        _step_polygon([b for _, b, _ in means], w, c, x, base, unit, "#1f77b4"),
        f'<line x1="{left}" y1="{base}" x2="{right:.1f}" y2="{base}" stroke="#999"/>',
        f'<line x1="{left}" y1="{base - r.depth * unit:.1f}" x2="{right:.1f}" y2="{base - r.depth * unit:.1f}"'
        f' stroke="#c00" stroke-dasharray="4 3"><title>depth {r.depth}</title></line>',
        f'<line x1="{left}" y1="{base}" x2="{left}" y2="{base - r.depth * unit:.1f}" stroke="#333"/>',
    ]
    if c > 1:  # where a column's mean hides a ring that was full (or empty) for a moment
        most = " ".join(_steps([m for _, _, m in means], w, c, x, base, unit))
        out.append(f'<polyline class="ring-most" points="{most}" fill="none" stroke="{_MOST}" stroke-width="1"/>')
    every = 1 if r.depth <= 4 else r.depth  # a label on each page level only where they do not collide
    levels_text = [
        _text(_LEFT - 4, base - v * unit + 4, str(v), "", text_anchor="end") for v in range(0, r.depth + 1, every)
    ]
    return [f'<g class="ring" data-ring="{escape(r.ring)}">', *out, '<g class="ring-axis">', *levels_text, "</g></g>"]


def _tick_axis(y: float, w: Window, x: Scale, top: float) -> list[str]:
    """The tick axis along the bottom, with light grid lines up through the lanes."""
    out = ['<g class="axis">', f'<line x1="{x(w[0])}" y1="{y}" x2="{x(w[1]):.1f}" y2="{y}" stroke="#333"/>']
    for t in _nice_ticks(*w):
        out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{y}" stroke="#000" stroke-opacity="0.08"/>')
        out.append(f'<line x1="{x(t):.1f}" y1="{y}" x2="{x(t):.1f}" y2="{y + 4}" stroke="#333"/>')
        out.append(_text(x(t), y + 15, str(t), "tick", text_anchor="middle"))
    axis_title = "logical tick (one tick ~ one tile moved or multiplied)"
    return [*out, "</g>", _text(x((w[0] + w[1]) / 2), y + 31, axis_title, "axis-title", text_anchor="middle")]


def _depth_text(r) -> str:
    """A ring's depth, with its page layout where that is not plain row-major (ir.nodes.PageLayout.note)."""
    note = PageLayout(r.layout).note
    return f"depth {r.depth}" + (f", {note}" if note else "")


def _span_lane(spans: Sequence[OpSpan], y: float, w: Window, x: Scale) -> list[str]:
    """An engine's ops, one box each, where every tick has room."""
    out = []
    for s in spans:
        x0, x1 = x(max(s.start, w[0])), x(min(s.end, w[1]))
        out.append(
            f'<rect class="span" x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" height="{_LANE - 6}"'
            f' fill="{_fill(_kind(s.op))}"><title>{escape(s.op)} [{s.start}, {s.end})</title></rect>'
        )
    return out


_SLIVER = 2.0  # the least height of any op a column holds: a short write in a long column still shows


def _heights(col: dict[str, int], ticks: int) -> list[tuple[str, float]]:
    """The height of each kind of op in a column, bottom up: its share of the lane, but at least _SLIVER, the
    largest share giving up what that adds."""
    room = _LANE - 6
    parts = [(k, max(_SLIVER, room * col[k] / ticks)) for k in _STACK if k in col]
    excess = sum(h for _, h in parts) - room * sum(col.values()) / ticks
    big = max(range(len(parts)), key=lambda i: parts[i][1])
    parts[big] = (parts[big][0], max(parts[big][1] - excess, _SLIVER))
    return parts


def _column_lane(cols: list[dict[str, int]], y: float, w: Window, c: int, x: Scale) -> list[str]:
    """An engine's columns: each split bottom up by the share of its ticks each kind of op took (white: the
    engine had not started or had finished)."""
    out = []
    for i, col in enumerate(cols):
        if not col:
            continue
        t0, t1 = w[0] + i * c, min(w[1], w[0] + (i + 1) * c)
        x0, x1, bottom = x(t0), x(t1), y + _LANE - 6
        over = 0.6 if t1 < w[1] else 0  # under the next column: no hairline seam where two columns meet
        rects = []
        for kind, h in _heights(col, t1 - t0):
            bottom -= h
            rects.append(f'<rect x="{x0:.1f}" y="{bottom:.2f}" width="{x1 - x0 + over:.1f}" height="{h:.2f}"'
                         f' fill="{_fill(kind)}"/>')  # fmt: skip
        tip = ", ".join(f"{k} {100 * n / (t1 - t0):.0f}%" for k, n in sorted(col.items(), key=lambda kn: -kn[1]))
        out.append(
            f'<g class="column" data-ticks="{t0} {t1}"><title>ticks {t0}..{t1}: {tip}</title>{"".join(rects)}</g>'
        )
    return out


def timeline_svg(
    trace: Trace, site: int = 0, window: Window | None = None, width: int = 1000, *, name: str = ""
) -> str:
    """One site's engines as lanes of op spans, and each of its rings' occupancy against its depth, over ticks.

    `trace` is what `spatialc.evaluate(..., trace=True)` returns beside C; `window` (start, end) the ticks drawn
    (default: the whole run); `name` (the program's) goes in the title. Where the ticks outnumber the pixels, each
    column of a few ticks shows the share of them each kind of op took, and a ring's mean pages over them. Waits and
    reserves that blocked show grey: that is where an engine starved or a ring was full."""
    w = _window(trace, site, window)
    plot = width - _LEFT - max(20, len(str(w[1])) * CHAR_W / 2 + 6)  # room for the last tick's number
    c = 1 if (w[1] - w[0]) * _COLUMN_PX <= plot else _round_up((w[1] - w[0]) * _COLUMN_PX / plot)
    mine = [s for s in trace.spans if s.site == site and s.start < w[1] and s.end > w[0]]
    lanes = {e.value: [s for s in mine if s.engine == e.value] for e in Engine}
    lanes = {e: spans for e, spans in lanes.items() if spans}
    rings = [r for r in trace.rings if r.site == site]
    total = trace.ticks
    whole = w == (0, total)
    title = f"Timeline of site {site}{f' of {name}' if name else ''}: ticks {w[0]}..{w[1]}"
    title += "" if whole else f" of the run's 0..{total}"
    said = (["the whole run"] if whole else []) + ([f"1 column = {c} ticks"] if c > 1 else [])
    title += f" ({', '.join(said)})" if said else ""
    subtitle = (
        "top: what each engine ran, tick by tick; bottom: the pages held in each ring against its depth"
        if c == 1
        else f"top: each column of {c} ticks split by the share each engine spent on each op (white: not running);"
        " bottom: the mean pages each ring held"
    )
    kinds = {_kind(s.op) for s in mine}
    others = sorted({s.op.split()[0] for s in mine if _kind(s.op) == "other"})
    entries = [("box", fill, label) for k, (fill, label) in _OP_FILL.items() if k in kinds]
    entries += [("box", _OTHER, f"{', '.join(others)}: bookkeeping")] if others else []
    legend, legend_h = _legend(10, 50, width - 20, entries + (_ring_key(c > 1) if rings else []))
    top = 50 + legend_h + 12
    rings_top = top + 16 + _LANE * len(lanes) + 10
    axis_y = rings_top + 16 + (_RING + 10) * len(rings) + 4

    def x(t: float) -> float:
        return _LEFT + (t - w[0]) * plot / max(w[1] - w[0], 1)

    out = [*_open(width, axis_y + 42, title, subtitle), *legend]
    out.append(_text(10, top + 10, "engines", "section", font_weight="bold"))
    out += [] if lanes else [_text(_LEFT, top + 10, f"site {site} runs nothing", "section")]
    for row, (eng, spans) in enumerate(lanes.items()):
        y = top + 16 + row * _LANE
        drawn = _span_lane(spans, y, w, x) if c == 1 else _column_lane(_shares(spans, w, c), y, w, c, x)
        out += [f'<g class="engine-lane" data-engine="{eng}">', _text(10, y + 14, eng, "lane"), *drawn, "</g>"]
    out += [_text(10, rings_top + 10, "rings (pages)", "section", font_weight="bold")] if rings else []
    for i, r in enumerate(rings):
        out += _ring_row(r, rings_top + 16 + i * (_RING + 10), w, c, x)
    out += _tick_axis(axis_y, w, x, top + 14)
    return "\n".join([*out, "</svg>"]) + "\n"


# ---- deadlock ----------------------------------------------------------------------------------------------------

_HEAD = r"site (\d+) (\w+)(?: \[[^\]]*\])?: "
# One blocked engine in either message: verify's "deadlock: HEAD: op — why; HEAD: …" or the interpreter's lines.
_FIX = r"; (\S+ needs \d+ pages for this order of ops[^\n]*)"  # verify's remedy, after the blocked engines
_ENTRY = re.compile(_HEAD + r"(.+?) — (.+?)(?=; " + _HEAD + r"| \(and on \d+ other|" + _FIX + r"|\n|$)")
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
    """What the message says beside the blocked engines: the other sites it happens on, and verify's remedy."""
    m, fix = _OTHER_SITES.search(str(error)), re.search(_FIX, str(error))
    others = f"the same deadlock happens on {m[1]} other site(s) with the same programs" if m else ""
    return "\n".join(line for line in (others, fix[1] if fix else "") if line)


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


def _curve(a: Point, b: Point, ha: Point, hb: Point) -> tuple[str, Callable[[float], Point], Point]:
    """An arrow's path from box a to box b (centres; ha, hb their half widths and heights) bent to its left (so
    a→b and b→a never overlap), its point at t in [0, 1], and the outward normal of the bend."""
    if a == b:  # an engine waiting on itself: a loop over the top of its box
        x, y = a[0], a[1] - ha[1]
        return f"M{x - 30},{y} C{x - 50},{y - 70} {x + 50},{y - 70} {x + 30},{y + 2}", lambda t: (x, y - 52), (0, -1)
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = math.hypot(dx, dy)
    n = (dy / length, -dx / length)
    c = ((a[0] + b[0]) / 2 + n[0] * max(0.3 * length, 50), (a[1] + b[1]) / 2 + n[1] * max(0.3 * length, 50))

    def border(m: Point, half: Point, pad: float) -> Point:  # where the ray from box centre m toward c leaves it
        ex, ey = c[0] - m[0], c[1] - m[1]
        t = min((half[0] + pad) / abs(ex) if ex else math.inf, (half[1] + pad) / abs(ey) if ey else math.inf)
        return m[0] + ex * t, m[1] + ey * t

    p0, p1 = border(a, ha, 0), border(b, hb, 3)

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


def _edge_svg(
    a: Point, b: Point, halves: tuple[Point, Point], colour: str, label: list[str], strong: bool, taken: list[Box]
) -> tuple[str, str]:
    """A curved arrow a→b, and apart its label on a white ground (drawn after every arrow, so none runs through it)."""
    d, at, n = _curve(a, b, *halves)
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

    def subtitles(self, note: str, chars: int) -> list[str]:
        """What the title leaves out: `note`, the sites not drawn, how to read an arrow (lines of `chars` at most)."""
        lines = [wrapped for line in note.splitlines() for wrapped in textwrap.wrap(line, chars)]
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
    the page counts. The first `max_sites` sites are drawn; `note`'s lines go under the title; `size` is the least
    width; `where` gives, by (site, engine), the file and line of the op it is stuck at (a program written with
    spatialc.lang), named beside the op. Each box is as wide as its text, and the picture as large as its labels."""
    why = dict(zip(((int(s), e) for s, e, _ in blocked), reasons or [""] * len(blocked), strict=True))
    g = _Graph(p, blocked, max_sites)
    least = max(size, 110 + 2 * _COL_W + _NODE_W / 2 + 150)
    lines = g.subtitles(note, int((least - 20) / CHAR_W))
    legend, legend_h = _legend(10, 30 + 16 * len(lines), least - 20, g.key())
    top = 30 + 16 * len(lines) + legend_h + 16
    nodes = {n: _node_text(p, g, n, where) for n in [*g.stuck, *g.done]}
    half = {n: ((_node_width(*nodes[n]) / 2), (_NODE_H / 2)) for n in nodes}
    left = max([110.0, *(h[0] + 12 for h in half.values())])  # the first column's boxes clear of the left edge
    pos = {n: (left + _ENGINE_COL.get(n[1], 3) * _COL_W, top + (g.sites.index(n[0]) + 0.5) * _ROW_H) for n in nodes}
    hot, waits = {a for a, _ in g.cycle}, {a for a, _ in g.edges}
    taken = [(x - half[n][0], y - half[n][1], x + half[n][0], y + half[n][1]) for n, (x, y) in pos.items()]
    arrows, labels = [], []
    for a, b in g.edges:
        colour, label = _EDGE[type(g.ops[a]).__name__][0], _edge_label(p, g.ops[a], why.get(a, ""))
        path, text = _edge_svg(pos[a], pos[b], (half[a], half[b]), colour, label, (a, b) in g.cycle, taken)
        ends = f'data-from="{a[0]} {a[1]}" data-to="{b[0]} {b[1]}"'
        arrows.append(f'<g class="edge" {ends}>{path}</g>')
        labels.append(f'<g class="edge-label" {ends}>{text}</g>')
    for n, at in pos.items():
        state = "done" if n in g.done else "hot" if n in hot else "stuck"
        reason = textwrap.wrap("" if n in waits else why.get(n, ""), 44)
        labels += _node_svg(n, at, half[n][0] * 2, nodes[n][1], reason, state)
        wide = max(map(len, reason), default=0) * CHAR_W / 2
        taken.append((at[0] - wide, at[1], at[0] + wide, at[1] + half[n][1] + 4 + 13 * len(reason)))
    # Sized to what it holds: a label pushed out past the last band or the right edge stays in the picture.
    width = max(least, max(box[2] for box in taken) + 10)
    height = max(top + _ROW_H * len(g.sites) + 10, max(box[3] for box in taken) + 14)
    title = f"Deadlock in {p.name}: {plural(len(blocked), 'engine')} can never go on (who waits on whom)"
    out = [*_open(width, height, title, *lines), *legend, _MARKERS]
    for i, s in enumerate(g.sites):
        y = top + i * _ROW_H
        h = height - 8 - y if i == len(g.sites) - 1 else _ROW_H - 8  # the last band down to the picture's foot
        out.append(f'<rect x="4" y="{y + 4}" width="{width - 8:.0f}" height="{h:.0f}" fill="#f4f4f4" rx="6"/>')
        out.append(_text(12, y + 20, f"site {s}", "site-label", font_weight="bold"))
    return "\n".join([*out, *arrows, *labels, "</svg>"]) + "\n"


_NODE_CHARS = (_COL_W - 40) // CHAR_W  # the most characters a box's line holds: boxes keep clear of the next column


def _node_text(
    p: SpatialProgram, g: _Graph, n: Node, where: dict[tuple[int, str], tuple[str, int]] | None
) -> tuple[str, str]:
    """A box's two lines: the engine, and the op it is stuck at with the user's file and line where known, cut
    with an ellipsis to what a box holds (the line stays whole: it is what the user looks for)."""
    head = f"site {n[0]} {n[1]}"
    if n in g.done:
        return head, "finished"
    op, at = op_text(p, g.ops[n]) if n in g.ops else "", ""
    if where and (n[0], n[1]) in where:
        file, line = where[(n[0], n[1])]
        at = f" ({Path(file).name}:{line})"
    room = _NODE_CHARS - len("at: ") - len(at)
    return head, f"at: {op if len(op) <= room else op[: max(room - 1, 0)] + '…'}{at}"


def _node_width(head: str, op: str) -> float:
    """A box as wide as its longer line (bold text a little wider), and no narrower than _NODE_W."""
    return max(_NODE_W, max(len(head) * 1.1, len(op)) * CHAR_W + 16)


def _node_svg(n: Node, at: Point, width: float, op: str, reason: list[str], state: str) -> list[str]:
    """A box naming the engine and the op it is stuck at, and under it the reason when no arrow carries it."""
    x, y = at[0] - width / 2, at[1] - _NODE_H / 2
    fill = {"done": "#ffffff", "hot": "#f2a541", "stuck": "#f7e08a"}[state]
    dash = ' stroke-dasharray="4 3"' if state == "done" else ""
    return [
        f'<g class="node" data-node="{n[0]} {n[1]}">',
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{_NODE_H}" rx="6" fill="{fill}"'
        f' stroke="#333"{dash}/>',
        _text(at[0], y + 16, f"site {n[0]} {n[1]}", "node-label", text_anchor="middle", font_weight="bold"),
        _text(at[0], y + 31, op, "node-op", text_anchor="middle"),
        *(_text(at[0], y + _NODE_H + 14 + 13 * i, line, "node-reason", text_anchor="middle")
          for i, line in enumerate(reason)),
        "</g>",
    ]  # fmt: skip


# ---- files -------------------------------------------------------------------------------------------------------


def write_pictures(
    folder: str | Path,
    program: SpatialProgram,
    trace: Trace | None = None,
    site: int = 0,
    window: Window | None = None,
) -> list[Path]:
    """Write placement.svg, and timeline.svg (site `site`, the whole run or the ticks of `window`) when a trace is
    given, into `folder` (made if missing); returns the paths written."""
    folder = Path(folder)
    pictures = {"placement.svg": placement_svg(program)}
    if trace is not None:
        check_site(program, site)
        pictures["timeline.svg"] = timeline_svg(trace, site, window, name=program.name)
    folder.mkdir(parents=True, exist_ok=True)  # once every picture is drawn: a refused one leaves no folder behind
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

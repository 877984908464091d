"""timeline.svg: one site's engines and rings over the run, op by op or, past the pixels, in columns of ticks."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from html import escape

from ..errors import SpatialError
from ..interp.trace import OpSpan, RingTrace, Trace
from ..ir.nodes import Engine, PageLayout, SpatialProgram
from .svg import CHAR_W, Entry, _legend, _open, _text

# Op kind -> (fill, key label). Waiting ops are grey so that long grey spans read as "idle" at a glance.
_OP_FILL = {
    "ReadTiles": ("#4e79a7", "ReadTiles: load tiles into a ring"),
    "Compute": ("#e15759", "Compute: matmul, map or reduce"),
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

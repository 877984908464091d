"""What the pictures share: text laid out without measuring, the frame with its title, colour keys."""

from __future__ import annotations

import colorsys
from collections.abc import Sequence
from html import escape

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

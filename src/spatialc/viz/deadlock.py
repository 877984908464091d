"""deadlock.svg: the wait-for graph of a deadlock, each blocked engine a box and each wait an arrow."""

from __future__ import annotations

import itertools
import math
import re
import textwrap
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path

from ..errors import DeadlockError
from ..ir.nodes import SpatialProgram
from ..ir.ops import ChoreoOp, Pop, Push, Reserve, SemInc, SemWait, Wait, walk
from ..ir.printer import op_text, plural
from .svg import CHAR_W, Box, Entry, Point, _legend, _open, _text

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

"""A program as text: its tensors, buffers and plan, then each site's engine programs, one op per line."""

from __future__ import annotations

import re

from .ids import LV_ITEM_X, LV_ITEM_Y, loop_var_name
from .nodes import (
    Accumulator,
    Buffer,
    ComputeStage,
    Fifo,
    Interm,
    ReadStage,
    SpatialProgram,
    Stage,
    TileOrder,
    WriteStage,
)
from .ops import (
    AcquireAcc,
    AddPartial,
    Apply,
    Arg,
    Attention,
    Barrier,
    BlockScales,
    ChoreoOp,
    Col,
    ColReduce,
    Compute,
    ComputeOp,
    Const,
    Dequant,
    Expr,
    Flush,
    Generic,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Pos,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Requant,
    Reserve,
    RowArg,
    RowReduce,
    ScaleAcc,
    SemInc,
    SemSet,
    SemWait,
    Span,
    TileAddr,
    VecAxis,
    Wait,
    WriteBarrier,
    WriteTiles,
)

# A whole number of more bits is named by its size, not printed: Python refuses to print past 4,300 digits.
PRINTED_BITS = 4096
_WORD = re.compile(r"[A-Za-z0-9_.]+")  # what `word` shows as it is


def word(text: str) -> str:
    """A string the JSON reader does not check (a target, an op's name) as the listing shows it: as it is where it is
    a plain word, else quoted and escaped as verify's errors show it — never a raw newline or terminal escape."""
    return text if isinstance(text, str) and _WORD.fullmatch(text) else ascii(text)


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 site', '3 sites' (`many` for irregular plurals): how every report of spatialc counts things."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def addr_text(at: TileAddr) -> str:
    """`base + stride·var …` with the item coordinates spelled out."""
    terms = [str(at.base)] if at.base or not at.steps else []
    for var, stride in at.steps:
        name = {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}.get(var, loop_var_name(var))
        terms.append(f"{stride}*{name}")
    return " + ".join(terms)


def _scales_text(s: BlockScales, p: SpatialProgram | None) -> str:
    """A block-scaled matmul's promotion: each scale tensor, its block, and where the step is."""
    a, b = (_tensor(p, x.tensor) if p is not None else f"tensor{int(x.tensor)}" for x in (s.a, s.b))
    where = f" at row {addr_text(s.rows)} col {addr_text(s.cols)} k {addr_text(s.k)}"
    where += f" group {addr_text(s.group)}" if s.group is not None else ""  # a grouped GEMM's: its group's scales
    return f" promoted by {a}[{s.a.outer}x{s.a.k}] {b}[{s.b.k}x{s.b.outer}]" + where


def compute_text(op: ComputeOp, p: SpatialProgram | None = None) -> str:
    """A compute op in a few words."""
    match op:
        case MatmulTiles(b, (sh, sw), prec, transpose_b):
            sub = f" sub {sh}x{sw}" if (sh, sw) != (1, 1) else ""
            text = f"matmul {b.osh}x{b.osw}x{b.ibw}{sub} {prec.value}" + (" B transposed" if transpose_b else "")
            return text + (_scales_text(op.scales, p) if op.scales is not None else "")
        case Map(expr):
            return expr_text(expr, p)
        case Requant(mult, shift, zp):
            return f"requant x{mult} shift {shift} zero point {zp}"
        case Generic(name, params):
            return f"generic {word(name)}{list(params) if params else ''}"
        case AddPartial():
            return "add partial sum"
        case ScaleAcc():
            return "scale rows by x0[row]"
        case Attention(scale, sq, skv, group, causal):
            heads = f", {group} query heads a KV head" if group > 1 else ""
            mask = ", causal" if causal else ""
            return f"attention of {sq} queries over {skv} keys, scale {_num(scale)}{heads}{mask}"
        case RowReduce(name, n, at, width):
            where = "" if (at, width) == (TileAddr(0), 1) else f" at {addr_text(at)} width {width}"
            return f"row {word(name)} of {n} columns{where}"
        case ColReduce(name, n, at, width):
            where = "" if (at, width) == (TileAddr(0), 1) else f" at {addr_text(at)} width {width}"
            return f"column {word(name)} of {n} rows{where}"
        case Dequant(fmt, prec, group, scale, zero, rows, cols, width, low_first):
            s, z = (_tensor(p, t) if p and t is not None else str(t if t is None else int(t)) for t in (scale, zero))
            minus = f" - {z}[g, j]" if zero is not None else ""
            where = (
                ""
                if (rows, cols, width) == (TileAddr(0), TileAddr(0), 1)
                else (f" at rows {addr_text(rows)} cols {addr_text(cols)} width {width}")
            )
            order = "" if low_first else " high nibble first"
            return f"dequant {fmt.value} to {prec.value}: {s}[k/{group}, j] * (x0{minus}){where}{order}"
    raise TypeError(f"not a compute op: {op!r}")


_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
}


def expr_text(expr: Expr, p: SpatialProgram | None = None) -> str:
    """An elementwise expression in a few words: the one-input forms an epilogue chain holds as before (`relu`,
    `add 0.5`, `bias B[…]`, `gelu_tanh`), anything else as a formula over the input pages x0, x1, …"""
    match expr:
        case Apply(name, (Arg(0),), ()):
            return word(name)
        case Apply(name, (Arg(0), Lit(v)), ()) if name in ("add", "mul", "max", "min"):
            return f"{name} {_num(v)}"
        case Apply("add", (Arg(0), Col(axis=VecAxis.COL) as c), ()):
            return f"bias {_col(p, c)}"
    return _formula(expr, p)


def _formula(expr: Expr, p: SpatialProgram | None) -> str:
    match expr:
        case Arg(i):
            return f"x{i}"
        case RowArg(i):
            return f"x{i}[row]"
        case Lit(v):
            return _num(v)
        case Col():
            return _col(p, expr)
        case Pos(axis, at, width):
            where = "" if (at, width) == (TileAddr(0), 1) else f" at {addr_text(at)} width {width}"
            return f"{axis.value}{where}"
        case Apply(name, args, params):
            parts = [_formula(a, p) for a in args]
            if name in _INFIX and not params and len(parts) == 2:
                return f"({parts[0]} {_INFIX[name]} {parts[1]})"
            return f"{word(name)}({', '.join(parts + [_num(v) for v in params])})"
    return repr(expr)


def _num(v: float) -> str:
    """A constant as short as it reads back exactly (`0.5`, `1e-05`), else in full: a message about a changed
    constant shows the change."""
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


def _col(p: SpatialProgram | None, c: Col) -> str:
    name = _tensor(p, c.tensor) if p else int(c.tensor)
    if c.axis == VecAxis.ROW:  # one value per row: tile rows from `at`, a tile row every `width` tiles of the page
        return f"{name}[row {addr_text(c.at)} /{c.width}]"
    return f"{name}[{addr_text(c.at)} +{c.width}]"


def _tensor(p: SpatialProgram, tid) -> str:
    try:
        return p.tensor(tid).name
    except KeyError:
        return f"tensor{int(tid)}?"


def _buf(p: SpatialProgram, bid) -> str:
    try:
        return p.buffer(bid).name
    except KeyError:
        return f"buf{int(bid)}?"


def op_text(p: SpatialProgram, op: ChoreoOp) -> str:
    """One op on one line."""
    match op:
        case Reserve(buf, n) | Push(buf, n) | Wait(buf, n) | Pop(buf, n):
            return f"{type(op).__name__} {_buf(p, buf)}" + (f" x{n}" if n != 1 else "")
        case ReadTiles(t, at, bh, bw, sh, sw, into, rows):
            text = f"ReadTiles {_tensor(p, t)}[{addr_text(at)}] {bh}x{bw} (strides {sh},{sw}) -> {_buf(p, into)}"
            return text + (f" rows < {_tensor(p, rows)}[group]" if rows is not None else "")
        case WriteTiles(src, t, at, bh, bw, sh, sw, rows):
            text = f"WriteTiles {_buf(p, src)} -> {_tensor(p, t)}[{addr_text(at)}] {bh}x{bw} (strides {sh},{sw})"
            return text + (f" rows < {_tensor(p, rows)}[group]" if rows is not None else "")
        case AcquireAcc(buf) | ReleaseAcc(buf):
            return f"{type(op).__name__} {_buf(p, buf)}"
        case Compute(cop, ins, outs, acc, reload):
            text = f"Compute {compute_text(cop, p)} ({', '.join(_buf(p, b) for b in ins)})"
            if outs:
                text += f" -> {', '.join(_buf(p, b) for b in outs)}"
            if acc is not None:
                text += f" acc {_buf(p, acc)}"
            if reload is not None:
                text += f" reload {_buf(p, reload)}"
            return text
        case PackAcc(acc, to, tiles, accumulate):
            return f"PackAcc {_buf(p, acc)} -> {_buf(p, to)} ({tiles} tiles{', accumulate' if accumulate else ''})"
        case SemSet(sem, v):
            return f"SemSet sem{int(sem)} = {v}"
        case SemInc(sem, at, by):
            return f"SemInc sem{int(sem)}@site{int(at)} += {by}"
        case SemWait(sem, v):
            return f"SemWait sem{int(sem)} >= {v}"
        case McastSetValid(sem, group, v):
            return f"McastSetValid sem{int(sem)} = {v} on group{int(group)}"
        case McastSend(buf, group):
            return f"McastSend {_buf(p, buf)} to group{int(group)}"
        case Barrier(group):
            return f"Barrier group{int(group)}"
        case ReadBarrier() | WriteBarrier():
            return type(op).__name__
        case Flush(buf):
            return f"Flush {_buf(p, buf)}"
        case Loop(var, count, _, first) if first:  # an ITEM loop from the site's item `first` on
            huge = not isinstance(first, int) or first.bit_length() > PRINTED_BITS
            head = op_text(p, Loop(var, count, ()))[:-1]
            return f"{head} (from the site's item {'(huge)' if huge else first}):"
        case Loop(var, count, _):
            if isinstance(count, Const):
                huge = isinstance(count.n, int) and count.n.bit_length() > PRINTED_BITS
                return f"Loop {loop_var_name(var)} < {'(huge)' if huge else count.n}:"
            if isinstance(count, Span):
                value = addr_text(TileAddr(count.base, count.steps))
                return f"Loop {loop_var_name(var)} < min({count.bound}, ceil(({value}) / {count.per})):"
            element = addr_text(TileAddr(count.index, count.steps))
            value = f"{_tensor(p, count.tensor)}[{element}]"
            if count.per > 1:
                value = f"ceil({value} / {count.per})"
            return f"Loop {loop_var_name(var)} < trip({value}<={count.bound}):"
    raise TypeError(f"not a choreography op: {op!r}")


def ops_lines(p: SpatialProgram, ops: tuple[ChoreoOp, ...], depth: int = 0) -> list[str]:
    lines = []
    for op in ops:
        lines.append("  " * depth + op_text(p, op))
        if isinstance(op, Loop):
            lines.extend(ops_lines(p, op.body, depth + 1))
    return lines


def _kind_text(b: Buffer) -> str:
    match b.kind:
        case Fifo(d, pt, layout) | Interm(d, pt, layout):
            shown = f", {layout.note}" if layout.note else ""
            return f"{type(b.kind).__name__.lower()} {d} x {pt} tiles{shown}"
        case Accumulator(tiles):
            return f"accumulator {tiles} tiles"
    return str(b.kind)


def _stage_text(p: SpatialProgram, s: Stage) -> str:
    match s.kind:
        case ReadStage(t):
            return f"read {_tensor(p, t)} -> {', '.join(_buf(p, b) for b in s.outs)}"
        case WriteStage(t):
            return f"write {', '.join(_buf(p, b) for b in s.ins)} -> {_tensor(p, t)}"
        case ComputeStage(op):
            into = ", ".join(_buf(p, b) for b in s.outs) or "the accumulator"
            return f"{compute_text(op, p)} ({', '.join(_buf(p, b) for b in s.ins)}) -> {into}"
    return str(s.kind)


def program_text(p: SpatialProgram, sites: int | None = None) -> str:
    """The whole program; `sites` caps how many sites' programs are listed."""
    out = [
        f"program {p.name}  target {word(p.target)}  precision {p.precision.value}  tile {p.tile.rows}x{p.tile.cols}"
        f"  {'verified' if p.verified else 'unverified'}"
    ]
    for t in p.tensors:
        shape = f"{t.elems[0]}x{t.elems[1]}"
        if t.groups > 1:  # one group's shape, every group's tiles (stacked)
            shape = f"{t.groups} groups of {shape}, stacked"
        out.append(
            f"  tensor {t.name}: {t.role.value} {t.dtype.value} {shape}"
            f" in {t.tiles[0]}x{t.tiles[1]} tiles" + (", column-major tiles" if t.order == TileOrder.COL else "")
        )
    for b in p.buffers:
        origin = f" (copy of {int(b.origin)})" if b.origin is not None else ""
        out.append(f"  buffer {b.name}: {_kind_text(b)}{origin}")
    for sem in p.semaphores:
        out.append(f"  semaphore sem{int(sem.id)} {sem.name}: one count per site, from {sem.initial}")
    for s in p.stages:
        out.append(f"  stage {s.name} on {s.engine.value}: {_stage_text(p, s)}")
    for pl in p.plans:
        blk = pl.block
        out.append(
            f"  plan block {blk.osh}x{blk.osw}x{blk.ibw} sub-blocks {pl.sub_blocks[0]}x{pl.sub_blocks[1]}"
            f" grid {pl.grid[0]}x{pl.grid[1]} k_tiles {pl.k_tiles} depth {pl.depth}"
            + (f" groups {pl.groups} (items: strips of a group and a column)" if pl.groups > 1 else "")
        )
    if p.placement is not None:
        used = sum(1 for _, items in p.placement.items_of_site if items)
        split = f", each item on {p.placement.splits} sites (split-K)" if p.placement.splits > 1 else ""
        if p.placement.tail:
            split = f", the last {p.placement.tail} items on {p.placement.splits} sites each (a split tail)"
        out.append(f"  placement {p.placement.kind}: {len(p.placement.items_of_site)} sites, {used} with items{split}")
    if p.schedule is not None:
        placed = p.placement.items_of_site if p.placement else ()
        by_site = p.schedule.by_site()
        for shown, (site, items) in enumerate(placed):
            if sites is not None and shown >= sites:
                out.append(f"  ... {len(placed) - shown} more sites")
                break
            listed = ", ".join(str(int(i)) for i in items[:16]) + (" ..." if len(items) > 16 else "")
            out.append(f"site {int(site)}  items [{listed}]")
            for prog in by_site.get(site, ()):
                out.append(f"  {prog.engine.value}:")
                out.extend("    " + line for line in ops_lines(p, prog.ops))
    return "\n".join(out) + "\n"

"""Rule 8's attention proof, the pages between the engines (`verify/attention.py`): which of the reader's pages each
of the compute engine's Waits receives, and which tiles of Q, K and V it holds (`reader_page`, `arrive`); that the
KV loop's K pages cover the KV head's keys once each, in order, and, a loop counted per item, enough of them for
every key its band keeps (`coverage`, `enough`); that the compute engine publishes O = o / l and LSE = m + log l
(`output`) and the writer stores each at the item's own rows, every row once (`write`).

The reader's (writer's) one ReadTiles (WriteTiles) a ring is matched to the compute engine's one Wait (Push) of it
loop for loop (`one_each`): both move one page an iteration of loops counted alike.
"""

from __future__ import annotations

from ...errors import StrongerCheckNeeded
from ...ir.ids import LV_ITEM_X, LV_ITEM_Y, BufferId, loop_var_name
from ...ir.nodes import EngineProgram, Tensor
from ...ir.ops import (
    ChoreoOp,
    Const,
    Flush,
    Loop,
    LoopCount,
    Pop,
    Push,
    ReadBarrier,
    ReadTiles,
    Reserve,
    Span,
    Wait,
    WriteBarrier,
    WriteTiles,
    walk,
)
from .attention_state import Proof, addr, nested, where
from .recurrence import K_ATOM, Q_ATOM, V_ATOM, Geom, Val, finish, form_text, geom_text, pin
from .symbolic import PC, PR, Aff, one_to_one, split


def one_each(proof: Proof, prog: EngineProgram) -> None:
    """The compute engine waits for and pops each of Q's, K's and V's rings at one op, and reserves and publishes
    each of O's and LSE's at one: the reader's one ReadTiles (the writer's one WriteTiles) is then matched to it
    loop for loop (`arrive`, `write`)."""
    moves: dict[tuple[type, BufferId], int] = {}
    for op in walk(prog.ops):
        if isinstance(op, Reserve | Push | Wait | Pop):
            moves[type(op), op.buf] = moves.get((type(op), op.buf), 0) + 1
    for kinds, rings in (((Wait, Pop), (proof.q, proof.k, proof.v)), ((Reserve, Push), (proof.o, proof.lse))):
        for ring in rings:
            if any(moves.get((kind, ring), 0) != 1 for kind in kinds):
                raise StrongerCheckNeeded(
                    f"{where(prog)}: the semantic rule follows {proof.name(ring)} moved by one"
                    f" {kinds[0].__name__} and one {kinds[1].__name__} of this engine"
                )


def reader_page(proof: Proof, ring: BufferId) -> tuple[tuple, ReadTiles]:
    """The loops around the one ReadTiles filling `ring`, and that ReadTiles."""
    prog = proof.progs["reader"]
    found = []
    for op, nest in nested(prog.ops):
        if isinstance(op, Reserve | Push | ReadTiles) and _buf(op) == ring:
            found.append((op, nest))
        elif not isinstance(op, Reserve | Push | ReadTiles | ReadBarrier):
            raise proof.unsure(op, "an attention program's reader only reads Q, K and V", "reader")
    kinds = [type(op) for op, _ in found]
    ops = [op for op, _ in found]
    pages = {op.pages for op in ops if isinstance(op, Reserve | Push)}
    if kinds == [Reserve, Push]:
        raise proof.wrong(ops[1], f"it publishes pages of {proof.name(ring)} that no ReadTiles fills", "reader")
    if kinds != [Reserve, ReadTiles, Push] or len({n for _, n in found}) != 1 or pages != {1}:
        raise StrongerCheckNeeded(
            f"{where(prog)}: the semantic rule follows a ring of Q, K or V filled by one Reserve, ReadTiles, Push"
            f" of one page in one loop body; {proof.name(ring)} is filled otherwise"
        )
    read, nest = ops[1], found[1][1]
    assert isinstance(read, ReadTiles)
    if read.rows_from is not None:
        raise proof.unsure(read, "it masks rows, which an attention's read does not", "reader")
    return nest, read


def arrive(proof: Proof, op: Wait, ring: BufferId) -> Val:
    """The page the reader filled in the iteration of its loops that matches the compute engine's now: both
    move one page an iteration of loops counted alike, so the n-th page pushed is the n-th waited (rules 3–5)."""
    nest, read = proof.pages[ring]
    counts = tuple(c for c, _ in nest)
    mine = tuple(c for c, _ in proof.nest)
    if counts != mine:
        raise proof.unsure(
            op,
            f"the reader fills {proof.name(ring)} in loops of {_counts(counts)} iterations, this engine waits for"
            f" it in loops of {_counts(mine)}; the semantic rule matches pages of loops counted alike",
        )
    env = dict(proof.env)
    for (_, loop), (_, value) in zip(nest, proof.nest, strict=True):
        env[loop.var] = value
    t = proof.tensors[ring]
    flat = pin(addr(read.at, env) + Aff.of(PR, read.stride_h) + Aff.of(PC, read.stride_w), read.block_h, read.block_w)
    ranges = {**proof.ranges, PR: read.block_h, PC: read.block_w}
    across = pin(Aff.of(PC), read.block_h, read.block_w)
    tile = split(flat, t.tiles[1], ranges)
    if tile is None:
        # (the page the recurrence needs lies in whole rows of the grid, so an address that crosses them is not it)
        raise proof.wrong(read, f"its page's tiles {flat.text()} cross rows of {t.name}'s tile grid", "reader")
    row, col = tile
    head = split(row, t.group_tiles[0], ranges)
    if head is None:
        # (the page the recurrence needs lies in one head's rows, so rows crossing heads are not it)
        raise proof.wrong(read, f"its rows {row.text()} cross the heads of {t.name}", "reader")
    group, rows = head
    role = {proof.q: "Q", proof.k: "K", proof.v: "V"}[ring]
    want = proof.ix * proof.group + proof.head if ring == proof.q else proof.ix
    whose = "the item's query head (item_x · group + head)" if ring == proof.q else "the item's KV head (item_x)"
    if group != want:
        raise proof.wrong(read, f"{role}'s page is read from head {group.text()}, not {whose}: {want.text()}", "reader")
    if col != across or read.block_w != t.tiles[1]:
        raise proof.wrong(
            read, f"{role}'s page holds head_dim tiles {col.text()}, not all {t.tiles[1]} of a row", "reader"
        )
    if ring == proof.q:
        band = proof.band()
        if rows != band or read.block_h != proof.bh:
            raise proof.wrong(
                read,
                f"Q's page holds query tile rows {rows.text()} of the head, not the item's band {band.text()}",
                "reader",
            )
        return Val(Q_ATOM, Geom(proof.bh, t.tiles[1], "query", rows, "d", across))
    if ring == proof.k:
        if read.block_h != proof.bw:  # (the kernels' KV block is the plan's: their registers and wgmma are sized by it)
            raise proof.wrong(
                read, f"K's page holds {read.block_h} key tile rows, not the plan's KV block of {proof.bw}", "reader"
            )
        proof.key_rows = rows
    elif rows != proof.key_rows:
        raise proof.wrong(
            read, f"V's page holds key tile rows {rows.text()}, not K's block {form_text(proof.key_rows)}", "reader"
        )
    atom = K_ATOM if ring == proof.k else V_ATOM
    return Val(atom, Geom(read.block_h, t.tiles[1], "key", rows, "d", across))


def output(proof: Proof, op: Push, buf: BufferId, val: Val) -> None:
    """What the writer receives: O = o / l, LSE = m + log l, at the band's query rows."""
    end = finish()
    band = proof.band()
    if buf == proof.o:
        want, geom = end["O"], Geom(proof.bh, proof.dt, "query", band, "d", pin(Aff.of(PC), 1, proof.dt))
    else:
        want, geom = end["LSE"], Geom(proof.bh, 1, "query", band)
    proof.same(op, f"the page of {proof.name(buf)}", val.value, want, {r: end[r] for r in ("m", "l", "o")})
    if val.geom != geom:
        raise proof.wrong(op, f"its page of {proof.name(buf)} holds {geom_text(val.geom)}, not {geom_text(geom)}")


def write(proof: Proof, ring: BufferId) -> None:
    """The writer stores the page of each query head at that head's rows of the item's band, every row once."""
    prog = proof.progs["writer"]
    found = []
    for op, nest in nested(prog.ops):
        if isinstance(op, Wait | WriteTiles | Pop) and _buf(op) == ring:
            found.append((op, nest))
        elif not isinstance(op, Wait | WriteTiles | Pop | WriteBarrier | Flush):
            raise proof.unsure(op, "an attention program's writer only writes O and LSE", "writer")
    pages = {op.pages for op, _ in found if isinstance(op, Wait | Pop)}
    if [type(op) for op, _ in found] == [Wait, Pop]:
        raise proof.wrong(found[1][0], f"it frees pages of {proof.name(ring)} that no WriteTiles stores", "writer")
    if [type(op) for op, _ in found] != [Wait, WriteTiles, Pop] or len({n for _, n in found}) != 1 or pages != {1}:
        raise StrongerCheckNeeded(
            f"{where(prog)}: the semantic rule follows a ring of O or LSE emptied by one Wait, WriteTiles, Pop"
            f" in one loop body; {proof.name(ring)} is emptied otherwise"
        )
    w, nest = found[1]
    assert isinstance(w, WriteTiles)
    if ring not in proof.outputs:
        raise proof.wrong(prog.ops[0], f"it never publishes a page of {proof.name(ring)}")
    val, mine, _ = proof.outputs[ring]
    if tuple(c for c, _ in nest) != tuple(c for c, _ in mine) or w.rows_from is not None:
        raise proof.unsure(w, "the semantic rule matches pages of loops counted alike, no rows masked", "writer")
    env = dict(proof.env)
    for (_, loop), (_, value) in zip(nest, mine, strict=True):
        env[loop.var] = value
    t: Tensor = proof.tensors[ring]
    g = val.geom
    if (w.block_h, w.block_w) != (g.rows, g.width):
        raise proof.wrong(w, f"it writes {w.block_h}x{w.block_w} tiles of pages of {g.rows}x{g.width}", "writer")
    ranges = {**proof.ranges, PR: g.rows, PC: g.width}
    flat = pin(addr(w.at, env) + Aff.of(PR, w.stride_h) + Aff.of(PC, w.stride_w), g.rows, g.width)
    tile = split(flat, t.tiles[1], ranges)
    want_row = (proof.ix * proof.group + proof.head) * t.group_tiles[0] + g.row
    want_col = g.col if g.col is not None else Aff(0)
    if tile is None or tile != (want_row, want_col) or (g.ckind == "d" and g.width != t.tiles[1]):
        have = "tiles crossing rows" if tile is None else f"tile rows {tile[0].text()}, columns {tile[1].text()}"
        raise proof.wrong(
            w,
            f"it writes {have} of {t.name}; the item's query head (item_x · group + head) and band are at rows"
            f" {want_row.text()}, columns {want_col.text()}",
            "writer",
        )
    run = one_to_one(want_row, ranges)
    if run != (0, t.tiles[0]):
        raise proof.wrong(
            w, f"its rows {want_row.text()} do not cover the {t.tiles[0]} tile rows of {t.name} once", "writer"
        )


def coverage(proof: Proof, loop: Loop, n: int, k: Aff) -> None:
    """The KV loop's K pages hold the key tile rows 0, 1, … of the KV head, each once, in order, all the keys."""
    rows = proof.key_rows
    if rows is None:
        raise proof.wrong(loop, "the KV loop reads no K page")
    ranges = {**proof.ranges, PR: proof.pages[proof.k][1].block_h}  # (PR is pinned to 0 where it is 1)
    ks = set(k.terms)
    run = one_to_one(rows, ranges) if rows.syms() <= ks | {PR} else None
    keys = proof.op.seq_kv
    if n > 1 and not ks & rows.syms():
        raise proof.wrong(loop, f"each of its {n} blocks reads the same key tile rows {rows.text()}")
    if run is None or run[0] != 0 or any(rows.coef(s) < 0 for s in ks):
        raise proof.wrong(
            loop,
            f"in {_blocks(n)} it reads key tile rows {rows.text()}: not the KV head's rows 0, 1, … once each, in order",
        )
    if run[1] * proof.tile_rows < keys:
        raise proof.wrong(
            loop,
            f"in {_blocks(n)} it reads {run[1]} key tile rows ({run[1] * proof.tile_rows} keys); the declaration has"
            f" {keys}",
        )


def enough(proof: Proof, loop: Loop, count: Span, k: Aff) -> None:
    """A KV loop counted per item (a causal band runs the blocks at or left of its diagonal) runs, for every item,
    blocks enough for every key its band's rows keep: min(bound, ⌈v / per⌉) blocks of `step` key tile rows hold
    every kept key when the bound's blocks hold all seq_kv keys (`coverage`) and v · step · tile ≥ per · need, for
    need the keys a row of the band keeps at most — seq_kv, or for a causal mask (the band's end row + 1) +
    seq_kv − seq_q. The blocks an item does not run are then masked for all its rows: as the recurrence, they
    would leave m, l and o as they were. One affine form over the grid, its least value: no item is enumerated."""
    rows = proof.key_rows
    step = proof.pages[proof.k][1].block_h  # key tile rows a block: iterations 0 … n − 1 hold rows 0 … n·step − 1
    if rows != k * step + pin(Aff.of(PR), step, 1):
        raise proof.wrong(
            loop,
            f"its blocks read key tile rows {form_text(rows)}: a loop counted per item reads the blocks in order,"
            " each a whole page",
        )
    v = Aff(count.base)
    for var, stride in count.steps:
        if var not in (LV_ITEM_Y, LV_ITEM_X):
            raise proof.unsure(loop, "the semantic rule follows a KV loop counted by the item's coordinates")
        v = v + proof.env[var] * stride
    tile = proof.tile_rows
    needs = [Aff(proof.op.seq_kv)]
    if proof.op.causal:
        needs.append((proof.iy * proof.bh + proof.bh) * tile + (proof.op.seq_kv - proof.op.seq_q))
    if not any((v * (step * tile) - need * count.per).span(proof.ranges)[0] >= 0 for need in needs):
        raise proof.wrong(
            loop,
            f"an item runs {_count_text(count)} KV blocks of {step * tile} keys, too few for the keys its band's"
            f" rows keep (at most {needs[-1].text()})",
        )


def _buf(op: ChoreoOp) -> BufferId | None:
    match op:
        case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf):
            return buf
        case ReadTiles(into=into):
            return into
        case WriteTiles(src=src):
            return src
    return None


def _counts(counts: tuple[LoopCount, ...]) -> str:
    return " × ".join(_count_text(c) for c in counts) or "no"


def _count_text(count: LoopCount) -> str:
    match count:
        case Const(n):
            return str(n)
        case Span(base, per, bound, steps):
            v = " + ".join([str(base), *(f"{s}·{loop_var_name(var)}" for var, s in steps)])
            return f"min({bound}, ⌈({v}) / {per}⌉)"
    return "a count read from data"


def _blocks(n: int) -> str:
    return "1 block" if n == 1 else f"{n} blocks"

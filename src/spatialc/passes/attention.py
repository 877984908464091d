"""Attention programs (`spatialc.attention`): their plan, placement and schedule — the online softmax recurrence.

An item is a band of bh tile rows of the query rows of one KV head's query heads (grouped-query attention runs the
group's heads one after another, `LV_HEAD`); it walks that head's keys in blocks of bw tile rows (`LV_K`). For each
KV block the compute engine runs FlashAttention's recurrence, each step one op of the IR:

    S  = Q · Kᵀ                        a matmul of the Q band and the K block (K's rows as stored: `transpose_b`)
    X  = mask(keep(r, c), scale · S)    a map: scores the mask leaves out are −∞ (`Pos`: an element's row, column)
    m_old = m;  m ⊕= rowmax(X);  m_new = m    the running max, an accumulator packed before and after its reduction
    α  = exp(m_old − m_new)              a map of row vectors
    P  = exp(X − m_new)                  a map
    l ·= α;  l ⊕= rowsum(P)              the running sum: rescaled (`ScaleAcc`), then reduced into
    O ·= α;  O += P · V                  the output accumulator: rescaled, then the matmul of P (computed) and V

and after the last block O / l and LSE = m + log l, each through a map to the writer. Rule 8 proves the schedule
runs exactly this recurrence (passes/verify, docs/verification.md). The plan is a GEMM plan read so: a block of bh
query tile rows by head_dim, reduced bw key tiles a step (`BlockShape(bh, dt, bw)`, K = a head's key tiles), the
grid (bands, batch · kv heads).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import PlanError, ProgramError
from ..ir.ids import LV_HEAD, LV_ITEM_X, LV_ITEM_Y, LV_K, BufferId, TensorId
from ..ir.nodes import Accumulator, Buffer, ComputeStage, Fifo, Interm, Plan, SpatialProgram, Stage, WriteStage
from ..ir.ops import (
    AcquireAcc,
    Apply,
    Arg,
    Attention,
    BlockShape,
    ChoreoOp,
    Compute,
    Const,
    Expr,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    PackAcc,
    Pop,
    Pos,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    RowArg,
    RowReduce,
    ScaleAcc,
    Span,
    TileAddr,
    VecAxis,
    Wait,
    WriteTiles,
)
from ..target import SpatialTarget
from .footprint import operand_layouts
from .maps import place_map, scheduled

BAND, BLOCK = 4, 4  # tile rows of a band of queries and of a block of keys: 64 × 64 scores a step
DEPTH = 2  # pages of the K and V rings: the reader fetches the next block while the compute engine runs one


def attention_stage(p: SpatialProgram) -> Stage | None:
    """The stage declaring attention (`spatialc.attention`'s), or None: not an attention program."""
    found = [s for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Attention)]
    if len(found) > 1:
        raise ProgramError(f"a program declares attention once, not in {len(found)} stages")
    return found[0] if found else None


def is_attention_program(p: SpatialProgram) -> bool:
    """Whether `p` declares attention: planned here."""
    return attention_stage(p) is not None


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionShape:
    """An attention program's parts: the declaration, its Q, K, V read stages' tensors and rings, its O and LSE
    writes' tensors and rings."""

    stage: Stage
    op: Attention
    reads: tuple[tuple[int, BufferId], ...]  # (tensor id, ring) of Q, K, V
    writes: tuple[tuple[int, BufferId], ...]  # (tensor id, ring) of O, LSE


def attention_shape(p: SpatialProgram) -> AttentionShape:
    """The program's parts, or ProgramError saying what an attention program is."""
    stage = attention_stage(p)
    assert stage is not None
    op = stage.kind.op  # type: ignore[union-attr]
    assert isinstance(op, Attention)
    fillers = {b: s for s in p.stages for b in s.outs}
    emptiers = {b: s for s in p.stages if isinstance(s.kind, WriteStage) for b in s.ins}
    others = [s for s in p.stages if isinstance(s.kind, ComputeStage) and s is not stage]
    if others or len(stage.ins) != 3 or len(stage.outs) != 2:
        raise ProgramError(
            "an attention program reads Q, K and V, declares attention of them once (its two outputs: O and the"
            " row log-sum-exp) and writes both; it has no other compute stage"
        )
    reads, writes = [], []
    for role, ring in zip(("Q", "K", "V"), stage.ins, strict=True):
        src = fillers.get(ring)
        if src is None or not hasattr(src.kind, "tensor") or isinstance(src.kind, WriteStage):
            raise ProgramError(f"attention's {role} ring must be filled by a read stage")
        reads.append((int(src.kind.tensor), ring))  # type: ignore[union-attr]
    for role, ring in zip(("O", "LSE"), stage.outs, strict=True):
        w = emptiers.get(ring)
        if w is None:
            raise ProgramError(f"attention's {role} ring must be emptied by a write stage")
        writes.append((int(w.kind.tensor), ring))  # type: ignore[union-attr]
    return AttentionShape(stage, op, tuple(reads), tuple(writes))


def _geometry(p: SpatialProgram) -> tuple[int, int, int, int]:
    """(query tile rows a head, key tile rows a head, head_dim tiles, KV heads in all) of the unplanned tensors."""
    shape = attention_shape(p)
    q, k = (p.tensor(tid) for tid, _ in shape.reads[:2])  # type: ignore[arg-type]
    return q.group_tiles[0], k.group_tiles[0], q.tiles[1], k.groups


def plan_attention(
    p: SpatialProgram, target: SpatialTarget, block: tuple[int, int] | None, depth: int | None, form: str = "general"
) -> Plan:
    """Bands of bh query tile rows, blocks of bw key tile rows (BAND × BLOCK unless forced, no larger than a head's
    rows, and smaller where the general form's block would not fit a site: `_fitting`), K and V rings `depth` pages
    deep (DEPTH unless forced). For the sm_90a form a band is BAND tile rows whatever the head's rows (its one
    consumer warpgroup's 64: the rows past a head's are padding, never stored)."""
    sq_t, skv_t, dt, kv_heads = _geometry(p)
    d = DEPTH if depth is None else depth
    if block is None and form == "sm90a":
        block = (BAND, min(BLOCK, skv_t))
    bh, bw = block if block is not None else _fitting(target, p, (min(BAND, sq_t), min(BLOCK, skv_t)), dt, max(d, 1))
    if min(bh, bw, d) < 1:
        raise PlanError(f"an attention's block ({bh}x{bw} tiles) and depth ({d}) must be ≥ 1")
    bands, blocks = math.ceil(sq_t / bh), math.ceil(skv_t / bw)
    return Plan(BlockShape(bh, dt, bw), (1, 1), (bands, kv_heads), blocks * bw, d)


def _fitting(target: SpatialTarget, p: SpatialProgram, start: tuple[int, int], dt: int, depth: int) -> tuple[int, int]:
    """The first block from `start`, the larger side halved in turn (the key block first), whose block of the general
    form — the one form that prints attention — fits a site (`lower.cuda.general.kernel.attention_resources`: at
    head_dim 128 a 4 × 4 block needs 116 KiB, its recurrence in registers: more than sm_86's); 1 × 1 where none does
    (lower says why)."""
    from ..lower.cuda.general.kernel import attention_resources

    bh, bw = start
    while (bh, bw) != (1, 1):
        plan = Plan(BlockShape(bh, dt, bw), (1, 1), (1, 1), bw, depth)
        if attention_resources(target, plan, p.precision)[1] > 0:
            break
        bh, bw = (bh, (bw + 1) // 2) if bw >= bh else ((bh + 1) // 2, bw)
    return bh, bw


def apply_attention_plan(p: SpatialProgram, plan: Plan, form: str = "general") -> SpatialProgram:
    """The declared rings sized by the plan, the recurrence's own rings and accumulators added (`RING_NAMES`,
    `ACC_NAMES`), and each head's rows padded to whole bands (Q, O, LSE) and whole blocks (K, V). Q's, K's and V's
    pages, which only the two matmuls read, are laid out for the tensor cores' loads as a GEMM's operands are
    (`footprint.operand_layouts`: 16-bit tiles swizzled, so that an 8 × 8 `ldmatrix` phase reads every bank once; for
    the sm_90a `form` row-major panels the copy engine lands and wgmma reads — Q's and K's K-major, V's MN-major)."""
    shape = attention_shape(p)
    bh, dt, bw = plan.block.osh, plan.block.osw, plan.block.ibw
    (tq, q), (tk, k), (tv, v) = shape.reads
    (to, o), (tl, lse) = shape.writes
    pages = {q: (1, bh * dt), k: (plan.depth, bw * dt), v: (plan.depth, bw * dt), o: (1, bh * dt), lse: (1, bh)}
    a_layout, b_layout = operand_layouts(p.precision, form)
    layouts = {q: a_layout, k: b_layout, v: b_layout}
    buffers = []
    for b in p.buffers:
        if b.id in pages and isinstance(b.kind, Fifo | Interm):
            depth, n = pages[b.id]
            layout = layouts.get(b.id, b.kind.layout)
            sized = dataclasses.replace(b.kind, depth_pages=depth, page_tiles=n, layout=layout)
            b = dataclasses.replace(b, kind=sized)
        buffers.append(b)
    for name, kind in RING_NAMES.items():
        buffers.append(Buffer(BufferId(len(buffers)), name, Interm(1, _tiles(kind, bh, bw, dt))))
    for name, kind in ACC_NAMES.items():
        buffers.append(Buffer(BufferId(len(buffers)), name, Accumulator(_tiles(kind, bh, bw, dt))))
    rows_q = plan.grid[0] * bh  # a head's query tile rows, padded to whole bands
    rows_kv = plan.k_tiles  # a head's key tile rows, padded to whole blocks
    tensors = []
    for t in p.tensors:
        if int(t.id) in (tq, to, tl):
            t = dataclasses.replace(t, tiles=(t.groups * rows_q, t.tiles[1]))
        elif int(t.id) in (tk, tv):
            t = dataclasses.replace(t, tiles=(t.groups * rows_kv, t.tiles[1]))
        tensors.append(t)
    return p.evolve(plans=(plan,), buffers=tuple(buffers), tensors=tuple(tensors))


# The recurrence's rings (one page each) and accumulators, by name, with their tiles: "s" a band by a block of
# keys, "v" a row vector (one tile a band row), "o" a band by head_dim.
RING_NAMES = {
    "s_ring": "s",
    "x_ring": "s",
    "p_ring": "s",
    "m_old_ring": "v",
    "m_new_ring": "v",
    "alpha_ring": "v",
    "o_acc_ring": "o",
    "l_ring": "v",
    "m_ring": "v",
}
ACC_NAMES = {"s_acc": "s", "m_acc": "v", "l_acc": "v", "o_acc": "o"}


def _tiles(kind: str, bh: int, bw: int, dt: int) -> int:
    return {"s": bh * bw, "v": bh, "o": bh * dt}[kind]


def keep(op: Attention, bh: int, bw: int) -> Expr:
    """1 where the mask keeps the score at (row, column) of a page of a band by a block of keys, else 0: a key
    column inside the keys (c < seq_kv) and, for a causal attention, at or left of the row's diagonal
    (c ≤ r + seq_kv − seq_q)."""
    row = Pos(VecAxis.ROW, TileAddr(0, ((LV_ITEM_Y, bh),)), bw)
    col = Pos(VecAxis.COL, TileAddr(0, ((LV_K, bw),)), bw)
    inside: Expr = Apply("lt", (col, Lit(float(op.seq_kv))))
    if not op.causal:
        return inside
    diagonal = Apply("le", (col, Apply("add", (row, Lit(float(op.seq_kv - op.seq_q))))))
    return Apply("mul", (inside, diagonal))


def kv_blocks(op: Attention, bh: int, bw: int, blocks: int, side: int) -> Const | Span:
    """The KV blocks an item runs: all of them, or for a causal attention those at or left of its band's diagonal —
    the band's last row r = (item_y + 1)·bh·side − 1 sees keys up to r + seq_kv − seq_q, so it needs
    ceil(((item_y + 1)·bh·side + seq_kv − seq_q) / (bw·side)) blocks (at most all: the padding rows of the last band
    reach past the keys, which the mask leaves out)."""
    if not op.causal:
        return Const(blocks)
    return Span(bh * side + op.seq_kv - op.seq_q, bw * side, blocks, ((LV_ITEM_Y, bh * side),))


def attention_bodies(p: SpatialProgram) -> dict[str, tuple[ChoreoOp, ...]]:
    """Each engine's per-item body: for each query head of the item's KV head, the reader fills Q's band once and
    K's and V's blocks in turn; the compute engine runs the recurrence block by block, then O / l and m + log l; the
    writer stores O's band and LSE's rows."""
    plan = p.plan
    assert plan is not None
    shape = attention_shape(p)
    op = shape.op
    bh, dt, bw = plan.block.osh, plan.block.osw, plan.block.ibw
    blocks, group = plan.k_steps, op.group
    (tq, q), (tk, k), (tv, v) = shape.reads
    (to, o), (tl, lse) = shape.writes
    named = {b.name: b.id for b in p.buffers}
    s, x, pp = named["s_ring"], named["x_ring"], named["p_ring"]
    m_old, m_new, alpha = named["m_old_ring"], named["m_new_ring"], named["alpha_ring"]
    o_pk, l_pk, m_pk = named["o_acc_ring"], named["l_ring"], named["m_ring"]
    s_acc, m_acc, l_acc, o_acc = named["s_acc"], named["m_acc"], named["l_acc"], named["o_acc"]
    rows_q, rows_kv = plan.grid[0] * bh, plan.k_tiles
    blocks_of_item = kv_blocks(op, bh, bw, blocks, p.tile.rows)
    head = ((LV_ITEM_X, group * rows_q), (LV_HEAD, rows_q), (LV_ITEM_Y, bh))  # the band's first tile row, in rows
    q_at = TileAddr(0, tuple((var, n * dt) for var, n in head))
    kv_at = TileAddr(0, ((LV_ITEM_X, rows_kv * dt), (LV_K, bw * dt)))
    lse_at = TileAddr(0, head)
    prec = p.precision

    reader_block = (
        Reserve(k),
        ReadTiles(TensorId(tk), kv_at, bw, dt, dt, 1, k),
        Push(k),
        Reserve(v),
        ReadTiles(TensorId(tv), kv_at, bw, dt, dt, 1, v),
        Push(v),
    )
    reader = (
        Loop(
            LV_HEAD,
            Const(group),
            (
                Reserve(q),
                ReadTiles(TensorId(tq), q_at, bh, dt, dt, 1, q),
                Push(q),
                Loop(LV_K, blocks_of_item, reader_block),
            ),
        ),
    )

    scores = Map(Apply("mask", (keep(op, bh, bw), Apply("mul", (Arg(0), Lit(op.scale))))))
    col_at = TileAddr(0, ((LV_K, bw),))
    step: tuple[ChoreoOp, ...] = (
        # S = Q · Kᵀ
        Wait(k),
        AcquireAcc(s_acc),
        Compute(MatmulTiles(BlockShape(bh, bw, dt), (1, 1), prec, transpose_b=True), (q, k), acc=s_acc),
        Pop(k),
        Reserve(s),
        PackAcc(s_acc, s, bh * bw),
        Push(s),
        ReleaseAcc(s_acc),
        # X = mask(keep, scale · S)
        Wait(s),
        Reserve(x),
        Compute(scores, (s,), (x,)),
        Push(x),
        Pop(s),
        # m_old = m; m ⊕= rowmax(X); m_new = m
        Reserve(m_old),
        PackAcc(m_acc, m_old, bh),
        Push(m_old),
        Wait(x),
        Compute(RowReduce("max", op.seq_kv, col_at, bw), (x,), acc=m_acc),
        Reserve(m_new),
        PackAcc(m_acc, m_new, bh),
        Push(m_new),
        # α = exp(m_old − m_new)
        Wait(m_old),
        Wait(m_new),
        Reserve(alpha),
        Compute(Map(Apply("exp", (Apply("sub", (RowArg(0), RowArg(1))),))), (m_old, m_new), (alpha,)),
        Push(alpha),
        Pop(m_old),
        # P = exp(X − m_new)
        Reserve(pp),
        Compute(Map(Apply("exp", (Apply("sub", (Arg(0), RowArg(1, bw))),))), (x, m_new), (pp,)),
        Push(pp),
        Pop(x),
        Pop(m_new),
        # l ·= α; l ⊕= rowsum(P); O ·= α; O += P · V
        Wait(alpha),
        Wait(pp),
        Compute(ScaleAcc(), (alpha,), acc=l_acc),
        Compute(RowReduce("sum", op.seq_kv, col_at, bw), (pp,), acc=l_acc),
        Compute(ScaleAcc(), (alpha,), acc=o_acc),
        Pop(alpha),
        Wait(v),
        Compute(MatmulTiles(BlockShape(bh, dt, bw), (1, 1), prec), (pp, v), acc=o_acc),
        Pop(v),
        Pop(pp),
    )
    finish: tuple[ChoreoOp, ...] = (
        Pop(q),
        Reserve(o_pk),
        PackAcc(o_acc, o_pk, bh * dt),
        Push(o_pk),
        ReleaseAcc(o_acc),
        Reserve(l_pk),
        PackAcc(l_acc, l_pk, bh),
        Push(l_pk),
        ReleaseAcc(l_acc),
        Reserve(m_pk),
        PackAcc(m_acc, m_pk, bh),
        Push(m_pk),
        ReleaseAcc(m_acc),
        Wait(o_pk),
        Wait(l_pk),
        Wait(m_pk),
        # O = O / l; LSE = m + log l
        Reserve(o),
        Compute(Map(Apply("div", (Arg(0), RowArg(1, dt)))), (o_pk, l_pk), (o,)),
        Push(o),
        Reserve(lse),
        Compute(Map(Apply("add", (RowArg(0), Apply("log", (RowArg(1),))))), (m_pk, l_pk), (lse,)),
        Push(lse),
        Pop(o_pk),
        Pop(l_pk),
        Pop(m_pk),
    )
    compute = (
        Loop(
            LV_HEAD,
            Const(group),
            (
                Wait(q),
                AcquireAcc(m_acc),
                AcquireAcc(l_acc),
                AcquireAcc(o_acc),
                Loop(LV_K, blocks_of_item, step),
                *finish,
            ),
        ),
    )
    writer = (
        Loop(
            LV_HEAD,
            Const(group),
            (
                Wait(o),
                WriteTiles(o, TensorId(to), q_at, bh, dt, dt, 1),
                Pop(o),
                Wait(lse),
                WriteTiles(lse, TensorId(tl), lse_at, bh, 1, 1, 1),
                Pop(lse),
            ),
        ),
    )
    return {"reader": reader, "compute": compute, "writer": writer}


def place_attention(
    p: SpatialProgram, target: SpatialTarget, sites: int | None = None, placement: str | None = None
) -> SpatialProgram:
    """Items over sites as a map's go (`maps.place_map`)."""
    return place_map(p, target, sites, placement)


def schedule_attention(p: SpatialProgram) -> SpatialProgram:
    """Each site's engines run the per-item bodies over their items."""
    return scheduled(p, attention_bodies(p))

"""Attention schedules and edits of them, for rule 8's tests: each edit rewrites the scheduled program's ops (the
stages, what the program declares, are never touched), so an edit that changes what the schedule computes must be
refused by verify."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hypothesis import strategies as st

import spatialc
from spatialc.ir.ids import LV_HEAD, LV_ITEM_X, LV_K
from spatialc.ir.nodes import Engine, SpatialProgram
from spatialc.ir.ops import (
    AcquireAcc,
    Apply,
    Arg,
    ChoreoOp,
    Compute,
    Const,
    Expr,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    Pop,
    Pos,
    ReadTiles,
    RowReduce,
    ScaleAcc,
    Span,
    TileAddr,
    VecAxis,
    WriteTiles,
)
from spatialc.passes.attention import apply_attention_plan, place_attention, plan_attention, schedule_attention
from spatialc.target import target

Ops = tuple[ChoreoOp, ...]


def scheduled(*args: int, sites: int | None = None, **kw: object) -> SpatialProgram:
    """`spatialc.attention(*args, **kw)` planned, placed and scheduled, not yet verified."""
    return planned(spatialc.attention(*args, **kw), sites)  # type: ignore[arg-type]


def planned(p: SpatialProgram, sites: int | None = None) -> SpatialProgram:
    """An attention program (one spatialc.attention made, or edited past it) planned, placed and scheduled for
    sm_90, not yet verified."""
    t = target("sm_90")
    p = p.evolve(target=t.name)
    return schedule_attention(place_attention(apply_attention_plan(p, plan_attention(p, t, None, None)), t, sites))


def ring(p: SpatialProgram, name: str):
    return next(b.id for b in p.buffers if b.name == name)


def engines(p: SpatialProgram, engine: str, f: Callable[[Ops], Ops], only: Ops | None = None) -> SpatialProgram:
    """`p` with every program of `engine` (every one running the ops `only`, when given) rewritten by f."""
    progs = tuple(
        dataclasses.replace(q, ops=f(q.ops)) if q.engine == Engine(engine) and only in (None, q.ops) else q
        for q in p.schedule.programs  # type: ignore[union-attr]
    )
    return p.evolve(schedule=dataclasses.replace(p.schedule, programs=progs))


def in_loop(var, f: Callable[[list[ChoreoOp]], list[ChoreoOp]]) -> Callable[[Ops], Ops]:
    """Rewrite the body of every loop over `var` with f (a list of its ops in, a list out)."""

    def go(ops: Ops) -> Ops:
        out = []
        for op in ops:
            if isinstance(op, Loop):
                body = tuple(f(list(go(op.body)))) if op.var == var else go(op.body)
                op = dataclasses.replace(op, body=body)
            out.append(op)
        return tuple(out)

    return go


def each(f: Callable[[ChoreoOp], ChoreoOp]) -> Callable[[list[ChoreoOp]], list[ChoreoOp]]:
    return lambda body: [f(op) for op in body]


def loop_count(var, delta: int) -> Callable[[Ops], Ops]:
    """Every loop over `var` run `delta` more times (a loop counted per item: `delta` more for every item)."""

    def more(count):
        if isinstance(count, Span):
            return Span(count.base + delta * count.per, count.per, count.bound + delta, count.steps)
        return Const(count.n + delta)

    def go(ops: Ops) -> Ops:
        return tuple(
            dataclasses.replace(op, count=more(op.count) if op.var == var else op.count, body=go(op.body))
            if isinstance(op, Loop)
            else op
            for op in ops
        )

    return go


def diagonal(var, delta: int) -> Callable[[Ops], Ops]:
    """Every loop over `var` counted per item (a causal band's blocks) run `delta` more times, its bound kept."""

    def go(ops: Ops) -> Ops:
        return tuple(
            dataclasses.replace(
                op,
                count=dataclasses.replace(op.count, base=op.count.base + delta * op.count.per)
                if op.var == var and isinstance(op.count, Span)
                else op.count,
                body=go(op.body),
            )
            if isinstance(op, Loop)
            else op
            for op in ops
        )

    return go


def map_of(p: SpatialProgram, out: str) -> Callable[[ChoreoOp], bool]:
    """Whether an op is the Compute filling ring `out`."""
    r = ring(p, out)
    return lambda op: isinstance(op, Compute) and op.outs == (r,)


def with_expr(expr: Expr, f: Callable[[Expr], Expr | None]) -> Expr:
    """`expr` with the first node f rewrites (f returns None to go on) replaced, depth first."""
    done = f(expr)
    if done is not None:
        return done
    if isinstance(expr, Apply):
        return Apply(expr.op, tuple(with_expr(a, f) for a in expr.args), expr.params)
    return expr


def step(base, var, delta: int) -> TileAddr:
    """An address with the stride of `var` changed by delta."""
    return TileAddr(base.base, tuple((v, s + delta if v == var else s) for v, s in base.steps))


def mutations(p: SpatialProgram) -> dict[str, SpatialProgram]:
    """The edits rule 8 must refuse, by name: each changes what the schedule computes."""
    r = {b.name: b.id for b in p.buffers}
    plan = p.plan
    assert plan is not None
    bh, dt, bw = plan.block.osh, plan.block.osw, plan.block.ibw
    rows_q = plan.grid[0] * bh
    op = next(s.kind.op for s in p.stages if s.name == "attention")  # type: ignore[union-attr]
    # Another query head: the group's next head (grouped-query), or the next KV head's where a group is one head.
    head_var, heads = (LV_HEAD, 1) if op.group > 1 else (LV_ITEM_X, 1)

    def kv(f):
        return engines(p, "compute", in_loop(LV_K, f))

    def head(f):
        return engines(p, "compute", in_loop(LV_HEAD, f))

    def is_map(out):
        return lambda o: isinstance(o, Compute) and o.outs == (r[out],)

    def is_acc(acc, kind, reduce=None):
        return lambda o: (
            isinstance(o, Compute)
            and o.acc == r[acc]
            and isinstance(o.op, kind)
            and (reduce is None or o.op.op == reduce)
        )

    def drop(pred):
        return lambda body: [o for o in body if not pred(o)]

    def twice(pred):
        return lambda body: [x for o in body for x in ((o, o) if pred(o) else (o,))]

    def ins(pred, rings):
        return each(lambda o: dataclasses.replace(o, ins=tuple(r[x] for x in rings)) if pred(o) else o)

    def expr(pred, f):
        return each(lambda o: dataclasses.replace(o, op=Map(with_expr(o.op.expr, f))) if pred(o) else o)

    def lit_by(value, delta):
        return lambda e: Lit(e.value + delta) if isinstance(e, Lit) and e.value == value else None

    def pos_by(axis, delta):
        return lambda e: (
            Pos(e.axis, TileAddr(e.at.base + delta, e.at.steps), e.width)
            if isinstance(e, Pos) and e.axis == axis
            else None
        )

    def addresses(q, engine, var, rings, f):
        """Every ReadTiles into (WriteTiles from) `rings` in loops over `var` of `engine`, its address f(address)."""
        ids = {r[x] for x in rings}
        return engines(
            q,
            engine,
            in_loop(
                var,
                each(
                    lambda o: (
                        dataclasses.replace(o, at=f(o.at))
                        if isinstance(o, ReadTiles) and o.into in ids or isinstance(o, WriteTiles) and o.src in ids
                        else o
                    )
                ),
            ),
        )

    def stale_p(body):
        body = [o for o in body if o != Pop(r["m_old_ring"])]
        body.insert(body.index(Pop(r["m_new_ring"])) + 1, Pop(r["m_old_ring"]))
        return ins(is_map("p_ring"), ("x_ring", "m_old_ring"))(body)

    kv_all = ("k_ring", "v_ring")
    block0 = addresses(p, "reader", LV_K, kv_all, lambda a: step(a, LV_K, -bw * dt))
    out = {
        "P from m_old (stale max in P)": kv(stale_p),
        "α from m_new, m_new": kv(ins(is_map("alpha_ring"), ("m_new_ring", "m_new_ring"))),
        "α reversed: exp(m_new − m_old)": kv(ins(is_map("alpha_ring"), ("m_new_ring", "m_old_ring"))),
        "ScaleAcc of o_acc removed": kv(drop(is_acc("o_acc", ScaleAcc))),
        "ScaleAcc of l_acc removed": kv(drop(is_acc("l_acc", ScaleAcc))),
        "P·V added twice in a block": kv(twice(is_acc("o_acc", MatmulTiles))),
        "rowsum(P) added twice in a block": kv(twice(is_acc("l_acc", RowReduce))),
        "KV loop one block short": engines(engines(p, "compute", loop_count(LV_K, -1)), "reader", loop_count(LV_K, -1)),
        "KV loop one block long": engines(engines(p, "compute", loop_count(LV_K, 1)), "reader", loop_count(LV_K, 1)),
        "K and V always block 0": block0,
        "K, V, the mask's and the reductions' keys all block 0": engines(
            block0,
            "compute",
            in_loop(
                LV_K,
                lambda body: each(
                    lambda o: (
                        dataclasses.replace(o, op=dataclasses.replace(o.op, at=TileAddr(0)))
                        if isinstance(o, Compute) and isinstance(o.op, RowReduce)
                        else o
                    )
                )(
                    expr(
                        is_map("x_ring"),
                        lambda e: (
                            Pos(e.axis, TileAddr(0), e.width) if isinstance(e, Pos) and e.axis == VecAxis.COL else None
                        ),
                    )(body)
                ),
            ),
        ),
        "K and V at half a block's stride": addresses(
            p, "reader", LV_K, kv_all, lambda a: step(a, LV_K, -(bw // 2) * dt)
        ),
        "mask padding bound + 1": kv(expr(is_map("x_ring"), lit_by(float(op.seq_kv), 1))),
        "mask padding bound − 1": kv(expr(is_map("x_ring"), lit_by(float(op.seq_kv), -1))),
        "mask's key position shifted a tile": kv(expr(is_map("x_ring"), pos_by(VecAxis.COL, 1))),
        "scale changed": kv(
            expr(
                is_map("x_ring"), lambda e: Lit(e.value * 1.01) if isinstance(e, Lit) and e.value == op.scale else None
            )
        ),
        "row max over fewer keys than the mask keeps": kv(
            each(
                lambda o: (
                    dataclasses.replace(o, op=dataclasses.replace(o.op, cols=op.seq_kv - 1))
                    if is_acc("m_acc", RowReduce)(o)
                    else o
                )
            )
        ),
        "V from another KV head": addresses(
            p, "reader", LV_K, ("v_ring",), lambda a: step(a, LV_ITEM_X, -plan.k_tiles * dt)
        ),
        "V always from block 0": addresses(p, "reader", LV_K, ("v_ring",), lambda a: step(a, LV_K, -bw * dt)),
        "Q band of another head": addresses(
            p, "reader", LV_HEAD, ("q_ring",), lambda a: step(a, head_var, -heads * rows_q * dt)
        ),
        "final division left out (O = o)": head(
            each(lambda o: dataclasses.replace(o, op=Map(Arg(0)), ins=o.ins[:1]) if is_map("o_ring")(o) else o)
        ),
        "LSE without log": head(
            expr(is_map("lse_ring"), lambda e: e.args[0] if isinstance(e, Apply) and e.op == "log" else None)
        ),
        "LSE with exp for log": head(
            expr(is_map("lse_ring"), lambda e: Apply("exp", e.args) if isinstance(e, Apply) and e.op == "log" else None)
        ),
        "m not acquired for a head": head(drop(lambda o: o == AcquireAcc(r["m_acc"]))),
        "S not acquired a block": kv(drop(lambda o: o == AcquireAcc(r["s_acc"]))),
        "every head's O at head 0's rows": addresses(
            p, "writer", LV_HEAD, ("o_ring",), lambda a: step(a, head_var, -heads * rows_q * dt)
        ),
        "every head's LSE at head 0's rows": addresses(
            p, "writer", LV_HEAD, ("lse_ring",), lambda a: step(a, head_var, -heads * rows_q)
        ),
    }
    if op.causal:
        short = engines(engines(p, "compute", diagonal(LV_K, -1)), "reader", diagonal(LV_K, -1))
        out["each band one block short of its diagonal"] = short
        shift = float(op.seq_kv - op.seq_q)
        out["causal mask offset + 1"] = kv(expr(is_map("x_ring"), lit_by(shift, 1)))
        out["causal mask offset − 1"] = kv(expr(is_map("x_ring"), lit_by(shift, -1)))
        out["mask's query row shifted a tile"] = kv(expr(is_map("x_ring"), pos_by(VecAxis.ROW, 1)))
    return out


@st.composite
def attentions(draw):
    """An attention program's shape and a forced plan and placement (block, depth, sites, placement)."""
    kv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    seq_q = draw(st.integers(1, 130))
    seq_kv = draw(st.integers(seq_q, 160)) if draw(st.booleans()) else draw(st.integers(1, 160))
    causal = seq_q <= seq_kv and draw(st.booleans())
    shape = (draw(st.integers(1, 2)), kv * group, seq_q, seq_kv, 16 * draw(st.integers(1, 8)))
    block = draw(st.none() | st.tuples(st.integers(1, 5), st.integers(1, 5), st.just(1)))
    plan = {"block": block, "depth": draw(st.none() | st.integers(1, 3)), "sites": draw(st.none() | st.integers(1, 9))}
    return shape, {"kv_heads": kv, "causal": causal}, plan | {"placement": draw(st.sampled_from(PLACEMENTS))}


PLACEMENTS = (None, "contiguous", "round_robin")

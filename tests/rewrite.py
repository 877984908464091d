"""Rewriting a built program's engine programs, as the verifier's and the mutation suite's tests do by hand."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from spatialc.ir.ids import LV_K
from spatialc.ir.nodes import ComputeStage, Engine, Schedule, SpatialProgram
from spatialc.ir.ops import ChoreoOp, Compute, ComputeOp, Loop, walk


def map_ops(ops: tuple[ChoreoOp, ...], f: Callable[[ChoreoOp], tuple[ChoreoOp, ...] | None]) -> tuple[ChoreoOp, ...]:
    """`ops` with each op replaced by f(op) (None: kept, loops rewritten inside)."""
    out: list[ChoreoOp] = []
    for op in ops:
        new = f(op)
        if new is not None:
            out.extend(new)
        elif isinstance(op, Loop):
            out.append(dataclasses.replace(op, body=map_ops(op.body, f)))
        else:
            out.append(op)
    return tuple(out)


def edit(
    p: SpatialProgram,
    engine: Engine,
    f: Callable[[tuple[ChoreoOp, ...]], tuple[ChoreoOp, ...]],
    sites: tuple[int, ...] | None = None,
) -> SpatialProgram:
    """`p` with `engine`'s programs (on `sites`, default all) rewritten by `f`."""
    assert p.schedule is not None
    progs = tuple(
        dataclasses.replace(q, ops=f(q.ops)) if q.engine == engine and (sites is None or q.site in sites) else q
        for q in p.schedule.programs
    )
    return p.evolve(schedule=Schedule(progs))


def replace(
    p: SpatialProgram,
    engine: Engine,
    f: Callable[[ChoreoOp], tuple[ChoreoOp, ...] | None],
    sites: tuple[int, ...] | None = None,
) -> SpatialProgram:
    """`p` with each op of `engine`'s programs replaced by f(op) (see `map_ops`)."""
    return edit(p, engine, lambda ops: map_ops(ops, f), sites)


def swap_compute(p: SpatialProgram, old: ComputeOp, new: ComputeOp) -> SpatialProgram:
    """`p` with compute op `old` replaced by `new` both in the stages and in the compute engine's programs."""
    stages = tuple(
        dataclasses.replace(s, kind=ComputeStage(new)) if isinstance(s.kind, ComputeStage) and s.kind.op == old else s
        for s in p.stages
    )
    return replace(
        p.evolve(stages=stages),
        Engine.COMPUTE,
        lambda op: (dataclasses.replace(op, op=new),) if isinstance(op, Compute) and op.op == old else None,
    )


def k_body(p: SpatialProgram, engine: Engine) -> tuple[ChoreoOp, ...]:
    """The body of `engine`'s first K loop."""
    assert p.schedule is not None
    prog = next(q for q in p.schedule.programs if q.engine == engine)
    loop = next(op for op in walk(prog.ops) if isinstance(op, Loop) and op.var == LV_K)
    return loop.body


def edit_k_steps(
    p: SpatialProgram, site: int, f: Callable[[list[ChoreoOp]], list[ChoreoOp]], engine: Engine = Engine.READER
) -> SpatialProgram:
    """`p` with the body of every K loop of site `site`'s `engine` rewritten by f (a list of ops in, one out)."""

    def k_loops(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
        return map_ops(
            ops,
            lambda op: (
                (dataclasses.replace(op, body=tuple(f(list(k_loops(op.body))))),)
                if isinstance(op, Loop) and op.var == LV_K
                else None
            ),
        )

    return edit(p, engine, k_loops, (site,))


def engine_orders(p: SpatialProgram) -> list[SpatialProgram]:
    """`p` with its engine programs listed in other orders: the interpreter resumes engines round-robin in the
    listed order, so each is another deterministic interleaving of the same program."""
    assert p.schedule is not None
    progs = p.schedule.programs
    orders = (progs[::-1], progs[1::2] + progs[::2], tuple(sorted(progs, key=lambda q: (q.engine.value, -q.site))))
    return [p.evolve(schedule=dataclasses.replace(p.schedule, programs=order)) for order in orders]


def unroll_k(p: SpatialProgram, order: list[int]) -> SpatialProgram:
    """`p` with its K loops unrolled: the reader's steps in `order` (its reads addressed at each step's k), the
    compute engine's in order. A correct program still (the sum is the same), which only a deeper ring or the
    general form can hold when `order` is not 0, 1, …"""
    from spatialc.ir.ops import ReadTiles, TileAddr

    def at_k(op: ChoreoOp, k: int) -> ChoreoOp:
        if not isinstance(op, ReadTiles):
            return op
        stride = dict(op.at.steps).get(LV_K, 0)
        steps = tuple(s for s in op.at.steps if s[0] != LV_K)
        return dataclasses.replace(op, at=TileAddr(op.at.base + k * stride, steps))

    def unrolled(ks: list[int]) -> Callable[[ChoreoOp], tuple[ChoreoOp, ...] | None]:
        return lambda op: (
            tuple(at_k(o, k) for k in ks for o in op.body) if isinstance(op, Loop) and op.var == LV_K else None
        )

    p = replace(p, Engine.READER, unrolled(order))
    return replace(p, Engine.COMPUTE, unrolled(list(range(len(order)))))


def json_dicts(node: Any) -> Iterator[dict]:
    """Every object of a saved program's JSON tree (`json.loads(spatialc.to_json(p))`), outermost first, for tests
    that edit a field wherever it is written (the declaration's and every scheduled op's alike)."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from json_dicts(v)
    elif isinstance(node, list):
        for v in node:
            yield from json_dicts(v)

"""verify's rules 2–4 for one site: who may touch each ring, how many pages each op moves, and that they balance."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RingDepthError, RingOwnershipError, UnbalancedError
from ..ir.ids import BufferId, Site, TensorId
from ..ir.ids import loop_var_name as _var
from ..ir.nodes import Accumulator, EngineProgram, ReadStage, WriteStage
from ..ir.ops import ChoreoOp, ReadTiles, WriteTiles
from .verify_walk import Ctx, Facts, Frame, Side, Use, where

SiteProgs = Sequence[tuple[EngineProgram, Facts]]
Owners = dict[tuple[Side, BufferId], tuple[str, str, TensorId | None]]  # engine, stage, the tensor it reads/writes

_ROLE = {Side.PRODUCE: "produced", Side.CONSUME: "consumed", Side.ACC: "used"}
_AGENT = {Side.PRODUCE: "producer", Side.CONSUME: "consumer", Side.ACC: "owner"}


def stage_owners(ctx: Ctx) -> Owners:
    """(side, ring) → (engine, stage name, tensor) as the stages declare them: a stage produces its outs, consumes its
    ins; a read stage fills them from its tensor, a write stage empties them to its tensor."""
    owners: Owners = {}
    for s in ctx.p.stages:
        tensor = s.kind.tensor if isinstance(s.kind, ReadStage | WriteStage) else None
        for side, bufs in ((Side.PRODUCE, s.outs), (Side.CONSUME, s.ins)):
            for b in bufs:
                owners.setdefault((side, ctx.ring(b)), (s.engine.value, s.name, tensor))
    return owners


def check_site(ctx: Ctx, site: Site, progs: SiteProgs, owners: Owners) -> None:
    """Rules 2, 4 and 3, in that order, for the programs of one site."""
    engines = check_owners(ctx, site, progs, owners)
    check_depths(ctx, site, progs)
    check_balance(ctx, site, progs, engines)


def _owner_error(ctx: Ctx, site: Site, engine: str, use: Use, why: str) -> RingOwnershipError:
    text = ctx.op(use.op)
    return RingOwnershipError(
        f"{where(site, engine)}: {text} — {why}", site=int(site), engine=engine, op=text, buffer=ctx.name(use.buf)
    )


def _check_kind(ctx: Ctx, site: Site, engine: str, use: Use) -> None:
    is_acc = isinstance(ctx.buffers[use.buf].kind, Accumulator)
    name = ctx.name(use.buf)
    if use.side == Side.ACC and not is_acc:
        raise _owner_error(ctx, site, engine, use, f"{name} is a ring, not an accumulator")
    if use.side != Side.ACC and is_acc:
        raise _owner_error(
            ctx,
            site,
            engine,
            use,
            f"{name} is an accumulator; only AcquireAcc, Compute's acc, PackAcc and ReleaseAcc may touch it",
        )


def _check_tensor(
    ctx: Ctx, site: Site, engine: str, use: Use, op: ReadTiles | WriteTiles, declared: tuple[str, str, TensorId | None]
) -> None:
    """A ReadTiles fills a ring from its read stage's tensor; a WriteTiles empties one to its write stage's."""
    want, got = declared[2], op.tensor
    if want is not None and want != got:
        ring, verb = ctx.name(ctx.ring(use.buf)), "filled from" if isinstance(op, ReadTiles) else "written to"
        raise _owner_error(
            ctx,
            site,
            engine,
            use,
            f"{ring} is {verb} {ctx.tensors[want].name} (stage {declared[1]}), not {ctx.tensors[got].name}",
        )


def check_owners(ctx: Ctx, site: Site, progs: SiteProgs, owners: Owners) -> dict[tuple[Side, BufferId], str]:
    """Rule 2: each ring has one producer and one consumer engine at a site; accumulators only via their ops."""
    seen: dict[tuple[Side, BufferId], tuple[str, ChoreoOp]] = {}
    for prog, facts in progs:
        engine = prog.engine.value
        for use in facts.uses:
            _check_kind(ctx, site, engine, use)
            key = (use.side, ctx.ring(use.buf))
            ring = ctx.name(key[1])
            declared = owners.get(key)
            if declared is not None and declared[0] != engine:
                raise _owner_error(
                    ctx,
                    site,
                    engine,
                    use,
                    f"{ring} is {_ROLE[use.side]} by {declared[0]} (stage {declared[1]}), not by {engine}",
                )
            if declared is not None and isinstance(use.op, ReadTiles | WriteTiles):
                _check_tensor(ctx, site, engine, use, use.op, declared)
            first = seen.setdefault(key, (engine, use.op))
            if first[0] != engine:
                why = (
                    f"{ring} belongs to {first[0]} ({ctx.op(first[1])}); an accumulator has one engine per site"
                    if use.side == Side.ACC
                    else f"{ring} is already {_ROLE[use.side]} by {first[0]} ({ctx.op(first[1])}); a ring has one"
                    f" {_AGENT[use.side]} engine per site"
                )
                raise _owner_error(ctx, site, engine, use, why)
    return {key: engine for key, (engine, _) in seen.items()}


def check_depths(ctx: Ctx, site: Site, progs: SiteProgs) -> None:
    """Rule 4: no Reserve, Push, Wait or Pop moves more pages than its ring holds."""
    for prog, facts in progs:
        for use in facts.uses:
            depth = ctx.depth(ctx.ring(use.buf))
            if use.flow > depth:
                text, engine = ctx.op(use.op), prog.engine.value
                raise RingDepthError(
                    f"{where(site, engine)}: {text} — moves {use.flow} pages of {ctx.name(use.buf)},"
                    f" a ring of {depth}; it could never complete",
                    site=int(site),
                    engine=engine,
                    op=text,
                    buffer=ctx.name(use.buf),
                )


def check_balance(ctx: Ctx, site: Site, progs: SiteProgs, engines: dict[tuple[Side, BufferId], str]) -> None:
    """Rule 3: each engine pairs its own ops, co-iterating loops move equal pages, and every ring ends empty."""
    for prog, facts in progs:
        if facts.fault is not None:
            text, engine = ctx.op(facts.fault.op), prog.engine.value
            raise UnbalancedError(
                f"{where(site, engine)}: {text} — {facts.fault.message}",
                site=int(site),
                engine=engine,
                op=text,
                buffer=ctx.name(facts.fault.buf),
            )
    by_engine = {prog.engine.value: facts for prog, facts in progs}
    rings = sorted({ring for (side, ring) in engines if side != Side.ACC})
    for ring in rings:
        producer, consumer = engines.get((Side.PRODUCE, ring)), engines.get((Side.CONSUME, ring))
        if producer is not None and consumer is not None and producer != consumer:
            _check_coiteration(ctx, site, ring, (producer, by_engine[producer]), (consumer, by_engine[consumer]))
    for ring in rings:
        pushed = sum(f.totals.get(ring, (0, 0))[0] for f in by_engine.values())
        popped = sum(f.totals.get(ring, (0, 0))[1] for f in by_engine.values())
        if pushed != popped:
            producer = engines.get((Side.PRODUCE, ring), "no engine")
            consumer = engines.get((Side.CONSUME, ring), "no engine")
            raise UnbalancedError(
                f"site {int(site)}: {ctx.name(ring)} has {pushed} page(s) pushed (by {producer}) but"
                f" {popped} popped (by {consumer}); every ring must end empty",
                site=int(site),
                engine=producer,
                buffer=ctx.name(ring),
            )


def _flow_loops(facts: Facts, ring: BufferId, side: Side, ctx: Ctx) -> tuple[Frame, ...]:
    """The loops that enclose every Reserve/Push (or Wait/Pop) of `ring` in one program, outermost first."""
    chains = [u.loops for u in facts.uses if u.flow and u.side == side and ctx.ring(u.buf) == ring]
    if not chains:
        return ()
    common = chains[0]
    for chain in chains[1:]:
        n = 0
        while n < min(len(common), len(chain)) and common[n].key == chain[n].key:
            n += 1
        common = common[:n]
    return common


def _check_coiteration(ctx: Ctx, site: Site, ring: BufferId, prod: tuple[str, Facts], cons: tuple[str, Facts]) -> None:
    """Where a ring's producer and consumer both sit inside loops with the same key, those loops run in lockstep:
    the pages pushed by one iteration of the producer's must equal those popped by one of the consumer's."""
    outer = _flow_loops(prod[1], ring, Side.PRODUCE, ctx)
    inner_keys = {f.key for f in _flow_loops(cons[1], ring, Side.CONSUME, ctx)}
    for frame in reversed([f for f in outer if f.key in inner_keys]):
        pushed = prod[1].per_iter[frame.key].get(ring, [0, 0])[0]
        popped = cons[1].per_iter[frame.key].get(ring, [0, 0])[1]
        if pushed != popped:
            text = ctx.op(frame.op)
            raise UnbalancedError(
                f"{where(site, prod[0])}: {text} — each iteration pushes {pushed} page(s) of"
                f" {ctx.name(ring)}, but each iteration of {cons[0]}'s co-iterating loop"
                f" {_var(frame.op.var)} pops {popped}",
                site=int(site),
                engine=prod[0],
                op=text,
                buffer=ctx.name(ring),
            )

"""verify's rule 3, ownership: at each site a ring has one producer engine and one consumer engine — the ones its
stages declare — a ring is filled from (emptied to) the tensor of its read (write) stage, its pages holding tiles
in that tensor's tile order, and an accumulator is touched only through its own ops, by one engine.

The order matters because tiles move as raw bytes: a K-major B tensor copied into a row-major page would give the
matmul Bᵀ's tiles, and every run would agree on the wrong answer."""

from __future__ import annotations

from ...errors import RingOwnershipError
from ...ir.ids import BufferId, Site, TensorId
from ...ir.index import ProgramIndex, where
from ...ir.nodes import Accumulator, ReadStage, WriteStage
from ...ir.ops import ChoreoOp, ReadTiles, WriteTiles
from .facts import Side, SiteProgs, Use

Owners = dict[tuple[Side, BufferId], tuple[str, str, TensorId | None]]  # engine, stage, the tensor it reads/writes
Engines = dict[tuple[Side, BufferId], str]  # (side, ring) → the engine that works that end at a site

_ROLE = {Side.PRODUCE: "produced", Side.CONSUME: "consumed", Side.ACC: "used"}
_AGENT = {Side.PRODUCE: "producer", Side.CONSUME: "consumer", Side.ACC: "owner"}


def stage_owners(ctx: ProgramIndex) -> Owners:
    """(side, ring) → (engine, stage name, tensor) as the stages declare them: a stage produces its outs, consumes its
    ins; a read stage fills them from its tensor, a write stage empties them to its tensor."""
    owners: Owners = {}
    for s in ctx.p.stages:
        tensor = s.kind.tensor if isinstance(s.kind, ReadStage | WriteStage) else None
        for side, bufs in ((Side.PRODUCE, s.outs), (Side.CONSUME, s.ins)):
            for b in bufs:
                owners.setdefault((side, ctx.ring(b)), (s.engine.value, s.name, tensor))
    return owners


def _owner_error(ctx: ProgramIndex, site: Site, engine: str, use: Use, why: str) -> RingOwnershipError:
    text = ctx.op(use.op)
    return RingOwnershipError(
        f"{where(site, engine)}: {text} — {why}", site=int(site), engine=engine, op=text, buffer=ctx.name(use.buf)
    )


def _check_kind(ctx: ProgramIndex, site: Site, engine: str, use: Use) -> None:
    is_acc = ctx.is_acc(use.buf)
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
    ctx: ProgramIndex,
    site: Site,
    engine: str,
    use: Use,
    op: ReadTiles | WriteTiles,
    declared: tuple[str, str, TensorId | None],
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
    _check_order(ctx, site, engine, use, op)


def _check_order(ctx: ProgramIndex, site: Site, engine: str, use: Use, op: ReadTiles | WriteTiles) -> None:
    """The page holds tiles in the order its tensor stores them (a per-site copy has its template's kind, layout
    included: rule 1)."""
    kind = ctx.buffers[use.buf].kind
    tensor = ctx.tensors[op.tensor]
    assert not isinstance(kind, Accumulator)  # _check_kind ran
    name = ctx.name(use.buf)
    if kind.layout.order != tensor.order:
        verb = "filled from" if isinstance(op, ReadTiles) else "written to"
        raise _owner_error(
            ctx,
            site,
            engine,
            use,
            f"{name} holds {kind.layout.order.value}-major tiles ({kind.layout.value} pages) but is {verb}"
            f" {tensor.name}, stored {tensor.order.value}-major: the tiles would arrive transposed",
        )


def check_owners(ctx: ProgramIndex, site: Site, progs: SiteProgs, owners: Owners) -> Engines:
    """Rule 3: each ring has one producer and one consumer engine at a site; accumulators only via their ops."""
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

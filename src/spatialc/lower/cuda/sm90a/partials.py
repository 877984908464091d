"""Split-K in the sm_90a form: partial sums straight between the consumers' accumulators and the workspace.

The general form stages an item's partial sums in two rings of accumulator pages (`partial_out`, `partial_in`):
a 128 x 256 item's page is 128 KiB of float32, which beside the operand stages no sm_90a block holds. Here those
rings have no page (`Rings.direct`); the program's ops around them print as what they mean for the consumers:

- a contributor's compute engine packs its accumulators into `partial_out` and its writer stores that page to the
  workspace, makes the store visible and raises the owner's semaphore. The consumers store their own elements to
  where the writer's WriteTiles puts the page, fence, meet at their engine's barrier and one thread raises the
  semaphore (the writer's SemInc): the same stores, the same release, before the same raise;
- the owner's reader waits on the semaphore and reads each partial into `partial_in`; its compute engine adds the
  pages to its accumulators one after another. The consumers wait on the semaphore themselves, before their first
  add (no earlier than the reader would have let that page through), then add the j-th read's block of the
  workspace as the j-th AddPartial (the ring is a FIFO with one filler: its j-th page is the reader's j-th read).

`sides` finds, for each site class, the ops that say where (the writer's store and raise, the reader's wait and
reads), after checking that the programs are split-K's as `passes/schedule.split_bodies` makes them — otherwise the
form refuses, naming what it met.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....ir.ids import LV_ITEM
from ....ir.nodes import Engine, Plan, SpatialProgram, TensorRole
from ....ir.ops import (
    AddPartial,
    Barrier,
    ChoreoOp,
    Compute,
    Loop,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    Wait,
    WriteBarrier,
    WriteTiles,
    walk,
)
from ....passes.split import SEM_PARTIALS, partial_rings
from ....target import SpatialTarget
from ...errors import Unsupported
from ..common.program import all_ops
from ..general import kernel as general
from .plan import warpgroups


@dataclass(frozen=True, slots=True)
class PartialSide:
    """What one site class does with partial sums: a contributor's store and raise, or an owner's wait and reads."""

    store: WriteTiles | None = None
    inc: SemInc | None = None
    wait: SemWait | None = None
    reads: tuple[ReadTiles, ...] = ()


def adds_fit(plan: Plan, target: SpatialTarget) -> str | None:
    """Why an owner of `plan`'s items cannot add partial sums without spilling, or None. A consumer thread holds 8
    accumulator values a tile of its tile row, and ptxas gives it the registers `__launch_bounds__` leaves (not what
    setmaxnreg raises it to): the loads of partial sums in flight need as many again beside them — at 128 × 256
    items (128 values of 168 registers) they spilled, at 128 × 128 (64) they did not; paired blocks' 128 registers
    spilled at 64 values."""
    held = plan.item_tiles[1] * 8
    regs = warpgroups(plan).at_launch(target)
    if 2 * held < regs:
        return None
    widest = max(1, (regs - 1) // 16)
    return (
        f"an owner's adds of split-K's partial sums beside {held} accumulator registers a thread (of {regs}): use"
        f" items of at most {widest} tile columns (block=(osh, {widest}, ibw))"
    )


def _refuse(what: str) -> Unsupported:
    return Unsupported(f"split-K's partial sums {what}", "the sm_90a form moves them as split-K's schedule does")


def sides(p: SpatialProgram, k: general.GeneralKernel) -> tuple[tuple[int, int], tuple[PartialSide, ...]] | None:
    """(the templates of partial_out and partial_in, each site class's PartialSide), or None for a program without
    split-K's workspace; Unsupported where the programs do not move partial sums as split-K's schedule does."""
    bufs = partial_rings(p)
    if bufs is None:
        if any(t.role == TensorRole.WORKSPACE for t in p.tensors):
            raise _refuse("in a workspace read or written other than once")
        return None
    out, into = bufs
    for op in all_ops(p):  # split-K's one semaphore is the only hand-over between sites
        if isinstance(op, McastSend | McastSetValid | Barrier | SemSet) or (
            isinstance(op, SemInc | SemWait) and op.sem != SEM_PARTIALS
        ):
            raise _refuse(f"beside a {type(op).__name__} between sites")
    work = next(t.id for t in p.tensors if t.role == TensorRole.WORKSPACE)
    templates = (k.rings.template[out], k.rings.template[into])
    programs = {role.engine: role.programs for role in k.roles}
    found = []
    for i in range(len(k.classes)):
        reader, compute, writer = (
            _item_body(programs[e][i], bufs) if e in programs else ()
            for e in (Engine.READER, Engine.COMPUTE, Engine.WRITER)
        )
        if not any(_touches(ops, bufs) for ops in (reader, compute, writer)):
            found.append(PartialSide())
        elif _touches(writer, (out,)) or _touches(compute, (out,)):
            found.append(_contributor(writer, compute, out, work))
        else:
            found.append(_owner(reader, compute, into, work))
    return templates, tuple(found)


def _item_body(ops: tuple[ChoreoOp, ...], bufs: tuple) -> tuple[ChoreoOp, ...]:
    """A class's program inside its ITEM loop (a split site holds one item) — a split tail's, inside the loop over
    the site's last item, after a loop over its whole items that moves no partial sum."""
    items = [op for op in ops if isinstance(op, Loop) and op.var == LV_ITEM]
    if len(ops) == 1 and len(items) == 1:
        return items[0].body
    if len(ops) == 2 and len(items) == 2 and items[1].first:
        if _touches(items[0].body, bufs):
            raise _refuse("moved by a split tail's whole items")
        return items[1].body
    return ops


def _touches(ops: tuple[ChoreoOp, ...], bufs: tuple) -> bool:
    return any(getattr(op, f, None) in bufs for op in walk(ops) for f in ("buf", "into", "src", "to"))


def _contributor(writer, compute, out, work) -> PartialSide:
    """A contributor: its writer is exactly Wait, the store of the page, Pop, WriteBarrier and one SemInc; its compute
    engine packs the page once."""
    shape = [type(op) for op in writer]
    if shape != [Wait, WriteTiles, Pop, WriteBarrier, SemInc]:
        raise _refuse(f"written by a writer of {', '.join(t.__name__ for t in shape)}")
    wait, store, pop, _, inc = writer
    if not (wait.buf == out and store.src == out and pop.buf == out and store.tensor == work):
        raise _refuse("stored from another ring or to another tensor")
    packs = [op for op in walk(compute) if isinstance(op, PackAcc) and op.to == out]
    if len(packs) != 1 or packs[0].accumulate:
        raise _refuse("packed other than once")
    if [type(op) for op in walk(compute) if _touches((op,), (out,))] != [Reserve, PackAcc, Push]:
        raise _refuse("reserved, packed and pushed out of order")
    return PartialSide(store=store, inc=inc)


def _owner(reader, compute, into, work) -> PartialSide:
    """An owner: its reader waits on one semaphore and then reads each partial into the ring (Reserve, ReadTiles,
    Push), nothing else touching it; its compute engine takes each page by Wait, AddPartial, Pop."""
    at = next((i for i, op in enumerate(reader) if isinstance(op, SemWait)), None)
    tail = reader[at + 1 :] if at is not None else ()
    if at is None or len(tail) % 3 or not tail:
        raise _refuse("read without a semaphore wait before them")
    reads = []
    for j in range(0, len(tail), 3):
        rsv, read, push = tail[j : j + 3]
        ok = isinstance(rsv, Reserve) and isinstance(read, ReadTiles) and isinstance(push, Push)
        if not ok or not (rsv.buf == into and read.into == into and push.buf == into and read.tensor == work):
            raise _refuse("read other than as Reserve, ReadTiles, Push of the workspace, after the wait")
        reads.append(read)
    if _touches(reader[:at], (into,)):
        raise _refuse("read before the semaphore wait")
    taken = [op for op in walk(compute) if _touches((op,), (into,)) or (isinstance(op, Compute) and into in op.ins)]
    want = [Wait, Compute, Pop] * len(reads)
    if [type(op) for op in taken] != want or not all(_adds(op, into) for op in taken[1::3]):
        raise _refuse("added other than as Wait, AddPartial, Pop, once a read")
    return PartialSide(wait=reader[at], reads=tuple(reads))


def _adds(op: ChoreoOp, into) -> bool:
    return isinstance(op, Compute) and op.ins == (into,) and isinstance(op.op, AddPartial)


__all__ = ["PartialSide", "adds_fit", "sides"]

"""What the general form takes: the programs it refuses, each with the reason and what would fix it.

The form counts pages per ring op in 32-bit counters and prints one block shape; a program outside that is refused
here, before anything is laid out (`kernel.make_kernel` calls `refuse` first).
"""

from __future__ import annotations

from ....ir.ids import BufferId
from ....ir.nodes import DType, SpatialProgram, TensorRole
from ....ir.ops import Barrier, ChoreoOp, Compute, Const, Loop, PackAcc, Pop, Push, Reserve, Trip, Wait, walk
from ...errors import Unsupported
from ..common.program import all_ops, check_printable, distinct_lists


def refuse(p: SpatialProgram) -> None:
    """Raise the first reason the general form cannot print `p` yet."""
    check_printable(p, dequant=True)
    ops = all_ops(p)
    for listed in distinct_lists(p):  # a list's waits are the same wherever it runs
        check_waits(p, listed)
    by_site = p.schedule.by_site()  # type: ignore[union-attr]
    lists = distinct_lists(p)
    barriers = {id(listed): {op.group for op in walk(listed) if isinstance(op, Barrier)} for listed in lists}
    for prog in p.schedule.programs:  # type: ignore[union-attr]
        for other in by_site[prog.site]:
            shared = barriers[id(prog.ops)] & barriers[id(other.ops)]
            if other.engine != prog.engine and shared:
                raise Unsupported(
                    f"a barrier of group {int(min(shared))} crossed by two engines of site {int(prog.site)}",
                    "its arrival count is the site's, kept by one engine",
                )
    if len(p.plans) > 1:
        raise Unsupported(f"a program with {len(p.plans)} plans", "the general form prints one block shape so far")
    for op in ops:
        if isinstance(op, Loop) and isinstance(op.count, Trip):
            t = p.tensor(op.count.tensor)
            if t.role != TensorRole.PARAMETER or t.dtype != DType.INT32:
                raise Unsupported(f"a loop count read from {t.name}", "trip counts are read from an int32 parameter")
            if not 0 <= op.count.index < t.elems[0] * t.elems[1]:
                raise Unsupported(
                    f"a loop count read from element {op.count.index} of {t.name}", "it has no such element"
                )
    if p.tile.rows != 16 or p.tile.cols != 16:
        raise Unsupported(f"tiles of {p.tile.rows}x{p.tile.cols}", "MMA fragments are 16x16; tile the program 16x16")
    for op in ops:
        if isinstance(op, Reserve | Push | Wait | Pop) and op.pages != 1:
            raise Unsupported(
                f"{type(op).__name__} of {op.pages} pages on {p.buffer(op.buf).name}",
                "a ring slot of the general form is one page with its own barriers",
            )
        if isinstance(op, Compute) and op.acc_reload is not None:
            raise Unsupported("an accumulator spill (acc_reload)", "accumulators never leave the registers")
        if isinstance(op, PackAcc) and op.accumulate:
            raise Unsupported("an accumulating PackAcc", "accumulator fragments are stored, never added to a page")
    check_counter_wrap(p)


# A ring's counters are C `unsigned`: they wrap at 2^32 pages, where a slot `count % DEPTH` and a phase
# `(count / DEPTH) & 1` carry on unbroken only if DEPTH divides 2^32 — a power of two.
COUNTER_WRAP = 2**32


def check_counter_wrap(p: SpatialProgram) -> None:
    """Unsupported where a ring whose depth is not a power of two could pass 2^32 pages on one site (every loop
    at its largest count): its 32-bit counters would wrap onto the wrong slot and phase."""
    reserved = {id(listed): reserved_pages(listed) for listed in distinct_lists(p)}
    for prog in p.schedule.programs:  # type: ignore[union-attr]
        for bid, pages in reserved[id(prog.ops)].items():
            kind = p.buffer(bid).kind
            depth = getattr(kind, "depth_pages", 1)
            if pages >= COUNTER_WRAP and depth & (depth - 1):
                raise Unsupported(
                    f"ring {p.buffer(bid).name} of {depth} pages passing up to {pages} pages on site {int(prog.site)}",
                    "its 32-bit counters wrap at 2^32 pages, onto the right slot only for a power-of-two depth:"
                    " give the ring a depth of 1, 2, 4, 8, …",
                )


def reserved_pages(ops: tuple[ChoreoOp, ...], times: int = 1) -> dict[BufferId, int]:
    """Pages each ring is reserved over `ops` run `times` times, every loop taken at its largest count."""
    out: dict[BufferId, int] = {}
    for op in ops:
        match op:
            case Loop(count=Const(n), body=body) | Loop(count=Trip(bound=n), body=body):
                inner = reserved_pages(body, times * n)
            case Reserve(buf, n):
                inner = {buf: times * n}
            case _:
                inner = {}
        for bid, pages in inner.items():
            out[bid] = out.get(bid, 0) + pages
    return out


def check_waits(p: SpatialProgram, ops: tuple[ChoreoOp, ...]) -> None:
    """Refuse a Wait on a ring whose page the engine already holds (waited for, not yet popped), in program order.
    In the IR such a wait finds the page it holds and passes; the general form counts waits, so it would wait for
    the next page instead (and deadlock)."""
    held: dict[BufferId, int] = {}
    for op in walk(ops):
        if isinstance(op, Wait):
            if held.get(op.buf, 0):
                raise Unsupported(
                    f"a second Wait on {p.buffer(op.buf).name} while the engine holds its page",
                    "the general form waits for the next page at each Wait: pop the page before waiting again",
                )
            held[op.buf] = op.pages
        elif isinstance(op, Pop):
            held[op.buf] = max(0, held.get(op.buf, 0) - op.pages)

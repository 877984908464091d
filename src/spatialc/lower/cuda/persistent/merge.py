"""Serialise a site's engine programs onto one CUDA block.

Elsewhere a site's engines run at once and hand pages over through rings with flow control. A persistent kernel
runs a site as one block, so its engine programs must become one sequential program — and one in which no op
waits for data that the block has not produced yet, since a block cannot wait on itself. The order is the
programs' own dataflow: programs that fill a buffer go before those that drain it; loops that several programs
run over the same variable are merged into one loop (recursively); in a straight-line segment an op is emitted
unless it waits on a buffer another program still pushes, at any depth (a push inside a later loop counts too).

DESIGN §4's question — a program with no part in a loop whose ops wait on a push made after that loop — is settled
here by letting such a program carry its blocked ops past the loop. The standard writer (`Wait C; WriteTiles;
Pop C`, no K loop) waits on the compute engine's push after its K loop; draining every program before each
co-iterated loop, as the seed did, refuses that good program. Carrying is sound: delaying one program's ops never
breaks another's order, the ops still run in their own program's order, and the ring proof that follows
(`order.prove`) rejects an order that would overfill a ring. The alternative, giving every engine the site's whole
loop skeleton, would put empty loops into the IR for this backend's sake alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ....ir.ids import BufferId, LoopVar, loop_var_name
from ....ir.ops import ChoreoOp, Const, Loop, LoopCount, Push, Wait
from ...errors import Unsupported


@dataclass(frozen=True, slots=True)
class SerialLoop:
    """A loop of the serial program: the image of `merged` engine loops that co-iterate over `var`."""

    var: LoopVar
    count: LoopCount
    body: tuple[SerialOp, ...]
    merged: int = 1


SerialOp = ChoreoOp | SerialLoop


def serialise(programs: Sequence[tuple[ChoreoOp, ...]]) -> tuple[SerialOp, ...]:
    """One sequential program that runs every program of `programs` (one site's engines) without self-waits."""
    return tuple(_merge([list(p) for p in producers_first(programs) if p]))


def serial_walk(ops: Sequence[SerialOp]):
    """Every op of a serial program, loops before their bodies, depth first (as `ir.ops.walk` for engine ops)."""
    for op in ops:
        yield op
        if isinstance(op, SerialLoop):
            yield from serial_walk(op.body)


def buffers_of(ops: Sequence[SerialOp], kind: type[Push] | type[Wait]) -> set[BufferId]:
    """Buffers that a `kind` op (Push or Wait) names in `ops`, at any loop depth."""
    found: set[BufferId] = set()
    for op in ops:
        if isinstance(op, Loop | SerialLoop):
            found |= buffers_of(op.body, kind)
        elif isinstance(op, Push | Wait) and isinstance(op, kind):
            found.add(op.buf)
    return found


def producers_first(programs: Sequence[tuple[ChoreoOp, ...]]) -> list[tuple[ChoreoOp, ...]]:
    """`programs` ordered so that one filling a buffer comes before one draining it; stable, cycles kept in order.

    On one block the order is a correctness property: a consumer printed before its producer waits for data the
    block has not made. The schedule lists engines in no particular dataflow order, so sort first and let the
    merge interleave within that order.
    """
    fills = [buffers_of(p, Push) for p in programs]
    drains = [buffers_of(p, Wait) for p in programs]
    left = list(range(len(programs)))
    order: list[int] = []
    while left:
        free = [i for i in left if not any(fills[j] & drains[i] for j in left if j != i)]
        pick = free[0] if free else left[0]
        order.append(pick)
        left.remove(pick)
    return [programs[i] for i in order]


def _serial(op: ChoreoOp) -> SerialOp:
    """An engine op as a serial op: a loop taken whole becomes a SerialLoop of itself."""
    if isinstance(op, Loop):
        return SerialLoop(op.var, op.count, tuple(_serial(o) for o in op.body), 1)
    return op


def _cuts(heads: list[list[ChoreoOp]]) -> list[int]:
    """Where each program's straight-line segment ends: at a loop the merge must align, or at its end.

    A loop another program co-iterates with (same variable) is a merge point. A loop nobody co-iterates with is
    absorbed into the segment as one op when it runs once; a longer one stays a cut, since emitting it whole
    before its consumers drain would hold all its pages at once.
    """
    firsts = [next((op.var for op in h if isinstance(op, Loop)), None) for h in heads]
    seen = Counter(v for v in firsts if v is not None)
    shared = {v for v, n in seen.items() if n > 1}

    def cut(h: list[ChoreoOp]) -> int:
        for j, op in enumerate(h):
            if isinstance(op, Loop) and (op.var in shared or op.count != Const(1)):
                return j
        return len(h)

    return [cut(h) for h in heads]


def _merge(progs: list[list[ChoreoOp]]) -> list[SerialOp]:
    """Merge programs segment by segment, loop by loop."""
    heads = progs
    out: list[SerialOp] = []
    while True:
        cuts = _cuts(heads)
        at_loop = _joining(heads, cuts)
        segs = [h[:c] for h, c in zip(heads, cuts, strict=True)]
        tails = [h[c:] for h, c in zip(heads, cuts, strict=True)]
        emitted, left = _order_segment(segs, tails, at_loop)
        out.extend(emitted)
        if not any(at_loop):
            if any(left):
                raise _stuck(left)
            return out
        loops: list[Loop] = [h[c] for h, c, at in zip(heads, cuts, at_loop, strict=True) if at]  # type: ignore[misc]
        out.append(_merge_loops(loops))
        # A program left out of the loop keeps its own (`_joining`); one with no loop here has nothing past its cut.
        heads = [rest + h[c + 1 if at else c :] for h, c, at, rest in zip(heads, cuts, at_loop, left, strict=True)]


def _joining(heads: list[list[ChoreoOp]], cuts: list[int]) -> list[bool]:
    """Which programs at a cut enter the loop merged there: each one at a loop, but for a loop that waits on pages
    only another program's ops after its own loop push, and on none the loops merged there push — a later pass's loop
    (a row program's writer, whose one loop over the row's pages stores what the compute engine's last pass over
    them fills). Merged with the first pass it would wait for pages no op before it produces; left out, it comes with
    its own ops (carried past the loop merged without it, as a program with no part in a loop is) to a later cut. A
    loop that drains some of the merged loops' pages stays in (left out, it would let them pile up over the trips;
    the ring proof judges that order as before). If every loop would be left out, none is: the ring proof then
    names the wait that cannot be met."""
    at = [c < len(h) for h, c in zip(heads, cuts, strict=True)]
    later = [buffers_of(h[c + 1 :], Push) if a else set() for h, c, a in zip(heads, cuts, at, strict=True)]
    inside = [buffers_of([h[c]], Push) if a else set() for h, c, a in zip(heads, cuts, at, strict=True)]
    waits = [buffers_of([h[c]], Wait) if a else set() for h, c, a in zip(heads, cuts, at, strict=True)]
    joins = list(at)
    changed = True
    while changed:
        changed = False
        for i in [i for i, j in enumerate(joins) if j]:
            met = set().union(*(inside[j] for j, ok in enumerate(joins) if ok and j != i))
            after = set().union(*(later[j] for j in range(len(heads)) if j != i))
            if waits[i] & after and not waits[i] & met:
                joins[i], changed = False, True
    return joins if any(joins) else at


def _merge_loops(loops: list[Loop]) -> SerialLoop:
    """One loop running the bodies of co-iterating loops, merged."""
    var, count = loops[0].var, loops[0].count
    if any(lp.var != var for lp in loops):
        names = sorted({loop_var_name(lp.var) for lp in loops})
        raise Unsupported(
            f"engine loops over different variables ({', '.join(names)}) at the same point",
            "one block runs the site's engines in one order, so their loop nests must align",
        )
    if any(lp.count != count for lp in loops):
        raise Unsupported(
            f"co-iterating loops over {loop_var_name(var)} with different counts",
            "merged into one block they must run the same number of times",
        )
    body = _merge([list(lp.body) for lp in loops])
    return SerialLoop(var, count, tuple(body), len(loops))


def _waits_in(op: ChoreoOp) -> set[BufferId]:
    """Buffers `op` waits on (a loop taken whole: any wait inside it)."""
    return buffers_of([op], Wait)


def _order_segment(
    segs: list[list[ChoreoOp]], tails: list[list[ChoreoOp]], at_loop: list[bool]
) -> tuple[list[SerialOp], list[list[ChoreoOp]]]:
    """Emit the segments' ops so none waits on a push still to come; return them and what each program carries."""
    idx = [0] * len(segs)

    def pending(buf: BufferId, skip: int) -> bool:
        return any(j != skip and buf in buffers_of(segs[j][idx[j] :] + tails[j], Push) for j in range(len(segs)))

    out: list[SerialOp] = []
    progressed = True
    while progressed:
        progressed = False
        for i, seg in enumerate(segs):
            while idx[i] < len(seg) and not any(pending(b, i) for b in _waits_in(seg[idx[i]])):
                out.append(_serial(seg[idx[i]]))
                idx[i] += 1
                progressed = True
    left = [seg[k:] for seg, k in zip(segs, idx, strict=True)]
    # A program about to enter a loop it shares cannot carry ops past its own loop: that would reorder it.
    for rest, at in zip(left, at_loop, strict=True):
        if rest and at:
            raise _stuck([rest])
    return out, left


def _stuck(left: list[list[ChoreoOp]]) -> Unsupported:
    blocked = next(rest[0] for rest in left if rest)
    return Unsupported(
        f"engine programs that cannot be serialised (blocked at {type(blocked).__name__})",
        "one block must run the site's engines in one order, and in every order some op waits for "
        "data no op before it produces",
    )

"""Rule 8's attention proof, the compute engine's run (`verify/attention.py`): its loops — [ITEM] → the KV head's
query heads → the KV blocks — bound as symbols, its ops followed one by one (the rings' pages moved here, the
values computed in `attention_ops`, the reader's and writer's pages matched in `attention_pages`), and the KV
loop's body run once from opaque m, l, o, which it must leave as one step of the recurrence.
"""

from __future__ import annotations

from ...errors import StrongerCheckNeeded
from ...ir.ids import LV_ITEM, BufferId
from ...ir.ops import (
    AcquireAcc,
    ChoreoOp,
    Compute,
    Const,
    Flush,
    Loop,
    Map,
    MatmulTiles,
    PackAcc,
    Pop,
    Push,
    ReadBarrier,
    ReleaseAcc,
    Reserve,
    RowReduce,
    ScaleAcc,
    Span,
    Wait,
    WriteBarrier,
    walk,
)
from .attention_ops import apply_map, matmul, pack, row_reduce, scale
from .attention_pages import arrive, coverage, enough, one_each, output
from .attention_state import Proof, where
from .recurrence import ACQUIRED, Geom, Val, pin, show, step
from .symbolic import PC, Aff


def compute(proof: Proof) -> None:
    """The compute engine: [ITEM loop] → one loop over the KV head's query heads → its body around one loop over
    the KV blocks."""
    prog = proof.progs["compute"]
    one_each(proof, prog)
    ops = prog.ops
    if len(ops) == 1 and isinstance(ops[0], Loop) and ops[0].var == LV_ITEM:
        proof.nest.append(proof.bind(ops[0], "item"))
        ops = ops[0].body
    if len(ops) != 1 or not isinstance(ops[0], Loop) or not isinstance(ops[0].count, Const):
        raise StrongerCheckNeeded(
            f"{where(prog)}: the semantic rule follows an attention schedule of one loop over an item's query"
            " heads, around one loop over its KV blocks"
        )
    heads = ops[0]
    if heads.count.n != proof.group:  # type: ignore[union-attr]
        raise proof.wrong(
            heads,
            f"it runs {heads.count.n} query heads an item; the declaration reads {proof.group} query heads"  # type: ignore[union-attr]
            " a KV head",
        )
    proof.nest.append(proof.bind(heads, "head"))
    proof.head = proof.env[heads.var]
    loops = [op for op in heads.body if isinstance(op, Loop)]
    if (
        len(loops) != 1
        or any(isinstance(o, Loop) for o in loops[0].body)
        or not isinstance(loops[0].count, Const | Span)
    ):
        raise StrongerCheckNeeded(
            f"{where(prog)}: the semantic rule follows a head's body of one loop over the KV blocks, with no"
            " loop inside it"
        )
    kv = loops[0]
    at = heads.body.index(kv)
    for op in heads.body[:at]:
        leaf(proof, op)
    kv_loop(proof, kv)
    for op in heads.body[at + 1 :]:
        leaf(proof, op)
    for ring, state in proof.rings.items():
        if state.reserved is not None or state.queue or state.front is not None:
            raise proof.wrong(heads, f"a head's run leaves a page in {proof.name(ring)}")


def leaf(proof: Proof, op: ChoreoOp) -> None:
    """One op of the compute engine's, but a loop: its pages moved, or its value computed (`attention_ops`)."""
    match op:
        case Reserve() | Push() | Wait() | Pop() if op.pages != 1:
            raise proof.unsure(op, "the semantic rule follows an attention's rings a page at a time")
        case Reserve(buf):
            reserve(proof, op, buf)
        case Push(buf):
            push(proof, op, buf)
        case Wait(buf):
            wait(proof, op, buf)
        case Pop(buf):
            if proof.ring(buf).front is None:
                raise proof.wrong(op, f"it pops a page of {proof.name(buf)} it does not hold")
            proof.ring(buf).front = None
        case AcquireAcc(buf):
            proof.accs[buf] = (ACQUIRED, None)
        case ReleaseAcc(buf):
            proof.accs[buf] = None
        case PackAcc():
            pack(proof, op)
        case Compute(op=MatmulTiles()):
            matmul(proof, op)
        case Compute(op=RowReduce()):
            row_reduce(proof, op)
        case Compute(op=ScaleAcc()):
            scale(proof, op)
        case Compute(op=Map()):
            apply_map(proof, op)
        case ReadBarrier() | WriteBarrier() | Flush():
            pass
        case _:
            raise proof.unsure(op, "the semantic rule does not follow this op in an attention schedule")


def reserve(proof: Proof, op: ChoreoOp, buf: BufferId) -> None:
    """A page of one of the recurrence's rings reserved, to be filled by an op of this engine."""
    state = proof.ring(buf)
    if buf in (proof.q, proof.k, proof.v) or state.reserved is not None:
        raise proof.unsure(op, f"the semantic rule follows one reserved page of {proof.name(buf)} at a time")
    state.reserved = True


def push(proof: Proof, op: Push, buf: BufferId) -> None:
    """A filled page published: O's and LSE's to the writer (`output`), the rest queued for this engine's Waits."""
    state = proof.ring(buf)
    if not isinstance(state.reserved, Val):
        raise proof.wrong(op, f"it publishes a page of {proof.name(buf)} it did not fill")
    val, state.reserved = state.reserved, None
    if buf in (proof.o, proof.lse):
        if buf in proof.outputs:
            raise proof.wrong(op, f"it publishes a second page of {proof.name(buf)} a query head")
        output(proof, op, buf, val)
        proof.outputs[buf] = (val, tuple(proof.nest), op)
    else:
        state.queue.append(val)


def wait(proof: Proof, op: Wait, buf: BufferId) -> None:
    """The next page of a ring: the reader's (`arrive`) for Q, K and V, else the first this engine published."""
    state = proof.ring(buf)
    if state.front is not None:
        raise proof.unsure(op, f"the semantic rule follows one waited page of {proof.name(buf)} at a time")
    if buf in (proof.q, proof.k, proof.v):
        state.front = arrive(proof, op, buf)
    elif not state.queue:
        raise proof.wrong(op, f"it waits for a page of {proof.name(buf)} that it published in no earlier op")
    else:
        state.front = state.queue.pop(0)


def roles_of(proof: Proof, loop: Loop) -> dict[str, BufferId]:
    """The loop's running max, running sum and output accumulator: those live at its entry that a max, a sum or
    a matmul adds into."""
    adds: dict[BufferId, set[str]] = {}
    for op in walk(loop.body):
        if isinstance(op, Compute) and op.acc is not None:
            kind = op.op.op if isinstance(op.op, RowReduce) else "mm" if isinstance(op.op, MatmulTiles) else ""
            adds.setdefault(op.acc, set()).add(kind)
    live = [a for a, s in proof.accs.items() if s is not None]
    out = {}
    for role, kind in (("m", "max"), ("l", "sum"), ("o", "mm")):
        found = [a for a in live if kind in adds.get(a, ())]
        if len(found) != 1:
            names = ", ".join(proof.name(a) for a in found) or "none"
            raise proof.wrong(
                loop,
                f"the recurrence carries one accumulator a {kind} adds into across the KV blocks ({role}); of those"
                f" acquired before this loop, {names}",
            )
        out[role] = found[0]
    return out


def kv_loop(proof: Proof, loop: Loop) -> None:
    """The KV loop: its body, run once from opaque m, l, o, leaves one step of the recurrence from any state; its
    K pages cover the KV head's keys (`coverage`, `enough`); after it m, l, o hold the recurrence's last values."""
    roles = roles_of(proof, loop)
    identity = {"m": "−∞", "l": "0", "o": "0"}
    for role, a in roles.items():
        value, _ = proof.accs[a]  # type: ignore[misc]
        if value != ACQUIRED:
            raise proof.wrong(
                loop,
                f"{proof.name(a)} enters the KV loop holding {show(value)}, not freshly acquired: the recurrence"
                f" starts from {role} = {identity[role]}",
            )
    before = in_flight(proof)
    if set(before) - {proof.q}:
        raise proof.unsure(loop, "the semantic rule follows a KV loop entered with no page in flight but Q's")
    count, k = proof.bind(loop, "k")
    n = count.n if isinstance(count, Const) else count.bound  # type: ignore[union-attr]
    if n < 1:
        raise proof.wrong(loop, "it runs no KV block")
    proof.nest.append((count, k))
    band = proof.band()
    vector = Geom(proof.bh, 1, "query", band)
    state = {
        "m": (("in", "m"), vector),
        "l": (("in", "l"), vector),
        "o": (("in", "o"), Geom(proof.bh, proof.dt, "query", band, "d", pin(Aff.of(PC), 1, proof.dt))),
    }
    entry = {a: st for a, st in proof.accs.items() if st is not None}
    for a, st in entry.items():  # any other live accumulator: opaque, so a block that reads it is refused
        proof.accs[a] = (("entry", proof.name(a)), st[1])
    for role, a in roles.items():
        proof.accs[a] = state[role]
    proof.key_rows = None
    for op in loop.body:
        leaf(proof, op)
    if in_flight(proof) != before:
        raise proof.wrong(loop, "a KV block's run leaves pages its next block would read: blocks hand on only m, l, o")
    want = step(proof.op, *(state[r][0] for r in ("m", "l", "o")))
    for role in ("m", "l", "o"):
        held = proof.accs[roles[role]]
        if held is None:
            raise proof.wrong(loop, f"a KV block releases {proof.name(roles[role])}, which the next block reads")
        value = held[0]
        proof.same(loop, f"{proof.name(roles[role])} after a KV block", value, want[role + "′"], want)
    coverage(proof, loop, n, k)
    if isinstance(count, Span):
        enough(proof, loop, count, k)
    for a, now in list(proof.accs.items()):
        if now is not None and a in entry and now[0] == ("entry", proof.name(a)):
            proof.accs[a] = entry[a]  # untouched by the loop
        elif now is not None:
            proof.accs[a] = (("last", proof.name(a)), now[1])  # the last block's: no value of the recurrence
    for role, a in roles.items():
        proof.accs[a] = (("rec", role), state[role][1])
    proof.nest.pop()


def in_flight(proof: Proof) -> dict[BufferId, tuple[object, ...]]:
    """Every ring holding a page (reserved, published or waited), with what it holds."""
    return {
        r: (s.reserved, tuple(s.queue), s.front)
        for r, s in proof.rings.items()
        if s.reserved is not None or s.queue or s.front is not None
    }

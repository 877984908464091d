"""Rule 8 on an online softmax's pass (`passes/rows.py`'s `online`): the loop over a row's pages that keeps the row's
max m and its sum of exp l running, as attention's KV loop does (docs/verification.md).

The stages declare the max M of x, the map E = exp(x − M) and the sum S of E, as a softmax of three passes reads
them. The engine's run (`engine.EngineRun`) follows such a loop — one that rescales an accumulator (`ScaleAcc`) — in
two ways at once. Its pages and reductions as it follows any loop: x's pages at their positions, the max's and the
sum's terms at their tile columns, so that the proof at the write still shows every column of the row reduced
exactly once. And its values as trees (`recurrence`) over the atom X, the page of x the iteration reads, and the
opaque m and l of the loop's entry: the body must leave m and l as one step of `recurrence.running` — m′ = max(m,
rowmax(X)), α = exp(m − m′), P = exp(X − m′), l′ = α·l + rowsum(P), the same m′ in α and P, tree for tree. Then, from
m = −∞ and l = 0 (both freshly acquired), after the last page m is M's value and l is S's of E = exp(x − M) over the
whole row: the sum's terms are recorded as E's pages of x beside M's final vector, which is what the three passes
compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...ir.ids import BufferId
from ...ir.nodes import Stage
from ...ir.ops import (
    Apply,
    Arg,
    ChoreoOp,
    Compute,
    Lit,
    Loop,
    Map,
    PackAcc,
    Pop,
    Push,
    Reserve,
    RowArg,
    RowReduce,
    ScaleAcc,
    walk,
)
from ...ir.printer import compute_text
from .dataflow import Acc, same_op
from .recurrence import Tree, ap, first_difference, lit, running, show
from .symbolic import PR, Elem, Page, RowVec

PENDING = RowVec(ScaleAcc(), ())  # E's vector in the sum's terms until the loop ends: M's value after its last page


def is_online(loop: Loop) -> bool:
    """Whether `loop`'s own body (not a loop inside it) rescales an accumulator: a running sum, proved here."""
    return any(isinstance(op, Compute) and isinstance(op.op, ScaleAcc) for op in loop.body)


@dataclasses.dataclass
class OnlineRun:
    """The values of one run of an online loop's body: each ring's pages filled inside it (a FIFO of trees), the
    running max's and sum's accumulators and their trees."""

    run: Any  # the EngineRun (engine.py imports this module)
    loop: Loop
    m_acc: BufferId
    l_acc: BufferId
    stages: tuple[Stage, Stage, Stage]  # the declared max M, map E and sum S
    x_ring: BufferId
    trees: dict[BufferId, Tree] = dataclasses.field(default_factory=dict)
    queues: dict[BufferId, list] = dataclasses.field(default_factory=dict)
    pending: dict[BufferId, list] = dataclasses.field(default_factory=dict)
    x_pops: int = 0

    def takes(self, op: ChoreoOp) -> bool:
        """Follow `op` here (its values as trees); the engine follows it too where it returns False."""
        r = self.run
        match op:
            case Reserve(buf, 1):
                self.pending.setdefault(r.index.ring(buf), []).append(None)
                return False
            case Push(buf, 1):
                ring = r.index.ring(buf)
                if self.pending.get(ring):
                    self.queues.setdefault(ring, []).append(self.pending[ring].pop(0))
                return False
            case Pop(buf, 1):
                ring = r.index.ring(buf)
                if ring == self.x_ring:
                    self.x_pops += 1
                elif self.queues.get(ring):
                    self.queues[ring].pop(0)
                return False
            case Reserve() | Push() | Pop():
                raise r.unsure(op, "the semantic rule follows an online pass's rings a page at a time")
            case PackAcc(acc, to) if acc in (self.m_acc, self.l_acc) and r.index.ring(to) not in self.outs:
                rows = r.front(op, self.x_ring).rows
                if op.tiles != rows or op.accumulate:
                    raise r.unsure(
                        op,
                        f"it packs {op.tiles} tiles of a row accumulator of {rows} rows; the semantic rule follows a"
                        " pack of every row, one tile each",
                    )
                self.fill(op, to, self.trees[acc])
                return True
            case Compute(op=ScaleAcc(), ins=(vec,), acc=acc):
                if acc != self.l_acc:
                    raise r.wrong(op, "an online pass rescales its running sum, and no other accumulator")
                self.trees[acc] = ("scale", self.trees[acc], self.front(op, vec))
                return True
            case Compute(op=RowReduce() as red, ins=(src,), acc=acc) if acc in (self.m_acc, self.l_acc):
                self.trees[acc] = ("combine", red.op, self.trees[acc], ("rowred", red.op, self.front(op, src)))
                return False  # the engine records its terms at their columns
            case Compute(op=Map() as mp, ins=ins, outs=(out,)):
                self.widths(op, mp)
                value = self.tree(op, mp, [self.front(op, b) for b in ins])
                self.fill(op, out, value)
                if r.index.ring(out) != r.index.ring(self.stages[1].outs[0]):
                    return True
                self.exp_page(op, mp, ins)
                return True
        return False

    def widths(self, op: ChoreoOp, mp: Map) -> None:
        """A map's row vectors read against rows as wide as x's pages where it maps pages, one tile where it maps row
        vectors alone (as the engine's `elementwise` and `vector_map` ask)."""
        pages, got = _reads(mp.expr)
        want = self.run.front(op, self.x_ring).width if pages else 1
        if got - {want}:
            raise self.run.unsure(
                op,
                f"it reads a row vector as rows {max(got - {want})} tiles wide against pages of rows {want} tiles wide;"
                " the semantic rule follows a row vector of one tile a page row",
            )

    @property
    def outs(self) -> set[BufferId]:
        return {self.run.index.ring(s.outs[0]) for s in self.stages}

    def fill(self, op: ChoreoOp, buf: BufferId, value: object) -> None:
        pages = self.pending.get(self.run.index.ring(buf))
        if not pages:
            raise self.run.wrong(op, f"it fills a page of {self.run.index.name(buf)} it has not reserved")
        pages[-1] = value

    def front(self, op: ChoreoOp, buf: BufferId) -> Tree:
        """The tree of the front page of `buf`'s ring: X (the page of x this iteration reads), or a page filled
        earlier in the body."""
        ring = self.run.index.ring(buf)
        if ring == self.x_ring:
            return ("X",) if self.x_pops == 0 else ("X", self.x_pops)
        queue = self.queues.get(ring)
        if not queue or queue[0] is None:
            raise self.run.unsure(
                op,
                f"it reads {self.run.index.name(buf)} in an online pass, which no op of the pass fills before; the"
                " semantic rule follows an online pass that reads x and its own pages alone",
            )
        return queue[0]

    def tree(self, op: ChoreoOp, mp: Map, ins: list[Tree]) -> Tree:
        def of(e: object) -> Tree:
            match e:
                case Arg(i) | RowArg(i):
                    return ins[i]
                case Lit(v):
                    return lit(v)
                case Apply(name, args, params):
                    return ap(name, *(of(a) for a in args), params=params)
            raise self.run.unsure(op, "the semantic rule follows an online pass's maps of pages and constants")

        return of(mp.expr)

    def exp_page(self, op: Compute, mp: Map, ins: tuple[BufferId, ...]) -> None:
        """E's page: the declared map of x's page beside M's final vector (PENDING until the loop ends), which the
        pass computes as P = exp(x − max(m′, float32's lowest)) — m′ where the max is finite, as M is wherever E is
        a number (`recurrence.running`)."""
        from ..rows import ONLINE_P

        r = self.run
        e = self.stages[1]
        declared = e.kind.op  # type: ignore[union-attr]
        if not same_op(mp, ONLINE_P) or len(ins) != 2 or r.index.ring(ins[0]) != self.x_ring:
            raise r.wrong(
                op,
                f"it fills {r.index.name(op.outs[0])} with {compute_text(mp)} of {', '.join(map(r.index.name, ins))};"
                f" stage {e.name} declares {compute_text(declared)} of x's page and the row's max, which an online"
                f" pass computes as {compute_text(ONLINE_P)} of x's page and the running max",
            )
        page = r.front(op, ins[0])
        origin = (int(r.site.site), r.engine, r.index.op(op))
        cell = Elem(declared, (page.cell, PENDING), None, origin)
        r.fill(op, op.outs[0], Page(page.rows, page.width, cell))

    def finish(self, m_in: Tree, l_in: Tree) -> None:
        """The body ran: m and l must be one step of `running` from the opaque m and l of the loop's entry."""
        r = self.run
        want = running(("X",), m_in, l_in, floored=True)
        named = {v: k for k, v in want.items()}
        for acc, role in ((self.m_acc, "m′"), (self.l_acc, "l′")):
            have = self.trees[acc]
            if have != want[role]:
                part, should = first_difference(have, want[role])
                raise r.wrong(
                    self.loop,
                    f"after a page of the online pass {r.index.name(acc)} holds {show(have, named, True)}; one step"
                    f" of the running max and sum is {role} = {show(want[role], named, True)} (where it holds"
                    f" {show(part, named)}, the step holds {show(should, named)})",
                )
        for ring, queue in self.queues.items():
            if ring != self.x_ring and queue:
                raise r.wrong(self.loop, f"a page of the online pass leaves a page of {r.index.name(ring)} unread")


def _reads(expr: object) -> tuple[bool, set[int]]:
    """Whether `expr` reads a page element by element, and every width its row vectors are read at."""
    match expr:
        case Arg():
            return True, set()
        case RowArg(_, w):
            return False, {w}
        case Apply(_, args):
            found = [_reads(a) for a in args]
            return any(p for p, _ in found), set().union(*(w for _, w in found))
    return False, set()


def start(run: Any, loop: Loop, accs: dict[BufferId, Acc]) -> OnlineRun:
    """The online loop's roles — its running max and sum (the one accumulator each of the stages' online pair's
    reductions adds into, freshly acquired before the loop) and x's ring — or the reason it is not one."""
    from ...errors import ProgramError
    from ..rows import row_shape

    r = run
    try:
        pair = row_shape(r.index.p).online
    except ProgramError:
        pair = None
    if pair is None:
        raise r.unsure(loop, "it rescales an accumulator; the semantic rule follows that in an online softmax's pass")
    m, e, s = pair
    into: dict[str, set[BufferId]] = {"max": set(), "sum": set()}
    for op in walk(loop.body):
        if isinstance(op, Compute) and isinstance(op.op, RowReduce) and op.acc is not None:
            into.setdefault(op.op.op, set()).add(op.acc)
    if len(into["max"]) != 1 or len(into["sum"]) != 1 or into["max"] == into["sum"] or len(into) != 2:
        raise r.wrong(
            loop, f"an online pass reduces each page into one running max ({m.name}) and one running sum ({s.name})"
        )
    (m_acc,), (l_acc,) = into["max"], into["sum"]
    for stage, acc in ((m, m_acc), (s, l_acc)):
        held = accs.get(acc)
        if held is None or not held.live or held.row_terms or held.terms or held.packed:
            raise r.wrong(
                loop,
                f"{r.index.name(acc)} enters the online pass not freshly acquired: {stage.name} starts from its"
                " identity",
            )
    online = OnlineRun(run, loop, m_acc, l_acc, (m, e, s), r.index.ring(m.ins[0]))
    online.trees = {m_acc: ("in", "m"), l_acc: ("in", "l")}
    return online


def settle(online: OnlineRun, max_vector: RowVec, row: object) -> None:
    """After the loop: the sum's terms read M's final vector (`max_vector`, as PackAcc would make it) where they
    held PENDING — the recurrence's l after the last page is the sum of exp(x − m) at the final m."""
    acc = online.run.accs[online.l_acc]
    now = max_vector.subst({PR: row})  # type: ignore[dict-item]

    def settled(cell: Any) -> Any:
        if isinstance(cell, Elem):
            return dataclasses.replace(cell, inners=tuple(now if c == PENDING else settled(c) for c in cell.inners))
        return cell

    acc.row_terms = [dataclasses.replace(t, cell=settled(t.cell)) for t in acc.row_terms]

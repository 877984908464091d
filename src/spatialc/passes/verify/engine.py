"""The semantic rule's run of one engine program on formulas (verify's rule 8; `dataflow` says how pages flow).

Each op changes what the pages and the accumulator hold: ReadTiles fills the newest reserved page with "tile (row,
col) of T", a tile matmul adds "Σ A-tile × B-tile" to its accumulator (summed over the loops between its AcquireAcc
and itself), PackAcc and the elementwise ops wrap the formula, WriteTiles records which tile of C gets which formula.
Every Compute is checked against the stage that declares it, by the rings it reads and fills.
"""

from __future__ import annotations

from ...ir.ids import LV_ITEM, loop_var_name
from ...ir.ops import (
    AcquireAcc,
    AddPartial,
    ChoreoOp,
    Compute,
    Const,
    Dequant,
    Loop,
    MatmulTiles,
    McastSend,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    RowReduce,
    TileAddr,
    Trip,
    WriteTiles,
)
from .dataflow import ZERO, Acc
from .engine_ops import ACC_ROW, EngineRunOps
from .online import OnlineRun, is_online, settle, start
from .symbolic import Aff, Sym


class EngineRun(EngineRunOps):
    """One engine program run once, symbolically (see the module docstring)."""

    # ---- walking -------------------------------------------------------------------------------------------------

    def body(self, ops: tuple[ChoreoOp, ...]) -> None:
        for op in ops:
            if isinstance(op, Loop):
                self.loop(op)
            else:
                self.leaf(op)

    def loop(self, op: Loop) -> None:
        # A loop counted at run time is followed at its bound: what every row present computes. The proof at the
        # write shows the count and the rows it masks leave exactly the rows the data asks for (`semantics`).
        n = op.count.n if isinstance(op.count, Const) else op.count.bound
        if n == 0:
            return
        per_reserve, per_pop, touched = self.site.per_iteration(op)
        sym = None
        if n > 1:
            sym = Sym("loop", next(self.site.counter), loop_var_name(op.var))
            self.site.ranges[sym] = n
            for ring in touched:
                if self.pending.get(ring):
                    raise self.unsure(
                        op,
                        f"pages of {self.index.name(ring)} reserved before the loop are filled or pushed inside it;"
                        " the semantic rule follows loops whose iterations reserve, fill and push their own pages",
                        ring,
                    )
        saved = (dict(self.reserved), dict(self.popped))
        if sym is not None:
            for ring, k in per_reserve.items():
                self.reserved[ring] = saved[0].get(ring, ZERO).inside(sym, n, k)
            for ring, k in per_pop.items():
                self.popped[ring] = saved[1].get(ring, ZERO).inside(sym, n, k)
        outer_item, outer_var, outer_part = self.item, self.env.get(op.var), self.part
        self.env[op.var] = Aff(0) if sym is None else Aff.of(sym)
        if op.var == LV_ITEM:
            # A loop of one item past the site's first (a split tail's) names its item apart from the site's only
            # one, the same in every engine of the site (its place in the site's list tells them apart).
            self.item = sym if sym is not None or not op.first else Sym("item at", op.first, f"item {op.first}")
            self.part = (op.first, n)
        self.frames.append((object(), sym, op))
        if isinstance(op.count, Trip):
            self.trips.append((op.count, self.addr(op, TileAddr(op.count.index, op.count.steps)), sym))
        online = start(self, op, self.accs) if self.online is None and is_online(op) else None
        self.online = online or self.online
        self.body(op.body)
        if online is not None:
            self.online = None
            self.close_online(online)
        if isinstance(op.count, Trip):
            self.trips.pop()
        self.frames.pop()
        self.item, self.part = outer_item, outer_part
        if outer_var is None:
            del self.env[op.var]
        for ring, k in per_reserve.items():
            self.reserved[ring] = saved[0].get(ring, ZERO).shifted(k * n)
        for ring, k in per_pop.items():
            self.popped[ring] = saved[1].get(ring, ZERO).shifted(k * n)

    def close_online(self, online: OnlineRun) -> None:
        """An online pass's body ran: its step proved (`online.finish`), its sum's terms given M's final vector."""
        online.finish(("in", "m"), ("in", "l"))
        acc = self.accs[online.m_acc]
        settle(online, self.vector(acc, online.stages[0]), Aff.of(ACC_ROW) if acc.rows > 1 else Aff(0))

    def leaf(self, op: ChoreoOp) -> None:
        ring = self.index.ring
        if self.online is not None and self.online.takes(op):
            return
        match op:
            case Reserve(buf, n):
                r = ring(buf)
                at = self.reserved.get(r, ZERO)
                self.pending.setdefault(r, []).extend([at.shifted(i), None, None] for i in range(n))
                self.reserved[r] = at.shifted(n)
            case Push(buf, n):
                self.push(op, ring(buf), n)
            case Pop(buf, n):
                self.popped[ring(buf)] = self.popped.get(ring(buf), ZERO).shifted(n)
            case ReadTiles():
                self.read(op)
            case WriteTiles():
                self.write(op)
            case AcquireAcc(buf):
                self.accs[buf] = Acc(tuple(token for token, _, _ in self.frames))
            case ReleaseAcc(buf) if buf in self.accs:
                self.accs[buf].live = False
            case Compute(op=MatmulTiles()):
                self.matmul(op)
            case Compute(op=AddPartial()):
                self.add_partial(op)
            case Compute(op=RowReduce()):
                self.row_reduce(op)
            case Compute(op=Dequant()):
                self.dequant(op)
            case Compute():
                self.elementwise(op)
            case PackAcc():
                self.pack(op)
            case McastSend(buf):
                self.send(op, ring(buf))
            case _:
                pass  # Wait, semaphores, barriers and ordering points order the work; they compute nothing

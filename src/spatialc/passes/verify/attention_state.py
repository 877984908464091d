"""The state of rule 8's run of one attention site (`verify/attention.py`): what the run knows of the program, the
symbols it binds, the pages and accumulators the compute engine holds, and the errors it raises.

The run itself is functions taking this state: the reader's and writer's pages matched to the compute engine's
(`attention_pages`), the compute engine's ops and its KV loop (`attention_run`, `attention_ops`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import LV_ITEM_X, LV_ITEM_Y, BufferId
from ...ir.index import ProgramIndex
from ...ir.nodes import EngineProgram
from ...ir.ops import Attention, ChoreoOp, Const, Loop, LoopCount, ReadTiles, TileAddr
from .recurrence import Geom, Tree, Val, first_difference, geom_text, pin, show
from .symbolic import PC, PR, Aff, Sym


@dataclasses.dataclass
class Ring:
    """A ring as the compute engine sees it: its reserved page, its published pages in order, its waited page."""

    reserved: Val | None | bool = None  # None: nothing reserved; True: reserved, not filled
    queue: list[Val] = dataclasses.field(default_factory=list)
    front: Val | None = None


class Proof:
    """One site's engines as the run follows them: the declaration's sizes and rings, the symbols bound so far, what
    the compute engine holds."""

    def __init__(self, index: ProgramIndex, shape, progs: dict[str, EngineProgram]) -> None:
        self.index, self.p = index, index.p
        self.op: Attention = shape.op
        plan = self.p.plan
        assert plan is not None
        self.bh, self.dt, self.bw = plan.block.osh, plan.block.osw, plan.block.ibw
        self.group = self.op.group
        (tq, self.q), (tk, self.k), (tv, self.v) = shape.reads
        (to, self.o), (tl, self.lse) = shape.writes
        self.tensors = {r: index.tensors[t] for t, r in (*shape.reads, *shape.writes)}  # type: ignore[index]
        self.progs = progs
        for name in ("reader", "compute", "writer"):
            if name not in progs:
                raise StrongerCheckNeeded(f"the attention schedule has no {name} engine on a site holding items")
        self.ranges: dict[Sym, int] = {PR: 1 << 30, PC: 1 << 30}
        self.iy = self.coord("item_y", plan.grid[0])
        self.ix = self.coord("item_x", plan.grid[1])
        self.tile_rows = self.p.tile.rows
        self.rings: dict[BufferId, Ring] = {}
        self.accs: dict[BufferId, tuple[Tree, Geom | None] | None] = {}
        self.nest: list[tuple[LoopCount, Aff]] = []  # the loops around the op being run: count, variable's value
        self.env: dict = {LV_ITEM_Y: self.iy, LV_ITEM_X: self.ix}
        self.origin: dict[Tree, ChoreoOp] = {}
        self.outputs: dict[BufferId, tuple[Val, tuple, ChoreoOp]] = {}
        self.key_rows: Aff | None = None  # the key tile rows of the K page the KV block waited for
        self.pages: dict[BufferId, tuple[tuple, ReadTiles]] = {}  # Q's, K's, V's: the ReadTiles and its loops
        self.head = Aff(0)  # the query head loop's variable, bound by `attention_run.compute`

    def coord(self, label: str, n: int) -> Aff:
        if n < 2:
            return Aff(0)
        sym = Sym("attention", label, label)
        self.ranges[sym] = n
        return Aff.of(sym)

    def band(self) -> Aff:
        """The query tile rows of the item's band in its head, page row by page row."""
        return self.iy * self.bh + pin(Aff.of(PR), self.bh, 1)

    def bind(self, loop: Loop, label: str) -> tuple[LoopCount, Aff]:
        """The loop's variable as a symbol over its iterations (a Span's: up to its bound, as rules 3–7 follow it),
        or the constant 0 for a loop of one."""
        n = loop.count.n if isinstance(loop.count, Const) else loop.count.bound  # type: ignore[union-attr]
        if n < 2:
            value = Aff(0)
        else:
            sym = Sym("attention", (label, id(loop)), label)
            self.ranges[sym] = n
            value = Aff.of(sym)
        self.env[loop.var] = value
        return loop.count, value

    # ---- errors -------------------------------------------------------------------------------------------------

    def wrong(self, op: ChoreoOp, why: str, engine: str = "compute") -> SemanticError:
        return self.index.at_op(SemanticError, self.progs[engine], op, why)

    def unsure(self, op: ChoreoOp, why: str, engine: str = "compute") -> StrongerCheckNeeded:
        return self.index.at_op(StrongerCheckNeeded, self.progs[engine], op, why)

    def name(self, b: BufferId) -> str:
        return self.index.name(b)

    # ---- the compute engine's rings and accumulators ------------------------------------------------------------

    def ring(self, buf: BufferId) -> Ring:
        return self.rings.setdefault(buf, Ring())

    def fill(self, op: ChoreoOp, buf: BufferId, val: Val) -> None:
        state = self.ring(buf)
        if state.reserved is not True:
            raise self.wrong(op, f"it fills {self.name(buf)}, holding no reserved page of it to fill")
        state.reserved = val
        self.origin.setdefault(val.value, op)

    def page(self, op: ChoreoOp, buf: BufferId) -> Val:
        front = self.ring(buf).front
        if front is None:
            raise self.wrong(op, f"it reads {self.name(buf)}, holding no page of it")
        return front

    def acc(self, op: ChoreoOp, buf: BufferId) -> tuple[Tree, Geom | None]:
        state = self.accs.get(buf)
        if state is None:
            raise self.wrong(op, f"it reads {self.name(buf)} before acquiring it (for this query head)")
        return state

    def put(self, op: ChoreoOp, buf: BufferId, value: Tree, geom: Geom, had: Geom | None) -> None:
        if had is not None and had != geom:
            raise self.wrong(op, f"it adds {geom_text(geom)} into {self.name(buf)}, which holds {geom_text(had)}")
        self.accs[buf] = (value, geom)
        self.origin.setdefault(value, op)

    # ---- comparing values ---------------------------------------------------------------------------------------

    def same(self, op: ChoreoOp, what: str, have: Tree, want: Tree, names: dict[str, Tree]) -> None:
        if have == want:
            return
        named = {v: k for k, v in names.items()}
        part = first_difference(have, want)
        culprit = self.origin.get(part[0])
        at = f"; it differs at {show(part[0], named)} where the recurrence has {show(part[1], named)}"
        by = f" (made by `{self.index.op(culprit)}`)" if culprit is not None else ""
        raise self.wrong(
            op, f"{what} is {show(have, named)}, not the recurrence's {show(want, named, top=True)}{at}{by}"
        )


def nested(ops: tuple[ChoreoOp, ...], nest: tuple = ()) -> Iterator[tuple[ChoreoOp, tuple]]:
    """Every op but loops, with the (count, loop) pairs around it, outermost first."""
    for op in ops:
        if isinstance(op, Loop):
            yield from nested(op.body, (*nest, (op.count, op)))
        else:
            yield op, nest


def addr(at: TileAddr, env: dict) -> Aff:
    """A tile address in the loop variables' values of `env` (a variable it does not bind: 0)."""
    out = Aff(at.base)
    for var, stride in at.steps:
        out = out + env.get(var, Aff(0)) * stride
    return out


def where(prog: EngineProgram) -> str:
    """The site and engine a program runs on, as a message names them."""
    return f"site {int(prog.site)} {prog.engine.value}"

"""The plumbing of the engine code generator (`codegen.Emitter`): one program's state — the per-site state it takes,
its constants, what it knows of each ring — and the helpers every op's lines are written with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LoopVar, loop_var_name
from ..ir.names import plain
from ..ir.nodes import Accumulator, Buffer, Fifo, Interm
from ..ir.ops import (
    ChoreoOp,
    ColReduce,
    Compute,
    MatmulTiles,
    RowReduce,
    TileAddr,
    walk,
)
from .errors import EvalError

if TYPE_CHECKING:
    from .machine import Machine

# Per-site state an engine takes: ("ring", buffer) | ("acc", buffer) | ("sem", sem, site or None for its own) |
# ("sem_group", sem, group) | ("ring_group", buffer, group) (the other sites' copies) | ("barrier", group)
Ref = tuple[Any, ...]


class EmitterBase:
    """An engine program's source as it is built: its lines, the state it takes, and the helpers that write them."""

    def __init__(self, m: Machine, label: str, tracing: bool) -> None:
        self.m, self.label, self.tracing = m, label, tracing
        self.lines: list[str] = []
        self.indent = 1
        self.refs: list[Ref] = []
        self.names: dict[Ref, str] = {}
        self.consts: dict[str, object] = {}
        self.ops: list[ChoreoOp] = []
        self.block_ref: dict[int, int] = {}
        self.scope: set[LoopVar] = set()
        self.item_coords_free = False
        self.known: dict[str, list[int]] = {}
        self.sides: dict[tuple[int, str], None] = {}  # ordered: errors name the first ring in program order
        self.roles: dict[Any, Compute] = {}  # each accumulator's matmul or row reduction (`acc_roles`)

    # ---- plumbing ------------------------------------------------------------------------------------------

    def comment(self, op: ChoreoOp) -> str:
        """The op's text for a `#` comment of the generated source: names in it can end no line (ir/names.py)."""
        return plain(self.m.text(op))

    def emit(self, *lines: str) -> None:
        self.lines.extend("    " * self.indent + line for line in lines)

    def where(self, op: ChoreoOp) -> str:
        return f"{self.label}: `{self.m.text(op)}`"

    def ref(self, key: Ref, prefix: str) -> str:
        """The argument name of a piece of per-site state."""
        if key not in self.names:
            self.names[key] = f"{prefix}{sum(1 for k in self.refs if k[0] == key[0])}"
            self.refs.append(key)
        return self.names[key]

    def const(self, value: object, prefix: str) -> str:
        for name, v in self.consts.items():
            if v is value and name.startswith(prefix):
                return name
        name = f"{prefix.upper()}{len(self.consts)}"
        self.consts[name] = value
        return name

    def index(self, op: ChoreoOp) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    def block(self, cond: str, i: int, ref: str | None = None) -> None:
        """Lines that wait until `cond` holds: yield i once, then None per retry still blocked."""
        if ref is not None:
            self.block_ref[i] = self.refs.index(next(k for k, n in self.names.items() if n == ref))
        self.emit(f"if not ({cond}):", f"    yield {i}", f"    while not ({cond}):", "        yield None")

    def buffer(self, bid, op: ChoreoOp, kinds: tuple[type, ...]) -> Buffer:
        buf = self.m.buffer(bid, lambda: self.where(op))
        if not isinstance(buf.kind, kinds):
            what = "an accumulator" if kinds == (Accumulator,) else "a ring"
            raise EvalError(f"{self.where(op)}: {buf.name} is not {what}")
        return buf

    def ring(self, bid, op: ChoreoOp, side: str) -> str:
        """The ring's argument name; `side` (produce / consume) is recorded so that binding can check each ring
        has one producer and one consumer engine per site — which is also what makes `facts` sound."""
        name = self.ref(("ring", self.buffer(bid, op, (Fifo, Interm)).id), "r")
        self.sides[(self.refs.index(("ring", bid)), side)] = None
        return name

    def depth_of(self, bid) -> int:
        return self.m.ring_kind(bid).depth_pages

    def facts(self, r: str) -> list[int]:
        """[reserved, published] pages of ring r that this engine's own ops guarantee at this point of the code.

        Only the producer changes `reserved` and only the consumer lowers `published`, so after a Reserve (Wait)
        those pages stay until this engine's own Push (Pop) — in straight-line code. A loop forgets them."""
        return self.known.setdefault(r, [0, 0])

    def newest_reserved(self, r: str, bid, i: int) -> str:
        """The slot expression of ring r's newest reserved page, with a check there is one unless known."""
        if self.facts(r)[0] < 1:
            what = f"writes {{{r}.name}} but holds no reserved page"
            self.emit(f"if {r}.tail == {r}.pushed:", f"    fail(E, {i}, f'{what}')")
        return f"{r}.slots[({r}.tail - 1) % {self.depth_of(bid)}]"

    def front(self, var: str, r: str, bid, i: int, n: int) -> None:
        """Lines putting ring r's front page in `var`, checked to hold at least n tiles."""
        page = f"{r}.slots[{r}.popped % {self.depth_of(bid)}]"
        if self.facts(r)[1] < 1:
            page += f" if {r}.pushed != {r}.popped else None"
        self.emit(f"{var} = {page}", f"if {var} is None or {var}.count < {n}:", f"    fail_page(E, {i}, {r}, {n})")

    def acc(self, bid, op: ChoreoOp) -> str:
        return self.ref(("acc", self.buffer(bid, op, (Accumulator,)).id), "a")

    def addr(self, at: TileAddr, op: ChoreoOp) -> str:
        terms = [str(at.base)] if at.base or not at.steps else []
        for var, stride in at.steps:
            if var in (LV_ITEM_Y, LV_ITEM_X):
                if LV_ITEM not in self.scope:
                    self.item_coords_free = True
                terms.append(_times(stride, "iy" if var == LV_ITEM_Y else "ix"))
            elif var in self.scope:
                terms.append(_times(stride, f"v{self.m.slot(var)}"))
            else:
                raise EvalError(f"{self.where(op)} uses loop variable {loop_var_name(var)} outside its loop")
        return " + ".join(terms)

    def acc_roles(self, ops: tuple[ChoreoOp, ...]) -> dict[Any, Compute]:
        """Each accumulator's role in this engine program: the matmul or the row reduction that accumulates into it
        (its first; `row_reduce` and `set_geom` check the others agree). What an AcquireAcc starts it from (a row
        max from −∞) and what a ScaleAcc scales (a matmul's block, or rows) follow from it."""
        roles: dict[Any, Compute] = {}
        for op in walk(ops):
            if (
                isinstance(op, Compute)
                and op.acc is not None
                and isinstance(op.op, MatmulTiles | RowReduce | ColReduce)
            ):
                first = roles.setdefault(op.acc, op)
                if type(first.op) is not type(op.op):
                    name = self.m.buffers[op.acc].name
                    raise EvalError(f"{self.where(op)}: {name} holds a matmul and a row reduction")
        return roles


def _times(stride: int, name: str) -> str:
    return name if stride == 1 else f"{stride} * {name}"

"""Engine programs compiled once into Python generator functions, shared by every site that runs the same ops.

Running an op is then a few lines of straight Python (one per ring counter it touches), not a call through a
dispatcher: this is what keeps the interpreter within a small factor of numpy. Each op's lines come from one
`match` arm below and are the op's semantics (DESIGN §2, `ops.py`); rare or long cases call `support.py`.
For the standard reader the generated code reads:

    def engine(E, co, r0, r1):                 # E: EngineState; co: the site's item coordinates; then its state
        iy, ix = co[0]                         # no ITEM loop: the site's one item
        for v5 in range(64):                   # Loop k
            # [0] Reserve A_ring
            if not (r0.tail - r0.popped <= 2):   # a ring of depth 3 with a page free
                yield 0                        # blocked on op 0 ...
                while not (r0.tail - r0.popped <= 2):
                    yield None                 # ... and still blocked: no progress
            r0.tail += 1
            ...

A generator yields the index of the op it blocks on, then None for every retry that is still blocked, so the
scheduler tells a stall from progress. With tracing, each op is followed by one call that records its span.
Site-specific state (rings, accumulators, semaphores, barriers) comes in as arguments, resolved per site from
`Code.refs`; program-wide constants (tensor stores, tile offsets, block shapes) are globals of the code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LoopVar, loop_var_name
from ..ir.names import plain
from ..ir.nodes import Accumulator, Buffer, Fifo, Interm
from ..ir.ops import (
    AcquireAcc,
    AddPartial,
    Apply,
    Barrier,
    ChoreoOp,
    Compute,
    Const,
    Flush,
    Loop,
    Map,
    MatmulTiles,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Pos,
    Precision,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Requant,
    Reserve,
    RowReduce,
    ScaleAcc,
    SemInc,
    SemSet,
    SemWait,
    Span,
    TileAddr,
    Trip,
    VecAxis,
    Wait,
    WriteBarrier,
    WriteTiles,
    arg_indices,
    cols,
    walk,
)
from . import support, trace
from .errors import EvalError, UnsupportedOp
from .mapped import MapKernel
from .values import TileRefs, Tiles

if TYPE_CHECKING:
    from .machine import Machine

# Per-site state an engine takes: ("ring", buffer) | ("acc", buffer) | ("sem", sem, site or None for its own) |
# ("sem_group", sem, group) | ("ring_group", buffer, group) (the other sites' copies) | ("barrier", group)
Ref = tuple[Any, ...]


@dataclass(frozen=True)
class Code:
    """One compiled engine program: its generator function, the per-site state it takes, its ops by index."""

    fn: Callable[..., Iterator[int | None]]
    refs: list[Ref]
    ops: list[ChoreoOp]
    block_ref: dict[int, int]  # blocking op index → position of the state it waits on among the refs
    item_coords_free: bool  # reads item_y / item_x outside an ITEM loop (needs a site with exactly one item)
    sides: dict[tuple[int, str], None]  # (position of a ring among the refs, "produce" | "consume")
    source: str
    texts: list[str]  # each op as op_text prints it

    def blocked_on(self, args: list[Any], i: int) -> Any:
        return args[self.block_ref[i]]


class Emitter:
    """Builds the source of one engine program, op by op."""

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

    def compile(self, ops: tuple[ChoreoOp, ...]) -> Code:
        """The Code of an engine program."""
        self.roles = self.acc_roles(ops)
        self.body(ops)
        prologue = ["    iy, ix = co[0]"] if self.item_coords_free else []
        self.lines += ["    return", "    yield None  # never reached: the yield makes this a generator"]
        params = ", ".join(["E", "co", *(self.names[r] for r in self.refs)])
        source = "\n".join([f"def engine({params}):", *prologue, *self.lines]) + "\n"
        namespace: dict[str, object] = {**_HELPERS, **self.consts}
        exec(compile(source, f"<spatialc engine {self.label}>", "exec"), namespace)  # noqa: S102 — our own text
        return Code(
            namespace["engine"],
            self.refs,
            self.ops,
            self.block_ref,  # type: ignore[arg-type]
            self.item_coords_free,
            self.sides,
            source,
            [self.m.text(op) for op in self.ops],
        )

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
            if isinstance(op, Compute) and op.acc is not None and isinstance(op.op, MatmulTiles | RowReduce):
                first = roles.setdefault(op.acc, op)
                if type(first.op) is not type(op.op):
                    name = self.m.buffers[op.acc].name
                    raise EvalError(f"{self.where(op)}: {name} holds a matmul and a row reduction")
        return roles

    # ---- ops -----------------------------------------------------------------------------------------------

    def body(self, ops: tuple[ChoreoOp, ...]) -> None:
        for op in ops:
            if isinstance(op, Loop):
                self.loop(op)
            else:
                i = self.index(op)
                self.emit(f"# [{i}] {self.comment(op)}")
                self.leaf(op, i)
                if self.tracing:
                    self.emit(self.trace_line(op, i))

    def loop(self, op: Loop) -> None:
        i = self.index(op)
        if op.var in (LV_ITEM_Y, LV_ITEM_X):
            raise EvalError(f"{self.where(op)}: {loop_var_name(op.var)} is never bound by a Loop")
        match op.count:
            case Const(n) if n >= 0:
                count = str(n)
            case Span(base, per, bound, steps):
                if steps and LV_ITEM not in self.scope:
                    self.item_coords_free = True  # the site's only item's coordinates, bound up front
                v = " + ".join(
                    [str(base), *(f"{stride} * {'iy' if var == LV_ITEM_Y else 'ix'}" for var, stride in steps)]
                )
                count = f"min({bound}, max(0, -(-({v}) // {per})))"
            case Trip():
                self.m.store(op.count.tensor, lambda: self.where(op))
                if op.count.steps and LV_ITEM not in self.scope:
                    self.item_coords_free = True  # the site's only item's coordinates, bound up front
                count = f"trip(E, {i}, iy, ix)" if op.count.steps else f"trip(E, {i}, 0, 0)"
            case _:
                raise EvalError(f"{self.where(op)}: a loop count of {op.count!r}")
        if op.var != LV_ITEM and all(isinstance(inner, Loop) for inner in walk(op.body)):
            # Nothing happens inside: running it would only spin (a count of 2^31 - 1 is legal).
            self.emit(f"# [{i}] {self.comment(op)}: no operation inside, skipped")
            return
        v = f"v{self.m.slot(op.var)}"
        self.emit(f"for {v} in range({count}):  # [{i}] {self.comment(op)}")
        self.indent += 1
        if op.var == LV_ITEM:
            self.emit(f"iy, ix = item_coords(E, co, {v}, {i})")
        outer = set(self.scope)
        self.scope.add(op.var)
        self.known = {}
        self.body(op.body)
        self.known = {}
        self.scope = outer
        if not op.body:
            self.emit("pass")
        self.indent -= 1

    def leaf(self, op: ChoreoOp, i: int) -> None:
        match op:
            case Reserve() | Push() | Wait() | Pop():
                self.flow(op, i)
            case ReadTiles():
                self.read_tiles(op, i)
            case WriteTiles():
                self.write_tiles(op, i)
            case AcquireAcc(buf):
                a = self.acc(buf, op)
                role = self.roles.get(buf)
                reduction = role.op.op if role is not None and isinstance(role.op, RowReduce) else None
                self.emit(
                    f"{a}.live = True",
                    f"{a}.a = []",
                    f"{a}.b = []",
                    f"{a}.geom = None",
                    f"{a}.parts = []",
                    f"{a}.rows = []",
                    f"{a}.carried = None",
                    f"{a}.reduction = {reduction!r}",
                )
            case ReleaseAcc(buf):
                self.emit(f"{self.acc(buf, op)}.live = False")
            case Compute():
                self.compute(op, i)
            case PackAcc(acc, to, n, accumulate):
                self.pack_checks(op)
                self.emit(f"pack(E, {i}, {self.acc(acc, op)}, {self.ring(to, op, 'produce')}, {n}, {accumulate})")
            case SemSet() | SemInc() | SemWait() | McastSetValid():
                self.semaphore(op, i)
            case McastSend(buf, group):
                r = self.ring(buf, op, "produce")
                self.m.group(group, lambda: self.where(op))
                q = self.ref(("ring_group", buf, group), "q")
                self.emit(f"mcast_send(E, {i}, {r}, {q})")
            case Barrier(group):
                self.m.group(group, lambda: self.where(op))
                b = self.ref(("barrier", group), "b")
                self.emit(f"g{i} = barrier_arrive(E, {b})")
                self.block(f"min({b}.count.values()) >= g{i}", i, b)
                self.emit(f"E.ready = {b}.ticks[g{i}]")
            case ReadBarrier() | WriteBarrier():
                self.emit("pass  # reads and writes are synchronous here")
            case Flush(buf):
                self.m.buffer(buf, lambda: self.where(op))
                self.emit("pass  # writes are synchronous here")
            case _:
                raise UnsupportedOp(f"{self.label}: the interpreter does not know the op {op!r}")

    def flow(self, op: Reserve | Push | Wait | Pop, i: int) -> None:
        """Ring counters. A check the engine's own earlier ops already guarantee (`facts`) is left out."""
        n = op.pages
        match op:
            case Reserve(buf):
                r, depth = self.ring(buf, op, "produce"), self.depth_of(buf)
                self.block(f"{r}.tail - {r}.popped <= {depth - n}", i, r)
                self.emit(f"{r}.tail += {n}")
                self.facts(r)[0] += n
            case Push(buf):
                r = self.ring(buf, op, "produce")
                if self.facts(r)[0] < n:
                    what = f"pushes {n} page(s) of {{{r}.name}} but {{{r}.reserved}} are reserved"
                    self.emit(f"if {r}.tail - {r}.pushed < {n}:", f"    fail(E, {i}, f'{what}')")
                self.emit(f"{r}.pushed += {n}")
                self.facts(r)[0] = max(self.facts(r)[0] - n, 0)
            case Wait(buf):
                r = self.ring(buf, op, "consume")
                self.block(f"{r}.pushed - {r}.popped >= {n}", i, r)
                self.facts(r)[1] = max(self.facts(r)[1], n)
            case Pop(buf):
                r = self.ring(buf, op, "consume")
                if self.facts(r)[1] < n:
                    what = f"pops {n} page(s) of {{{r}.name}} but {{{r}.published}} are published"
                    self.emit(f"if {r}.pushed - {r}.popped < {n}:", f"    fail(E, {i}, f'{what}')")
                self.emit(f"{r}.popped += {n}")
                self.facts(r)[1] = max(self.facts(r)[1] - n, 0)

    def block_of(self, op: ReadTiles | WriteTiles, bid, i: int, side: str) -> tuple[str, str, str]:
        """(ring, store, offsets) names of a ReadTiles / WriteTiles, and the lines computing `at` and checking it."""
        r = self.ring(bid, op, side)
        store = self.m.store(op.tensor, lambda: self.where(op))
        page = self.m.buffer(bid, lambda: self.where(op)).kind.page_tiles  # type: ignore[union-attr]
        n = op.block_h * op.block_w
        if n > page:
            raise EvalError(f"{self.where(op)} moves {n} tiles but a page of {self.m.buffers[bid].name} holds {page}")
        off = self.m.offsets(op.block_h, op.block_w, op.stride_h, op.stride_w)
        s, o = self.const(store, "t"), self.const(off, "o")
        lo, hi = int(off.min()), int(off.max())
        self.emit(
            f"at = {self.addr(op.at, op)}",
            f"if not {-lo} <= at <= {store.ntiles - 1 - hi}:",
            f"    fail_addr(E, {i}, {s}, at, {o})",
        )
        return r, s, o

    def read_tiles(self, op: ReadTiles, i: int) -> None:
        r, s, o = self.block_of(op, op.into, i, "produce")
        slot = self.newest_reserved(r, op.into, i)
        if op.rows_from is not None:  # a grouped tensor's rows past their group's count: zeros, never read
            counts = self.const(self.m.row_counts(op.rows_from, lambda: self.where(op)), "n")
            flush = f"{s}.flush()" if self.m.stores[op.tensor].written else "pass"
            self.emit(flush, f"{slot} = masked_read(E, {i}, {s}, at, {o}, {counts})")
            return
        if self.m.stores[op.tensor].written:  # its contents change: copy now, after the writes issued before
            self.emit(f"{s}.flush()", f"{slot} = Tiles({s}.gather(at + {o}))")
        else:
            self.emit(f"{slot} = TileRefs({s}, at, {o})")

    def write_tiles(self, op: WriteTiles, i: int) -> None:
        r, s, o = self.block_of(op, op.src, i, "consume")
        n = op.block_h * op.block_w
        self.front("v", r, op.src, i, n)
        if op.rows_from is not None:  # only the rows below their group's count are written
            counts = self.const(self.m.row_counts(op.rows_from, lambda: self.where(op)), "n")
            self.emit(f"v = masked_write(E, {i}, {s}, at, {o}, {counts}, v)")
        self.emit(f"{s}.pending.append((at, {o}, {op.block_h}, {op.block_w}, v))")

    def compute(self, op: Compute, i: int) -> None:
        mm = op.op
        if isinstance(mm, Map | Requant):
            self.elementwise(op, mm, i)
            return
        if isinstance(mm, AddPartial):
            self.add_partial(op, i)
            return
        if isinstance(mm, RowReduce):
            self.row_reduce(op, mm, i)
            return
        if isinstance(mm, ScaleAcc):
            self.scale_acc(op, i)
            return
        if not isinstance(mm, MatmulTiles):
            raise UnsupportedOp(f"{self.where(op)}: the interpreter does not run {type(mm).__name__} yet")
        if op.acc_reload is not None:
            raise UnsupportedOp(f"{self.where(op)}: the interpreter does not run accumulator reloads yet")
        if len(op.ins) != 2 or op.acc is None:
            raise EvalError(f"{self.where(op)}: a tile matmul takes two input rings and an accumulator")
        ra, rb = self.ring(op.ins[0], op, "consume"), self.ring(op.ins[1], op, "consume")
        a = self.acc(op.acc, op)
        geom = self.geometry(op, mm)
        g = self.const(geom, "g")
        self.emit(f"if not {a}.live:", f"    fail(E, {i}, {a}.name + ' is not acquired')")
        self.front("x", ra, op.ins[0], i, geom[0] * geom[2])
        self.front("y", rb, op.ins[1], i, geom[2] * geom[1])
        prec = str(mm.operand.value)  # a computed page is rounded to it, a tensor's tiles are taken as they are
        for name, buf in (("x", op.ins[0]), ("y", op.ins[1])):
            if self.m.buffers[buf].ring in self.m.computed:
                self.emit(f"{name} = operand(E, {i}, {name}, {prec!r})")
        if mm.transpose_b:  # the page holds Bᵀ (w × ibw tiles): the product reads it as B
            self.emit(f"y = transposed(y, {geom[1]}, {geom[2]})")
        self.emit(f"if {a}.geom is not {g}:", f"    set_geom(E, {i}, {a}, {g})", f"{a}.a.append(x)", f"{a}.b.append(y)")

    def scale_acc(self, op: Compute, i: int) -> None:
        """acc[row] ·= the row's value of its one ring's front page (a row vector): what the accumulator holds now."""
        if len(op.ins) != 1 or op.outs or op.acc is None:
            raise EvalError(f"{self.where(op)}: rescaling an accumulator reads one ring (a row vector)")
        role = self.roles.get(op.acc)
        if role is None:
            raise EvalError(
                f"{self.where(op)} rescales {self.m.buffers[op.acc].name}, which no matmul or row reduction of this"
                " engine accumulates into"
            )
        geom = self.geometry(role, role.op) if isinstance(role.op, MatmulTiles) else None
        r = self.ring(op.ins[0], op, "consume")
        a = self.acc(op.acc, op)
        self.front("x", r, op.ins[0], i, 1)
        self.emit(f"scale_acc(E, {i}, x, {a}, {self.const(geom, 'g') if geom is not None else None})")

    def add_partial(self, op: Compute, i: int) -> None:
        """acc += the front page of its one ring: kept beside the products, added in order when it is packed."""
        if len(op.ins) != 1 or op.outs or op.acc is None:
            raise EvalError(f"{self.where(op)}: adding a partial sum reads one ring into an accumulator")
        r = self.ring(op.ins[0], op, "consume")
        a = self.acc(op.acc, op)
        n = self.m.buffers[op.acc].kind.tiles  # type: ignore[union-attr]
        self.emit(f"if not {a}.live:", f"    fail(E, {i}, {a}.name + ' is not acquired')")
        self.front("x", r, op.ins[0], i, 1)
        self.emit(f"{a}.parts.append(partial(E, {i}, x, {n}))")

    def row_reduce(self, op: Compute, rr: RowReduce, i: int) -> None:
        """acc ⊕= each row of its one ring's front page, the columns at or past the row's width left out: the pages
        kept, reduced when the accumulator is packed (`support.pack`)."""
        if len(op.ins) != 1 or op.outs or op.acc is None:
            raise EvalError(f"{self.where(op)}: a row reduction reads one ring into an accumulator")
        r = self.ring(op.ins[0], op, "consume")
        a = self.acc(op.acc, op)
        self.front("x", r, op.ins[0], i, rr.width)
        self.emit(f"row_reduce(E, {i}, x, {a}, {self.const(rr, 'e')}, {self.addr(rr.at, op)})")

    def elementwise(self, op: Compute, cop: Map | Requant, i: int) -> None:
        """An elementwise stage: the front pages of its input rings, element by element, into its output ring."""
        arity = 1 if isinstance(cop, Requant) else max(arg_indices(cop.expr), default=-1) + 1
        if len(op.ins) != max(arity, 1) or len(op.outs) != 1 or op.acc is not None:
            raise EvalError(
                f"{self.where(op)}: an elementwise stage reads the rings its expression names"
                f" ({max(arity, 1)}) and writes one"
            )
        dst = op.outs[0]
        pages = []
        for j, src in enumerate(op.ins):
            self.front(f"x{j}", self.ring(src, op, "consume"), src, i, 1)
            pages.append(f"x{j}")
        slot = self.newest_reserved(self.ring(dst, op, "produce"), dst, i)
        integer = self.m.p.precision == Precision.INT8
        c = self.const(MapKernel(cop, integer, (self.m.p.tile.rows, self.m.p.tile.cols), len(op.ins)), "e")
        columns = cols(cop.expr) if isinstance(cop, Map) else ()
        vectors = []
        for col in columns:
            store = self.const(self.m.store(col.tensor, lambda: self.where(op)), "t")
            vectors.append(f"({store}, {self.addr(col.at, op)}, {col.width}, {col.axis == VecAxis.ROW})")
        places = [f"({self.const(node, 'p')}, {self.addr(node.at, op)})" for node in _places(cop)]
        at = f", ({', '.join(places)},)" if places else ""
        self.emit(f"{slot} = elementwise(E, {i}, [{', '.join(pages)}], {c}, [{', '.join(vectors)}]{at})")

    def geometry(self, op: Compute, mm: MatmulTiles) -> tuple[int, int, int, int, int]:
        """(h, w, ibw, tile side, int8 elements per product or 0), checked against the pages and accumulator."""
        h, w, ibw = mm.sub_blocks[0] * mm.block.osh, mm.sub_blocks[1] * mm.block.osw, mm.block.ibw
        tile = self.m.p.tile
        if tile.rows != tile.cols:
            raise UnsupportedOp(f"{self.where(op)}: tile matmuls need square tiles, not {tile.rows}x{tile.cols}")
        for bid, n in ((op.ins[0], h * ibw), (op.ins[1], ibw * w)):
            buf = self.m.buffers[bid]
            if n > buf.kind.page_tiles:  # type: ignore[union-attr]
                raise EvalError(
                    f"{self.where(op)} needs {n} tiles per page of {buf.name}, whose pages hold {buf.kind.page_tiles}"
                )  # type: ignore[union-attr]
        acc = self.m.buffers[op.acc]  # type: ignore[index]
        if h * w > acc.kind.tiles:  # type: ignore[union-attr]
            raise EvalError(f"{self.where(op)} needs {h * w} accumulator tiles, {acc.name} has {acc.kind.tiles}")  # type: ignore[union-attr]
        return (h, w, ibw, tile.rows, ibw * tile.cols if mm.operand == Precision.INT8 else 0)

    def pack_checks(self, op: PackAcc) -> None:
        page = self.buffer(op.to, op, (Fifo, Interm)).kind.page_tiles  # type: ignore[union-attr]
        acc = self.buffer(op.acc, op, (Accumulator,))
        if op.tiles > page or op.tiles > acc.kind.tiles:  # type: ignore[union-attr]
            raise EvalError(
                f"{self.where(op)} packs {op.tiles} tiles: pages of {self.m.buffers[op.to].name}"
                f" hold {page}, {acc.name} has {acc.kind.tiles}"
            )  # type: ignore[union-attr]

    def semaphore(self, op: SemSet | SemInc | SemWait | McastSetValid, i: int) -> None:
        where = lambda: self.where(op)  # noqa: E731
        match op:
            case SemSet(sem, v):
                self.m.check_sem(sem, None, where)
                self.emit(f"{self.ref(('sem', sem, None), 'c')}.value = {v}")
            case SemInc(sem, at, by):
                self.m.check_sem(sem, at, where)
                self.emit(f"{self.ref(('sem', sem, at), 'c')}.value += {by}")
            case SemWait(sem, v):
                self.m.check_sem(sem, None, where)
                c = self.ref(("sem", sem, None), "c")
                self.block(f"{c}.value >= {v}", i, c)
            case McastSetValid(sem, group, v):
                for s in self.m.group(group, where):
                    self.m.check_sem(sem, s, where)
                self.emit(f"for c in {self.ref(('sem_group', sem, group), 'g')}:", f"    c.value = {v}")

    def trace_line(self, op: ChoreoOp, i: int) -> str:
        """The call that records op i's span (tracing only)."""
        match op:
            case Reserve(buf, n) | Push(buf, n) | Wait(buf, n) | Pop(buf, n):
                return f"span(E, {i}, ring_end(E, {self.names[('ring', buf)]}, '{type(op).__name__}', {n}))"
            case SemSet(sem):
                return f"span(E, {i}, stamp(E, [{self.ref(('sem', sem, None), 'c')}]))"
            case SemWait(sem):
                return f"span(E, {i}, waited(E, {self.ref(('sem', sem, None), 'c')}.tick))"
            case SemInc(sem, at):
                return f"span(E, {i}, stamp(E, [{self.ref(('sem', sem, at), 'c')}]))"
            case McastSetValid(sem, group):
                return f"span(E, {i}, stamp(E, {self.ref(('sem_group', sem, group), 'g')}))"
            case Barrier():
                return f"span(E, {i}, waited(E, E.ready))"
        return f"span(E, {i}, E.clock + {trace.op_ticks(op)})"


def _places(op: Map | Requant) -> list[Pos]:
    """The positions (`Pos`) a map reads, each once."""
    found: dict[Pos, None] = {}
    stack = [op.expr] if isinstance(op, Map) else []
    while stack:
        node = stack.pop()
        if isinstance(node, Pos):
            found[node] = None
        elif isinstance(node, Apply):
            stack.extend(node.args)
    return list(found)


def _times(stride: int, name: str) -> str:
    return name if stride == 1 else f"{stride} * {name}"


_HELPERS: dict[str, object] = {
    "TileRefs": TileRefs,
    "Tiles": Tiles,
    **{
        name: getattr(support, name)
        for name in (
            "fail",
            "fail_addr",
            "fail_page",
            "item_coords",
            "set_geom",
            "pack",
            "partial",
            "operand",
            "masked_read",
            "masked_write",
            "mcast_send",
            "barrier_arrive",
            "trip",
            "elementwise",
            "row_reduce",
            "scale_acc",
            "transposed",
        )
    },
    **{name: getattr(trace, name) for name in ("span", "ring_end", "stamp", "waited")},
}

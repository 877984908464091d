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
from typing import Any

from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, loop_var_name
from ..ir.ops import (
    AcquireAcc,
    Barrier,
    ChoreoOp,
    ColReduce,
    Compute,
    Const,
    Flush,
    Loop,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    RowReduce,
    SemInc,
    SemSet,
    SemWait,
    Span,
    Trip,
    Wait,
    WriteBarrier,
    WriteTiles,
    walk,
)
from . import support, trace
from .blockscale import scaled_step
from .colpacks import col_reduce
from .compute_code import ComputeEmitter
from .dequant import dequant
from .emitter import Ref
from .errors import EvalError, UnsupportedOp
from .values import TileRefs, Tiles


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


class Emitter(ComputeEmitter):
    """Builds the source of one engine program, op by op."""

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
            self.emit(f"iy, ix = item_coords(E, co, {f'{op.first} + ' if op.first else ''}{v}, {i})")
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
                col_op = role.op.op if role is not None and isinstance(role.op, ColReduce) else None
                self.emit(
                    f"{a}.live = True",
                    f"{a}.a = []",
                    f"{a}.b = []",
                    f"{a}.geom = None",
                    f"{a}.parts = []",
                    f"{a}.rows = []",
                    f"{a}.carried = None",
                    f"{a}.reduction = {reduction!r}",
                    f"{a}.columns = []",
                    f"{a}.col_op = {col_op!r}",
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


_HELPERS: dict[str, object] = {
    "TileRefs": TileRefs,
    "dequant": dequant,
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
    "scaled_step": scaled_step,
    "col_reduce": col_reduce,
}

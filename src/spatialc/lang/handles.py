"""What a traced program holds of what it declares: symbolic tile addresses (`Affine`, over the IR's loop variables),
the handles of tensors, stages, semaphores, groups, rings, pages and accumulators, and the checks of the values an
engine passes them, each refused at the user's line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..ir.ids import (
    LV_ITEM_X,
    LV_ITEM_Y,
    BufferId,
    GroupId,
    LoopVar,
    SemId,
    StageId,
    TensorId,
)
from ..ir.names import name_fault
from ..ir.ops import (
    AcquireAcc,
    AddPartial,
    BlockShape,
    ChoreoOp,
    ColReduce,
    Compute,
    ComputeOp,
    MatmulTiles,
    McastSend,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    RowReduce,
    ScaleAcc,
    TileAddr,
    Wait,
    WriteTiles,
)
from .lines import refuse
from .maps import reduce_op

if TYPE_CHECKING:
    from .builder import Builder

WHAT = {  # what each kind of argument is, for messages
    "Page": "a page (ring.reserve() or ring.wait())",
    "TensorRef": "a tensor (p.input, p.output, p.parameter, p.workspace)",
    "StageRef": "a stage (p.matmul, p.elementwise, …)",
    "RingRef": "a ring (p.ring)",
    "GroupRef": "a group of sites (p.group)",
    "SemRef": "a semaphore (p.semaphore)",
}


KIND = {"TensorRef": "tensor", "RingRef": "ring", "AccRef": "accumulator", "SemRef": "semaphore"}  # a handle, named
KIND |= {"StageRef": "stage", "GroupRef": "group of sites", "Page": "a page of ring"}

# The builders of the programs being traced, innermost last: a handle is used only in the program that declared it.
_TRACING: ContextVar[tuple[Builder, ...]] = ContextVar("spatialc_lang_tracing", default=())


@contextmanager
def tracing(builder: Builder) -> Iterator[None]:
    """While a program function runs: `builder` is the program its handles must belong to."""
    token = _TRACING.set((*_TRACING.get(), builder))
    try:
        yield
    finally:
        _TRACING.reset(token)


def traced() -> Builder | None:
    """The builder of the program being traced (the innermost), if any."""
    active = _TRACING.get()
    return active[-1] if active else None


def mine(value: Any, what: str) -> None:
    """A LangError at the user's line if `value`, a handle (or a page of a ring), is another program's than the one
    being traced — its number would name something else of this program, or nothing."""
    owner = value.ring.builder if isinstance(value, Page) else getattr(value, "builder", None)
    here = traced()
    if here is None or owner is None or owner is here:
        return
    name = getattr(value.ring if isinstance(value, Page) else value, "name", None)
    given = " ".join(x for x in (KIND.get(type(value).__name__, type(value).__name__), name) if x)
    raise refuse(
        f"{what} is {given} of another program ({owner.name}), not of {here.name}: a handle is used only in the"
        " program that declared it"
    )


def expect(value: Any, kind: type, what: str) -> Any:
    """`value`, or a LangError at the user's line saying `what` must be (a page where a ring was given, …) — or that
    it is another program's."""
    if isinstance(value, kind):
        mine(value, what)
        return value
    ring = isinstance(value, RingRef)
    hint = " — wait for a page of it, or reserve one" if ring and kind is Page else ""
    raise refuse(f"{what} is {WHAT.get(kind.__name__, kind.__name__)}, not {shown(value)}{hint}")


def shown(value: Any) -> str:
    """`value` for a message: a handle by its kind and name (its repr holds the whole builder), a list or tuple by
    its first few parts so."""
    if isinstance(value, list | tuple):
        parts = [shown(v) for v in value[:4]] + ["…"] * (len(value) > 4)
        return f"{type(value).__name__} [{', '.join(parts)}]"
    name = getattr(value.ring if isinstance(value, Page) else value, "name", None)
    if type(value).__name__ in KIND and isinstance(name, str):
        return f"{KIND[type(value).__name__]} {name}"
    return f"{type(value).__name__} {value!r}"[:120]


def whole(value: Any, what: str, least: int = 1) -> int:
    """`value` when it is a whole number of at least `least`, else a LangError at the user's line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise refuse(f"{what} is a whole number of at least {least}, not {value!r}")
    return value


def named(what: str, name: object) -> None:
    """A name as ir/names.py allows it (identifier-like, bounded), or a LangError at the user's line."""
    fault = name_fault(what, name)
    if fault is not None:
        raise refuse(fault)


# ---- symbolic tile addresses ----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Affine:
    """`base + Σ stride · var` over loop variables: a tile index that depends on where the engine's loops are. It
    adds, subtracts and scales by whole numbers; it has no value while tracing, so it cannot be compared or tested."""

    base: int = 0
    steps: tuple[tuple[LoopVar, int], ...] = ()
    loops: tuple[Unnamed, ...] = ()  # the unnamed loops whose variables it uses (their variables are reused)

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.base + other, self.steps, self.loops)
        if isinstance(other, Affine):
            steps: dict[LoopVar, int] = dict(self.steps)
            for v, s in other.steps:
                steps[v] = steps.get(v, 0) + s
            loops = tuple(dict.fromkeys((*self.loops, *other.loops)))
            return Affine(self.base + other.base, tuple((v, s) for v, s in steps.items() if s), loops)
        raise refuse(f"a tile address adds whole numbers and addresses only, not {type(other).__name__} {other!r}")

    __radd__ = __add__

    def __mul__(self, n: int) -> Affine:
        if isinstance(n, bool) or not isinstance(n, int):
            raise refuse(f"a tile address is scaled by whole numbers only, not {type(n).__name__}")
        return Affine(self.base * n, tuple((v, s * n) for v, s in self.steps if s * n), self.loops)

    __rmul__ = __mul__

    def __sub__(self, other: Affine | int) -> Affine:
        return self + (-1) * other

    def __rsub__(self, n: int) -> Affine:
        return (-1) * self + n

    def __neg__(self) -> Affine:
        return (-1) * self

    def _compared(self, *_: Any) -> bool:
        raise refuse(
            "a loop variable has no value while the program is traced, so it cannot be compared: use Python's `if`"
            " on compile-time values (the site, a Python loop's index), not on an engine loop's"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compared  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise refuse(
            "a loop variable has no value while the program is traced: use Python's `if` on compile-time values"
            " (the site, a Python loop's index), not on an engine loop's"
        )

    def __index__(self) -> int:
        raise refuse("a loop variable is not a number while the program is traced (engine.range gives symbols)")

    def _divided(self, *_: Any) -> Affine:
        raise refuse(
            "a loop variable cannot be divided while the program is traced: a tile address adds, subtracts and scales"
            " loop variables by whole numbers (write the loop over the quotient instead)"
        )

    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _divided  # type: ignore[assignment]


@dataclass(eq=False)
class Unnamed:
    """An unnamed engine loop: its variable is the first free one, which a later unnamed loop may take again — so an
    address that uses it once the loop has ended is refused rather than read as the later loop's."""

    var: LoopVar
    line: tuple[str, int]
    open: bool = True


def address(at: Affine | int) -> TileAddr:
    if isinstance(at, bool) or not isinstance(at, int | Affine):
        raise refuse(f"a tile address is a whole number or a loop expression, not {type(at).__name__}")
    if isinstance(at, int):
        return TileAddr(at)
    used = {v for v, _ in at.steps}
    for loop in at.loops:
        if not loop.open and loop.var in used:
            file, line = loop.line
            raise refuse(
                f"an address uses the index of the unnamed loop at {file}:{line} after that loop ended, which no"
                " enclosing loop binds (use it inside its loop, or name the loop: e.range(n, name))"
            )
    return TileAddr(at.base, at.steps)


def var(v: LoopVar, loop: Unnamed | None = None) -> Affine:
    return Affine(0, ((v, 1),), (loop,) if loop is not None else ())


@dataclass(frozen=True, eq=False)
class Item:
    """The item an engine is on: its row `y` and column `x` in the plan's grid of items (symbolic)."""

    y: Affine = field(default_factory=lambda: var(LV_ITEM_Y))
    x: Affine = field(default_factory=lambda: var(LV_ITEM_X))


# ---- handles of what the program declares ---------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRef:
    builder: Builder
    id: TensorId
    name: str


@dataclass(frozen=True)
class StageRef:
    builder: Builder
    id: StageId
    name: str
    op: ComputeOp | None = None


@dataclass(frozen=True)
class SemRef:
    builder: Builder
    id: SemId
    name: str


@dataclass(frozen=True)
class GroupRef:
    builder: Builder
    id: GroupId
    sites: tuple[int, ...]


class Page:
    """A page of a ring an engine holds: reserved (to fill, published by `push` or at the end of its `with`) or
    waited for (to read, freed by `pop` or at the end of its `with`)."""

    def __init__(self, ring: RingRef, pages: int, reserved: bool):
        self.ring, self.pages, self.reserved, self.done = ring, pages, reserved, False

    def __enter__(self) -> Page:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is None and not self.done:
            self.push() if self.reserved else self.pop()

    def push(self) -> None:
        """Publish the reserved page to the ring's consumer."""
        self._end(True, Push(self.ring.id, self.pages))

    def pop(self) -> None:
        """Give the waited page back to the ring's producer."""
        self._end(False, Pop(self.ring.id, self.pages))

    def _end(self, reserved: bool, op: ChoreoOp) -> None:
        what = "push" if reserved else "pop"
        mine(self, f"the page of a {what}")
        if self.reserved != reserved:
            raise refuse(f"{what} of a page of {self.ring.name} this engine {'waited for' if reserved else 'reserved'}")
        if self.done:
            raise refuse(f"a second {what} of the same page of {self.ring.name}")
        self.done = True
        self.ring.builder.held[(self.ring.id, reserved)] -= 1
        if reserved:
            self.ring.builder.pushed.add(self.ring.id)
        self.ring.builder.emit(op)

    def read(self, tensor: TensorRef, at: Affine | int, rows: int, cols: int, strides=None, rows_from=None) -> None:
        """Copy `rows` × `cols` tiles of `tensor`, from its tile `at` (a flat index into its tile grid), into this
        reserved page; `strides` (between tile rows, between tile columns) default to the tensor's grid;
        `rows_from`: a grouped tensor's row counts (a parameter, one int32 per group) — rows at or past their
        group's count read as zeros."""
        self._need(True, "read into")
        t, addr, sh, sw, counts = self._block(tensor, at, strides, rows_from, "the tensor a page reads")
        self.ring.builder.emit(ReadTiles(t, addr, rows, cols, sh, sw, self.ring.id, counts))

    def write(self, tensor: TensorRef, at: Affine | int, rows: int, cols: int, strides=None, rows_from=None) -> None:
        """Copy this waited page's `rows` × `cols` tiles to `tensor` at tile `at` (the reverse of `read`; `rows_from`:
        rows at or past their group's count are left alone)."""
        self._need(False, "write from")
        t, addr, sh, sw, counts = self._block(tensor, at, strides, rows_from, "the tensor a page writes")
        self.ring.builder.emit(WriteTiles(self.ring.id, t, addr, rows, cols, sh, sw, counts))

    def _block(
        self,
        tensor: TensorRef,
        at: Affine | int,
        strides: tuple[int, int] | None,
        rows_from: TensorRef | None,
        what: str,
    ) -> tuple[Any, TileAddr, int, int, Any]:
        expect(tensor, TensorRef, what)
        if rows_from is not None:
            expect(rows_from, TensorRef, "rows_from (the row counts)")
        sh, sw = strides if strides is not None else (self.ring.builder.tensor_cols(tensor), 1)
        return tensor.id, address(at), sh, sw, rows_from.id if rows_from is not None else None

    def send(self, group: GroupRef) -> None:
        """Multicast this reserved page into the page of the same ring each other site of `group` has reserved."""
        self._need(True, "send")
        self.ring.builder.emit(McastSend(self.ring.id, expect(group, GroupRef, "the group a page is sent to").id))

    def _need(self, reserved: bool, what: str) -> None:
        mine(self, f"the page to {what}")
        if self.reserved != reserved:
            raise refuse(f"{what} a page of {self.ring.name} this engine {'waited for' if reserved else 'reserved'}")
        if self.done:
            raise refuse(f"{what} a page of {self.ring.name} after its {'push' if reserved else 'pop'}")


@dataclass(frozen=True)
class RingRef:
    """A ring of pages between two engines of a site (`depth` pages of `tiles` tiles)."""

    builder: Builder
    id: BufferId
    name: str
    depth: int
    tiles: int

    def reserve(self, pages: int = 1) -> Page:
        """Wait for `pages` free pages and hold them to fill (`with ring.reserve() as page:` publishes them at the end
        of the block; without `with`, call `page.push()`)."""
        mine(self, "the ring reserved")
        self.builder.hold(self, True)
        self.builder.emit(Reserve(self.id, pages))
        return Page(self, pages, True)

    def wait(self, pages: int = 1) -> Page:
        """Wait for `pages` filled pages and hold them to read (`with ring.wait() as page:` frees them at the end of
        the block; without `with`, call `page.pop()`)."""
        mine(self, "the ring waited for")
        if kind := self.builder.packs_later(self):
            raise refuse(
                f"a wait for {self.name}'s {kind} vector before this engine packs it: reserve a page of it, pack the"
                f" {kind} accumulator into it and push it first"
            )
        self.builder.hold(self, False)
        self.builder.emit(Wait(self.id, pages))
        return Page(self, pages, False)


@dataclass(frozen=True)
class AccRef:
    """An accumulator: tiles of sums an engine keeps across a reduction."""

    builder: Builder
    id: BufferId
    name: str
    tiles: int

    def acquire(self) -> None:
        """Zero the accumulator (the start of an item's reduction; a row reduction's: its op's identity)."""
        mine(self, "the accumulator acquired")
        self.builder.acquired.add(self.id)
        self.builder.emit(AcquireAcc(self.id))

    def release(self) -> None:
        mine(self, "the accumulator released")
        self.builder.acquired.discard(self.id)
        self.builder.emit(ReleaseAcc(self.id))

    def reduce(
        self,
        stage: StageRef | str,
        page: Page,
        at: Affine | int | None = None,
        width: int | None = None,
        cols: int | None = None,
        row: Affine | int | None = None,
    ) -> None:
        """Fold the waited `page` (of reduction `stage`'s ring) into the accumulator. A row reduction (p.reduce)
        folds each row into one value a row: the page holds rows of `width` tiles (by default all its tiles: one
        tile row) whose first is tile column `at` of the row — columns past the stage's width are padding, left out.
        A column reduction (p.col_reduce) folds each column into one value a column (`width` tiles of them): the
        page's first tile row is tile row `row` of the tensor — rows past the stage's height are padding, left out.
        `stage` may instead name the op (max, min, sum, sumsq, absmax) of a row reduction no stage declares (a step
        of a declared stage the engines expand, as attention's running max), whose rows are `cols` elements wide."""
        mine(self, "the accumulator")
        expect(page, Page, "what an accumulator reduces")
        page._need(False, "reduce")
        op: RowReduce | ColReduce
        if isinstance(stage, StageRef) and isinstance(stage.op, ColReduce):
            op, place = self._declared_col_reduce(stage, page, at, cols), row
        elif row is not None:
            raise refuse("row= places a column reduction's page (p.col_reduce); a row reduction's is placed by at=")
        elif isinstance(stage, str):
            n = whole(cols, f"the row width (cols=…) of the {stage} into {self.name}")
            op, place = reduce_op(f"into {self.name}", stage, n), at
        else:
            op, place = self._declared_reduce(stage, page, cols), at
        if self.id not in self.builder.acquired:
            raise refuse(f"a reduce into {self.name} before its acquire() (which sets each value to the op's identity)")
        w = page.ring.tiles if width is None else whole(width, "the tiles a row of the page holds")
        if isinstance(op, RowReduce):
            self.builder.row_accs.add(self.id)
        placed = replace(op, at=address(0 if place is None else place), width=w)
        self.builder.emit(Compute(placed, (page.ring.id,), (), self.id))

    def _declared_reduce(self, stage: StageRef, page: Page, cols: int | None) -> RowReduce:
        expect(stage, StageRef, "the first argument of a reduce")
        if not isinstance(stage.op, RowReduce):
            raise refuse(f"stage {stage.name} is not a reduction (p.reduce, p.col_reduce)")
        if cols is not None:
            raise refuse(f"stage {stage.name} says its row's width; cols= is for a reduction no stage declares")
        self._reduces_its_ring(stage, page)
        return stage.op

    def _declared_col_reduce(self, stage: StageRef, page: Page, at: Any, cols: int | None) -> ColReduce:
        """Column reduction `stage`, which reduces `page`'s ring; at= and cols= are a row reduction's, refused."""
        assert isinstance(stage.op, ColReduce)
        if at is not None or cols is not None:
            said = "at=" if at is not None else "cols="
            raise refuse(
                f"stage {stage.name} reduces columns: its page is placed by its first tile row (row=…); {said} is a"
                " row reduction's"
            )
        self._reduces_its_ring(stage, page)
        return stage.op

    def _reduces_its_ring(self, stage: StageRef, page: Page) -> None:
        (src,) = self.builder.stage(stage).ins
        if page.ring.id != src:
            name = self.builder.buffer_name(src)
            raise refuse(f"stage {stage.name} reduces pages of {name}; this one is of {page.ring.name}")

    def scale(self, page: Page) -> None:
        """Multiply each row of the accumulator, all its tiles, by that row's value in the waited `page`, a row
        vector (online softmax's rescale by α = exp(m − m′) between two blocks of keys)."""
        mine(self, "the accumulator")
        expect(page, Page, "what an accumulator is scaled by")
        page._need(False, "scale by")
        if self.id not in self.builder.acquired:
            raise refuse(f"a scale of {self.name} before its acquire()")
        self.builder.emit(Compute(ScaleAcc(), (page.ring.id,), (), self.id))

    def product(self, a: Page, b: Page, block: tuple[int, int, int], transpose_b: bool = False) -> None:
        """Add the product of the waited pages `a` (block[0] × block[2] tiles) and `b` (block[2] × block[1] tiles;
        with `transpose_b`, block[1] × block[2] tiles holding Bᵀ, a K page's rows as stored) to the accumulator: a
        matmul no stage declares — a step of a declared stage the engines expand (attention's S = Q·Kᵀ and P·V)."""
        mine(self, "the accumulator")
        for which, page in (("A", a), ("B", b)):
            expect(page, Page, f"operand {which} of a product")
            page._need(False, "multiply")
        if not isinstance(block, tuple | list) or len(block) != 3:
            raise refuse(f"a product's block is (rows, columns, K) tiles, not {block!r}")
        if not isinstance(transpose_b, bool):
            raise refuse(f"a product's transpose_b is True or False, not {type(transpose_b).__name__} {transpose_b!r}")
        shape = BlockShape(*(whole(n, "a product's block") for n in block))
        op = MatmulTiles(shape, (1, 1), self.builder.matmul_precision("a product"), transpose_b=transpose_b)
        self.builder.emit(Compute(op, (a.ring.id, b.ring.id), (), self.id))

    def matmul(self, stage: StageRef, a: Page, b: Page) -> None:
        """Add the product of the waited pages `a` and `b` (one K step of matmul `stage`, whose rings they are) to
        the accumulator."""
        mine(self, "the accumulator")
        expect(stage, StageRef, "the first argument of a matmul")
        if not isinstance(stage.op, MatmulTiles):
            raise refuse(f"stage {stage.name} is not a matmul")
        for which, page in (("A", a), ("B", b)):
            expect(page, Page, f"operand {which} of a matmul")
            page._need(False, "multiply")
        ins = self.builder.stage(stage).ins
        if (a.ring.id, b.ring.id) != ins:
            names = " and ".join(self.builder.buffer_name(x) for x in ins)
            raise refuse(
                f"stage {stage.name} multiplies pages of {names}; these are of {a.ring.name} and {b.ring.name}"
            )
        self.builder.emit(Compute(stage.op, (a.ring.id, b.ring.id), (), self.id))

    def add(self, page: Page) -> None:
        """Add the partial sums of the waited page to the accumulator (split-K)."""
        mine(self, "the accumulator")
        expect(page, Page, "what an accumulator adds")
        page._need(False, "add")
        self.builder.emit(Compute(AddPartial(), (page.ring.id,), (), self.id))

    def pack(self, into: Page, tiles: int | None = None) -> None:
        """Move the accumulator's tiles into the reserved page `into` (rounded to the ring's type)."""
        mine(self, "the accumulator")
        expect(into, Page, "what an accumulator is packed into")
        into._need(True, "pack into")
        n = self.tiles if tiles is None else whole(tiles, "the tiles a pack moves")
        self.builder.packed.setdefault(into.ring.id, set()).add(self.id)
        self.builder.emit(PackAcc(self.id, into.ring.id, n))

"""The embedded language's builder: a spatial program declared and its engines traced, in Python, into the IR.

A program is a Python function decorated with `spatialc.lang.program`. It receives a `Builder` and declares, in
order, the tensors, the rings, accumulators and semaphores, the stages (what the program computes: what verify's
rule 8 proves the engines compute), the plan and where the items go; then it writes each engine as a function of
an `Engine` context. An engine function runs once per site at trace time: Python values (the site, `range`, `if`)
are compile-time and unroll; `engine.range(n)` and `engine.items()` become IR loops whose variables are symbolic
(`Affine`), so tile addresses such as `8 * item.y + 4 * k` become the IR's affine `TileAddr`s.

Every op recorded remembers the line of the user's file that made it (`Traced.lines`), so that a refusal made while
tracing, and any error `verify` raises about an op, name the user's file and line (`located`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeadlockError, ProgramError, SpatialError, VerifyRuleError
from ..ir.ids import (
    LOOP_VAR_NAMES,
    LV_ITEM,
    LV_ITEM_X,
    LV_ITEM_Y,
    BufferId,
    GroupId,
    ItemId,
    LoopVar,
    SemId,
    Site,
    StageId,
    TensorId,
)
from ..ir.nodes import (
    Accumulator,
    Buffer,
    ComputeStage,
    DType,
    EngineProgram,
    Fifo,
    Group,
    Interm,
    PageLayout,
    Placement,
    Plan,
    ReadStage,
    Schedule,
    Semaphore,
    SpatialProgram,
    Stage,
    Tensor,
    TensorRole,
    Tile,
    TileOrder,
    WriteStage,
)
from ..ir.nodes import Engine as IREngine
from ..ir.ops import (
    AcquireAcc,
    AddPartial,
    Barrier,
    Bias,
    BlockShape,
    ChoreoOp,
    Compute,
    ComputeOp,
    Const,
    Loop,
    MatmulTiles,
    McastSend,
    McastSetValid,
    PackAcc,
    Pop,
    Precision,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    TileAddr,
    Trip,
    Wait,
    WriteBarrier,
    WriteTiles,
)
from ..ir.printer import op_text

_HERE = os.path.dirname(os.path.abspath(__file__))
TILE = 16  # elements a tile side: the IR's unit


class LangError(ProgramError):
    """A program the embedded language cannot trace, named at the user's line (`file`, `line`)."""

    def __init__(self, message: str, where: tuple[str, int] | None = None):
        self.file, self.line = where if where is not None else ("", 0)
        super().__init__(f"{self.file}:{self.line}: {message}" if where is not None else message)


def in_tracer(filename: str) -> bool:
    """Whether code of `filename` is this package's (the tracer's), not the user's."""
    return os.path.dirname(os.path.abspath(filename)) == _HERE


def user_line() -> tuple[str, int]:
    """The file and line of the innermost frame outside this package: the user's statement being traced."""
    frame = inspect.currentframe()
    while frame is not None and in_tracer(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def refuse(message: str) -> LangError:
    return LangError(message, user_line())


WHAT = {  # what each kind of argument is, for messages
    "Page": "a page (ring.reserve() or ring.wait())",
    "TensorRef": "a tensor (p.input, p.output, p.parameter, p.workspace)",
    "StageRef": "a stage (p.matmul, p.elementwise, …)",
    "RingRef": "a ring (p.ring)",
    "GroupRef": "a group of sites (p.group)",
    "SemRef": "a semaphore (p.semaphore)",
}


def expect(value: Any, kind: type, what: str) -> Any:
    """`value`, or a LangError at the user's line saying `what` must be (a page where a ring was given, …)."""
    if isinstance(value, kind):
        return value
    ring = isinstance(value, RingRef)
    given = f"ring {value.name}" if ring else f"{type(value).__name__} {value!r}"
    hint = " — wait for a page of it, or reserve one" if ring and kind is Page else ""
    raise refuse(f"{what} is {WHAT.get(kind.__name__, kind.__name__)}, not {given}{hint}")


def whole(value: Any, what: str, least: int = 1) -> int:
    """`value` when it is a whole number of at least `least`, else a LangError at the user's line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise refuse(f"{what} is a whole number of at least {least}, not {value!r}")
    return value


def checked(target: str, precision: str) -> Precision:
    """The program's precision, after its target and precision are shown to be ones spatialc knows."""
    from ..target import TARGETS

    if target not in TARGETS:
        raise refuse(f"target {target!r} ({', '.join(TARGETS)})")
    try:
        return Precision(precision)
    except ValueError:
        raise refuse(f"precision {precision!r} (int8, fp16 or bf16)") from None


def default_dtype(role: TensorRole, precision: Precision) -> DType:
    """A tensor's element type unless its declaration says: an input the program's precision, an output or a
    workspace the accumulators' (int32 for int8, else float32), a parameter float32."""
    if role == TensorRole.INPUT:
        return DType(precision.value)
    if role in (TensorRole.OUTPUT, TensorRole.WORKSPACE):
        return DType.INT32 if precision == Precision.INT8 else DType.FLOAT32
    return DType.FLOAT32


def least_tiles(rows: int, cols: int) -> tuple[int, int]:
    """The grid of 16 × 16 tiles that holds `rows` × `cols` elements."""
    return (-(-rows // TILE), -(-cols // TILE))


# ---- symbolic tile addresses ----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Affine:
    """`base + Σ stride · var` over loop variables: a tile index that depends on where the engine's loops are. It
    adds, subtracts and scales by whole numbers; it has no value while tracing, so it cannot be compared or tested."""

    base: int = 0
    steps: tuple[tuple[LoopVar, int], ...] = ()

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.base + other, self.steps)
        if isinstance(other, Affine):
            steps: dict[LoopVar, int] = dict(self.steps)
            for v, s in other.steps:
                steps[v] = steps.get(v, 0) + s
            return Affine(self.base + other.base, tuple((v, s) for v, s in steps.items() if s))
        raise refuse(f"a tile address adds whole numbers and addresses only, not {type(other).__name__} {other!r}")

    __radd__ = __add__

    def __mul__(self, n: int) -> Affine:
        if isinstance(n, bool) or not isinstance(n, int):
            raise refuse(f"a tile address is scaled by whole numbers only, not {type(n).__name__}")
        return Affine(self.base * n, tuple((v, s * n) for v, s in self.steps if s * n))

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


def address(at: Affine | int) -> TileAddr:
    if isinstance(at, bool) or not isinstance(at, int | Affine):
        raise refuse(f"a tile address is a whole number or a loop expression, not {type(at).__name__}")
    if isinstance(at, int):
        return TileAddr(at)
    return TileAddr(at.base, at.steps)


def var(v: LoopVar) -> Affine:
    return Affine(0, ((v, 1),))


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
        if self.reserved != reserved:
            raise refuse(f"{what} of a page of {self.ring.name} this engine {'waited for' if reserved else 'reserved'}")
        if self.done:
            raise refuse(f"a second {what} of the same page of {self.ring.name}")
        self.done = True
        self.ring.builder.held[(self.ring.id, reserved)] -= 1
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
        self.builder.hold(self, True)
        self.builder.emit(Reserve(self.id, pages))
        return Page(self, pages, True)

    def wait(self, pages: int = 1) -> Page:
        """Wait for `pages` filled pages and hold them to read (`with ring.wait() as page:` frees them at the end of
        the block; without `with`, call `page.pop()`)."""
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
        """Zero the accumulator (the start of an item's reduction)."""
        self.builder.emit(AcquireAcc(self.id))

    def release(self) -> None:
        self.builder.emit(ReleaseAcc(self.id))

    def matmul(self, stage: StageRef, a: Page, b: Page) -> None:
        """Add the product of the waited pages `a` and `b` (one K step of matmul `stage`, whose rings they are) to
        the accumulator."""
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
        expect(page, Page, "what an accumulator adds")
        page._need(False, "add")
        self.builder.emit(Compute(AddPartial(), (page.ring.id,), (), self.id))

    def pack(self, into: Page, tiles: int | None = None) -> None:
        """Move the accumulator's tiles into the reserved page `into` (rounded to the ring's type)."""
        expect(into, Page, "what an accumulator is packed into")
        into._need(True, "pack into")
        n = self.tiles if tiles is None else whole(tiles, "the tiles a pack moves")
        self.builder.emit(PackAcc(self.id, into.ring.id, n))


# ---- engines ---------------------------------------------------------------------------------------------------


class Engine:
    """What an engine function is given: its `site`, its items and loops, and the ops that are not a ring's."""

    def __init__(self, builder: Builder, site: int, name: IREngine):
        self.builder, self.site, self.name = builder, site, name
        self.used: set[LoopVar] = set()

    @property
    def item(self) -> Item:
        """The site's only item (no loop: a site with one item)."""
        return Item()

    def items(self) -> Iterator[Item]:
        """The site's items, one after another (the IR's ITEM loop)."""
        yield from self._loop(LV_ITEM, len(self.builder.items_of(self.site)), Item())

    def range(self, n: int, name: str | None = None) -> Iterator[Affine]:
        """An engine loop of `n` steps, its index symbolic (`name` "k" is the reduction's K loop; others are the
        loops listings name "lv<n>")."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise refuse(f"an engine loop runs a whole number of times, not {n!r}")
        v = self.builder.loop_var(name)
        yield from self._loop(v, n, var(v))

    def range_from(
        self, tensor: TensorRef, element: Affine | int, bound: int, per: int = 1, name: str | None = None
    ) -> Iterator[Affine]:
        """A loop counted at run time: ceil(v / `per`) steps for v the int32 `element` (a flat index, which may
        name loop variables and item coordinates) of the parameter `tensor`, at most `bound` — a grouped GEMM's
        blocks of `per` rows, v its group's row count. Its index is symbolic, as `range`'s."""
        if any(isinstance(x, bool) or not isinstance(x, int) for x in (bound, per)) or bound < 0 or per < 1:
            raise refuse(f"a loop counted at run time has a whole bound ≥ 0 and rows per step ≥ 1, not {bound}, {per}")
        expect(tensor, TensorRef, "the tensor a loop's count is read from")
        v = self.builder.loop_var(name)
        at = address(element)
        yield from self._loop(v, Trip(tensor.id, at.base, bound, per, at.steps), var(v))

    def _loop(self, v: LoopVar, n: int | Trip, value: Any) -> Iterator[Any]:
        if v in self.used:
            raise refuse(f"loop variable {LOOP_VAR_NAMES.get(v, v)} inside a loop of itself")
        self.used.add(v)
        body = self.builder.open()
        yield value
        self.builder.close(body, Loop(v, n if isinstance(n, Trip) else Const(n), ()))
        self.used.discard(v)

    def barrier(self, group: GroupRef) -> None:
        """Until every site of `group` has arrived here."""
        self.builder.emit(Barrier(expect(group, GroupRef, "what a barrier waits for").id))

    def compute(self, stage: StageRef | ComputeOp, src: Page, dst: Page) -> None:
        """Elementwise `stage` from the waited page `src` into the reserved page `dst` — or the op given itself (a
        bias names the tile columns of the page at hand: `Bias(tensor, at, width)`, ir.ops)."""
        op = stage.op if isinstance(stage, StageRef) else stage
        if op is None or isinstance(op, MatmulTiles) or not dataclasses.is_dataclass(op):
            raise refuse(f"{getattr(stage, 'name', op)!s} is not an elementwise stage or op (Relu(), Bias(...), …)")
        if isinstance(op, Bias) and not isinstance(op.at, TileAddr):
            op = dataclasses.replace(op, at=address(op.at))  # a bias's tile column may name loop variables
        expect(src, Page, "what an elementwise op reads")
        expect(dst, Page, "what an elementwise op writes")
        src._need(False, "read")
        dst._need(True, "write")
        self.builder.emit(Compute(op, (src.ring.id,), (dst.ring.id,)))

    def write_barrier(self) -> None:
        """The writes issued so far are visible."""
        self.builder.emit(WriteBarrier())

    def read_barrier(self) -> None:
        """The reads issued so far have landed."""
        self.builder.emit(ReadBarrier())

    def sem_inc(self, sem: SemRef, site: int, by: int = 1) -> None:
        """Add `by` to site `site`'s copy of `sem`."""
        self.builder.emit(SemInc(expect(sem, SemRef, "what sem_inc raises").id, Site(site), by))

    def sem_wait(self, sem: SemRef, value: int) -> None:
        """Until this site's copy of `sem` is at least `value`."""
        self.builder.emit(SemWait(expect(sem, SemRef, "what sem_wait waits for").id, value))

    def sem_set(self, sem: SemRef, value: int) -> None:
        self.builder.emit(SemSet(expect(sem, SemRef, "what sem_set sets").id, value))

    def set_valid(self, sem: SemRef, group: GroupRef, value: int = 1) -> None:
        """Set `sem` to `value` on every site of `group` (a multicast's "the page is there")."""
        expect(group, GroupRef, "the group set_valid sets")
        self.builder.emit(McastSetValid(expect(sem, SemRef, "what set_valid sets").id, group.id, value))


# ---- the builder ---------------------------------------------------------------------------------------------


class Builder:
    """What a program function is given: it declares the program and traces its engines."""

    def __init__(self, name: str, target: str, precision: str):
        self.precision = checked(target, precision)
        self.name, self.target = name, target
        self.tensors: list[Tensor] = []
        self.buffers: list[Buffer] = []
        self.semaphores: list[Semaphore] = []
        self.stages: list[Stage] = []
        self.plans: list[Plan] = []
        self.placement: Placement | None = None
        self.groups: list[Group] = []
        self.programs: list[EngineProgram] = []
        self.lines: dict[tuple[int, str], list[tuple[ChoreoOp, tuple[str, int]]]] = {}
        self.frames: list[list[ChoreoOp]] = []
        self.engine: tuple[int, str] | None = None
        self.vars: dict[str, LoopVar] = {}
        self.held: dict[tuple[BufferId, bool], int] = {}  # pages the engine being traced holds, by ring and side
        self.declared: dict[str, tuple[str, int]] = {}  # the user's line of the plan, placement, stages, groups

    def hold(self, ring: RingRef, reserved: bool) -> None:
        """One page more held of `ring` (reserved or waited for): one at a time, since the ops name the ring, not
        the page (`reserve(2)` holds two at once)."""
        key = (ring.id, reserved)
        if self.held.get(key, 0):
            verb, end = ("reserved", "push") if reserved else ("waited for", "pop")
            raise refuse(
                f"a second page of {ring.name} {verb} while this engine holds one: {end} it first, or take two at"
                f" once ({'reserve' if reserved else 'wait'}(2))"
            )
        self.held[key] = 1

    # -- tensors and buffers --

    def tensor(
        self, name: str, role: str, rows: int, cols: int, dtype: str | None, order: str, tiles=None, groups: int = 1
    ) -> TensorRef:
        if any(t.name == name for t in self.tensors):
            raise refuse(f"a second tensor named {name!r}")
        if min(rows, cols) < 1:
            raise refuse(f"tensor {name} of {rows} x {cols} elements")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise refuse(f"tensor {name} of {groups!r} groups (a whole number ≥ 1)")
        try:
            kind = DType(dtype) if dtype else default_dtype(TensorRole(role), self.precision)
            order_ = TileOrder(order)
        except ValueError as e:
            raise refuse(f"tensor {name}: {e}") from None
        least = least_tiles(rows, cols)
        least = (least[0] * groups, least[1])
        grid = least if tiles is None else tuple(tiles)
        if len(grid) != 2 or grid[0] < least[0] or grid[1] < least[1] or grid[0] % groups:
            what = f"{groups} groups of {rows} x {cols}" if groups > 1 else f"{rows} x {cols}"
            raise refuse(f"tensor {name}: a grid of {tiles} tiles does not hold {what} elements")
        t = Tensor(TensorId(len(self.tensors)), name, TensorRole(role), (rows, cols), grid, kind, order_, groups)
        self.tensors.append(t)
        return TensorRef(self, t.id, name)

    def input(
        self,
        name: str,
        rows: int,
        cols: int,
        dtype: str | None = None,
        order: str = "row",
        tiles=None,
        groups: int = 1,
    ) -> TensorRef:
        """An input tensor of `rows` × `cols` elements (the program's precision by default), stored in 16 × 16 tiles
        (`order` "col": each tile column-major, an int8 B; `tiles`: a grid of tiles larger than the elements need,
        padded to whole items; `groups` G: G matrices of `rows` × `cols` stacked, a grouped GEMM's)."""
        return self.tensor(name, "input", rows, cols, dtype, order, tiles, groups)

    def output(
        self, name: str, rows: int, cols: int, dtype: str | None = None, tiles=None, groups: int = 1
    ) -> TensorRef:
        """The output tensor (float32, or int32 for int8, by default; `groups` as for an input)."""
        return self.tensor(name, "output", rows, cols, dtype, "row", tiles, groups)

    def parameter(self, name: str, rows: int, cols: int, dtype: str | None = None, tiles=None) -> TensorRef:
        """A parameter tensor (a bias, a row count; float32 by default)."""
        return self.tensor(name, "parameter", rows, cols, dtype, "row", tiles)

    def workspace(self, name: str, rows: int, cols: int, dtype: str | None = None, tiles=None) -> TensorRef:
        """A workspace in global memory the sites hand partial sums through (split-K), of the accumulators' type."""
        return self.tensor(name, "workspace", rows, cols, dtype, "row", tiles)

    def ring(self, name: str, depth: int, tiles: int, layout: str = "row", kind: str = "fifo") -> RingRef:
        """A ring of `depth` pages of `tiles` tiles each (`layout`: how a page holds its tiles, ir.nodes.PageLayout;
        `kind` "interm": an epilogue stage's ring, between two steps of the compute engine)."""
        whole(depth, f"ring {name}'s depth")
        whole(tiles, f"ring {name}'s tiles a page")
        if kind not in ("fifo", "interm"):
            raise refuse(f"ring {name} of {depth} pages of {tiles} tiles ({kind})")
        try:
            ring_kind = (Fifo if kind == "fifo" else Interm)(depth, tiles, PageLayout(layout))
        except ValueError:
            raise refuse(f"ring {name}: layout {layout!r} ({', '.join(x.value for x in PageLayout)})") from None
        b = self._buffer(name, ring_kind)
        return RingRef(self, b.id, name, depth, tiles)

    def accumulator(self, name: str, tiles: int) -> AccRef:
        """An accumulator of `tiles` tiles of sums (an item's block)."""
        b = self._buffer(name, Accumulator(whole(tiles, f"accumulator {name}'s tiles")))
        return AccRef(self, b.id, name, tiles)

    def _buffer(self, name: str, kind: Any) -> Buffer:
        if any(b.name == name for b in self.buffers):
            raise refuse(f"a second buffer named {name!r}")
        b = Buffer(BufferId(len(self.buffers)), name, kind)
        self.buffers.append(b)
        return b

    def semaphore(self, name: str, initial: int = 0, number: int | None = None) -> SemRef:
        """A count each site keeps a copy of (`SemInc` raises another site's, `SemWait` waits on its own); numbered
        1, 2, … in declaration order unless `number` says."""
        n = len(self.semaphores) + 1 if number is None else number
        if any(int(x.id) == n for x in self.semaphores):
            raise refuse(f"a second semaphore numbered {n}")
        s = Semaphore(SemId(n), name, initial)
        self.semaphores.append(s)
        return SemRef(self, s.id, name)

    # -- what the program computes --

    def stage(self, ref: StageRef) -> Stage:
        return self.stages[int(ref.id)]

    def buffer_name(self, bid: BufferId) -> str:
        return self.buffers[int(bid)].name

    def _stage(self, name: str, kind: Any, engine: str, ins: tuple, outs: tuple) -> StageRef:
        s = Stage(StageId(len(self.stages)), name, kind, IREngine(engine), ins, outs)
        self.stages.append(s)
        self.declared[f"stage {name}"] = user_line()  # an error about the stage names it so
        return StageRef(self, s.id, name, getattr(kind, "op", None))

    def read(self, name: str, tensor: TensorRef, into: RingRef, engine: str = "reader") -> StageRef:
        """Stage: `tensor` is read into the pages of `into`."""
        expect(tensor, TensorRef, f"the tensor stage {name} reads")
        expect(into, RingRef, f"the ring stage {name} fills")
        return self._stage(name, ReadStage(tensor.id), engine, (), (into.id,))

    def matmul(
        self,
        name: str,
        a: RingRef,
        b: RingRef,
        out: RingRef,
        block: tuple[int, int, int],
        sub_blocks=(1, 1),
        partial: RingRef | None = None,
    ) -> StageRef:
        """Stage: the product of A's and B's pages, `block` = (output tile rows, columns, K tiles a step), into
        `out`'s pages — and, split over sites (split-K), a part of K's sum into `partial`'s."""
        for what, ring in (("operand A", a), ("operand B", b), ("output", out)):
            expect(ring, RingRef, f"the {what} ring of stage {name}")
        op = MatmulTiles(BlockShape(*block), tuple(sub_blocks), self.precision)  # type: ignore[arg-type]
        outs = (out.id,) if partial is None else (out.id, partial.id)
        return self._stage(name, ComputeStage(op), "compute", (a.id, b.id), outs)

    def add_partials(self, name: str, src: RingRef) -> StageRef:
        """Stage: the partial sums in `src`'s pages are added to the accumulator (split-K's owner site)."""
        return self._stage(name, ComputeStage(AddPartial()), "compute", (src.id,), ())

    def elementwise(self, name: str, op: ComputeOp, src: RingRef, dst: RingRef) -> StageRef:
        """Stage: `op` (ir.ops Relu, Bias, Scalar, …) applied to `src`'s pages into `dst`'s."""
        expect(src, RingRef, f"the ring stage {name} reads")
        expect(dst, RingRef, f"the ring stage {name} fills")
        return self._stage(name, ComputeStage(op), "compute", (src.id,), (dst.id,))

    def write(self, name: str, src: RingRef, tensor: TensorRef, engine: str = "writer") -> StageRef:
        """Stage: the pages of `src` are written to `tensor`."""
        expect(src, RingRef, f"the ring stage {name} empties")
        expect(tensor, TensorRef, f"the tensor stage {name} writes")
        return self._stage(name, WriteStage(tensor.id), engine, (src.id,), ())

    def plan(
        self,
        block: tuple[int, int, int],
        grid: tuple[int, int],
        k_tiles: int,
        depth: int,
        sub_blocks: tuple[int, int] = (1, 1),
        groups: int = 1,
    ) -> None:
        """The items: a `grid` of blocks of `block[0]` × `block[1]` output tiles, K reduced `block[2]` tiles a step
        over `k_tiles` tiles, operand rings `depth` pages deep (`groups` G: a grouped GEMM, the grid one group's)."""
        for name, value, n in (("block", block, 3), ("grid", grid, 2), ("sub_blocks", sub_blocks, 2)):
            if not isinstance(value, tuple | list) or len(value) != n:
                raise refuse(f"p.plan's {name} is {n} whole numbers, not {value!r}")
        plan = Plan(BlockShape(*block), tuple(sub_blocks), tuple(grid), k_tiles, depth, groups)  # type: ignore[arg-type]
        self.plans.append(plan)
        self.declared["plan"] = user_line()

    def place(
        self,
        items_of_site: list[list[int]],
        kind: str = "contiguous",
        band: int = 0,
        multicast: tuple[int, int] = (1, 1),
        splits: int = 1,
    ) -> None:
        """Which items each site runs: `items_of_site[s]` for site s (`kind`, `band`: the placement rule they
        follow, ir/worklist.py, which lets a launch spread them over the device's sites; any other list runs as
        listed). `multicast` (gy, gx): the sites form groups of gy × gx that share pages (kind "multicast"; the
        kernels run each group as a thread-block cluster). `splits` S (kind "split"): each item is on S sites, each
        reducing a part of K (split-K)."""
        if not isinstance(items_of_site, list | tuple) or not all(isinstance(i, list | tuple) for i in items_of_site):
            raise refuse(f"p.place takes a list of each site's item list, not {items_of_site!r}")
        listed = tuple((Site(s), tuple(ItemId(i) for i in items)) for s, items in enumerate(items_of_site))
        self.placement = Placement(listed, (), kind, band, splits, tuple(multicast))  # type: ignore[arg-type]
        self.declared["placement"] = user_line()

    def group(self, sites: list[int]) -> GroupRef:
        """A group of sites (a multicast's or a barrier's)."""
        g = Group(GroupId(len(self.groups)), tuple(Site(s) for s in sites))
        self.groups.append(g)
        self.declared[f"group {int(g.id)}"] = user_line()
        return GroupRef(self, g.id, tuple(sites))

    def items_of(self, site: int) -> tuple[ItemId, ...]:
        if self.placement is None:
            raise refuse("the engines are traced after the items are placed (builder.place)")
        for s, items in self.placement.items_of_site:
            if int(s) == site:
                return items
        return ()

    def tensor_cols(self, tensor: TensorRef) -> int:
        return self.tensors[int(tensor.id)].tiles[1]

    def loop_var(self, name: str | None) -> LoopVar:
        """The loop variable a loop named `name` binds: "k", "sh", "sw", "row" have their fixed meanings (ir.ids);
        "lv<n>" is variable n; any other name (or none) a variable of its own, from 7 up."""
        fixed = {n: v for v, n in LOOP_VAR_NAMES.items() if v not in (LV_ITEM, LV_ITEM_Y, LV_ITEM_X)}
        if name in fixed:
            return fixed[name]
        numbered = re.fullmatch(r"lv(\d+)", name or "")
        if numbered and int(numbered[1]) >= 7:
            return LoopVar(int(numbered[1]))
        if name is None or name not in self.vars:
            taken = {int(v) for v in self.vars.values()}
            v = LoopVar(next(i for i in range(7, 10_000) if i not in taken))
            if name is None:
                return v
            self.vars[name] = v
        return self.vars[name]

    # -- engines --

    def engine_fn(self, name: str, sites: list[int] | None, fn: Any) -> Any:
        """Trace `fn(engine)` for each site (all placed sites by default) as its `name` engine's program."""
        try:
            engine = IREngine(name)
        except ValueError:
            raise refuse(f"engine {name!r} ({', '.join(e.value for e in IREngine)})") from None
        if self.placement is None:
            raise refuse("the engines are traced after the items are placed (builder.place)")
        for site in sites if sites is not None else [int(s) for s, _ in self.placement.items_of_site]:
            if (site, engine.value) in self.lines:
                raise refuse(f"a second {engine.value} engine for site {site} (each site has one of each)")
            self.engine = (site, engine.value)
            self.lines[self.engine] = []
            self.held = {}
            frame = self.open()
            fn(Engine(self, site, engine))
            if len(self.frames) != 1:
                raise refuse("an engine loop left open (a loop body that did not finish)")
            self.frames.pop()
            self.programs.append(EngineProgram(Site(site), engine, tuple(frame)))
            self.engine = None
        return fn

    def reader(self, fn: Any = None, *, sites: list[int] | None = None) -> Any:
        """Decorator: `fn(engine)` is the reader engine of every site (or of `sites`)."""
        return self._decorator("reader", fn, sites)

    def compute(self, fn: Any = None, *, sites: list[int] | None = None) -> Any:
        return self._decorator("compute", fn, sites)

    def writer(self, fn: Any = None, *, sites: list[int] | None = None) -> Any:
        return self._decorator("writer", fn, sites)

    def mover(self, fn: Any = None, *, sites: list[int] | None = None) -> Any:
        """Decorator: `fn(engine)` is a further data-movement engine (a second reader or writer, a forwarder)."""
        return self._decorator("mover", fn, sites)

    def _decorator(self, name: str, fn: Any, sites: list[int] | None) -> Any:
        if fn is None:
            return lambda f: self.engine_fn(name, sites, f)
        return self.engine_fn(name, sites, fn)

    def open(self) -> list[ChoreoOp]:
        frame: list[ChoreoOp] = []
        self.frames.append(frame)
        return frame

    def close(self, body: list[ChoreoOp], loop: Loop) -> None:
        if not self.frames or self.frames[-1] is not body:
            raise refuse("engine loops closed out of order")
        self.frames.pop()
        self.emit(Loop(loop.var, loop.count, tuple(body)))

    def emit(self, op: ChoreoOp) -> None:
        if self.engine is None or not self.frames:
            raise refuse(f"{type(op).__name__} outside an engine function")
        self.frames[-1].append(op)
        self.lines[self.engine].append((op, user_line()))

    # -- the program --

    def program(self) -> SpatialProgram:
        if self.placement is None:
            raise LangError("the program places no items (builder.place)")
        rank: dict[IREngine, int] = {}  # each site's engines in the order their functions were first declared
        for q in self.programs:
            rank.setdefault(q.engine, len(rank))
        placement = Placement(
            self.placement.items_of_site,
            tuple(self.groups),
            self.placement.kind,
            self.placement.band,
            self.placement.splits,
            self.placement.multicast,
        )
        return SpatialProgram(
            self.name,
            self.target,
            Tile(TILE, TILE),
            self.precision,
            tuple(self.tensors),
            tuple(self.stages),
            tuple(self.buffers),
            tuple(self.semaphores),
            tuple(self.plans),
            placement,
            Schedule(tuple(sorted(self.programs, key=lambda q: (int(q.site), rank[q.engine])))),
        )


# ---- errors at the user's lines --------------------------------------------------------------------------------


def located(
    error: SpatialError,
    lines: dict[tuple[int, str], list[tuple[ChoreoOp, tuple[str, int]]]],
    p,
    declared: dict[str, tuple[str, int]] | None = None,
    blocked: tuple[tuple[int, str, str], ...] = (),
    names: dict[str, str] | None = None,
) -> Exception:
    """`error` (from verify, the interpreter or the emulation) with the user's lines of the ops it names appended —
    or, for an error about the plan or the placement rather than an op, the line that declared it — as the same
    kind of error. `blocked`: (site, engine, op text) of ops an error names only in its words (an emulation hang);
    `names`: the user's names of loop variables the IR numbers ("lv7" → "h"), put back in the message."""
    found: list[str] = []
    where: dict[tuple[int, str], tuple[str, int]] = {}

    def lines_of(site: int | None, engine: str | None, text: str | None) -> None:
        for (s, e), ops in lines.items():
            if (site is not None and s != site) or (engine is not None and e != engine):
                continue
            for op, (file, line) in ops:
                if text is None or op_text(p, op) == text:
                    found.append(f"{file}:{line}: site {s} {e}: {op_text(p, op)}")
                    where.setdefault((s, e), (file, line))

    for site, engine, text in blocked:
        lines_of(site, engine, text)
    if isinstance(error, DeadlockError):
        for site, engine, text in error.blocked:
            lines_of(site, engine, text)
    elif isinstance(error, VerifyRuleError):
        if error.op is not None:
            lines_of(error.site, error.engine, error.op)
        for site, engine, text in error.related:
            lines_of(site, engine, text)
    if not found:
        text = str(error).lower()
        named = [w for w in (declared or {}) if re.search(rf"\b{re.escape(w)}\b", text)]  # the most precise first
        if "placement" in named and len(named) > 1:
            named.remove("placement")  # a group's or a stage's own line says more than the placement's
        if not named and "placement" in (declared or {}) and "site" in text and "item" in text:
            named = ["placement"]
        for what in named:
            file, line = (declared or {})[what]
            found.append(f"{file}:{line}: the {what}")

    def named(text: str) -> str:
        return re.sub(r"\blv\d+\b", lambda m: (names or {}).get(m[0], m[0]), text)

    found = [named(f) for f in dict.fromkeys(found)]
    message = "\n".join([named(str(error)), *(f"  {f}" for f in found)])
    if message == str(error):
        return error
    if isinstance(error, DeadlockError):
        out: Exception = type(error)(message, error.blocked)
    elif isinstance(error, VerifyRuleError):
        out = type(error)(
            message, site=error.site, engine=error.engine, op=error.op, buffer=error.buffer, related=error.related
        )
    elif hasattr(error, "stderr"):  # the emulation's: the run's own output and status kept
        out = type(error)(message, stderr=error.stderr, status=error.status)  # type: ignore[call-arg, attr-defined]
    else:
        out = type(error)(message)
    out.lines = found  # type: ignore[attr-defined]
    out.where = where  # type: ignore[attr-defined]  # (site, engine) → its op's file and line: deadlock.svg names them
    return out

"""The embedded language's builder: a spatial program declared and its engines traced, in Python, into the IR.

A program is a Python function decorated with `spatialc.lang.program`. It receives a `Builder` and declares, in
order, the tensors, the rings, accumulators and semaphores, the stages (what the program computes: what verify's
rule 8 proves the engines compute), the plan and where the items go; then it writes each engine as a function of
an `Engine` context. An engine function runs once per site at trace time: Python values (the site, `range`, `if`)
are compile-time and unroll; `engine.range(n)` and `engine.items()` become IR loops whose variables are symbolic
(`Affine`), so tile addresses such as `8 * item.y + 4 * k` become the IR's affine `TileAddr`s.

Every op recorded remembers the line of the user's file that made it (`Traced.lines`), so that a refusal made while
tracing, and any error `verify` raises about an op, name the user's file and line (`located`).

Beside this module: the stage declarations (`stages.py`, a base of `Builder`), the engine context (`engine.py`),
symbolic addresses and the handles of what a program declares (`handles.py`), and the user's lines with the errors
that name them (`lines.py`).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Set as AbstractSet
from typing import Any

from ..arguments import PRECISIONS_ACCEPTED, precision_named
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
    TensorId,
)
from ..ir.nodes import (
    Accumulator,
    Buffer,
    DType,
    EngineProgram,
    Fifo,
    Group,
    Interm,
    PageLayout,
    Placement,
    Plan,
    Schedule,
    Semaphore,
    SpatialProgram,
    Stage,
    Tensor,
    TensorRole,
    Tile,
    TileOrder,
)
from ..ir.nodes import Engine as IREngine
from ..ir.ops import (
    BlockShape,
    ChoreoOp,
    Loop,
    Precision,
)
from .engine import Engine
from .handles import AccRef, GroupRef, RingRef, SemRef, TensorRef, expect, named, traced, whole
from .lines import LangError, refuse, user_line
from .stages import StageDeclarations

TILE = 16  # elements a tile side: the IR's unit
FREE_LOOP_VARS = 1 + max(LOOP_VAR_NAMES)  # the first loop variable with no fixed meaning (ir.ids): a user's loop's
LOOP_VARS_END = 10_000  # past the loop variables a program's named and unnamed loops take (a program names fewer)
PLACEMENT_KINDS = ("contiguous", "round_robin", "grouped", "hilbert", "split", "split_tail", "multicast")  # builds'


def checked(target: str, precision: str) -> Precision:
    """The program's precision, after its target and precision are shown to be ones spatialc knows."""
    from ..target import TARGETS

    if target not in TARGETS:
        raise refuse(f"target {target!r} ({', '.join(TARGETS)})")
    prec = precision_named(precision)
    if prec is None:
        raise refuse(f"precision {precision!r} ({PRECISIONS_ACCEPTED})")
    return prec


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


# ---- the builder ---------------------------------------------------------------------------------------------


class Builder(StageDeclarations):
    """What a program function is given: it declares the program and traces its engines."""

    def __init__(self, name: str, target: str, precision: str):
        self.precision = checked(target, precision)
        named("program", name)
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
        self.vars: dict[str, LoopVar] = {}  # each loop name's variable
        self.named_vars: set[int] = set()  # their numbers, and the least number from FREE_LOOP_VARS no name has
        self.first_free = FREE_LOOP_VARS
        self.held: dict[tuple[BufferId, bool], int] = {}  # pages the engine being traced holds, by ring and side
        self.pushed: set[BufferId] = set()  # rings the engine being traced has pushed a page of, so far
        self.acquired: set[BufferId] = set()  # accumulators it holds acquired, so far
        self.declared: dict[str, tuple[str, int]] = {}  # the user's line of the plan, placement, stages, groups
        # What the engines traced so far fill rings with, for the maps no stage declares: the accumulators rows are
        # reduced into, the accumulators packed into each ring, and the rings maps of row vectors alone fill.
        self.row_accs: set[BufferId] = set()
        self.packed: dict[BufferId, set[BufferId]] = {}
        self.vector_maps: set[BufferId] = set()

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
        named("tensor", name)
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
        self.declared[f"tensor {name}"] = user_line()  # an error about the tensor (its type, its shape) names it so
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
        named("buffer", name)
        if any(b.name == name for b in self.buffers):
            raise refuse(f"a second buffer named {name!r}")
        b = Buffer(BufferId(len(self.buffers)), name, kind)
        self.buffers.append(b)
        return b

    def semaphore(self, name: str, initial: int = 0, number: int | None = None) -> SemRef:
        """A count each site keeps a copy of (`SemInc` raises another site's, `SemWait` waits on its own); numbered
        1, 2, … in declaration order unless `number` says."""
        n = len(self.semaphores) + 1 if number is None else number
        named("semaphore", name)
        if any(x.name == name for x in self.semaphores):
            raise refuse(f"a second semaphore named {name!r}")
        if any(int(x.id) == n for x in self.semaphores):
            raise refuse(f"a second semaphore numbered {n}")
        s = Semaphore(SemId(n), name, initial)
        self.semaphores.append(s)
        return SemRef(self, s.id, name)

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
        tail: int = 0,
    ) -> None:
        """Which items each site runs: `items_of_site[s]` for site s (`kind`, `band`: the placement rule they
        follow, ir/worklist.py, which lets a launch spread them over the device's sites; any other list runs as
        listed). `multicast` (gy, gx): the sites form groups of gy × gx that share pages (kind "multicast"; the
        kernels run each group as a thread-block cluster). `splits` S (kind "split"): each item is on S sites, each
        reducing a part of K (split-K); with a `tail` T (kind "split_tail"), only the last T items of the grid are,
        each as the last item of its S sites."""
        if not isinstance(items_of_site, list | tuple) or not all(isinstance(i, list | tuple) for i in items_of_site):
            raise refuse(f"p.place takes a list of each site's item list, not {items_of_site!r}")
        if not isinstance(kind, str) or kind not in PLACEMENT_KINDS:
            raise refuse(f"a placement of kind {kind!r} ({', '.join(PLACEMENT_KINDS)})")
        listed = tuple((Site(s), tuple(ItemId(i) for i in items)) for s, items in enumerate(items_of_site))
        self.placement = Placement(listed, (), kind, band, splits, tuple(multicast), tail)  # type: ignore[arg-type]
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
        return self.tensors[int(expect(tensor, TensorRef, "the tensor").id)].tiles[1]

    def loop_var(self, name: str | None, enclosing: AbstractSet[LoopVar] = frozenset()) -> LoopVar:
        """The loop variable a loop named `name` binds: "k", "sh", "sw", "row" have their fixed meanings (ir.ids);
        "lv<n>" is variable n; any other name a variable of its own, from FREE_LOOP_VARS up, and no name the first
        variable from there that no name has and no `enclosing` loop binds (a later unnamed loop may take it
        again: handles.Unnamed)."""
        fixed = {n: v for v, n in LOOP_VAR_NAMES.items() if v not in (LV_ITEM, LV_ITEM_Y, LV_ITEM_X)}
        if name in fixed:
            return fixed[name]
        numbered = re.fullmatch(r"lv(\d+)", name or "")
        if numbered and int(numbered[1]) >= FREE_LOOP_VARS:
            return LoopVar(int(numbered[1]))
        if name is not None and name in self.vars:
            return self.vars[name]
        v = self.first_free
        while v in self.named_vars or LoopVar(v) in enclosing:  # (steps past the enclosing loops only)
            v += 1
        if v >= LOOP_VARS_END:
            raise refuse(
                f"a loop {'named ' + repr(name) if name is not None else 'with no name'} past the"
                f" {LOOP_VARS_END - FREE_LOOP_VARS} loop variables a program's loops may take"
                f" ({len(self.vars)} loop names so far): reuse a loop's name where its loops do not nest"
            )
        if name is not None:
            self.vars[name] = LoopVar(v)
            self.named_vars.add(v)
            while self.first_free in self.named_vars:
                self.first_free += 1
        return LoopVar(v)

    # -- engines --

    def engine_fn(self, name: str, sites: list[int] | None, fn: Any) -> Any:
        """Trace `fn(engine)` for each site (all placed sites by default) as its `name` engine's program."""
        try:
            engine = IREngine(name)
        except ValueError:
            raise refuse(f"engine {name!r} ({', '.join(e.value for e in IREngine)})") from None
        if self.placement is None:
            raise refuse("the engines are traced after the items are placed (builder.place)")
        if not_plain := lazy_body(fn):
            raise refuse(f"engine function {getattr(fn, '__name__', name)!r} is {not_plain}")
        for site in sites if sites is not None else [int(s) for s, _ in self.placement.items_of_site]:
            if (site, engine.value) in self.lines:
                raise refuse(f"a second {engine.value} engine for site {site} (each site has one of each)")
            self.engine = (site, engine.value)
            self.lines[self.engine] = []
            self.held, self.pushed, self.acquired = {}, set(), set()
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
        self.emit(Loop(loop.var, loop.count, tuple(body), loop.first))

    def emit(self, op: ChoreoOp) -> None:
        here = traced()
        if here is not None and here is not self:
            raise refuse(
                f"{type(op).__name__} by a handle of another program ({self.name}) while {here.name} is traced: a"
                " handle is used only in the program that declared it"
            )
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
        placement = dataclasses.replace(self.placement, groups=tuple(self.groups))
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


def lazy_body(fn: Any) -> str | None:
    """What makes `fn` unfit to trace, or None: a generator's or a coroutine's body does not run when it is called,
    so tracing one would record nothing (a program function or an engine function must be a plain `def`)."""
    if inspect.isasyncgenfunction(fn) or inspect.iscoroutinefunction(fn):
        return "an async function: its body does not run when it is called (write a plain `def`)"
    if inspect.isgeneratorfunction(fn):
        return "a generator (it has `yield`): its body does not run when it is called (write a plain `def`)"
    return None

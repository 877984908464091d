"""An engine of a traced program: the context an engine function writes its ops through, once per site."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..ir.ids import (
    LV_ITEM,
    LoopVar,
    Site,
    loop_var_name,
)
from ..ir.nodes import Engine as IREngine
from ..ir.ops import (
    Barrier,
    Col,
    ColReduce,
    Compute,
    ComputeOp,
    Const,
    Dequant,
    Expr,
    Loop,
    Map,
    MatmulTiles,
    McastSetValid,
    Pos,
    ReadBarrier,
    RowReduce,
    SemInc,
    SemSet,
    SemWait,
    Span,
    TileAddr,
    Trip,
    VecAxis,
    WriteBarrier,
    with_cols,
    with_row_args,
)
from .handles import (
    Affine,
    GroupRef,
    Item,
    Page,
    SemRef,
    StageRef,
    TensorRef,
    Unnamed,
    address,
    expect,
    var,
    whole,
)
from .lines import refuse, user_line
from .maps import formula, with_positions

if TYPE_CHECKING:
    from .builder import Builder


class Engine:
    """What an engine function is given: its `site`, its items and loops, and the ops that are not a ring's."""

    def __init__(self, builder: Builder, site: int, name: IREngine):
        self.builder, self.site, self.name = builder, site, name
        self.used: set[LoopVar] = set()

    @property
    def item(self) -> Item:
        """The site's only item (no loop: a site with one item)."""
        return Item()

    def items(self, first: int = 0, count: int | None = None) -> Iterator[Item]:
        """The site's items, one after another (the IR's ITEM loop): `count` of them (default: the rest) from its
        `first` on — a split tail's site runs its whole items, then its last apart (`e.items(n, 1)`)."""
        held = len(self.builder.items_of(self.site))
        if any(isinstance(x, bool) or not isinstance(x, int) for x in (first, held if count is None else count)):
            raise refuse(f"e.items takes whole numbers, not {first!r}, {count!r}")
        n = held - first if count is None else count
        if first < 0 or n < 0 or first + n > held:
            raise refuse(f"e.items({first}, {count}): site {self.site} holds {held} item(s)")
        yield from self._loop_of(LV_ITEM, n, Item(), first)

    def range(self, n: int, name: str | None = None) -> Iterator[Affine]:
        """An engine loop of `n` steps, its index symbolic (`name` "k" is the reduction's K loop; others are the
        loops listings name "lv<n>")."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise refuse(f"an engine loop runs a whole number of times, not {n!r}")
        yield from self._loop(name, n)

    def range_from(
        self, tensor: TensorRef, element: Affine | int, bound: int, per: int = 1, name: str | None = None
    ) -> Iterator[Affine]:
        """A loop counted at run time: ceil(v / `per`) steps for v the int32 `element` (a flat index, which may
        name loop variables and item coordinates) of the parameter `tensor`, at most `bound` — a grouped GEMM's
        blocks of `per` rows, v its group's row count. Its index is symbolic, as `range`'s."""
        if any(isinstance(x, bool) or not isinstance(x, int) for x in (bound, per)) or bound < 0 or per < 1:
            raise refuse(f"a loop counted at run time has a whole bound ≥ 0 and rows per step ≥ 1, not {bound}, {per}")
        expect(tensor, TensorRef, "the tensor a loop's count is read from")
        at = address(element)
        yield from self._loop(name, Trip(tensor.id, at.base, bound, per, at.steps))

    def range_span(self, value: Affine | int, per: int, bound: int, name: str | None = None) -> Iterator[Affine]:
        """A loop whose count each item knows: min(`bound`, ceil(v / `per`)) steps (none where v ≤ 0) for v the
        address `value` over the item's coordinates — a causal attention's KV blocks at or left of its band's
        diagonal, v the band's last visible key + 1 and `per` the keys of a block. Its index is symbolic, as
        `range`'s."""
        if any(isinstance(x, bool) or not isinstance(x, int) for x in (bound, per)) or bound < 0 or per < 1:
            raise refuse(f"a loop counted per item has a whole bound ≥ 0 and a step ≥ 1, not {bound}, {per}")
        at = address(value)
        yield from self._loop(name, Span(at.base, per, bound, at.steps))

    def _loop(self, name: str | None, n: int | Trip | Span) -> Iterator[Affine]:
        """A loop named `name` (or none: handles.Unnamed) of `n` steps, its index symbolic."""
        v = self.builder.loop_var(name, self.used)
        unnamed = Unnamed(v, user_line()) if name is None else None
        yield from self._loop_of(v, n, var(v, unnamed), name=name)
        if unnamed is not None:
            unnamed.open = False

    def _loop_of(
        self, v: LoopVar, n: int | Trip | Span, value: Any, first: int = 0, name: str | None = None
    ) -> Iterator[Any]:
        if v in self.used:
            called = f"loop {name}" if name is not None and name != loop_var_name(v) else "loop"
            raise refuse(f"{called} (variable {loop_var_name(v)}) inside a loop of the same variable")
        self.used.add(v)
        body = self.builder.open()
        yield value
        self.builder.close(body, Loop(v, n if isinstance(n, Trip | Span) else Const(n), (), first))
        self.used.discard(v)

    def barrier(self, group: GroupRef) -> None:
        """Until every site of `group` has arrived here."""
        self.builder.emit(Barrier(expect(group, GroupRef, "what a barrier waits for").id))

    def compute(self, stage: StageRef | ComputeOp, src: Page | Sequence[Page], dst: Page) -> None:
        """Elementwise `stage` from the waited page `src` (a list of pages: a Map of several) into the reserved page
        `dst` — or the op given itself (a Map of the elementwise table, ir.ops; a column vector names the tile
        columns of the page at hand: `ir.ops.bias(tensor, at, width)`; a Dequant's `rows` and `cols` the tile row
        and column of the weights its page holds, which may name loop variables too)."""
        op = stage.op if isinstance(stage, StageRef) else stage
        if isinstance(op, RowReduce | ColReduce):
            axis = "rows" if isinstance(op, RowReduce) else "columns"
            raise refuse(f"{getattr(stage, 'name', 'a reduction')} folds {axis} into an accumulator: acc.reduce(…)")
        if op is None or isinstance(op, MatmulTiles) or not dataclasses.is_dataclass(op):
            raise refuse(f"{getattr(stage, 'name', op)!s} is not an elementwise stage or op (relu(), bias(...), …)")
        if isinstance(op, Map):  # a column vector's tile column may name loop variables
            op = Map(with_cols(op.expr, lambda c: c if isinstance(c.at, TileAddr) else replace(c, at=address(c.at))))
        if isinstance(op, Dequant):  # so may a dequant's tile row (the K step's) and tile column (the item's)
            rows, cols = (x if isinstance(x, TileAddr) else address(x) for x in (op.rows, op.cols))
            op = replace(op, rows=rows, cols=cols)
        srcs = tuple(src) if isinstance(src, list | tuple) else (src,)
        for s in srcs:
            expect(s, Page, "what an elementwise op reads")
            s._need(False, "read")
        expect(dst, Page, "what an elementwise op writes")
        dst._need(True, "write")
        self.builder.emit(Compute(op, tuple(s.ring.id for s in srcs), (dst.ring.id,)))

    def map(
        self,
        stage: StageRef | Any,
        src: Page | Sequence[Page],
        dst: Page,
        at: Affine | int = 0,
        width: int | None = None,
        row: Affine | int = 0,
    ) -> None:
        """Map `stage` (p.map) of the waited pages `src`, one of each of its rings in its order, into the reserved
        page `dst` — or a map no stage declares, given as p.map takes a formula (`lambda x, m: ew.exp(x - m)`: a step
        of a declared stage the engines expand, as attention's). The pages hold rows of `width` tiles (by default all
        of dst's: one tile row) whose first is tile column `at` of the tensors' rows: where a column vector
        (`ew.col`) is read and where `ew.col_index()` counts from; their first row is tile row `row` of the
        tensors: where a row vector (`ew.row`) is read and `ew.row_index()` counts from. A ring a row reduction
        fills, or a row accumulator is packed into, gives each row its value."""
        srcs = tuple(src) if isinstance(src, list | tuple) else (src,)
        named = stage.name if isinstance(stage, StageRef) else f"into {dst.ring.name if isinstance(dst, Page) else '?'}"
        for s in srcs:
            expect(s, Page, f"what map {named} reads")
            s._need(False, "map")
        expect(dst, Page, f"what map {named} fills")
        dst._need(True, "map into")
        declared = self._declared_map(stage, srcs, dst)
        w = dst.ring.tiles if width is None else whole(width, "the tiles a row of the pages holds")
        col_at, row_at = address(at), address(row)

        def placed(c: Col) -> Col:
            return Col(c.tensor, row_at if c.axis == VecAxis.ROW else col_at, w, c.axis)

        def counted(q: Pos) -> Pos:
            return Pos(q.axis, row_at if q.axis == VecAxis.ROW else col_at, w)

        expr = with_row_args(with_positions(with_cols(declared, placed), counted), w)
        self.builder.emit(Compute(Map(expr), tuple(s.ring.id for s in srcs), (dst.ring.id,)))

    def _declared_map(self, stage: StageRef | Any, srcs: tuple[Page, ...], dst: Page) -> Expr:
        """The formula `map` places: its stage's (whose rings the pages must be), or the one given, each input a row
        vector where the builder has seen its ring filled with them."""
        if not isinstance(stage, StageRef):
            b = self.builder
            vectors = b.row_vectors()
            expr = formula(b, f"into {dst.ring.name}", stage, [s.ring for s in srcs], vectors)
            if all(s.ring.id in vectors for s in srcs):  # a map of row vectors alone is one (α = exp(m − m′))
                b.vector_maps.add(dst.ring.id)
            return expr
        if not isinstance(stage.op, Map):
            raise refuse(f"stage {stage.name} is not a map (p.map)")
        declared = self.builder.stage(stage)
        if tuple(s.ring.id for s in srcs) != declared.ins or (dst.ring.id,) != declared.outs:
            names = ", ".join(self.builder.buffer_name(x) for x in declared.ins)
            given = ", ".join(s.ring.name for s in srcs)
            raise refuse(
                f"stage {stage.name} maps pages of {names} into {self.builder.buffer_name(declared.outs[0])}; these"
                f" are of {given} into {dst.ring.name}"
            )
        return stage.op.expr

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

"""Rule 8 for a program that reduces columns (`spatialc.col_reduce`): what its stages declare, and the proof that its
schedule computes it.

Declared: out (1 × n) = the maps, in order, of `op` over each column of x (m × n), its padding rows left out — a read
of x, one ColReduce of its ring over x's m rows, maps of that vector alone, and one write of the last.

The proof, for each site, each of its items (a band of tile columns) taken by its coordinates, the loops inside a band
left as symbols: the band's column accumulator is acquired before its reduction and packed after it; the one ColReduce
reduces, page by page, the pages the reader reads into its ring (the n-th page read is the n-th reduced: rules 3–5
showed the ring single-producer, single-consumer and balanced, and the two loop nests around them are matched here
loop for loop); each page lies at the band's columns, and at the tile row the ColReduce says (so that its padding rows
are the ones left out); the page rows over the loops run one to one over 0..N−1 with N at least x's rows of tiles
(a mixed-radix check of their coefficients: every row page of the band reduced exactly once); the packed vector
reaches the write through the declared maps, one each; and the write stores it at the band's own columns of the
output's one tile row. Over all items, every tile column of the output is written exactly once.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId
from ...ir.index import ProgramIndex
from ...ir.nodes import ComputeStage, DType, Engine, EngineProgram, ReadStage, Stage, TensorRole, WriteStage
from ...ir.ops import (
    AcquireAcc,
    ChoreoOp,
    ColReduce,
    Compute,
    Const,
    Loop,
    Map,
    PackAcc,
    Precision,
    ReadTiles,
    WriteTiles,
    arg_indices,
    cols,
    row_args,
)
from ...ir.printer import addr_text
from .dataflow import Declared
from .declared_checks import _unsure
from .facts import Programs

UNSURE = StrongerCheckNeeded  # (a fault the rule cannot follow, as against one it refutes)


def is_col_declared(p) -> bool:
    """Whether the stages reduce columns (a ColReduce): `_declared_col_outputs` states them."""
    return any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, ColReduce) for s in p.stages)


def _declared_col_outputs(index: ProgramIndex) -> tuple[Declared, ...]:
    """The one output of a column program: out = maps(op over each column of x), or SemanticError saying how the
    stages differ from that."""
    p = index.p
    if p.precision == Precision.INT8:
        raise _unsure("an int8 program that reduces columns (column reductions are float arithmetic here)")
    stages = {s.id: s for s in p.stages}
    producer: dict[BufferId, Stage] = {}
    for s in p.stages:
        for b in s.outs:
            if producer.setdefault(index.ring(b), s) is not s:
                raise _unsure(f"stages {producer[index.ring(b)].name} and {s.name} both fill {index.name(b)}")
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage)]
    if len(writes) != 1 or len(writes[0].ins) != 1:
        raise _unsure(f"{len(writes)} write stages (a column program's one write empties one ring)")
    write = writes[0]
    out = index.tensors[write.kind.tensor]  # type: ignore[union-attr]
    if out.role != TensorRole.OUTPUT:
        raise SemanticError(f"write stage {write.name} writes {out.name}, which is no output of the program")
    chain: list[Stage] = []
    ring = index.ring(write.ins[0])
    while True:
        found = producer.get(ring)
        if found is None or not isinstance(found.kind, ComputeStage):
            raise _unsure(f"{index.name(ring)} is filled by no column reduction, nor a map of one")
        s, kind = found, found.kind.op
        chain.insert(0, s)
        if isinstance(kind, ColReduce):
            break
        if not isinstance(kind, Map) or len(s.ins) != 1 or not _vector_map(kind):
            raise SemanticError(
                f"stage {s.name} stands between the column reduction and {write.name}: only maps of the reduced vector"
                " alone (x0, element by element) may"
            )
        ring = index.ring(s.ins[0])
    reduce = chain[0]
    op = reduce.kind.op  # type: ignore[union-attr]
    assert isinstance(op, ColReduce)
    read = producer.get(index.ring(reduce.ins[0])) if len(reduce.ins) == 1 else None
    if read is None or not isinstance(read.kind, ReadStage):
        raise _unsure(f"stage {reduce.name} reduces a ring no read stage fills")
    x = index.tensors[read.kind.tensor]
    if x.dtype != DType(p.precision.value) or x.groups != 1:
        raise SemanticError(
            f"stage {read.name} reads {x.name} ({x.dtype.value}); the program's inputs hold {p.precision.value}"
        )
    if op.rows != x.elems[0]:
        raise SemanticError(
            f"stage {reduce.name} reduces columns of {op.rows} values, but {x.name}'s columns hold {x.elems[0]}: a"
            " reduction covers each column's values, and no padding"
        )
    if out.elems != (1, x.elems[1]):
        raise SemanticError(
            f"{write.name} writes {out.name} ({out.elems[0]}x{out.elems[1]}) from a column vector of {x.name}'s"
            f" {x.elems[1]} columns: its output is 1x{x.elems[1]}"
        )
    if out.dtype not in (DType.FLOAT32, DType.FP16, DType.BF16):
        raise SemanticError(f"a column program computes float32 values; its output {out.name} holds {out.dtype.value}")
    used = {read.id, write.id, *(s.id for s in chain)}
    extra = [s.name for s in stages.values() if s.id not in used]
    if extra:
        raise SemanticError(f"stage {extra[0]} is not on the way from the inputs to the output")
    last = index.ring(write.ins[0])
    return (Declared(out, last, producer, tuple(chain), rows=True, vector=True, used=frozenset(used)),)


def _vector_map(op: Map) -> bool:
    """A map of one page element by element, nothing else read (Σ / m)."""
    return set(arg_indices(op.expr)) <= {0} and not row_args(op.expr) and not cols(op.expr)


# ---- the proof ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    """A leaf op of an item's body and the loops around it (innermost last)."""

    op: ChoreoOp
    loops: tuple[Loop, ...]
    top: int  # the index of the item body's top-level op it is in


def _leaves(ops: tuple[ChoreoOp, ...]) -> list[_Found]:
    found: list[_Found] = []

    def walk(body: tuple[ChoreoOp, ...], loops: tuple[Loop, ...], top: int | None) -> None:
        for i, op in enumerate(body):
            at = i if top is None else top
            if isinstance(op, Loop):
                walk(op.body, (*loops, op), at)
            else:
                found.append(_Found(op, loops, at))

    walk(ops, (), None)
    return found


class _Band:
    """One site's programs read as a column band's: `check(item_y, item_x)` proves an item and says the tile columns
    it writes."""

    def __init__(self, index: ProgramIndex, decl: Declared, progs: list[EngineProgram], items: int) -> None:
        self.index, self.decl = index, decl
        self.progs = {q.engine: q for q in progs}
        self.bodies = {e: self._body(q, items) for e, q in self.progs.items()}
        p = index.p
        self.reduce_stage = decl.chain[0]
        self.op: ColReduce = self.reduce_stage.kind.op  # type: ignore[union-attr, assignment]
        (x_ring,) = self.reduce_stage.ins
        self.x_ring = index.ring(x_ring)
        self.x = index.tensors[decl.producer[self.x_ring].kind.tensor]  # type: ignore[union-attr]
        self.tile = p.tile
        self.read = self._one(Engine.READER, lambda o: isinstance(o, ReadTiles) and index.ring(o.into) == self.x_ring)
        self.fold = self._one(
            Engine.COMPUTE, lambda o: isinstance(o, Compute) and o.ins and index.ring(o.ins[0]) == self.x_ring
        )
        self.store = self._one(Engine.WRITER, lambda o: isinstance(o, WriteTiles) and index.ring(o.src) == decl.last)
        self._episode()
        self._chain()
        self.rows = self._rows()

    # -- where it fails

    def fail(self, engine: Engine, op: ChoreoOp, why: str, cls: type = SemanticError) -> Exception:
        return self.index.at_op(cls, self.progs[engine], op, why)

    def _body(self, q: EngineProgram, items: int) -> tuple[ChoreoOp, ...]:
        """The ops one item runs: an ITEM loop's body, or the program itself (one item, or none)."""
        if len(q.ops) == 1 and isinstance(q.ops[0], Loop) and q.ops[0].var == LV_ITEM:
            return q.ops[0].body
        if items > 1:
            raise StrongerCheckNeeded("a column program's engines run their items in one ITEM loop", site=int(q.site))
        return q.ops

    def _one(self, engine: Engine, pred) -> _Found:
        q = self.progs.get(engine)
        found = [f for f in _leaves(self.bodies.get(engine, ())) if pred(f.op)]
        if q is None or len(found) != 1:
            what = {Engine.READER: "reads x", Engine.COMPUTE: "reduces x", Engine.WRITER: "writes the output"}[engine]
            raise StrongerCheckNeeded(
                f"a column program's {engine.value} {what} once an item ({len(found)} ops do); the semantic rule"
                " follows that one",
                site=None if q is None else int(q.site),
                engine=engine.value,
            )
        for loop in found[0].loops:
            if not isinstance(loop.count, Const) or loop.first:
                raise self.fail(
                    engine,
                    found[0].op,
                    "a loop counted at run time; the rule follows constant loops",
                    StrongerCheckNeeded,
                )
        return found[0]

    # -- the accumulator, the maps

    def _episode(self) -> None:
        """The fold is the stage's reduction into an accumulator acquired before its loops and packed after them."""
        f = self.fold
        op = f.op
        assert isinstance(op, Compute)
        if not isinstance(op.op, ColReduce) or op.acc is None:
            raise self.fail(Engine.COMPUTE, op, f"stage {self.reduce_stage.name} declares a column reduction here")
        if op.op.op != self.op.op or op.op.rows != self.op.rows:
            raise self.fail(
                Engine.COMPUTE,
                op,
                f"stage {self.reduce_stage.name} declares a column {self.op.op} of {self.op.rows} rows; this op runs a"
                f" column {op.op.op} of {op.op.rows}",
            )
        body = self.bodies[Engine.COMPUTE]
        acquired = [i for i, o in enumerate(body) if isinstance(o, AcquireAcc) and o.buf == op.acc]
        packs = [i for i, o in enumerate(body) if isinstance(o, PackAcc) and o.acc == op.acc]
        if len(acquired) != 1 or len(packs) != 1 or not acquired[0] < f.top < packs[0]:
            raise self.fail(
                Engine.COMPUTE,
                op,
                f"{self.index.name(op.acc)} is acquired once before the band's reduction and packed once after it",
            )
        pack = body[packs[0]]
        assert isinstance(pack, PackAcc)
        (vector,) = self.reduce_stage.outs
        if self.index.ring(pack.to) != self.index.ring(vector) or pack.tiles != op.op.width or pack.accumulate:
            raise self.fail(
                Engine.COMPUTE,
                pack,
                f"the band's {op.op.width} column tiles are packed, whole, into stage {self.reduce_stage.name}'s"
                f" {self.index.name(vector)}",
            )
        self.pack_at = packs[0]

    def _chain(self) -> None:
        """Each declared map runs once an item, on the vector before it, after the pack, in order."""
        body = self.bodies[Engine.COMPUTE]
        at = self.pack_at
        for s in self.decl.chain[1:]:
            (src,), (dst,) = s.ins, s.outs
            hits = [
                i
                for i, o in enumerate(body)
                if isinstance(o, Compute) and tuple(map(self.index.ring, o.outs)) == (self.index.ring(dst),)
            ]
            if len(hits) != 1 or hits[0] < at:
                raise StrongerCheckNeeded(
                    f"stage {s.name}'s map runs once an item, after the pack; the rule follows that",
                    site=int(self.progs[Engine.COMPUTE].site),
                )
            op = body[hits[0]]
            assert isinstance(op, Compute)
            declared = s.kind.op  # type: ignore[union-attr]
            if op.op != declared or tuple(map(self.index.ring, op.ins)) != (self.index.ring(src),):
                said = self.index.op(Compute(declared, s.ins, s.outs))
                raise self.fail(Engine.COMPUTE, op, f"stage {s.name} declares {said}")
            at = hits[0]

    # -- the rows

    def _rows(self) -> tuple[list[tuple[int, int]], int]:
        """The page rows' terms over the loops (coefficient, count), shown one to one onto 0..N−1, and N."""
        read, fold = self.read.op, self.fold.op
        assert isinstance(read, ReadTiles) and isinstance(fold, Compute) and isinstance(fold.op, ColReduce)
        c_t = self.x.tiles[1]
        if read.stride_h != c_t or read.stride_w != 1 or read.block_w != fold.op.width:
            raise self.fail(
                Engine.READER,
                read,
                f"a page of the band is {read.block_h} whole rows of the ColReduce's {fold.op.width} tiles of"
                f" {self.x.name}'s rows ({c_t} tiles)",
                StrongerCheckNeeded,
            )
        r_loops, c_loops = self.read.loops, self.fold.loops
        if [lp.count for lp in r_loops] != [lp.count for lp in c_loops]:
            raise self.fail(
                Engine.COMPUTE,
                fold,
                "the loops around it differ from those around the reader's pages; the rule matches them loop for loop",
                StrongerCheckNeeded,
            )
        terms: list[tuple[int, int]] = [(1, read.block_h)]
        steps = dict(read.at.steps)
        at_steps = dict(fold.op.at.steps)
        for r_loop, c_loop in zip(r_loops, c_loops, strict=True):
            stride = steps.pop(r_loop.var, 0)
            if stride % c_t:
                raise self.fail(
                    Engine.READER, read, "its pages move along the rows' columns in a loop", StrongerCheckNeeded
                )
            said = at_steps.pop(c_loop.var, 0)
            if said != stride // c_t:
                raise self.fail(
                    Engine.COMPUTE,
                    fold,
                    f"it says its pages move {said} tile rows a step (its page at {addr_text(fold.op.at)}), and"
                    f" the reader's move {stride // c_t}:"
                    " the padding rows it leaves out would not be the tensor's",
                )
            terms.append((stride // c_t, r_loop.count.n))  # type: ignore[union-attr]
        self.item_steps = steps  # what is left: the item's coordinates
        if set(steps) - {LV_ITEM_X, LV_ITEM_Y} or at_steps:
            raise self.fail(
                Engine.READER, read, "an address of a variable the rule does not follow", StrongerCheckNeeded
            )
        expected = 1
        for coef, count in sorted(t for t in terms if t[1] > 1 or t[0] == 1):
            if coef != expected:
                why = "reduced twice" if coef < expected else "skipped"
                raise self.fail(
                    Engine.READER,
                    read,
                    f"over the band's pages some row page of {self.x.name} is {why}: each row page of each column band"
                    " is reduced exactly once",
                )
            expected *= count
        need = math.ceil(self.x.elems[0] / self.tile.rows)
        if expected < need:
            raise self.fail(
                Engine.READER,
                read,
                f"the band's pages cover {expected} tile rows of {self.x.name}'s {need}: a row page is skipped",
            )
        return terms, expected

    # -- an item

    def check(self, iy: int, ix: int) -> range:
        """The item at (iy, ix): its pages at one band's columns from the first tile row, the reduction told where
        they lie, and its write at the same columns; the output's tile columns it writes."""
        read, fold, store = self.read.op, self.fold.op, self.store.op
        assert isinstance(read, ReadTiles) and isinstance(fold, Compute) and isinstance(store, WriteTiles)
        assert isinstance(fold.op, ColReduce)
        coords = {LV_ITEM_Y: iy, LV_ITEM_X: ix}
        flat = read.at.base + sum(s * coords[v] for v, s in self.item_steps.items())
        row0, col0 = divmod(flat, self.x.tiles[1])
        if fold.op.at.base != 0:
            raise self.fail(
                Engine.COMPUTE,
                fold,
                f"it says its first page is at tile row {fold.op.at.base} of {self.x.name} (its page at"
                f" {addr_text(fold.op.at)}), and the reader's band starts at tile row 0: the padding rows it leaves"
                " out would not be the tensor's",
            )
        if row0 != 0 or col0 + read.block_w > self.x.tiles[1]:
            raise self.fail(
                Engine.READER,
                read,
                f"item ({iy}, {ix})'s pages start at tile ({row0}, {col0}) of {self.x.name}: a band's pages start at"
                " its first tile row and lie inside its columns",
            )
        out = self.decl.out
        if self.store.loops:
            raise self.fail(Engine.WRITER, store, "the vector is written once an item", StrongerCheckNeeded)
        steps = dict(store.at.steps)
        if set(steps) - {LV_ITEM_X, LV_ITEM_Y}:
            raise self.fail(
                Engine.WRITER, store, "an address of a variable the rule does not follow", StrongerCheckNeeded
            )
        w_flat = store.at.base + sum(s * coords[v] for v, s in steps.items())
        w_row, w_col = divmod(w_flat, out.tiles[1])
        if (w_row, w_col, store.block_h, store.block_w, store.stride_w) != (0, col0, 1, read.block_w, 1):
            raise self.fail(
                Engine.WRITER,
                store,
                f"item ({iy}, {ix}) reduces {self.x.name}'s tile columns {col0}..{col0 + read.block_w - 1} and writes"
                f" {store.block_h}x{store.block_w} tiles of {out.name} at tile ({w_row}, {w_col}): a band's vector is"
                " written at its own columns of the output's one tile row",
            )
        return range(col0, col0 + read.block_w)


def _idle(index: ProgramIndex, progs: list[EngineProgram]) -> None:
    """A site that holds no band writes nothing (what it wrote would be no band's)."""
    for q in progs:
        for f in _leaves(q.ops):
            if isinstance(f.op, WriteTiles):
                raise index.at_op(SemanticError, q, f.op, "a site that holds no band writes nothing")


def check_col_semantics(index: ProgramIndex, programs: Programs) -> None:
    """Rule 8 for a column program: each site's items proved (`_Band.check`), then every tile column of the output
    written exactly once over them all."""
    p = index.p
    (decl,) = _declared_col_outputs(index)
    assert p.placement is not None and p.plan is not None
    items = dict(p.placement.items_of_site)
    nx = p.plan.grid[1]
    bands: dict[tuple[object, ...], _Band] = {}
    written: Counter[int] = Counter()
    for site, progs in programs.listed.items():
        its = items.get(site, ())
        if not its:  # a site with no band writes nothing
            _idle(index, progs)
            continue
        key = (programs.keys[site], len(its) > 1)
        if key not in bands:
            bands[key] = _Band(index, decl, progs, len(its))
        for it in its:
            written.update(bands[key].check(*divmod(int(it), nx)))
    need = math.ceil(decl.out.elems[1] / p.tile.cols)
    twice = sorted(c for c, n in written.items() if n > 1)
    if twice:
        raise SemanticError(f"tile column {twice[0]} of {decl.out.name} is written {written[twice[0]]} times; once is")
    missing = [c for c in range(need) if not written[c]]
    if missing:
        raise SemanticError(f"tile column {missing[0]} of {decl.out.name} is written by no item")


__all__ = ["check_col_semantics", "is_col_declared"]

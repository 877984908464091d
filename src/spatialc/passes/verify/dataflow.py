"""The semantic rule's run of a site's engines, once each, on formulas instead of data (verify's rule 8).

Each engine program is walked once. A loop's variable becomes a symbol over its iterations; item_y / item_x become
symbols over the grid; a page's value is a formula in its tile's row and column (`symbolic.Page`). ReadTiles fills
the newest reserved page with "tile (row, col) of T"; a tile matmul adds "Σ A-tile × B-tile" to its accumulator,
summed over the loops between its AcquireAcc and itself; PackAcc and the elementwise ops wrap the formula; every
Compute is checked against the stage that declares it. A page's position in its ring is an affine form in the loops
around the op (`Seq`), and a consumer reads the page whose producer position has the same form, loop for loop, its
symbols renamed to the consumer's. What is written where is collected for `semantics` to prove.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import BufferId, ItemId, Site, StageId, TensorId
from ...ir.index import ProgramIndex
from ...ir.nodes import EngineProgram, Stage, Tensor
from ...ir.ops import (
    Apply,
    ChoreoOp,
    Col,
    Compute,
    ComputeOp,
    Const,
    Dequant,
    Expr,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    Reserve,
    RowArg,
    RowReduce,
    TileAddr,
    Trip,
    WriteTiles,
)
from .blockscale import unplaced
from .facts import Side, SiteProgs
from .symbolic import PC, PR, Aff, Cell, Copy, Page, Partial, Product, RowTerm, Sym


@dataclass(frozen=True, slots=True)
class MatmulDecl:
    """One tile matmul stage on the way to C: the ring its accumulator is packed into, each operand's tensor (None:
    computed, by `chains[i]` applied to another matmul's result), its item geometry, and the k-tiles a reduction
    must cover (k_need ≤ N ≤ k_max, over `k_elems` elements)."""

    stage: Stage
    ring: BufferId
    operands: tuple[TensorId | None, TensorId | None]
    chains: tuple[tuple[Stage, ...], tuple[Stage, ...]]
    sources: tuple[StageId | None, StageId | None]  # the matmul each computed operand starts from
    shape: tuple[int, int, int]  # h, w, ibw in tiles
    k_need: int
    k_max: int
    k_elems: int
    value: tuple[tuple[int, int], tuple[int, int]]  # the result's elements and tile grid
    a_tiles: tuple[int, int]  # operand A's tile grid


@dataclass(frozen=True, slots=True)
class Declared:
    """What the stages say C is: the stage producing each ring, the ring the write stage empties, and for a GEMM
    the operand tensors, the matmul's item geometry and the range of k-tiles a reduction must cover."""

    out: Tensor
    last: BufferId
    producer: dict[BufferId, Stage]
    chain: tuple[Stage, ...] = ()  # the elementwise stages, in the order the rings run them (first applied first)
    a: TensorId | None = None
    b: TensorId | None = None
    matmul: Stage | None = None
    acc_shape: tuple[int, int, int] = (1, 1, 1)  # the matmul's h, w, ibw in tiles
    k_need: int = 0  # k-tiles holding K's elements; a reduction covers 0..N-1 with k_need ≤ N ≤ k_max
    k_max: int = 0
    acc_ring: BufferId | None = None  # the ring the matmul's result leaves by on its way to C
    split: SplitDecl | None = None  # split-K's partial path, where the stages declare one
    matmuls: dict[StageId, MatmulDecl] = field(default_factory=dict)  # every matmul on the way to C, by stage
    rows: bool = False  # a row program: `chain` is its maps and row reductions, each after what it reads
    vector: bool = False  # a row program's output of one value a row (m × 1), from a row vector
    row_tiles: int = 0  # a row program's rows, in tiles (as its reads are padded)
    others: frozenset[TensorId] = frozenset()  # the program's other outputs, each proved by its own Declared
    used: frozenset[StageId] = frozenset()  # a row program's stages on the way to this output


@dataclass(frozen=True, slots=True)
class SplitDecl:
    """Split-K's stages: the matmul also fills `out_ring`, which `write` empties into the workspace tensor `work`;
    `read` fills `in_ring` from it and `add` adds that to the accumulator (a partial sum of other k-tiles)."""

    work: TensorId
    out_ring: BufferId
    in_ring: BufferId
    write: Stage
    read: Stage
    add: Stage


def same_op(scheduled: ComputeOp, declared_op: ComputeOp) -> bool:
    """A scheduled compute op does what its stage declares (a column vector's address and width say where, checked
    apart)."""
    if isinstance(scheduled, Map) and isinstance(declared_op, Map):
        return _formula(scheduled.expr) == _formula(declared_op.expr)
    if isinstance(scheduled, Dequant) and isinstance(declared_op, Dequant):  # (its page's place: checked apart)
        at, here = TileAddr(0), dataclasses.replace(scheduled, rows=TileAddr(0), cols=TileAddr(0), width=1)
        return here == dataclasses.replace(declared_op, rows=at, cols=at, width=1)
    if isinstance(scheduled, MatmulTiles) and isinstance(declared_op, MatmulTiles):  # scales' places: rule 8's
        return unplaced(scheduled) == unplaced(declared_op)
    if isinstance(scheduled, RowReduce) and isinstance(declared_op, RowReduce):  # where a page lies: its terms'
        return (scheduled.op, scheduled.cols) == (declared_op.op, declared_op.cols)
    return scheduled == declared_op


def _formula(expr: Expr) -> object:
    """`expr` as a value equal only to the same formula's: column vectors by their tensor alone (their address and
    width are checked apart), constants and parameters by their bits — in Python 0.0 == -0.0, but x·0 and x·−0
    differ in sign, and 1/x of them by an infinity."""
    match expr:
        case Col(tensor, axis=axis):
            return (axis.value, tensor)
        case RowArg(index):
            return ("row", index)
        case Lit(value):
            return ("lit", float(value).hex())
        case Apply(op, args, params):
            return (op, tuple(_formula(a) for a in args), tuple(float(v).hex() for v in params))
    return expr


@dataclass(frozen=True, slots=True)
class Seq:
    """A page's position in its ring: Σ per·loop over the loops (outermost first) around the op, plus `const`."""

    levels: tuple[tuple[Sym, int, int], ...] = ()  # (the loop's symbol, its iterations, pages per iteration)
    const: int = 0

    def shifted(self, n: int) -> Seq:
        return Seq(self.levels, self.const + n)

    def inside(self, sym: Sym, n: int, per: int) -> Seq:
        return Seq((*self.levels, (sym, n, per)), self.const)

    def shape(self) -> tuple[object, ...]:
        return (tuple((n, per) for _, n, per in self.levels), self.const)

    def text(self) -> str:
        terms = [f"{per}·{sym.label}" if per != 1 else sym.label for sym, _, per in self.levels]
        return " + ".join([*terms, str(self.const)] if self.const or not terms else terms)


@dataclass
class Entry:
    """A page pushed into a ring: its position, its value (None: pushed without being filled), who pushed it."""

    seq: Seq
    page: Page | None
    engine: str
    push: ChoreoOp


@dataclass
class Acc:
    """An accumulator between AcquireAcc and ReleaseAcc: the loops open at its AcquireAcc, its products so far, the
    loops they are summed over, the matmul stage they are products of, and whether PackAcc has read it."""

    opened: tuple[object, ...]
    terms: list[Product | Partial] = field(default_factory=list)
    stage: MatmulDecl | None = None
    summed: dict[Sym, ChoreoOp] = field(default_factory=dict)
    packed: bool = False
    live: bool = True
    reduce: Stage | None = None  # a row accumulator: the row reduction stage its terms are, its rows a page
    row_terms: list[RowTerm] = field(default_factory=list)
    rows: int = 0


@dataclass(frozen=True, slots=True)
class Write:
    """One WriteTiles, followed: the tile of C (or of a workspace) it writes (row, col) and the formula it writes
    there."""

    op: WriteTiles
    head: str
    engine: str
    loops: tuple[Sym, ...]
    item: Sym | None
    row: Aff
    col: Aff
    cell: Cell
    block: tuple[Aff, Aff]
    trips: tuple[tuple[Trip, Aff, Sym | None], ...] = ()  # the loops around it counted at run time: (count, the
    # element of its tensor it reads, as a form; its symbol, None for a bound of 1)
    part: tuple[int, int] | None = None  # its ITEM loop's items, (first, count) of the site's; None: outside one

    def items(self, held: Sequence[ItemId]) -> Sequence[ItemId]:
        """Which of a site's items (`held`) it writes."""
        return held if self.part is None else held[self.part[0] : self.part[0] + self.part[1]]


class SiteRun:
    """Rule 8 for the programs of one site (and every site that runs the same ones)."""

    def __init__(
        self,
        index: ProgramIndex,
        decl: Declared,
        site: Site,
        progs: SiteProgs,
        items: tuple[ItemId, ...],
        witnesses: tuple[ItemId, ...],
    ) -> None:
        """`items`: the site's own; `witnesses`: a sample of the items of every site that runs the same programs."""
        self.index, self.decl, self.site, self.progs, self.items = index, decl, site, progs, items
        self.witnesses = witnesses
        plan = index.p.plan
        assert plan is not None
        # What placement distributes: items of a block each, or a grouped GEMM's strips (a group's rows, a block wide).
        self.grid, self.block = plan.placed, plan.placed_tiles
        self.ranges: dict[Sym, int] = {}
        self.pushed: dict[BufferId, list[Entry]] = {}
        self.writes: list[Write] = []  # of C
        self.partials: list[Write] = []  # of the workspace (split-K)
        self.split = bool(index.p.placement and index.p.placement.splits > 1)
        self.senders: dict[BufferId, SiteRun] = {}  # ring → the run of the site whose McastSends fill it here
        self.sent: dict[BufferId, list[Entry]] = {}  # ring → the pages this site's McastSends copied out of it
        self.received: dict[BufferId, set[str]] = {}  # ring → the item coordinates its received pages name
        self.counter = itertools.count()
        self._per: dict[int, tuple[dict[BufferId, int], dict[BufferId, int], set[BufferId]]] = {}

    def fresh(self, label: str, n: int) -> Aff:
        """A new symbol over 0..n-1 (the constant 0 when n is 1)."""
        if n <= 1:
            return Aff(0)
        sym = Sym("fresh", next(self.counter), label)
        self.ranges[sym] = n
        return Aff.of(sym)

    def item_coords(self, loop: Sym | None) -> tuple[Aff, Aff]:
        """(item_y, item_x) of the item the ITEM loop `loop` is on (None: the site's only item)."""
        out = []
        for kind, n in (("item_y", self.grid[0]), ("item_x", self.grid[1])):
            if n <= 1:
                out.append(Aff(0))
                continue
            sym = Sym(kind, loop, kind if loop is None else f"{kind}({loop.label})")
            self.ranges[sym] = n
            out.append(Aff.of(sym))
        return out[0], out[1]

    def per_iteration(self, loop: Loop) -> tuple[dict[BufferId, int], dict[BufferId, int], set[BufferId]]:
        """Pages one iteration of `loop` reserves and pops, per ring, and the rings it fills or pushes."""
        key = id(loop)
        if key not in self._per:
            reserved: Counter[BufferId] = Counter()
            popped: Counter[BufferId] = Counter()
            touched: set[BufferId] = set()
            self._count(loop.body, 1, reserved, popped, touched)
            self._per[key] = (dict(reserved), dict(popped), touched)
        return self._per[key]

    def _count(
        self, ops: tuple[ChoreoOp, ...], times: int, reserved: Counter, popped: Counter, touched: set[BufferId]
    ) -> None:
        ring = self.index.ring
        for op in ops:
            match op:
                case Loop(count=count, body=body):
                    n = count.n if isinstance(count, Const) else count.bound
                    self._count(body, times * n, reserved, popped, touched)
                case Reserve(buf, n):
                    reserved[ring(buf)] += n * times
                    touched.add(ring(buf))
                case Pop(buf, n):
                    popped[ring(buf)] += n * times
                case Push(buf) | ReadTiles(into=buf) | PackAcc(to=buf):
                    touched.add(ring(buf))
                case Compute(outs=outs):
                    touched.update(ring(b) for b in outs)

    def renaming(self, producer: SiteRun, theirs: Seq, mine: Seq) -> dict[Sym, Aff]:
        """The producer's loop and item symbols at position `theirs` of a ring, as this site's at `mine` (the same
        shape): loop for loop, each loop's item coordinates with it."""
        rename: dict[Sym, Aff] = {}
        for (their, _, _), (my, _, _) in zip(theirs.levels, mine.levels, strict=True):
            rename[their] = Aff.of(my)
            for old, new in zip(producer.item_coords(their), self.item_coords(my), strict=True):
                rename.update({s: new for s in old.syms()})
        return rename

    def receive(self, ring: BufferId, at: Seq) -> tuple[Page | None, str]:
        """The page the sender's McastSend put at position `at` of `ring` here, in this site's symbols, or None and
        why not. The item coordinates it names are recorded: the sender's item must agree with this site's in them,
        item for item (checked by `semantics` for every pair of sites, concretely)."""
        sender = self.senders[ring]
        for entry in sender.sent.get(ring, []):
            if entry.seq.shape() != at.shape():
                continue
            if entry.page is None or not isinstance(entry.page.cell, Copy):
                return None, f"site {int(sender.site)} multicasts a page that holds no tiles it read"
            rename = self.renaming(sender, entry.seq, at)
            coords: set[str] = set()
            ref = entry.page.cell.ref
            for s in ref.row.syms() | ref.col.syms():
                only = s.kind in ("item_y", "item_x") and s.ident is None  # both sites' only item
                if s not in rename and s not in (PR, PC) and not only:
                    return None, (
                        f"its tiles at site {int(sender.site)} depend on {s.label}, a loop the ring's pages do not"
                        " follow"
                    )
                if s.kind in ("item_y", "item_x"):
                    coords.add(s.kind)
            self.received.setdefault(ring, set()).update(coords)
            return Page(entry.page.rows, entry.page.width, entry.page.cell.subst(rename)), ""
        shapes = "; ".join(sorted({e.seq.text() for e in sender.sent.get(ring, [])})) or "none"
        return None, (
            f"site {int(sender.site)} sends no page of it at the same position in the same loops (pages sent at:"
            f" {shapes}); the semantic rule matches sender and receiver loop for loop"
        )

    # ---- the whole site -----------------------------------------------------------------------------------------

    def run(self) -> list[Write]:
        """Every engine followed; its writes of C: one, or one an ITEM loop where its ITEM loops run parts of its
        items (a split tail's); none where the site writes nothing."""
        from .engine import EngineRun

        for prog in self.order():
            EngineRun(self, prog).body(prog.ops)
        written = [i for w in self.writes for i in w.items(self.items)]
        if len(self.writes) > 1 and (any(w.part is None for w in self.writes) or len(set(written)) < len(written)):
            w = self.writes[1]
            raise StrongerCheckNeeded(
                f"{w.head} — {self.decl.out.name} is written by more than one op at site {int(self.site)}; the"
                " semantic rule proves one WriteTiles writing each item's block",
                site=int(self.site),
                engine=w.engine,
                op=self.index.op(w.op),
                buffer=self.index.buffer_of(w.op),
            )
        if self.writes and not self.items:
            w = self.writes[0]
            raise SemanticError(
                f"{w.head} — site {int(self.site)} holds no item, yet it writes {self.decl.out.name}: each tile is"
                " written once, by the site that holds its item",
                site=int(self.site),
                engine=w.engine,
                op=self.index.op(w.op),
                buffer=self.index.buffer_of(w.op),
            )
        unwritten = [i for i in self.items if i not in set(written)]
        if unwritten and not (self.split and self.partials):
            y, x = divmod(int(unwritten[0]), self.grid[1])
            rows, cols = self.block
            raise SemanticError(
                f"site {int(self.site)}: {self.decl.out.name} tile ({y * rows}, {x * cols}) is never written — the"
                f" site holds {len(self.items)} item(s) and no WriteTiles of it runs for item {int(unwritten[0])}",
                site=int(self.site),
            )
        return self.writes

    def order(self) -> list[EngineProgram]:
        """The engines in the order data flows between them (a producer before the engines that read its pages)."""
        ring = self.index.ring
        fills: dict[BufferId, str] = {}
        reads: dict[str, set[BufferId]] = {}
        for prog, facts in self.progs:
            for use in facts.uses:
                if use.side == Side.PRODUCE:
                    fills.setdefault(ring(use.buf), prog.engine.value)
                elif use.side == Side.CONSUME and not use.flow:
                    reads.setdefault(prog.engine.value, set()).add(ring(use.buf))
        left = [prog for prog, _ in self.progs if prog.ops]
        done: set[str] = set()
        out: list[EngineProgram] = []
        while left:
            ready = [
                q
                for q in left
                if all(fills.get(r) in (None, q.engine.value, *done) for r in reads.get(q.engine.value, ()))
            ]
            if not ready:
                names = ", ".join(q.engine.value for q in left)
                raise StrongerCheckNeeded(
                    f"site {int(self.site)}: engines {names} read each other's pages in a cycle; the semantic rule"
                    " follows data that flows one way between engines",
                    site=int(self.site),
                )
            out.append(ready[0])
            done.add(ready[0].engine.value)
            left.remove(ready[0])
        return out


ZERO = Seq()  # the position of a ring's first page

"""verify's rule 8 for attention: the schedule runs the online softmax recurrence the declaration `attention(Q, K, V)`
stands for (docs/verification.md, "Attention: the online recurrence").

The proof is one symbolic run of each distinct site's engines, as rule 8 proves a GEMM: a loop's variable is a
symbol over its iterations, an item's coordinates are symbols over the grid (`symbolic.Aff`), and no item, head or
KV block is enumerated. Pages hold values — trees over the atoms Q, K and V (the reader's pages, checked against
the item's band of query rows at the right head and the KV loop's block of the right KV head) — and carry where
their tiles sit: the query tile row of each page row, the key (or head_dim) tile of each page column. The KV loop's
body is run once from opaque states m, l, o (the loop-entry accumulators); it must leave them as one step of the
recurrence

    m′ = max(m, rowmax(X)),  α = exp(m − m′),  P = exp(X − m′),  l′ = α·l + rowsum(P),  o′ = α·o + P·V,
    X = mask(keep(r, c), scale · Q·Kᵀ),

the same m′ in P and α, tree for tree (one canonical form: a reordering that means the same is refused). Before the
loop m, l and o are freshly acquired (an accumulator's acquire is its reduction's identity: −∞ for a max, 0 for a
sum or a matmul), the loop covers the key tile rows 0, 1, … of its KV head one to one in order (a causal band's
loop, counted per item, at least the keys its rows keep: `enough`), and after it the
writer receives O = o / l and LSE = m + log l at the item's own rows of its own query head, every row of both
written once. Anything else is a SemanticError naming the op and what differs; a schedule whose shape the run does
not follow is StrongerCheckNeeded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ...errors import ProgramError, SemanticError, StrongerCheckNeeded
from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, loop_var_name
from ...ir.index import ProgramIndex
from ...ir.nodes import EngineProgram, Tensor
from ...ir.ops import (
    AcquireAcc,
    Apply,
    Arg,
    Attention,
    ChoreoOp,
    Compute,
    Const,
    Expr,
    Flush,
    Lit,
    Loop,
    LoopCount,
    Map,
    MatmulTiles,
    PackAcc,
    Pop,
    Pos,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    RowArg,
    RowReduce,
    ScaleAcc,
    Span,
    TileAddr,
    VecAxis,
    Wait,
    WriteBarrier,
    WriteTiles,
    walk,
)
from .facts import Programs
from .recurrence import (
    ACQUIRED,
    K_ATOM,
    Q_ATOM,
    V_ATOM,
    Geom,
    Tree,
    Val,
    ap,
    finish,
    first_difference,
    form_text,
    geom_text,
    lit,
    pin,
    show,
    step,
    vector,
)
from .symbolic import PC, PR, Aff, Sym, one_to_one, split


@dataclasses.dataclass
class Ring:
    """A ring as the compute engine sees it: its reserved page, its published pages in order, its waited page."""

    reserved: Val | None | bool = None  # None: nothing reserved; True: reserved, not filled
    queue: list[Val] = dataclasses.field(default_factory=list)
    front: Val | None = None


def check_attention(index: ProgramIndex, programs: Programs) -> None:
    """Rule 8 for an attention program: each distinct site's engines prove the recurrence (module docstring)."""
    from ..attention import attention_shape  # (passes/attention imports verify through the planner's modules)

    p = index.p
    try:
        shape = attention_shape(p)
    except ProgramError as e:
        raise SemanticError(str(e)) from None
    items = dict(p.placement.items_of_site)  # type: ignore[union-attr]
    proved: set[tuple[object, ...]] = set()  # sites running the same programs are proved once, by one holding items
    for site in sorted(programs.by_site):
        by_engine = {q.engine.value: q for q, _ in programs.by_site[site]}
        if not items.get(site):
            _idle(index, by_engine)
        elif programs.keys[site] not in proved:
            proved.add(programs.keys[site])
            _SiteProof(index, shape, by_engine).check()


def _idle(index: ProgramIndex, progs: dict[str, EngineProgram]) -> None:
    """A site holding no item writes nothing (its ITEM loop, if any, runs no iteration)."""
    writer = progs.get("writer")
    if writer is None:
        return
    for op, nest in _nested(writer.ops):
        if isinstance(op, WriteTiles) and all(count != Const(0) for count, _ in nest):
            raise index.at_op(
                SemanticError, writer, op, "the site holds no item, yet writes: every row once, by its item"
            )


def _nested(ops: tuple[ChoreoOp, ...], nest: tuple = ()) -> Iterator[tuple[ChoreoOp, tuple]]:
    """Every op but loops, with the (count, loop) pairs around it, outermost first."""
    for op in ops:
        if isinstance(op, Loop):
            yield from _nested(op.body, (*nest, (op.count, op)))
        else:
            yield op, nest


class _SiteProof:
    """One site's engines, run symbolically (module docstring)."""

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
        self.key_rows: Aff | None = None

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

    # ---- the proof ----------------------------------------------------------------------------------------------

    def check(self) -> None:
        self.pages = {r: self.reader_page(r) for r in (self.q, self.k, self.v)}
        self.compute()
        for ring in (self.o, self.lse):
            self.write(ring)

    def compute(self) -> None:
        """The compute engine: [ITEM loop] → one loop over the KV head's query heads → its body around one loop over
        the KV blocks."""
        prog = self.progs["compute"]
        self.one_each(prog)
        ops = prog.ops
        if len(ops) == 1 and isinstance(ops[0], Loop) and ops[0].var == LV_ITEM:
            self.nest.append(self.bind(ops[0], "item"))
            ops = ops[0].body
        if len(ops) != 1 or not isinstance(ops[0], Loop) or not isinstance(ops[0].count, Const):
            raise StrongerCheckNeeded(
                f"{_where(prog)}: the semantic rule follows an attention schedule of one loop over an item's query"
                " heads, around one loop over its KV blocks"
            )
        heads = ops[0]
        if heads.count.n != self.group:  # type: ignore[union-attr]
            raise self.wrong(
                heads,
                f"it runs {heads.count.n} query heads an item; the declaration reads {self.group} query heads"  # type: ignore[union-attr]
                " a KV head",
            )
        self.nest.append(self.bind(heads, "head"))
        self.head = self.env[heads.var]
        loops = [op for op in heads.body if isinstance(op, Loop)]
        if (
            len(loops) != 1
            or any(isinstance(o, Loop) for o in loops[0].body)
            or not isinstance(loops[0].count, Const | Span)
        ):
            raise StrongerCheckNeeded(
                f"{_where(prog)}: the semantic rule follows a head's body of one loop over the KV blocks, with no"
                " loop inside it"
            )
        kv = loops[0]
        at = heads.body.index(kv)
        for op in heads.body[:at]:
            self.leaf(op)
        self.kv_loop(kv)
        for op in heads.body[at + 1 :]:
            self.leaf(op)
        for ring, state in self.rings.items():
            if state.reserved is not None or state.queue or state.front is not None:
                raise self.wrong(heads, f"a head's run leaves a page in {self.name(ring)}")

    def one_each(self, prog: EngineProgram) -> None:
        """The compute engine waits for and pops each of Q's, K's and V's rings at one op, and reserves and publishes
        each of O's and LSE's at one: the reader's one ReadTiles (the writer's one WriteTiles) is then matched to it
        loop for loop (`arrive`, `write`)."""
        moves: dict[tuple[type, BufferId], int] = {}
        for op in walk(prog.ops):
            if isinstance(op, Reserve | Push | Wait | Pop):
                moves[type(op), op.buf] = moves.get((type(op), op.buf), 0) + 1
        for kinds, rings in (((Wait, Pop), (self.q, self.k, self.v)), ((Reserve, Push), (self.o, self.lse))):
            for ring in rings:
                if any(moves.get((kind, ring), 0) != 1 for kind in kinds):
                    raise StrongerCheckNeeded(
                        f"{_where(prog)}: the semantic rule follows {self.name(ring)} moved by one"
                        f" {kinds[0].__name__} and one {kinds[1].__name__} of this engine"
                    )

    # ---- the reader's pages -------------------------------------------------------------------------------------

    def reader_page(self, ring: BufferId) -> tuple[tuple, ReadTiles]:
        """The loops around the one ReadTiles filling `ring`, and that ReadTiles."""
        prog = self.progs["reader"]
        found = []
        for op, nest in _nested(prog.ops):
            if isinstance(op, Reserve | Push | ReadTiles) and _buf(op) == ring:
                found.append((op, nest))
            elif not isinstance(op, Reserve | Push | ReadTiles | ReadBarrier):
                raise self.unsure(op, "an attention program's reader only reads Q, K and V", "reader")
        kinds = [type(op) for op, _ in found]
        ops = [op for op, _ in found]
        pages = {op.pages for op in ops if isinstance(op, Reserve | Push)}
        if kinds == [Reserve, Push]:
            raise self.wrong(ops[1], f"it publishes pages of {self.name(ring)} that no ReadTiles fills", "reader")
        if kinds != [Reserve, ReadTiles, Push] or len({n for _, n in found}) != 1 or pages != {1}:
            raise StrongerCheckNeeded(
                f"{_where(prog)}: the semantic rule follows a ring of Q, K or V filled by one Reserve, ReadTiles, Push"
                f" of one page in one loop body; {self.name(ring)} is filled otherwise"
            )
        read, nest = ops[1], found[1][1]
        assert isinstance(read, ReadTiles)
        if read.rows_from is not None:
            raise self.unsure(read, "it masks rows, which an attention's read does not", "reader")
        return nest, read

    def arrive(self, op: Wait, ring: BufferId) -> Val:
        """The page the reader filled in the iteration of its loops that matches the compute engine's now: both
        move one page an iteration of loops counted alike, so the n-th page pushed is the n-th waited (rules 3–5)."""
        nest, read = self.pages[ring]
        counts = tuple(c for c, _ in nest)
        mine = tuple(c for c, _ in self.nest)
        if counts != mine:
            raise self.unsure(
                op,
                f"the reader fills {self.name(ring)} in loops of {_counts(counts)} iterations, this engine waits for"
                f" it in loops of {_counts(mine)}; the semantic rule matches pages of loops counted alike",
            )
        env = dict(self.env)
        for (_, loop), (_, value) in zip(nest, self.nest, strict=True):
            env[loop.var] = value
        t = self.tensors[ring]
        flat = pin(
            _addr(read.at, env) + Aff.of(PR, read.stride_h) + Aff.of(PC, read.stride_w), read.block_h, read.block_w
        )
        ranges = {**self.ranges, PR: read.block_h, PC: read.block_w}
        across = pin(Aff.of(PC), read.block_h, read.block_w)
        tile = split(flat, t.tiles[1], ranges)
        if tile is None:
            # (the page the recurrence needs lies in whole rows of the grid, so an address that crosses them is not it)
            raise self.wrong(read, f"its page's tiles {flat.text()} cross rows of {t.name}'s tile grid", "reader")
        row, col = tile
        head = split(row, t.group_tiles[0], ranges)
        if head is None:
            # (the page the recurrence needs lies in one head's rows, so rows crossing heads are not it)
            raise self.wrong(read, f"its rows {row.text()} cross the heads of {t.name}", "reader")
        group, rows = head
        role = {self.q: "Q", self.k: "K", self.v: "V"}[ring]
        want = self.ix * self.group + self.head if ring == self.q else self.ix
        whose = "the item's query head (item_x · group + head)" if ring == self.q else "the item's KV head (item_x)"
        if group != want:
            raise self.wrong(
                read, f"{role}'s page is read from head {group.text()}, not {whose}: {want.text()}", "reader"
            )
        if col != across or read.block_w != t.tiles[1]:
            raise self.wrong(
                read, f"{role}'s page holds head_dim tiles {col.text()}, not all {t.tiles[1]} of a row", "reader"
            )
        if ring == self.q:
            band = self.band()
            if rows != band or read.block_h != self.bh:
                raise self.wrong(
                    read,
                    f"Q's page holds query tile rows {rows.text()} of the head, not the item's band {band.text()}",
                    "reader",
                )
            return Val(Q_ATOM, Geom(self.bh, t.tiles[1], "query", rows, "d", across))
        if ring == self.k:
            self.key_rows = rows
        elif rows != self.key_rows:
            raise self.wrong(
                read, f"V's page holds key tile rows {rows.text()}, not K's block {form_text(self.key_rows)}", "reader"
            )
        atom = K_ATOM if ring == self.k else V_ATOM
        return Val(atom, Geom(read.block_h, t.tiles[1], "key", rows, "d", across))

    # ---- the compute engine's ops -------------------------------------------------------------------------------

    def leaf(self, op: ChoreoOp) -> None:
        match op:
            case Reserve() | Push() | Wait() | Pop() if op.pages != 1:
                raise self.unsure(op, "the semantic rule follows an attention's rings a page at a time")
            case Reserve(buf):
                self.reserve(op, buf)
            case Push(buf):
                self.push(op, buf)
            case Wait(buf):
                self.wait(op, buf)
            case Pop(buf):
                if self.ring(buf).front is None:
                    raise self.wrong(op, f"it pops a page of {self.name(buf)} it does not hold")
                self.ring(buf).front = None
            case AcquireAcc(buf):
                self.accs[buf] = (ACQUIRED, None)
            case ReleaseAcc(buf):
                self.accs[buf] = None
            case PackAcc():
                self.pack(op)
            case Compute(op=MatmulTiles()):
                self.matmul(op)
            case Compute(op=RowReduce()):
                self.row_reduce(op)
            case Compute(op=ScaleAcc()):
                self.scale(op)
            case Compute(op=Map()):
                self.map(op)
            case ReadBarrier() | WriteBarrier() | Flush():
                pass
            case _:
                raise self.unsure(op, "the semantic rule does not follow this op in an attention schedule")

    def ring(self, buf: BufferId) -> Ring:
        return self.rings.setdefault(buf, Ring())

    def reserve(self, op: ChoreoOp, buf: BufferId) -> None:
        state = self.ring(buf)
        if buf in (self.q, self.k, self.v) or state.reserved is not None:
            raise self.unsure(op, f"the semantic rule follows one reserved page of {self.name(buf)} at a time")
        state.reserved = True

    def fill(self, op: ChoreoOp, buf: BufferId, val: Val) -> None:
        state = self.ring(buf)
        if state.reserved is not True:
            raise self.wrong(op, f"it fills {self.name(buf)}, holding no reserved page of it to fill")
        state.reserved = val
        self.origin.setdefault(val.value, op)

    def push(self, op: Push, buf: BufferId) -> None:
        state = self.ring(buf)
        if not isinstance(state.reserved, Val):
            raise self.wrong(op, f"it publishes a page of {self.name(buf)} it did not fill")
        val, state.reserved = state.reserved, None
        if buf in (self.o, self.lse):
            if buf in self.outputs:
                raise self.wrong(op, f"it publishes a second page of {self.name(buf)} a query head")
            self.output(op, buf, val)
            self.outputs[buf] = (val, tuple(self.nest), op)
        else:
            state.queue.append(val)

    def wait(self, op: Wait, buf: BufferId) -> None:
        state = self.ring(buf)
        if state.front is not None:
            raise self.unsure(op, f"the semantic rule follows one waited page of {self.name(buf)} at a time")
        if buf in (self.q, self.k, self.v):
            state.front = self.arrive(op, buf)
        elif not state.queue:
            raise self.wrong(op, f"it waits for a page of {self.name(buf)} that it published in no earlier op")
        else:
            state.front = state.queue.pop(0)

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

    def pack(self, op: PackAcc) -> None:
        value, geom = self.acc(op, op.acc)
        if geom is None:
            raise self.wrong(op, f"it packs {self.name(op.acc)}, which nothing added into")
        if op.accumulate or op.tiles != geom.rows * geom.width:
            raise self.unsure(
                op, f"the semantic rule follows a pack of the accumulator's {geom.rows * geom.width} tiles"
            )
        self.fill(op, op.to, Val(value, geom))

    def matmul(self, op: Compute) -> None:
        mm = op.op
        assert isinstance(mm, MatmulTiles) and op.acc is not None
        if mm.sub_blocks != (1, 1):
            raise self.unsure(op, "the semantic rule follows an attention matmul of one sub-block")
        if mm.operand != self.p.precision:
            raise self.wrong(op, f"it multiplies in {mm.operand}, the program's operands are {self.p.precision}")
        a, b = (self.page(op, r).geom for r in op.ins)
        blk, t = mm.block, mm.transpose_b
        b_shape = (blk.osw, blk.ibw) if t else (blk.ibw, blk.osw)
        if (a.rows, a.width) != (blk.osh, blk.ibw) or (b.rows, b.width) != b_shape:
            raise self.wrong(
                op, f"its block {blk.osh}x{blk.osw}x{blk.ibw} does not read its pages as they are laid out"
            )
        x = Aff.of(Sym("attention", "sum", "kk")) if blk.ibw > 1 else Aff(0)
        left = (a.ckind, a.col.subst({PC: x}) if a.col is not None else None)
        right = (b.ckind, b.col.subst({PC: x})) if t and b.col is not None else (b.rkind, b.row.subst({PR: x}))
        if left != right:
            raise self.wrong(
                op,
                f"it sums {self.name(op.ins[0])}'s {a.ckind} tiles {form_text(left[1])} times {self.name(op.ins[1])}'s"
                f" {right[0]} tiles {form_text(right[1])}: a product over unlike tiles",
            )
        if left[0] == "d" and (left[1] != x or blk.ibw != self.dt):
            raise self.wrong(op, f"it sums head_dim tiles {form_text(left[1])}, not all {self.dt} of a row")
        cols = (b.rkind, pin(b.row.subst({PR: Aff.of(PC)}), blk.osh, blk.osw)) if t else (b.ckind, b.col)
        geom = Geom(blk.osh, blk.osw, a.rkind, a.row, cols[0], cols[1])
        value, had = self.acc(op, op.acc)
        product = ("mm", self.page(op, op.ins[0]).value, self.page(op, op.ins[1]).value)
        self.put(op, op.acc, product if value == ACQUIRED else ("add", value, product), geom, had)

    def row_reduce(self, op: Compute) -> None:
        rr = op.op
        assert isinstance(rr, RowReduce) and op.acc is not None
        x = self.page(op, op.ins[0])
        g = x.geom
        if (
            g.ckind != "key"
            or rr.width != g.width
            or g.col != pin(_addr(rr.at, self.env) + Aff.of(PC), g.rows, g.width)
        ):
            raise self.wrong(
                op, f"it reduces columns at {_addr(rr.at, self.env).text()} of a page holding {geom_text(g)}"
            )
        if rr.cols < self.op.seq_kv:
            raise self.wrong(
                op, f"it reduces the keys below {rr.cols}, hiding keys {rr.cols}..{self.op.seq_kv - 1} the mask keeps"
            )
        value, had = self.acc(op, op.acc)
        part = ("rowred", rr.op, x.value)
        self.put(op, op.acc, part if value == ACQUIRED else ("combine", rr.op, value, part), vector(g), had)

    def scale(self, op: Compute) -> None:
        assert op.acc is not None
        by = self.page(op, op.ins[0])
        value, had = self.acc(op, op.acc)
        if had is None or by.geom != vector(had):
            raise self.wrong(
                op, f"it scales {self.name(op.acc)} by a page holding {geom_text(by.geom)}, not one value a row"
            )
        self.put(op, op.acc, ("scale", value, by.value), had, had)

    def map(self, op: Compute) -> None:
        assert isinstance(op.op, Map)
        pages = [self.page(op, r) for r in op.ins]
        expr = op.op.expr
        whole = {i for i in _args(expr, Arg)}
        geoms = {pages[i].geom for i in whole}
        if len(geoms) > 1:
            raise self.wrong(op, "it combines pages whose tiles sit at different rows or columns, element by element")
        main = geoms.pop() if geoms else None
        vec = vector(main) if main is not None else None
        for i in _args(expr, RowArg):
            if vec is None:
                vec = pages[i].geom
            if pages[i].geom != vec or pages[i].geom.ckind is not None:
                raise self.wrong(
                    op,
                    f"it reads {self.name(op.ins[i])} as one value a row of pages holding {geom_text(main or vec)}",
                )
        geom = main or vec
        if geom is None:
            raise self.wrong(op, "its value reads none of its pages")
        self.fill(op, op.outs[0], Val(self.expr(op, expr, pages, geom), geom))

    def expr(self, op: Compute, e: Expr, pages: list[Val], geom: Geom) -> Tree:
        match e:
            case Arg(i):
                return pages[i].value
            case RowArg(i, width):
                if width != geom.width:
                    raise self.wrong(
                        op, f"it reads a row vector for pages {width} tiles wide; its pages are {geom.width}"
                    )
                return pages[i].value
            case Lit(value):
                return lit(value)
            case Pos(axis, at, width):
                self.position(op, axis, _addr(at, self.env), width, geom)
                return ("pos", str(axis))
            case Apply(name, args, params):
                return ap(name, *(self.expr(op, a, pages, geom) for a in args), params=params)
        raise self.unsure(op, "the semantic rule follows an attention's maps of their own pages and constants")

    def position(self, op: Compute, axis: VecAxis, at: Aff, width: int, g: Geom) -> None:
        """A mask's row (column) is the query row (key) of the element it masks."""
        if g.ckind != "key" or g.rkind != "query" or width != g.width:
            raise self.wrong(op, f"its mask reads positions of pages {width} tiles wide; its page holds {geom_text(g)}")
        have, want = (at + Aff.of(PR), g.row) if axis == VecAxis.ROW else (at + Aff.of(PC), g.col)
        have = pin(have, g.rows, g.width)
        if have != want:
            which = "query row" if axis == VecAxis.ROW else "key"
            raise self.wrong(
                op, f"its mask's {which} is tile {have.text()}, where the element it masks is at tile {form_text(want)}"
            )

    # ---- the KV loop: one step of the recurrence from any state -------------------------------------------------

    def roles(self, loop: Loop) -> dict[str, BufferId]:
        """The loop's running max, running sum and output accumulator: those live at its entry that a max, a sum or
        a matmul adds into."""
        adds: dict[BufferId, set[str]] = {}
        for op in walk(loop.body):
            if isinstance(op, Compute) and op.acc is not None:
                kind = op.op.op if isinstance(op.op, RowReduce) else "mm" if isinstance(op.op, MatmulTiles) else ""
                adds.setdefault(op.acc, set()).add(kind)
        live = [a for a, s in self.accs.items() if s is not None]
        out = {}
        for role, kind in (("m", "max"), ("l", "sum"), ("o", "mm")):
            found = [a for a in live if kind in adds.get(a, ())]
            if len(found) != 1:
                names = ", ".join(self.name(a) for a in found) or "none"
                raise self.wrong(
                    loop,
                    f"the recurrence carries one accumulator a {kind} adds into across the KV blocks ({role}); of those"
                    f" acquired before this loop, {names}",
                )
            out[role] = found[0]
        return out

    def kv_loop(self, loop: Loop) -> None:
        roles = self.roles(loop)
        identity = {"m": "−∞", "l": "0", "o": "0"}
        for role, a in roles.items():
            value, _ = self.accs[a]  # type: ignore[misc]
            if value != ACQUIRED:
                raise self.wrong(
                    loop,
                    f"{self.name(a)} enters the KV loop holding {show(value)}, not freshly acquired: the recurrence"
                    f" starts from {role} = {identity[role]}",
                )
        before = self.in_flight()
        if set(before) - {self.q}:
            raise self.unsure(loop, "the semantic rule follows a KV loop entered with no page in flight but Q's")
        count, k = self.bind(loop, "k")
        n = count.n if isinstance(count, Const) else count.bound  # type: ignore[union-attr]
        if n < 1:
            raise self.wrong(loop, "it runs no KV block")
        self.nest.append((count, k))
        band = self.band()
        vector = Geom(self.bh, 1, "query", band)
        state = {
            "m": (("in", "m"), vector),
            "l": (("in", "l"), vector),
            "o": (("in", "o"), Geom(self.bh, self.dt, "query", band, "d", pin(Aff.of(PC), 1, self.dt))),
        }
        entry = {a: st for a, st in self.accs.items() if st is not None}
        for a, st in entry.items():  # any other live accumulator: opaque, so a block that reads it is refused
            self.accs[a] = (("entry", self.name(a)), st[1])
        for role, a in roles.items():
            self.accs[a] = state[role]
        self.key_rows = None
        for op in loop.body:
            self.leaf(op)
        if self.in_flight() != before:
            raise self.wrong(
                loop, "a KV block's run leaves pages its next block would read: blocks hand on only m, l, o"
            )
        want = step(self.op, *(state[r][0] for r in ("m", "l", "o")))
        for role in ("m", "l", "o"):
            held = self.accs[roles[role]]
            if held is None:
                raise self.wrong(loop, f"a KV block releases {self.name(roles[role])}, which the next block reads")
            value = held[0]
            self.same(loop, f"{self.name(roles[role])} after a KV block", value, want[role + "′"], want)
        self.coverage(loop, n, k)
        if isinstance(count, Span):
            self.enough(loop, count, k)
        for a, now in list(self.accs.items()):
            if now is not None and a in entry and now[0] == ("entry", self.name(a)):
                self.accs[a] = entry[a]  # untouched by the loop
            elif now is not None:
                self.accs[a] = (("last", self.name(a)), now[1])  # the last block's: no value of the recurrence
        for role, a in roles.items():
            self.accs[a] = (("rec", role), state[role][1])
        self.nest.pop()

    def in_flight(self) -> dict[BufferId, tuple[object, ...]]:
        """Every ring holding a page (reserved, published or waited), with what it holds."""
        return {
            r: (s.reserved, tuple(s.queue), s.front)
            for r, s in self.rings.items()
            if s.reserved is not None or s.queue or s.front is not None
        }

    def coverage(self, loop: Loop, n: int, k: Aff) -> None:
        """The KV loop's K pages hold the key tile rows 0, 1, … of the KV head, each once, in order, all the keys."""
        rows = self.key_rows
        if rows is None:
            raise self.wrong(loop, "the KV loop reads no K page")
        ranges = {**self.ranges, PR: self.pages[self.k][1].block_h}  # (PR is pinned to 0 where it is 1)
        ks = set(k.terms)
        run = one_to_one(rows, ranges) if rows.syms() <= ks | {PR} else None
        keys = self.op.seq_kv
        if n > 1 and not ks & rows.syms():
            raise self.wrong(loop, f"each of its {n} blocks reads the same key tile rows {rows.text()}")
        if run is None or run[0] != 0 or any(rows.coef(s) < 0 for s in ks):
            raise self.wrong(
                loop,
                f"in {_blocks(n)} it reads key tile rows {rows.text()}: not the KV head's rows 0, 1, … once each,"
                " in order",
            )
        if run[1] * self.tile_rows < keys:
            raise self.wrong(
                loop,
                f"in {_blocks(n)} it reads {run[1]} key tile rows ({run[1] * self.tile_rows} keys); the declaration has"
                f" {keys}",
            )

    def enough(self, loop: Loop, count: Span, k: Aff) -> None:
        """A KV loop counted per item (a causal band runs the blocks at or left of its diagonal) runs, for every item,
        blocks enough for every key its band's rows keep: min(bound, ⌈v / per⌉) blocks of `step` key tile rows hold
        every kept key when the bound's blocks hold all seq_kv keys (`coverage`) and v · step · tile ≥ per · need, for
        need the keys a row of the band keeps at most — seq_kv, or for a causal mask (the band's end row + 1) +
        seq_kv − seq_q. The blocks an item does not run are then masked for all its rows: as the recurrence, they
        would leave m, l and o as they were. One affine form over the grid, its least value: no item is enumerated."""
        rows = self.key_rows
        step = self.pages[self.k][1].block_h  # key tile rows a block: iterations 0 … n − 1 hold rows 0 … n·step − 1
        if rows != k * step + pin(Aff.of(PR), step, 1):
            raise self.wrong(
                loop,
                f"its blocks read key tile rows {form_text(rows)}: a loop counted per item reads the blocks in order,"
                " each a whole page",
            )
        v = Aff(count.base)
        for var, stride in count.steps:
            if var not in (LV_ITEM_Y, LV_ITEM_X):
                raise self.unsure(loop, "the semantic rule follows a KV loop counted by the item's coordinates")
            v = v + self.env[var] * stride
        tile = self.tile_rows
        needs = [Aff(self.op.seq_kv)]
        if self.op.causal:
            needs.append((self.iy * self.bh + self.bh) * tile + (self.op.seq_kv - self.op.seq_q))
        if not any((v * (step * tile) - need * count.per).span(self.ranges)[0] >= 0 for need in needs):
            raise self.wrong(
                loop,
                f"an item runs {_count_text(count)} KV blocks of {step * tile} keys, too few for the keys its band's"
                f" rows keep (at most {needs[-1].text()})",
            )

    def output(self, op: Push, buf: BufferId, val: Val) -> None:
        """What the writer receives: O = o / l, LSE = m + log l, at the band's query rows."""
        end = finish()
        band = self.band()
        if buf == self.o:
            want, geom = end["O"], Geom(self.bh, self.dt, "query", band, "d", pin(Aff.of(PC), 1, self.dt))
        else:
            want, geom = end["LSE"], Geom(self.bh, 1, "query", band)
        self.same(op, f"the page of {self.name(buf)}", val.value, want, {r: end[r] for r in ("m", "l", "o")})
        if val.geom != geom:
            raise self.wrong(op, f"its page of {self.name(buf)} holds {geom_text(val.geom)}, not {geom_text(geom)}")

    # ---- the writer ---------------------------------------------------------------------------------------------

    def write(self, ring: BufferId) -> None:
        """The writer stores the page of each query head at that head's rows of the item's band, every row once."""
        prog = self.progs["writer"]
        found = []
        for op, nest in _nested(prog.ops):
            if isinstance(op, Wait | WriteTiles | Pop) and _buf(op) == ring:
                found.append((op, nest))
            elif not isinstance(op, Wait | WriteTiles | Pop | WriteBarrier | Flush):
                raise self.unsure(op, "an attention program's writer only writes O and LSE", "writer")
        pages = {op.pages for op, _ in found if isinstance(op, Wait | Pop)}
        if [type(op) for op, _ in found] == [Wait, Pop]:
            raise self.wrong(found[1][0], f"it frees pages of {self.name(ring)} that no WriteTiles stores", "writer")
        if [type(op) for op, _ in found] != [Wait, WriteTiles, Pop] or len({n for _, n in found}) != 1 or pages != {1}:
            raise StrongerCheckNeeded(
                f"{_where(prog)}: the semantic rule follows a ring of O or LSE emptied by one Wait, WriteTiles, Pop"
                f" in one loop body; {self.name(ring)} is emptied otherwise"
            )
        w, nest = found[1]
        assert isinstance(w, WriteTiles)
        if ring not in self.outputs:
            raise self.wrong(prog.ops[0], f"it never publishes a page of {self.name(ring)}")
        val, mine, _ = self.outputs[ring]
        if tuple(c for c, _ in nest) != tuple(c for c, _ in mine) or w.rows_from is not None:
            raise self.unsure(w, "the semantic rule matches pages of loops counted alike, no rows masked", "writer")
        env = dict(self.env)
        for (_, loop), (_, value) in zip(nest, mine, strict=True):
            env[loop.var] = value
        t: Tensor = self.tensors[ring]
        g = val.geom
        if (w.block_h, w.block_w) != (g.rows, g.width):
            raise self.wrong(w, f"it writes {w.block_h}x{w.block_w} tiles of pages of {g.rows}x{g.width}", "writer")
        ranges = {**self.ranges, PR: g.rows, PC: g.width}
        flat = pin(_addr(w.at, env) + Aff.of(PR, w.stride_h) + Aff.of(PC, w.stride_w), g.rows, g.width)
        tile = split(flat, t.tiles[1], ranges)
        want_row = (self.ix * self.group + self.head) * t.group_tiles[0] + g.row
        want_col = g.col if g.col is not None else Aff(0)
        if tile is None or tile != (want_row, want_col) or (g.ckind == "d" and g.width != t.tiles[1]):
            have = "tiles crossing rows" if tile is None else f"tile rows {tile[0].text()}, columns {tile[1].text()}"
            raise self.wrong(
                w,
                f"it writes {have} of {t.name}; the item's query head (item_x · group + head) and band are at rows"
                f" {want_row.text()}, columns {want_col.text()}",
                "writer",
            )
        run = one_to_one(want_row, ranges)
        if run != (0, t.tiles[0]):
            raise self.wrong(
                w, f"its rows {want_row.text()} do not cover the {t.tiles[0]} tile rows of {t.name} once", "writer"
            )

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


def _args(expr: Expr, kind: type) -> list[int]:
    match expr:
        case Arg(i) | RowArg(i) if isinstance(expr, kind):
            return [i]
        case Apply(_, args):
            return [i for a in args for i in _args(a, kind)]
    return []


def _addr(at: TileAddr, env: dict) -> Aff:
    out = Aff(at.base)
    for var, stride in at.steps:
        out = out + env.get(var, Aff(0)) * stride
    return out


def _buf(op: ChoreoOp) -> BufferId | None:
    match op:
        case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf):
            return buf
        case ReadTiles(into=into):
            return into
        case WriteTiles(src=src):
            return src
    return None


def _counts(counts: tuple[LoopCount, ...]) -> str:
    return " × ".join(_count_text(c) for c in counts) or "no"


def _count_text(count: LoopCount) -> str:
    match count:
        case Const(n):
            return str(n)
        case Span(base, per, bound, steps):
            v = " + ".join([str(base), *(f"{s}·{loop_var_name(var)}" for var, s in steps)])
            return f"min({bound}, ⌈({v}) / {per}⌉)"
    return "a count read from data"


def _blocks(n: int) -> str:
    return "1 block" if n == 1 else f"{n} blocks"


def _where(prog: EngineProgram) -> str:
    return f"site {int(prog.site)} {prog.engine.value}"

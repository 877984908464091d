"""verify's rule 1 on the ops: ids that resolve, counts and pages of at least one, loop variables bound where they
are read, loop bounds the kernel's `int` counters hold, reads from input, parameter or workspace tensors, writes to
the output or a workspace, Trip loops that read a parameter tensor, sites and groups the placement has, and no
semaphore count past a C `int`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ...errors import IllFormedError
from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LoopVar, SemId, Site, loop_var_name
from ...ir.index import ProgramIndex, where
from ...ir.nodes import DType, EngineProgram, Tensor, TensorRole, TileOrder, per_op_list
from ...ir.ops import (
    MAX_ADDR_STEPS,
    MAX_OP_LIST,
    AcquireAcc,
    AddPartial,
    Attention,
    Barrier,
    ChoreoOp,
    Col,
    ColReduce,
    Compute,
    Const,
    Dequant,
    Flush,
    Loop,
    Map,
    MatmulTiles,
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
    positions,
    walk,
)
from ...ir.printer import PRINTED_BITS, plural
from .limits import MAX_BUFFER_TILES, MAX_INT, MAX_ITEM_SIDE, MAX_RING_DEPTH
from .wellformed import role_text
from .wellformed_compute import compute_fault


def check_ops(index: ProgramIndex, programs: Iterable[EngineProgram]) -> None:
    """Rule 1 on every op of `programs` (one program per distinct op tuple is enough)."""
    for prog in programs:
        _OpCheck(index, prog).body(prog.ops, ())


def raise_counts(programs: Iterable[EngineProgram]) -> Counter[tuple[Site, SemId]]:
    """How far every (site, semaphore) is raised over `programs`, at most: loops run their counts, run-time counts
    their bounds."""
    total: Counter[tuple[Site, SemId]] = Counter()

    def walk_ops(ops: tuple[ChoreoOp, ...], times: int) -> None:
        for op in ops:
            if isinstance(op, Loop):
                n = op.count.n if isinstance(op.count, Const) else op.count.bound
                walk_ops(op.body, times * max(n, 0))
            elif isinstance(op, SemInc) and op.by > 0:
                total[(op.at, op.sem)] += op.by * times

    # An op list with no SemInc adds nothing (each shared list looked into once).
    for prog, raises in per_op_list(programs, lambda ops: any(isinstance(op, SemInc) for op in walk(ops))):
        if raises:
            walk_ops(prog.ops, 1)
    return total


def check_sem_counts(index: ProgramIndex, programs: Iterable[EngineProgram]) -> None:
    """No site's copy of a semaphore can pass what a C int holds: its start plus every raise any site makes of it
    (`raise_counts`) — the kernel keeps the count in an `int`."""
    total = raise_counts(programs)
    for (site, sem), raised in total.items():
        start = index.sems[sem].initial  # type: ignore[index]
        if start + raised > MAX_INT:
            raise IllFormedError(
                f"site {int(site)}'s copy of semaphore {index.sems[sem].name} can reach {start + raised}"  # type: ignore[index]
                f" ({start} and the raises of it); the kernel keeps a count in a C int, at most {MAX_INT}",
                site=int(site),
            )


_GroupOp = McastSetValid | McastSend | Barrier  # the ops that name a group


def check_site_groups(index: ProgramIndex, programs: Iterable[EngineProgram]) -> None:
    """A site names only groups it belongs to (the one part of rule 1 that depends on the site, not the ops)."""
    for prog, named in per_op_list(programs, lambda ops: tuple(_group_ops(ops))):  # each shared list walked once
        for op in named:
            if prog.site not in index.groups[op.group].sites:
                raise index.at_op(IllFormedError, prog, op, f"site {int(prog.site)} is not in group {int(op.group)}")


def _group_ops(ops: tuple[ChoreoOp, ...]) -> Iterable[_GroupOp]:
    for op in ops:
        if isinstance(op, Loop):
            yield from _group_ops(op.body)
        elif isinstance(op, McastSetValid | McastSend | Barrier):
            yield op


class _OpCheck:
    """One walk over one engine program, raising IllFormedError at the first op that is not well-formed."""

    def __init__(self, index: ProgramIndex, prog: EngineProgram):
        self.index, self.prog = index, prog

    def fail(self, op: ChoreoOp, why: str, buf=None) -> IllFormedError:
        text = self.index.op(op)
        return IllFormedError(
            f"{where(self.prog.site, self.prog.engine.value)}: {text} — {why}",
            site=int(self.prog.site),
            engine=self.prog.engine.value,
            op=text,
            buffer=self.index.buffer_of(op) if buf is None else self.index.name(buf),
        )

    def body(self, ops: tuple[ChoreoOp, ...], bound: tuple[LoopVar, ...]) -> None:
        if len(ops) > MAX_OP_LIST:  # (a saved file's reader refuses what verify refuses: ir/serde.py)
            raise self.fail(ops[0], f"a list of {len(ops)} ops; a program or loop body holds at most {MAX_OP_LIST}")
        for op in ops:
            if isinstance(op, Loop):
                self.loop(op, bound)
                self.body(op.body, (*bound, op.var))
            else:
                self.leaf(op, bound)

    def loop(self, op: Loop, bound: tuple[LoopVar, ...]) -> None:
        if op.var in (LV_ITEM_Y, LV_ITEM_X):
            raise self.fail(op, f"{loop_var_name(op.var)} stands for the item's coordinate; no loop may bind it")
        if op.var in bound:
            raise self.fail(op, f"loop variable {loop_var_name(op.var)} is already bound by an enclosing loop")
        if isinstance(op.first, bool) or not isinstance(op.first, int) or op.first < 0 or op.first > MAX_INT:
            raise self.fail(op, f"a loop's first item is a whole number from 0 to {MAX_INT}, not {op.first!r}")
        if op.first and op.var != LV_ITEM:
            raise self.fail(op, "only an ITEM loop starts past the first of its site's items (`first`)")
        match op.count:
            case Const(n) if n < 0:
                raise self.fail(op, f"a loop count must be ≥ 0, not {n}")
            case Const(n) if n > MAX_INT:
                shown = n if n.bit_length() <= PRINTED_BITS else f"a number of {n.bit_length()} bits"
                raise self.fail(
                    op, f"a loop count must be at most {MAX_INT} (the kernel counts in a C int), not {shown}"
                )
            case Trip(tid, index, limit):
                t = self.index.tensors.get(tid)
                if t is None:
                    raise self.fail(op, f"its trip count reads tensor {int(tid)}, which does not exist")
                if t.role != TensorRole.PARAMETER:
                    raise self.fail(
                        op,
                        f"its trip count reads {t.name}, an {t.role.value} tensor; trip counts come from a"
                        " parameter tensor",
                    )
                lo, hi = index, index
                placed = self.index.p.plan.placed if self.index.p.plan is not None else (1, 1)
                for var, stride in op.count.steps:
                    if var not in (LV_ITEM_Y, LV_ITEM_X):
                        raise self.fail(
                            op, f"its trip count's element steps with {loop_var_name(var)}; only item_y and item_x may"
                        )
                    reach = stride * (placed[0 if var == LV_ITEM_Y else 1] - 1)
                    lo, hi = lo + min(reach, 0), hi + max(reach, 0)
                if not 0 <= lo <= hi < t.elems[0] * t.elems[1]:
                    raise self.fail(
                        op,
                        f"its trip count reads elements {lo}..{hi} of {t.name}, which has {t.elems[0] * t.elems[1]}",
                    )
                if not 0 <= limit <= MAX_INT:
                    raise self.fail(op, f"a trip bound must be ≥ 0 and at most {MAX_INT}, not {limit}")
                if not 1 <= op.count.per <= MAX_INT:
                    raise self.fail(op, f"a trip count's divisor must be ≥ 1 and at most {MAX_INT}, not {op.count.per}")
            case Span(base, per, limit, steps):
                if not 0 <= limit <= MAX_INT or not 1 <= per <= MAX_INT or abs(base) > MAX_INT:
                    raise self.fail(
                        op,
                        f"a per-item count's bound (0..{MAX_INT}), divisor (1..{MAX_INT}) and base (within"
                        f" ±{MAX_INT}) are out of range: {limit}, {per}, {base}",
                    )
                for var, stride in steps:
                    if var not in (LV_ITEM_Y, LV_ITEM_X) or abs(stride) > MAX_INT:
                        raise self.fail(
                            op,
                            f"a per-item count steps with the item's coordinates (item_y, item_x) by at most"
                            f" {MAX_INT}, not {loop_var_name(var)} by {stride}",
                        )

    def buf(self, op: ChoreoOp, bid) -> None:
        if bid not in self.index.buffers:
            raise self.fail(op, f"buffer {int(bid)} does not exist (the program has {len(self.index.buffers)})", bid)

    def tensor(self, op: ChoreoOp, tid) -> Tensor:
        t = self.index.tensors.get(tid)
        if t is None:
            raise self.fail(op, f"tensor {int(tid)} does not exist")
        return t

    def leaf(self, op: ChoreoOp, bound: tuple[LoopVar, ...]) -> None:
        match op:
            case Reserve(buf, n) | Push(buf, n) | Wait(buf, n) | Pop(buf, n):
                self.buf(op, buf)
                if not 1 <= n <= MAX_RING_DEPTH:
                    raise self.fail(op, f"an op moves 1 to {MAX_RING_DEPTH} pages (a ring's most), not {n}", buf)
            case ReadTiles() | WriteTiles():
                self.block(op, bound)
            case AcquireAcc(buf) | ReleaseAcc(buf) | Flush(buf) | McastSend(buf=buf):
                self.buf(op, buf)
            case PackAcc(acc, to, tiles, _):
                self.buf(op, acc)
                self.buf(op, to)
                if not 1 <= tiles <= MAX_BUFFER_TILES:
                    raise self.fail(op, f"a pack moves 1 to {MAX_BUFFER_TILES} tiles, not {tiles}", to)
            case Compute():
                self.compute(op, bound)
            case ReadBarrier() | WriteBarrier():
                pass
            case SemSet(_, v) | SemWait(_, v) | McastSetValid(_, _, v) if not -MAX_INT <= v <= MAX_INT:
                raise self.fail(op, f"a semaphore count must be within ±{MAX_INT} (the kernel keeps it in a C int)")
            case SemInc(_, _, by) if not -MAX_INT <= by <= MAX_INT:
                raise self.fail(op, f"a semaphore raise must be within ±{MAX_INT} (the kernel adds it to a C int)")
            case SemSet() | SemInc() | SemWait() | McastSetValid() | Barrier():
                pass
            case _:
                raise self.fail(op, "not a choreography op")
        if isinstance(op, SemSet | SemInc | SemWait | McastSetValid) and op.sem not in self.index.sems:
            raise self.fail(op, f"semaphore {int(op.sem)} does not exist")
        if isinstance(op, McastSetValid | McastSend | Barrier) and op.group not in self.index.groups:
            raise self.fail(op, f"group {int(op.group)} does not exist")
        if isinstance(op, SemInc) and op.at not in self.index.sites:
            raise self.fail(op, f"site {int(op.at)} is not a site of the placement")

    def block(self, op: ReadTiles | WriteTiles, bound: tuple[LoopVar, ...]) -> None:
        """A read from an input, parameter or workspace tensor, a write to the output or a workspace, of a block of at
        least one tile."""
        buf = op.into if isinstance(op, ReadTiles) else op.src
        self.buf(op, buf)
        t = self.tensor(op, op.tensor)
        if isinstance(op, ReadTiles) and t.role == TensorRole.OUTPUT:
            raise self.fail(
                op,
                f"it reads {t.name}, the output tensor, into {self.index.name(buf)}; a read comes"
                " from an input, a parameter or a workspace tensor",
                buf,
            )
        if isinstance(op, WriteTiles) and t.role not in (TensorRole.OUTPUT, TensorRole.WORKSPACE):
            raise self.fail(
                op,
                f"it writes {self.index.name(buf)} to {t.name}, {role_text(t)}; only the output tensor and workspace"
                " tensors are written",
                buf,
            )
        self.addr(op, op.at, bound)
        if not (1 <= op.block_h <= MAX_ITEM_SIDE and 1 <= op.block_w <= MAX_ITEM_SIDE):
            raise self.fail(
                op, f"a block must be 1x1 to {MAX_ITEM_SIDE}x{MAX_ITEM_SIDE} tiles, not {op.block_h}x{op.block_w}"
            )
        if op.rows_from is not None:
            sizes = self.tensor(op, op.rows_from)
            if sizes.role != TensorRole.PARAMETER or sizes.dtype != DType.INT32 or sizes.elems != (1, t.groups):
                raise self.fail(
                    op,
                    f"its row counts come from {sizes.name}, {role_text(sizes)} of {sizes.elems[0]}x{sizes.elems[1]}"
                    f" {sizes.dtype.value}; they are an int32 parameter of one value per group of {t.name}"
                    f" (1x{t.groups})",
                    buf,
                )
            if t.order != TileOrder.ROW:
                raise self.fail(op, f"it limits the rows of {t.name}, whose tiles are column-major", buf)

    def addr(self, op: ChoreoOp, at: TileAddr, bound: tuple[LoopVar, ...]) -> None:
        """Every variable of an address is an item coordinate or bound by an enclosing loop."""
        if len(at.steps) > MAX_ADDR_STEPS:
            raise self.fail(op, f"an address of {len(at.steps)} steps; at most {MAX_ADDR_STEPS}")
        for var, _ in at.steps:
            if var not in (LV_ITEM_Y, LV_ITEM_X) and var not in bound:
                raise self.fail(op, f"its address uses {loop_var_name(var)}, which no enclosing loop binds")

    def compute(self, op: Compute, bound: tuple[LoopVar, ...]) -> None:
        for b in (*op.ins, *op.outs, *(x for x in (op.acc, op.acc_reload) if x is not None)):
            self.buf(op, b)
        if isinstance(op.op, MatmulTiles) and (len(op.ins) != 2 or op.outs or op.acc is None):
            raise self.fail(op, "a tile matmul reads two rings (A, B) and adds into an accumulator; it fills no ring")
        if isinstance(op.op, AddPartial) and (len(op.ins) != 1 or op.outs or op.acc is None):
            raise self.fail(op, "adding a partial sum reads one ring into an accumulator; it fills no ring")
        if isinstance(op.op, RowReduce) and (len(op.ins) != 1 or op.outs or op.acc is None):
            raise self.fail(op, "a row reduction reads one ring into an accumulator; it fills no ring")
        if isinstance(op.op, ColReduce) and (len(op.ins) != 1 or op.outs or op.acc is None):
            raise self.fail(op, "a column reduction reads one ring into an accumulator; it fills no ring")
        if isinstance(op.op, ScaleAcc) and (len(op.ins) != 1 or op.outs or op.acc is None):
            raise self.fail(op, "rescaling an accumulator reads one ring (a row vector) into it; it fills no ring")
        if isinstance(op.op, Attention):
            raise self.fail(
                op,
                "attention is a stage's declaration, not an op an engine runs (its schedule runs the"
                " online recurrence)",
            )
        why = compute_fault(op.op, self.index.p.precision, self.index.p.tile)
        if why is not None:
            raise self.fail(op, why)
        elementwise = not isinstance(op.op, MatmulTiles | AddPartial | RowReduce | ColReduce | ScaleAcc)
        pages = max(arg_indices(op.op.expr), default=0) + 1 if isinstance(op.op, Map) else 1
        if elementwise and (len(op.ins) != pages or len(op.outs) != 1 or op.acc is not None):
            raise self.fail(
                op,
                f"an elementwise compute reads the {plural(pages, 'ring')} its expression names and fills one; it"
                " names no accumulator",
            )
        if isinstance(op.op, Map):
            for c in cols(op.op.expr):
                self.bias(op, c, bound)
            for at in positions(op.op.expr):
                self.addr(op, at, bound)
        if isinstance(op.op, RowReduce | ColReduce):
            self.addr(op, op.op.at, bound)
        if isinstance(op.op, MatmulTiles) and op.op.scales is not None:  # where a block-scaled step's scales lie
            s = op.op.scales
            for where in (s.rows, s.cols, s.k, *(() if s.group is None else (s.group,))):
                self.addr(op, where, bound)
        if isinstance(op.op, Dequant):
            self.dequant(op, op.op, bound)

    def dequant(self, op: Compute, dq: Dequant, bound: tuple[LoopVar, ...]) -> None:
        """A dequant's scales and zero points are parameter tensors, read at addresses of bound variables (that
        they hold one value per group and column of the weights is rule 8's `declared`)."""
        for tid in (dq.scale, dq.zero):
            if tid is None:
                continue
            t = self.tensor(op, tid)
            if t.role != TensorRole.PARAMETER:
                raise self.fail(op, f"a dequant's scales and zero points are parameter tensors; {t.name} is {t.role}")
        if dq.width < 1 or dq.group < 1:
            raise self.fail(
                op, f"a dequant's pages are ≥ 1 tile wide and its groups ≥ 1 row, not {dq.width}, {dq.group}"
            )
        self.addr(op, dq.rows, bound)
        self.addr(op, dq.cols, bound)

    def bias(self, op: Compute, bias: Col, bound: tuple[LoopVar, ...]) -> None:
        """A bias names a parameter row, read at an address of bound variables (that it holds one value per column
        of the values it is added to — C's, or a computed operand's — is rule 8's `declared`)."""
        t = self.tensor(op, bias.tensor)
        if bias.axis == VecAxis.ROW and (t.role != TensorRole.PARAMETER or t.elems[1] != 1 or t.tiles[1] != 1):
            raise self.fail(
                op,
                f"a row vector (a per-row scale) is a parameter tensor of one column of values in one column of tiles;"
                f" {t.name} is a {t.role.value} tensor of {t.elems[0]}x{t.elems[1]} in {t.tiles[0]}x{t.tiles[1]}"
                " tiles",
            )
        if bias.axis == VecAxis.COL and (t.role != TensorRole.PARAMETER or t.elems[0] != 1 or t.tiles[0] != 1):
            raise self.fail(
                op,
                f"a column vector (a bias) is a parameter tensor of one row of values in one row of tiles; {t.name} is"
                " a"
                f" {t.role.value} tensor of {t.elems[0]}x{t.elems[1]} in {t.tiles[0]}x{t.tiles[1]} tiles",
            )
        if bias.width < 1:
            raise self.fail(op, f"a column vector is at least 1 tile wide, not {bias.width}")
        self.addr(op, bias.at, bound)

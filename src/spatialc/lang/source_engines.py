"""The engine functions of a program printed as the embedded language's source: each engine's ops as the calls on
its `Engine`, rings and accumulators that record them again (pages reserved and waited for by name, loops as
`e.range` / `e.items`, maps as `e.map` of their stage or of an ew formula), and how a name or an op is spelled in it.

`EngineSource` is a base of `source.SourcePrinter`, whose names and declarations it reads (annotated below).
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import keyword
import re
from collections import deque
from enum import Enum
from typing import Any

from ..ir.ids import LOOP_VAR_NAMES, LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LoopVar, loop_var_name
from ..ir.nodes import ComputeStage, SpatialProgram, TensorRole
from ..ir.ops import (
    ACTIVATION_NAMES,
    REDUCE_OPS,
    SCALAR_OPS,
    AcquireAcc,
    AddPartial,
    Apply,
    Arg,
    Barrier,
    ChoreoOp,
    Col,
    ColReduce,
    Compute,
    Const,
    Lit,
    Loop,
    Map,
    MatmulTiles,
    McastSend,
    McastSetValid,
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
    SemInc,
    SemSet,
    SemWait,
    Span,
    TileAddr,
    VecAxis,
    Wait,
    WriteBarrier,
    WriteTiles,
    cols,
    row_args,
    row_reads,
    with_cols,
    with_row_args,
)
from .maps import ew_source, with_positions


def literal(text: str) -> str:
    """`text` as a double-quoted Python literal of the same value: a name is printed as data, never as code."""
    return json.dumps(text)  # every escape JSON writes (\n, \", \u2028, …) means the same in Python


def op_source(op: object) -> str:
    """An elementwise op as the source that makes it: the one-page forms by their names (`Relu()`, `Scalar("add",
    0.5)`, `Activation("silu")`, `Bias(3, TileAddr(…), 4)`), any other Map or op by its fields."""
    match op:
        case Map(Apply("relu", (Arg(0),), ())):
            return "Relu()"
        case Map(Apply(name, (Arg(0), Lit(v)), ())) if name in SCALAR_OPS:
            return f"Scalar({literal(name)}, {v!r})"
        case Map(Apply(name, (Arg(0),), ())) if name in ACTIVATION_NAMES:
            return f"Activation({literal(name)})"  # by its op's own name (gelu_tanh, not the warned-of bare gelu)
        case Map(Apply("add", (Arg(0), Col(t, at, width)), ())):
            return f"Bias({int(t)}, at={at!r}, width={width})"
    return value_source(op)


def value_source(v: object) -> str:
    """`v` as the source that makes it: `repr`, but an enum member by its name (`WeightFormat.INT4`, which
    `from spatialc.ir.ops import *` brings in; its repr `<WeightFormat.INT4: 'int4'>` is no Python) at any depth."""
    match v:
        case Enum():
            return f"{type(v).__name__}.{v.name}"
        case tuple():
            inner = ", ".join(map(value_source, v))
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        case _ if dataclasses.is_dataclass(v) and not isinstance(v, type):
            args = (f"{f.name}={value_source(getattr(v, f.name))}" for f in dataclasses.fields(v) if f.repr)
            return f"{type(v).__name__}({', '.join(args)})"
    return repr(v)


BUILTINS = frozenset(dir(builtins))


def identifier(name: str, taken: set[str]) -> str:
    """`name` as a Python identifier not yet `taken` (and now taken)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", name) or "x"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = f"_{base}"
    elif base in BUILTINS:  # a stage named map or sum would hide Python's own in the printed module
        base = f"{base}_"
    out, n = base, 1
    while out in taken:
        n += 1
        out = f"{base}_{n}"
    taken.add(out)
    return out


class EngineSource:
    """Prints each engine function's body (a base of `SourcePrinter`, whose program, names, declared stages and
    lines it uses)."""

    p: SpatialProgram  # (annotations only: the state and methods are SourcePrinter's)
    taken: set[str]
    lines: list[str]
    tensors: dict
    buffers: dict
    sems: dict
    stages: dict
    groups: dict
    matmuls: dict
    mapped: dict
    reduces: dict
    row_accs: set
    packed: dict
    vector_maps: set
    uses_ew: bool
    loops: dict[LoopVar, str]
    explicit_items: bool
    local: set[str]
    refuse: Any
    line: Any

    def engines(self) -> None:
        assert self.p.schedule is not None
        classes: dict[tuple[str, tuple[ChoreoOp, ...]], list[int]] = {}
        for q in self.p.schedule.programs:
            classes.setdefault((q.engine.value, q.ops), []).append(int(q.site))
        for (engine, ops), sites in classes.items():
            fn = identifier(f"{engine}_{sites[0]}", self.taken)
            self.line(0, "")
            self.line(1, f"@p.{engine}(sites={sites})")
            self.line(1, f"def {fn}(e: lang.Engine):")
            self.pages: dict[int, deque[str]] = {}
            self.n = 0
            self.local = set(self.taken)  # the module's names and this function's pages (a page is its own local)
            # A split tail's programs run their whole items and their last apart: each ITEM loop says which.
            self.explicit_items = any(isinstance(op, Loop) and op.var == LV_ITEM and op.first for op in ops)
            start = len(self.lines)
            self.body(ops, 2, in_item=False)
            if len(self.lines) == start:
                self.line(2, "pass")

    def body(self, ops: tuple[ChoreoOp, ...], depth: int, in_item: bool) -> None:
        for op in ops:
            self.op(op, depth, in_item)

    def page(self, ring, reserved: bool) -> str:
        queue = self.pages.get((int(ring), reserved))  # type: ignore[call-overload]
        if not queue:
            state = "reserved" if reserved else "waited for"
            raise self.refuse(f"a page of {self.buffers[ring]} used before it is {state}")
        return queue[-1] if reserved else queue[0]

    def acquire(self, ring, reserved: bool, pages: int, depth: int) -> None:
        self.n += 1
        var = identifier(f"{self.buffers[ring]}_{'w' if reserved else 'r'}{self.n}", self.local)
        more = f"{pages}" if pages != 1 else ""
        self.line(depth, f"{var} = {self.buffers[ring]}.{'reserve' if reserved else 'wait'}({more})")
        self.pages.setdefault((int(ring), reserved), deque()).append(var)  # type: ignore[arg-type]

    def release(self, ring, reserved: bool, depth: int) -> None:
        queue = self.pages.get((int(ring), reserved))  # type: ignore[call-overload]
        if not queue:
            what = "push" if reserved else "pop"
            raise self.refuse(f"a {what} of {self.buffers[ring]} before its page in the engine")
        self.line(depth, f"{queue.popleft()}.{'push' if reserved else 'pop'}()")

    def addr(self, at: TileAddr, in_item: bool) -> str:
        terms = [f"{s} * {self.var(v, in_item)}" if s != 1 else self.var(v, in_item) for v, s in at.steps]
        if at.base or not terms:
            terms.append(str(at.base))
        return " + ".join(terms)

    def var(self, v: LoopVar, in_item: bool) -> str:
        if v in (LV_ITEM_Y, LV_ITEM_X):
            item = "item" if in_item else "e.item"
            return f"{item}.{'y' if v == LV_ITEM_Y else 'x'}"
        return self.loop_name(v)

    def loop_name(self, v: LoopVar) -> str:
        """The Python variable of loop `v`: its name (`k`, `head`, `lv8`), unless a tensor or ring took it (`k`,
        attention's K tensor: the loop's variable is then `k_2`, its loop still named "k")."""
        if v not in self.loops:  # a name no page of this function took, nor any name of the module
            self.loops[v] = identifier(loop_var_name(v), self.taken | self.local)
            self.taken.add(self.loops[v])
            self.local.add(self.loops[v])
        return self.loops[v]

    def map_call(self, m: Map, ins: tuple, outs: tuple, in_item: bool) -> str | None:
        """A scheduled map of a stage p.map prints, as e.map — its column vectors and row vectors placed at one
        tile column and page width — or None where it is not one."""
        stage = self.mapped.get((ins, outs))
        if stage is None:
            return None
        declared = stage.kind.op  # type: ignore[union-attr]
        assert isinstance(declared, Map)
        found, rows = cols(m.expr), row_reads(m.expr)
        width = found[0].width if found else rows[0][1] if rows else None
        by_col = [c for c in found if c.axis != VecAxis.ROW]
        by_row = [c for c in found if c.axis == VecAxis.ROW]
        at = by_col[0].at if by_col else TileAddr(0)  # where column vectors are read, and row vectors
        row_at = by_row[0].at if by_row else TileAddr(0)
        if width is None:
            placed = declared
        elif isinstance(width, int) and width >= 1:

            def place(c: Col) -> Col:
                return Col(c.tensor, row_at if c.axis == VecAxis.ROW else at, width, c.axis)

            placed = Map(with_row_args(with_cols(declared.expr, place), width))
        else:
            return None
        if placed != m:
            return None
        pages = [self.page(x, False) for x in ins]
        src = pages[0] if len(pages) == 1 else f"[{', '.join(pages)}]"
        where = f", at={self.addr(at, in_item)}" if by_col and at != TileAddr(0) else ""
        where += f", width={width}" if width is not None else ""
        where += f", row={self.addr(row_at, in_item)}" if by_row and row_at != TileAddr(0) else ""
        return f"e.map({self.stages[stage.id]}, {src}, {self.page(outs[0], True)}{where})"

    def free_map_call(self, m: Map, ins: tuple, dst, in_item: bool) -> str | None:
        """A map no stage declares (a step of a declared stage the engines expand, as attention's), as e.map of an
        ew formula — its column vectors, row vectors and positions placed at one tile column, tile row and page
        width, its row vectors the rings the builder will take for them — or None where it is not one."""
        if any(ins == st.ins for st in self.p.stages if isinstance(st.kind, ComputeStage)):
            return None
        vectors = {ring for ring, accs in self.packed.items() if accs & self.row_accs} | self.vector_maps
        vectors |= {x for st in self.p.stages if isinstance(st.kind, ComputeStage) and
                    isinstance(st.kind.op, RowReduce) for x in st.outs}  # fmt: skip
        shapes = tuple(x in vectors for x in ins)
        if set(row_args(m.expr)) != {i for i, vec in enumerate(shapes) if vec}:
            return None
        found, rows, counted = cols(m.expr), row_reads(m.expr), _positions(m.expr)
        widths = {c.width for c in found} | {w for _, w in rows} | {q.width for q in counted}
        by_col = [c.at for c in found if c.axis != VecAxis.ROW] + [q.at for q in counted if q.axis != VecAxis.ROW]
        by_row = [c.at for c in found if c.axis == VecAxis.ROW] + [q.at for q in counted if q.axis == VecAxis.ROW]
        if len(widths) > 1 or len(set(map(repr, by_col))) > 1 or len(set(map(repr, by_row))) > 1:
            return None
        width = widths.pop() if widths else self.p.buffer(dst).kind.page_tiles  # type: ignore[union-attr]
        at, row = (by_col or [TileAddr(0)])[0], (by_row or [TileAddr(0)])[0]
        unplaced = with_positions(with_cols(m.expr, lambda c: Col(c.tensor, axis=c.axis)), lambda q: Pos(q.axis))
        unplaced = _unplaced_rows(unplaced)
        taken = {"ew", "lambda"}
        args = [identifier(re.sub(r"_ring$", "", self.buffers[x]) or "x", taken) for x in ins]
        tensors = {t.id: t for t in self.p.tensors}

        def column(c: Col) -> str | None:
            t = tensors.get(c.tensor)
            return t.name if t is not None and t.role == TensorRole.PARAMETER and t.name.isidentifier() else None

        try:
            body = ew_source(unplaced, args, shapes, column)
        except ValueError:
            return None
        if all(shapes):
            self.vector_maps.add(dst)
        self.uses_ew = True
        pages = [self.page(x, False) for x in ins]
        src = pages[0] if len(pages) == 1 else f"[{', '.join(pages)}]"
        where = f", at={self.addr(at, in_item)}" if at != TileAddr(0) else ""
        where += f", width={width}"
        where += f", row={self.addr(row, in_item)}" if row != TileAddr(0) else ""
        return f"e.map(lambda {', '.join(args)}: {body}, {src}, {self.page(dst, True)}{where})"

    def op(self, op: ChoreoOp, depth: int, in_item: bool) -> None:
        b = self.buffers
        match op:
            case Loop(var, Const(n), body, first) if var == LV_ITEM:
                explicit = first or self.explicit_items
                self.line(depth, f"for item in e.items({first}, {n}):" if explicit else "for item in e.items():")
                self.body(body, depth + 1, True)
            case Loop(var, count, body) if var != LV_ITEM:
                name = loop_var_name(var)
                named = f'"{name}"' if var in LOOP_VAR_NAMES or name.startswith("lv") else "None"
                name = self.loop_name(var)
                if isinstance(count, Const):
                    self.line(depth, f"for {name} in e.range({count.n}, {named}):")
                elif isinstance(count, Span):
                    value = self.addr(TileAddr(count.base, count.steps), in_item)
                    self.line(depth, f"for {name} in e.range_span({value}, {count.per}, {count.bound}, {named}):")
                else:
                    element = self.addr(TileAddr(count.index, count.steps), in_item)
                    self.line(
                        depth,
                        f"for {name} in e.range_from({self.tensors[count.tensor]}, {element}, {count.bound},"
                        f" per={count.per}, name={named}):",
                    )
                self.body(body, depth + 1, in_item)
                if not body:
                    self.line(depth + 1, "pass")
            case Reserve(ring, pages):
                self.acquire(ring, True, pages, depth)
            case Wait(ring, pages):
                self.acquire(ring, False, pages, depth)
            case Push(ring, _):
                self.release(ring, True, depth)
            case Pop(ring, _):
                self.release(ring, False, depth)
            case ReadTiles(tensor, at, bh, bw, sh, sw, into, counts):
                args = f"{self.tensors[tensor]}, {self.addr(at, in_item)}, {bh}, {bw}, strides=({sh}, {sw})"
                args += f", rows_from={self.tensors[counts]}" if counts is not None else ""
                self.line(depth, f"{self.page(into, True)}.read({args})")
            case WriteTiles(src, tensor, at, bh, bw, sh, sw, counts):
                args = f"{self.tensors[tensor]}, {self.addr(at, in_item)}, {bh}, {bw}, strides=({sh}, {sw})"
                args += f", rows_from={self.tensors[counts]}" if counts is not None else ""
                self.line(depth, f"{self.page(src, False)}.write({args})")
            case Barrier(group):
                self.line(depth, f"e.barrier({self.groups[group]})")
            case AcquireAcc(acc):
                self.line(depth, f"{b[acc]}.acquire()")
            case ReleaseAcc(acc):
                self.line(depth, f"{b[acc]}.release()")
            case Compute(MatmulTiles() as mm, (x, y), (), acc, None) if acc is not None:
                stage = self.matmuls.get((x, y))
                pages = f"{self.page(x, False)}, {self.page(y, False)}"
                if stage is not None:
                    self.line(depth, f"{b[acc]}.matmul({stage}, {pages})")
                elif mm.sub_blocks == (1, 1) and mm.operand == self.p.precision:  # a step of a declared stage
                    blk = (mm.block.osh, mm.block.osw, mm.block.ibw)
                    transposed = ", transpose_b=True" if mm.transpose_b else ""
                    self.line(depth, f"{b[acc]}.product({pages}, block={blk}{transposed})")
                else:
                    raise self.refuse("a matmul of rings no matmul stage names")
            case Compute(RowReduce() as rr, (src,), (), acc, None) if acc is not None:
                self.row_accs.add(acc)
                folds = self.reduces.get(src)
                where = f", at={self.addr(rr.at, in_item)}" if rr.at != TileAddr(0) else ""
                page = self.page(src, False)
                if folds is not None and dataclasses.replace(folds.kind.op, at=rr.at, width=rr.width) == rr:  # type: ignore[union-attr]
                    self.line(depth, f"{b[acc]}.reduce({self.stages[folds.id]}, {page}{where}, width={rr.width})")
                elif folds is None and rr.op in REDUCE_OPS:  # a step of a declared stage (attention's running max)
                    op_name = literal(rr.op)
                    self.line(depth, f"{b[acc]}.reduce({op_name}, {page}{where}, width={rr.width}, cols={rr.cols})")
                else:
                    raise self.refuse("a row reduction no p.reduce stage declares")
            case Compute(ColReduce() as cr, (src,), (), acc, None) if acc is not None:
                folds = self.reduces.get(src)
                if folds is None or dataclasses.replace(folds.kind.op, at=cr.at, width=cr.width) != cr:  # type: ignore[union-attr]
                    raise self.refuse("a column reduction no p.col_reduce stage declares")
                where = f", row={self.addr(cr.at, in_item)}" if cr.at != TileAddr(0) else ""
                page = self.page(src, False)
                self.line(depth, f"{b[acc]}.reduce({self.stages[folds.id]}, {page}{where}, width={cr.width})")
            case Compute(ScaleAcc(), (src,), (), acc, None) if acc is not None:
                self.line(depth, f"{b[acc]}.scale({self.page(src, False)})")
            case Compute(Map() as m, srcs, outs, None, None) if call := self.map_call(m, srcs, outs, in_item):
                self.line(depth, call)
            case Compute(Map() as m, srcs, (dst,), None, None) if call := self.free_map_call(m, srcs, dst, in_item):
                self.line(depth, call)
            case Compute(AddPartial(), (src,), (), acc, None) if acc is not None:
                self.line(depth, f"{b[acc]}.add({self.page(src, False)})")
            case Compute(stage_op, (src,), (dst,), None, None) if not isinstance(stage_op, MatmulTiles):
                self.line(depth, f"e.compute({op_source(stage_op)}, {self.page(src, False)}, {self.page(dst, True)})")
            case Compute(stage_op, srcs, (dst,), None, None) if isinstance(stage_op, Map) and len(srcs) > 1:
                pages = ", ".join(self.page(s, False) for s in srcs)
                self.line(depth, f"e.compute({op_source(stage_op)}, [{pages}], {self.page(dst, True)})")
            case PackAcc(acc, to, tiles, False):
                self.packed.setdefault(to, set()).add(acc)
                self.line(depth, f"{b[acc]}.pack({self.page(to, True)}, tiles={tiles})")
            case McastSend(ring, group):
                self.line(depth, f"{self.page(ring, True)}.send({self.groups[group]})")
            case McastSetValid(sem, group, value):
                self.line(depth, f"e.set_valid({self.sems[sem]}, {self.groups[group]}, {value})")
            case SemInc(sem, at, by):
                self.line(depth, f"e.sem_inc({self.sems[sem]}, {int(at)}, {by})")
            case SemWait(sem, value):
                self.line(depth, f"e.sem_wait({self.sems[sem]}, {value})")
            case SemSet(sem, value):
                self.line(depth, f"e.sem_set({self.sems[sem]}, {value})")
            case ReadBarrier():
                self.line(depth, "e.read_barrier()")
            case WriteBarrier():
                self.line(depth, "e.write_barrier()")
            case _:
                raise self.refuse(f"the op {type(op).__name__}")


def _positions(expr) -> list[Pos]:
    """The positions (`Pos`) `expr` reads."""
    match expr:
        case Pos():
            return [expr]
        case Apply(_, args):
            return [q for a in args for q in _positions(a)]
    return []


def _unplaced_rows(expr):
    """`expr` with every row vector read at the width a formula is written with (1: e.map places it)."""
    match expr:
        case RowArg(i, _):
            return RowArg(i)
        case Apply(op, args, params):
            return Apply(op, tuple(_unplaced_rows(a) for a in args), params)
    return expr

"""A program printed as the embedded language's Python source (`spatialc show --python FILE.json`): declarations,
then one engine function per engine and group of sites that run the same ops, with explicit page handling. Run,
the source traces back to a program equal to the one printed (tests/lang/test_lang.py)."""

from __future__ import annotations

import importlib
import re

from ..ir.ids import LoopVar
from ..ir.names import plain
from ..ir.nodes import (
    Accumulator,
    ComputeStage,
    Fifo,
    Interm,
    ReadStage,
    SpatialProgram,
    Stage,
    TensorRole,
    WriteStage,
)
from ..ir.ops import (
    REDUCE_OPS,
    AddPartial,
    Attention,
    Col,
    ColReduce,
    Map,
    MatmulTiles,
    RowReduce,
    TileAddr,
    VecAxis,
)
from .builder import default_dtype, least_tiles
from .lines import LangError
from .maps import ew_source
from .source_engines import EngineSource, identifier, literal, op_source

# The modules the printed source imports every name of (`from … import *`): the ids and ops it prints by their
# classes (`Bias(…)`, `TileAddr(…)`).
STAR_IMPORTS = ("spatialc.ir.ids", "spatialc.ir.ops")


def module_names() -> set[str]:
    """Every name the printed module binds besides the program's own: what it imports (by name and by `*`) and
    defines, and the engine functions' parameter and item variable — none a variable the printer invents may take."""
    names = {"p", "e", "ew", "lang", "program", "item"}
    for module in map(importlib.import_module, STAR_IMPORTS):
        public = getattr(module, "__all__", None)
        names.update(public if public is not None else (n for n in vars(module) if not n.startswith("_")))
    return names


class SourcePrinter(EngineSource):
    """One program's source."""

    def __init__(self, p: SpatialProgram):
        self.p = p
        self.taken: set[str] = module_names()  # then every identifier invented below, as it is
        self.lines: list[str] = []
        self.tensors = {t.id: identifier(t.name, self.taken) for t in p.tensors}
        self.buffers = {b.id: identifier(b.name, self.taken) for b in p.buffers}
        self.sems = {s.id: identifier(s.name, self.taken) for s in p.semaphores}
        self.stages = {s.id: identifier(s.name, self.taken) for s in p.stages}
        assert p.placement is not None
        self.groups = {g.id: identifier(f"group{int(g.id)}", self.taken) for g in p.placement.groups}
        self.matmuls = {s.ins: self.stages[s.id] for s in p.stages if isinstance(s.kind, ComputeStage) and
                        isinstance(s.kind.op, MatmulTiles)}  # fmt: skip
        self.formulas = self.ew_formulas()  # the maps p.map prints: a program's with no matmul
        self.mapped = {(s.ins, s.outs): s for s in p.stages if s.id in self.formulas}
        self.reduces = {s.ins[0]: s for s in p.stages if self.reduce_call(s) is not None}
        # As the builder sees them while the engines are traced (Builder.row_vectors): the accumulators rows are
        # reduced into, those packed into each ring, the rings maps of row vectors alone fill.
        self.row_accs: set = set()
        self.packed: dict = {}
        self.vector_maps: set = set()
        self.uses_ew = bool(self.formulas)
        self.loops: dict[LoopVar, str] = {}
        self.local: set[str] = set()  # the names one engine function takes (EngineSource.engines)

    def ew_formulas(self) -> dict[object, str]:
        """Each map stage of a program with no matmul as the function p.map takes (`lambda x, m: ew.exp(x - m)`),
        where its formula has that form (a GEMM's epilogue keeps its named forms, Bias(…), Relu())."""
        if self.matmuls:
            return {}
        out: dict[object, str] = {}
        filled: set = set()
        vectors: set = set()
        for s in self.p.stages:
            if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map) and len(s.outs) == 1 and s.ins:
                text = self.ew_formula(s, vectors) if filled.issuperset(s.ins) else None
                if text is not None:
                    out[s.id] = text
            reduces = isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce)
            if reduces or (s.id in out and vectors.issuperset(s.ins)):  # a map of row vectors alone is one too
                vectors.update(s.outs)
            filled.update(s.outs)
        return out

    def ew_formula(self, s: Stage, vectors: set) -> str | None:
        taken = {"ew", "lambda"}
        args = [identifier(re.sub(r"_ring$", "", self.buffers[b]) or "x", taken) for b in s.ins]
        tensors = {t.id: t for t in self.p.tensors}

        def column(c: Col) -> str | None:  # the tensor's name, where ew.col / ew.row reads it back to c's tensor
            t = tensors.get(c.tensor)
            one = 1 if c.axis == VecAxis.ROW else 0  # a row vector is one column of values, a column vector one row
            ok = t is not None and t.role == TensorRole.PARAMETER and t.elems[one] == 1 and t.name.isidentifier()
            return t.name if ok and t is not None else None

        assert isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map)
        try:
            body = ew_source(s.kind.op.expr, args, tuple(b in vectors for b in s.ins), column)
        except ValueError:
            return None
        return f"lambda {', '.join(args)}: {body}"

    def reduce_call(self, s: Stage) -> str | None:
        """Reduction stage `s` as p.reduce (rows) or p.col_reduce (columns) declares it, where it has that form."""
        if len(s.ins) != 1 or len(s.outs) != 1:
            return None
        src, dst = self.buffers[s.ins[0]], self.buffers[s.outs[0]]
        match s.kind:
            case ComputeStage(RowReduce(op, n, TileAddr(0, ()), 1)) if op in REDUCE_OPS:
                return f"p.reduce({literal(s.name)}, {literal(op)}, {src}, {dst}, cols={n})"
            case ComputeStage(ColReduce(op, n, TileAddr(0, ()), 1)) if op in REDUCE_OPS:
                return f"p.col_reduce({literal(s.name)}, {literal(op)}, {src}, {dst}, rows={n})"
        return None

    def attention_call(self, s: Stage, op: Attention) -> str | None:
        """Attention stage `s` as p.attention declares it — where what p.attention reads off the tensors read into
        its rings (each head's rows, the query heads a KV head serves) is what `op` says."""
        reads = {x: st.kind.tensor for st in self.p.stages if isinstance(st.kind, ReadStage) for x in st.outs}
        if len(s.ins) != 3 or len(s.outs) != 2 or s.ins[0] not in reads or s.ins[1] not in reads:
            return None
        q, k = (self.p.tensor(reads[x]) for x in s.ins[:2])
        if (q.elems[0], k.elems[0], q.groups) != (op.seq_q, op.seq_kv, op.group * k.groups):
            return None
        rings = ", ".join(self.buffers[x] for x in (*s.ins, *s.outs))
        return f"p.attention({literal(s.name)}, {rings}, causal={op.causal}, scale={op.scale!r})"

    def refuse(self, what: str) -> LangError:
        return LangError(f"program {self.p.name}: {what} has no form in spatialc.lang yet")

    def text(self) -> str:
        p = self.p
        name = literal(p.name)  # a name is printed as a literal Python reads back, never as code (ir/names.py)
        if any(getattr(getattr(s.kind, "op", None), "scales", None) is not None for s in p.stages):
            raise self.refuse("a block-scaled matmul (spatialc.gemm's scales=)")
        self.declarations()
        self.engines()
        header = [
            f'"""{plain(p.name)}: printed by spatialc from its IR (spatialc show --python). Run it to trace it'
            ' again."""',
            "",
            "from spatialc import ew, lang" if self.uses_ew else "from spatialc import lang",
            f"from {STAR_IMPORTS[0]} import *  # noqa: F403 (the ids an elementwise op's fields name)",
            f"from {STAR_IMPORTS[1]} import *  # noqa: F403 (elementwise ops: Map, Apply, Arg, Lit, Col, Requant)",
            "",
            "",
            f"@lang.program(target={literal(p.target)}, precision={literal(p.precision.value)}, name={name})",
            "def program(p: lang.Builder):",
        ]
        self.lines[:0] = header
        self.lines += ["", "", 'if __name__ == "__main__":', '    print(f"{program().name}: verified")']
        return "\n".join(self.lines) + "\n"

    def line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    # ---- what the program declares ----

    def declarations(self) -> None:
        p = self.p
        for t in p.tensors:
            args = [literal(t.name), str(t.elems[0]), str(t.elems[1])]
            if t.dtype != default_dtype(t.role, p.precision):
                args.append(f'dtype="{t.dtype.value}"')
            if t.role == TensorRole.INPUT and t.order.value != "row":
                args.append(f'order="{t.order.value}"')
            least = least_tiles(*t.elems)
            if t.tiles != (least[0] * t.groups, least[1]):
                args.append(f"tiles={t.tiles}")
            if t.groups != 1:
                if t.role not in (TensorRole.INPUT, TensorRole.OUTPUT):
                    raise self.refuse(f"{t.role.value} {t.name} of {t.groups} groups")
                args.append(f"groups={t.groups}")
            self.line(1, f"{self.tensors[t.id]} = p.{t.role.value}({', '.join(args)})")
        for b in p.buffers:
            if b.origin is not None:
                raise self.refuse(f"buffer {b.name}, a per-site copy")
            match b.kind:
                case Fifo(depth, tiles, layout) | Interm(depth, tiles, layout):
                    extra = f', layout="{layout.value}"' if layout.value != "row" else ""
                    extra += ', kind="interm"' if isinstance(b.kind, Interm) else ""
                    ring = f"p.ring({literal(b.name)}, depth={depth}, tiles={tiles}{extra})"
                    self.line(1, f"{self.buffers[b.id]} = {ring}")
                case Accumulator(tiles):
                    self.line(1, f"{self.buffers[b.id]} = p.accumulator({literal(b.name)}, tiles={tiles})")
        for i, sem in enumerate(p.semaphores):
            extra = f", initial={sem.initial}" if sem.initial else ""
            extra += f", number={int(sem.id)}" if int(sem.id) != i + 1 else ""
            self.line(1, f"{self.sems[sem.id]} = p.semaphore({literal(sem.name)}{extra})")
        for s in p.stages:
            name, engine = literal(s.name), s.engine.value
            match s.kind:
                case ReadStage(tensor):
                    at = "" if engine == "reader" else f', engine="{engine}"'
                    call = f"p.read({name}, {self.tensors[tensor]}, {self.buffers[s.outs[0]]}{at})"
                case WriteStage(tensor):
                    at = "" if engine == "writer" else f', engine="{engine}"'
                    call = f"p.write({name}, {self.buffers[s.ins[0]]}, {self.tensors[tensor]}{at})"
                case ComputeStage(MatmulTiles(block, sub_blocks, _)):
                    a, b, out = (self.buffers[x] for x in (*s.ins, s.outs[0]))
                    blk = (block.osh, block.osw, block.ibw)
                    partial = f", partial={self.buffers[s.outs[1]]}" if len(s.outs) > 1 else ""
                    call = f"p.matmul({name}, {a}, {b}, {out}, block={blk}, sub_blocks={sub_blocks}{partial})"
                case ComputeStage(AddPartial()):
                    call = f"p.add_partials({name}, {self.buffers[s.ins[0]]})"
                case ComputeStage(Attention() as op) if (attention := self.attention_call(s, op)) is not None:
                    call = attention
                case ComputeStage(Map()) if s.id in self.formulas:
                    srcs = [self.buffers[b] for b in s.ins]
                    src = srcs[0] if len(srcs) == 1 else f"[{', '.join(srcs)}]"
                    call = f"p.map({name}, {self.formulas[s.id]}, {src}, {self.buffers[s.outs[0]]})"
                case ComputeStage(RowReduce() | ColReduce()) if (reduce := self.reduce_call(s)) is not None:
                    call = reduce
                case ComputeStage(op):
                    srcs = [self.buffers[b] for b in s.ins]
                    src = srcs[0] if len(srcs) == 1 else f"[{', '.join(srcs)}]"
                    call = f"p.elementwise({name}, {op_source(op)}, {src}, {self.buffers[s.outs[0]]})"
                case _:
                    raise self.refuse(f"stage {s.name}")
            self.line(1, f"{self.stages[s.id]} = {call}")
        for plan in p.plans:
            blk = (plan.block.osh, plan.block.osw, plan.block.ibw)
            grouped = f", groups={plan.groups}" if plan.groups != 1 else ""
            self.line(
                1,
                f"p.plan(block={blk}, grid={plan.grid}, k_tiles={plan.k_tiles}, depth={plan.depth},"
                f" sub_blocks={plan.sub_blocks}{grouped})",
            )
        pl = self.p.placement
        assert pl is not None
        items = [[int(i) for i in items] for _, items in pl.items_of_site]
        if [int(s) for s, _ in pl.items_of_site] != list(range(len(items))):
            raise self.refuse("a placement whose sites are not 0, 1, …")
        rule = f"kind={literal(pl.kind)}, band={pl.band}, multicast={tuple(pl.multicast)}, splits={pl.splits}"
        rule += f", tail={pl.tail}" if pl.tail else ""
        self.line(1, f"p.place({items}, {rule})")
        for g in pl.groups:
            if int(g.id) != pl.groups.index(g):
                raise self.refuse(f"group {int(g.id)} out of order")
            self.line(1, f"{self.groups[g.id]} = p.group({[int(s) for s in g.sites]})")


def python_source(p: SpatialProgram) -> str:
    """`p` as the embedded language's source: a module whose `program()` traces and verifies it again. `p` is a
    verified program (`spatialc show --python` verifies it first); one with no placement or schedule is refused."""
    if p.placement is None or p.schedule is None:  # a frontend program: the language always places and schedules
        raise LangError(f"program {p.name}: a program with no placement or schedule has no form in spatialc.lang yet")
    return SourcePrinter(p).text()

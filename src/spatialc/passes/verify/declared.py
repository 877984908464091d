"""What a program's stages declare C to be (verify's rule 8 proves the schedule computes it; the numpy reference
computes it with numpy).

The stages must be one pipeline: reads of tensors, a tile matmul, a chain of elementwise bias / relu / scalar /
activation / requant stages, and one write of the output — every stage on the way to C, the chain read by its rings
(not by the order the stages are listed in), the operands by the matmul stage's rings (not by their names). An
operand may itself be computed: a ring filled by a chain of elementwise stages from another tile matmul (a two-layer
MLP: gelu(X @ W1) @ W2), whose operands may be computed in turn. A computed operand is multiplied in the operand
precision — rounded to bf16 / fp16 with round-to-nearest-even, or, in an int8 program, the int8 values a requant
made. Split-K adds its partial path beside a single matmul: a write of its partial sums to a workspace, a read of
them back, an add into the accumulator. Its types and integer bounds are checked here too: the function must be one
the interpreter computes exactly and the output can hold.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import BufferId, StageId, TensorId
from ...ir.index import ProgramIndex
from ...ir.nodes import (
    ComputeStage,
    DType,
    PageLayout,
    ReadStage,
    Stage,
    Tensor,
    TensorRole,
    WriteStage,
    accumulator_dtype,
)
from ...ir.ops import (
    AddPartial,
    Apply,
    Arg,
    Col,
    Dequant,
    Expr,
    Map,
    MatmulTiles,
    Precision,
    Requant,
    RowReduce,
    VecAxis,
    arg_indices,
    cols,
    row_args,
)
from ...ir.printer import compute_text
from ...numerics import elementwise, epilogue
from ...numerics.elementwise import ElementwiseError
from ...numerics.epilogue import EXACT_LIMIT, dot_range, integer_peak, integer_range
from ...numerics.rounding import computed_operand
from .dataflow import Declared, MatmulDecl, SplitDecl
from .dequant import dequant_operand


def _unsure(what: str) -> StrongerCheckNeeded:
    return StrongerCheckNeeded(f"the stages: {what}; the semantic rule (verify's rule 8) cannot state what C is")


def _chain_op(op: object, pages: int = 1) -> bool:
    """An op an epilogue chain holds: a requant, or a Map of the page before it (a bias, relu, scalar, activation, or
    any formula of the elementwise table over that page, constants and column or row vectors) and of `pages` − 1
    more pages each read from a tensor (a residual, a gate), each page read."""
    if isinstance(op, Requant):
        return pages == 1
    return (
        isinstance(op, Map)
        and set(arg_indices(op.expr)) <= set(range(pages))
        and (pages == 1 or set(arg_indices(op.expr)) == set(range(pages)))
    )


def _reduces_rows(p) -> bool:
    """Whether the stages reduce rows and multiply nothing: a row program (`_declared_rows`)."""
    ops = [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage)]
    return any(isinstance(op, RowReduce) for op in ops) and not any(isinstance(op, MatmulTiles) for op in ops)


def declared_outputs(index: ProgramIndex) -> tuple[Declared, ...]:
    """Each output's declared function: a GEMM's or a map program's one; a row program's one for each write stage
    (LayerNorm's out, mean and rstd), the program's first output tensor first."""
    if _reduces_rows(index.p):
        return _declared_row_outputs(index)
    return (declared(index),)


def declared(index: ProgramIndex) -> Declared:
    """The stages' function, or StrongerCheckNeeded when they are not one pipeline ending in one write: reads of
    tensors, tile matmuls, chains of elementwise stages, one write — every stage on the way to C. (A row program's
    may write several outputs: this is its first output's, `declared_outputs` gives each.)"""
    p = index.p
    if _reduces_rows(p):
        return declared_outputs(index)[0]
    work = {t.id for t in p.tensors if t.role == TensorRole.WORKSPACE}
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage) and s.kind.tensor not in work]
    if len(writes) != 1 or len(writes[0].ins) != 1:
        raise _unsure(f"{len(writes)} write stages of the output (one, emptying one ring, is what it proves)")
    out = index.tensors[writes[0].kind.tensor]  # type: ignore[union-attr]
    unwritten = [t.name for t in p.tensors if t.role == TensorRole.OUTPUT and t.id != out.id]
    if unwritten:  # (the interpreter would hand it back as it found it; a GPU, as its memory held it)
        raise SemanticError(f"output {unwritten[0]} is written by no stage; {writes[0].name} writes {out.name}")
    producer: dict[BufferId, Stage] = {}
    for s in p.stages:
        for b in s.outs:
            if producer.setdefault(index.ring(b), s) is not s:
                raise _unsure(f"stages {producer[index.ring(b)].name} and {s.name} both fill {index.name(b)}")
    last = index.ring(writes[0].ins[0])
    ops = [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage)]
    for s in p.stages:  # a row vector is a row reduction's: a GEMM or a map of reads has none to read
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map) and row_args(s.kind.op.expr):
            raise _unsure(f"stage {s.name} reads a row vector, and no stage reduces rows")
    if not any(isinstance(op, MatmulTiles) for op in ops):
        return _declared_map(index, out, last, producer, writes[0])
    way = _Way(index, producer)
    stage, ring, chain = way.to_matmul(last, f"the way to {writes[0].name}")
    top = way.matmul(stage, ring, chain)
    decl = Declared(
        out, last, producer, chain, *top.operands, stage, top.shape, top.k_need, top.k_max, ring, None, way.matmuls
    )
    _gemm(index, decl, top)
    if len(way.matmuls) > 1 and (work or out.groups > 1):
        raise _unsure("a matmul of computed tiles in a split-K or grouped GEMM (the rule proves each apart)")
    decl = dataclasses.replace(decl, split=_split(index, stage, ring, producer, work))
    _every_stage_used(index, decl, writes[0])
    _epilogue_types(index, decl)
    _integer_bounds(index, decl)
    return decl


def _declared_map(
    index: ProgramIndex, out: Tensor, last: BufferId, producer: dict[BufferId, Stage], write: Stage
) -> Declared:
    """A program with no matmul: C = map(x0, x1, …), element by element — one Map stage whose rings are each filled
    by a read of a tensor of C's shape, the map's ring written. Its types: inputs of the program's precision, column
    vectors of the accumulator's type, one value per column; its integer values within what int64 and C hold."""
    p = index.p
    stage = producer.get(last)
    if stage is None or not isinstance(stage.kind, ComputeStage) or not isinstance(stage.kind.op, Map):
        raise _unsure(
            f"{write.name} writes a ring no elementwise stage fills; a program with no matmul is one map of its reads"
        )
    reads = [producer.get(index.ring(b)) for b in stage.ins]
    for b, r in zip(stage.ins, reads, strict=True):
        if r is None or not isinstance(r.kind, ReadStage):
            raise _unsure(f"stage {stage.name} reads {index.name(b)}, which no read of a tensor fills")
    used = {write.id, stage.id, *(r.id for r in reads if r is not None)}
    extra = [s.name for s in p.stages if s.id not in used]
    if extra:
        raise SemanticError(f"stage {extra[0]} is not on the way from the inputs to {out.name}")
    for r in reads:
        t = index.tensors[r.kind.tensor]  # type: ignore[union-attr]
        if t.elems != out.elems or t.dtype != DType(p.precision.value) or t.groups != 1:
            raise SemanticError(
                f"stage {stage.name} maps {t.name} ({t.elems[0]}x{t.elems[1]} {t.dtype.value}) element by element"
                f" into {out.name} ({out.elems[0]}x{out.elems[1]}): a map's inputs have its output's shape and hold"
                f" {p.precision.value} values"
            )
    decl = Declared(out, last, producer, (stage,))
    _map_types(index, decl, stage)
    return decl


def _declared_row_outputs(index: ProgramIndex) -> tuple[Declared, ...]:
    """A row program's outputs, each declared by its own write stage (`_declared_rows`): every output tensor written
    by exactly one write stage, every stage on the way to one of them."""
    p = index.p
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage)]
    producer: dict[BufferId, Stage] = {}
    for s in p.stages:
        for b in s.outs:
            if producer.setdefault(index.ring(b), s) is not s:
                raise _unsure(f"stages {producer[index.ring(b)].name} and {s.name} both fill {index.name(b)}")
    by_tensor: dict[TensorId, Stage] = {}
    for w in writes:
        t = index.tensors[w.kind.tensor]  # type: ignore[union-attr]
        if len(w.ins) != 1:
            raise _unsure(f"write stage {w.name} empties {len(w.ins)} rings (one, its output's, is what it proves)")
        if t.role != TensorRole.OUTPUT:
            raise SemanticError(f"write stage {w.name} writes {t.name}, which is no output of the program")
        if t.id in by_tensor:
            raise SemanticError(
                f"write stages {by_tensor[t.id].name} and {w.name} both write {t.name}: each output is written by one"
            )
        by_tensor[t.id] = w
    outputs = [t for t in p.tensors if t.role == TensorRole.OUTPUT]
    unwritten = [t.name for t in outputs if t.id not in by_tensor]
    if unwritten:
        raise SemanticError(f"output {unwritten[0]} is written by no stage")
    reads = [index.tensors[s.kind.tensor] for s in p.stages if isinstance(s.kind, ReadStage)]  # type: ignore[union-attr]
    if not reads:
        raise _unsure("a row program that reads no tensor")
    shape = reads[0].elems  # the rows': every read and every output of values has it, a row vector's is (m, 1)
    every = frozenset(by_tensor)
    decls, used = [], set()
    for t in outputs:
        w = by_tensor[t.id]
        decl = _declared_rows(index, t, index.ring(w.ins[0]), producer, w, shape)
        decls.append(dataclasses.replace(decl, others=every - {t.id}))
        used |= {w.id, *decl.used}
    extra = [s.name for s in p.stages if s.id not in used]
    if extra:
        raise SemanticError(f"stage {extra[0]} is not on the way from the inputs to any output")
    return tuple(decls)


def _declared_rows(
    index: ProgramIndex,
    out: Tensor,
    last: BufferId,
    producer: dict[BufferId, Stage],
    write: Stage,
    shape: tuple[int, int],
) -> Declared:
    """One output of a program that reduces rows (softmax, RMSNorm, LayerNorm's out, mean and rstd): its stages a
    graph of reads of tensors of the rows' `shape` (m × n), maps of them element by element, and row reductions,
    each of one ring of such values into a row vector that later maps read by row (RowArg); a map of row vectors
    alone is a row vector. The output is the value of the ring its write empties: pages of values for a tensor of
    the rows' shape, a row vector for one of m × 1. Each reduction reduces the rows' logical width, its padding left
    out. Its values are float32 (an int8 program reduces no rows yet). `chain` holds the compute stages on its way,
    each after the stages it reads."""
    p = index.p
    if p.precision == Precision.INT8:
        raise _unsure("an int8 program that reduces rows (row reductions are float arithmetic here)")
    order: list[Stage] = []
    state: dict[StageId, bool] = {}  # False while its inputs are followed, True once ordered
    vector: dict[StageId, bool] = {}  # whether the stage's value is a row vector (one value a row)
    whose_rows = out.name if out.elems == shape else "the inputs"

    def full(ring: BufferId, whose: str) -> Stage:
        """The stage filling `ring`, read element by element: a read of a tensor of the rows' shape, or a map."""
        stage = follow(ring, whose)
        if vector[stage.id]:
            raise SemanticError(
                f"{whose} reads {index.name(ring)}, stage {stage.name}'s row vector, element by element; a map reads a"
                " row vector by row (x[row])"
            )
        return stage

    def follow(ring: BufferId, whose: str) -> Stage:
        stage = producer.get(index.ring(ring))
        if stage is None:
            raise _unsure(f"no stage fills {index.name(ring)}, which {whose} reads")
        if state.get(stage.id) is False:
            raise _unsure("the stages form a cycle")
        if stage.id in state:
            return stage
        state[stage.id] = False
        match stage.kind:
            case ReadStage(tensor):
                t = index.tensors[tensor]
                if t.elems != shape or t.dtype != DType(p.precision.value) or t.groups != 1:
                    raise SemanticError(
                        f"stage {stage.name} reads {t.name} ({t.elems[0]}x{t.elems[1]} {t.dtype.value}) for values"
                        f" element by element of rows of {shape[0]}x{shape[1]}: a row program's inputs have one shape"
                        f" and hold {p.precision.value} values"
                    )
                vector[stage.id] = False
            case ComputeStage(Map(expr)):
                vector[stage.id] = _map_of_rows(index, stage, expr, follow, full, vector)
                _map_types(index, Declared(out, last, producer), stage, shape[1])
            case ComputeStage(RowReduce(_, n)) if len(stage.ins) == len(stage.outs) == 1:
                full(stage.ins[0], f"stage {stage.name}")
                if n != shape[1]:
                    raise SemanticError(
                        f"stage {stage.name} reduces rows of {n} values, but {whose_rows}'s rows hold {shape[1]}: a"
                        " reduction covers each row's values, and no padding"
                    )
                vector[stage.id] = True
            case _:
                raise _unsure(
                    f"stage {stage.name} is no read, map or row reduction (a row program's stages are those only)"
                )
        state[stage.id] = True
        if isinstance(stage.kind, ComputeStage):
            order.append(stage)
        return stage

    rows_of = out.elems == (shape[0], 1) and vector[follow(last, write.name).id]
    if not rows_of:
        full(last, write.name)
        if out.elems != shape:
            raise SemanticError(
                f"{write.name} writes {out.name} ({out.elems[0]}x{out.elems[1]}) from pages of the rows' values"
                f" ({shape[0]}x{shape[1]}): an output has the rows' shape, or one value a row ({shape[0]}x1) from a"
                " row vector"
            )
    if out.dtype not in (DType.FLOAT32, DType.FP16, DType.BF16):
        raise SemanticError(f"a row program computes float32 values; its output {out.name} holds {out.dtype.value}")
    reads = [s for s in producer.values() if s.id in state and isinstance(s.kind, ReadStage)]
    row_tiles = index.tensors[reads[0].kind.tensor].tiles[1] if reads else 0  # type: ignore[union-attr]
    return Declared(
        out, last, producer, tuple(order), rows=True, vector=rows_of, row_tiles=row_tiles, used=frozenset(state)
    )


def _map_of_rows(index: ProgramIndex, stage: Stage, expr: Expr, follow, full, vector) -> bool:
    """Follow a map's inputs; whether it is a map of row vectors alone (itself a row vector)."""
    far = [i for i in arg_indices(expr) if i >= len(stage.ins)]
    if far:
        raise SemanticError(f"stage {stage.name}'s formula reads page {far[0]} of the {len(stage.ins)} rings it names")
    rows = row_args(expr)
    whole = _args(expr)
    for i, b in enumerate(stage.ins):
        if i in rows and Arg(i) in whole:
            raise SemanticError(f"stage {stage.name} reads its page {i} both element by element and by row")
        if i in rows:
            vec = follow(b, f"stage {stage.name}")
            if not vector[vec.id]:
                raise SemanticError(
                    f"stage {stage.name} reads {index.name(b)} by row (x{i}[row]), and no row reduction, nor a map of"
                    " row vectors, fills it"
                )
        else:
            full(b, f"stage {stage.name}")
    if whole:
        return False
    if not rows:
        raise _unsure(f"stage {stage.name} maps no page (a map reads pages of values, or row vectors)")
    if cols(expr):
        raise SemanticError(
            f"stage {stage.name} maps row vectors alone, one value a row, and reads a column vector, one value a column"
        )
    return True


def _args(expr: Expr) -> set[Arg]:
    """The element-by-element page reads (Arg) of `expr`."""
    match expr:
        case Arg():
            return {expr}
        case Apply(_, args):
            return {x for a in args for x in _args(a)}
    return set()


def _map_types(index: ProgramIndex, decl: Declared, stage: Stage, width: int | None = None) -> None:
    """A map's column vectors, one accumulator-typed value per column of C, and row vectors, one per row; its output
    type, and in an int8 program its values' range, which must stay where the interpreter's int64 is exact and C
    holds every value."""
    p, out = index.p, decl.out
    op = stage.kind.op  # type: ignore[union-attr]
    assert isinstance(op, Map)
    want = accumulator_dtype(p.precision)
    n = out.elems[1] if width is None else width  # (a row program's: the rows' width, whatever output is followed)
    m = out.elems[0]  # every output of a map or row program has the inputs' rows (LayerNorm's mean: m × 1)
    for c in cols(op.expr):
        t = index.tensors[c.tensor]
        row = c.axis == VecAxis.ROW
        if t.elems != ((m, 1) if row else (1, n)) or t.dtype != want:
            what, each, count = ("row", "row", m) if row else ("column", "column", n)
            raise SemanticError(
                f"stage {stage.name} reads {t.name} ({t.elems[0]}x{t.elems[1]} {t.dtype.value}) as a {what} vector of"
                f" {out.name}: one {want.value} value per {each}, {count} of them"
            )
    if p.precision != Precision.INT8:
        if out.dtype not in (DType.FLOAT32, DType.FP16, DType.BF16):
            raise SemanticError(
                f"a {p.precision.value} program computes float32 values (stored as float32, fp16 or bf16); its"
                f" output {out.name} holds {out.dtype.value}"
            )
        return
    pages, column = [(-128, 127)] * len(stage.ins), lambda c: (-(2**31), 2**31 - 1)
    try:
        lo, hi = elementwise.int_range(op.expr, pages, column)
    except ElementwiseError as e:
        raise SemanticError(f"stage {stage.name}: {e}") from None
    peak = elementwise.int_peak(op.expr, pages, column)  # a value inside the formula too, not only its result
    if peak >= EXACT_LIMIT - EXACT_MARGIN:
        where = "" if peak == max(-lo, hi) else " within its formula"
        raise SemanticError(
            f"stage {stage.name} can reach {peak}{where}, beyond ±(2^62 - 2^12), where integer maps are exact"
        )
    fits = out.dtype in (DType.INT32, DType.INT64) and -_INT_RANGE[out.dtype] <= lo and hi < _INT_RANGE[out.dtype]
    if not fits:
        raise SemanticError(f"the output {out.name} holds {out.dtype.value}, but the declared values lie in {lo}..{hi}")


class _Way:
    """The stages on the way back from a ring to the reads: each matmul found, with its operands, by its stage."""

    def __init__(self, index: ProgramIndex, producer: dict[BufferId, Stage]) -> None:
        self.index, self.producer = index, producer
        self.matmuls: dict[StageId, MatmulDecl] = {}
        self.elems: dict[BufferId, tuple[tuple[int, int], tuple[int, int]]] = {}  # ring → (elements, tiles)

    def to_matmul(self, ring: BufferId, whose: str) -> tuple[Stage, BufferId, tuple[Stage, ...]]:
        """The matmul stage whose result reaches `ring` through elementwise stages, the ring it leaves the matmul
        by, and those stages (first applied first)."""
        p, chain = self.index.p, list[Stage]()
        while True:
            stage = self.producer.get(ring)
            if stage is None:
                raise _unsure(f"no stage fills {self.index.name(ring)}, which {whose} reads")
            if stage in chain:
                raise _unsure("the stages form a cycle")
            match stage.kind:
                case ReadStage():
                    raise _unsure(
                        f"{whose} reads a tensor with no tile matmul on the way (stage {stage.name}); the rule"
                        " proves GEMM pipelines: reads, tile matmuls, elementwise stages, one write"
                    )
                case ComputeStage(MatmulTiles()):
                    return stage, ring, tuple(chain[::-1])
                case ComputeStage(op) if _chain_op(op, len(stage.ins)) and len(stage.outs) == 1 and stage.ins:
                    for b in stage.ins[1:]:  # a residual's page: a read of a tensor, nothing else
                        read = self.producer.get(self.index.ring(b))
                        if read is None or not isinstance(read.kind, ReadStage):
                            raise _unsure(
                                f"stage {stage.name} reads {self.index.name(b)} beside the value before it, and no"
                                " read of a tensor fills it"
                            )
                    chain.append(stage)
                    ring = self.index.ring(stage.ins[0])
                case ComputeStage(op):
                    raise _unsure(
                        f"stage {stage.name} ({compute_text(op, p)}) is no elementwise stage of the one page before"
                        " it, nor a requant"
                    )
                case _:
                    raise _unsure(
                        f"stage {stage.name} fills {self.index.name(ring)}, and only read or compute stages fill rings"
                    )

    def finite_padding(self, chain: tuple[Stage, ...]) -> bool:
        """Whether `chain`, applied to a zero accumulator (a padding tile: zero products, a bias's zero padding)
        and rounded to the operand type, is finite."""
        integer = self.index.p.precision == Precision.INT8
        x = epilogue.start(np.zeros((1, 1)), integer)
        with np.errstate(all="ignore"):
            for s in chain:
                op = s.kind.op  # type: ignore[union-attr]
                if isinstance(op, Dequant):  # padded weights and scales are zero: 0 · (0 − 0)
                    continue
                x = epilogue.apply(op, x, integer, np.zeros(1))  # a column vector's padding is zero too
            value = computed_operand(x, self.index.p.precision.value)
        return bool(np.isfinite(value).all())

    def matmul(self, stage: Stage, ring: BufferId, chain: tuple[Stage, ...]) -> MatmulDecl:
        """The matmul of `stage` (packed into `ring`, then `chain` applied), its computed operands found first."""
        if stage.id in self.matmuls:
            raise _unsure(f"the result of matmul stage {stage.name} is used twice")
        p, mm = self.index.p, stage.kind.op  # type: ignore[union-attr]
        assert isinstance(mm, MatmulTiles)
        if mm.operand != p.precision:
            raise SemanticError(
                f"stage {stage.name} multiplies {mm.operand.value} tiles in a {p.precision.value} program"
            )
        if p.tile.rows != p.tile.cols:
            raise _unsure(f"tiles of {p.tile.rows}x{p.tile.cols} (a tile matmul multiplies square tiles)")
        if len(stage.ins) != 2:
            raise _unsure(f"matmul stage {stage.name} reads {len(stage.ins)} rings, not an A and a B")
        operands: list[TensorId | None] = []
        sources: list[StageId | None] = []
        chains: list[tuple[Stage, ...]] = []
        shapes = []
        for which, b in zip("AB", stage.ins, strict=True):
            src = self.producer.get(self.index.ring(b))
            if src is not None and isinstance(src.kind, ReadStage):
                t = self.index.tensors[src.kind.tensor]
                operands.append(t.id)
                sources.append(None)
                chains.append(())
                shapes.append((t.elems, (t.group_tiles[0], t.tiles[1]) if which == "B" else t.tiles))
                if t.dtype.value != p.precision.value:
                    raise SemanticError(
                        f"tensor {t.name} holds {t.dtype.value} values, but the {p.precision.value} matmul stage"
                        f" {stage.name} reads it"
                    )
                continue
            if src is not None and isinstance(src.kind, ComputeStage) and isinstance(src.kind.op, Dequant):
                t = dequant_operand(self.index, self.producer, src, stage, which)  # W4A16 (verify/dequant.py)
                operands.append(None)
                sources.append(None)
                chains.append((src,))
                shapes.append((t.elems, t.tiles))
                continue
            inner, inner_ring, inner_chain = self.to_matmul(
                self.index.ring(b), f"matmul stage {stage.name}'s operand {which}"
            )
            wide = [s.name for s in inner_chain if len(s.ins) > 1]
            if wide:
                raise _unsure(f"stage {wide[0]} reads a tensor beside a computed operand's value (it follows C's only)")
            self.matmul(inner, inner_ring, inner_chain)
            operands.append(None)
            sources.append(inner.id)
            chains.append(inner_chain)
            shapes.append(self.elems[inner_ring])
        (a_elems, a_tiles), (b_elems, b_tiles) = shapes
        if a_elems[1] != b_elems[0]:
            raise SemanticError(
                f"stage {stage.name} multiplies {a_elems[0]}x{a_elems[1]} values by {b_elems[0]}x{b_elems[1]}: the"
                " shapes do not agree"
            )
        tile = self.index.p.tile.cols
        for which, op, elems in (("A", operands[0], a_elems[1]), ("B", operands[1], b_elems[0])):
            if op is None and elems % tile:
                raise _unsure(
                    f"matmul stage {stage.name}'s computed operand {which} reduces {elems} elements, not a whole"
                    f" number of {tile}-element tiles (a computed tile's padding is not known to be zero)"
                )
        value = ((a_elems[0], b_elems[1]), (a_tiles[0], b_tiles[1]))
        self.elems[ring] = value
        decl = MatmulDecl(
            stage=stage,
            ring=ring,
            operands=(operands[0], operands[1]),
            chains=(chains[0], chains[1]),
            sources=(sources[0], sources[1]),
            shape=(mm.sub_blocks[0] * mm.block.osh, mm.sub_blocks[1] * mm.block.osw, mm.block.ibw),
            k_need=math.ceil(a_elems[1] / tile),
            # Past K a tensor's padding is zero, so a sum may run over it: a product with zero is zero. A computed
            # operand's padding holds its chain's value of zero (gelu(0) = 0, sigmoid(0) = 1/2, a scalar add's
            # constant), which the zeros of the other operand's padding cancel — unless it is not finite (inf × 0
            # is NaN): then a sum over the padding is refused.
            k_max=min(a_tiles[1], b_tiles[0])
            if all(map(self.finite_padding, chains))
            else math.ceil(a_elems[1] / tile),
            k_elems=a_elems[1],
            value=value,
            a_tiles=a_tiles,
        )
        self.matmuls[stage.id] = decl
        return decl


def _every_stage_used(index: ProgramIndex, decl: Declared, write: Stage) -> None:
    """No stage is off the way to C: each one declares part of what C is, and the reference applies them all."""
    used = {id(write), *(id(s) for s in decl.chain)}
    used.update(id(decl.producer[index.ring(b)]) for s in decl.chain for b in s.ins[1:])  # a residual's read
    for mm in decl.matmuls.values():
        used.add(id(mm.stage))
        used.update(id(s) for chain in mm.chains for s in chain)
        used.update(id(decl.producer[index.ring(b)]) for b in mm.stage.ins)
        used.update(id(decl.producer[index.ring(s.ins[0])]) for c in mm.chains if c and _dequants(c) for s in c)
    if decl.split is not None:
        used.update(id(s) for s in (decl.split.write, decl.split.read, decl.split.add))
    for s in index.p.stages:
        if id(s) not in used:
            raise SemanticError(
                f"stage {s.name} is not on the way from the inputs to {decl.out.name}: every stage must be part of the"
                " one pipeline the program declares"
            )


def _dequants(chain: tuple[Stage, ...]) -> bool:
    """Whether `chain` is a W4A16 operand's dequant (its read is on the way to C too)."""
    return isinstance(chain[0].kind, ComputeStage) and isinstance(chain[0].kind.op, Dequant)


def _split(
    index: ProgramIndex, mm: Stage, acc_ring: BufferId, producer: dict[BufferId, Stage], work: set
) -> SplitDecl | None:
    """Split-K's partial path (`passes/split.py`), None where the stages declare none: the matmul fills one more
    ring, emptied into a workspace tensor by a write stage; a read stage fills a ring from that tensor, and an
    add-partial stage adds the ring to the accumulator. Anything else with a workspace is refused by name."""
    p = index.p
    others = [b for b in mm.outs if index.ring(b) != acc_ring]
    if not work and not others:
        return None
    unsure = _unsure
    if len(work) != 1 or len(others) != 1:
        raise unsure(
            f"{len(work)} workspace tensor(s) and {len(others)} more ring(s) out of matmul stage {mm.name}; split-K"
            " has one of each"
        )
    (tid,) = work
    out_ring = index.ring(others[0])
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage) and s.kind.tensor == tid]
    reads = [s for s in p.stages if isinstance(s.kind, ReadStage) and s.kind.tensor == tid]
    adds = [s for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, AddPartial)]
    if len(writes) != 1 or len(reads) != 1 or len(adds) != 1:
        raise unsure(
            f"{len(writes)} write, {len(reads)} read and {len(adds)} add-partial stage(s) of workspace"
            f" {index.tensors[tid].name}; split-K has one of each"
        )
    write, read, add = writes[0], reads[0], adds[0]
    if tuple(map(index.ring, write.ins)) != (out_ring,):
        raise unsure(f"stage {write.name} writes the workspace from a ring matmul stage {mm.name} does not fill")
    if len(read.outs) != 1 or tuple(map(index.ring, add.ins)) != (index.ring(read.outs[0]),) or add.outs:
        raise unsure(f"stage {add.name} does not add exactly the ring stage {read.name} fills from the workspace")
    if producer.get(index.ring(read.outs[0])) is not read:
        raise unsure(f"stage {read.name}'s ring is filled by another stage too")
    return SplitDecl(tid, out_ring, index.ring(read.outs[0]), write, read, add)


def _epilogue_types(index: ProgramIndex, decl: Declared) -> None:
    """A bias (a column vector) holds one value per column of what it is applied to, a row vector one per row, int32
    values in an int8 program, float32 in a float one (the bounds and the kernel rely on it); a tensor read beside
    the value (a residual) has C's shape and holds the program's operand type. Only C's chain reads such a tensor."""
    p = index.p
    want = accumulator_dtype(p.precision)
    for chain, source in _applied_chains(decl):  # a bias holds one value per column of what it is added to
        height, width = source.value[0]
        for s in chain:
            for b in s.ins[1:]:
                t = index.tensors[decl.producer[index.ring(b)].kind.tensor]  # type: ignore[union-attr]
                layout = index.buffers[index.ring(b)].kind.layout  # type: ignore[union-attr]
                if layout != PageLayout.ROW:  # the kernel combines element e of each page: C's lie row by row
                    raise SemanticError(
                        f"stage {s.name} reads {index.name(b)}, whose pages are laid out {layout.value}, element by"
                        f" element beside {decl.out.name}'s values, which a page holds row by row: lay"
                        f" {index.name(b)} out by rows"
                    )
                if t.elems != decl.out.elems or t.dtype != DType(p.precision.value) or t.groups != 1:
                    raise SemanticError(
                        f"stage {s.name} reads {t.name} ({t.elems[0]}x{t.elems[1]} {t.dtype.value}) element by element"
                        f" beside {decl.out.name}'s values ({decl.out.elems[0]}x{decl.out.elems[1]}): it has C's shape"
                        f" and holds {p.precision.value} values"
                    )
            for c in _vectors(s):
                t = index.tensors[c.tensor]
                if c.axis == VecAxis.ROW and t.elems != (height, 1):
                    raise SemanticError(
                        f"stage {s.name} reads {t.name} ({t.elems[0]}x{t.elems[1]}) as a row vector of values {height}"
                        f" rows high: one value per row, a column of {height}"
                    )
                if c.axis == VecAxis.COL and t.elems[1] != width:
                    raise SemanticError(
                        f"stage {s.name} adds {t.name}, a row of {t.elems[1]} values, to values {width} columns wide"
                    )
    for s in _chains(decl):
        for c in _vectors(s):
            t = index.tensors[c.tensor]
            if t.dtype != want:
                raise SemanticError(
                    f"stage {s.name} adds {t.name}, which holds {t.dtype.value}; a {index.p.precision.value}"
                    f" program's bias holds {want.value}"
                )


def _vectors(s: Stage) -> tuple[Col, ...]:
    """The column vectors (biases) a stage's Map reads."""
    op = s.kind.op  # type: ignore[union-attr]
    return cols(op.expr) if isinstance(op, Map) else ()


def _gemm(index: ProgramIndex, decl: Declared, top: MatmulDecl) -> None:
    """What the last matmul (the one whose result reaches C) must agree on with C and the plan."""
    p, stage, out = index.p, top.stage, decl.out
    mm = stage.kind.op  # type: ignore[union-attr]
    assert isinstance(mm, MatmulTiles)
    a, b = (index.tensors[t] if t is not None else None for t in top.operands)
    grouped = (
        a is not None
        and b is not None
        and (a.groups, b.groups, a.group_tiles[0]) != (out.groups,) * 2 + (out.group_tiles[0],)
    )
    if grouped:
        raise SemanticError(
            f"stage {stage.name} multiplies {a.name} ({a.groups} group(s) of {a.group_tiles[0]} tile rows) by"  # type: ignore[union-attr]
            f" {b.name} ({b.groups} group(s)) into {out.name} ({out.groups} group(s) of {out.group_tiles[0]} tile"  # type: ignore[union-attr]
            " rows): a grouped GEMM's operands and output have the same groups, A and C the same rows"
        )
    elems, _ = top.value
    if elems != out.elems:
        raise SemanticError(
            f"stage {stage.name} computes {elems[0]}x{elems[1]} values into {out.name} ({out.elems[0]}x"
            f"{out.elems[1]}): the shapes do not agree"
        )
    plan = p.plan
    if plan is not None and (mm.block, mm.sub_blocks) != (plan.block, plan.sub_blocks):
        raise SemanticError(
            f"stage {stage.name} declares {compute_text(mm, p)}, but the plan's block is"
            f" {plan.block.osh}x{plan.block.osw}x{plan.block.ibw} with {plan.sub_blocks[0]}x{plan.sub_blocks[1]}"
            " sub-blocks"
        )
    if plan is not None and plan.k_tiles != top.a_tiles[1]:
        what = f"{a.name}'s tile grid" if a is not None else f"the computed operand A of stage {stage.name}"
        raise SemanticError(f"the plan reduces {plan.k_tiles} k-tiles, but {what} has {top.a_tiles[1]} columns of them")


# The interpreter checks exactness on a float64 estimate of each value, whose rounding near 2^62 is 2^10: the bound
# keeps clear of it, so a value verify accepts is one the interpreter computes.
EXACT_MARGIN = 2**12
_INT_RANGE = {DType.INT8: 2**7, DType.INT32: 2**31, DType.INT64: 2**63}  # values lie in -r..r-1


def _applied_chains(decl: Declared) -> list[tuple[tuple[Stage, ...], MatmulDecl]]:
    """Each chain of elementwise stages with the matmul whose result it is applied to: C's, and each computed
    operand's."""
    assert decl.matmul is not None
    out = [(decl.chain, decl.matmuls[decl.matmul.id])]
    for mm in decl.matmuls.values():
        out += [(c, decl.matmuls[s]) for c, s in zip(mm.chains, mm.sources, strict=True) if s is not None]
    return out


def _chains(decl: Declared) -> list[Stage]:
    """Every elementwise stage: C's chain and the chains that make computed operands."""
    return [s for chain, _ in _applied_chains(decl) for s in chain]


def _integer_bounds(index: ProgramIndex, decl: Declared) -> None:
    """What the epilogue produces, and its range: every integer value stays inside what the interpreter computes
    exactly (±2^62) and what the output tensor holds; a float program's output is float32.

    The bounds start from the K-long int8 dot product and follow the stages; a bias adds any int32, requant
    saturates to int8. The output type must be the chain's own: int8 after requant, a wide integer before. A
    computed operand of an int8 matmul is int8: its chain ends in a requant."""
    p, out = index.p, decl.out
    if p.precision != Precision.INT8:
        requant = any(isinstance(s.kind.op, Requant) for s in _chains(decl))  # type: ignore[union-attr]
        if out.dtype not in (DType.FLOAT32, DType.FP16, DType.BF16) or requant:
            raise SemanticError(
                f"a {p.precision.value} program computes float32 values (stored as float32, fp16 or bf16); its"
                f" output {out.name} holds {out.dtype.value}"
                + ("; a requant needs an integer accumulator" if requant else "")
            )
        return
    for mm in decl.matmuls.values():
        for which, chain, source in zip("AB", mm.chains, mm.sources, strict=True):
            if source is None:
                continue
            if not (chain and isinstance(chain[-1].kind.op, Requant)):  # type: ignore[union-attr]
                raise SemanticError(
                    f"stage {mm.stage.name} multiplies int8 tiles, and its computed operand {which} is not"
                    " requantised to int8 last"
                )
            _chain_range(index, chain, decl.matmuls[source].k_elems)
    assert decl.matmul is not None
    lo, hi = _chain_range(index, decl.chain, decl.matmuls[decl.matmul.id].k_elems)
    requantised = bool(decl.chain) and isinstance(decl.chain[-1].kind.op, Requant)  # type: ignore[union-attr]
    fits = out.dtype in _INT_RANGE and -_INT_RANGE[out.dtype] <= lo and hi < _INT_RANGE[out.dtype]
    if (out.dtype == DType.INT8) != requantised or not fits:
        raise SemanticError(
            f"the output {out.name} holds {out.dtype.value}, but the declared values lie in {lo}..{hi}"
            + ("" if requantised else " (int8 output comes from a requant, last)")
        )


def _chain_range(index: ProgramIndex, chain: tuple[Stage, ...], k: int) -> tuple[int, int]:
    """The range of integer values after `chain`, applied to a K-long int8 dot product."""
    lo, hi = dot_range(k)
    for s in chain:
        op = s.kind.op  # type: ignore[union-attr]
        after = integer_range(op, lo, hi)
        if after is None:
            raise SemanticError(f"{compute_text(op)} is not an integer epilogue op")
        peak = integer_peak(op, lo, hi)  # a value inside the stage's formula too, not only its result
        lo, hi = after
        if peak >= EXACT_LIMIT - EXACT_MARGIN:
            where = "after" if peak == max(-lo, hi) else "within"
            raise SemanticError(
                f"{where} stage {s.name} ({compute_text(op, index.p)}) a value can reach {peak}, beyond"
                " ±(2^62 - 2^12), where integer epilogues are exact"
            )
    return lo, hi

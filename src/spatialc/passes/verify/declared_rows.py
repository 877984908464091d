"""What a row program's stages declare (softmax, RMSNorm, LayerNorm's out, mean and rstd): each output by its own
write stage, its stages a graph of reads, maps and row reductions (verify/declared.py finds a program's function;
this is its part for programs that reduce rows and multiply nothing)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ...errors import SemanticError
from ...ir.ids import BufferId, StageId, TensorId
from ...ir.index import ProgramIndex
from ...ir.nodes import ComputeStage, DType, ReadStage, Stage, Tensor, TensorRole, WriteStage
from ...ir.ops import Apply, Arg, Expr, Map, Precision, RowReduce, arg_indices, cols, row_args
from .dataflow import Declared
from .declared_checks import _map_types, _unsure


def _declared_row_outputs(index: ProgramIndex) -> tuple[Declared, ...]:
    """A row program's outputs, each declared by its own write stage (`_declared_rows`)."""
    return declared_each(
        index, lambda out, last, producer, write, shape: _declared_rows(index, out, last, producer, write, shape)
    )


Each = Callable[[Tensor, BufferId, dict[BufferId, Stage], Stage, tuple[int, int]], Declared]


def declared_each(index: ProgramIndex, each: Each) -> tuple[Declared, ...]:
    """A program's outputs, each declared by `each` from its own write stage — (output, the ring its write empties,
    the stage filling each ring, the write, the shape of the first tensor read) — every output tensor written by
    exactly one write stage, every stage on the way to one of them (its Declared's `used`): a row program's
    (`_declared_rows`), a map program's of several outputs (`declared._declared_map`)."""
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
        raise _unsure("a program of outputs each of its own write that reads no tensor")
    shape = reads[0].elems  # the rows': every read and every output of values has it, a row vector's is (m, 1)
    every = frozenset(by_tensor)
    decls, used = [], set()
    for t in outputs:
        w = by_tensor[t.id]
        decl = each(t, index.ring(w.ins[0]), producer, w, shape)
        decls.append(dataclasses.replace(decl, others=every - {t.id}))
        used |= {w.id, *decl.used}
    extra = [s for s in p.stages if s.id not in used]
    if extra:  # named by its end, where the stages off the way stop (a reduction whose vector nothing reads)
        read = {b for s in p.stages for b in s.ins}
        end = next((s for s in extra if s.outs and not read.intersection(s.outs)), None)
        why = ": no stage reads what it fills" if end is not None else ""
        raise SemanticError(f"stage {(end or extra[0]).name} is not on the way from the inputs to any output{why}")
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

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

from ...errors import SemanticError
from ...ir.ids import BufferId, StageId, TensorId
from ...ir.index import ProgramIndex
from ...ir.nodes import ComputeStage, DType, ReadStage, Stage, Tensor, TensorRole, WriteStage
from ...ir.ops import AddPartial, Dequant, Map, MatmulTiles, Precision, Requant, RowReduce, arg_indices, row_args
from ...ir.printer import compute_text
from ...numerics import epilogue
from ...numerics.rounding import computed_operand
from .dataflow import Declared, MatmulDecl, SplitDecl
from .declared_checks import _epilogue_types, _every_stage_used, _gemm, _integer_bounds, _map_types, _unsure
from .declared_cols import _declared_col_outputs, is_col_declared
from .declared_rows import _declared_row_outputs, declared_each
from .dequant import dequant_operand


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


def _mapped_outputs(p) -> bool:
    """Whether the stages are maps alone (no matmul, no row reduction) with several write stages: a map program of
    several outputs (`_declared_map_outputs`)."""
    computes = [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage)]
    writes = [s for s in p.stages if isinstance(s.kind, WriteStage)]
    return len(writes) > 1 and bool(computes) and all(isinstance(op, Map) for op in computes)


def declared_outputs(index: ProgramIndex) -> tuple[Declared, ...]:
    """Each output's declared function: a GEMM's or a one-output map program's one; a row program's or a map
    program's one for each write stage (LayerNorm's out, mean and rstd; RoPE's two halves), the program's first
    output tensor first."""
    if is_col_declared(index.p):
        return _declared_col_outputs(index)
    if _reduces_rows(index.p):
        return _declared_row_outputs(index)
    if _mapped_outputs(index.p):
        return _declared_map_outputs(index)
    return (declared(index),)


def declared(index: ProgramIndex) -> Declared:
    """The stages' function, or StrongerCheckNeeded when they are not one pipeline ending in one write: reads of
    tensors, tile matmuls, chains of elementwise stages, one write — every stage on the way to C. (A row program's
    may write several outputs: this is its first output's, `declared_outputs` gives each.)"""
    p = index.p
    if _reduces_rows(p) or is_col_declared(p) or _mapped_outputs(p):
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
    _no_row_vectors(p)
    if not any(isinstance(op, MatmulTiles) for op in ops):
        decl = _declared_map(index, out, last, producer, writes[0])
        extra = [s.name for s in p.stages if s.id not in decl.used]
        if extra:
            raise SemanticError(f"stage {extra[0]} is not on the way from the inputs to {out.name}")
        return decl
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


def _no_row_vectors(p) -> None:
    """A row vector is a row reduction's: a GEMM or a map of reads has none to read."""
    for s in p.stages:
        if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map) and row_args(s.kind.op.expr):
            raise _unsure(f"stage {s.name} reads a row vector, and no stage reduces rows")


def _declared_map_outputs(index: ProgramIndex) -> tuple[Declared, ...]:
    """A map program's outputs (RoPE's two halves, SwiGLU's backward), each declared by its own write stage as a
    one-output map program's is (`_declared_map`), by the machinery a row program's outputs share."""
    _no_row_vectors(index.p)
    return declared_each(index, lambda out, last, producer, write, _: _declared_map(index, out, last, producer, write))


def _declared_map(
    index: ProgramIndex, out: Tensor, last: BufferId, producer: dict[BufferId, Stage], write: Stage
) -> Declared:
    """A program with no matmul: C = map(x0, x1, …), element by element — Map stages whose rings are each filled by
    a read of a tensor of C's shape or by another map (a float program's: an int8 map's range is proved from int8
    pages), the last map's ring written. `chain` holds the maps on the way, each after the maps it reads; `used`
    every stage on the way. Its types: inputs of the program's precision, column vectors of the accumulator's type,
    one value per column; its integer values within what int64 and C hold."""
    p = index.p
    stage = producer.get(last)
    if stage is None or not isinstance(stage.kind, ComputeStage) or not isinstance(stage.kind.op, Map):
        raise _unsure(
            f"{write.name} writes a ring no elementwise stage fills; a program with no matmul is maps of its reads"
        )
    chain: list[Stage] = []
    used = {write.id}
    state: dict[StageId, bool] = {}  # False while its inputs are followed, True once in the chain

    def follow(stage: Stage) -> None:
        if state.get(stage.id) is False:
            raise _unsure("the stages form a cycle")
        if stage.id in state:
            return
        state[stage.id] = False
        for b in stage.ins:
            r = producer.get(index.ring(b))
            if r is not None and isinstance(r.kind, ComputeStage) and isinstance(r.kind.op, Map):
                if p.precision == Precision.INT8:
                    raise _unsure(f"stage {stage.name} maps stage {r.name}'s values in an int8 program")
                follow(r)
                continue
            if r is None or not isinstance(r.kind, ReadStage):
                raise _unsure(f"stage {stage.name} reads {index.name(b)}, which no read of a tensor fills")
            _map_input(index, stage, index.tensors[r.kind.tensor], out)
            used.add(r.id)
        state[stage.id] = True
        used.add(stage.id)
        chain.append(stage)

    follow(stage)
    decl = Declared(out, last, producer, tuple(chain), used=frozenset(used))
    for s in chain:
        _map_types(index, decl, s)
    return decl


def _map_input(index: ProgramIndex, stage: Stage, t: Tensor, out: Tensor) -> None:
    """A tensor a map reads has the output's shape and holds the program's precision."""
    p = index.p
    if t.elems != out.elems or t.dtype != DType(p.precision.value) or t.groups != 1:
        raise SemanticError(
            f"stage {stage.name} maps {t.name} ({t.elems[0]}x{t.elems[1]} {t.dtype.value}) element by element"
            f" into {out.name} ({out.elems[0]}x{out.elems[1]}): a map's inputs have its output's shape and hold"
            f" {p.precision.value} values"
        )


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

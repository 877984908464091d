"""The numpy reference of a GEMM program: C = epilogue(A @ B) on whole matrices, no tiles, no engines (a grouped
GEMM's: C[g] = epilogue(A[g] @ B[g]) on each group's rows below its row count, zeros past it). A program whose
matmul multiplies a computed operand (an MLP's gelu(X @ W1) @ W2) is evaluated stage by stage the same way, the
computed operand rounded from float32 to the operand type (nearest even) as the kernel stores it.

It is what the CLI and the GPU check compare against; the interpreter is checked against it in the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ProgramError
from ..inputs import operand_values, row_limits
from ..interp.values import matmul
from ..ir.nodes import SpatialProgram
from ..ir.ops import Precision
from . import elementwise, epilogue, intervals, reductions
from .blockscale import program_scales, program_sum
from .rounding import computed_operand, output_values


def _declared(p: SpatialProgram):
    """What the program's stages declare (verify's rule 8 reads them the same way: by their rings)."""
    from ..ir.index import ProgramIndex
    from ..passes.verify.declared import declared

    return declared(ProgramIndex.of(p))


def declared_outputs(p: SpatialProgram) -> tuple:
    """What the stages declare each output to be (one for all but a row program of several writes)."""
    from ..ir.index import ProgramIndex
    from ..passes.verify.declared import declared_outputs as each

    return each(ProgramIndex.of(p))


def epilogue_ops(p: SpatialProgram) -> list:
    """The program's compute ops after the matmul, in the order its rings apply them."""
    return [s.kind.op for s in _declared(p).chain]


def epilogue_chain(p: SpatialProgram) -> list:
    """The program's compute stages after the matmul, in the order its rings apply them."""
    return list(_declared(p).chain)


def stage_pages(p: SpatialProgram, stage: Any, inputs: Mapping[str, Any], rows: Any = None) -> list[np.ndarray]:
    """The pages an epilogue stage reads beside the value before it — each tensor read into its further rings (a
    residual, a gate) — as the stage's values (float32 of the operand type's, int64 in an int8 program), only C's
    sampled `rows` where given."""
    from ..ir.index import ProgramIndex
    from ..ir.nodes import ReadStage, Stage

    if not isinstance(stage, Stage) or len(stage.ins) < 2:
        return []
    index = ProgramIndex.of(p)
    reads = {index.ring(b): s.kind.tensor for s in p.stages if isinstance(s.kind, ReadStage) for b in s.outs}
    integer = p.precision == Precision.INT8
    out = []
    for b in stage.ins[1:]:
        x = epilogue.start(tensor_operand(p, reads[index.ring(b)], inputs), integer)
        out.append(x if rows is None else x[np.asarray(rows)])
    return out


def rounded_operands(p: SpatialProgram, inputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A and B — the tensors the matmul stage multiplies, in that order, whatever their names — holding exactly the
    operand type's values (int8 as given, fp16 / bf16 as float32), for `values.matmul`, which sums in float64."""
    decl = _declared(p)
    if len(decl.matmuls) == 1 and dequantised(decl):  # a W4A16 GEMM: B its weights dequantised (numerics/w4.py)
        from .w4 import w4_operand

        (mm,) = decl.matmuls.values()
        a, b = (
            tensor_operand(p, t, inputs) if t is not None else w4_operand(p, chain[0].kind.op, t_w, inputs)
            for t, chain, t_w in zip(mm.operands, mm.chains, _dequant_reads(p, mm), strict=True)
        )
        return a, b
    if decl.a is None or decl.b is None or len(decl.matmuls) > 1:
        raise ProgramError(f"program {p.name} declares no single tile matmul of two tensors, so it has no A and B")
    return tensor_operand(p, decl.a, inputs), tensor_operand(p, decl.b, inputs)


def dequantised(decl: Any) -> bool:
    """Whether a matmul of the declaration multiplies dequantised 4-bit weights (a W4A16 GEMM)."""
    from ..ir.ops import Dequant

    return any(c and isinstance(c[0].kind.op, Dequant) for mm in decl.matmuls.values() for c in mm.chains)


def _dequant_reads(p: SpatialProgram, mm: Any) -> list:
    """Each operand's weights tensor where a dequant makes it (None elsewhere)."""
    from ..ir.index import ProgramIndex
    from ..ir.nodes import ReadStage
    from ..ir.ops import Dequant

    index = ProgramIndex.of(p)
    reads = {index.ring(b): s.kind.tensor for s in p.stages if isinstance(s.kind, ReadStage) for b in s.outs}
    return [reads[index.ring(c[0].ins[0])] if c and isinstance(c[0].kind.op, Dequant) else None for c in mm.chains]


def tensor_operand(p: SpatialProgram, tensor: Any, inputs: Mapping[str, Any]) -> np.ndarray:
    """A matmul's operand read from `tensor`: the given array rounded to its element type (int8 stays int8: take
    np.abs of it only wider, as -128 has no int8 magnitude)."""
    t = p.tensor(tensor)
    return operand_values(t.name, inputs[t.name], t.dtype)


def reference(p: SpatialProgram, inputs: Mapping[str, Any]) -> np.ndarray | dict[str, np.ndarray]:
    """epilogue(A @ B) in the output's element type, from float64 products of the operand-rounded inputs; a
    program of several outputs (LayerNorm's out, mean and rstd), each's by name, as `spatialc.evaluate` gives them.
    An attention program's is its declaration computed directly (`numerics.attention.softmax_attention`)."""
    if is_attention(p):
        from .attention import attention_reference

        return attention_reference(p, inputs)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN / ±inf inputs: said once, by check_inputs
        return _reference(p, inputs)


def is_attention(p: SpatialProgram) -> bool:
    """Whether `p` declares attention (`spatialc.attention`): its reference and bound are `numerics.attention`'s."""
    from ..passes.attention import is_attention_program

    return is_attention_program(p)


def _reference(p: SpatialProgram, inputs: Mapping[str, Any]) -> np.ndarray | dict[str, np.ndarray]:
    decl = _declared(p)
    if decl.rows:
        decls = declared_outputs(p)
        done: dict = {}  # the stages the outputs share, computed once
        each = {
            d.out.name: output_values(d.out.name, row_stages(p, d, inputs, done=done)[0], d.out.dtype) for d in decls
        }
        return each if len(decls) > 1 else each[decl.out.name]
    if decl.matmul is None:
        outs = {d.out.name: mapped(p, d, inputs) for d in declared_outputs(p)}  # (a map program of several outputs)
        return outs if len(outs) > 1 else outs[decl.out.name]
    if len(decl.matmuls) == 1:
        a, b = rounded_operands(p, inputs)
        return reference_of(p, a, b, inputs)
    assert decl.matmul is not None
    x = applied(p, matmul_value(p, decl, decl.matmuls[decl.matmul.id], inputs), list(decl.chain), inputs)
    out = p.output_tensor()
    assert out is not None
    return output_values(out.name, x, out.dtype)


def matmul_value(p: SpatialProgram, decl: Any, mm: Any, inputs: Mapping[str, Any]) -> np.ndarray:
    """The sum a matmul stage (`mm`, a `MatmulDecl` of `decl`) computes, in float64 (int8: exact integers): its
    computed operands evaluated first, through their chains, and rounded to the operand type."""
    operands = []
    for tensor, source, chain in zip(mm.operands, mm.sources, mm.chains, strict=True):
        if tensor is not None:
            operands.append(tensor_operand(p, tensor, inputs))
            continue
        x = applied(p, matmul_value(p, decl, decl.matmuls[source], inputs), [s.kind.op for s in chain], inputs)
        operands.append(computed_operand(x, p.precision.value))
    x = matmul(*operands)
    return np.rint(x) if p.precision == Precision.INT8 else x


def map_values(
    p: SpatialProgram, decl: Any, inputs: Mapping[str, Any], bounds: bool = False, done: dict | None = None
) -> tuple[Any, Any]:
    """A map program's value before C's rounding: each map of `decl.chain` on whole tensors, in order, its inputs
    rounded to the operand type, as float32 (int64 in an int8 program) — and with `bounds` how far a kernel's may lie
    from it (each map's `intervals.bounded`, carried from map to map), else None. `done` (ring → value and bound)
    keeps the maps one output's declaration computed for the next output's."""
    from ..ir.index import ProgramIndex

    index = ProgramIndex.of(p)
    integer = p.precision == Precision.INT8
    col = column_values(p, inputs)
    done = {} if done is None else done

    def page(ring: Any) -> tuple[Any, Any]:
        if ring not in done:  # a read's ring: the maps a chain holds are computed before the maps that read them
            x = epilogue.start(tensor_operand(p, decl.producer[ring].kind.tensor, inputs), integer)
            done[ring] = (x, np.zeros(1))
        return done[ring]

    for stage in decl.chain:
        ring = index.ring(stage.outs[0])
        if ring in done:
            continue
        pages = [page(index.ring(b)) for b in stage.ins]
        if bounds:
            done[ring] = intervals.bounded(
                stage.kind.op.expr, [(np.asarray(x, np.float64), e) for x, e in pages], _rows_of(col)
            )
        else:
            done[ring] = (epilogue.mapped(stage.kind.op.expr, [x for x, _ in pages], integer, col), None)
    return done[decl.last]


def mapped(p: SpatialProgram, decl: Any, inputs: Mapping[str, Any], done: dict | None = None) -> np.ndarray:
    """A program with no matmul: its maps of the whole input tensors, in the output's element type."""
    integer = p.precision == Precision.INT8
    x = map_values(p, decl, inputs, done=done)[0]
    return output_values(decl.out.name, np.asarray(x).astype(np.int64 if integer else np.float64), decl.out.dtype)


def row_stages(
    p: SpatialProgram, decl: Any, inputs: Mapping[str, Any], bounds: bool = False, done: dict | None = None
) -> tuple[Any, Any]:
    """A row program's value before C's rounding — each stage on whole tensors, in the order `declared` gives: a map
    element by element (a row vector read by row), a row reduction of each row (`reductions.reduce_rows`) — and
    with `bounds` how far a kernel's may lie from it (each map's `intervals.bounded`, each reduction's
    `reductions.reduce_bound`, carried from stage to stage), else None. `done` (ring → value and bound) keeps the
    stages computed for one output for the next output of the same program and inputs (LayerNorm's three share
    theirs)."""
    from ..ir.index import ProgramIndex
    from ..ir.nodes import ReadStage
    from ..ir.ops import ColReduce, RowReduce

    index = ProgramIndex.of(p)
    col = column_values(p, inputs)
    done = {} if done is None else done
    read: dict[Any, np.ndarray] = {}  # each tensor rounded once, however many stages read it
    exact = np.zeros(1)  # a read page's error: one object, so that maps of the same pages share their bounds
    memo: dict = {}  # (`intervals.bounded`'s: alive while `done` and `read` hold every page it names)
    pass_exps = online_exps(index, decl)
    for stage in decl.producer.values():
        ring = index.ring(stage.outs[0]) if stage.outs else None
        if isinstance(stage.kind, ReadStage) and ring not in done:
            t = stage.kind.tensor
            if t not in read:
                read[t] = np.asarray(epilogue.start(tensor_operand(p, t, inputs), False), np.float64)
            done[ring] = (read[t], exact)
    for stage in decl.chain:
        ring = index.ring(stage.outs[0])
        if ring in done:
            continue
        pages = [done[index.ring(b)] for b in stage.ins]
        op = stage.kind.op
        if isinstance(op, ColReduce):  # each column, as a row of the transpose (`reductions.reduce_cols`)
            x, e = pages[0]
            value, err = (
                reductions.reduce_cols_bound(op.op, x, e) if bounds else (reductions.reduce_cols(op.op, x, False), None)
            )
        elif isinstance(op, RowReduce):  # with bounds, the value reduce_bound computes on the way (the same)
            x, e = pages[0]
            value, err = (
                reductions.reduce_bound(op.op, x, e) if bounds else (reductions.reduce_rows(op.op, x, False), None)
            )
            shared = online_values(index, decl, stage)
            if bounds and shared is not None:
                err = err + rescaled(done[shared], value, err, p.tile.cols, np)
        elif bounds:  # the value bounded computes on the way: each op in float64 of float32 operands, rounded once
            value, err = intervals.bounded(op.expr, pages, _rows_of(col), memo)
            if ring in pass_exps:  # the pass's P: the declared map's value and bound wherever M is finite, else 0
                value, err = _floored(pass_exps[ring], pages, col, value, err)
        else:
            value, err = epilogue.mapped(pass_exps.get(ring, op.expr), [x for x, _ in pages], False, col), None
        done[ring] = (np.asarray(value, np.float64), err)
    return done[decl.last]


def online_exps(index: Any, decl: Any) -> dict[Any, Any]:
    """Each online softmax pair's E ring → the map its pass computes for the declared exp(x − M): P = exp(x −
    max(M, float32's lowest)) (`passes.rows.ONLINE_P`), equal to it wherever M is finite, and 0, not NaN, in a row
    of −∞ alone — whose Σ is then 0, and log-sum-exp −∞ as torch.logsumexp's, the interpreter's and a kernel's."""
    from ..ir.ops import RowReduce
    from ..passes.rows import ONLINE_EXP, ONLINE_P

    out = {}
    for stage in decl.chain:
        if isinstance(stage.kind.op, RowReduce) and online_values(index, decl, stage) is not None:
            e = decl.producer[index.ring(stage.ins[0])]
            if e.kind.op == ONLINE_EXP:
                out[index.ring(e.outs[0])] = ONLINE_P.expr
    return out


def _floored(expr: Any, pages: list, col: Any, value: Any, err: Any) -> tuple[Any, Any]:
    """The online pass's P (`expr`, `online_exps`) of `pages`, with the declared map's bound `err` where that map's
    `value` is a number, and none where it is NaN and P is not (a row of −∞ alone: P = 0 exactly, a kernel's too)."""
    floored = np.asarray(epilogue.mapped(expr, [x for x, _ in pages], False, col), np.float64)
    return floored, np.where(np.isnan(value) & ~np.isnan(floored), 0.0, err)


def online_values(index: Any, decl: Any, stage: Any) -> Any:
    """The ring of values an online softmax's pass reads, where `stage` is the sum of its pair: a row sum of a map
    exp(x − M) whose x M's row max reads too (`spatialc.softmax(…, online=True)`); else None."""
    from ..ir.nodes import ComputeStage
    from ..ir.ops import Map, RowReduce

    op = stage.kind.op
    if not isinstance(op, RowReduce) or op.op != "sum":
        return None
    e = decl.producer.get(index.ring(stage.ins[0]))
    if e is None or not isinstance(e.kind, ComputeStage) or not isinstance(e.kind.op, Map) or len(e.ins) != 2:
        return None
    m = decl.producer.get(index.ring(e.ins[1]))
    if m is None or not isinstance(m.kind, ComputeStage) or not isinstance(m.kind.op, RowReduce):
        return None
    shared = index.ring(e.ins[0])
    return shared if m.kind.op.op == "max" and tuple(map(index.ring, m.ins)) == (shared,) else None


def rescaled(x: tuple[Any, Any], value: Any, err: Any, tile_cols: int, xp: Any) -> Any:
    """What rescaling the running sum adds to its bound (docs/numerics.md, "The online softmax"): each page's
    α = exp(m_old − m_new) rounds m_old − m_new (relative error |m_old − m_new|·u in α, summing to at most
    2·max|x| over a row, the differences telescoping), and exp and the product one rounding and ulp each; at most one
    page a tile of the row. Only finite values count: while the running max is −∞, α = exp(−∞) is exactly 0 (a row
    holding +∞ is NaN in the reference and the kernel alike). On `xp`'s arrays (numpy, or CuPy on the GPU check's
    device)."""
    values, errors = x
    size = xp.abs(values) + errors
    reach = xp.max(xp.where(xp.isinf(size), 0.0, size), axis=1, keepdims=True) if values.shape[1] else 0.0
    pages = -(-values.shape[1] // tile_cols)
    return (2.0 * reach + 4.0 * pages + 4.0) * elementwise.EPS32 * (xp.abs(value) + err)


def _rows_of(col: Any) -> Any:
    """Column vectors' values as rows that broadcast over a page's rows, row vectors' as columns."""
    from ..ir.ops import VecAxis

    return lambda c: np.asarray(col(c), np.float32).reshape((-1, 1) if c.axis == VecAxis.ROW else (1, -1))


def column_values(p: SpatialProgram, inputs: Mapping[str, Any], rows: Any = None):
    """Vector c's values, from the input named by its tensor: a column vector's one value per column of C, a row
    vector's one per row of C (only the sampled `rows` where given)."""
    from ..ir.ops import VecAxis

    def values(c: Any) -> np.ndarray:
        x = np.asarray(inputs[p.tensor(c.tensor).name]).reshape(-1)
        return x[np.asarray(rows)] if rows is not None and c.axis == VecAxis.ROW else x

    return values


def applied(p: SpatialProgram, x: np.ndarray, chain: list, inputs: Mapping[str, Any], rows: Any = None) -> np.ndarray:
    """Elementwise stages (or their ops) `chain` on a matmul's sum, in the accumulator's type (int64, or float32 as
    the kernel's); a stage that reads a tensor beside the value (a residual) reads it from `inputs` (C's sampled
    `rows` of it, and of a row vector, where given)."""
    integer = p.precision == Precision.INT8
    if chain:
        x = epilogue.start(x, integer)
    col = column_values(p, inputs, rows)
    for stage in chain:
        op = getattr(getattr(stage, "kind", None), "op", stage)  # a stage's op, or the op itself
        more = stage_pages(p, stage, inputs, rows)
        x = epilogue.mapped(op.expr, [x, *more], integer, col) if more else epilogue.apply(op, x, integer, col)
    return x


def product(p: SpatialProgram, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A @ B in float64 (exact integers for int8), each group's own for a grouped GEMM."""
    x = _matmul(a, b)
    return np.rint(x) if p.precision == Precision.INT8 else x


def reference_of(
    p: SpatialProgram, a: np.ndarray, b: np.ndarray, inputs: Mapping[str, Any], rows: Any = None
) -> np.ndarray:
    """`reference` from A and B already rounded by `rounded_operands` (the other inputs, a bias, from `inputs`); A
    may be a sample of its rows (in each group), `rows`, which C's rows then are."""
    if program_scales(p) is not None:  # block-scaled: the promoted sum (numerics/blockscale.py)
        return finished(p, program_sum(p, a, b, inputs, matmul, rows)[0], inputs, rows)
    return finished(p, product(p, a, b), inputs, rows)


def finished(p: SpatialProgram, x: np.ndarray, inputs: Mapping[str, Any], rows: Any = None) -> np.ndarray:
    """C from the matmul's sum `x` (`product`): the epilogue applied, a grouped GEMM's rows past its counts zero,
    rounded to C's element type."""
    x = applied(p, x, epilogue_chain(p), inputs, rows)
    out = p.output_tensor()
    assert out is not None
    if out.groups > 1:  # a grouped GEMM: each group's rows at or past its row count are left zero
        x = np.array(x, copy=True)
        at = np.arange(x.shape[1]) if rows is None else np.asarray(rows)
        for name in row_limits(p):
            counts = np.asarray(inputs[name]).reshape(-1)
            for g, count in enumerate(counts[: out.groups]):
                x[g, at >= int(count)] = 0
    return output_values(out.name, x, out.dtype)  # C's element type, rounded as the interpreter rounds it


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in float64 (`values.matmul`), each group's own for a grouped GEMM's (G, rows, K) @ (G, K, N)."""
    if a.ndim == 2:
        return matmul(a, b)
    return np.stack([matmul(a[g], b[g]) for g in range(a.shape[0])])

"""What a declared function must also be (verify/declared.py finds it): every stage on the way to C, vectors and
tensors read beside it of the right shape and type, the plan's block and K, and integer values within what the
interpreter computes exactly and the output holds. Also the refusal, StrongerCheckNeeded, for stages the rule
cannot state C of."""

from __future__ import annotations

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.index import ProgramIndex
from ...ir.nodes import ComputeStage, DType, PageLayout, Stage, accumulator_dtype
from ...ir.ops import Col, Dequant, Map, MatmulTiles, Precision, Requant, VecAxis, cols
from ...ir.printer import compute_text
from ...numerics import intervals
from ...numerics.elementwise import ElementwiseError
from ...numerics.epilogue import EXACT_LIMIT, dot_range, integer_peak, integer_range
from .dataflow import Declared, MatmulDecl


def _unsure(what: str) -> StrongerCheckNeeded:
    return StrongerCheckNeeded(f"the stages: {what}; the semantic rule (verify's rule 8) cannot state what C is")


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
        lo, hi = intervals.int_range(op.expr, pages, column)
    except ElementwiseError as e:
        raise SemanticError(f"stage {stage.name}: {e}") from None
    peak = intervals.int_peak(op.expr, pages, column)  # a value inside the formula too, not only its result
    if peak >= EXACT_LIMIT - EXACT_MARGIN:
        where = "" if peak == max(-lo, hi) else " within its formula"
        raise SemanticError(
            f"stage {stage.name} can reach {peak}{where}, beyond ±(2^62 - 2^12), where integer maps are exact"
        )
    fits = out.dtype in (DType.INT32, DType.INT64) and -_INT_RANGE[out.dtype] <= lo and hi < _INT_RANGE[out.dtype]
    if not fits:
        raise SemanticError(f"the output {out.name} holds {out.dtype.value}, but the declared values lie in {lo}..{hi}")


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

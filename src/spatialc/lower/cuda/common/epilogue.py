"""The fused epilogue chain: which stages it holds, what the kernel may assume of them, and their C statements.

The chain is the run of elementwise stages (bias, relu, scalar, requant) from the matmul's output ring to the ring
the writer stores. Fused, none of those rings exists: each lane applies the whole chain to its own accumulator
elements (their places in the tile are the mma layout's) before writing them out. The statements spell
`spatialc.numerics.epilogue` in C: integer programs on exact 64-bit values (`long long`), proved here never to
overflow, and `spatialc.numerics.quant.requantize` as the device function `spatialc_requant`; float programs in
float32, with additions and multiplications that nvcc may not contract into a fused multiply-add (numpy rounds
each one).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ....ir.nodes import ComputeStage, DType, PageLayout, ReadStage, SpatialProgram, Stage, TensorRole
from ....ir.ops import Col, ComputeOp, Lit, Map, MatmulTiles, Pos, Requant, VecAxis, arg_indices, cols
from ....ir.printer import compute_text
from ....numerics import cexpr, intervals
from ....numerics.elementwise import ElementwiseError, transcendental
from ....numerics.epilogue import integer_peak, integer_range
from ...errors import NeedsGeneral, TooBig, Unsupported, UnsupportedPrecision
from .cwriter import inlined


def fused(op: ComputeOp) -> bool:
    """Whether the persistent kernel's fused store (and the sm_90a form's) applies `op` from the accumulators: a
    requant, or a Map of the one page before it that calls no library function."""
    return isinstance(op, Requant) or (isinstance(op, Map) and not transcendental(op.expr))


def page_to_page(op: ComputeOp) -> bool:
    """Whether the general form's stages apply `op` page to page: a requant, or any Map."""
    return isinstance(op, Requant | Map)


def fused_reading(op: ComputeOp) -> bool:
    """What the fused stores (the persistent kernel's, the sm_90a form's) apply: `fused`'s stages, each of which may
    also read a page of a second tensor (a residual, a gate) from the ring a read stage fills — the store reads its
    own elements of that page between the ring's Wait and Pop, as the schedule orders them."""
    return fused(op)


EPILOGUE_OPS = fused_reading  # what the fused stores apply
ELEMENTWISE_OPS = page_to_page  # what the general form's stages apply page to page
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT8_RANGE = (-128, 127)  # what a map program's int8 input pages hold
MAX_C_LEAVES = 4096  # the leaves one stage's C expression may print: 16 times the nodes verify's rule 1 allows a Map


def chain(p: SpatialProgram, mm: Stage, ops=EPILOGUE_OPS) -> tuple[Stage, ...]:
    """The elementwise stages from the matmul's output to the written buffer — or to the page the next matmul reads
    (an MLP's hidden layer, `feeds`) — in order (empty: no epilogue); a stage of none of `ops` needs the general
    form."""
    readers: dict[int, list[Stage]] = {}
    for s in p.stages:
        for b in s.ins:
            readers.setdefault(int(b), []).append(s)
    stages: list[Stage] = []
    cur = mm.outs[0]
    while True:
        after = readers.get(int(cur), [])
        if len(after) != 1:
            raise Unsupported(
                f"buffer {p.buffer(cur).name}, read by {len(after)} stages",
                "the tile kernel's output flows down one chain of stages to one writer",
            )
        (s,) = after
        if not isinstance(s.kind, ComputeStage) or isinstance(s.kind.op, MatmulTiles):
            return tuple(stages)
        # A stage of more pages than the one before it reads the others from rings a read fills (a residual's):
        # the general form's stages read them page to page, and the fused stores beside the chain's value (its first
        # page).
        beside = len(s.ins) == 1 or ops is page_to_page
        beside = beside or (ops is fused_reading and s.ins[0] == cur and _read_pages(p, s.ins[1:]))
        if not ops(s.kind.op) or len(s.outs) != 1 or not beside:
            raise NeedsGeneral(
                f"a {compute_text(s.kind.op, p)} stage ({s.name})",
                "the fused epilogue applies only elementwise stages of one page (no second tensor, no row vector)"
                " that call no library function (exp, log, tanh, erf, pow), and requant",
            )
        stages.append(s)
        cur = s.outs[0]


def _read_pages(p: SpatialProgram, bufs) -> bool:
    """Whether each of `bufs` is filled by a read stage (a tensor's pages, not a computed value)."""
    return all(any(isinstance(s.kind, ReadStage) and b in s.outs for s in p.stages) for b in bufs)


def names(p: SpatialProgram, stages: tuple[Stage, ...]) -> str:
    """The chain in a few words, for messages: `bias bias[…] → relu → requant …`."""
    return " → ".join(compute_text(s.kind.op, p) for s in stages)  # type: ignore[union-attr]


def feeds(p: SpatialProgram, stages: tuple[Stage, ...], mm: Stage | None) -> Stage | None:
    """The matmul stage that reads the last page of `mm`'s chain (of a map program's one map, `mm` None) as an
    operand, or None: the chain is written out."""
    last = stages[-1].outs[0] if stages else mm.outs[0]  # type: ignore[union-attr]
    return next(
        (
            s
            for s in p.stages
            if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles) and last in s.ins
        ),
        None,
    )


def check(p: SpatialProgram, stages: tuple[Stage, ...], integer: bool, mm: Stage | None) -> None:
    """Refuse a chain (after matmul `mm`; a map program's one map, with `mm` None) whose C statements would not
    compute exactly what `spatialc.numerics.epilogue` defines, or whose last page does not hold what its reader takes:
    the output's type, or another matmul's operands."""
    ops: list[ComputeOp] = [s.kind.op for s in stages]  # type: ignore[union-attr]
    for i, op in enumerate(ops):
        if isinstance(op, Requant) and i != len(ops) - 1:
            raise Unsupported(
                f"a requant followed by {compute_text(ops[i + 1], p)}",
                "requant's int8 result ends the epilogue; apply the other stages before it",
            )
        if isinstance(op, Requant) and not integer:
            raise UnsupportedPrecision("requant", "it requantises an integer accumulator; this program's is float32")
        if isinstance(op, Map):
            _check_map(p, op, integer)
        if isinstance(op, Requant):
            _check_requant(op)
    reader = feeds(p, stages, mm)
    if reader is not None and mm is not None:
        _check_operand_page(p, stages, integer, mm, reader)
        return
    # What the kernel stores C as: a float accumulator as float32, or rounded to nearest even into fp16 / bf16 by the
    # store's conversion; an integer one as int32 or widened to int64 (verify has shown the values fit), int8 after
    # a requant.
    out = p.output_tensor()
    assert out is not None
    if not integer:
        want = (DType.FLOAT32, DType.FP16, DType.BF16)
    else:
        want = (DType.INT8,) if ops and isinstance(ops[-1], Requant) else (DType.INT64, DType.INT32)
    if out.dtype not in want:
        raise UnsupportedPrecision(
            out.dtype.value,
            (f"after the epilogue {names(p, stages)}" if stages else "without an epilogue")
            + f" the output {out.name} holds {' or '.join(d.value for d in want)} values, which is what the kernel"
            " writes",
        )


def _check_operand_page(p: SpatialProgram, stages: tuple[Stage, ...], integer: bool, mm: Stage, reader: Stage) -> None:
    """A page another matmul reads holds its operands: an elementwise stage stores them (a float one rounding to
    nearest even to the operand type, as the interpreter rounds a computed operand page where a matmul reads it),
    and in an int8 program a requant, whose results are int8 already."""
    if not stages:
        raise Unsupported(
            f"matmul {mm.name}'s accumulator packed straight into an operand page of {reader.name}",
            "an elementwise stage between them stores the page in the operand type",
        )
    page = p.buffer(stages[-1].outs[0])
    if page.kind.layout != PageLayout.ROW:  # type: ignore[union-attr]
        raise Unsupported(
            f"the operand page {page.name} of matmul {reader.name}, laid out {page.kind.layout.value}",  # type: ignore[union-attr]
            "an elementwise stage stores its page row by row: lay the ring out by rows (the default)",
        )
    last = stages[-1].kind.op  # type: ignore[union-attr]
    if integer and not isinstance(last, Requant):
        raise Unsupported(
            f"the operand page {page.name} of int8 matmul {reader.name}, filled by a {compute_text(last, p)} stage",
            "an int8 matmul multiplies int8 values: end the stages before it with a requant",
        )


def check_maps(p: SpatialProgram, ops: tuple[Map, ...], integer: bool) -> None:
    """Refuse Maps the printers do not spell exactly (`check`'s test of each Map of a chain), for ops a schedule
    computes that no stage declares (attention's recurrence)."""
    for op in ops:
        _check_map(p, op, integer)


def _check_map(p: SpatialProgram, op: Map, integer: bool) -> None:
    """A Map the printers spell exactly: the table's ops, integer ones in an integer program, constants the
    program's values hold, column vectors the kernel can read."""
    for node in _nodes(op.expr):
        if isinstance(node, Lit):
            _check_constant(node, integer)
    if integer:
        pages = [(0, 0)] * (1 + max(arg_indices(op.expr), default=0))
        try:
            intervals.int_range(op.expr, pages, lambda c: (0, 0))  # every op has an integer meaning
        except ElementwiseError as e:
            raise UnsupportedPrecision(compute_text(op, p), f"{e}; an int8 program's epilogue is integer") from None
    leaves = cexpr.c_leaves(op.expr, integer)
    if leaves > MAX_C_LEAVES:
        raise Unsupported(
            f"a {compute_text(op, p)} stage, whose C would print {leaves} leaves",
            f"its C names an operand more than once in nested ops, which multiplies the text; a stage prints at most"
            f" {MAX_C_LEAVES}: split the formula into stages (each prints its own statement)",
        )
    for c in cols(op.expr):
        _check_col(p, c, integer)


def _nodes(expr):
    yield expr
    for a in getattr(expr, "args", ()):
        yield from _nodes(a)


def _check_col(p: SpatialProgram, op: Col, integer: bool) -> None:
    t = p.tensor(op.tensor)
    want = DType.INT32 if integer else DType.FLOAT32
    if op.axis == VecAxis.ROW:
        _check_row(p, op, t, want)
        return
    if t.tiles[0] != 1:
        raise Unsupported(
            f"bias tensor {t.name} of {t.tiles[0]}x{t.tiles[1]} tiles",
            "the kernel reads a bias's values from one row of tiles, one tile per output tile column",
        )
    if t.role != TensorRole.PARAMETER or t.dtype != want:
        raise UnsupportedPrecision(
            t.dtype.value,
            f"bias tensor {t.name} must be a {want.value} parameter "
            f"({'int8' if integer else 'float'} programs add {want.value} biases)",
        )
    plan = p.plans[0]
    need = plan.grid[1] * plan.item_tiles[1]
    if t.tiles[1] < need:
        raise TooBig(
            f"tile columns of bias tensor {t.name} (the kernel reads one per output tile column, padding included)",
            need,
            t.tiles[1],
            "pad the bias tensor's tile grid to whole blocks",
        )


def _check_row(p: SpatialProgram, op: Col, t, want: DType) -> None:
    """A row vector the kernel reads: one column of tiles of `want` values (a per-row scale's), one tile per output
    tile row, padding included."""
    if t.tiles[1] != 1 or t.role != TensorRole.PARAMETER or t.dtype != want:
        raise Unsupported(
            f"row vector {t.name}, a {t.role.value} tensor of {t.dtype.value} in {t.tiles[0]}x{t.tiles[1]} tiles",
            f"the kernel reads a row vector's {want.value} values from one column of tiles, one tile per output tile"
            " row",
        )
    plan = p.plans[0]
    need = plan.grid[0] * plan.item_tiles[0]
    if t.tiles[0] < need:
        raise TooBig(
            f"tile rows of row vector {t.name} (the kernel reads one per output tile row, padding included)",
            need,
            t.tiles[0],
            "pad the row vector's tile grid to whole blocks",
        )


def _check_constant(op: Lit, integer: bool) -> None:
    if integer and op.value != int(op.value):
        raise Unsupported(f"the constant {op.value!r} in an int8 program", "its epilogue is integer arithmetic")
    if not integer and not math.isfinite(float(np.float32(op.value))):
        raise Unsupported(
            f"the constant {op.value!r}",
            "the value is not a finite float32, and the kernel's float epilogue is float32 arithmetic",
        )


def _check_requant(op: Requant) -> None:
    """The ranges `numerics.quant.quantize_multiplier` produces, within which spatialc_requant cannot overflow."""
    if not (0 <= op.multiplier <= INT32_MAX and -31 <= op.shift <= 30 and INT32_MIN <= op.zero_point <= INT32_MAX):
        raise Unsupported(
            f"requant x{op.multiplier} >>{op.shift} +{op.zero_point}",
            "a requant needs a Q31 multiplier in [0, 2^31), a shift in [-31, 30] and an int32 zero "
            "point (what spatialc.numerics.quant.quantize_multiplier makes)",
        )


def check_int64(p: SpatialProgram, stages: tuple[Stage, ...], start: tuple[int, int]) -> None:
    """Refuse an integer chain any of whose values (a stage's result, or one inside its formula) could leave int64,
    where C's `long long` would overflow (undefined).

    The bounds start from `start` — the accumulator's (a K-long int8 dot product, `dot_range`), or a map program's
    int8 inputs (`INT8_RANGE`, every page) — and follow each stage; a bias adds any int32. Requantisation saturates,
    so it ends every bound.
    """
    lo, hi = start
    for s in stages:
        op = s.kind.op  # type: ignore[union-attr]
        after = integer_range(op, lo, hi)
        if after is None:
            raise Unsupported(
                f"epilogue op {compute_text(op, p)}",
                "the integer epilogue knows the table's integer ops (numerics.elementwise) and requant",
            )
        peak = integer_peak(op, lo, hi)  # a value inside the stage's formula too, not only its result
        lo, hi = after
        if lo < INT64_MIN or hi > INT64_MAX or peak > INT64_MAX:
            where = "after" if peak == max(-lo, hi) else "within"
            raise TooBig(
                f"the largest magnitude {where} epilogue stage {s.name} ({compute_text(op, p)}) in int64",
                peak,
                INT64_MAX,
                "the kernel's integer epilogue is exact 64-bit arithmetic",
            )


# ---- C --------------------------------------------------------------------------------------------------------


def helpers(integer: bool) -> str:
    """The device functions the chain's statements call, inlined into the kernel text: an integer program's
    requantisation (its elementwise ops are plain C expressions), or a float program's elementwise ops."""
    return inlined("common/requant.cuh" if integer else "common/elementwise.cuh")


def c_int(n: int) -> str:
    """An int64 literal, parenthesised when negative (the most negative has no literal of its own)."""
    return cexpr.c_long(n)


def c_float(x: float) -> str:
    """The float32 nearest `x` as a float literal that reads back to exactly that float32."""
    return cexpr.c_float(x)


def statement(
    op: ComputeOp, integer: bool, col_at: Callable[[Col], str] | None = None, page: Callable[[int], str] | None = None
) -> str:
    """One stage as an assignment to the lane's value `v`, from `v` itself (an epilogue stage) or from the input
    pages' values `page(i)` (a map of several pages); `col_at(c)` is the flat index of the element's value in column
    vector c's tensor (a bias's)."""
    return f"v = {value(op, integer, col_at, page)};"


def value(
    op: ComputeOp,
    integer: bool,
    col_at: Callable[[Col], str] | None = None,
    page: Callable[[int], str] | None = None,
    row: Callable[[int], str] | None = None,
    pos: Callable[[Pos], str] | None = None,
) -> str:
    """One stage's result as a C expression over its input pages' values (`page(i)`; `v`, the one page before it,
    by default), its row vectors' (`row(i)`: input page i's value of the element's row), its column vectors'
    (`col_at`, as in `statement`) and the element's positions (`pos`: a mask's row and column indices)."""
    pages = page or (lambda i: "v")
    match op:
        case Map(expr):

            def col(c: Col) -> str:
                assert col_at is not None, "a column vector's stage needs its index"
                return f"t{int(c.tensor)}[{col_at(c)}]"

            return cexpr.c_expr(expr, integer, pages, col, row, pos)
        case Requant(multiplier, shift, zero_point):
            return f"spatialc_requant({pages(0)}, {multiplier}, {shift}, {zero_point})"
        case MatmulTiles():
            pass
    raise Unsupported(f"a {type(op).__name__} epilogue stage", "the fused epilogue has no statement for it")

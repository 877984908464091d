"""Describing programs: `gemm(m, n, k, precision, epilogue=[...])` builds the unplanned program of
C = epilogue(A @ B), with `bias`, `relu`, `scalar`, `activation`, `row_scale`, `col_scale`, `residual`, `gate` and
`requant` as the epilogue's elementwise stages. (The other families have modules of their own: `maps` the
elementwise programs, `rows` softmax and the norms, `attention`; what they all read of their arguments — precision
names, sizes, output types — is `arguments`.)"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from .arguments import (
    DEFAULT_PRECISION,
    OUTPUT_CHOICES,
    TILE,
    _check_map,
    _check_size,
    _dim,
    finite_number,
    matmul_precision_of,
    out_named,
    shown_number,
)
from .errors import ProgramError
from .ir import ops
from .ir.ids import BufferId, StageId, TensorId
from .ir.names import fitted_name, name_fault
from .ir.nodes import (
    Accumulator,
    Buffer,
    ComputeStage,
    DType,
    Engine,
    Fifo,
    Interm,
    ReadStage,
    SpatialProgram,
    Stage,
    Tensor,
    TensorRole,
    WriteStage,
    accumulator_dtype,
)
from .ir.ops import (
    ACTIVATIONS,
    SCALAR_OPS,
    Apply,
    Arg,
    BlockShape,
    ComputeOp,
    Lit,
    Map,
    MatmulTiles,
    Precision,
    Requant,
    VecAxis,
)
from .numerics.epilogue import dot_range
from .numerics.quant import QuantError, quantize_multiplier

# What C holds unless `out` says otherwise: an int8 GEMM's int32 sums while K ≤ 131071 keeps them in range (int64
# beyond), the int64 an integer epilogue computes in, int8 after a requant, float32 for fp16 / bf16 / e4m3 / e5m2
# programs (an 8-bit float program's sums are float32 like bf16's; bf16 or fp16 on request, never 8-bit floats).
OUTPUT_DTYPE = {
    Precision.INT8: DType.INT32,
    Precision.FP16: DType.FLOAT32,
    Precision.BF16: DType.FLOAT32,
    Precision.E4M3: DType.FLOAT32,
    Precision.E5M2: DType.FLOAT32,
}

# Buffer ids of a GEMM program: the operand rings, the accumulator and the output ring.
BUF_A, BUF_B, BUF_ACC, BUF_C = BufferId(0), BufferId(1), BufferId(2), BufferId(3)
T_A, T_B, T_C = TensorId(0), TensorId(1), TensorId(2)


@dataclass(frozen=True, slots=True)
class BiasOf:
    """An epilogue stage adding the parameter tensor `name` (one value per output column)."""

    name: str


@dataclass(frozen=True, slots=True)
class ScaleOf:
    """An epilogue stage multiplying by the parameter tensor `name`: one value per output row (`axis` ROW: m values,
    a per-token scale) or per output column (COL: n values, a per-channel scale)."""

    name: str
    axis: VecAxis


@dataclass(frozen=True, slots=True)
class OperandOf:
    """An epilogue stage combining the value, element by element, with the input tensor `name` of C's shape: `op`
    add (a residual) or mul (a gate)."""

    name: str
    op: str


Epilogue = BiasOf | ScaleOf | OperandOf | Map | Requant
NAMED = (BiasOf, ScaleOf, OperandOf)  # the epilogue stages that bring a tensor of their own


def _tensor_name(what: str, name: object) -> str:
    # a.txt and b.txt carry the operands, and some file systems fold case: names are compared without it.
    fault = name_fault(f"a {what} tensor's", name)  # the IR's rule (ASCII, at most 64), here rather than at build
    if fault is not None:
        raise ProgramError(fault)
    assert isinstance(name, str)
    if name.lower() in ("a", "b", "c"):
        raise ProgramError(f"a {what} tensor needs an identifier name other than A, B, C (in any case), not {name!r}")
    return name


def bias(name: str = "bias") -> BiasOf:
    """Add a parameter tensor of n values, one per output column (int32 for int8 programs, float32 otherwise)."""
    return BiasOf(_tensor_name("bias", name))


def row_scale(name: str = "row_scale") -> ScaleOf:
    """Multiply each row of C by its value of a parameter tensor of m values, one per output row (a quantised GEMM's
    per-token scale): int32 for int8 programs, float32 otherwise, given as m values or an m×1 array."""
    return ScaleOf(_tensor_name("row scale", name), VecAxis.ROW)


def col_scale(name: str = "col_scale") -> ScaleOf:
    """Multiply each column of C by its value of a parameter tensor of n values, one per output column (a per-channel
    scale): int32 for int8 programs, float32 otherwise."""
    return ScaleOf(_tensor_name("column scale", name), VecAxis.COL)


def residual(name: str = "residual") -> OperandOf:
    """Add the input tensor `name`, m×n, element by element (a residual connection). It holds the program's operand
    type (int8, fp16, bf16, e4m3 or e5m2 values), as A and B do."""
    return OperandOf(_tensor_name("residual", name), "add")


def gate(name: str = "gate") -> OperandOf:
    """Multiply by the input tensor `name`, m×n, element by element (a gate). It holds the program's operand type
    (int8, fp16, bf16, e4m3 or e5m2 values), as A and B do."""
    return OperandOf(_tensor_name("gate", name), "mul")


def relu() -> Map:
    """max(x, 0)."""
    return ops.relu()


def activation(name: str) -> Map:
    """An elementwise activation by name: gelu_tanh (PyTorch's tanh form), gelu_erf (the erf form, nn.GELU()'s
    default, the table's gelu), silu, sigmoid or tanh. Bare gelu is still the tanh form, as it always was here, with a
    FutureWarning naming the two (the elementwise table's gelu is the erf form). Float programs only;
    `spatialc.numerics.elementwise` gives each formula and the tolerance a kernel keeps to it."""
    if name not in ACTIVATIONS:
        raise ProgramError(f"unknown activation {name!r}; use one of {', '.join(ACTIVATIONS)}")
    ops.warn_bare_gelu(name)
    return ops.activation(name)


def scalar(op: str, value: float) -> Map:
    """x op value, for op in add, mul, max, min."""
    if op not in SCALAR_OPS:
        raise ProgramError(f"unknown scalar op {op!r}; use one of {', '.join(SCALAR_OPS)}")
    number = finite_number(value)
    if number is None:
        raise ProgramError(f"a scalar {op} needs a finite number, not {shown_number(value)}")
    return ops.scalar(op, number)


def requant(scale: float, zero_point: int = 0) -> Requant:
    """Requantise to int8: fixed-point multiply by `scale` (see spatialc.numerics.quant), add `zero_point`, clamp."""
    if isinstance(zero_point, bool) or not isinstance(zero_point, numbers.Integral) or not -128 <= zero_point <= 127:
        raise ProgramError(f"a requant zero point must be a whole number in [-128, 127], not {zero_point!r}")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):  # not True as 1.0, nor the text "0.5"
        raise ProgramError(f"a requant scale must be a number, not {scale!r}")
    try:
        multiplier, shift = quantize_multiplier(float(scale))
    except QuantError as e:
        raise ProgramError(str(e)) from None
    return Requant(multiplier, shift, int(zero_point))


def _check_epilogue(epilogue: tuple[Epilogue, ...], prec: Precision) -> None:
    for i, stage in enumerate(epilogue):
        if not isinstance(stage, BiasOf | ScaleOf | OperandOf | Map | Requant):
            raise ProgramError(
                f"epilogue stage {i} is {stage!r}; use spatialc.bias, relu, scalar, activation, row_scale, col_scale,"
                " residual, gate or requant"
            )
        if isinstance(stage, Map):
            _check_map(stage, prec)
        if isinstance(stage, Requant):
            if prec != Precision.INT8:
                raise ProgramError(
                    f"requant produces int8 from an integer accumulator; a {prec.value} program has a float one"
                )
            if i != len(epilogue) - 1:
                raise ProgramError("requant must be the last epilogue stage (its output is int8)")
    names = [s.name for s in epilogue if isinstance(s, NAMED)]
    if len({n.lower() for n in names}) != len(names):
        raise ProgramError(f"two epilogue stages share a tensor name (compared without case): {names}")


def _output_dtype(prec: Precision, epi: tuple[Epilogue, ...], out: str | None, k: int) -> DType:
    """C's element type: what `out` asks for, checked against what the program computes, or the default."""
    out = out_named(out)
    if epi and isinstance(epi[-1], Requant):
        if out not in (None, "int8"):
            raise ProgramError(f"a requant's output is int8; out={out!r} cannot hold it as such")
        return DType.INT8
    choices = OUTPUT_CHOICES["int8" if prec == Precision.INT8 else "float"]
    if out is None:
        return DType.INT64 if prec == Precision.INT8 and (epi or dot_range(k)[1] > 2**31 - 1) else OUTPUT_DTYPE[prec]
    if out not in choices:
        article = "an" if prec == Precision.INT8 else "a"
        raise ProgramError(f"{article} {prec.value} program's output is one of {', '.join(choices)}, not {out!r}")
    return DType(out)


def gemm(
    m: int,
    n: int,
    k: int,
    precision: str | Precision = DEFAULT_PRECISION,
    *,
    epilogue: list[Epilogue] | tuple[Epilogue, ...] = (),
    target: str = "sm_90",
    out: str | None = None,
    weights: str | None = None,
    group: int | None = None,
    zeros: bool = False,
    scale_type: str | None = None,
    scales: Any = None,
) -> SpatialProgram:
    """The program C[m×n] = epilogue(A[m×k] @ B[k×n]), before tiling (`_gemm` says what `out` may be). With `weights`
    ("int4", "uint4" or "mxfp4") B holds 4-bit weights dequantised on the way in — a scale per `group` rows of K
    (default 128; mxfp4's is 32) and column, of `scale_type` (the precision's by default, or float32; e8m0 for
    mxfp4), and with `zeros` a zero point beside it (spatialc.weights, numerics/w4.py). `scales`, for an e4m3 or e5m2
    program: a pair of scale layouts, A's and B's — ("1x128", "128x128") is DeepGEMM's — which make it block-scaled,
    C = Σ_g (A_g @ B_g) · scale_a · scale_b over the K groups (`spatialc.blockscaled`)."""
    if weights is not None and scales is not None:
        raise ProgramError(
            "weights= (4-bit weights dequantised to bf16/fp16) and scales= (a block-scaled 8-bit float GEMM) do not"
            " combine; give one"
        )
    if weights is None and (group is not None or zeros or scale_type is not None):
        raise ProgramError("group, zeros and scale_type describe 4-bit weights: give weights= too")
    program = _gemm(m, n, k, precision, epilogue, target, out, 1)
    if weights is not None:
        from .weights import with_weights

        return with_weights(program, program.precision, weights, group, zeros, scale_type)
    if scales is None:
        return program
    from .blockscaled import with_scales  # a block-scaled 8-bit float GEMM (spatialc/blockscaled.py names them)

    return with_scales(program, scales, int(m), int(n), int(k))


MAX_GROUPS = 1 << 16  # experts of a mixture-of-experts layer: far fewer; more is a typo
SIZES = "sizes"  # the parameter tensor of a grouped GEMM's row counts


def grouped_gemm(
    groups: int,
    max_rows: int,
    n: int,
    k: int,
    precision: str | Precision = DEFAULT_PRECISION,
    *,
    epilogue: list[Epilogue] | tuple[Epilogue, ...] = (),
    target: str = "sm_90",
    out: str | None = None,
    scales: Any = None,
) -> SpatialProgram:
    """The program C[g, :m_g] = epilogue(A[g, :m_g] @ B[g]) for g = 0 … groups − 1 (a mixture-of-experts layer),
    before tiling. A is (groups, max_rows, k), B (groups, k, n), C (groups, max_rows, n); the row counts m_g ≤
    max_rows arrive at run time, as the int32 parameter tensor `sizes` of `groups` values. Rows of A at or past m_g
    are not read, rows of C there not written. A bias is one row of n values that every group adds. `scales`, as
    gemm's: block-scaled, each group with its own scale tensors (`spatialc.blockscaled`: DeepGEMM's grouped fp8)."""
    groups = _dim("groups", groups)
    if groups == 1:  # a program of one group is the plain GEMM (`Tensor.groups` 1): no row count would reach it
        raise ProgramError(
            "a grouped GEMM has at least 2 groups, not 1; one group with all its rows computed is"
            " spatialc.gemm(max_rows, n, k) (spatialc gemm)"
        )
    if groups > MAX_GROUPS:
        raise ProgramError(f"groups must be at most {MAX_GROUPS}, not {groups}")
    stages = epilogue if isinstance(epilogue, list | tuple) else ()
    if any(isinstance(s, BiasOf) and s.name.lower() == SIZES for s in stages):
        raise ProgramError(f"a grouped GEMM's row counts are the tensor {SIZES!r}; name the bias otherwise")
    if any(isinstance(s, ScaleOf | OperandOf) for s in stages):
        raise ProgramError(
            "a grouped GEMM's epilogue takes a bias and elementwise ops; row and column scales, residuals and gates"
            " are for gemm"
        )
    program = _gemm(max_rows, n, k, precision, epilogue, target, out, groups)
    if scales is None:
        return program
    from .blockscaled import with_scales  # each group's scales a matrix of their own (spatialc/blockscaled.py)

    return with_scales(program, scales, int(max_rows), int(n), int(k), groups)


def _gemm(
    m: int,
    n: int,
    k: int,
    precision: str | Precision,
    epilogue: list[Epilogue] | tuple[Epilogue, ...],
    target: str,
    out: str | None,
    groups: int,
) -> SpatialProgram:
    """The program C[m×n] = epilogue(A[m×k] @ B[k×n]), before tiling (ring sizes are the tile pass's to choose).

    `out` is C's element type: for int8 programs "int32" (the default without an epilogue, while K ≤ 131071) or
    "int64" (the default with one: integer epilogues are exact 64-bit arithmetic); int8 after a requant; for float
    programs (fp16, bf16, e4m3, e5m2) "float32" (the default), "fp16" or "bf16" (the float32 result rounded to
    nearest even). The accumulator is int32 or float32 whatever C holds."""
    m, n, k = _dim("max_rows" if groups > 1 else "m", m), _dim("n", n), _dim("k", k)
    _check_size(m, n, k, groups)
    prec = matmul_precision_of(precision, "grouped_gemm" if groups > 1 else "gemm")
    if not isinstance(epilogue, list | tuple):
        raise ProgramError(f"epilogue is a list of stages (e.g. [spatialc.bias(), spatialc.relu()]), not {epilogue!r}")
    epi = tuple(epilogue)
    _check_epilogue(epi, prec)
    op_dtype = DType(prec.value)
    out_dtype = _output_dtype(prec, epi, out, k)

    def tensor(tid: TensorId, name: str, role: TensorRole, rows: int, cols: int, dtype: DType) -> Tensor:
        tiles = (groups * math.ceil(rows / TILE.rows), math.ceil(cols / TILE.cols))
        return Tensor(tid, name, role, (rows, cols), tiles, dtype, groups=groups)

    tensors = (
        tensor(T_A, "A", TensorRole.INPUT, m, k, op_dtype),
        tensor(T_B, "B", TensorRole.INPUT, k, n, op_dtype),
        tensor(T_C, "C", TensorRole.OUTPUT, m, n, out_dtype),
    )
    buffers = (
        Buffer(BUF_A, "A_ring", Fifo(1, 1)),
        Buffer(BUF_B, "B_ring", Fifo(1, 1)),
        Buffer(BUF_ACC, "acc", Accumulator(1)),
        Buffer(BUF_C, "C_ring", Fifo(1, 1)),
    )
    stages = [
        Stage(StageId(0), "read_A", ReadStage(T_A), Engine.READER, outs=(BUF_A,)),
        Stage(StageId(1), "read_B", ReadStage(T_B), Engine.READER, outs=(BUF_B,)),
        Stage(
            StageId(2),
            "matmul",
            ComputeStage(MatmulTiles(BlockShape(1, 1, 1), (1, 1), prec)),
            Engine.COMPUTE,
            ins=(BUF_A, BUF_B),
            outs=(BUF_C,),
        ),
    ]
    tensors, buffers, last = _epilogue_stages(epi, prec, m, n, tensors, buffers, stages)
    stages.append(Stage(StageId(len(stages)), "write_C", WriteStage(T_C), Engine.WRITER, ins=(last,)))
    name = fitted_name(f"gemm_{m}x{n}x{k}_{prec.value}" + "".join(f"_{stage_name(s)}" for s in epi))
    if groups > 1:
        tid = TensorId(len(tensors))
        cols = math.ceil(groups / TILE.cols)
        tensors = (*tensors, Tensor(tid, SIZES, TensorRole.PARAMETER, (1, groups), (1, cols), DType.INT32))
        name = fitted_name(
            f"grouped_gemm_{groups}x{m}x{n}x{k}_{prec.value}" + "".join(f"_{stage_name(s)}" for s in epi)
        )
    return SpatialProgram(name, target, TILE, prec, tensors, tuple(stages), buffers)


def stage_name(stage: Epilogue) -> str:
    """An epilogue stage's name in program and stage names: bias, row_scale, residual, relu, gelu, scalar, …."""
    match stage:
        case BiasOf():
            return "bias"
        case ScaleOf(_, axis):
            return f"{axis.value}_scale"
        case OperandOf(_, op):
            return "residual" if op == "add" else "gate"
        case Requant():
            return "requant"
        case Map(Apply(name, (Arg(0), Lit()), ())) if name in SCALAR_OPS:
            return "scalar"
        case Map(Apply(name, (Arg(0),), ())):
            # An activation by the name it was asked by (gelu: the tanh form, as always), the erf form as gelu_erf.
            return ops.ACTIVATION_NAMES.get(name, "gelu_erf" if name == "gelu" else name)
    return "map"


def _epilogue_stages(
    epi, prec, m, n, tensors, buffers, stages
) -> tuple[tuple[Tensor, ...], tuple[Buffer, ...], BufferId]:
    """Append one compute stage per epilogue op, each from the previous ring into a new Interm ring; a stage that
    reads a tensor of C's shape (a residual, a gate) reads it as its second page, from a ring a read stage fills."""
    last = BUF_C
    for i, stage in enumerate(epi):
        op: ComputeOp
        ins: tuple[BufferId, ...] = (last,)
        tid = TensorId(len(tensors))
        vec = accumulator_dtype(prec)
        match stage:
            case BiasOf(name):
                tensors = (*tensors, Tensor(tid, name, TensorRole.PARAMETER, (1, n), (1, _tiles(n, TILE.cols)), vec))
                op = ops.bias(tid)
            case ScaleOf(name, VecAxis.ROW):
                tensors = (*tensors, Tensor(tid, name, TensorRole.PARAMETER, (m, 1), (_tiles(m, TILE.rows), 1), vec))
                op = ops.row_scale(tid)
            case ScaleOf(name, _):
                tensors = (*tensors, Tensor(tid, name, TensorRole.PARAMETER, (1, n), (1, _tiles(n, TILE.cols)), vec))
                op = ops.col_scale(tid)
            case OperandOf(name, how):
                tiles = (_tiles(m, TILE.rows), _tiles(n, TILE.cols))
                tensors = (*tensors, Tensor(tid, name, TensorRole.INPUT, (m, n), tiles, DType(prec.value)))
                ring = BufferId(len(buffers))
                buffers = (*buffers, Buffer(ring, f"{name}_ring", Fifo(1, 1)))
                stages.append(Stage(StageId(len(stages)), f"read_{name}", ReadStage(tid), Engine.READER, outs=(ring,)))
                op = ops.with_operand(how)
                ins = (last, ring)
            case _:
                op = stage
        out = BufferId(len(buffers))
        buffers = (*buffers, Buffer(out, f"{stage_name(stage)}{i}_ring", Interm(1, 1)))
        stages.append(
            Stage(
                StageId(len(stages)),
                f"{stage_name(stage)}{i}",
                ComputeStage(op),
                Engine.COMPUTE,
                ins=ins,
                outs=(out,),
            )
        )
        last = out
    return tensors, buffers, last


def _tiles(elems: int, side: int) -> int:
    return math.ceil(elems / side)

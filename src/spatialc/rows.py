"""Programs that reduce rows (issue 31): softmax, RMSNorm (alone, or fused with the residual add before it), LayerNorm
and one reduction of each row (`row_reduce`), written with nothing but reads, row reductions and maps.

A row reduction (`RowReduce`) folds each row of a tensor into one value — its max, sum, sum of squares — and a map
reads that value back as a row vector (`RowArg`): x − max(x) row by row. A row longer than a page is reduced over
its pages in turn into a row accumulator, then read again for the map: each pass reads the row's pages once more
(`passes/rows.py` plans and schedules the passes). `softmax(…, online=True)` reads each row twice, not three times:
its max and its sum of exp(x − max) in one pass, kept running as attention's recurrence keeps them.

    p = spatialc.build(spatialc.softmax(4096, 4096, "bf16"), "sm_90")
    p = spatialc.build(spatialc.rmsnorm(4096, 4096, eps=1e-6), "sm_90")
    p = spatialc.build(spatialc.layernorm(4096, 4096), "sm_90")   # three outputs: out, mean and rstd
    p = spatialc.build(spatialc.rmsnorm(4096, 4096, residual=True), "sm_90")   # two: out and residual_out
    p = spatialc.build(spatialc.row_reduce(4096, 4096, "absmax"), "sm_90")   # one value a row: m × 1

A map of row vectors alone (mean = Σx / n) is itself a row vector, computed once a band; a row vector is written
into an m × 1 tensor (one value a row) by a write stage of its own, from a ring that stage alone empties. A program
writes any number of tensors of the rows' shape, each a map's pages stored in the band's last pass, or none.
"""

from __future__ import annotations

import math

from .arguments import (
    OUTPUT_CHOICES,
    TILE,
    _dim,
    check_elems,
    finite_number,
    out_named,
    precision_of,
    shown_number,
)
from .errors import ProgramError
from .ir.ids import BufferId, StageId, TensorId
from .ir.nodes import (
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
from .ir.ops import Apply, Arg, Col, Expr, Lit, Map, Precision, RowArg, RowReduce
from .numerics.narrow import FLOAT32_MAX


class _Builder:
    """Tensors, rings and stages of a row program, added in order."""

    def __init__(self, m: int, n: int, precision: Precision) -> None:
        self.m, self.n, self.prec = m, n, precision
        self.tiles = (math.ceil(m / TILE.rows), math.ceil(n / TILE.cols))
        self.tensors: list[Tensor] = []
        self.buffers: list[Buffer] = []
        self.stages: list[Stage] = []

    def tensor(self, name: str, role: TensorRole, elems: tuple[int, int], dtype: DType) -> TensorId:
        tid = TensorId(len(self.tensors))
        tiles = (math.ceil(elems[0] / TILE.rows), math.ceil(elems[1] / TILE.cols))
        self.tensors.append(Tensor(tid, name, role, elems, tiles, dtype))
        return tid

    def ring(self, name: str, fifo: bool = False) -> BufferId:
        bid = BufferId(len(self.buffers))
        self.buffers.append(Buffer(bid, name, Fifo(1, 1) if fifo else Interm(1, 1)))
        return bid

    def stage(self, name: str, kind, engine: Engine, ins=(), outs=()) -> None:
        self.stages.append(Stage(StageId(len(self.stages)), name, kind, engine, tuple(ins), tuple(outs)))

    def read(self, tensor: TensorId, name: str) -> BufferId:
        """A read of `tensor` into a ring of its own (each pass reads the rows again)."""
        ring = self.ring(f"{name}_ring", fifo=True)
        self.stage(f"read_{name}", ReadStage(tensor), Engine.READER, outs=(ring,))
        return ring

    def reduce(self, name: str, op: str, ring: BufferId) -> BufferId:
        out = self.ring(f"{name}_ring")
        self.stage(name, ComputeStage(RowReduce(op, self.n)), Engine.COMPUTE, ins=(ring,), outs=(out,))
        return out

    def map(self, name: str, expr: Expr, ins: tuple[BufferId, ...]) -> BufferId:
        out = self.ring(f"{name}_ring")
        self.stage(name, ComputeStage(Map(expr)), Engine.COMPUTE, ins=ins, outs=(out,))
        return out

    def write(self, ring: BufferId, tensor: TensorId, name: str = "write_out") -> None:
        self.stage(name, WriteStage(tensor), Engine.WRITER, ins=(ring,))

    def program(self, name: str, target: str) -> SpatialProgram:
        return SpatialProgram(
            name, target, TILE, self.prec, tuple(self.tensors), tuple(self.stages), tuple(self.buffers)
        )


def _begin(m: int, n: int, precision: object, out: str | None, what: str) -> tuple[_Builder, DType]:
    m, n = _dim("m", m), _dim("n", n)
    check_elems("x", m, n)  # (every tensor of the program is m × n or less)
    prec = precision_of(precision)
    if prec == Precision.INT8:
        raise ProgramError(f"{what} is float arithmetic (row programs reduce in float32); use fp16 or bf16 (or fp32)")
    choices = OUTPUT_CHOICES["float"]
    out = out_named(out)
    if out is not None and out not in choices:
        named = what.removeprefix("a ")  # (a row sum's: "a bf16 row sum's output")
        raise ProgramError(f"a {prec.value} {named}'s output is one of {', '.join(choices)}, not {out!r}")
    return _Builder(m, n, prec), DType(out) if out is not None else DType.FLOAT32


def softmax(
    m: int,
    n: int,
    precision: str | Precision = "bf16",
    *,
    target: str = "sm_90",
    out: str | None = None,
    online: bool = False,
) -> SpatialProgram:
    """The program out = softmax(x) along each row of x (m × n): exp(x − max) / Σ exp(x − max), before tiling.

    By default three passes over each row: the max, the sum of exp(x − max) of a second read, then the quotient of a
    third. online=True: two — the max and the sum of exp(x − max) of one read of each page, the max and the sum kept
    running as FlashAttention keeps them (`passes/rows.py`), then the quotient; the stages say so by one read
    feeding both the max and the exp map beside it."""
    b, out_dtype, x, peak, total = _max_and_sum_of_exp(m, n, precision, out, online, "softmax")
    y = b.tensor("out", TensorRole.OUTPUT, (b.m, b.n), out_dtype)
    quotient = Apply("div", (Apply("exp", (Apply("sub", (Arg(0), RowArg(1))),)), RowArg(2)))
    b.write(b.map("normalise", quotient, (b.read(x, "x1" if online else "x2"), peak, total)), y)
    return b.program(f"softmax_{b.m}x{b.n}_{b.prec.value}" + ("_online" if online else ""), target)


def log_softmax(
    m: int,
    n: int,
    precision: str | Precision = "bf16",
    *,
    target: str = "sm_90",
    out: str | None = None,
    online: bool = False,
) -> SpatialProgram:
    """The program out = log_softmax(x) along each row of x (m × n), as torch.log_softmax(x, -1): x − max −
    log Σ exp(x − max), before tiling — softmax's passes (online=True: two, as softmax's), log s once a row (a map of
    the sum's vector), then the last map (x − m) − log s, as torch rounds it (no exp of the output, no quotient: a row
    of large negative logits keeps its values, where log(softmax) is −∞)."""
    b, out_dtype, x, peak, total = _max_and_sum_of_exp(m, n, precision, out, online, "log_softmax")
    y = b.tensor("out", TensorRole.OUTPUT, (b.m, b.n), out_dtype)
    log_sum = b.map("log_sum", Apply("log", (RowArg(0),)), (total,))  # once a row, not once an element
    shifted = Apply("sub", (Apply("sub", (Arg(0), RowArg(1))), RowArg(2)))
    b.write(b.map("log_normalise", shifted, (b.read(x, "x1" if online else "x2"), peak, log_sum)), y)
    return b.program(f"log_softmax_{b.m}x{b.n}_{b.prec.value}" + ("_online" if online else ""), target)


def _max_and_sum_of_exp(
    m: int, n: int, precision: object, out: str | None, online: object, what: str
) -> tuple[_Builder, DType, TensorId, BufferId, BufferId]:
    """The builder of a softmax-like program, its output's type, its input x, and the rings of each row's max and
    Σ exp(x − max): two passes, or one pass of both kept running (`online`: one read feeding the max and the exp map
    beside it)."""
    if not isinstance(online, bool):
        raise ProgramError(f"{what}'s online is True or False, not {online!r}")
    b, out_dtype = _begin(m, n, precision, out, what)
    x = b.tensor("x", TensorRole.INPUT, (b.m, b.n), DType(b.prec.value))
    peak, total = _max_and_sum(b, x, online)
    return b, out_dtype, x, peak, total


def _max_and_sum(b: _Builder, x: TensorId, online: bool) -> tuple[BufferId, BufferId]:
    """The rings of each row's max of x and Σ exp(x − max)."""
    first = b.read(x, "x0")
    peak = b.reduce("row_max", "max", first)
    shifted = Apply("exp", (Apply("sub", (Arg(0), RowArg(1))),))
    exps = b.map("exp", shifted, (first if online else b.read(x, "x1"), peak))
    return peak, b.reduce("row_sum", "sum", exps)


def eps_value(eps: object, what: str) -> float:
    """`eps` as a float: a finite number ≥ 0 that float32 holds (the programs add it in float32, where 1e39 is inf),
    else ProgramError naming `what` (rmsnorm, spatialc.torch.rms_norm)."""
    number = finite_number(eps)
    if number is None or not 0 <= number <= FLOAT32_MAX:
        raise ProgramError(
            f"{what}'s eps is a finite number ≥ 0 within float32 (at most {FLOAT32_MAX:.4g}), not {shown_number(eps)}"
        )
    return number


def rmsnorm(
    m: int,
    n: int,
    precision: str | Precision = "bf16",
    *,
    eps: float = 1e-6,
    weight: bool = True,
    residual: bool = False,
    target: str = "sm_90",
    out: str | None = None,
) -> SpatialProgram:
    """The program out = x · rsqrt(mean(x²) + eps) · w along each row of x (m × n), w the parameter tensor `weight`
    of n values (float32; none with weight=False), in two passes over each row — its sum of squares, then the
    scaling — before tiling.

    residual=True: fused add + RMSNorm, as vLLM's and FlashInfer's `fused_add_rms_norm` — a second input `residual`
    (m × n, x's type), h = x + residual (in float32), out = h · rsqrt(mean(h²) + eps) · w, and a second output
    `residual_out` = h stored in x's type (those kernels write it over `residual`). Each pass reads x and residual
    again: the first for the sum of squares, the last once for both outputs (its maps share h's pages)."""
    if not isinstance(residual, bool):
        raise ProgramError(f"rmsnorm's residual is True or False, not {residual!r}")
    eps = eps_value(eps, "rmsnorm")
    b, out_dtype = _begin(m, n, precision, out, "rmsnorm")
    if residual and b.prec.value not in OUTPUT_CHOICES["float"]:  # residual_out holds h in x's type
        raise ProgramError(
            f"fused add + RMSNorm (residual=True) stores residual_out in x's type, and a row program's outputs hold"
            f" {', '.join(OUTPUT_CHOICES['float'])}: give x one of those types, not {b.prec.value}"
        )
    x = b.tensor("x", TensorRole.INPUT, (b.m, b.n), DType(b.prec.value))
    r = b.tensor("residual", TensorRole.INPUT, (b.m, b.n), DType(b.prec.value)) if residual else None
    w = b.tensor("weight", TensorRole.PARAMETER, (1, b.n), accumulator_dtype(b.prec)) if weight else None
    y = b.tensor("out", TensorRole.OUTPUT, (b.m, b.n), out_dtype)
    h_out = b.tensor("residual_out", TensorRole.OUTPUT, (b.m, b.n), DType(b.prec.value)) if residual else None

    def rows(i: int) -> BufferId:
        """The pages of x — of x + residual with a residual — a pass reads again."""
        if r is None:
            return b.read(x, f"x{i}")
        return b.map(f"add{i}", Apply("add", (Arg(0), Arg(1))), (b.read(x, f"x{i}"), b.read(r, f"residual{i}")))

    squares = b.reduce("row_sumsq", "sumsq", rows(0))
    mean = Apply("div", (RowArg(1), Lit(float(b.n))))
    scaled: Expr = Apply("mul", (Arg(0), Apply("rsqrt", (Apply("add", (mean, Lit(float(eps)))),))))
    if w is not None:
        scaled = Apply("mul", (scaled, Col(w)))
    h = rows(1)
    b.write(b.map("scale", scaled, (h, squares)), y)
    if h_out is not None:  # the last pass's maps share h's pages: its writer stores a copy of them
        b.write(b.map("residual_copy", Arg(0), (h,)), h_out, "write_residual")
    kind = "rmsnorm_residual" if residual else "rmsnorm"
    return b.program(f"{kind}_{b.m}x{b.n}_{b.prec.value}", target)


def layernorm(
    m: int,
    n: int,
    precision: str | Precision = "bf16",
    *,
    eps: float = 1e-5,
    weight: bool = True,
    bias: bool = True,
    target: str = "sm_90",
    out: str | None = None,
) -> SpatialProgram:
    """The program of torch's native_layer_norm along each row of x (m × n), before tiling: out = (x − mean) · rstd
    · w + b, with mean = Σx / n and rstd = rsqrt(Σ(x − mean)² / n + eps) (the variance in two passes, as torch
    computes it); w and b the parameter tensors `weight` and `bias` of n values (float32; none with weight=False,
    bias=False). Three outputs: `out` (m × n), and `mean` and `rstd` (m × 1, float32). Three passes over each row:
    its sum, the sum of squares of x − mean, then the output."""
    eps = eps_value(eps, "layernorm")
    b, out_dtype = _begin(m, n, precision, out, "layernorm")
    x = b.tensor("x", TensorRole.INPUT, (b.m, b.n), DType(b.prec.value))
    w = b.tensor("weight", TensorRole.PARAMETER, (1, b.n), accumulator_dtype(b.prec)) if weight else None
    bb = b.tensor("bias", TensorRole.PARAMETER, (1, b.n), accumulator_dtype(b.prec)) if bias else None
    y = b.tensor("out", TensorRole.OUTPUT, (b.m, b.n), out_dtype)
    mean_t = b.tensor("mean", TensorRole.OUTPUT, (b.m, 1), DType.FLOAT32)
    rstd_t = b.tensor("rstd", TensorRole.OUTPUT, (b.m, 1), DType.FLOAT32)
    total = b.reduce("row_sum", "sum", b.read(x, "x0"))
    mean = b.map("mean", Apply("div", (RowArg(0), Lit(float(b.n)))), (total,))
    centred = b.map("centre", Apply("sub", (Arg(0), RowArg(1))), (b.read(x, "x1"), mean))
    squares = b.reduce("row_sumsq", "sumsq", centred)
    variance = Apply("add", (Apply("div", (RowArg(0), Lit(float(b.n)))), Lit(eps)))
    rstd = b.map("rstd", Apply("rsqrt", (variance,)), (squares,))
    normed: Expr = Apply("mul", (Apply("sub", (Arg(0), RowArg(1))), RowArg(2)))
    if w is not None:
        normed = Apply("mul", (normed, Col(w)))
    if bb is not None:
        normed = Apply("add", (normed, Col(bb)))
    b.write(b.map("normalise", normed, (b.read(x, "x2"), mean, rstd)), y)
    # The writer pops a vector it stores, so the vectors the maps read are written through copies of their own.
    b.write(b.map("mean_out", RowArg(0), (mean,)), mean_t, "write_mean")
    b.write(b.map("rstd_out", RowArg(0), (rstd,)), rstd_t, "write_rstd")
    return b.program(f"layernorm_{b.m}x{b.n}_{b.prec.value}", target)


# `row_reduce`'s: the table's, the mean and the log-sum-exp (torch.logsumexp)
ROW_REDUCTIONS = ("sum", "mean", "max", "min", "absmax", "sumsq", "logsumexp")


def row_reduce(
    m: int,
    n: int,
    op: str = "sum",
    precision: str | Precision = "bf16",
    *,
    target: str = "sm_90",
    out: str | None = None,
) -> SpatialProgram:
    """The program out[i] = `op` over row i of x (m × n) — torch's x.sum(-1), x.amax(-1), x.abs().amax(-1) (an fp8
    quantiser's per-token scale), the mean, torch.logsumexp(x, -1) — into `out`, an m × 1 tensor (float32 unless
    `out` says otherwise): one pass over each row, its values reduced in float32 (`numerics/reductions.py` defines
    each op), the mean the sum divided by n once a band, the log-sum-exp max + log Σ exp(x − max) with the max and the
    sum kept running in its one pass (online softmax's). No output of the rows' shape: a row vector alone."""
    if not isinstance(op, str) or op not in ROW_REDUCTIONS:
        raise ProgramError(f"a row reduction is one of {', '.join(ROW_REDUCTIONS)}, not {op!r}")
    b, out_dtype = _begin(m, n, precision, out, f"a row {op}")
    x = b.tensor("x", TensorRole.INPUT, (b.m, b.n), DType(b.prec.value))
    y = b.tensor("out", TensorRole.OUTPUT, (b.m, 1), out_dtype)
    if op == "logsumexp":
        folded = b.map("logsumexp", Apply("add", (RowArg(0), Apply("log", (RowArg(1),)))), _max_and_sum(b, x, True))
    else:
        folded = b.reduce(f"row_{op}", "sum" if op == "mean" else op, b.read(x, "x0"))
    if op == "mean":
        folded = b.map("mean", Apply("div", (RowArg(0), Lit(float(b.n)))), (folded,))
    b.write(folded, y)
    return b.program(f"row_{op}_{b.m}x{b.n}_{b.prec.value}", target)

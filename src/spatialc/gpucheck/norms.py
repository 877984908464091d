"""The GPU check's norm rows (issue 31): programs that reduce rows, `spatialc.softmax` and `spatialc.rmsnorm`, as
map rows of kinds of their own — `map:softmax:MxN`, `map:rmsnorm:MxN`, … — measured as maps are (maprows.py).

What a norm row does differently from an elementwise map's:
- Its kernel reads x once a pass over the row: softmax three times (its max, the sum of exp(x − max), the quotient),
  `map:softmax_online:MxN` — the same function, `spatialc.softmax(…, online=True)` — twice, RMSNorm twice (its sum
  of squares, the scaling). Its GB/s still count the bytes the function must move, x read once
  and C written once (`cases.map_bytes`), as the copy's do: its share of the copy says how near the kernel comes to
  moving each byte once.
- Its reference is the program's own stages, run on the device on whole tensors as the interpreter's reference runs
  them (`numerics.reference.row_stages`: each op in float64 from float32 operands, rounded to float32; a row sum in
  float64, rounded to float32), with the bound the kernel's tolerance carries beside it (`carried_rows`): a float32
  row sum within n + 2 float32 ulps of the sum of its magnitudes (`reductions.reduce_bound`), each op's interval
  over its operands' boxes plus its own rounding and ulps (`intervals.bounded`), and for C 2 ulps at 1.0 of its
  type and half its least step (`RowBound`). The device sums in float64 in its own order where the reference sums
  exactly (math.fsum): within n · 2^-53 of the magnitudes, so its float32 sum may lie an ulp from the exactly rounded
  one — which the bound's n + 2 ulps, against the (n − 1) / 2 a float32 sum can take, hold many times over.
- torch: `torch.softmax(x, dim=-1)`, kernel only through aten's `_softmax.out`; `F.rms_norm(x, (n,), w, eps)` (the
  formula where torch has none), which has no form that writes into C: its rows are timed by events, every
  contestant alike (maps.Kind).
- RMSNorm's weight is a parameter tensor: n values drawn once a row (maps.PARAM_RANGE) in the inputs' type, which
  spatialc's kernel reads as float32 (the same values) and torch in the inputs' type; so are LayerNorm's weight and
  bias.
- LayerNorm (`map:layernorm:MxN`, `spatialc.layernorm`: torch's native_layer_norm) has three outputs — out (m × n),
  mean and rstd (m × 1) — each checked against its own stages and bound (`carried_outputs`). The general form stores
  every output in one element type and mean and rstd are float32, so its out is float32 too (torch's is in the
  inputs' type); its bytes are those torch's kernel must move, x read and out written in the inputs' type and mean
  and rstd as float32 (`NormKind.bytes`), which spatialc's kernel exceeds by its float32 out and its three passes.
  torch: `F.layer_norm(x, (n,), w, b, eps)`, which has no form that writes into C: its rows are timed by events.
- Fused add + RMSNorm (`map:fused_add_rmsnorm:MxN`, `spatialc.rmsnorm(…, residual=True)`: vLLM's
  `fused_add_rms_norm`) reads x and residual and writes two outputs of their shape, out and residual_out = x +
  residual, both in the inputs' type; its kernel reads x and residual twice (the sum of squares' pass, then the
  last, whose h = x + residual a page feeds both outputs). torch: `h = x + r` then `F.rms_norm(h, (n,), w, eps)`
  (out alone is compared; two kernels or more, no form that writes into C: timed by events).
- Row reductions (`map:row_absmax:MxN`, `map:row_sum:MxN`, `map:row_logsumexp:MxN`: `spatialc.row_reduce`) read x
  once and write one value a row, an m × 1 output in the inputs' type (torch's `x.abs().amax(-1)`, `x.sum(-1)`,
  `torch.logsumexp(x, -1)`, kept as a column), one pass — the log-sum-exp's max and Σ exp(x − max) kept running in
  it, its bound carrying the running sum's rescalings as the online softmax's; their bytes are x's and the m
  values'. torch's calls allocate: timed by events.
- log_softmax (`map:log_softmax:MxN`, `spatialc.log_softmax`: torch.log_softmax) takes softmax's three passes, its
  last map x − max − log Σ exp(x − max); torch: `torch.log_softmax(x, dim=-1)`, kernel only through aten's
  `_log_softmax.out`.
- Every kind takes fp32 besides fp16 and bf16 (cases.MAP_PRECISIONS): x, its parameters and C as float32, the
  bytes 4 an element, torch computing in float32 — Triton's fused-softmax tutorial's row (`map:softmax:MxN:fp32`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SpatialError
from ..ir.ops import Apply, Arg, Col, Expr, Lit, RowArg
from ..numerics.elementwise import OPS
from ..numerics.intervals import _corners, _crosses_pole
from ..numerics.reductions import reduction_named
from ..numerics.tolerance import EPS32
from .cases import ELEM_OF, Case
from .maps import C_EPS, F64, OUT_STEP, Kind, elem_bytes

EPS = 1e-6  # RMSNorm's eps in its rows (LLaMA's)
LN_EPS = 1e-5  # LayerNorm's (torch's default)
ROW_VECTOR_BYTES = 4  # a float32 value a row: LayerNorm's mean and rstd, as torch stores them too


@dataclass(frozen=True)
class NormKind(Kind):
    """A norm: its program (`build(m, n, precision, target=, out=)`, a `spatialc` frontend), torch's calls (maps.Kind)
    and how many passes its kernel makes over each row; `outputs` the names of its several outputs (LayerNorm's out,
    mean and rstd; none: one output), the first `page_outputs` of them of the rows' shape and the rest row vectors
    (m × 1) of `vector_bytes` a value; `out` the type its kernel stores its first output in whatever torch gives
    (LayerNorm's float32; None: the type asked, torch's)."""

    name: str
    build: Callable[..., Any]
    torch_text: str
    torch_call: Callable[[Any, list[Any]], Any]
    torch_into: Callable[[Any, list[Any], Any, Any], None] | None
    passes: int
    names: tuple[str, ...] = ("x",)
    params: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    page_outputs: int = 1
    vector_bytes: int | None = ROW_VECTOR_BYTES  # None: the inputs' type's (a row reduction's one value a row)
    out: str | None = None
    family = "norm"

    def source(self, case: Case, target: str, out: str | None) -> Any:
        return self.build(case.m, case.n, case.precision, target=target, out=out)

    def kernel_out(self, case: Case, asked: str | None) -> str | None:
        """The kind's own type of its first output where it has one (LayerNorm's float32, mean's and rstd's), else
        the type asked."""
        return self.out if self.out is not None else asked

    def bytes(self, case: Case) -> int:
        """Each input read and each output of the rows' shape written once in the inputs' type, and each row-vector
        output's m values (LayerNorm's mean and rstd as float32, a row reduction's one in the inputs' type)."""
        vectors = max(1, len(self.outputs)) - self.page_outputs
        width = elem_bytes(case)
        per_vector = width if self.vector_bytes is None else self.vector_bytes
        return (len(self.names) + self.page_outputs) * case.m * case.n * width + vectors * case.m * per_vector

    def reference(self, case: Case, values: list[Any], params: dict[str, Any], xp: Any) -> tuple[Any, Any]:
        """The program's (first output's) value before C's rounding, as the interpreter's reference computes it, and
        the bound the kernel's tolerance carries to it (`carried_rows`)."""
        return next(iter(self.references(case, values, params, xp).values()))

    def references(self, case: Case, values: list[Any], params: dict[str, Any], xp: Any) -> dict[Any, Any]:
        """Each output's value and bound (`reference`), by name, for the kernel's outputs in the type it stores
        them (`kernel_out`)."""
        program = self.source(case, "sm_90", self.kernel_out(case, case.precision))
        found = carried_outputs(program, {**dict(zip(self.names, values, strict=True)), **params}, xp)
        elems = {t.name: ELEM_OF[t.dtype.value] for t in program.tensors}
        return {name: (value, RowBound(err, elems[name], case.n)) for name, (value, err) in found.items()}

    def bound_text(self, case: Case) -> str:
        return f"against its stages in float64 ({RowBound.words(case.n)})"


def _softmax(m: int, n: int, precision: str, **kw: Any) -> Any:
    import spatialc

    return spatialc.softmax(m, n, precision, **kw)


def _softmax_online(m: int, n: int, precision: str, **kw: Any) -> Any:
    import spatialc

    return spatialc.softmax(m, n, precision, online=True, **kw)


def _log_softmax(m: int, n: int, precision: str, **kw: Any) -> Any:
    import spatialc

    return spatialc.log_softmax(m, n, precision, **kw)


def _rmsnorm(m: int, n: int, precision: str, **kw: Any) -> Any:
    import spatialc

    return spatialc.rmsnorm(m, n, precision, eps=EPS, **kw)


def _layernorm(m: int, n: int, precision: str, **kw: Any) -> Any:
    import spatialc

    return spatialc.layernorm(m, n, precision, eps=LN_EPS, **kw)


def _fused_add_rmsnorm(m: int, n: int, precision: str, **kw: Any) -> Any:
    import spatialc

    return spatialc.rmsnorm(m, n, precision, eps=EPS, residual=True, **kw)


def _row_reduce(op: str) -> Callable[..., Any]:
    """The frontend of a row `op` into an m × 1 output (`spatialc.row_reduce`)."""

    def build(m: int, n: int, precision: str, **kw: Any) -> Any:
        import spatialc

        return spatialc.row_reduce(m, n, op, precision, **kw)

    return build


def _layer_norm(torch: Any, t: list[Any]) -> Any:
    """F.layer_norm, torch's native_layer_norm underneath (its mean and rstd computed and dropped)."""
    x, w, b = t
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def _softmax_into(torch: Any, t: list[Any], c: Any, scratch: Any) -> None:
    torch.ops.aten._softmax.out(t[0], -1, False, out=c)  # what torch.softmax(x, dim=-1) runs, into C


def _log_softmax_into(torch: Any, t: list[Any], c: Any, scratch: Any) -> None:
    torch.ops.aten._log_softmax.out(t[0], -1, False, out=c)  # what torch.log_softmax(x, dim=-1) runs, into C


def _rms_norm(torch: Any, t: list[Any]) -> Any:
    """F.rms_norm (torch 2.4 and later), else its formula as LLaMA's RMSNorm writes it."""
    x, w = t
    f = torch.nn.functional
    if hasattr(f, "rms_norm"):
        return f.rms_norm(x, (x.shape[-1],), w, EPS)
    v = x.float()
    return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def _fused_add_rms_norm(torch: Any, t: list[Any]) -> Any:
    """h = x + r in the inputs' type, then F.rms_norm of h: torch's out (its h is residual_out)."""
    x, r, w = t
    return _rms_norm(torch, [x + r, w])


NORMS = {
    k.name: k
    for k in (
        NormKind(
            "softmax",
            _softmax,
            "softmax(x, dim=-1)",
            lambda torch, t: torch.softmax(t[0], dim=-1),
            _softmax_into,
            3,
        ),
        # the same function in two passes, the max and the sum kept running (the softmax row's neighbour)
        NormKind(
            "softmax_online",
            _softmax_online,
            "softmax(x, dim=-1)",
            lambda torch, t: torch.softmax(t[0], dim=-1),
            _softmax_into,
            2,
        ),
        # softmax's passes, its last map x − max − log Σ exp(x − max)
        NormKind(
            "log_softmax",
            _log_softmax,
            "log_softmax(x, dim=-1)",
            lambda torch, t: torch.log_softmax(t[0], dim=-1),
            _log_softmax_into,
            3,
        ),
        NormKind("rmsnorm", _rmsnorm, f"F.rms_norm(x, (n,), w, eps={EPS:g})", _rms_norm, None, 2, params=("weight",)),
        NormKind(
            "layernorm",
            _layernorm,
            f"F.layer_norm(x, (n,), w, b, eps={LN_EPS:g})",
            _layer_norm,
            None,
            3,
            params=("weight", "bias"),
            outputs=("out", "mean", "rstd"),
            out="float32",
        ),
        # x and residual read twice: the sum of squares' pass, and the last, whose h feeds both outputs
        NormKind(
            "fused_add_rmsnorm",
            _fused_add_rmsnorm,
            f"h = x + r; F.rms_norm(h, (n,), w, eps={EPS:g})",
            _fused_add_rms_norm,
            None,
            2,
            names=("x", "residual"),
            params=("weight",),
            outputs=("out", "residual_out"),
            page_outputs=2,
        ),
        NormKind(
            "row_absmax",
            _row_reduce("absmax"),
            "x.abs().amax(-1)",
            lambda torch, t: t[0].abs().amax(-1, keepdim=True),
            None,
            1,
            page_outputs=0,
            vector_bytes=None,
        ),
        NormKind(
            "row_sum",
            _row_reduce("sum"),
            "x.sum(-1)",
            lambda torch, t: t[0].sum(-1, keepdim=True),
            None,
            1,
            page_outputs=0,
            vector_bytes=None,
        ),
        # the max and Σ exp(x − max) kept running in one pass (online softmax's), then max + log Σ a row
        NormKind(
            "row_logsumexp",
            _row_reduce("logsumexp"),
            "logsumexp(x, -1)",
            lambda torch, t: torch.logsumexp(t[0], -1, keepdim=True),
            None,
            1,
            page_outputs=0,
            vector_bytes=None,
        ),
    )
}


# ---- the reference and its bound, on the device ----------------------------------------------------------------


@dataclass(frozen=True)
class RowBound:
    """|C − R| ≤ err + 2 · eps · |R| + step for every element: R the program's value before C's rounding, err the
    bound carried to it (`carried_rows`), eps one ulp at 1.0 of C's type, step half C's least step, twice over (as
    `maps.MapBound`'s floor)."""

    err: Any
    elem: str
    n: int

    def allowed(self, ref: Any, xp: Any) -> Any:
        """The largest |C − R| each element may have."""
        return self.err + 2 * C_EPS[self.elem] * xp.abs(ref) + OUT_STEP[self.elem]

    @property
    def text(self) -> str:
        return self.words(self.n)

    @staticmethod
    def words(n: int) -> str:
        """The bound in words, for rows of `n` values."""
        return (
            f"each row sum within {n + 2} float32 ulps of its magnitude, each op's interval and rounding carried "
            "after it, plus 2 ulps at 1.0 of C's type"
        )


def carried_rows(program: Any, inputs: Mapping[str, Any], xp: Any) -> tuple[Any, Any]:
    """A row program's (first output's) value before C's rounding and the bound a kernel's lies within, from its
    inputs' and parameters' exact values (float64 arrays, by tensor name): its stages in the order its declaration
    gives, each read's tensor exact, each map carried by `carried`, each row reduction by `reduced` — what
    `numerics.reference.row_stages(…, bounds=True)` does on the CPU, here on `xp`'s arrays (CuPy on the device)."""
    return next(iter(carried_outputs(program, inputs, xp).values()))


def carried_outputs(program: Any, inputs: Mapping[str, Any], xp: Any) -> dict[str, tuple[Any, Any]]:
    """`carried_rows` for each output of a row program, by name in the program's order (LayerNorm's out, mean and
    rstd; a row vector's value and bound as a column, m × 1), each stage computed once for all of them."""
    from ..ir.index import ProgramIndex
    from ..passes.verify.declared import declared_outputs

    index = ProgramIndex.of(program)
    done: dict[Any, tuple[Any, Any]] = {}
    return {decl.out.name: _carried_to(program, index, decl, inputs, xp, done) for decl in declared_outputs(index)}


def _carried_to(
    program: Any, index: Any, decl: Any, inputs: Mapping[str, Any], xp: Any, done: dict[Any, tuple[Any, Any]]
) -> tuple[Any, Any]:
    """The value and bound of the output `decl` declares, its stages' rings kept in `done` (shared by outputs)."""
    from ..ir.nodes import ReadStage
    from ..ir.ops import RowReduce
    from ..numerics.reference import online_values, rescaled

    for stage in decl.producer.values():
        if isinstance(stage.kind, ReadStage) and index.ring(stage.outs[0]) not in done:
            x = inputs[program.tensor(stage.kind.tensor).name]
            done[index.ring(stage.outs[0])] = (x, xp.zeros((1, 1)))

    def col(c: Col) -> Any:
        return inputs[program.tensor(c.tensor).name].reshape(1, -1)

    for stage in decl.chain:
        ring = index.ring(stage.outs[0])
        if ring in done:
            continue
        pages = [done[index.ring(b)] for b in stage.ins]
        op = stage.kind.op
        done[ring] = reduced(op.op, *pages[0], xp) if isinstance(op, RowReduce) else carried(op.expr, pages, col, xp)
        shared = online_values(index, decl, stage)  # an online softmax's sum: its rescalings too
        if shared is not None:
            value, err = done[ring]
            done[ring] = (value, err + rescaled(done[shared], value, err, program.tile.cols, xp))
    return done[decl.last]


def _f32(x: Any, xp: Any) -> Any:
    """float64 values rounded to float32, held in float64."""
    return xp.asarray(x).astype(xp.float32).astype(xp.float64)


def carried(expr: Expr, pages: list[tuple[Any, Any]], col: Callable[[Col], Any], xp: Any) -> tuple[Any, Any]:
    """(value, error) of a map's `expr` as `intervals.bounded` gives them, on `xp`: each op's value in float64 from
    its operands' (`F64`), rounded to float32, and its error the spread of its exact value over the box of its
    operands' bounds (its corners: the ops here have no turning point, refused otherwise) — unbounded where the box
    holds a pole or a corner is not finite — plus (1 + ulps) float32 ulps of the value. A row vector's page is held as
    a column (m × 1), one value a row; a column vector is its row of values (1 × n)."""
    match expr:
        case Arg(i) | RowArg(i):
            return pages[i]
        case Lit(v):
            return float(np.float32(v)), 0.0
        case Col():
            return col(expr), 0.0
        case Apply(name, args, params):
            op = OPS[name]
            if name not in F64 or params or op.turns or op.tail or op.comparison:
                raise SpatialError(f"the GPU check carries no bound through {name!r} (norms.carried)")
            parts = [carried(a, pages, col, xp) for a in args]
            f = functools.partial(F64[name], xp)
            y = _f32(f(*(x for x, _ in parts)), xp)
            boxes = [(x - e, x + e) for x, e in parts]
            corners = [f(*c) for c in _corners(boxes)]
            lo, hi = functools.reduce(xp.minimum, corners), functools.reduce(xp.maximum, corners)
            unbounded = ~xp.isfinite(lo) | ~xp.isfinite(hi) | _crosses_pole(op, boxes)
            spread = xp.where(unbounded, xp.inf, xp.maximum(hi - y, y - lo))
            e = spread + (1 + op.ulps) * EPS32 * xp.abs(y)
            return y, xp.where(xp.isnan(e), xp.inf, e)
    raise SpatialError(f"the GPU check's norm rows take no {expr!r}")


def reduced(name: str, x: Any, e: Any, xp: Any) -> tuple[Any, Any]:
    """Each row of `x` (its elements each within `e`) reduced by `name`, as a column (m × 1), and the bound a
    kernel's lies within, as `reductions.reduce_rows` and `reduce_bound` give them: a max or min exact, within the
    largest error of its row; a sum rounded to float32 (see the module's docstring), within its terms' errors plus
    n + 2 float32 ulps of the sum of their magnitudes, each grown by its error."""
    r = reduction_named(name)
    e = xp.broadcast_to(xp.asarray(e), x.shape)
    y = r.pre(x)
    if r.combine in ("max", "min"):
        value = xp.max(y, axis=1, keepdims=True) if r.combine == "max" else xp.min(y, axis=1, keepdims=True)
        return value, xp.max(e, axis=1, keepdims=True)
    value = _f32(xp.sum(y, axis=1, keepdims=True), xp)
    grown = xp.abs(x) + e if name == "sum" else (xp.abs(x) + e) ** 2
    magnitude = xp.sum(grown, axis=1, keepdims=True)
    spread = xp.sum(e, axis=1, keepdims=True) if name == "sum" else magnitude - xp.sum(x * x, axis=1, keepdims=True)
    return value, xp.abs(spread) + (x.shape[1] + 2) * EPS32 * magnitude

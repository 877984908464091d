"""The GPU check's map rows (issue 31): programs with no matmul, `map:KIND:MxN` — elementwise maps (SwiGLU's gate
silu(gate) · x, a residual add x + r, gelu's tanh form) and norms that reduce rows (softmax, RMSNorm: their kinds
are in gpucheck/norms.py) — in fp16 and bf16, and in fp32 (spatialc's float32, the precision of programs with no
matmul: Triton's tutorials' vector add is the residual add in fp32), C in the inputs' type, as torch gives it.

A map reads each input once and writes its output once: its speed is bandwidth, so its rows count GB/s of those
bytes (every input read, C written) and set spatialc's kernel against two contestants timed in the same row:
- torch computing the same formula in the inputs' type (`F.silu(gate) * x`, `x + r`, `F.gelu(x, approximate="tanh")`,
  `torch.softmax`, `F.rms_norm`): end to end as a caller writes it (its results allocated), kernel only into results
  allocated beforehand (its ops' `out=` forms, which a CUDA graph can hold; where torch has none, the row is timed
  by events throughout);
- `torch`'s device-to-device copy (`copy_`) of as many bytes, half read and half written: the device's copy
  bandwidth, which no map beats and which issue 31 asks a map to reach within 10%.
spatialc's contestant is the general form's kernel (the form `auto` prints a map in; the persistent form prints one
too, untimed here, and the sm_90a form refuses one by name, which their contestants say), its output poisoned first,
checked element by element against the kind's float64 reference on the same rounded inputs within the kind's bound
(`check_map`), timed both ways like a GEMM row's kernels: kernel only on inputs already tiled, end to end from
row-major inputs (tilized on the device) to row-major C.

This module holds what a map row needs on the CPU — its kinds, their float64 references and bounds, its build
(`map_case`), what the dry run says of it; maprows.py measures it on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ew
from ..errors import SpatialError
from ..ir.nodes import DType
from ..ir.ops import Apply, Arg, Expr
from ..ir.traffic import DTYPE_BYTES
from ..numerics.elementwise import GELU_C, OPS
from ..numerics.tolerance import EPS32, OUT_EPS
from ..numerics.tolerance import OUT_STEP as STEP
from ..runtime.tilize import ELEMENT_DTYPES, storage_dtype, unwritten
from .agreement import Check, _errors, values64
from .builds import Built, Form, describe_plan, forms_of, hopper_form, plan_facts
from .cases import ELEM_OF, Case, map_bytes, one_line, spatialc_name

COPY = "torch copy_"  # the copy baseline's contestant
SPREAD = 4.0  # inputs uniform in ±SPREAD: past silu's and gelu's turning points (−1.28, −0.75) into their tails
PARAM_RANGE = (0.5, 1.5)  # parameters (a norm's weight) uniform in this range, rounded to the inputs' type
# The smallest step of C's type (its least subnormal): an unrounded reference lies up to half of it from any C of
# that type, however small, where a relative bound alone would ask for more than C can hold.
OUT_STEP = {"float16": STEP[DType.FP16], "bfloat16": STEP[DType.BF16], "float32": STEP[DType.FLOAT32]}
# One ulp at 1.0 of C's type (float32: a LayerNorm's outputs, which the general form stores in mean's and rstd's type).
C_EPS = {"float16": OUT_EPS[DType.FP16], "bfloat16": OUT_EPS[DType.BF16], "float32": OUT_EPS[DType.FLOAT32]}


def elem_bytes(case: Any) -> int:
    """The bytes of one element of a map case's or row's inputs: 2 (fp16, bf16) or 4 (fp32)."""
    return DTYPE_BYTES[ELEMENT_DTYPES[ELEM_OF[case.precision]]]


class Kind:
    """What a map row needs of its kind, whatever the kernel computes: an elementwise map (`MapKind`) or a norm that
    reduces rows (`norms.NormKind`). Its kernel's inputs (`names`, each m × n, which the function reads once) and
    parameter tensors (`params`, each n values, drawn once a row in `PARAM_RANGE`); torch's contestant end to end
    (`torch_call(torch, tensors)`: the inputs, then the parameters, in the inputs' type; its result allocated) and
    kernel only (`torch_into(torch, tensors, c, scratch)`: into C, and a scratch tensor of C's shape where torch
    takes two steps; None where torch has no such form, and then every contestant of the row is timed by events, as
    no CUDA graph holds a call that allocates)."""

    name: str
    names: tuple[str, ...]
    params: tuple[str, ...]
    torch_text: str
    torch_call: Callable[[Any, list[Any]], Any]
    torch_into: Callable[[Any, list[Any], Any, Any], None] | None
    family = "map"  # what a lost GPU is blamed on in its rows (`cases.kernel_path`): its kind's kernels together
    passes = 1  # how many times the kernel reads each input (a norm's reads its row again for each reduction)
    outputs: tuple[str, ...] = ()  # the names of several outputs (LayerNorm's out, mean, rstd); none: one output

    @property
    def contestant(self) -> str:
        """torch's contestant in this kind's rows."""
        return f"torch {self.torch_text}"

    @property
    def graphs(self) -> bool:
        """Whether the kind's rows time kernel only by CUDA graphs (torch has a form that allocates nothing)."""
        return self.torch_into is not None

    def source(self, case: Case, target: str, out: str | None) -> Any:
        """The program of `case` (unplanned), its output of type `out` (None: the frontend's own)."""
        raise NotImplementedError

    def kernel_out(self, case: Case, asked: str | None) -> str | None:
        """The type the kernel stores C in, given the one the check asks for (torch's: the inputs' type)."""
        return asked

    def bytes(self, case: Case) -> int:
        """The bytes the function must read and write (`cases.map_bytes`): each input once and C once, all m × n in
        the inputs' type (a norm's weight, n values, left out)."""
        return (len(self.names) + 1) * case.m * case.n * elem_bytes(case)

    def references(self, case: Case, values: list[Any], params: dict[str, Any], xp: Any) -> dict[Any, Any]:
        """Each output's (reference, bound) by name; None names the kernel's one output (`reference`)."""
        return {None: self.reference(case, values, params, xp)}

    def reference(self, case: Case, values: list[Any], params: dict[str, Any], xp: Any) -> tuple[Any, Any]:
        """The kind's value in float64 on the inputs' exact `values` (float64 arrays, in `names`' order) and the
        parameters' (by name), and the bound C must meet about it (`allowed(ref, xp)`, `text`)."""
        raise NotImplementedError

    def bound_text(self, case: Case) -> str:
        """The bound in words, before any value is drawn (the dry run's)."""
        raise NotImplementedError


@dataclass(frozen=True)
class MapKind(Kind):
    """An elementwise map: its formula as spatialc writes it (`spatialc.ew`) and as torch does. The formulas subtract
    no value they computed, so each op's relative error adds to the next's (`map_ulps`)."""

    name: str
    names: tuple[str, ...]
    expr: Callable[..., Any]  # the ew inputs → the ew formula
    torch_text: str
    torch_call: Callable[[Any, list[Any]], Any]
    torch_into: Callable[[Any, list[Any], Any, Any], None] | None
    params: tuple[str, ...] = ()

    def formula(self) -> Expr:
        """The formula as the IR holds it: Arg(i) the kernel's input i (the kinds read no column vectors)."""
        return ew.resolved(self.expr(*ew.inputs(len(self.names))), _no_column)

    def source(self, case: Case, target: str, out: str | None) -> Any:
        import spatialc

        expr = self.expr(*ew.inputs(len(self.names)))
        kw = {} if out is None else {"out": out}
        return spatialc.elementwise(expr, case.m, case.n, case.precision, names=self.names, target=target, **kw)

    def reference(self, case: Case, values: list[Any], params: dict[str, Any], xp: Any) -> tuple[Any, Any]:
        """The formula in float64, no rounding between ops (`reference64`), and its relative bound (`MapBound`)."""
        return reference64(self.formula(), values, xp), self.bound(case)

    def bound(self, case: Case) -> MapBound:
        """The relative bound of `case`'s C, for inputs drawn in ±SPREAD."""
        return MapBound.of(self.formula(), ELEM_OF[case.precision], SPREAD)

    def bound_text(self, case: Case) -> str:
        return f"against the formula in float64 ({self.bound(case).text})"


def _no_column(name: str) -> Any:
    raise SpatialError(f"a map row's formula reads its inputs alone, not the column vector {name!r}")


def _swiglu_into(torch: Any, t: list[Any], c: Any, scratch: Any) -> None:
    torch.ops.aten.silu.out(t[1], out=scratch)  # F.silu's own kernel, into a tensor allocated beforehand
    torch.mul(scratch, t[0], out=c)


def _residual_into(torch: Any, t: list[Any], c: Any, scratch: Any) -> None:
    torch.add(t[0], t[1], out=c)


def _gelu_into(torch: Any, t: list[Any], c: Any, scratch: Any) -> None:
    torch.ops.aten.gelu.out(t[0], approximate="tanh", out=c)


KINDS = {
    k.name: k
    for k in (
        MapKind(
            "swiglu",
            ("x", "gate"),
            lambda x, gate: ew.silu(gate) * x,
            "F.silu(gate) * x",
            lambda torch, t: torch.nn.functional.silu(t[1]) * t[0],
            _swiglu_into,
        ),
        MapKind("residual", ("x", "r"), lambda x, r: x + r, "x + r", lambda torch, t: t[0] + t[1], _residual_into),
        MapKind(
            "gelu",
            ("x",),
            lambda x: ew.gelu_tanh(x),
            'F.gelu(x, approximate="tanh")',
            lambda torch, t: torch.nn.functional.gelu(t[0], approximate="tanh"),
            _gelu_into,
        ),
    )
}


def kinds() -> dict[str, Kind]:
    """Every kind a map row takes: the elementwise maps above, then the norms (gpucheck/norms.py)."""
    from .norms import NORMS

    return {**KINDS, **NORMS}


def kind_of(case: Any) -> Kind:
    """The kind of a map case or row."""
    return kinds()[case.map]


# ---- the formula in float64 -------------------------------------------------------------------------------------

# Each op of the table (`numerics.elementwise.OPS`) the kinds use, as its `f64` states it, in float64 on the device's
# arrays (`xp`: CuPy there, numpy in the tests, which check each against the table's own). An op comes here with the
# kind that needs it; a formula that subtracts values it computed needs its bound carried by intervals, as
# `tolerance` does, not `MapBound`'s relative one — the norms' (softmax's x − max) are (norms.carried).
F64: dict[str, Callable[..., Any]] = {
    "silu": lambda xp, v: v / (1.0 + xp.exp(-v)),
    "gelu_tanh": lambda xp, v: 0.5 * v * (1.0 + xp.tanh(GELU_C * (v + 0.044715 * (v * v * v)))),
    "exp": lambda xp, v: xp.exp(v),
    "log": lambda xp, v: xp.log(v),
    "rsqrt": lambda xp, v: 1.0 / xp.sqrt(v),
    "add": lambda xp, a, b: a + b,
    "sub": lambda xp, a, b: a - b,
    "mul": lambda xp, a, b: a * b,
    "div": lambda xp, a, b: a / b,
}


def _ops(expr: Expr) -> list[str]:
    match expr:
        case Apply(name, args):
            return [name, *(op for a in args for op in _ops(a))]
    return []


def reference64(expr: Expr, values: list[Any], xp: Any) -> Any:
    """The formula in float64 on the inputs' exact values (`values`, float64 arrays): no rounding between ops."""
    match expr:
        case Arg(i):
            return values[i]
        case Apply(name, args):
            if name not in F64:
                raise SpatialError(f"the GPU check's float64 reference has no op {name!r}")
            return F64[name](xp, *(reference64(a, values, xp) for a in args))
    raise SpatialError(f"the GPU check's map rows take formulas of the inputs alone, not {expr!r}")


def map_ulps(expr: Expr) -> tuple[int, float]:
    """How far the kernel's float32 value may lie from the float64 formula: float32 ulps relative — each op's own
    rounding to float32 (half an ulp, counted whole) and a library op's ulps (`ElementwiseOp.ulps`) — and the ops'
    `tail`s (absolute, relative to the largest input): what `tolerance(p, kernel=True)` carries through a map by
    intervals, summed relative to R, which holds for formulas that subtract nothing they computed (`MapKind`)."""
    names = _ops(expr)
    return sum(int(OPS[n].ulps) + 1 for n in names), sum(OPS[n].tail for n in names)


@dataclass(frozen=True, slots=True)
class MapBound:
    """|C − R| ≤ rel · |R| + floor for every element: R the formula in float64, rel the float32 ulps of `map_ulps`
    plus 2 ulps at 1.0 of C's type (`tolerance`'s 2 · eps · |C|: C's own rounding and one step beyond), floor the
    formula's tails and half a step of C's type below its normal range."""

    rel: float
    floor: float

    @classmethod
    def of(cls, expr: Expr, elem: str, largest_input: float) -> MapBound:
        ulps, tail = map_ulps(expr)
        return cls(ulps * EPS32 + 2 * C_EPS[elem], tail * largest_input + OUT_STEP[elem])

    def allowed(self, ref: Any, xp: Any) -> Any:
        """The largest |C − R| each element may have."""
        return self.rel * xp.abs(ref) + self.floor

    @property
    def text(self) -> str:
        return f"each element within {100 * self.rel:.3g}% of R, plus {self.floor:.3g}"


def check_map(c: Any, ref: Any, bound: Any, elem: str, xp: Any, out_tiled: Any = None) -> Check:
    """A map's C (element type `elem`, logical) against its kind's float64 reference `ref`, element by element within
    `bound` (a `MapBound`, or a norm's `norms.RowBound`); the poison left in C and (given the tiled buffer) in its
    padding counted as `check_result` counts it."""
    storage = storage_dtype(elem)
    poison = unwritten(c, storage, xp)
    pad = 0 if out_tiled is None else unwritten(out_tiled, storage, xp) - poison
    c64 = values64(c, elem, xp)
    nonfinite = int(c.size - xp.count_nonzero(xp.isfinite(c64)))
    max_abs, rel_fro, _ = _errors(c64, ref, xp)
    within = xp.abs(c64 - ref) <= bound.allowed(ref, xp)  # NaN compares false: outside
    outside = int(c.size - xp.count_nonzero(within))
    return Check(outside == 0 and poison == 0 and nonfinite == 0, max_abs, rel_fro, poison, pad, nonfinite)


# ---- building (on the CPU) --------------------------------------------------------------------------------------


def map_case(built: Built, target: str) -> Built:
    """The map built and lowered in the general form, beside the forms it does not time (absent, with the reason: the
    persistent form's, lowered but untimed — or lower's refusal — and on sm_90 the sm_90a form's, built for sm_90a)."""
    import spatialc

    case, kind = built.case, kind_of(built.case)
    out = kind.kernel_out(case, built.kernel.get("out"))
    if out is not None:
        built.kernel["out"] = out
    source = kind.source(case, target, out)
    program = spatialc.build(source, target)
    built.plan = describe_plan(program)
    built.kernel.update(plan_facts(program))
    try:
        spatialc.lower(program, target, form="persistent")
        persistent = Form("persistent", absent="lowered, but a map row times its general form alone")
    except Exception as e:
        persistent = Form("persistent", absent=one_line(e))
    built.forms = [persistent, *forms_of(spatialc.lower(program, target))]
    if target == "sm_90":
        built.forms.append(hopper_form(source, {}))
    return built


def contenders(case: Case, built: Built) -> list[str]:
    """What the dry run says each contestant of a map row is timed for."""
    kind = kind_of(case)
    form = built.form("general")
    mine = "end to end + kernel only" if form is not None and form.artifact is not None else "n/a (no kernel)"
    kernel_only = "its ops' out= forms" if kind.graphs else "the same call: it has no out= form; the row by events"
    reads = f"; it reads x {kind.passes} times, the GB/s count once" if kind.passes > 1 else ""
    if kind.outputs:
        reads += f"; its outputs {', '.join(kind.outputs)} each checked, stored as {built.kernel.get('out')}"
    return [
        f"{spatialc_name('general')}: {mine}, checked {kind.bound_text(case)}{reads}",
        f"{kind.contestant}: end to end + kernel only ({kernel_only}), in {case.precision}",
        f"{COPY}: kernel only, {map_bytes(case) // 2} bytes copied device to device ({map_bytes(case)} moved, as"
        " the map moves): the copy bandwidth",
    ]

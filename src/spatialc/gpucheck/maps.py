"""The GPU check's map rows (issue 31): elementwise programs with no matmul, `map:KIND:MxN` — SwiGLU's gate silu(gate)
· x, a residual add x + r, gelu's tanh form — in fp16 and bf16, C in the inputs' type, as torch gives it.

A map reads each input once and writes its output once: its speed is bandwidth, so its rows count GB/s of those
bytes (every input read, C written) and set spatialc's kernel against two contestants timed in the same row:
- torch computing the same formula in the inputs' type (`F.silu(gate) * x`, `x + r`, `F.gelu(x, approximate="tanh")`):
  end to end as a caller writes it (its results allocated), kernel only into results allocated beforehand (its ops'
  `out=` forms, which a CUDA graph can hold);
- `torch`'s device-to-device copy (`copy_`) of as many bytes, half read and half written: the device's copy
  bandwidth, which no map beats and which issue 31 asks a map to reach within 10%.
spatialc's contestant is the general form's kernel (the only form that prints a map; the persistent kernel and the
sm_90a form refuse one by name, which their contestants say), its output poisoned first, checked element by element
against the formula in float64 on the same rounded inputs (`check_map`), timed both ways like a GEMM row's kernels:
kernel only on inputs already tiled, end to end from row-major inputs (tilized on the device) to row-major C.

Here too what a map row needs on the CPU: its kinds, its build (`map_case`), what the dry run says of it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ew
from ..errors import SpatialError
from ..ir.nodes import DType
from ..ir.ops import Apply, Arg, Expr
from ..numerics.elementwise import GELU_C, OPS
from ..numerics.tolerance import EPS32, OUT_EPS
from ..runtime.tilize import bf16_bits, storage_dtype, unwritten
from .builds import Built, Form, describe_plan, forms_of, hopper_form, plan_facts
from .cases import (
    ELEM_OF,
    BudgetExceeded,
    Case,
    Check,
    Contestant,
    Deadline,
    GpuLost,
    Row,
    _errors,
    agrees,
    blaming,
    is_sticky,
    kernel_path,
    map_bytes,
    one_line,
    spatialc_name,
    values64,
)
from .preflight import REFERENCE

COPY = "torch copy_"  # the copy baseline's contestant
SPREAD = 4.0  # inputs uniform in ±SPREAD: past silu's and gelu's turning points (−1.28, −0.75) into their tails
# The smallest step of C's type (its least subnormal): an unrounded reference lies up to half of it from any C of
# that type, however small, where a relative bound alone would ask for more than C can hold.
OUT_STEP = {"float16": 2.0**-24, "bfloat16": 2.0**-133}
C_EPS = {"float16": OUT_EPS[DType.FP16], "bfloat16": OUT_EPS[DType.BF16]}  # one ulp at 1.0 of C's type


@dataclass(frozen=True)
class MapKind:
    """One map of the rows: the kernel's input names, its formula as spatialc writes it (`spatialc.ew`) and as torch
    does, end to end (`torch_call`: the results allocated) and kernel only (`torch_into`: into C, and a scratch
    tensor of C's shape where torch takes two steps). The formulas subtract no value they computed, so each op's
    relative error adds to the next's (`map_ulps`)."""

    name: str
    names: tuple[str, ...]
    expr: Callable[..., Any]  # the ew inputs → the ew formula
    torch_text: str
    torch_call: Callable[[Any, list[Any]], Any]
    torch_into: Callable[[Any, list[Any], Any, Any], None]

    def formula(self) -> Expr:
        """The formula as the IR holds it: Arg(i) the kernel's input i (the kinds read no column vectors)."""
        return ew.resolved(self.expr(*ew.inputs(len(self.names))), _no_column)

    @property
    def contestant(self) -> str:
        """torch's contestant in this kind's rows."""
        return f"torch {self.torch_text}"


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


def kind_of(case: Case) -> MapKind:
    return KINDS[case.map]


# ---- the formula in float64 -------------------------------------------------------------------------------------

# Each op of the table (`numerics.elementwise.OPS`) the kinds use, as its `f64` states it, in float64 on the device's
# arrays (`xp`: CuPy there, numpy in the tests, which check each against the table's own). An op comes here with the
# kind that needs it; a formula that subtracts values it computed needs its bound carried by intervals, as
# `tolerance` does, not `MapBound`'s relative one.
F64: dict[str, Callable[..., Any]] = {
    "silu": lambda xp, v: v / (1.0 + xp.exp(-v)),
    "gelu_tanh": lambda xp, v: 0.5 * v * (1.0 + xp.tanh(GELU_C * (v + 0.044715 * (v * v * v)))),
    "add": lambda xp, a, b: a + b,
    "mul": lambda xp, a, b: a * b,
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

    @property
    def text(self) -> str:
        return f"each element within {100 * self.rel:.3g}% of R, plus {self.floor:.3g}"


def check_map(c: Any, ref: Any, bound: MapBound, elem: str, xp: Any, out_tiled: Any = None) -> Check:
    """A map's C (element type `elem`, logical) against the float64 formula `ref`, element by element within
    `bound`; the poison left in C and (given the tiled buffer) in its padding counted as `check_result` counts it."""
    storage = storage_dtype(elem)
    poison = unwritten(c, storage, xp)
    pad = 0 if out_tiled is None else unwritten(out_tiled, storage, xp) - poison
    c64 = values64(c, elem, xp)
    nonfinite = int(c.size - xp.count_nonzero(xp.isfinite(c64)))
    max_abs, rel_fro, _ = _errors(c64, ref, xp)
    within = xp.abs(c64 - ref) <= bound.rel * xp.abs(ref) + bound.floor  # NaN compares false: outside
    outside = int(c.size - xp.count_nonzero(within))
    return Check(outside == 0 and poison == 0 and nonfinite == 0, max_abs, rel_fro, poison, pad, nonfinite)


# ---- building (on the CPU) --------------------------------------------------------------------------------------


def map_case(built: Built, target: str) -> Built:
    """The map built and lowered in the general form, beside the forms that refuse a map (absent, with lower's own
    reason: the persistent kernel's, and on sm_90 the sm_90a form's, built for sm_90a)."""
    import spatialc

    case, kind = built.case, kind_of(built.case)
    out = {"out": built.kernel["out"]} if "out" in built.kernel else {}
    source = spatialc.elementwise(
        kind.expr(*ew.inputs(len(kind.names))),
        case.m,
        case.n,
        case.precision,
        names=kind.names,
        target=target,
        **out,
    )
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
    bound = MapBound.of(kind.formula(), ELEM_OF[case.precision], SPREAD)
    return [
        f"{spatialc_name('general')}: {mine}, checked against the formula in float64 ({bound.text})",
        f"{kind.contestant}: end to end + kernel only (its ops' out= forms), in {case.precision}",
        f"{COPY}: kernel only, {map_bytes(case) // 2} bytes copied device to device ({map_bytes(case)} moved, as"
        " the map moves): the copy bandwidth",
    ]


# ---- on the GPU ---------------------------------------------------------------------------------------------------


class MapRows:
    """Measures a map row on the GPU runner's device, clocks and torch (`device.GpuRunner`)."""

    def __init__(self, runner: Any):
        self.r, self.cp = runner, runner.cp

    def measure(self, case: Case, built: Built, row: Row, deadline: Deadline) -> None:
        from .device import settle
        from .timing import copies_for

        kind, elem = kind_of(case), ELEM_OF[case.precision]
        copies = copies_for(len(kind.names) * case.m * case.n * 2, self.r._l2_bytes())  # an input set's bytes
        sets = self._inputs(case, kind, copies)
        ref = blaming(REFERENCE, lambda: self._reference(kind, sets[0], elem, deadline))
        bound = MapBound.of(kind.formula(), elem, SPREAD)
        verdicts = [("error", built.error)] if built.error else []
        for form in built.forms:
            mine, verdict = self._spatialc(case, form, sets, ref, bound, deadline)
            row.contestants.append(mine)
            verdicts.append(verdict)
        row.status, row.note = settle(row.note, verdicts)
        row.contestants.append(
            self._library(kind.contestant, lambda: self._torch(case, kind, sets, ref, deadline), deadline)
        )
        row.contestants.append(self._library(COPY, lambda: self._copy(case, deadline), deadline))

    def _inputs(self, case: Case, kind: MapKind, copies: int) -> list[list[Any]]:
        """`copies` sets of the kind's inputs, row-major in their storage type (bf16 as its bits), drawn on the
        device uniform in ±SPREAD, the same on every run of the row."""
        cp = self.cp
        rs = cp.random.RandomState(zlib.crc32(f"{self.r.seed} {case}".encode()))
        sets = []
        for _ in range(copies):
            xs = [rs.uniform(-SPREAD, SPREAD, size=(case.m, case.n), dtype=cp.float32) for _ in kind.names]
            sets.append([x.astype(cp.float16) if case.precision == "fp16" else bf16_bits(x, cp) for x in xs])
        return sets

    def _reference(self, kind: MapKind, inputs: list[Any], elem: str, deadline: Deadline) -> Any:
        ref = reference64(kind.formula(), [values64(x, elem, self.cp) for x in inputs], self.cp)
        self.r._sync(deadline)
        return ref

    # ---- spatialc ------------------------------------------------------------------------------------------

    def _spatialc(
        self, case: Case, form: Form, sets: list[list[Any]], ref: Any, bound: MapBound, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        name = form.contestant
        if form.artifact is None:
            return Contestant(name, "spatialc", note=f"n/a: {form.absent}", facts=form.facts), ("", "")
        path = kernel_path(case, name)
        off = self.r.unavailable.get(path) or self.r.unavailable.get(name)  # it lost the GPU in an earlier process
        failure = form.error or (f"unavailable: {off}" if off else "")
        if not failure:
            try:
                return self._kernel(form, sets, ref, bound, deadline)
            except GpuLost as e:
                raise e.blame(path) from None
            except BudgetExceeded:
                raise
            except Exception as e:
                if is_sticky(e):
                    raise GpuLost(f"{name}: {one_line(e)}", path=path) from None
                failure = f"failed: {one_line(e)}"
        return Contestant(name, "spatialc", note=failure, facts=form.facts), ("error", f"{name}: {failure}")

    def _kernel(
        self, form: Form, sets: list[list[Any]], ref: Any, bound: MapBound, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        from ..ir.printer import plural
        from .device import same_error

        name, prep = form.contestant, self.r._prepare(form)
        ins = [a for a in prep.args if a.role == "input"]
        out = prep.output_buffer(poison=True)
        tiled = [prep.order(tuple(prep.tiled(a, x) for a, x in zip(ins, s, strict=True)), out) for s in sets]
        check = self._checked_run(prep, tiled[0], out, ref, bound, deadline)
        kernel = self.r._time(lambda i: prep.run(tiled[i]), len(tiled), deadline)
        again = self._checked_run(prep, tiled[0], out, ref, bound, deadline)
        check.stable = again.correct == check.correct and same_error(again.max_abs, check.max_abs)
        e2e = MapEndToEnd(prep, sets)
        e2e(0)
        self.r._sync(deadline)
        e2e_check = check_map(e2e.result, ref, bound, prep.output.elem, self.cp)
        end_to_end = self.r._time(e2e, len(sets), deadline, graphs=False)
        notes = []
        if not check.correct:
            notes.append(f"C wrong (max err {check.max_abs:.3g}, {plural(check.unwritten, 'element')} unwritten)")
        if not check.stable:
            notes.append("a second run on the same inputs gave another C")
        if check.pad_unwritten:
            notes.append(f"{check.pad_unwritten} padding elements unwritten")
        if not e2e_check.correct:
            notes.append(f"end-to-end C wrong (max err {e2e_check.max_abs:.3g})")
        detail = (
            f"C stored as {prep.output.elem}, checked {bound.text}; end to end: tilize each input on the device, the"
            " kernel, untilize C"
        )
        ok = e2e_check.correct
        mine = Contestant(
            name, "spatialc", end_to_end, kernel, check.max_abs, ok, detail, check=check, facts=form.facts
        )
        status = "ok" if check.correct and check.stable and ok else "wrong"
        return mine, (status, f"{name}: {'; '.join(notes)}" if notes else "")

    def _checked_run(
        self, prep: Any, args: tuple[Any, ...], out: Any, ref: Any, bound: MapBound, deadline: Deadline
    ) -> Check:
        from ..runtime.tilize import poison_value

        out.fill(poison_value(prep.output.storage))
        prep.run(args)
        self.r._sync(deadline)
        return check_map(prep.result(out), ref, bound, prep.output.elem, self.cp, out)

    # ---- torch and the copy --------------------------------------------------------------------------------

    def _library(self, name: str, measure: Callable[[], Contestant], deadline: Deadline) -> Contestant:
        """A library contestant measured (`measure`), or why not: no torch, left out after a loss, no time left, or
        a failure that did not lose the GPU."""
        family = "copy" if name == COPY else "torch"
        if self.r.torch is None:
            return Contestant(name, family, note="unavailable: torch is not installed (or sees no GPU)")
        if name in self.r.unavailable:
            return Contestant(name, family, note=f"unavailable: {self.r.unavailable[name]}")
        if deadline.passed():
            return Contestant(name, family, note="skipped: time budget spent")
        try:
            return measure()
        except GpuLost as e:  # a hung or lost GPU (GpuHung is one) ends the process's run, as device.py's
            raise e.blame(name) from None
        except BudgetExceeded:
            raise
        except Exception as e:
            if is_sticky(e):
                raise GpuLost(f"{name}: {one_line(e)}", path=name) from None
            return Contestant(name, family, note=f"failed: {one_line(e)}")

    def _torch(self, case: Case, kind: MapKind, sets: list[list[Any]], ref: Any, deadline: Deadline) -> Contestant:
        torch, libs, elem = self.r.torch, self.r.libs, ELEM_OF[case.precision]
        ts = [[libs.to_torch(x, case.precision) for x in s] for s in sets]
        c = torch.empty((case.m, case.n), dtype=ts[0][0].dtype, device=ts[0][0].device)
        scratch = torch.empty((case.m, case.n), dtype=ts[0][0].dtype, device=ts[0][0].device)
        box: list[Any] = [None]

        def e2e(i: int) -> None:
            box[0] = kind.torch_call(torch, ts[i])

        def kernel(i: int) -> None:
            kind.torch_into(torch, ts[i], c, scratch)

        kernel(0)
        e2e(0)
        self.r._sync(deadline)
        ok_k, err_k = agrees(libs.from_torch(c), elem, ref, self.cp, library=True)
        ok_e, err_e = agrees(libs.from_torch(box[0]), elem, ref, self.cp, library=True)
        detail = f"{kind.torch_text} in {case.precision}; kernel only into C allocated beforehand (its ops' out= forms)"
        if not (ok_k and ok_e):
            return Contestant(
                kind.contestant, "torch", max_abs=max(err_k, err_e), ok=False, detail=detail, note="wrong; not timed"
            )
        kernel_t = self.r._time(kernel, len(ts), deadline)
        end_to_end = self.r._time(e2e, len(ts), deadline, graphs=False)
        return Contestant(kind.contestant, "torch", end_to_end, kernel_t, max(err_k, err_e), True, detail)

    def _copy(self, case: Case, deadline: Deadline) -> Contestant:
        """Half the row's bytes copied device to device, so that as many bytes move as the map reads and writes:
        source buffers rotated like the inputs (each holding its own bytes), one destination."""
        from .timing import copies_for

        cp, torch = self.cp, self.r.torch
        half = map_bytes(case) // 2
        sources = [cp.full(half, i + 1, dtype=cp.uint8) for i in range(copies_for(half, self.r._l2_bytes()))]
        src = [torch.from_dlpack(x) for x in sources]
        dst = torch.empty((half,), dtype=torch.uint8, device=src[0].device)

        def kernel(i: int) -> None:
            dst.copy_(src[i])

        kernel(0)
        self.r._sync(deadline)
        if not bool(cp.all(self.r.libs.from_torch(dst) == 1)):
            return Contestant(COPY, "copy", ok=False, note="wrong: the copy's bytes differ from its source's")
        kernel_t = self.r._time(kernel, len(src), deadline)
        detail = f"{half} bytes read and as many written, device to device: the map's {map_bytes(case)} bytes"
        return Contestant(COPY, "copy", None, kernel_t, 0.0, True, detail)


class MapEndToEnd:
    """What spatialc.run does on the device for a map's row-major inputs: tilize each, launch, untilize C (in the
    inputs' type: nothing to convert); `result` holds the last C."""

    def __init__(self, prep: Any, sets: list[list[Any]]):
        self.prep, self.sets = prep, sets
        self.ins = [a for a in prep.args if a.role == "input"]
        self.result: Any = None

    def __call__(self, i: int) -> None:
        p = self.prep
        out = p.output_buffer(poison=False)
        p.run(p.order(tuple(p.tiled(a, x) for a, x in zip(self.ins, self.sets[i], strict=True)), out))
        self.result = p.result(out)

"""The GPU check's fused-epilogue rows (issue 31): `fused:SIZE`, the GEMM C = (A·B) · row_scale · col_scale + residual
(`spatialc.row_scale()`, `col_scale()`, `residual()`), in bf16, C stored in bf16 as torch gives it.

Issue 31's goal for it: not slower than the plain GEMM of the same size by more than 3%. So a fused row holds, beside
its own kernels, the plain GEMM's (every form the plain row has, each at its own plan), timed kernel only in the same
row — on the same device, minutes apart at most — and the report sets each form's fused kernel against the plain one
of that form, and the fastest right fused kernel against the fastest right plain one (`fused_summary`).

Which form prints the fused GEMM is `spatialc.lower`'s own choice (`auto`), recorded in the row (`kernel["form"]`):
today the persistent kernel and the sm_90a form refuse a residual (their fused stores read no second tensor's pages)
and the general form prints it, at a plan of its own; a form that later takes it shows up here without a change.

The epilogue's tensors are drawn with A and B (`device.GpuRunner._inputs`): the scales uniform in PARAM_RANGE, one
per row and one per column, stored in the operands' type (spatialc's kernel reads them as float32, the same
values; torch in bf16), and the residual uniform in ±√(k/3), the spread of A·B's elements, so that a residual lost
or read at the wrong place moves C by as much as C itself. The reference is the float64 product with the epilogue
applied in float64 (`reference`); each kernel is held to the GEMM rows' tolerance of its C's type.

torch's contestant is `torch.matmul` followed by the same epilogue in the inputs' type: kernel only through the
ops' `out=` forms into C (four kernels, which one CUDA graph holds), end to end allocating as a caller writes it.
Triton's matmul has no epilogue: not a contestant here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .builds import Built, Form, build_case, describe_plan, forms_of, general_planned, hopper_form, plan_facts
from .cases import FORMS, SAME_SPEED, Case, Row, spatialc_name

PLAIN = "(plain GEMM)"  # the plain GEMM's kernels in a fused row: `spatialc general (plain GEMM)`
TORCH_EPILOGUE = "torch.matmul + epilogue"
EPILOGUE_TEXT = "(A·B) · row_scale · col_scale + residual"
SCALE_RANGE = (0.5, 1.5)  # the scales' values (as maps.PARAM_RANGE)
GOAL = 0.03  # issue 31: the fused kernel at most this much slower than the plain GEMM


def epilogue() -> list[Any]:
    """The fused row's epilogue, in the order C meets it."""
    import spatialc

    return [spatialc.row_scale(), spatialc.col_scale(), spatialc.residual()]


def residual_spread(k: int) -> float:
    """The residual's values are uniform in ±this: A·B's spread for A and B uniform in ±1 (each term's variance 1/9, k
    of them; a uniform ±s has variance s²/3)."""
    return math.sqrt(k / 3)


# ---- building (on the CPU) --------------------------------------------------------------------------------------


def fused_case(built: Built, target: str, kw: dict[str, Any]) -> Built:
    """The fused GEMM built and lowered as `auto` chooses (the form it picked in `kernel["form"]`, and why the others
    refused in the note), the sm_90a form's attempt, then the plain GEMM's kernels of the same size (`plain_forms`)."""
    import spatialc

    case = built.case
    gemm = spatialc.gemm(case.m, case.n, case.k, case.precision, epilogue=epilogue(), **kw)
    program = spatialc.build(gemm, target)
    built.plan = describe_plan(program)
    built.kernel.update(plan_facts(program))
    artifact = spatialc.lower(program, target)
    built.kernel["form"] = artifact.budget.form
    forms = forms_of(artifact, lambda: general_planned(gemm, target))
    if artifact.budget.form == "general":  # the persistent kernel refused it: said in its place
        why = next((n for n in artifact.notes if "persistent kernel refuses" in n), "; ".join(artifact.notes))
        forms.insert(0, Form("persistent", absent=why or "lower chose the general form"))
    built.note = f"lower's auto chose the {artifact.budget.form} form"
    if target == "sm_90":
        forms.append(hopper_form(gemm, {}))
    built.forms = [*forms, *plain_forms(case, target, built)]
    return built


def plain_forms(case: Case, target: str, built: Built) -> list[Form]:
    """The plain GEMM of the case's size, every form its own row has, each timed kernel only and named as the plain
    GEMM's (`spatialc general (plain GEMM)`); where it does not build, the row's note says why."""
    plain = build_case(Case(case.m, case.n, case.k, case.precision), target)
    if plain.error:
        built.note = "; ".join(x for x in (built.note, f"the plain GEMM: {plain.error}") if x)
    for form in plain.forms:
        form.variant, form.kernel_only = PLAIN, True
    return [f for f in plain.forms if f.artifact is not None]


def is_plain(form: Form) -> bool:
    return form.variant == PLAIN


# ---- on the device ------------------------------------------------------------------------------------------------


def more_inputs(case: Case, random: Callable[[tuple[int, int], float, float], Any]) -> dict[str, Any]:
    """One set of the epilogue's tensors, by name, each drawn by `random(shape, lo, hi)` (stored in the operands'
    type): the row scale (m × 1), the column scale (1 × n) and the residual (m × n)."""
    s = residual_spread(case.k)
    return {
        "row_scale": random((case.m, 1), *SCALE_RANGE),
        "col_scale": random((1, case.n), *SCALE_RANGE),
        "residual": random((case.m, case.n), -s, s),
    }


def reference(product: Any, more: dict[str, Any]) -> Any:
    """The epilogue applied in float64 to the float64 product (`more`: the tensors' float64 values, by name)."""
    return product * more["row_scale"] * more["col_scale"] + more["residual"]


def torch_epilogue(torch: Any, a: Any, b: Any, more: dict[str, Any], c: Any = None) -> Any:
    """torch.matmul and the same epilogue in the inputs' type: into `c` through the ops' out= forms (four kernels),
    or allocating (c None) as a caller writes it."""
    if c is None:
        return torch.matmul(a, b) * more["row_scale"] * more["col_scale"] + more["residual"]
    torch.matmul(a, b, out=c)
    torch.mul(c, more["row_scale"], out=c)
    torch.mul(c, more["col_scale"], out=c)
    torch.add(c, more["residual"], out=c)
    return c


def contenders(case: Case, built: Built) -> list[str]:
    """What the dry run says each contestant of a fused row is timed for."""
    said = []
    for form in built.forms:
        what = "kernel only, against the fused kernel" if is_plain(form) else "end to end + kernel only"
        said.append(f"{form.contestant}: {what if form.artifact is not None else 'n/a (no kernel)'}")
    said.append(f"{TORCH_EPILOGUE}: end to end + kernel only (out= forms), {EPILOGUE_TEXT} in {case.precision}")
    said.append("Triton matmul: n/a (its kernel has no epilogue)")
    return said


# ---- the report -------------------------------------------------------------------------------------------------


def _right_kernel_s(c: Any) -> float | None:
    """A contestant's median kernel time, where its own C was right and stable."""
    right = c is not None and c.check is not None and c.check.correct and c.check.stable is not False
    return c.kernel.median_s if right and c.kernel is not None else None


def fused_summary(row: Row) -> dict[str, Any]:
    """Each form's fused kernel against the plain GEMM's of that form (fused time / plain time, kernel only), the
    fastest right of each against the other, and issue 31's goal (the fastest fused at most GOAL slower, within the
    timing noise SAME_SPEED besides: None where either has no right, timed kernel)."""
    forms: dict[str, Any] = {}
    for form in FORMS:
        fused, plain = row.spatialc(form), row.spatialc(f"{form} {PLAIN}")
        tf, tp = _right_kernel_s(fused), _right_kernel_s(plain)
        if fused is None and plain is None:
            continue
        forms[form] = {"fused_s": tf, "plain_s": tp, "ratio": tf / tp if tf and tp else None}
    fused_t = {f: v["fused_s"] for f, v in forms.items() if v["fused_s"]}
    plain_t = {f: v["plain_s"] for f, v in forms.items() if v["plain_s"]}
    goal = None
    if fused_t and plain_t:
        ratio = min(fused_t.values()) / min(plain_t.values())
        goal = "met" if ratio <= 1 + GOAL + SAME_SPEED else f"missed: {ratio:.2f}× the plain GEMM's time"
    return {
        "picked": row.kernel.get("form"),
        "forms": forms,
        "fastest_fused": min(fused_t, key=fused_t.__getitem__) if fused_t else None,
        "fastest_plain": min(plain_t, key=plain_t.__getitem__) if plain_t else None,
        "ratio": min(fused_t.values()) / min(plain_t.values()) if fused_t and plain_t else None,
        "goal": goal,
    }


def fused_lines(rows: list[Row]) -> list[str]:
    """The fused rows against the plain GEMM in the same row, kernel only (none without fused rows)."""
    out = []
    for r in (r for r in rows if r.fused):
        s = fused_summary(r)
        each = "; ".join(f"{form} {v['ratio']:.2f}×" if v["ratio"] else f"{form} —" for form, v in s["forms"].items())
        best = (
            f"fastest fused ({s['fastest_fused']}) / fastest plain ({s['fastest_plain']}) {s['ratio']:.2f}×"
            if s["ratio"]
            else "no right, timed kernel on one side"
        )
        out.append(f"- {r.precision} {r.size} (auto: {s['picked']}): {each}; {best}; goal: {s['goal'] or '—'}")
    if not out:
        return []
    head = (
        f"Fused epilogues ({EPILOGUE_TEXT}) against the plain GEMM of the same size in the same row, kernel only: "
        f"each form's fused kernel time over its plain one (— where one has no right, timed kernel; "
        f"{spatialc_name('general')} {PLAIN} and the like are in the contestants table); issue 31's goal: the fastest "
        f"fused at most {GOAL:.0%} slower than the fastest plain, within the timing noise ({SAME_SPEED:.0%}):"
    )
    return ["", head, "", *out]

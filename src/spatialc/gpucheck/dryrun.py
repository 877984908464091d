"""The GPU check's dry run: what a GPU run would do, said on a CPU: the preflight's steps, the two timings, and for
each case its plan, for each of its kernels (the persistent kernel, its general form and, on sm_90, the sm_90a form's
kernel of the same GEMM built for sm_90a) the launch, ptxas's
numbers and where its cubin would come from, and what they are timed against."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..ir.printer import plural
from . import baselines as bl
from .blockscaled import BLOCKWISE
from .builds import Built, Form, build_case, compile_kernel, conversion, describe_ptxas, gemm_takes_out, use_prepared
from .cases import FORMS, HOPPER_FORM, Case, grouped_sizes, kernel_arch, spatialc_name
from .fp8 import EPILOGUE_TEXT, SCALED_MM
from .preflight import PREFLIGHT_S, step_names

# ---- the dry run -----------------------------------------------------------------------------------------------

END_TO_END = (
    "end to end: row-major A and B in, row-major C out in torch's type (int32 for int8, fp16 / bf16 for fp16 / "
    "bf16): every layout copy, tilize / untilize and conversion included; batches of launches between one pair of "
    "events, the host's launching included, as a caller has it"
)
KERNEL_ONLY = (
    "kernel only: operands already in each contestant's layout, C preallocated; batches of launches replayed as "
    "CUDA graphs (the launching left out), launch by launch where a capture fails"
)


def outputs_note() -> str:
    """How C comes out of spatialc's kernels, for the dry run and the report's header."""
    if gemm_takes_out():
        return "spatialc.gemm(…, out=…) builds each kernel to store C in torch's type (int32, fp16, bf16)"
    return (
        "spatialc.gemm takes no `out` yet: its kernels store C in their own type (see the kernel table), and the "
        "end-to-end times include converting C to torch's type"
    )


def _say(line: str) -> None:
    print(line, flush=True)  # each case as it is built, also through a pipe


def dry_run(cases: Sequence[Case], target: str, manifest: Any = None, out: Callable[[str], None] = _say) -> None:
    """Say what a GPU run would do: the preflight's steps, the timings, and for each case its plan and, for each of
    its kernels, the launch (built here, on the CPU), what ptxas says of it (from the prepared folder, or compiled for
    `target` when nvcc is here) and where its cubin would come from; then what they are timed against."""
    out(f"gpucheck dry run: {plural(len(cases), 'row')} on {target}; would write gpucheck.json and gpucheck.md")
    steps = "; ".join(step_names(cases))
    out(f"preflight (first, at most {PREFLIGHT_S:.0f} s; a step that fails marks its path unavailable): {steps}")
    out(f"timings: {END_TO_END}; {KERNEL_ONLY}")
    out(f"outputs: {outputs_note()}")
    out(f"cubins: prepared in {manifest.folder} ({manifest.summary()})" if manifest else _unprepared())
    for case in cases:
        _dry_case(case, target, manifest, out)


def _unprepared() -> str:
    from ..runtime import nvcc

    here = (
        "; this dry run compiles each kernel here with nvcc for ptxas's numbers, a few seconds each (`--prepared DIR` "
        "reads them from a prepared folder instead)"
        if nvcc.find_nvcc() is not None
        else ""
    )
    return (
        f"cubins: none prepared: the GPU run compiles them (`spatialc gpucheck DIR --prepare` does it beforehand){here}"
    )


def _dry_case(case: Case, target: str, manifest: Any, out: Callable[[str], None]) -> None:
    built = build_case(case, target)
    out(str(case))
    if built.skip:
        out(f"  skipped   {built.skip}")
        return
    out(f"  plan      {built.plan or '—'}")
    if built.error:
        out(f"  launch    {built.error}")
    for form in built.forms:
        _dry_form(case, form, target, manifest, out)
    if built.note:
        out(f"  note      {built.note}")
    out(f"  timed     {'; '.join(contenders(case, built))}")


def _dry_form(case: Case, form: Form, target: str, manifest: Any, out: Callable[[str], None]) -> None:
    """One kernel of a case: its launch, ptxas's numbers, its cubin's origin and C's type (or why there is none)."""
    if form.artifact is None:
        out(f"  {form.contestant}: {form.absent}")
        return
    arch = kernel_arch(form.name, target)  # the sm_90a form's kernels are built for sm_90a
    why = use_prepared(form, manifest, arch) if manifest else ""
    if form.cubin is not None:
        cubin = f"prepared: {form.cubin.name} (source hash checked)"
    else:
        cubin = f"compiled on the GPU machine{': ' + why if why else ''}"
        _dry_compile(form, arch)
    # A map row's end to end converts nothing, nor an attention row's (O and LSE as the kernel stores them).
    conv = "" if case.map or case.heads[0] else conversion(case, form.facts["c_elem"])
    out(f"  {form.contestant}")
    if "sweep" in form.facts:
        sweep = form.facts["sweep"]
        out(f"    plan      {sweep['change']}: {form.facts['own_plan']}")
        out(f"    predicted {sweep['predicted']:.2f}× the speed of its planner's plan, by the planner's own cost")
    elif "w4_plan" in form.facts:
        out(f"    plan      its own ({form.name} form): {form.facts['w4_plan']}")
    elif "own_plan" in form.facts:
        whose = "built for sm_90a" if form.name == HOPPER_FORM else "the case's leaves it no room"
        out(f"    plan      its own ({whose}): {form.facts['own_plan']}")
    out(f"    launch    {form.facts['launch']}")
    out(f"    ptxas     {describe_ptxas(form.facts)}")
    if form.facts.get("sass"):
        out(f"    sass      {form.facts['sass']}")
    out(f"    cubin     {cubin}")
    out(f"    C         stored as {form.facts['c_elem']}" + (f"; end to end converts {conv}" if conv else ""))


def _dry_compile(form: Form, target: str) -> None:
    from ..runtime import nvcc

    if nvcc.find_nvcc() is None:
        form.facts["ptxas"] = "no nvcc here"
        return
    try:
        compile_kernel(form, target)
    except nvcc.KernelBuildError as e:
        form.facts["ptxas"] = f"compile: {e}"


def contenders(case: Case, built: Built) -> list[str]:
    """Each contestant of a case and what it is timed for (or why it cannot take the shape)."""
    if case.groups > 1:  # grouped.py: kernel only, against the grouped ways of torch
        from .grouped import GROUPED_MM, TORCH_LOOP
        from .groupedbs import LOOP_BLOCKWISE, LOOP_TENSOR

        form = built.form("general")
        mine = "kernel only" if form is not None and form.artifact is not None else "n/a (no kernel)"
        sizes = grouped_sizes(case.groups, case.m)
        return [
            f"row counts {', '.join(map(str, sizes[:8]))}{', …' if len(sizes) > 8 else ''} ({int(sizes.sum())} rows)",
            f"{spatialc_name('general')}: {mine}, rows past each count checked to keep the poison",
            *(
                (
                    f"{LOOP_TENSOR}: kernel only, against each group's A·B",
                    f"{LOOP_BLOCKWISE}: kernel only, where "
                    "this torch has it (2.9 and later), its C checked in the row (the block-scaled sum)",
                )
                if case.blockscaled  # groupedbs.py
                else (f"{TORCH_LOOP}: kernel only", f"{GROUPED_MM}: kernel only, where this torch has it")
            ),
        ]
    if case.heads[0]:  # attnrows.py: the forms that print attention, torch's SDPA backends, flash_attn
        from .attnrows import contenders as attention_contenders

        return attention_contenders(case, built)
    if case.weights:  # w4rows.py: each form, torch's mm on the dequantised weights and the copy, kernel only
        from .w4rows import contenders as w4_contenders

        return w4_contenders(case, built)
    if case.map:  # maps.py: torch's formula and the copy, in GB/s
        from .maps import contenders as map_contenders

        return map_contenders(case, built)
    if case.fused:  # the fused kernels, the plain GEMM's beside, torch's GEMM and epilogue (fused.py)
        from .fused import contenders as fused_contenders

        return fused_contenders(case, built)
    if case.sweep:  # each form at each plan of the sweep (sweep.py)
        said = [f"{f.contestant}: {_kernel_timed(f)}" for f in built.forms]
    else:
        said = [f"{spatialc_name(name)}: {_kernel_timed(built.form(name))}" for name in FORMS]
    for name, _family in bl.baselines_of(case):
        why = bl.refusal(name, case)
        if why:
            said.append(f"{name}: n/a ({why})")
        elif name == BLOCKWISE:  # no preflight step: each block-scaled row checks its library results itself
            said.append(f"{name}: end to end + kernel only, its C checked in the row (the block-scaled sum)")
        elif name in SCALED_MM:  # no preflight step: each fp8 row checks its library results itself
            said.append(f"{name}: end to end + kernel only, its C checked in the row ({EPILOGUE_TEXT} or A·B)")
        elif name == bl.GEMM_EX:
            said.append(f"{name}: end to end + kernel only, {bl.padding(case)}, where the preflight finds it works")
        else:
            said.append(f"{name}: end to end + kernel only, where the preflight finds it works")
    return said


def _kernel_timed(form: Form | None) -> str:
    """What one of spatialc's kernels is timed for: both ways (a sweep's other plans: kernel only), or nothing where
    lower printed none."""
    if form is None or form.artifact is None:
        return "n/a (no kernel)"
    return "kernel only" if form.kernel_only else "end to end + kernel only"

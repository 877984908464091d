"""The GPU check's CPU work: building and lowering each case, compiling its kernels — the persistent kernel and its
general form — (or finding them prepared), and the pool that does this in background threads while the GPU runs
earlier rows. On a GPU the planning and lowering run in processes of their own (`processes`): in a thread they
would hold the GIL for seconds at a time (47 cases, about 40 CPU-seconds) while the thread timing the first rows
waits to launch, and a 4096³ row's end-to-end time would measure the builds.

Each nvcc gets no more than the budget's time left; `close` cancels the builds not started and kills the nvcc
processes still running (with the cicc and ptxas they started), so a run ends within its budget.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runtime import launch, nvcc
from ..runtime.cpus import usable_cpus
from .blockscaled import scales_of
from .cases import (
    ELEM_OF,
    HOPPER_FORM,
    TORCH_OUT,
    BudgetExceeded,
    Case,
    Deadline,
    kernel_arch,
    one_line,
    spatialc_name,
)
from .fp8 import epilogue as fp8_epilogue
from .fp8 import is_fp8

COMPILE_S = 300.0  # the most one nvcc may take …
COMPILE_GRACE_S = 2.0  # … and never past the deadline plus this (the deadline keeps RESERVE_S ≥ this back)
MIN_COMPILE_S = 1.0  # an nvcc is not started with less than this left
CLOSE_WAIT_S = 2.0  # how long `close` waits for the killed compiles' threads to finish
# What ptxas says of a kernel, under the report's names, each from its field of launch's PtxasInfo.
PTXAS_FIELDS = {
    "registers": "registers",
    "spill_stores": "spill_stores",
    "spill_loads": "spill_loads",
    "static_smem": "smem",
    "stack": "stack",
}


@dataclass
class Form:
    """One of a built case's kernels (`name` of FORMS): its artifact (None: lower printed none, `absent` says why),
    its numbers for the report and where its cubin is."""

    name: str
    artifact: Any = None
    absent: str = ""  # why lower printed no kernel in this form
    error: str = ""  # why it cannot run: its compile failed or was not started
    facts: dict[str, Any] = field(default_factory=dict)  # launch, budget, C's type, ptxas numbers, the cubin's origin
    cubin: Path | None = None  # a prepared cubin to load instead of compiling
    variant: str = ""  # a sweep's plan other than the planner's, in the contestant's name (`8×16×4 d3`)
    kernel_only: bool = False  # timed kernel only (a sweep's other plans: their end to end is the planner's)

    @property
    def label(self) -> str:
        """The form, and a sweep plan's own name after it (`sm90a 8×16×4 d3`)."""
        return self.name + (f" {self.variant}" if self.variant else "")

    @property
    def contestant(self) -> str:
        return spatialc_name(self.label)


@dataclass
class Built:
    """A case built and lowered (or the reason it was not): its plan and its kernels, one per form lower gave."""

    case: Case
    plan: str = ""
    error: str = ""
    note: str = ""  # how it was built when not as asked (without `out`, or in the general form alone)
    skip: str = ""  # why the row is not run at all on this target (a sweep away from a Hopper)
    kernel: dict[str, Any] = field(default_factory=dict)  # the plan's numbers and the type C was asked in
    forms: list[Form] = field(default_factory=list)

    def form(self, name: str) -> Form | None:
        return next((f for f in self.forms if f.name == name), None)


def gemm_takes_out() -> bool:
    """Whether `spatialc.gemm` takes `out=` (C's element type): then kernels store torch's output type."""
    import spatialc

    try:
        return "out" in inspect.signature(spatialc.gemm).parameters
    except (TypeError, ValueError):
        return False


def build_case(case: Case, target: str) -> Built:
    """Build and lower one case on the CPU, for torch's output type where `spatialc.gemm` takes `out` (and without
    it, said in `note`, where that build fails); errors become text, never exceptions."""
    built = _build(case, target, TORCH_OUT[case.precision] if gemm_takes_out() else None)
    if built.error and "out" in built.kernel:
        plain = _build(case, target, None)
        if not plain.error:
            without = f"built without out={built.kernel['out']!r}: {built.error}"
            plain.note = "; ".join(x for x in (without, plain.note) if x)
            return plain
    return built


def build_elsewhere(case: Case, target: str) -> Built:
    """`build_case` as a build process runs it (by this name, which pickles: the pool sends the function's name)."""
    return build_case(case, target)


def _build(case: Case, target: str, out: str | None) -> Built:
    import spatialc

    built = Built(case)
    if out is not None:
        built.kernel["out"] = out
    try:
        if case.map:  # an elementwise map: no GEMM, the general form alone (maps.py)
            from .maps import map_case

            return map_case(built, target)
        if case.heads[0]:  # attention: as lower's auto prints it, where it does (attnrows.py)
            from .attnrows import attention_case

            return attention_case(built, target)
        if case.weights:  # W4A16: each form of w4rows.W4_FORMS for its own plan (w4rows.py)
            from .w4rows import w4_case

            return w4_case(built, target, out)
        kw: dict[str, Any] = {} if out is None else {"out": out}
        if case.blockscaled:  # DeepGEMM's block scales (blockscaled.py)
            kw["scales"] = scales_of(case)  # (an MX row's: "mx")
        elif is_fp8(case.precision):  # an fp8 GEMM with its dequant scales, built as any GEMM row (fp8.py)
            kw["epilogue"] = fp8_epilogue()
        if case.fused:  # scales and a residual fused into the GEMM, the plain GEMM's kernels beside (fused.py)
            from .fused import fused_case

            return fused_case(built, target, kw)
        if case.groups > 1:
            gemm = spatialc.grouped_gemm(case.groups, case.m, case.n, case.k, case.precision, **kw)
        else:
            gemm = spatialc.gemm(case.m, case.n, case.k, case.precision, **kw)
        if case.sweep:
            from .sweep import sweep_case

            return sweep_case(built, gemm, target)
        if case.hopper_block is not None:
            return hopper_alone(built, gemm, target, case.hopper_block)
        grouped = {"multicast": case.multicast} if case.multicast != (1, 1) else {}
        program = spatialc.build(gemm, target, **grouped)
        built.plan = describe_plan(program)
        built.kernel.update(plan_facts(program))
        artifact = spatialc.lower(program, target)
        built.forms = forms_of(artifact, lambda: general_planned(gemm, target))
        if target == "sm_90":  # a Hopper: the same GEMM built for sm_90a, in its own form
            # A split row's sm_90a kernel splits K as many ways as the row's plan (its own plan for that split:
            # lower/cuda/sm90a/partials.py); its planner does not choose a split itself.
            splits = program.placement.splits if program.placement is not None else 1
            built.forms.append(hopper_form(gemm, {**grouped, "split_k": splits} if splits > 1 else grouped))
    except Exception as e:
        built.error = ("lower: " if built.plan else "build: ") + one_line(e)
        return built
    if artifact.budget.form == "general":
        built.note = "; ".join(artifact.notes)  # why the persistent kernel refused it
    return built


def hopper_alone(built: Built, gemm: Any, target: str, block: tuple[int, int, int]) -> Built:
    """The case in the sm_90a form alone, at `block` (the preflight's kernel of that form); skipped away from a
    Hopper, where the form does not run."""
    if target != "sm_90":
        built.skip = f"the sm_90a form runs on sm_90 (H100 / H200), not {target}"
        return built
    form = hopper_form(gemm, {"block": block})
    built.forms, built.plan = [form], form.facts.get("own_plan", "")
    if form.artifact is None:
        built.error = f"build: {form.absent}"
    return built


def forms_of(artifact: Any, replan: Any = None) -> list[Form]:
    """The kernels of what lower returned: the persistent kernel and its general form, or the general form alone
    where lower gave only that. Where the persistent kernel's plan leaves the general form no room (its rings keep
    the output in shared memory), `replan()` gives the program planned for the general form (its plan is named in
    the kernel's facts, `own_plan`; None: there is none); failing that the general form is absent, with lower's
    reason."""
    if artifact.budget.form == "general":
        return [_form("general", artifact)]
    if artifact.general is not None:
        return [_form("persistent", artifact), _form("general", artifact.general)]
    why = next((n for n in artifact.notes if n.startswith("no general form")), "no general form")
    try:
        planned = replan() if replan is not None else None
    except Exception as e:
        why = f"{why}; planned for it: {one_line(e)}"
        planned = None
    if planned is None:
        return [_form("persistent", artifact), Form("general", absent=why)]
    program, general = planned
    form = _form("general", general)
    form.facts.update(plan_facts(program))  # the kernel table shows the general form's own plan
    form.facts["own_plan"] = describe_plan(program)
    return [_form("persistent", artifact), form]


def hopper_form(gemm: Any, options: dict[str, Any]) -> Form:
    """The GEMM built for sm_90a and lowered in the sm_90a form (TMA, wgmma): its own plan, named in its facts; or
    absent, with the reason (the form leaves grouped GEMMs to the others so far)."""
    return form_built(gemm, HOPPER_FORM, options)[1]


def form_built(
    gemm: Any, name: str, options: dict[str, Any], lowering: dict[str, Any] | None = None
) -> tuple[Any, Form]:
    """The GEMM built with `options` and lowered in form `name` (with `lowering`'s options: the sm_90a form's
    epilogue) — the sm_90a form for sm_90a, the persistent kernel for sm_90 — its plan named in its facts; with the
    program (None where the build or the lowering refused: the form is then absent, with the reason)."""
    import spatialc

    target = kernel_arch(name, "sm_90")  # a Hopper's target, as its architecture: sm_90a for the sm_90a form
    try:
        program = spatialc.build(gemm, target, **options)
        artifact = spatialc.lower(program, target, form=name, **(lowering or {}))
    except Exception as e:
        return None, Form(name, absent=one_line(e))
    form = _form(name, artifact)
    form.facts.update(plan_facts(program))
    form.facts["own_plan"] = describe_plan(program)
    return program, form


def general_planned(gemm: Any, target: str) -> tuple[Any, Any]:
    """The GEMM planned for the general form, and its general-form artifact."""
    import spatialc

    program = spatialc.build(gemm, target, form="general")
    return program, spatialc.lower(program, target, form="general")


def _form(name: str, artifact: Any) -> Form:
    form = Form(name, artifact)
    form.facts["launch"] = describe_launch(artifact)
    form.facts.update(budget_facts(artifact))
    form.facts["c_elem"] = output_elem(artifact)
    return form


def output_elem(artifact: Any) -> str:
    """The element type the kernel stores C in (`int32`, `int64`, `float32`, `float16`, `bfloat16`)."""
    return next(a.elem for a in launch.kernel_args(artifact.launch) if a.role == "output")


def conversion(case: Case, c_elem: str) -> str:
    """What the end-to-end time adds to turn the kernel's C into torch's output type ('' when it stores that)."""
    want = ELEM_OF[TORCH_OUT[case.precision]]
    return "" if c_elem == want else f"{c_elem} → {want}"


def plan_facts(program: Any) -> dict[str, Any]:
    """The plan's numbers for the report: block osh×osw×ibw, sub-blocks, ring depth, sites."""
    p = program.plan
    b = p.block
    return {
        "block": f"{b.osh}×{b.osw}×{b.ibw}",
        "sub_blocks": f"{p.sub_blocks[0]}×{p.sub_blocks[1]}",
        "depth": p.depth,
        "sites": len(program.placement.items_of_site) if program.placement else 0,
        "splits": program.placement.splits if program.placement else 1,
    }


def budget_facts(artifact: Any) -> dict[str, Any]:
    """The artifact's budget for the report: threads, blocks per SM, dynamic shared memory, the register estimate."""
    ls, bud = artifact.launch, artifact.budget
    return {"threads": ls.block, "blocks_per_sm": bud.blocks_per_sm, "dyn_smem": ls.dyn_smem, "regs_est": bud.regs_est}


def ptxas_facts(info: Any) -> dict[str, Any]:
    """What ptxas said of a kernel (a PtxasInfo), under the report's names."""
    return {key: getattr(info, name) for key, name in PTXAS_FIELDS.items()}


def compile_kernel(form: Form, arch: str, timeout_s: float = COMPILE_S, cache: Path | None = None) -> Path:
    """Compile one kernel with nvcc for `arch` (or take it from the cache) and add what ptxas said of it to
    `form.facts`. KernelBuildError when nvcc refuses or runs too long."""
    path = nvcc.compile_cubin(form.artifact.kernel_cu, arch, timeout_s=timeout_s, cache=cache)
    info = nvcc.kernel_ptxas(path, form.artifact.launch.kernel_name)
    if info is None:
        form.facts["ptxas"] = "not reported"
    else:
        form.facts.update(ptxas_facts(info))
    nvcc.check_entry_registers(form.artifact.budget, info)  # a kernel that would hang in setmaxnreg is not run
    return path


def describe_ptxas(kernel: dict[str, Any]) -> str:
    """The ptxas numbers in one line, or why there are none."""
    if "registers" not in kernel:
        return str(kernel.get("ptxas", "—"))
    return (
        f"{kernel['registers']} regs (est {kernel.get('regs_est', '?')}), spills {kernel['spill_stores']}/"
        f"{kernel['spill_loads']} B (st/ld), static smem {kernel['static_smem']} B, stack {kernel['stack']} B"
        + ("  ⚠ spills" if spilled(kernel) else "")
    )


def spilled(kernel: dict[str, Any]) -> bool:
    """Whether ptxas reported spills (stores or loads) in a kernel's numbers."""
    return bool(kernel.get("spill_stores") or kernel.get("spill_loads"))


def describe_plan(program: Any) -> str:
    """The plan in one line: block, sub-blocks, item grid, ring depth, sites."""
    p = program.plan
    b = p.block
    sites = len(program.placement.items_of_site) if program.placement else 0
    kind = program.placement.kind if program.placement else "?"
    if program.placement is not None and program.placement.splits > 1:
        kind = f"split-K: {program.placement.splits} sites per item"
        if program.placement.tail:
            kind = f"a split tail: its last {program.placement.tail} items on {program.placement.splits} sites each"
    if program.placement is not None and program.placement.multicast != (1, 1):
        kind = f"multicast: {clusters_planned(program)}"
    return (
        f"block {b.osh}×{b.osw}×{b.ibw}, sub {p.sub_blocks[0]}×{p.sub_blocks[1]}, items {p.grid[0]}×{p.grid[1]}, "
        f"depth {p.depth}, {sites} sites ({kind})"
    )


def clusters_planned(program: Any) -> str:
    """How many thread-block clusters a multicast plan launches, against what its target's board holds at once (a
    cluster lives in one GPC: fewer than SMs / size; the clusters past those would run in a second wave)."""
    from ..target import target as target_of

    gy, gx = program.placement.multicast
    size = gy * gx
    launched = len(program.placement.items_of_site) // size
    board = target_of(program.target)
    held = board.clusters_at_once(size)
    room = f"{board.board}: {held} at once with one block an SM" if held else f"no figure for {board.board}"
    return f"{launched} clusters of {gy}×{gx} sites ({room})"


def describe_launch(artifact: Any) -> str:
    """The launch in one line: grid, threads, shared memory, residency."""
    ls, bud = artifact.launch, artifact.budget
    return (
        f"grid {ls.grid} × {ls.block} threads, dyn smem {ls.dyn_smem} B, rings {bud.smem_bytes} B "
        f"({'dynamic' if bud.rings_dynamic else 'static'}), {bud.blocks_per_sm}/SM"
    )


# ---- the background pool ---------------------------------------------------------------------------------------


class BuildPool:
    """Builds every case in background threads, each kernel from a prepared cubin (`manifest`) when one matches its
    source, else compiled for `arch`; no compile runs past the deadline (plus COMPILE_GRACE_S)."""

    def __init__(
        self, target: str, arch: str, *, manifest: Any = None, workers: int | None = None, processes: bool = False
    ):
        self.target, self.arch, self.manifest = target, arch, manifest
        n = workers or min(8, usable_cpus())
        self.executor = ThreadPoolExecutor(max_workers=n)
        # Planning and lowering in processes (started afresh, not forked from a process holding a CUDA context),
        # each thread waiting for its case without the GIL; the compiles stay nvcc's own processes.
        self.processes: ProcessPoolExecutor | None = (
            ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) if processes else None
        )
        self.futures: dict[Case, Future[Built]] = {}
        self.deadline: Deadline | None = None
        self.closed = False

    def start(self, cases: Sequence[Case], deadline: Deadline) -> None:
        """Queue every case (once)."""
        self.deadline = deadline
        for case in cases:
            self.submit(case)

    def submit(self, case: Case) -> Future[Built]:
        if case not in self.futures:
            self.futures[case] = self.executor.submit(self._build, case)
        return self.futures[case]

    def result(self, case: Case, deadline: Deadline) -> Built:
        """The case built, waiting for it no longer than the deadline allows (BudgetExceeded)."""
        try:
            return self.submit(case).result(timeout=max(1.0, deadline.left()))
        except FutureTimeout:
            raise BudgetExceeded() from None

    def close(self) -> None:
        """Cancel the builds not started, kill the nvcc processes still running, and wait (briefly) for their threads,
        so that neither this call nor the interpreter's exit waits on a compile."""
        if self.closed:
            return
        self.closed = True
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.processes is not None:
            stop_processes(self.processes)
        kill_compiles()
        running = [f for f in self.futures.values() if not f.done()]
        if running:
            wait_futures(running, timeout=CLOSE_WAIT_S)

    def _compile_limit(self) -> float:
        """Seconds the next nvcc may take: COMPILE_S, cut to the time left before the deadline (plus the grace)."""
        if self.deadline is None:
            return COMPILE_S
        return min(COMPILE_S, self.deadline.left() + COMPILE_GRACE_S)

    def _build(self, case: Case) -> Built:
        if self.processes is None:
            built = build_case(case, self.target)
        else:
            try:
                built = self.processes.submit(build_elsewhere, case, self.target).result()
            except Exception as e:  # the pool shut down (the run ended) or a worker died
                built = Built(case, error=f"build: {one_line(str(e) or type(e).__name__)}")
        for form in built.forms:
            if form.artifact is not None and not self._prepared(form):
                self._compile(form)
        return built

    def _compile(self, form: Form) -> None:
        """Compile one kernel for the device, within the time left (NVRTC compiles it at its launch without nvcc)."""
        if nvcc.find_nvcc() is None:
            form.facts["ptxas"] = "no nvcc (NVRTC)"
            return
        limit = self._compile_limit()
        if self.closed or limit < MIN_COMPILE_S:
            form.error = "compile: not started: time budget spent"
            return
        try:
            compile_kernel(form, kernel_arch(form.name, self.arch), timeout_s=limit)
        except nvcc.KernelBuildError as e:
            form.error = "compile: stopped at the end of the run" if self.closed else f"compile: {e}"

    def _prepared(self, form: Form) -> bool:
        """Take the kernel's cubin from the prepared folder when its source hash matches; else say why not."""
        if self.manifest is None:
            return False
        use_prepared(form, self.manifest, kernel_arch(form.name, self.arch))
        return form.cubin is not None


def use_prepared(form: Form, manifest: Any, arch: str) -> str:
    """Take a kernel's cubin for `arch` (`form.cubin`) and what ptxas said of it from the prepared folder `manifest`
    when its source hash matches; else return why not. `form.facts['cubin']` says which."""
    path, entry, why = manifest.find(form.artifact.kernel_cu, arch)
    if path is None or entry is None:
        form.facts["cubin"] = f"compiled here: {why}"
        return why
    form.cubin = path
    form.facts["cubin"] = "prepared"
    form.facts.update(entry.ptxas or {"ptxas": "not reported"})
    if getattr(entry, "sass", ""):
        form.facts["sass"] = entry.sass
    return ""


def stop_processes(pool: ProcessPoolExecutor) -> None:
    """Cancel a process pool's builds not started and end its workers now (a build in progress is CPU work whose
    answer nobody waits for any more)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for w in workers:
        if w.is_alive():
            w.kill()


# ---- stopping compiles -------------------------------------------------------------------------------------------


def kill_compiles() -> list[int]:
    """Kill this process's nvcc compiles (its children whose command line holds `-cubin`) with everything they
    started (cicc, ptxas, …): stopped first so none starts another, then killed. Returns the ids signalled; does
    nothing where there is no /proc."""
    me = os.getpid()
    hit: list[int] = []
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in _compile_tree(me):
            try:
                os.kill(p, sig)
            except OSError:
                continue
            if p not in hit:
                hit.append(p)
    return hit


def _compile_tree(root: int) -> list[int]:
    """The compile processes under `root`, children before their own children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    todo = [p for p in children.get(root, []) if "-cubin" in _cmdline(p)]
    tree: list[int] = []
    while todo:
        p = todo.pop(0)
        tree.append(p)
        todo += children.get(p, [])
    return tree


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc (empty where there is none)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path("/proc", name, "stat").read_text()
            parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _cmdline(pid: int) -> list[str]:
    try:
        return Path("/proc", str(pid), "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []

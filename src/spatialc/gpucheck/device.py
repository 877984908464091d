"""The GPU check's device side: CuPy runs, checks and times spatialc's kernels (the persistent kernel and its general
form); torch, CuPy's cuBLAS and Triton the libraries they are compared with.

Imported only on a machine that runs the check (it needs CuPy; torch and Triton are used when present). All work
goes to one stream that both CuPy and torch use, so events order both; it is a stream of its own (not the legacy
default), so that it can be captured into CUDA graphs. Every wait on the GPU polls an event with a limit, so a
deadlocked kernel becomes `GpuHung` instead of a hung process. Kernels are built and compiled (or found prepared)
in background threads while earlier rows run (`builds.BuildPool`).
The preflight's steps are `probes.PreflightSteps`'s and a row's inputs and references `operands.RowOperands`'s,
both bases of `GpuRunner`.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

from ..ir.printer import plural
from ..runtime import launch, nvcc
from ..runtime.tilize import poison_value
from ..target import target as target_of
from . import blockscaled as bs
from . import preflight as pf
from .agreement import Check, agrees, check_result, values64
from .baselines import Libraries, baselines_of, refusal
from .builds import BuildPool, Built, Form, conversion
from .cases import (
    ELEM_OF,
    TORCH_OUT,
    BudgetExceeded,
    Case,
    Contestant,
    Deadline,
    GpuHung,
    GpuLost,
    Probe,
    Row,
    blaming,
    is_sticky,
    kernel_path,
    one_line,
    row_of,
    spatialc_name,
)
from .cuda import CupyGraphs, EventTimer, Inputs, PreparedDevice, SpatialcEndToEnd, kernel_tensors
from .fp8 import is_fp8
from .fp8 import library_reference as fp8_library_reference
from .fused import is_plain
from .operands import RowOperands
from .prepare import source_hash
from .probes import PreflightSteps
from .timing import Timing, measure

TARGET_OF_CC = {"80": "sm_80", "86": "sm_86", "89": "sm_89", "90": "sm_90"}
# A wait longer than this is a hung kernel: the longest legitimate wait of a check launch (a batch of 8192³ launches,
# a float64 reference) is well under a second, and each hang costs the run this much before its restart …
HANG_S = 12.0
# The builds' planning and lowering run in processes of their own on a GPU (builds.BuildPool); the fake GPU of the
# tests turns this off, since its stand-ins patch the builds in this process.
BUILD_IN_PROCESSES = True
HANG_MIN_S = 10.0  # … and never shorter than this, even when the budget is nearly spent


class GpuRunner(PreflightSteps, RowOperands):
    """Runs the check's preflight and rows on the current CUDA device."""

    def __init__(
        self,
        target: str | None,
        *,
        seed: int = 0,
        triton: bool = True,
        workers: int | None = None,
        prepared: Any = None,
        graphs: bool = True,
    ):
        self.cp = launch.require_cupy()  # GpuUnavailable when there is none
        self.torch = _import_torch()
        self.stream = self._one_stream()
        triton_mod, triton_note = _import_triton(self.torch) if triton else (None, "disabled (--no-triton)")
        self.libs = Libraries(self.cp, self.torch, triton_mod, triton_note)
        cc = str(self.cp.cuda.Device().compute_capability)
        self.arch = f"sm_{cc}"
        self.target = target or TARGET_OF_CC.get(cc, "sm_90")
        self.device = PreparedDevice(launch.cupy_device(), self.cp)
        self.timer = EventTimer(self.cp)
        self.graphs: CupyGraphs | None = CupyGraphs(self.stream) if graphs else None
        self.graphs_note = "" if graphs else "disabled (--no-graphs)"
        self.seed, self.manifest = seed, prepared
        # Built in processes: a thread's planning would hold the GIL while this one times a row.
        self.builds = BuildPool(
            self.target, self.arch, manifest=prepared, workers=workers, processes=BUILD_IN_PROCESSES
        )
        self.unavailable: dict[str, str] = {}
        self.cases: list[Case] = []
        # What the preflight's steps ran, for the graph step: spatialc's kernels (by the path a loss is blamed on)
        # and the libraries, by name.
        self.probed_kernels: dict[str, tuple[Any, ...]] = {}
        self.probed: dict[str, tuple[Any, ...]] = {}
        # spatialc's kernels whose preflight kernel computed a wrong C, by path: kept, each row noting it.
        self.marked: dict[str, str] = {}
        # Libraries the graph step could not capture (CuPy refuses cuBLAS calls inside a capture), with the reason:
        # a row that times one of them times all its contestants launch by launch, so that its rows stay alike.
        self.uncaptured: dict[str, str] = {}
        self.row_graphs = True
        # An MX row's reference and spatialc.tolerance's bound of each element (blockscaled.tolerance_bound): a
        # spatialc kernel checked against that reference is held to the bound too. None in any other row.
        self.row_bound: tuple[Any, Any] | None = None

    def _one_stream(self) -> Any:
        """A stream of its own, made current for CuPy and (when present) torch."""
        if self.torch is not None:
            self.torch_stream = self.torch.cuda.Stream()  # kept: CuPy's view of it does not own it
            self.torch.cuda.set_stream(self.torch_stream)
            stream = self.cp.cuda.ExternalStream(self.torch_stream.cuda_stream)
        else:
            stream = self.cp.cuda.Stream(non_blocking=True)
        stream.use()
        return stream

    # ---- description ---------------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """GPU name, SMs, clocks, memory, library versions and how kernels are timed, for the report's header: the
        fixed facts found once, the clocks (current, from nvidia-smi) and the kernel timing (the preflight may turn
        graphs off) as they are now."""
        info = dict(self._facts)  # the same keys in the same order, the live ones filled in below
        info["clocks"] = _clocks(self._props)
        info["kernel_timing"] = "CUDA graphs" if self.graphs is not None else f"events ({self.graphs_note})"
        if self.graphs is not None and self.uncaptured:
            left = "; ".join(f"{name}: {why}" for name, why in self.uncaptured.items())
            info["kernel_timing"] += f", except rows with a library a graph cannot hold, timed by events ({left})"
        return info

    @cached_property
    def _props(self) -> dict[str, Any]:
        """The device's properties, read once."""
        rt = self.cp.cuda.runtime
        props: dict[str, Any] = rt.getDeviceProperties(rt.getDevice())
        return props

    @cached_property
    def _facts(self) -> dict[str, Any]:
        """What `info` says that does not change during a run, found on its first call; `clocks` and
        `kernel_timing` hold their places for `info` to fill."""
        props = self._props
        name = props.get("name", b"?")
        sms = props.get("multiProcessorCount")
        planned = target_of(self.target).units
        facts = {
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "sms": sms,
            "target_sms": planned,
            "compute_capability": self.arch,
            "target": self.target,
            "memory_gib": round(props.get("totalGlobalMem", 0) / 2**30, 1),
            "l2_mib": round(self._l2_bytes() / 2**20, 1),
            "clocks": None,
            "versions": self._versions(),
            "kernel_timing": None,
            "warnings": sm_warnings(sms, planned, self.target),
        }
        if self.manifest is not None:
            facts["prepared"] = f"{self.manifest.folder}: {self.manifest.summary()}"
        return facts

    def _l2_bytes(self) -> int:
        return int(self._props.get("l2CacheSize") or 50 * 2**20)

    def _versions(self) -> str:
        parts = [f"cupy {self.cp.__version__}", f"driver {self.cp.cuda.runtime.driverGetVersion()}"]
        if self.torch is not None:
            parts.append(f"torch {self.torch.__version__}")
        triton = self.libs.triton
        parts.append(f"triton {triton.VERSION}" if triton is not None else f"triton: {self.libs.triton_note}")
        found = nvcc.find_nvcc()
        parts.append(f"nvcc {nvcc.nvcc_version(found)}" if found else "nvcc: none (NVRTC)")
        return ", ".join(parts)

    # ---- the run -------------------------------------------------------------------------------------------

    def start(self, cases: Sequence[Case], deadline: Deadline) -> None:
        """Build every case in the background (the preflight's first) while the GPU runs the preflight and rows."""
        self.cases = list(cases)
        self.builds.start([*pf.preflight_cases(self.cases), *cases], deadline)

    def close(self) -> None:
        self.builds.close()

    def preflight(
        self, deadline: Deadline, say: Callable[[str], None] = lambda s: None, lost: Mapping[str, str] | None = None
    ) -> list[Probe]:
        """The preflight's steps, at most PREFLIGHT_S (and never past the deadline); marks what failed unavailable,
        and what `lost` names (paths that lost the GPU in an earlier process: their steps are not tried)."""
        steps = pf.leaving_out(self._steps(deadline), lost or {})
        probes = pf.run_steps(steps, limit_s=min(pf.PREFLIGHT_S, max(0.0, deadline.left())), say=say)
        self.unavailable = pf.unavailable(probes) | dict(lost or {})
        if pf.GRAPHS in self.unavailable and self.graphs is not None:
            self.graphs, self.graphs_note = None, f"graphs unavailable: {self.unavailable[pf.GRAPHS]}"
        return probes

    def run(self, case: Case, deadline: Deadline) -> Row:
        """One row: each of spatialc's kernels checked and timed both ways, then every library; frees its memory
        whatever happens."""
        built = self.builds.result(case, deadline)
        if built.skip:
            return row_of(case, "skipped", built.skip)
        row = row_of(case, "pending", built.note, plan=built.plan, kernel=built.kernel)
        if pf.REFERENCE in self.unavailable:
            row.status, row.note = "error", f"no float64 reference: {self.unavailable[pf.REFERENCE]}"
            return row
        lost = False
        try:
            self._measure(case, built, row, deadline)
        except GpuLost:
            lost = True
            raise
        except BudgetExceeded:
            raise
        except Exception as e:
            if is_sticky(e):
                lost = True
                raise GpuLost(one_line(e)) from None
            raise
        finally:
            if not lost:  # freeing waits for the device, which a hung kernel would keep busy forever
                self._free()
        return row

    def _measure(self, case: Case, built: Built, row: Row, deadline: Deadline) -> None:
        # Every contestant of a row is timed the same way: by events where one of its libraries cannot be captured.
        self.row_graphs = (
            case.groups > 1
            or bool(case.map or case.weights)
            or not any(name in self.uncaptured for name, _ in baselines_of(case))
        )
        if case.weights:  # W4A16: torch's mm on dequantised weights and the copy, in GB/s of the weights (w4rows.py)
            from .w4measure import W4Rows

            W4Rows(self).measure(case, built, row, deadline)
            return
        if case.map:  # an elementwise map: torch's formula and the copy bandwidth, in GB/s (maps.py)
            from .maprows import MapRows

            MapRows(self).measure(case, built, row, deadline)
            return
        if case.heads[0]:  # attention: O and LSE on a sample, against torch's SDPA backends (attnrows.py)
            from .attnrows import AttentionRows

            AttentionRows(self).measure(case, built, row, deadline)
            return
        if case.groups > 1:  # a grouped GEMM's row counts, its own contestants (grouped.py; block-scaled: groupedbs.py)
            from .grouped import GroupedRows
            from .groupedbs import GroupedScaled

            (GroupedScaled if case.blockscaled else GroupedRows)(self).measure(case, built, row, deadline)
            return
        inputs = self._inputs(case, self._copies(case))
        plain = self._reference(inputs, case, deadline)  # A·B: a fused row's plain GEMM kernels are held to it
        scaled = case.fused or is_fp8(case.precision)  # an epilogue of tensors of its own
        ref = self._fused_reference(inputs, case, plain, deadline) if scaled else plain
        self.row_bound = (ref, self._mx_bound(case, built, inputs, ref, deadline)) if case.mx else None
        verdicts = [("error", built.error)] if built.error else []
        for form in built.forms:
            mine, verdict = self._spatialc(case, form, inputs, plain if is_plain(form) else ref, deadline)
            row.contestants.append(mine)
            verdicts.append(verdict)
        row.status, row.note = settle(row.note, verdicts)
        for name, family in baselines_of(case):
            lib_ref = fp8_library_reference(name, plain, ref) if is_fp8(case.precision) else ref
            lib_ref = bs.library_reference(name, plain, ref) if case.blockscaled else lib_ref
            row.contestants.append(self._baseline(name, family, case, inputs, lib_ref, deadline))

    # ---- spatialc ------------------------------------------------------------------------------------------

    def _prepare(self, form: Form) -> Any:
        """The kernel loaded (from its prepared cubin when there is one) with the work list for this device's SMs;
        the blocks it launches go into its facts beside the plan's sites."""
        if form.cubin is not None:
            self.device.cubins[source_hash(form.artifact.kernel_cu)] = form.cubin
        prep = launch.prepare(form.artifact, self.device)
        form.facts["sites_run"] = getattr(prep, "grid", 0) or form.artifact.launch.grid
        held, cluster = getattr(prep, "clusters_held", None), form.artifact.launch.cluster
        if cluster > 1:  # the driver's count beside the plan's (a launch of more is refused: a second wave)
            said = f"the device holds {held} at once" if held is not None else "the driver did not say how many fit"
            form.facts["clusters"] = f"{form.facts['sites_run'] // cluster} clusters of {cluster} launched; {said}"
        return prep

    def _spatialc(
        self, case: Case, form: Form, inputs: Inputs, ref: Any, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        """spatialc's kernel in one form, checked and timed both ways: its contestant and its verdict for the row
        (ok, wrong or error, and what the row's note says of it; '' for a form lower printed no kernel in). A kernel
        that fails without losing the GPU costs only its own contestant."""
        name = form.contestant
        if form.artifact is None:
            return Contestant(name, "spatialc", note=f"n/a: {form.absent}", facts=form.facts), ("", "")
        path = kernel_path(case, name)
        marked = self.marked.get(path) or self.marked.get(name)
        if marked:  # its form's preflight kernel was wrong: kept, and this row's kernel checked like any
            form.facts["preflight"] = marked
        # Left out as this kernel, as its contestant anywhere, or (a sweep's plan) as its form.
        return self.guarded(
            case, form, lambda: self._measure_kernel(case, form, inputs, ref, deadline), (spatialc_name(form.name),)
        )

    def guarded(
        self, case: Case, form: Form, measure: Callable[[], tuple[Contestant, tuple[str, str]]], also: tuple = ()
    ) -> tuple[Contestant, tuple[str, str]]:
        """`measure()` — a spatialc kernel's check and timing — unless the kernel was left out (its path, its
        contestant, or a name in `also`, by an earlier process) or failed to build. A kernel that fails without
        losing the GPU costs only its own contestant; one that loses it (a sticky error) is raised for the restart,
        blamed on its path."""
        name = form.contestant
        path = kernel_path(case, name)
        off = next((why for key in (path, name, *also) if (why := self.unavailable.get(key))), None)
        failure = form.error or (f"unavailable: {off}" if off else "")
        if not failure:
            try:
                return measure()
            except GpuLost as e:
                raise e.blame(path) from None
            except BudgetExceeded:
                raise
            except Exception as e:
                if is_sticky(e):
                    raise GpuLost(f"{name}: {one_line(e)}", path=path) from None
                failure = f"failed: {one_line(e)}"
        return Contestant(name, "spatialc", note=failure, facts=form.facts), ("error", f"{name}: {failure}")

    def library_guarded(
        self, name: str, family: str, measure: Callable[[], Contestant], deadline: Deadline
    ) -> Contestant:
        """A torch library's contestant in a row of its own kind (a map's, a grouped GEMM's, attention's) measured
        (`measure`: its check and timing), or why not: no torch, left out after a loss by an earlier process, no time
        left, or a failure that did not lose the GPU. One that lost it (a sticky error; a hang is one) is raised for
        the restart, blamed on the library."""
        if self.torch is None:
            return Contestant(name, family, note="unavailable: torch is not installed (or sees no GPU)")
        if name in self.unavailable:
            return Contestant(name, family, note=f"unavailable: {self.unavailable[name]}")
        if deadline.passed():
            return Contestant(name, family, note="skipped: time budget spent")
        try:
            return measure()
        except GpuLost as e:
            raise e.blame(name) from None
        except BudgetExceeded:
            raise
        except Exception as e:
            if is_sticky(e):
                raise GpuLost(f"{name}: {one_line(e)}", path=name) from None
            return Contestant(name, family, note=f"failed: {one_line(e)}")

    def _measure_kernel(
        self, case: Case, form: Form, inputs: Inputs, ref: Any, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        name = form.contestant
        prep = self._prepare(form)
        out = prep.output_buffer(poison=True)
        sets = [kernel_tensors(prep, inputs.named(i), out, self.cp) for i in range(len(inputs.a))]
        c_elem, want = prep.output.elem, ELEM_OF[TORCH_OUT[case.precision]]
        check = self._checked_run(prep, sets[0], out, ref, deadline)
        kernel = self._time(lambda i: prep.run(sets[i]), len(sets), deadline)
        again = self._checked_run(prep, sets[0], out, ref, deadline)
        check.stable = again.correct == check.correct and same_error(again.max_abs, check.max_abs)
        if form.kernel_only:  # a sweep's other plans: their end to end is their kernel's plus the planner's copies
            ok, max_abs, end_to_end = check.correct, check.max_abs, None
        else:
            e2e = SpatialcEndToEnd(prep, inputs, want, self.cp)
            e2e(0)
            self._sync(deadline)
            ok, max_abs = agrees(e2e.result, want, ref, self.cp)
            end_to_end = self._time(e2e, len(sets), deadline, graphs=False)
        notes = []
        if not check.correct:
            notes.append(f"C wrong (max err {check.max_abs:.3g}, {plural(check.unwritten, 'element')} unwritten)")
        if not check.stable:
            notes.append("a second run on the same inputs gave another C")
        if check.pad_unwritten:
            notes.append(f"{check.pad_unwritten} padding elements unwritten")
        if end_to_end is not None and not ok:
            notes.append(f"end-to-end C wrong (max err {max_abs:.3g})")
        if end_to_end is None and is_plain(form):
            detail = f"C stored as {c_elem}; kernel only: the plain GEMM of the fused row's size, set against it"
        elif end_to_end is None:
            detail = f"C stored as {c_elem}; kernel only: {form.facts['sweep']['change']} (a sweep's plan)"
        else:
            conv = conversion(case, c_elem)
            lay = "store A and B as the kernel takes them (tiled, or padded matrices), the kernel, read C back"
            if case.fused:
                lay = lay.replace("store A and B", "store A, B, the residual and the scales")
            elif is_fp8(case.precision):
                lay = lay.replace("store A and B", "store A and B (their bits) and the scales")
            detail = f"C stored as {c_elem}; end to end: {lay}" + (f", convert {conv}" if conv else "")
            detail += " (spatialc.run's argument checks, which wait on the device, left out)"
        mine = Contestant(name, "spatialc", end_to_end, kernel, max_abs, ok, detail, check=check, facts=form.facts)
        status = "ok" if check.correct and check.stable and ok else "wrong"
        return mine, (status, f"{name}: {'; '.join(notes)}" if notes else "")

    def _checked_run(self, prep: Any, args: tuple[Any, ...], out: Any, ref: Any, deadline: Deadline) -> Check:
        out.fill(poison_value(prep.output.storage))
        prep.run(args)
        self._sync(deadline)
        check = check_result(prep.result(out), ref, out, prep.output.elem, self.cp)
        if self.row_bound is not None and ref is self.row_bound[0]:  # an MX row: spatialc.tolerance's bound too
            diff = self.cp.abs(values64(prep.result(out), prep.output.elem, self.cp) - ref)  # (poison: NaN, outside)
            check.correct = check.correct and bool(self.cp.all(diff <= self.row_bound[1]))
        return check

    def _mx_bound(self, case: Case, built: Built, inputs: Inputs, ref: Any, deadline: Deadline) -> Any:
        """spatialc.tolerance's bound of each element of an MX row's C (`blockscaled.tolerance_bound`), from the
        magnitude of input set 0's block-scaled sum, on the device."""
        import spatialc

        gemm = spatialc.gemm(case.m, case.n, case.k, case.precision, scales=bs.MX, out=built.kernel.get("out"))
        tolerance = spatialc.tolerance(spatialc.build(gemm, self.target), kernel=True)

        def made() -> Any:
            cp = self.cp
            a, b = (cp.abs(values64(x[0], ELEM_OF[case.precision], cp)) for x in (inputs.a, inputs.b))
            more = {name: cp.abs(values64(x, "float32", cp)) for name, x in inputs.more[0].items()}
            bound = bs.tolerance_bound(tolerance, ref, bs.reference(a, b, more, cp), cp)
            self._sync(deadline)
            return bound

        return blaming(pf.REFERENCE, made)

    # ---- the libraries -------------------------------------------------------------------------------------

    def _baseline(self, name: str, family: str, case: Case, inputs: Inputs, ref: Any, deadline: Deadline) -> Contestant:
        why = self.libs.missing(name) or self.unavailable.get(name, "")
        if why:
            return Contestant(name, family, note=f"unavailable: {why}")
        refused = refusal(name, case)
        if refused:
            return Contestant(name, family, note=f"n/a: {refused}")
        if deadline.passed():
            return Contestant(name, family, note="skipped: time budget spent")
        try:
            made = self.libs.make(name, case, inputs.a, inputs.b, inputs.more)
            ok, max_abs = self._check_contender(made, ref, deadline)
            if not ok:
                return Contestant(name, family, max_abs=max_abs, ok=False, detail=made.detail, note="wrong; not timed")
            kernel = self._time(made.kernel, len(inputs.a), deadline)
            end_to_end = self._time(made.end_to_end, len(inputs.a), deadline, graphs=False)
            return Contestant(name, family, end_to_end, kernel, max_abs, True, made.detail)
        except GpuHung as e:
            raise e.blame(name) from None
        except Exception as e:
            if is_sticky(e):
                raise GpuLost(f"{name}: {one_line(e)}", path=name) from None
            return Contestant(name, family, note=f"failed: {one_line(e)}")

    def _check_contender(self, made: Any, ref: Any, deadline: Deadline) -> tuple[bool, float]:
        """Both of a contender's ways on input set 0, against the reference."""
        made.kernel(0)
        made.end_to_end(0)
        self._sync(deadline)
        ok_k, err_k = agrees(made.kernel_result(), made.elem, ref, self.cp, library=True)
        ok_e, err_e = agrees(made.e2e_result(), made.elem, ref, self.cp, library=True)
        return ok_k and ok_e, max(err_k, err_e)

    # ---- timing --------------------------------------------------------------------------------------------

    def _time(self, launch_i: Callable[[int], None], copies: int, deadline: Deadline, graphs: bool = True) -> Timing:
        graphs_or_none = self.graphs if graphs and self.row_graphs else None
        return measure(launch_i, copies, self.timer, graphs=graphs_or_none, limit_s=self._hang(deadline))

    def _sync(self, deadline: Deadline) -> None:
        self.timer.wait(self.timer.mark(), self._hang(deadline))

    def _hang(self, deadline: Deadline) -> float:
        return min(HANG_S, max(HANG_MIN_S, deadline.left()))

    def _free(self) -> None:
        self.cp.get_default_memory_pool().free_all_blocks()
        if self.torch is not None:
            self.torch.cuda.empty_cache()


def same_error(x: float, y: float) -> bool:
    """Whether two runs' largest errors are the same (NaN, from poison left in C, the same as NaN)."""
    return x == y or (math.isnan(x) and math.isnan(y))


def settle(note: str, verdicts: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """A row's status and note from its spatialc kernels' verdicts (status, what to note): wrong when one was
    wrong, else error when one could not run, else ok; the row's `note` first, then each kernel's."""
    found = {status for status, _ in verdicts}
    status = next((s for s in ("wrong", "error") if s in found), "ok")
    return status, "; ".join(x for x in (note, *(said for _, said in verdicts)) if x)


def sm_warnings(sms: int | None, planned: int, target: str) -> list[str]:
    """A warning when the device has fewer SMs than the target's plans assume."""
    if not sms or sms >= planned:
        return []
    return [
        f"the device has {sms} SMs, fewer than the {planned} that {target} plans for: each kernel's work list is "
        f"split over the sites this device runs (the kernel table's sites column: planned (run)), but its block, "
        f"sub-blocks and ring depth were chosen for {planned}"
    ]


def _import_torch() -> Any:
    try:
        import torch
    except Exception:
        return None
    return torch if torch.cuda.is_available() else None


def _import_triton(torch: Any) -> tuple[Any, str]:
    if torch is None:
        return None, "needs torch, which is not installed"
    try:
        from . import triton_ref
    except Exception as e:
        return None, f"not available ({one_line(e)})"
    return triton_ref, ""


def _clocks(props: dict[str, Any]) -> str:
    """SM and memory clocks: nvidia-smi's current / max when it answers, else the device properties."""
    try:
        q = "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
        )
        now, most, mem_now, mem_most = (v.strip() for v in out.stdout.splitlines()[0].split(","))
        return f"SM {now}/{most} MHz, memory {mem_now}/{mem_most} MHz (current/max, nvidia-smi)"
    except Exception:
        pass
    sm, mem = props.get("clockRate"), props.get("memoryClockRate")
    if sm:
        return f"SM {int(sm) // 1000} MHz, memory {int(mem or 0) // 1000} MHz (max, device properties)"
    return "unknown"

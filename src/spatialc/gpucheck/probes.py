"""The GPU check's preflight steps on the device: each a probe that runs one thing once and says what it found —
the device itself, CuPy's float64 matmul, each spatialc kernel form and each library on the preflight's product, and
CUDA graphs captured and replayed (`preflight.py` orders the steps and reports them).

`PreflightSteps` is a base of `device.GpuRunner`, whose state and row machinery it uses (annotated below).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..errors import SpatialError
from ..ir.printer import plural
from ..runtime.tilize import poison_value
from . import preflight as pf
from .agreement import agrees, check_result
from .cases import Case, Deadline, blaming, kernel_path, one_line, spatialc_name
from .cuda import kernel_tensors
from .timing import GraphUnavailable


class PreflightSteps:
    """The preflight's steps of a `GpuRunner` (its base): the probes, and what they leave for the rows (the kernels
    and libraries probed, the kernel paths marked wrong, the libraries no graph can hold)."""

    cp: Any  # (annotations only: the state and methods are GpuRunner's)
    cases: list[Case]
    target: str
    arch: str
    libs: Any
    builds: Any
    graphs: Any
    graphs_note: str
    probed_kernels: dict[str, tuple[Any, ...]]
    probed: dict[str, tuple[Any, ...]]
    marked: dict[str, str]
    uncaptured: dict[str, str]
    info: Any
    _inputs: Any
    _reference: Any
    _prepare: Any
    _checked_run: Any
    _check_contender: Any
    _sync: Any

    def _steps(self, deadline: Deadline) -> list[pf.Step]:
        steps = [
            pf.Step(pf.DEVICE_STEP, (), self._probe_device),
            pf.Step(pf.CUPY_STEP, (pf.REFERENCE,), self._probe_cupy),
            *(self._spatialc_step(form, case, deadline) for form, case in pf.kernel_steps(self.cases)),
        ]
        steps += [self._library_step(name, case, deadline) for name, case in pf.library_steps(self.cases)]
        graphs: Callable[[], str] | str = (lambda: self._probe_graphs(deadline)) if self.graphs else self.graphs_note
        return [*steps, pf.Step(pf.GRAPHS_STEP, (pf.GRAPHS,), graphs)]

    def _spatialc_step(self, form: str, case: Case, deadline: Deadline) -> pf.Step:
        run = partial(self._probe_spatialc, form, case, deadline)
        return pf.Step(pf.spatialc_step(form, case), (kernel_path(case, spatialc_name(form)),), run)

    def _library_step(self, name: str, case: Case, deadline: Deadline) -> pf.Step:
        missing = self.libs.missing(name)
        run: Callable[[], str] | str = missing or (lambda: self._probe_library(name, case, deadline))
        return pf.Step(f"{name}: {case}", (name,), run)

    def _probe_device(self) -> str:
        info = self.info()
        return (
            f"{info['gpu']}, {info['sms']} SMs ({self.target} plans for {info['target_sms']}), {self.arch}, "
            f"{info['memory_gib']} GiB, L2 {info['l2_mib']} MiB, {info['clocks']}"
        )

    def _probe_cupy(self) -> str:
        import numpy as np

        cp = self.cp
        a = np.arange(64 * 64, dtype=np.float64).reshape(64, 64) % 7 - 3
        got = cp.asnumpy(cp.matmul(cp.asarray(a), cp.asarray(a.T)))
        if not np.array_equal(got, a @ a.T):
            raise SpatialError("cp.matmul of 64³ float64 differs from numpy's")
        return "correct"

    def _probe_spatialc(self, name: str, case: Case, deadline: Deadline) -> str:
        """Launch spatialc's kernel in form `name` on the preflight's product `case` and check it; a wrong C marks
        the kernel's path (WrongResult) without leaving it out: each row checks its own."""
        built = self.builds.result(case, deadline)
        form = built.form(name)
        why = built.error or built.skip or (built.note if form is None else form.error or form.absent)
        if form is None or why:
            raise SpatialError(why or f"lower printed no {name} kernel")
        inputs = self._inputs(case, 1)
        ref = self._reference(inputs, case, deadline)
        prep = self._prepare(form)
        out = prep.output_buffer(poison=True)
        args = kernel_tensors(prep, inputs.named(0), out, self.cp)
        check = self._checked_run(prep, args, out, ref, deadline)
        path = kernel_path(case, form.contestant)
        if not check.correct:
            wrong = f"wrong result: max err {check.max_abs:.3g}, {plural(check.unwritten, 'element')} unwritten"
            self.marked[path] = f"its preflight kernel ({case}) was wrong ({wrong})"
            raise pf.WrongResult(f"{wrong}; kept: each row checks its own C")
        self.probed_kernels[path] = (prep, args, out, ref)
        origin = form.facts.get("cubin", "compiled here" if "registers" in form.facts else "NVRTC")
        return f"correct; cubin {origin}"

    def _probe_library(self, name: str, case: Case, deadline: Deadline) -> str:
        inputs = self._inputs(case, 1)
        made = self.libs.make(name, case, inputs.a, inputs.b)
        ref = self._reference(inputs, case, deadline)
        ok, max_abs = self._check_contender(made, ref, deadline)
        if not ok:
            raise SpatialError(f"wrong result (max err {max_abs:.3g})")
        self.probed[name] = (made, ref)
        return f"correct both ways ({made.detail})"

    def _probe_graphs(self, deadline: Deadline) -> str:
        """Capture the kernel-only call of each spatialc kernel and of every library that passed its step, replay
        each, check the results. A spatialc kernel that fails turns graphs off for every row; a library that fails
        (CuPy's cuBLAS cannot be captured) only for the rows it runs in, all of whose contestants are then timed
        launch by launch, so that the kernel-only columns of a row stay alike."""
        if not self.probed_kernels or self.graphs is None:
            raise SpatialError("no spatialc kernel to capture: their own steps failed")
        for name, probed in self.probed_kernels.items():
            blaming(name, partial(self._replay_kernel, name, probed, deadline))
        captured = list(self.probed_kernels)
        for name, (made, lib_ref) in self.probed.items():
            try:
                blaming(name, partial(self._replay_library, name, made, lib_ref, deadline))
                captured.append(name)
            except SpatialError as e:
                self.uncaptured[name] = one_line(e).removeprefix(f"{name}: ")
        said = f"{', '.join(captured)}: captured, replayed, correct"
        for name, why in self.uncaptured.items():
            said += f"; {name}: not captured ({why}), its rows timed by events"
        return said

    def _replay_kernel(self, name: str, probed: tuple[Any, ...], deadline: Deadline) -> None:
        """Capture one launch and replay it twice, each time into poison: the second replay finds the sync words as
        the first left them, unless the graph itself resets them (a copy from the host would not be replayed)."""
        prep, args, out, ref = probed
        replay = self._capture(name, lambda: prep.run(args))
        for time in ("first", "second"):
            out.fill(poison_value(prep.output.storage))
            replay()
            self._sync(deadline)
            if not check_result(prep.result(out), ref, out, prep.output.elem, self.cp).correct:
                raise SpatialError(f"{name}'s kernel left a wrong result at its graph's {time} replay")

    def _replay_library(self, name: str, made: Any, ref: Any, deadline: Deadline) -> None:
        made.kernel_result().fill(0)
        self._sync(deadline)
        self._capture(name, lambda: made.kernel(0))()
        self._sync(deadline)
        if not agrees(made.kernel_result(), made.elem, ref, self.cp, library=True)[0]:
            raise SpatialError(f"{name}'s replayed call left a wrong result")

    def _capture(self, name: str, call: Callable[[], None]) -> Callable[[], None]:
        assert self.graphs is not None
        try:
            return self.graphs.capture(call)
        except GraphUnavailable as e:
            raise SpatialError(f"{name}: {e}") from None

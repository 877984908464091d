"""A W4A16 row on the GPU (gpucheck/w4rows.py says what it measures and why): its inputs made on the host (the same
for every M of one weight shape, and kept for the next row that shares them), each of spatialc's forms checked
against `spatialc.tolerance` and timed kernel only over rotated copies of its arguments, torch's bf16 mm on the
weights dequantised beforehand, and the copy of the weights' bytes (the ceiling).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .builds import Built, Form
from .cases import BudgetExceeded, Case, Check, Contestant, Deadline, Row, agrees, blaming, values64
from .preflight import REFERENCE
from .w4rows import TORCH_MM, a_values, activations, operands, torch_mm, weight_bytes, weights_of

# The host's inputs and dequantised operands of the last weight shape measured: rows of one shape (M = 1, 16, 64)
# adjoin in the run and share them (at N = K = 14336 making them takes seconds of the budget).
_KEPT: dict[str, Any] = {}


class W4Rows:
    """Measures a W4A16 row on the GPU runner's device, clocks and torch (`device.GpuRunner`)."""

    def __init__(self, runner: Any):
        self.r, self.cp = runner, runner.cp

    def measure(self, case: Case, built: Built, row: Row, deadline: Deadline) -> None:
        import spatialc

        from .device import settle
        from .maprows import copy_contestant
        from .maps import COPY
        from .timing import copies_for

        program = spatialc.build(_program(case), self.r.target)  # the tolerance's program (C's type, K)
        given, a64, b64 = blaming(REFERENCE, lambda: self._inputs(program, case))
        ref = a64 @ b64  # the float64 product: each contestant's largest error is against it
        tolerance = spatialc.tolerance(program, kernel=True)
        _left(deadline)
        bounded = blaming(REFERENCE, lambda: tolerance.against(given))  # one reference and bound for every form
        copies = copies_for(weight_bytes(case.weights, case.n, case.k), self.r._l2_bytes())
        verdicts = [("error", built.error)] if built.error else []
        for form in built.forms:
            _left(deadline)
            mine, verdict = self._spatialc(case, form, given, (tolerance, *bounded, ref), copies, deadline)
            row.contestants.append(mine)
            verdicts.append(verdict)
        row.status, row.note = settle(row.note, verdicts)
        torch = self.r.library_guarded(TORCH_MM, "torch", lambda: self._torch(case, a64, b64, ref, deadline), deadline)
        row.contestants.append(torch)
        total, what = case.ops, f"the weights' {case.ops} bytes (packed B, scales, zero points)"
        copy = self.r.library_guarded(COPY, "copy", lambda: copy_contestant(self.r, total, what, deadline), deadline)
        row.contestants.append(copy)

    def _inputs(self, program: Any, case: Case) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        """The row's inputs by name, and A and the dequantised B as float64: the weights' kept from the last row
        of the same shape and format."""
        key = f"{self.r.seed} {case.weights} {case.n}x{case.k}"
        if _KEPT.get("key") != key:
            _KEPT.clear()
            weights = weights_of(program, self.r.seed)
            _KEPT.update(
                key=key, weights=weights, b64=operands(program, {**weights, "A": activations(program, self.r.seed)})[1]
            )
        given = {**_KEPT["weights"], "A": activations(program, self.r.seed)}
        return given, a_values(program, given), _KEPT["b64"]

    # ---- spatialc ------------------------------------------------------------------------------------------

    def _spatialc(
        self, case: Case, form: Form, given: dict[str, Any], checks: Any, copies: int, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        if form.artifact is None:
            return Contestant(form.contestant, "spatialc", note=f"n/a: {form.absent}", facts=form.facts), ("", "")
        return self.r.guarded(case, form, lambda: self._kernel(form, given, checks, copies, deadline))

    def _kernel(
        self, form: Form, given: dict[str, Any], checks: Any, copies: int, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        """One form's kernel: its arguments bound once (the 4-bit ones laid out on the host) and uploaded `copies`
        times, one launch into poisoned C checked within the tolerance (`checks`: it, its reference and bound, and
        the float64 product), the launches timed, C read again."""
        from ..runtime import launch as L

        tolerance, reference, bound_c, ref = checks
        name, prep = form.contestant, self.r._prepare(form)
        bound, _ = L.bound_operands(form.artifact, (), given)
        sets = [L.uploaded(prep, bound) for _ in range(copies)]
        buffers, outs = sets[0]
        prep.run(buffers)
        self.r._sync(deadline)
        prep.check()  # a loop count read from data past its bound says so here
        out = next(iter(outs.values()))
        c = self._host(prep.result(out), prep.output.elem)
        _left(deadline)
        right, how = tolerance.check_against(c, reference, bound_c, given)
        kernel = self.r._time(lambda i: prep.run(sets[i][0]), len(sets), deadline)
        again = self._host(prep.result(out), prep.output.elem)
        stable = bool(np.array_equal(again, c, equal_nan=True))
        with np.errstate(invalid="ignore"):  # NaN where poison was left
            diff = c - ref
            err = float(np.max(np.abs(diff), initial=0.0))
            rel = float(np.linalg.norm(diff) / max(float(np.linalg.norm(ref)), 1e-300))
        poison = int(np.count_nonzero(np.isnan(c)))  # bf16's poison is a NaN; a sum never is (finite inputs)
        check = Check(right, err, rel, poison, 0, int(np.count_nonzero(~np.isfinite(c))), stable)
        detail = (
            f"C stored as {prep.output.elem}; kernel only over {len(sets)} copies of its arguments (the 4-bit ones "
            f"laid out on the host once), its C checked: {how}"
        )
        ok = right and stable
        mine = Contestant(name, "spatialc", None, kernel, err, ok, detail, check=check, facts=form.facts)
        notes = [] if right else [f"C wrong ({how.split(' (bound')[0]})"]
        notes += [] if stable else ["C changed over the timed launches on the same inputs"]
        return mine, ("ok" if ok else "wrong", f"{name}: {'; '.join(notes)}" if notes else "")

    def _host(self, c: Any, elem: str) -> np.ndarray:
        """C's values as float64 on the host (bf16 from its bits: exact)."""
        return np.asarray(self.cp.asnumpy(values64(c, elem, self.cp)), np.float64)

    # ---- torch -----------------------------------------------------------------------------------------------

    def _torch(self, case: Case, a64: np.ndarray, b64: np.ndarray, ref: np.ndarray, deadline: Deadline) -> Contestant:
        """torch.mm of A and the dequantised weights in bf16 (exact: both hold bf16 values), rotated over copies of
        the weights as spatialc's arguments are; its C held to the libraries' bar."""
        from ..runtime.tilize import bf16_bits
        from .timing import copies_for

        torch, cp, libs = self.r.torch, self.cp, self.r.libs
        a = libs.to_torch(bf16_bits(cp.asarray(a64.astype(np.float32)), cp), "bf16")
        bits = bf16_bits(cp.asarray(b64.astype(np.float32)), cp)
        copies = copies_for(bits.nbytes, self.r._l2_bytes())
        weights = [libs.to_torch(bits if i == 0 else bits.copy(), "bf16") for i in range(copies)]
        c = torch.empty((case.m, case.n), dtype=torch.bfloat16, device=a.device)
        kernel = torch_mm(torch, a, weights, c)
        kernel(0)
        self.r._sync(deadline)
        ok, err = agrees(libs.from_torch(c), "bfloat16", cp.asarray(ref), cp, library=True)
        detail = f"torch.mm in bf16 of A and the weights dequantised beforehand ({len(weights)} copies), into C"
        if not ok:
            return Contestant(TORCH_MM, "torch", max_abs=err, ok=False, detail=detail, note="wrong; not timed")
        kernel_t = self.r._time(kernel, len(weights), deadline)
        return Contestant(TORCH_MM, "torch", None, kernel_t, err, True, detail)


def _program(case: Case) -> Any:
    from .w4rows import gemm_of

    return gemm_of(case)


def _left(deadline: Deadline) -> None:
    if deadline.passed():
        raise BudgetExceeded()

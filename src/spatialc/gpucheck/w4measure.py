"""A W4A16 row on the GPU (gpucheck/w4rows.py says what it measures and why): its inputs drawn on the host (the same
for every M of one weight shape, and kept for the next row that shares them, with their 4-bit layouts), the
reference C and its bound loaded from `--prepare`'s file (computed here only where none matches: w4refs.py), the
weights dequantised on the device, each of spatialc's forms checked against `spatialc.tolerance` and timed kernel
only over rotated copies of its arguments, torch's bf16 mm on the weights dequantised beforehand, and the copy of the
weights' bytes (the ceiling).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .agreement import Check, agrees, values64
from .builds import Built, Form
from .cases import BudgetExceeded, Case, Contestant, Deadline, Row, blaming
from .preflight import REFERENCE
from .w4refs import dequant_bits, load
from .w4rows import TORCH_MM, a_values, activations, torch_mm, weight_bytes, weights_of

# The inputs of the last weight shape measured, their 4-bit layouts and their dequantised bits on the device: rows
# of one shape (M = 1, 16, 64) adjoin in the run and share them (at N = K = 14336 making them takes seconds).
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
        given = self._inputs(program, case)
        tolerance = spatialc.tolerance(program, kernel=True)
        _left(deadline)
        bounded, said = blaming(REFERENCE, lambda: self._reference(program, tolerance, given))
        if said.startswith("computed"):
            row.note = "; ".join(x for x in (row.note, f"reference and bound {said}") if x)
        _left(deadline)
        bits, ref = blaming(REFERENCE, lambda: self._on_device(program, case, given))
        copies = copies_for(weight_bytes(case.weights, case.n, case.k), self.r._l2_bytes())
        verdicts = [("error", built.error)] if built.error else []
        for form in built.forms:
            _left(deadline)
            checks = (tolerance, *bounded, ref, said)
            mine, verdict = self._spatialc(case, form, given, checks, copies, deadline)
            row.contestants.append(mine)
            verdicts.append(verdict)
        row.status, row.note = settle(row.note, verdicts)
        torch = self.r.library_guarded(
            TORCH_MM, "torch", lambda: self._torch(case, given, bits, ref, deadline), deadline
        )
        row.contestants.append(torch)
        total, what = case.ops, f"the weights' {case.ops} bytes (packed B, scales, zero points)"
        copy = self.r.library_guarded(COPY, "copy", lambda: copy_contestant(self.r, total, what, deadline), deadline)
        row.contestants.append(copy)

    def _inputs(self, program: Any, case: Case) -> dict[str, Any]:
        """The row's inputs by name: the weights kept from the last row of the same shape and format (with what
        was made of them: their layouts, their dequantised bits on the device)."""
        key = f"{self.r.seed} {case.weights} {case.n}x{case.k}"
        if _KEPT.get("key") != key:
            _KEPT.clear()
            _KEPT.update(key=key, weights=weights_of(program, self.r.seed), laid={})
        return {**_KEPT["weights"], "A": activations(program, self.r.seed)}

    def _reference(self, program: Any, tolerance: Any, given: dict[str, Any]) -> tuple[Any, str]:
        """The reference C and its bound: `--prepare`'s saved file where it matches the row (w4refs.py), else
        computed here (seconds of the budget at 14336²), with how long that took."""
        folder = self.r.manifest.folder if self.r.manifest is not None else None
        saved, why = load(folder, program, self.r.seed, given)
        if saved is not None:
            return saved, "prepared"
        t0 = time.monotonic()
        made = tolerance.against(given)
        return made, f"computed on the host in {time.monotonic() - t0:.1f} s ({why})"

    def _on_device(self, program: Any, case: Case, given: dict[str, Any]) -> tuple[Any, np.ndarray]:
        """The dequantised weights' bf16 bits on the device (made there once a shape, `w4refs.dequant_bits`), and
        the float64 product A · dequant(B) every contestant's error is measured against, on the host."""
        from ..runtime.tilize import bf16_to_float32

        cp = self.cp
        if "bits" not in _KEPT:
            _KEPT["bits"] = dequant_bits(given, program, cp)
        b64 = bf16_to_float32(_KEPT["bits"], cp).astype(cp.float64)
        ref = cp.asnumpy(cp.asarray(a_values(program, given)) @ b64)
        del b64
        return _KEPT["bits"], np.asarray(ref, np.float64)

    def _bound(self, form: Form, given: dict[str, Any], fresh: bool = False) -> list[Any]:
        """The kernel's arguments bound to `given`, the 4-bit and e8m0 ones laid out once a shape and tiling
        (`laid_out`, the packed weights on the device): every form and M of one weight shape tiles the weights
        alike, and shares them. `fresh`: their bytes copied (a rotated copy's own: an upload of a device array is
        the array itself)."""
        from ..runtime.arguments import bind, kernel_args
        from ..runtime.tilize import BYTE_ELEMS
        from ..runtime.w4_args import HostBytes

        laid = _KEPT.setdefault("laid", {})
        args = kernel_args(form.artifact.launch)
        made = [a for a in args if a.elem in BYTE_ELEMS and a.role not in ("output", "workspace")]
        rest = [a for a in args if a not in made]
        bound = dict(bind(rest, (), {a.name: given[a.name] for a in rest if a.role not in ("output", "workspace")}))
        for a in made:
            if a not in laid:
                laid[a] = laid_out(a, given[a.name], self.cp)
            bound[a] = laid[a] if not fresh else HostBytes(laid[a].storage.copy(), laid[a].given)
        return [(a, bound[a]) for a in args]

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

        tolerance, reference, bound_c, ref, said = checks
        name, prep = form.contestant, self.r._prepare(form)
        sets = [L.uploaded(prep, self._bound(form, given, fresh=i > 0)) for i in range(copies)]
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
            f"laid out on the host once), its C checked: {how}; reference and bound {said}"
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

    def _torch(self, case: Case, given: dict[str, Any], bits: Any, ref: np.ndarray, deadline: Deadline) -> Contestant:
        """torch.mm of A and the weights dequantised on the device in bf16 (exact: both hold bf16 values), rotated
        over copies of the weights as spatialc's arguments are; its C held to the libraries' bar."""
        from ..runtime.tilize import bf16_bits
        from .timing import copies_for

        torch, cp, libs = self.r.torch, self.cp, self.r.libs
        a = libs.to_torch(bf16_bits(cp.asarray(np.asarray(given["A"], np.float32)), cp), "bf16")
        copies = copies_for(bits.nbytes, self.r._l2_bytes())
        weights = [libs.to_torch(bits if i == 0 else bits.copy(), "bf16") for i in range(copies)]
        c = torch.empty((case.m, case.n), dtype=torch.bfloat16, device=a.device)
        kernel = torch_mm(torch, a, weights, c)
        kernel(0)
        self.r._sync(deadline)
        ok, err = agrees(libs.from_torch(c), "bfloat16", cp.asarray(ref), cp, library=True)
        detail = (
            f"torch.mm in bf16 of A and the weights dequantised beforehand on the device ({len(weights)} copies), "
            "into C"
        )
        if not ok:
            return Contestant(TORCH_MM, "torch", max_abs=err, ok=False, detail=detail, note="wrong; not timed")
        kernel_t = self.r._time(kernel, len(weights), deadline)
        return Contestant(TORCH_MM, "torch", None, kernel_t, err, True, detail)


def laid_out(arg: Any, value: Any, xp: Any = np) -> Any:
    """A 4-bit or e8m0 argument's bytes as the launcher lays them out (`runtime.w4_args.host_bytes`), the packed
    weights straight from their bytes, on `xp` (CuPy: on the device, where the layout takes milliseconds, not the
    host's seconds): the codes are the bytes' nibbles (`pack_int4`'s order), so the float64 values, and the check
    that they are the format's, are skipped — the row drew them, every byte two codes of the format. The tests hold
    the two paths to the same bytes."""
    from ..runtime.w4_args import HostBytes, host_bytes, packed_tiles

    packed = np.asarray(value)
    if not arg.packed or packed.dtype != np.uint8 or packed.shape != (arg.elems[0] // 2, arg.elems[1]):
        return host_bytes(arg.spec, arg.tiles, arg.packed, value)
    on = xp.asarray(packed)
    codes = xp.empty(arg.elems, xp.uint8)
    codes[0::2], codes[1::2] = on & 0xF, on >> 4
    return HostBytes(packed_tiles(codes, arg.tiles, xp), value)


def _program(case: Case) -> Any:
    from .w4rows import gemm_of

    return gemm_of(case)


def _left(deadline: Deadline) -> None:
    if deadline.passed():
        raise BudgetExceeded()

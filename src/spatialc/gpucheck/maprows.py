"""A map row on the GPU (gpucheck/maps.py says what its kinds are and how each is checked): its inputs drawn on
the device, its kind's float64 reference and bound, spatialc's general form checked and timed both ways, torch's
contestant and the device's copy of as many bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from ..runtime.tilize import bf16_bits
from .agreement import Check, agrees, values64
from .builds import Built, Form
from .cases import ELEM_OF, FP32, Case, Contestant, Deadline, Row, blaming, map_bytes
from .maps import COPY, PARAM_RANGE, SPREAD, Kind, check_map, elem_bytes, kind_of
from .preflight import REFERENCE


class MapRows:
    """Measures a map row on the GPU runner's device, clocks and torch (`device.GpuRunner`)."""

    def __init__(self, runner: Any):
        self.r, self.cp = runner, runner.cp
        self.params: dict[str, Any] = {}  # the row's parameters by name, n values each, stored as the inputs are

    def measure(self, case: Case, built: Built, row: Row, deadline: Deadline) -> None:
        from .device import settle
        from .timing import copies_for

        kind = kind_of(case)
        # A torch call no graph holds (one that allocates): the row's contestants are all timed by events.
        self.r.row_graphs = kind.graphs
        copies = copies_for(len(kind.names) * case.m * case.n * elem_bytes(case), self.r._l2_bytes())  # a set's
        sets = self._inputs(case, kind, copies)
        refs = blaming(REFERENCE, lambda: self._reference(case, kind, sets[0], deadline))
        verdicts = [("error", built.error)] if built.error else []
        for form in built.forms:
            mine, verdict = self._spatialc(case, form, sets, refs, deadline)
            row.contestants.append(mine)
            verdicts.append(verdict)
        row.status, row.note = settle(row.note, verdicts)
        ref = next(iter(refs.values()))[0]  # torch's one result: the first output's
        row.contestants.append(
            self._library(kind.contestant, lambda: self._torch(case, kind, sets, ref, deadline), deadline)
        )
        row.contestants.append(self._library(COPY, lambda: self._copy(case, deadline), deadline))

    def _inputs(self, case: Case, kind: Kind, copies: int) -> list[list[Any]]:
        """`copies` sets of the kind's inputs, row-major in their storage type (bf16 as its bits), drawn on the
        device uniform in ±SPREAD, the same on every run of the row; and its parameters (`self.params`: one for
        all sets, n values each, uniform in PARAM_RANGE), stored alike."""
        cp = self.cp
        rs = cp.random.RandomState(zlib.crc32(f"{self.r.seed} {case}".encode()))
        sets = []
        for _ in range(copies):
            xs = [rs.uniform(-SPREAD, SPREAD, size=(case.m, case.n), dtype=cp.float32) for _ in kind.names]
            sets.append([self._stored(x, case) for x in xs])
        lo, hi = PARAM_RANGE
        self.params = {
            name: self._stored(rs.uniform(lo, hi, size=(case.n,), dtype=cp.float32), case) for name in kind.params
        }
        return sets

    def _stored(self, x: Any, case: Case) -> Any:
        """float32 values `x` in the case's storage: fp16, bf16 as its bits, or fp32 as they are."""
        if case.precision == FP32:
            return x
        return x.astype(self.cp.float16) if case.precision == "fp16" else bf16_bits(x, self.cp)

    def _values(self, x: Any, case: Case) -> Any:
        return values64(x, ELEM_OF[case.precision], self.cp)

    def _reference(self, case: Case, kind: Kind, inputs: list[Any], deadline: Deadline) -> dict[Any, Any]:
        """Each output's float64 reference and bound, by name (None: the kernel's one output), waited for."""
        params = {name: self._values(w, case) for name, w in self.params.items()}
        refs = kind.references(case, [self._values(x, case) for x in inputs], params, self.cp)
        self.r._sync(deadline)
        return refs

    # ---- spatialc ------------------------------------------------------------------------------------------

    def _spatialc(
        self, case: Case, form: Form, sets: list[list[Any]], refs: dict[Any, Any], deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        name = form.contestant
        if form.artifact is None:
            return Contestant(name, "spatialc", note=f"n/a: {form.absent}", facts=form.facts), ("", "")
        return self.r.guarded(case, form, lambda: self._kernel(case, form, sets, refs, deadline))

    def _kernel(
        self, case: Case, form: Form, sets: list[list[Any]], refs: dict[Any, Any], deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        from ..ir.printer import plural
        from .device import same_error

        name, prep = form.contestant, self.r._prepare(form)
        outs = prep.output_buffers(poison=True)
        e2e = MapEndToEnd(prep, sets, {param: self._values(w, case) for param, w in self.params.items()})
        params = e2e.tiled_params()
        tiled = [e2e.tiled(s, outs, params) for s in sets]
        check = self._checked_run(prep, tiled[0], outs, refs, deadline)
        kernel = self.r._time(lambda i: prep.run(tiled[i]), len(tiled), deadline)
        again = self._checked_run(prep, tiled[0], outs, refs, deadline)
        check.stable = again.correct == check.correct and same_error(again.max_abs, check.max_abs)
        e2e(0)
        self.r._sync(deadline)
        e2e_check = check_outputs(prep, e2e.results, refs, self.cp)
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
        passes = kind_of(case).passes
        reads = f"; the kernel reads x {passes} times (a pass a row reduction, one for C), the GB/s count it once"
        bound = next(iter(refs.values()))[1]
        stored = (
            f"{', '.join(prep.output_names)} stored as {'/'.join(dict.fromkeys(a.elem for a in prep.outputs))}, each"
            " against its own stages:"
            if len(prep.outputs) > 1
            else f"C stored as {prep.output.elem},"
        )
        detail = (
            f"{stored} checked {bound.text}; end to end: tilize each input on the device, the kernel, untilize"
            f" {'each output' if len(prep.outputs) > 1 else 'C'}{reads if passes > 1 else ''}"
        )
        ok = e2e_check.correct
        mine = Contestant(
            name, "spatialc", end_to_end, kernel, check.max_abs, ok, detail, check=check, facts=form.facts
        )
        status = "ok" if check.correct and check.stable and ok else "wrong"
        return mine, (status, f"{name}: {'; '.join(notes)}" if notes else "")

    def _checked_run(
        self, prep: Any, args: tuple[Any, ...], outs: dict[str, Any], refs: dict[Any, Any], deadline: Deadline
    ) -> Check:
        """One launch into poisoned outputs, each checked against its reference (`check_outputs`)."""
        from ..runtime.tilize import poison_value

        for name, out in outs.items():
            out.fill(poison_value(prep.output_arg(name).storage))
        prep.run(args)
        self.r._sync(deadline)
        results = {name: prep.result(out, name) for name, out in outs.items()}
        return check_outputs(prep, results, refs, self.cp, outs)

    # ---- torch and the copy --------------------------------------------------------------------------------

    def _library(self, name: str, measure: Callable[[], Contestant], deadline: Deadline) -> Contestant:
        """A library contestant measured (`measure`), or why not (`GpuRunner.library_guarded`)."""
        return self.r.library_guarded(name, "copy" if name == COPY else "torch", measure, deadline)

    def _torch(self, case: Case, kind: Kind, sets: list[list[Any]], ref: Any, deadline: Deadline) -> Contestant:
        torch, libs, elem = self.r.torch, self.r.libs, ELEM_OF[case.precision]
        params = [libs.to_torch(w, case.precision) for w in self.params.values()]
        ts = [[*(libs.to_torch(x, case.precision) for x in s), *params] for s in sets]
        c = torch.empty((case.m, case.n), dtype=ts[0][0].dtype, device=ts[0][0].device)
        scratch = torch.empty((case.m, case.n), dtype=ts[0][0].dtype, device=ts[0][0].device)
        box: list[Any] = [None, None]

        def e2e(i: int) -> None:
            box[0] = kind.torch_call(torch, ts[i])

        def kernel(i: int) -> None:
            if kind.torch_into is None:  # no form that writes into C: the same call, its result from torch's cache
                box[1] = kind.torch_call(torch, ts[i])
            else:
                kind.torch_into(torch, ts[i], c, scratch)

        kernel(0)
        e2e(0)
        self.r._sync(deadline)
        ok_k, err_k = agrees(libs.from_torch(c if box[1] is None else box[1]), elem, ref, self.cp, library=True)
        ok_e, err_e = agrees(libs.from_torch(box[0]), elem, ref, self.cp, library=True)
        how = (
            "kernel only into C allocated beforehand (its ops' out= forms)"
            if kind.graphs
            else "kernel only the same call (torch has no form of it that writes into C), its rows timed by events"
        )
        detail = f"{kind.torch_text} in {case.precision}; {how}"
        if not (ok_k and ok_e):
            return Contestant(
                kind.contestant, "torch", max_abs=max(err_k, err_e), ok=False, detail=detail, note="wrong; not timed"
            )
        kernel_t = self.r._time(kernel, len(ts), deadline)
        end_to_end = self.r._time(e2e, len(ts), deadline, graphs=False)
        return Contestant(kind.contestant, "torch", end_to_end, kernel_t, max(err_k, err_e), True, detail)

    def _copy(self, case: Case, deadline: Deadline) -> Contestant:
        """Half the row's bytes copied device to device, so that as many bytes move as the map reads and writes."""
        return copy_contestant(self.r, map_bytes(case), f"the map's {map_bytes(case)} bytes", deadline)


def copy_contestant(runner: Any, total: int, what: str, deadline: Deadline) -> Contestant:
    """The device's copy bandwidth over `total` bytes moved (`what` they are): half of them copied device to device
    and as many written, source buffers rotated like a row's inputs (each holding its own bytes), one destination;
    its kernel time is the time to move `total` bytes at the copy's bandwidth (the map rows', the W4A16 rows')."""
    from .timing import copies_for

    cp, torch = runner.cp, runner.torch
    half = total // 2
    sources = [cp.full(half, i + 1, dtype=cp.uint8) for i in range(copies_for(half, runner._l2_bytes()))]
    src = [torch.from_dlpack(x) for x in sources]
    dst = torch.empty((half,), dtype=torch.uint8, device=src[0].device)

    def kernel(i: int) -> None:
        dst.copy_(src[i])

    kernel(0)
    runner._sync(deadline)
    if not bool(cp.all(runner.libs.from_torch(dst) == 1)):
        return Contestant(COPY, "copy", ok=False, note="wrong: the copy's bytes differ from its source's")
    kernel_t = runner._time(kernel, len(src), deadline)
    detail = f"{half} bytes read and as many written, device to device: {what}"
    return Contestant(COPY, "copy", None, kernel_t, 0.0, True, detail)


def check_outputs(
    prep: Any, results: dict[str, Any], refs: dict[Any, Any], xp: Any, outs: dict[str, Any] | None = None
) -> Check:
    """Every output of a map kernel (`results`, logical, by name) against its reference and bound (`refs` by name;
    None names a kernel's one output), element by element (`check_map`), as one Check: right when each is, its
    errors the largest of any output's, its poison and non-finite elements counted over all (`outs`: the tiled
    buffers, whose padding is counted too)."""
    checks = []
    for name, c in results.items():
        ref, bound = refs[name] if name in refs else refs[None]
        out = None if outs is None else outs[name]
        checks.append(check_map(c, ref, bound, prep.output_arg(name).elem, xp, out))
    return Check(
        all(c.correct for c in checks),
        max(c.max_abs for c in checks),
        max(c.rel_fro for c in checks),
        sum(c.unwritten for c in checks),
        sum(c.pad_unwritten for c in checks),
        sum(c.nonfinite for c in checks),
    )


class MapEndToEnd:
    """What spatialc.run does on the device for a map's row-major inputs: tilize each (and each parameter, from its
    float32 values `params`), launch, untilize each output (in the type the kernel stores it: nothing to convert);
    `results` holds the last launch's outputs by name."""

    def __init__(self, prep: Any, sets: list[list[Any]], params: dict[str, Any]):
        self.prep, self.sets, self.params = prep, sets, params
        self.results: dict[str, Any] = {}

    def tiled(self, inputs: list[Any], outs: Any, params: dict[str, Any]) -> tuple[Any, ...]:
        """The kernel's arguments: `inputs` tiled, in parameter order with the output buffers `outs` (by name, or
        a kernel of one output's buffer) and the tiled `params`."""
        p = self.prep
        ins = [a for a in p.args if a.role == "input"]
        return p.order(tuple(p.tiled(a, x) for a, x in zip(ins, inputs, strict=True)), outs, params)

    def tiled_params(self) -> dict[str, Any]:
        """Each parameter tensor tiled: its n values as a row of float32."""
        p, xp = self.prep, self.prep.xp
        return {
            a.name: p.tiled(a, self.params[a.name].astype(xp.float32).reshape(1, -1))
            for a in p.args
            if a.role == "parameter"
        }

    def __call__(self, i: int) -> None:
        outs = self.prep.output_buffers(poison=False)
        self.prep.run(self.tiled(self.sets[i], outs, self.tiled_params()))
        self.results = {name: self.prep.result(out, name) for name, out in outs.items()}

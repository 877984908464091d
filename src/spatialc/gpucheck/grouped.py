"""The GPU check's grouped-GEMM rows (a mixture-of-experts layer): C[g, :m_g] = A[g, :m_g] @ B[g] with the row
counts m_g drawn for the shape (`cases.grouped_sizes`) and read by the kernel at run time.

Contestants, kernel only (each with its operands already on the device in its own layout):
- spatialc's general form, its output poisoned first: every row below a group's count must match the float64
  reference, and every row at or past it must keep the poison (the kernel neither reads nor writes those rows);
- `torch.matmul` per group (a loop of G calls on A[g, :m_g], each into its rows of C) — what a framework without
  a grouped kernel does;
- `torch._grouped_mm` where this torch has it: the groups' rows packed into one (Σm, K) A with their offsets, one
  call (cuBLAS / CUTLASS grouped GEMM).

No end-to-end timing: a grouped caller's layout (packed rows, offsets) differs from library to library, so only the
calls themselves are compared. The reference is computed group by group in float64 (the operands are exact).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.tilize import bf16_bits, unwritten
from .agreement import Check, _within, values64
from .builds import Built, Form
from .cases import ELEM_OF, Case, Contestant, Deadline, Row, blaming, grouped_sizes
from .preflight import REFERENCE

TORCH_LOOP = "torch.matmul per group"
GROUPED_MM = "torch._grouped_mm"


class GroupedErrors:
    """max|C−R|, ‖C−R‖_F / ‖R‖_F and max|R| over the groups' rows, gathered group by group (no packed copy)."""

    def __init__(self, xp: Any):
        self.xp, self.max_abs, self.diff2, self.ref2, self.scale = xp, 0.0, 0.0, 0.0, 0.0
        self.nonfinite = 0

    def add(self, c64: Any, ref: Any) -> None:
        xp = self.xp
        if not ref.size:
            return
        diff = c64 - ref
        self.nonfinite += int(c64.size - xp.count_nonzero(xp.isfinite(c64)))
        self.max_abs = max(self.max_abs, float(xp.max(xp.abs(diff))))
        self.diff2 += float(xp.sum(diff * diff))
        self.ref2 += float(xp.sum(ref * ref))
        self.scale = max(self.scale, float(xp.max(xp.abs(ref))))

    @property
    def rel_fro(self) -> float:
        return (self.diff2**0.5) / (self.ref2**0.5) if self.ref2 > 0 else self.max_abs

    def within(self, elem: str, *, library: bool = False) -> bool:
        return self.nonfinite == 0 and _within(elem, self.max_abs, self.rel_fro, self.scale, library=library)


class GroupedRows:
    """Measures a grouped row on the GPU runner's device, clocks and libraries (`device.GpuRunner`)."""

    def __init__(self, runner: Any):
        self.r, self.cp = runner, runner.cp

    def measure(self, case: Case, built: Built, row: Row, deadline: Deadline) -> None:
        sizes = grouped_sizes(case.groups, case.m)
        row.note = "; ".join(
            x for x in (row.note, f"row counts {', '.join(map(str, sizes[:8]))}{', …' if len(sizes) > 8 else ''}"
                        f" ({int(sizes.sum())} of {case.groups * case.m} rows)") if x
        )  # fmt: skip
        a, b = self._operands(case)
        refs = self._references(a, b, sizes, case)
        refs.make_all(lambda: self.r._sync(deadline))  # a loss here is the references', not the first kernel's
        verdicts = [("error", built.error)] if built.error else []
        for form in built.forms:
            mine, verdict = self._spatialc(case, form, a, b, sizes, refs, deadline)
            row.contestants.append(mine)
            verdicts.append(verdict)
        from .device import settle

        row.status, row.note = settle(row.note, verdicts)
        for name in self.libraries(case):
            row.contestants.append(self._library(name, case, a, b, sizes, refs, deadline))

    # What a block-scaled grouped row (groupedbs.py) changes: its libraries, references, scales and result type.

    def libraries(self, case: Case) -> tuple[str, ...]:
        return (TORCH_LOOP, GROUPED_MM)

    def _references(self, a: Any, b: Any, sizes: Any, case: Case) -> Any:
        return _References(self.cp, a, b, sizes, ELEM_OF[case.precision])

    def _params(self, prep: Any, args: dict[str, Any]) -> dict[str, Any]:
        """The kernel's parameters besides the row counts, tiled (none here)."""
        return {}

    def _library_ref(self, name: str, refs: Any, g: int) -> Any:
        """What a library's group `g` is checked against."""
        return refs.of(g)

    def _library_elem(self, case: Case) -> str:
        """The element type of a library's result."""
        return ELEM_OF[case.precision]

    def _operands(self, case: Case) -> tuple[Any, Any]:
        import zlib

        cp = self.cp
        rs = cp.random.RandomState(zlib.crc32(f"{self.r.seed} {case}".encode()))
        shapes = ((case.groups, case.m, case.k), (case.groups, case.k, case.n))
        made = []
        for shape in shapes:
            x = rs.uniform(-1.0, 1.0, size=shape, dtype=cp.float32)
            made.append(x.astype(cp.float16) if case.precision == "fp16" else bf16_bits(x, cp))
        return made[0], made[1]

    # ---- spatialc ------------------------------------------------------------------------------------------

    def _spatialc(
        self, case: Case, form: Form, a: Any, b: Any, sizes: Any, refs: _References, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        name = form.contestant
        if form.artifact is None:
            return Contestant(name, "spatialc", note=f"n/a: {form.absent}"), ("", "")
        return self.r.guarded(case, form, lambda: self._kernel(case, form, a, b, sizes, refs, deadline))

    def _kernel(
        self, case: Case, form: Form, a: Any, b: Any, sizes: Any, refs: _References, deadline: Deadline
    ) -> tuple[Contestant, tuple[str, str]]:
        cp, name = self.cp, form.contestant
        prep = self.r._prepare(form)
        args = {x.name: x for x in prep.args}
        out = prep.output_buffer(poison=True)
        counts = cp.asarray(sizes, dtype=cp.int32).reshape(1, -1)
        params = {"sizes": prep.tiled(args["sizes"], counts), **self._params(prep, args)}
        tiled = prep.order((prep.tiled(args["A"], a), prep.tiled(args["B"], b)), out, params)
        prep.run(tiled)
        self.r._sync(deadline)
        check, touched = self._check(prep.result(out), prep.output.elem, sizes, refs)
        kernel = self.r._time(lambda i: prep.run(tiled), 1, deadline)
        detail = (
            f"C stored as {prep.output.elem}; kernel only: the launch on tilized A, B and the row counts, its output"
            " poisoned first"
        )
        ok = check.correct and touched == 0
        mine = Contestant(name, "spatialc", None, kernel, check.max_abs, ok, detail, check=check, facts=form.facts)
        notes = [f"{touched} elements of rows past their group's count were written"] if touched else []
        return mine, ("ok" if ok else "wrong", f"{name}: {'; '.join(notes)}" if notes else "")

    def _check(self, c: Any, elem: str, sizes: Any, refs: _References) -> tuple[Check, int]:
        """The rows below each count against the reference; how many elements past the counts lost the poison."""
        cp = self.cp
        storage = "uint16" if elem == "bfloat16" else elem
        errs, poisoned_in, touched = GroupedErrors(cp), 0, 0
        for g, m in enumerate(sizes):
            m = int(m)
            errs.add(values64(c[g, :m], elem, cp), refs.of(g))
            poisoned_in += unwritten(c[g, :m], storage, cp)
            rest = c[g, m:]
            touched += int(rest.size) - unwritten(rest, storage, cp)
        correct = errs.within(elem) and poisoned_in == 0
        return Check(bool(correct), errs.max_abs, errs.rel_fro, poisoned_in, 0, errs.nonfinite), touched

    # ---- the libraries -------------------------------------------------------------------------------------

    def _library(
        self, name: str, case: Case, a: Any, b: Any, sizes: Any, refs: _References, deadline: Deadline
    ) -> Contestant:
        torch = self.r.torch
        if torch is not None and name == GROUPED_MM and not hasattr(torch, "_grouped_mm"):
            return Contestant(name, "cublas", note=f"unavailable: this torch ({torch.__version__}) has no _grouped_mm")

        def measure() -> Contestant:
            call, results, detail = self._make(name, case, a, b, sizes)
            call()
            self.r._sync(deadline)
            errs, elem = GroupedErrors(self.cp), self._library_elem(case)
            for g, got in enumerate(results()):
                errs.add(values64(got, elem, self.cp)[: int(sizes[g])], self._library_ref(name, refs, g))
            ok = errs.within(elem, library=True)
            if not ok:
                return Contestant(
                    name, "cublas", max_abs=errs.max_abs, ok=False, detail=detail, note="wrong; not timed"
                )
            kernel = self.r._time(lambda i: call(), 1, deadline, graphs=False)
            return Contestant(name, "cublas", None, kernel, errs.max_abs, True, detail)

        return self.r.library_guarded(name, "cublas", measure, deadline)

    def _make(self, name: str, case: Case, a: Any, b: Any, sizes: Any) -> tuple[Callable[[], None], Any, str]:
        """The library call, a function giving each group's rows of its result (CuPy views), and what it does."""
        torch, libs = self.r.torch, self.r.libs
        ta, tb = libs.to_torch(a, case.precision), libs.to_torch(b, case.precision)
        counts = [int(m) for m in sizes]
        if name == TORCH_LOOP:
            c = torch.empty((case.groups, case.m, case.n), dtype=ta.dtype, device=ta.device)

            def loop() -> None:
                for g, m in enumerate(counts):
                    if m:
                        torch.matmul(ta[g, :m], tb[g], out=c[g, :m])

            def rows() -> Any:
                return (libs.from_torch(c[g, :m]) for g, m in enumerate(counts))

            return loop, rows, f"a loop of {case.groups} torch.matmul calls, each on its group's rows, into C"
        packed = torch.cat([ta[g, :m] for g, m in enumerate(counts)])
        offs = torch.tensor(list(_cumsum(counts)), dtype=torch.int32, device=ta.device)
        box: list[Any] = [None]

        def grouped() -> None:
            box[0] = torch._grouped_mm(packed, tb, offs=offs)

        def packed_rows() -> Any:
            starts = [0, *_cumsum(counts)]
            return (libs.from_torch(box[0][starts[g] : starts[g + 1]]) for g in range(len(counts)))

        return grouped, packed_rows, "one call on the groups' rows packed into one A, with their offsets"


class _References:
    """Each group's float64 reference, A[g, :m_g] @ B[g], made when first asked and kept."""

    def __init__(self, cp: Any, a: Any, b: Any, sizes: Any, elem: str):
        self.cp, self.a, self.b, self.sizes, self.elem = cp, a, b, sizes, elem
        self.cache: dict[int, Any] = {}

    def make_all(self, sync: Callable[[], None]) -> None:
        """Every group's reference, waited for (`sync`), a loss of the GPU in them blamed on the references."""

        def made() -> None:
            for g in range(len(self.sizes)):
                self.of(g)
            sync()

        blaming(REFERENCE, made)

    def of(self, g: int) -> Any:
        if g not in self.cache:
            m = int(self.sizes[g])
            cp, elem = self.cp, self.elem
            self.cache[g] = cp.matmul(values64(self.a[g, :m], elem, cp), values64(self.b[g], elem, cp))
        return self.cache[g]


def _cumsum(xs: list[int]) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out

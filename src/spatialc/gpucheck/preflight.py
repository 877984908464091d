"""The preflight: the first thing a GPU run does, in at most a minute, so that the run counts.

Every path the run will take is tried once on a small product before any row: the device itself, CuPy and its
cuBLAS (the float64 references), spatialc's kernel in each form (persistent, general; the sm_90a form at the plan
the large rows run: 128×256 items, K steps of 128-byte swizzled panels) launched and checked, a kernel whose sites
hand over pages within thread-block clusters (a multicast group's), torch.matmul, each int8 library path in the
exact layout the rows will use, a CUDA graph capture (the kernel-only timings: every kernel above captured and
replayed twice, so that state a replay does not reset shows), one Triton compile. A path that fails is marked
unavailable with its reason; the rows skip it, the report says why, and the run goes on with what works. A
spatialc kernel that runs but computes a wrong C is kept and its form marked (each row checks its own C): a corner
of a form that the preflight reaches and the rows do not must not cost every row. A step not reached within the
minute counts as failed ("not tried"). Only a lost GPU (a hang, a sticky error) stops the run. The steps are the
device side's; their order, limit and bookkeeping are here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import SpatialError
from .baselines import GEMM_EX, INT_MM_COL, INT_MM_ROW, TORCH_MATMUL, TRITON
from .cases import (
    FORMS,
    HOPPER_FORM,
    PRECISIONS,
    Case,
    GpuLost,
    Probe,
    is_sticky,
    one_line,
    preflight_case,
    spatialc_name,
)
from .fp8 import FP8_PRECISIONS

PREFLIGHT_S = 60.0
# Paths the steps decide, beside the contenders' own names (spatialc's kernels among them: `spatialc general`).
REFERENCE = "reference"  # the float64 references, through CuPy's cuBLAS
GRAPHS = "graphs"  # CUDA graphs for the kernel-only timings
TINY_INT8_EX = Case(33, 35, 37, "int8")  # odd sizes, so that cublasGemmEx's padding runs in the preflight too
DEVICE_STEP = "device"
CUPY_STEP = "CuPy cuBLAS: float64 matmul 64³"
GRAPHS_STEP = "CUDA graphs: every contestant captured and replayed"
# The sm_90a form's preflight kernel: the plan the 4096³ and 8192³ rows run — 128 × 256 items (8 × 16 tiles), K steps
# of one 128-byte swizzled panel, B MN-major in bf16 — on a 2 × 2 grid of them, not the 64³ corner of the form
# (64-row items, 64-byte panels) that no large row reaches.
HOPPER_PROBE = (256, 512, 256)
HOPPER_ITEM = (8, 16)
PANEL_BYTES = 128
HANDOVER_GROUP = (2, 1)  # the cluster kernel: a multicast group's handshake, on the preflight's product


class WrongResult(SpatialError):
    """A preflight kernel ran and computed a wrong C: its step is kept (`Probe.marked`), its paths stay available."""


@dataclass(frozen=True, slots=True)
class Step:
    """One preflight step: `run` returns what it saw (and raises when the path fails), or is the reason it cannot
    be tried at all here."""

    name: str
    paths: tuple[str, ...]
    run: Callable[[], str] | str


def run_steps(
    steps: Sequence[Step],
    *,
    limit_s: float = PREFLIGHT_S,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = lambda s: None,
) -> list[Probe]:
    """Run the steps in order within `limit_s`; GpuLost (a hang, a sticky error) ends the preflight."""
    t0, probes = clock(), []
    for step in steps:
        if isinstance(step.run, str):
            probes.append(Probe(step.name, False, step.run, 0.0, step.paths))
            continue
        if clock() - t0 >= limit_s:
            why = f"not tried: the preflight's {limit_s:.0f} s were spent"
            probes.append(Probe(step.name, None, why, 0.0, step.paths))
            continue
        say(f"preflight: {step.name}")
        start = clock()
        marked = False
        try:
            detail, ok = step.run(), True
        except WrongResult as e:
            detail, ok, marked = str(e), True, True
        except GpuLost as e:
            raise (e.blame(step.paths[0]) if len(step.paths) == 1 else e) from None
        except Exception as e:
            if is_sticky(e):
                path = step.paths[0] if len(step.paths) == 1 else None
                raise GpuLost(f"{step.name}: {one_line(e)}", path=path) from None
            detail, ok = one_line(e), False
        probes.append(Probe(step.name, ok, detail, round(clock() - start, 2), step.paths, marked))
    return probes


def leaving_out(steps: Sequence[Step], lost: Mapping[str, str]) -> list[Step]:
    """The steps, each that decides a path `lost` names replaced by that reason (not tried, so not lost again)."""
    out = []
    for step in steps:
        why = next((lost[p] for p in step.paths if p in lost), None)
        out.append(step if why is None else Step(step.name, step.paths, why))
    return out


def unavailable(probes: Sequence[Probe]) -> dict[str, str]:
    """Each path a failed (or untried) step decides, with the step's reason."""
    out: dict[str, str] = {}
    for p in probes:
        if not p.ok:
            for path in p.paths:
                out.setdefault(path, f"{p.name}: {p.detail}" if p.detail else p.name)
    return out


def spatialc_step(form: str, case: Case) -> str:
    """The name of the step that launches and checks spatialc's kernel in `form` for `case`."""
    if case.multicast != (1, 1):
        return f"{spatialc_name(form)} kernel in clusters: {case}"
    if case.hopper_block is not None:
        osh, osw, ibw = case.hopper_block
        panel = ibw * 16 * (1 if case.precision == "int8" else 2)
        return f"{spatialc_name(form)} kernel: {case} ({osh * 16}×{osw * 16} items, {panel}-byte panels)"
    return f"{spatialc_name(form)} kernel: {case}"


def hopper_case(cases: Sequence[Case]) -> Case:
    """The sm_90a form's preflight product, at the large rows' plan: bf16 where the run has it (their precision
    of note), else the run's first; K steps of one 128-byte panel in its type."""
    # fp8: checked in its rows; fp32: a map's alone (no GEMM takes it)
    precisions = [c.precision for c in cases if c.precision in PRECISIONS]
    precision = "bf16" if "bf16" in precisions or not precisions else precisions[0]
    ibw = PANEL_BYTES // (16 * (1 if precision == "int8" else 2))
    return Case(*HOPPER_PROBE, precision, hopper_block=(*HOPPER_ITEM, ibw))


def handover_case(cases: Sequence[Case]) -> Case:
    """The preflight's cluster kernel: the preflight's product in multicast groups (their handshake on the
    clusters' barriers, pages through distributed shared memory)."""
    first = preflight_case(list(cases))
    return Case(first.m, first.n, first.k, first.precision, multicast=HANDOVER_GROUP)


def kernel_steps(cases: Sequence[Case]) -> list[tuple[str, Case]]:
    """Each of spatialc's preflight kernels, as (form, case), in the preflight's order."""
    first = preflight_case(list(cases))
    mine = [(form, hopper_case(cases) if form == HOPPER_FORM else first) for form in FORMS]
    return [*mine, ("general", handover_case(cases))]


def preflight_cases(cases: Sequence[Case]) -> list[Case]:
    """The products spatialc's preflight kernels are built for (each once), which the GPU run and --prepare build."""
    return list(dict.fromkeys(case for _, case in kernel_steps(cases)))


def library_steps(cases: Sequence[Case]) -> list[tuple[str, Case]]:
    """Each library the rows of `cases` use, with the small product its step tries, in the preflight's order."""
    precisions = {c.precision for c in cases} - set(FP8_PRECISIONS)  # fp8 rows: _scaled_mm, checked in its rows
    int8 = Case(64, 64, 64, "int8")
    steps = [(TORCH_MATMUL, Case(64, 64, 64, tiny_float(cases)))] if precisions - {"int8"} else []
    if "int8" in precisions:
        steps += [(INT_MM_COL, int8), (GEMM_EX, TINY_INT8_EX), (INT_MM_ROW, int8)]
    return [*steps, (TRITON, preflight_case(list(cases)))]


def step_names(cases: Sequence[Case]) -> list[str]:
    """The steps a GPU run of `cases` takes, by name, in order (what the dry run lists)."""
    kernels = [spatialc_step(form, case) for form, case in kernel_steps(cases)]
    return [DEVICE_STEP, CUPY_STEP, *kernels, *(f"{n}: {c}" for n, c in library_steps(cases)), GRAPHS_STEP]


def tiny_float(cases: Sequence[Case]) -> str:
    """The float precision the preflight tries torch.matmul in: the run's first."""
    return next((c.precision for c in cases if c.precision in ("fp16", "bf16")), "fp16")

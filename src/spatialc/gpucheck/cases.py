"""The GPU check's shared vocabulary: what it runs (cases, from the size strings `sizes.py` reads), and what it finds
(timings, contestants, preflight probes, rows; a kernel's `Check` and the tolerances are `agreement.py`'s). Both the
driver and the device side import this module; it imports neither of them, and needs no GPU."""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpatialError
from ..runtime.tilize import ELEMENT_DTYPES
from .agreement import Check
from .attnrows import ATTENTION_PRECISIONS, parse_attention
from .blockscaled import parse_blockscaled
from .fp8 import FP8_PRECISIONS, parse_fp8
from .sizes import parse_fused, parse_grouped, parse_map, parse_multicast, parse_size, parse_sweep
from .w4rows import default_sizes as w4_sizes

PRECISIONS = ("int8", "fp16", "bf16")  # the default run's list, and the precisions a GEMM row takes
# float32, the precision of programs with no matmul (spatialc refuses it for a matmul: `ops.NO_FP32_MATMUL`): map and
# norm rows take it (`MAP_PRECISIONS`), a GEMM's size skips it; `--precisions` takes it beside PRECISIONS.
FP32 = "fp32"
RUN_PRECISIONS = (*PRECISIONS, FP32)
# In the order a short budget should keep them (rows run in this order; what the budget does not reach is skipped):
# first what the open goals are judged by — 4096³ and 8192³, then the same with multicast groups (mcGYxGX:SIZE,
# sm_90's thread-block clusters, compared with the plain row of that size) — then
# a GEMM with a fused epilogue (fused:SIZE, bf16: C = (A·B) · row_scale · col_scale + residual, gpucheck/fused.py),
# compared with the plain GEMM of the same size in the same row; then the small and odd sizes; then
# elementwise maps (map:KIND:MxN, fp16 / bf16 — fp32 too: gpucheck/maps.py), measured in GB/s against torch's formula
# and the device's copy bandwidth, and norms that reduce rows likewise (map:softmax:MxN and its two-pass neighbour
# map:softmax_online:MxN, map:rmsnorm:MxN, map:layernorm:MxN, fused add + RMSNorm map:fused_add_rmsnorm:MxN, and
# the row reductions map:row_absmax:MxN and map:row_sum:MxN — the sum's by --sizes alone, to keep the run short:
# norms.py; map:log_softmax:MxN and map:row_logsumexp:MxN by --sizes alone too), and what users of Triton compare
# first, its float32 tutorials: the vector add (x + y: the residual kind in fp32) and the fused softmax, a map size
# naming its precision (map:KIND:MxN:PRECISION, run in it whatever the run's list); then
# 128x128x65536 and 512x512x32768, few output items and a long K, which the planner splits over sites (split-K, set
# against cuBLAS, which splits such shapes too); last grouped GEMMs (gG:MAXROWSxNxK: G groups with row counts drawn
# from 0..MAXROWS, fp16 / bf16 only); then, after every row the table had before them, so that they never push those
# out of a short budget, fp8 GEMMs with dequant scales (fp8:KIND:SIZE, the row's precision its kind: gpucheck/fp8.py)
# against torch._scaled_mm; then attention (att:BATCHxHEADS:SEQ:HEAD_DIM[:causal], fp16 / bf16: gpucheck/attnrows.py)
# against torch's SDPA backends and flash_attn; last the W4A16 decode rows (w4:FORMAT:MxNxK, bf16 A and 4-bit
# weights: gpucheck/w4rows.py) against torch's mm on the weights dequantised beforehand and the copy bandwidth.
DEFAULT_SIZES = (
    "4096",
    "8192",
    "mc2x1:4096",
    "mc2x2:4096",
    "mc2x1:8192",
    "mc2x2:8192",
    "fused:4096",
    "fused:8192",
    "256",
    "512",
    "1024",
    "2048",
    "1000",
    "4097x513x1031",
    "map:swiglu:4096x11008",
    "map:swiglu:8192x14336",
    "map:residual:8192x8192",
    "map:softmax:4096x4096",
    "map:softmax:8192x8192",
    "map:softmax_online:4096x4096",
    "map:softmax_online:8192x8192",
    "map:rmsnorm:8192x4096",
    "map:rmsnorm:16384x8192",
    "map:layernorm:8192x4096",
    "map:layernorm:16384x8192",
    "map:fused_add_rmsnorm:8192x4096",
    "map:row_absmax:8192x4096",
    "map:residual:8192x8192:fp32",
    "map:softmax:4096x4096:fp32",
    "128x128x65536",
    "512x512x32768",
    "g8:4096x4096x4096",
    "g64:4096x4096x4096",
    "fp8:e4m3:4096",
    "fp8:e4m3:8192",
    "fp8:e5m2:4096",
    "fp8bs:e4m3:4096",
    "fp8bs:e4m3:8192",
    "fp8mx:e4m3:4096",
    "fp8mx:e4m3:8192",
    "fp8bs:e4m3:g8:512x4096x7168",
    "fp8bs:e4m3:g4:1024x7168x2048",
    "att:16x16:4096:128",
    "att:16x16:4096:128:causal",
    "att:2x16:8192:128",
    "att:2x16:8192:128:causal",
    "att:1x16:16384:128",
    "att:1x16:16384:128:causal",
    "att:16x16:4096:64",
    "att:16x16:4096:64:causal",
    "att:2x16:8192:64",
    "att:2x16:8192:64:causal",
    "att:1x16:16384:64",
    "att:1x16:16384:64:causal",
    *w4_sizes(),
)
# The plan sweep (`sweep:SIZE`): the persistent kernel and the sm_90a form at their planners' plans and the plans one
# change away (gpucheck/sweep.py), beside cuBLAS. Not in the default run: a session's second GPU run, prepared with
# the first (`--prepare` compiles these kernels too when no `--sizes` is given).
SWEEP_SIZES = ("sweep:4096", "sweep:8192")
PLANNERS_PLAN = "the planner's plan"  # a sweep's plan that is its form's planner's own choice (the others: one change)
TIMED_AGAIN = "the planner's plan, timed again"  # … and its kernel once more, after the neighbours
SAME_SPEED = 0.02  # two speeds closer than this (relative) are a tie in a sweep's verdicts: timing noise, not order
GROUPED_PRECISIONS = ("fp16", "bf16")  # the grouped rows' baselines (torch.matmul per group, torch._grouped_mm)
MAP_PRECISIONS = ("fp16", "bf16", FP32)  # the map rows' (C in the inputs' type, as torch gives it)
FUSED_PRECISIONS = ("bf16",)  # the fused-epilogue rows' (issue 31's: bf16 at 4096³ and 8192³)
# What torch's own GEMM returns for each precision: every contestant's end-to-end result comes in this type, and
# spatialc's kernels are built for it (`spatialc.gemm(..., out=…)`) where gemm takes `out`.
TORCH_OUT = {"int8": "int32", "fp16": "fp16", "bf16": "bf16", "e4m3": "bf16", "e5m2": "bf16", FP32: FP32}
# spatialc's type names (`fp16`; float32 spelt `fp32` too) as the launcher names element types (`float16`;
# spatialc.runtime.tilize).
ELEM_OF = {dtype.value: elem for elem, dtype in ELEMENT_DTYPES.items()} | {FP32: "float32"}
WAYS = ("end_to_end", "kernel")  # the two timings of every contestant
# spatialc's kernels of a product, in the report's order: the persistent tile kernel and the same program in the
# general form (`spatialc.lower`'s artifact and its `general`), and on a Hopper (sm_90) the same GEMM built for
# target sm_90a in the sm_90a form (TMA and wgmma); each is a contestant of its own.
FORMS = ("persistent", "general", "sm90a")
# What each form's kernel is compiled for on a device of architecture `arch`: the sm_90a form for sm_90a.
HOPPER_FORM = "sm90a"


def kernel_arch(form: str, arch: str) -> str:
    """The architecture a kernel of `form` is compiled for on a device of `arch` (the sm_90a form: `sm_90a`)."""
    return arch + "a" if form == HOPPER_FORM and arch == "sm_90" else arch


# Errors after which the CUDA context is unusable ("sticky"): every later call would fail too.
STICKY = re.compile(
    r"illegal|misaligned|launch ?fail|unspecified launch|hardware ?stack|\bECC\b|uncorrectable|"
    r"cudaErrorAssert|device-side assert|LaunchTimeout",
    re.IGNORECASE,
)


def is_sticky(e: BaseException) -> bool:
    """Whether an error leaves the CUDA context unusable."""
    return bool(STICKY.search(str(e)))


class GpuLost(Exception):
    """The GPU can no longer be trusted (a kernel hung, or the CUDA context holds a sticky error). `path` is the
    contestant or preflight path that lost it, where known (a later process can go on without it)."""

    def __init__(self, *args: object, path: str | None = None):
        super().__init__(*args)
        self.path = path

    def blame(self, path: str) -> GpuLost:
        """Itself, naming `path` as what lost the GPU unless an inner frame named it first."""
        self.path = self.path or path
        return self


class GpuHung(GpuLost):
    """A wait on the GPU ran past its limit: most likely a deadlocked kernel."""


def blaming(path: str, call: Callable[[], Any]) -> Any:
    """`call()`, a loss of the GPU in it (a GpuLost, or a sticky CUDA error) blamed on `path` unless something inside
    named its own."""
    try:
        return call()
    except GpuLost as e:
        raise e.blame(path) from None
    except Exception as e:
        if is_sticky(e):
            raise GpuLost(f"{path}: {one_line(e)}", path=path) from None
        raise


class BudgetExceeded(Exception):
    """The time budget ran out inside a row."""


class _Product:
    """What a case and its row say of their product C = A·B: `size` (`MxNxK`, a grouped GEMM's `gG:MAXROWSxNxK`, a
    map's `map:KIND:MxN`), `ops` (a grouped GEMM's: over the rows its drawn counts give; a map's: the bytes it reads
    and writes, which its rates count), and `precision size`."""

    __slots__ = ()  # no fields of its own: the dataclasses below keep theirs (and their slots)
    m: int
    n: int
    k: int
    precision: str
    groups: int
    multicast: tuple[int, int]
    sweep: bool
    map: str
    fused: bool
    heads: tuple[int, int]
    causal: bool
    weights: str

    @property
    def size(self) -> str:
        if self.map:
            return f"map:{self.map}:{self.m}x{self.n}"
        if self.heads[0]:  # attention: batch x heads, seq_q x seq_kv x head_dim
            return f"att:{self.heads[0]}x{self.heads[1]}:{self.m}x{self.n}x{self.k}" + (
                ":causal" if self.causal else ""
            )
        head = f"g{self.groups}:" if self.groups > 1 else ""
        if self.multicast != (1, 1):
            head = f"mc{self.multicast[0]}x{self.multicast[1]}:"
        if self.sweep:
            head = "sweep:"
        if self.fused:
            head = "fused:"
        if self.precision in FP8_PRECISIONS:
            head = ("fp8mx:" if self.mx else "fp8bs:" + head) if self.blockscaled else "fp8:"  # (head: gG:)
        if self.weights:
            head = f"w4:{self.weights}:"
        return f"{head}{self.m}x{self.n}x{self.k}"

    @property
    def ops(self) -> int:
        if self.map:
            return map_bytes(self)
        if self.weights:  # a W4A16 row's rates count the weights' bytes, read once (gpucheck/w4rows.py)
            from .w4rows import weight_bytes

            return weight_bytes(self.weights, self.n, self.k)
        if self.heads[0]:  # 4·seq_q·seq_kv·head_dim a head (Q·Kᵀ and P·V), half of it kept by a causal mask
            per_head = 4 * self.m * self.n * self.k // (2 if self.causal else 1)
            return per_head * self.heads[0] * self.heads[1]
        rows = int(grouped_sizes(self.groups, self.m).sum()) if self.groups > 1 else self.m
        return 2 * rows * self.n * self.k

    def __str__(self) -> str:
        return f"{self.precision} {self.size}"


@dataclass(frozen=True, slots=True)
class Case(_Product):
    """One product to check (`groups` > 1: a grouped GEMM of that many groups of at most m rows)."""

    m: int
    n: int
    k: int
    precision: str
    groups: int = 1
    multicast: tuple[int, int] = (1, 1)  # sites of a multicast group (gy, gx): `spatialc.build(multicast=…)`
    sweep: bool = False  # each form at its planner's plan and the plans one change away (gpucheck/sweep.py)
    # The sm_90a form alone, at this block (osh, osw, ibw tiles): the preflight's kernel of that form, at the plan
    # the large rows run (preflight.hopper_case).
    hopper_block: tuple[int, int, int] | None = None
    map: str = ""  # a map of m × n inputs (k 0), by its kind (gpucheck/maps.py, norms.py): `swiglu`, `softmax`, …
    # The GEMM with row and column scales and a residual fused into its epilogue (gpucheck/fused.py), beside the
    # plain GEMM of the same size.
    fused: bool = False
    # Attention (gpucheck/attnrows.py): (batch, heads), m = seq_q, n = seq_kv, k = head_dim; (0, 0) for any other.
    heads: tuple[int, int] = (0, 0)
    causal: bool = False
    blockscaled: bool = False  # an fp8 GEMM of DeepGEMM's block scales (gpucheck/blockscaled.py)
    mx: bool = False  # … of OCP MX's e8m0 scales instead, one per 32 of K (MXFP8: blockscaled too)
    weights: str = ""  # a W4A16 GEMM's 4-bit format (int4, uint4, mxfp4), A and C bf16 (gpucheck/w4rows.py)


def map_bytes(product: Any) -> int:
    """The bytes a map case or row must read and write: each of its kind's inputs once and C once, all m × n in the
    inputs' type, 2 or 4 bytes an element (a norm's kernel reads x once a pass, and its weight's n values, which
    these leave out); LayerNorm's mean and rstd besides, as float32; a row reduction's m values in place of C
    (`Kind.bytes`)."""
    from .maps import kind_of

    return kind_of(product).bytes(product)


def grouped_sizes(groups: int, max_rows: int) -> Any:
    """A grouped row's row counts: uniform in 0..max_rows, the same on every machine for the same shape (numpy's
    PCG64 seeded from the shape)."""
    import numpy as np

    rng = np.random.default_rng(zlib.crc32(f"grouped {groups} {max_rows}".encode()))
    return rng.integers(0, max_rows + 1, groups).astype(np.int32)


def cases_of(sizes: Iterable[str], precisions: Iterable[str]) -> list[Case]:
    """Every size × precision, size-major (so a budget cut drops whole sizes, not one precision); each case once. An
    fp8 size (`fp8:e4m3:4096`) names its own precision, and so may a map's (`map:softmax:4096x4096:fp32`). fp32
    is a map's alone: a GEMM's size skips it, and one left with no other precision is refused (`_gemm_precisions`)."""
    precs = list(precisions)
    for p in precs:
        if p not in RUN_PRECISIONS:
            raise SpatialError(f"unknown precision {p!r}; use {', '.join(RUN_PRECISIONS)}")
    out = []
    from .w4rows import parse_w4

    for s in sizes:
        w4 = parse_w4(s)
        if w4 is not None:  # bf16 activations, whatever the run's list (gpucheck/w4rows.py)
            out.append(Case(*w4[1], "bf16", weights=w4[0]))
            continue
        mapped = parse_map(s)
        if mapped is not None:
            own = [mapped[2]] if mapped[2] else [p for p in precs if p in MAP_PRECISIONS]
            out += [Case(*mapped[1], 0, p, map=mapped[0]) for p in own]
            continue
        att = parse_attention(s)
        if att is not None:
            own = [p for p in _gemm_precisions(s, precs) if p in ATTENTION_PRECISIONS]
            out += [Case(*att[1], p, heads=att[0], causal=att[2]) for p in own]
            continue
        scaled = parse_blockscaled(s)
        if scaled is not None:  # as fp8's, with block scales
            out.append(Case(*scaled[1], scaled[0], groups=scaled[3], blockscaled=True, mx=scaled[2]))
            continue
        fp8 = parse_fp8(s)
        if fp8 is not None:  # its precision is its own (the operands' kind), whatever the run's list
            out.append(Case(*fp8[1], fp8[0]))
            continue
        fused = parse_fused(s)
        if fused is not None:
            out += [Case(*fused, p, fused=True) for p in _gemm_precisions(s, precs) if p in FUSED_PRECISIONS]
            continue
        sweep = parse_sweep(s)
        multicast = parse_multicast(s) if sweep is None else None
        grouped = parse_grouped(s) if multicast is None and sweep is None else None
        gemm = _gemm_precisions(s, precs)
        if sweep is not None:
            out += [Case(*sweep, p, sweep=True) for p in gemm]
        elif multicast is not None:
            out += [Case(*multicast[1], p, 1, multicast[0]) for p in gemm]
        elif grouped is None:
            out += [Case(*parse_size(s), p) for p in gemm]
        else:
            out += [Case(*grouped[1], p, grouped[0]) for p in gemm if p in GROUPED_PRECISIONS]
    return list(dict.fromkeys(out))


def _gemm_precisions(size: str, precs: list[str]) -> list[str]:
    """The run's precisions a GEMM's `size` takes (an attention's and a fused GEMM's too): all but fp32, which
    spatialc refuses for a matmul; a GEMM size that the run gives fp32 alone is refused in words (SpatialError), not
    left without a row unsaid."""
    gemm = [p for p in precs if p in PRECISIONS]
    if not gemm and FP32 in precs:
        raise SpatialError(
            f"size {size!r} is a GEMM's and fp32 is the precision of programs with no matmul (a map:KIND:MxN row's);"
            f" give the GEMM sizes {', '.join(PRECISIONS)} with --precisions, or leave them out"
        )
    return gemm


def preflight_case(cases: list[Case]) -> Case:
    """The small product the preflight launches: 64³ in the first precision of the run (but fp8: its rows check
    their own kernels, whose epilogue the preflight's plain product does not have)."""
    return Case(64, 64, 64, next((c.precision for c in cases if c.precision in PRECISIONS), "fp16"))


class Deadline:
    """A point on a clock; rows ask how long is left."""

    def __init__(self, at: float, clock: Callable[[], float]):
        self.at, self.clock = at, clock

    def left(self) -> float:
        return self.at - self.clock()

    def passed(self) -> bool:
        return self.left() <= 0


def one_line(e: BaseException) -> str:
    """An exception as one short line: its type and first line."""
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else ""
    name = type(e).__name__
    return (f"{name}: {text}" if text and not isinstance(e, SpatialError) else text or name)[:240]


# ---- what a row finds ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timing:
    """The device time of one launch: the median over `reps` batches of `per_batch` launches, each batch between
    one pair of events (`method` "events") or replayed as one CUDA graph (`method` "graph")."""

    median_s: float
    reps: int
    per_batch: int
    min_s: float
    max_s: float
    method: str = "events"
    host_s: float | None = None  # host time to issue one launch (events): as long as the device's, it is the limit
    note: str = ""  # why the graph the caller asked for was not used

    @property
    def launch_bound(self) -> bool:
        """The host issued launches no faster than the device ran them: the time is the host's, not the kernel's."""
        return self.method == "events" and self.host_s is not None and self.host_s >= 0.8 * self.median_s


def kernel_path(case: Case, name: str) -> str:
    """What a lost GPU is blamed on when `name`'s kernel of `case` loses it (restart.py): the contestant, or, in a
    multicast, grouped, map or norm row, the contestant in that kind of row — a kernel of its own (clusters, row
    counts, no matmul, row reductions), whose loss says nothing of the same form elsewhere. A form's cluster kernels
    are blamed together, whatever their group's shape: one handshake bug hangs 2×1 and 2×2 alike, and each hang
    would cost a restart; so are the norms' kernels, softmax's and RMSNorm's, which reduce rows alike."""
    if case.multicast != (1, 1):
        return f"{name} (multicast)"
    if case.groups > 1:
        return f"{name} (grouped)"
    if case.map:  # an elementwise map's kernels together, a norm's (their row reductions, shuffles) together
        from .maps import kind_of

        return f"{name} ({kind_of(case).family})"
    if case.fused:  # an epilogue that reads a tensor beside C: a kernel of its own
        return f"{name} (fused)"
    if case.heads[0]:  # attention: a kernel of its own (two matmuls, an online softmax)
        return f"{name} (attention)"
    if case.precision in FP8_PRECISIONS:  # 8-bit float operands: their own loads and MMAs
        return f"{name} (fp8)"
    if case.weights:  # 4-bit weights dequantised in registers: a kernel of its own
        return f"{name} (w4)"
    return name


def spatialc_name(form: str) -> str:
    """The contestant, preflight path and kernel that run spatialc's kernel in `form` (`spatialc general`)."""
    return f"spatialc {form}"


@dataclass
class Contestant:
    """One way to compute a row's product — one of spatialc's kernels or a library's — timed end to end and kernel
    only (None: not timed; `note` says why). A spatialc kernel also carries its own poisoned output's `check` and its
    `facts`: launch, budget (threads, blocks_per_sm, dyn_smem, regs_est), C's element type (`c_elem`), the sites it
    ran and, once nvcc compiled it, ptxas's (registers, spill_stores, spill_loads, static_smem, stack); `ptxas` says
    why those are missing, `cubin` where the cubin came from."""

    name: str
    family: str  # spatialc | cublas | triton
    end_to_end: Timing | None = None
    kernel: Timing | None = None
    max_abs: float | None = None
    ok: bool | None = None  # its result agreed with the reference
    detail: str = ""  # what each timing holds (layouts, padding, conversions)
    note: str = ""  # why it was not timed, or what went wrong
    check: Check | None = None  # a spatialc kernel's own (poisoned) output against the reference
    facts: dict[str, Any] = field(default_factory=dict)

    def timing(self, way: str) -> Timing | None:
        return self.end_to_end if way == "end_to_end" else self.kernel


# How the report and the log say a preflight probe's `ok`.
PROBE_RESULT = {True: "ok", False: "unavailable", None: "not tried"}
KEPT_WRONG = "wrong, kept"  # … and a spatialc kernel's that ran but computed a wrong C (`Probe.marked`)


def probe_result(ok: bool | None, marked: bool = False) -> str:
    """A preflight probe's result in a word or two."""
    return KEPT_WRONG if marked else PROBE_RESULT[ok]


@dataclass
class Probe:
    """One check of the preflight: what it tried, whether it worked (None: not tried) and the paths it decides."""

    name: str
    ok: bool | None
    detail: str = ""
    seconds: float = 0.0
    paths: tuple[str, ...] = ()
    # A kernel that ran and computed a wrong C: its paths stay available (each row checks its own C), and its
    # form's kernels carry the note; only a hang or a sticky error leaves a path out.
    marked: bool = False


@dataclass
class Row(_Product):
    """One (precision, m, n, k) of the check (a grouped GEMM's: `groups` of at most m rows)."""

    precision: str
    m: int
    n: int
    k: int
    groups: int = 1
    multicast: tuple[int, int] = (1, 1)
    sweep: bool = False
    status: str = "pending"  # ok | wrong | error | hung | skipped | pending (not reached yet)
    plan: str = ""
    contestants: list[Contestant] = field(default_factory=list)
    note: str = ""
    # What the row's kernels share: the plan's numbers (block, sub_blocks, depth, sites) and the type C was asked
    # in (`out`); each kernel's own are in its contestant's `facts`.
    kernel: dict[str, Any] = field(default_factory=dict)
    map: str = ""  # a map's kind (k 0): its row has contestants of its own (gpucheck/maps.py, norms.py)
    fused: bool = False  # a GEMM with a fused epilogue, the plain GEMM's kernels beside (gpucheck/fused.py)
    heads: tuple[int, int] = (0, 0)  # attention's (batch, heads) (gpucheck/attnrows.py)
    causal: bool = False
    blockscaled: bool = False  # DeepGEMM's block scales (gpucheck/blockscaled.py)
    mx: bool = False  # OCP MX's e8m0 scales instead (MXFP8)
    weights: str = ""  # a W4A16 row's 4-bit format (gpucheck/w4rows.py)

    def spatialc(self, form: str) -> Contestant | None:
        """The contestant of spatialc's kernel in `form` (None: the row has none)."""
        return next((c for c in self.contestants if c.name == spatialc_name(form)), None)


def row_of(case: Case, status: str, note: str = "", **facts: Any) -> Row:
    """A row with nothing measured (pending, skipped or failed, and why), or only the `facts` given (plan, …)."""
    return Row(
        case.precision,
        case.m,
        case.n,
        case.k,
        case.groups,
        case.multicast,
        case.sweep,
        status,
        note=note,
        map=case.map,
        fused=case.fused,
        heads=case.heads,
        causal=case.causal,
        blockscaled=case.blockscaled,
        mx=case.mx,
        weights=case.weights,
        **facts,
    )

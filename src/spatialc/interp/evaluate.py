"""The reference interpreter (the oracle): runs every engine of every site with real flow control.

`evaluate(program, inputs)` loads the inputs into tiled storage (DESIGN §2), compiles each distinct engine
program once into a Python generator (`codegen.py`), then runs the engines round-robin, each until it blocks,
until all have finished. A full round in which no engine moved is a deadlock: `DeadlockError` names every blocked
engine, its op and why it waits. Pages hold values, not copies; the arithmetic is deferred and batched into BLAS
calls (`values.py`) and is exact as `numerics.py` states. `trace=True` also records a `Trace` (`trace.py`).

Before anything is allocated, `check_memory` estimates the bytes the run takes (`memory_ledger`) and refuses a
program past `max_bytes` (2 GiB unless told) or this machine's memory, with the figure and the way out. A `Sample`
runs every op of the program but computes only some rows of C: the row operand (A) is given as just those rows,
its other rows are zeros that no product reads, and C's sampled rows come back — exactly what the whole run gives
them (a row of C depends on that row of A alone).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DeadlockError
from ..inputs import TensorSpec, check_inputs, check_row_counts, row_limits, specs_of
from ..ir.ids import TensorId
from ..ir.names import names_fault
from ..ir.nodes import FP8, DType, SpatialProgram, Tensor, TensorRole
from ..ir.ops import Compute, Const, Loop, PackAcc, ReadTiles, walk
from ..numerics.rounding import output_values
from .errors import EvalError, NotReady, TooLarge
from .machine import Machine, written_tensors
from .state import EngineState
from .support import why
from .trace import Trace
from .values import CHUNK_ELEMS, HULL_MAX_ELEMS, NARROW, PENDING_ELEMS, Store, adoptable, store_dtype

__all__ = ["Sample", "Trace", "evaluate"]

DEADLOCK_LINES = 12  # blocked engines a DeadlockError message spells out
MAX_BYTES = 2**31  # what an evaluation may take unless told otherwise: a laptop's share, not a server's
# An input as check_inputs returns it, at most: int8 as given, fp16 / bf16 / e4m3 / e5m2 / float32 values as float32
CHECKED_BYTES = {DType.INT8: 1, DType.FP16: 4, DType.BF16: 4, DType.FLOAT32: 4, DType.E4M3: 4, DType.E5M2: 4}
TRACE_OP_BYTES = 200  # a traced op's span and ring events, about (Python objects)
# The ops the interpreter runs at most (loop iterations counted as ops): a 32768³ GEMM's default plan runs about
# 2.2·10⁸; a loop of 2³¹ no-ops, which verifies in milliseconds, would run for minutes.
MAX_STEPS = 1 << 28
MAX_RING_SLOTS = 1 << 24  # page slots of all the rings of all sites the interpreter keeps (a list entry each)


@dataclass(frozen=True, slots=True)
class Sample:
    """Only `rows` of C are computed (within each group of a grouped GEMM), in that order: the tensors `given`
    (the matmul's row operand, A) come as just those rows, and C comes back as just those rows."""

    rows: tuple[int, ...]
    given: tuple[str, ...]


def evaluate(
    program: SpatialProgram,
    inputs: Mapping[str, Any],
    *,
    trace: bool = False,
    sample: Sample | None = None,
    max_bytes: int | None = None,
) -> np.ndarray | tuple[np.ndarray, Trace]:
    """The output tensor (logical shape, its element type) of a placed, scheduled program — a dict name → array
    where it has several (`result`); with `trace`, also the Trace of the run; with a `sample`, only the sampled rows
    of C. TooLarge, before anything is allocated, where the run would take more than `max_bytes` (default MAX_BYTES)
    or this machine's memory."""
    _check_ready(program)
    check_memory(program, max_bytes, sample, trace, inputs)
    # A run makes tens of thousands of short-lived objects (pages, accumulator lists) and no cycles among them:
    # the cyclic collector would only re-scan them, at ~20% of the run time. Reference counting frees them.
    collecting = gc.isenabled()
    gc.disable()
    try:
        # NaN and ±inf flow through as IEEE arithmetic says (check_inputs says so once, in spatialc's words); numpy's
        # own RuntimeWarnings would name a line inside the interpreter, once for every op that meets one.
        with np.errstate(over="ignore", invalid="ignore"):
            stores, params = load_inputs(program, inputs, sample)
            m = Machine(program, stores, params, trace)
            run(m.engines(), m)
            outs = {t.id for t in program.tensors if t.role == TensorRole.OUTPUT}
            for tid, store in stores.items():
                if tid not in outs:  # (result writes each output's pending pages itself)
                    store.flush()
            out = result(program, stores, sample)
        return (out, m.trace()) if trace else out
    finally:
        if collecting:
            gc.enable()


def _check_ready(p: SpatialProgram) -> None:
    missing = [what for what, v in (("a placement", p.placement), ("a schedule", p.schedule)) if v is None]
    if missing:
        raise NotReady(
            f"program {p.name} has no {' and no '.join(w[2:] for w in missing)}: the interpreter runs"
            f" placed and scheduled programs (spatialc.build)"
        )
    if p.output_tensor() is None:
        raise NotReady(f"program {p.name} has no output tensor")
    fault = names_fault(p)  # inputs bind by name: two tensors of one name would read one array (ir/names.py)
    if fault is not None:
        raise EvalError(fault)


def load_inputs(
    p: SpatialProgram, inputs: Mapping[str, Any], sample: Sample | None = None
) -> tuple[dict[TensorId, Store], dict]:
    """Tiled, zero-padded storage for every tensor, the inputs and parameters filled from `inputs` (a sampled
    tensor's rows where they lie in it; its other tile rows left zero and not live)."""
    values = check_inputs(p.name, _specs(p, sample), inputs)
    check_row_counts(row_limits(p), values)
    written = written_tensors(p)
    stores, params = {}, {}
    for t in p.tensors:
        if t.tiles[0] * p.tile.rows < t.elems[0] or t.tiles[1] * p.tile.cols < t.elems[1]:
            raise EvalError(
                f"tensor {t.name}: {t.elems[0]}x{t.elems[1]} elements do not fit its"
                f" {t.tiles[0]}x{t.tiles[1]} grid of {p.tile.rows}x{p.tile.cols} tiles"
            )
        store = Store(t, p.tile.rows, p.tile.cols, t.id in written)
        if t.name in values:
            rows = _rows(t, sample)
            _fill(store, t, values[t.name], rows, p.tile.rows)
            if t.role != TensorRole.INPUT:  # row counts and trip counts: read by the engines, never sampled
                params[t.id] = values[t.name].reshape(-1)
        stores[t.id] = store
    return stores, params


def _rows(t: Tensor, sample: Sample | None) -> np.ndarray | None:
    """The rows a sampled tensor is given as, or None for all of them."""
    return np.asarray(sample.rows, dtype=np.int64) if sample is not None and t.name in sample.given else None


def _specs(p: SpatialProgram, sample: Sample | None) -> list[TensorSpec]:
    """What each input takes: a sampled one, just its sampled rows (in each group)."""
    specs = specs_of(p)
    if sample is None:
        return specs
    unknown = sorted(set(sample.given) - {s.name for s in specs if s.role == TensorRole.INPUT.value})
    if unknown:
        raise EvalError(f"a sample gives rows of {', '.join(unknown)}, which {p.name} has no input tensor named")
    rows = sample.rows
    for s in specs:
        if s.name in sample.given and (any(not 0 <= r < s.elems[0] for r in rows) or len(set(rows)) != len(rows)):
            raise EvalError(f"a sample's rows are distinct rows of {s.name}, in 0..{s.elems[0] - 1}; got {rows[:8]}")
    return [
        TensorSpec(s.name, s.role, (len(rows), s.elems[1]), s.dtype, s.groups) if s.name in sample.given else s
        for s in specs
    ]


def _fill(store: Store, t: Tensor, given: np.ndarray, rows: np.ndarray | None, tr: int) -> None:
    """Each group's rows of `given` into their padded place in the store; given only `rows`, only their tile rows
    are live (the others stay zero, and products of them are skipped)."""
    if rows is None and store.adopt(given):
        return
    rows_of = np.arange(t.elems[0]) if rows is None else rows
    given = given.reshape(t.groups, len(rows_of), t.elems[1])
    step = t.group_tiles[0] * tr  # a grouped tensor's groups, each padded, one after another
    for g in range(t.groups):
        if rows is None:
            store.mat[g * step : g * step + t.elems[0], : t.elems[1]] = given[g]
        else:
            store.mat[g * step + rows_of, : t.elems[1]] = given[g]
    if rows is not None:
        live = np.zeros(t.tiles[0], dtype=bool)
        groups = np.arange(t.groups)[:, None] * step
        live[((groups + rows_of[None, :]) // tr).reshape(-1)] = True
        store.live = live


def memory_ledger(
    p: SpatialProgram, sample: Sample | None = None, trace: bool = False, inputs: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """What evaluating `p` takes, in bytes, by what takes it — an upper bound found without allocating: the stores
    (a tensor nothing writes in its narrow type, a sampled one only its sampled tile rows), the checked copies of
    inputs (none for an array of the narrow type already; an inexact float32 array for a bf16 tensor takes one more),
    the writes a store holds before applying them, the pages the rings may hold, the matmuls' float64 panels and
    C as returned."""
    t2 = p.tile.rows * p.tile.cols
    written = written_tensors(p) if p.schedule is not None else set()
    given_arrays = inputs if isinstance(inputs, Mapping) else {}  # not a mapping: check_inputs will say so
    ledger: dict[str, int] = {}
    for t in p.tensors:
        item = np.dtype(store_dtype(t, t.id in written)).itemsize
        rows_t = max(t.tiles[0], 0)
        if sample is not None and t.name in sample.given:
            rows_t = min(rows_t, t.groups * len(sample.rows))  # a sampled row's tile row, at most one each
        sampled = sample is not None and t.name in sample.given
        if not sampled and adoptable(t, p.tile.rows, p.tile.cols, t.id in written, given_arrays.get(t.name)):
            # The array the checks hand back (the caller's, or its rounded copy, counted below) is the store itself
            # (Store.adopt).
            ledger[f"{t.name}'s store"] = 0
        else:
            ledger[f"{t.name}'s store"] = rows_t * max(t.tiles[1], 0) * t2 * item
        if t.role in (TensorRole.INPUT, TensorRole.PARAMETER):
            given = len(sample.rows) * t.groups if sample is not None and t.name in sample.given else t.elems[0]
            if not _narrow_already(t, given_arrays.get(t.name)):
                ledger[f"{t.name} as checked"] = given * t.elems[1] * CHECKED_BYTES.get(t.dtype, 8)
        if t.id in written:
            ledger[f"{t.name}'s pending writes"] = min(max(t.tiles[0], 0) * max(t.tiles[1], 0) * t2, PENDING_ELEMS) * 8
    out = p.output_tensor()
    c_elems = out.groups * out.elems[0] * out.elems[1] if out is not None else 0
    if sample is not None and out is not None:
        c_elems = out.groups * len(sample.rows) * out.elems[1]
    ledger["C as returned"] = c_elems * 8
    ledger["ring pages"] = computed_page_elems(p, written) * 8
    ledger["matmul panels"] = (min(HULL_MAX_ELEMS, max(c_elems, 1)) + 3 * min(CHUNK_ELEMS, _operand_elems(p))) * 8
    if trace:
        ledger["trace"] = min(run_steps(p), MAX_STEPS) * TRACE_OP_BYTES
    return ledger


def _narrow_already(t: Tensor, given: Any) -> bool:
    """Whether check_inputs surely returns `given` itself: an input array of its tensor's narrow type — but not a
    float32 array for a bf16 (or 8-bit float) tensor, which comes back rounded (a copy) unless it holds values of
    that type, which is not known before it is read."""
    narrow = t.role == TensorRole.INPUT and t.dtype in NARROW and getattr(given, "dtype", None) == NARROW[t.dtype]
    return narrow and t.dtype != DType.BF16 and t.dtype not in FP8


def computed_page_elems(p: SpatialProgram, written: set[TensorId]) -> int:
    """The elements the pages of every site's rings may hold as arrays: every ring's, but those that a ReadTiles of
    a tensor nothing writes fills (their pages refer to the tensor's tiles)."""
    if p.schedule is None:
        return 0
    by_ref, held = set(), set()
    for prog in {id(q.ops): q for q in p.schedule.programs}.values():
        for op in walk(prog.ops):
            if isinstance(op, ReadTiles) and op.tensor not in written and op.rows_from is None:
                by_ref.add(p.buffer(op.into).ring)
            elif isinstance(op, ReadTiles | Compute | PackAcc):
                held.update(p.buffer(b).ring for b in _filled(op))
    kinds = {b.id: b.kind for b in p.buffers}
    sites = len({q.site for q in p.schedule.programs})
    t2 = p.tile.rows * p.tile.cols
    pages = sum(
        min(getattr(kinds.get(r), "depth_pages", 0), MAX_RING_SLOTS) * getattr(kinds.get(r), "page_tiles", 0)
        for r in held - (by_ref - held)
    )
    return min(sites * pages, MAX_RING_SLOTS * max(_page_tiles(p), 1)) * t2


def _operand_elems(p: SpatialProgram) -> int:
    return max(sum(t.elems[0] * t.elems[1] * t.groups for t in p.tensors), 1)


def _filled(op: Any) -> tuple:
    """The buffers an op fills with pages."""
    if isinstance(op, ReadTiles):
        return (op.into,)
    return tuple(op.outs) if isinstance(op, Compute) else (op.to,)


def _page_tiles(p: SpatialProgram) -> int:
    return max((getattr(b.kind, "page_tiles", 0) for b in p.buffers), default=0)


def store_bytes(p: SpatialProgram) -> int:
    """Bytes of the interpreter's stores: every tensor's padded tiles, each in its store's type."""
    return sum(v for k, v in memory_ledger(p).items() if k.endswith("'s store"))


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the platform does not say."""
    try:
        size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or a name this platform lacks
        return None
    return size if size > 0 else None  # sysconf says -1 for "indeterminate"


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def memory_refusal(p: SpatialProgram, need: dict[str, int], limit: tuple[int, str], whose: str) -> str | None:
    """Why `need` (a memory ledger) does not fit the `limit` (bytes, and whose limit it is), the three largest items
    named; None if it fits."""
    total = sum(need.values())
    if total <= limit[0]:
        return None
    top = ", ".join(f"{k} {gib(v)}" for k, v in sorted(need.items(), key=lambda kv: -kv[1])[:3])
    return f"{whose} {p.name} needs {total} bytes ({gib(total)}: {top}); {limit[1]} {limit[0]} bytes ({gib(limit[0])})"


def memory_limit(max_bytes: int | None) -> tuple[int, str]:
    """The bytes an evaluation may take, and whose limit that is, in words."""
    limit, why = (MAX_BYTES, "the interpreter takes at most") if max_bytes is None else (int(max_bytes), "max_bytes is")
    have = physical_memory()
    if have is not None and have < limit:
        return have, "this machine has"
    return limit, why


def check_memory(
    p: SpatialProgram,
    max_bytes: int | None = None,
    sample: Sample | None = None,
    trace: bool = False,
    inputs: Mapping[str, Any] | None = None,
) -> None:
    """Refuse, before allocating or running, a program whose evaluation would take more than `max_bytes` (default
    MAX_BYTES) or this machine's memory (numpy would reserve the stores lazily and the run would swap or be killed
    long after it started, instead of saying so now), whose rings hold more page slots than MAX_RING_SLOTS, or that
    would run more than MAX_STEPS ops."""
    refused = memory_refusal(p, memory_ledger(p, sample, trace, inputs), memory_limit(max_bytes), "evaluating")
    if refused:
        raise TooLarge(
            f"{refused}: evaluate a smaller size, or a sample of C's rows (spatialc.evaluate(p, inputs, rows=...)),"
            " or pass a larger max_bytes where this machine has the memory"
        )
    if ring_slots(p) > MAX_RING_SLOTS:
        raise TooLarge(
            f"evaluating {p.name} keeps more than {MAX_RING_SLOTS} ring page slots (each ring's depth, on each site);"
            " the interpreter keeps at most that many"
        )
    if run_steps(p) > MAX_STEPS:
        raise TooLarge(
            f"evaluating {p.name} runs more than {MAX_STEPS:.3g} ops (loop trips included), the most the interpreter"
            " runs (a 32768³ GEMM runs about 2.2e+08)"
        )


def run_steps(p: SpatialProgram) -> int:
    """The ops every engine of every site runs, each loop trip counted as one more (a data-dependent count at its
    bound), or MAX_STEPS + 1 where more: an upper bound of the interpreter's work, found without running it."""
    cap = MAX_STEPS + 1

    def steps(ops) -> int:
        total = 0
        for op in ops:
            if isinstance(op, Loop) and not op.body:
                total += 1  # an empty loop is not spun (codegen.py): it changes nothing
            elif isinstance(op, Loop):
                n = op.count.n if isinstance(op.count, Const) else op.count.bound
                total += min(max(n, 0), cap) * (1 + steps(op.body))
            else:
                total += 1
            if total >= cap:
                return cap
        return total

    return min(sum(steps(prog.ops) for prog in p.schedule.programs), cap) if p.schedule is not None else 0


def ring_slots(p: SpatialProgram) -> int:
    """The page slots of the rings the interpreter may make (one ring per site and ring template, as
    `Machine.ring`: every template's depth on every site), or MAX_RING_SLOTS + 1 where more."""
    if p.schedule is None:
        return 0
    cap = MAX_RING_SLOTS + 1
    kinds = {b.id: b.kind for b in p.buffers}
    depth = {b.ring: getattr(kinds.get(b.ring, b.kind), "depth_pages", 0) for b in p.buffers}
    sites = {prog.site for prog in p.schedule.programs}
    return min(len(sites) * sum(min(max(d, 0), cap) for d in depth.values()), cap)


def result(
    p: SpatialProgram, stores: dict[TensorId, Store], sample: Sample | None = None
) -> np.ndarray | dict[str, np.ndarray]:
    """The output tensor's logical part, in its element type (a sample's rows of it, in their order); a program of
    several outputs (LayerNorm's out, mean and rstd), each's by name. Each output's pending writes are applied first
    — a float32 output's computed pages straight into a float32 matrix where they may be."""
    outs = [t for t in p.tensors if t.role == TensorRole.OUTPUT]
    if len(outs) > 1:
        return {t.name: _result_of(p, t, stores, sample) for t in outs}
    out = p.output_tensor()
    assert out is not None
    return _result_of(p, out, stores, sample)


def _result_of(p: SpatialProgram, out: Tensor, stores: dict[TensorId, Store], sample: Sample | None) -> np.ndarray:
    store = stores[out.id]
    if sample is None and out.groups == 1 and out.dtype == DType.FLOAT32:
        narrow = store.narrow_result()
        if narrow is not None:
            part = narrow[: out.elems[0], : out.elems[1]]
            return part if part.shape == narrow.shape else np.ascontiguousarray(part)
    store.flush()
    rows = slice(0, out.elems[0]) if sample is None else np.asarray(sample.rows, dtype=np.int64)
    cols = out.elems[1]
    mat = stores[out.id].mat
    if out.groups > 1:  # (groups, rows, cols): each group's rows from its own padded run
        step = out.group_tiles[0] * p.tile.rows
        mat = mat.reshape(out.groups, step, mat.shape[1])
        return output_values(out.name, mat[:, rows, :cols], out.dtype)
    return output_values(out.name, mat[rows, :cols], out.dtype)


def run(engines: list[tuple[EngineState, Iterator[int | None]]], m: Machine) -> None:
    """Resume each engine until it blocks, round after round, until all finish; a round without progress is a
    deadlock (nothing that could unblock an engine changed in it)."""
    live = engines
    while live:
        moved = False
        still = []
        for eng, gen in live:
            try:
                blocked = next(gen)
            except StopIteration:
                moved = True
                continue
            if blocked is not None:  # blocked on a new op: the engine ran up to it
                eng.blocked, moved = blocked, True
            still.append((eng, gen))
        if not moved:
            raise deadlock(m, [eng for eng, _ in still])
        live = still


def deadlock(m: Machine, engines: list[EngineState]) -> DeadlockError:
    """The error naming each blocked engine, its op and why it cannot go on."""
    blocked: list[tuple[int, str, str]] = []
    lines: list[str] = []
    for eng in engines:
        assert eng.blocked is not None
        text = eng.code.texts[eng.blocked]
        blocked.append((int(eng.site), eng.engine.value, text))
        if len(lines) < DEADLOCK_LINES:
            lines.append(f"  {eng.label}: {text} — {why(eng, eng.blocked)}")
    if len(engines) > DEADLOCK_LINES:
        lines.append(f"  ... and {len(engines) - DEADLOCK_LINES} more (DeadlockError.blocked lists them all)")
    return DeadlockError(
        f"deadlock in {m.p.name}: {len(engines)} engines can never go on\n" + "\n".join(lines), tuple(blocked)
    )

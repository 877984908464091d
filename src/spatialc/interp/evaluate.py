"""The reference interpreter (the oracle): runs every engine of every site with real flow control.

`evaluate(program, inputs)` loads the inputs into tiled storage (DESIGN §2), compiles each distinct engine
program once into a Python generator (`codegen.py`), then runs the engines round-robin, each until it blocks,
until all have finished. A full round in which no engine moved is a deadlock: `DeadlockError` names every blocked
engine, its op and why it waits. Pages hold values, not copies; the arithmetic is deferred and batched into BLAS
calls (`values.py`) and is exact as `numerics.py` states. `trace=True` also records a `Trace` (`trace.py`).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import DeadlockError
from ..inputs import check_inputs, check_row_counts, row_limits, specs_of
from ..ir.ids import TensorId
from ..ir.names import names_fault
from ..ir.nodes import SpatialProgram
from ..ir.ops import Const, Loop
from .errors import EvalError, NotReady, TooLarge
from .machine import Machine, written_tensors
from .numerics import output_values
from .state import EngineState
from .support import why
from .trace import Trace
from .values import Store

__all__ = ["Trace", "evaluate"]

DEADLOCK_LINES = 12  # blocked engines a DeadlockError message spells out
STORE_ITEM_BYTES = 8  # every store is float64
# The ops the interpreter runs at most (loop iterations counted as ops): a 32768³ GEMM's default plan runs about
# 2.2·10⁸; a loop of 2³¹ no-ops, which verifies in milliseconds, would run for minutes.
MAX_STEPS = 1 << 28
MAX_RING_SLOTS = 1 << 24  # page slots of all the rings of all sites the interpreter keeps (a list entry each)


def evaluate(
    program: SpatialProgram, inputs: Mapping[str, Any], *, trace: bool = False
) -> np.ndarray | tuple[np.ndarray, Trace]:
    """The output tensor (logical shape, its element type) of a placed, scheduled program; with `trace`, also
    the Trace of the run."""
    _check_ready(program)
    # A run makes tens of thousands of short-lived objects (pages, accumulator lists) and no cycles among them:
    # the cyclic collector would only re-scan them, at ~20% of the run time. Reference counting frees them.
    collecting = gc.isenabled()
    gc.disable()
    try:
        stores, params = load_inputs(program, inputs)
        m = Machine(program, stores, params, trace)
        run(m.engines(), m)
        for store in stores.values():
            store.flush()
        out = result(program, stores)
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


def load_inputs(p: SpatialProgram, inputs: Mapping[str, Any]) -> tuple[dict[TensorId, Store], dict]:
    """Tiled, zero-padded storage for every tensor, the inputs and parameters filled from `inputs`."""
    check_memory(p)
    values = check_inputs(p.name, specs_of(p), inputs)
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
            given = values[t.name].reshape(t.groups, *t.elems)
            step = t.group_tiles[0] * p.tile.rows  # a grouped tensor's groups, each padded, one after another
            for g in range(t.groups):
                store.mat[g * step : g * step + t.elems[0], : t.elems[1]] = given[g]
            params[t.id] = values[t.name].reshape(-1)
        stores[t.id] = store
    return stores, params


def store_bytes(p: SpatialProgram) -> int:
    """Bytes of the interpreter's stores: every tensor's padded tiles, in float64."""
    tile = p.tile.rows * p.tile.cols * STORE_ITEM_BYTES
    return sum(max(t.tiles[0], 0) * max(t.tiles[1], 0) * tile for t in p.tensors)


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the platform does not say."""
    try:
        size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or a name this platform lacks
        return None
    return size if size > 0 else None  # sysconf says -1 for "indeterminate"


def check_memory(p: SpatialProgram) -> None:
    """Refuse, before allocating or running, a program whose stores exceed physical memory (numpy would reserve them
    lazily and the run would swap or be killed long after it started, instead of saying so now), whose rings hold
    more page slots than MAX_RING_SLOTS, or that would run more than MAX_STEPS ops."""
    need, have = store_bytes(p), physical_memory()
    if have is not None and need > have:
        raise TooLarge(
            f"evaluating {p.name} needs {need} bytes ({need / 2**30:.1f} GiB) for its tensors' float64 tiles;"
            f" this machine has {have} bytes ({have / 2**30:.1f} GiB) of memory"
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


def result(p: SpatialProgram, stores: dict[TensorId, Store]) -> np.ndarray:
    """The output tensor's logical part, in its element type."""
    out = p.output_tensor()
    assert out is not None
    rows, cols = out.elems
    mat = stores[out.id].mat
    if out.groups > 1:  # (groups, rows, cols): each group's rows from its own padded run
        step = out.group_tiles[0] * p.tile.rows
        mat = mat.reshape(out.groups, step, mat.shape[1])
        return output_values(out.name, mat[:, :rows, :cols], out.dtype)
    return output_values(out.name, mat[:rows, :cols], out.dtype)


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

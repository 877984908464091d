"""The reference interpreter (the oracle): runs every engine of every site with real flow control.

`evaluate(program, inputs)` loads the inputs into tiled storage (DESIGN §2), compiles each distinct engine
program once into a Python generator (`codegen.py`), then runs the engines round-robin, each until it blocks,
until all have finished. A full round in which no engine moved is a deadlock: `DeadlockError` names every blocked
engine, its op and why it waits. Pages hold values, not copies; the arithmetic is deferred and batched into BLAS
calls (`values.py`) and is exact as `numerics.py` states. `trace=True` also records a `Trace` (`trace.py`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import DeadlockError
from ..ir.ids import TensorId
from ..ir.nodes import SpatialProgram, TensorRole
from .errors import EvalError, InputError, NotReady
from .machine import Machine, written_tensors
from .numerics import operand_values, output_values
from .state import EngineState
from .support import why
from .trace import Trace
from .values import Store

__all__ = ["Trace", "evaluate"]

DEADLOCK_LINES = 12  # blocked engines a DeadlockError message spells out


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


def load_inputs(p: SpatialProgram, inputs: Mapping[str, Any]) -> tuple[dict[TensorId, Store], dict]:
    """Tiled, zero-padded storage for every tensor, the inputs and parameters filled from `inputs`."""
    if not isinstance(inputs, Mapping):
        raise InputError(
            f"inputs are a mapping of tensor name to array (e.g. {{'A': a, 'B': b}}), not a {type(inputs).__name__}"
        )
    wanted = {t.name: t for t in p.tensors if t.role in (TensorRole.INPUT, TensorRole.PARAMETER)}
    unknown = sorted(set(inputs) - set(wanted))
    if unknown:
        raise InputError(
            f"{p.name} has no input or parameter tensor named {', '.join(unknown)}"
            f" (it takes {', '.join(sorted(wanted))})"
        )
    missing = sorted(set(wanted) - set(inputs))
    if missing:
        raise InputError(f"{p.name} needs tensor {', '.join(missing)}, which is not among the inputs")
    written = written_tensors(p)
    stores, params = {}, {}
    for t in p.tensors:
        if t.tiles[0] * p.tile.rows < t.elems[0] or t.tiles[1] * p.tile.cols < t.elems[1]:
            raise EvalError(
                f"tensor {t.name}: {t.elems[0]}x{t.elems[1]} elements do not fit its"
                f" {t.tiles[0]}x{t.tiles[1]} grid of {p.tile.rows}x{p.tile.cols} tiles"
            )
        store = Store(t, p.tile.rows, p.tile.cols, t.id in written)
        if t.name in wanted:
            given = np.asarray(inputs[t.name])
            if given.ndim == 1 and t.elems[0] == 1:  # a row vector (a bias) may be given as a plain vector
                given = given.reshape(1, -1)
            if given.shape != tuple(t.elems):
                raise InputError(f"tensor {t.name}: expected shape {tuple(t.elems)}, got {given.shape}")
            values = operand_values(t.name, given, t.dtype)
            store.mat[: t.elems[0], : t.elems[1]] = values
            params[t.id] = values.reshape(-1)
        stores[t.id] = store
    return stores, params


def result(p: SpatialProgram, stores: dict[TensorId, Store]) -> np.ndarray:
    """The output tensor's logical part, in its element type."""
    out = p.output_tensor()
    assert out is not None
    rows, cols = out.elems
    return output_values(out.name, stores[out.id].mat[:rows, :cols], out.dtype)


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

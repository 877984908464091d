"""spatialc.lang — spatial programs written in Python: tensors, rings, stages, and engines as functions.

    import spatialc
    from spatialc import lang

    @lang.program(target="sm_90", precision="bf16")
    def my_gemm(p: lang.Builder, m: int = 64, n: int = 64, k: int = 64):
        A = p.input("A", m, k)
        ...                                              # B, C, rings, stages, plan, placement
        @p.reader
        def read(e: lang.Engine):
            for item in e.items():
                for kk in e.range(k // 64, "k"):
                    with a_ring.reserve() as page:
                        page.read(A, 2 * (k // 16) * item.y + 4 * kk, 2, 4)
        ...                                              # the compute engine and the writer

    program = my_gemm(k=128)       # traced, then verified: a SpatialProgram like spatialc.build's

Beside matmuls: maps (`p.map(name, lambda x, m: ew.exp(x - m), rings, out)`, applied by `e.map`), row reductions
(`p.reduce(name, "max", ring, out)`, folded into an accumulator by `acc.reduce`), as examples/lang_softmax.py writes
a softmax, and column reductions (`p.col_reduce(name, "sum", ring, out)`, folded by `acc.reduce(stage, page, row=…)`).

The program is the IR's (docs/design.md): everything `spatialc.verify`, `evaluate`, `lower`, `emulate` and `run`
do applies to it unchanged. An error `verify` finds — a deadlock, an overrun, a page read that nothing filled, a
result other than the stages declare — comes back as the same error with the user's file and line of each op it
names (`error.lines`); a program the language cannot trace is a `LangError` at the line that made it. The
interpreter's deadlocks come back so too, from `.trace(...).evaluate(inputs)` (the program run as traced), and the
emulation's hangs from `.trace(...).emulate(inputs)`.
docs/tutorial.md walks through writing one.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..arguments import DEFAULT_PRECISION
from ..errors import SpatialError
from ..ir.ids import loop_var_name
from ..ir.nodes import SpatialProgram
from ..ir.ops import ChoreoOp, Reserve, Wait
from ..ir.printer import op_text
from ..target import WARP
from .builder import Builder, checked, lazy_body
from .engine import Engine
from .handles import AccRef, Affine, GroupRef, Item, Page, RingRef, SemRef, StageRef, TensorRef, named, tracing
from .lines import LangError, in_tracer, located, user_line

__all__ = [
    "AccRef",
    "Affine",
    "Builder",
    "Engine",
    "GroupRef",
    "Item",
    "LangError",
    "Page",
    "RingRef",
    "SemRef",
    "StageRef",
    "TensorRef",
    "Traced",
    "program",
    "trace",
]


@dataclass(frozen=True)
class Traced:
    """A traced program, not yet verified, and the user's line of each op (by site and engine, in order)."""

    program: SpatialProgram
    lines: dict[tuple[int, str], list[tuple[ChoreoOp, tuple[str, int]]]]
    declared: dict[str, tuple[str, int]]  # the user's line of the plan, the placement, each stage and group
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # "lv8" → the user's name of that loop, "h"

    def located(self, error: SpatialError, blocked: tuple[tuple[int, str, str], ...] = ()) -> Exception:
        """`error` with the user's lines of the ops it names, and the user's names of its loops."""
        return located(error, self.lines, self.program, self.declared, blocked, self.names)

    def verify(self, target: str | None = None) -> SpatialProgram:
        """The program verified, or verify's error with the user's lines of the ops it names."""
        from ..api import verify

        try:
            return verify(self.program, target)
        except SpatialError as e:
            raise self.located(e) from None

    def emulate(self, inputs: dict[str, Any], artifact: Any = None, **kwargs: Any) -> Any:
        """The host emulation's run (`spatialc.emulate`) of `artifact` — by default the program verified and lowered
        (`spatialc.lower`). A hang it reports (every thread waiting on a barrier that cannot complete) comes back
        with the user's line of each op the blocked engines wait in: a ring's full barrier is its consumer's Wait,
        its empty barrier its producer's Reserve."""
        from ..api import emulate, lower
        from ..runtime.emulate import EmulationDeadlock

        art = artifact if artifact is not None else lower(self.verify())
        try:
            return emulate(art, inputs, **kwargs)
        except EmulationDeadlock as e:
            blocked = hung_ops(str(e), self.program, dict(art.budget.engines), self.lines)
            raise self.located(e, blocked) from None

    def evaluate(self, inputs: dict[str, Any], **kwargs: Any) -> Any:
        """The interpreter's run of the program as traced, verified or not (`spatialc.evaluate`): a deadlock it
        meets comes back with the user's line of each blocked engine's op — what running a program verify refuses
        shows."""
        from ..api import evaluate

        try:
            return evaluate(self.program, inputs, **kwargs)
        except SpatialError as e:
            raise self.located(e) from None


HUNG = re.compile(r"(\d+) threads? \(([\d,-]+)\) waits on (full|empty)_(\d+)\[")


def hung_ops(
    report: str, p: SpatialProgram, engines: dict[str, int], lines: dict[tuple[int, str], list]
) -> tuple[tuple[int, str, str], ...]:
    """The ops an emulation hang `report` finds engines blocked in, as (site, engine, op text): the threads waiting
    on a ring's full barrier are its consumer in a Wait of it, those on its empty barrier its producer in a Reserve
    (the general form: each engine on warps of its own, in `engines`' order, a ring's barriers named by its id)."""
    first, owner = 0, []
    for engine, warps in engines.items():
        owner.append((first, first + warps * WARP, engine))
        first += warps * WARP
    found = []
    for match in HUNG.finditer(report):
        tid = int(match[2].split(",")[0].split("-")[0])
        engine = next((e for lo, hi, e in owner if lo <= tid < hi), None)
        kind = Wait if match[3] == "full" else Reserve
        ring = int(match[4])
        for (site, name), ops in lines.items():
            if name != engine:
                continue
            for op, _ in ops:
                if isinstance(op, kind) and int(p.buffer(op.buf).ring) == ring:
                    found.append((site, name, op_text(p, op)))
    return tuple(dict.fromkeys(found))


def _at_user_line(e: Exception) -> Exception:
    """A Python error raised inside this package while it took a value of the user's (a tuple of the wrong length,
    a string where numbers belong) as a LangError at the user's statement; an error of the user's own code as it
    is."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [in_tracer(f.filename) for f in frames]
    if not ours or not ours[-1]:  # raised in the user's own code (the tracer's frame is only outside it)
        return e
    user = next((f for f, mine in zip(reversed(frames), reversed(ours), strict=True) if not mine), None)
    # None: raised by the tracer's own call of the program function (a keyword it does not take): the caller's line
    where = (user.filename, user.lineno or 0) if user is not None else user_line()
    what = str(e).splitlines()[0] if str(e) else type(e).__name__
    return LangError(f"spatialc.lang cannot take a value given here ({type(e).__name__}: {what})", where)


def trace(
    fn: Callable[..., Any], *, name: str | None = None, target: str = "sm_90", precision: str = "bf16", **kwargs: Any
) -> Traced:
    """Run the program function `fn(builder, **kwargs)` and return what it declared and traced, unverified."""
    builder = Builder(name or fn.__name__, target, precision)
    if not_plain := lazy_body(fn):
        raise LangError(f"program function {getattr(fn, '__name__', '?')!r} is {not_plain}", user_line())
    try:
        with tracing(builder):
            fn(builder, **kwargs)
    except SpatialError:
        raise
    except (TypeError, ValueError, ArithmeticError) as e:
        converted = _at_user_line(e)
        if converted is e:
            raise
        raise converted from None
    names = {loop_var_name(v): name for name, v in builder.vars.items() if loop_var_name(v) != name}
    return Traced(builder.program(), builder.lines, builder.declared, names)


def program(*, target: str = "sm_90", precision: str = DEFAULT_PRECISION, name: str | None = None):
    """Decorator: the function becomes one that traces and verifies the program (its keyword arguments are the
    program function's, after the builder) and returns the verified SpatialProgram; `.trace(**kwargs)` gives the
    unverified `Traced` program with its lines."""

    checked(target, precision)  # an unknown target or precision is refused at the decorator's line
    if name is not None:
        named("program", name)  # and a name that is not identifier-like (ir/names.py)

    def wrap(fn: Callable[..., Any]) -> Callable[..., SpatialProgram]:
        @functools.wraps(fn)
        def build(**kwargs: Any) -> SpatialProgram:
            return trace(fn, name=name, target=target, precision=precision, **kwargs).verify()

        build.trace = lambda **kwargs: trace(  # type: ignore[attr-defined]
            fn, name=name, target=target, precision=precision, **kwargs
        )
        return build

    return wrap

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

The program is the IR's (docs/design.md): everything `spatialc.verify`, `evaluate`, `lower`, `emulate` and `run`
do applies to it unchanged. An error `verify` finds — a deadlock, an overrun, a page read that nothing filled, a
result other than the stages declare — comes back as the same error with the user's file and line of each op it
names (`error.lines`); a program the language cannot trace is a `LangError` at the line that made it. The
interpreter's deadlocks come back so too, from `.trace(...).evaluate(inputs)` (the program run as traced).
docs/tutorial.md walks through writing one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import SpatialError
from ..ir.nodes import SpatialProgram
from ..ir.ops import ChoreoOp
from .builder import (
    AccRef,
    Affine,
    Builder,
    Engine,
    GroupRef,
    Item,
    LangError,
    Page,
    RingRef,
    SemRef,
    StageRef,
    TensorRef,
    located,
)

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
    declared: dict[str, tuple[str, int]]  # the user's line of the plan and of the placement

    def verify(self, target: str | None = None) -> SpatialProgram:
        """The program verified, or verify's error with the user's lines of the ops it names."""
        from ..api import verify

        try:
            return verify(self.program, target)
        except SpatialError as e:
            raise located(e, self.lines, self.program, self.declared) from None

    def evaluate(self, inputs: dict[str, Any], **kwargs: Any) -> Any:
        """The interpreter's run of the program as traced, verified or not (`spatialc.evaluate`): a deadlock it
        meets comes back with the user's line of each blocked engine's op — what running a program verify refuses
        shows."""
        from ..api import evaluate

        try:
            return evaluate(self.program, inputs, **kwargs)
        except SpatialError as e:
            raise located(e, self.lines, self.program, self.declared) from None


def trace(
    fn: Callable[..., Any], *, name: str | None = None, target: str = "sm_90", precision: str = "bf16", **kwargs: Any
) -> Traced:
    """Run the program function `fn(builder, **kwargs)` and return what it declared and traced, unverified."""
    builder = Builder(name or fn.__name__, target, precision)
    fn(builder, **kwargs)
    return Traced(builder.program(), builder.lines, builder.declared)


def program(*, target: str = "sm_90", precision: str = "bf16", name: str | None = None):
    """Decorator: the function becomes one that traces and verifies the program (its keyword arguments are the
    program function's, after the builder) and returns the verified SpatialProgram; `.trace(**kwargs)` gives the
    unverified `Traced` program with its lines."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., SpatialProgram]:
        @functools.wraps(fn)
        def build(**kwargs: Any) -> SpatialProgram:
            return trace(fn, name=name, target=target, precision=precision, **kwargs).verify()

        build.trace = lambda **kwargs: trace(  # type: ignore[attr-defined]
            fn, name=name, target=target, precision=precision, **kwargs
        )
        return build

    return wrap

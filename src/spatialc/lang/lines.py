"""The user's lines: where the tracer is (this package's files), the line of the user's statement being traced, and
errors that name it — refusals made while tracing (`LangError`) and errors verify, the interpreter or the emulation
raise about the traced program's ops, with the lines that wrote those ops appended (`located`).
"""

from __future__ import annotations

import inspect
import os
import re

from ..errors import DeadlockError, ProgramError, SpatialError, VerifyRuleError
from ..ir.ops import (
    ChoreoOp,
)
from ..ir.printer import op_text

_SPATIALC = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the spatialc package's folder


class LangError(ProgramError):
    """A program the embedded language cannot trace, named at the user's line (`file`, `line`)."""

    def __init__(self, message: str, where: tuple[str, int] | None = None):
        self.file, self.line = where if where is not None else ("", 0)
        super().__init__(f"{self.file}:{self.line}: {message}" if where is not None else message)


def in_tracer(filename: str) -> bool:
    """Whether code of `filename` is spatialc's own — the tracer's, or what it calls (ir/ops.py, ew.py) — not the
    user's."""
    return os.path.abspath(filename).startswith(_SPATIALC)


def user_line() -> tuple[str, int]:
    """The file and line of the innermost frame outside this package: the user's statement being traced."""
    frame = inspect.currentframe()
    while frame is not None and in_tracer(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def refuse(message: str) -> LangError:
    return LangError(message, user_line())


# ---- errors at the user's lines --------------------------------------------------------------------------------


def located(
    error: SpatialError,
    lines: dict[tuple[int, str], list[tuple[ChoreoOp, tuple[str, int]]]],
    p,
    declared: dict[str, tuple[str, int]] | None = None,
    blocked: tuple[tuple[int, str, str], ...] = (),
    names: dict[str, str] | None = None,
) -> Exception:
    """`error` (from verify, the interpreter or the emulation) with the user's lines of the ops it names appended —
    or, for an error about the plan or the placement rather than an op, the line that declared it — as the same
    kind of error. `blocked`: (site, engine, op text) of ops an error names only in its words (an emulation hang);
    `names`: the user's names of loop variables the IR numbers ("lv8" → "h"), put back in the message."""
    found: list[str] = []
    where: dict[tuple[int, str], tuple[str, int]] = {}

    def lines_of(site: int | None, engine: str | None, text: str | None) -> None:
        for (s, e), ops in lines.items():
            if (site is not None and s != site) or (engine is not None and e != engine):
                continue
            for op, (file, line) in ops:
                if text is None or op_text(p, op) == text:
                    found.append(f"{file}:{line}: site {s} {e}: {op_text(p, op)}")
                    where.setdefault((s, e), (file, line))

    for site, engine, text in blocked:
        lines_of(site, engine, text)
    if isinstance(error, DeadlockError):
        for site, engine, text in error.blocked:
            lines_of(site, engine, text)
    elif isinstance(error, VerifyRuleError):
        if error.op is not None:
            lines_of(error.site, error.engine, error.op)
        for site, engine, text in error.related:
            lines_of(site, engine, text)
    if not found:
        text = str(error)
        named = [w for w in (declared or {}) if re.search(rf"\b{re.escape(w)}\b", text, re.IGNORECASE)]
        if "placement" in named and len(named) > 1:
            named.remove("placement")  # a group's or a stage's own line says more than the placement's
        if not named and "placement" in (declared or {}) and "site" in text.lower() and "item" in text.lower():
            named = ["placement"]
        for what in named:
            file, line = (declared or {})[what]
            found.append(f"{file}:{line}: the {what}")

    def named(text: str) -> str:
        return re.sub(r"\blv\d+\b", lambda m: (names or {}).get(m[0], m[0]), text)

    found = [named(f) for f in dict.fromkeys(found)]
    message = "\n".join([named(str(error)), *(f"  {f}" for f in found)])
    if message == str(error):
        return error
    if isinstance(error, DeadlockError):
        out: Exception = type(error)(message, error.blocked, buffer=error.buffer)
    elif isinstance(error, VerifyRuleError):
        out = type(error)(
            message, site=error.site, engine=error.engine, op=error.op, buffer=error.buffer, related=error.related
        )
    elif hasattr(error, "stderr"):  # the emulation's: the run's own output and status kept
        out = type(error)(message, stderr=error.stderr, status=error.status)  # type: ignore[call-arg, attr-defined]
    else:
        out = type(error)(message)
    out.lines = found  # type: ignore[attr-defined]
    out.where = where  # type: ignore[attr-defined]  # (site, engine) → its op's file and line: deadlock.svg names them
    return out

"""What the things a program declares may be called, and how a name is written into generated text.

A saved program is something people share, and opening one must be as safe as opening a CSV file. Its names reach
text that spatialc generates and then runs or hands out: the interpreter's Python, the host programs' C++, the
lang source `show --python` prints, pictures and listings. So there are two walls, each enough on its own:

- at the boundary (the JSON reader, verify's rule 1, the lang builder), a name is identifier-like — a letter or
  `_`, then letters, digits and `_`, at most MAX_NAME characters — and unique among the names of its kind;
- every printer that puts a name (or an op's text, which holds names) into a comment or a string literal passes
  it through `plain` as well, and no file name or path is ever made from a name: operand files are named by
  position (`lower.artifact.operand_files`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .nodes import SpatialProgram

MAX_NAME = 64
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What `plain` keeps: characters that end no comment or string in Python, C or C++, start no escape, directive,
# comment (no /, so no // or /* and no census marker), format (printf's %, an f-string's braces) or trigraph (??/),
# and are not whitespace other than a space.
_PLAIN = re.compile(r"[^A-Za-z0-9_ .,:;()\[\]=+\-*<>@#!&|^~×·→−≤≥]")


def fitted_name(name: str) -> str:
    """A generated name (a GEMM's, from its sizes and epilogue) cut to MAX_NAME where it is longer: its head, then
    `_` and 8 hex digits of a hash of the whole, so that two long names stay apart."""
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


def name_fault(what: str, name: object) -> str | None:
    """Why `name` cannot name `what` ("tensor", "stage", …), or None: identifier-like and at most MAX_NAME long."""
    if not isinstance(name, str):
        return f"{what} name {shown_name(name)}: a name is a string"
    if len(name) > MAX_NAME:
        return f"{what} name {shown_name(name)} is {len(name)} characters long; at most {MAX_NAME}"
    if _NAME.fullmatch(name) is None:
        return (
            f"{what} name {shown_name(name)} is not identifier-like: a letter or _, then letters, digits"
            " and _ (names reach generated code and listings)"
        )
    return None


def shown_name(name: object) -> str:
    """A name as an error shows it: quoted, escaped, cut short — whatever it holds, one safe line."""
    text = ascii(name) if isinstance(name, str) else type(name).__name__
    return text if len(text) <= MAX_NAME + 2 else text[: MAX_NAME - 1] + "…'"


def names_fault(p: SpatialProgram) -> str | None:
    """The first name of `p` that is not identifier-like, or the first repeated within its kind, or None: the
    program, its placement's kind, and every tensor, stage, buffer and semaphore."""
    kinds: tuple[tuple[str, Iterable[object]], ...] = (
        ("tensor", (t.name for t in p.tensors)),
        ("stage", (s.name for s in p.stages)),
        ("buffer", (b.name for b in p.buffers)),
        ("semaphore", (s.name for s in p.semaphores)),
    )
    fault = name_fault("program", p.name)
    if fault is None and p.placement is not None:
        fault = name_fault("placement kind", p.placement.kind)
    for what, names in kinds:
        if fault is not None:
            break
        seen: set[object] = set()
        for name in names:
            fault = name_fault(what, name)
            if fault is None and name in seen:
                fault = f"two {what}s are named {shown_name(name)}: names are unique within their kind"
            if fault is not None:
                break
            seen.add(name)
    return fault


def plain(text: str) -> str:
    """`text` safe inside a comment or a string literal of generated Python, C or C++ (and a printf format):
    every character that could end, escape, format or continue one (a newline, a quote, a backslash, %, braces,
    ?) becomes `_`. Names that passed `name_fault` come through unchanged."""
    return _PLAIN.sub("_", text)

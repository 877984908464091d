"""The census: each choreography op kind counted in the program, and counted again in the text a backend printed.

A printer ends the first line of each op's image with a marker comment, so the text can be read back without
parsing C. Three tags exist:

- `// op:Kind` — the image of one op. Every op has exactly one, even one whose image is empty: an op with nothing
  to do on this backend (e.g. flow control on a ring the fused epilogue removed) prints a comment-only line that
  carries the marker, which is what lets the census tell "handled by printing nothing" from "forgotten".
  `// op:Loop x3` marks one `for` that is the image of three engines' co-iterating loops, merged when the site's
  engines were serialised onto one block.
- `// pre:Kind` — a second copy of a producer op that a software-pipelined loop prints before itself for its
  first step. Counted apart: it is the same op, printed twice on purpose.
- `// pad:Push` — an empty commit that keeps the pipeline's wait count exact on a loop's last step; the image of
  no op, so not counted as one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from ..ir.ops import ChoreoOp, walk
from .artifact import Census

OP, PRE, PAD = "op", "pre", "pad"
_MARK = re.compile(r"// (op|pre|pad):(\w+)(?: x(\d+))?")


def marker(op_or_kind: object, tag: str = OP, times: int = 1) -> str:
    """The marker comment for an op (or an op kind name); `times` > 1 for one statement that images several ops."""
    kind = op_or_kind if isinstance(op_or_kind, str) else type(op_or_kind).__name__
    return f"// {tag}:{kind}" + (f" x{times}" if times > 1 else "")


def count_ops(programs: Iterable[tuple[ChoreoOp, ...]]) -> dict[str, int]:
    """Each op kind's count over `programs`, loops and their bodies included (static counts, not trips)."""
    counts: Counter[str] = Counter()
    for ops in programs:
        counts.update(type(op).__name__ for op in walk(ops))
    return dict(sorted(counts.items()))


def count_printed(text: str, tag: str = OP) -> dict[str, int]:
    """Each op kind's count among the `tag` markers of printed text."""
    counts: Counter[str] = Counter()
    for t, kind, times in _MARK.findall(text):
        if t == tag:
            counts[kind] += int(times or 1)
    return dict(sorted(counts.items()))


def census(programs: Iterable[tuple[ChoreoOp, ...]], text: str) -> Census:
    """The census of `programs` against the text printed from them.

    For the persistent kernel `programs` are the engine programs of the site it is printed from: every site runs
    that one text, so those are the ops it must hold, each once.
    """
    return Census(program=count_ops(programs), printed=count_printed(text), rotated=count_printed(text, PRE))

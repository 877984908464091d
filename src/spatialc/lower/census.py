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
- `// post:Kind` — a second copy of a consumer op that a pipelined loop prints after itself for its last step (the
  sm_90a form releases each K step's stages one step late, once the next step's MMAs are issued). Counted with
  the `pre` copies: the same op, printed twice on purpose.
- `// pad:Push` — an empty commit that keeps the pipeline's wait count exact on a loop's last step; the image of
  no op, so not counted as one.

A `Compute` marker also names its compute op, `// op:Compute:Map_relu_x0`, so the census counts the stages too (the
matmul, and each epilogue stage the fused store applies, a Map by the ops and leaves of its expression): a store that
applied one stage twice and forgot another would have the right number of Computes, and the wrong stages.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from ..ir.ops import Apply, Arg, ChoreoOp, Col, Compute, ComputeOp, Expr, Lit, Map, RowArg, walk
from .artifact import Census

OP, PRE, POST, PAD = "op", "pre", "post", "pad"
_MARK = re.compile(r"// (op|pre|post|pad):(\w+)(?::(\w+))?(?: x(\d+))?")


def stage_kind(op: ComputeOp) -> str:
    """A compute op's kind as markers and counts name it: its class, and a Map's expression as one word
    (`Map_add_x0_col`: a bias, `Map_mul_x0_row`: a per-row scale)."""
    return f"Map_{_word(op.expr)}" if isinstance(op, Map) else type(op).__name__


def _word(expr: Expr) -> str:
    match expr:
        case Arg(i):
            return f"x{i}"
        case RowArg(i):
            return f"row{i}"
        case Lit():
            return "lit"
        case Col(axis=axis):
            return axis.value  # col: a column vector (a bias), row: a row vector (a per-row scale)
        case Apply(name, args):
            return "_".join([name, *(_word(a) for a in args)])
    return "expr"


def marker(op_or_kind: object, tag: str = OP, times: int = 1) -> str:
    """The marker comment for an op (or an op kind name); `times` > 1 for one statement that images several ops.

    A Compute op's marker names its compute op after a colon: `// op:Compute:MatmulTiles`."""
    kind = op_or_kind if isinstance(op_or_kind, str) else type(op_or_kind).__name__
    if isinstance(op_or_kind, Compute):
        kind += f":{stage_kind(op_or_kind.op)}"
    return f"// {tag}:{kind}" + (f" x{times}" if times > 1 else "")


def count_ops(programs: Iterable[tuple[ChoreoOp, ...]]) -> dict[str, int]:
    """Each op kind's count over `programs`, loops and their bodies included (static counts, not trips)."""
    counts: Counter[str] = Counter()
    for ops in programs:
        counts.update(type(op).__name__ for op in walk(ops))
    return dict(sorted(counts.items()))


def count_stages(programs: Iterable[tuple[ChoreoOp, ...]]) -> dict[str, int]:
    """Each compute op kind's count over the Compute ops of `programs` (MatmulTiles, Map_relu_x0, …)."""
    counts: Counter[str] = Counter()
    for ops in programs:
        counts.update(stage_kind(op.op) for op in walk(ops) if isinstance(op, Compute))
    return dict(sorted(counts.items()))


def count_printed(text: str, tag: str = OP) -> dict[str, int]:
    """Each op kind's count among the `tag` markers of printed text."""
    counts: Counter[str] = Counter()
    for t, kind, _, times in _MARK.findall(text):
        if t == tag:
            counts[kind] += int(times or 1)
    return dict(sorted(counts.items()))


def count_printed_stages(text: str) -> dict[str, int]:
    """Each compute op kind's count among the `// op:Compute:Kind` markers of printed text."""
    counts: Counter[str] = Counter()
    for t, kind, stage, times in _MARK.findall(text):
        if t == OP and kind == "Compute" and stage:
            counts[stage] += int(times or 1)
    return dict(sorted(counts.items()))


def census(programs: Iterable[tuple[ChoreoOp, ...]], text: str) -> Census:
    """The census of `programs` against the text printed from them.

    For the persistent kernel `programs` are the engine programs of the site it is printed from: every site runs
    that one text, so those are the ops it must hold, each once.
    """
    programs = tuple(programs)
    return Census(
        program=count_ops(programs),
        printed=count_printed(text),
        rotated=dict(sorted((Counter(count_printed(text, PRE)) + Counter(count_printed(text, POST))).items())),
        stages=count_stages(programs),
        printed_stages=count_printed_stages(text),
    )

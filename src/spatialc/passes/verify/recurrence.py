"""The values rule 8 follows through an attention schedule, and the online softmax recurrence they must equal.

A value is a tree (nested tuples, compared by equality) over the atoms Q, K and V — the reader's pages, which the
run (`verify/attention.py`) checks to be the item's band of query rows at its query head and the KV loop's block of
its KV head — and over the opaque states m, l, o of the KV loop's entry:

    ("ap", op, params, *args)           op of the elementwise table (numerics/elementwise.py) on its arguments
    ("lit", v)                          a constant, as the float32 a Map holds
    ("pos", "row" | "col")              a mask's query row r, its key column c
    ("mm", a, b)                        the tile matmul a·b (a·bᵀ where b is K: its rows are keys)
    ("rowred", op, a)                   each row's `op` (max, sum) of a page
    ("combine", op, acc, part)          an accumulator's value ⊕ part, ⊕ its reduction's op
    ("add", acc, part)                  a matmul accumulator's value + a product
    ("scale", acc, by)                  an accumulator rescaled by a row vector (ScaleAcc)
    ("acquired",)                       an accumulator just acquired: its reduction's identity (−∞ for a max, 0 for
                                        a sum or a matmul)
    ("in", role) / ("rec", role)        the running m, l or o at a KV block's entry / after the last block

Every value is built by the same constructors the template below uses, so a schedule computing the recurrence
gives exactly the template's trees; there is one canonical form, and a reordering that would mean the same is
refused rather than normalised.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...ir.ops import Attention, VecAxis
from ...numerics.narrow import FLOAT32_MAX
from .symbolic import PC, PR, Aff

Tree = tuple
ACQUIRED: Tree = ("acquired",)
Q_ATOM, K_ATOM, V_ATOM = ("Q",), ("K",), ("V",)


def ap(op: str, *args: Tree, params: tuple[float, ...] = ()) -> Tree:
    return ("ap", op, params, *args)


def lit(value: float) -> Tree:
    with np.errstate(over="ignore"):  # a constant past float32 is inf there, as in the Map: no warning to stderr
        return ("lit", float(np.float32(value)))  # a Map holds its constants as float32


@dataclasses.dataclass(frozen=True, slots=True)
class Geom:
    """Where a page's (or an accumulator's) tiles sit: `rows` × `width` tiles, page row PR at tile `row` of
    `rkind`, page column PC at tile `col` of `ckind` — "query": a query row of the head, "key": a key row of the KV
    head, "d": a head_dim tile; `ckind` None: a row vector, one tile a row."""

    rows: int
    width: int
    rkind: str
    row: Aff
    ckind: str | None = None
    col: Aff | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Val:
    """A page's value and where its tiles sit."""

    value: Tree
    geom: Geom


def keep(op: Attention) -> Tree:
    """The declared mask: key c < seq_kv and, causal, c ≤ r + seq_kv − seq_q."""
    col, row = ("pos", str(VecAxis.COL)), ("pos", str(VecAxis.ROW))
    inside = ap("lt", col, lit(op.seq_kv))
    if not op.causal:
        return inside
    return ap("mul", inside, ap("le", col, ap("add", row, lit(op.seq_kv - op.seq_q))))


# float32's lowest value: where a softmax's running max is still −∞ (every value so far −∞), exp reads it as this
# instead, so that α = exp(−∞ − m′) and P = exp(−∞ − m′) are 0 rather than exp(−∞ + ∞) = NaN (FlashAttention's guard).
LOWEST = -FLOAT32_MAX


def running(x: Tree, m: Tree, lsum: Tree, floored: bool = False) -> dict[str, Tree]:
    """One step of the running max and sum of exp from (m, l) over the page of values x (a KV block's scores, a
    page of a softmax's row): m′ = max(m, rowmax(x)), α = exp(m − m′), P = exp(x − m′), l′ = α·l + rowsum(P) — the
    same m′ in α and P. From m = −∞, l = 0 over pages x_0 … x_n−1, m ends as the max of every value and l as the sum
    of exp(value − m) (docs/verification.md). `floored`: α and P read m′ as max(m′, LOWEST), which is m′ wherever
    it is finite; a row of a softmax may begin with whole pages of −∞ (a mask), where m′ is −∞ (attention's first
    KV block always holds a key its mask leaves)."""
    m1 = ("combine", "max", m, ("rowred", "max", x))
    shift = ap("max", m1, lit(LOWEST)) if floored else m1
    alpha = ap("exp", ap("sub", m, shift))
    p = ap("exp", ap("sub", x, shift))
    l1 = ("combine", "sum", ("scale", lsum, alpha), ("rowred", "sum", p))
    return {"X": x, "m": m, "l": lsum, "m′": m1, "α": alpha, "P": p, "l′": l1}


def step(op: Attention, m: Tree, lsum: Tree, o: Tree) -> dict[str, Tree]:
    """One KV block's step of the recurrence from (m, l, o), every part by name (how messages show them)."""
    s = ("mm", Q_ATOM, K_ATOM)
    x = ap("mask", keep(op), ap("mul", s, lit(op.scale)))
    run = running(x, m, lsum)
    o1 = ("add", ("scale", o, run["α"]), ("mm", run["P"], V_ATOM))
    return {"keep": keep(op), "S": s, **run, "o": o, "o′": o1, "Q": Q_ATOM, "K": K_ATOM, "V": V_ATOM}


def finish() -> dict[str, Tree]:
    """What the writer receives after the last block: O = o / l, LSE = m + log l, and the states by name."""
    m, lsum, o = ("rec", "m"), ("rec", "l"), ("rec", "o")
    return {"O": ap("div", o, lsum), "LSE": ap("add", m, ap("log", lsum)), "m": m, "l": lsum, "o": o}


def show(t: Tree, named: dict[Tree, str] | None = None, top: bool = False) -> str:
    """A value as text, its known parts by name (S, X, m′, α, P, …; not the whole value where `top`)."""
    named = named or {}
    if not top and t in named:
        return named[t]

    def sub(u: Tree) -> str:
        return show(u, named)

    match t:
        case ("ap", op, _, a, b) if op in _INFIX:
            return f"({sub(a)} {_INFIX[op]} {sub(b)})"
        case ("ap", op, _, *args):
            return f"{op}({', '.join(sub(a) for a in args)})"
        case ("lit", v):
            return f"{v:g}" if not math.isfinite(v) or v == int(v) else str(np.float32(v))
        case ("pos", axis):
            return "r" if axis == str(VecAxis.ROW) else "c"
        case ("combine", op, a, b):
            return f"{op}({sub(a)}, {sub(b)})" if op == "max" else f"({sub(a)} + {sub(b)})"
        case ("rowred", op, a):
            return f"row{op}({sub(a)})"
        case ("scale", a, b):
            return f"{sub(b)}·{sub(a)}"
        case ("mm", a, b):
            return f"{sub(a)}·{sub(b)}ᵀ" if b == K_ATOM else f"{sub(a)}·{sub(b)}"
        case ("add", a, b):
            return f"({sub(a)} + {sub(b)})"
        case ("in", name) | ("entry", name) | ("rec", name) | ("last", name):
            return name
        case (atom,):
            return atom
    return repr(t)


_INFIX = {"add": "+", "sub": "−", "mul": "·", "div": "/", "lt": "<", "le": "≤"}


def first_difference(have: Tree, want: Tree) -> tuple[Tree, Tree]:
    """The innermost pair of parts where `have` and `want` differ, followed while their heads agree and one part
    differs."""
    while (
        isinstance(have, tuple)
        and isinstance(want, tuple)
        and len(have) == len(want)
        and have[:1] == want[:1]
        and have[:1] not in (("lit",), ("pos",))
    ):
        diffs = [i for i, (a, b) in enumerate(zip(have, want, strict=True)) if a != b]
        if len(diffs) != 1 or not isinstance(have[diffs[0]], tuple):
            break
        have, want = have[diffs[0]], want[diffs[0]]
    return have, want


def pin(form: Aff, rows: int, width: int) -> Aff:
    """`form` with the page row (column) the constant 0 where a page has one row (column): a symbol ranges over two
    values or more, so equal functions are equal forms (`symbolic`)."""
    return form.subst({s: Aff(0) for s, n in ((PR, rows), (PC, width)) if n < 2})


def vector(g: Geom) -> Geom:
    """A row vector of `g`'s rows."""
    return Geom(g.rows, 1, g.rkind, g.row)


def geom_text(g: Geom | None) -> str:
    if g is None:
        return "nothing"
    cols = "one value a row" if g.ckind is None else f"{g.ckind} tiles {form_text(g.col)}"
    return f"{g.rows}x{g.width} tiles: {g.rkind} tile rows {g.row.text()}, {cols}"


def form_text(form: Aff | None) -> str:
    return "none" if form is None else form.text()

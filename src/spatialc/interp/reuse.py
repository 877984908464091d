"""A part of an elementwise page's value that a page its row vector reduced has computed already, taken as it is.

Softmax's quotient exp(x − max) / sum divides, page by page, the very exp(x − max) that the sum's pages computed
from the same tiles of x and the same max: the program says it twice (a ring feeds one stage), and computing it twice
was a third of the interpreter's arithmetic. When a chunk of row packs has been computed (`rowpacks.py`) and the pages
that read them are computed next (`mapped._Waves`), the pages each pack reduced are still at hand: where the page's
expression holds the reduced pages' whole expression as a part — the same ops, parameters and constants, its pages the
same tiles of a tensor nothing writes or the same page values, read at the same widths — that part is their computed
band. Every op of the table is a float64 op of float32 operands rounded once to float32, so the part's value is, bit
for bit, the float32 array the expression would compute for it again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.ops import Apply, Arg, Expr, Lit, RowArg
from .pages import MapValue, RowPack, TileRefs


def reused(kernel: Any, runs: list[list[MapValue]]) -> tuple[Expr, np.ndarray] | None:
    """(the kernel's expression with the part replaced by `Arg(n)`, the part's values shaped as the runs' evaluation
    takes page n: (rows, run columns), or (runs, rows, run columns)), n being the kernel's page count; None where no
    row pack of the runs holds computed pages whose expression is such a part of every page of the runs."""
    v0 = runs[0][0]
    for j in kernel.by_row:
        pack = v0.ins[j]
        if pack.__class__ is not RowPack or not pack.pages:
            continue
        m0 = pack.pages[0][1]
        if m0.__class__ is not MapValue or m0.result is None or m0.cols or m0.kernel.order:
            continue
        found = _part(kernel, m0.kernel)
        if found is None:
            continue
        node, names = found
        bands = [_band_of(run, j, names, m0.kernel) for run in runs]
        if any(b is None for b in bands):
            continue
        expr = _replaced(kernel.op.expr, node, Arg(len(v0.ins)))
        return expr, _stacked(bands)  # type: ignore[arg-type]
    return None


def _stacked(bands: list[np.ndarray]) -> np.ndarray:
    """The bands stacked (runs, rows, columns): a view where each lies right after the one before in one block of
    memory, as the bands of one evaluation do (`mapped._realise_runs`), else a copy."""
    first = bands[0]
    if len(bands) == 1:
        return first
    step = first.shape[0] * first.strides[0]
    at = first.__array_interface__["data"][0]
    for k, b in enumerate(bands):
        if b.base is None or b.base is not first.base or b.shape != first.shape or b.strides != first.strides:
            return np.stack(bands)
        if b.__array_interface__["data"][0] != at + k * step:
            return np.stack(bands)
    shape, strides = (len(bands), *first.shape), (step, *first.strides)
    return np.lib.stride_tricks.as_strided(first, shape, strides, writeable=False)


def _band_of(run: list[MapValue], j: int, names: dict[int, int], source: Any) -> np.ndarray | None:
    """The band of pages that run[0]'s row pack j reduced, where page k of it is the part of page k of the run."""
    pack = run[0].ins[j]
    pages = pack.pages
    if len(pages) != len(run):
        return None
    v0, m0 = run[0], pages[0][1]
    band = m0.band
    if band is None or (m0.h, m0.width, m0.tr, m0.tc) != (v0.h, v0.width, v0.tr, v0.tc):
        return None
    # The pages of one band were computed together, as a run's were: one shape and widths each (`mapped._realise_runs`)
    if any(m0.widths[i] != v0.widths[i2] for i, i2 in names.items()):
        return None
    read = list(names.items())
    for k, v in enumerate(run):
        m = pages[k][1]
        if m.__class__ is not MapValue or m.kernel is not source or m.band is not band or m.slot != k:
            return None
        for i, i2 in read:
            a, b = m.ins[i], v.ins[i2]
            if a is not b and not _same_page(a, b):
                return None
    return band


def _same_page(a: object, b: object) -> bool:
    """Whether two page values hold the same values: one value, or the same tiles of a tensor nothing writes."""
    if a is b:
        return True
    return (
        a.__class__ is TileRefs
        and b.__class__ is TileRefs
        and a.store is b.store  # type: ignore[attr-defined]
        and a.at == b.at  # type: ignore[attr-defined]
        and (a.off is b.off or np.array_equal(a.off, b.off))  # type: ignore[attr-defined]
    )


def _part(kernel: Any, source: Any) -> tuple[Expr, dict[int, int]] | None:
    """The first part (preorder) of kernel's expression that is source's expression with its pages renamed, and the
    renaming (source's page → kernel's page); found once per pair of kernels."""
    hit = kernel.reuse.get(id(source))
    if hit is None or hit[0] is not source:  # (the entry keeps `source` alive, so its id is not reused meanwhile)
        found = None
        stack = [kernel.op.expr]
        while stack and found is None:
            node = stack.pop()
            names: dict[int, int] = {}
            if _same(node, source.op.expr, names):
                found = (node, names)
            elif isinstance(node, Apply):
                stack.extend(reversed(node.args))
        hit = kernel.reuse[id(source)] = (source, found)
    return hit[1]


def _same(a: Expr, b: Expr, names: dict[int, int]) -> bool:
    """Whether `a` is `b` with b's pages renamed consistently into `names` (b's page → a's)."""
    match b:
        case Arg(i):
            return isinstance(a, Arg) and names.setdefault(i, a.index) == a.index
        case RowArg(i, w):
            return isinstance(a, RowArg) and a.width == w and names.setdefault(i, a.index) == a.index
        case Lit(v):  # (as evaluate takes it: its float32, bit for bit)
            return isinstance(a, Lit) and np.float32(a.value).tobytes() == np.float32(v).tobytes()
        case Apply(op, args, params):
            return (
                isinstance(a, Apply)
                and a.op == op
                and a.params == params
                and len(a.args) == len(args)
                and all(_same(x, y, names) for x, y in zip(a.args, args, strict=True))
            )
    return False


def _replaced(expr: Expr, node: Expr, by: Expr) -> Expr:
    """`expr` with the part `node` (that object) replaced by `by`."""
    if expr is node:
        return by
    if isinstance(expr, Apply):
        return Apply(expr.op, tuple(_replaced(a, node, by) for a in expr.args), expr.params)
    return expr

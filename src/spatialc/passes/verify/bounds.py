"""verify's rule 6, bounds: every ReadTiles / WriteTiles stays inside its tensor's tile grid, its rows and its page.

An address is linear in its loop variables, so its extremes over a run are at the ends of each variable's range —
except the item coordinates, which take the values of the site's items. Each access is checked once against the
box of item coordinates of all the sites that share its program (a box inside the grid, so a pass there is a pass
everywhere), and only when that fails site by site against the real items, to name the first that leaves. No
check walks items × K iterations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import TileBoundsError
from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, BufferId, ItemId, LoopVar, Site, loop_var_name
from ...ir.index import ProgramIndex, where
from ...ir.nodes import EngineProgram, Plan
from ...ir.ops import Compute, Dequant, Map, PackAcc, WriteTiles, arg_indices, row_args
from .facts import Access, BiasRead, Run

Box = tuple[int, int, int, int]  # item_y lo, hi, item_x lo, hi


@dataclass(frozen=True, slots=True)
class _Var:
    name: str
    coef: int
    hi: int  # the variable runs 0..hi


@dataclass(frozen=True, slots=True)
class _Linear:
    """`base + Σ coef · var + cy · item_y + cx · item_x` — one access's first tile of a block row, or any tile."""

    base: int
    terms: tuple[_Var, ...]
    cy: int
    cx: int

    def span(self) -> tuple[int, int]:
        """Its least and greatest value, item coordinates left out."""
        lo = self.base + sum(min(0, v.coef * v.hi) for v in self.terms)
        hi = self.base + sum(max(0, v.coef * v.hi) for v in self.terms)
        return lo, hi


def _linear(acc: Access, whole_block: bool) -> _Linear:
    op, counts = acc.op, {f.op.var: f.n for f in acc.loops}
    coefs: dict[LoopVar, int] = {}
    for var, stride in op.at.steps:
        coefs[var] = coefs.get(var, 0) + stride
    terms = [_Var(loop_var_name(v), c, counts[v] - 1) for v, c in coefs.items() if v not in (LV_ITEM_Y, LV_ITEM_X)]
    terms.append(_Var("block row", op.stride_h, op.block_h - 1))
    if whole_block:
        terms.append(_Var("block col", op.stride_w, op.block_w - 1))
    return _Linear(op.at.base, tuple(terms), coefs.get(LV_ITEM_Y, 0), coefs.get(LV_ITEM_X, 0))


def site_box(items: Sequence[ItemId], nx: int) -> Box | None:
    """The smallest box of grid coordinates around `items` (None for no items)."""
    if not items:
        return None
    first, last = min(items), max(items)
    y0, y1 = first // nx, last // nx
    return (y0, y1, first % nx, last % nx) if y0 == y1 else (y0, y1, 0, nx - 1)


def _union(boxes: list[Box]) -> Box:
    return (min(b[0] for b in boxes), max(b[1] for b in boxes), min(b[2] for b in boxes), max(b[3] for b in boxes))


def _item_span(lin: _Linear, box: Box) -> tuple[int, int]:
    ys, xs = (lin.cy * box[0], lin.cy * box[1]), (lin.cx * box[2], lin.cx * box[3])
    return min(ys) + min(xs), max(ys) + max(xs)


def check_bounds(ctx: ProgramIndex, plan: Plan | None, runs: Sequence[Run]) -> None:
    """Rule 6 for every access of every distinct program."""
    nx = plan.grid[1] if plan is not None else 1
    boxes: dict[tuple[Site, tuple[int, int] | None], Box | None] = {}
    for run in runs:
        _check_pages(ctx, run)
        for acc in run.facts.accesses:
            if any(f.n == 0 for f in acc.loops):
                continue  # never runs
            part = item_part(acc)
            sites = tuple(
                (site, items if part is None else items[part[0] : part[0] + part[1]]) for site, items in run.sites
            )
            for site, items in sites:
                if (site, part) not in boxes:
                    boxes[(site, part)] = site_box(items, nx)
            _check_access(ctx, nx, run, acc, {site: boxes[(site, part)] for site, _ in sites}, sites)


def item_part(acc: Access) -> tuple[int, int] | None:
    """(first, count) of the site's items the ITEM loop around `acc` runs, where that loop starts past the first
    (a split tail's); None where the access sees every item of its site."""
    loop = next((f for f in acc.loops if f.op.var == LV_ITEM), None)
    return (loop.op.first, loop.n) if loop is not None and loop.op.first else None


def _fail(
    ctx: ProgramIndex, site: Site, engine: str, acc: Access | PackAcc | Compute, why: str, buffer: str | None
) -> TileBoundsError:
    op = acc.op if isinstance(acc, Access) else acc
    text = ctx.op(op.source if isinstance(op, BiasRead) else op)  # a bias read is named by its Compute
    return TileBoundsError(
        f"{where(site, engine)}: {text} — {why}", site=int(site), engine=engine, op=text, buffer=buffer
    )


def _check_pages(ctx: ProgramIndex, run: Run) -> None:
    """Each block fits the page it fills or empties; each pack fits its page and comes from its accumulator; each map
    fills a page of the tiles its inputs' pages hold."""
    site, engine = run.sites[0][0], run.prog.engine.value
    for acc in run.facts.accesses:
        op = acc.op
        buf = op.src if isinstance(op, WriteTiles) else op.into
        tiles, room = op.block_h * op.block_w, ctx.page_tiles(buf)
        if tiles > room:
            raise _fail(
                ctx,
                site,
                engine,
                acc,
                f"a {op.block_h}x{op.block_w} block ({tiles} tiles) does not fit a"
                f" page of {ctx.name(buf)}, which holds {room}",
                ctx.name(buf),
            )
    for use in run.facts.uses:
        if isinstance(use.op, PackAcc) and use.buf == use.op.to:
            pack = use.op
            for buf in (pack.to, pack.acc):
                if pack.tiles > ctx.page_tiles(buf):
                    raise _fail(
                        ctx,
                        site,
                        engine,
                        pack,
                        f"packs {pack.tiles} tiles, but {ctx.name(buf)} holds {ctx.page_tiles(buf)}",
                        ctx.name(buf),
                    )
        if isinstance(use.op, Compute) and isinstance(use.op.op, Map) and use.buf in use.op.outs:
            _check_map_page(ctx, site, engine, use.op, use.buf)
        if isinstance(use.op, Compute) and isinstance(use.op.op, Dequant) and use.buf in use.op.outs:
            _check_dequant_page(ctx, site, engine, use.op, use.buf)


def _check_map_page(ctx: ProgramIndex, site: Site, engine: str, op: Compute, out) -> None:
    """A map's output page holds at least the tiles of the pages it reads element by element — or, reading only row
    vectors, of the vectors' pages: it fills its page with theirs, element for element (a smaller page would be
    written past its slot; a larger one is filled as far as they go, what its readers take being their own ops')."""
    assert isinstance(op.op, Map)
    vectors = set(row_args(op.op.expr))
    pages = [i for i in arg_indices(op.op.expr) if i not in vectors] or sorted(vectors)
    for i in pages:
        if i >= len(op.ins):
            continue  # rule 1 names an expression reading a page the op does not take
        _check_fill(ctx, site, engine, op, op.ins[i], out, "", "a map's page holds its inputs' pages")


def _check_dequant_page(ctx: ProgramIndex, site: Site, engine: str, op: Compute, out: BufferId) -> None:
    """A dequant's output page holds at least the tiles of the packed page it reads: it dequantises all of that page
    into its own, tile for tile (a smaller page would be written past its slot, and its readers would take tiles the
    page does not hold; rule 8 follows the page's value, not its room)."""
    for src in op.ins:
        _check_fill(ctx, site, engine, op, src, out, " (its page_tiles)", "a dequant's page holds the page it reads")


def _check_fill(
    ctx: ProgramIndex, site: Site, engine: str, op: Compute, src: BufferId, out: BufferId, field: str, rule: str
) -> None:
    """`op` fills a page of `out` from pages of `src` element for element: `out`'s pages hold at least as many tiles
    (`field` and `rule` name, in the refusal, what counts and why)."""
    if ctx.page_tiles(src) > ctx.page_tiles(out):
        raise _fail(
            ctx,
            site,
            engine,
            op,
            f"it fills a page of {ctx.name(out)}, which holds {ctx.page_tiles(out)} tiles{field}, from pages of"
            f" {ctx.name(src)}, which hold {ctx.page_tiles(src)}: {rule}",
            ctx.name(out),
        )


def _check_access(
    ctx: ProgramIndex,
    nx: int,
    run: Run,
    acc: Access,
    boxes: dict[Site, Box | None],
    sites: Sequence[tuple[Site, Sequence[ItemId]]],
) -> None:
    tensor = ctx.tensors[acc.op.tensor]
    rows, cols = tensor.tiles
    whole, first = _linear(acc, True), _linear(acc, False)
    uses_items = bool(whole.cy or whole.cx)
    placed = [(s, items) for s, items in sites if boxes[s] is not None] if uses_items else list(sites[:1])
    if not placed:
        return
    box = _union([b for s, _ in placed if (b := boxes[s]) is not None]) if uses_items else (0, 0, 0, 0)
    lo, hi = whole.span()
    ilo, ihi = _item_span(whole, box)
    if lo + ilo < 0 or hi + ihi >= rows * cols:
        for site, items in placed:
            _exact_bounds(ctx, nx, run.prog, site, items, acc, whole)
    if acc.op.stride_w == 1 and acc.op.block_w > 1 and _col_bound(first, box, cols) + acc.op.block_w > cols:
        for site, items in placed:
            _exact_row(ctx, nx, run.prog, site, items, acc, first)


def _assignment(lin: _Linear, low: bool, item: ItemId | None, nx: int) -> tuple[int, str]:
    """The value of `lin` where it is lowest (or highest), and the variables that get it there, as text."""
    value, parts = lin.base, []
    if item is not None:
        y, x = divmod(int(item), nx)
        value += lin.cy * y + lin.cx * x
        parts.append(f"item {int(item)} (y {y}, x {x})")
    for v in lin.terms:
        at = v.hi if (v.coef < 0) == low else 0
        value += v.coef * at
        if v.hi > 0:
            parts.append(f"{v.name} {at}")
    return value, ", ".join(parts) or "its only run"


def _exact_bounds(
    ctx: ProgramIndex, nx: int, prog: EngineProgram, site: Site, items: Sequence[ItemId], acc: Access, lin: _Linear
) -> None:
    tensor = ctx.tensors[acc.op.tensor]
    rows, cols = tensor.tiles
    uses_items = bool(lin.cy or lin.cx)
    cands: Sequence[ItemId | None] = items if uses_items else [None]

    def at_item(i: ItemId | None) -> int:
        return 0 if i is None else lin.cy * (int(i) // nx) + lin.cx * (int(i) % nx)

    for low, item in ((True, min(cands, key=at_item)), (False, max(cands, key=at_item))):
        flat, text = _assignment(lin, low, item, nx)
        if not 0 <= flat < rows * cols:
            verb = "writes" if isinstance(acc.op, WriteTiles) else "reads"
            raise _fail(
                ctx,
                site,
                prog.engine.value,
                acc,
                f"at {text} it {verb} tile {flat} of {tensor.name}, outside its {rows}x{cols} tile grid",
                ctx.name(_buf(acc)),
            )


def _buf(acc: Access):
    return acc.op.src if isinstance(acc.op, WriteTiles) else acc.op.into


def _col_bound(lin: _Linear, box: Box, cols: int) -> int:
    """An upper bound on the column of a block row's first tile: the sum of each term's largest column step."""
    bound = lin.base % cols + (lin.cy % cols) * box[1] + (lin.cx % cols) * box[3]
    return bound + sum((v.coef % cols) * v.hi for v in lin.terms)


def _exact_row(
    ctx: ProgramIndex, nx: int, prog: EngineProgram, site: Site, items: Sequence[ItemId], acc: Access, lin: _Linear
) -> None:
    """The exact set of columns a block row can start at (residues mod cols_t, each with a witness)."""
    tensor = ctx.tensors[acc.op.tensor]
    cols = tensor.tiles[1]
    reach: dict[int, tuple[str, ...]] = {lin.base % cols: ()}
    steps: list[dict[int, str]] = []
    if lin.cy or lin.cx:
        by_item: dict[int, str] = {}
        for i in items:
            y, x = divmod(int(i), nx)
            by_item.setdefault((lin.cy * y + lin.cx * x) % cols, f"item {int(i)} (y {y}, x {x})")
        steps.append(by_item)
    for v in lin.terms:
        if v.coef % cols:
            by_value: dict[int, str] = {}
            for n in range(min(v.hi + 1, cols)):
                by_value.setdefault((v.coef * n) % cols, f"{v.name} {n}")
            steps.append(by_value)
    for step in steps:
        reach = {(r + s) % cols: wit + (text,) for r, wit in reach.items() for s, text in step.items()}
    col = max(reach)
    if col + acc.op.block_w > cols:
        at = ", ".join(reach[col]) or "its only run"
        raise _fail(
            ctx,
            site,
            prog.engine.value,
            acc,
            f"at {at} a block row starts at column {col} of {tensor.name}'s"
            f" {cols}, so its {acc.op.block_w} tiles wrap into the next"
            " row of tiles",
            ctx.name(_buf(acc)),
        )

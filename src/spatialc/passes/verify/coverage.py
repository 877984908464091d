"""verify's rule 2, coverage: the placement puts every item of the plan's grid on exactly one site — on exactly
`splits` sites where split-K divides its K among them — and each site's programs loop over as many items as it holds
(so every item is run exactly once, by the site that holds it; that the split sites of an item reduce its K between
them exactly once, and that one of them writes it, is rule 8's)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ...errors import CoverageError, listed
from ...ir.ids import ItemId, Site
from ...ir.index import ProgramIndex, where
from ...ir.nodes import EngineProgram
from ..split import MAX_SPLITS, SPLIT_TAIL
from .facts import Facts, Programs


def check_coverage(index: ProgramIndex, programs: Programs) -> None:
    """Rule 2: items 0..ny·nx-1 each on exactly one site, and each site's programs loop over as many as it holds."""
    p = index.p
    if p.placement is None or p.plan is None:
        return
    ny, nx = p.plan.placed  # items, or a grouped GEMM's strips (a group and a column of blocks)
    n = ny * nx
    splits = p.placement.splits
    if not 1 <= splits <= MAX_SPLITS:
        raise CoverageError(f"the placement splits each item over {splits} sites; a split is 1 to {MAX_SPLITS} sites")
    tail = p.placement.tail
    if not 0 <= tail <= n or (tail and (p.placement.kind != SPLIT_TAIL or splits < 2)):
        raise CoverageError(
            f"the placement ({p.placement.kind}) splits its last {tail} item(s) over {splits} sites; a split tail"
            f" (kind {SPLIT_TAIL}) splits 1 to {n} items over 2 or more"
        )
    whole = n - tail if tail else 0
    placed = sorted(itertools.chain.from_iterable(items for _, items in p.placement.items_of_site))
    want = [i for i in range(n) for _ in range(1 if i < whole else splits)]
    if len(placed) != len(want) or placed != want:  # the length first: n can be far more than are placed
        _coverage_fault(p.placement.items_of_site, ny, nx, splits, whole)
    for site, items in p.placement.items_of_site:
        early = next((int(i) for i in items[:-1] if int(i) >= whole), None) if tail else None
        if early is not None:
            raise CoverageError(
                f"site {int(site)} holds item {early}, one of the {tail} split in the tail, before its last item: a"
                " site runs a split of a tail item after its whole items",
                site=int(site),
            )
        progs = programs.by_site.get(site, [])
        if items and p.schedule is not None and not any(prog.ops for prog, _ in progs):
            raise CoverageError(
                f"site {int(site)} holds {len(items)} item(s) but the schedule gives it nothing to run", site=int(site)
            )
        for prog, facts in progs:
            _check_item_loops(index, site, len(items), prog, facts)


def _coverage_fault(
    items_of_site: Sequence[tuple[Site, tuple[ItemId, ...]]], ny: int, nx: int, splits: int = 1, whole: int = 0
) -> None:
    n = ny * nx
    owners: dict[int, list[int]] = {}
    for site, items in items_of_site:
        for item in items:
            i = int(item)
            if not 0 <= i < n:
                raise CoverageError(
                    f"site {int(site)} holds item {int(i)}, outside the {ny}x{nx} grid of {n} items", site=int(site)
                )
            owners.setdefault(i, []).append(int(site))
    for i in range(n):
        sites = owners.get(i, [])
        times = 1 if i < whole else splits
        if len(sites) != times:
            which = f"on sites {listed(sites)}" if sites else "on no site"
            once = "exactly once" if times == 1 else f"on exactly {splits} sites (split-K)"
            once += f" (items {whole} on are the split tail's)" if whole and times == 1 else ""
            raise CoverageError(
                f"item {i} (y {i // nx}, x {i % nx}) of the {ny}x{nx} grid is {which}; each item is placed {once}",
                site=sites[-1] if sites else None,
            )


def _check_item_loops(index: ProgramIndex, site: Site, held: int, prog: EngineProgram, facts: Facts) -> None:
    engine = prog.engine.value
    if any(loop.first for loop, _ in facts.item_loops):
        kind = index.p.placement.kind  # type: ignore[union-attr]
        if kind != SPLIT_TAIL:  # the only schedule the rules that follow items loop by loop were shown on
            text = index.op(next(loop for loop, _ in facts.item_loops if loop.first))
            raise CoverageError(
                f"{where(site, engine)}: {text} — an ITEM loop starts past the site's first item only in a split"
                f" tail (placement kind {SPLIT_TAIL}), not in a {kind} placement",
                site=int(site),
                engine=engine,
                op=text,
            )
        _check_item_runs(index, site, held, prog, facts)
        _check_item_free(index, site, held, prog, facts)
        return
    for loop, count in facts.item_loops:
        if count != held:
            text = index.op(loop)
            raise CoverageError(
                f"{where(site, engine)}: {text} — the site holds {held} item(s) but its ITEM loop runs {count} time(s)",
                site=int(site),
                engine=engine,
                op=text,
            )
    _check_item_free(index, site, held, prog, facts)


def _check_item_free(index: ProgramIndex, site: Site, held: int, prog: EngineProgram, facts: Facts) -> None:
    """Outside an ITEM loop item_y / item_x name the site's only item: none of the program's ops use them there
    unless the site holds one."""
    engine = prog.engine.value
    if facts.item_free and held != 1:
        text = index.op(facts.item_free[0])
        raise CoverageError(
            f"{where(site, engine)}: {text} — outside an ITEM loop item_y / item_x name the site's"
            f" only item, but the site holds {held}",
            site=int(site),
            engine=engine,
            op=text,
            buffer=index.buffer_of(facts.item_free[0]),
        )


def _check_item_runs(index: ProgramIndex, site: Site, held: int, prog: EngineProgram, facts: Facts) -> None:
    """ITEM loops that start past the site's first item (a split tail's): one after another, each starting where the
    one before ended, they run the site's items 0 … held − 1 each once."""
    engine = prog.engine.value
    at = 0
    for loop, count in facts.item_loops:
        if loop.first != at:
            text = index.op(loop)
            raise CoverageError(
                f"{where(site, engine)}: {text} — the ITEM loops before it ran the site's items 0 … {at - 1}, and"
                f" this one starts at item {loop.first}: a site's ITEM loops run its items one after another, each"
                " once",
                site=int(site),
                engine=engine,
                op=text,
            )
        at += count
    if at != held:
        text = index.op(facts.item_loops[-1][0])
        raise CoverageError(
            f"{where(site, engine)}: {text} — the site holds {held} item(s) but its ITEM loops run {at}",
            site=int(site),
            engine=engine,
            op=text,
        )

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
from ..split import MAX_SPLITS
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
    placed = sorted(itertools.chain.from_iterable(items for _, items in p.placement.items_of_site))
    want = [i for i in range(n) for _ in range(splits)]
    if len(placed) != n * splits or placed != want:  # the length first: n can be far more than are placed
        _coverage_fault(p.placement.items_of_site, ny, nx, splits)
    for site, items in p.placement.items_of_site:
        progs = programs.by_site.get(site, [])
        if items and p.schedule is not None and not any(prog.ops for prog, _ in progs):
            raise CoverageError(
                f"site {int(site)} holds {len(items)} item(s) but the schedule gives it nothing to run", site=int(site)
            )
        for prog, facts in progs:
            _check_item_loops(index, site, len(items), prog, facts)


def _coverage_fault(
    items_of_site: Sequence[tuple[Site, tuple[ItemId, ...]]], ny: int, nx: int, splits: int = 1
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
        if len(sites) != splits:
            which = f"on sites {listed(sites)}" if sites else "on no site"
            once = "exactly once" if splits == 1 else f"on exactly {splits} sites (split-K)"
            raise CoverageError(
                f"item {i} (y {i // nx}, x {i % nx}) of the {ny}x{nx} grid is {which}; each item is placed {once}",
                site=sites[-1] if sites else None,
            )


def _check_item_loops(index: ProgramIndex, site: Site, held: int, prog: EngineProgram, facts: Facts) -> None:
    engine = prog.engine.value
    for loop, count in facts.item_loops:
        if count != held:
            text = index.op(loop)
            raise CoverageError(
                f"{where(site, engine)}: {text} — the site holds {held} item(s) but its ITEM loop runs {count} time(s)",
                site=int(site),
                engine=engine,
                op=text,
            )
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

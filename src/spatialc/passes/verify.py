"""verify: the one pass that sets `verified`. It proves seven rules, in this order, or raises the rule's error.

1. a known target; sane tile, tensor shapes, plan and compute ops; ids resolve, counts are ≥ 0, pages ≥ 1; reads
   come from input or parameter tensors, writes go to the output, Trip loops read parameter tensors  (IllFormedError)
6. the placement covers every item exactly once, as the ITEM loops say  (CoverageError)
2. each ring has one producer and one consumer engine per site, and is read from / written to the tensor of its
   stage; accumulators only via their ops  (RingOwnershipError)
4. no op moves more pages than its ring holds  (RingDepthError)
3. each engine pairs Reserve/Push and Wait/Pop, co-iterating loops balance, every ring ends empty  (UnbalancedError)
5. every tile access stays inside its tensor's grid, its rows and its page  (TileBoundsError)
7. the choreography cannot deadlock  (VerifyDeadlockError; StrongerCheckNeeded where one run cannot tell)

Rule 6 comes early because rule 5 reads the items; rule 7 comes last because its argument rests on the others.
Every error names the site, engine, op and buffer it is about. Sites with the same programs are checked once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from ..errors import CoverageError, IllFormedError
from ..ir.ids import ItemId, Site
from ..ir.nodes import Accumulator, ComputeStage, EngineProgram, ReadStage, SpatialProgram, TensorRole, WriteStage
from ..ir.ops import Bias, ChoreoOp
from ..target import SpatialTarget
from .deadlock import check_deadlock, check_decidable
from .verify_bounds import Run, check_bounds
from .verify_rings import check_site, stage_owners
from .verify_tables import check_plans, check_target, check_tensors, check_tile, compute_fault, role_text
from .verify_walk import Ctx, Facts, facts_of, where

SiteProgs = list[tuple[EngineProgram, Facts]]


def verify(p: SpatialProgram, target: SpatialTarget | None = None) -> SpatialProgram:
    """`p` marked verified, or the first broken rule's error. (The rules are the program's own; `target` only lets
    a program name a target spatialc does not list, the one it is verified for.)"""
    check_tables(p, target)
    ctx = Ctx.of(p)
    names = _Names()
    by_site: dict[Site, SiteProgs] = {}
    keys: dict[Site, tuple[object, ...]] = {}
    for site, listed in _programs_by_site(p).items():
        by_site[site] = [(prog, names.facts(ctx, prog)) for prog in listed]
        keys[site] = tuple((prog.engine, names.number(prog.ops)) for prog in listed)
    _check_site_refs(ctx, by_site)
    check_coverage(p, by_site)
    distinct = _distinct(by_site, keys)
    owners = stage_owners(ctx)
    for site, progs in distinct:
        check_site(ctx, site, progs, owners)
    check_bounds(ctx, p.plan, _runs(p, by_site, names))
    for site, progs in distinct:
        check_decidable(ctx, site, progs)
    check_deadlock(ctx, by_site, keys)
    return p.evolve(verified=True)


class _Names:
    """A number per distinct op tuple. Sites share op tuple objects, so most look-ups hit by identity and the
    (uncached, recursive) hash of a frozen op tree is computed once per object, not once per site."""

    def __init__(self) -> None:
        self.by_id: dict[int, tuple[int, tuple[ChoreoOp, ...]]] = {}  # the tuple is kept so its id stays its own
        self.by_value: dict[tuple[ChoreoOp, ...], int] = {}
        self.facts_of: dict[int, Facts] = {}

    def number(self, ops: tuple[ChoreoOp, ...]) -> int:
        """The number of `ops`' value."""
        hit = self.by_id.get(id(ops))
        if hit is None:
            hit = self.by_id[id(ops)] = (self.by_value.setdefault(ops, len(self.by_value)), ops)
        return hit[0]

    def facts(self, ctx: Ctx, prog: EngineProgram) -> Facts:
        """The facts of `prog`, walked once per distinct op tuple."""
        n = self.number(prog.ops)
        if n not in self.facts_of:
            self.facts_of[n] = facts_of(ctx, prog)
        return self.facts_of[n]


def _programs_by_site(p: SpatialProgram) -> dict[Site, list[EngineProgram]]:
    by_site: dict[Site, list[EngineProgram]] = {}
    for prog in p.schedule.programs if p.schedule else ():
        by_site.setdefault(prog.site, []).append(prog)
    return by_site


def _distinct(by_site: dict[Site, SiteProgs], keys: dict[Site, tuple[object, ...]]) -> list[tuple[Site, SiteProgs]]:
    """One site per distinct set of engine programs (the lowest-numbered), for the rules items do not affect."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for site in sorted(by_site):
        key = keys[site]
        if key not in seen:
            seen.add(key)
            out.append((site, by_site[site]))
    return out


def _runs(p: SpatialProgram, by_site: dict[Site, SiteProgs], names: _Names) -> list[Run]:
    """Each distinct program with the sites that run it and their items."""
    groups: dict[tuple[object, ...], tuple[EngineProgram, Facts, list[tuple[Site, tuple[ItemId, ...]]]]] = {}
    items = dict(p.placement.items_of_site) if p.placement else {}
    for site in sorted(by_site):
        for prog, facts in by_site[site]:
            entry = groups.setdefault((prog.engine, names.number(prog.ops)), (prog, facts, []))
            entry[2].append((site, items.get(site, ())))
    return [Run(prog, facts, tuple(sites)) for prog, facts, sites in groups.values()]


# ---- rule 1 on the tables: ids unique and resolving, sizes sane -----------------------------------------------


def _unique(kind: str, ids: Iterable[int]) -> None:
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            raise IllFormedError(f"two {kind}s have id {int(i)}")
        seen.add(i)


def check_tables(p: SpatialProgram, target: SpatialTarget | None = None) -> None:
    """Rule 1 for everything but the ops: a known target, sane shapes and plan, unique ids, resolving references,
    sane buffer sizes, stages that read inputs and write the output with sane compute ops."""
    check_target(p, target)
    check_tile(p)
    check_plans(p)
    check_tensors(p)
    _unique("tensor", (t.id for t in p.tensors))
    _unique("buffer", (b.id for b in p.buffers))
    _unique("semaphore", (s.id for s in p.semaphores))
    _unique("stage", (s.id for s in p.stages))
    _check_buffers(p)
    _check_stages(p)
    _check_layout(p)


def _check_buffers(p: SpatialProgram) -> None:
    buffers = {b.id: b for b in p.buffers}
    for b in p.buffers:
        match b.kind:
            case Accumulator(tiles) if tiles < 1:
                raise IllFormedError(f"accumulator {b.name} must hold at least 1 tile, not {tiles}", buffer=b.name)
            case Accumulator():
                pass
            case kind if kind.depth_pages < 1 or kind.page_tiles < 1:
                raise IllFormedError(
                    f"ring {b.name} must have pages ≥ 1 of tiles ≥ 1, not {kind.depth_pages} x {kind.page_tiles}",
                    buffer=b.name,
                )
        if b.origin is None:
            continue
        template = buffers.get(b.origin)
        if template is None or template.origin is not None:
            raise IllFormedError(
                f"buffer {b.name} is a copy of buffer {int(b.origin)}, which is not a template buffer", buffer=b.name
            )
        if template.kind != b.kind:
            raise IllFormedError(
                f"buffer {b.name} is a copy of {template.name} but is {b.kind}, not"
                f" {template.kind}: the copies of a template are one ring",
                buffer=b.name,
            )


def _check_stages(p: SpatialProgram) -> None:
    buffers, tensors = {b.id for b in p.buffers}, {t.id: t for t in p.tensors}
    for s in p.stages:
        for b in (*s.ins, *s.outs):
            if b not in buffers:
                raise IllFormedError(f"stage {s.name} names buffer {int(b)}, which does not exist")
        match s.kind:
            case ReadStage(t) | WriteStage(t) | ComputeStage(Bias(t)) if t not in tensors:
                raise IllFormedError(f"stage {s.name} names tensor {int(t)}, which does not exist")
            case ReadStage(t) if tensors[t].role == TensorRole.OUTPUT:
                raise IllFormedError(
                    f"stage {s.name} reads {tensors[t].name}, the output tensor; a read stage reads"
                    " an input or a parameter tensor"
                )
            case WriteStage(t) if tensors[t].role != TensorRole.OUTPUT:
                raise IllFormedError(
                    f"stage {s.name} writes {tensors[t].name}, {role_text(tensors[t])}; a write"
                    " stage writes the output tensor"
                )
            case ComputeStage(op) if (why := compute_fault(op, p.precision)) is not None:
                raise IllFormedError(f"stage {s.name}: {why}")


def _check_layout(p: SpatialProgram) -> None:
    if p.placement is None:
        if p.schedule is not None:
            raise IllFormedError("the program has a schedule but no placement")
        return
    if p.plan is None:
        raise IllFormedError(f"a placed program needs exactly one plan, not {len(p.plans)}")
    sites = set(p.placement.sites)
    if len(sites) != len(p.placement.items_of_site):
        dup = next(s for s in p.placement.sites if p.placement.sites.count(s) > 1)
        raise CoverageError(f"site {int(dup)} is listed twice in the placement", site=int(dup))
    _unique("group", (g.id for g in p.placement.groups))
    for g in p.placement.groups:
        for s in g.sites:
            if s not in sites:
                raise IllFormedError(
                    f"group {int(g.id)} names site {int(s)}, which the placement does not have", site=int(s)
                )
    seen: set[tuple[Site, str]] = set()
    for prog in p.schedule.programs if p.schedule else ():
        if prog.site not in sites:
            raise IllFormedError(
                f"{where(prog.site, prog.engine.value)}: the placement has no site {int(prog.site)}",
                site=int(prog.site),
                engine=prog.engine.value,
            )
        if (prog.site, prog.engine.value) in seen:
            raise IllFormedError(
                f"{where(prog.site, prog.engine.value)}: two programs for one engine",
                site=int(prog.site),
                engine=prog.engine.value,
            )
        seen.add((prog.site, prog.engine.value))


def _check_site_refs(ctx: Ctx, by_site: dict[Site, SiteProgs]) -> None:
    """Rule 1 for what depends on the site: a site names only groups it belongs to."""
    for site, progs in by_site.items():
        for prog, facts in progs:
            for g in sorted(facts.groups):
                if site not in ctx.groups[g].sites:
                    raise IllFormedError(
                        f"{where(site, prog.engine.value)}: uses group {int(g)}, which site {int(site)} is not in",
                        site=int(site),
                        engine=prog.engine.value,
                    )


# ---- rule 6 ------------------------------------------------------------------------------------------------------


def check_coverage(p: SpatialProgram, by_site: dict[Site, SiteProgs]) -> None:
    """Rule 6: items 0..ny·nx-1 each on exactly one site, and each site's programs loop over as many as it holds."""
    if p.placement is None or p.plan is None:
        return
    ny, nx = p.plan.grid
    n = ny * nx
    placed = sorted(itertools.chain.from_iterable(items for _, items in p.placement.items_of_site))
    if len(placed) != n or placed != list(range(n)):  # the length first: n can be far more than are placed
        _coverage_fault(p.placement.items_of_site, ny, nx)
    for site, items in p.placement.items_of_site:
        progs = by_site.get(site, [])
        if items and p.schedule is not None and not any(prog.ops for prog, _ in progs):
            raise CoverageError(
                f"site {int(site)} holds {len(items)} item(s) but the schedule gives it nothing to run", site=int(site)
            )
        for prog, facts in progs:
            _check_item_loops(p, site, len(items), prog, facts)


def _coverage_fault(items_of_site: Sequence[tuple[Site, tuple[ItemId, ...]]], ny: int, nx: int) -> None:
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
        if len(sites) != 1:
            which = f"on sites {', '.join(map(str, sites))}" if sites else "on no site"
            raise CoverageError(
                f"item {i} (y {i // nx}, x {i % nx}) of the {ny}x{nx} grid is {which}; each item is"
                " placed exactly once",
                site=sites[-1] if sites else None,
            )


def _check_item_loops(p: SpatialProgram, site: Site, held: int, prog: EngineProgram, facts: Facts) -> None:
    engine = prog.engine.value
    for loop, count in facts.item_loops:
        if count != held:
            text = Ctx.of(p).op(loop)
            raise CoverageError(
                f"{where(site, engine)}: {text} — the site holds {held} item(s) but its ITEM loop runs {count} time(s)",
                site=int(site),
                engine=engine,
                op=text,
            )
    if facts.item_free and held != 1:
        text = Ctx.of(p).op(facts.item_free[0])
        raise CoverageError(
            f"{where(site, engine)}: {text} — outside an ITEM loop item_y / item_x name the site's"
            f" only item, but the site holds {held}",
            site=int(site),
            engine=engine,
            op=text,
        )

"""The engine programs a kernel prints for a verified program: its sites grouped into classes that run the same
programs (their ITEM loop counts aside), each program inside an ITEM loop — what one kernel text, whose flow every site
of a class shares, runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ....ir.ids import LV_ITEM, GroupId, Site
from ....ir.nodes import Engine, SpatialProgram
from ....ir.ops import ChoreoOp, Const, Loop, McastSend, McastSetValid, SemInc, rewrite, walk
from ...errors import Unsupported
from .program import distinct_lists


def _normal(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    """`ops` with every ITEM loop's count erased: the one thing the kernel reads per site at run time."""
    return tuple(
        dataclasses.replace(
            op, count=Const(0) if op.var == LV_ITEM else op.count, first=min(op.first, 1), body=_normal(op.body)
        )
        if isinstance(op, Loop)
        else op
        for op in ops
    )


@dataclass(frozen=True, slots=True)
class SiteClass:
    """Sites that run the same engine programs (their ITEM loop counts aside), in blockIdx order, and those programs
    (each in an ITEM loop)."""

    sites: tuple[int, ...]
    engines: tuple[tuple[Engine, tuple[ChoreoOp, ...]], ...]


def site_classes(p: SpatialProgram, relative_sems: bool = False):
    """The sites with items, grouped by the engine programs they run, in the order of their first site — after
    checking that every site's ITEM loops run its share of the items and that a site without items runs nothing
    (the kernel returns at once for it).

    With `relative_sems`, returns (classes, relative): where reading every SemInc's site as an offset from the
    site that runs it makes fewer classes (split-K: every contributor raises the owner a fixed number of sites
    before it), the classes hold those offsets and `relative` is True."""
    if not relative_sems:
        return _classes(p, lambda site, ops: ops)
    # Multicast groups are named by their place in `relative_groups` either way (the printer reads them so).
    table = {offsets: i for i, offsets in enumerate(relative_groups(p))}
    absolute = _classes(p, lambda site, ops: _relative_view(p, table, site, ops, sems=False))
    relative = _classes(p, lambda site, ops: _relative_view(p, table, site, ops))
    return (relative, True) if len(relative) < len(absolute) else (absolute, False)


def relative_groups(p: SpatialProgram) -> tuple[tuple[int, ...], ...]:
    """Every multicast group a McastSend or McastSetValid names, seen from each site that names it: the offsets of
    its sites from that site, sorted; relative classes name a group by its place in this list."""
    assert p.placement is not None and p.schedule is not None
    groups = {g.id: g.sites for g in p.placement.groups}
    mcast = (McastSend, McastSetValid)
    named = {id(ops): [op.group for op in walk(ops) if isinstance(op, mcast)] for ops in distinct_lists(p)}
    seen = {
        tuple(int(t) - int(q.site) for t in groups[group]) for q in p.schedule.programs for group in named[id(q.ops)]
    }
    return tuple(sorted(seen))


def _relative_view(
    p: SpatialProgram, table: dict[tuple[int, ...], int], site: int, ops: tuple[ChoreoOp, ...], sems: bool = True
):
    """The view of `ops` site classes compare: every multicast group as its place in `relative_groups` and (with
    `sems`) every SemInc's site given as its offset from `site`."""
    assert p.placement is not None
    groups = {g.id: g.sites for g in p.placement.groups}

    def relative(op: ChoreoOp) -> ChoreoOp:
        if isinstance(op, SemInc) and sems:
            return dataclasses.replace(op, at=Site(int(op.at) - site))
        if isinstance(op, McastSend | McastSetValid):
            return dataclasses.replace(op, group=GroupId(table[tuple(int(t) - site for t in groups[op.group])]))
        return op

    return rewrite(ops, relative)


def _classes(p: SpatialProgram, view) -> tuple[SiteClass, ...]:
    assert p.placement is not None and p.schedule is not None
    groups: dict[tuple, list[int]] = {}
    programs: dict[tuple, tuple] = {}
    by_site = p.schedule.by_site()
    # Sites share their op lists (a few distinct ones among hundreds of sites): what depends only on the list is
    # found once per list, and the normal forms are interned so that a class key compares by identity.
    once = _PerList(view)
    for s, items in p.placement.items_of_site:
        progs = by_site.get(s, ())
        counts = set().union(*(once.item_counts(prog.ops) for prog in progs))
        # Each ITEM loop runs all the site's items — or, a split tail's, all but its last and then that one.
        runs = {Const(len(items))} | ({(Const(len(items) - 1), 0), (Const(1), len(items) - 1)} if items else set())
        if counts - runs or (not counts and len(items) > 1) or not all(once.tail_last(prog.ops) for prog in progs):
            raise Unsupported(
                f"site {int(s)} with {len(items)} items and ITEM loops of {sorted(map(str, counts))}",
                "the kernel's ITEM loop runs the site's share of the work list",
            )
        if not items:  # the kernel returns at once for it: nothing outside an ITEM loop (run no times) may be lost
            if any(not (isinstance(op, Loop) and op.var == LV_ITEM) for prog in progs for op in prog.ops):
                raise Unsupported(
                    f"site {int(s)}, which has no items and ops outside its ITEM loops", "it returns at once"
                )
            continue
        seen = tuple((prog.engine, once.view(int(s), prog.ops)) for prog in progs)
        key = tuple((engine, once.normal(ops)) for engine, ops in seen)
        groups.setdefault(key, []).append(int(s))
        programs.setdefault(key, seen)
    return tuple(
        SiteClass(tuple(sites), tuple((engine, _per_item(ops)) for engine, ops in programs[key]))
        for key, sites in groups.items()
    )


def _tail_last(ops: tuple[ChoreoOp, ...]) -> bool:
    """Whether an ITEM loop past the site's first item (a split tail's last item), if `ops` has one, is their last op,
    after their loop over the others: the kernel runs it as the site's last item of the work list."""
    if not any(isinstance(op, Loop) and op.var == LV_ITEM and op.first for op in walk(ops)):
        return True
    top = [isinstance(op, Loop) and op.var == LV_ITEM for op in ops]
    if top != [True, True] or ops[0].first or not ops[1].first:  # type: ignore[union-attr]
        return False
    return not any(isinstance(op, Loop) and op.var == LV_ITEM for loop in ops for op in walk(loop.body))  # type: ignore[union-attr]


_SITE_NAMING = (SemInc, McastSend, McastSetValid)  # the only ops a class view may read relative to their site


class _PerList:
    """`_classes`' look-ups, each made once per op list (by identity; the lists outlive the call): the ITEM loop
    counts, whether a split tail's loop comes last, the view (the same for every site where the list names no site or
    group), and the id of the interned normal form."""

    def __init__(self, view) -> None:
        self._view = view
        self._counts: dict[int, frozenset] = {}
        self._tails: dict[int, bool] = {}
        self._views: dict[int, tuple[ChoreoOp, ...]] = {}
        self._normals: dict[int, int] = {}
        self._kept: set[int] = set()
        self._interned: dict[tuple[ChoreoOp, ...], tuple[ChoreoOp, ...]] = {}

    def item_counts(self, ops: tuple[ChoreoOp, ...]) -> frozenset:
        """Each ITEM loop's count, or (count, first) where a program has an ITEM loop past the site's first item."""
        found = self._counts.get(id(ops))
        if found is None:
            loops = [op for op in walk(ops) if isinstance(op, Loop) and op.var == LV_ITEM]
            tail = any(op.first for op in loops)
            found = frozenset((op.count, op.first) if tail else op.count for op in loops)
            self._counts[id(ops)] = found
        return found

    def tail_last(self, ops: tuple[ChoreoOp, ...]) -> bool:
        """`_tail_last` of `ops`."""
        found = self._tails.get(id(ops))
        if found is None:
            found = self._tails[id(ops)] = _tail_last(ops)
        return found

    def view(self, site: int, ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
        found = self._views.get(id(ops))
        if found is not None:
            return found
        seen = self._view(site, ops)
        if not any(isinstance(op, _SITE_NAMING) for op in walk(ops)):
            self._views[id(ops)] = seen
            self._kept.add(id(seen))
        return seen

    def normal(self, ops: tuple[ChoreoOp, ...]) -> int:
        found = self._normals.get(id(ops))
        if found is None:
            normal = _normal(ops)
            found = id(self._interned.setdefault(normal, normal))
            if id(ops) in self._kept:  # a view held in `_views`: its id names no other list while the call lasts
                self._normals[id(ops)] = found
        return found


def site_engines(p: SpatialProgram) -> tuple[tuple[Engine, tuple[ChoreoOp, ...]], ...]:
    """Each engine and its program (in an ITEM loop), which every site with items runs: one kernel text, whose
    flow every site shares, runs them all."""
    classes = site_classes(p)
    if len(classes) > 1:
        raise Unsupported(
            f"site {classes[1].sites[0]}, whose engine programs differ from site {classes[0].sites[0]}'s",
            "one kernel text runs every site; only the number of items may differ",
        )
    return classes[0].engines


def printed_site_programs(p: SpatialProgram) -> tuple[tuple[ChoreoOp, ...], ...]:
    """The engine programs every site runs (`site_engines` without the engines)."""
    return tuple(ops for _, ops in site_engines(p))


def _per_item(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    """`ops` inside an ITEM loop when they have none: a program without one is the work of a site's only item, and
    the kernel runs whatever share of the items the device's sites get at launch — one, none or several."""
    if not ops or any(isinstance(op, Loop) and op.var == LV_ITEM for op in walk(ops)):
        return ops
    return (Loop(LV_ITEM, Const(0), ops),)

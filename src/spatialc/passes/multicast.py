"""multicast groups: sites that share operand pages instead of each reading them from global memory.

`build(p, multicast=(gy, gx))` lays the item grid out in blocks of gy × gx items and gives each block to a group of
gy × gx sites, site (r, c) of the group computing item (r, c) of the block. The sites of one group row need the same
A strip at every K step, those of one group column the same B strip. So one site reads each shared page: the first
site of a row (c = 0) reads A and sends it to the rest of its row, the first of a column (r = 0) reads B and sends it
down its column. A group runs its blocks in lock step: the j-th item of every site of a group lies in the group's
j-th block.

The handshake, per shared page (DESIGN §2, the standard one):

    receiver: Reserve X; SemInc ready → sender; SemWait valid ≥ 1; SemSet valid = 0; Push X
    sender:   Reserve X; ReadTiles → X; SemWait ready ≥ receivers; SemSet ready = 0; ReadBarrier;
              McastSend X → group; McastSetValid valid = 1 on group; Push X

A receiver offers its reserved page by raising the sender's `ready`; the sender waits until every receiver has,
copies its page into each receiver's reserved page and sets their `valid`; a receiver waits for valid, resets it
and publishes the page to its compute engine, which cannot tell a received page from one it read. Each reset is
done by the site that owns the semaphore, right after its wait: a counter with an epoch, which verify's rule 7
decides (passes/verify/handshake.py). The global reads of A fall by a factor gx and of B by gy
(`budget.global_read_bytes`).
"""

from __future__ import annotations

import warnings

from ..errors import ProgramError
from ..ir.ids import GroupId, ItemId, SemId, Site
from ..ir.nodes import Group, Placement, Plan, Semaphore, SpatialProgram
from ..ir.ops import ChoreoOp, McastSend, McastSetValid, ReadBarrier, ReadTiles, Reserve, SemInc, SemSet, SemWait
from ..ir.traffic import global_read_bytes

MAX_GROUP = 8  # sites of a group: a thread-block cluster holds 8 portably on sm_90 (16 only with an opt-in)
SEM_A_READY, SEM_A_VALID, SEM_B_READY, SEM_B_VALID = SemId(1), SemId(2), SemId(3), SemId(4)
SEMAPHORES = (
    Semaphore(SEM_A_READY, "a_ready", 0),
    Semaphore(SEM_A_VALID, "a_valid", 0),
    Semaphore(SEM_B_READY, "b_ready", 0),
    Semaphore(SEM_B_VALID, "b_valid", 0),
)


def asked(gy: int, gx: int) -> str:
    """A multicast group as the API and the command line each spell it, for the head of a refusal."""
    return f"multicast=({gy}, {gx}) (--multicast {gy},{gx})"


def check_multicast(multicast: object) -> tuple[int, int]:
    """`multicast` as (gy, gx), or ProgramError: two whole numbers ≥ 1 whose product is at most MAX_GROUP."""
    values = list(multicast) if isinstance(multicast, tuple | list) else []
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ProgramError(f"multicast must be two whole numbers (gy, gx) ≥ 1, not {multicast!r}")
    gy, gx = int(values[0]), int(values[1])
    if gy * gx > MAX_GROUP:
        raise ProgramError(f"{asked(gy, gx)}: a group holds at most {MAX_GROUP} sites, not {gy * gx}")
    return gy, gx


def multicast_placement(plan: Plan, gy: int, gx: int, sites: int, clusters: int | None = None) -> Placement:
    """Blocks of gy × gx items dealt round-robin to the ⌊sites / (gy·gx)⌋ site groups (at most one a block, and at
    most `clusters`: the thread-block clusters the device holds at once, `SpatialTarget.clusters_at_once`); site
    q·gy·gx + r·gx + c is site (r, c) of group q. Each group row (when gx > 1) and each group column (when gy > 1)
    is a multicast group; its first site sends.

    Why `clusters`: a cluster lives in one GPC, and the H100 of the first GPU run (132 SMs) held 30 clusters of 4
    one-block-an-SM sites at once, not 33; the rest would run after the others in a second wave, almost doubling
    the time."""
    ny, nx = plan.grid
    if ny % gy or nx % gx:
        raise ProgramError(
            f"{asked(gy, gx)}: the plan's grid of {ny}×{nx} items does not fall into groups of {gy}×{gx}"
            f" items (use a group that divides it, or a block that makes it divisible)"
        )
    per = gy * gx
    blocks = (ny // gy) * (nx // gx)
    n_groups = min(blocks, sites // per, sites if clusters is None else clusters)
    if n_groups < 1:
        raise ProgramError(f"{asked(gy, gx)}: a group needs {per} sites and there are {sites}")
    listed: list[tuple[Site, tuple[ItemId, ...]]] = []
    groups: list[Group] = []
    for q in range(n_groups):
        mine = range(q, blocks, n_groups)
        for r in range(gy):
            for c in range(gx):
                items = []
                for b in mine:
                    by, bx = divmod(b, nx // gx)
                    items.append(ItemId((by * gy + r) * nx + bx * gx + c))
                listed.append((Site(q * per + r * gx + c), tuple(items)))
        first = q * per
        rows = [_row_col(first + r * gx, gy, gx)[0] for r in range(gy)] if gx > 1 else []
        cols = [_row_col(first + c, gy, gx)[1] for c in range(gx)] if gy > 1 else []
        groups += [Group(GroupId(len(groups) + i), g) for i, g in enumerate(rows + cols)]
    # No idle sites after the groups: a kernel's grid is a whole number of clusters (one a group).
    return Placement(tuple(listed), tuple(groups), "multicast", 0, 1, (gy, gx))


class MulticastWarning(UserWarning):
    """A multicast build whose plan reads no fewer bytes from global memory than the same request's best plan
    without groups: the groups' smaller (or other) block cost what their sharing saved. The CLI prints it as a
    `note` line."""


def say_reads(grouped: SpatialProgram, plain: SpatialProgram) -> str | None:
    """Warn (MulticastWarning, at the user's line) where the multicast build `grouped` reads no fewer bytes from
    global memory (`ir.traffic`) than `plain`, the same request built without groups; the warning's text, or None."""
    ours, theirs = global_read_bytes(grouped), global_read_bytes(plain)
    if ours < theirs:
        return None
    assert grouped.placement is not None
    gy, gx = grouped.placement.multicast
    than = "more than" if ours > theirs else "as many as"
    text = (
        f"{asked(gy, gx)} reads {_bytes(ours)} from global memory ({_plan(grouped)}), {than} the best plan without"
        f" groups: {_bytes(theirs)} ({_plan(plain)}); the groups save no reads here"
    )
    from ..inputs import _outside_spatialc

    warnings.warn(text, MulticastWarning, stacklevel=_outside_spatialc())
    return text


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB ({n} bytes)"


def _plan(p: SpatialProgram) -> str:
    assert p.plan is not None
    b, (gy, gx) = p.plan.block, p.plan.grid
    return f"block {b.osh}x{b.osw}x{b.ibw}, grid {gy}x{gx} items"


def add_semaphores(p: SpatialProgram) -> SpatialProgram:
    """The program with the handshake's four semaphores."""
    taken = {int(s.id) for s in p.semaphores} & {int(s.id) for s in SEMAPHORES}
    if taken:
        raise ProgramError(f"program {p.name} already has semaphore(s) {sorted(taken)}")
    return p.evolve(semaphores=(*p.semaphores, *SEMAPHORES))


def _row_col(site: int, gy: int, gx: int) -> tuple[tuple[Site, ...], tuple[Site, ...]]:
    """The sites of `site`'s group row and group column (site q·gy·gx + r·gx + c is site (r, c) of group q)."""
    per = gy * gx
    first, (r, c) = site - site % per, divmod(site % per, gx)
    row = tuple(Site(first + r * gx + j) for j in range(gx))
    col = tuple(Site(first + i * gx + c) for i in range(gy))
    return row, col


def roles(placement: Placement, site: Site) -> tuple[Group | None, Group | None]:
    """The multicast groups `site` shares A in (its group row) and B in (its group column); None where it shares
    nothing. A group's first site is its sender."""
    gy, gx = placement.multicast
    row, col = _row_col(int(site), gy, gx)
    by_sites = {g.sites: g for g in placement.groups}
    return (by_sites.get(row) if gx > 1 else None), (by_sites.get(col) if gy > 1 else None)


def share(
    ops: tuple[ChoreoOp, ...], read: ReadTiles, group: Group | None, site: Site, ready: SemId, valid: SemId
) -> tuple[ChoreoOp, ...]:
    """A reader's K-step ops with `read`'s page shared over `group`: sent by its first site, received by the rest."""
    if group is None:
        return ops
    at = ops.index(read)
    if site == group.sites[0]:
        send = (
            SemWait(ready, len(group.sites) - 1),
            SemSet(ready, 0),
            ReadBarrier(),
            McastSend(read.into, group.id),
            McastSetValid(valid, group.id, 1),
        )
        return (*ops[: at + 1], *send, *ops[at + 1 :])
    assert isinstance(ops[at - 1], Reserve)
    receive = (SemInc(ready, group.sites[0], 1), SemWait(valid, 1), SemSet(valid, 0))
    return (*ops[:at], *receive, *ops[at + 1 :])


__all__ = [
    "MAX_GROUP",
    "MulticastWarning",
    "SEMAPHORES",
    "add_semaphores",
    "check_multicast",
    "multicast_placement",
    "roles",
    "say_reads",
    "share",
]

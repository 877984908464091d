"""The general form's hand-overs between sites: semaphores and group barriers in global memory (a multicast group's
handshake is printed on its cluster's barriers instead: clusters.py). What `general` prints for `SemInc`, `SemWait`,
a reset `SemSet`, `Barrier` and `ReadBarrier`, and what the kernel decides about them before printing: its sync words
and its clusters (a multicast group is an sm_90 thread-block cluster)."""

from __future__ import annotations

from typing import Any

from ....ir.nodes import SpatialProgram
from ....ir.ops import (
    Barrier,
    ChoreoOp,
    Loop,
    McastSend,
    McastSetValid,
    ReadBarrier,
    SemInc,
    SemSet,
    SemWait,
    Trip,
    walk,
)
from ....target import SpatialTarget
from ...census import marker
from ...errors import Unsupported
from .cwriter import Writer
from .program import all_ops

Words = dict[tuple[str, int], int]  # ("group" | "sem", id) → its first word in spatialc_sync (one per site)


def clusters(p: SpatialProgram, target: SpatialTarget) -> int:
    """Sites per thread-block cluster: 1 without multicast; with it, the group shape's sites, where every group
    (and every site a semaphore of a group's site raises) lies within one aligned run of that many sites — a page
    multicast travels through distributed shared memory, which only a cluster's blocks share (sm_90)."""
    assert p.placement is not None
    ops = all_ops(p)
    if not any(isinstance(op, McastSend | McastSetValid) for op in ops):
        return 1
    if not target.name.startswith("sm_9"):
        raise Unsupported(
            f"multicast groups on {target.name}",
            "a group is a thread-block cluster whose sites share shared memory, which sm_90 has and sm_80/86 do not;"
            " build for sm_90 (a staging buffer in global memory would read the shared pages from L2 again)",
        )
    gy, gx = p.placement.multicast
    size = gy * gx
    sites = len(p.placement.items_of_site)
    far = [g for g in p.placement.groups if len({int(s) // size for s in g.sites}) > 1]
    if size < 2 or sites % size or far or any(isinstance(op, Barrier) for op in ops):
        what = f"group {int(far[0].id)}" if far else "this placement"
        raise Unsupported(
            f"{what} as thread-block clusters",
            f"each group must lie within one aligned run of {size} sites (the multicast shape {gy}x{gx}) of a grid"
            " that is a whole number of them, without group barriers",
        )
    for q in p.schedule.programs:  # type: ignore[union-attr]
        sends = [op for op in walk(q.ops) if isinstance(op, McastSend)]
        if len({p.buffer(op.buf).ring for op in sends}) < len(sends):
            raise Unsupported(
                f"site {int(q.site)}'s two multicasts of one ring",
                "the kernel counts a ring's sends to find each receiver's page: one McastSend a ring",
            )
        for op in walk(q.ops):
            if isinstance(op, SemInc) and int(op.at) // size != int(q.site) // size:
                raise Unsupported(
                    f"a semaphore raise from site {int(q.site)} to site {int(op.at)}",
                    f"the sites of a multicast kernel wait only within their cluster of {size}",
                )
    return size


def sync_words(
    p: SpatialProgram, on_barriers: frozenset[int] = frozenset()
) -> tuple[int, Words, dict[int, tuple[int, ...]], tuple[int, ...], int]:
    """The sites, where each barrier group's arrival counts and each semaphore's copies start in `spatialc_sync`
    (one word per site each) — but the semaphores `on_barriers`, a multicast handshake's, which are mbarriers in the
    cluster's shared memory (clusters.py) — each group's sites, every word's initial value (counts at 0, a
    semaphore's copies at its initial value) and, for a program with loop counts read from data, the first of the two
    words after them for an error (-1: none)."""
    assert p.placement is not None
    n = len(p.placement.items_of_site)
    ops = all_ops(p)
    groups = sorted({int(op.group) for op in ops if isinstance(op, Barrier)})
    sems = [
        s
        for s in p.semaphores
        if int(s.id) not in on_barriers and any(isinstance(op, SemInc | SemWait) and op.sem == s.id for op in ops)
    ]
    words = {("group", g): i * n for i, g in enumerate(groups)}
    words |= {("sem", int(s.id)): (len(groups) + i) * n for i, s in enumerate(sems)}
    members = {g: tuple(int(s) for s in next(x.sites for x in p.placement.groups if int(x.id) == g)) for g in groups}
    initial = (0,) * (len(groups) * n) + tuple(s.initial for s in sems for _ in range(n))
    if not any(isinstance(op, Loop) and isinstance(op.count, Trip) for op in ops):
        return n, words, members, initial, -1
    return n, words, members, (*initial, 0, 0), len(initial)


class HandoverPrinter:
    """The hand-over ops of one engine of the general form (a mixin of `general.printer.EnginePrinter`, whose kernel
    `k`, writer `w`, engine `role`, `engine_sync` and `kept` it uses)."""

    k: Any
    w: Writer
    role: Any
    engine_sync: Any  # (annotations only: the methods are EnginePrinter's and TilePrinter's)
    kept: Any

    def handover(self, op: ChoreoOp, mark: str) -> bool:
        """Print `op` if it hands over between engines or sites, and say whether it did."""
        match op:
            case ReadBarrier():
                # Every thread's cp.async copies have landed, and the engine's threads see each other's.
                with self.w.block("", mark):
                    self.w.line("__pipeline_commit();")
                    self.w.line("__pipeline_wait_prior(0);")
                    self.w.line(self.engine_sync())
            case Barrier(group):
                self.barrier(int(group), mark)
            case SemInc(sem, at, by):
                # The engine's threads meet first, so that what they did is released with the add.
                with self.w.block("", mark):
                    self.w.line(self.engine_sync())
                    base = self.k.words[("sem", int(sem))]
                    to = self.site_expr(at)
                    self.w.line(f"if (etid == 0) {{ spatialc_grid_add(spatialc_sync + {base} + {to}, {by}); }}")
            case SemWait(sem, value):
                # The first thread waits on the site's own copy; the others wait for it at the engine's barrier.
                with self.w.block("", mark):
                    base = self.k.words[("sem", int(sem))]
                    self.w.line(f"if (etid == 0) {{ spatialc_grid_wait(spatialc_sync + {base} + site, {value}); }}")
                    self.w.line(self.engine_sync())
            case _:
                return False
        return True

    @staticmethod
    def offset(o: int) -> str:
        return "site" if o == 0 else f"(site {'+' if o > 0 else '-'} {abs(o)})"

    def reset(self, op: SemSet, before: ChoreoOp | None) -> None:
        """SemSet: only a reset to 0 right after the engine's own wait for v on it passes verify — so the count is
        v then (`handshake`), and taking v away resets it."""
        if not (isinstance(before, SemWait) and before.sem == op.sem and op.value == 0):
            raise Unsupported("a SemSet not right after its own wait", "only a reset after the wait is printed")
        base = self.k.words[("sem", int(op.sem))]
        add = f"spatialc_grid_add(spatialc_sync + {base} + site, {-before.value});"
        self.w.line(f"if (etid == 0) {{ {add} }}", marker(op))

    def site_expr(self, at) -> str:
        """A SemInc's site: itself, or — where the site classes hold SemIncs relative to their site (`relative`) —
        this site plus the offset."""
        if not self.k.relative:
            return str(int(at))
        return self.offset(int(at))

    def barrier(self, group: int, mark: str) -> None:
        """Every site of the group arrives, and waits until every site has arrived as often: the engine's threads
        meet first (so what they did is released with the arrival), its first thread adds the site's arrival at
        device scope and waits on the others' with acquire loads, and the engine's threads meet again."""
        base, sync = self.k.words[("group", group)], self.engine_sync()
        members = self.k.members[group]
        with self.w.block("", mark):
            self.w.line(sync)
            with self.w.block("if (etid == 0)"):
                self.w.line(f"spatialc_grid_add(spatialc_sync + {base} + site, 1);")
                self.w.line(f"++crossed_{group};")
                if members == tuple(range(len(members))):
                    with self.w.block(f"for (int s = 0; s < {len(members)}; ++s)"):
                        self.w.line(f"spatialc_grid_wait(spatialc_sync + {base} + s, crossed_{group});")
                else:
                    for s in members:
                        self.w.line(f"spatialc_grid_wait(spatialc_sync + {base} + {s}, crossed_{group});")
            self.w.line(sync)

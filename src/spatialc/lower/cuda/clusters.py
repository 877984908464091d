"""The sm_90a form's multicast groups: thread-block clusters whose operand pages the copy engine multicasts.

The IR's handshake (passes/multicast.py) has, per page of a shared ring, a receiver that reserves its stage and
raises the sender's *ready* semaphore, a sender that waits for every receiver's raise, sends the page and sets each
receiver's *valid* semaphore, and receivers that wait for it before they push. On Hopper each part has a cheaper
image, and nothing else changes:

- *ready* is an mbarrier per stage of the ring in every block (used in the sender's), counting one arrival per
  receiver; a receiver's raise is an arrival on it through distributed shared memory, made after the receiver has
  announced the page's bytes on its own full barrier (`expect_tx`), so that its count is never short of bytes
  already landed. The sender's wait is a wait on that barrier's phase.
- the send is one TMA load multicast to the group's blocks (`.multicast::cluster`): the same box lands at the same
  offset of each block's shared memory and counts on the full barrier at the same offset there. The sender's
  `ReadTiles` of the page *is* that load; it is issued where the IR sends the page (after the ready wait), since it
  writes the receivers' stages too.
- *valid* needs no image: the receiver's full barrier completes only once the bytes have landed, so the receiver's
  `Push` (its arrival) is made at once and its consumers wait for the page exactly as for one it loaded itself.

The pages land at the sender's stage offset in every block, so the sender's n-th sent page and each receiver's n-th
reserved page must be the same stage: both count the ring's pages alike (one reserve per page, as verify's
rule 8 proved for the handshake), and the rings have one depth. The cluster barrier after the barriers'
initialisation lets a peer use them; the one before exit is CUDA's rule for distributed shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...ir.nodes import SpatialProgram
from ...ir.ops import (
    Barrier,
    ChoreoOp,
    McastSend,
    McastSetValid,
    Push,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    walk,
)
from ..census import marker
from ..errors import Unsupported
from .handover import HandoverPrinter
from .program import all_ops

CLUSTER_MAX = 8  # blocks of a portable cluster (larger ones need an opt-in the form does not make)


@dataclass(frozen=True, slots=True)
class Multicast:
    """What the sm_90a form prints for a program's multicast handshake."""

    ready: dict[int, int]  # semaphore → the ring whose stages receivers announce free with it
    valid: dict[int, int]  # semaphore → the ring whose sent pages it announces (the bytes do, here)
    receivers: dict[int, int]  # ring → receivers of each of its pages: its ready barriers' arrival count

    @property
    def rings(self) -> tuple[int, ...]:
        return tuple(sorted(self.receivers))


def multicast(p: SpatialProgram, template: dict) -> Multicast | None:
    """The handshake of `p` by ring (`template`: buffer → kept ring), or None without multicast; Unsupported where
    a semaphore is used other than as the handshake's."""
    ops = all_ops(p)
    if not any(isinstance(op, McastSend) for op in ops):
        if any(isinstance(op, SemInc | SemWait | SemSet | Barrier) for op in ops):
            raise Unsupported("a handshake between sites", "the sm_90a form prints multicast handshakes only")
        return None
    if any(isinstance(op, Barrier) for op in ops):
        raise Unsupported("a group barrier", "the sm_90a form prints multicast handshakes only")
    shared = {template[op.buf] for op in ops if isinstance(op, McastSend)}
    ready: dict[int, int] = {}
    valid: dict[int, int] = {}
    receivers: dict[int, int] = {}

    def claim(table: dict[int, int], sem: int, ring: int) -> None:
        other = valid if table is ready else ready
        if table.setdefault(sem, ring) != ring or sem in other:
            raise Unsupported(f"semaphore {sem} in two roles", "each multicast ring has its own ready and valid")

    assert p.schedule is not None
    for q in p.schedule.programs:
        body = tuple(walk(q.ops))
        sends = {template[op.buf] for op in body if isinstance(op, McastSend)}
        page: int | None = None  # the shared ring whose page the engine is between reserving and pushing
        for op in body:
            match op:
                case Reserve(buf) if template[buf] in shared:
                    page = template[buf]
                case Push(buf) if template[buf] == page:
                    page = None
                case SemWait(sem, value) | SemSet(sem, value) | SemInc(sem, _, value) if page is None:
                    raise Unsupported(
                        f"a {type(op).__name__} of semaphore {int(sem)} outside a multicast's handshake",
                        "the sm_90a form prints multicast handshakes only",
                    )
                case SemWait(sem, value) if page in sends:  # the sender: every receiver's stage is free
                    claim(ready, int(sem), page)
                    if receivers.setdefault(page, value) != value:
                        raise Unsupported(f"senders of ring {page} waiting for different counts", "one group size")
                case SemWait(sem, value):  # a receiver: the page has landed
                    claim(valid, int(sem), page)
                case SemInc(sem, _, by):
                    claim(ready, int(sem), page)
                    if by != 1:
                        raise Unsupported(f"a ready raise by {by}", "each receiver arrives once a page")
                case McastSetValid(sem):
                    claim(valid, int(sem), page)  # type: ignore[arg-type]
                case SemSet(sem, 0):
                    pass  # the reset after a wait: a barrier's phase moves on by itself
                case SemSet():
                    raise Unsupported("a SemSet to a count", "only the reset after the wait is a barrier's phase")
    missing = shared - set(receivers)
    if missing:
        raise Unsupported(f"ring {min(missing)} multicast with no ready wait", "the handshake waits for the receivers")
    return Multicast(ready, valid, receivers)


def check_cluster(cluster: int) -> None:
    if cluster > CLUSTER_MAX:
        raise Unsupported(
            f"clusters of {cluster} blocks", f"a portable cluster holds at most {CLUSTER_MAX}: use a smaller group"
        )


def mask_expr(offsets: tuple[int, ...], cluster: int) -> str:
    """The multicast's block mask: bit r for each cluster rank of the group's sites (offsets from this site; every
    group lies within one cluster, the `cluster` consecutive sites of blockIdx.x)."""
    bits = " | ".join(f"(1u << {rank_of(HandoverPrinter.offset(o), cluster)})" for o in offsets)
    return f"(unsigned short)({bits})"


def rank_of(site: str, cluster: int) -> str:
    """The cluster rank of the site `site` (an int expression): never negative, whatever the offset."""
    return f"((({site}) % {cluster} + {cluster}) % {cluster})"


def check_items(p: SpatialProgram, cluster: int) -> None:
    """Every site of a cluster holds as many items: a site with none returns at once, and its peers would wait for
    it at the handshake (or multicast into a block that has exited)."""
    assert p.placement is not None
    counts = [len(items) for _, items in p.placement.items_of_site]
    for first in range(0, len(counts), cluster):
        run = counts[first : first + cluster]
        if len(set(run)) > 1:
            raise Unsupported(
                f"sites {first}..{first + len(run) - 1} holding {run} items",
                "every site of a cluster takes part in each page's handshake: give them as many items",
            )


class ClusterPrinter:
    """The handshake's ops of one engine of the sm_90a form (a mixin of `hopper_printer.HopperPrinter`)."""

    hk: Any
    k: Any
    w: Any
    kept: Any
    write_slot: Any
    site_expr: Any
    tma: Any
    sends: frozenset[int]
    deferred: dict[int, tuple[ChoreoOp, dict]]

    def handshake(self, op: ChoreoOp, env: dict, mark: str) -> bool:
        """Print `op` if it is part of a multicast handshake, and say whether it was."""
        mc: Multicast | None = self.hk.multicast
        if mc is None:
            return False
        cluster = self.k.cluster
        match op:
            case SemWait(sem, _) if int(sem) in mc.ready:
                r = mc.ready[int(sem)]
                slot, phase = self.write_slot(r), f"((rsv_{r} - 1) / DEPTH_{r}) & 1"
                self.w.line(f"spatialc_mbar_wait_cluster(&ready_{r}[{slot}], {phase});", f"{mark} (receivers ready)")
            case SemWait(sem, _) if int(sem) in mc.valid:
                self.w.line("", f"{mark} (the sender's bytes complete this block's full barrier)")
            case SemInc(sem, at, _) if int(sem) in mc.ready:
                r = mc.ready[int(sem)]
                ring = self.k.rings.rings[r]
                slot = self.write_slot(r)
                with self.w.block("", mark):
                    nbytes = ring.page * ring.elem_bytes
                    self.w.line(f"spatialc_mbar_expect_tx(&full_{r}[{slot}], {nbytes}u);  // the page the sender sends")
                    rank = rank_of(self.site_expr(at), cluster)
                    self.w.line(f"spatialc_mbar_arrive_cluster(&ready_{r}[{slot}], {rank});  // this stage is free")
            case McastSend(buf, group):
                r = self.kept(buf).id
                if r not in self.deferred:
                    raise Unsupported(f"a multicast of ring {r} with no ReadTiles", "the sender loads what it sends")
                load, at_env = self.deferred.pop(r)
                self.tma(load, at_env, mark, mask_expr(self.k.groups[int(group)], cluster))
            case McastSetValid():
                self.w.line("", f"{mark} (the bytes complete each receiver's full barrier)")
            case _:
                return False
        return True

    def handshake_reset(self, op: SemSet) -> bool:
        mc: Multicast | None = self.hk.multicast
        if mc is None or (int(op.sem) not in mc.ready and int(op.sem) not in mc.valid):
            return False
        self.w.line("", f"{marker(op)} (the barrier's phase moves on by itself)")
        return True

"""Multicast groups as thread-block clusters: the handshake's analysis, and its image in the two forms that print it.

The IR's handshake (passes/multicast.py) has, per page of a shared ring, a receiver that reserves its stage and
raises the sender's *ready* semaphore, a sender that waits for every receiver's raise, sends the page and sets each
receiver's *valid* semaphore, and receivers that wait for it before they push. On Hopper each part has a cheaper
image on the blocks' own barriers, reached through distributed shared memory, and nothing else changes:

- *ready* is an mbarrier per stage of the ring in every block (used in the sender's), counting one arrival per
  receiver; a receiver's raise is an arrival on it through distributed shared memory. The sender's wait is a wait on
  that barrier's phase. (sm_90a: the receiver first announces the page's bytes on its own full barrier,
  `expect_tx`, so that its count is never short of bytes already landed.)
- the send, in the sm_90a form, is one TMA load multicast to the group's blocks (`.multicast::cluster`): the same box
  lands at the same offset of each block's shared memory and counts on the full barrier at the same offset there.
  The sender's `ReadTiles` of the page *is* that load; it is issued where the IR sends the page (after the ready
  wait), since it writes the receivers' stages too. In the general form the sender's engine copies its page into
  each receiver's stage, 16 bytes a thread at a time (`st.shared::cluster`), and each of its threads then arrives on
  the full barrier of that stage in each receiver, releasing its own stores at cluster scope.
- *valid* needs no image: the receiver's full barrier completes only once the page has landed (the bytes, or the
  sender's arrivals), so its consumers wait for the page at cluster scope exactly as for one it loaded itself. The
  receiver's engine goes on at once: it reserves the next stages and raises ready for them while the sender still
  sends, so the ring's depth, not a round trip between the blocks, sets the pace. (sm_90a: the receiver's `Push` is
  its arrival, made at once; general form: the sender's arrivals are the `Push`, the receiver's prints nothing.)

The sm_90a form's pages land at the sender's stage offset in every block, so the sender's n-th sent page and each
receiver's n-th reserved page must be the same stage: both count the ring's pages alike (one reserve per page, as
verify's rule 8 proved for the handshake), and the rings have one depth. The general form copies into the stage of
the receiver's n-th reserved page (the sender's n-th send), wherever its own page is. The cluster barrier after the
barriers' initialisation lets a peer use them; the one before exit is CUDA's rule for distributed shared memory.

Why not the semaphores in global memory the general form printed first: a page then waited on two round trips
through L2 (the receiver's raise, the sender's flags), six device-scope fences and a one-warp copy, in lock step —
one page in flight per group, whatever the ring's depth — which the first GPU run measured at 4.1–5.0 µs a K step
against 0.6–1.2 µs without groups (bench/README.md, "The first GPU run").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ....ir.nodes import SpatialProgram
from ....ir.ops import (
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
from ...census import marker
from ...errors import Unsupported
from .handover import HandoverPrinter
from .program import all_ops

CLUSTER_MAX = 8  # blocks of a portable cluster (larger ones need an opt-in the form does not make)
ONLY = "a kernel of thread-block clusters prints multicast handshakes only"


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
            raise Unsupported("a handshake between sites", ONLY)
        return None
    if any(isinstance(op, Barrier) for op in ops):
        raise Unsupported("a group barrier", ONLY)
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
                        ONLY,
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
    """The handshake's ops of one engine of the sm_90a form (a mixin of `sm90a.printer.HopperPrinter`)."""

    hk: Any
    k: Any
    w: Any
    kept: Any
    write_slot: Any
    site_expr: Any
    tma: Any
    page_bytes: Any  # the bytes ring r's page brings to the full barrier (sm_90a: A's scales' box too)
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
                slot = self.write_slot(r)
                with self.w.block("", mark):
                    nbytes = self.page_bytes(r)
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
        return reset_image(self.hk.multicast, op, self.w)


def reset_image(mc: Multicast | None, op: SemSet, w: Any) -> bool:
    """A handshake semaphore's reset: nothing to print (a barrier's phase moves on by itself); False for another."""
    if mc is None or (int(op.sem) not in mc.ready and int(op.sem) not in mc.valid):
        return False
    w.line("", f"{marker(op)} (the barrier's phase moves on by itself)")
    return True


class GeneralClusterPrinter:
    """The handshake's ops of one engine of the general form (a mixin of `general.printer.EnginePrinter`, whose
    kernel `k`, writer `w`, engine `role` and slots it uses): the receivers' raise an arrival on the sender's ready
    barrier, the sender's wait a wait on it, the send a copy into each receiver's stage by every thread of the engine,
    the valid flag each thread's arrival on that stage's full barrier in each receiver."""

    k: Any
    w: Any
    role: Any
    kept: Any
    write_slot: Any
    site_expr: Any
    offset: Any
    engine_sync: Any
    received: set[int]  # rings whose page the engine waited for as a receiver and has not pushed yet

    def cluster_handshake(self, op: ChoreoOp, mark: str) -> bool:
        """Print `op` if it is part of a multicast handshake, and say whether it was."""
        mc: Multicast | None = self.k.multicast
        if mc is None:
            return False
        match op:
            case SemInc(sem, at, _) if int(sem) in mc.ready:
                # Every thread of the engine waited for the stage to be free (its Reserve): one tells the sender.
                r, rank = mc.ready[int(sem)], rank_of(self.site_expr(at), self.k.cluster)
                arrive = f"spatialc_mbar_arrive_cluster(&ready_{r}[{self.write_slot(r)}], {rank});"
                self.w.line(f"if (etid == 0) {{ {arrive} }}", f"{mark} (this stage is free)")
            case SemWait(sem, _) if int(sem) in mc.ready:
                r = mc.ready[int(sem)]
                wait = f"spatialc_mbar_wait_cluster(&ready_{r}[snd_{r} % DEPTH_{r}], (snd_{r} / DEPTH_{r}) & 1);"
                self.w.line(wait, f"{mark} (every receiver's stage is free)")
            case SemWait(sem, _) if int(sem) in mc.valid:
                self.received.add(mc.valid[int(sem)])
                self.w.line("", f"{mark} (the sender's arrivals on the full barrier publish the page)")
            case McastSend(buf, group):
                self.send(self.kept(buf).id, self.k.groups[int(group)], mark)
            case McastSetValid(sem, group, _) if int(sem) in mc.valid:
                # Each thread's arrival releases the stores it made into the receiver's stage: when the phase
                # completes there, every thread's have landed. The receiver's Push has no arrival of its own.
                r, cluster = mc.valid[int(sem)], self.k.cluster
                with self.w.block("", mark):
                    for o in self.k.groups[int(group)]:
                        if o:
                            rank = rank_of(self.offset(o), cluster)
                            self.w.line(f"spatialc_mbar_arrive_cluster(&full_{r}[(snd_{r} - 1) % DEPTH_{r}], {rank});")
            case _:
                return False
        return True

    def received_push(self, r: int, mark: str) -> bool:
        """A receiver's Push of the page it waited for: nothing to print (the sender's arrivals are it)."""
        if r not in self.received:
            return False
        self.received.discard(r)
        self.w.line(f"++psh_{r};", f"{mark} (published by the sender's arrivals)")
        return True

    def send(self, r: int, offsets: tuple[int, ...], mark: str) -> None:
        """McastSend: the newest reserved page, 16 bytes a thread at a time, into the page of the same slot as this
        ring's n-th send in each other site of the group — its n-th reserved page, as verify proved — through
        distributed shared memory (the group is a cluster of `k.cluster` sites)."""
        with self.w.block("", mark):
            # The page's own copies have landed, every thread's (verify does not ask for the ReadBarrier before it).
            self.w.line("__pipeline_commit();")
            self.w.line("__pipeline_wait_prior(0);")
            self.w.line(self.engine_sync())
            self.w.line(f"const char* src = (const char*)(ring_{r} + ((rsv_{r} - 1) % DEPTH_{r}) * PAGE_{r});")
            self.w.line(f"const char* dst = (const char*)(ring_{r} + (snd_{r} % DEPTH_{r}) * PAGE_{r});")
            chunks = f"(int)(PAGE_{r} * sizeof(*ring_{r}) / 16)"
            with self.w.block(f"for (int i = etid; i < {chunks}; i += {self.role.threads})"):
                for o in offsets:
                    if o:
                        at = self.offset(o)
                        copy = f"spatialc_dsmem_copy16(src + 16 * i, dst + 16 * i, {at}, {at} % {self.k.cluster});"
                        self.w.line(copy)
            self.w.line(f"++snd_{r};")

"""Rule 7 for handshakes whose semaphores are reset: counters with an epoch, and multicast pages.

A semaphore copy that is reset — `SemWait s ≥ v; SemSet s = 0`, by the engine of the site that owns the copy,
right after its own wait — is a counter with an epoch (DESIGN §4, "What verified means"). Counted from the start
instead of from its last reset, it only rises: the e-th wait passes once the raises reach v_0 + … + v_e. So the
program is the same as one with monotone counters (which one counter run decides, `deadlock`), *provided no raise
is lost*: when the owner resets, the count must be exactly v — no raise meant for the next epoch may come before
the reset. `McastSetValid s = 1` sets each copy rather than adding to it; it is the same as a raise of 1 provided
the copy is 0 when it lands, which is the same condition.

That condition is about every interleaving, and one run decides it with vector clocks. The run follows the
happens-before edges every interleaving shares: program order, the n-th push of a ring before the wait that needs
it, the pop that freed a page before the reserve that takes it, each site's n-th arrival at a barrier before the
n-th crossing, and the e-th epoch's raises before the e-th wait on it passes. A plain (never reset) semaphore
orders nothing here: which of its raises let a wait pass can depend on the interleaving, so its waits acquire no
clock — a loss of precision, never of soundness. The run checks that every raise of epoch e ≥ 1 happens after the
owner's (e−1)-th reset and that no raise of epoch e+1 has come when the e-th wait passes. Induction over a run's
events gives the rest: while no raise is early, every wait needs exactly its epoch's raises in every interleaving,
so every edge above is one every interleaving has, and so is every raise's order after the reset before it.

A multicast page is checked the same way. The n-th McastSend of a ring to a group copies into each receiver's
n-th page of the ring (the newest it has reserved then): so the receiver's reserve of page n must happen before the
send (else the send overwrites a page the receiver may still read: page n − depth), the send before the receiver
reserves page n + 1 (else it lands in the wrong page), and before the receiver pushes page n (else its consumer
reads the page before it is there).

Which copies are counters with an epoch, and what is refused before the run (`epoch_copies`): a SemSet anywhere
but right after its own site's wait on the same semaphore, a reset to anything but 0, a McastSetValid that sets 0
(a reset by a site that does not own the copy), a McastSetValid onto a copy that is waited on without resets, and
a multicast into a ring more than one site sends into.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...errors import HandshakeError, StrongerCheckNeeded
from ...ir.ids import BufferId, SemId, Site
from ...ir.index import ProgramIndex
from ...ir.nodes import EngineProgram, per_op_list
from ...ir.ops import ChoreoOp, Loop, McastSend, McastSetValid, SemSet, SemWait, walk


def _bodies(ops: tuple[ChoreoOp, ...]) -> Iterable[tuple[ChoreoOp, ...]]:
    """`ops` and every loop body in it: the op sequences in which "right after" has a meaning."""
    yield ops
    for op in ops:
        if isinstance(op, Loop):
            yield from _bodies(op.body)


def epoch_copies(ctx: ProgramIndex, programs: Iterable[EngineProgram]) -> set[tuple[Site, SemId]]:
    """The semaphore copies (site, sem) that are counters with an epoch; refuse the resets and sets one run cannot
    decide (see the module docstring)."""
    progs = with_handshake(programs)
    epochs: dict[tuple[Site, SemId], str] = {}  # copy → the engine that waits on and resets it
    plain: dict[tuple[Site, SemId], tuple[EngineProgram, SemWait]] = {}
    resets: list[tuple[EngineProgram, SemWait]] = []  # each epoch wait (the wait a reset follows)
    flagged: set[tuple[Site, SemId]] = set()  # copies a McastSetValid sets
    for prog in progs:
        for ops in _bodies(prog.ops):
            for i, op in enumerate(ops):
                if isinstance(op, SemSet):
                    before = ops[i - 1] if i else None
                    if not isinstance(before, SemWait) or before.sem != op.sem or op.value != 0:
                        raise _unsure(
                            ctx,
                            prog,
                            op,
                            "only a reset to 0 right after the site's own SemWait on the same semaphore (a counter"
                            " with an epoch) is decided; this one can lower a semaphore count, so whether a SemWait"
                            " passes can depend on how the engines interleave",
                        )
                    copy = (prog.site, op.sem)
                    resets.append((prog, before))
                    if epochs.setdefault(copy, prog.engine.value) != prog.engine.value:
                        raise _unsure(ctx, prog, op, f"two engines of site {int(prog.site)} reset this semaphore")
                elif isinstance(op, SemWait) and not (i + 1 < len(ops) and _resets(ops[i + 1], op.sem)):
                    plain.setdefault((prog.site, op.sem), (prog, op))
    for copy, (prog, wait) in plain.items():
        if copy in epochs:
            raise _unsure(
                ctx,
                prog,
                wait,
                f"site {int(copy[0])} also resets {ctx.sems[copy[1]].name} after another wait; a counter with an epoch"
                " is waited on only by the engine that resets it, each wait followed by its reset",
            )
    for prog in progs:
        for ops in _bodies(prog.ops):
            for op in ops:
                if not isinstance(op, McastSetValid):
                    continue
                sites = ctx.groups[op.group].sites
                if op.value == 0:
                    others = ", ".join(str(int(s)) for s in sites if s != prog.site)
                    raise ctx.at_op(
                        HandshakeError,
                        prog,
                        op,
                        f"a reset by a site that does not own the semaphore: it sets {ctx.sems[op.sem].name} to 0 on"
                        f" site(s) {others}; only the site that waits on a copy resets it, right after its wait",
                    )
                if op.value != 1:
                    raise _unsure(ctx, prog, op, "a multicast flag is set to 1 (a raise of a counter with an epoch)")
                for s in sites:
                    if (s, op.sem) in plain and (s, op.sem) not in epochs:
                        raise _unsure(
                            ctx,
                            prog,
                            op,
                            f"it sets {ctx.sems[op.sem].name} on site {int(s)}, which waits on it without resetting"
                            " it: a set is a raise only onto a copy its owner resets after each wait",
                        )
                    flagged.add((s, op.sem))
    for prog, wait in resets:
        if wait.value < 1 or ((prog.site, wait.sem) in flagged and wait.value != 1):
            why = (
                "a count with an epoch is waited for at least 1"
                if wait.value < 1
                else "a McastSetValid sets this copy to 1, and sets do not add up: a flag is waited for 1"
            )
            raise _unsure(ctx, prog, wait, why)
    multicast_senders(ctx, progs)
    return set(epochs)


_HANDSHAKE_OPS = (SemSet, SemWait, McastSetValid, McastSend)  # the only ops epoch_copies and multicast_senders read


def with_handshake(programs: Iterable[EngineProgram]) -> list[EngineProgram]:
    """The programs, in order, whose ops include a semaphore or multicast op: the others add nothing to the epochs
    or the senders (and hundreds of sites share each op list, so each list is looked into once)."""
    found = per_op_list(programs, lambda ops: any(isinstance(op, _HANDSHAKE_OPS) for op in walk(ops)))
    return [prog for prog, has in found if has]


def _resets(op: ChoreoOp, sem: SemId) -> bool:
    return isinstance(op, SemSet) and op.sem == sem


def multicast_senders(ctx: ProgramIndex, progs: Iterable[EngineProgram]) -> dict[Site, dict[BufferId, Site]]:
    """Receiver site → ring → the site whose McastSends fill it; refused where a receiving ring has two senders."""
    senders: dict[Site, dict[BufferId, Site]] = {}
    for prog in with_handshake(progs):
        for op in walk(prog.ops):
            if not isinstance(op, McastSend):
                continue
            for s in ctx.groups[op.group].sites:
                if s == prog.site:
                    continue
                first = senders.setdefault(s, {}).setdefault(ctx.ring(op.buf), prog.site)
                if first != prog.site:
                    raise _unsure(
                        ctx,
                        prog,
                        op,
                        f"site {int(first)} also sends into site {int(s)}'s {ctx.name(op.buf)}; a receiving ring"
                        " has one sender",
                    )
    return senders


def _unsure(ctx: ProgramIndex, prog: EngineProgram, op: ChoreoOp, why: str) -> StrongerCheckNeeded:
    return ctx.at_op(StrongerCheckNeeded, prog, op, f"{why}; a stronger check (over every interleaving) is needed")


def _refusal(
    where: tuple[str, int, str, str], why: str, undecided: bool = False
) -> HandshakeError | StrongerCheckNeeded:
    """A handshake refused at `where` (head, site, engine, op text): a race (`HandshakeError`), or — `undecided`, an
    order a wait on a never-reset semaphore may give, which one run cannot follow — `StrongerCheckNeeded`."""
    head, site, engine, op = where
    if undecided:
        why = (
            f"{why}, unless a wait on a semaphore that is never reset orders it, which one run cannot follow; a"
            " stronger check (over every interleaving) is needed"
        )
        return StrongerCheckNeeded(f"{head} — {why}", site=site, engine=engine, op=op)
    return HandshakeError(f"{head} — {why}", site=site, engine=engine, op=op)


class Clocks:
    """The vector clocks of one counter run (`deadlock_run.Network`), and the checks of the module docstring. Engines
    are numbered as the network lists them; `text(e, pc)` names engine e's op at pc for messages."""

    def __init__(self, n: int, epochs: set[int], receivers: set[int], text) -> None:
        """`epochs`: the semaphore slots that are counters with an epoch; `receivers`: the ring slots McastSends
        fill; `text(e, pc)`: (message head, site, engine, op text) of engine e's op at pc."""
        # One component per engine, and a last one that is 1 where a clock may miss an edge: after a wait on a
        # plain semaphore, whose order the run does not follow (joins carry it on, as max of 0 and 1).
        self.vc = [[0] * (n + 1) for _ in range(n)]
        self.epochs, self.text = epochs, text
        self.receivers = receivers
        self.pushed: dict[int, list[list[int]]] = {}  # ring → the pushing clock of each page
        self.popped: dict[int, list[list[int]]] = {}
        self.reserved: dict[int, list[tuple[int, int]]] = {}  # ring → (engine, its own time) of each page's reserve
        self.pending: dict[int, list[tuple[int, list[int], int]]] = {}  # epoch slot → raises: (engine, clock, pc)
        self.resets: dict[int, list[tuple[int, int, int]]] = {}  # epoch slot → (owner, own time, pc) of each reset
        self.arrivals: dict[int, list[list[int]]] = {}
        self.sends: dict[int, list[tuple[int, int]]] = {}  # receiving ring → (sender, its own time) of each send

    def _tick(self, e: int) -> list[int]:
        v = self.vc[e]
        v[e] += 1
        return v

    def _join(self, e: int, other: list[int]) -> None:
        v = self.vc[e]
        # (map(max, v, other), without a call of max for each engine: this is the clocked run's hottest line)
        v[:] = [b if b > a else a for a, b in zip(v, other, strict=False)]

    def _after(self, e: int, who: int, time: int) -> bool:
        """Whether engine e's present is after engine `who`'s own time `time`."""
        return self.vc[e][who] >= time

    # ---- rings ---------------------------------------------------------------------------------------------------

    def reserve(self, e: int, ring: int, pages: int, depth: int) -> None:
        got = self.reserved.setdefault(ring, [])
        last = len(got) + pages - 1
        popped = self.popped.get(ring, [])
        if last - depth >= 0:
            self._join(e, popped[last - depth])
        own = self._tick(e)[e]
        for page in range(len(got), last + 1):
            if ring in self.receivers and page >= 1:
                self._landed(e, ring, page - 1, f"reserves page {page} of it")
            got.append((e, own))

    def push(self, e: int, ring: int, pages: int) -> None:
        got = self.pushed.setdefault(ring, [])
        for _ in range(pages):
            if ring in self.receivers:
                self._landed(e, ring, len(got), f"publishes page {len(got)} of it")
            got.append(list(self._tick(e)))

    def wait(self, e: int, ring: int, pages: int) -> None:
        at = len(self.popped.get(ring, ()))  # the consumer's place: its pops so far
        self._join(e, self.pushed[ring][at + pages - 1])

    def pop(self, e: int, ring: int, pages: int) -> None:
        got = self.popped.setdefault(ring, [])
        for _ in range(pages):
            got.append(list(self._tick(e)))

    # ---- multicast -----------------------------------------------------------------------------------------------

    def send(self, e: int, rings: Sequence[int]) -> None:
        """Engine e's McastSend into each receiver's ring slot of `rings`."""
        own = self._tick(e)[e]
        for ring in rings:
            sent = self.sends.setdefault(ring, [])
            n = len(sent)
            got = self.reserved.get(ring, [])
            if n >= len(got) or not self._after(e, *got[n]):
                raise self._race(
                    e,
                    n < len(got),
                    f"it sends page {n} of the ring into a receiver before that receiver is known to have reserved"
                    f" it (no wait orders the send after the receiver's reserve): the receiver may still be reading"
                    " the page it lands in — an overwrite",
                )
            sent.append((e, own))

    def _landed(self, e: int, ring: int, page: int, doing: str) -> None:
        sent = self.sends.get(ring, [])
        if page >= len(sent) or not self._after(e, *sent[page]):
            raise self._race(
                e,
                page < len(sent),
                f"it {doing}, and nothing orders that after the multicast of page {page} into it landed (no wait for"
                " the sender's flag between them): the page may be read before it is there, or the copy land in the"
                " wrong page",
            )

    def _race(self, e: int, in_order: bool, why: str) -> HandshakeError | StrongerCheckNeeded:
        """The error for an order the run could not show. Where the events did come in order in this run but a
        wait on a plain semaphore is in the history, the order may hold all the same: refused as undecided."""
        head, site, engine, op = self.text(e, None)
        return _refusal((head, site, engine, op), why, undecided=in_order and bool(self.vc[e][-1]))

    def plain_wait(self, e: int) -> None:
        """Engine e passed a wait on a plain semaphore: its clock may now miss an edge."""
        self.vc[e][-1] = 1

    # ---- semaphores ----------------------------------------------------------------------------------------------

    def raised(self, e: int, pc: int, slots: Iterable[int], by: int = 1) -> None:
        """A raise by `by` of each slot; one of 0 changes no count, so no wait needs it and it orders nothing."""
        if by == 0:
            return
        clock = list(self._tick(e))
        for slot in slots:
            if slot in self.epochs:
                self.pending.setdefault(slot, []).append((e, clock, pc))

    def epoch_wait(self, e: int, pc: int, slot: int, value: int, count: int) -> None:
        """The owner e passes its wait for `value` on `slot` (whose count since the last reset is `count`) and
        resets it."""
        raises = self.pending.pop(slot, [])
        if count != value and not raises:  # the count was there before any raise: its initial value
            why = (
                f"the count is {count} when it waits for {value} and resets it, before any raise: a counter with an"
                " epoch starts at 0 and is waited for what its raises add"
            )
            raise _refusal(self.text(e, pc), why)
        if count != value:
            who, clock, at = raises[-1]
            raise self._early(who, at, e, pc, f"the count is {count} when it waits for {value}", None)
        self._after_last_reset(slot, raises, "nothing orders this raise after the owner's last reset")
        for _, clock, _ in raises:
            self._join(e, clock)
        self.resets.setdefault(slot, []).append((e, self._tick(e)[e], pc))

    def finish(self) -> None:
        """After a run that ends with every engine done: a raise no wait counted must still come after the owner's
        last reset — else, in another interleaving, it lands before that reset and an earlier wait counts it in
        place of the raise it was waiting for."""
        for slot, raises in self.pending.items():
            self._after_last_reset(
                slot, raises, "no wait counts this raise, and nothing orders it after the owner's last reset"
            )

    def _after_last_reset(self, slot: int, raises: list[tuple[int, list[int], int]], why: str) -> None:
        """Each of `raises` happened after the owner's last reset of `slot` (if it was ever reset)."""
        if not self.resets.get(slot):
            return
        owner, time, pc = self.resets[slot][-1]
        for who, clock, at in raises:
            if clock[owner] < time:
                raise self._early(who, at, owner, pc, why, clock)

    def _early(
        self, who: int, at: int, owner: int, pc: int, why: str, clock: list[int] | None
    ) -> HandshakeError | StrongerCheckNeeded:
        """`clock`: the raise's, where it came after the reset in this run but the run cannot show it always does."""
        head, site, engine, op = self.text(who, at)
        owner_head = self.text(owner, pc)[0]
        said = (
            f"it can raise the semaphore again before its owner resets it ({owner_head}; {why}): under some"
            " interleaving the raise lands before the reset and is lost"
        )
        return _refusal((head, site, engine, op), said, undecided=clock is not None and bool(clock[-1]))

    # ---- barriers ------------------------------------------------------------------------------------------------

    def arrive(self, e: int, slot: int) -> None:
        self.arrivals.setdefault(slot, []).append(list(self._tick(e)))

    def cross(self, e: int, slots: Sequence[int], n: int) -> None:
        for slot in slots:
            self._join(e, self.arrivals[slot][n - 1])

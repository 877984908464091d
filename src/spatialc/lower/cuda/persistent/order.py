"""The persistent form's serialised order: the K loop's rotation, the pops it frees of barriers, the occupancy
proof, and the rings' shared-memory layout.

A ring here has no flow control at run time: `Reserve` names the next slot and trusts that it is free, `Wait`
trusts that the page has arrived. Whether that trust holds is decided before printing, by `prove`, on exactly the
order the printer takes (the rotation included) — an overfilled ring is a wrong answer, not a hang, so it must be
ruled out statically.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....ir.ids import LV_ITEM, BufferId, loop_var_name
from ....ir.ops import (
    AcquireAcc,
    Compute,
    Const,
    PackAcc,
    Pop,
    Push,
    ReadBarrier,
    ReadTiles,
    Reserve,
    Wait,
    WriteTiles,
)
from ....target import SpatialTarget
from ...errors import NeedsGeneral, TooBig, Unsupported
from ..common.dequant import InRegisters
from ..common.rings import Ring, Rings, aligned
from .merge import SerialLoop, SerialOp

# ---- software pipelining ----------------------------------------------------------------------------------

PRODUCER_OPS = (Reserve, Push, ReadTiles, ReadBarrier)
CONSUMER_OPS = (Wait, Pop, Compute, InRegisters)  # InRegisters: a W4A16 B page's op the dequant does without


@dataclass(frozen=True, slots=True)
class Rotation:
    """A loop software-pipelined `ahead` steps deep. Printed, step i runs the consumer's waits `head` (whose run ends
    with the block barrier), then the producer half `prod` for step i + ahead, then the rest of the consumer half."""

    prod: tuple[SerialOp, ...]
    cons: tuple[SerialOp, ...]
    ahead: int

    @property
    def head(self) -> tuple[SerialOp, ...]:
        """The consumer half's leading waits: the producer of step i + ahead is printed after them."""
        n = next((i for i, op in enumerate(self.cons) if not isinstance(op, Wait)), len(self.cons))
        return self.cons[:n]

    @property
    def rest(self) -> tuple[SerialOp, ...]:
        return self.cons[len(self.head) :]


def rotation(rings: Rings, loop: SerialLoop) -> Rotation | None:
    """The producer and consumer halves of a loop the printer pipelines, and how many steps ahead its producer
    runs; None to print the loop as written.

    Pipelined `a` steps ahead, step i + a's copies are issued right after step i's wait barrier and steps i+1 …
    i+a are in flight while step i is computed, so a ring holds a + 1 steps' pages at once: every ring the producer
    half fills must hold (a + 1)·r pages, r being what one step reserves on it — and that is also what keeps its pops
    free of barriers (`barrier_free_pops`), so a step crosses one block barrier at any depth. The distance is the
    deepest the rings hold: depth // r − 1, never more than the loop's steps less one. The producer half must end
    with a Push so that all its copies are committed inside it, which keeps the consumer's wait count exact, and the
    consumer half must begin with a wait on a kept ring, whose barrier the producer is printed behind.
    """
    if loop.var == LV_ITEM or not isinstance(loop.count, Const) or loop.count.n < 2:
        return None
    body = loop.body
    split = next((i for i, op in enumerate(body) if not isinstance(op, PRODUCER_OPS)), len(body))
    prod, cons = body[:split], body[split:]
    if not prod or not cons or not all(isinstance(op, CONSUMER_OPS) for op in cons) or not isinstance(prod[-1], Push):
        return None
    if not isinstance(cons[0], Wait) or rings.kept(cons[0].buf) is None:
        return None
    reserved: dict[int, int] = {}
    for op in prod:
        if isinstance(op, Reserve):
            ring = rings.kept(op.buf)
            if ring is None:
                return None
            reserved[ring.id] = reserved.get(ring.id, 0) + op.pages
    if not all(2 * n <= rings.rings[r].depth for r, n in reserved.items()):
        return None
    ahead = min((rings.rings[r].depth // n - 1 for r, n in reserved.items()), default=1)
    return Rotation(prod, cons, max(1, min(ahead, loop.count.n - 1)))


def commits(rings: Rings, ops: tuple[SerialOp, ...]) -> int:
    """Commit groups that `ops` print: one per Push on a kept ring."""
    return sum(1 for op in ops if isinstance(op, Push) and rings.kept(op.buf) is not None)


def barrier_free_pops(rings: Rings, ops: tuple[SerialOp, ...]) -> frozenset[int]:
    """The rings whose Pops need no barrier after them: the next refill of a popped slot waits at another barrier.

    The barrier after a run of Pops is there so that no thread refills a slot another thread still reads. A ring
    qualifies when all its Reserves are in the producer half P and all its Pops in the consumer half C = W R of one
    loop rotated a steps ahead — W its leading waits, whose run ends with a block barrier — and the ring's depth D
    is at least (a + 1)·r, r being the pages P reserves on it per step. Then:

    - The ring is filled only by P, r pages a step, and read only in C, between its Wait and its Pop; since nothing
      else reserves it, the steps of every run of the loop (every item's) number its pages consecutively: step s
      owns pages sr … sr + r − 1, slot = page mod D.
    - Printed, step i of the loop runs W(s), then P(s + a) inside the `if`, then R(s) (s = global step). A thread X
      that issues P(s + a) has crossed W(s)'s barrier, which every thread reached only after finishing R(s − 1):
      no page of step s − 1 or earlier is still read, only step s's (by threads in R(s)). X writes step s + a's
      pages, which differ from step s's by (a − 1)·r + 1 … (a + 1)·r − 1: never a multiple of D when
      D ≥ (a + 1)·r. Its copies land by X's wait in W(s + a), while steps s … s + a — (a + 1)·r consecutive pages,
      each in a slot of its own — are the only ones in use.
    - The prologue's P(s) … P(s + a − 1) of a run are issued behind the previous run's last wait barrier W(s − 1)
      (or before any read at all): only step s − 1's pages may still be read, within (a + 1)·r − 1 pages of them.

    At D < (a + 1)·r the prefetch would refill a slot still read (the emulation's race check catches such a ring:
    tests/runtime/test_emulation_faults.py). Anything else — a ring filled or drained outside one rotated loop, a
    non-rotated loop, the output ring — keeps its barrier.
    """
    # Where each kept ring is reserved and popped: (a rotated loop's id, "fill" or "drain"), or ELSEWHERE.
    places: dict[int, set[tuple[int, str]]] = {}
    per_step: dict[int, int] = {}
    fenced: set[int] = set()  # the rotated loops whose consumer half crosses a barrier
    ahead: dict[int, int] = {0: 1}  # each rotated loop's distance

    def visit(body: tuple[SerialOp, ...], at: tuple[int, str]) -> None:
        for op in body:
            if isinstance(op, SerialLoop):
                rot = rotation(rings, op)
                if rot is None:
                    visit(op.body, _ELSEWHERE)
                else:
                    ahead[id(op)] = rot.ahead
                    visit(rot.prod, (id(op), "fill"))
                    visit(rot.cons, (id(op), "drain"))
            elif isinstance(op, Wait) and rings.kept(op.buf) is not None and at[1] == "drain":
                fenced.add(at[0])
            elif isinstance(op, Reserve | Pop) and rings.kept(op.buf) is not None:
                rid = rings.template[op.buf]
                places.setdefault(rid, set()).add(at)
                if isinstance(op, Reserve):
                    per_step[rid] = per_step.get(rid, 0) + 1

    visit(ops, _ELSEWHERE)
    free = set()
    for rid, where in places.items():
        loop = next(iter(where))[0]
        deep = rings.rings[rid].depth >= (ahead[loop] + 1) * per_step[rid]
        if where == {(loop, "fill"), (loop, "drain")} and loop in fenced and deep:
            free.add(rid)
    return frozenset(free)


_ELSEWHERE = (0, "elsewhere")  # id() of a live object is never 0

# ---- the occupancy proof -----------------------------------------------------------------------------------


class _Occupancy:
    """Pages of each ring, as the printed order leaves them: reserved, published (of those), waited (of those)."""

    def __init__(self, rings: Rings):
        self.rings = rings
        self.pages: dict[int, tuple[int, int, int]] = {}
        # The fused epilogue: where in the chain the packed accumulators are (None: not packed, or stored).
        self.at: int | None = None
        # The rings of pages the chain's stages read beside its value (a residual's), read by the fused store; and
        # whether that store stood at the chain's last Push (`stored`), its WriteTiles still to come.
        self.beside: set[int] = set()
        self.stored = False
        # A W4A16 B page dequantised in registers → the packed page its matmul's fragments are read from.
        self.packed: dict[BufferId, BufferId] = {}

    @property
    def last(self) -> int:
        """The fused chain's last step: the page the writer stores."""
        return len(self.rings.fused) - 1

    def state(self) -> tuple[tuple[tuple[int, tuple[int, int, int]], ...], int | None]:
        return tuple(sorted((r, v) for r, v in self.pages.items() if v != (0, 0, 0))), self.at

    def run(self, ops: tuple[SerialOp, ...]) -> None:
        for op in ops:
            self.step(op)

    def step(self, op: SerialOp) -> None:
        """Apply one op, refusing it where the printed kernel would read or overwrite the wrong page."""
        match op:
            case Reserve(buf, n) | Push(buf, n) | Wait(buf, n) | Pop(buf, n) if n != 1:
                raise Unsupported(
                    f"{type(op).__name__} of {n} pages on {self.rings.name(buf)}",
                    "a ring slot of the persistent kernel is one page; its slot counters step by one",
                )
            case SerialLoop():
                self.loop(op)
            case InRegisters():
                # A W4A16 B page's ring op or dequant, printed as a comment (the matmul dequantises its fragments
                # from the packed page, which the fused order pops after it): the page is followed as if it were
                # held, so that the matmul still finds its B waited for — and the packed page, which the matmul
                # reads, must still be waited for and unpopped there (`Compute` below).
                if isinstance(op.op, Compute):
                    self.packed[op.op.outs[0]] = op.op.ins[0]
                self.step(op.op)
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) if self.rings.kept(buf) is not None:
                self.flow(op, self.rings.kept(buf))  # type: ignore[arg-type]
            case ReadTiles(into=buf) | PackAcc(to=buf) if self.rings.kept(buf) is not None:
                self.need(buf, lambda h, r, s: h - r == 1, "a page reserved and not yet pushed", op)
            case WriteTiles(src=buf) if self.rings.kept(buf) is not None:
                self.need(buf, lambda h, r, s: s == 1, "a page waited for and not yet popped", op)
            case PackAcc(to=buf) if self.rings.is_fused(buf):
                self.fused(op, self.at is None and self.rings.chain_step(buf) == 0, 0)
            case Compute(ins=(src, *side), outs=(dst,)) if self.rings.is_fused(src) and self.rings.is_fused(dst):
                step = self.rings.chain_step(src)
                self.fused(op, self.at == step and self.rings.chain_step(dst) == step + 1, step + 1)
                for buf in side:  # a page beside the chain's value, waited for: the store reads it
                    self.need(buf, lambda h, r, s: s == 1, "a page waited for and not yet popped", op)
                    self.beside.add(self.rings.kept(buf).id)  # type: ignore[union-attr]
            case Push(buf) if self.beside and self.rings.is_fused(buf) and self.rings.chain_step(buf) == self.last:
                # A chain reading pages beside its value is stored here, while those pages are still the block's.
                for r in sorted(self.beside):
                    self.check(self.pages.get(r, (0, 0, 0))[2] == 1, self.rings.rings[r], op, "its page unpopped")
                self.fused(op, self.at == self.last, None)
                self.beside, self.stored = set(), True
            case WriteTiles(src=buf) if self.rings.is_fused(buf) and self.stored:
                self.fused(op, self.at is None and self.rings.chain_step(buf) == self.last, None)  # stored above
                self.stored = False
            case WriteTiles(src=buf) if self.rings.is_fused(buf):
                self.fused(op, self.at == self.last and self.rings.chain_step(buf) == self.last, None)
            case Compute(ins=ins, outs=outs):
                self.accumulate(op)
                for buf in ins:
                    if self.rings.kept(buf) is not None:
                        self.need(buf, lambda h, r, s: s == 1, "a page waited for and not yet popped", op)
                    if buf in self.packed:  # B's fragments dequantised from this packed page
                        self.need(self.packed.pop(buf), lambda h, r, s: s == 1, "its packed page unpopped", op)
                for buf in outs:  # a stage page to page fills the page its engine reserved
                    if self.rings.kept(buf) is not None:
                        self.need(buf, lambda h, r, s: h - r == 1, "a page reserved and not yet pushed", op)
            case AcquireAcc():
                self.accumulate(op)

    def flow(self, op: SerialOp, ring: Ring) -> None:
        """Reserve / Push / Wait / Pop on a kept ring."""
        held, ready, seen = self.pages.get(ring.id, (0, 0, 0))
        match op:
            case Reserve():
                if held + 1 > ring.depth:
                    raise TooBig(
                        f"pages of ring {ring.name} held at once in the printed order",
                        held + 1,
                        ring.depth,
                        "deepen the ring or let its consumer drain it sooner",
                    )
                held += 1
            case Push():
                self.check(held > ready, ring, op, "a reserved page to publish")
                ready += 1
            case Wait():
                self.check(ready > seen and seen == 0, ring, op, "a published page, and none waited for unpopped")
                seen = 1
            case Pop():
                self.check(seen == 1, ring, op, "a waited page to free")
                held, ready, seen = held - 1, ready - 1, 0
        self.pages[ring.id] = (held, ready, seen)

    def need(self, buf: BufferId, ok, what: str, op: SerialOp) -> None:
        ring = self.rings.kept(buf)
        assert ring is not None
        self.check(ok(*self.pages.get(ring.id, (0, 0, 0))), ring, op, what)

    @staticmethod
    def check(ok: bool, ring: Ring, op: SerialOp, what: str) -> None:
        if not ok:
            # The engines run one after another here; the general form runs each on warps of its own, handing
            # pages over at run time, which verify proved free of deadlock for every interleaving.
            raise NeedsGeneral(
                f"{type(op).__name__} on ring {ring.name} in the serialised order",
                f"it needs {what} there, and the block would read or overwrite the wrong slot",
            )

    def fused(self, op: SerialOp, ok: bool, then: int | None) -> None:
        """An op of the fused chain, in order (`ok`), which leaves the packed value at chain step `then`.

        The store prints the whole chain, so the ops must pack the accumulators, take the value down the chain one
        stage at a time, and store the last stage's value, before the accumulators are packed again.
        """
        if not ok:
            raise Unsupported(
                f"{type(op).__name__} on the fused output out of order",
                "the fused epilogue packs the accumulators, applies each epilogue stage once in chain "
                "order and stores the last stage's value, once after each PackAcc",
            )
        self.at = then

    def accumulate(self, op: SerialOp) -> None:
        if self.at is not None:
            raise Unsupported(
                f"{type(op).__name__} between the fused PackAcc and its WriteTiles",
                "the fused epilogue stores straight from the accumulators, which it would overwrite",
            )

    def loop(self, loop: SerialLoop) -> None:
        """A loop as printed (rotated or not); one that runs more than once must leave the rings as found."""
        # The ITEM loop runs a per-site count at run time: it must balance whatever that count is.
        multi = loop.var == LV_ITEM or not isinstance(loop.count, Const) or loop.count.n >= 2
        if not multi and loop.count == Const(0):
            return
        entry = self.state()
        rot = rotation(self.rings, loop)
        if rot is None:
            self.run(loop.body)
        else:
            # Printed: P(0) … P(a − 1); then W(i) P(i + a) R(i) for each step but the last a; then W R of those.
            # One W P R from the steady state must return to it, so every middle step is the same.
            for _ in range(rot.ahead):
                self.run(rot.prod)
            steady = self.state()
            self.run(rot.head)
            self.run(rot.prod)
            self.run(rot.rest)
            if self.state() != steady:
                raise Unsupported(
                    f"the pipelined loop over {loop_var_name(loop.var)}", "one step does not drain what it fills"
                )
            for _ in range(rot.ahead):
                self.run(rot.cons)
        if multi and self.state() != entry:
            raise Unsupported(
                f"the loop over {loop_var_name(loop.var)}",
                "its body does not leave every ring as it found it, so a later trip would overrun one",
            )


def prove(rings: Rings, ops: tuple[SerialOp, ...]) -> None:
    """Refuse, before printing, an order that overfills a ring, reads a page not there, or leaves a ring unbalanced."""
    occ = _Occupancy(rings)
    occ.run(ops)
    if occ.state() != ((), None):
        raise Unsupported("the serialised site program", "it ends with pages still in a ring or accumulators unstored")


# ---- shared memory -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SmemLayout:
    """Where the rings live: static up to the static cap, else in the dynamic block."""

    ring_bytes: int
    rings_dynamic: bool
    static_bytes: int
    dyn_bytes: int
    ring_off: dict[int, int]
    opt_in: bool  # more than a block gets by default: the host must raise the dynamic limit before launching


def smem_layout(rings: Rings, target: SpatialTarget) -> SmemLayout:
    """The shared-memory layout: rings static unless over the cap, then all of them in the dynamic block.

    ptxas caps static `__shared__` at 48 KiB whatever attribute the host sets, so rings beyond it must be carved
    from the dynamic block.
    """
    ring_bytes = sum(aligned(r.bytes) for r in rings.rings.values())
    rings_dynamic = ring_bytes > target.smem_static_max
    off = 0
    ring_off: dict[int, int] = {}
    if rings_dynamic:
        for rid in sorted(rings.rings):
            ring_off[rid] = off
            off += aligned(rings.rings[rid].bytes)
    static = 0 if rings_dynamic else ring_bytes
    # A block's shared memory over 48 KiB in all needs the opt-in (CUDA C++ Programming Guide, compute capability
    # 8.x / 9.0): the sum decides, not the dynamic block alone.
    opt_in = static + off > target.smem_static_max
    return SmemLayout(ring_bytes, rings_dynamic, static, off, ring_off, opt_in)

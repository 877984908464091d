"""One index of a program's tables, built once and read by every rule of verify (and by whoever else walks ops).

A program names its tensors, buffers, semaphores and groups by id; the index turns each id into its node in one
dict look-up and prints an op even when an id in it does not resolve, so a message about a broken program can
still say which op it is about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from .errors import SpatialError
from .ids import BufferId, GroupId, SemId, Site, TensorId
from .nodes import Accumulator, Buffer, EngineProgram, Group, Semaphore, SpatialProgram, Tensor
from .ops import ChoreoOp, ring_of
from .printer import op_text

E = TypeVar("E", bound=SpatialError)


@dataclass(frozen=True, slots=True)
class ProgramIndex:
    """Look-ups of one program by id (valid once its ids are known to be unique)."""

    p: SpatialProgram
    buffers: dict[BufferId, Buffer]
    tensors: dict[TensorId, Tensor]
    sems: dict[SemId, Semaphore]
    groups: dict[GroupId, Group]
    sites: frozenset[Site]

    @staticmethod
    def of(p: SpatialProgram) -> ProgramIndex:
        """The index of `p`."""
        placement = p.placement
        return ProgramIndex(
            p,
            {b.id: b for b in p.buffers},
            {t.id: t for t in p.tensors},
            {s.id: s for s in p.semaphores},
            {g.id: g for g in placement.groups} if placement else {},
            frozenset(placement.sites) if placement else frozenset(),
        )

    def name(self, bid: BufferId) -> str:
        """A buffer's name, or 'buffer N' when no buffer has that id."""
        b = self.buffers.get(bid)
        return b.name if b is not None else f"buffer {int(bid)}"

    def buffer_of(self, op: ChoreoOp) -> str | None:
        """The name of the buffer an op is about (ops.ring_of), for an error's `buffer` field; None where it has
        none, or names one the program lacks."""
        bid = ring_of(op)
        return None if bid is None or bid not in self.buffers else self.name(bid)

    def ring(self, bid: BufferId) -> BufferId:
        """The ring a buffer belongs to: its template (per-site copies of one template are one ring)."""
        return self.buffers[bid].ring

    def depth(self, ring: BufferId) -> int:
        """Pages of a ring (0 for an accumulator)."""
        kind = self.buffers[ring].kind
        return 0 if isinstance(kind, Accumulator) else kind.depth_pages

    def page_tiles(self, bid: BufferId) -> int:
        """Tiles in one page of a ring, or in an accumulator."""
        kind = self.buffers[bid].kind
        return kind.tiles if isinstance(kind, Accumulator) else kind.page_tiles

    def is_acc(self, bid: BufferId) -> bool:
        """Whether `bid` is an accumulator (not a ring)."""
        return isinstance(self.buffers[bid].kind, Accumulator)

    def op(self, op: ChoreoOp) -> str:
        """One op as text, even when an id in it does not resolve or it is not an op at all."""
        try:
            return op_text(self.p, op)
        except (KeyError, TypeError):
            return repr(op)

    def at_op(self, cls: type[E], prog: EngineProgram, op: ChoreoOp, why: str) -> E:
        """The error `cls` (a located verify error) 'site 3 compute: <op> — why', naming site, engine and op."""
        text = self.op(op)
        return cls(
            f"{where(prog.site, prog.engine.value)}: {text} — {why}",
            site=int(prog.site),
            engine=prog.engine.value,
            op=text,
        )  # type: ignore[call-arg]


def where(site: Site | int, engine: str) -> str:
    """'site 3 compute', the head of every located message."""
    return f"site {int(site)} {engine}"

"""The errors spatialc raises at its users. Each says what is wrong and, where it can, what would fix it."""

from __future__ import annotations

from collections.abc import Sequence

from .ir.errors import SpatialError  # noqa: F401  (the base lives in the IR, which imports nothing of ours)

MAX_QUOTED = 80  # the most characters of user data (a value, a list) one error message quotes


def clipped(text: str, most: int = MAX_QUOTED) -> str:
    """`text` (user data an error quotes) cut to at most `most` characters, ending in '…' where it was cut."""
    return text if len(text) <= most else text[: most - 1] + "…"


def listed(values: Sequence[object], most: int = 8) -> str:
    """`values` as an error lists them: the first `most`, and how many there are in all where that is more."""
    shown = ", ".join(clipped(str(v)) for v in values[:most])
    return shown if len(values) <= most else f"{shown}, … ({len(values)} in all)"


class ProgramError(SpatialError, ValueError):
    """A malformed request: an impossible shape, an unknown precision or placement, a bad forced plan field."""


class PlanError(SpatialError):
    """No plan fits the target, or a forced plan does not."""


class VerifyError(SpatialError):
    """A program that breaks one of verify's rules; subclasses name the rule, the message names the place."""


class DeadlockError(SpatialError):
    """Engines that can never proceed. `blocked` lists (site, engine, op text) for each blocked engine; `site`,
    `engine` and `op` are the first one's, `buffer` the ring whose depth would remove the deadlock where verify
    found one (its message then says the depth), else None."""

    def __init__(self, message: str, blocked: tuple[tuple[int, str, str], ...] = (), *, buffer: str | None = None):
        super().__init__(message)
        self.blocked = blocked
        self.site, self.engine, self.op = blocked[0] if blocked else (None, None, None)
        self.buffer = buffer


# ---- verify's rules: one class each. `site`, `engine`, `op` and `buffer` say where (None where it does not apply).


class VerifyRuleError(VerifyError):
    """A broken verify rule, located: the site, engine, op text and buffer name it is about, and `related` — the
    other side of the fault, (site, engine, op text) each: the consumer of an unbalanced ring, the read whose tile
    a wrong sum holds."""

    def __init__(
        self,
        message: str,
        *,
        site: int | None = None,
        engine: str | None = None,
        op: str | None = None,
        buffer: str | None = None,
        related: tuple[tuple[int | None, str | None, str], ...] = (),
    ):
        super().__init__(message)
        self.site, self.engine, self.op, self.buffer = site, engine, op, buffer
        self.related = related


class IllFormedError(VerifyRuleError):
    """Rule 1: an id that does not resolve, a negative or oversized loop count, a page count below one, a bad Trip
    loop, a tensor or plan the machine cannot hold."""


class CoverageError(VerifyRuleError):
    """Rule 2: a placement that misses an item, repeats one, or disagrees with the schedule's ITEM loops."""


class RingOwnershipError(VerifyRuleError):
    """Rule 3: a ring touched by more than one producer or consumer engine of a site, or an accumulator misused."""


class RingDepthError(VerifyRuleError):
    """Rule 4: one op that moves more pages than its ring holds."""


class UnbalancedError(VerifyRuleError):
    """Rule 5: pages pushed unreserved or popped unwaited, a loop that does not restore a ring, pages left over."""


class TileBoundsError(VerifyRuleError):
    """Rule 6: a ReadTiles / WriteTiles that leaves its tensor's tile grid, wraps a row, or overfills a page."""


class StrongerCheckNeeded(VerifyRuleError):
    """Rules 7 and 8 at their limits: a program one counter run cannot decide (a SemSet, a ring whose balance
    depends on data), or whose result the semantic rule cannot follow (data-dependent loop counts, multicast, pages
    handed over in a loop structure it cannot match)."""


class HandshakeError(VerifyRuleError):
    """Rule 7: a handshake between sites that races under some interleaving — a semaphore reset by a site that does
    not own it, a count raised again before its owner reset it (the raise is lost), a multicast page sent into a
    page the receiver has not reserved (an overwrite) or published before the copy landed."""


class VerifyDeadlockError(DeadlockError, VerifyError):
    """Rule 7: the counter run of the choreography ends with engines blocked for good."""


class SemanticError(VerifyRuleError):
    """Rule 8: the schedule computes something other than its stages declare — an output tile written twice or never,
    a reduction that misses or repeats a k, operands out of their roles, a scheduled op unlike its stage's, a page
    read that nothing filled, an accumulator read before its last product or never zeroed."""


class TorchUnavailable(SpatialError, ImportError):
    """`spatialc.torch` imported where PyTorch is not installed (the core needs numpy alone)."""

"""The errors spatialc raises at its users. Each says what is wrong and, where it can, what would fix it."""

from __future__ import annotations


class SpatialError(Exception):
    """Base of every error spatialc raises on purpose."""


class ProgramError(SpatialError, ValueError):
    """A malformed request: an impossible shape, an unknown precision or placement, a bad forced plan field."""


class PlanError(SpatialError):
    """No plan fits the target, or a forced plan does not."""


class VerifyError(SpatialError):
    """A program that breaks one of verify's rules; subclasses name the rule, the message names the place."""


class DeadlockError(SpatialError):
    """Engines that can never proceed. `blocked` lists (site, engine, op text) for each blocked engine."""

    def __init__(self, message: str, blocked: tuple[tuple[int, str, str], ...] = ()):
        super().__init__(message)
        self.blocked = blocked

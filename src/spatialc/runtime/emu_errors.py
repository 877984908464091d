"""The emulation's errors: `EmulationError` and one subclass per way a run can end without C."""

from __future__ import annotations

from ..errors import SpatialError


class EmulationError(SpatialError):
    """The emulation could not produce C: `kind` says why, the message carries the emulator's own words."""

    kind = "failed"

    def __init__(self, message: str, *, stderr: str = "", status: int | None = None):
        super().__init__(message)
        self.stderr = stderr
        self.status = status


class EmulationCompileError(EmulationError):
    """g++ refused the program text (the message holds the first errors)."""

    kind = "compile"


class EmulationRace(EmulationError):
    """Two threads touched the same shared bytes in one barrier interval; the message names ring, slot, threads."""

    kind = "race"


class EmulationDeadlock(EmulationError):
    """Every live thread waits at a barrier that can never complete."""

    kind = "deadlock"


class EmulationTimeout(EmulationError):
    """The run passed its wall-clock limit or stopped making progress."""

    kind = "timeout"


class EmulationFault(EmulationError):
    """Anything else: a CUDA error, a missing input, a misuse of an emulated primitive, output of the wrong size."""

    kind = "fault"


class EmulationTooLarge(EmulationError):
    """A run whose tensors would take more memory than it may use: refused before anything is written or run."""

    kind = "too large"

"""Errors of the reference interpreter. Each message names the site, engine, op and buffer it is about."""

from __future__ import annotations

from ..errors import SpatialError
from ..inputs import InputError

__all__ = [
    "AddressError",
    "EvalError",
    "FlowError",
    "InputError",
    "NotReady",
    "NumericError",
    "TooLarge",
    "TripError",
    "UnsupportedOp",
]


class EvalError(SpatialError):
    """A program the interpreter cannot run as given."""


class NotReady(EvalError):
    """The program lacks a placement or a schedule (run `spatialc.build` first)."""


# InputError (re-exported above) is not the interpreter's alone: the emulation and the GPU launch raise it too, for
# the same inputs, from the one check in spatialc.inputs.


class TooLarge(EvalError, MemoryError):
    """A program whose tensors' stores would not fit this machine's memory; refused before any is allocated."""


class FlowError(EvalError):
    """A ring op used out of protocol: a Push of pages never reserved, a Pop or read of pages never published."""


class AddressError(EvalError, IndexError):
    """A ReadTiles / WriteTiles address outside the tensor's tile grid."""


class TripError(EvalError):
    """A data-dependent loop count that is not a whole number in 0..bound."""


class UnsupportedOp(EvalError):
    """An op the interpreter does not run yet; it refuses rather than guess."""


class NumericError(EvalError):
    """A result the interpreter cannot give exactly: an int8 reduction too long for float64, an output overflow."""

"""What each elementwise epilogue op does to a block of values: the one definition the interpreter and the numpy
reference share (the CUDA printer spells the same formulas in C, and tests compare all three).

Integer programs (int8 operands): values are exact integers (int64); bias is int32, scalar values whole numbers,
and requantisation is `spatialc.numerics.quant.requantize`. Float programs (fp16/bf16): the float32 accumulator, and
every op in float32 arithmetic, as the kernel does it — except the activations (float programs only), each computed in
float64 from the float32 value by the formula below and rounded once to float32. The kernel spells the same
formulas in double with the same operation order and no contraction; only `tanh` and `exp` come from another
library (CUDA's, or the host's in the emulation, each within 2 ulp of float64), so a kernel's activation is within
one float32 ulp of this one — equal except where the float64 value lies within a few float64 ulp of a point half
way between two float32 values.
"""

from __future__ import annotations

import numpy as np

from ..ir.errors import SpatialError
from ..ir.ops import Activation, Bias, ComputeOp, Relu, Requant, Scalar
from .quant import requantize

_SCALAR = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


class EpilogueError(SpatialError, ValueError):
    """An op that is not an elementwise epilogue op, or an integer result beyond what int64 holds exactly."""


GELU_C = 0.7978845608028654  # sqrt(2 / pi), as PyTorch's tanh-form gelu writes it


def _gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + np.tanh(GELU_C * (v + 0.044715 * (v * v * v))))


# Each on float64 values. The kernel's C (lower/cuda/activations.cuh) has the same operations in the same order.
# Where 1 + tanh cancels (gelu's far negative tail) a float64 ulp of tanh is a large part of a tiny result: there
# the kernel's value is within 2^-50·|x| of this one rather than one float32 ulp.
ACTIVATION_FORMULAS = {
    "gelu": _gelu,  # PyTorch's approximate="tanh" form
    "silu": lambda v: v / (1.0 + np.exp(-v)),
    "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "tanh": np.tanh,
}

# The largest |f'(x)| of each: how much an error in x can grow through it (`spatialc.tolerance` uses it).
ACTIVATION_SLOPE = {"gelu": 1.13, "silu": 1.1, "sigmoid": 0.25, "tanh": 1.0}
ACTIVATION_TAIL = 2.0**-50  # the absolute error, relative to |x|, where gelu's formula cancels (see above)

EXACT_LIMIT = 2.0**62  # integer epilogue values must stay well inside int64: beyond this they may have wrapped


def dot_range(k: int) -> tuple[int, int]:
    """The least and greatest K-long int8 dot product: K·(−128)·127 and K·(−128)·(−128)."""
    return -k * 128 * 127, k * 128 * 128


def integer_range(op: ComputeOp, lo: int, hi: int) -> tuple[int, int] | None:
    """The range of an integer epilogue op's result on values in lo..hi (a bias adds any int32, requant saturates
    to int8), or None for an op that is none of them."""
    match op:
        case Bias():
            return lo - 2**31, hi + 2**31 - 1
        case Relu():
            return max(lo, 0), max(hi, 0)
        case Scalar("add", v):
            return lo + int(v), hi + int(v)
        case Scalar("mul", v):
            a, b = lo * int(v), hi * int(v)
            return min(a, b), max(a, b)
        case Scalar("max", v):
            return max(lo, int(v)), max(hi, int(v))
        case Scalar("min", v):
            return min(lo, int(v)), min(hi, int(v))
        case Requant():
            return -128, 127
    return None


def start(acc: np.ndarray, integer: bool) -> np.ndarray:
    """The accumulator as the epilogue sees it: int64 for integer programs, float32 otherwise."""
    return np.asarray(acc).astype(np.int64 if integer else np.float32)


def apply(op: ComputeOp, x: np.ndarray, integer: bool, bias_row: np.ndarray | None = None) -> np.ndarray:
    """`op` on values `x` (from `start` or an earlier op); `bias_row` holds the bias of each column of `x`."""
    match op:
        case Bias():
            if bias_row is None:
                raise EpilogueError("a bias op needs the bias of each column")
            row = np.asarray(bias_row).astype(np.int64 if integer else np.float32)
            return _exact(x + row[np.newaxis, :], x.astype(np.float64) + row, op) if integer else x + row[None, :]
        case Relu():
            return np.maximum(x, 0)
        case Scalar(name, value) if name in _SCALAR:
            if not integer:
                return _SCALAR[name](x, np.float32(value))
            if abs(value) >= EXACT_LIMIT:
                raise EpilogueError(f"scalar {name} {value:g} is beyond exact integer arithmetic")
            v = np.int64(int(value))
            return _exact(_SCALAR[name](x, v), _SCALAR[name](x.astype(np.float64), float(v)), op)
        case Requant(multiplier, shift, zero_point):
            return requantize(x, multiplier, shift, zero_point)
        case Activation(name) if name in ACTIVATION_FORMULAS:
            if integer:
                raise EpilogueError(f"activation {name} is float arithmetic; an int8 program's epilogue is integer")
            with np.errstate(over="ignore", invalid="ignore"):
                return ACTIVATION_FORMULAS[name](np.asarray(x, np.float32).astype(np.float64)).astype(np.float32)
    raise EpilogueError(f"{op!r} is not an elementwise epilogue op")


def _exact(result: np.ndarray, estimate: np.ndarray, op: ComputeOp) -> np.ndarray:
    """`result` when the float64 `estimate` of the same values shows none of them left int64's exact range."""
    if estimate.size and float(np.abs(estimate).max()) >= EXACT_LIMIT:
        raise EpilogueError(
            f"{type(op).__name__.lower()} takes an integer epilogue value beyond ±2^62: the"
            " int64 arithmetic would no longer be exact"
        )
    return result

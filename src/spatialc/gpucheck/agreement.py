"""agreement: whether a kernel's C agrees with the float64 reference — the tolerances by the element type C is stored
in (looser for a library's own result), and the check of a spatialc kernel's poisoned output (`Check`). Needs no GPU:
it takes numpy or CuPy as `xp`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import SpatialError

# ‖C−R‖_F/‖R‖_F and max|C−R|/max|R| that a float result may reach, by the element type C is stored in: float32 keeps
# the fp32 accumulation's rounding only; fp16 and bf16 add one rounding of each element (2^-11, 2^-8 relative).
TOLERANCE = {"float32": (1e-4, 1e-3), "float16": (1e-3, 2e-3), "bfloat16": (6e-3, 1e-2)}
# The libraries' own results are held to a looser bar: cuBLAS may reduce split-K partial sums in fp16 / bf16.
BASELINE_REL_TOL = {"float32": 1e-2, "float16": 5e-3, "bfloat16": 2e-2}


@dataclass
class Check:
    """How one kernel's output compared with the float64 reference."""

    correct: bool
    max_abs: float
    rel_fro: float
    unwritten: int  # logical elements still holding the poison
    pad_unwritten: int  # padding elements still holding the poison (the kernel writes whole tiles)
    nonfinite: int
    stable: bool | None = None  # a second poisoned run on the same inputs agreed


def values64(x: Any, elem: str, xp: Any) -> Any:
    """float64 values of an array of element type `elem` (bf16 held as its bits in uint16); exact."""
    from ..runtime.tilize import FP8_ELEMS, bf16_to_float32, fp8_values

    if elem == "bfloat16":
        return bf16_to_float32(x.view(xp.uint16), xp).astype(xp.float64)
    if elem in FP8_ELEMS:  # its bits in uint8
        return fp8_values(x, elem, xp).astype(xp.float64)
    return x.astype(xp.float64)


def check_result(c: Any, ref: Any, out_tiled: Any, elem: str, xp: Any) -> Check:
    """Compare a kernel's logical C (element type `elem`) with the float64 reference `ref`; count the poison left in
    C and in the padding of the tiled output buffer."""
    from ..runtime.tilize import storage_dtype, unwritten

    storage = storage_dtype(elem)
    logical_poison = unwritten(c, storage, xp)
    pad_poison = unwritten(out_tiled, storage, xp) - logical_poison
    c64 = values64(c, elem, xp)
    nonfinite = int(c.size - xp.count_nonzero(xp.isfinite(c64)))
    max_abs, rel_fro, scale = _errors(c64, ref, xp)
    correct = _within(elem, max_abs, rel_fro, scale) and logical_poison == 0 and nonfinite == 0
    return Check(bool(correct), max_abs, rel_fro, logical_poison, pad_poison, nonfinite)


def agrees(got: Any, elem: str, ref: Any, xp: Any, *, library: bool = False) -> tuple[bool, float]:
    """Whether a result of element type `elem` agrees with the reference, and its largest error. Integer results
    must be exact; float ones within TOLERANCE (spatialc) or BASELINE_REL_TOL (`library`)."""
    got64 = values64(got, elem, xp)
    max_abs, rel_fro, scale = _errors(got64, ref, xp)
    if not math.isfinite(max_abs):
        return False, max_abs
    return _within(elem, max_abs, rel_fro, scale, library=library), max_abs


def _within(elem: str, max_abs: float, rel_fro: float, scale: float, *, library: bool = False) -> bool:
    """Whether the errors of a result of element type `elem` are within its tolerance: an integer C exact, a float
    one within TOLERANCE (or BASELINE_REL_TOL for a `library`'s). NaN errors are never within."""
    if elem not in TOLERANCE:
        return max_abs == 0.0
    if library:
        return rel_fro <= BASELINE_REL_TOL[elem]
    rel_tol, abs_tol = TOLERANCE[elem]
    return rel_fro <= rel_tol and max_abs <= abs_tol * max(scale, 1e-30)


def _errors(c64: Any, ref: Any, xp: Any) -> tuple[float, float, float]:
    """max|C−R|, ‖C−R‖_F/‖R‖_F and max|R| (NaN anywhere makes the first two NaN)."""
    if c64.shape != ref.shape:
        raise SpatialError(f"a result of shape {tuple(c64.shape)} for a product of shape {tuple(ref.shape)}")
    if not c64.size:
        return 0.0, 0.0, 0.0
    diff = c64 - ref
    max_abs = float(xp.max(xp.abs(diff)))
    ref_norm = float(xp.sqrt(xp.sum(ref * ref)))
    rel_fro = float(xp.sqrt(xp.sum(diff * diff))) / ref_norm if ref_norm > 0 else max_abs
    return max_abs, rel_fro, float(xp.max(xp.abs(ref)))

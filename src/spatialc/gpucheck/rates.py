"""A row's rates and shares — T(FL)OP/s of a product, GB/s of a map's bytes; the fastest right contestant of a
library family, each way, and a time's share of its speed — and how the report's tables write them. No GPU."""

from __future__ import annotations

import math

from .agreement import Check
from .cases import Contestant, Row, Timing

UNIT = {"int8": "TOP/s", "fp16": "TFLOP/s", "bf16": "TFLOP/s", "e4m3": "TFLOP/s", "e5m2": "TFLOP/s"}
MAP_UNIT = "GB/s"  # a map row's: of the bytes it reads and writes


def rate(ops: int, seconds: float | None) -> float | None:
    """Tera-operations per second."""
    if seconds is None or seconds <= 0:
        return None
    return ops / seconds / 1e12


def row_rate(row: Row, seconds: float | None) -> float | None:
    """A row's rate for a time: T(FL)OP/s of a product, GB/s of the bytes a map moves (a W4A16 row's: its
    weights')."""
    if not (row.map or row.weights):
        return rate(row.ops, seconds)
    return None if seconds is None or seconds <= 0 else row.ops / seconds / 1e9


def unit_of(row: Row) -> str:
    return MAP_UNIT if row.map or row.weights else UNIT.get(row.precision, "TOP/s")


def _median(t: Timing | None) -> float | None:
    return None if t is None else t.median_s


def best(row: Row, family: str, way: str = "end_to_end") -> Contestant | None:
    """The fastest contestant of `family` timed `way` whose own result was right."""
    timed = [c for c in row.contestants if c.family == family and c.ok and _median(c.timing(way))]
    return min(timed, key=lambda c: _median(c.timing(way)) or math.inf, default=None)


def percent_of(row: Row, family: str, way: str, form: str) -> float | None:
    """The speed `way` of spatialc's kernel in `form` as a percentage of the fastest `family` contestant's."""
    mine = row.spatialc(form)
    return share_of(row, family, way, _median(mine.timing(way) if mine else None))


def share_of(row: Row, family: str, way: str, seconds: float | None) -> float | None:
    """A time of `seconds` (timed `way`) as a percentage of the fastest `family` contestant's speed."""
    ref = best(row, family, way)
    theirs = _median(ref.timing(way) if ref else None)
    return 100.0 * theirs / seconds if seconds and theirs else None


# ---- cells ---------------------------------------------------------------------------------------------------------


def _rate(x: float | None) -> str:
    """A rate with one decimal, or three significant digits when it is small (a tiny product)."""
    if x is None:
        return "—"
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}%"


def _err(c: Check | None) -> str:
    if c is None:
        return "—"
    return f"{c.max_abs:.3g}" if math.isfinite(c.max_abs) else str(c.max_abs)


def _correct(mine: Contestant | None) -> str:
    """Whether a spatialc kernel's result was right: its own output, a second run's, and end to end."""
    if mine is None or mine.check is None:
        return "—"
    if not mine.check.correct:
        return "no"
    if mine.check.stable is False:
        return "no (unstable)"
    return "no (end to end)" if mine.ok is False else "yes"


def _per_form(values: list[str]) -> str:
    """One cell of a value per spatialc kernel (`a / b`, in FORMS' order), or one — when none has any."""
    return "—" if all(v == "—" for v in values) else " / ".join(values)


def _timed(row: Row, t: Timing | None) -> str:
    """A timing as the row's rate, marked ‡ where the host's launching, not the device, set it."""
    return "—" if t is None else _rate(row_rate(row, t.median_s)) + (" ‡" if t.launch_bound else "")


def size_cell(row: Row) -> str:
    """A row's size as the tables write it, its dimensions joined by × (a map's kind, which may hold an x, kept)."""
    if row.map:
        return f"map:{row.map}:{row.m}×{row.n}"
    if row.weights:  # its format's name may hold an x (mxfp4)
        return f"w4:{row.weights}:{row.m}×{row.n}×{row.k}"
    if row.mx:  # fp8mx: holds an x too
        return f"fp8mx:{row.m}×{row.n}×{row.k}"
    return row.size.replace("x", "×")


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")

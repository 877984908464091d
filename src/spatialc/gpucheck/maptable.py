"""The report's table of map rows (programs with no matmul: elementwise maps and norms that reduce rows,
gpucheck/maps.py and norms.py), in GB/s of the bytes each must read and write: spatialc's general form against
torch's formula (kernel only and end to end) and against a device-to-device copy of as many bytes, and issue 31's
goal for a map (kernel only: ≥ 90% of the copy's bandwidth, not slower than torch). No GPU."""

from __future__ import annotations

from typing import Any

from .cases import SAME_SPEED, WAYS, Row
from .rates import (
    MAP_UNIT,
    _cell,
    _correct,
    _err,
    _median,
    _pct,
    _per_form,
    _rate,
    _timed,
    best,
    row_rate,
    share_of,
    size_cell,
)

# Issue 31's goal for a map, kernel only: at least this % of the copy's bandwidth, and of torch's speed.
MAP_GOAL = {"copy": 90.0, "torch": 100.0}

MAP_COLUMNS = (
    "precision",
    "map",
    "MB",
    "spatialc general kernel",
    "spatialc general e2e",
    "torch kernel",
    "torch e2e",
    "copy",
    "% torch kernel / e2e",
    "% copy",
    "max err",
    "correct",
    "goal",
    "status",
)


def _map_time(row: Row, way: str) -> float | None:
    """spatialc's map kernel's time `way`."""
    mine = row.spatialc("general")
    return _median(mine.timing(way)) if mine else None


def map_goal(row: Row) -> str | None:
    """Whether a map row met issue 31's goal, kernel only (≥ MAP_GOAL % of the copy's bandwidth and of torch's
    speed; torch's within SAME_SPEED, the timing noise the sweep's verdicts allow, counts as not slower), in words;
    None where one of the three has no right, timed kernel."""
    mine = row.spatialc("general")
    right = mine is not None and mine.check is not None and mine.check.correct and mine.ok
    pct = {family: share_of(row, family, "kernel", _map_time(row, "kernel")) for family in MAP_GOAL}
    if not right or any(p is None for p in pct.values()):
        return None
    slack = {"copy": 0.0, "torch": 100.0 * SAME_SPEED}
    missed = [
        f"{p:.0f}% of {family} (goal {MAP_GOAL[family]:.0f}%)"
        for family, p in pct.items()
        if p is not None and p < MAP_GOAL[family] - slack[family]
    ]
    return "missed: " + ", ".join(missed) if missed else "met"


def map_summary(row: Row) -> dict[str, Any]:
    """A map row's rates (GB/s), each way: spatialc's general form, the fastest right torch contestant and the copy,
    with spatialc's share of torch's speed and of the copy's bandwidth, and the goal's verdict."""
    fastest: dict[str, Any] = {}
    for family, ways in (("torch", WAYS), ("copy", ("kernel",))):
        for way in ways:
            ref = best(row, family, way)
            theirs = None if ref is None else {"name": ref.name, "rate": row_rate(row, _median(ref.timing(way)))}
            fastest.setdefault(family, {})[way] = theirs
    return {
        "bytes": row.ops,
        "spatialc": {way: row_rate(row, _map_time(row, way)) for way in WAYS},
        **fastest,
        "pct_of_torch": {way: share_of(row, "torch", way, _map_time(row, way)) for way in WAYS},
        "pct_of_copy": share_of(row, "copy", "kernel", _map_time(row, "kernel")),
        "goal": map_goal(row),
    }


def map_cells(row: Row) -> list[str]:
    """One line of the map table."""
    mine = row.spatialc("general")
    from .maps import kind_of

    passes = kind_of(row).passes
    kind = size_cell(row).removeprefix("map:") + (f" ({passes} passes)" if passes > 1 else "")
    cells = [row.precision, kind, _rate(row.ops / 1e6)]
    cells += [_timed(row, mine.timing(way) if mine else None) for way in ("kernel", "end_to_end")]
    for family, way in (("torch", "kernel"), ("torch", "end_to_end"), ("copy", "kernel")):
        ref = best(row, family, way)
        cells.append("—" if ref is None else _timed(row, ref.timing(way)))
    torch = [_pct(share_of(row, "torch", way, _map_time(row, way))) for way in ("kernel", "end_to_end")]
    cells += [_per_form(torch), _pct(share_of(row, "copy", "kernel", _map_time(row, "kernel")))]
    cells += [_err(mine.check if mine else None), _correct(mine), map_goal(row) or "—"]
    return [_cell(c) for c in [*cells, row.status + (f": {row.note}" if row.note else "")]]


def map_lines(rows: list[Row]) -> list[str]:
    """The map rows' table (none without map rows)."""
    maps = [r for r in rows if r.map]
    if not maps:
        return []
    goal = f"≥ {MAP_GOAL['copy']:.0f}% of the copy's bandwidth and ≥ {MAP_GOAL['torch']:.0f}% of torch's speed"
    return [
        "",
        f"Maps (programs with no matmul: elementwise maps, and norms that reduce rows; {MAP_UNIT} of the bytes each "
        "must read and write — every input once, C once — as spatialc's general form, torch's formula in the inputs' "
        "type and a device-to-device copy of as many bytes move them; a norm's kernel reads x once a pass over its "
        "rows (softmax 3, RMSNorm 2, LayerNorm 3, fused add + RMSNorm 2, a row reduction 1: the map column's "
        "passes), which these bytes count once; fused add + RMSNorm's count x and residual read, out and residual_out "
        "written; a row reduction's x and its m values; LayerNorm's "
        "bytes count its mean and rstd as float32 besides, and its kernel stores out as float32 (layernorm's "
        "default out type, which gpucheck builds), torch's in the inputs' type; goal, issue 31's, kernel "
        f"only: {goal}, within the timing noise ({SAME_SPEED:.0%}) of torch's; correct: every element of C within "
        "its kind's bound of its float64 reference on the same rounded inputs (LayerNorm: each of its outputs; a "
        "map's: each op's float32 rounding and ulps, relative; a norm's: each row sum's float32 rounding, n + 2 ulps "
        "of its magnitude, carried through the ops after it; either with 2 ulps at 1.0 of C's type); spatialc's end "
        "to end tilizes each input and untilizes C on the device, torch's takes them row-major as they are):",
        "",
        "| " + " | ".join(MAP_COLUMNS) + " |",
        "|" + "---|" * len(MAP_COLUMNS),
        *("| " + " | ".join(map_cells(r)) + " |" for r in maps),
    ]

"""Pictures, as standalone SVG text (no dependencies): where the items went, how a site's engines and rings went
over time, and which engines a deadlock left waiting on which. Each has a title saying what it shows, a colour
key, and (the timeline) axes with numbers, so that it can be read without the source."""

from __future__ import annotations

from pathlib import Path

from ..errors import DeadlockError
from ..files import write_whole
from ..interp.trace import Trace
from ..ir.nodes import SpatialProgram
from .deadlock import _note_of, deadlock_svg, reasons_of
from .placement import placement_rule, placement_svg
from .svg import CHAR_W
from .timeline import PictureError, Window, check_site, timeline_svg


def write_pictures(
    folder: str | Path,
    program: SpatialProgram,
    trace: Trace | None = None,
    site: int = 0,
    window: Window | None = None,
) -> list[Path]:
    """Write placement.svg, and timeline.svg (site `site`, the whole run or the ticks of `window`) when a trace is
    given, into `folder` (made if missing); returns the paths written."""
    folder = Path(folder)
    pictures = {"placement.svg": placement_svg(program)}
    if trace is not None:
        check_site(program, site)
        pictures["timeline.svg"] = timeline_svg(trace, site, window, name=program.name)
    folder.mkdir(parents=True, exist_ok=True)  # once every picture is drawn: a refused one leaves no folder behind
    for name, svg in pictures.items():
        write_whole(folder / name, svg)
    return [folder / name for name in pictures]


def write_deadlock(folder: str | Path, program: SpatialProgram, error: DeadlockError) -> Path:
    """Write deadlock.svg, the wait-for graph of `error` with the page counts its message gives, into `folder`
    (made if missing); returns its path."""
    path = Path(folder) / "deadlock.svg"
    path.parent.mkdir(parents=True, exist_ok=True)
    where = getattr(error, "where", None)  # the user's lines, for a program written with spatialc.lang
    svg = deadlock_svg(program, error.blocked, reasons=reasons_of(error), note=_note_of(error), where=where)
    write_whole(path, svg)
    return path


__all__ = [
    "CHAR_W",
    "PictureError",
    "check_site",
    "deadlock_svg",
    "placement_rule",
    "placement_svg",
    "reasons_of",
    "timeline_svg",
    "write_deadlock",
    "write_pictures",
]

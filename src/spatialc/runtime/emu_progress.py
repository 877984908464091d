"""A progress line on a terminal: `StderrProgress`, the ready-made `progress(done, total)` callback of a run."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import IO


class StderrProgress:
    """A `progress(done, total)` callback that keeps one line on stderr up to date: `emulating: 37/132 blocks, 12 s`.

    It writes only when its stream is a terminal (or with `force`), at most ten times a second, and finishes the
    line when `done` reaches `total`. Used as a context manager it also finishes a line left open by a run that
    failed, so the error printed next starts on a line of its own. Seconds count from its creation."""

    EVERY_S = 0.1

    def __init__(
        self,
        label: str = "emulating",
        *,
        force: bool = False,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.force, self.stream, self.clock = label, force, stream, clock
        self.started = clock()
        self.width = 0  # characters of the open line; 0 when none is open
        self.shown = -float("inf")
        self._lock = threading.Lock()

    def _out(self) -> IO[str] | None:
        stream = self.stream if self.stream is not None else sys.stderr
        if stream is None:
            return None
        try:
            return stream if self.force or stream.isatty() else None
        except (AttributeError, ValueError):  # no isatty, or closed
            return None

    def note(self, text: str) -> None:
        """A line of its own before the count (what the run waits on first), where the count would be shown."""
        stream = self._out()
        if stream is not None:
            with self._lock:
                stream.write(("\n" if self.width else "") + f"{self.label}: {text}\n")  # after a count left open
                self.width = 0
                stream.flush()

    def __call__(self, done: int, total: int) -> None:
        stream = self._out()
        if stream is None:
            return
        with self._lock:
            now, last = self.clock(), done >= total
            if not last and self.width and now - self.shown < self.EVERY_S:
                return
            text = f"{self.label}: {done}/{total} blocks, {now - self.started:.0f} s"
            stream.write("\r" + text.ljust(self.width) + ("\n" if last else ""))
            stream.flush()
            self.width, self.shown = (0 if last else len(text)), now

    def close(self) -> None:
        """End the open line, if there is one (a run that stopped before its last block)."""
        stream = self._out()
        with self._lock:
            if stream is not None and self.width:
                stream.write("\n")
                stream.flush()
            self.width = 0

    def __enter__(self) -> StderrProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stderr_progress(label: str = "emulating", *, force: bool = False) -> StderrProgress:
    """A progress callback for `emulate(..., progress=)` that shows `label: done/total blocks, seconds` on one
    rewritten stderr line when stderr is a terminal (silent when piped, unless `force`)."""
    return StderrProgress(label, force=force)

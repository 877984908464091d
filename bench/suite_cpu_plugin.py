"""The pytest plugin of bench/suite_cpu.py: each test's CPU seconds (its process's and its waited-for children's,
setup to teardown) appended to SPATIALC_SUITE_CPU_OUT/cpu.<pid>.tsv."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator
from typing import IO

import pytest

_out: IO[str] | None = None


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    global _out
    if _out is None:
        folder = os.environ.get("SPATIALC_SUITE_CPU_OUT", ".")
        _out = open(os.path.join(folder, f"cpu.{os.getpid()}.tsv"), "a")  # noqa: SIM115 — kept open for the run
    own, children, wall = *_cpu(), time.perf_counter()
    yield
    own2, children2, wall2 = *_cpu(), time.perf_counter()
    _out.write(f"{own2 - own:.3f}\t{children2 - children:.3f}\t{wall2 - wall:.3f}\t{item.nodeid}\n")
    _out.flush()

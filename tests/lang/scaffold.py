"""What the lang fault tests share: `copy_program`, the smallest program of the embedded language they edit — input
`name` copied to out a tile an item (2 × 2 items of one tile on one site) through a map, the writer's body
`writer(e, ring, out)` (by default: wait for the copy's page of each item and write it) given the ring it empties
(`ring_of()` where given: another's) —, `map_program` and `squared`, a map stage of a formula and a formula whose
parts are shared, and `at_most`, which fails a test that runs on (an exponential walk would run for minutes)."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from spatialc import lang


def write_each_item(e: lang.Engine, ring, out) -> None:
    for item in e.items():
        with ring.wait() as page:
            page.write(out, 2 * item.y + item.x, 1, 1)


def copy_program(
    p: lang.Builder, name: str = "x", writer: Callable = write_each_item, ring_of: Callable | None = None
) -> None:
    x = p.input(name, 32, 32)
    out = p.output("out", 32, 32)
    ring = p.ring("x_ring", depth=2, tiles=1)
    done = p.ring("out_ring", depth=2, tiles=1, kind="interm")
    p.read("read_x", x, ring)
    copy = p.map("copy", lambda v: v, ring, done)
    p.write("write_out", done, out)
    p.plan(block=(1, 1, 1), grid=(2, 2), k_tiles=1, depth=2)
    p.place([[0, 1, 2, 3]])

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            with ring.reserve() as page:
                page.read(x, 2 * item.y + item.x, 1, 1)

    @p.compute
    def compute(e: lang.Engine):
        for item in e.items():
            with ring.wait() as src, done.reserve() as dst:
                e.map(copy, src, dst, at=item.x, width=1)

    @p.writer
    def write(e: lang.Engine):
        writer(e, done if ring_of is None else ring_of(), out)


@contextmanager
def at_most(seconds: int) -> Iterator[None]:
    """Fail the test instead of running on past `seconds`."""

    def expired(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def squared(times: int):
    """x^(2^times) by repeated squaring: `times` + 1 distinct nodes, a tree of 2^(times + 1) − 1."""
    return lambda v: functools.reduce(lambda a, _: a * a, range(times), v)


def map_program(p: lang.Builder, formula) -> None:
    """A map stage of `formula` and nothing placed: refused after the map, where the map is accepted."""
    x = p.input("x", 16, 16)
    p.output("out", 16, 16)
    ring = p.ring("x_ring", depth=2, tiles=1)
    done = p.ring("out_ring", depth=2, tiles=1, kind="interm")
    p.read("read_x", x, ring)
    p.map("m", formula, ring, done)

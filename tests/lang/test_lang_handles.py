"""What the embedded language takes of a program's handles, loops and options: another program's handles, loops
past the variables a program may take, unnamed loops' indices after their loops, and options of a known set (a
placement's kind) or a bool (attention's causal, a product's transpose_b) — each refused as a LangError at the
user's line."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import pytest

from spatialc import lang

from .scaffold import copy_program


def line_of(fn: Callable, text: str) -> int:
    """The line of this file where `fn`'s source holds `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def handles_of_another_program() -> dict:
    kept: dict = {}

    def other(p: lang.Builder) -> None:
        kept["ring"] = p.ring("out_ring", depth=2, tiles=1)
        kept["sem"] = p.semaphore("s")
        kept["group"] = p.group([0, 1])

    with pytest.raises(lang.LangError):
        lang.trace(other)  # (no placement: refused, but its handles are made)
    return kept


def wait_for_the_ring(e: lang.Engine, ring: lang.RingRef, out: lang.TensorRef) -> None:
    for item in e.items():
        with ring.wait() as page:
            page.write(out, 2 * item.y + item.x, 1, 1)


def test_the_copy_program_verifies():  # the control for the refusals below
    lang.trace(copy_program, writer=wait_for_the_ring).verify()


@pytest.mark.parametrize("handle", ["ring", "sem", "group"])
def test_a_handle_of_another_program_is_refused_at_its_line(handle):
    kept = handles_of_another_program()

    def writer(e: lang.Engine, ring: lang.RingRef, out: lang.TensorRef) -> None:
        for item in e.items():
            if handle == "sem":
                e.sem_wait(kept["sem"], 1)
            if handle == "group":
                e.barrier(kept["group"])
            with ring.wait() as page:
                page.write(out, 2 * item.y + item.x, 1, 1)

    ring_of = (lambda: kept["ring"]) if handle == "ring" else None
    with pytest.raises(lang.LangError, match="another program") as error:
        lang.trace(copy_program, writer=writer, ring_of=ring_of)
    text = {"ring": "with ring.wait()", "sem": "e.sem_wait(", "group": "e.barrier("}[handle]
    assert (error.value.file, error.value.line) == (__file__, line_of(writer, text))


def test_an_unnamed_loops_index_after_its_loop_is_refused():
    def writer(e: lang.Engine, ring: lang.RingRef, out: lang.TensorRef) -> None:
        for item in e.items():
            for i in e.range(1):  # noqa: B007 (its index is used after it: what is refused)
                pass
            for _ in e.range(1):  # the same variable as the loop above: `i` here would silently be this loop's
                with ring.wait() as page:
                    page.write(out, 2 * item.y + item.x + i, 1, 1)

    with pytest.raises(lang.LangError, match="no enclosing loop binds") as error:
        lang.trace(copy_program, writer=writer)
    assert error.value.line == line_of(writer, "page.write(")


def test_sequential_unnamed_loops_share_a_variable():  # as they always have: the IR of such programs is unchanged
    def writer(e: lang.Engine, ring: lang.RingRef, out: lang.TensorRef) -> None:
        for item in e.items():
            for _ in e.range(1):
                pass
            for _ in e.range(1):
                for _ in e.range(1):
                    with ring.wait() as page:
                        page.write(out, 2 * item.y + item.x, 1, 1)

    program = lang.trace(copy_program, writer=writer).verify()
    (writer_ops,) = [q.ops for q in program.schedule.programs if q.engine.value == "writer" and int(q.site) == 0]
    (items,) = writer_ops
    first, second = items.body
    assert (int(first.var), int(second.var), int(second.body[0].var)) == (8, 8, 9)


def test_ten_thousand_loop_names_are_refused_quickly():
    def many(p: lang.Builder) -> None:
        p.input("x", 32, 32)
        p.plan(block=(1, 1, 1), grid=(2, 2), k_tiles=1, depth=2)
        p.place([[0, 1, 2, 3]])

        @p.reader
        def read(e: lang.Engine):
            for i in range(10_000):
                for _ in e.range(1, f"loop{i}"):
                    pass

    start = time.perf_counter()
    with pytest.raises(lang.LangError, match="loop variables a program's loops may take") as error:
        lang.trace(many)
    assert time.perf_counter() - start < 5  # (a rebuild of the names taken at each new name: seconds)
    assert error.value.file == __file__


def test_a_placement_of_an_unknown_kind_is_refused():
    def bogus(p: lang.Builder) -> None:
        p.input("x", 32, 32)
        p.plan(block=(1, 1, 1), grid=(2, 2), k_tiles=1, depth=2)
        p.place([[0, 1, 2, 3]], kind="bogus")

    with pytest.raises(lang.LangError, match=r"'bogus' \(contiguous, round_robin, grouped, hilbert, split"):
        lang.trace(bogus)


@pytest.mark.parametrize("kind", ["contiguous", "round_robin", "grouped", "hilbert", "split", "split_tail"])
def test_the_placement_kinds_builds_make_are_taken(kind):
    def placed(p: lang.Builder) -> None:
        p.input("x", 32, 32)
        p.place([[0, 1, 2, 3]], kind=kind)

    assert lang.trace(placed).program.placement.kind == kind


def attention_program(p: lang.Builder, causal: object) -> None:
    rings = {}
    for name in ("Q", "K", "V"):
        t = p.input(name, 64, 64)
        rings[name] = p.ring(f"{name.lower()}_ring", depth=2, tiles=4)
        p.read(f"read_{name.lower()}", t, rings[name])
    o, lse = p.ring("o_ring", depth=2, tiles=4), p.ring("lse_ring", depth=2, tiles=1)
    p.attention("attention", rings["Q"], rings["K"], rings["V"], o, lse, causal=causal)


@pytest.mark.parametrize("causal", ["False", 1, None])
def test_attention_causal_is_a_bool(causal):
    with pytest.raises(lang.LangError, match="causal is True or False"):
        lang.trace(attention_program, causal=causal)


def test_a_product_transpose_b_is_a_bool():
    def product(p: lang.Builder) -> None:
        p.input("A", 16, 16), p.input("B", 16, 16)
        a_ring, b_ring = p.ring("a_ring", depth=2, tiles=1), p.ring("b_ring", depth=2, tiles=1)
        acc = p.accumulator("acc", 1)
        p.plan(block=(1, 1, 1), grid=(1, 1), k_tiles=1, depth=2)
        p.place([[0]])

        @p.compute
        def compute(e: lang.Engine):
            acc.acquire()
            with a_ring.wait() as pa, b_ring.wait() as pb:
                acc.product(pa, pb, block=(1, 1, 1), transpose_b="no")

    with pytest.raises(lang.LangError, match="transpose_b is True or False"):
        lang.trace(product)


def test_a_list_given_for_a_ring_is_refused_by_the_rings_names():
    """It was the list's repr: each ring's with its builder's, `<spatialc.lang.builder.Builder object at 0x…>`."""

    def bad(p: lang.Builder) -> None:
        x = p.input("x", 16, 16)
        a, b = p.ring("a", depth=2, tiles=1), p.ring("b", depth=1, tiles=1, kind="interm")
        p.read("read_x", x, a)
        p.reduce("r", "sum", [a, a], b)

    with pytest.raises(lang.LangError, match=r"is a ring \(p\.ring\), not list \[ring a, ring a\]$"):
        lang.trace(bad)

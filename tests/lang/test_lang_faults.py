"""Faults of spatialc.lang a review found, each named by its test: nested unnamed loops refused, another program's
handles taken by number, a formula's shared parts walked as a tree, Python's own errors from a formula, a printed
module's names shadowed by a tensor's, errors naming spatialc's file. Each test failed before its fix."""

from __future__ import annotations

import functools

import pytest

import spatialc
from spatialc import bias, lang, relu
from spatialc.errors import SpatialError
from spatialc.lang.source import python_source

from .scaffold import at_most, copy_program, map_program, squared


def nested_copy(p: lang.Builder, nested: tuple[str | None, str | None] = ("i", "j")) -> None:
    """The copy program with the writer's store inside two nested one-step loops named `nested`."""

    def writer(e: lang.Engine, ring, out) -> None:
        for item in e.items():
            for _ in e.range(1, nested[0]):
                for _ in e.range(1, nested[1]):
                    with ring.wait() as page:
                        page.write(out, 2 * item.y + item.x, 1, 1)

    copy_program(p, writer=writer)


def test_named_nested_loops_trace():  # the control: the same program with its loops named is accepted
    lang.trace(nested_copy, nested=("i", "j")).verify()


# Bug: `Builder.loop_var(None)` hands out the first free loop variable without taking it, so a loop with no name
# inside another (or a named one inside an unnamed one) gets its enclosing loop's variable and is refused with
# "loop variable 8 inside a loop of itself" — the IR's number, not a name the user wrote.
@pytest.mark.parametrize("names", [(None, None), (None, "j")])
def test_unnamed_nested_loops_trace(names):
    lang.trace(nested_copy, nested=names).verify()


# Bug: `show --python` prints an epilogue op by its class (`Bias(3, …)`, `Relu()`, `TileAddr(…)`, brought in by
# `from spatialc.ir.ops import *`) but does not keep those names out of the tensors' variables: a bias tensor named
# "Bias" (or "Relu", "TileAddr") shadows the class, and the printed source dies with a raw TypeError
# ('TensorRef' object is not callable) instead of tracing back to the program.
@pytest.mark.parametrize("name", ["Bias", "Relu", "TileAddr"])
def test_python_source_of_a_bias_named_like_an_op_traces_back(name):
    p = spatialc.build(spatialc.gemm(64, 64, 128, "bf16", epilogue=[bias(name), relu()]), "sm_90")
    scope: dict = {}
    exec(python_source(p), scope)
    assert scope["program"]() == p


# Bug: p.map walks its formula as a tree (lang/maps.py `as_rows`, ew.resolved), not as the DAG the user built, so
# a formula of 25 distinct nodes whose results are each used twice (x^(2^24) by squaring) takes time and memory
# exponential in its size — minutes and gigabytes for 25 ops (2^16 leaves already take 0.5 s).
def test_a_map_of_shared_subexpressions_traces_in_time():
    with at_most(3), pytest.raises(SpatialError):  # refused (the trace places no items) — after the map, quickly
        lang.trace(map_program, formula=squared(24))


# Bug: errors raised in spatialc/ew.py while p.map builds the formula are not the tracer's (lang.lines.in_tracer
# knows only the lang package), so they leave as raw Python errors: OverflowError for an integer constant past
# float, RecursionError for a formula nested 3,000 deep (300 deep is an IllFormedError).
@pytest.mark.parametrize(
    "formula",
    [lambda v: v * 10**400, lambda v: functools.reduce(lambda a, _: a + 1, range(3000), v)],
    ids=["int-past-float", "3000-deep"],
)
def test_a_bad_map_formula_is_a_spatial_error(formula):
    with pytest.raises(SpatialError):
        lang.trace(map_program, formula=formula)


# Bug: handles are checked for their type, never for their program: a tensor handle of another traced program is
# taken as this program's tensor of the same number (silently another tensor), and past this program's tensors
# page.read dies with a raw IndexError in builder.tensor_cols.
def test_a_tensor_of_another_program_is_refused():
    kept: dict = {}

    def other(p: lang.Builder) -> None:
        for name in "UVWXYZ":
            kept[name] = p.input(name, 32, 32)

    with pytest.raises(SpatialError):
        lang.trace(other)  # (no placement: refused, but its handles are made)

    def program(p: lang.Builder) -> None:
        x = p.input("x", 32, 32)
        out = p.output("out", 32, 32)
        ring = p.ring("x_ring", depth=2, tiles=1)
        p.read("read_x", x, ring)
        p.write("write_out", ring, out)
        p.plan(block=(1, 1, 1), grid=(2, 2), k_tiles=1, depth=2)
        p.place([[0, 1, 2, 3]])

        @p.reader
        def read(e: lang.Engine):
            for item in e.items():
                with ring.reserve() as page:
                    page.read(kept["Z"], 2 * item.y + item.x, 1, 1)

    with pytest.raises(SpatialError):
        lang.trace(program)


# Bug: a program function called with a keyword it does not take is a LangError naming spatialc's own file
# (spatialc/lang/__init__.py, the tracer's call) rather than the user's line: `_at_user_line` falls back to the
# innermost frame, which is the tracer's.
def test_a_wrong_keyword_names_the_callers_line():
    @lang.program()
    def nothing(p: lang.Builder, m: int = 16) -> None:
        p.input("x", m, m)

    with pytest.raises(lang.LangError) as error:
        nothing(n=3)
    assert error.value.file == __file__


# Bug: an engine function with a `yield` (or an `async def` one) is only called, never run, by the tracer: the engine
# traced as empty and the program was refused for unbalanced rings, the compute engine's pops blamed. So is a program
# function of either kind (nothing declared). Each is refused at once, naming the function.
def test_a_generator_engine_is_refused_by_name():
    def program(p: lang.Builder) -> None:
        copy_program(p)

        @p.mover
        def forward(e: lang.Engine):
            for _ in e.items():
                yield

    with pytest.raises(lang.LangError, match="engine function 'forward' is a generator") as error:
        lang.trace(program)
    assert error.value.file == __file__


def test_an_async_program_function_is_refused_by_name():
    async def program(p: lang.Builder) -> None:
        copy_program(p)

    with pytest.raises(lang.LangError, match="program function 'program' is an async function") as error:
        lang.trace(program)
    assert error.value.file == __file__

"""A map's formula in the embedded language: one that reuses its parts is read once per part (and one too large for a
Map refused at once), Python's own errors from building one are refusals at the user's line, `show --python` keeps
the names it invents off every name its module imports, and verify refuses an id no saved program holds."""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import numpy as np
import pytest

import spatialc
from spatialc import bias, ew, lang, relu
from spatialc.errors import IllFormedError, ProgramError
from spatialc.ir import serde
from spatialc.ir.ids import ItemId, LoopVar, SemId, TensorId
from spatialc.ir.nodes import ComputeStage, Semaphore
from spatialc.ir.ops import MAX_EXPR_NODES, Loop
from spatialc.lang.source import python_source

from . import scaffold
from .scaffold import at_most, map_program, squared
from .scaffold import copy_program as copy_program_of


def map_refusal(formula) -> lang.LangError:
    """The refusal of `formula` at p.map (not the later one of the program's missing placement)."""
    with pytest.raises(lang.LangError) as error:
        lang.trace(map_program, formula=formula)
    assert error.value.file == scaffold.__file__, str(error.value)  # the line of p.map in map_program
    return error.value


# ---- 1. a formula that reuses its parts -------------------------------------------------------------------------


def test_a_formula_of_shared_parts_is_the_formula_written_out():
    # x^16 by squaring: 5 distinct nodes, a tree of 31 — within a Map's limit, and the same formula as written out.
    v = ew.inputs(1)[0]
    written = ((v * v) * (v * v)) * ((v * v) * (v * v))
    written = written * written
    assert ew.resolved(squared(4)(v), lambda _: TensorId(0)) == ew.resolved(written, lambda _: TensorId(0))
    declared: dict = {}

    def keep(p: lang.Builder, formula) -> None:
        map_program(p, formula)
        declared[formula] = next(s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage))

    for formula in (squared(4), lambda x: written):
        with pytest.raises(spatialc.SpatialError, match="plan|place"):  # refused for what it lacks, after the map
            lang.trace(keep, formula=formula)
    shared, out = declared.values()
    assert shared == out


@pytest.mark.parametrize("times", [8, 24, 60])
def test_a_formula_past_a_maps_size_is_refused_at_once(times):
    start = time.perf_counter()
    with at_most(5):
        error = map_refusal(squared(times))
    assert f"more than {MAX_EXPR_NODES} nodes" in str(error) and time.perf_counter() - start < 2
    start = time.perf_counter()
    with at_most(5), pytest.raises(ProgramError, match=f"more than {MAX_EXPR_NODES} nodes"):  # and elementwise's
        spatialc.elementwise(squared(times)(ew.inputs(1)[0]), 16, 16)
    assert time.perf_counter() - start < 2


def test_the_vectors_of_a_shared_formula_are_read_once_in_order():
    v = ew.inputs(1)[0]
    part = functools.reduce(lambda a, _: a * a, range(40), v + ew.col("b"))  # 2^40 uses of b: read once
    with at_most(5):
        named = ew.vector_names(part * ew.row("s") + ew.col("c"))
    assert named == {
        "b": spatialc.ir.ops.VecAxis.COL,
        "s": spatialc.ir.ops.VecAxis.ROW,
        "c": spatialc.ir.ops.VecAxis.COL,
    }


# ---- 2. Python's own errors while a formula is built ------------------------------------------------------------


@pytest.mark.parametrize(
    ("formula", "words"),
    [
        (lambda v: v * 10**400, "integer of 1329 bits"),
        (lambda v: v ** (-(10**5000)), "integer of"),  # (its repr is itself refused by Python)
        (lambda v: ew.leaky_relu(v, alpha=10**400), "alpha is a finite number"),
        (lambda v: v // 2, "floor division"),
        (lambda v: 2 // v, "floor division"),
        (lambda v: v % 2, "remainder"),
        (lambda v: round(v), "round()"),
        (lambda v: math.floor(v), "math.floor()"),
        (lambda v: math.exp(v), "not one float"),
        (lambda v: np.exp(v), "numpy's exp"),
        (lambda v: np.ones(3) * v, "numpy's multiply"),
        (lambda v: v & v, "ew.where"),
        (lambda v: v.exp(), "AttributeError"),
        (lambda v: functools.reduce(lambda a, _: a + 1, range(3000), v), "nested more than"),
        (lambda v: functools.reduce(lambda a, _: a + 1, range(300), v), "nested more than"),
    ],
    ids=[
        "int-past-float",
        "int-past-repr",
        "param-past-float",
        "floordiv",
        "rfloordiv",
        "mod",
        "round",
        "floor",
        "math-exp",
        "np-exp",
        "np-array",
        "and",
        "no-method",
        "3000-deep",
        "300-deep",
    ],
)
def test_a_bad_formula_is_refused_at_its_map(formula, words):
    error = map_refusal(formula)
    assert words in str(error)


def test_a_refused_operator_says_what_a_formula_is_made_of():
    error = map_refusal(lambda v: v // 2)
    assert "+ - * / **" in str(error) and "ew.where" in str(error)


def test_unary_plus_is_the_value_itself():
    v = ew.inputs(1)[0]
    assert (+v) is v and ew.resolved(+v * 2, lambda _: TensorId(0)) == ew.resolved(v * 2, lambda _: TensorId(0))


# ---- 3. show --python's invented names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["A_ring_w1", "C_ring_r4", "LoopVar", "Apply", "reader_0", "k", "Map"])
def test_python_source_keeps_its_names_off_the_programs(name):
    p = spatialc.build(spatialc.gemm(64, 64, 128, "bf16", epilogue=[bias(name), relu()]), "sm_90")
    scope: dict = {}
    exec(python_source(p), scope)
    assert scope["program"]() == p


# ---- 4. ids a saved program cannot hold -------------------------------------------------------------------------


@functools.cache
def built() -> spatialc.SpatialProgram:
    return spatialc.build(spatialc.gemm(32, 32, 32, "int8"), "sm_90")


def _renumbered_loop(p: spatialc.SpatialProgram, var: int) -> spatialc.SpatialProgram:
    """`p` with its first program's first loop's variable renumbered `var` (its body's reads of it left as they are:
    rule 1 meets the number first)."""
    assert p.schedule is not None
    prog = p.schedule.programs[0]
    i, loop = next((i, op) for i, op in enumerate(prog.ops) if isinstance(op, Loop))
    ops = (*prog.ops[:i], dataclasses.replace(loop, var=LoopVar(var)), *prog.ops[i + 1 :])
    programs = (dataclasses.replace(prog, ops=ops), *p.schedule.programs[1:])
    return p.evolve(schedule=dataclasses.replace(p.schedule, programs=programs))


def _edits():
    def semaphore(p):
        return p.evolve(semaphores=(Semaphore(SemId(10**30), "s", 0),))

    def tensor(p):
        return p.evolve(tensors=(dataclasses.replace(p.tensors[0], id=TensorId(2**63)), *p.tensors[1:]))

    def item(p):
        (site, items), *rest = p.placement.items_of_site
        first = ((site, (ItemId(-(2**63) - 1), *items[1:])), *rest)
        return p.evolve(placement=dataclasses.replace(p.placement, items_of_site=first))

    def stage(p):
        return p.evolve(stages=(dataclasses.replace(p.stages[0], id=type(p.stages[0].id)(2**70)), *p.stages[1:]))

    def loop(p):
        return _renumbered_loop(p, 2**64)

    return {"semaphore": semaphore, "tensor": tensor, "item": item, "stage": stage, "loop": loop}


@pytest.mark.parametrize("what", list(_edits()))
def test_verify_refuses_an_id_past_what_json_holds(what):
    p = _edits()[what](built())
    with pytest.raises(IllFormedError, match="an id is a whole number of at most 64 bits") as error:
        spatialc.verify(p)
    assert "own types" not in str(error.value)  # a fault of size, not of type: no advice to use the IR's types
    with pytest.raises(serde.SerdeError, match=r"at most 64 bits"):  # what it spares: a saved file not read back
        serde.from_json(serde.to_json(p))


def test_an_id_at_the_edge_of_json_is_kept():
    p = built().evolve(semaphores=(Semaphore(SemId(2**63 - 1), "s", 0),))
    spatialc.verify(p)
    assert serde.from_json(serde.to_json(p)) == p


def copy_program(name: str):
    """A program of input `name` copied to out a tile an item: its page variable in `show --python` is x_ring_w1."""

    def program(p: lang.Builder) -> None:
        copy_program_of(p, name=name)

    return program


@pytest.mark.parametrize("name", ["x_ring_w1", "x_ring_r1", "Wait"])
def test_python_source_keeps_its_pages_off_the_tensors(name):
    p = lang.trace(copy_program(name)).verify()
    scope: dict = {}
    exec(python_source(p), scope)
    assert scope["program"]() == p

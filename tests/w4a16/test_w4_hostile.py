"""Hostile edits of a saved W4A16 program's Dequant ops: each is refused by verify (the document comes back
unverified) or the JSON reader; the few that verify — the declaration's page place, which only the schedule's ops
give, or the zero point dropped from the declaration and the schedule alike (another function, declared) — compute
what is declared; and the interpreter runs every edited program to a result or a typed error, never a crash."""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import spatialc
from spatialc.numerics.reference import reference

from .w4_inputs import w4_inputs, w4_program

EDITS: dict[str, Callable[[dict], None]] = {
    "scale: no such tensor": lambda d: d.__setitem__("scale", 99),
    "scale: the weights": lambda d: d.__setitem__("scale", 1),
    "zero point: the output": lambda d: d.__setitem__("zero", 2),
    "no zero point": lambda d: d.__setitem__("zero", None),
    "group 0": lambda d: d.__setitem__("group", 0),
    "group -16": lambda d: d.__setitem__("group", -16),
    "group 2^62": lambda d: d.__setitem__("group", 2**62),
    "width 0": lambda d: d.__setitem__("width", 0),
    "width 1000": lambda d: d.__setitem__("width", 1000),
    "rows of an unbound variable": lambda d: d.__setitem__("rows", {"type": "TileAddr", "base": 0, "steps": [[9, 1]]}),
    "rows from -1": lambda d: d["rows"].__setitem__("base", -1),
    "columns from 2^40": lambda d: d["cols"].__setitem__("base", 2**40),
    "weights int8": lambda d: d.__setitem__("weights", "int8"),
    "weights uint4": lambda d: d.__setitem__("weights", "uint4"),
    "operand fp16": lambda d: d.__setitem__("operand", "fp16"),
    "operand int8": lambda d: d.__setitem__("operand", "int8"),
}
PLACE = ("width 0", "width 1000", "rows of an unbound variable", "rows from -1", "columns from 2^40")


def _dequants(node: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(node, dict):
        if node.get("type") == "Dequant":
            yield path
        for k, v in node.items():
            yield from _dequants(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _dequants(v, (*path, i))


def _at(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@pytest.fixture(scope="module")
def saved():
    p = w4_program(20, 40, 256, "int4", zeros=True, sites=2)
    return p, json.loads(spatialc.to_json(p)), w4_inputs(p)


@pytest.mark.parametrize("name", list(EDITS))
@pytest.mark.parametrize("where", ["schedule and stage", "stage"])
def test_each_edit_is_refused_or_harmless_and_never_crashes(saved, name, where):
    p, doc, x = saved
    out = copy.deepcopy(doc)
    paths = [q for q in _dequants(out) if where != "stage" or q[1] == "stages"]
    assert paths
    for path in paths:
        EDITS[name](_at(out, path))
    try:
        q = spatialc.from_json(json.dumps(out))
    except spatialc.SerdeError:
        assert name == "weights int8"
        return
    if where == "stage" and name in PLACE:  # the declaration's place is none: the schedule's ops say where
        assert q.verified
        assert np.array_equal(spatialc.evaluate(q, x), reference(p, x))
        return
    if q.verified:  # the declaration itself edited, and the schedule with it: it computes what it now declares
        assert name == "no zero point" and where != "stage"
        assert np.array_equal(spatialc.evaluate(q, x), reference(q, x))
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no numpy warning from inside the interpreter either
        with contextlib.suppress(spatialc.SpatialError):  # a typed refusal, or a result: nothing else
            spatialc.evaluate(q, x)

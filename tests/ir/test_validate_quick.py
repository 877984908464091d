"""The quick type check (`validate._holds`) against `validate._fault`: `type_fault` and `op_fault` say the same of every
program, an ill-typed value put anywhere in it included, and a well-typed program is passed by the quick check alone."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spatialc.ir import validate
from spatialc.ir.ids import ItemId
from spatialc.ir.nodes import Engine, SpatialProgram
from spatialc.ir.ops import CHOREO_OPS, Loop
from tests.ir.test_serde_quick import BUILDS


def _ops(p: SpatialProgram) -> list[Any]:
    out: list[Any] = []
    stack = [prog.ops for prog in p.schedule.programs] if p.schedule else []
    while stack:
        for op in stack.pop():
            out.append(op)
            if isinstance(op, Loop) and isinstance(op.body, tuple):
                stack.append(op.body)
    return out


def _slow_op_fault(op: Any) -> str | None:
    if not isinstance(op, CHOREO_OPS):
        return validate.op_fault(op, "op")  # (not a dataclass walk: said before either check)
    return validate._fields_fault(op, type(op), "op", skip="body")


def _verdicts(p: SpatialProgram) -> tuple[list[Any], list[Any]]:
    """What each check says of the program, and then of each op where the program's tables hold their types (as
    verify's check_types walks them)."""
    quick, slow = [validate.type_fault(p)], [validate._fault(p, SpatialProgram, "program")]
    if slow[0] is None:
        quick += [validate.op_fault(op, "op") for op in _ops(p)]
        slow += [_slow_op_fault(op) for op in _ops(p)]
    return quick, slow


@pytest.mark.parametrize("name", ["int8 epilogue", "fp16 map of three", "attention causal", "block-scaled", "w4a16"])
def test_a_built_program_holds_its_types_by_the_quick_check_alone(name):
    p = BUILDS[name]()
    assert validate._holds(SpatialProgram)(p)
    assert all(validate._all_hold(validate._field_checks(type(op), skip="body"), op) for op in _ops(p))
    quick, slow = _verdicts(p)
    assert quick == slow == [None] * len(quick)


def _places(node: Any, out: list[tuple[Any, str, int | None]]) -> None:
    """Every dataclass field (and every entry of a tuple field) below `node`: (owner, field, index or None)."""
    if not dataclasses.is_dataclass(node):
        return
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        out.append((node, f.name, None))
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                out.append((node, f.name, i))
                if isinstance(v, tuple):
                    for w in v:
                        _places(w, out)
                _places(v, out)
        _places(value, out)


WRONG: list[Any] = [1.5, True, "x", None, -1, 2**64, (), (1,), ("x",), next(iter(Engine)), ItemId(3), 2.0, object()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["int8 epilogue", "fp16 map of three", "bf16 softmax online", "int8 split tail"]),
    where=st.integers(min_value=0),
    what=st.sampled_from(range(len(WRONG))),
)
def test_an_ill_typed_value_is_found_with_the_same_message(name, where, what):
    p = copy.deepcopy(_program(name))
    places: list[tuple[Any, str, int | None]] = []
    _places(p, places)
    owner, field, index = places[where % len(places)]
    value = WRONG[what]
    if index is not None:
        value = tuple(value if i == index else v for i, v in enumerate(getattr(owner, field)))
    object.__setattr__(owner, field, value)
    quick, slow = _verdicts(p)
    assert quick == slow


_BUILT: dict[str, SpatialProgram] = {}


def _program(name: str) -> SpatialProgram:
    if name not in _BUILT:
        _BUILT[name] = BUILDS[name]()
    return _BUILT[name]


def test_a_well_typed_program_is_checked_without_fault(monkeypatch):
    """The quick check is the one taken: `_fault` and `_fields_fault` walk only a program that does not hold."""
    p = BUILDS["bf16 scales and residual"]()
    calls: list[str] = []
    for name in ("_fault", "_fields_fault"):
        slow = getattr(validate, name)
        monkeypatch.setattr(validate, name, lambda *args, _name=name, _slow=slow: calls.append(_name) or _slow(*args))
    assert validate.type_fault(p) is None
    assert all(validate.op_fault(op) is None for op in _ops(p))
    assert calls == []
    bad = copy.deepcopy(p)
    object.__setattr__(bad.tensors[0], "name", 3)
    assert validate.type_fault(bad) == "program.tensors[0].name: expected a string, found 3"
    assert calls[0] == "_fault"

"""Whether a program built in Python holds the IR's own types where its annotations say: a document read by
`serde.from_json` always does (decoding checks each value), but the Python API takes whatever it is given, and a float
where a count belongs, or a string where an enum does, would pass every later comparison and fail only at run time.

Everything is checked field by field against the same annotations JSON is decoded by: `type_fault` the program
outside its ops, `op_fault` one op, for verify's rule 1 to call on each op as it walks the op lists without
recursion."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any

from .ids import _Id
from .nodes import Engine, EngineProgram, Schedule, SpatialProgram
from .ops import CHOREO_OPS, Map, expr_size_fault
from .serde import INT_BITS, INT_RANGE, _hints, shown


def type_fault(p: SpatialProgram) -> str | None:
    """The first value of `p` (outside its schedule) whose type is not its field's, as 'path: what was found', or
    None. Item lists are checked as whole numbers without descending into each one."""
    if not isinstance(p, SpatialProgram):
        return f"program: expected a SpatialProgram, found {type(p).__name__}"
    return None if _holds(SpatialProgram)(p) else _fault(p, SpatialProgram, "program")


def _fault(value: Any, annotation: Any, path: str) -> str | None:
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        if type(value) in options:  # one of the union's classes: its own fields say what is wrong, if anything
            return _fault(value, type(value), path)
        faults = [_fault(value, o, path) for o in options if o is not type(None)]
        return None if any(f is None for f in faults) else faults[0]
    if origin is tuple:
        return _tuple_fault(value, typing.get_args(annotation), path)
    if annotation is type(None):
        return None if value is None else f"{path}: expected nothing, found {type(value).__name__}"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return None if isinstance(value, annotation) else f"{path}: expected {_a(annotation.__name__)}, found {value!r}"
    if annotation is bool:
        return None if isinstance(value, bool) else f"{path}: expected true or false, found {value!r}"
    if isinstance(annotation, type) and issubclass(annotation, _Id):
        return _id_fault(value, path)
    if isinstance(annotation, type) and issubclass(annotation, int):
        return None if _whole(value) else f"{path}: expected a whole number, found {value!r}"
    if annotation is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"{path}: expected a number, found {value!r}"
    if annotation is str:
        return None if isinstance(value, str) else f"{path}: expected a string, found {value!r}"
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _dataclass_fault(value, annotation, path)
    return None


def op_fault(op: Any, path: str = "op") -> str | None:
    """The first field of one choreography op (not a loop's body: its ops are checked one by one) whose value is not
    of its annotated type, or None."""
    if not isinstance(op, CHOREO_OPS):
        return f"{path}: expected a choreography op, found {type(op).__name__}"
    checks = _OP_FIELDS.get(type(op))
    if checks is None:
        checks = _OP_FIELDS[type(op)] = _field_checks(type(op), skip="body")
    return None if _all_hold(checks, op) else _fields_fault(op, type(op), path, skip="body")


def _a(name: str) -> str:
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


ID_RANGE = "an id is a whole number"  # how a fault of an id's range (not of its type) begins


def _in_range(value: int) -> bool:
    """Whether `value` is within JSON's 64 bits (compared: `in range(…)` iterates over an int subclass, as an id)."""
    return INT_RANGE.start <= value < INT_RANGE.stop


def _id_fault(value: Any, path: str) -> str | None:
    """Why `value` is no id (of a tensor, buffer, stage, semaphore, site, item, group or loop variable) a saved file
    holds — not a whole number, or one past JSON's 64 bits (serde.INT_BITS) — or None."""
    if not _whole(value):
        return f"{path}: expected a whole number, found {value!r}"
    if not _in_range(value):
        return f"{path}: {ID_RANGE} of at most {INT_BITS} bits (a saved file's), not {shown(value)}"
    return None


def _tuple_fault(value: Any, args: tuple[Any, ...], path: str) -> str | None:
    if not isinstance(value, tuple):
        return f"{path}: expected a tuple, found {type(value).__name__}"
    if len(args) == 2 and args[1] is Ellipsis:
        if args[0] is int or (isinstance(args[0], type) and issubclass(args[0], int)):  # item lists: no descent
            # (by index: an entry that is None is no whole number either)
            bad = next((i for i, v in enumerate(value) if not _whole(v)), None)
            if bad is None and issubclass(args[0], _Id):
                bad = next((i for i, v in enumerate(value) if not _in_range(v)), None)
                return None if bad is None else _id_fault(value[bad], f"{path}[{bad}]")
            return None if bad is None else f"{path}: expected whole numbers, found {value[bad]!r}"
        return next((f for i, v in enumerate(value) if (f := _fault(v, args[0], f"{path}[{i}]"))), None)
    if len(value) != len(args):
        return f"{path}: expected {len(args)} values, found {len(value)}"
    return next(
        (f for i, (v, a) in enumerate(zip(value, args, strict=True)) if (f := _fault(v, a, f"{path}[{i}]"))), None
    )


def _dataclass_fault(value: Any, cls: type, path: str) -> str | None:
    if not isinstance(value, cls):
        return f"{path}: expected {_a(cls.__name__)}, found {type(value).__name__}"
    if isinstance(value, Schedule):
        return _schedule_fault(value, path)
    if isinstance(value, Map):  # its expression is walked by recursion below: first its size, without
        too_large = expr_size_fault(value.expr)
        if too_large is not None:
            return f"{path}.expr: {too_large}"
    return _fields_fault(value, cls, path)


def _fields_fault(value: Any, cls: Any, path: str, skip: str = "") -> str | None:
    """The first field of dataclass `value` (but `skip`) that does not hold its annotated type, or None."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name != skip:
            fault = _fault(getattr(value, f.name), hints[f.name], f"{path}.{f.name}")
            if fault is not None:
                return fault
    return None


def _schedule_fault(schedule: Schedule, path: str) -> str | None:
    """Each engine program's site, engine and op list; the ops themselves are rule 1's, which walks them once per
    distinct program."""
    if not isinstance(schedule.programs, tuple):
        return f"{path}.programs: expected a tuple, found {type(schedule.programs).__name__}"
    for i, prog in enumerate(schedule.programs):
        where = f"{path}.programs[{i}]"
        if not isinstance(prog, EngineProgram):
            return f"{where}: expected an EngineProgram, found {type(prog).__name__}"
        if (fault := _id_fault(prog.site, f"{where}.site")) is not None:
            return fault
        if not isinstance(prog.engine, Engine):
            return f"{where}.engine: expected an Engine, found {prog.engine!r}"
        if not isinstance(prog.ops, tuple):
            return f"{where}.ops: expected a tuple, found {type(prog.ops).__name__}"
    return None


# The quick check. `_fault` asks `typing` and `dataclasses` about each value's annotation again and names a path for
# each; `_holds(annotation)` is made once per annotation and only says whether a value holds its type, by the same
# rules (`_whole`, `_in_range`, `_tuple_fault`'s item lists, a schedule's and a formula's own checks). Where it says
# no, `_fault` walks the value again to say where and what: every message is `_fault`'s own.
Holds = Callable[[Any], bool]
_HOLDS: dict[Any, Holds] = {}
_OP_FIELDS: dict[type, list[tuple[str, Holds]]] = {}  # a choreography op's fields but its body, and their checks


def _holds(annotation: Any) -> Holds:
    """Whether a value holds `annotation` (`_fault` finds nothing in it): made once per annotation."""
    found = _HOLDS.get(annotation)
    if found is None:
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            found = _dataclass_holds(annotation)  # (stores itself before its fields' checks are made)
        else:
            found = _HOLDS[annotation] = _make_holds(annotation)
    return found


def _make_holds(annotation: Any) -> Holds:
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return _union_holds(typing.get_args(annotation))
    if origin is tuple:
        return _tuple_holds(typing.get_args(annotation))
    if annotation is type(None):
        return lambda value: value is None
    if isinstance(annotation, type) and issubclass(annotation, Enum | bool):
        return lambda value: isinstance(value, annotation)
    if isinstance(annotation, type) and issubclass(annotation, _Id):
        return lambda value: _whole(value) and _in_range(value)
    if isinstance(annotation, type) and issubclass(annotation, int):
        return _whole
    if annotation is float:
        return lambda value: isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return lambda value: isinstance(value, str)
    return lambda value: True  # (as `_fault` finds nothing)


def _union_holds(options: tuple[Any, ...]) -> Holds:
    nullable = type(None) in options
    by_class = {o: _holds(o) for o in options if isinstance(o, type)}
    each = [_holds(o) for o in options if o is not type(None)]

    def holds(value: Any) -> bool:
        if value is None and nullable:
            return True
        own = by_class.get(type(value))
        if own is not None:  # one of the union's classes: its own fields say
            return own(value)
        return any(h(value) for h in each)

    return holds


def _tuple_holds(args: tuple[Any, ...]) -> Holds:
    if len(args) == 2 and args[1] is Ellipsis:
        if args[0] is int or (isinstance(args[0], type) and issubclass(args[0], int)):  # item lists: as they are
            return lambda value: _tuple_fault(value, args, "") is None
        entry = _holds(args[0])
        return lambda value: isinstance(value, tuple) and all(map(entry, value))
    each = [_holds(a) for a in args]

    def fixed(value: Any) -> bool:
        if not isinstance(value, tuple) or len(value) != len(each):
            return False
        return all(h(v) for h, v in zip(each, value, strict=True))

    return fixed


def _dataclass_holds(cls: type) -> Holds:
    checks: list[tuple[str, Holds]] = []

    def holds(value: Any) -> bool:
        if not isinstance(value, cls):
            return False
        if isinstance(value, Schedule):
            return _schedule_fault(value, "") is None
        if isinstance(value, Map) and expr_size_fault(value.expr) is not None:
            return False
        return _all_hold(checks, value)

    _HOLDS[cls] = holds
    checks += _field_checks(cls)
    return holds


def _field_checks(cls: type, skip: str = "") -> list[tuple[str, Holds]]:
    hints = _hints(cls)
    return [(f.name, _holds(hints[f.name])) for f in dataclasses.fields(cls) if f.name != skip]


def _all_hold(checks: list[tuple[str, Holds]], value: Any) -> bool:
    return all(holds(getattr(value, name)) for name, holds in checks)

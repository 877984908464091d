"""Hypothesis strategies that build any IR value from the dataclasses' own annotations."""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum

from hypothesis import strategies as st

from spatialc.ir import serde
from spatialc.ir.nodes import SpatialProgram

_cache: dict[object, st.SearchStrategy] = {}


def strategy_for(annotation: object) -> st.SearchStrategy:
    """Any value of the IR type `annotation` (small collections, finite floats)."""
    if annotation in _cache:
        return _cache[annotation]
    _cache[annotation] = st.deferred(lambda: _build(annotation))
    return _cache[annotation]


def _build(annotation: object) -> st.SearchStrategy:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        return st.one_of([strategy_for(a) for a in args])
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy_for(args[0]), max_size=3).map(tuple)
        return st.tuples(*[strategy_for(a) for a in args])
    if annotation is type(None):
        return st.none()
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return st.sampled_from(list(annotation))
    if annotation is bool:
        return st.booleans()
    if isinstance(annotation, type) and issubclass(annotation, int):
        return st.integers(-(2**40), 2**40).map(annotation)
    if annotation is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if annotation is str:  # mostly names as ir/names.py allows them, sometimes any text (which must be refused)
        return st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True), st.text(max_size=8))
    if dataclasses.is_dataclass(annotation):
        hints = serde._hints(annotation)
        fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(annotation)}
        return st.builds(annotation, **fields)
    raise TypeError(f"no strategy for {annotation!r}")


programs = strategy_for(SpatialProgram)

"""JSON for every IR value. A document is `{"format": "spatialc.program", "version": 1, "program": {...}}`.

Encoding is driven by the dataclasses' annotations: a dataclass becomes an object whose `type` names its class,
a tuple a list, an enum its value, an id its integer. Decoding walks the same annotations and names the path of
the first value that does not fit, so a document that is not ours is refused with one clear line.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from enum import Enum
from functools import cache
from typing import Any

from . import ids, nodes, ops
from .errors import SpatialError
from .nodes import SpatialProgram

FORMAT = "spatialc.program"
TAG = "type"  # the key naming a node's class (fields may be called `kind`)
VERSION = 1


class SerdeError(SpatialError, ValueError):
    """A document that is not a spatialc program (or not this version of one)."""


_NAMESPACE: dict[str, Any] = {**vars(ids), **vars(ops), **vars(nodes)}


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns=_NAMESPACE)


def encode(value: Any) -> Any:
    """An IR value as plain JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {TAG: type(value).__name__}
        for f in dataclasses.fields(value):
            out[f.name] = encode(getattr(value, f.name))
        return out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [encode(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return value
    if isinstance(value, int):
        return int(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def _fail(path: str, want: str, got: Any) -> typing.NoReturn:
    shown = json.dumps(got)[:60] if not isinstance(got, dict) else "an object"
    raise SerdeError(f"{path}: expected {want}, found {shown}")


def decode(data: Any, annotation: Any, path: str = "program") -> Any:
    """Rebuild a value of type `annotation` from JSON data, or raise SerdeError naming `path`."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return _decode_union(data, typing.get_args(annotation), path)
    if origin is tuple:
        args = typing.get_args(annotation)
        if not isinstance(data, list):
            _fail(path, "a list", data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(v, args[0], f"{path}[{i}]") for i, v in enumerate(data))
        if len(data) != len(args):
            _fail(path, f"a list of {len(args)}", data)
        return tuple(decode(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(data, args, strict=True)))
    if annotation is type(None):
        if data is not None:
            _fail(path, "null", data)
        return None
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        try:
            return annotation(data)
        except ValueError:
            _fail(path, f"one of {[e.value for e in annotation]}", data)
    if annotation is bool:
        if not isinstance(data, bool):
            _fail(path, "true or false", data)
        return data
    if isinstance(annotation, type) and issubclass(annotation, int):
        if isinstance(data, bool) or not isinstance(data, int):
            _fail(path, "an integer", data)
        return annotation(data)
    if annotation is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            _fail(path, "a number", data)
        return float(data)
    if annotation is str:
        if not isinstance(data, str):
            _fail(path, "a string", data)
        return data
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _decode_dataclass(data, annotation, path)
    raise SerdeError(f"{path}: cannot decode a {annotation!r}")


def _decode_union(data: Any, options: tuple[Any, ...], path: str) -> Any:
    if data is None and type(None) in options:
        return None
    classes = [o for o in options if isinstance(o, type) and dataclasses.is_dataclass(o)]
    if classes:
        if not isinstance(data, dict):
            _fail(path, "an object", data)
        by_name = {c.__name__: c for c in classes}
        name = data.get(TAG)
        if name not in by_name:
            _fail(f"{path}.{TAG}", f"one of {sorted(by_name)}", name)
        return _decode_dataclass(data, by_name[name], path)
    rest = [o for o in options if o is not type(None)]
    if len(rest) == 1:
        return decode(data, rest[0], path)
    raise SerdeError(f"{path}: ambiguous union {options!r}")


def _decode_dataclass(data: Any, cls: type, path: str) -> Any:
    if not isinstance(data, dict):
        _fail(path, f"a {cls.__name__} object", data)
    if data.get(TAG) != cls.__name__:
        _fail(f"{path}.{TAG}", repr(cls.__name__), data.get(TAG))
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is not dataclasses.MISSING:
                continue
            raise SerdeError(f"{path}: missing field {f.name!r} of {cls.__name__}")
        kwargs[f.name] = decode(data[f.name], hints[f.name], f"{path}.{f.name}")
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)} - {TAG}
    if unknown:
        raise SerdeError(f"{path}: unknown field(s) {sorted(unknown)} for {cls.__name__}")
    return cls(**kwargs)


def to_json(program: SpatialProgram, indent: int | None = None) -> str:
    """The program as a JSON document."""
    doc = {"format": FORMAT, "version": VERSION, "program": encode(program)}
    return json.dumps(doc, indent=indent)


def from_json(text: str) -> SpatialProgram:
    """Read a document written by `to_json`; SerdeError says what is wrong with any other."""
    if not isinstance(text, str | bytes | bytearray):
        raise SerdeError(f"a spatialc document is JSON text, not {type(text).__name__}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SerdeError(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SerdeError(f'not a spatialc program (no "format": "{FORMAT}" at the top)')
    if doc.get("version") != VERSION:
        raise SerdeError(f"spatialc program version {doc.get('version')!r}; this spatialc reads version {VERSION}")
    if "program" not in doc:
        raise SerdeError('a spatialc document with no "program"')
    return decode(doc["program"], SpatialProgram)

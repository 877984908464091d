"""JSON for every IR value. A document is `{"format": "spatialc.program", "version": 12, "program": {...}}`.

Encoding is driven by the dataclasses' annotations: a dataclass becomes an object whose `type` names its class,
a tuple a list, an enum its value, an id its integer. Decoding walks the same annotations and names the path of
the first value that does not fit, so a document that is not ours is refused with one clear line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from collections.abc import Callable
from enum import Enum
from functools import cache
from typing import Any

from . import ids, nodes, ops
from .errors import SpatialError
from .names import names_fault
from .nodes import MAX_SEMAPHORES, Engine, SpatialProgram
from .worklist import MAX_SITES

FORMAT = "spatialc.program"
TAG = "type"  # the key naming a node's class (fields may be called `kind`)
VERSION = 12
# Versions this spatialc reads. Version 1 (before page layouts) decodes with every layout and tile order row-major;
# `upgrade` (spatialc.from_json passes the tile pass's) lays its operands out as version 2 does. Version 3 added
# split-K (a placement's `splits`, workspace tensors, AddPartial): a version-2 document is a version-3 one without.
# Version 4 added multicast groups (a placement's `multicast`); a version-3 document is a version-4 one without.
# Version 5 added the page layouts whose tiles lie by column (`swizzled_cols`, `row_cols`: sm_90a's A pages then).
# Version 6 added the swizzled panels (`panels`, `panels_t`) the sm_90a form's operand pages now are; a version-5
# document is a version-6 one without them (`spatialc.from_json` lays a version-5 sm_90a one out in panels).
# Version 7 made the elementwise ops one op, Map(expr) over the elementwise table: an older document's Relu, Scalar,
# Activation and Bias are read as the Maps they are (`_legacy_elementwise`), with the same meaning.
# Version 8 added row reductions (RowReduce, a formula's row vectors RowArg); a version-7 document is one without.
# Version 9 added row vectors (a Col's `axis`: one value per row, from a parameter tensor of one column) and GEMM
# epilogue stages that read a second tensor (a residual); a version-8 document is one without.
# Version 10 added attention (its declaration Attention, ScaleAcc, a formula's positions Pos, a matmul's
# `transpose_b`, a loop counted per item Span); a version-9 document is one without. Version 10 also added the 8-bit
# float precisions and element types (e4m3, e5m2); a version-9 document holds none.
# Version 11 added 4-bit weights (the element types int4, uint4, e2m1 and e8m0 and the compute op Dequant: a W4A16
# GEMM's dequant prologue) and block-scaled matmuls (a MatmulTiles' `scales`: BlockScales of two KScales); a
# version-10 document holds none of them.
# Version 12 added the float32 precision (a program's `precision` "float32": a map's or a row program's, never a
# matmul's); a version-11 document holds none.
READS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
# How deep objects and lists may nest. A built program nests about 12 deep; each Loop inside a Loop adds two. 32
# allows eleven nested loops: fewer than the 20 nested blocks Python compiles (the interpreter turns each loop into
# one), and far from Python's recursion limit for decoding and for everything that walks the program after it.
MAX_DEPTH = 32
EXPR_NESTING = 2 * ops.MAX_EXPR_DEPTH + 6  # the objects and lists a Map's formula may nest besides the program's
INT_BITS = 64  # every integer of the IR is an id, a count or a size: 64 bits hold any the kernel can use
INT_RANGE = range(-(2 ** (INT_BITS - 1)), 2 ** (INT_BITS - 1))
# The longest string a document may hold. Its strings are names (at most MAX_NAME, ir/names.py), a target, a
# placement kind and an op's name: all far shorter. A longer one is refused before anything quotes or walks it.
MAX_STRING = 200
# The longest list of a field, checked before one entry of it is decoded: (most, what the entries are). Every list a
# program holds has one, so a document of a million entries is refused after its JSON parse, before the decoder (tens
# of microseconds an op) or a rule of verify walks them. The IR's own limits, which verify holds every program to
# (ops.MAX_ADDR_STEPS, ops.MAX_OP_LIST, MAX_SEMAPHORES, MAX_SITES); a formula's op has at most its nodes as operands;
# and bounds far above what any program holds: the passes make one plan and a score of tensors, stages and buffers
# (an elementwise map reads at most 16 inputs), a stage or compute op names a few rings, a multicast group a few sites.
MAX_STEPS = ops.MAX_ADDR_STEPS
MAX_OPS = ops.MAX_OP_LIST
MAX_TABLE = 1 << 10  # tensors, stages or buffers of a program
MAX_PLANS = 1 << 6
MAX_OPERANDS = 1 << 8  # rings a stage or a compute op names; an op's parameters
# Items one site lists: verify's MAX_ITEMS (passes/verify/limits.py), what a plan may hold, all on one site.
MAX_SITE_ITEMS = 1 << 24
MAX_ITEM_SITES = 32  # the most sites split-K puts one item on (passes/split.py MAX_SPLITS, which verify holds to)
# Ops of the whole schedule, loop bodies included: 2.7 times the 96,256 of attention(4, 32, 4096, 4096, 128) built for
# 1,024 sites, and 20 times a 132-site program's; decoding this many takes seconds, a million of them minutes.
MAX_SCHEDULE_OPS = 1 << 18
# Objects ({…}) of a whole document, counted before it is parsed: parsing 2.7 million took 20 s and 1.2 GB, and the
# ops of MAX_SCHEDULE_OPS fit with room to spare (one or two objects each in a built program: 151,613 in all for the
# 1,024-site attention above; a compute op a few more).
MAX_OBJECTS = 1 << 21
# The longest document a reader of files takes (`show`, `verify`, the torch op cache): far above MAX_OBJECTS' worth; a
# program of verify's MAX_ITEMS (2^24) items lists each in its placement, about 10 bytes apiece.
MAX_DOCUMENT_BYTES = 512 << 20
# Lists ([…]) and values (a comma each) of a whole document, counted alike: an object's lists are a few at most (a
# 65,536-site program's items lists 1.6 an object), its values its fields (about 4), and the items the sites list at
# most MAX_SITE_ITEMS. A document of 60 million empty lists inside the byte limit took 36 s and 4.6 GB to parse.
MAX_LISTS = 1 << 21
MAX_VALUES = MAX_SITE_ITEMS + 8 * MAX_OBJECTS
_LIST_LIMITS: dict[tuple[type, str], tuple[int, str]] = {
    (ops.TileAddr, "steps"): (MAX_STEPS, "steps"),
    (ops.Trip, "steps"): (MAX_STEPS, "steps"),
    (ops.Span, "steps"): (MAX_STEPS, "steps"),
    (ops.Loop, "body"): (MAX_OPS, "ops"),
    (nodes.EngineProgram, "ops"): (MAX_OPS, "ops"),
    (ops.Apply, "args"): (ops.MAX_EXPR_NODES, "operands"),
    (ops.Apply, "params"): (MAX_OPERANDS, "parameters"),
    (ops.Generic, "params"): (MAX_OPERANDS, "parameters"),
    (ops.Compute, "ins"): (MAX_OPERANDS, "rings"),
    (ops.Compute, "outs"): (MAX_OPERANDS, "rings"),
    (nodes.Stage, "ins"): (MAX_OPERANDS, "rings"),
    (nodes.Stage, "outs"): (MAX_OPERANDS, "rings"),
    (nodes.Group, "sites"): (MAX_SITES, "sites"),
    (nodes.Placement, "items_of_site"): (MAX_SITES, "sites"),
    (nodes.Placement, "groups"): (MAX_SITES, "groups"),
    (nodes.Schedule, "programs"): (MAX_SITES * len(Engine), "engine programs"),
    (SpatialProgram, "tensors"): (MAX_TABLE, "tensors"),
    (SpatialProgram, "stages"): (MAX_TABLE, "stages"),
    (SpatialProgram, "buffers"): (MAX_TABLE, "buffers"),
    (SpatialProgram, "semaphores"): (MAX_SEMAPHORES, "semaphores"),
    (SpatialProgram, "plans"): (MAX_PLANS, "plans"),
}
# A list inside a list (not a field of its own), by what its entries are: a site's items in `items_of_site`.
_ENTRY_LIMITS: dict[type, tuple[int, str, str]] = {ids.ItemId: (MAX_SITE_ITEMS, "items", "a site lists")}


# Fields added after documents of this version were written, left out where they hold their default: such a
# document reads the same in a reader that predates them (a split tail's: an ITEM loop's first item, a placement's
# tail).
_WRITTEN_ONLY_SET = frozenset({(ops.Loop, "first"), (nodes.Placement, "tail")})


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
            if (type(value), f.name) in _WRITTEN_ONLY_SET and getattr(value, f.name) == f.default:
                continue
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


def shown(value: Any) -> str:
    """A short rendering of any JSON value for a message: never recursive, never long, never a huge number."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        if len(value) > 8 or any(isinstance(v, dict | list) for v in value):
            return f"a list of {len(value)}"
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() <= INT_BITS else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value[:40]) + ("…" if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def _fail(path: str, want: str, got: Any) -> typing.NoReturn:
    raise SerdeError(f"{path}: expected {want}, found {shown(got)}")


def decode(data: Any, annotation: Any, path: str = "program", depth: int = 1) -> Any:
    """Rebuild a value of type `annotation` from JSON data, or raise SerdeError naming `path`. `depth` counts the
    objects and lists around `data` (the document itself is one), up to MAX_DEPTH."""
    if depth > MAX_DEPTH and isinstance(data, dict | list):
        raise SerdeError(f"{path}: objects and lists nest more than {MAX_DEPTH} deep; no spatialc program does")
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return _decode_union(data, typing.get_args(annotation), path, depth)
    if origin is tuple:
        return _decode_tuple(data, typing.get_args(annotation), path, depth)
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
        if isinstance(data, bool) or not isinstance(data, int) or data not in INT_RANGE:
            _fail(path, f"an integer of at most {INT_BITS} bits", data)
        return annotation(data)
    if annotation is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            _fail(path, "a number", data)
        if isinstance(data, int) and _beyond_float(data):
            _fail(path, "a number within float64's range", data)
        return float(data)
    if annotation is str:
        if not isinstance(data, str):
            _fail(path, "a string", data)
        if len(data) > MAX_STRING:
            raise SerdeError(f"{path}: a string of {len(data)} characters; at most {MAX_STRING}")
        return data
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _decode_dataclass(data, annotation, path, depth)
    raise SerdeError(f"{path}: cannot decode a {annotation!r}")


def _beyond_float(data: int) -> bool:
    """Whether integer `data` is past float64's range (float() would raise OverflowError)."""
    return abs(data) > sys.float_info.max


def _nesting(cls: type, name: str) -> int:
    """How much deeper field `name` of `cls` lies than its object. A Map's formula gets nesting of its own: ops nest up
    to MAX_EXPR_DEPTH deep (rule 1 refuses more), each an Apply object and its list of operands, the deepest a column
    vector's address below them."""
    return 1 - EXPR_NESTING if cls is ops.Map and name == "expr" else 1


def _decode_tuple(data: Any, args: tuple[Any, ...], path: str, depth: int) -> tuple:
    if not isinstance(data, list):
        _fail(path, "a list", data)
    if len(args) == 2 and args[1] is Ellipsis:
        limit = _ENTRY_LIMITS.get(args[0])
        if limit is not None and len(data) > limit[0]:
            raise SerdeError(f"{path}: {len(data)} {limit[1]}; {limit[2]} at most {limit[0]}")
        if _plain_ids(data, args[0]):  # a site's items, a stage's rings: millions of them cost no more than a copy
            return tuple(map(args[0], data))
        return tuple(decode(v, args[0], f"{path}[{i}]", depth + 1) for i, v in enumerate(data))
    if len(data) != len(args):
        _fail(path, f"a list of {len(args)}", data)
    return tuple(decode(v, a, f"{path}[{i}]", depth + 1) for i, (v, a) in enumerate(zip(data, args, strict=True)))


def _plain_ids(data: list, annotation: Any) -> bool:
    """Whether `data` is a list of plain integers in INT_RANGE for a list of ids or counts: `decode` would take each
    as it is."""
    counts = isinstance(annotation, type) and issubclass(annotation, int) and not issubclass(annotation, bool | Enum)
    if not counts or not data:
        return False
    return all(type(v) is int for v in data) and min(data) in INT_RANGE and max(data) in INT_RANGE


def _decode_union(data: Any, options: tuple[Any, ...], path: str, depth: int) -> Any:
    if data is None and type(None) in options:
        return None
    classes = [o for o in options if isinstance(o, type) and dataclasses.is_dataclass(o)]
    if classes:
        if not isinstance(data, dict):
            _fail(path, "an object", data)
        by_name = {c.__name__: c for c in classes}
        name = data.get(TAG)
        if not isinstance(name, str) or name not in by_name:  # a list or object here is no class name either
            _fail(f"{path}.{TAG}", f"one of {sorted(by_name)}", name)
        return _decode_dataclass(data, by_name[name], path, depth)
    rest = [o for o in options if o is not type(None)]
    if len(rest) == 1:
        return decode(data, rest[0], path, depth)
    raise SerdeError(f"{path}: ambiguous union {options!r}")


def _decode_dataclass(data: Any, cls: type, path: str, depth: int) -> Any:
    if not isinstance(data, dict):
        _fail(path, f"a {cls.__name__} object", data)
    if not isinstance(data.get(TAG), str) or data.get(TAG) != cls.__name__:
        _fail(f"{path}.{TAG}", repr(cls.__name__), data.get(TAG))
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is not dataclasses.MISSING:
                continue
            raise SerdeError(f"{path}: missing field {f.name!r} of {cls.__name__}")
        inner = depth + _nesting(cls, f.name)
        limit = _LIST_LIMITS.get((cls, f.name))
        if limit is not None and isinstance(data[f.name], list) and len(data[f.name]) > limit[0]:
            raise SerdeError(
                f"{path}.{f.name}: {len(data[f.name])} {limit[1]}; a {cls.__name__} has at most {limit[0]}"
            )
        kwargs[f.name] = decode(data[f.name], hints[f.name], f"{path}.{f.name}", inner)
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)} - {TAG}
    if unknown:
        names = [repr(k[:40]) if isinstance(k, str) else shown(k) for k in sorted(unknown, key=str)[:5]]
        more = ", …" if len(unknown) > 5 else ""
        raise SerdeError(f"{path}: unknown field(s) [{', '.join(names)}{more}] for {cls.__name__}")
    return cls(**kwargs)


# The quick decoder. `decode` asks `typing` and `dataclasses` about each value's annotation again and names a path
# for each value; a saved program of 100,000 ops is a million such questions. `decode_quickly` asks them once per
# annotation: `_quick` makes a function for it that takes what `decode` takes and returns what it returns, checking
# the same rules with the same constants, and names no path. On anything it would refuse, or cannot tell at once, it
# gives up (`_GiveUp`) and `decode` walks the value again to say what is wrong: every message is `decode`'s own.
# The limits are looked up as each value is decoded, as `decode` looks them up (a test may lower one).
Quick = Callable[[Any, int], Any]  # (data, depth) -> value, or _GiveUp


class _GiveUp(Exception):
    """A value the quick decoder does not take: `decode` says why (or takes it after all)."""


def decode_quickly(data: Any, annotation: Any, path: str = "program", depth: int = 1) -> Any:
    """What `decode(data, annotation, path, depth)` returns or raises, found quicker where `data` is well formed."""
    try:
        return _quick(annotation)(data, depth)
    except Exception:  # _GiveUp, or an error the value's own constructor raises: `decode` raises it as it does
        return decode(data, annotation, path, depth)


_QUICK: dict[Any, Quick] = {}


def _quick(annotation: Any) -> Quick:
    """The quick decoder of `annotation`, made once (a dataclass's before its fields': the IR's types nest)."""
    found = _QUICK.get(annotation)
    if found is None:
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            found = _quick_dataclass(annotation)  # (stores itself before its fields' decoders are made)
        else:
            found = _QUICK[annotation] = _make_quick(annotation)
    return found


def _give_up(data: Any, depth: int) -> Any:
    raise _GiveUp


def _make_quick(annotation: Any) -> Quick:
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return _quick_union(typing.get_args(annotation))
    if origin is tuple:
        return _quick_tuple(typing.get_args(annotation))
    if annotation is type(None):
        return _quick_check(lambda data: data is None)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _quick_enum(annotation)
    if annotation is bool:
        return _quick_check(lambda data: data is True or data is False)
    if isinstance(annotation, type) and issubclass(annotation, int):
        return _quick_int(annotation)
    if annotation is float:
        return _quick_float
    if annotation is str:
        return _quick_check(lambda data: type(data) is str and len(data) <= MAX_STRING)
    return _give_up  # (`decode` says it cannot)


def _quick_check(ok: Callable[[Any], bool]) -> Quick:
    def decoder(data: Any, depth: int) -> Any:
        if not ok(data):
            raise _GiveUp
        return data

    return decoder


def _quick_enum(annotation: type[Enum]) -> Quick:
    """An enum's member by its value: only a value of the very type the members' values are (JSON's `true` is no 1)."""
    members = {e.value: e for e in annotation}
    kinds = {type(v) for v in members}

    def decoder(data: Any, depth: int) -> Any:
        if type(data) not in kinds or data not in members:
            raise _GiveUp
        return members[data]

    return decoder


def _quick_int(annotation: type) -> Quick:
    def decoder(data: Any, depth: int) -> Any:
        if type(data) is not int or data not in INT_RANGE:
            raise _GiveUp
        return annotation(data)

    return decoder


def _quick_float(data: Any, depth: int) -> Any:
    if type(data) is float:
        return data
    if type(data) is not int or _beyond_float(data):
        raise _GiveUp
    return float(data)


def _quick_union(options: tuple[Any, ...]) -> Quick:
    nullable = type(None) in options
    by_name = {o.__name__: o for o in options if isinstance(o, type) and dataclasses.is_dataclass(o)}
    if by_name:  # an object whose tag names one of them
        decoders: dict[str, Quick] = {}

        def by_tag(data: Any, depth: int) -> Any:
            if data is None and nullable:
                return None
            if type(data) is not dict:
                raise _GiveUp
            name = data.get(TAG)
            if type(name) is not str or name not in by_name:
                raise _GiveUp
            decoder = decoders.get(name)
            if decoder is None:  # (made on first use: the union may hold the class being made)
                decoder = decoders[name] = _quick(by_name[name])
            return decoder(data, depth)

        return by_tag
    rest = [o for o in options if o is not type(None)]
    if len(rest) != 1:
        return _give_up
    inner = _quick(rest[0])

    def optional(data: Any, depth: int) -> Any:
        return None if data is None and nullable else inner(data, depth)

    return optional


def _quick_tuple(args: tuple[Any, ...]) -> Quick:
    if len(args) == 2 and args[1] is Ellipsis:
        entry = args[0]
        counts = isinstance(entry, type) and issubclass(entry, int) and not issubclass(entry, bool | Enum)
        each = None if counts else _quick(entry)

        def entries(data: Any, depth: int) -> tuple:
            if type(data) is not list or depth > MAX_DEPTH:
                raise _GiveUp
            limit = _ENTRY_LIMITS.get(entry)
            if limit is not None and len(data) > limit[0]:
                raise _GiveUp
            if each is not None:
                return tuple([each(v, depth + 1) for v in data])
            if data and not _plain_ids(data, entry):
                raise _GiveUp
            return tuple(map(entry, data))

        return entries
    decoders = [_quick(a) for a in args]

    def fixed(data: Any, depth: int) -> tuple:
        if type(data) is not list or depth > MAX_DEPTH or len(data) != len(decoders):
            raise _GiveUp
        return tuple([d(v, depth + 1) for d, v in zip(decoders, data, strict=True)])

    return fixed


def _quick_dataclass(cls: type) -> Quick:
    """A dataclass's decoder: an object tagged with its name, each field decoded in turn (a missing one given its
    default, if it has one: what the constructor gives it), no field it does not have."""
    name = cls.__name__
    # (field, its decoder, how much deeper it lies than the object (`_nesting`), its default or MISSING)
    fields: list[tuple[str, Quick, int, Any]] = []

    def decoder(data: Any, depth: int) -> Any:
        if type(data) is not dict or depth > MAX_DEPTH:
            raise _GiveUp
        tag = data.get(TAG)
        if type(tag) is not str or tag != name:
            raise _GiveUp
        args = []
        present = 1  # (the tag)
        for field, decode_field, nesting, default in fields:
            value = data.get(field, _GiveUp)  # (no JSON value is the class _GiveUp)
            if value is _GiveUp:
                if default is dataclasses.MISSING:
                    raise _GiveUp
                args.append(default)
                continue
            if type(value) is list:
                limit = _LIST_LIMITS.get((cls, field))
                if limit is not None and len(value) > limit[0]:
                    raise _GiveUp
            args.append(decode_field(value, depth + nesting))
            present += 1
        if len(data) != present:  # a field it does not have (every key is one of its fields, or the tag)
            raise _GiveUp
        return cls(*args)

    _QUICK[cls] = decoder
    own = dataclasses.fields(cls)
    if any(f.name == TAG or not f.init or f.kw_only for f in own):  # (taken by keyword, or one key off the count)
        _QUICK[cls] = _give_up
        return _give_up
    hints = _hints(cls)
    for f in own:
        fields.append((f.name, _quick(hints[f.name]), _nesting(cls, f.name), f.default))
    return decoder


def to_json(program: SpatialProgram, indent: int | None = None) -> str:
    """The program as a JSON document."""
    doc = {"format": FORMAT, "version": VERSION, "program": encode(program)}
    return json.dumps(doc, indent=indent)


def from_json(
    text: str | bytes | bytearray, upgrade: Callable[[SpatialProgram, int], SpatialProgram] | None = None
) -> SpatialProgram:
    """Read a document written by `to_json` (of this version or an older one it reads, passed through `upgrade`
    with its version); SerdeError says what is wrong with any other."""
    doc = _load(text)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SerdeError(f'not a spatialc program (no "format": "{FORMAT}" at the top)')
    version = doc.get("version")
    if type(version) is not int or version not in READS:  # not `true` or `1.0`, which equal 1 in Python
        raise SerdeError(
            f"spatialc program version {shown(version)}; this spatialc reads versions {', '.join(map(str, READS))}"
        )
    if "program" not in doc:
        raise SerdeError('a spatialc document with no "program"')
    too_large = _too_large(doc["program"])
    if too_large:  # before decoding (and type-checking) a million entries one by one
        raise SerdeError(f"program: {too_large}")
    body = _legacy_elementwise(doc["program"]) if version < 7 else doc["program"]
    program = decode_quickly(body, SpatialProgram, "program", 2)
    fault = names_fault(program)  # before anything prints a name into generated code (ir/names.py)
    if fault is not None:
        raise SerdeError(f"program: {fault}")
    return upgrade(program, version) if upgrade is not None and version < VERSION else program


def _arg0() -> dict[str, Any]:
    return {TAG: "Arg", "index": 0}


def _legacy_elementwise(data: Any, depth: int = 2) -> Any:
    """A version-6 (or older) program's JSON with each Relu, Scalar, Activation and Bias op written as the Map it is
    now: relu(x0), op(x0, value), the activation's table op of x0 (`gelu` was PyTorch's tanh form, `gelu_tanh`),
    x0 + a column vector. Anything not shaped as one of them — a scalar op or an activation those versions did not
    have, too — is left for the decoder to refuse, and so is anything nested past MAX_DEPTH (`depth` counts as
    `decode` does), unwalked."""
    if depth > MAX_DEPTH:
        return data
    if isinstance(data, list):
        return [_legacy_elementwise(v, depth + 1) for v in data]
    if not isinstance(data, dict):
        return data
    data = {k: _legacy_elementwise(v, depth + 1) for k, v in data.items()}
    kind, fields = data.get(TAG), set(data) - {TAG}
    expr: dict[str, Any] | None = None
    if kind == "Relu" and not fields:
        expr = {TAG: "Apply", "op": "relu", "args": [_arg0()], "params": []}
    elif kind == "Scalar" and fields == {"op", "value"} and data["op"] in ops.SCALAR_OPS:
        expr = {TAG: "Apply", "op": data["op"], "args": [_arg0(), {TAG: "Lit", "value": data["value"]}], "params": []}
    elif kind == "Activation" and fields == {"name"} and data["name"] in ops.ACTIVATIONS:
        expr = {TAG: "Apply", "op": ops.ACTIVATION_OPS.get(data["name"], data["name"]), "args": [_arg0()], "params": []}
    elif kind == "Bias" and "tensor" in fields and fields <= {"tensor", "at", "width"}:
        col = {TAG: "Col", **{k: data[k] for k in fields}}
        expr = {TAG: "Apply", "op": "add", "args": [_arg0(), col], "params": []}
    return data if expr is None else {TAG: "Map", "expr": expr}


def _too_large(program: Any) -> str | None:
    """What makes the document's program larger than any spatialc verifies — more sites than MAX_SITES (and
    more engine programs than they hold), more semaphores than MAX_SEMAPHORES, more items listed than its plan
    places, more ops than MAX_SCHEDULE_OPS — or None: counted on the JSON, before one entry is decoded."""
    if not isinstance(program, dict):
        return None
    placement, schedule = program.get("placement"), program.get("schedule")
    placement = placement if isinstance(placement, dict) else {}
    programs = schedule.get("programs") if isinstance(schedule, dict) else None
    counts = (
        ("sites", placement.get("items_of_site"), MAX_SITES),
        ("engine programs", programs, MAX_SITES * len(Engine)),
        ("semaphores", program.get("semaphores"), MAX_SEMAPHORES),
    )
    for what, listed, most in counts:
        if isinstance(listed, list) and len(listed) > most:
            return f"{len(listed)} {what}; a spatialc program has at most {most}"
    return _too_many_items(program, placement) or _too_many_ops(programs)


def _too_many_items(program: dict[str, Any], placement: dict[str, Any]) -> str | None:
    """Whether the sites list more items in all than the program's one plan could place — each item on at most
    MAX_ITEM_SITES sites — or than MAX_SITE_ITEMS: the coverage rule's verdict, reached before decoding millions of item
    ids (fewer are left to it, whose message names the item)."""
    listed = placement.get("items_of_site")
    if not isinstance(listed, list):
        return None
    total = sum(len(e[1]) for e in listed if isinstance(e, list) and len(e) == 2 and isinstance(e[1], list))
    most, whose = MAX_SITE_ITEMS, "a spatialc program places at most"
    plans = program.get("plans")
    plan = plans[0] if isinstance(plans, list) and len(plans) == 1 and isinstance(plans[0], dict) else {}
    grid, groups = plan.get("grid"), plan.get("groups", 1)
    if isinstance(grid, list) and len(grid) == 2 and all(_count(v) for v in (*grid, groups)):
        items = (groups if groups > 1 else grid[0]) * grid[1]
        most = items * MAX_ITEM_SITES
        whose = f"its plan's {items} items, each on at most {MAX_ITEM_SITES} sites, are at most {most}"
    if total <= most:
        return None
    return f"placement.items_of_site: {total} items listed in all; {whose}"


def _count(value: Any) -> bool:
    return type(value) is int and 0 < value <= MAX_SITE_ITEMS


def _too_many_ops(programs: Any) -> str | None:
    """Whether the engine programs hold more than MAX_SCHEDULE_OPS ops, loop bodies included: counted without
    recursion, and only until the bound is passed."""
    if not isinstance(programs, list):
        return None
    lists = [prog["ops"] for prog in programs if isinstance(prog, dict) and isinstance(prog.get("ops"), list)]
    total = 0
    while lists and total <= MAX_SCHEDULE_OPS:
        ops_ = lists.pop()
        total += len(ops_)
        lists += [op["body"] for op in ops_ if isinstance(op, dict) and isinstance(op.get("body"), list)]
    if total <= MAX_SCHEDULE_OPS:
        return None
    return (
        f"schedule: more than {MAX_SCHEDULE_OPS} ops in its engine programs, loop bodies included;"
        f" a spatialc program has at most {MAX_SCHEDULE_OPS}"
    )


def _load(text: str | bytes | bytearray) -> Any:
    """The JSON data of `text`, or SerdeError: whatever the text holds, json's own errors never leave here."""
    if isinstance(text, bytes | bytearray):
        encoding = json.detect_encoding(text)
        try:
            text = bytes(text).decode(encoding)
        except UnicodeDecodeError as e:
            raise SerdeError(f"not JSON text: byte {e.start} is not valid {encoding}") from None
    if not isinstance(text, str):
        raise SerdeError(f"a spatialc document is JSON text, not {type(text).__name__}")
    # (a brace, bracket or comma in a string counts too: no program's names hold millions of them)
    for mark, what, most in (("{", "objects", MAX_OBJECTS), ("[", "lists", MAX_LISTS), (",", "values", MAX_VALUES)):
        many = text.count(mark)
        if many > most:
            raise SerdeError(f"a document of {many} {what}; a spatialc program has at most {most}")
    try:
        return json.loads(text, object_pairs_hook=_once_each)
    except json.JSONDecodeError as e:
        raise SerdeError(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except SerdeError:
        raise
    except RecursionError:
        raise SerdeError(f"not a spatialc program: objects and lists nest more than {MAX_DEPTH} deep") from None
    except ValueError as e:  # an integer of thousands of digits: Python's int-string limit
        raise SerdeError(f"not a spatialc program: {str(e).split(':')[0]}") from None


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of the document, each key written once: JSON leaves a repeated key's meaning open (Python's reader
    keeps the last value, others the first), so a document that repeats one could mean one thing here and another
    to whoever checked it."""
    out = dict(pairs)
    if len(out) != len(pairs):
        key = next(k for i, (k, _) in enumerate(pairs) if any(k == other for other, _ in pairs[:i]))
        raise SerdeError(f"program: the key {shown(key)} is written twice in one object; a document writes each once")
    return out

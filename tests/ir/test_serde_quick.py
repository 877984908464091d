"""The quick decoder (`serde.decode_quickly`) against `serde.decode`: the same value for every program the builders
make, the same verdict and the same message for every edited document, and the quick path taken for a good one."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spatialc
from spatialc import ew
from spatialc.ir import serde
from spatialc.ir.nodes import SpatialProgram
from tests import mutants
from tests.blockscale.programs import scaled

BUILDS: dict[str, Callable[[], SpatialProgram]] = {
    **mutants.PROGRAMS,
    "gemm fp16 sm_90": lambda: spatialc.build(spatialc.gemm(256, 256, 512, "fp16"), "sm_90"),
    "gemm e4m3 split_tail": lambda: spatialc.build(
        spatialc.gemm(48, 64, 128, "e4m3"), "sm_90", placement="split_tail", sites=5, block=(1, 1, 1)
    ),
    "softmax": lambda: spatialc.build(spatialc.softmax(40, 70, "fp16"), "sm_90"),
    "rmsnorm": lambda: spatialc.build(spatialc.rmsnorm(33, 50, "bf16"), "sm_80"),
    "layernorm": lambda: spatialc.build(spatialc.layernorm(40, 72, "bf16"), "sm_90"),
    "attention causal": lambda: spatialc.build(spatialc.attention(1, 2, 40, 72, 32, causal=True), "sm_90"),
    "attention gqa": lambda: spatialc.build(spatialc.attention(2, 4, 16, 16, 16, kv_heads=2)),
    "elementwise": lambda: spatialc.build(spatialc.elementwise(ew.x(0) * ew.x(1) + 1.5, 20, 40, "fp16"), "sm_90"),
    "col_reduce": lambda: spatialc.build(spatialc.col_reduce(40, 70, "absmax", "bf16"), "sm_90"),
    "grouped": lambda: spatialc.build(spatialc.grouped_gemm(3, 40, 48, 64, "bf16"), "sm_90"),
    "w4a16": lambda: spatialc.build(spatialc.gemm(20, 48, 256, "fp16", weights="mxfp4"), "sm_90", sites=3),
    "block-scaled": lambda: scaled(32, 32, 256),
}


@cache
def _document(name: str) -> str:
    return spatialc.to_json(BUILDS[name]())


def _body(name: str) -> Any:
    return json.loads(_document(name))["program"]


def _outcome(decoder: Callable[..., Any], body: Any) -> tuple[str, Any]:
    try:
        return "value", decoder(body, SpatialProgram, "program", 2)
    except serde.SerdeError as e:
        return "refused", str(e)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_built_program_decodes_quickly_to_what_decode_gives(name):
    body = _body(name)
    quick = serde._quick(SpatialProgram)(body, 2)  # the quick path itself: it must not give up on a built program
    assert quick == serde.decode(body, SpatialProgram, "program", 2)
    assert serde.to_json(quick) == _document(name)


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# What an edit puts in place of a value: each a function of the value it replaces.
REPLACEMENTS: list[Callable[[Any], Any]] = [
    lambda v: "x",
    lambda v: "x" * (serde.MAX_STRING + 1),
    lambda v: "x" * serde.MAX_STRING,
    lambda v: serde.INT_RANGE.stop,
    lambda v: serde.INT_RANGE.stop - 1,
    lambda v: serde.INT_RANGE.start - 1,
    lambda v: -1,
    lambda v: 10**400,
    lambda v: True,
    lambda v: False,
    lambda v: 1.0,
    lambda v: 0.5,
    lambda v: float("nan"),
    lambda v: None,
    lambda v: [],
    lambda v: {},
    lambda v: [v],
    lambda v: [v, v],
    lambda v: {serde.TAG: "Nope"},
    lambda v: {**v, "extra": 1} if isinstance(v, dict) else v,
    lambda v: {**v, serde.TAG: "Loop"} if isinstance(v, dict) else v,
    lambda v: {**v, serde.TAG: 3} if isinstance(v, dict) else v,
    lambda v: v * (serde.MAX_OPERANDS + 1) if isinstance(v, list) and v else v,
    lambda v: _nested(serde.MAX_DEPTH),
    lambda v: {serde.TAG: v} if isinstance(v, str) else v,
    lambda v: str(v) if not isinstance(v, dict | list) else v,
    lambda v: int(v) if isinstance(v, float) and abs(v) < 1e18 else v,
    lambda v: float(v) if type(v) is int and abs(v) < 1e18 else v,
    lambda v: int(sys.float_info.max) + 1,  # (past float64: a float field refuses it, an int field too)
    lambda v: int(sys.float_info.max),
    lambda v: -0.0,
    lambda v: float("inf"),
    lambda v: {**v, serde.TAG: None} if isinstance(v, dict) else v,
    lambda v: {k: x for k, x in v.items() if k != serde.TAG} if isinstance(v, dict) else v,
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["int8 epilogue", "fp16 map of three", "bf16 softmax online", "int8 split tail", "w4a16"]),
    where=st.integers(min_value=0),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, len(REPLACEMENTS))), min_size=1, max_size=3),
)
def test_an_edited_document_is_refused_quickly_exactly_as_decode_refuses_it(name, where, edits):
    body = copy.deepcopy(_body(name))
    for where, how in edits:
        paths = _paths(body)
        path = paths[where % len(paths)]
        if not path:
            continue
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if how == len(REPLACEMENTS):  # delete the field (or the list's entry)
            del parent[path[-1]]
        else:
            parent[path[-1]] = REPLACEMENTS[how](parent[path[-1]])
    slow, quick = _outcome(serde.decode, body), _outcome(serde.decode_quickly, body)
    assert quick[0] == slow[0]
    if slow[0] == "refused":
        assert quick[1] == slow[1]
    else:
        assert quick[1] == slow[1]
        assert type(quick[1]) is SpatialProgram


def test_whole_documents_read_the_same_with_and_without_the_quick_decoder(monkeypatch):
    """spatialc.from_json's own verdicts: a good document, an older one, and a few refused ones."""
    good = _document("int8 epilogue")
    doc = json.loads(good)
    doc["program"]["tensors"][0]["shape"] = [1.0, 2]
    texts = [good, _document("bf16 layernorm"), json.dumps(doc), good.replace('"Map"', '"Mapp"', 1)]

    def verdicts() -> list[Any]:
        out: list[Any] = []
        for text in texts:
            try:
                out.append(spatialc.from_json(text))
            except serde.SerdeError as e:
                out.append(str(e))
        return out

    quick = verdicts()
    monkeypatch.setattr(serde, "decode_quickly", serde.decode)
    assert verdicts() == quick
    assert [type(v) for v in quick] == [SpatialProgram, SpatialProgram, str, str]


def test_a_good_document_is_read_without_decode(monkeypatch):
    """The quick path is the one taken: `decode` is called only where the quick decoder gives up."""
    calls: list[Any] = []
    slow = serde.decode

    def counted(*args: Any) -> Any:
        calls.append(args[2:])
        return slow(*args)

    monkeypatch.setattr(serde, "decode", counted)
    text = _document("bf16 scales and residual")
    assert serde.from_json(text) == BUILDS["bf16 scales and residual"]()
    assert calls == []
    with pytest.raises(serde.SerdeError, match="unknown field"):
        serde.from_json(text.replace('"pages":', '"pagez": 0, "pages":', 1))
    assert calls[0] == ("program", 2)  # (and again for each value inside, down to the one it names)

"""The IR: JSON round trips, documents that are not ours, the printer, typed ids."""

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings

import spatialc
from spatialc.ir import ops
from spatialc.ir.ids import BufferId, TensorId
from spatialc.ir.names import names_fault
from spatialc.ir.printer import ops_lines, program_text
from spatialc.ir.serde import SerdeError, from_json, to_json

from ..strategies import programs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_every_generated_program_round_trips_exactly_or_is_refused_for_its_names(p):
    fault = names_fault(p)
    if fault is not None:  # a name that could reach generated code, or a repeated one: refused on reading
        with pytest.raises(SerdeError, match=re.escape(fault)):
            from_json(to_json(p))
        return
    q = from_json(to_json(p))
    assert q == p
    assert to_json(q) == to_json(p)


@pytest.mark.parametrize("cls", [*ops.CHOREO_OPS, *ops.COMPUTE_OPS], ids=lambda c: c.__name__)
def test_every_op_kind_round_trips_on_its_own(cls):
    # The whole-program test draws ops from a union; this one makes sure no kind is left to chance.
    from spatialc.ir.serde import decode, encode

    from ..strategies import strategy_for

    @settings(max_examples=25, deadline=None)
    @given(strategy_for(cls))
    def round_trip(op):
        assert decode(encode(op), ops.ChoreoOp | ops.ComputeOp) == op

    round_trip()


def test_a_built_program_round_trips():
    p = spatialc.build(spatialc.gemm(70, 50, 90, "bf16"), "sm_86", placement="round_robin", sites=5)
    assert from_json(to_json(p)) == p


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json at all", "not JSON"),
        ("[1, 2, 3]", "not a spatialc program"),
        ('{"format": "something.else", "program": {}}', "not a spatialc program"),
        ('{"format": "spatialc.program", "version": 99, "program": {}}', "version 99"),
        ('{"format": "spatialc.program", "version": 1}', 'no "program"'),
    ],
)
def test_documents_that_are_not_ours_are_refused(text, says):
    with pytest.raises(SerdeError, match=says):
        from_json(text)


def _doc(p):
    return json.loads(to_json(p))


def test_a_wrong_field_is_named_by_its_path():
    p = spatialc.build(spatialc.gemm(32, 32, 32), "sm_86", block=(1, 1, 1), sites=1)
    doc = _doc(p)
    doc["program"]["schedule"]["programs"][1]["ops"][0]["body"][0]["buf"] = "A_ring"
    where = r"program\.schedule\.programs\[1\]\.ops\[0\]\.body\[0\]\.buf"
    with pytest.raises(SerdeError, match=where + ": expected an integer"):
        from_json(json.dumps(doc))


def test_an_unknown_op_kind_and_unknown_fields_are_refused():
    p = spatialc.build(spatialc.gemm(32, 32, 32), "sm_86")
    doc = _doc(p)
    doc["program"]["schedule"]["programs"][0]["ops"][0]["type"] = "Teleport"
    with pytest.raises(SerdeError, match=r"ops\[0\]\.type: expected one of"):
        from_json(json.dumps(doc))
    doc = _doc(p)
    doc["program"]["tile"]["depth"] = 3
    with pytest.raises(SerdeError, match=r"unknown field\(s\) \['depth'\]"):
        from_json(json.dumps(doc))
    doc = _doc(p)
    del doc["program"]["tensors"][0]["dtype"]
    with pytest.raises(SerdeError, match="missing field 'dtype'"):
        from_json(json.dumps(doc))


def test_printer_lists_one_op_per_line_per_site_and_engine():
    p = spatialc.build(spatialc.gemm(48, 48, 32), "sm_86", block=(1, 1, 1), sites=3, placement="round_robin")
    text = program_text(p)
    for site in range(3):
        assert f"site {site}  items [{site}, {site + 3}, {site + 6}]" in text
    assert text.count("  reader:") == 3 and text.count("  writer:") == 3
    compute = p.schedule.programs_of(spatialc.ir.Site(0))[1]
    lines = ops_lines(p, compute.ops)
    # One line per op, nested ops indented one level per loop.
    assert len(lines) == sum(1 for _ in ops.walk(compute.ops))
    assert lines[0] == "Loop item < 3:"
    assert lines[2] == "  Loop k < 2:"
    assert lines[3].strip() == "Wait A_ring"
    assert "Compute matmul 1x1x1 int8 (A_ring, B_ring) acc acc" in text


def test_ids_are_typed_and_print_as_numbers():
    assert repr(BufferId(3)) == "BufferId(3)"
    assert str(TensorId(2)) == "2"
    assert isinstance(from_json(to_json(spatialc.gemm(1, 1, 1))).tensors[0].id, TensorId)


def test_evolve_clears_verified():
    p = spatialc.build(spatialc.gemm(16, 16, 16), "sm_86")
    assert p.verified
    assert not p.evolve(name="x").verified

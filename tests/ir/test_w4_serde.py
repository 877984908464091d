"""JSON version 11: 4-bit weights' element types and the Dequant op round trip; a version-10 document (no 4-bit
weights) still loads; the listing prints a dequant with its place."""

from __future__ import annotations

import json

import spatialc
from spatialc.ir import serde
from spatialc.ir.ops import Dequant
from spatialc.ir.printer import program_text


def test_a_w4a16_program_round_trips_as_version_11():
    p = spatialc.build(spatialc.gemm(20, 48, 256, "fp16", weights="mxfp4"), "sm_90", sites=3)
    doc = json.loads(spatialc.to_json(p))
    assert doc["version"] == serde.VERSION >= 11
    assert {t["dtype"] for t in doc["program"]["tensors"]} >= {"e2m1", "e8m0"}
    q = spatialc.from_json(json.dumps(doc))
    assert q == p and q.verified
    assert "dequant mxfp4 to fp16: scale[k/32, j] * (x0) at rows" in program_text(q)


def test_a_version_10_document_still_loads():
    p = spatialc.build(spatialc.gemm(20, 48, 64, "bf16"), "sm_90")
    doc = json.loads(spatialc.to_json(p))
    doc["version"] = 10
    assert spatialc.from_json(json.dumps(doc)) == p


def test_a_dequant_op_decodes_from_its_fields():
    op = Dequant(serde.ops.WeightFormat.UINT4, serde.ops.Precision.BF16, 64, serde.ids.TensorId(3), None)
    assert serde.decode(serde.encode(op), serde.ops.ComputeOp) == op

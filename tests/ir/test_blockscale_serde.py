"""JSON of a block-scaled program (version 11: a MatmulTiles' `scales`): read back equal and verified, run to the same
C; a version-10 document, which has no `scales`, still reads (tests/blockscale holds the rest of the feature)."""

from __future__ import annotations

import json

import numpy as np

import spatialc
from spatialc.ir import serde
from tests.blockscale.programs import inputs_of, scaled


def test_json_round_trip_and_older_documents():
    p = scaled(48, 64, 384, scales=("row", "128x128"))
    text = spatialc.to_json(p)
    assert json.loads(text)["version"] == serde.VERSION >= 11
    back = spatialc.from_json(text)
    assert back == p and back.verified
    ins = inputs_of(p)
    assert np.array_equal(spatialc.evaluate(back, ins), spatialc.evaluate(p, ins))
    plain = spatialc.build(spatialc.gemm(32, 32, 64, "e4m3"), "sm_89")
    doc = json.loads(spatialc.to_json(plain))
    doc["version"] = 10
    for stage in doc["program"]["stages"]:  # a version-10 writer knew no `scales`
        stage["kind"].get("op", {}).pop("scales", None)

    def strip(x):
        if isinstance(x, dict):
            if x.get("type") == "MatmulTiles":
                x.pop("scales", None)
            for v in x.values():
                strip(v)
        elif isinstance(x, list):
            for v in x:
                strip(v)

    strip(doc)
    assert spatialc.from_json(json.dumps(doc)) == plain

"""A hostile review of saved programs (review 48): edits that `spatialc verify FILE` accepted and that then crashed
lower or run ("internal error", exit 3) or printed C++ that does not compile. Each is now one line and exit 2 from
verify, at the rule that owns the fact:

1. a block-scaled GEMM's scale tensors of another element type than float32 or e8m0 (e4m3 … uint4): lowering
   raised KeyError on the DType or printed uncompilable code — rule 8's scale check (`verify/blockscale.py`);
2. an operand tensor (GEMM's A, attention's q, an elementwise input) of role `parameter`: lowering took the first
   two inputs as A and B and crashed unpacking one — rule 1 (`verify/wellformed.py`): a read stage reads an input
   or a workspace tensor; a parameter is read by the compute op that names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spatialc.cli import main

BUILDS = {
    "bs": ["gemm", "64", "64", "256", "--precision", "e4m3", "--scales", "1x128,128x128"],
    "gemm": ["gemm", "64", "64", "128"],
    "attention": ["attention", "1", "2", "64", "64", "64"],
    "elementwise": ["elementwise", "x+y", "64", "64"],
}


def saved(tmp_path: Path, kind: str) -> dict:
    path = tmp_path / f"{kind}.json"
    assert main([*BUILDS[kind], "--check", "none", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def verify(tmp_path: Path, doc: dict, capsys) -> tuple[int, str]:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    status = main(["verify", str(path)])
    return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2", "e2m1", "int4", "int8", "int32", "int64", "uint4", "fp16"])
@pytest.mark.parametrize("which", [3, 4])
def test_a_scale_tensor_of_another_type_than_float32_or_e8m0_is_refused(tmp_path, capsys, dtype, which):
    doc = saved(tmp_path, "bs")
    tensors = doc["program"]["tensors"]
    assert [t["name"] for t in tensors[3:]] == ["scale_a", "scale_b"]
    tensors[which]["dtype"] = dtype
    status, err = verify(tmp_path, doc, capsys)
    assert status == 2, err
    assert len(err.splitlines()) == 1
    assert f"{tensors[which]['name']} holds {dtype} scales" in err and "float32 or e8m0" in err


def test_float32_scales_still_verify(tmp_path, capsys):
    assert verify(tmp_path, saved(tmp_path, "bs"), capsys)[0] == 0


@pytest.mark.parametrize(
    ("kind", "index", "name"), [("gemm", 0, "A"), ("gemm", 1, "B"), ("attention", 0, "q"), ("elementwise", 1, "y")]
)
def test_an_operand_of_role_parameter_is_refused(tmp_path, capsys, kind, index, name):
    doc = saved(tmp_path, kind)
    tensor = doc["program"]["tensors"][index]
    assert tensor["name"] == name
    tensor["role"] = "parameter"
    status, err = verify(tmp_path, doc, capsys)
    assert status == 2, err
    assert len(err.splitlines()) == 1
    assert f"reads {name}, a parameter tensor" in err and "input" in err

"""The public API: names, keywords, the error hierarchy, and a `verified` mark that cannot be forged."""

import dataclasses
import json

import numpy as np
import pytest

import spatialc
import spatialc.errors
from spatialc.ir.ids import BufferId
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import Map

from .rewrite import replace


def test_build_and_lower_take_the_target_keyword_the_issues_name():
    p = spatialc.build(spatialc.gemm(48, 40, 32), target="sm_86")
    assert p.target == "sm_86" and p.verified
    art = spatialc.lower(p, target="sm_86")
    assert art.target == "sm_86" and art.census.agrees


def test_build_without_a_target_builds_for_the_one_the_program_names():
    # It built for sm_90 whatever gemm(..., target=...) said, and lower() then printed sm_90 code for it.
    p = spatialc.build(spatialc.gemm(48, 40, 32, target="sm_86"))
    assert p.target == "sm_86" and p.verified
    with pytest.raises(spatialc.UnknownTarget, match="not 90"):
        spatialc.build(spatialc.gemm(48, 40, 32, target=90))


def test_numpy_numbers_are_taken_for_builds_counts_and_the_epilogues_constants():
    # A sweep over np.arange was refused: "split_k must be a whole number ≥ 1, not np.int64(2)"; so were
    # scalar("mul", np.float32(0.5)) and requant's zero point np.int64(3) ("needs a finite number, not …").
    two, four = np.int64(2), np.int64(4)
    p = spatialc.build(spatialc.gemm(64, 64, 640, "bf16"), "sm_90", split_k=two, block=(two, four, four), depth=two)
    assert p.placement.splits == 2 and p.plan.block == spatialc.ir.BlockShape(2, 4, 4)
    assert spatialc.from_json(spatialc.to_json(p)) == p
    assert spatialc.scalar("mul", np.float32(0.5)) == spatialc.scalar("mul", 0.5)
    assert spatialc.requant(np.float32(0.5), np.int64(3)) == spatialc.requant(0.5, 3)


def test_every_error_is_a_spatial_error_and_the_names_are_exported():
    for name in (
        "SpatialError",
        "ProgramError",
        "PlanError",
        "VerifyError",
        "DeadlockError",
        "SerdeError",
        "UnknownTarget",
        "bias",
        "relu",
        "scalar",
        "requant",
    ):
        assert hasattr(spatialc, name), name
    assert issubclass(spatialc.SerdeError, spatialc.SpatialError)
    assert issubclass(spatialc.UnknownTarget, spatialc.SpatialError)
    cases = [
        lambda: spatialc.from_json(None),
        lambda: spatialc.target([]),
        lambda: spatialc.gemm(4, 4, 4, epilogue=spatialc.relu()),
        lambda: spatialc.build("gemm", "sm_90"),
        lambda: spatialc.evaluate(spatialc.build(spatialc.gemm(4, 4, 4)), [np.ones((4, 4)), np.ones((4, 4))]),
        lambda: spatialc.gemm(16, 16, 16, "int8", epilogue=[spatialc.scalar("mul", 2**40)]),
        lambda: spatialc.bias("b"),
        # An int past float64 raised OverflowError (ew's operands were refused by name); True was a scale of 1.0.
        lambda: spatialc.scalar("mul", 10**400),
        lambda: spatialc.rmsnorm(16, 16, eps=10**400),
        lambda: spatialc.requant(True),
    ]
    for case in cases:
        with pytest.raises(spatialc.SpatialError):
            case()


def _tampered(p):
    """The program's JSON with the writer's address moved off the tensor, the `verified` claim left in place."""
    doc = json.loads(spatialc.to_json(p))
    writer = doc["program"]["schedule"]["programs"][2]["ops"][0]["body"][1]
    assert writer["type"] == "WriteTiles"
    writer["at"]["base"] = 1000
    return json.dumps(doc)


def test_a_document_cannot_forge_the_verified_mark():
    p = spatialc.build(spatialc.gemm(64, 64, 64), "sm_86", block=(1, 1, 1), sites=1)
    assert spatialc.from_json(spatialc.to_json(p)) == p  # an honest claim stands
    forged = spatialc.from_json(_tampered(p))
    assert json.loads(_tampered(p))["program"]["verified"] is True and not forged.verified
    with pytest.raises(spatialc.SpatialError, match="not verified"):
        spatialc.lower(forged)


def test_lower_verifies_again_a_program_changed_behind_verify():
    p = spatialc.build(spatialc.gemm(64, 64, 64), "sm_86", block=(1, 1, 1), sites=1)
    shallow = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, depth_pages=0)) if b.id == BufferId(0) else b
        for b in p.buffers
    )
    changed = dataclasses.replace(p, buffers=shallow)  # dataclasses.replace keeps verified=True
    assert changed.verified
    with pytest.raises(spatialc.VerifyError):
        spatialc.lower(changed)


def test_integer_epilogues_refuse_to_wrap():
    huge = [spatialc.scalar("mul", 2**30), spatialc.scalar("mul", 2**30)]
    with pytest.raises(spatialc.errors.SemanticError, match="beyond ±\\(2\\^62 - 2\\^12\\)"):  # verify bounds the chain
        spatialc.build(spatialc.gemm(16, 16, 16, "int8", epilogue=huge), "sm_86")
    # The interpreter keeps its own check, for a program that never went through verify.
    ones = spatialc.build(spatialc.gemm(16, 16, 16, "int8", epilogue=[spatialc.scalar("mul", 1)] * 2), "sm_86")
    scaled = replace(
        ones,
        Engine.COMPUTE,
        lambda op: (
            (dataclasses.replace(op, op=huge[0]),)
            if op.__class__.__name__ == "Compute" and isinstance(op.op, Map)
            else None
        ),
    )
    with pytest.raises(spatialc.SpatialError, match="beyond ±2\\^62"):
        spatialc.evaluate(scaled, {"A": np.full((16, 16), 100), "B": np.full((16, 16), 100)})


def test_sizes_are_any_integral_number_and_precisions_any_common_spelling():
    import ml_dtypes
    import numpy as np

    p = spatialc.gemm(np.int64(64), np.int32(32), np.uint16(48), "bfloat16")
    assert p.tensors[0].elems == (64, 48) and type(p.tensors[0].elems[0]) is int and p.precision.value == "bf16"
    for spelling, want in (("float16", "fp16"), ("half", "fp16"), ("BF16", "bf16"), (np.float16, "fp16")):
        assert spatialc.gemm(32, 32, 32, spelling).precision.value == want
    assert spatialc.gemm(32, 32, 32, np.dtype("int8")).precision.value == "int8"
    assert spatialc.gemm(32, 32, 32, ml_dtypes.bfloat16).precision.value == "bf16"
    for wrong in (None, np.float64, 8):
        with pytest.raises(spatialc.ProgramError, match=r"unknown precision .*; use int8, fp16 \(float16, half\)"):
            spatialc.gemm(32, 32, 32, wrong)
    with pytest.raises(spatialc.ProgramError, match="round A and B to bf16 or fp16") as e:  # the fix, for float32
        spatialc.gemm(32, 32, 32, "float32")
    assert "\n" not in str(e.value)
    for size in (64.0, True, np.float32(64), "64"):
        with pytest.raises(spatialc.ProgramError, match="must be a whole number"):
            spatialc.gemm(size, 32, 32)
    # out= takes the same spellings (precision=np.float16 was taken, out=np.float16 refused): each family's
    for out, want in (("float16", "fp16"), (ml_dtypes.bfloat16, "bf16"), ("fp32", "float32"), (np.int32, "int32")):
        prec = "int8" if want == "int32" else "bf16"
        assert spatialc.gemm(32, 32, 32, prec, out=out).tensors[-1].dtype.value == want
        if prec == "bf16":
            assert spatialc.softmax(4, 4, out=out).tensors[-1].dtype.value == want
            assert spatialc.elementwise(spatialc.ew.x(0), 4, 4, out=out).tensors[-1].dtype.value == want
    with pytest.raises(
        spatialc.ProgramError, match="output is one of float32, fp16, bf16, not <class 'numpy.float64'>"
    ):
        spatialc.softmax(4, 4, out=np.float64)


def test_lowering_for_another_target_than_the_program_was_built_for_says_so():
    p = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86")
    assert spatialc.lower(p).notes == ()
    assert spatialc.lower(p, "sm_80").notes[0] == (
        "lowered for sm_80, a program built for sm_86: its plan was chosen for sm_86"
    )

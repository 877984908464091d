"""Hostile review of column reductions (`spatialc.col_reduce`) and map programs of several outputs
(`spatialc.elementwise({"out1": ..., "out2": ...})`): each test a fault found, failing before its fix."""

from __future__ import annotations

import pytest

import spatialc
from spatialc import ew
from spatialc.cli import main
from spatialc.errors import ProgramError


@pytest.mark.parametrize("other", [ew.row("s") * 2.0, ew.col("s")])
def test_an_output_of_constants_or_vectors_alone_is_refused_by_elementwise_in_its_words(other):
    """An output whose formula reads no input has a map of no pages: it was built, and refused only by the verifier
    at build, in its words about rings (IllFormedError: "Compute () -> b_ring ... reads the 1 ring ...")."""
    (x0,) = ew.inputs(1)
    with pytest.raises(ProgramError, match="output b's formula reads none, only constants or vectors"):
        spatialc.elementwise({"a": x0, "b": other}, 40, 20)


def test_the_cli_refuses_an_output_of_a_constant_in_one_line(capsys):
    assert main(["elementwise", "a = x0; b = 1", "40", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "output b's formula reads none" in err


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: spatialc.col_reduce(2**34 + 1, 5, "sum"), "x would be 17179869185x5 ="),
        (
            lambda: spatialc.elementwise({"a": ew.inputs(1)[0]}, 2**34 + 1, 5),
            "each input and output would be 17179869185x5",
        ),
    ],
)
def test_a_tensor_too_large_is_named_with_its_own_shape(make, says):
    """A column or map program's m × n tensor past 2^34 elements was refused as a GEMM's "A would be (m)x1" — a
    tensor the program has not, of a shape it has not (the GEMM check was called with k = 1)."""
    with pytest.raises(ProgramError, match=says.replace("(", r"\(")):
        make()

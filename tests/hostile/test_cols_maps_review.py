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


def test_an_int8_map_of_two_outputs_runs_and_is_checked_exactly_by_the_cli(capsys):
    """The CLI compared the kernel's outputs with the interpreter's by np.array_equal of two dicts: an internal
    error (exit 3, "The truth value of an array ... is ambiguous") for any int8 map program of several outputs."""
    argv = ["elementwise", "a = x0 + x1; b = x0 * x1", "17", "33", "--precision", "int8", "--run"]
    assert main(argv) == 0
    assert "C equals the reference interpreter, exactly" in capsys.readouterr().out


def test_the_exact_check_of_several_outputs_sees_one_that_differs():
    import numpy as np

    from spatialc.cli.commands import _exactly

    c = {"a": np.zeros((2, 2), np.int64), "b": np.ones((2, 2), np.int64)}
    assert _exactly({k: v.copy() for k, v in c.items()}, c)
    assert not _exactly({"a": c["a"], "b": c["a"]}, c)
    assert not _exactly({"a": c["a"]}, c)


def test_a_column_reduction_told_its_pages_start_lower_is_refused_at_the_reduction():
    """A ColReduce whose address says its first page lies at tile row 2 was refused at the reader, in words about
    the reader's pages ("item (0, 0)'s pages start at tile (0, 0) of x") — true of the reader, which is not wrong."""
    import dataclasses

    from spatialc.errors import SemanticError
    from spatialc.ir.ids import LV_K
    from spatialc.ir.nodes import Engine
    from spatialc.ir.ops import ColReduce, Compute, TileAddr

    from ..rewrite import edit, map_ops

    p = spatialc.build(spatialc.col_reduce(100, 70, "sum", "fp32"), "sm_90", block=(2, 2, 1), sites=2)

    def lowered(op):
        if isinstance(op, Compute) and isinstance(op.op, ColReduce):
            return (dataclasses.replace(op, op=dataclasses.replace(op.op, at=TileAddr(2, ((LV_K, 2),)))),)
        return None

    bad = edit(p, Engine.COMPUTE, lambda ops: map_ops(ops, lowered))
    with pytest.raises(SemanticError, match=r"site 0 compute: Compute column sum .* first page is at tile row 2 of x"):
        spatialc.verify(bad)


def test_a_map_of_more_outputs_than_any_block_holds_is_told_so_not_to_force_a_smaller_block():
    """600 outputs need more shared memory than a site has at any block or depth: the refusal said to force a
    smaller block or depth, which cannot help; 100 outputs fit when forced 1 deep, and are told so."""
    from spatialc.errors import PlanError

    (x0,) = ew.inputs(1)
    many = spatialc.elementwise({f"o{i}": x0 + float(i) for i in range(600)}, 16, 16)
    with pytest.raises(PlanError, match="even 1x1 tiles 1 deep does not fit its 601 rings: map fewer inputs"):
        spatialc.build(many, "sm_80")
    some = spatialc.elementwise({f"o{i}": x0 + float(i) for i in range(100)}, 16, 16)
    with pytest.raises(PlanError, match="force a smaller block or depth"):
        spatialc.build(some, "sm_80")
    assert spatialc.build(some, "sm_80", depth=1).verified


@pytest.mark.parametrize("op", ["absmax", "min"])
def test_an_e5m2_column_of_infinities_runs_as_the_interpreter_says(op):
    """e5m2 holds ±inf, and the interpreter keeps an input's; the kernel's host program cast each input value to
    __nv_fp8_e5m2, whose constructor saturates — ±inf became ±57344, and the column's absmax or min with it."""
    import warnings

    import numpy as np

    p = spatialc.build(spatialc.col_reduce(20, 16, op, "e5m2"), "sm_90")
    x = np.ones((20, 16), np.float32)
    x[2, 2], x[3, 3] = -np.inf, np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = spatialc.evaluate(p, {"x": x})
        got = spatialc.emulate(spatialc.lower(p, form="general"), {"x": x})
    assert np.isinf(want[0, 2]) and np.array_equal(got, want)


def test_an_output_read_as_an_input_and_a_forced_column_block_too_big_say_what_is_wrong(capsys):
    """`b = a + x1` with a an output: it said every name needed one of its own; a forced column block past shared
    memory said no block fits and to force a smaller one, not what the forced one takes."""
    from spatialc.cli import main

    assert main(["elementwise", "a = x0*2; b = a + x1", "32", "32"]) == 2
    assert "output a is read by a formula as an input: an output is no input" in capsys.readouterr().err
    with pytest.raises(
        spatialc.PlanError, match=r"column program's rings of 8x64-tile pages, 2 a ring, take \d+ bytes"
    ):
        spatialc.build(spatialc.col_reduce(64, 64, "sum"), block=(8, 64, 1))

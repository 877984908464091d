"""`spatialc col-reduce M N --op OP` (a 1×N output, one value a column): checked against numpy (and, with --run, the
kernel's under the host emulation), its plan said, its program saved, the sm_90a form's refusal and bad input as one
line on stderr and exit 2."""

from __future__ import annotations

import shutil

import pytest

import spatialc
from spatialc.cli import main


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "absmax", "sumsq"])
def test_col_reduce_checks_its_1_by_n_output(capsys, op, tmp_path):
    saved = tmp_path / "c.json"
    assert main(["col-reduce", "40", "70", "--op", op, "--json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"spatialc col-reduce {op} over 40x70 bf16" in out
    assert "plan      columns: bands of" in out
    assert "check     interpreter vs numpy reference: OK, max |error|" in out
    p = spatialc.from_json(saved.read_text())
    assert [(t.name, t.elems) for t in p.tensors] == [("x", (40, 70)), ("out", (1, 70))]
    assert p.verified and p.name == f"col_{op}_40x70_bf16"


def test_col_reduce_emits_the_general_forms_kernel_of_an_fp16_vector(capsys, tmp_path):
    argv = ["col-reduce", "300", "40", "--op", "max", "--out", "fp16", "--block", "4,2"]
    assert main([*argv, "--emit", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    assert "plan      columns: bands of 2 tile columns (32 columns of 320 elements), read a page of 4 tile rows" in out
    text = (tmp_path / "k" / "kernel.cu").read_text()
    assert "typedef __half OUT_T;" in text and "#define CCOLS 1" in text


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["col-reduce", "40", "70", "--op", "logsumexp"], "argument --op: invalid choice: 'logsumexp'"),
        (["col-reduce", "40", "70", "--precision", "int8"], "a column sum is float arithmetic"),
        (["col-reduce", "40", "0"], "n must be a whole number ≥ 1, not 0"),
        (["col-reduce", "40", "70", "--out", "int32"], "output is one of float32, fp16, bf16, not 'int32'"),
        (["col-reduce", "40", "70", "--target", "sm_90a", "--form", "sm90a"], "a program that reduces columns"),
    ],
)
def test_what_col_reduce_cannot_take_is_one_line_and_exit_2(capsys, argv, says):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_col_reduce_runs_under_the_emulation(capsys):
    assert main(["col-reduce", "33", "50", "--op", "absmax", "--run"]) == 0
    out = capsys.readouterr().out
    assert "under the host emulation" in out and "C equals the numpy reference within its bound: max |error|" in out


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_col_reduce_runs_under_the_emulation_in_the_persistent_form(capsys):
    assert main(["col-reduce", "33", "50", "--op", "sum", "--run", "--form", "persistent"]) == 0
    out = capsys.readouterr().out
    assert "under the host emulation" in out and "C equals the numpy reference within its bound: max |error|" in out

"""`spatialc rmsnorm M N --residual` (fused add + RMSNorm: out and residual_out) and `spatialc row-reduce M N --op OP`
(an M×1 output alone): their outputs checked against numpy (and, with --run, the kernel's under the host emulation),
the saved program, the padding note, and bad input as one line on stderr and exit 2."""

from __future__ import annotations

import shutil

import pytest

import spatialc
from spatialc.cli import main


def test_rmsnorm_residual_checks_out_and_residual_out_and_prints_its_kernel(capsys):
    assert main(["rmsnorm", "40", "70", "--residual", "--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "spatialc rmsnorm over 40x70 fp16, eps 1e-06, fused add (residual)" in out
    assert "check     interpreter vs numpy reference: OK, out: max |error|" in out
    assert "; residual_out: max |error|" in out and "(out float32, residual_out fp16)" in out
    assert "kernel    general form: each engine on its own warps" in out


def test_rmsnorm_residual_and_no_weight_shape_the_saved_program(capsys, tmp_path):
    saved = tmp_path / "fused.json"
    assert main(["rmsnorm", "33", "50", "--residual", "--no-weight", "--json", str(saved)]) == 0
    assert "check     interpreter vs numpy reference: OK" in capsys.readouterr().out
    p = spatialc.from_json(saved.read_text())
    assert [(t.name, t.role.value) for t in p.tensors] == [
        ("x", "input"),
        ("residual", "input"),
        ("out", "output"),
        ("residual_out", "output"),
    ]
    assert p.verified and p.name == "rmsnorm_residual_33x50_bf16"
    assert main(["verify", str(saved)]) == 0
    assert "verified" in capsys.readouterr().out


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "absmax", "sumsq"])
def test_row_reduce_checks_its_m_by_1_output(capsys, op, tmp_path):
    saved = tmp_path / "r.json"
    assert main(["row-reduce", "40", "70", "--op", op, "--json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"spatialc row-reduce {op} over 40x70 bf16" in out
    assert "check     interpreter vs numpy reference: OK, max |error|" in out
    p = spatialc.from_json(saved.read_text())
    assert [(t.name, t.elems) for t in p.tensors] == [("x", (40, 70)), ("out", (40, 1))]


def test_row_reduce_pads_the_rows_it_reads_not_its_one_column(capsys):
    """The padding note measures N by x's 5 tile columns (padded to a page of 8), not by out's one column."""
    assert main(["row-reduce", "40", "70", "--op", "absmax"]) == 0
    out = capsys.readouterr().out
    assert "the plan pads N from 5 to 8 tiles (+60%)" in out and "from 1 to" not in out


def test_row_reduce_persistent_form_emits_its_kernel_of_an_fp16_row_vector(capsys, tmp_path):
    argv = ["row-reduce", "40", "70", "--op", "max", "--out", "fp16", "--form", "persistent"]
    assert main([*argv, "--emit", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    assert "kernel    shared memory 9216 bytes a block (budget.json: 9216 static + 0 dynamic)" in out
    assert "typedef __half OUT_T;" in (tmp_path / "k" / "kernel.cu").read_text()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["row-reduce", "40", "70", "--op", "median"], "argument --op: invalid choice: 'median'"),
        (["row-reduce", "40", "70", "--precision", "int8"], "a row sum is float arithmetic"),
        (["row-reduce", "0", "70"], "m must be a whole number ≥ 1, not 0"),
        (["row-reduce", "40", "70", "--out", "int32"], "output is one of float32, fp16, bf16, not 'int32'"),
        (["rmsnorm", "40", "70", "--residual", "--precision", "int8"], "use fp16 or bf16"),
        (["rmsnorm", "40", "70", "--residual", "--eps", "nan"], "rmsnorm's eps is a finite number ≥ 0"),
    ],
)
def test_what_row_reduce_and_fused_rmsnorm_cannot_take_is_one_line_and_exit_2(capsys, argv, says):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_rmsnorm_residual_runs_under_the_emulation_and_checks_both_outputs(capsys):
    assert main(["rmsnorm", "33", "50", "--residual", "--run"]) == 0
    out = capsys.readouterr().out
    assert "under the host emulation" in out
    assert "C equals the numpy reference within its bound: out:" in out and "; residual_out: max |error|" in out


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_row_reduce_runs_under_the_emulation_in_the_persistent_form(capsys):
    assert main(["row-reduce", "33", "50", "--op", "absmax", "--run", "--form", "persistent"]) == 0
    out = capsys.readouterr().out
    assert "under the host emulation" in out and "C equals the numpy reference within its bound: max |error|" in out

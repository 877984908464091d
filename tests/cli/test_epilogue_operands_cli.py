"""`spatialc gemm --row-scale --col-scale --residual --gate`: the epilogue built, checked, emitted and run on random
inputs for every tensor it reads; what a grouped GEMM or an int8 GEMM cannot take refused in one line."""

from __future__ import annotations

import shutil

import pytest

import spatialc
from spatialc.cli import main


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_gemm_builds_and_checks_scales_a_residual_and_a_gate(capsys, tmp_path):
    path = tmp_path / "p.json"
    status, out, err = run_cli(
        capsys,
        *("gemm", "40", "48", "32", "--precision", "bf16", "--target", "sm_80"),
        *("--row-scale", "--col-scale", "--bias", "--residual", "--gate", "--json", str(path)),
    )
    assert status == 0, err
    assert "epilogue row_scale → col_scale → bias → residual → gate" in out
    assert "interpreter vs numpy reference: OK" in out
    # the form auto took: the persistent kernel, whose fused store reads the residual's and the gate's rings
    assert "residual_ring 8192 B, gate_ring 8192 B (static); fused into the store (no ring): C_ring" in out
    p = spatialc.from_json(path.read_text())
    shapes = {t.name: (t.role.value, t.elems) for t in p.tensors}
    assert shapes["row_scale"] == ("parameter", (40, 1)) and shapes["col_scale"] == ("parameter", (1, 48))
    assert shapes["residual"] == ("input", (40, 48)) and shapes["gate"] == ("input", (40, 48))


def test_an_int8_gemm_with_a_row_scale_and_a_residual_is_exact(capsys):
    status, out, err = run_cli(capsys, "gemm", "33", "20", "40", "--row-scale", "--residual", "--relu")
    assert status == 0, err
    assert "interpreter vs numpy reference: OK, exact" in out


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_run_makes_inputs_for_every_tensor_the_epilogue_reads(capsys):
    status, out, err = run_cli(
        capsys, "gemm", "24", "40", "16", "--precision", "fp16", "--row-scale", "--residual", "--gate", "--run"
    )
    assert status == 0, err
    assert "C equals the numpy reference within its bound" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("grouped-gemm", "2", "32", "32", "32", "--residual"), "unrecognized arguments: --residual"),
        (("gemm", "32", "32", "32", "--row-scale", "--col-scale"), "beyond ±(2^62 - 2^12)"),
    ],
)
def test_what_cannot_be_built_is_one_line_and_exit_2(capsys, argv, says):
    status, _, err = run_cli(capsys, *argv)
    assert status == 2 and says in err and err.count("\n") == 1, err

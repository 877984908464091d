"""`spatialc layernorm M N`: rmsnorm's options and --eps, --no-weight, --no-bias; its three outputs checked against
numpy (and, with --run, the kernel's under the host emulation); bad input one line on stderr and exit 2."""

from __future__ import annotations

import shutil

import pytest

import spatialc
from spatialc.cli import main
from spatialc.ir.ops import Lit


def test_layernorm_checks_its_three_outputs_and_prints_its_kernel(capsys):
    assert main(["layernorm", "40", "70", "--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "spatialc layernorm over 40x70 fp16, eps 1e-05" in out
    assert "check     interpreter vs numpy reference: OK, out: max |error|" in out
    assert "; mean: max |error|" in out and "; rstd: max |error|" in out
    assert "kernel    general form: each engine on its own warps" in out


def test_no_weight_no_bias_and_eps_shape_the_saved_program(capsys, tmp_path):
    saved = tmp_path / "ln.json"
    assert main(["layernorm", "33", "50", "--eps", "1e-3", "--no-weight", "--no-bias", "--json", str(saved)]) == 0
    assert "check     interpreter vs numpy reference: OK" in capsys.readouterr().out
    p = spatialc.from_json(saved.read_text())
    assert [t.name for t in p.tensors] == ["x", "out", "mean", "rstd"] and p.verified
    rstd = next(s for s in p.stages if s.name == "rstd")
    assert Lit(1e-3) in rstd.kind.op.expr.args[0].args  # rsqrt(Σ / n + eps)
    assert main(["verify", str(saved)]) == 0
    assert "verified" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["layernorm", "40", "70", "--eps", "-1"], "layernorm's eps is a finite number ≥ 0"),
        (["layernorm", "40", "70", "--precision", "int8"], "use fp16 or bf16"),
        (["layernorm", "0", "70"], "m must be a whole number ≥ 1, not 0"),
    ],
)
def test_what_layernorm_cannot_take_is_one_line_and_exit_2(capsys, tmp_path, argv, says):
    argv = [str(tmp_path / "k") if a == "DIR" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_out_of_bf16_is_emitted_beside_float32_vectors(capsys, tmp_path):
    assert main(["layernorm", "40", "70", "--out", "bf16", "--emit", str(tmp_path / "k")]) == 0
    assert "kernel    general form" in capsys.readouterr().out
    text = (tmp_path / "k" / "kernel.cu").read_text()
    assert "typedef __nv_bfloat16 OUT_T;" in text and "OUT_T* __restrict__ t3, float* __restrict__ t4" in text


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_layernorm_runs_under_the_emulation_within_its_bound(capsys):
    assert main(["layernorm", "33", "50", "--run"]) == 0
    out = capsys.readouterr().out
    assert "under the host emulation" in out and "C equals the numpy reference within its bound: out:" in out

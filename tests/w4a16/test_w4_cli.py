"""`spatialc gemm … --weights int4 --group 128 [--zeros]`: built, verified, the interpreter checked against numpy;
a bad request one line and exit status 2; the kernel printed in the general form and run (the emulation here)."""

from __future__ import annotations

import json

import pytest

from spatialc.cli import main
from spatialc.ir import serde


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("args", "head"),
    [
        (["--weights", "int4", "--group", "128", "--zeros"], "bf16, int4 weights with zero points"),
        (["--weights", "uint4", "--group", "64", "--scale-type", "float32"], "bf16, uint4 weights"),
        (["--weights", "mxfp4"], "bf16, mxfp4 weights"),
    ],
)
def test_a_w4a16_gemm_is_checked_against_numpy(capsys, args, head):
    status, out, err = run_cli(capsys, "gemm", "16", "96", "256", "--precision", "bf16", *args)
    assert status == 0, err
    assert f"spatialc gemm 16x96x256 {head} on sm_90" in out
    assert "Bq_ring" in out and "interpreter vs numpy reference: OK" in out
    assert "kernel    general form" in out
    assert "Warning" not in err  # random weights, scales and zeros are values of their types: nothing rounded


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--weights", "int4", "--group", "96"], "K = 256 is not a multiple of the group (96)"),
        (["--weights", "mxfp4", "--zeros"], "no zero point"),
        (["--group", "128"], "give weights= too"),
        (["--weights", "int4", "--precision", "int8"], "dequantised to bf16 or fp16"),
    ],
)
def test_a_bad_request_is_one_line_and_status_2(capsys, args, says):
    status, out, err = run_cli(
        capsys, "gemm", "16", "96", "256", *(["--precision", "bf16"] if "--precision" not in args else []), *args
    )
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in err


@pytest.mark.emulation
def test_the_kernel_is_emitted_and_run(capsys, tmp_path):
    status, out, err = run_cli(
        capsys,
        "gemm",
        "16",
        "96",
        "256",
        "--precision",
        "bf16",
        "--weights",
        "int4",
        "--zeros",
        "--emit",
        str(tmp_path / "k"),
        "--run",
    )
    assert status == 0, err
    assert "spatialc_w4_load_b<0, true, OPT>(" in (tmp_path / "k" / "kernel.cu").read_text()  # the register path
    assert "C equals the numpy reference within its bound" in out


def test_a_saved_w4a16_program_verifies_again(capsys, tmp_path):
    saved = tmp_path / "w4.json"
    status, _, err = run_cli(
        capsys, "gemm", "16", "96", "256", "--precision", "bf16", "--weights", "int4", "--zeros", "--json", str(saved)
    )
    assert status == 0, err
    assert json.loads(saved.read_text())["version"] == serde.VERSION
    status, out, err = run_cli(capsys, "verify", str(saved))
    assert status == 0, err
    assert "verified" in out


def test_check_none_makes_no_weights(capsys, monkeypatch):
    """With --check none and no --run nothing multiplies B, so its weights are never drawn nor packed (a plain GEMM
    makes no operand either): at 1 × 65536 × 65536 they took the machine's memory."""
    from spatialc.numerics import w4

    def packed(*_):
        raise AssertionError("weights packed with --check none")

    monkeypatch.setattr(w4, "pack_int4", packed)
    monkeypatch.setattr(w4, "random_weights", packed)
    status, out, err = run_cli(capsys, "gemm", "16", "96", "256", "--precision", "bf16", "--weights", "int4", "--zeros")
    assert status == 3 and "weights packed" in err  # a check draws them (the patch is in the way)
    status, out, err = run_cli(
        capsys, "gemm", "16", "96", "256", "--precision", "bf16", "--weights", "int4", "--zeros", "--check", "none"
    )
    assert status == 0, err
    assert "check     none (--check none)" in out


@pytest.mark.parametrize("fmt", ["int4", "uint4", "mxfp4"])
def test_random_weights_are_drawn_a_block_of_rows_at_a_time(monkeypatch, fmt):
    """The same packed weights as one draw of the whole K × N, never more than a block of values at once."""
    import numpy as np

    from spatialc.numerics import w4

    k, n = 96, 40
    dtype = w4.WEIGHT_FORMATS[fmt]
    whole = w4.random_weights((k, n), dtype, fmt, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    if fmt == "mxfp4":
        values = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])[rng.integers(0, 8, (k, n))] * rng.choice([-1, 1], (k, n))
    else:
        values = rng.integers(*w4.FOUR_BIT_RANGE[dtype], (k, n), endpoint=True)
    assert np.array_equal(whole, w4.pack_int4(values, fmt))
    sizes = []
    pack = w4.pack_int4
    monkeypatch.setattr(w4, "pack_int4", lambda v, f: sizes.append(np.size(v)) or pack(v, f))
    monkeypatch.setattr(w4, "WEIGHT_CHUNK", 6 * n)
    assert np.array_equal(w4.random_weights((k, n), dtype, fmt, np.random.default_rng(5)), whole)
    assert len(sizes) == k // 6 and max(sizes) <= 6 * n

"""`spatialc gemm --precision e4m3 --scales 1x128,128x128`: a block-scaled GEMM built, verified and checked against
the reference on random inputs (scales of their own shapes), its kernel printed; bad layouts
and a scaled int8 GEMM refused in one line, exit status 2."""

from __future__ import annotations

import shutil

import pytest

import spatialc
from spatialc.cli import main


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_gemm_with_block_scales_is_checked(capsys, tmp_path):
    path = tmp_path / "p.json"
    status, out, err = run_cli(
        capsys,
        *("gemm", "40", "48", "384", "--precision", "e4m3", "--target", "sm_89"),
        *("--scales", "1x128,128x128", "--bias", "--json", str(path)),
    )
    assert status == 0, err
    assert "scales 1x128,128x128" in out
    assert "interpreter vs numpy reference: OK" in out and "Σ_g |sa·sb|·|A_g|@|B_g|" in out
    assert "printed kernel agrees" in out  # the persistent form's kernel, its ops counted in the text
    p = spatialc.from_json(path.read_text())
    shapes = {t.name: (t.role.value, t.elems) for t in p.tensors}
    assert shapes["scale_a"] == ("parameter", (40, 3)) and shapes["scale_b"] == ("parameter", (3, 1))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--precision", "e4m3", "--scales", "1x128"), "--scales takes A's and B's layouts"),
        (("--precision", "e4m3", "--scales", "1x64,128x128"), "groups 64 elements of K"),
        (("--precision", "e4m3", "--scales", "1x128,sideways"), "unknown scale layout 'sideways' for B"),
        (("--scales", "1x128,128x128"), "block scales are for 8-bit float operands (e4m3, e5m2), not int8 ones"),
    ],
)
def test_bad_scales_are_one_line(capsys, argv, message):
    status, out, err = run_cli(capsys, "gemm", "32", "32", "256", *argv)
    assert status == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_run_goes_through_the_emulation_within_the_kernel_bound(capsys):
    status, out, err = run_cli(
        capsys,
        "gemm",
        "40",
        "48",
        "384",
        "--precision",
        "e4m3",
        "--target",
        "sm_89",
        "--scales",
        "row,128x128",
        "--run",
    )
    assert status == 0, err
    assert "C equals the numpy reference within its bound" in out and "block-scaled, promoted every 128 of K" in out

"""The command line: reports, saved programs, and one clear line with exit status 2 for anything wrong."""

import json
import subprocess
import sys

import pytest

import spatialc
from spatialc.cli import main


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_gemm_reports_plan_sites_rings_check_and_time(capsys):
    status, out, err = run_cli(
        capsys, "gemm", "70", "50", "90", "--target", "sm_86", "--sites", "4", "--placement", "round_robin"
    )
    assert status == 0, err
    assert "spatialc gemm 70x50x90 int8 on sm_86" in out
    for label in ("plan ", "sites ", "rings ", "check ", "time "):
        assert f"  {label}" in out
    assert "4 (round_robin)" in out
    assert "interpreter vs numpy reference: OK, exact" in out


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gemm_checks_float_precisions_within_the_stated_bound(capsys, precision):
    status, out, _ = run_cli(capsys, "gemm", "33", "17", "49", "--precision", precision, "--target", "sm_80")
    assert status == 0 and "OK, max |error|" in out


def test_saved_program_shows_and_round_trips(capsys, tmp_path):
    path = tmp_path / "p.json"
    status, _, err = run_cli(capsys, "gemm", "40", "40", "40", "--block", "1,1,1", "--json", str(path))
    assert status == 0, err
    p = spatialc.from_json(path.read_text())
    assert p.verified and p.plan.block == spatialc.ir.BlockShape(1, 1, 1)
    status, out, _ = run_cli(capsys, "show", str(path))
    assert status == 0 and "Loop k < 3:" in out and "site 0" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["gemm", "0", "4", "4"], "m must be a whole number ≥ 1"),
        (["gemm", "4", "4", "4", "--target", "sm_75"], "unknown target 'sm_75'"),
        (["gemm", "4", "4", "4", "--precision", "fp8"], "invalid choice: 'fp8'"),
        (["gemm", "4", "4", "4", "--block", "2,2"], "--block must be 3 comma-separated whole numbers"),
        (
            [
                "gemm",
                "64",
                "64",
                "64",
                "--precision",
                "fp16",
                "--block",
                "4,8,8",
                "--sub-blocks",
                "2,2",
                "--depth",
                "4",
            ],
            "shared memory",
        ),
        (["gemm", "4", "4", "4", "--sites", "0"], "sites must be a whole number from 1 to 65536"),
        (["gemm", "4", "4", "4", "--sites", "3000000"], "sites must be a whole number from 1 to 65536"),
        (["gemm", "4", "x", "4"], "invalid int value: 'x'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["show", "/nonexistent/p.json"], "cannot read /nonexistent/p.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(capsys, argv, says):
    status, _, err = run_cli(capsys, *argv)
    assert status == 2
    assert err.count("\n") == 1 and says in err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{ not json", "not JSON"),
        (json.dumps({"name": "a", "layers": []}), "not a spatialc program"),
        (
            json.dumps({"format": "spatialc.program", "version": 1, "program": {"type": "SpatialProgram"}}),
            "missing field 'name'",
        ),
    ],
)
def test_show_refuses_files_that_are_not_ours(capsys, tmp_path, content, says):
    path = tmp_path / "x.json"
    path.write_text(content)
    status, _, err = run_cli(capsys, "show", str(path))
    assert status == 2 and says in err and err.count("\n") == 1


def test_python_dash_m_is_the_same_command():
    res = subprocess.run(
        [sys.executable, "-m", "spatialc", "gemm", "4", "4", "4", "--target", "nope"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "unknown target 'nope'" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the run falls back to the host emulation")
def test_the_readme_main_job_emits_and_runs(capsys, tmp_path):
    # The README's first command, minus the install: build, check, emit CUDA, run it (emulated: no GPU here).
    status, out, err = run_cli(
        capsys,
        "gemm",
        "256",
        "256",
        "256",
        "--precision",
        "int8",
        "--target",
        "sm_86",
        "--emit",
        str(tmp_path / "gemm256"),
        "--run",
    )
    assert status == 0, err
    assert "interpreter vs numpy reference: OK, exact" in out
    assert "census    " in out and "printed kernel agrees" in out
    assert "under the host emulation (late copies; no GPU" in out
    assert "C equals the reference interpreter, exactly" in out
    for name in ("program.cu", "bench.cu", "budget.json", "census.json"):
        assert (tmp_path / "gemm256" / name).is_file()
    assert json.loads((tmp_path / "gemm256" / "budget.json").read_text())["threads"] == 128


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the run falls back to the host emulation")
@pytest.mark.parametrize(
    ("precision", "flags"),
    [
        ("int8", ["--bias", "--relu", "--requant", "0.01,3"]),
        ("bf16", ["--bias", "--scalar", "mul,0.5", "--mode", "early"]),
    ],
)
def test_an_epilogue_runs_from_the_command_line(capsys, precision, flags):
    status, out, err = run_cli(
        capsys, "gemm", "100", "72", "40", "--precision", precision, "--target", "sm_86", *flags, "--run"
    )
    assert status == 0, err
    assert ", epilogue bias → " in out and "check     interpreter vs numpy reference: OK" in out
    assert "C equals" in out


def test_gpucheck_gets_its_own_arguments_in_any_order(capsys, tmp_path):
    for argv in (
        ["gpucheck", "--dry-run", str(tmp_path), "--sizes", "64", "--precisions", "int8"],
        ["gpucheck", str(tmp_path), "--sizes", "64", "--precisions", "int8", "--dry-run"],
    ):
        status, out, err = run_cli(capsys, *argv)
        assert status == 0, err
        assert "int8 64x64x64" in out


def test_a_bad_depth_reads_naturally(capsys):
    status, _, err = run_cli(capsys, "gemm", "4", "4", "4", "--depth", "0")
    assert status == 2 and "depth must be a whole number ≥ 1, not 0" in err

"""`spatialc elementwise EXPR M N`: an elementwise program from the command line, its formula read as a tree (never
run), and one clear line with exit status 2 for anything wrong."""

import subprocess
import sys

import pytest

import spatialc
from spatialc import ew
from spatialc.errors import ProgramError
from spatialc.ir.ops import Apply, Arg, Lit

from .test_cli import run_cli


def test_an_elementwise_program_builds_checks_and_says_its_inputs(capsys):
    status, out, err = run_cli(capsys, "elementwise", "silu(g) * x + col(bias)", "100", "300", "--precision", "fp16")
    assert status == 0, err
    assert "spatialc elementwise 'silu(g) * x + col(bias)' over 100x300 fp16 on sm_90" in out and "inputs g, x" in out
    assert "plan      a map: blocks of" in out
    assert "interpreter vs numpy reference: OK, max |error|" in out


def test_the_inputs_order_the_block_the_output_and_a_saved_program(capsys, tmp_path):
    path = tmp_path / "m.json"
    argv = ["elementwise", "a - b", "40", "70", "--inputs", "b,a", "--block", "1,2", "--out", "bf16"]
    status, out, err = run_cli(capsys, *argv, "--json", str(path), "--sites", "3")
    assert status == 0, err
    p = spatialc.from_json(path.read_text())
    assert [t.name for t in p.tensors] == ["b", "a", "out"] and p.plan.item_tiles == (1, 2)
    assert p.output_tensor().dtype.value == "bf16" and len(p.placement.items_of_site) == 3
    status, out, _ = run_cli(capsys, "show", "--python", str(path))
    assert status == 0 and "p.map(" in out and "[a_ring, b_ring]" not in out
    scope: dict = {}
    exec(compile(out, "<shown>", "exec"), scope)  # the printed source traces back to the same program
    assert scope["program"]() == p


def test_a_row_vector_builds_checks_and_shows_as_lang_that_traces_back(capsys, tmp_path):
    path = tmp_path / "r.json"
    argv = ["elementwise", "x * row(scale) + col(bias)", "70", "48", "--block", "2,1", "--sites", "2"]
    status, out, err = run_cli(capsys, *argv, "--json", str(path))
    assert status == 0, err
    assert "interpreter vs numpy reference: OK" in out
    p = spatialc.from_json(path.read_text())
    assert [(t.name, t.elems) for t in p.tensors] == [
        ("x", (70, 48)),
        ("scale", (70, 1)),
        ("bias", (1, 48)),
        ("out", (70, 48)),
    ]
    status, out, _ = run_cli(capsys, "show", "--python", str(path))
    assert status == 0 and 'ew.row("scale")' in out and 'ew.col("bias")' in out
    scope: dict = {}
    exec(compile(out, "<shown>", "exec"), scope)  # the printed source traces back to the same program
    assert scope["program"]() == p


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["elementwise", "x + __import__('os')", "8", "8"], "is not part of an elementwise expression"),
        (["elementwise", "x.real", "8", "8"], "is not part of an elementwise expression"),
        (["elementwise", "x +", "8", "8"], "is not one: invalid syntax"),
        (["elementwise", "silu", "8", "8"], "silu is an op; call it"),
        (["elementwise", "x + y", "8", "8", "--inputs", "x"], "'y' is not one of the inputs x"),
        (["elementwise", "exp(x)", "8", "8", "--precision", "int8"], "exp is float arithmetic"),
        (["elementwise", "x", "8", "8", "--block", "1,1,1"], "--block must be 2 comma-separated whole numbers"),
        (["elementwise", "x", "0", "8"], "m must be a whole number ≥ 1"),
        (["elementwise", "x", "8", "8", "--form", "sm90a"], "printed in the general and the persistent forms only"),
        (["elementwise", "+" * 3000 + "x", "8", "8"], "nests too deep"),
        (["elementwise", "x * row(s) + col(s)", "8", "8"], "'s' is read both as a column vector (col) and as a row"),
        (["elementwise", "x * row(x)", "8", "8"], "need names of their own"),
        (["elementwise", "row", "8", "8"], "row is an op; call it"),
    ],
)
def test_a_bad_elementwise_command_is_one_line_and_exit_status_2(capsys, argv, says):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and says in err and err.count("\n") == 1, err


def test_the_reader_builds_the_table_ops_and_refuses_the_rest():
    expr, names = ew.parse("leaky_relu(x, alpha=-0.5) + 2 ** y")
    assert names == ("x", "y")
    want = Apply("add", (Apply("leaky_relu", (Arg(0),), (-0.5,)), Apply("pow", (Lit(2.0), Arg(1)))))
    assert expr.node == want
    for bad, says in (
        ("x < y < 1", "one comparison"),
        ("clamp(x, lo=y, hi=1)", "clamp's parameters are numbers"),
        ("x if y else 1", "is not part of an elementwise expression"),
        ("col(1)", "is not part of"),
        ("row(x, y)", "is not part of"),
        ("+".join(["x"] * 600), "more than 512 parts"),
        ("exp(x, y)", "ew.exp takes 1 operand(s), not 2"),
        ("clamp(x)", "takes the parameter(s) lo, hi"),
    ):
        with pytest.raises(ProgramError, match=says.replace("(", r"\(").replace(")", r"\)")):
            ew.parse(bad)


def test_python_dash_m_runs_an_elementwise_program():
    done = subprocess.run(
        [sys.executable, "-m", "spatialc", "elementwise", "max(x, y) * 0.5", "20", "30"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr

"""What hostile review 48 found in `spatialc show`, each kept as a test: 4-bit-weight programs printed as source
that did not parse, `show --python` crashing on hand-edited files that verify refuses, and the listing printing a
file's unchecked strings (a target, an op's name) raw onto the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import spatialc
from spatialc.cli import main

FORGED = 'relu\n\x1b[31mFORGED LINE\x1b[0m")#'


def saved(tmp_path: Path, name: str, *argv: str) -> Path:
    path = tmp_path / f"{name}.json"
    assert main([*argv, "--json", str(path)]) == 0
    return path


def edited(path: Path, name: str, change) -> Path:
    doc = json.loads(path.read_text())
    change(doc["program"])
    out = path.with_name(f"{name}.json")
    out.write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize("weights", [["--weights", "int4", "--zeros", "--group", "64"], ["--weights", "mxfp4"]])
def test_show_python_prints_a_4_bit_weight_program_as_source_that_rebuilds_it(tmp_path, capsys, weights):
    path = saved(tmp_path, "w4", "gemm", "64", "64", "256", "--precision", "fp16", *weights)
    capsys.readouterr()
    assert main(["show", "--python", str(path)]) == 0
    source = capsys.readouterr().out
    assert "Dequant(weights=WeightFormat." in source and "<" not in source.split("def program")[1]
    scope: dict[str, object] = {"__name__": "printed"}
    exec(compile(source, "<show --python>", "exec"), scope)  # a SyntaxError here before: the enums' reprs
    assert scope["program"]() == spatialc.from_json(path.read_text())  # type: ignore[operator]


def _dangling(p):
    p["tensors"][0]["id"] = 7


def _duplicated(p):
    p["tensors"][1]["id"] = p["tensors"][0]["id"]


@pytest.mark.parametrize(
    "change, says",
    [
        (_dangling, "names tensor 0, which does not exist"),
        (_duplicated, "two tensors have id 0"),
        (lambda p: p.update(placement=None), "has a schedule but no placement"),
        (lambda p: p.update(schedule=None), "no placement or schedule has no form in spatialc.lang yet"),
    ],
)
def test_show_python_refuses_a_hand_edited_program_in_one_line_as_verify_does(tmp_path, capsys, change, says):
    path = edited(saved(tmp_path, "g", "gemm", "64", "64", "64"), "edited", change)
    capsys.readouterr()
    assert main(["show", "--python", str(path)]) == 2  # an internal error (exit 3) before
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert main(["show", str(path)]) == 0  # the listing still shows the program it reads, verified or not


@pytest.mark.parametrize(
    "argv, change",
    [
        (["gemm", "64", "64", "64"], lambda p: p.update(target="sm_90\nX\x1b[2J")),
        (["elementwise", "silu(g) * x", "32", "64"], lambda p: _rename_op(p, "Apply")),
        (["softmax", "32", "64"], lambda p: _rename_op(p, "RowReduce")),
    ],
)
def test_the_listing_escapes_a_files_unchecked_strings(tmp_path, capsys, argv, change):
    path = edited(saved(tmp_path, "p", *argv), "forged", change)
    capsys.readouterr()
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and not any(line.startswith(("X", "\x1b")) for line in out.splitlines()), out
    assert "\\n" in out  # shown escaped, as verify's error shows it


def _rename_op(node, kind: str) -> None:
    """Every op of `kind` (Apply, RowReduce) in the document gets the forged name."""
    if isinstance(node, dict):
        if node.get("type") == kind:
            key = "op" if "op" in node else "name"
            node[key] = FORGED
        for v in node.values():
            _rename_op(v, kind)
    elif isinstance(node, list):
        for v in node:
            _rename_op(v, kind)

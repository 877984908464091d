"""A hostile review of saved programs (review 48, its sizes and messages): files that `spatialc verify FILE` read
at any length, echoed at any length, or answered with more than it proved.

1. no length bounds: a TileAddr of 2,000,000 steps took 35 s and 500 MB, a loop body repeated 200,000 times 68 s
   and 1.1 GB, a 100,000-character target came back whole in the error line; `from_json` now refuses a list or a
   string past its bound (`ir/serde.py`: MAX_STEPS, MAX_OPS, MAX_STRING) before decoding one entry of it, with one
   line naming the field, its size and the bound;
2. an item listed 3,000,000 times on a site gave a coverage error of 9 MB: a message lists at most a few values
   (`errors.listed`), quotes a value cut short (`errors.clipped`), and the CLI cuts any error line as a backstop;
3. attention's scale 1e308 (inf in float32, the kernel's type) leaked numpy's RuntimeWarning to stderr before the
   error: `numerics.attention.valid_scale` refuses a scale float32 cannot hold, in the API and in verify alike;
4. a GEMM saved with `"schedule": null` was "verified — … deadlock-free": verify now says what it proved of a
   program with no engine programs, and no more.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

import spatialc
from spatialc.cli import MAX_ERROR_LINE, _fail, main
from spatialc.errors import CoverageError, IllFormedError, ProgramError
from spatialc.ir.serde import MAX_OPS, MAX_STEPS, MAX_STRING, SerdeError
from spatialc.numerics.attention import valid_scale

BUILDS = {
    "gemm": ["gemm", "64", "64", "128"],
    "attention": ["attention", "1", "2", "64", "64", "64"],
}


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> dict[str, str]:
    out = {}
    for kind, argv in BUILDS.items():
        path = tmp_path_factory.mktemp(kind) / f"{kind}.json"
        assert main([*argv, "--check", "none", "--json", str(path)]) == 0
        out[kind] = path.read_text()
    return out


def verify(tmp_path: Path, doc: dict, capsys) -> tuple[int, str, str]:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    status = main(["verify", str(path)])
    captured = capsys.readouterr()
    return status, captured.out.strip(), captured.err.strip()


def first_read(doc: dict) -> tuple[str, dict]:
    """The path and the JSON of the first ReadTiles in a loop body of the document's schedule."""
    for i, prog in enumerate(doc["program"]["schedule"]["programs"]):
        for j, op in enumerate(prog["ops"]):
            for k, inner in enumerate(op.get("body", [])):
                if inner["type"] == "ReadTiles":
                    return f"program.schedule.programs[{i}].ops[{j}].body[{k}]", inner
    raise AssertionError("no ReadTiles in a loop body")


def test_a_tile_address_of_more_steps_than_the_bound_is_refused_before_decoding(docs, tmp_path, capsys):
    doc = json.loads(docs["gemm"])
    path, read = first_read(doc)
    read["at"]["steps"] = [[5, 0]] * (MAX_STEPS + 1)
    status, _, err = verify(tmp_path, doc, capsys)
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"{path}.at.steps: {MAX_STEPS + 1} steps; a TileAddr has at most {MAX_STEPS}" in err
    read["at"]["steps"] = [[5, 0]] * MAX_STEPS  # the bound itself is read
    spatialc.from_json(json.dumps(doc))


def test_a_loop_body_longer_than_the_bound_is_refused(docs, tmp_path, capsys):
    doc = json.loads(docs["gemm"])
    path, _ = first_read(doc)
    loop_path = path.rsplit(".body", 1)[0]
    prog = doc["program"]["schedule"]["programs"][int(loop_path.split("programs[")[1].split("]")[0])]
    loop = prog["ops"][int(loop_path.rsplit("ops[", 1)[1].rstrip("]"))]
    body = loop["body"]
    loop["body"] = (body * (MAX_OPS // len(body) + 1))[: MAX_OPS + 1]
    status, _, err = verify(tmp_path, doc, capsys)
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"{loop_path}.body: {MAX_OPS + 1} ops; a Loop has at most {MAX_OPS}" in err
    loop["body"] = body
    prog["ops"] = [loop] * (MAX_OPS + 1)
    with pytest.raises(SerdeError, match=rf"programs\[\d+\]\.ops: {MAX_OPS + 1} ops; an? EngineProgram has at most"):
        spatialc.from_json(json.dumps(doc))


@pytest.mark.parametrize("field", ["target", "name"])
def test_a_string_longer_than_the_bound_is_refused_without_echoing_it(docs, tmp_path, capsys, field):
    doc = json.loads(docs["gemm"])
    doc["program"][field] = "x" * 100_000
    status, _, err = verify(tmp_path, doc, capsys)
    assert status == 2 and len(err) < 200, err
    assert f"program.{field}: a string of 100000 characters; at most {MAX_STRING}" in err


def test_an_unknown_target_is_quoted_short(docs):
    """An in-memory program (no JSON reader on the way) with a long target: rule 1 quotes it cut short."""
    p = spatialc.from_json(docs["gemm"])
    with pytest.raises(IllFormedError, match="the program's target is 'xxx") as e:
        spatialc.verify(dataclasses.replace(p, target="x" * 10_000, verified=False))
    assert len(str(e.value)) < 300


def test_an_item_listed_many_times_gives_a_short_coverage_error(docs):
    """(A saved file listing more items than its plan places is now refused by the reader, by count:
    test_hostile_sizes.py; a program built in Python reaches the coverage rule.)"""
    p = spatialc.from_json(docs["gemm"])
    site, items = p.placement.items_of_site[0]
    listed = ((site, items + (items[0],) * 20_000), *p.placement.items_of_site[1:])
    with pytest.raises(CoverageError) as e:
        spatialc.verify(p.evolve(placement=dataclasses.replace(p.placement, items_of_site=listed)))
    assert len(str(e.value)) < 300 and "(20001 in all)" in str(e.value), str(e.value)[:400]


def test_the_cli_cuts_any_error_line_as_a_backstop(capsys):
    assert _fail("a message quoting " + "y" * 100_000) == 2
    err = capsys.readouterr().err
    assert len(err) <= len("spatialc: error: \n") + MAX_ERROR_LINE and err.rstrip().endswith("…")


@pytest.mark.parametrize("scale", [1e308, 3.5e38, 1e-50])
def test_a_scale_float32_cannot_hold_is_refused_in_one_line_with_no_warning(docs, tmp_path, capsys, scale):
    doc = json.loads(docs["attention"])
    stages = [s for s in doc["program"]["stages"] if s["kind"].get("op", {}).get("type") == "Attention"]
    stages[0]["kind"]["op"]["scale"] = scale
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning fails the test instead of reaching stderr
        status, _, err = verify(tmp_path, doc, capsys)
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"scale = {scale!r}; attention's scale is a finite number > 0" in err and "float32" in err
    with pytest.raises(ProgramError, match="scale is a finite number > 0, not .*float32"):
        spatialc.attention(1, 2, 64, 64, 64, scale=scale)


def test_valid_scale_is_float32s_range():
    assert valid_scale(3.4e38) and valid_scale(1e-30) and valid_scale(0.125)
    assert not any(valid_scale(s) for s in (1e308, 3.5e38, 1e-50, 10**400, float("inf"), float("nan"), 0.0, -1.0))


def test_a_program_without_a_schedule_is_not_called_deadlock_free(docs, tmp_path, capsys):
    doc = json.loads(docs["gemm"])
    doc["program"]["schedule"] = None
    status, out, err = verify(tmp_path, doc, capsys)
    assert status == 0, err
    first = out.splitlines()[0]
    assert "without a schedule" in first and "nothing is proved of rings, bounds, deadlock" in first, first
    assert "deadlock-free" not in out
    status, out, _ = verify(tmp_path, json.loads(docs["gemm"]), capsys)  # a scheduled one still says it all
    assert status == 0 and "deadlock-free" in out

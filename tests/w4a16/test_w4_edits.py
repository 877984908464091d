"""Hand edits of a saved W4A16 program's fields that no rule of verify used to see: each is refused by name, or it
means nothing and then no printer reads it.

- A one-row block's `stride_h` moves no tile (tile at + i·stride_h for i < 1): the interpreter never reads it and
  verify cannot hold it to anything, so the sm_90a form's bulk copies find the page's tiles, scales and zero points
  by the tensor's grid, as rule 8 proves them — an edited `stride_h` prints the very kernel of the unedited program
  (the one test_w4_sm90a.py emulates: "int4-zeros-m1"). In a block of several rows it is proved, and an edit refused.
- The dequantised ring's `page_tiles`: one fewer than the packed page's tiles is refused by rule 6 (the dequant would
  write past its page); one more is verified (the extra tiles are never read) and refused by the sm_90a form by one
  line (its panel pages are exactly the packed page's tiles).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import spatialc
from spatialc.cli import main
from spatialc.errors import SpatialError, TileBoundsError
from spatialc.ir.ops import ReadTiles, walk
from spatialc.lower.errors import Unsupported
from spatialc.numerics.reference import reference

from .w4_inputs import w4_inputs, w4_program


def _edited(p: spatialc.SpatialProgram, edit) -> spatialc.SpatialProgram:
    """`p` saved, `edit`ed as a document, loaded again (verified anew, or marked unverified)."""
    doc = json.loads(spatialc.to_json(p))
    edit(doc)
    return spatialc.from_json(json.dumps(doc))


def _packed_reads(doc: dict) -> list[dict]:
    b = next(t["id"] for t in doc["program"]["tensors"] if t["name"] == "B")
    found = []
    for g in doc["program"]["schedule"]["programs"]:
        stack = list(g["ops"])
        while stack:
            op = stack.pop()
            stack.extend(op.get("body", ()))
            if op["type"] == "ReadTiles" and op["tensor"] == b:
                found.append(op)
    return found


def _set_stride_h(value: int):
    def edit(doc: dict) -> None:
        reads = _packed_reads(doc)
        assert reads
        for op in reads:
            op["stride_h"] = value

    return edit


@pytest.fixture(scope="module")
def decode() -> spatialc.SpatialProgram:
    """The sm_90a form's decode case of test_w4_sm90a.py (M = 1, int4 with zero points per 128): one-row blocks."""
    p = w4_program(1, 64, 512, "int4", zeros=True, group=128, target="sm_90a", form="sm90a")
    reads = [op for g in p.schedule.programs for op in walk(g.ops) if isinstance(op, ReadTiles)]
    assert {op.block_h for op in reads if op.tensor == p.tensor_named("B").id} == {1}
    return p


@pytest.mark.parametrize("stride", [2, 3, 8, -4])
def test_a_one_row_blocks_stride_h_prints_the_same_sm90a_kernel(decode, stride):
    q = _edited(decode, _set_stride_h(stride))
    assert q.verified  # it moves no tile: nothing for verify to hold it to
    x = w4_inputs(decode, seed=3)
    assert np.array_equal(spatialc.evaluate(q, x), reference(decode, x))
    art, edited = spatialc.lower(decode), spatialc.lower(q)
    assert edited.budget.form == "sm90a"
    assert edited.kernel_cu == art.kernel_cu and edited.program_cu == art.program_cu


@pytest.mark.parametrize("stride", [0, 2, 8])
def test_a_several_row_blocks_stride_h_is_proved(stride):
    p = w4_program(16, 64, 256, "int4", zeros=True, group=128, target="sm_90a", form="sm90a", block=(4, 2, 4))
    q = _edited(p, _set_stride_h(stride))
    assert not q.verified
    with pytest.raises(spatialc.VerifyError, match="B") as e:
        spatialc.verify(q)
    assert f"(strides {stride},1)" in str(e.value) or "operand B" in str(e.value)


FORMS = {
    "sm90a": lambda: w4_program(
        64, 72, 192, "uint4", "fp16", target="sm_90a", group=64, scale_type="float32", form="sm90a"
    ),
    "persistent": lambda: w4_program(20, 48, 256, "int4", zeros=True, group=64, form="persistent"),
    "general": lambda: w4_program(20, 48, 256, "int4", zeros=True, group=64, form="general"),
}


def _page_tiles(delta: int):
    def edit(doc: dict) -> None:
        ring = next(b for b in doc["program"]["buffers"] if b["name"] == "B_ring")
        assert ring["kind"]["type"] == "Interm"  # the ring the dequant fills
        ring["kind"]["page_tiles"] += delta

    return edit


@pytest.mark.parametrize("form", FORMS)
def test_a_dequantised_page_smaller_than_the_packed_page_is_refused_by_rule_6(form):
    q = _edited(FORMS[form](), _page_tiles(-1))
    assert not q.verified
    with pytest.raises(TileBoundsError) as e:
        spatialc.verify(q)
    text = str(e.value)
    assert e.value.buffer == "B_ring" and "Compute dequant" in text
    assert "it fills a page of B_ring, which holds" in text and "(its page_tiles)" in text and "Bq_ring" in text


def test_a_larger_panel_page_is_refused_by_the_sm90a_form_by_name():
    q = _edited(FORMS["sm90a"](), _page_tiles(1))
    assert q.verified  # the extra tile is never read
    with pytest.raises(Unsupported, match=r"a dequant of Bq_ring's pages of (\d+) tiles into B_ring's of (?!\1)\d+"):
        spatialc.lower(q)


def test_the_cli_refuses_the_edited_file_in_one_line(capsys, tmp_path):
    path = tmp_path / "w4.json"
    doc = json.loads(spatialc.to_json(FORMS["sm90a"]()))
    _page_tiles(-1)(doc)
    path.write_text(json.dumps(doc))
    for argv in (["verify", str(path)], ["lower", str(path), "--emit", str(tmp_path / "k")]):
        status = main(argv)
        out, err = capsys.readouterr()
        assert status == 2, (argv, out, err)
        assert "verified" not in out and "Traceback" not in err and "internal error" not in err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "a dequant's page holds the page it reads" in lines[0]


def test_no_edit_here_is_an_internal_error():
    """Each edit above, in each form, asked of every form: a kernel or a one-line SpatialError, never another
    exception (an AssertionError was one)."""
    for make in FORMS.values():
        for edit in (_page_tiles(-1), _page_tiles(1)):
            q = _edited(make(), edit)
            for form in ("auto", "general", "persistent", "sm90a"):
                try:
                    assert spatialc.lower(q, form=form).budget.form in ("general", "persistent", "sm90a")
                except SpatialError as e:
                    assert "\n" not in str(e), (form, str(e))

"""The tutorial's chapter on 4-bit weights runs and prints what it shows; the example runs."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_tutorials_w4a16_chapter_prints_what_it_shows(capsys):
    text = (ROOT / "docs" / "tutorial.md").read_text()
    chapter = text.split("## 15. Four-bit weights (W4A16)\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", chapter, re.S)
    assert [lang for lang, _ in blocks] == ["python", "text"]
    exec(compile(blocks[0][1], "docs/tutorial.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == blocks[1][1].splitlines()


def test_the_example_runs_and_says_the_results_agree(capsys):
    runpy.run_path(str(ROOT / "examples" / "w4a16.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("equal to the reference: True") == 3 and "False" not in out

"""The README tells the truth: its quick start is the first two bash blocks, its Python example runs, and so do
the docs it moved its reference material to (the error table, the rest of the example, their links)."""

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ERRORS = (ROOT / "docs" / "errors.md").read_text()  # the error table, moved out of the README
PYTHON = (ROOT / "docs" / "python.md").read_text()  # the rest of the README's Python example


def test_the_quick_start_is_the_first_two_fenced_blocks_and_ci_runs_the_second():
    blocks = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
    assert [lang for lang, _ in blocks[:2]] == ["bash", "bash"]
    main_job, tests = (body.strip() for _, body in blocks[:2])
    assert "pip install" in main_job and "spatialc gemm" in main_job and "--emit" in main_job and "--run" in main_job
    assert tests == "python -m pip install -e '.[dev]' && python -m pytest"
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert tests in ci


@pytest.mark.skipif(shutil.which("g++") is None, reason="the example runs the host emulation, which needs g++")
@pytest.mark.emulation  # compiles with g++
def test_the_python_example_runs():
    # The first Python block is the README's example, run whole; any later one is a sketch (spatialc.lang's, whose
    # whole program is docs/tutorial.md's, run by tests/lang/test_lang.py), which must at least be Python.
    example, *sketches = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", README, re.S) if lang == "python"]
    exec(compile(example, "README.md", "exec"), {})
    for sketch in sketches:
        compile(sketch, "README.md", "exec")


def test_the_python_guides_example_runs():
    example = re.findall(r"```python\n(.*?)```", PYTHON, re.S)[0]
    exec(compile(example, "docs/python.md", "exec"), {})


def test_every_doc_the_readme_points_to_links_somewhere():
    for doc in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#:]+)\)", doc.read_text()):
            assert (doc.parent / link).exists(), f"{doc.name}: {link}"


def test_every_link_of_the_readme_leads_somewhere():
    root = Path(__file__).resolve().parents[1]
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links, "the README links its docs"
    for link in links:
        assert (root / link).exists(), link
    assert not re.search(r"\.\./shared", README), "the README must stand alone: shared/ is not in the repository"


def test_the_error_table_names_the_errors_spatialc_raises():
    import importlib
    import inspect

    import spatialc

    names = ("errors", "interp.errors", "lower.errors", "runtime.emulate", "runtime.launch")
    modules = (spatialc, *(importlib.import_module(f"spatialc.{n}") for n in names))
    named = set(
        re.findall(
            r"`(\w+Error|\w+Needed|Unverified|Unsupported|NeedsGeneral|TooBig|Precision|\w+Sites|"
            r"UnknownTarget|GpuUnavailable|Emulation\w+|NotReady|TooLarge)`",
            README + ERRORS,
        )
    )
    defined = {name for m in modules for name, obj in vars(m).items() if inspect.isclass(obj)}
    assert named <= defined, named - defined
    for name in ("SemanticError", "StrongerCheckNeeded", "InputError", "Unverified", "EmulationTimeout"):
        assert f"`{name}`" in ERRORS

"""The README tells the truth: its quick start is the first two bash blocks, its Python example runs, and so do
the docs it moved its reference material to (the error table, the rest of the example, their links) and the
tutorial's chapters "Beyond GEMM" and "Attention" (their code, the output they show, their pictures and commands)."""

import re
import shlex
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
    assert tests == "python -m pip install -e '.[dev,torch]' && python -m pytest"
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


TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text()


def beyond_gemm() -> list[tuple[str, str]]:
    """The fenced blocks of the tutorial's chapter "Beyond GEMM", in order: (language, body)."""
    chapter = TUTORIAL.split("## 12. Beyond GEMM\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", chapter, re.S)


def run_beyond_gemm(tmp_path, monkeypatch, capsys, emulate: bool) -> str:
    """Run the chapter's Python blocks one after another in one namespace (the block that calls the emulation only
    where `emulate`), then each line of its bash block through the CLI; check each `text` block is what the Python
    before it printed (its lines among the printed ones, `...` standing for the lines left out). Returns stdout."""
    from spatialc.cli import main

    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    printed: list[str] = []
    for lang, body in beyond_gemm():
        if lang == "python" and (emulate or "spatialc.emulate" not in body):
            exec(compile(body, "docs/tutorial.md", "exec"), scope)
            printed = capsys.readouterr().out.splitlines()
        elif lang == "text":
            missing = [line for line in body.splitlines() if line.strip() != "..." and line not in printed]
            assert not missing, f"the chapter shows lines the code does not print: {missing}"
        elif lang == "bash":
            for line in body.strip().splitlines():
                argv = shlex.split(line)
                assert argv[0] == "spatialc" and "--run" not in argv and "--emit" not in argv, line
                assert main(argv[1:]) == 0, line
    return capsys.readouterr().out


def test_the_tutorials_beyond_gemm_chapter_runs_and_prints_what_it_shows(tmp_path, monkeypatch, capsys):
    assert [lang for lang, _ in beyond_gemm()].count("python") >= 6
    run_beyond_gemm(tmp_path, monkeypatch, capsys, emulate=False)
    # Its picture is the one its code draws (and `spatialc softmax 64 256 --pictures DIR` too: the ticks are logical).
    drawn = (tmp_path / "softmax_pictures" / "timeline.svg").read_text()
    assert drawn == (ROOT / "docs" / "images" / "softmax-timeline.svg").read_text(), (
        "docs/images/softmax-timeline.svg is not what the chapter draws: regenerate it with"
        " `spatialc softmax 64 256 --pictures DIR` and copy DIR/timeline.svg"
    )
    assert "](images/softmax-timeline.svg)" in TUTORIAL


def test_the_tutorials_claim_that_rule_8_does_no_algebra_holds():
    # "swap mul's operands inside the scheduled op instead, x · silu(gate), and it is refused too (…)"
    import dataclasses

    import spatialc
    from spatialc import ew
    from spatialc.ir.ops import Apply, Compute, Map, rewrite

    x, gate = ew.inputs(2)
    p = spatialc.build(spatialc.elementwise(ew.silu(gate) * x, 64, 96, "bf16", names=("x", "gate")), "sm_90")

    def commuted(op):
        if isinstance(op, Compute):
            return dataclasses.replace(op, op=Map(Apply("mul", op.op.expr.args[::-1])))
        return op

    engines = tuple(dataclasses.replace(q, ops=rewrite(q.ops, commuted)) for q in p.schedule.programs)
    with pytest.raises(spatialc.VerifyError) as caught:
        spatialc.verify(p.evolve(schedule=dataclasses.replace(p.schedule, programs=engines)))
    words = "schedule op (x0 * silu(x1)) where stage map declares (silu(x1) * x0)"
    assert words in str(caught.value) and words in " ".join(TUTORIAL.split())


@pytest.mark.skipif(shutil.which("g++") is None, reason="the chapter runs the host emulation, which needs g++")
@pytest.mark.emulation  # compiles with g++
def test_the_tutorials_beyond_gemm_chapter_emulates_its_softmax(tmp_path, monkeypatch, capsys):
    run_beyond_gemm(tmp_path, monkeypatch, capsys, emulate=True)


def attention_chapter() -> list[tuple[str, str]]:
    """The fenced blocks of the tutorial's chapter "Attention", in order: (language, body)."""
    chapter = TUTORIAL.split("## 13. Attention\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", chapter, re.S)


def test_the_tutorials_attention_chapter_shows_the_example_and_the_schedule_as_they_are():
    from spatialc import attention
    from spatialc.ir.printer import program_text
    from spatialc.passes.attention import apply_attention_plan, place_attention, plan_attention, schedule_attention
    from spatialc.target import target

    blocks = attention_chapter()
    [excerpt] = [body for lang, body in blocks if lang == "python" and body.startswith(" ")]
    assert excerpt in (ROOT / "examples" / "attention.py").read_text(), "the chapter's excerpt is not the example's"
    # The schedule it shows is the planner's (built unverified here: the text block's lines do not say verified).
    t = target("sm_90")
    p = attention(1, 4, 128, 200, 32, kv_heads=2, causal=True)
    p = schedule_attention(place_attention(apply_attention_plan(p, plan_attention(p, t, (4, 4), None)), t, 2))
    printed = program_text(p, sites=1).splitlines()
    [shown] = [body for lang, body in blocks if lang == "text"]
    missing = [line for line in shown.splitlines() if line.strip() != "..." and line not in printed]
    assert not missing, f"the chapter shows lines the program does not print: {missing}"
    assert "](images/attention-timeline.svg)" in TUTORIAL


def _attention_runs() -> bool:
    import numpy as np

    import spatialc

    try:
        p = spatialc.build(spatialc.attention(1, 1, 16, 16, 16))
        spatialc.evaluate(p, {n: np.zeros((16, 16), np.float32) for n in ("q", "k", "v")})
    except spatialc.SpatialError:
        return False
    return True


@pytest.mark.skipif(not _attention_runs(), reason="needs rule 8's proof of attention and the interpreter's run of it")
def test_the_tutorials_attention_chapter_runs_and_draws_its_picture(tmp_path, monkeypatch, capsys):
    from spatialc.cli import main

    monkeypatch.chdir(tmp_path)
    [program] = [body for lang, body in attention_chapter() if lang == "python" and not body.startswith(" ")]
    exec(compile(program, "docs/tutorial.md", "exec"), {})
    [bash] = [body for lang, body in attention_chapter() if lang == "bash"]
    assert main(shlex.split(bash.strip())[1:]) == 0
    drawn = (tmp_path / "attention_pictures" / "timeline.svg").read_text()
    assert drawn == (ROOT / "docs" / "images" / "attention-timeline.svg").read_text(), (
        "docs/images/attention-timeline.svg is not what the chapter draws: regenerate it with"
        " `spatialc attention 1 1 32 128 16 --causal --block 2,2 --pictures DIR` and copy DIR/timeline.svg"
    )

"""The embedded language (spatialc.lang): programs written in Python traced to the IR, equal to what build makes,
run like any program, and refused at the user's own lines."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc import lang
from spatialc.errors import IllFormedError, SemanticError, UnbalancedError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def line_of(path: Path, text: str, after: str = "") -> int:
    """The 1-based line of the first `text` in `path` (after the first line holding `after`)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines) if i >= start and text in line) + 1


def ints(m: int, n: int, k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"A": rng.integers(-4, 5, (m, k)).astype(np.float32), "B": rng.integers(-4, 5, (k, n)).astype(np.float32)}


def test_the_gemm_written_by_hand_is_the_built_one_op_for_op():
    traced = example("gemm_by_hand").gemm()
    built = spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90", sites=1)
    assert traced.verified and traced == built


def test_a_traced_program_evaluates_and_lowers_like_a_built_one():
    program = example("gemm_by_hand").gemm(m=96, n=128, k=128)  # 3 × 2 items on one site, two K steps
    x = ints(96, 128, 128)
    assert np.array_equal(spatialc.evaluate(program, x), x["A"] @ x["B"])
    art = spatialc.lower(program)
    assert art.census.agrees


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_a_traced_program_runs_under_the_emulation():
    program = example("gemm_by_hand").gemm()
    x = ints(64, 64, 64)
    assert np.array_equal(spatialc.emulate(spatialc.lower(program), x, timeout=120), x["A"] @ x["B"])


def test_a_ring_one_page_too_shallow_deadlocks_at_the_users_lines():
    module = example("shallow_ring")
    assert module.pipeline(a_depth=module.STEPS).verified
    with pytest.raises(spatialc.DeadlockError) as caught:
        module.pipeline(a_depth=module.STEPS - 1)
    path = EXAMPLES / "shallow_ring.py"
    where = {
        "reader": line_of(path, "with a_ring.reserve() as page:"),
        "compute": line_of(path, "a, b = a_ring.wait(), b_ring.wait()"),
        "writer": line_of(path, "with c_ring.wait() as page:"),
    }
    for engine, line in where.items():
        assert f"{path}:{line}: site 0 {engine}:" in str(caught.value), str(caught.value)
    assert len(caught.value.lines) == 3  # type: ignore[attr-defined]


def small(
    p: lang.Builder,
    forget_push: bool = False,
    read_waited: bool = False,
    branch: bool = False,
    compare: bool = False,
    two_pages: bool = False,
    ill: str = "",
):
    """One site copies A (one tile row) to C through a ring: the smallest program, with a fault where asked."""
    A = p.input("A", 16, 16 * 4)
    C = p.output("C", 16, 16 * 4, dtype="bf16")
    ring = p.ring("ring", depth=2, tiles=1)
    p.read("read_A", A, ring)
    p.write("write_C", ring, C)
    if ill == "plan":
        p.plan(block=(1, 1), grid=(1, 4), k_tiles=1, depth=2)  # a block of two numbers
    p.plan(block=(1, 1, 1), grid=(1, 4), k_tiles=1, depth=2)
    if ill == "place":
        p.place("ab")  # type: ignore[arg-type]  # a string for the sites' item lists
    p.place([[0, 1, 2, 3]])

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            if branch and item.x:
                pass
            if compare and item.x == 0:
                pass
            if two_pages:
                ring.reserve()
            page = ring.reserve() if ill != "pages" else ring.reserve(1.0)  # type: ignore[arg-type]
            if ill == "float":
                page.read(A, item.x + 0.5, 1, 1)  # type: ignore[operator]  # a tile address of a float
            if ill == "strides":
                page.read(A, item.x, 1, 1, strides=(4,))  # type: ignore[arg-type]  # one stride of two
            page.read(A, item.x, 1, 1)
            if not forget_push:
                page.push()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with ring.wait() as page:
                if read_waited:
                    page.read(A, item.x, 1, 1)
                page.write(C, item.x, 1, 1)


def test_a_missing_push_is_refused_by_verify_at_the_loop_it_unbalances():
    traced = lang.trace(small, name="copy", forget_push=True)
    with pytest.raises(UnbalancedError) as caught:
        traced.verify()
    here = Path(__file__)
    loop = line_of(here, "for item in e.items():", "def small")  # the reader's: each pass leaves a page unpushed
    assert f"{here}:{loop}: site 0 reader: Loop item < 4:" in str(caught.value), str(caught.value)
    assert "unpushed" in str(caught.value)


@pytest.mark.parametrize(
    ("ill", "statement", "words"),
    [
        ("float", "page.read(A, item.x + 0.5, 1, 1)", "adds whole numbers and addresses only, not float"),
        ("strides", "page.read(A, item.x, 1, 1, strides=(4,))", "ValueError: not enough values to unpack"),
        ("place", 'p.place("ab")', "p.place takes a list of each site's item list, not 'ab'"),
        ("plan", "p.plan(block=(1, 1), grid=(1, 4)", "p.plan's block is 3 whole numbers, not (1, 1)"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_at_the_users_line(ill, statement, words):
    """A float address, one stride for two, a string for the item lists, a block of two numbers: raw TypeError /
    ValueError from inside the tracer before; a LangError at the user's statement now."""
    here = Path(__file__)
    with pytest.raises(lang.LangError) as caught:
        lang.trace(small, name="copy", ill=ill)
    assert caught.value.file == str(here) and caught.value.line == line_of(here, statement), str(caught.value)
    assert words in str(caught.value), str(caught.value)


def test_an_op_of_an_ill_typed_field_is_refused_by_verify_at_the_users_line():
    """A float page count reaches the IR (the tracer passes it on); rule 1's type check names the op, so the error
    carries the user's line of it."""
    here = Path(__file__)
    with pytest.raises(IllFormedError) as caught:
        lang.trace(small, name="copy", ill="pages").verify()
    line = line_of(here, 'page = ring.reserve() if ill != "pages" else ring.reserve(1.0)')
    assert f"{here}:{line}: site 0 reader: Reserve" in str(caught.value), str(caught.value)
    assert "Reserve.pages: expected a whole number, found 1.0" in str(caught.value)


def test_an_error_of_the_users_own_code_passes_through_the_tracer_as_it_is():
    def mine(p: lang.Builder):
        return {}["no such key"]

    with pytest.raises(KeyError):
        lang.trace(mine)

    def my_type_error(p: lang.Builder):
        return len(3)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="has no len"):
        lang.trace(my_type_error)


def test_what_cannot_be_traced_is_refused_at_its_line():
    here = Path(__file__)
    with pytest.raises(lang.LangError) as caught:
        lang.trace(small, name="copy", read_waited=True)
    assert caught.value.file == str(here) and caught.value.line == line_of(
        here, "page.read(A, item.x, 1, 1)", "if read_waited"
    )
    assert "read into a page of ring this engine waited for" in str(caught.value)
    with pytest.raises(lang.LangError) as caught:
        lang.trace(small, name="copy", branch=True)
    assert caught.value.line == line_of(here, "if branch and item.x:")
    assert "no value while the program is traced" in str(caught.value)
    with pytest.raises(lang.LangError) as caught:
        lang.trace(small, name="copy", compare=True)
    assert caught.value.line == line_of(here, "if compare and item.x == 0:")
    assert "cannot be compared" in str(caught.value)
    with pytest.raises(lang.LangError) as caught:
        lang.trace(small, name="copy", two_pages=True)
    assert caught.value.line == line_of(here, "page = ring.reserve()", "if two_pages")
    assert "a second page of ring reserved while this engine holds one" in str(caught.value)


def test_a_program_rule_8_cannot_state_is_refused_by_name():
    # A copy with no matmul is balanced and deadlock-free, but the semantic rule proves GEMM pipelines only: it says
    # so rather than pass a program whose result it cannot state.
    with pytest.raises(spatialc.errors.StrongerCheckNeeded, match="rule 8"):
        lang.trace(small, name="copy").verify()


@pytest.mark.parametrize("steps", [1, 2])
def test_the_multicast_gemm_written_by_hand_is_the_built_one(steps):
    traced = example("multicast_gemm").multicast_gemm(steps=steps)
    built = spatialc.build(
        spatialc.gemm(32, 128, 64 * steps, "bf16"), "sm_90", multicast=(1, 2), block=(2, 4, 4), depth=2
    )
    assert traced.verified and dataclasses.replace(traced, name=built.name) == built
    x = ints(32, 128, 64 * steps)
    assert np.array_equal(spatialc.evaluate(traced, x), x["A"] @ x["B"])


def test_a_receiver_that_never_says_its_page_is_free_deadlocks_the_sender_at_its_wait():
    with pytest.raises(spatialc.DeadlockError) as caught:
        example("multicast_gemm").multicast_gemm(receiver_ready=False)
    path = EXAMPLES / "multicast_gemm.py"
    wait = line_of(path, "e.sem_wait(a_ready, 1)")
    assert f"{path}:{wait}: site 0 reader: SemWait sem1 >= 1" in str(caught.value), str(caught.value)


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_the_multicast_gemm_runs_as_a_cluster_under_the_emulation():
    program = example("multicast_gemm").multicast_gemm(steps=2)
    art = spatialc.lower(program)
    assert art.launch.cluster == 2
    x = ints(32, 128, 128)
    assert np.array_equal(spatialc.emulate(art, x, timeout=120), x["A"] @ x["B"])


def test_the_deadlock_picture_names_the_users_lines(tmp_path):
    from spatialc.viz import write_deadlock

    module = example("shallow_ring")
    traced = module.pipeline.trace(a_depth=module.STEPS - 1)
    with pytest.raises(spatialc.DeadlockError) as caught:
        traced.verify()
    svg = write_deadlock(tmp_path, traced.program, caught.value).read_text()
    reserve = line_of(EXAMPLES / "shallow_ring.py", "with a_ring.reserve() as page:")
    assert f"Reserve A_ring (shallow_ring.py:{reserve})" in svg


TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def tutorial_program(blocks_wanted: int = 5) -> str:
    """The tutorial's program as a newcomer would type it: its first Python blocks, one after another (the first
    five: the program and its check; the sixth: its pictures)."""
    blocks, inside, block = [], False, []
    for line in TUTORIAL.read_text().splitlines():
        if line.strip() == "```python":
            inside, block = True, []
        elif line.strip() == "```" and inside:
            inside = False
            blocks.append("\n".join(block))
        elif inside:
            block.append(line)
    return "\n".join(blocks[:blocks_wanted])


def test_the_tutorials_program_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "my_gemm.py"
    path.write_text(tutorial_program(6))
    scope: dict[str, object] = {}
    exec(compile(path.read_text(), str(path), "exec"), scope)  # its asserts check C against numpy
    assert (tmp_path / "pictures" / "placement.svg").exists() and (tmp_path / "pictures" / "timeline.svg").exists()
    program = scope["program"]
    built = spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90", sites=1)
    # The same program but for its name and its placement's rule: the tutorial's lists the items (contiguous),
    # build's says they follow the grouped rule (the same list on one site).
    assert program.placement.items_of_site == built.placement.items_of_site  # type: ignore[attr-defined]
    assert dataclasses.replace(program, name=built.name, placement=built.placement) == built  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("old", "new", "error", "engine"),
    [
        ("page.write(C, 2 * b_cols * item.y + 4 * item.x, 2, 4)", "page.write(C, 4 * item.x, 2, 4)", "SemanticError",
         "writer: WriteTiles C_ring"),
        ("2 * a_cols * item.y + 4 * kk", "2 * a_cols * item.y + 4 * kk + 1", "TileBoundsError", "reader: ReadTiles A"),
    ],
)  # fmt: skip
def test_the_tutorials_wrong_addresses_are_refused_at_their_lines(tmp_path, old, new, error, engine):
    path = tmp_path / "my_gemm.py"
    path.write_text(tutorial_program().replace(old, new))
    with pytest.raises(spatialc.VerifyError) as caught:
        exec(compile(path.read_text(), str(path), "exec"), {})
    assert type(caught.value).__name__ == error
    assert f"{path}:{line_of(path, new)}: site 0 {engine}" in str(caught.value), str(caught.value)


def built_programs():
    from spatialc import ew
    from spatialc.frontend import bias, relu, requant

    x, y = ew.inputs(2)

    gemm = spatialc.gemm
    return {
        "one site": lambda: spatialc.build(gemm(64, 64, 64, "bf16"), "sm_90", sites=1),
        "odd sizes, many sites": lambda: spatialc.build(gemm(200, 136, 100, "fp16"), "sm_90"),
        "bias and relu": lambda: spatialc.build(gemm(64, 64, 64, "bf16", epilogue=[bias(), relu()]), "sm_90", sites=1),
        "int8 requant": lambda: spatialc.build(gemm(129, 250, 190, "int8", epilogue=[bias(), requant(0.01)]), "sm_90"),
        "multicast": lambda: spatialc.build(gemm(64, 256, 128, "bf16"), "sm_90", multicast=(1, 2), block=(2, 4, 4)),
        "sm_90a": lambda: spatialc.build(gemm(300, 260, 200, "bf16"), "sm_90a"),
        "split-K": lambda: spatialc.build(gemm(32, 64, 2048, "bf16"), "sm_90", split_k=4),
        "grouped": lambda: spatialc.build(spatialc.grouped_gemm(4, 64, 64, 64, "bf16"), "sm_90"),
        "grouped, odd": lambda: spatialc.build(spatialc.grouped_gemm(3, 100, 72, 40, "int8"), "sm_90"),
        "softmax": lambda: spatialc.build(spatialc.softmax(64, 128, "bf16"), "sm_90", block=(2, 4, 1), sites=2),
        "rmsnorm, odd": lambda: spatialc.build(spatialc.rmsnorm(100, 300, "fp16", eps=1e-5), "sm_90", sites=3),
        "rmsnorm, no weight": lambda: spatialc.build(spatialc.rmsnorm(32, 64, weight=False), "sm_90"),
        "elementwise": lambda: spatialc.build(spatialc.elementwise(
            ew.where(x > 0.0, x, -0.5 * x) * ew.sigmoid(y) - ew.pow(2.0, ew.clamp(y, lo=-1.0, hi=1.0)) / y ** 2.0
            + ew.col("b"),
            40, 100, "fp16"), "sm_90"),
        "elementwise, int8": lambda: spatialc.build(spatialc.elementwise(abs(x) - ew.relu(-y) + 3.0, 32, 32, "int8"),
                                                    "sm_90"),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(built_programs()))
def test_a_program_printed_as_python_traces_back_to_itself(case):
    from spatialc.lang.source import python_source

    program = built_programs()[case]()
    scope: dict[str, object] = {}
    exec(compile(python_source(program), f"<{case}>", "exec"), scope)
    assert scope["program"]() == program  # type: ignore[operator]


def test_show_python_prints_a_saved_program_as_source_and_refuses_what_the_language_lacks(tmp_path, capsys):
    from spatialc.cli import main

    saved = tmp_path / "gemm.json"
    saved.write_text(spatialc.to_json(built_programs()["bias and relu"]()))
    assert main(["show", "--python", str(saved)]) == 0
    source = capsys.readouterr().out
    assert "@lang.program(" in source and "e.compute(Bias(" in source
    # An accumulating pack (a page added onto, which build never makes) has no form in the language.
    from spatialc.ir.nodes import Engine
    from spatialc.ir.ops import PackAcc

    from ..rewrite import replace

    program = built_programs()["one site"]()
    adding = replace(program, Engine.COMPUTE, lambda op: (dataclasses.replace(op, accumulate=True),) if isinstance(
        op, PackAcc) else None)  # fmt: skip
    odd = tmp_path / "adding.json"
    odd.write_text(spatialc.to_json(adding))
    assert main(["show", "--python", str(odd)]) == 2  # verified first: verify refuses it, in one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "it adds onto a page that does not hold an accumulator" in err
    from spatialc.lang.source import python_source

    with pytest.raises(lang.LangError, match="the op PackAcc has no form in spatialc.lang yet"):
        python_source(adding)  # and the printer itself, handed it unverified, refuses it by name


def test_split_k_written_by_hand_is_the_built_one_and_sums_both_halves():
    traced = example("split_k").split_k()
    built = spatialc.build(spatialc.gemm(32, 64, 256, "bf16"), "sm_90", split_k=2, block=(2, 4, 4), depth=2)
    assert traced.verified and dataclasses.replace(traced, name=built.name) == built
    x = ints(32, 64, 256)
    assert np.array_equal(spatialc.evaluate(traced, x), x["A"] @ x["B"])


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_split_k_written_by_hand_runs_under_the_emulation():
    program = example("split_k").split_k()
    x = ints(32, 64, 256)
    assert np.array_equal(spatialc.emulate(spatialc.lower(program), x, timeout=120), x["A"] @ x["B"])


def test_an_error_about_the_plan_names_the_plan_line(tmp_path):
    path = tmp_path / "my_gemm.py"
    path.write_text(tutorial_program().replace("program = my_gemm()", "program = my_gemm(m=48)"))
    with pytest.raises(spatialc.VerifyError) as caught:
        exec(compile(path.read_text(), str(path), "exec"), {})
    assert f"{path}:{line_of(path, 'p.plan(')}: the plan" in str(caught.value), str(caught.value)


def test_a_program_the_persistent_kernel_cannot_serialise_lowers_in_the_general_form():
    module = example("shallow_ring")
    art = spatialc.lower(module.pipeline(a_depth=module.STEPS))  # its reader runs all of A ahead of B
    assert art.budget.form == "general"
    assert any("the general form, as the persistent kernel refuses" in n for n in art.notes)


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_the_pipeline_with_its_deep_ring_runs_under_the_emulation():
    module = example("shallow_ring")
    program = module.pipeline(a_depth=module.STEPS)
    x = ints(32, 64, 64 * module.STEPS)
    assert np.array_equal(spatialc.emulate(spatialc.lower(program), x, timeout=120), x["A"] @ x["B"])


def test_a_grouped_gemm_written_with_run_time_row_counts_runs_each_groups_rows():
    from spatialc.lang.source import python_source

    built = spatialc.build(spatialc.grouped_gemm(3, 100, 72, 40, "bf16"), "sm_90")
    scope: dict[str, object] = {}
    exec(compile(python_source(built), "<grouped>", "exec"), scope)
    program = scope["program"]()  # type: ignore[operator]
    assert "e.range_from(sizes, e.item.y" in python_source(built)
    rng = np.random.default_rng(5)
    x = {"A": rng.integers(-4, 5, (3, 100, 40)), "B": rng.integers(-4, 5, (3, 40, 72)), "sizes": [100, 37, 0]}
    c = spatialc.evaluate(program, x)
    want = np.einsum("gmk,gkn->gmn", x["A"], x["B"]).astype(np.float32)
    for g, rows in enumerate(x["sizes"]):
        want[g, rows:] = 0
    assert np.array_equal(c, want)


def barrier_gemm(p: lang.Builder, wait: bool = True, group: tuple[int, ...] = (0, 1)):
    """Two sites, one item each; every writer waits at a barrier of both sites after its write."""
    A, B, C = p.input("A", 64, 64), p.input("B", 64, 64), p.output("C", 64, 64)
    a_ring = p.ring("A_ring", depth=2, tiles=8, layout="swizzled")
    b_ring = p.ring("B_ring", depth=2, tiles=16, layout="swizzled")
    acc, c_ring = p.accumulator("acc", tiles=8), p.ring("C_ring", depth=2, tiles=8)
    p.read("read_A", A, a_ring)
    p.read("read_B", B, b_ring)
    mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4))
    p.write("write_C", c_ring, C)
    p.plan(block=(2, 4, 4), grid=(2, 1), k_tiles=4, depth=2)
    p.place([[0], [1]])
    both = p.group(list(group))

    @p.reader
    def read(e: lang.Engine):
        with a_ring.reserve() as page:
            page.read(A, 8 * e.item.y, 2, 4)
        with b_ring.reserve() as page:
            page.read(B, 0, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        acc.acquire()
        with a_ring.wait() as a, b_ring.wait() as b:
            acc.matmul(mm, a, b)
        with c_ring.reserve() as page:
            acc.pack(page)
        acc.release()

    @p.writer
    def write(e: lang.Engine):
        with c_ring.wait() as page:
            page.write(C, 8 * e.item.y, 2, 4)
        if wait or e.site == 0:
            e.barrier(both)


def test_a_group_barrier_is_traced_and_one_site_skipping_it_deadlocks_at_its_line():
    program = lang.trace(barrier_gemm).verify()
    x = ints(64, 64, 64)
    assert np.array_equal(spatialc.evaluate(program, x), x["A"] @ x["B"])
    from spatialc.lang.source import python_source

    assert "e.barrier(group0)" in python_source(program)
    with pytest.raises(spatialc.VerifyError) as caught:
        lang.trace(barrier_gemm, wait=False).verify()
    text = str(caught.value)
    here = Path(__file__).resolve()
    assert f"{here}:{line_of(here, 'e.barrier(both)')}:" in text, text


def test_a_forgotten_pop_names_both_loops_it_unbalances(tmp_path):
    source = (EXAMPLES / "gemm_by_hand.py").read_text()
    assert source.count("                a.pop()\n") == 1
    path = tmp_path / "no_pop.py"
    path.write_text(source.replace("                a.pop()\n", ""))
    scope: dict[str, object] = {"__name__": "no_pop"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    with pytest.raises(UnbalancedError) as caught:
        scope["gemm"]()  # type: ignore[operator]
    text = str(caught.value)
    reader = line_of(path, 'for kk in e.range(steps, "k"):', "def read")
    compute = line_of(path, 'for kk in e.range(steps, "k"):', "def multiply")
    assert f"{path}:{reader}: site 0 reader: Loop k" in text and f"{path}:{compute}: site 0 compute: Loop k" in text, (
        text
    )


def test_an_address_missing_its_row_step_is_refused_at_its_line_with_a_tile_it_lands_on(tmp_path):
    source = (EXAMPLES / "gemm_by_hand.py").read_text()
    old, new = "page.read(B, 4 * b_cols * kk + 4 * item.x, 4, 4)", "page.read(B, 4 * kk + 4 * item.x, 4, 4)"
    path = tmp_path / "no_row_step.py"
    path.write_text(source.replace(old, new))
    scope: dict[str, object] = {"__name__": "no_row_step"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    with pytest.raises(spatialc.errors.StrongerCheckNeeded) as caught:
        scope["gemm"](m=96, n=128, k=128)  # type: ignore[operator]
    text = str(caught.value)
    assert "e.g. at item_x(item) 1, k 1: tile 8 is (1, 0) of B, not column 8 of row 0" in text, text
    assert "is a row step missing?" in text and f"{path}:{line_of(path, new)}: site 0 reader: ReadTiles B" in text


def test_the_interpreter_running_the_shallow_ring_deadlocks_at_the_same_lines():
    # Run as traced, past verify: the interpreter meets the deadlock verify predicts, at the same three lines.
    module = example("shallow_ring")
    traced = module.pipeline.trace(a_depth=module.STEPS - 1)
    x = {t.name: np.ones(t.elems, np.float32) for t in traced.program.tensors if t.role.value == "input"}
    with pytest.raises(spatialc.DeadlockError) as caught:
        traced.evaluate(x)
    path = EXAMPLES / "shallow_ring.py"
    assert len(caught.value.lines) == 3  # type: ignore[attr-defined]
    for engine, text in (("reader", "with a_ring.reserve() as page:"), ("writer", "with c_ring.wait() as page:")):
        assert f"{path}:{line_of(path, text)}: site 0 {engine}:" in str(caught.value), str(caught.value)


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_an_emulation_hang_names_the_users_lines_of_the_waits_it_hangs_in():
    # A kernel whose compute warps never free A's pages (a planted fault): the reader hangs in its Reserve of
    # A_ring and the compute warps in their Waits for pages that never come.
    traced = example("gemm_by_hand").gemm.trace(m=96, n=128, k=128)  # 12 pages of A through a ring of 2
    art = spatialc.lower(traced.verify(), form="general")
    free = "spatialc_mbar_arrive(&empty_0[pop_0 % DEPTH_0]); ++pop_0;"
    assert art.program_cu.count(free) == 1
    broken = dataclasses.replace(art, program_cu=art.program_cu.replace(free, "++pop_0;"))
    from spatialc.runtime.emulate import EmulationDeadlock

    with pytest.raises(EmulationDeadlock) as caught:
        traced.emulate(ints(96, 128, 128), artifact=broken, timeout=60)
    path = EXAMPLES / "gemm_by_hand.py"
    text = str(caught.value)
    assert f"{path}:{line_of(path, 'with a_ring.reserve() as page:')}: site 0 reader: Reserve A_ring" in text, text
    assert "waits on empty_0[" in text  # the emulator's own words are kept


@pytest.mark.parametrize(
    ("old", "new", "says", "line"),
    [
        ("acc.matmul(mm, a, b)", "acc.matmul(mm, a, b_ring)",
         "operand B of a matmul is a page (ring.reserve() or ring.wait()), not ring B_ring — wait for a page", None),
        ("acc.matmul(mm, a, b)", 'acc.matmul("matmul", a, b)', "the first argument of a matmul is a stage", None),
        ("page.read(A, 2 * a_cols", 'page.read("A", 2 * a_cols', "the tensor a page reads is a tensor", None),
        ("2 * a_cols * item.y + 4 * kk", "2 * a_cols * item.y + kk // 1 * 4", "a loop variable cannot be divided",
         None),
        ('acc = p.accumulator("acc", tiles=2 * 4)', 'acc = p.accumulator("acc", tiles=8.0)',
         "accumulator acc's tiles is a whole number of at least 1, not 8.0", None),
        ("    @p.writer", "    @p.reader", "a second reader engine for site 0", "def write(e: lang.Engine):"),
        ('target="sm_90", precision="bf16"', 'target="sm90", precision="bf16"', "target 'sm90' (", None),
        ('target="sm_90", precision="bf16"', 'target="sm_90", precision="float64"', "precision 'float64'", None),
        ('target="sm_90", precision="bf16"', 'target="sm_90", precision="float32"',
         "matmul matmul: a tile matmul takes no float32 operands", 'mm = p.matmul("matmul", a_ring,'),
    ],
    ids=["a ring for a page", "a stage's name for the stage", "a tensor's name for the tensor", "a divided loop",
         "fractional tiles", "two readers", "an unknown target", "an unknown precision", "a float32 matmul"],
)  # fmt: skip
def test_what_a_newcomer_gets_wrong_is_refused_at_its_line(tmp_path, old, new, says, line):
    source = (EXAMPLES / "gemm_by_hand.py").read_text()
    assert source.count(old) == 1
    path = tmp_path / "mine.py"
    path.write_text(source.replace(old, new))
    with pytest.raises(lang.LangError) as caught:
        scope: dict[str, object] = {"__name__": "mine"}
        exec(compile(path.read_text(), str(path), "exec"), scope)
        scope["gemm"]()  # type: ignore[operator]
    assert says in str(caught.value), str(caught.value)
    want = line_of(path, line if line is not None else new.strip().split("\n")[-1])
    # (a decorator's refusal is at the decorator, the line before its function's)
    assert caught.value.file == str(path) and caught.value.line in (want - 1, want, want + 1), (caught.value.line, want)


def test_a_matmul_given_pages_of_another_stage_is_refused_at_its_line(tmp_path):
    source = (EXAMPLES / "mlp.py").read_text()
    old = "acc2.matmul(layer2, g, w2)"
    assert source.count(old) == 1
    path = tmp_path / "mlp.py"
    path.write_text(source.replace(old, "acc2.matmul(layer1, g, w2)"))
    scope: dict[str, object] = {"__name__": "mine"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    with pytest.raises(lang.LangError, match="stage layer1 multiplies pages of X_ring and W1_ring; these are of"):
        scope["mlp"]()  # type: ignore[operator]


def test_a_bias_may_name_its_tile_column_with_loop_variables(tmp_path):
    from spatialc.lang.source import python_source

    program = spatialc.build(spatialc.gemm(64, 64, 64, "bf16", epilogue=[spatialc.bias()]), "sm_90", sites=1)
    source = python_source(program)
    printed = "at=TileAddr(base=0, steps=((LoopVar(2), 4),))"  # item_x's 4 tiles a step, as the IR spells it
    assert source.count(printed) == 1
    scope: dict[str, object] = {}
    exec(compile(source.replace(printed, "at=4 * item.x"), "<bias>", "exec"), scope)
    assert scope["program"]() == program  # type: ignore[operator]


def epilogue_gemm(p: lang.Builder, n: int = 64):
    """The tutorial's epilogue (section 8) on its GEMM: relu(A @ B + bias)."""
    from spatialc.ir.ops import Bias, Relu

    A, B, C = p.input("A", 64, 64), p.input("B", 64, n), p.output("C", 64, n)
    bias = p.parameter("bias", 1, n)
    a_ring = p.ring("A_ring", depth=2, tiles=8, layout="swizzled")
    b_ring = p.ring("B_ring", depth=2, tiles=16, layout="swizzled")
    acc, c_ring = p.accumulator("acc", tiles=8), p.ring("C_ring", depth=2, tiles=8)
    packed = p.ring("packed", depth=2, tiles=8, kind="interm")
    biased = p.ring("biased", depth=2, tiles=8, kind="interm")
    p.read("read_A", A, a_ring)
    p.read("read_B", B, b_ring)
    mm = p.matmul("matmul", a_ring, b_ring, packed, block=(2, 4, 4))
    p.elementwise("add_bias", Bias(bias.id), packed, biased)
    p.elementwise("relu", Relu(), biased, c_ring)
    p.write("write_C", c_ring, C)
    grid = (2, n // 64)
    p.plan(block=(2, 4, 4), grid=grid, k_tiles=4, depth=2)
    p.place([list(range(grid[0] * grid[1]))])

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            with a_ring.reserve() as page:
                page.read(A, 8 * item.y, 2, 4)
            with b_ring.reserve() as page:
                page.read(B, 4 * item.x, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        for item in e.items():
            acc.acquire()
            a, b = a_ring.wait(), b_ring.wait()
            acc.matmul(mm, a, b)
            a.pop()
            b.pop()
            with packed.reserve() as page:
                acc.pack(page)
            acc.release()
            with packed.wait() as src, biased.reserve() as dst:
                e.compute(Bias(bias.id, 4 * item.x, 4), src, dst)
            with biased.wait() as src, c_ring.reserve() as dst:
                e.compute(Relu(), src, dst)

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with c_ring.wait() as page:
                page.write(C, 2 * (n // 16) * item.y + 4 * item.x, 2, 4)


def test_the_tutorials_epilogue_computes_relu_of_the_product_plus_the_bias():
    program = lang.trace(epilogue_gemm, n=128).verify()
    rng = np.random.default_rng(3)
    x = ints(64, 128, 64) | {"bias": rng.integers(-40, 40, 128).astype(np.float32)}
    assert np.array_equal(spatialc.evaluate(program, x), np.maximum(x["A"] @ x["B"] + x["bias"], 0))


def two_readers(p: lang.Builder, rows: int = 2, k: int = 128):
    """A GEMM whose A and B are read by two engines: the reader reads A, a mover (a further data-movement engine)
    reads B. Items of `rows` × 4 tiles."""
    m, n = 16 * rows * 2, 64
    A, B, C = p.input("A", m, k), p.input("B", k, n), p.output("C", m, n)
    a_ring = p.ring("A_ring", depth=2, tiles=rows * 4, layout="swizzled")
    b_ring = p.ring("B_ring", depth=2, tiles=16, layout="swizzled")
    acc, c_ring = p.accumulator("acc", tiles=rows * 4), p.ring("C_ring", depth=2, tiles=rows * 4)
    p.read("read_A", A, a_ring)
    p.read("read_B", B, b_ring, engine="mover")
    mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(rows, 4, 4))
    p.write("write_C", c_ring, C)
    p.plan(block=(rows, 4, 4), grid=(2, 1), k_tiles=k // 16, depth=2)
    p.place([[0, 1]])
    a_cols, steps = k // 16, k // 64

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for kk in e.range(steps, "k"):
                with a_ring.reserve() as page:
                    page.read(A, rows * a_cols * item.y + 4 * kk, rows, 4)

    @p.mover
    def read_b(e: lang.Engine):
        for _ in e.items():
            for kk in e.range(steps, "k"):
                with b_ring.reserve() as page:
                    page.read(B, 16 * kk, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        for _ in e.items():
            acc.acquire()
            for _ in e.range(steps, "k"):
                a, b = a_ring.wait(), b_ring.wait()
                acc.matmul(mm, a, b)
                a.pop()
                b.pop()
            with c_ring.reserve() as page:
                acc.pack(page)
            acc.release()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with c_ring.wait() as page:
                page.write(C, rows * 4 * item.y, rows, 4)


def test_a_fourth_engine_moves_data_beside_the_reader_and_is_pictured_and_printed(tmp_path):
    from spatialc.lang.source import python_source
    from spatialc.viz import timeline_svg

    program = lang.trace(two_readers).verify()
    assert sorted({q.engine.value for q in program.schedule.programs}) == ["compute", "mover", "reader", "writer"]
    x = ints(64, 64, 128)
    c, trace = spatialc.evaluate(program, x, trace=True)
    assert np.array_equal(c, x["A"] @ x["B"])
    assert ">mover<" in timeline_svg(trace)  # its own lane
    source = python_source(program)
    scope: dict[str, object] = {}
    exec(compile(source, "<two readers>", "exec"), scope)
    assert "@p.mover(" in source and scope["program"]() == program  # type: ignore[operator]


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_a_fourth_engine_runs_on_warps_of_its_own_in_every_form():
    program = lang.trace(two_readers).verify()
    x = ints(64, 64, 128)
    for form in ("persistent", "general"):
        art = spatialc.lower(program, form=form)
        assert np.array_equal(spatialc.emulate(art, x, timeout=120), x["A"] @ x["B"]), form
    assert ("mover", 1) in spatialc.lower(program, form="general").budget.engines
    hopper = lang.trace(two_readers, name="two_readers_sm90a", target="sm_90a", rows=8).verify()
    y = ints(256, 64, 128)
    assert np.array_equal(spatialc.emulate(spatialc.lower(hopper), y, timeout=120), y["A"] @ y["B"])


@pytest.mark.parametrize(
    ("old", "new", "error", "at"),
    [
        ("with a_ring.reserve() as page:", "with a_ring.reserve(3) as page:", "RingDepthError",
         "with a_ring.reserve(3) as page:"),
        ('p.place([list(range(grid[0] * grid[1]))], kind="grouped", band=1)', 'p.place([[0]], kind="grouped", band=1)',
         "CoverageError", "p.place([[0]]"),
        ('p.read("read_B", B, b_ring)', 'p.read("read_B", B, b_ring, engine="mover")', "RingOwnershipError",
         "with b_in.reserve() as page:"),
    ],
    ids=["an overrun", "an item on no site", "a ring filled by another engine than its stage says"],
)  # fmt: skip
def test_each_rules_error_points_at_the_users_line(tmp_path, old, new, error, at):
    source = (EXAMPLES / "gemm_by_hand.py").read_text()
    assert source.count(old) == 1
    path = tmp_path / "mine.py"
    path.write_text(source.replace(old, new))
    scope: dict[str, object] = {"__name__": "mine"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    with pytest.raises(spatialc.VerifyError) as caught:
        scope["gemm"](m=96, n=128, k=128)  # type: ignore[operator]
    assert type(caught.value).__name__ == error
    assert f"{path}:{line_of(path, at)}:" in str(caught.value), str(caught.value)


def test_an_error_about_a_group_or_a_stage_names_its_line():
    here = Path(__file__).resolve()
    with pytest.raises(spatialc.VerifyError) as caught:
        lang.trace(barrier_gemm, group=(0, 2)).verify()
    assert f"{here}:{line_of(here, 'both = p.group(list(group))')}: the group 0" in str(caught.value)
    source = (EXAMPLES / "gemm_by_hand.py").read_text()
    old = 'mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4))'
    scope: dict[str, object] = {"__name__": "mine"}
    exec(compile(source.replace(old, old.replace("(2, 4, 4)", "(4, 2, 4)")), "mine.py", "exec"), scope)
    with pytest.raises(spatialc.errors.SemanticError) as wrong:
        scope["gemm"]()  # type: ignore[operator]
    stage, plan = line_of(EXAMPLES / "gemm_by_hand.py", old), line_of(EXAMPLES / "gemm_by_hand.py", "p.plan(")
    assert f"mine.py:{stage}: the stage matmul" in str(wrong.value) and f"mine.py:{plan}: the plan" in str(wrong.value)


def test_a_declared_type_refusal_names_the_users_lines_of_the_tensor_and_the_stage():
    """rule 8's refusal of an operand of the wrong type named no line of the user's file."""

    @lang.program(target="sm_90", precision="bf16")
    def prog(p):
        a = p.input("A", 16, 16)
        b = p.input("B", 16, 16, dtype="int8")  # the line the refusal names first
        c = p.output("C", 16, 16)
        ra, rb = p.ring("ra", depth=1, tiles=1), p.ring("rb", depth=1, tiles=1)
        rc = p.ring("rc", depth=1, tiles=1)
        p.read("read_a", a, ra)
        p.read("read_b", b, rb)
        mm = p.matmul("mm", ra, rb, rc, block=(1, 1, 1))
        p.write("write_c", rc, c)
        acc = p.accumulator("acc", tiles=1)
        p.plan(block=(1, 1, 1), grid=(1, 1), k_tiles=1, depth=1)
        p.place([[0]])

        @p.reader
        def read(e):
            for _ in e.items():
                with ra.reserve() as page:
                    page.read(a, 0, 1, 1)
                with rb.reserve() as page:
                    page.read(b, 0, 1, 1)

        @p.compute
        def multiply(e):
            for _ in e.items():
                acc.acquire()
                x, y = ra.wait(), rb.wait()
                acc.matmul(mm, x, y)
                x.pop()
                y.pop()
                with rc.reserve() as page:
                    acc.pack(page)
                acc.release()

        @p.writer
        def write(e):
            for _ in e.items():
                with rc.wait() as page:
                    page.write(c, 0, 1, 1)

    with pytest.raises(SemanticError) as info:
        prog()
    here = __file__
    lines = str(info.value).splitlines()
    assert lines[0] == "tensor B holds int8 values, but the bf16 matmul stage mm reads it"
    assert lines[1].startswith(f"  {here}:") and lines[1].endswith(": the tensor B")
    assert lines[2].startswith(f"  {here}:") and lines[2].endswith(": the stage mm")

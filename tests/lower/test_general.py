"""The general CUDA form (lower/cuda/general/kernel.py): which form `spatialc.lower` picks, the kernel's shape and
ledger, programs only the general form takes run under the emulation, and planted faults in its ring barriers caught."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.frontend import bias, relu, requant, scalar
from spatialc.ir.ids import SemId
from spatialc.ir.nodes import Engine, Semaphore
from spatialc.ir.ops import SemSet
from spatialc.lower.cuda.common.host import write_artifact
from spatialc.lower.cuda.forms import UnknownForm
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.errors import NeedsGeneral, TooBig, Unsupported, Unverified
from spatialc.runtime.emulate import EmulationDeadlock, EmulationError, EmulationRace

from ..rewrite import edit

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

RNG = np.random.default_rng(11)
INPUTS = {
    "A": RNG.integers(-128, 128, (64, 64)).astype(np.int8),
    "B": RNG.integers(-128, 128, (64, 64)).astype(np.int8),
}


@pytest.fixture(scope="module")
def gemm64():
    """64³ int8 on sm_86: 2×2-tile items, two per site, depth-2 rings; the persistent kernel takes it."""
    return spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(2, 2, 1), depth=2, sites=2)


@pytest.fixture(scope="module")
def one_tile_epilogue():
    """An epilogue on one-tile blocks: no warp grid divides the block, so the persistent kernel cannot fuse it."""
    chain = [bias(), relu(), requant(0.004, -3)]
    return spatialc.build(spatialc.gemm(40, 48, 64, "int8", epilogue=chain), "sm_86", block=(1, 1, 1), sites=3)


# ---- which form ------------------------------------------------------------------------------------------------


def test_auto_prints_the_persistent_kernel_and_carries_the_general_form(gemm64):
    art = spatialc.lower(gemm64)
    assert art.budget.form == "persistent" and art.launch.kernel_name == "spatialc_persistent"
    gen = art.general
    assert gen is not None and gen.general is None
    assert gen.budget.form == "general" and gen.launch.kernel_name == "spatialc_general"
    assert "spatialc_general<<<" in gen.program_cu and "spatialc_general<<<" in gen.bench_cu
    # The same program, op for op: both censuses count the same ops and both agree with their texts.
    assert art.census.agrees and gen.census.agrees and gen.census.program == art.census.program
    assert gen.launch.params == art.launch.params and gen.launch.items == art.launch.items


def test_what_the_persistent_kernel_refuses_is_printed_in_general_form(one_tile_epilogue):
    with pytest.raises(NeedsGeneral, match="the general form prints it"):
        spatialc.lower(one_tile_epilogue, form="persistent")
    art = spatialc.lower(one_tile_epilogue)
    assert art.budget.form == "general" and art.general is None
    assert any("the persistent kernel refuses: cannot lower the epilogue" in n for n in art.notes)
    want = {"Map_add_x0_col": 1, "MatmulTiles": 1, "Map_relu_x0": 1, "Requant": 1}
    assert art.census.stages == want == art.census.printed_stages


def test_an_unknown_form_is_a_typed_error_and_a_cli_error(gemm64, tmp_path, capsys):
    with pytest.raises(UnknownForm, match="unknown CUDA form 'fast'; use one of auto, persistent, general"):
        spatialc.lower(gemm64, form="fast")
    path = tmp_path / "p.json"
    path.write_text(spatialc.to_json(gemm64))
    from spatialc.cli import main

    assert main(["lower", str(path), "--emit", str(tmp_path / "k"), "--form", "fast"]) == 2
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_what_the_general_form_does_not_print_yet_is_refused_by_name(gemm64):
    # A SemSet can lower a count, which verify's one counter run cannot decide: it refuses it, and the backend,
    # called on such a program directly, names it too.
    s = gemm64.evolve(semaphores=(Semaphore(SemId(0), "s"),), verified=False)
    p = edit(s, Engine.WRITER, lambda ops: (SemSet(SemId(0), 1), *ops))
    with pytest.raises(spatialc.VerifyError, match="SemSet"):
        spatialc.verify(p)
    with pytest.raises(Unsupported, match="cannot lower a SemSet not right after its own wait"):
        general.lower(p.evolve(verified=True), spatialc.target("sm_86"))
    with pytest.raises(Unverified, match="not verified"):
        general.lower(gemm64.evolve(verified=False), spatialc.target("sm_86"))


# ---- the kernel and its ledger -----------------------------------------------------------------------------------


def engine_branches(text: str) -> list[tuple[str, int, int]]:
    """(engine, first warp, last warp) of each `if (warp < n)` branch of a general kernel."""
    return [(e, int(a), int(b)) for e, a, b in re.findall(r"\(warp < \d+\) \{  // (\w+): warps (\d+)-(\d+)", text)]


def test_each_engine_runs_on_warps_of_its_own_with_barriers_counting_its_threads(gemm64):
    art = spatialc.lower(gemm64, form="general")
    text = art.kernel_cu
    assert engine_branches(text) == [("compute", 0, 3), ("reader", 4, 4), ("writer", 5, 5)]
    assert art.budget.engines == (("compute", 4), ("reader", 1), ("writer", 1))
    assert art.launch.block == art.budget.threads == 6 * 32
    # Operand rings: full completed by the reader's 32 threads (their cp.async landing), empty by the 128 compute
    # threads; the output ring: full by the compute threads, empty by the writer's.
    counts = dict(re.findall(r"#define (\w+_COUNT_\d+) (\d+)", text))
    assert counts == {
        "FULL_COUNT_0": "32",
        "EMPTY_COUNT_0": "128",
        "FULL_COUNT_1": "32",
        "EMPTY_COUNT_1": "128",
        "FULL_COUNT_3": "128",
        "EMPTY_COUNT_3": "32",
    }
    assert text.count("spatialc_cp_async_arrive(&full_") == 2  # the reader's two Pushes
    assert "__syncthreads();  // the barriers are initialised" in text and text.count("__syncthreads()") == 1
    # Each engine's loops are its own: the reader's and the compute warps' K loops are two `for`s.
    assert len(re.findall(r"for \(int k = 0; k < 4; \+\+k\) \{  // op:Loop", text)) == 2


def test_the_ledger_counts_rings_barriers_and_warps(gemm64, tmp_path):
    art = spatialc.lower(gemm64, form="general")
    bud = art.budget
    depths = sum(r.depth_pages for r in (b.kind for b in gemm64.buffers) if hasattr(r, "depth_pages"))
    assert bud.barrier_bytes >= 2 * 8 * 3 and bud.barrier_bytes % 32 == 0 and depths > 0
    assert bud.total_bytes == bud.dyn_bytes == bud.ring_bytes + bud.barrier_bytes == art.launch.dyn_smem
    assert bud.static_bytes == 0 and bud.rings_dynamic
    assert bud.blocks_per_sm >= 1 and bud.regs_est > 0
    written = write_artifact(spatialc.lower(gemm64), tmp_path)
    doc = json.loads((tmp_path / "general" / "budget.json").read_text())
    assert doc["form"] == "general" and doc["engines"] == {"compute": 4, "reader": 1, "writer": 1}
    assert doc["launch_bounds"] == [bud.threads, bud.blocks_per_sm]
    assert tmp_path / "general" / "kernel.cu" in written and tmp_path / "kernel.cu" in written


def test_a_plan_whose_rings_do_not_fit_is_refused_with_the_fix():
    # The persistent kernel fuses the output ring away; the general form keeps it, so it needs 28 KiB more.
    p = spatialc.build(spatialc.gemm(256, 256, 256, "fp16"), "sm_86", block=(4, 4, 4), depth=5)
    with pytest.raises(TooBig, match="shared memory of one block of the general form on sm_86.*choose a smaller"):
        spatialc.lower(p, form="general")
    art = spatialc.lower(p)
    assert art.general is None and any(n.startswith("no general form: shared memory") for n in art.notes)


# ---- under the emulation -----------------------------------------------------------------------------------------


def emulated(art, program, inputs, mode):
    c = spatialc.emulate(art, inputs, mode=mode, timeout=60)
    return c, spatialc.evaluate(program, inputs)


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
def test_an_epilogue_only_the_general_form_takes_equals_the_interpreter(one_tile_epilogue, mode):
    ins = {
        "A": RNG.integers(-128, 128, (40, 64)).astype(np.int8),
        "B": RNG.integers(-128, 128, (64, 48)).astype(np.int8),
        "bias": RNG.integers(-5000, 5000, (1, 48)).astype(np.int32),
    }
    c, ref = emulated(spatialc.lower(one_tile_epilogue), one_tile_epilogue, ins, mode)
    assert c.dtype == ref.dtype == np.int8 and len(np.unique(c)) > 10
    np.testing.assert_array_equal(c, ref)


@emulation
@pytest.mark.emulation
def test_a_float_epilogue_on_a_target_without_register_accumulators_equals_the_interpreter():
    """Where the persistent kernel cannot fuse the epilogue (accumulators not in registers), the general form runs
    its stages page to page: float32 arithmetic, as the interpreter's."""
    chain = [bias(), scalar("mul", 0.5), relu()]
    p = spatialc.build(spatialc.gemm(32, 64, 48, "fp16", epilogue=chain), "sm_86", block=(2, 4, 1))
    off_registers = dataclasses.replace(spatialc.target("sm_86"), accumulator_in_registers=False)
    art = spatialc.lower(p, off_registers)
    assert art.budget.form == "general"
    ins = {
        "A": RNG.integers(-4, 5, (32, 48)).astype(np.float16),
        "B": RNG.integers(-4, 5, (48, 64)).astype(np.float16),
        "bias": RNG.normal(size=(1, 64)).astype(np.float32),
    }
    c, ref = emulated(art, p, ins, "late")
    np.testing.assert_array_equal(c, ref)
    assert (c == 0).any() and (c > 0).any()


# ---- planted faults in the ring barriers ---------------------------------------------------------------------------


def outcome(program, text: str, mode: str) -> tuple[str, str]:
    """('exact' | 'mismatch' | the emulation error's kind, its report) for the general form's text `text`."""
    art = dataclasses.replace(spatialc.lower(program, form="general"), program_cu=text)
    try:
        c = spatialc.emulate(art, INPUTS, mode=mode, timeout=60)
    except EmulationError as e:
        return e.kind, str(e)
    return ("exact" if np.array_equal(c, spatialc.evaluate(program, INPUTS)) else "mismatch"), ""


def planted(text: str, old: str, new: str) -> str:
    assert old in text, f"the general kernel has no {old!r}"
    return text.replace(old, new)


@pytest.fixture(scope="module")
def general_text(gemm64):
    return spatialc.lower(gemm64, form="general").program_cu


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
def test_the_unbroken_general_form_is_exact(gemm64, general_text, mode):
    assert outcome(gemm64, general_text, mode) == ("exact", "")


@emulation
@pytest.mark.emulation
def test_a_missing_arrive_on_empty_is_a_deadlock_naming_each_wait(gemm64, general_text):
    text = planted(general_text, "spatialc_mbar_arrive(&empty_0[pop_0 % DEPTH_0]); ++pop_0;", "++pop_0;")
    kind, report = outcome(gemm64, text, "late")
    assert kind == EmulationDeadlock.kind
    # The reader waits for A's slot 0 to be freed; the barrier has none of the compute warps' 128 arrivals.
    assert "32 threads (128-159) waits on empty_0[0] for phase 0 (parity 0) to complete" in report
    assert "empty_0[0] in phase 0 (parity 0) has 0 of 128 arrivals" in report


@emulation
@pytest.mark.emulation
def test_an_arrival_count_one_too_high_is_a_deadlock_and_one_too_low_a_race(gemm64, general_text):
    high = planted(general_text, "#define FULL_COUNT_0 32", "#define FULL_COUNT_0 33")
    kind, report = outcome(gemm64, high, "late")
    assert kind == EmulationDeadlock.kind and "full_0[0] in phase 0 (parity 0) has 32 of 33 arrivals" in report
    # One short, the empty phase completes before the last compute thread has read the page: the reader refills
    # it under that thread's fragment load. Which way it shows depends on how far that thread lags, here as on a
    # GPU: mostly a race, but a thread that lags two fills behind waits on a parity that has come round again and
    # never completes (about one run in fifty on two loaded cores). Either is caught; the race must be seen.
    low = planted(general_text, "#define EMPTY_COUNT_0 128", "#define EMPTY_COUNT_0 127")
    for _ in range(4):
        kind, report = outcome(gemm64, low, "early")
        if kind == EmulationRace.kind:
            assert "shared ring 'ring_0'" in report and "no mbarrier phase ordering" in report
            break
        assert kind == EmulationDeadlock.kind and re.search(r"waits on full_0\[\d\] for phase [2-9]", report), report
    else:
        pytest.fail("four runs of a one-short empty count deadlocked and none showed the race")


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
def test_a_pop_before_the_matmul_read_the_page_is_a_race(gemm64, general_text, mode):
    lines = general_text.split("\n")
    pop = next(i for i, line in enumerate(lines) if "spatialc_mbar_arrive(&empty_0[pop_0" in line)
    mm = next(i for i, line in enumerate(lines) if "op:Compute:MatmulTiles" in line)
    text = "\n".join([*lines[:mm], lines[pop], *lines[mm:pop], *lines[pop + 1 :]])
    kind, report = outcome(gemm64, text, mode)
    assert kind == EmulationRace.kind
    assert "a cp.async landing by thread" in report and "a fragment load (ldmatrix)" in report


@emulation
@pytest.mark.emulation
def test_a_wait_on_the_wrong_phase_is_caught(gemm64, general_text):
    text = general_text
    for r in (0, 1):
        text = planted(
            text,
            f"spatialc_mbar_wait(&full_{r}[wt_{r} % DEPTH_{r}], (wt_{r} / DEPTH_{r}) & 1);",
            f"spatialc_mbar_wait(&full_{r}[wt_{r} % DEPTH_{r}], ((wt_{r} / DEPTH_{r}) & 1) ^ 1);",
        )
    # Both operand rings' first waits pass at once: the compute warps read pages the reader has not filled. Which
    # the emulation meets first depends on how its threads interleave (under heavy load the reader can win): the
    # reads racing the reader's copies, or a later wait, a phase behind, that never completes. Either is the fault
    # caught, on one of the two rings.
    kind, report = outcome(gemm64, text, "late")
    if kind == EmulationRace.kind:
        assert re.search(r"shared ring 'ring_[01]' slot 0", report), report
    else:
        assert kind == EmulationDeadlock.kind and re.search(r"full_[01]\[", report), report
    # On A alone the B ring's wait still orders A's copies (the reader filled A first); the compute warps then run
    # a phase behind on A until they wait for one that never completes.
    one = planted(
        general_text,
        "spatialc_mbar_wait(&full_0[wt_0 % DEPTH_0], (wt_0 / DEPTH_0) & 1);",
        "spatialc_mbar_wait(&full_0[wt_0 % DEPTH_0], ((wt_0 / DEPTH_0) & 1) ^ 1);",
    )
    assert outcome(gemm64, one, "early")[0] == EmulationDeadlock.kind


@pytest.mark.parametrize("prec", ["int8", "fp16"])
def test_a_program_planned_for_the_general_form_gets_the_resources_the_backend_reports(prec):
    from spatialc.passes.footprint import resources

    chain = [bias(), relu()]
    for tgt, block, depth, epi in [
        ("sm_80", (1, 1, 1), 3, chain),
        ("sm_86", (2, 4, 2), 2, []),
        ("sm_90", None, 2, chain),
    ]:
        p = spatialc.build(
            spatialc.gemm(128, 96, 128, prec, epilogue=epi), tgt, block=block, depth=depth, form="general"
        )
        art = spatialc.lower(p, form="general")
        want = (art.budget.total_bytes, art.budget.blocks_per_sm)
        assert resources(spatialc.target(tgt), p.plan, p.precision, "general", len(epi)) == want


def test_the_default_8192_cube_plan_leaves_the_general_form_out_and_a_general_plan_fits():
    gemm = spatialc.gemm(8192, 8192, 8192, "fp16")
    art = spatialc.lower(spatialc.build(gemm, "sm_90"))
    assert art.general is None and "no general form: shared memory" in art.notes[0]
    planned = spatialc.build(gemm, "sm_90", form="general")
    assert spatialc.lower(planned, form="general").budget.form == "general"
    with pytest.raises(spatialc.ProgramError, match="unknown form 'fast'"):
        spatialc.build(gemm, "sm_90", form="fast")


def move_up(text: str, line_with: str, above_last: str) -> str:
    """`text` with the line holding `line_with` moved above the last line before it that holds `above_last`."""
    lines = text.split("\n")
    i = next(i for i, line in enumerate(lines) if line_with in line)
    j = max(j for j, line in enumerate(lines[:i]) if above_last in line)
    return "\n".join([*lines[:j], lines[i], *lines[j:i], *lines[i + 1 :]])


EPILOGUE_INPUTS = {
    "A": RNG.integers(-128, 128, (40, 64)).astype(np.int8),
    "B": RNG.integers(-128, 128, (64, 48)).astype(np.int8),
    "bias": RNG.integers(-5000, 5000, (1, 48)).astype(np.int32),
}
# Faults on the rings the epilogue stages and the writer read and write element by element (SPATIALC_PAGE_LD/ST):
# ring 6 is the requant's output, which the writer stores.
PAGE_FAULTS = {
    "a Push before the stage filled the page": lambda t: move_up(t, "arrive(&full_6[psh_6", "op:Compute:Requant"),
    "the writer's Pop before it stored the page": lambda t: move_up(t, "arrive(&empty_6[pop_6", "op:WriteTiles"),
    "the writer's Wait left out": lambda t: planted(
        t, "spatialc_mbar_wait(&full_6[wt_6 % DEPTH_6], (wt_6 / DEPTH_6) & 1);", ""
    ),
    "the stage's Reserve left out": lambda t: planted(
        t, "spatialc_mbar_wait(&empty_6[rsv_6 % DEPTH_6], ((rsv_6 / DEPTH_6) & 1) ^ 1);", ""
    ),
}


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
@pytest.mark.parametrize("fault", list(PAGE_FAULTS))
def test_faults_on_pages_read_and_written_element_by_element_are_races(one_tile_epilogue, fault, mode):
    art = spatialc.lower(one_tile_epilogue)
    text = PAGE_FAULTS[fault](art.program_cu)
    assert text != art.program_cu
    with pytest.raises(EmulationRace, match=r"RACE on shared ring 'ring_6'.*a page (load|store) by thread"):
        spatialc.emulate(dataclasses.replace(art, program_cu=text), EPILOGUE_INPUTS, mode=mode, timeout=60)


def test_a_repeated_wait_on_a_held_page_is_refused_by_the_general_form():
    # In the IR a second Wait finds the page the engine holds and passes (verify accepts it); the general form counts
    # its waits, so it would wait for the next page and hang — it refuses by name instead (found by the mutation
    # suite once the persistent kernel's serialised-order refusals reached the general form).
    from spatialc.ir.nodes import Engine
    from spatialc.ir.ops import Wait
    from spatialc.lower.errors import Unsupported

    from ..rewrite import replace

    base = spatialc.build(spatialc.gemm(32, 32, 48, "int8"), "sm_86", block=(1, 1, 1), depth=3)
    b_ring = next(b.id for b in base.buffers if b.name == "B_ring")
    q = replace(base, Engine.COMPUTE, lambda op: (op, op) if isinstance(op, Wait) and op.buf == b_ring else None)
    q = spatialc.verify(q)
    with pytest.raises(Unsupported, match="a second Wait on B_ring while the engine holds its page"):
        spatialc.lower(q, form="general")
    with pytest.raises(Unsupported):
        spatialc.lower(q)  # auto: the persistent kernel hands it to the general form, which refuses

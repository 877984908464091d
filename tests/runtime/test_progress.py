"""Progress of an emulated run: the emulator's block counts reach a callback as the run goes, its errors stay its
own, and the ready-made reporter keeps one line on a terminal up to date (and writes nothing into a pipe)."""

from __future__ import annotations

import io
import shutil
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc.runtime.emulate import (
    EmulationRace,
    EmulationTimeout,
    StderrProgress,
    _watched,
    compile_program,
    run_program,
    stderr_progress,
)

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
PROBE = (Path(__file__).parents[1] / "emu_fixtures" / "probe.cu").read_text()


@pytest.fixture(scope="module")
def small():
    """A 64³ int8 GEMM on 4 sites (4 blocks), its inputs and the exact product."""
    art = spatialc.lower(spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", sites=4))
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (64, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (64, 64)).astype(np.int8)
    return art, {"A": a, "B": b}, a.astype(np.int64) @ b.astype(np.int64)


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


# ---- the emulator's progress reaches the callback ------------------------------------------------------------------


@needs_gxx
@pytest.mark.emulation
def test_the_callback_hears_increasing_block_counts_ending_at_the_total(small):
    art, inputs, expected = small
    seen: list[tuple[int, int]] = []
    c = spatialc.emulate(art, inputs, progress=lambda done, total: seen.append((done, total)))
    np.testing.assert_array_equal(c, expected)
    total = art.launch.grid
    assert total == 4 and {t for _, t in seen} == {total}
    counts = [d for d, _ in seen]
    assert counts[0] == 0 and counts[-1] == total and counts == sorted(counts)


@needs_gxx
@pytest.mark.emulation
def test_with_no_interval_every_block_is_reported(small, monkeypatch):
    monkeypatch.setenv("SPATIALC_EMU_PROGRESS_S", "0")
    art, inputs, expected = small
    seen: list[tuple[int, int]] = []
    np.testing.assert_array_equal(spatialc.emulate(art, inputs, progress=lambda *p: seen.append(p)), expected)
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]


@needs_gxx
@pytest.mark.emulation
def test_progress_lines_never_reach_stderr_with_or_without_a_callback(small, monkeypatch):
    """The runner always asks for them (a run's pace bounds it: test_time_limits.py) and keeps them to itself."""
    monkeypatch.setenv("SPATIALC_EMU_PROGRESS", "0")  # set by someone else: the runner decides, not the environment
    art, _, _ = small
    files = {"a.txt": "1\n" * 64 * 64, "b.txt": "1\n" * 64 * 64}
    run = run_program(compile_program(art.program_cu), files)
    assert "progress" not in run.stderr and len(run.stdout.split()) == 64 * 64
    seen: list[tuple[int, int]] = []
    run = run_program(compile_program(art.program_cu), files, progress=lambda *p: seen.append(p))
    assert seen[-1] == (4, 4) and "progress" not in run.stderr  # the lines went to the callback only


@needs_gxx
@pytest.mark.emulation
def test_a_race_is_still_reported_in_the_emulators_words(monkeypatch):
    seen: list[tuple[int, int]] = []
    with pytest.raises(EmulationRace) as e:
        run_program(compile_program(PROBE), {"case.txt": "race0\n"}, 60, progress=lambda *p: seen.append(p))
    assert str(e.value).startswith("spatialc-emu [late]: RACE on shared ring 'race_ring' slot 1")
    assert "progress" not in str(e.value) and "progress" not in e.value.stderr and e.value.status == 86
    assert seen == [(0, 1)]  # the launch began; its one block never finished


@needs_gxx
@pytest.mark.emulation
def test_the_watchdog_still_ends_a_run_that_stops_making_progress():
    with pytest.raises(EmulationTimeout, match=r"TIMEOUT: no progress for 1\.0 s"):
        run_program(compile_program(PROBE), {"case.txt": "spin\n"}, 2, progress=lambda *p: None)


def test_a_child_past_its_limit_is_killed(tmp_path):
    with pytest.raises(EmulationTimeout, match="killed after 0.3 s"):
        _watched(["sleep", "30"], str(tmp_path), {"PATH": "/usr/bin:/bin"}, 0.3, None)


@needs_gxx
@pytest.mark.emulation
def test_a_callback_that_raises_stops_the_run_with_its_exception(small, monkeypatch):
    monkeypatch.setenv("SPATIALC_EMU_PROGRESS_S", "0")
    art, inputs, _ = small

    def stop(done, total):
        if done == 1:
            raise KeyError("enough")

    with pytest.raises(KeyError, match="enough"):
        spatialc.emulate(art, inputs, progress=stop)


# ---- the stderr reporter --------------------------------------------------------------------------------------------


def test_the_reporter_writes_nothing_when_stderr_is_not_a_terminal(capsys):
    report = stderr_progress("emulating")
    with report:
        for done in range(5):
            report(done, 4)
    assert capsys.readouterr() == ("", "")


@needs_gxx
@pytest.mark.emulation
def test_an_emulation_with_the_reporter_is_silent_in_a_pipe(small, capsys):
    art, inputs, expected = small
    with stderr_progress() as report:
        np.testing.assert_array_equal(spatialc.emulate(art, inputs, progress=report), expected)
    assert capsys.readouterr() == ("", "")


def test_forced_it_writes_even_into_a_pipe(capsys):
    report = stderr_progress("emulating", force=True)
    report(0, 2)
    report(2, 2)
    err = capsys.readouterr().err
    assert err.startswith("\remulating: 0/2 blocks, ") and err.endswith("\remulating: 2/2 blocks, 0 s\n")


def test_on_a_terminal_it_rewrites_one_line_and_finishes_it():
    tty, now = Tty(), [100.0]
    report = StderrProgress("emulating", stream=tty, clock=lambda: now[0])
    report(0, 132)
    now[0] = 112.4
    report(37, 132)
    now[0] = 112.45  # too soon after the last: skipped
    report(38, 132)
    now[0] = 130.0
    report(132, 132)
    assert tty.getvalue() == (
        "\remulating: 0/132 blocks, 0 s"
        "\remulating: 37/132 blocks, 12 s"
        "\remulating: 132/132 blocks, 30 s\n"  # and finished: what is printed next starts on a line of its own
    )


def test_a_run_that_stops_early_leaves_no_line_open():
    tty = Tty()
    with StderrProgress("emulating", stream=tty) as report:
        report(3, 10)
    assert tty.getvalue() == "\remulating: 3/10 blocks, 0 s\n"
    with StderrProgress("emulating", stream=tty) as report:
        report(10, 10)
    assert tty.getvalue().endswith("\remulating: 10/10 blocks, 0 s\n") and not tty.getvalue().endswith("\n\n")


def test_a_closed_or_missing_stderr_is_no_error(monkeypatch):
    monkeypatch.setattr(sys, "stderr", None)
    stderr_progress()(1, 2)
    closed = io.StringIO()
    closed.close()
    StderrProgress(stream=closed)(1, 2)


def test_the_first_run_of_a_kernel_text_says_it_waits_on_g_plus_plus(monkeypatch):
    """g++ takes seconds the first time a kernel text is emulated: the reporter says so before it starts, once."""
    from spatialc.runtime import emulate as E

    said: list[str] = []

    class Stop(Exception):
        pass

    def compile_program(program_cu, mode):
        said.append("compiled")
        raise Stop

    out = io.StringIO()
    report = StderrProgress("emulating", force=True, stream=out)
    monkeypatch.setattr(E, "compile_program", compile_program)
    for cached in (False, True):
        monkeypatch.setattr(E, "is_compiled", lambda program_cu, mode, cached=cached: cached)
        with pytest.raises(Stop):
            E.emulate_source(PROBE, {}, (1,), progress=report)
    assert said == ["compiled", "compiled"]
    assert (
        out.getvalue() == "emulating: compiling the emulation with g++ (seconds, once for each kernel text: cached)\n"
    )


@pytest.mark.emulation  # compiles with g++
def test_whether_a_kernel_text_is_compiled_follows_the_cache():
    from spatialc.runtime import emulate as E

    # A text no run has compiled (the shared cache keeps its prepared runtime: an empty one would rebuild it, ~30 s).
    text = PROBE + f"\n// {uuid.uuid4().hex}"
    assert not E.is_compiled(text)
    if shutil.which("g++") is not None:
        E.compile_program(text)
        assert E.is_compiled(text) and not E.is_compiled(text + "\n// another text")

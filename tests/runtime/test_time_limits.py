"""An emulated run's time limit: given by the caller, else SPATIALC_EMU_TIMEOUT_S (which the runner used to overwrite
with its own 120 s), else 120 s; a run whose pace says it would take more than twice its limit is stopped as soon as
that shows, saying how long it would take and how to give it that; a run still going at its limit says how far it
got rather than where its threads stood — those only where no block finished (a hang is likelier then). The CLI's
`--timeout` sets the limit."""

from __future__ import annotations

import stat
import subprocess
import sys
import time

import pytest

from spatialc.errors import ProgramError
from spatialc.runtime import emu_run
from spatialc.runtime.emu_run import EmulationTimeout, _watched, run_program, timeout_seconds

ENV = {"PATH": "/usr/bin:/bin"}


def test_the_limit_is_the_callers_else_the_environments_else_120_s(monkeypatch):
    monkeypatch.delenv("SPATIALC_EMU_TIMEOUT_S", raising=False)
    assert timeout_seconds(None) == 120.0 and timeout_seconds(7) == 7.0
    monkeypatch.setenv("SPATIALC_EMU_TIMEOUT_S", "450")
    assert timeout_seconds(None) == 450.0 and timeout_seconds(3.5) == 3.5
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv("SPATIALC_EMU_TIMEOUT_S", bad)
        with pytest.raises(ProgramError, match=f"SPATIALC_EMU_TIMEOUT_S is the emulation's limit .* not '{bad}'"):
            timeout_seconds(None)
    for bad in (0, -2, True, "60", float("inf")):
        with pytest.raises(ProgramError, match="timeout is the emulation's watchdog in seconds"):
            timeout_seconds(bad)


def _script(tmp_path, body: str):
    """An executable standing in for an emulation binary: python running `body`."""
    path = tmp_path / "fake_emu"
    path.write_text(f"#!{sys.executable}\nimport sys, time, os\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _progress(done: int, total: int) -> str:
    return f"sys.stderr.write('spatialc-emu progress {done} {total}\\n'); sys.stderr.flush()"


def test_a_run_whose_pace_passes_twice_its_limit_is_stopped_at_once(tmp_path, monkeypatch):
    """One block of 100 in 0.3 s: 30 s in all against a limit of 1 s — stopped then, not at the limit (nor at 30 s)."""
    monkeypatch.setattr(emu_run, "PROJECT_AFTER_S", 0.2)
    fake = _script(tmp_path, f"{_progress(0, 100)}\ntime.sleep(0.3)\n{_progress(1, 100)}\ntime.sleep(30)")
    t0 = time.perf_counter()
    with pytest.raises(EmulationTimeout) as e:
        _watched([str(fake)], str(tmp_path), ENV, 40, None, 1.0)
    assert time.perf_counter() - t0 < 10
    text = str(e.value)
    assert "stopped early — at the pace of its first 1 of 100 blocks" in text and "past its limit of 1 s" in text
    assert "--timeout" in text and "SPATIALC_EMU_TIMEOUT_S=" in text


def test_a_run_on_pace_to_finish_within_twice_its_limit_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(emu_run, "PROJECT_AFTER_S", 0.2)
    steps = "\n".join(f"time.sleep(0.1)\n{_progress(i, 4)}" for i in range(1, 5))
    fake = _script(tmp_path, f"{_progress(0, 4)}\n{steps}\nprint(42)")
    status, out, err, (pace, need) = _watched([str(fake)], str(tmp_path), ENV, 40, None, 1.0)
    assert (status, out.strip(), err) == (0, "42", "") and pace.startswith("4 of 4 blocks") and need < 2


def test_a_run_past_its_limit_says_how_far_it_got(tmp_path, monkeypatch):
    """The emulator's own limit (exit 88): the message keeps its head, says the pace, and drops the threads' state."""
    monkeypatch.delenv("SPATIALC_EMU_TIMEOUT_S", raising=False)
    said = (
        "spatialc-emu [late]: TIMEOUT: the run passed its wall-clock limit of 2.0 s (SPATIALC_EMU_TIMEOUT_S)."
        " Threads of block 3: 128 threads __shfl_sync() at line 10"
    )
    body = f"{_progress(0, 16)}\ntime.sleep(0.2)\n{_progress(3, 16)}\nsys.stderr.write({said!r} + '\\n')\nsys.exit(88)"
    with pytest.raises(EmulationTimeout) as e:
        run_program(_script(tmp_path, body), {}, 2)
    text = str(e.value)
    assert text.startswith("spatialc-emu [late]: TIMEOUT: the emulation passed its limit of 2 s still running")
    assert "(3 of 16 blocks of the launch done, about" in text and "Threads of block" not in text
    assert "--timeout" in text


def test_a_run_past_its_limit_with_no_block_done_keeps_where_its_threads_were(tmp_path):
    said = (
        "spatialc-emu [late]: TIMEOUT: the run passed its wall-clock limit of 2.0 s (SPATIALC_EMU_TIMEOUT_S)."
        " Threads of block 0: 128 threads __shfl_sync() at line 10"
    )
    body = f"{_progress(0, 16)}\nsys.stderr.write({said!r} + '\\n')\nsys.exit(88)"
    with pytest.raises(EmulationTimeout, match=r"still running\. Give it longer .* Where its threads were: Threads of"):
        run_program(_script(tmp_path, body), {}, 2)


def test_the_environments_limit_reaches_the_emulator(tmp_path, monkeypatch):
    """SPATIALC_EMU_TIMEOUT_S set by the user is what the emulator's watchdog is given (it was overwritten by 120)."""
    monkeypatch.setenv("SPATIALC_EMU_TIMEOUT_S", "450")
    fake = _script(tmp_path, "print(os.environ['SPATIALC_EMU_TIMEOUT_S'])")
    assert float(run_program(fake, {}).stdout) == 450.0
    assert float(run_program(fake, {}, 9).stdout) == 9.0


def test_the_cli_refuses_a_timeout_that_is_no_number_of_seconds(capsys):
    from spatialc.cli import main

    assert main(["gemm", "64", "64", "64", "--run", "--timeout", "-3"]) == 2
    assert "argument --timeout: a positive number of seconds, not '-3'" in capsys.readouterr().err


def test_a_run_that_ends_is_seen_ending_at_once(tmp_path):
    """Waited for, not polled (the kill at the runner's limit: tests/runtime/test_progress.py)."""
    start = time.monotonic()
    status, out, _, _ = _watched(["sh", "-c", "echo done; exit 3"], str(tmp_path), ENV, kill_after=30, progress=None)
    assert (status, out) == (3, "done\n") and time.monotonic() - start < 10


def test_a_run_that_ends_as_the_runners_timer_fires_is_no_timeout(tmp_path, monkeypatch):
    """The runner's timer may fire in the instant between the process's end and the runner's look at it: the kill
    then finds nothing to kill, and the run, which ended by itself, is returned as it ended, not called killed."""
    fired = []

    class Timer:  # the runner's timer, fired by hand below
        def __init__(self, seconds, kill):
            self.kill, self.daemon = kill, False

        def start(self):
            fired.append(self.kill)

        def cancel(self):
            pass

    class Popen(subprocess.Popen):
        def wait(self, timeout=None):
            status = super().wait(timeout)
            for kill in fired:  # the timer's moment: the process has just ended and been waited for
                kill()
            return status

    monkeypatch.setattr(emu_run.threading, "Timer", Timer)
    monkeypatch.setattr(emu_run.subprocess, "Popen", Popen)
    status, out, _, _ = _watched(["sh", "-c", "echo done"], str(tmp_path), ENV, kill_after=30, progress=None)
    assert (status, out) == (0, "done\n") and fired

"""A run at an LLM's size: the emulation's refusal (`check_emulable`: about 72 GiB for a 128K-token attention, more
than its 2 GiB) comes first, from the kernel alone, before any input is made — never after minutes and gigabytes of
random inputs. The check without a run (the interpreter's) is refused before its inputs too."""

from __future__ import annotations

import pytest

import spatialc
from spatialc.cli import main
from spatialc.runtime import launch


@pytest.fixture
def no_inputs_no_gpu(monkeypatch):
    """Making an input fails the test; and no GPU is found (where there is one, the kernel runs on it instead)."""
    monkeypatch.setattr("spatialc.cli.commands.random_inputs", lambda *a: pytest.fail("inputs made before the refusal"))

    def no_gpu():
        raise launch.GpuUnavailable("no GPU in this test")

    monkeypatch.setattr(launch, "cupy_device", no_gpu)


def refused(capsys, *argv: str) -> str:
    status = main(list(argv))
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv",
    [
        ("attention", "1", "32", "131072", "131072", "128", "--run"),
        ("gemm", "65536", "65536", "65536", "--run"),
        ("grouped-gemm", "8", "16384", "16384", "16384", "--run"),
        ("softmax", "65536", "131072", "--run"),
        ("elementwise", "silu(g) * x", "65536", "65536", "--run"),
    ],
    ids=lambda a: a[0],
)
def test_a_run_at_an_llm_size_is_refused_before_any_input(capsys, no_inputs_no_gpu, argv):
    err = refused(capsys, *argv)
    assert "emulating this kernel takes about" in err and "more than 2.0 GiB" in err, err


def test_a_saved_program_at_an_llm_size_is_refused_before_any_input(capsys, tmp_path, no_inputs_no_gpu):
    for i, prog in enumerate((spatialc.attention(1, 32, 131072, 131072, 128), spatialc.gemm(65536, 65536, 65536))):
        path = tmp_path / f"p{i}.json"
        path.write_text(spatialc.to_json(spatialc.build(prog, "sm_90")))
        err = refused(capsys, "run", str(path))
        assert "emulating this kernel takes about" in err, err


def test_a_check_at_an_llm_size_without_a_run_is_refused_before_any_input(capsys, no_inputs_no_gpu):
    err = refused(capsys, "attention", "1", "32", "131072", "131072", "128", "--check", "full")
    assert "checking attention_1x32x131072x131072x128_bf16 needs" in err and "--check none" in err, err


def test_a_small_run_still_emulates(capsys, monkeypatch):
    """The refusal is the emulation's own bound: a kernel under it is lowered, checked and run as before."""
    from spatialc.runtime import emulate as E

    monkeypatch.setattr(launch, "cupy_device", lambda: (_ for _ in ()).throw(launch.GpuUnavailable("no GPU")))
    asked = []
    real = E.check_emulable
    monkeypatch.setattr(E, "check_emulable", lambda art, *a: asked.append(E.emulation_bytes(art.launch)) or real(art))
    assert main(["gemm", "64", "64", "64", "--precision", "int8", "--target", "sm_86", "--check", "none"]) == 0
    assert asked == []  # no run, no question
    status = main(["gemm", "64", "64", "64", "--precision", "int8", "--target", "sm_86", "--run"])
    out = capsys.readouterr().out
    assert status == 0 and "C equals the reference interpreter, exactly" in out, out
    assert len(asked) == 2 and 0 < asked[0] < 2 << 30  # asked before the inputs, and again by the emulation


def test_an_attention_past_the_full_checks_size_is_not_checked_by_default(capsys, monkeypatch):
    """1 × 16 × 4096² × 128 (6.9e10 multiply-adds): checked in full by default it took over two minutes; the default
    is none now, its line saying what --check full would take, and no input is made. One below the bound (1 × 4 ×
    2048² × 128, 4.3e9) is still checked in full by default; --check full is still taken at any size that fits."""
    from spatialc.cli import commands
    from spatialc.cli.check import ATTENTION_FULL_CHECK_MACS, multiply_adds, plan_check

    made = commands.random_inputs  # the parameters only: operands (Q, K, V) only for a check or a run
    monkeypatch.setattr(commands, "random_inputs", lambda *a: pytest.fail("operands made") if a[3] else made(*a))
    assert main(["attention", "1", "16", "4096", "4096", "128"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("  check"))
    assert "none (the default for an attention above 8.59e+09 multiply-adds" in line
    assert "--check full computes all 6.87e+10 with the interpreter and numpy, about" in line
    small = spatialc.attention(1, 4, 2048, 2048, 128)
    assert multiply_adds(small) < ATTENTION_FULL_CHECK_MACS
    assert plan_check(small, None, 0, full_inputs=False).mode == "full"
    big = spatialc.attention(1, 16, 4096, 4096, 128)
    assert plan_check(big, "full", 0, full_inputs=False).mode == "full"

"""The command line: reports, saved programs, and one clear line with exit status 2 for anything wrong."""

import json
import re
import shutil
import subprocess
import sys

import pytest

import spatialc
from spatialc.cli import main
from spatialc.errors import PlanError


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_gemm_reports_plan_sites_rings_check_and_time(capsys):
    status, out, err = run_cli(
        capsys, "gemm", "70", "50", "90", "--target", "sm_86", "--sites", "4", "--placement", "round_robin"
    )
    assert status == 0, err
    assert "spatialc gemm 70x50x90 int8 on sm_86" in out
    for label in ("plan ", "sites ", "rings ", "check ", "time "):
        assert f"  {label}" in out
    assert "4 (round_robin)" in out
    assert "interpreter vs numpy reference: OK, exact" in out


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gemm_checks_float_precisions_within_the_stated_bound(capsys, precision):
    status, out, _ = run_cli(capsys, "gemm", "33", "17", "49", "--precision", precision, "--target", "sm_80")
    assert status == 0 and "OK, max |error|" in out


def test_saved_program_shows_and_round_trips(capsys, tmp_path):
    path = tmp_path / "saved" / "p.json"  # a folder not made yet: made, as --emit and --pictures make theirs
    status, _, err = run_cli(capsys, "gemm", "40", "40", "40", "--block", "1,1,1", "--json", str(path))
    assert status == 0, err
    p = spatialc.from_json(path.read_text())
    assert p.verified and p.plan.block == spatialc.ir.BlockShape(1, 1, 1)
    status, out, _ = run_cli(capsys, "show", str(path))
    assert status == 0 and "Loop k < 3:" in out and "site 0" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["gemm", "0", "4", "4"], "m must be a whole number ≥ 1"),
        (["gemm", "4", "4", "4", "--target", "sm_75"], "unknown target 'sm_75'"),
        (["gemm", "4", "4", "4", "--precision", "fp8"], "invalid choice: 'fp8'"),
        (["gemm", "4", "4", "4", "--block", "2,2"], "--block must be 3 comma-separated whole numbers"),
        (
            [
                "gemm",
                "64",
                "64",
                "64",
                "--precision",
                "fp16",
                "--block",
                "4,8,8",
                "--sub-blocks",
                "2,2",
                "--depth",
                "4",
            ],
            "shared memory",
        ),
        (["gemm", "4", "4", "4", "--sites", "0"], "sites must be a whole number from 1 to 65536"),
        (["gemm", "4", "4", "4", "--sites", "3000000"], "sites must be a whole number from 1 to 65536"),
        (["gemm", "4", "x", "4"], "invalid int value: 'x'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["show", "/nonexistent/p.json"], "cannot read /nonexistent/p.json"),
        # The API's option named as the command line spells it too.
        (["gemm", "64", "64", "640", "--split-k", "40"], "split_k=40 (--split-k 40): at most 32 sites share an item"),
        (["gemm", "256", "256", "256", "--multicast", "4,4"], "multicast=(4, 4) (--multicast 4,4): a group holds"),
        (["gemm", "64", "64", "640", "--split-k", "4", "--sites", "2"], "split_k=4 (--split-k 4) places each"),
        # A list starting with a negative value reaches its option's own check, not argparse's "expected one argument".
        (["gemm", "64", "64", "64", "--requant", "-1,3"], "requant scale must be a finite number ≥ 0, not -1.0"),
        (["gemm", "64", "64", "64", "--block", "-1,2,3"], "block must be 3 whole numbers ≥ 1, not (-1, 2, 3)"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(capsys, argv, says):
    status, _, err = run_cli(capsys, *argv)
    assert status == 2
    assert err.count("\n") == 1 and says in err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{ not json", "not JSON"),
        (json.dumps({"name": "a", "layers": []}), "not a spatialc program"),
        (
            json.dumps({"format": "spatialc.program", "version": 1, "program": {"type": "SpatialProgram"}}),
            "missing field 'name'",
        ),
    ],
)
def test_show_refuses_files_that_are_not_ours(capsys, tmp_path, content, says):
    path = tmp_path / "x.json"
    path.write_text(content)
    status, _, err = run_cli(capsys, "show", str(path))
    assert status == 2 and says in err and err.count("\n") == 1


def test_python_dash_m_is_the_same_command():
    res = subprocess.run(
        [sys.executable, "-m", "spatialc", "gemm", "4", "4", "4", "--target", "nope"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "unknown target 'nope'" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the run falls back to the host emulation")
@pytest.mark.emulation  # compiles with g++
def test_the_readme_main_job_emits_and_runs(capsys, tmp_path):
    # The README's first command, minus the install: build, check, emit CUDA, run it (emulated: no GPU here).
    status, out, err = run_cli(
        capsys,
        "gemm",
        "256",
        "256",
        "256",
        "--precision",
        "int8",
        "--target",
        "sm_86",
        "--emit",
        str(tmp_path / "gemm256"),
        "--run",
    )
    assert status == 0, err
    assert "interpreter vs numpy reference: OK, exact" in out
    assert "census    " in out and "printed kernel agrees" in out
    assert "under the host emulation (late copies; no GPU" in out
    assert "C equals the reference interpreter, exactly" in out
    for name in ("program.cu", "bench.cu", "budget.json", "census.json"):
        assert (tmp_path / "gemm256" / name).is_file()
    assert json.loads((tmp_path / "gemm256" / "budget.json").read_text())["threads"] == 128


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the run falls back to the host emulation")
@pytest.mark.parametrize(
    ("precision", "flags"),
    [
        ("int8", ["--bias", "--relu", "--requant", "0.01,3"]),
        ("bf16", ["--bias", "--scalar", "mul,0.5", "--mode", "early"]),
    ],
)
@pytest.mark.emulation  # compiles with g++
def test_an_epilogue_runs_from_the_command_line(capsys, precision, flags):
    status, out, err = run_cli(
        capsys, "gemm", "100", "72", "40", "--precision", precision, "--target", "sm_86", *flags, "--run"
    )
    assert status == 0, err
    assert ", epilogue bias → " in out and "check     interpreter vs numpy reference: OK" in out
    assert "C equals" in out


def test_gpucheck_gets_its_own_arguments_in_any_order(capsys, tmp_path):
    for argv in (
        ["gpucheck", "--dry-run", str(tmp_path), "--sizes", "64", "--precisions", "int8"],
        ["gpucheck", str(tmp_path), "--sizes", "64", "--precisions", "int8", "--dry-run"],
    ):
        status, out, err = run_cli(capsys, *argv)
        assert status == 0, err
        assert "int8 64x64x64" in out


def test_a_bad_depth_reads_naturally(capsys):
    status, _, err = run_cli(capsys, "gemm", "4", "4", "4", "--depth", "0")
    assert status == 2 and "depth must be a whole number ≥ 1, not 0" in err


@pytest.fixture()
def saved(tmp_path, capsys):
    path = tmp_path / "p.json"
    status, _, err = run_cli(capsys, "gemm", "40", "48", "64", "--target", "sm_86", "--sites", "3", "--json", str(path))
    assert status == 0, err
    return path


def test_verify_says_which_lowering_takes_a_saved_program(capsys, saved):
    status, out, err = run_cli(capsys, "verify", str(saved))
    assert status == 0, err
    assert "verified — " in out and "computes what its stages declare" in out
    assert "lowering  the persistent CUDA kernel for sm_86 takes it: 3 blocks of" in out


def test_hopper_target_on_the_command_line(capsys, tmp_path):
    path = tmp_path / "h.json"
    args = ("gemm", "200", "72", "96", "--target", "sm_90a")
    status, out, err = run_cli(capsys, *args, "--block", "8,5,2", "--json", str(path))
    assert status == 0, err
    assert "kernel    sm_90a form: one thread of a producer warpgroup loads each page by TMA" in out
    assert "two consumer warpgroups multiply with wgmma m64n80k32" in out
    # The registers are what setmaxnreg makes of the launch's (ptxas's count, with --emit, is the launch's).
    assert "384 threads each, 232 registers a consumer thread and 40 a producer thread after setmaxnreg" in out
    # Every byte of shared memory named: the rings, the barriers, the output's staging (8 consumer warps × 2 boxes of
    # one fp32 tile: the items are 5 tiles wide) and the padding to each stage's 1024-byte boundary.
    said = next(line for line in out.splitlines() if "shared memory" in line and "bytes a block" in line)
    total = int(re.search(r"shared memory (\d+) bytes a block", said).group(1))
    parts = {name: int(n) for name, n in re.findall(r"(\w[\w ]*?) (\d+) B\b", said.split("1024 bytes): ")[1])}
    assert parts["output staging"] == 8 * 2 * 1 * 256 * 4 and 0 <= parts["alignment"] < 1024 * 3
    assert sum(parts.values()) == total, said
    status, out, err = run_cli(capsys, "verify", str(path))
    assert status == 0 and "lowering  the sm_90a CUDA form (TMA, wgmma) for sm_90a takes it: " in out
    # Items of 64 rows: one consumer warpgroup, two blocks an SM, each keeping its launch's registers.
    status, out, err = run_cli(capsys, *args, "--block", "4,5,2")
    assert status == 0 and "one consumer warpgroup multiplies with wgmma m64n80k32" in out, err
    assert "items of 64x80: one warpgroup's, two blocks sharing an SM" in out
    assert "2 blocks per SM of sm_90a, 256 threads each, at most 128 registers a thread (the blocks share" in out
    assert "setmaxnreg moves" not in out
    # The form on a target without its instructions: one line, exit status 2.
    status, out, err = run_cli(capsys, "gemm", "64", "64", "64", "--target", "sm_90", "--form", "sm90a")
    assert status == 2 and err.count("\n") == 1 and "which target sm_90 has not; use target sm_90a" in err, err


def test_verify_says_which_form_takes_a_program_and_why(capsys, tmp_path):
    p = spatialc.build(spatialc.gemm(40, 48, 64, "int8", epilogue=[spatialc.relu()]), "sm_80", block=(1, 1, 1))
    path = tmp_path / "p.json"
    path.write_text(spatialc.to_json(p))
    status, out, _ = run_cli(capsys, "verify", str(path))
    assert status == 0 and "lowering  the general CUDA form for sm_80 takes it" in out
    assert "the persistent kernel refuses: cannot lower the epilogue relu" in out


def test_verify_says_why_no_lowering_takes_a_program(capsys, tmp_path):
    # An activation the persistent kernel leaves to the general form, on a plan made for the persistent kernel whose
    # rings the general form's shared memory cannot hold (it keeps the output and the activation's pages). (Auto
    # plans an activation for the general form, and refuses this forced block at once.)
    gemm = spatialc.gemm(256, 256, 256, "fp16", epilogue=[spatialc.activation("gelu_tanh")])
    with pytest.raises(PlanError, match="no plan with block=\\(4, 4, 4\\), depth=5 fits sm_86"):
        spatialc.build(gemm, "sm_86", block=(4, 4, 4), depth=5)
    p = spatialc.build(gemm, "sm_86", block=(4, 4, 4), depth=5, form="persistent")
    path = tmp_path / "p.json"
    path.write_text(spatialc.to_json(p))
    status, out, _ = run_cli(capsys, "verify", str(path))
    assert status == 0 and "lowering  none yet: shared memory of one block of the general form on sm_86" in out


def test_lower_writes_a_saved_programs_kernel_and_names_each_file(capsys, saved, tmp_path):
    out_dir = tmp_path / "k"
    status, out, err = run_cli(capsys, "lower", str(saved), "--emit", str(out_dir))
    assert status == 0, err
    for name in ("program.cu", "bench.cu", "kernel.cu", "launch.json", "budget.json", "census.json"):
        assert (out_dir / name).is_file() and f"wrote     {out_dir / name}" in out
    budget = json.loads((out_dir / "budget.json").read_text())
    assert f"shared memory {budget['static_bytes'] + budget['dyn_bytes']} bytes a block" in out


def test_a_hand_broken_file_is_refused_by_lower_and_run(capsys, saved):
    doc = json.loads(saved.read_text())
    loop = doc["program"]["schedule"]["programs"][0]["ops"][0]  # site 0's reader: its K loop
    loop["count"]["n"] -= 1
    saved.write_text(json.dumps(doc))
    for command in ("lower", "run", "verify"):
        argv = [command, str(saved)] + (["--emit", str(saved.parent / "k")] if command == "lower" else [])
        status, _, err = run_cli(capsys, *argv)
        assert status == 2 and err.count("\n") == 1, (command, err)


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the run falls back to the host emulation")
@pytest.mark.emulation  # compiles with g++
def test_run_checks_a_saved_program_and_its_kernel(capsys, saved):
    status, out, err = run_cli(capsys, "run", str(saved), "--seed", "3", "--mode", "early")
    assert status == 0, err
    assert "interpreter vs numpy reference: OK, exact" in out
    assert "under the host emulation (early copies" in out and "C equals the reference interpreter" in out


def test_mode_without_run_is_refused(capsys):
    status, _, err = run_cli(capsys, "gemm", "16", "16", "16", "--mode", "early")
    assert status == 2 and "--mode" in err and "goes with --run" in err


def test_version_and_help_that_teaches(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"spatialc {spatialc.__version__}"
    with pytest.raises(SystemExit):
        main(["gemm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in (
        "M: rows of A and of C (elements)",
        "K: columns of A, rows of B",
        "(default: int8)",
        "(default: sm_90)",
        "tiles are 16x16 elements",
        "a whole number ≥ 0 (default: 0)",
        "kernel.cu, launch.json, budget.json",
    ):
        assert words in text, words


def test_the_report_counts_in_good_english(capsys):
    status, out, _ = run_cli(capsys, "gemm", "16", "16", "16", "--target", "sm_86", "--block", "1,1,1", "--depth", "1")
    assert status == 0
    assert "1 item per site" in out and "1 K step," in out and "1 page deep" in out and "1 sites" not in out


def test_the_report_shows_the_kernels_memory_and_the_rings_it_fused(capsys, tmp_path):
    status, out, _ = run_cli(
        capsys, "gemm", "100", "72", "40", "--bias", "--relu", "--target", "sm_86", "--emit", str(tmp_path)
    )
    budget = json.loads((tmp_path / "budget.json").read_text())
    assert status == 0 and budget["fused"] == ["C_ring", "bias0_ring", "relu1_ring"]
    assert f"shared memory {budget['total_bytes']} bytes a block" in out
    assert budget["total_bytes"] == budget["static_bytes"] + budget["dyn_bytes"] == sum(budget["rings"].values())
    assert "fused into the store (no ring): C_ring, bias0_ring, relu1_ring" in out


def test_verify_pictures_on_a_program_that_passes_says_why_nothing_was_drawn(capsys, saved, tmp_path):
    status, out, _ = run_cli(capsys, "verify", str(saved), "--pictures", str(tmp_path / "pics"))
    assert status == 0 and "pictures  none drawn" in out and "there is none" in out


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_emitting_with_nvcc_here_adds_ptxas_registers_to_the_ledger(capsys, saved, tmp_path):
    status, out, err = run_cli(capsys, "lower", str(saved), "--emit", str(tmp_path / "k"))
    assert status == 0, err
    budget = json.loads((tmp_path / "k" / "budget.json").read_text())
    general = json.loads((tmp_path / "k" / "general" / "budget.json").read_text())
    assert budget["regs_ptxas"] > 0 and budget["spills_ptxas"] == 0 and general["regs_ptxas"] > 0
    assert f"~{budget['regs_est']} registers a thread (ptxas: {budget['regs_ptxas']}, spills 0 B)" in out


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_ledger_holds_the_stack_frame_of_a_fused_epilogue(capsys, tmp_path):
    """The persistent kernel's fused epilogue takes each fragment through the chain from a private 8-word copy:
    32 bytes of stack, no spill — said in budget.json and the occupancy line, not hidden behind "spills 0 B"."""
    status, out, err = run_cli(capsys, "gemm", "256", "256", "256", "--relu", "--emit", str(tmp_path / "k"))
    assert status == 0, err
    budget = json.loads((tmp_path / "k" / "budget.json").read_text())
    assert budget["form"] == "persistent" and budget["spills_ptxas"] == 0 and budget["stack_ptxas"] == 32
    assert f"(ptxas: {budget['regs_ptxas']}, spills 0 B, stack 32 B)" in out
    general = json.loads((tmp_path / "k" / "general" / "budget.json").read_text())
    assert general["stack_ptxas"] == 0  # the general form's epilogue stage reads its page from shared memory


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_sass_counts_the_k_steps_of_a_trip_by_the_busiest_warp(capsys, monkeypatch, tmp_path):
    """A 1 × 1 × 3 block: one warp multiplies the item's one tile, 3 tile-MACs a K step; the main loop (the K loop
    unrolled) is one item's 3 K steps — not 24, as sharing the tile-MACs over all 8 warps would say."""
    from spatialc.runtime.sass import find_cuobjdump

    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    status, out, err = run_cli(capsys, "gemm", "100", "100", "100", "--precision", "int8", "--block", "1,1,3", "--sass")
    assert status == 0, err
    assert "3 K steps, " in out and "main loop (sm_90, 3 K steps a trip, per warp)" in out and "(9 tile-MACs" in out
    occupancy = next(line for line in out.splitlines() if line.startswith("  occupancy"))
    assert "(ptxas: " in occupancy  # the kernel was compiled for --sass: its count beside the estimate, as --emit has
    # …and only that kernel: not the general form it carries for --emit, whose numbers --sass never shows.
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path))
    status, out, err = run_cli(capsys, "gemm", "100", "100", "100", "--precision", "int8", "--block", "1,1,3", "--sass")
    assert status == 0 and len(list((tmp_path / "cubin").glob("*.cubin"))) == 1, err


def test_without_nvcc_the_ledger_keeps_the_estimate_alone(capsys, saved, tmp_path, monkeypatch):
    from spatialc.runtime import nvcc

    monkeypatch.setattr(nvcc, "find_nvcc", lambda: None)
    assert run_cli(capsys, "lower", str(saved), "--emit", str(tmp_path / "k"))[0] == 0
    assert json.loads((tmp_path / "k" / "budget.json").read_text())["regs_ptxas"] is None


def test_a_message_that_starts_with_the_word_spatialc_still_gets_the_error_prefix(capsys, tmp_path):
    path = tmp_path / "p.json"
    assert run_cli(capsys, "gemm", "32", "32", "32", "--json", str(path))[0] == 0
    doc = json.loads(path.read_text())
    doc["version"] = 99
    path.write_text(json.dumps(doc))
    status, _, err = run_cli(capsys, "verify", str(path))
    assert status == 2 and err.startswith("spatialc: error: spatialc program version 99; this spatialc reads")
    file = tmp_path / "a-file"
    file.write_text("")
    # A file where an output folder must be: the one line names it, whichever option's folder it is.
    for option, given in (
        ("--json", file / "p.json"),
        ("--emit", file),
        ("--emit", file / "sub"),
        ("--pictures", file),
    ):
        status, _, err = run_cli(capsys, "gemm", "32", "32", "32", option, str(given))
        assert status == 2 and err == f"spatialc: error: {file} is a file, not a folder\n", (option, err)


@pytest.mark.parametrize(
    ("group", "says"),
    [
        ("2,1", "each group column shares its B pages, each read"),
        ("1,2", "each group row shares its A pages, each read"),
        ("2,2", "each group row shares its A pages, each group column shares its B pages"),
    ],
)
def test_the_multicast_line_names_only_what_a_group_shares(capsys, group, says):
    status, out, err = run_cli(capsys, "gemm", "128", "128", "128", "--precision", "bf16", "--multicast", group)
    assert status == 0, err
    line = next(x for x in out.splitlines() if x.startswith("  multicast"))
    assert says in line and line.count("shares") == says.count("shares"), line


def test_gemm_and_grouped_gemm_default_to_one_precision_everywhere(capsys):
    """The CLI's two commands, the Python API's two functions and `lang.program` all default to int8, as the README
    says."""
    import inspect

    from spatialc import lang

    for fn in (spatialc.gemm, spatialc.grouped_gemm, lang.program):
        assert inspect.signature(fn).parameters["precision"].default == "int8", fn
    assert spatialc.grouped_gemm(2, 16, 16, 16).precision.value == "int8"
    for argv in (["gemm", "16", "16", "16"], ["grouped-gemm", "2", "16", "16", "16"]):
        code, out, err = run_cli(capsys, *argv, "--check", "none", "--target", "sm_86")
        assert code == 0, err
        assert re.search(r"x16 int8 on sm_86", out.splitlines()[0]), out


def test_every_fallback_and_omission_prints_a_note(capsys):
    """The grouped GEMM on sm_90a falls back from the sm_90a form, and the persistent kernel, to the general form;
    each step is a `note` line, as is a general form that could not ride along."""
    code, out, _ = run_cli(capsys, "grouped-gemm", "4", "64", "64", "64", "--target", "sm_90a")
    notes = [line for line in out.splitlines() if line.startswith("  note      ")]
    assert code == 0 and len(notes) == 2
    assert notes[0].startswith("  note      not the sm_90a form: cannot lower a loop count read from data")
    assert notes[1].startswith("  note      the general form, as the persistent kernel refuses")


@pytest.mark.parametrize("emit", [False, True])
def test_a_forced_form_that_cannot_be_printed_exits_2_with_or_without_emit(capsys, tmp_path, emit):
    argv = ["grouped-gemm", "4", "64", "64", "64", "--target", "sm_90a", "--form", "sm90a", "--check", "none"]
    code, _, err = run_cli(capsys, *argv, *(["--emit", str(tmp_path / "out")] if emit else []))
    assert code == 2 and err.strip().splitlines() == [
        "spatialc: error: cannot lower a loop count read from data: the sm_90a form prints fixed loops so far"
    ]


def test_a_block_that_pads_a_side_by_more_than_a_tenth_says_so(capsys):
    code, out, _ = run_cli(capsys, "gemm", "256", "256", "256", "--block", "3,5,7", "--target", "sm_86")
    assert code == 0
    assert (
        "  note      the plan pads M from 16 to 18 tiles (+12%), N from 16 to 20 tiles (+25%), K from 16 to 21 tiles"
        " (+31%): zeros the kernel multiplies too" in out
    )
    code, out, _ = run_cli(capsys, "gemm", "256", "256", "256", "--block", "4,4,4", "--target", "sm_86")
    assert code == 0 and "pads" not in out


def test_out_gives_c_in_the_deployed_type(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "gemm", "64", "64", "64", "--precision", "bf16", "--out", "bf16", "--target",
                           "sm_86", "--json", str(tmp_path / "p.json"))  # fmt: skip
    assert code == 0 and "plus 2 bf16 ulps of |C|" in out
    p = spatialc.from_json((tmp_path / "p.json").read_text())
    assert p.output_tensor().dtype.value == "bf16"
    code, _, err = run_cli(capsys, "gemm", "64", "64", "64", "--precision", "int8", "--out", "bf16")
    assert code == 2 and err.strip() == "spatialc: error: an int8 program's output is one of int32, int64, not 'bf16'"


def test_a_program_no_sample_follows_gets_no_check_by_default_where_the_full_one_does_not_fit(monkeypatch):
    """A two-matmul program (an MLP) has no sampled check; where its full check does not fit, the default is none,
    with the reason for the check line, and a full check asked for is refused in one line."""
    from spatialc.cli.check import plan_check
    from spatialc.interp import evaluate as interp_evaluate
    from spatialc.interp.errors import TooLarge

    from ..lang.test_mlp import int8_mlp

    p = int8_mlp(requant=True)()
    monkeypatch.setattr(interp_evaluate, "physical_memory", lambda: 2**12)
    plan = plan_check(p, None, 0, full_inputs=False)
    assert plan.mode == "none" and plan.why.startswith("the default where no check fits: checking")
    with pytest.raises(TooLarge, match="use --check none"):
        plan_check(p, "full", 0, full_inputs=False)

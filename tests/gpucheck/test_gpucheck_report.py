"""The GPU check's report: the fastest right library each way, percentages, launch-bound marks, the preflight and
contestant tables, the kernel table, strict JSON. No GPU."""

from __future__ import annotations

import json

import pytest

from spatialc.gpucheck.agreement import Check
from spatialc.gpucheck.cases import Contestant, Probe, Row
from spatialc.gpucheck.report import best, percent_of, row_dict, to_markdown, write_report
from spatialc.gpucheck.timing import Timing


def t(s, method="graph", host=None):
    return Timing(s, 10, 4, s, s, method, host)


RIGHT = Check(True, 0.0, 0.0, 0, 0, 0, True)


def int8_row():
    row = Row("int8", 1024, 1024, 1024, status="ok")
    row.contestants = [
        Contestant(
            "spatialc persistent", "spatialc", t(4e-3, "events"), t(2e-3), 0.0, True, "C stored as int32", "", RIGHT
        ),
        Contestant(
            "spatialc general", "spatialc", t(8e-3, "events"), t(1e-3), 0.0, True, "C stored as int32", "", RIGHT
        ),
        Contestant("spatialc sm90a", "spatialc", t(2e-3, "events"), t(5e-4), 0.0, True, "C stored as int32", "", RIGHT),
        Contestant("torch._int_mm (B column-major)", "cublas", t(3e-3, "events"), t(4e-3), 0.0, True),
        Contestant("cublasGemmEx TN", "cublas", t(5e-3, "events"), t(1e-3), 0.0, True, "no padding needed"),
        Contestant("torch._int_mm (B row-major)", "cublas", note="unavailable: CUBLAS_STATUS_NOT_SUPPORTED"),
        Contestant("Triton matmul", "triton", None, None, 9.0, False, note="wrong; not timed"),
    ]
    return row


def test_the_fastest_right_library_counts_each_way_and_is_named():
    row = int8_row()
    assert best(row, "cublas", "end_to_end").name == "torch._int_mm (B column-major)"
    assert best(row, "cublas", "kernel").name == "cublasGemmEx TN"
    assert percent_of(row, "cublas", "end_to_end", "persistent") == pytest.approx(75.0)
    assert percent_of(row, "cublas", "kernel", "persistent") == pytest.approx(50.0)
    assert percent_of(row, "cublas", "end_to_end", "general") == pytest.approx(37.5)  # each form against the same
    assert percent_of(row, "cublas", "kernel", "general") == pytest.approx(100.0)
    assert percent_of(row, "cublas", "end_to_end", "sm90a") == pytest.approx(150.0)  # faster than the library
    assert percent_of(row, "cublas", "kernel", "sm90a") == pytest.approx(200.0)
    assert best(row, "triton", "end_to_end") is None  # its result was wrong
    assert percent_of(row, "triton", "end_to_end", "persistent") is None
    d = row_dict(row)
    kernel, e2e = d["timings"]["kernel"], d["timings"]["end_to_end"]
    assert kernel["spatialc"]["persistent"]["rate"] == pytest.approx(2 * 1024**3 / 2e-3 / 1e12)
    assert kernel["spatialc"]["general"]["rate"] == pytest.approx(2 * 1024**3 / 1e-3 / 1e12)
    assert kernel["cublas_best"]["name"] == "cublasGemmEx TN"
    assert kernel["spatialc"]["persistent"]["pct_of_cublas"] == pytest.approx(50)
    assert kernel["spatialc"]["general"]["pct_of_cublas"] == pytest.approx(100)
    assert kernel["spatialc"]["sm90a"] == {
        "rate": pytest.approx(2 * 1024**3 / 5e-4 / 1e12),
        "pct_of_cublas": 200.0,
        "pct_of_triton": None,
    }
    assert e2e["cublas_best"]["name"] == "torch._int_mm (B column-major)"
    assert e2e["spatialc"]["general"] == {
        "rate": pytest.approx(0.268, rel=1e-2),
        "pct_of_cublas": 37.5,
        "pct_of_triton": None,
    }


def test_report_files_hold_the_header_the_preflight_and_every_row(tmp_path):
    header = {
        "date": "2026-01-01T00:00:00+00:00",
        "gpu": "Fake GPU",
        "sms": 114,
        "commit": "abc123",
        "warnings": ["the device has 114 SMs, fewer than the 132 that sm_90 plans for"],
        "outputs": "spatialc.gemm(…, out=…) builds each kernel to store C in torch's type",
        "preflight": [
            {"name": "device", "ok": True, "detail": "Fake GPU", "seconds": 0.1, "paths": []},
            {"name": "Triton matmul: int8 64x64x64", "ok": None, "detail": "not tried", "seconds": 0, "paths": []},
        ],
    }
    skipped = Row("bf16", 8192, 8192, 8192, status="skipped", note="not run: time budget of 270 s spent")
    wrong = Row("fp16", 64, 64, 64, status="wrong")
    broken = Check(False, float("nan"), float("nan"), 3, 0, 3, False)
    wrong.contestants = [
        Contestant("spatialc persistent", "spatialc", t(1e-5), t(1e-5), float("nan"), False, check=broken),
        Contestant("spatialc general", "spatialc", note="n/a: no general form: planted"),
        Contestant("spatialc sm90a", "spatialc", t(2e-5), t(1e-5), 0.0, True, check=RIGHT),
    ]
    js, md = write_report(tmp_path / "out", header, [int8_row(), wrong, skipped])
    data = json.loads(js.read_text())  # strict JSON: NaN written as a string
    assert data["header"]["gpu"] == "Fake GPU" and [r["status"] for r in data["rows"]] == ["ok", "wrong", "skipped"]
    assert data["rows"][1]["contestants"][0]["check"]["max_abs"] == "nan"
    text = md.read_text()
    assert "- gpu: Fake GPU" in text and "- commit: abc123" in text and "- ⚠ the device has 114 SMs" in text
    assert "- outputs: spatialc.gemm(…, out=…)" in text
    assert "| device | ok | 0.1 | Fake GPU |" in text and "| Triton matmul: int8 64x64x64 | not tried | 0 |" in text
    head = (
        "| precision | m×n×k | spatialc persistent e2e | spatialc general e2e | spatialc sm90a e2e | "
        "cuBLAS e2e (fastest) | % cuBLAS e2e | spatialc persistent kernel | spatialc general kernel | "
        "spatialc sm90a kernel | cuBLAS kernel (fastest) | % cuBLAS kernel | Triton e2e | % Triton e2e | max err | "
        "correct | status |"
    )
    per_form = "% columns, max err and correct give each spatialc kernel's: persistent / general / sm90a."
    assert head in text and per_form in text
    line = next(x for x in text.splitlines() if x.startswith("| int8 | 1024×1024×1024 |"))
    e2e = "| 0.537 TOP/s | 0.268 TOP/s | 1.07 TOP/s | 0.716 (torch._int_mm (B column-major)) | 75% / 38% / 150% |"
    assert e2e in line
    assert "| 1.07 TOP/s | 2.15 TOP/s | 4.29 TOP/s | 2.15 (cublasGemmEx TN) | 50% / 100% / 200% |" in line
    assert line.endswith("| — | — | 0 / 0 / 0 | yes / yes / yes | ok |")
    assert "| nan / — / 0 | no / — / yes | wrong |" in text and "skipped: not run: time budget" in text
    assert "| — | — | — | skipped: not run: time budget of 270 s spent |" in text  # a row with no kernel: one —
    assert "| torch._int_mm (B row-major) | — | — | — | — | unavailable: CUBLAS_STATUS_NOT_SUPPORTED |" in text
    assert "| Triton matmul | — | — | — | WRONG (9) | wrong; not timed |" in text
    assert "| spatialc persistent | 0.537 | 1.07 | events ×4, 10 reps; graph ×4, 10 reps | right (0) | C stored" in text
    assert "| spatialc general | 0.268 | 2.15 | events ×4, 10 reps; graph ×4, 10 reps | right (0) | C stored" in text
    assert "| spatialc sm90a | 1.07 | 4.29 | events ×4, 10 reps; graph ×4, 10 reps | right (0) | C stored" in text
    assert "| fp16 | 64×64×64 | spatialc general | — | — | — | — | n/a: no general form: planted |" in text
    assert text == to_markdown(header, [int8_row(), wrong, skipped])


def test_a_launch_bound_timing_is_marked():
    row = int8_row()
    row.contestants[0].end_to_end = t(4e-3, "events", host=4e-3)
    text = to_markdown({}, [row])
    assert "0.537 ‡ TOP/s" in text and "‡ launch-bound: the host issued the launches" in text
    assert "‡" not in to_markdown({}, [int8_row()])


def kernel_row(precision, n, **ptxas):
    """A row whose persistent kernel has the numbers given (ptxas's) beside a budget, and has no general form."""
    row = Row(precision, n, n, n, status="ok")
    row.kernel = {"block": "4×8×1", "sub_blocks": "2×2", "depth": 3, "sites": 99}
    facts = {"threads": 256, "blocks_per_sm": 1, "dyn_smem": 8192, "regs_est": 244, "c_elem": "bfloat16"}
    row.contestants = [
        Contestant("spatialc persistent", "spatialc", check=RIGHT, facts={**facts, "cubin": "prepared", **ptxas}),
        Contestant("spatialc general", "spatialc", note="n/a: no general form: planted"),
    ]
    return row


def test_the_kernel_table_shows_plan_budget_and_ptxas_and_flags_spills(tmp_path):
    clean = kernel_row("bf16", 1024, registers=212, spill_stores=0, spill_loads=0, static_smem=36864, stack=0)
    spills = kernel_row("int8", 2048, registers=255, spill_stores=672, spill_loads=736, static_smem=18432, stack=640)
    spills.contestants[0].facts["blocks_per_sm"] = 2  # 255 registers × 256 threads fit once per SM, not twice
    unknown = kernel_row("fp16", 512, ptxas="no nvcc (NVRTC)")
    skipped = Row("bf16", 8192, 8192, 8192, status="skipped", note="not run")
    js, md = write_report(tmp_path, {"gpu": "Fake GPU"}, [clean, spills, unknown, skipped])
    rows = json.loads(js.read_text())["rows"]
    facts = [r["contestants"][0]["facts"] if r["contestants"] else None for r in rows]
    assert facts[0]["registers"] == 212 and facts[1]["spill_loads"] == 736
    assert facts[2]["ptxas"] == "no nvcc (NVRTC)" and facts[3] is None and rows[3]["kernel"] == {}
    text = md.read_text()
    head = (
        "| precision | m×n×k | form | block | sub | depth | sites | threads | blocks/SM | dyn smem | C | regs (est) |"
    )
    kernels = "Kernels (form: the persistent kernel, its general form or the sm_90a form, one line each; plan:"
    assert head in text and kernels in text
    cells = "| persistent | 4×8×1 | 2×2 | 3 | 99 | 256 |"
    assert f"| bf16 | 1024×1024×1024 {cells} 1 | 8192 | bfloat16 | 212 (244) | 0/0 | 36864 | prepared |" in text
    assert f"| int8 | 2048×2048×2048 {cells} 2 | 8192 | bfloat16 | 255 (244) | 672/736 ⚠ | 18432 |" in text
    assert f"| fp16 | 512×512×512 {cells} 1 | 8192 | bfloat16 | — (244) | no nvcc (NVRTC) | — |" in text
    assert "| general |" not in text  # a kernel lower did not print has no kernel line …
    assert "| bf16 | 8192×8192×8192 | " not in text.split("Kernels (")[1]  # … nor a row without kernel numbers
    notes = text.split("Kernel notes:")[1]
    assert "- int8 2048x2048x2048 persistent: ptxas spills 672 B stored / 736 B loaded per thread" in notes
    assert "leave room for 1 blocks/SM; the budget planned 2" in notes
    assert "bf16 1024" not in notes and "fp16" not in notes
    assert "Kernels" not in to_markdown({}, [skipped])


def test_each_form_has_its_kernel_line_and_a_row_that_did_not_lower_keeps_its_plan():
    row = kernel_row("fp16", 256, registers=96, spill_stores=0, spill_loads=0, static_smem=0, stack=0)
    general = {"threads": 320, "blocks_per_sm": 3, "dyn_smem": 25792, "regs_est": 64, "c_elem": "float16"}
    row.contestants[1] = Contestant("spatialc general", "spatialc", check=RIGHT, facts={**general, "sites_run": 21})
    unlowered = Row("bf16", 64, 64, 64, status="error", note="lower: planted")
    unlowered.kernel = {"block": "2×4×1", "sub_blocks": "1×1", "depth": 3, "sites": 2, "out": "bf16"}
    text = to_markdown({}, [row, unlowered])
    assert "| fp16 | 256×256×256 | persistent | 4×8×1 | 2×2 | 3 | 99 | 256 | 1 | 8192 | bfloat16 | 96 (244) |" in text
    assert "| fp16 | 256×256×256 | general | 4×8×1 | 2×2 | 3 | 99 (21) | 320 | 3 | 25792 | float16 | — (64) |" in text
    assert "| bf16 | 64×64×64 | — | 2×4×1 | 1×1 | 3 | 2 | — | — | — | — | — (—) | — | — | — |" in text


def test_a_probe_list_renders_in_order():
    probes = [Probe("device", True, "x", 0.2), Probe("CUDA graphs: capture and replay", False, "refused", 0.3)]
    text = to_markdown({"preflight": [p.__dict__ for p in probes]}, [])
    assert text.index("| device | ok |") < text.index(
        "| CUDA graphs: capture and replay | unavailable | 0.3 | refused |"
    )
    assert "Preflight (0.5 s):" in text


def test_a_multicast_row_is_set_against_the_same_gemm_without_groups():
    from spatialc.gpucheck.report import multicast_lines

    def row(multicast, kernel_s, ok=True):
        general = Contestant("spatialc general", "spatialc", t(2 * kernel_s), t(kernel_s), 0.0, ok)
        return Row("bf16", 4096, 4096, 4096, 1, multicast, status="ok", contestants=[general])

    lines = multicast_lines([row((1, 1), 3e-3), row((2, 2), 2e-3), row((2, 1), 1e-3, ok=False)])
    assert "- bf16 mc2x2:4096x4096x4096: general form without groups / with them, kernel time: 1.50×" in lines
    assert any(line.startswith("- bf16 mc2x1:4096x4096x4096") and "no right, timed kernel" in line for line in lines)
    assert multicast_lines([row((1, 1), 3e-3)]) == []

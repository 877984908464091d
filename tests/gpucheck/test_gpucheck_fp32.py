"""The GPU check's float32 rows and its log rows: Triton's tutorials' vector add (the residual kind in fp32) and fused
softmax (three passes and online), `map:log_softmax:MxN` and `map:row_logsumexp:MxN` — their sizes (a map naming its
precision; fp32 a map's alone, a GEMM size refused it in words), their bytes at 4 an element, their rows on the
stand-in GPU against torch and the copy, and a planted fault in each (a log printed away, a float32 page loaded
through bf16) failing its row."""

from __future__ import annotations

import dataclasses

import pytest

from spatialc import gpucheck
from spatialc.errors import SpatialError
from spatialc.gpucheck.cases import Case, cases_of, preflight_case
from spatialc.gpucheck.preflight import hopper_case
from spatialc.gpucheck.prepare import Manifest
from spatialc.runtime import nvcc as N

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture
from .test_gpucheck_fakes import lowered_as

TORCH = {
    "residual": "torch x + r",
    "softmax": "torch softmax(x, dim=-1)",
    "softmax_online": "torch softmax(x, dim=-1)",
    "log_softmax": "torch log_softmax(x, dim=-1)",
    "row_logsumexp": "torch logsumexp(x, -1)",
}

# ---- sizes --------------------------------------------------------------------------------------------------------


def test_a_map_size_may_name_its_precision_and_fp32_is_a_maps_alone():
    sizes = ["map:softmax:64x64:fp32", "map:log_softmax:40x72", "map:row_logsumexp:40x72", "4096"]
    cases = cases_of(sizes, ["fp16", "bf16"])
    assert [str(c) for c in cases] == [
        "fp32 map:softmax:64x64",  # its own precision, whatever the run's list
        "fp16 map:log_softmax:40x72",
        "bf16 map:log_softmax:40x72",
        "fp16 map:row_logsumexp:40x72",
        "bf16 map:row_logsumexp:40x72",
        "fp16 4096x4096x4096",
        "bf16 4096x4096x4096",
    ]
    # fp32 in the run's list: every map takes it, a GEMM's size, an attention's and a fused GEMM's skip it …
    mixed = cases_of(["map:residual:40x72", "4096", "att:1x2:128:64", "fused:256"], ["bf16", "fp32"])
    assert [str(c) for c in mixed] == [
        "bf16 map:residual:40x72",
        "fp32 map:residual:40x72",
        "bf16 4096x4096x4096",
        "bf16 att:1x2:128x128x64",
        "bf16 fused:256x256x256",
    ]
    # … and one left with fp32 alone is refused in words, as a map naming a precision no map takes is.
    for size in ("4096", "mc2x1:4096", "g8:64x64x64", "att:1x2:128:64", "fused:256", "sweep:4096"):
        with pytest.raises(SpatialError, match=f"size '{size}' is a GEMM's and fp32 is the precision of programs"):
            cases_of([size], ["fp32"])
    for bad in ("map:gelu:8x8:int8", "map:gelu:8x8:e4m3"):
        with pytest.raises(SpatialError, match="a map's is one of fp16, bf16, fp32"):
            cases_of([bad], ["bf16"])
    with pytest.raises(SpatialError, match="unknown precision 'fp64'; use int8, fp16, bf16, fp32"):
        cases_of(["4096"], ["fp64"])


def test_fp32_rows_count_four_bytes_an_element_and_the_preflight_stays_a_gemms():
    vector_add, softmax, lse = cases_of(
        ["map:residual:8192x8192:fp32", "map:softmax:4096x4096:fp32", "map:row_logsumexp:8192x4096:fp32"], []
    )
    assert vector_add.ops == 3 * 8192 * 8192 * 4  # x and y read, C written: 805 MB
    assert softmax.ops == 2 * 4096 * 4096 * 4
    assert lse.ops == 8192 * 4096 * 4 + 8192 * 4  # x read, one float32 a row written
    assert cases_of(["map:row_logsumexp:8192x4096"], ["bf16"])[0].ops == 8192 * 4096 * 2 + 8192 * 2
    # A run of fp32 maps alone launches its preflight GEMMs in a GEMM's precision, never fp32.
    assert preflight_case([softmax]).precision == "fp16" and hopper_case([softmax]).precision == "bf16"


# ---- on the stand-in GPU --------------------------------------------------------------------------------------------


def test_fp32_and_log_rows_are_checked_and_timed_against_torch_and_the_copy(fake_gpu, tmp_path, capsys):
    sizes = ["map:residual:40x72:fp32", "map:softmax:40x72:fp32", "map:softmax_online:40x72:fp32"]
    sizes += ["map:log_softmax:40x72", "map:row_logsumexp:40x72"]
    status, _, rows = run(tmp_path, "--sizes", *sizes, "--precisions", "bf16", "fp32")
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    got = [(r["map"], r["precision"]) for r in rows]
    assert got == [("residual", "fp32"), ("softmax", "fp32"), ("softmax_online", "fp32")] + [
        (kind, p) for kind in ("log_softmax", "row_logsumexp") for p in ("bf16", "fp32")
    ]
    for row in rows:
        elem, size = {"bf16": ("bfloat16", 2), "fp32": ("float32", 4)}[row["precision"]]
        mine, theirs, copy = (row["by_name"][n] for n in ("spatialc general", TORCH[row["map"]], "torch copy_"))
        assert row["status"] == "ok" and mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], row
        assert mine["check"]["unwritten"] == 0 and mine["check"]["pad_unwritten"] == 0
        assert mine["facts"]["c_elem"] == elem and theirs["ok"] and copy["ok"]
        # torch's elementwise ops, softmax and log_softmax write into C (a graph holds them); logsumexp allocates.
        method = "events" if row["map"] == "row_logsumexp" else "graph"
        assert [c["kernel"]["method"] for c in (mine, theirs, copy)] == [method] * 3
        pages = {"residual": 3, "row_logsumexp": 1}.get(row["map"], 2)  # m × n tensors read or written
        want = pages * 40 * 72 * size + (40 * size if row["map"] == "row_logsumexp" else 0)
        assert row["ops"] == want == row["map_timings"]["bytes"] and copy["detail"].startswith(f"{want // 2} bytes")
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| fp32 | residual:40×72 | " in md and "| fp32 | softmax_online:40×72 (2 passes) | " in md
    assert "| bf16 | log_softmax:40×72 (3 passes) | " in md and "| fp32 | row_logsumexp:40×72 | " in md
    capsys.readouterr()


def _printed(monkeypatch, old, new):
    """Each map or row kernel's text with `old` printed as `new` (the stand-in computes what the text says)."""

    def change(lower, program, target):
        art = lower(program, target)
        assert old in art.kernel_cu or not program.name.startswith(("log_softmax", "row_logsumexp", "elementwise"))
        return dataclasses.replace(art, kernel_cu=art.kernel_cu.replace(old, new))

    lowered_as(monkeypatch, change)


@pytest.mark.parametrize(
    ("size", "old", "new"),
    [
        # log_softmax's log of each row's sum (a map of the vector, once a row), printed away
        ("map:log_softmax:40x72", "spatialc_log(v0)", "v0"),
        ("map:log_softmax:40x72:fp32", "spatialc_log(v0)", "v0"),
        # the log-sum-exp max + s, likewise
        ("map:row_logsumexp:40x72", "spatialc_log(v1)", "v1"),
        # a float32 page element loaded through bf16: the vector add's x, and the softmax's quotient's x
        ("map:residual:40x72:fp32", "= (float)SPATIALC_PAGE_LD(", "= (float)(__nv_bfloat16)SPATIALC_PAGE_LD("),
        ("map:softmax:40x72:fp32", "= (float)SPATIALC_PAGE_LD(", "= (float)(__nv_bfloat16)SPATIALC_PAGE_LD("),
    ],
)
def test_a_planted_fault_in_each_new_row_fails_it(fake_gpu, monkeypatch, tmp_path, size, old, new, capsys):
    _printed(monkeypatch, old, new)
    status, _, rows = run(tmp_path, "--sizes", size, "--precisions", "bf16")
    (row,) = rows
    mine = row["by_name"]["spatialc general"]
    assert status == 1 and row["status"] == "wrong" and "C wrong (max err" in row["note"], row["note"]
    assert not mine["check"]["correct"] and row["map_timings"]["goal"] is None
    assert row["by_name"][TORCH[row["map"]]]["ok"] and row["by_name"]["torch copy_"]["ok"]
    capsys.readouterr()


def test_a_bf16_page_loaded_through_bf16_is_no_fault(fake_gpu, monkeypatch, tmp_path, capsys):
    # The same narrowing on a bf16 row changes no value (a bf16 element is a bf16): the fault above is float32's.
    _printed(monkeypatch, "= (float)SPATIALC_PAGE_LD(", "= (float)(__nv_bfloat16)SPATIALC_PAGE_LD(")
    status, _, rows = run(tmp_path, "--sizes", "map:residual:40x72", "--precisions", "bf16")
    assert status == 0 and rows[0]["status"] == "ok", rows[0]["note"]
    capsys.readouterr()


# ---- prepared, and found by the dry run ------------------------------------------------------------------------------


def test_prepare_compiles_the_fp32_and_log_kernels_and_the_dry_run_finds_them(tmp_path, capsys, monkeypatch, fake_nvcc):
    prep = tmp_path / "prep"
    sizes = ["map:softmax:64x64:fp32", "map:log_softmax:64x64", "map:row_logsumexp:64x64:fp32"]
    assert gpucheck.main([str(prep), "--prepare", "--sizes", *sizes, "--precisions", "bf16"]) == 0
    out = capsys.readouterr().out
    # The preflight's five (in bf16: no GEMM in fp32) and each row's general form.
    assert "gpucheck prepare: 8 kernels for sm_90 with fake nvcc" in out and "8 compiled, 0 failed" in out
    cases = {e.case for e in Manifest.load(prep).entries if e.form == "general"}
    assert {"fp32 map:softmax:64x64", "bf16 map:log_softmax:64x64", "fp32 map:row_logsumexp:64x64"} <= cases
    assert "bf16 64x64x64" in cases
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    argv = ["unused", "--dry-run", "--prepared", str(prep), "--sizes", *sizes, "--precisions", "bf16"]
    assert gpucheck.main(argv) == 0
    dry = capsys.readouterr().out
    assert dry.count("    cubin     prepared: ") == 3
    lse = dry.split("fp32 map:row_logsumexp:64x64\n")[1]
    timed = next(line for line in lse.splitlines() if line.startswith("  timed     "))
    assert "torch logsumexp(x, -1): end to end + kernel only (the same call" in timed
    assert "torch copy_: kernel only, 8320 bytes copied device to device (16640 moved" in timed


def test_case_precision_fp32_builds_the_float32_program():
    from spatialc.gpucheck.builds import build_case

    built = build_case(Case(64, 64, 0, "fp32", map="softmax"), "sm_90")
    assert not built.error and built.kernel["out"] == "fp32"
    general = built.form("general")
    assert general is not None and "typedef float OPT;" in general.artifact.kernel_cu


# ---- the kernels themselves, emulated ------------------------------------------------------------------------------


@pytest.mark.emulation
@pytest.mark.parametrize("name", ["residual", "softmax", "log_softmax", "row_logsumexp"])
def test_the_fp32_kernels_emulated_meet_the_rows_bound_and_a_page_loaded_through_bf16_does_not(name):
    # The general form's own float32 kernel text, run by the host emulation on a row's inputs (uniform in ±SPREAD,
    # rows over two pages, the last partly padding, three bands on two sites), is right by the GPU check's rule; the
    # same text with its page loads rounded through bf16 (a kernel that narrowed float32 pages) is not. (One load
    # alone need not show: a row's max narrowed shifts x − max and log Σ exp(x − max) alike, and cancels.)
    import numpy as np

    import spatialc
    from spatialc.gpucheck import maps as M

    kind, case = M.kinds()[name], Case(40, 200, 0, "fp32", map=name)
    program = spatialc.build(kind.source(case, "sm_90", "fp32"), "sm_90", sites=2)
    art = spatialc.lower(program, form="general")
    rng = np.random.default_rng(7)
    values = {x: rng.uniform(-M.SPREAD, M.SPREAD, (40, 200)).astype(np.float32) for x in kind.names}
    ref, bound = kind.reference(case, [values[x].astype(np.float64) for x in kind.names], {}, np)
    got = np.asarray(spatialc.emulate(art, values), np.float32)
    assert M.check_map(got, ref, bound, "float32", np).correct
    load = "= (float)SPATIALC_PAGE_LD("
    narrowed = art.program_cu.replace(load, "= (float)(__nv_bfloat16)SPATIALC_PAGE_LD(")
    assert narrowed != art.program_cu
    bad = np.asarray(spatialc.emulate(dataclasses.replace(art, program_cu=narrowed), values), np.float32)
    assert not M.check_map(bad, ref, bound, "float32", np).correct

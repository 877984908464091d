"""The GPU check's map rows (gpucheck/maps.py, maptable.py): elementwise programs timed in GB/s against torch's
formula and a device-to-device copy of as many bytes — their sizes, their float64 reference and bound (against the
kernel itself, emulated), the rows on the stand-in GPU (a wrong element caught, a hang left out in map rows alone),
their table, and their kernel prepared and found by the dry run."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spatialc
from spatialc import ew, gpucheck
from spatialc.errors import SpatialError
from spatialc.gpucheck import maps as M
from spatialc.gpucheck.agreement import Check, values64
from spatialc.gpucheck.cases import DEFAULT_SIZES, ELEM_OF, Contestant, Row, cases_of, kernel_path
from spatialc.gpucheck.maptable import map_goal, map_lines, map_summary
from spatialc.gpucheck.prepare import Manifest
from spatialc.gpucheck.report import row_dict, to_markdown
from spatialc.gpucheck.timing import Timing
from spatialc.numerics.elementwise import GELU_TAIL, OPS
from spatialc.runtime import nvcc as N
from spatialc.runtime.tilize import bf16_bits, bf16_to_float32

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture
from .test_gpucheck_restart_faults import by_name, supervise, workers

# ---- sizes --------------------------------------------------------------------------------------------------------


def test_map_sizes_name_their_kind_and_run_in_fp16_and_bf16():
    cases = cases_of(["map:swiglu:4096x11008", "map:gelu:33x50"], ["int8", "fp16", "bf16"])
    assert [(c.size, c.precision, c.map, c.k) for c in cases] == [
        ("map:swiglu:4096x11008", "fp16", "swiglu", 0),
        ("map:swiglu:4096x11008", "bf16", "swiglu", 0),
        ("map:gelu:33x50", "fp16", "gelu", 0),
        ("map:gelu:33x50", "bf16", "gelu", 0),
    ]
    assert cases[0].ops == 3 * 4096 * 11008 * 2 and cases[2].ops == 2 * 33 * 50 * 2  # the bytes read and written
    assert str(cases[1]) == "bf16 map:swiglu:4096x11008"
    assert kernel_path(cases[0], "spatialc general") == "spatialc general (map)"  # left out in map rows alone
    for bad in ("map:attention:8x8", "map:gelu:8", "map:gelu:8x0x3", "map:gelu"):
        with pytest.raises(
            SpatialError, match=r"not map:KIND:MxN\[:PRECISION\] with KIND one of swiglu, residual, gelu, softmax, soft"
        ):
            cases_of([bad], ["bf16"])


def test_the_default_run_measures_maps_after_the_gemms_and_before_split_k():
    order = [c.size for c in cases_of(DEFAULT_SIZES, ["int8", "bf16"])]
    maps = [s for s in order if s.startswith("map:")]
    assert maps[:3] == ["map:swiglu:4096x11008", "map:swiglu:8192x14336", "map:residual:8192x8192"]
    at = order.index(maps[0])
    assert order[at - 1] == "4097x513x1031" and order[at + len(maps)] == "128x128x65536"
    # fp16 and bf16 each, the norms too (LayerNorm's four with them, the online softmax's four, fused add + RMSNorm's
    # and the row absmax's four); Triton's vector add and fused softmax in fp32 (two); the two fused rows in bf16
    # alone; three fp8; two block-scaled fp8, two MXFP8 and two block-scaled grouped; 24 attention (12 shapes, fp16
    # and bf16); 12 W4A16
    every = cases_of(DEFAULT_SIZES, ["int8", "fp16", "bf16"])
    assert len(every) == 46 + 6 + 8 + 4 + 4 + 4 + 2 + 2 + 3 + 2 + 2 + 2 + 24 + 12
    assert [c.size for c in every if c.precision == "fp32"] == ["map:residual:8192x8192", "map:softmax:4096x4096"]


# ---- the reference and the bound ----------------------------------------------------------------------------------


def test_the_float64_formula_is_the_elementwise_tables():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-6, 6, (2, 257))
    for name, f in M.F64.items():
        args = (a, b)[: OPS[name].arity]
        with np.errstate(invalid="ignore"):  # rsqrt of the negative half: NaN in both
            np.testing.assert_array_equal(f(np, *args), OPS[name].f64(*args), err_msg=name)
    x, g = rng.uniform(-4, 4, (2, 64))
    assert np.array_equal(M.reference64(M.KINDS["swiglu"].formula(), [x, g], np), x * (g / (1 + np.exp(-g))))
    assert np.array_equal(M.reference64(M.KINDS["residual"].formula(), [x, g], np), x + g)
    assert M.map_ulps(M.KINDS["swiglu"].formula()) == (3, 0.0)  # silu: 1 ulp and its rounding; the product's
    assert M.map_ulps(M.KINDS["residual"].formula()) == (1, 0.0)
    assert M.map_ulps(M.KINDS["gelu"].formula()) == (2, GELU_TAIL)


def _inputs(kind, precision, shape, seed):
    """The kind's inputs as the device draws them (uniform in ±SPREAD, rounded to the type), in storage and as
    float32 values."""
    rng = np.random.default_rng(seed)
    stored, values = [], []
    for _ in kind.names:
        x = rng.uniform(-M.SPREAD, M.SPREAD, shape).astype(np.float32)
        s = x.astype(np.float16) if precision == "fp16" else bf16_bits(x, np)
        stored.append(s)
        values.append(s.astype(np.float32) if precision == "fp16" else bf16_to_float32(s, np))
    return stored, values


@pytest.mark.emulation
@pytest.mark.parametrize("kind", sorted(M.KINDS))
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_map_bound_holds_the_kernel_emulated_and_refuses_five_steps_past_it(kind, precision):
    # The general form's own kernel text, run by the host emulation on the row's inputs, is right by the GPU check's
    # rule; one element five steps of C's type away (beyond 2 ulps at 1.0 and the kernel's half step), or poisoned,
    # is not.
    k, elem = M.KINDS[kind], ELEM_OF[precision]
    p = spatialc.build(
        spatialc.elementwise(k.expr(*ew.inputs(len(k.names))), 48, 80, precision, names=k.names, out=precision),
        "sm_90",
    )
    stored, values = _inputs(k, precision, (48, 80), 7)
    c = np.asarray(spatialc.emulate(spatialc.lower(p), dict(zip(k.names, values, strict=True))), np.float32)
    c = c.astype(np.float16) if precision == "fp16" else bf16_bits(c, np)
    ref = M.reference64(k.formula(), [values64(s, elem, np) for s in stored], np)
    bound = M.MapBound.of(k.formula(), elem, M.SPREAD)
    assert M.check_map(c, ref, bound, elem, np).correct
    at = np.unravel_index(np.argmax(np.abs(ref)), ref.shape)
    for step in (1, -1):
        off = c.copy()
        bits = off.view(np.uint16)
        bits[at] += np.uint16(5) if step > 0 else -np.uint16(5)  # five steps of C's type, in magnitude either way
        assert not M.check_map(off, ref, bound, elem, np).correct
    poisoned = c.copy()
    poisoned[0, 0] = np.float16("nan") if precision == "fp16" else 0xFFFF
    check = M.check_map(poisoned, ref, bound, elem, np)
    assert not check.correct and check.unwritten == 1 and check.nonfinite == 1


# ---- on the stand-in GPU --------------------------------------------------------------------------------------------


def test_a_map_row_is_checked_and_timed_against_torch_and_the_copy(fake_gpu, tmp_path, capsys):
    sizes = ("map:swiglu:40x72", "map:gelu:33x50", "map:residual:64x64", "32")
    status, header, rows = run(tmp_path, "--sizes", *sizes, "--precisions", "fp16", "bf16")
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    assert [r["status"] for r in rows] == ["ok"] * 8
    torch_names = ["torch F.silu(gate) * x", 'torch F.gelu(x, approximate="tanh")', "torch x + r"]
    for r, kind, torch_name in zip(rows[:6:2], ("swiglu", "gelu", "residual"), torch_names, strict=True):
        for row in (r, rows[rows.index(r) + 1]):  # fp16, then bf16
            mine = row["by_name"]["spatialc general"]
            assert mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], mine["note"]
            assert mine["check"]["unwritten"] == 0 and mine["check"]["nonfinite"] == 0
            assert mine["kernel"]["method"] == "graph" and mine["end_to_end"]["method"] == "events"
            assert mine["facts"]["c_elem"] == {"fp16": "float16", "bf16": "bfloat16"}[row["precision"]]
            # The persistent form prints a map, but the row times the general form alone (auto's); the sm_90a form
            # refuses it, with lower's own reason.
            note = row["by_name"]["spatialc persistent"]["note"]
            assert note == "n/a: lowered, but a map row times its general form alone"
            note = row["by_name"]["spatialc sm90a"]["note"]
            assert note.startswith("n/a: cannot lower a program without a tile matmul (an elementwise map)")
            theirs, copy = row["by_name"][torch_name], row["by_name"]["torch copy_"]
            assert theirs["ok"] and theirs["kernel"]["method"] == "graph" and theirs["end_to_end"]["median_s"] > 0
            assert copy["ok"] and copy["kernel"]["median_s"] > 0 and copy["end_to_end"] is None
            assert copy["detail"].startswith(f"{row['ops'] // 2} bytes read and as many written")
            summary = row["map_timings"]
            assert row["unit"] == "GB/s" and summary["bytes"] == row["ops"] and "timings" not in row
            assert row["map"] == kind  # the row's kind; its rates are under map_timings
            assert summary["spatialc"]["kernel"] == pytest.approx(row["ops"] / mine["kernel"]["median_s"] / 1e9)
            assert summary["copy"]["kernel"]["name"] == "torch copy_" and summary["pct_of_copy"] > 0
            assert summary["torch"]["end_to_end"]["name"] == torch_name and summary["goal"] is not None
    swiglu = rows[0]["map_timings"]  # each of the stand-in's launches takes one clock step: torch's two ops take two
    assert swiglu["pct_of_torch"]["kernel"] == pytest.approx(200, rel=1e-3)
    assert swiglu["pct_of_copy"] == pytest.approx(100, rel=1e-3)
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| bf16 | swiglu:40×72 | 0.0173 | " in md and "| 200% / 200% | 100% | " in md  # the map table
    assert "| fp16 | 32×32×32 |" in md and "| fp16 | swiglu:40×72 |" not in md.split("Maps (")[0]  # not the main
    assert "| fp16 | map:swiglu:40×72 | general | 1×1×1 |" in md  # the kernel table has its kernel
    capsys.readouterr()


@pytest.mark.parametrize(("fault", "said"), [("skew", "C wrong (max err"), ("miss", "1 element unwritten")])
def test_a_map_kernel_with_a_wrong_element_fails_its_row(fake_gpu, tmp_path, fault, said, capsys):
    fake_gpu["fault"] = (fault, "40x72")  # the map's kernel alone
    status, _, rows = run(tmp_path, "--sizes", "map:swiglu:40x72", "--precisions", "bf16")
    (row,) = rows
    mine = row["by_name"]["spatialc general"]
    assert status == 1 and row["status"] == "wrong" and said in row["note"], row["note"]
    assert not mine["check"]["correct"] and mine["check"]["unwritten"] == (fault == "miss")
    assert row["map_timings"]["goal"] is None  # a wrong kernel's speed meets no goal
    assert row["by_name"]["torch F.silu(gate) * x"]["ok"] and row["by_name"]["torch copy_"]["ok"]
    capsys.readouterr()


def test_a_map_kernel_that_hangs_is_left_out_of_map_rows_alone(fake_gpu, monkeypatch, tmp_path, capsys):
    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "40x72"), None])
    status, header, rows = supervise(tmp_path, run_worker, ["32", "map:swiglu:40x72", "map:residual:40x72"])
    assert seen == [3, 1] and header["restarts"][0].startswith("spatialc general (map) lost the GPU on row 2/3")
    assert by_name(rows[0])["spatialc general"]["ok"]  # the GEMM's general form runs on
    for r in rows[1:]:  # both map rows without the map kernel, their libraries measured
        assert r["status"] == "error" and by_name(r)["spatialc general"]["note"].startswith("unavailable: lost")
        assert by_name(r)["torch copy_"]["ok"]


# ---- the table ------------------------------------------------------------------------------------------------------


def t(s, method="graph"):
    return Timing(s, 10, 4, s, s, method)


def map_row(mine_s=2e-3, torch_s=2.5e-3, copy_s=1.9e-3, correct=True):
    row = Row("bf16", 8192, 8192, 0, status="ok", map="residual")
    check = Check(correct, 0.01, 0.001, 0, 0, 0, True)
    row.contestants = [
        Contestant("spatialc persistent", "spatialc", note="n/a: cannot lower a program without a tile matmul"),
        Contestant("spatialc general", "spatialc", t(4e-3, "events"), t(mine_s), 0.01, correct, "", "", check),
        Contestant("torch x + r", "torch", t(3e-3, "events"), t(torch_s), 0.02, True),
        Contestant("torch copy_", "copy", None, t(copy_s), 0.0, True),
    ]
    return row


def test_the_map_table_gives_gb_s_and_shares_of_torch_and_the_copy():
    row = map_row()
    gb = 3 * 8192 * 8192 * 2 / 1e9  # x and r read, C written
    summary = row_dict(row)["map_timings"]
    assert summary["spatialc"] == {"end_to_end": pytest.approx(gb / 4e-3), "kernel": pytest.approx(gb / 2e-3)}
    assert summary["torch"]["kernel"] == {"name": "torch x + r", "rate": pytest.approx(gb / 2.5e-3)}
    assert summary["copy"] == {"kernel": {"name": "torch copy_", "rate": pytest.approx(gb / 1.9e-3)}}
    assert summary["pct_of_torch"] == {"end_to_end": pytest.approx(75), "kernel": pytest.approx(125)}
    assert summary["pct_of_copy"] == pytest.approx(95) and summary["goal"] == "met"
    assert map_goal(map_row(mine_s=2e-3, torch_s=2e-3)) == "met"  # as fast as torch
    assert map_goal(map_row(mine_s=2.04e-3, torch_s=2e-3)) == "met"  # 98% of torch: within the timing noise
    assert map_goal(map_row(mine_s=2.1e-3, torch_s=2e-3)) == "missed: 95% of torch (goal 100%)"
    assert map_goal(map_row(mine_s=3e-3)) == "missed: 63% of copy (goal 90%), 83% of torch (goal 100%)"
    assert map_goal(map_row(correct=False)) is None and map_summary(map_row(correct=False))["goal"] is None
    lines = map_lines([map_row(), Row("bf16", 64, 64, 64, status="ok")])
    assert len(lines) == 6 and lines[-1].startswith(
        "| bf16 | residual:8192×8192 | 402.7 | 201.3 | 100.7 | 161.1 | 134.2 | 211.9 |"
    )
    assert lines[-1].endswith("| 125% / 75% | 95% | 0.01 | yes | met | ok |")
    md = to_markdown({}, [map_row()])
    assert "| precision | m×n×k | spatialc persistent e2e" not in md  # no product: no main table
    assert "| bf16 | map:residual:8192×8192 | torch copy_ | — | 211.9 | " in md  # the contestants table, in GB/s
    assert json.loads(json.dumps(row_dict(row)))["unit"] == "GB/s"


# ---- prepared, and found by the dry run ------------------------------------------------------------------------------


def test_prepare_compiles_the_map_kernel_and_the_dry_run_finds_it(tmp_path, capsys, monkeypatch, fake_nvcc):
    prep = tmp_path / "prep"
    assert gpucheck.main([str(prep), "--prepare", "--sizes", "map:residual:64x64", "--precisions", "bf16"]) == 0
    out = capsys.readouterr().out
    # The preflight's five (64³ in three forms, the sm_90a form at the large rows' plan, the cluster kernel) and the
    # map's general form; its other forms are no failure.
    assert "gpucheck prepare: 6 kernels for sm_90 with fake nvcc" in out and "6 compiled, 0 failed" in out
    assert "bf16 map:residual:64x64 persistent: lowered, but a map row times its general form alone" in out
    assert "bf16 map:residual:64x64 sm90a: cannot lower a program without a tile matmul" in out
    entry = next(e for e in Manifest.load(prep).entries if e.case == "bf16 map:residual:64x64")
    assert (entry.form, entry.arch, entry.kernel_name) == ("general", "sm_90", "spatialc_general") and entry.cubin
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    argv = ["unused", "--dry-run", "--prepared", str(prep), "--sizes", "map:residual:64x64", "--precisions", "bf16"]
    assert gpucheck.main(argv) == 0
    dry = capsys.readouterr().out.split("bf16 map:residual:64x64\n")[1]
    assert dry.count("    cubin     prepared: ") == 1 and "  spatialc general\n    launch    grid " in dry
    timed = next(line for line in dry.splitlines() if line.startswith("  timed     "))
    assert "spatialc general: end to end + kernel only, checked against the formula in float64" in timed
    assert (
        "torch x + r: end to end + kernel only" in timed
        and "torch copy_: kernel only, 12288 bytes copied device to device (24576 moved" in timed
    )

"""The GPU check's norm rows (gpucheck/norms.py, measured by maprows.py as every map row is): softmax and RMSNorm as
map rows — their sizes and place in the run, their float64 reference and carried bound against the numerics' own
(`numerics.reference.row_stages`) and against the kernel itself, emulated; the rows on the stand-in GPU (checked and
timed, a wrong element caught, a hang left out in norm rows alone), their table, their kernels prepared and found by
the dry run."""

from __future__ import annotations

import numpy as np
import pytest

import spatialc
from spatialc import gpucheck
from spatialc.errors import SpatialError
from spatialc.gpucheck import maps as M
from spatialc.gpucheck import norms as NM
from spatialc.gpucheck.agreement import Check
from spatialc.gpucheck.cases import DEFAULT_SIZES, ELEM_OF, Case, Contestant, Row, cases_of, kernel_path
from spatialc.gpucheck.maptable import map_lines
from spatialc.gpucheck.prepare import Manifest
from spatialc.gpucheck.report import row_dict, to_markdown
from spatialc.gpucheck.timing import Timing
from spatialc.ir.ops import Apply, Arg
from spatialc.numerics.reductions import REDUCTIONS, reduce_bound
from spatialc.numerics.reference import declared_outputs, row_stages
from spatialc.numerics.tolerance import out_rounding, tolerance
from spatialc.runtime import launch as L
from spatialc.runtime import nvcc as N
from spatialc.runtime.tilize import bf16_bits, bf16_to_float32

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture
from .test_gpucheck_restart_faults import by_name, supervise, workers

# ---- sizes --------------------------------------------------------------------------------------------------------


def test_norm_sizes_are_map_sizes_of_their_own_kinds():
    cases = cases_of(["map:softmax:4096x4096", "map:rmsnorm:33x50"], ["int8", "fp16", "bf16"])
    assert [(c.size, c.precision, c.map, c.k) for c in cases] == [
        ("map:softmax:4096x4096", "fp16", "softmax", 0),
        ("map:softmax:4096x4096", "bf16", "softmax", 0),
        ("map:rmsnorm:33x50", "fp16", "rmsnorm", 0),
        ("map:rmsnorm:33x50", "bf16", "rmsnorm", 0),
    ]
    # The bytes the function must move, x read and C written once: not the kernel's three (two) passes over x.
    assert cases[0].ops == 2 * 4096 * 4096 * 2 and cases[2].ops == 2 * 33 * 50 * 2
    assert [M.kind_of(c).passes for c in cases[::2]] == [3, 2]
    # A norm's kernel lost is left out of norm rows alone; the elementwise maps' of theirs.
    assert kernel_path(cases[0], "spatialc general") == "spatialc general (norm)"
    assert kernel_path(cases_of(["map:gelu:8x8"], ["bf16"])[0], "spatialc general") == "spatialc general (map)"


def test_the_default_run_measures_the_norms_after_the_maps_and_before_split_k():
    order = [c.size for c in cases_of(DEFAULT_SIZES, ["bf16"])]
    at = order.index("map:residual:8192x8192")
    norms = ["map:softmax:4096x4096", "map:softmax:8192x8192", "map:softmax_online:4096x4096"]
    norms += ["map:softmax_online:8192x8192", "map:rmsnorm:8192x4096", "map:rmsnorm:16384x8192"]
    norms += ["map:layernorm:8192x4096", "map:layernorm:16384x8192"]
    norms += ["map:fused_add_rmsnorm:8192x4096", "map:row_absmax:8192x4096"]  # (a row sum's by --sizes alone)
    # … then Triton's float32 tutorials, the vector add and the fused softmax, whatever the run's precisions.
    norms += ["map:residual:8192x8192", "map:softmax:4096x4096"]
    assert order[at + 1 : at + 13] == norms and order[at + 13] == "128x128x65536"


# ---- the reference and its bound ----------------------------------------------------------------------------------


def _inputs(kind, precision, shape, seed):
    """x as the device draws it (uniform in ±SPREAD, rounded to the type) and the weight (uniform in PARAM_RANGE,
    rounded alike): stored, and as float32 values by name."""
    rng = np.random.default_rng(seed)

    def rounded(x):
        x = x.astype(np.float32)
        if precision == "fp32":
            return x, x
        s = x.astype(np.float16) if precision == "fp16" else bf16_bits(x, np)
        return s, (s.astype(np.float32) if precision == "fp16" else bf16_to_float32(s, np))

    stored, values = {}, {}
    for name in kind.names:
        stored[name], values[name] = rounded(rng.uniform(-M.SPREAD, M.SPREAD, shape))
    for name in kind.params:
        stored[name], values[name] = rounded(rng.uniform(*M.PARAM_RANGE, shape[1]))
    return stored, values


def _reference(kind, case, values):
    """The kind's reference and bound on numpy, as the device computes them."""
    ins = [values[n].astype(np.float64) for n in kind.names]
    return kind.reference(case, ins, {n: values[n].astype(np.float64) for n in kind.params}, np)


# Kinds whose outputs add values of either sign (x + residual, a row's sum): near a cancellation the carried bound,
# n + 2 float32 ulps of the terms' magnitudes, is more than an ulp of the small result.
CANCELLING = {"fused_add_rmsnorm", "row_sum"}


@pytest.mark.parametrize("name", sorted(NM.NORMS))
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_the_device_reference_and_bound_are_the_numerics_own(name, precision):
    # What the device computes (norms.carried_rows, here on numpy) is what numerics.reference.row_stages computes for
    # the interpreter and the kernel's tolerance: the value, and the bound carried to it, element by element.
    # LayerNorm's three outputs each (its kernel stores every one as float32, mean's and rstd's type); the log rows'
    # log carried too; in fp32 as in fp16 and bf16.
    kind, case = NM.NORMS[name], Case(40, 200, 0, precision, map=name)
    _, values = _inputs(kind, precision, (40, 200), 3)
    ins = [values[n].astype(np.float64) for n in kind.names]
    refs = kind.references(case, ins, {n: values[n].astype(np.float64) for n in kind.params}, np)
    program = kind.source(case, "sm_90", kind.kernel_out(case, precision))
    want, allowed = tolerance(spatialc.build(program, "sm_90"), kernel=True)._against(values)
    decls = declared_outputs(program)
    assert [d.out.name for d in decls] == list(kind.outputs or ["out"]) and len(refs) == len(decls)
    for decl in decls:
        ref, bound = refs[decl.out.name]
        value, err = row_stages(program, decl, values, bounds=True)
        np.testing.assert_allclose(ref, value, rtol=2.0**-23, atol=0)  # a row sum in float64, not fsum: an ulp at most
        np.testing.assert_allclose(bound.err, err, rtol=1e-12, atol=0)
        # … and the tolerance's bound is the same, about C rounded to its type (and at least that type's least step).
        eps = M.C_EPS[bound.elem]
        w, a = (want[decl.out.name], allowed[decl.out.name]) if kind.outputs else (want, allowed)
        np.testing.assert_allclose(a - out_rounding(eps, w.astype(np.float64)), err, rtol=1e-9, atol=1e-37)
        if bound.elem != "float32" and name not in CANCELLING:  # the carried part: below one ulp of C's type here
            assert bool(np.all(bound.err < eps * np.abs(ref)))
        assert bound.text.startswith("each row sum within 202 float32 ulps of its magnitude")
    assert {b.elem for _, b in refs.values()} == ({"float32"} if kind.out == "float32" else {ELEM_OF[precision]})
    assert kind.reference(case, ins, {n: values[n].astype(np.float64) for n in kind.params}, np)[0] is not None


def test_each_reduction_is_the_numerics_own_and_the_carried_map_takes_the_norms_ops_alone():
    rng = np.random.default_rng(5)
    x = np.asarray(rng.uniform(-4, 4, (6, 37)), np.float32).astype(np.float64)
    e = rng.uniform(0, 1e-3, (6, 37))
    for name in REDUCTIONS:
        value, err = NM.reduced(name, x, e, np)
        want, want_err = reduce_bound(name, x, e)
        np.testing.assert_allclose(value, want, rtol=2.0**-23, atol=0, err_msg=name)
        np.testing.assert_allclose(err, want_err, rtol=1e-12, atol=0, err_msg=name)
    pages = [(np.ones((2, 2)), np.zeros((1, 1)))]
    with pytest.raises(SpatialError, match="carries no bound through 'silu'"):  # a turning point: not by corners
        NM.carried(Apply("silu", (Arg(0),)), pages, lambda c: None, np)


ONE_OUTPUT = sorted(name for name, kind in NM.NORMS.items() if not kind.outputs)


@pytest.mark.emulation
@pytest.mark.parametrize("name", ONE_OUTPUT)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_norm_bound_holds_the_kernel_emulated_and_refuses_five_steps_past_it(name, precision):
    # The general form's own kernel text, run by the host emulation on the row's inputs (rows of 13 tiles over two
    # pages, the last partly padding; three bands on two sites), is right by the GPU check's rule; one element five
    # steps of C's type away, or poisoned, is not.
    kind, case, elem = NM.NORMS[name], Case(40, 200, 0, precision, map=name), ELEM_OF[precision]
    program = spatialc.build(kind.source(case, "sm_90", precision), "sm_90", sites=2)
    stored, values = _inputs(kind, precision, (40, 200), 11)
    c = np.asarray(spatialc.emulate(spatialc.lower(program), values), np.float32)
    c = c.astype(np.float16) if precision == "fp16" else bf16_bits(c, np)
    ref, bound = _reference(kind, case, values)
    assert M.check_map(c, ref, bound, elem, np).correct
    at = np.unravel_index(np.argmax(np.abs(ref)), ref.shape)
    for step in (1, -1):
        off = c.copy()
        bits = off.view(np.uint16)
        bits[at] += np.uint16(5) if step > 0 else -np.uint16(5)  # five steps of C's type, in magnitude either way
        assert not M.check_map(off, ref, bound, elem, np).correct
    poisoned = c.copy()
    poisoned[3, 7 % c.shape[1]] = np.float16("nan") if precision == "fp16" else 0xFFFF  # (a row vector: column 0)
    check = M.check_map(poisoned, ref, bound, elem, np)
    assert not check.correct and check.unwritten == 1 and check.nonfinite == 1


@pytest.mark.emulation
def test_each_layernorm_output_is_within_its_bound_emulated_and_a_wrong_one_is_not():
    # The general form's LayerNorm kernel (out, mean and rstd, all float32), emulated on a row's inputs (rows of 13
    # tiles over pages, three bands on two sites): each output within its own bound; mean off by 0.001 at one row,
    # or mean and rstd exchanged, or one poisoned value, is not.
    from spatialc.gpucheck.maprows import check_outputs

    kind, case = NM.NORMS["layernorm"], Case(40, 200, 0, "bf16", map="layernorm")
    program = spatialc.build(kind.source(case, "sm_90", kind.kernel_out(case, "bf16")), "sm_90", sites=2)
    art = spatialc.lower(program)
    _, values = _inputs(kind, "bf16", (40, 200), 11)
    got = spatialc.emulate(art, values)
    ins = [values[n].astype(np.float64) for n in kind.names]
    refs = kind.references(case, ins, {n: values[n].astype(np.float64) for n in kind.params}, np)

    class Prep:  # what check_outputs reads of a prepared kernel: each output's element type
        @staticmethod
        def output_arg(name):
            return next(a for a in L.kernel_args(art.launch) if a.name == name)

    assert list(got) == ["out", "mean", "rstd"] and got["mean"].shape == (40, 1)
    check = check_outputs(Prep, got, refs, np)
    assert check.correct and check.unwritten == 0, check
    off = {**got, "mean": got["mean"].copy()}
    off["mean"][7, 0] += np.float32(1e-3)  # its bound: about 5e-5 (202 float32 ulps of Σ|x| ≈ 400, over n)
    assert not check_outputs(Prep, off, refs, np).correct
    assert not check_outputs(Prep, {**got, "mean": got["rstd"], "rstd": got["mean"]}, refs, np).correct
    poisoned = {**got, "rstd": got["rstd"].copy()}
    poisoned["rstd"][3, 0] = np.nan
    bad = check_outputs(Prep, poisoned, refs, np)
    assert not bad.correct and bad.unwritten == 1 and bad.nonfinite == 1


# ---- on the stand-in GPU --------------------------------------------------------------------------------------------


def test_a_norm_row_is_checked_and_timed_against_torch_and_the_copy(fake_gpu, tmp_path, capsys):
    sizes = ("map:softmax:40x72", "map:rmsnorm:33x50")
    status, header, rows = run(tmp_path, "--sizes", *sizes, "--precisions", "fp16", "bf16")
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    assert [r["status"] for r in rows] == ["ok"] * 4
    torch_names = {"softmax": "torch softmax(x, dim=-1)", "rmsnorm": "torch F.rms_norm(x, (n,), w, eps=1e-06)"}
    for row in rows:
        mine, theirs = row["by_name"]["spatialc general"], row["by_name"][torch_names[row["map"]]]
        assert mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], mine["note"]
        assert mine["check"]["unwritten"] == 0 and mine["check"]["pad_unwritten"] == 0
        assert mine["facts"]["c_elem"] == {"fp16": "float16", "bf16": "bfloat16"}[row["precision"]]
        assert "each row sum within" in mine["detail"]
        # The persistent form prints a norm, but the row times the general form alone (auto's); the sm_90a form
        # refuses it, with lower's own reason.
        assert (
            row["by_name"]["spatialc persistent"]["note"] == "n/a: lowered, but a map row times its general form alone"
        )
        assert row["by_name"]["spatialc sm90a"]["note"].startswith("n/a: cannot lower a program that reduces rows")
        # softmax's torch writes into C through aten's _softmax.out, so its row is timed by graphs; rms_norm has no
        # such form, so every contestant of its row is timed by events.
        method = "graph" if row["map"] == "softmax" else "events"
        copy = row["by_name"]["torch copy_"]
        assert [c["kernel"]["method"] for c in (mine, theirs, copy)] == [method] * 3
        assert theirs["ok"] and copy["ok"] and copy["detail"].startswith(f"{row['ops'] // 2} bytes read")
        summary = row["map_timings"]
        assert row["unit"] == "GB/s" and summary["bytes"] == row["ops"] == 2 * row["m"] * row["n"] * 2
        assert summary["torch"]["kernel"]["name"] == torch_names[row["map"]] and summary["goal"] is not None
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| fp16 | softmax:40×72 (3 passes) | 0.0115 | " in md and "| bf16 | rmsnorm:33×50 (2 passes) | " in md
    assert "| fp16 | map:softmax:40×72 | general | " in md  # the kernel table, the kind's x left alone
    capsys.readouterr()


@pytest.mark.parametrize(("fault", "said"), [("skew", "C wrong (max err"), ("miss", "1 element unwritten")])
def test_a_norm_kernel_with_a_wrong_element_fails_its_row(fake_gpu, tmp_path, fault, said, capsys):
    fake_gpu["fault"] = (fault, "33x50")
    status, _, rows = run(tmp_path, "--sizes", "map:rmsnorm:33x50", "--precisions", "fp16")
    (row,) = rows
    mine = row["by_name"]["spatialc general"]
    assert status == 1 and row["status"] == "wrong" and said in row["note"], row["note"]
    assert not mine["check"]["correct"] and row["map_timings"]["goal"] is None
    assert row["by_name"]["torch F.rms_norm(x, (n,), w, eps=1e-06)"]["ok"] and row["by_name"]["torch copy_"]["ok"]
    capsys.readouterr()


def test_a_norm_kernel_that_hangs_is_left_out_of_norm_rows_alone(fake_gpu, monkeypatch, tmp_path, capsys):
    run_worker, seen = workers(fake_gpu, monkeypatch, [("hang", "40x72", "spatialc_general"), None])
    sizes = ["map:softmax:40x72", "map:residual:40x72", "map:rmsnorm:40x72"]
    status, header, rows = supervise(tmp_path, run_worker, sizes)
    assert seen == [3, 1] and header["restarts"][0].startswith("spatialc general (norm) lost the GPU on row 1/3")
    assert by_name(rows[1])["spatialc general"]["ok"]  # the elementwise map's kernel runs on
    for r in (rows[0], rows[2]):  # both norm rows without the norm kernel, their libraries measured
        assert r["status"] == "error" and by_name(r)["spatialc general"]["note"].startswith("unavailable: lost")
        assert by_name(r)["torch copy_"]["ok"]
    capsys.readouterr()


LN_TORCH = "torch F.layer_norm(x, (n,), w, b, eps=1e-05)"


def test_a_layernorm_row_checks_each_output_and_is_timed_against_torch_and_the_copy(fake_gpu, tmp_path, capsys):
    status, header, rows = run(tmp_path, "--sizes", "map:layernorm:40x72", "--precisions", "fp16", "bf16")
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    for row in rows:
        assert row["status"] == "ok" and row["kernel"]["out"] == "float32", row["note"]
        mine, theirs, copy = (row["by_name"][n] for n in ("spatialc general", LN_TORCH, "torch copy_"))
        assert mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], mine["note"]
        assert mine["check"]["unwritten"] == 0 and mine["check"]["pad_unwritten"] == 0
        assert mine["facts"]["c_elem"] == "float32"  # out, mean and rstd alike: layernorm's default out
        assert mine["detail"].startswith("out, mean, rstd stored as float32, each against its own stages: checked each")
        assert "untilize each output; the kernel reads x 3 times" in mine["detail"]
        assert [c["kernel"]["method"] for c in (mine, theirs, copy)] == ["events"] * 3  # torch has no out= form
        assert theirs["ok"] and copy["ok"]
        # The bytes torch's kernel must move: x and out in the inputs' type, mean and rstd as float32.
        assert row["ops"] == 2 * 40 * 72 * 2 + 2 * 40 * 4 == row["map_timings"]["bytes"]
        assert copy["detail"].startswith(f"{row['ops'] // 2} bytes read")
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| fp16 | layernorm:40×72 (3 passes) | " in md and "| bf16 | map:layernorm:40×72 | general | " in md
    capsys.readouterr()


@pytest.mark.parametrize(
    ("fault", "said"),
    [("swap", "C wrong (max err"), ("rstd", "C wrong (max err"), ("miss", "1 element unwritten")],
)
def test_a_layernorm_kernel_with_one_wrong_output_fails_its_row(fake_gpu, tmp_path, fault, said, capsys):
    # mean and rstd exchanged, rstd off by a part in a thousand at one row, or an element of out left poisoned: the
    # row checks every output, not out alone.
    fake_gpu["fault"] = (fault, "40x72")
    status, _, rows = run(tmp_path, "--sizes", "map:layernorm:40x72", "--precisions", "bf16")
    (row,) = rows
    mine = row["by_name"]["spatialc general"]
    assert status == 1 and row["status"] == "wrong" and said in row["note"], row["note"]
    assert not mine["check"]["correct"] and row["map_timings"]["goal"] is None
    assert row["by_name"][LN_TORCH]["ok"] and row["by_name"]["torch copy_"]["ok"]
    capsys.readouterr()


FUSED_TORCH = "torch h = x + r; F.rms_norm(h, (n,), w, eps=1e-06)"
REDUCE_TORCH = {"row_absmax": "torch x.abs().amax(-1)", "row_sum": "torch x.sum(-1)"}


def test_fused_add_rmsnorm_and_row_reduction_rows_are_checked_and_timed_against_torch_and_the_copy(
    fake_gpu, tmp_path, capsys
):
    # Fused add + RMSNorm: out and residual_out each checked, in the inputs' type, x and residual read and both
    # written; a row absmax and a row sum: their m × 1 vector, x read and m values written. torch's calls allocate:
    # every contestant timed by events.
    sizes = ("map:fused_add_rmsnorm:40x72", "map:row_absmax:40x72", "map:row_sum:40x72")
    status, _, rows = run(tmp_path, "--sizes", *sizes, "--precisions", "fp16", "bf16")
    assert status == 0, [(r["size"], r["note"]) for r in rows]
    assert [r["map"] for r in rows] == ["fused_add_rmsnorm"] * 2 + ["row_absmax"] * 2 + ["row_sum"] * 2
    for row in rows:
        elem = {"fp16": "float16", "bf16": "bfloat16"}[row["precision"]]
        torch_name = FUSED_TORCH if row["map"] == "fused_add_rmsnorm" else REDUCE_TORCH[row["map"]]
        mine, theirs, copy = (row["by_name"][n] for n in ("spatialc general", torch_name, "torch copy_"))
        assert row["status"] == "ok" and mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], row
        assert mine["check"]["unwritten"] == 0 and mine["check"]["pad_unwritten"] == 0
        assert mine["facts"]["c_elem"] == elem and row["kernel"]["out"] == row["precision"]
        assert [c["kernel"]["method"] for c in (mine, theirs, copy)] == ["events"] * 3
        assert theirs["ok"] and copy["ok"] and copy["detail"].startswith(f"{row['ops'] // 2} bytes read")
        if row["map"] == "fused_add_rmsnorm":
            assert mine["detail"].startswith(f"out, residual_out stored as {elem}, each against its own stages")
            assert "the kernel reads x 2 times" in mine["detail"]
            assert row["ops"] == 4 * 40 * 72 * 2 == row["map_timings"]["bytes"]  # x, residual read; both written
        else:
            assert mine["detail"].startswith(f"C stored as {elem}, checked each row sum within 74 float32 ulps")
            assert "reads x" not in mine["detail"]
            assert row["ops"] == 40 * 72 * 2 + 40 * 2 == row["map_timings"]["bytes"]  # x read, a value a row written
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| bf16 | fused_add_rmsnorm:40×72 (2 passes) | " in md and "| fp16 | row_absmax:40×72 | " in md
    capsys.readouterr()


@pytest.mark.parametrize(
    ("size", "fault"),
    [("map:fused_add_rmsnorm:40x72", "first"), ("map:fused_add_rmsnorm:40x72", "miss"), ("map:row_sum:40x72", "skew")],
)
def test_a_fused_add_rmsnorm_or_row_reduction_kernel_with_a_wrong_output_fails_its_row(
    fake_gpu, tmp_path, size, fault, capsys
):
    # residual_out stored from out's values, an element of out left poisoned, a row's sum half as large again: the
    # row checks every output, not the first alone, and its vectors too.
    fake_gpu["fault"] = (fault, "40x1" if "row_sum" in size else "40x72")  # the kernel of that first output
    status, _, rows = run(tmp_path, "--sizes", size, "--precisions", "bf16")
    (row,) = rows
    mine = row["by_name"]["spatialc general"]
    said = "1 element unwritten" if fault == "miss" else "C wrong (max err"
    assert status == 1 and row["status"] == "wrong" and said in row["note"], row["note"]
    assert not mine["check"]["correct"] and row["map_timings"]["goal"] is None
    assert row["by_name"]["torch copy_"]["ok"]


def test_a_row_absmax_printed_as_a_max_fails_its_row(fake_gpu, monkeypatch, tmp_path, capsys):
    # The kernel's text with the absmax's fold printed as a max's: the stand-in computes what the text says (a max),
    # and the row's check against the absmax's reference finds it wrong; torch's x.abs().amax(-1) is right.
    import dataclasses

    from .test_gpucheck_fakes import lowered_as

    fold = "spatialc_max(racc_2[q], spatialc_abs(x))"

    def as_max(lower, program, target):  # (the preflight's GEMM as it is)
        art = lower(program, target)
        return dataclasses.replace(art, kernel_cu=art.kernel_cu.replace(fold, "spatialc_max(racc_2[q], x)"))

    lowered_as(monkeypatch, as_max)
    status, _, rows = run(tmp_path, "--sizes", "map:row_absmax:40x72", "--precisions", "fp16")
    (row,) = rows
    assert status == 1 and row["status"] == "wrong" and "C wrong (max err" in row["note"], row["note"]
    assert row["by_name"][REDUCE_TORCH["row_absmax"]]["ok"]
    capsys.readouterr()


# ---- the table ------------------------------------------------------------------------------------------------------


def t(s, method="events"):
    return Timing(s, 10, 4, s, s, method)


def test_the_norm_table_counts_the_functions_bytes_and_says_the_passes():
    row = Row("bf16", 8192, 4096, 0, status="ok", map="rmsnorm")
    check = Check(True, 0.01, 0.001, 0, 0, 0, True)
    torch_name = "torch F.rms_norm(x, (n,), w, eps=1e-06)"
    row.contestants = [
        Contestant("spatialc general", "spatialc", t(4e-3), t(2e-4), 0.01, True, "", "", check),
        Contestant(torch_name, "torch", t(2e-4), t(2e-4), 0.02, True),
        Contestant("torch copy_", "copy", None, t(1.8e-4), 0.0, True),
    ]
    gb = 2 * 8192 * 4096 * 2 / 1e9  # x read once, C written once
    summary = row_dict(row)["map_timings"]
    assert summary["spatialc"]["kernel"] == pytest.approx(gb / 2e-4) and summary["pct_of_copy"] == pytest.approx(90)
    assert summary["goal"] == "met"
    (line,) = [x for x in map_lines([row]) if x.startswith("| bf16")]
    assert line.startswith("| bf16 | rmsnorm:8192×4096 (2 passes) | 134.2 | 671.1 | 33.6 | 671.1 | 671.1 | 745.7 |")
    assert "a norm's kernel reads x once a pass over its rows" in to_markdown({}, [row])


# ---- prepared, and found by the dry run ------------------------------------------------------------------------------


def test_prepare_compiles_the_norm_kernels_and_the_dry_run_finds_them(tmp_path, capsys, monkeypatch, fake_nvcc):
    prep, sizes = tmp_path / "prep", ["map:softmax:64x64", "map:rmsnorm:64x64"]
    assert gpucheck.main([str(prep), "--prepare", "--sizes", *sizes, "--precisions", "bf16"]) == 0
    out = capsys.readouterr().out
    # The preflight's five and each norm's general form; their other forms are no failure.
    assert "gpucheck prepare: 7 kernels for sm_90 with fake nvcc" in out and "7 compiled, 0 failed" in out
    assert "bf16 map:softmax:64x64 persistent: lowered, but a map row times its general form alone" in out
    assert "bf16 map:rmsnorm:64x64 sm90a: cannot lower a program that reduces rows" in out
    for size in sizes:
        entry = next(e for e in Manifest.load(prep).entries if e.case == f"bf16 {size}")
        assert (entry.form, entry.arch, entry.kernel_name) == ("general", "sm_90", "spatialc_general") and entry.cubin
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    argv = ["unused", "--dry-run", "--prepared", str(prep), "--sizes", *sizes, "--precisions", "bf16"]
    assert gpucheck.main(argv) == 0
    dry = capsys.readouterr().out
    assert dry.count("    cubin     prepared: ") == 2
    rms = dry.split("bf16 map:rmsnorm:64x64\n")[1]
    timed = next(line for line in rms.splitlines() if line.startswith("  timed     "))
    assert "spatialc general: end to end + kernel only, checked against its stages in float64 (each row sum" in timed
    assert "it reads x 2 times, the GB/s count once" in timed
    assert "torch F.rms_norm(x, (n,), w, eps=1e-06): end to end + kernel only (the same call" in timed
    assert "torch copy_: kernel only, 8192 bytes copied device to device (16384 moved" in timed


def test_the_online_softmax_row_is_checked_and_timed_beside_the_three_pass_one(fake_gpu, tmp_path, capsys):
    """`map:softmax_online:MxN`: the same function in two passes over each row, a row of its own beside softmax's."""
    status, _, rows = run(tmp_path, "--sizes", "map:softmax:40x72", "map:softmax_online:40x72", "--precisions", "bf16")
    assert status == 0 and [r["status"] for r in rows] == ["ok", "ok"], [r["note"] for r in rows]
    for row in rows:
        mine = row["by_name"]["spatialc general"]
        assert mine["ok"] and mine["check"]["correct"] and mine["check"]["unwritten"] == 0, mine["note"]
    md = (tmp_path / "gpucheck.md").read_text()
    assert "| bf16 | softmax:40×72 (3 passes) | " in md and "| bf16 | softmax_online:40×72 (2 passes) | " in md
    capsys.readouterr()

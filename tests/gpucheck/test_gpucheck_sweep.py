"""The GPU check's plan sweep (`sweep:SIZE` rows): the persistent kernel and the sm_90a form, each at its planner's
plan and at its neighbours, each with the planner's cost prediction, timed kernel only beside cuBLAS on the
stand-ins; the report's sweep table and verdicts. No GPU."""

from __future__ import annotations

import json

import pytest

import spatialc
from spatialc.errors import SpatialError
from spatialc.gpucheck import builds as B
from spatialc.gpucheck import device as D
from spatialc.gpucheck import driver as G
from spatialc.gpucheck import sweep as S
from spatialc.gpucheck.agreement import Check
from spatialc.gpucheck.cases import (
    DEFAULT_SIZES,
    PLANNERS_PLAN,
    SWEEP_SIZES,
    TIMED_AGAIN,
    Case,
    Contestant,
    Row,
    cases_of,
)
from spatialc.gpucheck.report import concordance, sweep_lines, sweep_summary, sweep_verdict
from spatialc.gpucheck.timing import Timing
from spatialc.lower.cuda.sm90a import plan as sm90a_plan
from spatialc.passes import tile
from spatialc.target import target

from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture


def test_sweep_sizes_parse_apart_from_the_plain_size():
    cases = cases_of(["sweep:4096", "4096", "sweep:300x200x100"], ["bf16"])
    assert [(c.size, c.sweep) for c in cases] == [
        ("sweep:4096x4096x4096", True),
        ("4096x4096x4096", False),
        ("sweep:300x200x100", True),
    ]
    with pytest.raises(SpatialError, match="not sweep:SIZE"):
        cases_of(["sweep:"], ["bf16"])
    with pytest.raises(SpatialError, match="not N or MxNxK"):
        cases_of(["sweep:12x3"], ["bf16"])


def test_the_sweep_is_prepared_with_the_default_run_but_not_run_with_it(tmp_path):
    _, prepared, _ = G._setup([str(tmp_path / "p"), "--prepare"], "")
    _, run, _ = G._setup([str(tmp_path / "r")], "")
    _, asked, _ = G._setup([str(tmp_path / "a"), "--prepare", "--sizes", "64"], "")
    swept = {c.size for c in prepared if c.sweep}
    assert swept == {"sweep:4096x4096x4096", "sweep:8192x8192x8192"} and len(SWEEP_SIZES) == 2
    assert not any(c.sweep for c in run) and {c for c in prepared if not c.sweep} == set(run)
    assert len(run) == len(cases_of(DEFAULT_SIZES, ["int8", "fp16", "bf16"]))
    assert [c.size for c in asked] == ["64x64x64"] * 3  # sizes asked for: those alone


def built_sweep(m, n, k, precision):
    built = B.build_case(Case(m, n, k, precision, sweep=True), "sm_90")
    assert not built.error, built.error
    return built


CHANGES = [
    "a stage fewer",
    "a stage more",
    "K steps halved, twice the stages",
    "K steps doubled",
    "items half as wide",
    "row-major waves, not bands",
]


def test_the_4096_sweep_is_each_planners_plan_and_one_change_each_with_the_models_prediction():
    built = built_sweep(4096, 4096, 4096, "bf16")
    forms = [f for f in built.forms if f.name == "sm90a"]
    planner = forms[0]
    assert planner.contestant == "spatialc sm90a" and not planner.kernel_only  # timed both ways, as in any row
    assert planner.facts["sweep"]["predicted"] == 1.0
    # The sm_90a form's own neighbour: paired blocks of 64-row items, at most 8 tiles wide, two an SM.
    changes = [*CHANGES[:5], S.PAIRED, CHANGES[5], S.TILE_EPILOGUE, S.HILBERT, S.SPLIT_TAIL, TIMED_AGAIN]
    assert [f.facts["sweep"]["change"] for f in forms[1:]] == changes
    paired = forms[6]
    assert paired.contestant.startswith("spatialc sm90a 4×8×4 d") and paired.artifact.budget.blocks_per_sm == 2
    assert "spatialc_regs_inc" not in paired.artifact.kernel_cu.split("spatialc_hopper(")[1]  # no setmaxnreg
    assert all(f.kernel_only for f in forms[1:])
    again = forms[-1]  # the planner's kernel once more, after its neighbours: the same text, kernel only
    assert again.artifact is planner.artifact and again.contestant == "spatialc sm90a (the planner's, again)"
    forms = forms[:-1]
    tail = forms.pop()  # 512 items of 128 × 256 on 132 SMs: a last wave of 116, more than half: no split tail
    assert tail.artifact is None and tail.absent.endswith(
        "its last wave has 116 items on 132 sites, and 1 site(s) would split each"
    )
    hilbert = forms.pop()  # a wave of bands of 16 rows reads 35.5 MiB of strips at 4096³: no Hilbert order asked
    assert hilbert.artifact is None and hilbert.absent.endswith("reads 35.5 MiB of strips, within the L2's 50 MiB")
    more = forms[2]  # four stages of 128×256×64 already fill shared memory: the fifth is refused, with the reason
    assert more.artifact is None and "shared memory" in more.absent
    assert more.contestant == "spatialc sm90a (a stage more)"
    names = [f.contestant for f in built.forms]
    assert forms[1].contestant == "spatialc sm90a 8×16×4 d3" and "spatialc sm90a 8×16×2 d8" in names
    assert forms[-2].contestant == "spatialc sm90a 8×16×4 d4 round_robin" and len(set(names)) == len(names)
    # The planner's plan with the first epilogue: a warp's 16 × 16 box a tile where the planner's kernel stores a
    # warpgroup's box of 64 rows (issue 36, section 2 item 2); the plan, and so the cost, the same.
    first = forms[-1]
    assert first.contestant == "spatialc sm90a 8×16×4 d4 tiles epilogue" and first.facts["sweep"]["predicted"] == 1.0
    assert first.facts["own_plan"] == planner.facts["own_plan"]
    assert first.artifact.launch.tensor_maps[-1].box == (16, 16) and planner.artifact.launch.tensor_maps[-1].box == (
        64,
        64,
    )
    # Each prediction is the form's cost model's own ratio, recomputed here from the plan each kernel was built with.
    sm90a = target("sm_90a")
    gemm = spatialc.gemm(4096, 4096, 4096, "bf16", out="bf16")
    base = sm90a_plan.plan_cost(sm90a, spatialc.build(gemm, "sm_90a").plan, gemm.precision)
    for n, f in zip(S.neighbours(spatialc.build(gemm, "sm_90a"), "sm90a"), [*forms[1:], hilbert, tail], strict=True):
        if f.artifact is None:
            assert f.facts["sweep"]["predicted"] is None
            continue
        program = spatialc.build(gemm, "sm_90a", **n.options())
        assert f.facts["own_plan"] == B.describe_plan(program)
        cost = sm90a_plan.plan_cost(sm90a, program.plan, gemm.precision)
        assert f.facts["sweep"]["predicted"] == pytest.approx(base / cost, abs=1e-3)
    assert forms[1].facts["sweep"]["predicted"] < 1 and forms[-2].facts["sweep"]["predicted"] == 1.0  # order unseen


def test_the_persistent_kernel_is_swept_beside_it_by_its_own_planners_cost():
    built = built_sweep(4096, 4096, 4096, "bf16")
    forms = [f for f in built.forms if f.name == "persistent"]
    assert built.forms[: len(forms)] == forms  # first, as in the report's order of forms
    planner = forms[0]
    assert planner.contestant == "spatialc persistent" and not planner.kernel_only
    assert built.plan == planner.facts["own_plan"]  # the row's plan, as in any row: the persistent kernel's
    # Its own: the halved K step with the stages its planner gives that block, after the one with twice the stages.
    changes = [*CHANGES[:3], S.HALVED_PLANNERS, *CHANGES[3:]]
    assert [f.facts["sweep"]["change"] for f in forms[1:]] == [*changes, TIMED_AGAIN]
    forms = forms[:-1]
    # The planner's: 4×8×8 (K steps of 128, the first GPU run's fastest), 2×2, depth 2 — the fewest, and a third
    # does not fit (294,912 bytes), nor do K steps of 16 tiles: listed with the reason, never built.
    assert planner.facts["own_plan"].startswith("block 4×8×8, sub 2×2, items 32×16, depth 2,")
    assert [f.contestant for f in forms[1:3]] == [f"spatialc persistent ({c})" for c in CHANGES[:2]]
    assert "fewest" in forms[1].absent and "294912 bytes of shared memory" in forms[2].absent
    assert forms[5].artifact is None and "393216 bytes of shared memory" in forms[5].absent  # K steps doubled
    names = [f.contestant for f in forms]
    assert names[3:5] == ["spatialc persistent 4×8×4 sub 2×2 d4", "spatialc persistent 4×8×4 sub 2×2 d3"]  # halved
    assert "spatialc persistent 4×8×8 sub 2×1 d3" in names  # half the sub-blocks across
    sm90 = target("sm_90")
    gemm = spatialc.gemm(4096, 4096, 4096, "bf16", out="bf16")

    def cost(program, artifact):  # passes/tile.py's plan_cost, with the blocks per SM the kernel's budget keeps
        per_unit = artifact.budget.blocks_per_sm
        return tile.plan_cost(sm90, program.plan, 256, 256, 256, gemm.precision, per_unit)

    base = cost(spatialc.build(gemm, "sm_90"), planner.artifact)
    for n, f in zip(S.neighbours(spatialc.build(gemm, "sm_90"), "persistent"), forms[1:], strict=True):
        if f.artifact is None:
            assert f.facts["sweep"]["predicted"] is None
            continue
        program = spatialc.build(gemm, "sm_90", **n.options())
        assert f.facts["own_plan"] == B.describe_plan(program) and f.artifact.budget.form == "persistent"
        assert f.facts["sweep"]["predicted"] == pytest.approx(base / cost(program, f.artifact), abs=1e-3)


def test_an_int8_k_step_is_never_halved_below_one_wgmma():
    program = spatialc.build(spatialc.gemm(512, 512, 512, "int8"), "sm_90a", block=(8, 4, 2))
    by_change = {n.change: n for n in S.neighbours(program, "sm90a")}
    halved = by_change["K steps halved, twice the stages"]  # listed, with the reason, never built
    assert halved.block is None and "K steps of 2 tiles or more" in halved.why_not
    assert by_change["K steps doubled"].block == (8, 4, 4)
    wide = spatialc.build(spatialc.gemm(512, 512, 512, "int8"), "sm_90a", block=(8, 4, 4))
    halved = [n for n in S.neighbours(wide, "sm90a") if n.change.startswith("K steps halved")]
    assert [n.block for n in halved] == [(8, 4, 2)]
    # The persistent kernel's int8 takes K steps of one tile (its k16 MMA), so it halves 2 to 1 — with twice the
    # stages, and with those its planner gives that block.
    persistent = spatialc.build(spatialc.gemm(512, 512, 512, "int8"), "sm_90", block=(2, 4, 2))
    halved = [n for n in S.neighbours(persistent, "persistent") if n.change.startswith("K steps halved")]
    assert [(n.block, n.depth) for n in halved] == [((2, 4, 1), 2 * persistent.plan.depth), ((2, 4, 1), None)]


def test_a_sweep_away_from_a_hopper_is_skipped_with_the_reason(fake_gpu, tmp_path, capsys):
    built = B.build_case(Case(256, 256, 256, "bf16", sweep=True), "sm_80")
    assert built.forms == [] and "runs on a Hopper's own target, sm_90" in built.skip and built.skip.endswith("sm_80")
    status, rows, md = run(tmp_path, "--sizes", "sweep:64", "64", "--precisions", "bf16", "--target", "sm_80")
    assert status == 0 and [r["status"] for r in rows] == ["skipped", "ok"] and rows[0]["note"] == built.skip
    capsys.readouterr()
    G.main(["unused", "--dry-run", "--sizes", "sweep:64", "--precisions", "bf16", "--target", "sm_90a"])
    assert "  skipped   a sweep runs on a Hopper's own target" in capsys.readouterr().out


def test_a_long_k_is_swept_unsplit_and_each_neighbour_keeps_the_planners_item_order():
    built = built_sweep(256, 256, 65536, "bf16")  # the sm_90 planner alone would split this K over sites
    planners = [f for f in built.forms if f.facts["sweep"]["change"] == PLANNERS_PLAN]
    assert [f.contestant for f in planners] == ["spatialc persistent", "spatialc sm90a"]
    assert all(f.artifact is not None and f.facts["splits"] == 1 for f in planners)
    odd = built_sweep(17, 4099, 33, "bf16")
    for f in odd.forms:
        if f.artifact is not None and f.facts["sweep"]["change"] != "row-major waves, not bands":
            planner = next(p for p in planners_of(odd) if p.name == f.name)
            assert f.facts["own_plan"].split("(")[-1] == planner.facts["own_plan"].split("(")[-1], f.contestant


def planners_of(built):
    return [f for f in built.forms if f.facts["sweep"]["change"] == PLANNERS_PLAN]


def test_a_form_the_preflight_found_unavailable_is_not_run_in_any_of_its_plans(fake_gpu, tmp_path):
    fake_gpu["fault"] = ("fails", "spatialc_hopper")  # the sm_90a kernel fails its preflight step
    status, rows, md = run(tmp_path, "--sizes", "sweep:64", "--precisions", "bf16")
    mine = [c for c in rows[0]["contestants"] if c["name"].startswith("spatialc sm90a")]
    ran = [c for c in mine if not c["note"].startswith("n/a: ")]  # the plans it has, the planner's first
    assert len(ran) >= 3 and all(c["note"].startswith("unavailable: ") for c in ran)
    assert not any(c["kernel"] for c in rows[0]["contestants"] if c["name"].startswith("spatialc sm90a"))
    assert all(c["kernel"] for c in rows[0]["contestants"] if c["name"] == "spatialc persistent")


def test_a_sweep_row_is_no_multicast_rows_baseline(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(S, "SWEPT_FORMS", ("persistent",))  # a sweep of one form is as much a 256³ row as of two
    status, rows, md = run(tmp_path, "--sizes", "256", "mc2x1:256", "sweep:256", "--precisions", "bf16")
    assert status == 0
    said = next(x for x in md.splitlines() if x.startswith("- bf16 mc2x1:256x256x256: sm90a form"))
    assert said.split(": ")[-1].endswith("×"), said  # a ratio against the plain 256³ row, not the sweep's


def run(tmp_path, *argv):
    status = G.main([str(tmp_path), "--commit", "x", *argv], make_runner=D.GpuRunner)
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    return status, data["rows"], (tmp_path / "gpucheck.md").read_text()


def test_a_sweep_row_times_every_plan_kernel_only_beside_cublas(fake_gpu, tmp_path):
    status, rows, md = run(tmp_path, "--sizes", "sweep:300x200x100", "--precisions", "bf16")
    assert status == 0 and [r["status"] for r in rows] == ["ok"]
    row = rows[0]
    mine = [c for c in row["contestants"] if c["family"] == "spatialc"]
    assert len(mine) == len(built_sweep(300, 200, 100, "bf16").forms) >= 8
    planners = [c for c in mine if c["facts"]["sweep"]["change"] == PLANNERS_PLAN]
    assert [c["name"] for c in planners] == ["spatialc persistent", "spatialc sm90a"]  # each form's, in the table
    for c in (c for c in mine if not c["note"].startswith("n/a: ")):  # every plan checked; the planners' timed
        # both ways, the others kernel only
        assert c["check"]["correct"] and c["check"]["stable"] and c["kernel"]["median_s"] > 0
        assert (c["end_to_end"] is not None) == (c in planners) and ("kernel only" in c["detail"]) != (c in planners)
    assert (
        row["timings"]["kernel"]["spatialc"]["sm90a"]["rate"]
        and row["timings"]["end_to_end"]["spatialc"]["persistent"]["rate"]
    )
    assert any(c["family"] == "cublas" and c["kernel"] for c in row["contestants"])
    summary = row["sweep"]
    assert [s["contestant"] for s in summary] == [c["name"] for c in mine]
    built = [s for s in summary if not s["contestant"].endswith(")") or s["change"] == TIMED_AGAIN]
    assert all(s["measured"] > 0 and s["pct_of_cublas"] > 0 for s in built)
    assert all(s["measured"] is None for s in summary if s not in built)  # a change the planner's plan has not
    own = [s["measured"] for s in summary if s["change"] in (PLANNERS_PLAN, TIMED_AGAIN)]  # 2 timings a form
    assert len(own) == 4 and all(x == pytest.approx(1.0, rel=0.05) for x in own)
    k = row["kernel"]  # the row's plan: the persistent kernel's
    mine_plan = f"persistent {k['block']}{'' if k['sub_blocks'] == '1×1' else ' sub ' + k['sub_blocks']} d{k['depth']}"
    assert "The plan sweep (sweep rows" in md and f"| bf16 | sweep:300×200×100 | {mine_plan} (the planner's) |" in md
    for form in ("persistent", "sm90a"):  # (the stand-in's equal times leave the cost nothing to order)
        assert f"- bf16 sweep:300x200x100, {form}: ★ {form} " in md
    variants = [c["name"].removeprefix("spatialc ") for c in mine if c not in planners]
    assert "spatialc sm90a (row-major waves, not bands)" in [c["name"] for c in mine]  # no bands: listed, with why
    assert any("not bands of rows" in c["note"] for c in mine)
    assert [s["plan"] for s in summary if s["change"] != PLANNERS_PLAN] == variants


def test_a_wrong_plan_fails_the_row_and_is_never_the_fastest(fake_gpu, tmp_path):
    forms = built_sweep(300, 200, 100, "bf16").forms
    fewer = next(f for f in forms if f.name == "sm90a" and f.facts["sweep"]["change"] == "a stage fewer")
    smem = fewer.facts["dyn_smem"]
    assert sum(f.facts.get("dyn_smem") == smem for f in forms) == 1  # the fault lands in that plan alone
    fake_gpu["fault"] = ("miss", f"smem{smem}")
    status, rows, md = run(tmp_path, "--sizes", "sweep:300x200x100", "--precisions", "bf16")
    assert status == 1 and rows[0]["status"] == "wrong" and fewer.contestant in rows[0]["note"]
    by_name = {s["contestant"]: s for s in rows[0]["sweep"]}
    assert by_name[fewer.contestant]["measured"] is None and by_name[fewer.contestant]["rate"] is None
    line = next(x for x in md.splitlines() if x.startswith(f"| bf16 | sweep:300×200×100 | sm90a {fewer.variant} |"))
    assert "| no |" in line and "★" not in line


def t(s):
    return Timing(s, 10, 4, s, s, "graph")


RIGHT = Check(True, 0.0, 0.0, 0, 0, 0, True)
WRONG = Check(False, 1.0, 1.0, 3, 0, 0, True)


def plan(name, change, predicted, seconds, check=RIGHT, form="sm90a"):
    facts = {"sweep": {"form": form, "change": change, "predicted": predicted}, "block": "8×16×4", "depth": 4}
    facts |= {"sub_blocks": "1×1" if form == "sm90a" else "2×2", "dyn_smem": 1}
    return Contestant(f"spatialc {form}{name}", "spatialc", None, t(seconds), 0.0, check.correct, "", "", check, facts)


def test_the_sweep_table_sets_prediction_beside_measurement_form_by_form():
    row = Row("bf16", 4096, 4096, 4096, sweep=True, status="wrong")
    refused = {"form": "sm90a", "change": "a stage more", "predicted": None}
    row.contestants = [
        plan("", PLANNERS_PLAN, 1.0, 4e-3, form="persistent"),
        plan(" p", "a stage fewer", 0.97, 3e-3, form="persistent"),  # against the persistent planner's: 1.33×
        plan("", PLANNERS_PLAN, 1.0, 2e-3),
        plan(" a", "a stage fewer", 0.9, 2.5e-3),  # predicted slower, measured slower: agrees with the planner's
        plan(" b", "K steps doubled", 0.8, 1e-3),  # predicted slower, measured twice as fast
        plan(" c", "items half as wide", 0.95, 5e-4, WRONG),  # the fastest kernel, but wrong: no speed counts
        Contestant("spatialc sm90a (a stage more)", "spatialc", note="n/a: too big", facts={"sweep": refused}),
        plan(" (the planner's, again)", TIMED_AGAIN, 1.0, 2e-3),
        Contestant("torch.matmul", "cublas", t(3e-3), t(1.6e-3), 0.0, True),
    ]
    summary = sweep_summary(row)
    assert [s["form"] for s in summary] == ["persistent"] * 2 + ["sm90a"] * 6
    measured = [1.0, pytest.approx(4 / 3), 1.0, pytest.approx(0.8), pytest.approx(2.0), None, None, 1.0]
    assert [s["measured"] for s in summary] == measured
    assert [s["pct_of_cublas"] for s in summary][2:5] == [pytest.approx(80), pytest.approx(64), pytest.approx(160)]
    assert summary[0]["plan"] == "persistent 8×16×4 sub 2×2 d4 (the planner's)"
    assert summary[2]["plan"] == "sm90a 8×16×4 d4 (the planner's)" and summary[4]["plan"] == "sm90a b"
    # Of the sm_90a plans, the pairs the cost tells apart and both measured: (planner, a), (planner, b), (a, b) —
    # the planner's second timing is no plan of its own: it got (planner, a) right and ranked b below both where b
    # measured faster.
    assert concordance(summary[2:]) == (1, 3)
    lines = sweep_lines([row])
    stars = [x for x in lines if x.startswith("|") and "★" in x]
    assert len(stars) == 2 and "| persistent p | a stage fewer | 0.97× | 1.33× |" in stars[0]
    assert "| sm90a b | K steps doubled | 0.80× | 2.00× |" in stars[1]
    wrong = next(x for x in lines if "items half as wide" in x)
    assert "| no |" in wrong and "| — | — |" in wrong  # neither a measured ratio nor a rate for a wrong kernel
    assert any("a stage more" in x and "n/a: too big" in x for x in lines)
    assert lines[-2:] == [
        "- bf16 sweep:4096x4096x4096, persistent: ★ persistent p at 45.8 TFLOP/s: 1.33× the planner's plan (the "
        "planner's plan timed once); its planner's cost ordered 0 of 1 pairs of plans as measured",
        "- bf16 sweep:4096x4096x4096, sm90a: ★ sm90a b at 137.4 TFLOP/s: 2.00× the planner's plan (the planner's two "
        "timings 0.0% apart); its planner's cost ordered 1 of 3 pairs of plans as measured",
    ]
    assert sweep_lines([Row("bf16", 8, 8, 8, status="ok")]) == []


def test_timing_noise_is_no_order():
    """A neighbour within the tie (2%, or twice the spread of the planner's two timings) of the planner's plan does
    not beat it, and the cost's ordering is not scored on pairs that measured, or were predicted, that close."""

    def row(*plans):
        r = Row("bf16", 4096, 4096, 4096, sweep=True, status="ok")
        r.contestants = [*plans, Contestant("torch.matmul", "cublas", t(3e-3), t(2e-3), 0.0, True)]
        return r

    close = row(
        plan("", PLANNERS_PLAN, 1.0, 2e-3),
        plan(" a", "a stage more", 0.999, 1.99e-3),  # 0.5% faster, predicted 0.1% slower: both ties
        plan(" b", "K steps doubled", 0.8, 2.5e-3),
        plan(" (the planner's, again)", TIMED_AGAIN, 1.0, 2e-3),
    )
    summary = sweep_summary(close)
    assert concordance(summary) == (2, 2)  # (planner, b) and (a, b); (planner, a) is a tie both ways
    lines = sweep_lines([close])
    starred = [x for x in lines if x.startswith("|") and "★" in x]
    assert (
        len(starred) == 1 and "| sm90a 8×16×4 d4 (the planner's) | the planner's plan | 1.00× | 1.00× |" in starred[0]
    )
    assert lines[-1].startswith(
        "- bf16 sweep:4096x4096x4096, sm90a: ★ sm90a 8×16×4 d4 (the planner's) at 68.7 TFLOP/s: no neighbour "
        "more than 2% faster (the planner's two timings 0.0% apart); the nearest, sm90a a, 1.01×"
    )
    # The planner's two timings 6% apart: a neighbour 5% faster than their mean is inside that noise.
    noisy = row(
        plan("", PLANNERS_PLAN, 1.0, 2.06e-3),
        plan(" a", "a stage more", 1.0, 1.91e-3),
        plan(" (the planner's, again)", TIMED_AGAIN, 1.0, 1.94e-3),
    )
    winner, said = sweep_verdict(sweep_summary(noisy))
    assert winner["change"] == PLANNERS_PLAN and said.startswith("no neighbour more than 6% faster")


def test_the_sm90a_form_at_8192_is_swept_in_hilbert_order_with_the_planners_kernel():
    """Where a wave of the planner's bands reads more A and B strips than the L2 holds (bf16 at 8192³: 73 MiB), the
    sm_90a form's sweep times Hilbert order beside it (issue 36, section 2 item 4): the same kernel text, so the
    check compiles it once (cubins by source hash), its work list dealt along the curve. int8 there, and the
    persistent kernel, list none."""
    gemm = spatialc.gemm(8192, 8192, 8192, "bf16", out="bf16")
    program, planner = B.form_built(gemm, "sm90a", dict(S.UNSPLIT))
    hilbert = S.neighbours(program, "sm90a")[-2]
    assert (hilbert.change, hilbert.placement, hilbert.why_not) == (S.HILBERT, "hilbert", "")
    swept, form = B.form_built(gemm, "sm90a", {**hilbert.options(), **S.UNSPLIT}, hilbert.lowering())
    assert form.artifact.kernel_cu == planner.artifact.kernel_cu and swept.plan == program.plan
    assert (form.artifact.launch.placement, planner.artifact.launch.placement) == ("hilbert", "grouped")
    assert S.variant_name(swept, program).endswith(" d4 hilbert")
    int8 = S.neighbours(spatialc.build(spatialc.gemm(8192, 8192, 8192, "int8"), "sm_90a"), "sm90a")[-2]
    assert int8.change == S.HILBERT and int8.why_not.endswith("reads 36.5 MiB of strips, within the L2's 50 MiB")
    persistent = S.neighbours(spatialc.build(gemm, "sm_90"), "persistent")
    assert S.HILBERT not in [n.change for n in persistent]


def test_the_sm90a_form_is_swept_with_a_split_tail_where_its_last_wave_is_at_most_half_full():
    """At 3072³ the planner's 576 items of 128 × 128 leave a last wave of 48 on 132 SMs: the sm_90a sweep times the
    same plan with those 48 split 2 ways (bench/README.md, "Prediction for the split tail": 1.11× in the model), its
    prediction priced with the split's waves; the persistent kernel's sweep lists none (its blocks never wait)."""
    gemm = spatialc.gemm(3072, 3072, 3072, "bf16", out="bf16")
    program, _ = B.form_built(gemm, "sm90a", dict(S.UNSPLIT))
    tail = S.neighbours(program, "sm90a")[-1]
    assert (tail.change, tail.placement, tail.why_not) == (S.SPLIT_TAIL, "split_tail", "")
    swept = spatialc.build(gemm, "sm_90a", form="sm90a", **tail.options())
    assert swept.plan == program.plan and (swept.placement.tail, swept.placement.splits) == (48, 2)
    assert S._cost(gemm, "sm90a", program) / S._cost(gemm, "sm90a", swept) == pytest.approx(1.106, abs=2e-3)
    assert S.SPLIT_TAIL not in [n.change for n in S.neighbours(spatialc.build(gemm, "sm_90"), "persistent")]

"""The GPU check's attention rows (gpucheck/attnrows.py): their sizes and place in the run (last), their build
(the forms `spatialc.lower` prints attention in; where it refuses, the row's spatialc contestant says lower's line and
the libraries still run), the sampled float64 reference against numerics.attention's, the sample check catching a
wrong O or LSE, and the rows on the stand-in GPU: the general form's kernel and torch's SDPA backends checked and
timed by events, a kernel with a wrong or unwritten O reported wrong, a backend with no kernel and a missing
flash_attn said as such, a wrong library result not timed."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spatialc
from spatialc import gpucheck
from spatialc.errors import SpatialError
from spatialc.gpucheck import attnrows as A
from spatialc.gpucheck import device as D
from spatialc.gpucheck.builds import build_case
from spatialc.gpucheck.cases import DEFAULT_SIZES, cases_of, kernel_path
from spatialc.numerics.attention import attention_op, softmax_attention
from spatialc.runtime import launch as L
from spatialc.runtime.tilize import bf16_bits, bf16_to_float32

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture


def test_attention_sizes_are_fp16_and_bf16_rows_run_last():
    cases = cases_of(["att:2x3:64:32:causal", "att:1x2:128:64"], ["int8", "fp16", "bf16"])
    assert [(c.size, c.precision) for c in cases] == [
        ("att:2x3:64x64x32:causal", "fp16"),
        ("att:2x3:64x64x32:causal", "bf16"),
        ("att:1x2:128x128x64", "fp16"),
        ("att:1x2:128x128x64", "bf16"),
    ]
    assert cases[0].heads == (2, 3) and cases[0].causal and not cases[2].causal
    assert cases[0].ops == 4 * 64 * 64 * 32 * 6 // 2 and cases[2].ops == 4 * 128 * 128 * 64 * 2
    assert kernel_path(cases[0], "spatialc general") == "spatialc general (attention)"
    for bad in ("att:2:64:32", "att:2x3:64", "att:2x3:64:32:sideways", "att:0x3:64:32"):
        with pytest.raises(SpatialError, match="not att:BATCHxHEADS:SEQ:HEAD_DIM"):
            cases_of([bad], ["bf16"])
    order = [c for c in cases_of(DEFAULT_SIZES, ["int8", "fp16", "bf16"])]
    atts = [c for c in order if c.heads[0]]
    assert len(atts) == 24 and order[-24:] == atts  # 12 shapes (d128, d64; causal and not) × fp16, bf16
    assert {(c.heads[0] * c.heads[1], c.m, c.k) for c in atts} == {
        (256, 4096, 128),
        (32, 8192, 128),
        (16, 16384, 128),
        (256, 4096, 64),
        (32, 8192, 64),
        (16, 16384, 64),
    }


def test_an_attention_case_is_built_in_the_form_lower_prints_it_or_says_lowers_line(monkeypatch):
    (case,) = cases_of(["att:1x2:64:64:causal"], ["bf16"])
    built = build_case(case, "sm_90")
    # On a Hopper both forms, and the sm_90a form's serial schedule beside its overlapped one (kernel only), and
    # bands of 128 rows on two consumer warpgroups, interleaved as they come and in the ping-pong's turns
    labels = ["general", "sm90a", "sm90a serial schedule", "sm90a two consumer warpgroups"]
    labels.append("sm90a two consumer warpgroups, ping-pong")
    assert not built.error and [f.label for f in built.forms] == labels
    form, hopper, serial, two, pingpong = built.forms
    assert hopper.artifact.budget.form == "sm90a" and hopper.facts["own_plan"] and serial.kernel_only
    assert two.kernel_only and pingpong.kernel_only
    assert two.artifact.budget.threads == pingpong.artifact.budget.threads == 384
    assert "spatialc_engine_arrive(" not in two.artifact.kernel_cu  # (overlapped: no turns)
    assert "spatialc_engine_arrive(11 - warp / 4, 256);" in pingpong.artifact.kernel_cu
    assert "the last block: no next S" in hopper.artifact.kernel_cu
    assert "the last block: no next S" not in serial.artifact.kernel_cu
    assert [a.order for a in L.kernel_args(hopper.artifact.launch)][:3] == ["rows"] * 3  # Q, K, V as matrices
    assert [f.name for f in build_case(case, "sm_80").forms] == ["general"]  # elsewhere the general form alone
    assert [a.name for a in L.kernel_args(form.artifact.launch)] == ["q", "k", "v", "o", "lse"]
    assert form.artifact.kernel_cu.split(":", 1)[0] == "// attention_1x2x64x64x64_bf16_causal"  # the stand-in reads it
    # The reference's scale is the program's own: spatialc.attention's default, 1/√head_dim.
    program = spatialc.attention(1, 2, 64, 64, 64, precision="bf16")
    assert attention_op(spatialc.build(program, "sm_90")).scale == 64**-0.5
    # Where lower refuses (as it did before the general form printed attention), the row says lower's line.
    monkeypatch.setattr(spatialc, "lower", lambda *a, **k: (_ for _ in ()).throw(SpatialError("no form prints it")))
    refused, hopper, serial = build_case(case, "sm_90").forms
    assert refused.artifact is None and refused.absent == "lower: no form prints it"
    assert hopper.artifact is None and hopper.absent == "no form prints it" and serial.absent == hopper.absent


@pytest.mark.parametrize("causal", [False, True])
def test_the_sampled_reference_is_numerics_and_the_sample_check_fails_a_wrong_o_or_lse(causal):
    rng = np.random.default_rng(5)
    q, k, v = (rng.uniform(-1, 1, (2, 200, 16)) for _ in range(3))
    o, lse = softmax_attention(q, k, v, 16**-0.5, causal)
    rows = A.sample_rows(200)
    assert rows[:2] == [0, 1] and rows[-1] == 199 and 100 in rows and len(rows) == 3 * A.SAMPLE_ROWS
    refs = {h: A.reference(q[h], k[h], v[h], rows, 16**-0.5, causal, np) for h in (0, 1)}
    for h in (0, 1):
        np.testing.assert_allclose(refs[h][0], o[h][rows], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(refs[h][1], lse[h][rows, 0], rtol=1e-12, atol=1e-12)
    o_bf16 = bf16_to_float32(bf16_bits(o.astype(np.float32), np), np)  # O rounded once to bf16: right
    lse32 = lse.astype(np.float32)
    assert A.check_sample(o_bf16, lse32, refs, rows, "bfloat16", np)[0]
    assert not A.check_sample(o_bf16[::-1], lse32, refs, rows, "bfloat16", np)[0]  # the heads swapped
    assert not A.check_sample(o_bf16, lse32 + 0.01, refs, rows, "bfloat16", np)[0]
    assert not A.check_sample(o_bf16, lse32, refs, rows, "float16", np)[0]  # bf16's rounding is past fp16's bound


def test_an_attention_row_runs_torchs_backends_each_checked_and_timed(fake_gpu, tmp_path, capsys):
    status, _, rows = run(tmp_path, "--sizes", "att:1x2:64:32:causal", "--precisions", "bf16")
    (row,) = rows
    assert status == 0 and row["status"] == "ok", row["note"]
    by = row["by_name"]
    mine = by["spatialc general"]  # the general form's kernel, O and LSE checked on the sample, timed both ways
    assert mine["ok"] and mine["check"]["correct"] and mine["check"]["stable"], mine["note"]
    assert mine["kernel"]["method"] == "events" and mine["end_to_end"] is not None
    assert "O and LSE stored as float32" in mine["detail"]
    hopper = by["spatialc sm90a"]  # the sm_90a form's, built for sm_90a: Q, K and V handed over as matrices
    assert hopper["ok"] and hopper["check"]["correct"] and hopper["kernel"]["method"] == "events", hopper["note"]
    for backend in ("flash", "efficient"):
        theirs = by[A.sdpa_name(backend)]
        assert theirs["ok"] and theirs["kernel"]["method"] == "events" and theirs["end_to_end"] is None, backend
    assert by[A.sdpa_name("cuDNN")]["note"] == "failed: FakeError: No available kernel. Aborting execution."
    assert by[A.FLASH_ATTN]["note"].startswith("unavailable: flash_attn does not import")
    assert row["ops"] == 4 * 64 * 64 * 32 * 2 // 2
    summary = row["attention_timings"]  # the bar: the fastest right library, kernel only; the stand-in's are alike
    assert summary["bar"]["name"] in (A.sdpa_name("flash"), A.sdpa_name("efficient"))
    assert summary["spatialc"]["spatialc general"]["pct_of_bar"] > 0
    md = (tmp_path / "gpucheck.md").read_text()
    assert "- bf16 att:1x2:64x64x32:causal: spatialc general " in md and "% of the bar; bar: torch SDPA (" in md
    capsys.readouterr()


@pytest.mark.parametrize(("fault", "said"), [("skew", "O or LSE wrong on the sample"), ("miss", "1 unwritten")])
def test_an_attention_kernel_with_a_wrong_o_is_reported_wrong(fake_gpu, tmp_path, fault, said, capsys):
    # The stand-in's kernel moves every element of O (or leaves one poisoned, outside the sample's rows: the poison is
    # counted over all of O): the row is wrong; torch's backends, right, are still timed.
    fake_gpu["fault"] = (fault, "spatialc_general")
    status, _, rows = run(tmp_path, "--sizes", "att:1x2:256:32", "--precisions", "bf16")
    (row,) = rows
    assert status == 1 and row["status"] == "wrong" and said in row["note"], row["note"]
    assert not row["by_name"]["spatialc general"]["check"]["correct"]
    assert row["by_name"][A.sdpa_name("flash")]["ok"]
    capsys.readouterr()


def test_a_wrong_library_attention_is_not_timed(fake_gpu, tmp_path, capsys):
    fake_gpu["torch"].sdpa_skew = 0.05
    status, _, rows = run(tmp_path, "--sizes", "att:1x2:64:32", "--precisions", "fp16")
    (row,) = rows
    for backend in ("flash", "efficient"):
        theirs = row["by_name"][A.sdpa_name(backend)]
        assert theirs["ok"] is False and theirs["note"] == "wrong; not timed" and theirs["kernel"] is None, backend
    capsys.readouterr()


def test_a_backend_an_earlier_process_lost_the_gpu_on_is_not_run_again(fake_gpu, tmp_path, capsys):
    # A restarted run names what lost the GPU before (`lost`); attention's libraries go through the one guard the
    # map and grouped rows use (GpuRunner.library_guarded), which leaves such a library out, saying why.
    flash = A.sdpa_name("flash")

    class Restarted(D.GpuRunner):
        def preflight(self, deadline, say=lambda s: None, lost=None):
            return super().preflight(deadline, say, {flash: "lost the GPU in an earlier process"})

    argv = [str(tmp_path), "--commit", "x", "--sizes", "att:1x2:64:32", "--precisions", "bf16"]
    gpucheck.main(argv, make_runner=Restarted)
    (row,) = json.loads((tmp_path / "gpucheck.json").read_text())["rows"]
    by = {c["name"]: c for c in row["contestants"]}
    assert by[flash]["note"] == "unavailable: lost the GPU in an earlier process" and by[flash]["kernel"] is None
    assert by[A.sdpa_name("efficient")]["ok"]
    capsys.readouterr()


def test_prepare_compiles_the_fp8_and_attention_kernels_and_the_dry_run_lists_their_rows(
    tmp_path, capsys, monkeypatch, fake_nvcc
):
    from spatialc import gpucheck
    from spatialc.runtime import nvcc as N

    prep, sizes = tmp_path / "prep", ["fp8:e4m3:64", "att:1x2:64:32:causal"]
    assert gpucheck.main([str(prep), "--prepare", "--sizes", *sizes, "--precisions", "bf16"]) == 0
    out = capsys.readouterr().out
    for made in (
        "e4m3 fp8:64x64x64 persistent: ",
        "e4m3 fp8:64x64x64 general: ",
        "e4m3 fp8:64x64x64 sm90a: ",
        "bf16 att:1x2:64x64x32:causal general",
        "bf16 att:1x2:64x64x32:causal sm90a",
    ):
        assert made in out, made
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    argv = ["unused", "--dry-run", "--prepared", str(prep), "--sizes", *sizes, "--precisions", "bf16"]
    assert gpucheck.main(argv) == 0
    dry = capsys.readouterr().out
    # fp8's persistent, general and sm90a kernels, attention's general and sm90a (two schedules; two warpgroups,
    # with and without the ping-pong)
    assert dry.count("    cubin     prepared: ") == 8
    fp8, att = dry.split("e4m3 fp8:64x64x64\n")[1].split("bf16 att:1x2:64x64x32:causal\n")
    timed = next(line for line in fp8.splitlines() if line.startswith("  timed     "))
    assert "spatialc persistent: end to end + kernel only; spatialc general: end to end + kernel only" in timed
    assert "torch._scaled_mm (rowwise scales): end to end + kernel only, its C checked in the row" in timed
    assert "spatialc sm90a: end to end + kernel only" in timed
    timed = next(line for line in att.splitlines() if line.startswith("  timed     "))
    assert "spatialc general: kernel only + end to end" in timed and "torch SDPA (cuDNN): kernel only" in timed
    assert "spatialc sm90a: kernel only + end to end" in timed
    assert "spatialc sm90a two consumer warpgroups, ping-pong: kernel only" in timed
    assert "checked: O and LSE on heads 0 and 1, rows of 64 ×3" in timed
    assert "    C         stored as float32\n" in att  # O as the kernel stores it: its end to end converts nothing

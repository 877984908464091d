"""Kernels compiled beforehand: `spatialc gpucheck DIR --prepare` (with nvcc, no GPU), its manifest, and the GPU
run's and the dry run's use of it."""

from __future__ import annotations

import json

import pytest

from spatialc import gpucheck
from spatialc.errors import SpatialError
from spatialc.gpucheck import builds as B
from spatialc.gpucheck import device as D
from spatialc.gpucheck.cases import Case, kernel_arch
from spatialc.gpucheck.prepare import MANIFEST, Manifest, file_hash, source_hash
from spatialc.runtime import nvcc as N
from spatialc.runtime import sass

from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture
from .test_gpucheck_fakes import lowered_as, without_general

NVCC = N.find_nvcc()


def only_the_64_cubed_preflight(monkeypatch):
    """The preflight's kernels cut to its 64³ product, for the tests that compile with the real nvcc: its sm_90a
    kernel at the large rows' plan and its cluster kernel are two more compiles, which those tests (of the
    prepare's own machinery) need not wait for; the fake nvcc's tests below count them."""
    from spatialc.gpucheck import prepare
    from spatialc.gpucheck.cases import preflight_case

    monkeypatch.setattr(prepare, "preflight_cases", lambda cases: [preflight_case(list(cases))])


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_prepare_compiles_every_kernel_and_the_gpu_run_loads_them(tmp_path, capsys, monkeypatch):
    only_the_64_cubed_preflight(monkeypatch)
    prep = tmp_path / "prep"
    argv = [str(prep), "--prepare", "--sizes", "64", "--precisions", "fp16", "--commit", "abc"]
    # One case, which is also the preflight's: its three kernels (persistent, general and, on sm_90, the sm90a
    # form's, for sm_90a), three compiles.
    assert gpucheck.main(argv) == 0
    out = capsys.readouterr().out
    assert f"gpucheck prepare: 3 kernels for sm_90 with {N.nvcc_version(NVCC)} into {prep}" in out
    assert f"wrote {prep / MANIFEST}: 3 compiled, 0 failed" in out
    data = json.loads((prep / MANIFEST).read_text())
    assert data["arch"] == "sm_90" and data["commit"] == "abc" and data["nvcc"] == N.nvcc_version(NVCC)
    entries = data["kernels"]
    forms = B.build_case(Case(64, 64, 64, "fp16"), "sm_90").forms
    assert [(e["form"], e["kernel_name"]) for e in entries] == [
        ("persistent", "spatialc_persistent"),
        ("general", "spatialc_general"),
        ("sm90a", "spatialc_hopper"),
    ]
    assert [e["arch"] for e in entries] == ["sm_90", "sm_90", "sm_90a"]
    manifest = Manifest.load(prep)
    monkeypatch.setattr(N, "find_nvcc", lambda: None)  # the dry run reads ptxas from the manifest, compiles nothing
    assert gpucheck.main(["unused", "--dry-run", "--prepared", str(prep), "--sizes", "64", "--precisions", "fp16"]) == 0
    dry = capsys.readouterr().out
    assert f"cubins: prepared in {prep} (3 kernels for sm_90" in dry
    assert dry.count("  cubin     prepared: ") == 3
    for entry, form in zip(entries, forms, strict=True):  # each kernel: its own source hash, cubin and ptxas report
        arch = kernel_arch(form.name, "sm_90")  # the sm90a form's: sm_90a
        assert entry["case"] == "fp16 64x64x64" and entry["source_sha256"] == source_hash(form.artifact.kernel_cu)
        assert entry["cubin_sha256"] == file_hash(prep / entry["cubin"]) and entry["arch"] == arch
        assert 0 < entry["ptxas"]["registers"] <= 255 and entry["ptxas"]["spill_stores"] >= 0 and not entry["error"]
        said = f"fp16 64x64x64 {form.name}: {entry['cubin']} in "
        assert said in out and f"{entry['ptxas']['registers']} regs" in out.split(said)[1].splitlines()[0]

        path, found, why = manifest.find(form.artifact.kernel_cu, arch)
        assert path == prep / entry["cubin"] and found.ptxas == entry["ptxas"] and why == ""
        assert manifest.find(form.artifact.kernel_cu, "sm_89")[2] == f"prepared for {arch}, the device is sm_89"

        shown = dry.split(f"  spatialc {form.name}\n")[1]
        if form.name == "sm90a":  # its own plan (built for sm_90a) comes first
            plan, shown = shown.split("\n", 1)
            assert plan == f"    plan      its own (built for sm_90a): {form.facts['own_plan']}"
        assert shown.startswith("    launch    grid ")
        assert f"    ptxas     {entry['ptxas']['registers']} regs" in shown.splitlines()[1]
        lines = shown.splitlines()
        assert f"    cubin     prepared: {entry['cubin']} (source hash checked)" in lines[2:4]
        if entry["sass"]:  # cuobjdump here: the main loop's census, in the manifest and the dry run
            mma = "HGMMA.64x" if form.name == "sm90a" else "HMMA.16816.F32"  # wgmma, or mma.sync
            assert "issue slots a tile-MAC" in entry["sass"] and mma in entry["sass"]
            assert lines[2] == f"    sass      {entry['sass']}"
        else:
            assert sass.find_cuobjdump() is None
    assert len({e["source_sha256"] for e in entries}) == 3


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_run_in_the_prepared_folder_finds_its_cubins(fake_gpu, tmp_path, capsys, monkeypatch):
    only_the_64_cubed_preflight(monkeypatch)
    monkeypatch.setattr(N, "find_nvcc", lambda: NVCC)  # here, with nvcc …
    assert gpucheck.main([str(tmp_path), "--prepare", "--sizes", "64", "--precisions", "int8"]) == 0
    monkeypatch.setattr(N, "find_nvcc", lambda: None)  # … there, without: nothing is left to compile
    status = gpucheck.main([str(tmp_path), "--sizes", "64", "--precisions", "int8"], make_runner=D.GpuRunner)
    assert status == 0
    data = json.loads((tmp_path / "gpucheck.json").read_text())
    assert data["header"]["prepared"].startswith(f"{tmp_path}: 3 kernels for sm_90")  # 64³: its three kernels
    spatialc = [c for c in data["rows"][0]["contestants"] if c["family"] == "spatialc"]
    assert [c["name"] for c in spatialc] == ["spatialc persistent", "spatialc general", "spatialc sm90a"]
    for c in spatialc:  # every kernel loaded from its cubin (the sm90a one's for sm_90a), nothing compiled there
        assert c["ok"] and c["facts"]["cubin"] == "prepared" and c["facts"]["registers"] > 0
    capsys.readouterr()


def test_a_kernel_that_does_not_compile_is_recorded_and_the_prepare_exits_1(tmp_path, capsys, monkeypatch, fake_nvcc):
    tried = []

    def refuse(built, arch, timeout_s, cache):
        tried.append((built.name, arch))
        raise N.KernelBuildError("nvcc failed: error: something")

    monkeypatch.setattr("spatialc.gpucheck.prepare.compile_kernel", refuse)
    assert gpucheck.main([str(tmp_path), "--prepare", "--sizes", "32", "--precisions", "bf16"]) == 1
    out = capsys.readouterr().out
    # The preflight's 64³ and 32³, three forms each (persistent, general, and the sm90a form's, for sm_90a), and the
    # preflight's own two: the sm_90a form at the large rows' plan, the general form's cluster kernel.
    assert "gpucheck prepare: 8 kernels for sm_90 with fake nvcc" in out
    assert "bf16 32x32x32 persistent: compile: nvcc failed: error: something" in out and "0 compiled, 8 failed" in out
    assert "bf16 32x32x32 general: compile: nvcc failed: error: something" in out
    assert "bf16 32x32x32 sm90a: compile: nvcc failed: error: something" in out
    forms = [("persistent", "sm_90"), ("general", "sm_90"), ("sm90a", "sm_90a")]
    own = [("sm90a", "sm_90a"), ("general", "sm_90")]
    assert sorted(tried) == sorted(forms * 2 + own)  # each tried once, for its own architecture
    manifest = Manifest.load(tmp_path)
    assert [e.error for e in manifest.entries] == ["compile: nvcc failed: error: something"] * 8
    assert [(e.form, e.arch) for e in manifest.entries] == forms + own + forms
    assert [e.case for e in manifest.entries][3:5] == ["bf16 256x512x256", "bf16 mc2x1:64x64x64"]
    for form in B.build_case(Case(32, 32, 32, "bf16"), "sm_90").forms:
        assert manifest.find(form.artifact.kernel_cu, kernel_arch(form.name, "sm_90"))[0] is None


def test_a_case_without_a_general_form_prepares_its_other_kernels_alone(tmp_path, capsys, monkeypatch, fake_nvcc):
    why = "no general form: shared memory of one block of the general form on sm_90: needs 299200, has 232448"
    lowered_as(monkeypatch, without_general(why))
    compiled = []

    def compile_kernel(form, arch, timeout_s, cache):
        compiled.append(form.name)
        path = cache / f"{form.name}.cubin"
        path.write_bytes(b"cubin")
        form.facts["ptxas"] = "not reported"
        return path

    monkeypatch.setattr("spatialc.gpucheck.prepare.compile_kernel", compile_kernel)
    assert gpucheck.main([str(tmp_path), "--prepare", "--sizes", "64", "--precisions", "int8"]) == 0
    out = capsys.readouterr().out
    # Two kernels: the persistent one and the sm90a form's (lowered apart, for sm_90a); no general form. (And the
    # preflight's own: the sm90a form at the large rows' plan, the multicast kernel, in the general form alone.)
    assert "gpucheck prepare: 4 kernels for sm_90" in out and f"int8 64x64x64 general: {why}" in out
    assert sorted(compiled) == ["general", "persistent", "sm90a", "sm90a"] and "4 compiled, 0 failed" in out
    assert [e.form for e in Manifest.load(tmp_path).entries] == ["persistent", "sm90a", "sm90a", "general"]


def test_a_manifest_of_another_format_is_refused(tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 0}))
    with pytest.raises(SpatialError, match="is not a gpucheck manifest of format 1; prepare it again"):
        Manifest.load(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(SpatialError, match="cannot read"):
        Manifest.load(tmp_path)


def test_a_kernel_text_two_plans_share_is_compiled_once_and_found_by_both(tmp_path, capsys, monkeypatch, fake_nvcc):
    # The fake nvcc: the sharing is the prepare's own (`_distinct`, by the text's hash), decided before any compile;
    # that nvcc builds what the prepare hands it is the first test's (real compiles made this one the module's slowest).
    from spatialc.gpucheck import sweep

    only_the_64_cubed_preflight(monkeypatch)
    monkeypatch.setattr(sweep, "SWEPT_FORMS", ("persistent",))  # one form's plans share texts as each form's do
    prep = tmp_path / "prep"
    # A sweep row's planner's kernel is timed twice and its row-major neighbour differs only in the work list: the
    # same text three times a form.
    argv = [str(prep), "--prepare", "--sizes", "sweep:48x80x96", "--precisions", "bf16", "--commit", "abc"]
    assert gpucheck.main(argv) == 0
    out = capsys.readouterr().out
    built = B.build_case(Case(48, 80, 96, "bf16", sweep=True), "sm_90")
    texts = {(source_hash(f.artifact.kernel_cu), kernel_arch(f.name, "sm_90")) for f in built.forms if f.artifact}
    entries = json.loads((prep / MANIFEST).read_text())["kernels"]
    keys = [(e["source_sha256"], e["arch"]) for e in entries]
    assert len(keys) == len(set(keys)) and texts <= set(keys)  # each text once, every one of the row's there
    shared = sum(f.artifact is not None for f in built.forms) - len(texts)
    assert shared > 0 and "more share a text with one of them" in out
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    argv = ["unused", "--dry-run", "--prepared", str(prep), "--sizes", "sweep:48x80x96", "--precisions", "bf16"]
    assert gpucheck.main(argv) == 0
    dry = capsys.readouterr().out
    assert dry.count("    cubin     prepared: ") == sum(f.artifact is not None for f in built.forms)

"""What a W4A16 row's check needs, made where it is cheapest (gpucheck/w4refs.py): the weights dequantised on the
device are `numerics.w4.dequant`'s bits; `--prepare` saves each row's reference C and bound, the run loads them —
and a file made for another seed, program or inputs is not used (the row computes them itself and says how long that
took); a planted wrong reference in a matching file is what the row checks against, so the check is the file's."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spatialc
from spatialc import gpucheck
from spatialc.gpucheck import w4measure as W4M
from spatialc.gpucheck import w4refs as R
from spatialc.gpucheck import w4rows as W4
from spatialc.gpucheck.cases import cases_of
from spatialc.gpucheck.prepare import MANIFEST
from spatialc.numerics.reference import rounded_operands
from spatialc.runtime.tilize import bf16_bits

from .test_gpucheck_device import run
from .test_gpucheck_fakes import fake_gpu as fake_gpu  # the fixture

SIZE = "w4:int4:16x256x256"


def _program(size):
    (case,) = cases_of([size], ["bf16"])
    return spatialc.build(W4.gemm_of(case), "sm_90")


@pytest.mark.parametrize("fmt", list(W4.FORMATS))
def test_the_weights_dequantised_on_the_device_are_numerics_own(fmt):
    program = _program(f"w4:{fmt}:1x128x256")
    given = W4.inputs(program, 5)
    if "zeros" in given:  # every zero point the format has, so that q − z spans its whole range
        lo, hi = {"int4": (-8, 7), "uint4": (0, 15)}[fmt]
        given["zeros"] = np.resize(np.arange(lo, hi + 1, dtype=np.int8), given["zeros"].shape)
    want = bf16_bits(rounded_operands(program, given)[1].astype(np.float32), np)
    got = R.dequant_bits(given, program, np)
    assert got.dtype == np.uint16 and np.array_equal(got, want)
    given["B"] = given["B"] ^ np.uint8(0x10)  # one bit of every high nibble: another weight
    assert not np.array_equal(R.dequant_bits(given, program, np), want)


@pytest.mark.parametrize("fmt", ["int4", "mxfp4"])
def test_the_weights_laid_out_from_their_bytes_are_the_launchers(fmt):
    from spatialc.gpucheck.builds import build_case
    from spatialc.runtime.arguments import kernel_args
    from spatialc.runtime.w4_args import host_bytes

    (case,) = cases_of([f"w4:{fmt}:1x96x256"], ["bf16"])  # N not a multiple of the tile: padding too
    form = build_case(case, "sm_90").forms[0]
    given = W4.inputs(spatialc.build(W4.gemm_of(case), "sm_90"), 2)
    (arg,) = [a for a in kernel_args(form.artifact.launch) if a.packed]
    fast, slow = W4M.laid_out(arg, given["B"]), host_bytes(arg.spec, arg.tiles, True, given["B"])
    assert fast.given is given["B"] and np.array_equal(fast.storage, slow.storage)
    flipped = W4M.laid_out(arg, given["B"] ^ np.uint8(1))
    assert not np.array_equal(flipped.storage, slow.storage)


def test_a_saved_reference_is_used_only_for_its_own_program_seed_and_inputs(tmp_path):
    program, other = _program(SIZE), _program("w4:int4:64x256x256")
    given = W4.inputs(program, 0)
    path = R.save(tmp_path, program, 0, given)
    (ref, bound), why = R.load(tmp_path, program, 0, given)
    want_ref, want_bound = spatialc.tolerance(program, kernel=True).against(given)
    assert why == "" and np.array_equal(ref, want_ref) and np.all(bound >= want_bound)
    assert np.all(bound <= want_bound * (1 + 2**-23))  # rounded up to float32, no further
    assert R.load(tmp_path, program, 1, W4.inputs(program, 1))[1].startswith("none prepared")  # another seed
    assert R.load(tmp_path, other, 0, W4.inputs(other, 0))[1].startswith("none prepared")  # another program
    changed = {**given, "A": given["A"] * 0.5}
    assert "made from other inputs" in R.load(tmp_path, program, 0, changed)[1]
    R.path_of(tmp_path, R.key_of(program, 1)).write_bytes(path.read_bytes())  # seed 0's file under seed 1's name
    assert "another row's" in R.load(tmp_path, program, 1, W4.inputs(program, 1))[1]
    assert R.load(None, program, 0, given)[1] == "no prepared folder"


def test_the_run_checks_against_the_prepared_reference_or_computes_it(
    fake_gpu, tmp_path, capsys, monkeypatch, fake_nvcc
):
    from spatialc.gpucheck import prepare
    from spatialc.gpucheck.cases import preflight_case
    from spatialc.runtime import nvcc as N

    monkeypatch.setattr(prepare, "preflight_cases", lambda cases: [preflight_case(list(cases))])
    prep, out = tmp_path / "prep", tmp_path / "out"
    assert gpucheck.main([str(prep), "--prepare", "--sizes", SIZE, "--commit", "abc"]) == 0
    (name,) = json.loads((prep / MANIFEST).read_text())["w4_references"]
    monkeypatch.setattr(N, "find_nvcc", lambda: None)
    monkeypatch.setattr(W4M, "_KEPT", {})

    def row():
        status, _, (r,) = run(out, "--prepared", str(prep), "--sizes", SIZE)
        return status, r, [r["by_name"][f"spatialc {f}"] for f in W4.W4_FORMS]

    status, r, mine = row()
    assert status == 0 and all(c["ok"] and "reference and bound prepared" in c["detail"] for c in mine), r["note"]
    assert "computed on the host" not in r["note"]
    program = _program(SIZE)
    with np.load(prep / name) as data:
        saved = dict(data)
    np.savez(prep / name, **{**saved, "ref": saved["ref"] * np.float32(1.25)})  # a planted wrong reference
    status, r, mine = row()
    assert status == 1 and r["status"] == "wrong" and not any(c["check"]["correct"] for c in mine)
    np.savez(prep / name, **{**saved, "crc": saved["crc"] + 1})  # made from other inputs: not used
    status, r, mine = row()
    assert status == 0 and all(c["ok"] for c in mine)
    assert "reference and bound computed on the host in " in r["note"] and "made from other inputs" in r["note"]
    assert R.path_of(prep, R.key_of(program, 0)).name == name
    capsys.readouterr()

"""Map programs of several outputs printed: RoPE's two halves (`spatialc.elementwise({"out1": …, "out2": …})`), each
stored from its own map's ring, and a program whose maps share an intermediate ring (h = x + r; y1 = 2h, y2 = h − r)
— nvcc for sm_80 and sm_90 without a warning or a spill, every kernel in one call (general and persistent forms, bf16
and fp16); the host emulation within `spatialc.tolerance(p, kernel=True)`, and a planted fault it must catch: out2
stored from out1's ring."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.lower.cuda.common.cwriter import INCLUDES

from ..passes.test_map_outputs import rope, rope_inputs, shared_program
from .test_general_row_outputs import param, stores
from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


@cache
def built(which: str, precision: str = "bf16"):
    return rope(precision, sites=3) if which == "rope" else shared_program()


@cache
def lowered(which: str, form: str, precision: str = "bf16"):
    return spatialc.lower(built(which, precision), form=form)


def from_other_ring(p, text: str) -> str:
    """The planted fault: out2 stored from out1's page, in out1's store (where that page is waited for), out2's own
    store left empty."""
    found = stores(text)
    (line1, _, page1), (line2, type2, _) = found[param(p, "out1")], found[param(p, "out2")]
    wrong = f"SPATIALC_OUT_ST(&{param(p, 'out2')}[(long long)tile * 256 + el], ({type2})SPATIALC_PAGE_LD({page1}));"
    assert text.count(line1) == text.count(line2) == 1
    return text.replace(line2, "(void)tile;").replace(line1, f"{line1} {wrong}")


@pytest.mark.parametrize("form", ["general", "persistent"])
def test_each_output_is_stored_from_its_own_maps_ring(form):
    p = built("rope")
    rings = {b.name: int(b.id) for b in p.buffers}
    found = stores(lowered("rope", form).kernel_cu)
    for out in ("out1", "out2"):
        page = found[param(p, out)][2]
        assert page.startswith(f"ring_{rings[out + '_ring']} "), (out, page)


NVCC_CASES = [
    *(("rope", form, prec) for prec in ("bf16", "fp16") for form in ("general", "persistent")),
    *(("shared", form, "fp16") for form in ("general", "persistent")),
]


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_kernel_compiles_for_sm80_and_sm90_without_warnings_or_spills(tmp_path):
    """Each case's program_cu (its kernel and the host code that launches it), all in one translation unit."""
    arts = [lowered(*case) for case in NVCC_CASES]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(art.program_cu, i, "p") for i, art in enumerate(arts)]
    (tmp_path / "maps.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "2", "-o", str(tmp_path / "maps.o"), str(tmp_path / "maps.cu"), *archs, *FLAGS]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert sorted((case, arch) for case, _, arch, _, _ in entries) == sorted(
        (i, arch) for i in range(len(arts)) for arch in ("sm_80", "sm_90")
    )
    for case, _, arch, spill, _ in entries:
        assert spill == 0, f"case {case} {arch} spills {spill} bytes"


@pytest.mark.emulation
@needs_gxx
@pytest.mark.filterwarnings("ignore::spatialc.InexactInputWarning")
def test_rope_emulates_within_the_tolerance_and_out2_from_out1s_ring_is_caught():
    """Both halves against the interpreter's (the general form); then out2 stored from out1's page: the check fails,
    naming out2, while out1 is as before."""
    p = built("rope")
    art, x = lowered("rope", "general"), rope_inputs()
    got = spatialc.emulate(art, x)
    want = spatialc.evaluate(p, x)
    assert set(got) == set(want) == {"out1", "out2"}
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how
    bad = spatialc.emulate(dataclasses.replace(art, program_cu=from_other_ring(p, art.program_cu)), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(bad, x)
    assert not ok and "out2" in how, how
    assert np.array_equal(bad["out1"], got["out1"]) and np.array_equal(bad["out2"], got["out1"])


@pytest.mark.emulation
@needs_gxx
def test_maps_of_a_shared_ring_emulate_within_the_tolerance():
    """h = x + r kept in a ring two maps read, r's ring read by two maps too (the persistent form)."""
    p = built("shared")
    rng = np.random.default_rng(4)
    x = {k: rng.standard_normal((40, 70)).astype(np.float16) for k in ("x", "r")}
    got = spatialc.emulate(lowered("shared", "persistent"), x)
    ok, how = spatialc.tolerance(p, kernel=True).check(got, x)
    assert ok, how
    h = x["x"].astype(np.float32) + x["r"].astype(np.float32)
    assert np.array_equal(got["y1"], 2 * h) and np.array_equal(got["y2"], h - x["r"].astype(np.float32))

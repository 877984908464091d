"""An elementwise program that reads a row vector (`ew.row`, one value per row), printed in the general form and run
through the host emulation: equal to the interpreter bit for bit, and a row vector read at the wrong row in the
printed text caught; nvcc compiles it for sm_80, 86 and 90 without a warning or a spill."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.lower.cuda.common.cwriter import INCLUDES

from .test_general_maps import inputs
from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

GXX = shutil.which("g++")


def built() -> spatialc.SpatialProgram:
    x, g = ew.inputs(2)
    expr = ew.max(x * ew.row("scale"), g) + ew.col("bias") - ew.row("shift")
    return spatialc.build(spatialc.elementwise(expr, 45, 40, "bf16"), "sm_90", block=(2, 1, 1), sites=3)


@pytest.mark.emulation
@pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")
def test_a_row_vector_map_emulates_as_the_interpreter_and_a_wrong_row_is_caught():
    """Odd sizes (the vector padded to whole blocks of rows), several items a site (item_y > 0: the vector read at
    an offset), a column vector beside it. The fault reads the row vector by the element's column in its tile."""
    p = built()
    art = spatialc.lower(p)
    vals = inputs(p)
    rng = np.random.default_rng(1)
    for t in p.tensors:  # a row vector: one value per row, all distinct
        if t.elems[1] == 1:
            vals[t.name] = (rng.standard_normal(t.elems[0]) * 4).astype(np.float32)
    want = spatialc.evaluate(p, vals)
    assert np.array_equal(spatialc.emulate(art, vals), want)

    old = " * 256 + (el / 16) * 16]"
    assert art.program_cu.count(old) == 2  # the two row vectors' reads
    wrong = dataclasses.replace(art, program_cu=art.program_cu.replace(old, " * 256 + (el % 16) * 16]"))
    assert not np.array_equal(spatialc.emulate(wrong, vals), want)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_row_vector_map_kernel_compiles_without_warnings_or_spills(tmp_path):
    """The program_cu, which begins with the kernel_cu as printed (so the kernel is compiled once, not again on its
    own), its host code compiled too (`-c`: gcc -Wall -Wextra -Werror)."""
    art = spatialc.lower(built())
    assert art.program_cu.startswith(art.kernel_cu)
    texts = [art.program_cu]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(text, i, "p") for i, text in enumerate(texts)]
    src = tmp_path / "map_rows.cu"
    src.write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_86", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "2", "-o", str(src.with_suffix(".o")), str(src), *archs, *FLAGS]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert len(entries) == 3 * len(texts) and not any(spill for _, _, _, spill, _ in entries), log[-3000:]

"""Host time of one W4A16 row of the GPU check (gpucheck/w4measure.py, w4refs.py), before and after the reference
moved to `--prepare` and the dequantisation to the device, measured in one run on this CPU.

before (what a row did on the GPU machine's CPU): the weights drawn, A and the weights dequantised in float64
(`w4rows.operands`), their float64 product, the tolerance's reference and bound (`against`: dequantises again), and
each form's arguments bound (`launch.bound_operands`: the 4-bit ones checked as float64 values and laid out).

after: the weights drawn, the saved reference and bound loaded (`w4refs.load`), the scales and zero points laid out
once a shape (every form and M of a shape shares them). The packed weights' layout (`w4measure.laid_out`, from their
bytes), the dequantisation and the float64 product run on the device (the layout is timed here in numpy, as a
bound). The file's cost at `--prepare` is timed too (`w4refs.save`).

    python bench/w4_host.py w4:int4:64x4096x4096 [w4:int4:64x14336x14336 …]
"""

from __future__ import annotations

import sys
import tempfile
import time

import spatialc
from spatialc.gpucheck import w4measure, w4refs, w4rows
from spatialc.gpucheck.builds import build_case
from spatialc.gpucheck.cases import cases_of
from spatialc.runtime import launch as L
from spatialc.runtime.arguments import kernel_args
from spatialc.runtime.tilize import BYTE_ELEMS


def timed(call):
    t0 = time.perf_counter()
    out = call()
    return out, time.perf_counter() - t0


def row(size: str) -> None:
    (case,) = cases_of([size], ["bf16"])
    program = spatialc.build(w4rows.gemm_of(case), "sm_90")
    forms = [f for f in build_case(case, "sm_90").forms if f.artifact is not None]
    given, t_draw = timed(lambda: w4rows.inputs(program, 0))
    tolerance = spatialc.tolerance(program, kernel=True)
    (a, b), t_ops = timed(lambda: w4rows.operands(program, given))
    _, t_prod = timed(lambda: a @ b)
    _, t_against = timed(lambda: tolerance.against(given))
    t_bind = sum(timed(lambda f=f: L.bound_operands(f.artifact, (), given))[1] for f in forms)
    before = t_draw + t_ops + t_prod + t_against + t_bind
    with tempfile.TemporaryDirectory() as folder:
        _, t_save = timed(lambda: w4refs.save(folder, program, 0, given))
        (saved, why), t_load = timed(lambda: w4refs.load(folder, program, 0, given))
        assert saved is not None, why
    args = {
        a
        for f in forms
        for a in kernel_args(f.artifact.launch)
        if a.elem in BYTE_ELEMS and a.role not in ("output", "workspace")
    }
    t_laid = sum(timed(lambda a=a: w4measure.laid_out(a, given[a.name]))[1] for a in args if not a.packed)
    t_packed = sum(timed(lambda a=a: w4measure.laid_out(a, given[a.name]))[1] for a in args if a.packed)
    after = t_draw + t_load + t_laid
    print(
        f"{size}: before {before:.1f} s (draw {t_draw:.1f}, dequant {t_ops:.1f}, product {t_prod:.1f}, reference and "
        f"bound {t_against:.1f}, {len(forms)} forms bound {t_bind:.1f}); after {after:.1f} s (draw {t_draw:.1f}, "
        f"load {t_load:.2f}, scales' and zero points' layouts once a shape {t_laid:.1f}); the packed weights' layout, "
        f"on the device in the run, {t_packed:.1f} s here in numpy; at --prepare {t_save:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    for size in sys.argv[1:] or ["w4:int4:64x4096x4096"]:
        row(size)

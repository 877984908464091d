"""How long lowering takes, in each form, for the largest programs: 8192³ fp16 and int8 on sm_90.

    python bench/lower_speed.py [runs]

Each form's program is planned for it (`spatialc.build(..., form=...)`: the general form keeps the output ring in
shared memory, so its plan differs). Times `spatialc.lower(p, form=...)` (which verifies the program again, as
every user call does) and the backend alone (`lower.cuda.<form>.lower`: checks, layout, printing, census), median
of `runs` (default 7), CPU time (`time.process_time`). Baseline, measured in the same run: `spatialc.build` of the same
program (tile → place → schedule → verify), and build + lower against the issue's goal (25 ms, issue 35, point 9).
`lower` after `build` does not prove the program again: verify remembers the programs it returned (a changed one is
verified anew); the backend alone is timed on its own.
"""

from __future__ import annotations

import sys

from build_speed import GOAL_MS, median_time  # bench/ is the script's folder, first on sys.path

import spatialc
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.cuda.persistent import kernel as persistent


def main(runs: int = 7) -> None:
    target = spatialc.target("sm_90")
    for prec in ("fp16", "int8"):
        gemm = spatialc.gemm(8192, 8192, 8192, prec)
        for form, backend in (("persistent", persistent), ("general", general)):
            build = median_time(lambda gemm=gemm, form=form: spatialc.build(gemm, target, form=form), runs)
            p = spatialc.build(gemm, target, form=form)  # the last built: lower finds it proven, as after a build
            whole = median_time(lambda p=p, form=form: spatialc.lower(p, form=form), runs)
            alone = median_time(lambda p=p, backend=backend: backend.lower(p, target), runs)
            sites = len(p.placement.items_of_site)
            print(
                f"8192³ {prec} sm_90 {form:10} ({p.plan.items} items on {sites} sites): lower {whole * 1e3:6.1f} ms"
                f" (backend alone {alone * 1e3:5.1f} ms); build {build * 1e3:.1f} ms, ratio {whole / build:.2f}x;"
                f" build + lower {(build + whole) * 1e3:.1f} ms (goal {GOAL_MS:.0f})"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)

"""How long building an attention program takes, all eight rules included, and rule 8 (its proof of the online
recurrence, passes/verify/attention.py) alone: at seq 16384 against the goal of 100 ms (issue 32), and at seq 1024
to show the build does not grow with the sequence. CPU time (`time.process_time`), median of `runs` after a warm-up.

Usage: python bench/attention_build.py [runs]      (runs: default 7)
"""

from __future__ import annotations

import statistics
import sys
import time

import spatialc
from spatialc.ir.index import ProgramIndex
from spatialc.passes.verify.facts import Programs
from spatialc.passes.verify.semantics import check_semantics

GOAL_MS = 100.0  # build + verify of attention(1, 16, 16384, 16384, 128), CPU time (issue 32)


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return 1000 * statistics.median(times)


def rule8(p: spatialc.SpatialProgram):
    """Rule 8 on a built program, as verify runs it, its index and the programs' facts made beforehand (as verify
    makes them for rules 1–7)."""
    index, programs = ProgramIndex.of(p), Programs(p)
    programs.gather(index)
    return lambda: check_semantics(index, programs)


def main(runs: int) -> None:
    print(f"{'program':<44} {'target':<7} {'build':>9} {'rule 8':>9}")
    for seq in (1024, 16384):
        # sm_90a: the build plans for the sm_90a form and asks it whether it prints the plan (`sm90a_refusal`)
        for target in ("sm_90", "sm_90a"):
            program = spatialc.attention(1, 16, seq, seq, 128, causal=seq == 1024)
            built = spatialc.build(program, target)  # warm-up: imports, the target's tables
            build = median_ms(lambda program=program, target=target: spatialc.build(program, target), runs)
            alone = median_ms(rule8(built), runs)
            name = f"attention(1, 16, {seq}, {seq}, 128{', causal' if seq == 1024 else ''})"
            print(f"{name:<44} {target:<7} {build:>7.1f}ms {alone:>7.2f}ms")
            if seq == 16384:
                met = "met" if build < GOAL_MS else "MISSED"
                print(f"goal ({target}): build + verify under {GOAL_MS:.0f} ms — {met}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)

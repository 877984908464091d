"""The mutation suite at size: many random edits of saved programs, through from_json → evaluate (→ lower → emulate
for a sample of the accepted ones), counted. The suite in tests/passes/test_mutations.py runs a smaller slice in CI.

    python bench/mutations.py [EDITS_PER_PROGRAM [SEED [EMULATED]]]      # defaults: 3000, 1, 40

Prints one line of counts per stage and every hole found (an edit accepted by verify that then computes something
else or fails); exits 1 when there is one. Progress goes to stderr.
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import mutants  # noqa: E402

import spatialc  # noqa: E402
from spatialc.numerics.reference import reference  # noqa: E402


def main(argv: list[str]) -> int:
    edits = int(argv[0]) if argv else 3000
    seed = int(argv[1]) if len(argv) > 1 else 1
    emulated = int(argv[2]) if len(argv) > 2 else 40
    warnings.simplefilter("ignore")  # inexact-input warnings: the inputs are exact small integers on purpose
    t0 = time.perf_counter()
    tally = mutants.run(edits, seed)
    print(f"interpreter: {tally.line()} ({time.perf_counter() - t0:.0f} s, {len(mutants.PROGRAMS)} programs)")
    kernel = Counter[str]()
    rng = random.Random(seed)
    t0 = time.perf_counter()
    for base, what, q in rng.sample(tally.accepted, len(tally.accepted)):
        if kernel["emulated"] >= emulated:
            break
        try:
            art = spatialc.lower(q)
        except spatialc.SpatialError:
            kernel["refused by lower"] += 1
            continue
        inputs = mutants.inputs_for(q)
        ref = reference(q, inputs)
        c = np.asarray(spatialc.emulate(art, inputs)).astype(ref.dtype)
        kernel["emulated"] += 1
        if not np.array_equal(c, ref):
            kernel["hole"] += 1
            tally.holes.append(f"{base}: {what}: verified and lowered; the emulated kernel differs")
        print(f"  emulated {kernel['emulated']}/{emulated}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    print(
        f"kernel: of the accepted edits that change the program, {kernel['refused by lower']} refused by lower,"
        f" {kernel['emulated']} emulated, {kernel['hole']} differing ({time.perf_counter() - t0:.0f} s)"
    )
    for hole in tally.holes:
        print(f"HOLE {hole}")
    return 1 if tally.holes else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

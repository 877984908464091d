"""Loading saved programs: `spatialc.from_json` (the document read, its verified mark checked by verify again) and
`serde.from_json` alone (parse, size counts, decode, name check), with the quick decoder and type check
(`serde.decode_quickly`, `validate._holds`) and without them, as before them (`serde.decode` in the quick one's
place, the quick check saying no at once, so that `validate._fault` checks everything): each pair timed in the same
run, interleaved, on the same text.
The median of RUNS (env RUNS, default 5) and the best.

Usage: PYTHONPATH=src python bench/json_speed.py  (from the repository root: the mutation suite's programs are
tests/mutants.py's)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import spatialc
from spatialc.ir import serde, validate

sys.path.insert(0, ".")
from tests import mutants  # noqa: E402

RUNS = int(os.environ.get("RUNS", 5))


def documents() -> dict[str, list[str]]:
    return {
        "gemm 4096³ fp16, sm_90": [spatialc.to_json(spatialc.build(spatialc.gemm(4096, 4096, 4096, "fp16"), "sm_90"))],
        "attention 1×8×1024×1024×64": [spatialc.to_json(spatialc.build(spatialc.attention(1, 8, 1024, 1024, 64)))],
        "mutants.PROGRAMS (15)": [spatialc.to_json(make()) for make in mutants.PROGRAMS.values()],
    }


def timed(load, texts: list[str], quick: bool) -> float:
    serde.decode_quickly = QUICK if quick else SLOW
    validate._holds = HOLDS if quick else NEVER
    validate._all_hold = ALL_HOLD if quick else (lambda checks, value: False)
    start = time.perf_counter()
    for text in texts:
        load(text)
    return time.perf_counter() - start


QUICK = serde.decode_quickly
SLOW = serde.decode
HOLDS, ALL_HOLD = validate._holds, validate._all_hold


def NEVER(annotation):
    return lambda value: False


def main() -> None:
    for name, texts in documents().items():
        for what, load in (("spatialc.from_json", spatialc.from_json), ("serde.from_json", serde.from_json)):
            before, after = [], []
            for _ in range(RUNS):
                before.append(timed(load, texts, quick=False))
                after.append(timed(load, texts, quick=True))
            b, a = statistics.median(before), statistics.median(after)
            print(
                f"{name:28} {what:18} {sum(map(len, texts)) / 1e6:6.2f} MB  before {b * 1e3:8.1f} ms"
                f"  after {a * 1e3:8.1f} ms  {b / a:4.2f}×  (best {min(before) / min(after):4.2f}×)"
            )
    timed(len, [], quick=True)


if __name__ == "__main__":
    main()

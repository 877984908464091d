"""The test suite's CPU seconds, per test and per file, children included (compilers, emulated runs, subprocesses).

    python bench/suite_cpu.py [pytest arguments]     # e.g. tests/lower -n 2; writes bench/suite_cpu/*.tsv

Runs pytest with a plugin (`-p suite_cpu_plugin`, loaded by every xdist worker) that records, around each test's
setup, call and teardown, the `getrusage` of the worker and of its waited-for children, then prints the totals (in
process, children), the heaviest files and tests, and how much the tests under a second add up to. Run it with a
fresh SPATIALC_CACHE to count the compiles a clean CI run pays: the runner's time has followed these CPU seconds
(bench/README.md, "The suite's CPU seconds")."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "suite_cpu"


def main(args: list[str]) -> int:
    OUT.mkdir(exist_ok=True)
    for old in OUT.glob("cpu.*.tsv"):
        old.unlink()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    env["SPATIALC_SUITE_CPU_OUT"] = str(OUT)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu_plugin", *args], env=env, check=False)
    rows = []
    for tsv in OUT.glob("cpu.*.tsv"):
        for line in tsv.read_text().splitlines():
            own, children, wall, node = line.split("\t", 3)
            rows.append((float(own), float(children), float(wall), node))
    if not rows:
        print("no test ran")
        return done.returncode or 2
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for own, children, _, node in rows:
        f = by_file[node.split("::")[0]]
        f[0] += own
        f[1] += children
        f[2] += 1
    own = sum(r[0] for r in rows)
    children = sum(r[1] for r in rows)
    print(f"\n{len(rows)} tests: {own + children:.0f} CPU-s ({own:.0f} in the test processes, {children:.0f} children)")
    small = [r for r in rows if r[0] + r[1] < 1.0]
    print(f"{len(small)} tests under 1 CPU-s: {sum(r[0] + r[1] for r in small):.0f} CPU-s")
    print("\nheaviest files (CPU-s: all, children; tests):")
    for name, (o, c, n) in sorted(by_file.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:25]:
        print(f"{o + c:7.1f} {c:7.1f} {int(n):4d}  {name}")
    print("\nheaviest tests (CPU-s: all, children):")
    for o, c, _, node in sorted(rows, key=lambda r: -(r[0] + r[1]))[:15]:
        print(f"{o + c:7.1f} {c:7.1f}  {node}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

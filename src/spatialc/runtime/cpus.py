"""How many CPUs this process may keep busy: the CPUs it may run on (its affinity), fewer where a cgroup's CPU quota
allows less — a container on a large host sees all the host's CPUs but may be given the time of two. Worker pools
(the test suite's pytest-xdist workers, the GPU check's parallel builds) size themselves by it: one worker a CPU the
process can see but not use only adds each worker's start-up, memory and contention."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def affinity_cpus() -> int:
    """The CPUs the affinity mask names (all the OS counts where there is no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cpus() -> int:
    """The CPUs the affinity mask names, capped by the CPU quota of this process's cgroup (v2 or v1) where one is
    set, rounded up; at least 1."""
    n = affinity_cpus()
    quota = cgroup_quota()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def cgroup_quota(root: Path = CGROUP, self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup allows (quota / period), the smallest along this process's cgroup and the
    root's; None where no quota is set or none can be read."""
    found: list[float] = []
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2: cpu.max reads "<quota|max> <period>"
            for folder in _up(root / rel, root):
                found += _v2(folder / "cpu.max")
        elif "cpu" in controllers.split(","):  # cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                for folder in _up(root / name / rel, root / name):
                    found += _v1(folder)
    return min(found) if found else None


def _up(folder: Path, top: Path) -> list[Path]:
    """`folder` and each folder above it up to `top`, the nearest first."""
    out = [folder]
    while folder != top and top in folder.parents:
        folder = folder.parent
        out.append(folder)
    return out


def _v2(path: Path) -> list[float]:
    try:
        quota, period = path.read_text().split()[:2]
        return [] if quota == "max" else [int(quota) / int(period)]
    except (OSError, ValueError, ZeroDivisionError):
        return []


def _v1(folder: Path) -> list[float]:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return []
    return [quota / period] if quota > 0 and period > 0 else []

"""usable_cpus: the affinity mask, capped by a cgroup's CPU quota (v2's cpu.max, v1's cfs quota over its period), the
smallest along the process's cgroup and the folders above it; what sizes the suite's pytest-xdist workers
(tests/conftest.py) and the GPU check's build pools."""

from __future__ import annotations

import os

import pytest

from spatialc.runtime import cpus

from ..conftest import pytest_xdist_auto_num_workers


def tree(tmp_path, files: dict[str, str], self_cgroup: str):
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "self").write_text(self_cgroup)
    return cpus.cgroup_quota(root, tmp_path / "self")


def test_a_v2_quota_is_the_smallest_along_the_path(tmp_path):
    files = {"cpu.max": "max 100000\n", "a/cpu.max": "400000 100000\n", "a/b/cpu.max": "150000 100000\n"}
    assert tree(tmp_path, files, "0::/a/b\n") == 1.5
    assert tree(tmp_path, {**files, "a/b/cpu.max": "max 100000\n"}, "0::/a/b\n") == 4.0


def test_no_quota_is_none(tmp_path):
    assert tree(tmp_path, {"cpu.max": "max 100000\n"}, "0::/\n") is None
    assert tree(tmp_path, {}, "0::/somewhere\n") is None
    assert tree(tmp_path, {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n") is None


def test_a_v1_quota_under_its_controllers_folder(tmp_path):
    files = {"cpu,cpuacct/job/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"}
    assert tree(tmp_path, files, "4:memory:/job\n3:cpu,cpuacct:/job\n") == 2.0


def test_unreadable_or_garbled_files_are_no_quota(tmp_path):
    assert tree(tmp_path, {"cpu.max": "lots\n"}, "0::/\n") is None
    assert cpus.cgroup_quota(tmp_path / "none", tmp_path / "no-such-file") is None
    # a period of 0 (no kernel writes one, but a garbled or faked file may) is no quota, not a ZeroDivisionError at
    # the suite's start (conftest.py's worker count and header ask it)
    assert tree(tmp_path, {"cpu.max": "100000 0\n"}, "0::/\n") is None


@pytest.mark.parametrize(
    ("seen", "quota", "usable"), [(16, 2.0, 2), (16, 1.5, 2), (16, None, 16), (4, 0.2, 1), (2, 8.0, 2)]
)
def test_usable_cpus_is_the_mask_capped_by_the_quota_rounded_up(monkeypatch, seen, quota, usable):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(seen)), raising=False)
    monkeypatch.setattr(cpus, "cgroup_quota", lambda: quota)
    assert cpus.usable_cpus() == usable


def test_the_suites_workers_are_the_usable_cpus_unless_the_environment_says(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    monkeypatch.setattr(cpus, "cgroup_quota", lambda: 2.0)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert pytest_xdist_auto_num_workers(None) == 2  # type: ignore[arg-type]
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert pytest_xdist_auto_num_workers(None) == 3  # type: ignore[arg-type]

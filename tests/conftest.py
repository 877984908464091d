"""The smoke subset: `python -m pytest -m smoke`, under two minutes on two cores with an empty compile cache.

A test is in it when its module is one of SMOKE_MODULES and it is not marked `emulation` or `nvcc`: those modules
check the IR, the passes, verify and its mutation suite, the interpreter, the API, the CLI's refusals and the printed
CUDA text, and compile nothing. The full suite (`python -m pytest`) runs everything, one worker per usable CPU
(pytest-xdist, `-n auto` in pyproject.toml's addopts, sized below); the emulation's compiles are cached across workers
under `$SPATIALC_CACHE`.
"""

from __future__ import annotations

import os

import pytest

from spatialc.runtime.cpus import affinity_cpus, cgroup_quota, usable_cpus

SMOKE_MODULES = frozenset(
    {
        "test_activations",
        "test_api",
        "test_cache",
        "test_cli",
        "test_epilogue",
        "test_general_maps",
        "test_grouped_gemm",
        "test_hardening",
        "test_interp",
        "test_ir",
        "test_lang",
        "test_lower",
        "test_lower_golden",
        "test_mlp",
        "test_multicast",
        "test_mutations",
        "test_names",
        "test_numerics_edges",
        "test_output_types",
        "test_passes",
        "test_progress",
        "test_quant",
        "test_readme",
        "test_split_k",
        "test_target",
        "test_verify",
        "test_worklist",
    }
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml): one worker for each CPU this process may use, not each CPU it can see — a runner
    given two CPUs' time on a large host would otherwise start a worker (each collecting the whole suite, importing
    numpy and torch) for every CPU of the host. PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    return int(env) if env and env.isdigit() else usable_cpus()


def _cpu_line() -> str:
    seen, quota = affinity_cpus(), cgroup_quota()
    limit = f", a CPU quota of {quota:g}" if quota is not None else ", no CPU quota"
    return f"spatialc: usable CPUs {usable_cpus()} ({seen} in the affinity mask{limit})"


def pytest_report_header(config: pytest.Config) -> str:
    return _cpu_line()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The CPUs again at the end, with the workers started: `-q` (pyproject's addopts) hides the header, and a CI log
    is read from its end."""
    workers = getattr(terminalreporter.config.option, "numprocesses", None)
    terminalreporter.write_line(f"{_cpu_line()}; xdist workers: {workers or 0}")


class SmokeCompiled(AssertionError):
    """A smoke test reached the host emulation's compiler: mark it `pytest.mark.emulation`."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if module in SMOKE_MODULES and not _compiles(item):
            item.add_marker(pytest.mark.smoke)
    _heaviest_files_first(items)


def _compiles(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("emulation") or item.get_closest_marker("nvcc"))


def _heaviest_files_first(items: list[pytest.Item]) -> None:
    """The files that compile the most first, each file's tests together and in their order: the workers take a file
    at a time (`--dist loadfile`), and a heavy file taken last leaves one core idle until it ends (in collection
    order the heaviest files, tests/w4a16's, came last). Compiling tests stand for a file's time (g++ and nvcc are
    two thirds of the suite's), and a test marked `long` (tens of seconds of Python) for five of them."""
    weight: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        first.setdefault(path, i)
        weight[path] = weight.get(path, 0) + _compiles(item) + 5 * bool(item.get_closest_marker("long"))

    def key(item: pytest.Item) -> tuple[int, int]:  # (a stable sort: a file's tests keep their order)
        path = item.nodeid.split("::", 1)[0]
        return (-weight[path], first[path])

    items.sort(key=key)


@pytest.fixture(autouse=True)
def _smoke_compiles_nothing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoke test that would compile an emulation fails, by name, instead of making the subset slow unseen."""
    if request.node.get_closest_marker("smoke") is None:
        return
    from spatialc.runtime import emu_compile

    def refuse() -> tuple[str, str]:
        raise SmokeCompiled(f"{request.node.nodeid} compiles with g++: mark it pytest.mark.emulation")

    monkeypatch.setattr(emu_compile, "_compiler", refuse)

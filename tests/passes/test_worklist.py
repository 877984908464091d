"""The work list follows the device: a kernel planned for one GPU's multiprocessors runs, exact, on any number of them
— its sites are the device's, its items split by the placement's rule at launch (issue: "the first GPU run must
count"). The kernel text is the same for every split; each split is a placement verify accepts."""

from __future__ import annotations

import shutil
import subprocess
from importlib import resources

import numpy as np
import pytest

import spatialc
from spatialc.ir.worklist import grouped_order, split_items, work_table
from spatialc.passes.place import place
from spatialc.passes.schedule import schedule
from spatialc.passes.tile import tile
from spatialc.passes.verify import verify
from spatialc.runtime import launch as L

from ..stand_in import StandInDevice

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the emulation compiles with g++")


@pytest.mark.parametrize("kind", ["contiguous", "round_robin"])
@pytest.mark.parametrize(("items", "sites"), [(1, 1), (7, 3), (12, 12), (5, 9), (1000, 132)])
def test_the_rule_gives_every_item_to_exactly_one_site(kind, items, sites):
    parts = split_items(items, sites, kind)
    assert len(parts) == sites and sorted(i for p in parts for i in p) == list(range(items))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    table = work_table(parts)
    assert len(table) == 2 * sites + items
    assert [table[2 * sites + table[s] : 2 * sites + table[s] + table[sites + s]] for s in range(sites)] == parts


@pytest.mark.parametrize(
    ("grid", "band", "sites"), [((1, 1), 1, 1), ((7, 5), 3, 4), ((7, 5), 9, 2), ((64, 32), 16, 132)]
)
def test_the_grouped_rule_deals_bands_of_rows_column_by_column(grid, band, sites):
    items = grid[0] * grid[1]
    parts = split_items(items, sites, "grouped", grid, band)
    assert sorted(i for p in parts for i in p) == list(range(items))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    order = grouped_order(grid, band)
    # What the sites run at one time lies in one band, or the end of one and the start of the next: at most two
    # bands of rows, and about as many columns as hold a wave in one band's rows.
    for t in range(0, items, sites):
        wave = order[t : t + sites]
        rows, cols = {i // grid[1] for i in wave}, {i % grid[1] for i in wave}
        assert len({r // band for r in rows}) <= 2
        assert len(cols) <= -(-len(wave) // min(band, grid[0])) + 2
    with pytest.raises(ValueError, match="needs the item grid"):
        split_items(items, sites, "grouped")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_printed_host_program_deals_the_same_work_list(tmp_path):
    """spatialc_work_list, the C++ the host programs carry, gives every rule's list exactly as ir/worklist.py."""
    header = resources.files("spatialc.lower.cuda.common").joinpath("host.cuh").read_text()
    cases = [(35, 4, "contiguous", (7, 5), 0), (35, 4, "round_robin", (7, 5), 0), (35, 4, "grouped", (7, 5), 3)]
    cases += [(2048, 132, "grouped", (64, 32), 16), (6, 9, "grouped", (2, 3), 5)]
    rules = ("contiguous", "round_robin", "grouped")
    calls = "".join(
        f"print(spatialc_work_list({n}, {s}, {rules.index(k)}, {g[0]}, {g[1]}, {b}));" for n, s, k, g, b in cases
    )
    src = tmp_path / "w.cpp"
    src.write_text(
        "#include <cstdio>\n#include <vector>\n"
        + header
        + '\nstatic void print(const std::vector<int>& w) { for (int x : w) printf("%d ", x); printf("\\n"); }\n'
        + f"int main() {{ {calls} return 0; }}\n"
    )
    subprocess.run(["g++", "-std=c++17", "-o", str(tmp_path / "w"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "w")], capture_output=True, text=True, check=True).stdout.splitlines()
    for line, (n, s, k, g, b) in zip(out, cases, strict=True):
        assert [int(x) for x in line.split()] == work_table(split_items(n, s, k, g, b)), (k, g, b)


@pytest.mark.parametrize("sms", [7, 132])
def test_every_split_the_device_makes_is_a_placement_verify_accepts(sms):
    t = spatialc.target("sm_90")
    base = spatialc.build(spatialc.gemm(300, 200, 100, "int8"), t)
    launch = spatialc.lower(base).launch
    tiled = tile(spatialc.gemm(300, 200, 100, "int8").evolve(target="sm_90"), t)
    again = verify(schedule(place(tiled, t, sites=launch.sites(sms), placement=base.placement.kind)))
    assert spatialc.lower(again).kernel_cu == spatialc.lower(base).kernel_cu


@pytest.mark.parametrize("sms", [7, 132])
def test_the_launcher_runs_as_many_sites_as_the_device_keeps_resident(sms):
    art = spatialc.lower(spatialc.build(spatialc.gemm(1000, 600, 64, "fp16"), "sm_90"))
    dev = StandInDevice(sms=sms)  # a GPU stand-in with `sms` multiprocessors that records its launches
    prep = L.prepare(art, dev)
    prep.run(prep.order([None, None], None))
    ((_, grid, _, _, args),) = dev.launches
    work = args[-1]
    assert grid == min(art.launch.items, sms * art.launch.per_sm) and work.dtype == np.int32
    rule = (art.launch.placement, art.launch.item_grid, art.launch.band)
    assert list(work) == work_table(split_items(art.launch.items, grid, *rule))


@needs_gxx
@pytest.mark.parametrize("sms", [7, 132])
@pytest.mark.parametrize("kind", ["contiguous", "round_robin", "grouped"])
@pytest.mark.emulation  # compiles with g++
def test_the_emulated_kernel_is_exact_on_devices_of_7_and_132_multiprocessors(sms, kind):
    p = spatialc.build(spatialc.gemm(384, 256, 32, "int8", epilogue=[spatialc.relu()]), "sm_86", placement=kind)
    art = spatialc.lower(p)
    assert art.launch.per_sm > 0  # placed over what sm_86 keeps resident: it follows the device
    assert art.launch.sites(7) < art.launch.items <= art.launch.sites(132)  # 7 SMs: sites with several items each
    rng = np.random.default_rng(sms)
    a = rng.integers(-128, 128, (384, 32)).astype(np.int8)
    x = {"A": a, "B": rng.integers(-128, 128, (32, 256)).astype(np.int8)}
    assert np.array_equal(spatialc.emulate(art, x, sms=sms), spatialc.evaluate(p, x))


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "7", 1 << 20])
def test_an_emulated_device_of_no_whole_number_of_multiprocessors_is_refused(bad):
    """The emulator takes 0 or -1 for its default of 132 without a word; the API refuses them before compiling."""
    art = spatialc.lower(spatialc.build(spatialc.gemm(32, 32, 32, "int8"), "sm_86"))
    x = {"A": np.ones((32, 32), np.int8), "B": np.ones((32, 32), np.int8)}
    with pytest.raises(spatialc.ProgramError, match=r"sms is the emulated device's multiprocessors, a whole number"):
        spatialc.emulate(art, x, sms=bad)


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan"), "60", True])
def test_an_emulation_watchdog_that_is_not_a_positive_number_of_seconds_is_refused(bad):
    """(None is no refusal: it asks for SPATIALC_EMU_TIMEOUT_S, else 120 s — tests/runtime/test_time_limits.py.)"""
    art = spatialc.lower(spatialc.build(spatialc.gemm(32, 32, 32, "int8"), "sm_86"))
    x = {"A": np.ones((32, 32), np.int8), "B": np.ones((32, 32), np.int8)}
    with pytest.raises(spatialc.ProgramError, match=r"timeout is the emulation's watchdog in seconds"):
        spatialc.emulate(art, x, timeout=bad)

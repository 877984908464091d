"""The hilbert placement (issue 36, section 2 item 4): a GEMM's items along a generalized Hilbert curve over their grid
(any sizes), dealt round-robin over the sites as `grouped` deals its bands — the rule in ir/worklist.py, the printed
host programs' copy in hilbert_host.cuh, and the places that know the rules (place, verify, lower, launch, viz,
serde, CLI). The working-set figures behind its being no default are computed here, not assumed."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spatialc
from spatialc import viz
from spatialc.cli import main
from spatialc.errors import IllFormedError, ProgramError
from spatialc.ir.worklist import grouped_order, hilbert_order, split_items, wave_strips, work_table
from spatialc.lower.cuda.sm90a.plan import L2_BYTES
from spatialc.passes.place import default_band, wave_bytes
from spatialc.passes.verify import verify
from spatialc.runtime.tilize import LaunchError, work_list

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host program's copy compiles with g++")

SHAPES = [(1, 1), (1, 2), (2, 1), (1, 1000), (1000, 1), (2, 2), (2, 3), (3, 2), (4, 5), (5, 4), (7, 11), (13, 17)]
SHAPES += [(33, 47), (47, 33), (64, 32), (32, 16), (31, 2), (2, 999), (999, 2), (97, 101), (101, 97), (3, 127)]


def assert_a_path_of_neighbours(grid):
    ny, nx = grid
    order = hilbert_order(grid)
    assert sorted(order) == list(range(ny * nx)), grid  # every item once
    assert order[0] == 0, grid
    for a, b in zip(order, order[1:], strict=False):
        assert abs(a // nx - b // nx) + abs(a % nx - b % nx) == 1, (grid, a, b)  # a step to a grid neighbour


@pytest.mark.parametrize("grid", SHAPES, ids=str)
def test_the_curve_visits_every_item_once_each_a_grid_neighbour_of_the_one_before(grid):
    assert_a_path_of_neighbours(grid)


def test_every_grid_up_to_24_by_24_is_one_path_of_neighbours():
    """Every parity of sides: an odd major side with an even minor one is where a curve ending at the far corner of
    its major side would need a diagonal step — there the curve runs along the even side instead."""
    for ny in range(1, 25):
        for nx in range(1, 25):
            assert_a_path_of_neighbours((ny, nx))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 160), st.integers(1, 160))
def test_any_grid_is_one_path_of_neighbours(ny, nx):
    assert_a_path_of_neighbours((ny, nx))


@pytest.mark.parametrize(("grid", "sites"), [((7, 5), 4), ((64, 32), 132), ((33, 47), 132), ((1, 9), 20)])
def test_the_rule_deals_the_curve_round_robin(grid, sites):
    items = grid[0] * grid[1]
    parts = split_items(items, sites, "hilbert", grid)
    assert len(parts) == sites and sorted(i for p in parts for i in p) == list(range(items))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    order = hilbert_order(grid)
    assert all(p == order[s::sites] for s, p in enumerate(parts))


def test_a_rule_without_what_it_needs_or_no_rule_at_all_is_a_value_error():
    with pytest.raises(ValueError, match="needs the item grid of its 35 items and no band"):
        split_items(35, 4, "hilbert")
    with pytest.raises(ValueError, match="needs the item grid"):
        split_items(35, 4, "hilbert", (5, 8))
    with pytest.raises(ValueError, match="no band"):
        split_items(35, 4, "hilbert", (7, 5), 2)
    with pytest.raises(ValueError, match="'zigzag' is no placement rule"):
        split_items(35, 4, "zigzag", (7, 5))


def window_span(order, nx, n):
    """The most rows + columns of the grid that any n consecutive items of `order` touch (a sliding count)."""
    rows: dict[int, int] = {}
    cols: dict[int, int] = {}
    most = 0
    for t, i in enumerate(order):
        rows[i // nx] = rows.get(i // nx, 0) + 1
        cols[i % nx] = cols.get(i % nx, 0) + 1
        if t >= n:
            j = order[t - n]
            for count, key in ((rows, j // nx), (cols, j % nx)):
                count[key] -= 1
                if not count[key]:
                    del count[key]
        if t >= n - 1:
            most = max(most, len(rows) + len(cols))
    return most


@pytest.mark.parametrize("grid", [(64, 32), (33, 47), (32, 64), (45, 45)], ids=str)
def test_any_run_of_the_curve_is_a_compact_patch_for_every_length(grid):
    """Any n consecutive items of the curve touch at most 3 √n rows and columns of these grids, for each n tried;
    bands of 8 rows go past 4 √n for some n (a run across the seam of two bands, or one band's run grown wide). What
    these grids measure, not a bound proved here."""
    ny, nx = grid
    lengths = [n for n in (16, 64, 132, 256, 512, 1024) if n <= ny * nx]
    curve = max(window_span(hilbert_order(grid), nx, n) / math.sqrt(n) for n in lengths)
    bands = max(window_span(grouped_order(grid, 8), nx, n) / math.sqrt(n) for n in lengths)
    assert curve <= 3 < 4 < bands, (curve, bands)


def sm90a(n, precision="bf16"):
    return spatialc.build(spatialc.gemm(n, n, n, precision), "sm_90a")


def test_the_l2_working_set_of_a_wave_measured_for_the_gpu_checks_sizes():
    """The computed fact behind hilbert being no default. At 8192³ bf16 (128 × 256 items, a 64 × 32 grid, 132
    sites) a wave of grouped bands reads more strips than the L2 holds — the case Hilbert order was proposed for —
    yet a wave of the curve reads more still: its patches are as tall as wide, where the band's height is chosen
    for B strips twice A's. At 4096³ both fit."""
    big, small = sm90a(8192), sm90a(4096)
    for p in (big, small):
        sites = len(p.placement.items_of_site)
        assert p.placement.kind == "grouped" and p.placement.band == default_band(p.plan, sites) == 16
    sites = len(big.placement.items_of_site)
    grouped = wave_bytes(big.plan, big.precision, sites, "grouped", 16)
    curve = wave_bytes(big.plan, big.precision, sites, "hilbert")
    assert curve > grouped > L2_BYTES  # 83 MiB and 73 MiB a wave, against 50
    strip_a, strip_b = 128 * 8192 * 2, 256 * 8192 * 2  # the bytes a row and a column of items read
    strips = wave_strips(hilbert_order(big.plan.placed), big.plan.placed[1], sites)
    assert curve == sum(r * strip_a + c * strip_b for r, c in strips) / len(strips)
    assert wave_bytes(small.plan, small.precision, sites, "hilbert") > wave_bytes(
        small.plan, small.precision, sites, "grouped", 16
    )
    assert wave_bytes(small.plan, small.precision, sites, "hilbert") < L2_BYTES
    with pytest.raises(ValueError, match="takes a grid rule"):
        wave_bytes(big.plan, big.precision, sites, "contiguous")


def test_build_places_along_the_curve_only_when_asked_and_lower_launches_the_rule_again():
    gemm = spatialc.gemm(300, 200, 100, "int8")
    assert spatialc.build(gemm, "sm_90", sites=7).placement.kind == "grouped"  # the default, several waves: unchanged
    p = spatialc.build(gemm, "sm_90", placement="hilbert")
    assert p.verified and p.placement.kind == "hilbert" and p.placement.band == 0
    parts = [[int(i) for i in items] for _, items in p.placement.items_of_site]
    assert parts == split_items(p.plan.items, len(parts), "hilbert", p.plan.placed)
    art = spatialc.lower(p)
    launch = art.launch
    assert (launch.placement, launch.item_grid, launch.band, launch.work) == ("hilbert", p.plan.placed, 0, ())
    assert launch.per_sm > 0  # it follows the device
    for sms in (7, 132):
        grid, work = work_list(launch, sms)
        assert list(work) == work_table(split_items(launch.items, grid, "hilbert", launch.item_grid))
    # The same kernel text as the grouped placement's: only the work list differs (the GPU check compiles it once).
    assert art.kernel_cu == spatialc.lower(spatialc.build(gemm, "sm_90")).kernel_cu
    assert "spatialc_hilbert_work_list(" in art.program_cu
    assert "spatialc_hilbert" not in spatialc.lower(spatialc.build(gemm, "sm_90")).program_cu  # others unchanged
    several = spatialc.build(gemm, "sm_90", sites=7, placement="hilbert")  # the picture names the rule it follows
    assert "which of 7 sites computes each item (along a Hilbert curve)" in viz.placement_svg(several)


def test_a_program_with_no_matmul_takes_no_hilbert_placement():
    with pytest.raises(ProgramError, match="contiguous or round_robin, not 'hilbert'"):
        spatialc.build(spatialc.softmax(40, 40), "sm_90", placement="hilbert")


def test_a_saved_hilbert_program_loads_and_a_hostile_one_is_refused_in_words():
    p = spatialc.build(spatialc.gemm(100, 70, 50, "int8"), "sm_86", sites=5, placement="hilbert")
    again = spatialc.from_json(spatialc.to_json(p))
    assert again.verified and again.placement == p.placement
    assert spatialc.lower(again).launch.placement == "hilbert"
    doc = json.loads(spatialc.to_json(p))
    doc["program"]["placement"]["band"] = 3  # a band the curve would ignore at launch
    hostile = spatialc.from_json(json.dumps(doc))
    assert not hostile.verified  # its claim dropped: verify refuses it
    with pytest.raises(IllFormedError, match="a hilbert placement of band 3: the curve has no bands"):
        verify(hostile)
    # A list the rule does not give runs as listed: the launch keeps it, and never re-deals it by the rule.
    listed = [(s, items[::-1]) for s, items in p.placement.items_of_site]
    swapped = verify(p.evolve(placement=p.placement.__class__(tuple(listed), (), "hilbert", 0)))
    assert spatialc.lower(swapped).launch.placement == "listed"


def test_a_launch_description_whose_grid_is_not_its_items_is_refused_in_words():
    launch = {"kernel_name": "k", "grid": 4, "block": 128, "dyn_smem": 0, "items": 16, "placement": "hilbert"}
    with pytest.raises(LaunchError, match="work list cannot be made: a hilbert placement needs the item grid"):
        work_list({**launch, "item_grid": [3, 5], "per_sm": 1}, 7)


def test_the_cli_takes_placement_hilbert(capsys):
    status = main(["gemm", "70", "50", "90", "--target", "sm_86", "--sites", "4", "--placement", "hilbert"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "4 (hilbert)" in out and "interpreter vs numpy reference: OK, exact" in out


@needs_gxx
def test_the_printed_host_programs_copy_deals_the_same_work_list(tmp_path):
    """hilbert_host.cuh, which a host program inlines for the rule, gives ir/worklist.py's list for each grid."""
    root = resources.files("spatialc.lower.cuda.common")
    header = root.joinpath("host.cuh").read_text() + root.joinpath("hilbert_host.cuh").read_text()
    cases = [(g, s) for g in SHAPES for s in (1, 3, 132)]
    calls = "".join(f"print(spatialc_hilbert_work_list({g[0] * g[1]}, {s}, {g[0]}, {g[1]}));" for g, s in cases)
    src = tmp_path / "w.cpp"
    src.write_text(
        "#include <cstdio>\n#include <vector>\n"
        + header
        + '\nstatic void print(const std::vector<int>& w) { for (int x : w) printf("%d ", x); printf("\\n"); }\n'
        + f"int main() {{ {calls} return 0; }}\n"
    )
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "-o", str(tmp_path / "w"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "w")], capture_output=True, text=True, check=True).stdout.splitlines()
    for line, (g, s) in zip(out, cases, strict=True):
        assert [int(x) for x in line.split()] == work_table(split_items(g[0] * g[1], s, "hilbert", g)), (g, s)


@needs_gxx
@pytest.mark.emulation  # compiles with g++
def test_the_emulated_kernel_dealt_along_the_curve_is_exact_on_a_device_of_7_multiprocessors():
    p = spatialc.build(spatialc.gemm(384, 256, 32, "int8"), "sm_86", placement="hilbert")
    art = spatialc.lower(p)
    assert art.launch.sites(7) < art.launch.items  # sites with several items each, dealt along the curve
    rng = np.random.default_rng(7)
    a, b = rng.integers(-128, 128, (384, 32)), rng.integers(-128, 128, (32, 256))
    x = {"A": a.astype(np.int8), "B": b.astype(np.int8)}
    assert np.array_equal(spatialc.emulate(art, x, sms=7), spatialc.evaluate(p, x))

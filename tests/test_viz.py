"""viz: each picture is well-formed SVG that says what it shows — a title, a colour key, axes whose numbers match
the range drawn — and a deadlock's arrows are drawn apart and carry the page counts the error message gives."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import spatialc
from spatialc import viz
from spatialc.cli import main
from spatialc.errors import DeadlockError, VerifyDeadlockError
from spatialc.interp.trace import RingSample, RingTrace
from spatialc.ir.ids import BufferId, ItemId, Site
from spatialc.ir.nodes import Buffer, Engine, Fifo, Placement, SpatialProgram
from spatialc.ir.ops import Pop, Push, Reserve, Wait
from spatialc.passes.verify import verify

from .passes.test_verify import _a_twice, _handshake, small
from .rewrite import edit

NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything that is not well-formed XML
    assert root.tag == f"{NS}svg"
    return root


def texts(el: ET.Element) -> list[str]:
    """Every <text> under `el`, in document order."""
    return ["".join(t.itertext()) for t in el.iter(f"{NS}text")]


def with_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [el for el in root.iter() if el.get("class") == cls]


def title(root: ET.Element) -> str:
    (el,) = with_class(root, "title")
    assert root.findtext(f"{NS}title") == "".join(el.itertext())  # the same words for a viewer's tooltip
    return "".join(el.itertext())


def key(root: ET.Element) -> list[str]:
    """The colour key's labels."""
    return [" ".join(texts(e)) for e in with_class(root, "legend-entry")]


@pytest.fixture(scope="module")
def program() -> SpatialProgram:
    return spatialc.build(spatialc.gemm(100, 70, 50, "int8"), "sm_86", sites=5)


@pytest.fixture(scope="module")
def trace(program):
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, (100, 50)).astype(np.int8)
    b = rng.integers(-128, 128, (50, 70)).astype(np.int8)
    c, trace = spatialc.evaluate(program, {"A": a, "B": b}, trace=True)
    assert (c == a.astype(np.int64) @ b).all()
    return trace


def refused(p: SpatialProgram) -> VerifyDeadlockError:
    with pytest.raises(VerifyDeadlockError) as info:
        verify(p)
    return info.value


def token_cycle() -> SpatialProgram:
    """The reader waits for a token that compute sends only after its K loop, which needs the reader's loads."""
    p = small()
    token = BufferId(4)
    p = p.evolve(buffers=(*p.buffers, Buffer(token, "token", Fifo(1, 1))))
    p = edit(p, Engine.READER, lambda ops: (Wait(token), Pop(token), *ops))
    return edit(p, Engine.COMPUTE, lambda ops: (*ops, Reserve(token), Push(token)))


# ---- placement ---------------------------------------------------------------------------------------------------


def test_placement_names_each_item_s_site_and_keys_every_site(program):
    root = parse(viz.placement_svg(program))
    assert program.name in title(root) and "5 sites" in title(root)
    sites = program.placement.items_of_site
    assert key(root) == [f"site {s}: {len(items)} item{'s' * (len(items) != 1)}" for s, items in sites]
    ny, nx = program.plan.grid
    cells = with_class(root, "item")
    assert len(cells) == ny * nx
    owner = {int(i): int(s) for s, items in sites for i in items}
    assert [int(t) for t in texts(root) if t.isdigit()][-ny * nx :] == [owner[i] for i in range(ny * nx)]
    axis = [t for el in with_class(root, "axis") for t in texts(el)]
    assert axis == [*map(str, range(nx)), *map(str, range(ny))]  # item x above the grid, item y beside it
    # A cell's colour is its site's colour in the key.
    swatch = {
        " ".join(texts(e)).split(":")[0]: e.find(f"{NS}rect").get("fill") for e in with_class(root, "legend-entry")
    }
    assert all(cells[i].get("fill") == swatch[f"site {owner[i]}"] for i in range(ny * nx))
    subtitle = "".join(with_class(root, "subtitle")[0].itertext())
    assert "C (100x70)" in subtitle and f"{ny}x{nx} items of 32x32 outputs" in subtitle


def test_placement_key_stays_short_with_many_sites():
    p = small()  # 35 sites, one item each
    keyed = key(parse(viz.placement_svg(p)))
    assert keyed[0] == "site 0: 1 item" and len(keyed) == 13
    assert keyed[-1].startswith("... and 23 more sites")


def listed(p: SpatialProgram, parts: list[list[int]], kind: str = "contiguous") -> SpatialProgram:
    """`p` with a hand-written placement: site s runs parts[s], its kind left at the builder's default."""
    items = tuple((Site(s), tuple(ItemId(i) for i in part)) for s, part in enumerate(parts))
    return p.evolve(placement=Placement(items, (), kind))


@pytest.mark.parametrize(
    ("parts", "rule"),
    [
        ([[0, 1, 2, 3], [4, 5, 6, 7]], "contiguous"),
        ([[0, 2, 4, 6], [1, 3, 5, 7]], "round-robin"),
        ([[0, 1, 2], [3, 4, 5, 6, 7]], "as listed, each site's items one run"),
        ([[0, 3, 6], [1, 2, 4, 5, 7]], "as listed"),
    ],
)
def test_the_placement_title_says_the_rule_the_list_follows_not_the_kind_it_claims(parts, rule):
    p = spatialc.build(spatialc.gemm(64, 128, 32, "int8"), "sm_86", sites=2)  # 2x4 items of 32x32
    assert p.plan.grid == (2, 4)
    root = parse(viz.placement_svg(listed(p, parts)))
    assert title(root) == f"Placement of {p.name}: which of 2 sites computes each item ({rule})"


def test_the_placement_title_of_the_built_rules(program):
    assert title(parse(viz.placement_svg(program))).endswith("(grouped, bands of 2 rows)")
    for rule, said in (("contiguous", "contiguous"), ("round_robin", "round-robin")):
        p = spatialc.build(spatialc.gemm(100, 70, 50, "int8"), "sm_86", sites=5, placement=rule)
        assert title(parse(viz.placement_svg(p))).endswith(f"({said})")


def test_three_digit_site_numbers_fit_their_cells():
    p = spatialc.build(spatialc.gemm(2048, 1024, 32, "int8"), "sm_86", sites=132, block=(2, 2, 1))
    root = parse(viz.placement_svg(p))
    cells = with_class(root, "item")
    numbers = with_class(root, "site")
    assert len(numbers) == len(cells) and max(int(t) for t in texts(root) if t.isdigit()) == 131
    size = float(cells[0].get("width"))
    font = float(numbers[0].get("font-size"))
    assert 3 * 0.62 * font <= size - 4 and font >= 7  # a monospace digit is about 0.6 of the font size wide


# ---- timeline ----------------------------------------------------------------------------------------------------


def axis_ticks(root: ET.Element) -> list[int]:
    (axis,) = with_class(root, "axis")
    return [int(t) for t in texts(axis)]


def axis_end_x(root: ET.Element) -> float:
    """Where the axis's last number, the last tick drawn, sits."""
    (axis,) = with_class(root, "axis")
    return float(list(axis.iter(f"{NS}text"))[-1].get("x"))


def right_edge(els: list[ET.Element]) -> float:
    return max(float(r.get("x")) + float(r.get("width")) for el in els for r in el.iter(f"{NS}rect"))


@pytest.mark.parametrize("window", [None, (0, 40), (30, 90), (7, 8)])
def test_timeline_title_and_axis_state_the_ticks_drawn(trace, window):
    total = trace.ticks
    start, end = window or (0, total)
    root = parse(viz.timeline_svg(trace, 0, window, name="gemm_100x70x50_int8"))
    whole = " (the whole run)" if window is None else f" of the run's 0..{total}"
    assert title(root) == f"Timeline of site 0 of gemm_100x70x50_int8: ticks {start}..{end}{whole}"
    ticks = axis_ticks(root)
    assert ticks[0] == start and ticks[-1] == end and ticks == sorted(set(ticks)) and len(ticks) >= 2
    # Where every tick has room, each op is a box of its own; none runs past the axis's last tick.
    spans = with_class(root, "span")
    assert spans and not with_class(root, "column")
    assert right_edge(spans) <= axis_end_x(root) + 0.6


def test_timeline_has_a_key_lanes_and_ring_axes(trace):
    root = parse(viz.timeline_svg(trace, 0))
    keyed = " | ".join(key(root))
    for word in ("ReadTiles", "Compute", "WriteTiles", "PackAcc", "Wait:", "Reserve:", "Push", "Pop",
                 "ring pages published", "ring pages reserved", "ring depth"):  # fmt: skip
        assert word in keyed, (word, keyed)
    assert {"reader", "compute", "writer"} <= set(texts(root))
    rings = {r.ring: (r.depth, r.layout) for r in trace.rings if r.site == 0}
    drawn = {el.get("data-ring"): el for el in with_class(root, "ring")}
    assert drawn.keys() == rings.keys()
    for name, (depth, layout) in rings.items():
        (levels,) = with_class(drawn[name], "ring-axis")
        assert [int(t) for t in texts(levels)] == list(range(depth + 1))  # 0..depth, each page level
        shown = {"row": "", "col": ", K-major", "swizzled": ", swizzled"}[layout]
        assert f"depth {depth}{shown}" in texts(drawn[name])
    # Every op kind drawn has its colour in the key.
    fills = {r.get("fill") for e in with_class(root, "legend-entry") for r in e.iter(f"{NS}rect")}
    assert {r.get("fill") for r in with_class(root, "span")} <= fills


def test_timeline_of_another_site(trace):
    root = parse(viz.timeline_svg(trace, 4, (0, 50)))
    assert title(root).startswith("Timeline of site 4: ticks 0..50 of")


@pytest.fixture(scope="module")
def long_run():
    """A run of thousands of ticks: 5207 on site 1, far more than a picture has pixels."""
    p = spatialc.build(spatialc.gemm(128, 128, 2048, "int8"), "sm_86", sites=2)
    x = {"A": np.ones((128, 2048), np.int8), "B": np.ones((2048, 128), np.int8)}
    return p, spatialc.evaluate(p, x, trace=True)[1]


def lanes(root: ET.Element) -> dict[str, ET.Element]:
    return {el.get("data-engine"): el for el in with_class(root, "engine-lane")}


def test_a_long_run_is_drawn_whole_in_columns_of_a_round_number_of_ticks(long_run):
    p, trace = long_run
    total = trace.ticks
    assert total > 4000
    root = parse(viz.timeline_svg(trace, 1, name=p.name))
    m = re.fullmatch(rf"Timeline of site 1 of {p.name}: ticks 0\.\.{total} \(the whole run, 1 column = (\d+) ticks\)",
                     title(root))  # fmt: skip
    assert m, title(root)
    c = int(m[1])
    assert c in (10, 20, 50) and axis_ticks(root)[:: len(axis_ticks(root)) - 1] == [0, total]
    drawn = lanes(root)
    assert list(drawn) == ["reader", "compute", "writer"]
    for eng, lane in drawn.items():
        columns = with_class(lane, "column")
        spans = trace.engine(1, eng)
        # The engine's columns run from its first op's column to its last op's, the last one at the run's end
        # for the writer, whose last op ends the run.
        ticks = [tuple(map(int, col.get("data-ticks").split())) for col in columns]
        assert ticks[0][0] == spans[0].start // c * c and ticks[-1][1] == min(total, -(-spans[-1].end // c) * c)
        assert all(b - a == c for a, b in ticks[:-1])
    writer = with_class(drawn["writer"], "column")
    assert writer[-1].get("data-ticks") == f"{total // c * c} {total}"
    assert abs(right_edge(writer[-1:]) - axis_end_x(root)) < 0.1  # drawn up to the axis's end, no further
    # The writer's last WriteTiles shows in its column (at least a sliver), in its colour, and the tooltip says so.
    last_write = next(s for s in reversed(trace.engine(1, "writer")) if s.op.startswith("WriteTiles"))
    col = next(el for el, (a, b) in zip(writer, ticks_of(writer), strict=True) if a <= last_write.start < b)
    assert viz.timeline._OP_FILL["WriteTiles"][0] in {r.get("fill") for r in col.iter(f"{NS}rect")}
    assert "WriteTiles" in col.findtext(f"{NS}title")


def ticks_of(columns: list[ET.Element]) -> list[tuple[int, int]]:
    return [tuple(map(int, col.get("data-ticks").split())) for col in columns]


def test_a_column_is_split_by_the_share_of_its_ticks_each_op_took(long_run):
    _, trace = long_run
    root = parse(viz.timeline_svg(trace, 1))
    compute = with_class(lanes(root)["compute"], "column")
    (a, b), col = ticks_of(compute)[100], compute[100]
    took: dict[str, int] = {}
    for s in trace.engine(1, "compute"):
        took[viz.timeline._kind(s.op)] = took.get(viz.timeline._kind(s.op), 0) + max(0, min(s.end, b) - max(s.start, a))
    took = {k: n for k, n in took.items() if n}
    heights = {r.get("fill"): float(r.get("height")) for r in col.iter(f"{NS}rect")}
    assert len(heights) == len(took)
    assert sum(heights.values()) == pytest.approx(viz.timeline._LANE - 6, abs=0.05)  # busy all through: the whole lane
    busiest = max(took, key=took.__getitem__)
    assert heights[viz.timeline._fill(busiest)] == pytest.approx(
        (viz.timeline._LANE - 6) * took[busiest] / (b - a), abs=2 * 2.0
    )
    assert all(h >= viz.timeline._SLIVER - 1e-9 for h in heights.values())


def test_ring_means_per_column():
    samples = (RingSample(0, 1, 0), RingSample(10, 0, 1), RingSample(15, 0, 2), RingSample(20, 0, 0))
    ring = RingTrace(0, "R", 2, samples)
    assert viz.timeline._ring_means(ring, (0, 40), 10) == [(1.0, 0.0, 1), (0.0, 1.5, 2), (0.0, 0.0, 0), (0.0, 0.0, 0)]
    assert viz.timeline._ring_means(ring, (12, 22), 5) == [(0.0, 1.0 * 3 / 5 + 2 * 2 / 5, 2), (0.0, 2 * 3 / 5 + 0, 2)]


def test_a_window_of_a_long_run_draws_its_ops(long_run):
    p, trace = long_run
    root = parse(viz.timeline_svg(trace, 1, (1000, 1200), name=p.name))
    assert title(root) == f"Timeline of site 1 of {p.name}: ticks 1000..1200 of the run's 0..{trace.ticks}"
    assert axis_ticks(root)[0] == 1000 and axis_ticks(root)[-1] == 1200
    spans = with_class(root, "span")
    assert len(spans) == sum(1 for s in trace.spans if s.site == 1 and s.start < 1200 and s.end > 1000)
    root = parse(viz.timeline_svg(trace, 1, (1000, 3000)))
    assert title(root).endswith(f"of the run's 0..{trace.ticks} (1 column = 10 ticks)")


@pytest.mark.parametrize(
    ("site", "window", "says"),
    [
        (5, None, "the timeline's site is one of the run's sites 0..4, not 5"),
        (-1, None, "not -1"),
        (0, (0, 108), "the timeline's window 0:108 is not within the run's 107 ticks"),
        (0, (10, 10), "window 10:10"),
        (0, (-1, 5), "window -1:5"),
    ],
)
def test_a_site_or_window_outside_the_run_is_refused(trace, site, window, says):
    with pytest.raises(viz.PictureError, match=re.escape(says)):
        viz.timeline_svg(trace, site, window)


# ---- the command line's pictures ---------------------------------------------------------------------------------

GEMM = ["gemm", "100", "70", "50", "--target", "sm_86", "--sites", "5"]


def test_the_command_line_draws_the_site_and_window_asked(capsys, tmp_path):
    status = main([*GEMM, "--pictures", str(tmp_path), "--pictures-site", "3", "--pictures-window", "10:60"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert f"picture   {tmp_path / 'timeline.svg'}" in out
    root = parse((tmp_path / "timeline.svg").read_text())
    assert re.fullmatch(r"Timeline of site 3 of gemm_100x70x50_int8: ticks 10\.\.60 of the run's 0\.\.\d+", title(root))
    status = main([*GEMM, "--pictures", str(tmp_path)])
    assert status == 0 and "(the whole run)" in title(parse((tmp_path / "timeline.svg").read_text()))


def test_the_command_line_with_no_check_draws_the_placement_and_says_why_no_timeline(capsys, tmp_path):
    status = main([*GEMM, "--check", "none", "--pictures", str(tmp_path)])
    out, _ = capsys.readouterr()
    assert status == 0 and sorted(f.name for f in tmp_path.iterdir()) == ["placement.svg"]
    assert "no timeline.svg: it draws the interpreter's run, and --check none runs none" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--pictures-site", "5"], "the timeline's site is one of the program's sites 0..4, not 5"),
        (["--pictures-site", "-1"], "argument --pictures-site: expected a whole number ≥ 0, not '-1'"),
        (["--pictures-window", "5:5"], "argument --pictures-window: expected START:END, whole numbers, START < END"),
        (["--pictures-window", "400"], "argument --pictures-window: expected START:END"),
        (["--pictures-window", "a:b"], "argument --pictures-window: expected START:END"),
        (["--pictures-window", "0:99999"], "the timeline's window 0:99999 is not within the run's 107 ticks"),
    ],
)
def test_the_command_line_refuses_a_bad_site_or_window_in_one_line(capsys, tmp_path, argv, says):
    status = main([*GEMM, "--pictures", str(tmp_path / "pics"), *argv])
    _, err = capsys.readouterr()
    assert status == 2 and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "pics").exists()  # refused before anything is written


def test_the_timeline_options_go_with_pictures(capsys):
    assert main([*GEMM, "--pictures-window", "0:10"]) == 2
    assert "--pictures-window says what timeline.svg draws; it goes with --pictures DIR" in capsys.readouterr().err


# ---- deadlock ----------------------------------------------------------------------------------------------------


def edges(root: ET.Element) -> dict[tuple[str, str], ET.Element]:
    return {(e.get("data-from"), e.get("data-to")): e for e in with_class(root, "edge")}


def edge_labels(root: ET.Element) -> dict[tuple[str, str], str]:
    return {(e.get("data-from"), e.get("data-to")): " ".join(texts(e)) for e in with_class(root, "edge-label")}


def numbers(d: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", d)]


def label_boxes(root: ET.Element) -> list[tuple[float, float, float, float]]:
    boxes = []
    for group in [*with_class(root, "edge-label"), *with_class(root, "node")]:
        r = group.find(f"{NS}rect")
        x, y, w, h = (float(r.get(k)) for k in ("x", "y", "width", "height"))
        boxes.append((x, y, x + w, y + h))
    return boxes


def overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_reasons_are_read_from_verify_s_message():
    e = refused(_a_twice(small(block=(1, 1, 1), sub_blocks=(1, 1), depth=1)))
    assert viz.reasons_of(e) == [
        "needs 1 free page(s), but 1 of 1 are held",
        "0 of 1 page(s) published",
        "0 of 1 page(s) published",
    ]


def test_a_two_way_wait_is_two_arrows_apart_each_with_its_page_counts(tmp_path):
    p = _a_twice(small(block=(1, 1, 1), sub_blocks=(1, 1), depth=1))
    e = refused(p)
    path = viz.write_deadlock(tmp_path / "pics", p, e)
    assert path == tmp_path / "pics" / "deadlock.svg"
    root = parse(path.read_text())
    assert title(root).startswith(f"Deadlock in {p.name}: 3 engines can never go on")
    assert "on 34 other site(s)" in " ".join(texts(root))
    arrows, labels = edges(root), edge_labels(root)
    there, back = ("0 reader", "0 compute"), ("0 compute", "0 reader")
    assert set(arrows) == {there, back, ("0 writer", "0 compute")}
    d1, d2 = (arrows[k].find(f"{NS}path").get("d") for k in (there, back))
    # Not one line drawn twice: the two curves bend to opposite sides (their control points far apart).
    assert d1 != d2 and abs(numbers(d1)[3] - numbers(d2)[3]) > 50
    assert all(a.find(f"{NS}path").get("marker-end", "").startswith("url(#arrow") for a in arrows.values())
    assert "room in A_ring" in labels[there] and "needs 1 free page(s), but 1 of 1 are held" in labels[there]
    assert "data in B_ring" in labels[back] and "0 of 1 page(s) published" in labels[back]
    assert "data in C_ring" in labels[("0 writer", "0 compute")]
    boxes = label_boxes(root)
    assert not any(overlap(a, b) for a, b in itertools.combinations(boxes, 2))
    keyed = " | ".join(key(root))
    assert "Wait: for pages" in keyed and "Reserve: for room" in keyed and "on the cycle" in keyed
    nodes = {" ".join(texts(n)) for n in with_class(root, "node")}
    assert nodes == {
        "site 0 reader at: Reserve A_ring",
        "site 0 compute at: Wait B_ring",
        "site 0 writer at: Wait C_ring",
    }
    assert "site 0" in texts(root)


def test_deadlock_from_the_interpreter_draws_a_few_sites():
    p = token_cycle()
    with pytest.raises(DeadlockError) as info:
        spatialc.evaluate(p, {"A": np.zeros((100, 50), np.int8), "B": np.zeros((50, 70), np.int8)})
    e = info.value
    reasons = viz.reasons_of(e)
    assert len(reasons) == len(e.blocked) == 105
    assert reasons[0] == "token: 0 of 1 pages published" and reasons[-1] == ""  # the message lists only 12
    root = parse(viz.deadlock_svg(p, e.blocked, reasons=reasons, max_sites=2))
    assert [t for t in texts(root) if t.startswith("site ") and len(t.split()) == 2] == ["site 0", "site 1"]
    assert "drawn: site(s) 0, 1 (99 more blocked engines on other sites are not)" in " ".join(texts(root))
    labels = edge_labels(root)
    assert labels[("1 reader", "1 compute")] == "waits for data in token 0 of 1 pages published"
    assert labels[("1 compute", "1 reader")] == "waits for data in A_ring 0 of 1 pages published"


def test_arrows_between_sites_keep_their_labels_clear():
    p = _handshake(True)  # each site's reader waits for the other site's compute to raise a semaphore
    e = refused(p)
    root = parse(viz.deadlock_svg(p, e.blocked, reasons=viz.reasons_of(e)))
    labels = edge_labels(root)
    assert (
        labels[("0 reader", "1 compute")] == "waits for sem0 the count is 0, it needs 1; raised only by site 1 compute"
    )
    assert (
        labels[("1 reader", "0 compute")] == "waits for sem0 the count is 0, it needs 1; raised only by site 0 compute"
    )
    assert "SemWait: for a semaphore" in " ".join(key(root))
    boxes = label_boxes(root)
    assert not any(overlap(a, b) for a, b in itertools.combinations(boxes, 2))


def test_deadlock_svg_keeps_its_old_call():
    e = refused(token_cycle())
    root = parse(viz.deadlock_svg(token_cycle(), e.blocked))
    labels = edge_labels(root)
    assert labels[("0 reader", "0 compute")] == "waits for data in token"


def shallow_ring_deadlock():
    """examples/shallow_ring.py with A's ring a page too shallow: a program written with spatialc.lang, whose
    deadlock names the user's lines."""
    from .lang.test_lang import example

    traced = example("shallow_ring").pipeline.trace(a_depth=3)
    with pytest.raises(DeadlockError) as caught:
        traced.verify()
    return traced.program, caught.value


def node_boxes(root: ET.Element) -> dict[str, tuple[ET.Element, list[str]]]:
    """Each box of the wait-for graph: its rect and the lines written in it (not the reason under it)."""
    out = {}
    for node in with_class(root, "node"):
        lines = [t for el in node.iter(f"{NS}text") if el.get("class") != "node-reason" for t in texts(el)]
        out[node.get("data-node")] = (node.find(f"{NS}rect"), lines)
    return out


def test_boxes_that_name_the_user_s_lines_are_wide_enough_for_them(tmp_path):
    p, e = shallow_ring_deadlock()
    root = parse(viz.write_deadlock(tmp_path, p, e).read_text())
    boxes = node_boxes(root)
    assert boxes["0 reader"][1] == ["site 0 reader", "at: Reserve A_ring (shallow_ring.py:40)"]
    width = float(root.get("width"))
    for rect, lines in boxes.values():
        x, w = float(rect.get("x")), float(rect.get("width"))
        assert w >= max(len(line) for line in lines) * viz.CHAR_W + 8  # 11px monospace: about 6.6px a character
        assert x >= 0 and x + w <= width
    assert not any(overlap(a, b) for a, b in itertools.combinations(label_boxes(root), 2))
    height = float(root.get("height"))
    assert all(b[3] <= height for b in label_boxes(root))
    # verify's remedy is the picture's note, not a part of the writer's reason.
    subtitles = " ".join("".join(el.itertext()) for el in with_class(root, "subtitle"))
    assert "A_ring needs 4 pages for this order of ops (it has 3): give it 4" in subtitles
    assert viz.reasons_of(e)[-1] == "0 of 1 page(s) published"
    assert edge_labels(root)[("0 writer", "0 compute")] == "waits for data in C_ring 0 of 1 page(s) published"


def test_a_box_cuts_a_long_op_with_an_ellipsis_and_keeps_the_user_s_line(tmp_path):
    p, e = shallow_ring_deadlock()
    where = {(0, "reader"): ("/src/pipeline_module.py", 40)}
    root = parse(viz.deadlock_svg(p, e.blocked, reasons=viz.reasons_of(e), where=where))
    rect, (_, op) = node_boxes(root)["0 reader"]
    assert op == "at: Reserve A_ri… (pipeline_module.py:40)"
    assert float(rect.get("width")) <= viz.deadlock._COL_W - 20  # clear of the next column's box
    assert float(rect.get("width")) >= len(op) * viz.CHAR_W


# ---- files -------------------------------------------------------------------------------------------------------


def test_write_pictures(tmp_path, program, trace):
    folder = tmp_path / "a" / "b"
    assert viz.write_pictures(folder, program) == [folder / "placement.svg"]
    paths = viz.write_pictures(folder, program, trace, site=1, window=(0, 30))
    assert paths == [folder / "placement.svg", folder / "timeline.svg"]
    root = parse(paths[1].read_text())
    assert title(root).startswith(f"Timeline of site 1 of {program.name}: ticks 0..30 of ")
    assert axis_ticks(root)[-1] == 30
    with pytest.raises(viz.PictureError, match="sites 0..4, not 5"):
        viz.write_pictures(tmp_path / "c", program, trace, site=5)
    assert not (tmp_path / "c").exists()

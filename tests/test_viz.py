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
from spatialc.errors import DeadlockError, VerifyDeadlockError
from spatialc.ir.ids import BufferId
from spatialc.ir.nodes import Buffer, Engine, Fifo, SpatialProgram
from spatialc.ir.ops import Pop, Push, Reserve, Wait
from spatialc.passes.verify import verify

from .rewrite import edit
from .test_verify import _a_twice, _handshake, small

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


# ---- timeline ----------------------------------------------------------------------------------------------------


def axis_ticks(root: ET.Element) -> list[int]:
    (axis,) = with_class(root, "axis")
    return [int(t) for t in texts(axis)]


@pytest.mark.parametrize("max_ticks", [None, 400, 40, 7])
def test_timeline_title_and_axis_state_the_ticks_drawn(trace, max_ticks):
    total = trace.ticks
    end = min(total, max_ticks or total)
    root = parse(viz.timeline_svg(trace, 0, max_ticks=max_ticks, name="gemm_100x70x50_int8"))
    whole = "the whole run" if end == total else f"only the first {end} drawn"
    assert title(root) == f"Timeline of site 0 of gemm_100x70x50_int8: ticks 0..{end} of {total} ({whole})"
    ticks = axis_ticks(root)
    assert ticks[0] == 0 and ticks[-1] == end and ticks == sorted(set(ticks)) and len(ticks) >= 3
    # The axis's last label sits where the last tick is drawn, and no span runs past it.
    (axis,) = with_class(root, "axis")
    right = float([t for t in axis.iter(f"{NS}text")][-1].get("x"))
    spans = with_class(root, "span")
    assert spans and max(float(r.get("x")) + float(r.get("width")) for r in spans) <= right + 0.6


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
    root = parse(viz.timeline_svg(trace, 4, max_ticks=50))
    assert title(root).startswith("Timeline of site 4: ticks 0..50 of")


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


# ---- files -------------------------------------------------------------------------------------------------------


def test_write_pictures(tmp_path, program, trace):
    folder = tmp_path / "a" / "b"
    assert viz.write_pictures(folder, program) == [folder / "placement.svg"]
    paths = viz.write_pictures(folder, program, trace, site=1, max_ticks=30)
    assert paths == [folder / "placement.svg", folder / "timeline.svg"]
    root = parse(paths[1].read_text())
    assert title(root).startswith(f"Timeline of site 1 of {program.name}: ticks 0..30 of ")
    assert axis_ticks(root)[-1] == 30

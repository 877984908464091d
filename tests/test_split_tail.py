"""A split tail (`placement="split_tail"`, passes/split.py): the items of the whole waves run unsplit, each item of
the last wave split over the sites that wave leaves idle — each site's ITEM loop over its whole items, then an ITEM
loop of one item (`Loop.first`) for its split of a tail item. Through the layers: placement and the rules that prove
it (coverage with ITEM loops from a later item, bounds and rule 8 per loop), the interpreter, the general form
under emulation, the planted faults each must catch, the refusals, the CLI. (The sm_90a form's: tests/lower/
test_sm90a_split.py.)"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.errors import ProgramError, SpatialError, VerifyError
from spatialc.ir.ids import ItemId, Site
from spatialc.ir.nodes import Engine, Placement, TensorRole
from spatialc.ir.ops import Const, Loop, SemInc, SemWait
from spatialc.passes.split import tail_split
from spatialc.passes.verify import verify

from .rewrite import edit
from .test_split_k import operands, reference

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def tailed(m, n, k, prec="int8", sites=5, block=(2, 2, 2), **kw):
    return spatialc.build(
        spatialc.gemm(m, n, k, prec), "sm_90", placement="split_tail", sites=sites, block=block, sub_blocks=(1, 1), **kw
    )


# 12 items of 32 × 32 on 5 sites: two whole waves (10 items, 2 a site), the last 2 items split 2 ways over sites
# 0–3; site 4 holds whole items only.
BASE = tailed(96, 128, 512)


def test_whole_waves_run_unsplit_and_the_last_waves_items_split_over_the_idle_sites():
    pl = BASE.placement
    assert pl.kind == "split_tail" and (pl.tail, pl.splits) == (2, 2)
    held = dict(pl.items_of_site)
    assert [held[Site(s)][-1] for s in range(4)] == [ItemId(10), ItemId(10), ItemId(11), ItemId(11)]
    assert all(int(i) < 10 for s in range(5) for i in held[Site(s)][: 2 if s < 4 else 3])
    assert sorted(int(i) for items in held.values() for i in items) == [*range(10), 10, 10, 11, 11]
    # the workspace holds S − 1 item blocks for each tail item, not S − 1 copies of the output
    work = next(t for t in BASE.tensors if t.role == TensorRole.WORKSPACE)
    assert work.tiles == (1 * 2 * 2, 2)
    reader = BASE.schedule.programs_of(Site(0))[0].ops
    assert [(op.count, op.first) for op in reader] == [(Const(2), 0), (Const(1), 2)]
    assert [op.count for op in BASE.schedule.programs_of(Site(4))[0].ops] == [Const(2)]


def test_the_tail_is_split_only_where_a_wave_is_left_short():
    assert tail_split(24, 12, 8) == "its 24 items fill 2 whole wave(s) of 12 sites: there is no tail to split"
    assert tail_split(20, 12, 8).startswith("its last wave has 8 items on 12 sites")  # 1 site each
    assert tail_split(14, 12, 8) == (2, 6) and tail_split(14, 12, 4) == (2, 4)  # at most the K steps
    assert tail_split(13, 132, 64) == (13, 10) and tail_split(1, 132, 64) == (1, 32)  # at most MAX_SPLITS


@pytest.mark.parametrize(
    ("prec", "shape", "sites", "block"),
    [
        ("int8", (96, 128, 512), 5, (2, 2, 2)),
        ("bf16", (96, 96, 1000), 4, (2, 2, 1)),  # 9 items: 2 whole on each site, 1 split 4 ways; odd K
        ("int8", (64, 192, 256), 5, (2, 2, 2)),  # 12 items: 2 whole a site, 2 split 2 ways (site 4 none)
    ],
)
def test_a_split_tail_verifies_and_evaluates_exactly(prec, shape, sites, block):
    p = tailed(*shape, prec, sites=sites, block=block)
    ins = operands(prec, *shape, seed=2)
    assert np.array_equal(spatialc.evaluate(p, ins), reference(ins))


def test_a_saved_split_tail_loads_verified_and_other_programs_save_as_before():
    text = spatialc.to_json(BASE)
    again = spatialc.from_json(text)
    assert again == BASE and again.verified
    plain = spatialc.to_json(spatialc.build(spatialc.gemm(64, 64, 256, "int8"), "sm_90"))
    assert '"first"' not in plain and '"tail"' not in plain  # written only where a split tail uses them
    doc = json.loads(text)
    doc["program"]["placement"]["tail"] = 1  # item 10 is on two sites, and the placement says it is whole
    with pytest.raises(VerifyError, match="item 10"):
        verify(spatialc.from_json(json.dumps(doc)))


# ---- what verify must refuse ----------------------------------------------------------------------------------------


def placed(p, f):
    """`p` with its placement's items rewritten by f(site, items)."""
    pl = p.placement
    items = tuple((s, tuple(f(int(s), items))) for s, items in pl.items_of_site)
    return p.evolve(placement=dataclasses.replace(pl, items_of_site=items), verified=False)


def tail_body(p, site, engine, f):
    """`p` with the body of site `site`'s `engine`'s tail loop (its last op) rewritten by f."""

    def g(ops):
        *rest, last = ops
        assert isinstance(last, Loop) and last.first
        return (*rest, dataclasses.replace(last, body=f(last.body)))

    return edit(p.evolve(verified=False), engine, g, (Site(site),))


def refused(p, *words, error=VerifyError):
    with pytest.raises(error) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"


def test_a_placement_that_misplaces_the_tail_is_refused():
    # the tail item before a whole one: the site's loops would run the split on a whole item's coordinates
    refused(placed(BASE, lambda s, items: (items[-1], *items[:-1]) if s == 0 else items), "before its last item")
    # a tail item on one site too few, or a whole item on two sites
    refused(placed(BASE, lambda s, items: items[:-1] if s == 1 else items), "item 10", "on exactly 2 sites")
    refused(placed(BASE, lambda s, items: (*items, ItemId(0)) if s == 4 else items), "item 0", "exactly once")
    # a tail of a plain placement, or of one site a split
    bad = dataclasses.replace(BASE.placement, kind="grouped")
    refused(BASE.evolve(placement=bad, verified=False), "split tail")
    bad = dataclasses.replace(BASE.placement, splits=1)
    refused(BASE.evolve(placement=bad, verified=False), "split tail")


def test_item_loops_that_skip_or_repeat_an_item_are_refused():
    def loops(f):
        return edit(BASE.evolve(verified=False), Engine.COMPUTE, lambda ops: f(ops), (Site(0),))

    ops = BASE.schedule.programs_of(Site(0))[1].ops

    # the tail loop starting at the whole loop's first item: it would run item 0's coordinates twice
    refused(loops(lambda ops: (ops[0], dataclasses.replace(ops[1], first=1))), "starts at item 1")
    # the whole loop running every item: the tail item twice
    refused(loops(lambda ops: (dataclasses.replace(ops[0], count=Const(3)), ops[1])), "starts at item 2")
    # the whole loop one item short, the tail loop after it: item 1 never run
    short = (dataclasses.replace(ops[0], count=Const(1)), dataclasses.replace(ops[1], first=1))
    refused(loops(lambda ops: short), "holds 3 item(s) but its ITEM loops run 2")
    # a loop other than ITEM's starting past 0
    refused(
        tail_body(BASE, 0, Engine.COMPUTE, lambda body: tuple(
            dataclasses.replace(op, first=1) if isinstance(op, Loop) else op for op in body
        )),
        "only an ITEM loop",
    )  # fmt: skip


def test_the_planted_handshake_faults_are_refused_by_name():
    def waits(v):
        return lambda body: tuple(SemWait(o.sem, v) if isinstance(o, SemWait) else o for o in body)

    refused(tail_body(BASE, 0, Engine.READER, waits(0)), "at a count of only 0")
    refused(
        tail_body(BASE, 0, Engine.READER, lambda body: tuple(o for o in body if not isinstance(o, SemWait))),
        "without first waiting",
    )
    refused(tail_body(BASE, 0, Engine.READER, waits(2)), "deadlock")
    refused(
        tail_body(BASE, 1, Engine.WRITER, lambda body: (body[-1], *body[:-1])),
        "nothing after the write raises",
    )

    def raise_site_0(body):
        return tuple(SemInc(o.sem, Site(0), 1) if isinstance(o, SemInc) else o for o in body)

    refused(tail_body(BASE, 3, Engine.WRITER, raise_site_0), "deadlock")  # item 11's contributor raises item 10's


def tail_ops(p):
    """(site, engine, index) of every op of every tail loop's body."""
    out = []
    for q in p.schedule.programs:
        if q.ops and isinstance(q.ops[-1], Loop) and q.ops[-1].first:
            out += [(q.site, q.engine, i) for i in range(len(q.ops[-1].body))]
    return out


def test_every_tail_op_deleted_or_changed_is_refused_or_still_right():
    """The mutation suite of the tail: each op of a tail loop deleted, each semaphore op's value or site changed.
    verify must refuse the result, or the result must still compute A @ B (checked by the interpreter)."""
    p = BASE
    ins = operands("int8", 96, 128, 512, 1)
    want = reference(ins)
    mutants = []
    for site, engine, i in tail_ops(p):
        mutants.append(("delete", site, engine, lambda b, i=i: b[:i] + b[i + 1 :]))
        op = [q for q in p.schedule.programs_of(site) if q.engine == engine][0].ops[-1].body[i]
        if isinstance(op, SemWait):
            for v in (op.value - 1, op.value + 1):
                mutants.append(
                    (f"wait {v}", site, engine, lambda b, i=i, v=v: (*b[:i], SemWait(b[i].sem, v), *b[i + 1 :]))
                )
        if isinstance(op, SemInc):
            for at in ((int(op.at) + 2) % 5, int(site)):
                mutants.append(
                    (
                        f"inc at {at}",
                        site,
                        engine,
                        lambda b, i=i, at=at: (*b[:i], SemInc(b[i].sem, Site(at), 1), *b[i + 1 :]),
                    )
                )
    assert len(mutants) >= 60
    accepted = []
    for name, site, engine, f in mutants:
        try:
            v = verify(tail_body(p, int(site), engine, f))
        except SpatialError:
            continue
        accepted.append((name, int(site), engine.value))
        assert np.array_equal(spatialc.evaluate(v, ins), want), (name, site, engine)
    assert len(accepted) < len(mutants) // 4, accepted


# ---- the refusals of the request --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"form": "persistent"}, "the persistent kernel cannot print"),
        ({"form": "sm90a"}, "use target sm_90a"),
        ({"split_k": 2}, "takes no split_k"),
        ({"sites": 4, "block": (2, 2, 2)}, "fill 3 whole wave(s) of 4 sites"),  # 12 items on 4 sites
        ({"sites": 0}, "sites must be a whole number"),
    ],
)
def test_a_split_tail_the_request_cannot_take_is_one_clear_error(kw, words):
    kw = {"sites": 5, "block": (2, 2, 2), **kw}
    with pytest.raises(ProgramError, match=words.replace("(", r"\(").replace(")", r"\)")):
        spatialc.build(spatialc.gemm(96, 128, 512, "int8"), "sm_90", placement="split_tail", sub_blocks=(1, 1), **kw)


def test_the_persistent_form_refuses_a_split_tail_by_name():
    with pytest.raises(SpatialError, match="wait on each other"):
        spatialc.lower(BASE, form="persistent")


def test_the_planner_picks_a_plan_whose_last_wave_splits():
    p = spatialc.build(spatialc.gemm(3072, 3072, 3072, "bf16"), "sm_90a", placement="split_tail")
    pl, plan = p.placement, p.plan
    assert len(pl.items_of_site) == 132 and pl.splits >= 2
    assert pl.tail == plan.items % 132 and pl.tail * pl.splits <= 132
    assert p.verified and isinstance(pl, Placement)


# ---- the general form -----------------------------------------------------------------------------------------


def test_the_general_form_prints_the_tail_as_the_sites_last_item():
    art = spatialc.lower(BASE)
    text = art.kernel_cu
    assert art.budget.form == "general" and art.launch.cooperative
    assert "for (int item = 0; item < n_items - 1; ++item)" in text
    assert "for (int item = n_items - 1; item < n_items; ++item)" in text
    assert art.budget.workspace_bytes == 4 * 16 * 16 * 4 * 2 * 1  # two tail items, one slot each, int32


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize(("prec", "shape", "sites", "block", "mode"), [
    ("int8", (96, 128, 512), 5, (2, 2, 2), "late"),
    ("bf16", (96, 96, 1000), 4, (2, 2, 1), "early"),
])  # fmt: skip
def test_the_general_form_under_emulation_equals_the_interpreter(prec, shape, sites, block, mode):
    p = tailed(*shape, prec, sites=sites, block=block)
    ins = operands(prec, *shape, seed=4)
    ins = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in ins.items()}
    got = spatialc.emulate(spatialc.lower(p), ins, mode=mode, timeout=120)
    assert np.array_equal(got, spatialc.evaluate(p, ins))


@emulation
@pytest.mark.emulation
def test_a_tail_owner_that_adds_before_its_contributors_wrote_is_caught():
    """The owner's grid wait taken out of the printed kernel: its reads of the workspace race the contributors'
    writes, which the emulation reports (or the sum comes out wrong) — it must not pass."""
    art = spatialc.lower(BASE)
    text = art.program_cu
    assert text.count("spatialc_grid_wait(spatialc_sync") == 1
    planted = dataclasses.replace(
        art, program_cu=text.replace("spatialc_grid_wait(spatialc_sync", "(void)(spatialc_sync")
    )
    ins = operands("int8", 96, 128, 512, 4)
    try:
        got = spatialc.emulate(planted, ins, mode="late", timeout=120)
    except SpatialError as e:
        assert "race" in str(e).lower() or "order" in str(e).lower(), str(e)
    else:
        assert not np.array_equal(got, reference(ins))


def test_the_cli_places_a_split_tail(capsys):
    from spatialc.cli import main

    args = ["gemm", "96", "128", "512", "--precision", "int8", "--placement", "split_tail", "--sites", "5"]
    assert main([*args, "--block", "2,2,2", "--sub-blocks", "1,1", "--target", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "split tail" in out
    # Where the tail is every item (2 items on 6 sites), the line said "items 0 … -1 whole".
    args = ["gemm", "130", "70", "520", "--precision", "bf16", "--placement", "split_tail", "--sites", "6"]
    assert main([*args, "--target", "sm_90a", "--check", "none"]) == 0
    assert "(its last 2 items; none whole)" in capsys.readouterr().out
    assert (
        main(
            [
                "gemm",
                "96",
                "128",
                "512",
                "--placement",
                "split_tail",
                "--sites",
                "4",
                "--block",
                "2,2,2",
                "--sub-blocks",
                "1,1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "split_tail" in err[0]


def test_the_python_source_of_a_split_tail_traces_the_same_program():
    from spatialc.lang.source import python_source

    src = python_source(BASE)
    assert "tail=2" in src and "for item in e.items(0, 2):" in src and "for item in e.items(2, 1):" in src
    ns: dict = {}
    exec(compile(src, "<split tail>", "exec"), ns)
    assert ns["program"]() == BASE


def test_the_placement_picture_frames_the_split_items():
    from spatialc.viz import placement_svg

    svg = placement_svg(BASE)
    assert "a split tail: the last 2 items 2 sites each" in svg
    assert svg.count('stroke-dasharray="3,2"') == 2 and svg.count("(split-K; site") == 2


def test_an_item_loop_past_the_first_item_outside_a_split_tail_is_refused():
    # a plain GEMM's site of two items run as two loops: what the rules follow loop by loop only for a split tail
    p = spatialc.build(spatialc.gemm(64, 64, 256, "int8"), "sm_90", sites=2, block=(2, 2, 2), sub_blocks=(1, 1))
    (site, items), *_ = p.placement.items_of_site
    assert len(items) == 2

    def halves(ops):
        (loop,) = ops
        return (dataclasses.replace(loop, count=Const(1)), dataclasses.replace(loop, count=Const(1), first=1))

    q = p.evolve(verified=False)
    for engine in (Engine.READER, Engine.COMPUTE, Engine.WRITER):
        q = edit(q, engine, halves, (site,))
    refused(q, "only in a split tail")


def test_the_launcher_runs_a_split_tail_on_exactly_its_sites_with_its_workspace():
    """A split tail is launched as listed — every site at once, cooperatively, with the tail's workspace — and not
    dealt again over the device's multiprocessors, as the grid rules' placements are."""
    from spatialc.runtime import launch as L

    from .stand_in import CooperativeStandIn, product

    art = spatialc.lower(BASE)
    dev = CooperativeStandIn(art, product, sms=132, per_sm=2)
    ins = operands("int8", 96, 128, 512)
    assert np.array_equal(L.run_with(dev, art, ins["A"], ins["B"]), reference(ins))
    ((grid, sync),) = dev.cooperative
    assert grid == 5 and np.array_equal(sync, art.launch.sync)
    work = next(t for t in BASE.tensors if t.role == TensorRole.WORKSPACE)
    sizes = {a.name: x.size for a, x in zip(dev.args, dev.launches[0][4], strict=False)}
    assert sizes[work.name] == work.tiles[0] * work.tiles[1] * 256
    n = len(art.launch.params)  # then the work list: each site's offset, count and items, as placed
    assert list(dev.launches[0][4][n])[5:10] == [len(items) for _, items in BASE.placement.items_of_site]

"""The planner's search and verify's memory, made faster (issue 35, point 9), still decide exactly what they did.

The candidate search asks the backend about a block shape once (`footprint.block_resources`), not about every plan of
every GEMM, and spells a plan out only to break a tie; the reference here asks the backend about every full plan and
sorts by the full key, as the search did before. Verify remembers the programs it returned, so that `lower` does
not prove again what `build` just proved; a program changed since, even in place, is verified anew."""

from __future__ import annotations

import dataclasses

import pytest

import spatialc
from spatialc.errors import VerifyError
from spatialc.frontend import bias, relu
from spatialc.ir.ids import LV_ITEM
from spatialc.ir.nodes import Plan
from spatialc.ir.ops import BlockShape, Const, Loop, walk
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.cuda.persistent import kernel as persistent
from spatialc.lower.cuda.sm90a import plan as sm90a_plan
from spatialc.passes import footprint, tile
from spatialc.passes import verify as verify_package
from spatialc.passes.verify import derived, verify

BACKENDS = {"persistent": persistent, "general": general, "sm90a": sm90a_plan}
SHAPES = [(64, 64, 64), (96, 200, 130), (1024, 1024, 1024), (4096, 4096, 512), (8192, 8192, 8192), (128, 128, 65536)]
PRECISIONS = ("int8", "fp16", "bf16")
FORMS = {"sm_80": ("persistent", "general"), "sm_86": ("persistent", "general"), "sm_90": ("persistent", "general")}
FORMS["sm_90a"] = ("persistent", "general", "sm90a")


def _every_plan_asked(monkeypatch, p, target, form, extra, **forced):
    """The candidates as the search made them before: the backend asked about each full plan, sorted by the full
    key with each plan's text."""

    def ask(target, plan, prec, form="persistent", stages=0, reads=0):
        if form in ("sm90a", "persistent"):  # (their fused stores' rings of a residual's pages: `footprint.side_rings`)
            return BACKENDS[form].plan_resources(target, plan, prec, stages, reads)
        return BACKENDS[form].plan_resources(target, plan, prec, stages)

    with monkeypatch.context() as m:
        m.setattr(tile, "resources", ask)
        found = tile.candidates(p, target, form=form, extra=extra, **forced)
    return sorted(found, key=lambda c: (c.cost, c.plan.block.osh * c.plan.block.osw, c.plan.depth, repr(c.plan)))


def _cases():
    for name, forms in FORMS.items():
        for form in forms:
            for prec in PRECISIONS:
                for m, n, k in SHAPES:
                    yield name, form, prec, (m, n, k)


@pytest.mark.parametrize("name,form,prec,shape", list(_cases()))
def test_the_search_offers_the_plans_it_offered_asking_for_each(monkeypatch, name, form, prec, shape):
    target = spatialc.target(name)
    p = spatialc.gemm(*shape, prec).evolve(target=name)
    for extra in (0, 1):
        want = _every_plan_asked(monkeypatch, p, target, form, extra)
        got = tile.candidates(p, target, form=form, extra=extra)
        assert got == want  # the same plans, figures and costs, in the same order: the same plan chosen
        if want:
            assert tile.choose(p, target, form=form, extra=extra) == want[0]


@pytest.mark.parametrize("name", ["sm_86", "sm_90a"])
def test_the_search_is_the_same_for_epilogues_groups_and_forced_fields(monkeypatch, name):
    target = spatialc.target(name)
    programs = [
        spatialc.gemm(300, 500, 700, "fp16", epilogue=[bias(), relu()]),
        spatialc.gemm(2048, 2048, 2048, "int8", epilogue=[bias()]),
        spatialc.grouped_gemm(4, 256, 512, 1024, "bf16"),
        spatialc.gemm(1024, 1024, 512, "bf16", epilogue=[spatialc.row_scale(), spatialc.residual(), relu()]),
    ]
    forced = [{}, {"block": (2, 2, 2)}, {"sub_blocks": (2, 1)}, {"depth": 4}, {"block": (8, 4, 1), "depth": 2}]
    for p in programs:
        p = p.evolve(target=name)
        for form in FORMS[name]:
            for fields in forced:
                want = _every_plan_asked(monkeypatch, p, target, form, 0, **fields)
                assert tile.candidates(p, target, form=form, **fields) == want, (p.name, form, fields)


def test_a_block_costs_the_backend_the_same_whatever_the_grid_and_k():
    """What `block_resources` rests on: a block's shared memory and residency do not depend on the item grid or K."""
    for name in ("sm_86", "sm_90a"):
        target = spatialc.target(name)
        for form, backend in BACKENDS.items():
            for block in (BlockShape(8, 16, 2), BlockShape(4, 4, 1)):
                for sub, depth, stages in (((1, 1), 2, 0), ((2, 1), 3, 1), ((1, 2), 4, 2)):
                    for prec in sorted({footprint.sized_as(p) for p in footprint.OPERAND_BYTES}):  # what it is asked
                        one = backend.plan_resources(target, Plan(block, sub, (1, 1), block.ibw, depth), prec, stages)
                        for grid, k_tiles, groups in (((7, 3), 40 * block.ibw, 1), ((512, 512), 512, 4)):
                            plan = Plan(block, sub, grid, k_tiles, depth, groups)
                            assert backend.plan_resources(target, plan, prec, stages) == one, (form, plan)


def _counting(monkeypatch):
    runs = []
    real = verify_package._verify

    def counted(p, target):
        runs.append(p)
        return real(p, target)

    monkeypatch.setattr(verify_package, "_verify", counted)
    return runs


def test_lower_does_not_prove_again_what_build_proved(monkeypatch):
    runs = _counting(monkeypatch)
    p = spatialc.build(spatialc.gemm(256, 256, 256, "fp16"), "sm_90")
    assert len(runs) == 1
    assert verify(p, spatialc.target("sm_90")) is p
    spatialc.lower(p)
    assert len(runs) == 1
    # A copy is another program, verified anew (and one verified for another target too).
    spatialc.lower(p.evolve(verified=True))
    assert len(runs) == 2
    verify(p)
    assert len(runs) == 3


def test_a_program_changed_in_place_after_build_is_verified_anew_and_refused():
    """A frozen program can still be changed through object.__setattr__: lower then proves it again."""
    p = spatialc.build(spatialc.gemm(256, 256, 512, "fp16"), "sm_90")
    assert p.placement is not None
    object.__setattr__(p, "placement", dataclasses.replace(p.placement, items_of_site=p.placement.items_of_site[1:]))
    with pytest.raises(VerifyError):
        spatialc.lower(p)


def test_an_op_changed_in_place_deep_in_the_schedule_is_verified_anew_and_refused():
    p = spatialc.build(spatialc.gemm(256, 256, 512, "int8"), "sm_90a")
    assert derived(p) is not None  # build made the sm_90a kernel, which lower takes from here
    spatialc.lower(p)
    assert p.schedule is not None
    loop = next(
        op
        for prog in p.schedule.programs
        for op in walk(prog.ops)
        if isinstance(op, Loop) and isinstance(op.count, Const) and op.count.n > 1 and op.var != LV_ITEM
    )
    object.__setattr__(loop, "count", Const(loop.count.n - 1))  # type: ignore[union-attr]
    assert derived(p) is None  # the kernel made from the program as it was is no longer offered
    with pytest.raises(VerifyError):
        spatialc.lower(p)

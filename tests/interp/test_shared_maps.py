"""A map whose expression holds an earlier map's whole expression of the same pages takes that map's computed pages
(`interp/mapped.py`'s `reuse_plan` and `shared`): softmax's quotient exp(x − max) / sum its exp map's exp(x − max),
LayerNorm's output its centring's x − mean. The part is computed once, and every result is the same bit for bit as
with each map computed in full."""

from __future__ import annotations

import numpy as np
import pytest

import spatialc
from spatialc.interp import codegen, mapped, support

from .test_lazy_maps import inputs_of, run

PROGRAMS = {
    "softmax": lambda: spatialc.softmax(40, 300, "bf16"),
    "softmax, bands of 2": lambda: spatialc.softmax(70, 100, "fp16", out="fp16"),
    "softmax online": lambda: spatialc.softmax(40, 300, "bf16", online=True),
    "layernorm": lambda: spatialc.layernorm(40, 300, "bf16"),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_map_that_reuses_an_earlier_maps_pages_gives_the_same_bits(name, monkeypatch):
    p = spatialc.build(PROGRAMS[name](), "sm_90")
    values = inputs_of(p, np.random.default_rng(len(name)))
    reused: list[int] = []
    with monkeypatch.context() as m:  # (count the pages that took an earlier map's)
        m.setattr(support, "shared", lambda kept, held, v: _counted(reused, mapped.shared(kept, held, v), v))
        shared = run(p, values)
    monkeypatch.setattr(codegen, "reuse_plan", lambda kernel, earlier, ins: None)  # every map in full
    full = run(p, values)
    if name != "softmax online":  # (its quotient's exp map is its one pass's: computed again, as the program says)
        assert reused, "no page took an earlier map's"
    assert shared.keys() == full.keys()
    for out, got in shared.items():
        assert got.dtype == full[out].dtype and got.tobytes() == full[out].tobytes(), out


def _counted(reused: list[int], got, v):
    if got is not v:
        reused.append(1)
    return got


def test_the_plan_finds_the_part_and_renames_its_pages():
    """The quotient exp(x2 − max) / sum reads x2 (0), max (1) and sum (2); the exp map exp(x1 − max) its x1 and max:
    the quotient keeps the sum and takes the exp map's page as its page 1."""
    from spatialc.ir.ops import Apply, Arg, Map, RowArg

    exp = Map(Apply("exp", (Apply("sub", (Arg(0), RowArg(1, 8))),)))
    quotient = Map(Apply("div", (exp.expr, RowArg(2, 8))))
    first = mapped.MapKernel(exp, False, (16, 16), 2)
    second = mapped.MapKernel(quotient, False, (16, 16), 3)
    mapped.reuse_plan(second, [first], 3)
    plan = second.reuse
    assert first.shared and plan is not None and plan.source is first and plan.picks == (0, 1)
    assert plan.keep == (2, 3) and plan.kernel.op == Map(Apply("div", (Arg(1), RowArg(0, 8))))
    other = mapped.MapKernel(Map(Apply("exp", (Apply("sub", (RowArg(1, 8), Arg(0))),))), False, (16, 16), 2)
    third = mapped.MapKernel(quotient, False, (16, 16), 3)
    mapped.reuse_plan(third, [other], 3)  # max − x is not x − max: nothing to reuse
    assert third.reuse is None and not other.shared

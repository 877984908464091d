"""Hostile review of the grouped GEMM's verifier (row counts known only at run time).

The guarantee attacked: a program `verify` accepts computes, for EVERY row-count vector 0 <= sizes[g] <= max_rows,
C[g, :m_g] = epilogue(A[g, :m_g] @ B[g]) with rows >= m_g zero, without deadlock or out-of-bounds access.

Each test asserts the correct behaviour: verify refuses the edited program, or the program equals the numpy
reference on every count vector tried (0, max_rows, max_rows - 1, 1, 17, random, per-group ramps). The review found
five holes, closed since and tested here: B's read masked by the row counts, A's masked by another tensor, the row
counts taken from a bias, a K loop counted at run time, a run-time bound that valid counts exceed.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import spatialc
from spatialc.errors import SpatialError
from spatialc.ir.ids import LV_ITEM, LV_ITEM_Y, LV_K, LV_ROW, ItemId, Site, TensorId
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import Const, Loop, ReadTiles, TileAddr, Trip, WriteTiles
from spatialc.passes.verify import verify

from ..rewrite import edit, map_ops

# ---- helpers ------------------------------------------------------------------------------------------------------


def grouped(groups=3, rows=40, n=32, k=48, prec="int8", tgt="sm_86", **kw):
    """A grouped program of one 2x2-tile block an item (unless asked otherwise): 32-row blocks, so a group of more
    than 32 rows has several, and the row loop a symbol the attacks can bend."""
    build = {key: kw.pop(key) for key in ("sites", "placement", "block", "sub_blocks", "depth") if key in kw}
    build.setdefault("block", (2, 2, 1))
    build.setdefault("sub_blocks", (1, 1))
    return spatialc.build(spatialc.grouped_gemm(groups, rows, n, k, prec, **kw), tgt, **build)


def operands(groups, rows, n, k, prec="int8", seed=0):
    rng = np.random.default_rng(seed)
    if prec == "int8":
        a = rng.integers(-128, 128, (groups, rows, k)).astype(np.int8)
        b = rng.integers(-128, 128, (groups, k, n)).astype(np.int8)
    else:  # small integers: every sum order is exact in float32
        a = rng.integers(-4, 5, (groups, rows, k)).astype(np.float64)
        b = rng.integers(-4, 5, (groups, k, n)).astype(np.float64)
    return {"A": a, "B": b}


def counts(groups, rows, seed=0):
    """Row-count vectors: none, all full, full minus one, one row, 17 (not a multiple of 16), random, ramps."""
    rng = np.random.default_rng(seed)
    vs = [
        [0] * groups,
        [rows] * groups,
        [rows - 1] * groups,
        [1] * groups,
        [min(rows, 17)] * groups,
        list(rng.integers(0, rows + 1, groups)),
        [g % (rows + 1) for g in range(groups)],
        [min(rows, 16 * (g + 1) + 1) for g in range(groups)],
    ]
    return [np.array(v, np.int32) for v in vs]


def reference(ins, sizes, bias=None):
    c = ins["A"].astype(np.float64) @ ins["B"].astype(np.float64)
    if bias is not None:
        c = c + np.asarray(bias, np.float64)
    for g, m in enumerate(sizes):
        c[g, m:] = 0
    return c


def refused_or_right(q, shape, prec="int8", extra=None, bias_name=None):
    """verify refuses `q`, or `q` equals the reference on every count vector tried (the guarantee)."""
    try:
        v = verify(q)
    except SpatialError:
        return "refused"
    groups, rows, n, k = shape
    for seed in range(2):
        ins = operands(groups, rows, n, k, prec, seed) | (extra or {})
        for sizes in counts(groups, rows, seed):
            got = spatialc.evaluate(v, ins | {"sizes": sizes})
            want = reference(ins, sizes, ins.get(bias_name) if bias_name else None)
            assert np.array_equal(got, want), f"wrong result for sizes={sizes.tolist()}"
    return "accepted"


def refused(q):
    with pytest.raises(SpatialError):
        verify(q)


def rw(p, engine, f, sites=None):
    return edit(p.evolve(verified=False), engine, lambda ops: map_ops(ops, f), sites)


def all_row_trips(p, f):
    """Every engine's row loop count replaced by f(count)."""
    q = p.evolve(verified=False)
    for e in Engine:
        q = rw(q, e, lambda op: (dataclasses.replace(op, count=f(op.count)),) if _row_loop(op) else None)
    return q


def _row_loop(op):
    return isinstance(op, Loop) and op.var == LV_ROW


def mask(p, engine, kind, tensor, to):
    """`p` with the rows_from of every `kind` op of `tensor` in `engine` set to `to`."""
    return rw(
        p,
        engine,
        lambda op: (dataclasses.replace(op, rows_from=to),) if isinstance(op, kind) and op.tensor == tensor else None,
    )


def restride(p, engine, tensor, var, f):
    """`p` with the stride of `var` in `tensor`'s addresses in `engine` replaced by f(stride)."""

    def g(op):
        if isinstance(op, ReadTiles | WriteTiles) and op.tensor == tensor:
            steps = tuple((v, f(s)) if v == var else (v, s) for v, s in op.at.steps)
            return (dataclasses.replace(op, at=TileAddr(op.at.base, steps)),)
        return None

    return rw(p, engine, g)


def tid(p, name):
    return p.tensor_named(name).id


# ---- baselines: what build makes is right for every count ----------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "prec", "kw"),
    [
        ((3, 40, 32, 48), "int8", {}),
        ((5, 33, 64, 48), "int8", {"sites": 2}),  # max_rows neither a multiple of 16 nor of the 32-row block
        ((4, 17, 40, 70), "fp16", {"sites": 3, "placement": "round_robin"}),
        ((2, 16, 16, 16), "bf16", {}),
    ],
)
def test_built_grouped_programs_are_right_for_every_count_vector(shape, prec, kw):
    assert refused_or_right(grouped(*shape, prec, **kw).evolve(verified=False), shape, prec) == "accepted"


def test_bias_epilogue_is_right_for_every_count_vector_and_rows_past_counts_stay_zero():
    shape = (3, 40, 32, 48)
    p = grouped(*shape, epilogue=[spatialc.bias()])
    bias = {"bias": np.arange(32, dtype=np.int32) * 1000 - 7000}
    assert refused_or_right(p.evolve(verified=False), shape, extra=bias, bias_name="bias") == "accepted"


def test_int8_at_the_edge_of_int32_accumulation_is_exact_for_every_count():
    groups, rows, n, k = 2, 17, 16, 131071  # 128 * 128 * 131071 = 2^31 - 2^14: the largest int32 sum
    p = grouped(groups, rows, n, k)
    assert p.tensor_named("C").dtype.value == "int32"
    ins = {"A": np.full((groups, rows, k), -128, np.int8), "B": np.full((groups, k, n), -128, np.int8)}
    for sizes in ([17, 0], [16, 17], [1, 3]):
        sizes = np.array(sizes, np.int32)
        assert np.array_equal(spatialc.evaluate(p, ins | {"sizes": sizes}), reference(ins, sizes))


def test_items_listed_in_another_order_or_sites_swapped_stay_right():
    shape = (5, 40, 64, 48)
    p = grouped(*shape, sites=2)
    its = dict(p.placement.items_of_site)
    for table in (
        ((Site(0), its[Site(1)]), (Site(1), its[Site(0)])),
        ((Site(0), tuple(reversed(its[Site(0)]))), (Site(1), its[Site(1)])),
    ):
        q = p.evolve(verified=False, placement=dataclasses.replace(p.placement, items_of_site=table))
        assert refused_or_right(q, shape) in ("refused", "accepted")


def test_dropping_as_mask_is_refused_or_still_right():
    shape = (3, 40, 32, 48)
    p = grouped(*shape)
    refused_or_right(mask(p, Engine.READER, ReadTiles, tid(p, "A"), None), shape)


# ---- the holes the review found, closed -----------------------------------------------------------------------


def test_b_read_masked_by_the_row_counts_is_refused():
    shape = (3, 40, 32, 48)  # fp16: B is stored row-major, so wellformed's column-major refusal does not fire
    p = grouped(*shape, "fp16")
    q = mask(p, Engine.READER, ReadTiles, tid(p, "B"), tid(p, "sizes"))
    assert refused_or_right(q, shape, "fp16") == "refused"


@pytest.mark.parametrize("other", ["bias", "counts2"])
def test_a_read_masked_by_another_tensor_than_the_row_counts_is_refused(other):
    shape = (3, 40, 3, 48)  # n == groups: an int8 bias is an int32 (1, n) = (1, G) parameter
    p = grouped(*shape, epilogue=[spatialc.bias()])
    extra = {"bias": np.array([5, 40, 17], np.int32)}
    if other == "counts2":
        s = p.tensor_named("sizes")
        p = p.evolve(
            verified=False, tensors=(*p.tensors, dataclasses.replace(s, id=TensorId(len(p.tensors)), name=other))
        )
        extra[other] = np.array([7, 40, 0], np.int32)
    q = mask(p, Engine.READER, ReadTiles, tid(p, "A"), tid(p, other))
    assert refused_or_right(q, shape, extra=extra, bias_name="bias") == "refused"


def test_row_counts_read_from_the_bias_are_refused():
    shape = (3, 40, 3, 48)
    p = grouped(*shape, epilogue=[spatialc.bias()])
    bias = tid(p, "bias")
    q = all_row_trips(p, lambda t: dataclasses.replace(t, tensor=bias))
    q = mask(q, Engine.READER, ReadTiles, tid(p, "A"), bias)
    q = mask(q, Engine.WRITER, WriteTiles, tid(p, "C"), bias)
    extra = {"bias": np.array([5, 40, 17], np.int32)}  # valid as counts, so evaluate's row-count check passes
    assert refused_or_right(q, shape, extra=extra, bias_name="bias") == "refused"


def _k_trip(p, per):
    """The K loop of reader and compute counted at run time: Trip(sizes[item_y], bound = its steps, per)."""
    sizes = tid(p, "sizes")

    def f(op):
        if isinstance(op, Loop) and op.var == LV_K:
            count = Trip(sizes, 0, op.count.n, per, ((LV_ITEM_Y, 1),))
            return (dataclasses.replace(op, count=count, body=map_ops(op.body, f)),)
        return None

    q = p.evolve(verified=False)
    for e in (Engine.READER, Engine.COMPUTE):
        q = rw(q, e, f)
    return q


def test_k_loop_counted_by_the_row_counts_is_refused():
    shape = (3, 40, 32, 256)
    p = grouped(*shape)
    nk = next(
        op for q in p.schedule.programs for op in spatialc.ir.ops.walk(q.ops) if isinstance(op, Loop) and op.var == LV_K
    ).count.n
    assert nk > 1
    assert refused_or_right(_k_trip(p, math.ceil(shape[1] / nk)), shape) == "refused"


def test_a_trip_bound_that_valid_counts_exceed_is_refused():
    shape = (3, 40, 32, 256)
    assert refused_or_right(_k_trip(grouped(*shape), 1), shape) == "refused"


# ---- attacks correctly refused -------------------------------------------------------------------------------------


def test_b_read_masked_in_an_int8_program_is_refused():  # B is column-major there
    p = grouped()
    refused(mask(p, Engine.READER, ReadTiles, tid(p, "B"), tid(p, "sizes")))


def test_c_write_unmasked_is_refused():
    p = grouped()
    refused(mask(p, Engine.WRITER, WriteTiles, tid(p, "C"), None))


@pytest.mark.parametrize(
    "change",
    [
        {"bound": +1},
        {"bound": +5},
        {"bound": -1},
        {"per": 40},
        {"per": 31},
        {"per": 33},
        {"per": 16},
        {"per": 64},
        {"steps": ((LV_ITEM_Y, 0),)},
        {"steps": ()},
        {"index": 1},
    ],
    ids=str,
)
def test_row_trip_edits_in_every_engine_are_refused(change):
    p = grouped(5, 40, 64, 48, sites=2)

    def f(t):
        kw = {k: (getattr(t, k) + v if k == "bound" else v) for k, v in change.items()}
        return dataclasses.replace(t, **kw)

    refused(all_row_trips(p, f))


@pytest.mark.parametrize("engine", [Engine.READER, Engine.COMPUTE, Engine.WRITER], ids=lambda e: e.value)
def test_row_trip_edited_in_one_engine_is_refused(engine):  # (the engines a built grouped GEMM runs)
    p = grouped(5, 40, 64, 48, sites=2)
    for f in (
        lambda t: dataclasses.replace(t, per=t.per * 2),
        lambda t: dataclasses.replace(t, bound=t.bound + 1),
        lambda t: Const(t.bound),
    ):
        refused(rw(p, engine, lambda op, f=f: (dataclasses.replace(op, count=f(op.count)),) if _row_loop(op) else None))


def test_row_trip_from_another_tensor_in_the_writer_only_is_refused():
    p = grouped(3, 40, 3, 48, epilogue=[spatialc.bias()])
    bias = tid(p, "bias")
    refused(
        rw(
            p,
            Engine.WRITER,
            lambda op: (
                (dataclasses.replace(op, count=dataclasses.replace(op.count, tensor=bias)),) if _row_loop(op) else None
            ),
        )
    )
    # the writer's loop and mask both from the bias, the reader and compute from sizes: the rings no longer co-iterate
    q = rw(
        p,
        Engine.WRITER,
        lambda op: (
            (dataclasses.replace(op, count=dataclasses.replace(op.count, tensor=bias)),) if _row_loop(op) else None
        ),
    )
    refused(mask(q, Engine.WRITER, WriteTiles, tid(p, "C"), bias))


def test_row_loop_as_a_constant_everywhere_is_refused():
    refused(all_row_trips(grouped(5, 40, 64, 48, sites=2), lambda t: Const(t.bound)))


@pytest.mark.parametrize(
    ("tensor", "var", "f"),
    [
        ("C", LV_ITEM_Y, lambda s: s // 2),  # groups of C overlap
        ("A", LV_ITEM_Y, lambda s: s // 2),
        ("B", LV_ITEM_Y, lambda s: 0),  # every group multiplies by B[0]
        ("C", LV_ROW, lambda s: 2 * s),
        ("A", LV_ROW, lambda s: 0),
    ],
    ids=["C-group-stride", "A-group-stride", "B-group-offset", "C-row-stride", "A-row-stride"],
)
def test_group_and_row_strides_tampered_are_refused(tensor, var, f):
    p = grouped(5, 40, 64, 48, sites=2)
    engine = Engine.WRITER if tensor == "C" else Engine.READER
    refused(restride(p, engine, tid(p, tensor), var, f))


def test_strips_missing_or_placed_twice_are_refused():
    p = grouped(5, 40, 64, 48, sites=2)
    its = dict(p.placement.items_of_site)
    for table in (
        ((Site(0), its[Site(0)][:-1]), (Site(1), its[Site(1)])),
        ((Site(0), its[Site(0)]), (Site(1), its[Site(1)][:-1] + (ItemId(8),))),
    ):
        refused(p.evolve(verified=False, placement=dataclasses.replace(p.placement, items_of_site=table)))


def test_item_loop_counted_at_run_time_or_nested_inside_the_row_loop_is_refused():
    p = grouped(5, 40, 64, 48, sites=2)
    sizes = tid(p, "sizes")

    def item_trip(op):
        if isinstance(op, Loop) and op.var == LV_ITEM:
            return (dataclasses.replace(op, count=Trip(sizes, 0, op.count.n, 1, ())),)
        return None

    def swap_nesting(op):
        if isinstance(op, Loop) and op.var == LV_ITEM:
            (inner,) = op.body
            return (dataclasses.replace(inner, body=(dataclasses.replace(op, body=inner.body),)),)
        return None

    for f in (item_trip, swap_nesting):
        q = p.evolve(verified=False)
        for e in Engine:
            q = rw(q, e, f)
        refused(q)


def test_groups_and_row_count_shapes_tampered_are_refused():
    p = grouped(5, 40, 64, 48, sites=2)
    refused(p.evolve(verified=False, plans=(dataclasses.replace(p.plan, groups=4),)))
    for name, change in (("B", {"groups": 1}), ("C", {"groups": 1}), ("sizes", {"elems": (1, 6)})):
        tens = tuple(dataclasses.replace(t, **change) if t.name == name else t for t in p.tensors)
        refused(p.evolve(verified=False, tensors=tens))


def test_one_site_counting_its_rows_from_another_tensor_is_refused():
    """(Found by a later review.) Site 1 alone takes its row loop and both masks from the bias, the other sites from
    `sizes`: the output's rows are then counted by two tensors, which is refused."""
    shape = (3, 40, 3, 48)
    p = grouped(*shape, epilogue=[spatialc.bias()], sites=3)
    bias, a, c = tid(p, "bias"), tid(p, "A"), tid(p, "C")
    q = p.evolve(verified=False)
    for e in Engine:
        q = rw(
            q,
            e,
            lambda op: (
                (dataclasses.replace(op, count=dataclasses.replace(op.count, tensor=bias)),) if _row_loop(op) else None
            ),
            (1,),
        )
    q = rw(
        q,
        Engine.READER,
        lambda op: (dataclasses.replace(op, rows_from=bias),) if isinstance(op, ReadTiles) and op.tensor == a else None,
        (1,),
    )
    q = rw(
        q,
        Engine.WRITER,
        lambda op: (
            (dataclasses.replace(op, rows_from=bias),) if isinstance(op, WriteTiles) and op.tensor == c else None
        ),
        (1,),
    )
    extra = {"bias": np.array([5, 40, 17], np.int32)}
    assert refused_or_right(q, shape, extra=extra, bias_name="bias") == "refused"

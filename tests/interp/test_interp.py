"""The reference interpreter against numpy, and against programs broken on purpose.

Tolerance for real-valued fp16 / bf16 GEMMs: the interpreter rounds each input once to the operand type, sums
exact products in float64 and returns float32, so its result is within one float32 rounding of the float64
product of the rounded inputs — |C - ref| <= 2^-23·|ref| + 2^-40·(|A|·|B|) for the float64 sum's own error.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spatialc
from spatialc.errors import DeadlockError, SpatialError
from spatialc.interp.errors import AddressError, EvalError, InputError, NotReady, TripError, UnsupportedOp
from spatialc.ir.ids import LV_K, BufferId, GroupId, SemId, Site, TensorId
from spatialc.ir.nodes import Buffer, DType, Fifo, Group, Interm, Schedule, Semaphore, Tensor, TensorRole
from spatialc.ir.ops import (
    Barrier,
    Compute,
    Const,
    Generic,
    Loop,
    McastSend,
    McastSetValid,
    Pop,
    Push,
    ReadTiles,
    Relu,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    TileAddr,
    Trip,
    Wait,
    WriteTiles,
)
from spatialc.numerics.rounding import BF16_MAX, round_bf16, round_fp16

TARGETS = ("sm_80", "sm_86", "sm_90")
SMALL = dict(max_examples=50, deadline=None)


def operands(rng: np.random.Generator, m: int, n: int, k: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(lo, hi, (m, k)), rng.integers(lo, hi, (k, n))


def build_kwargs(data: st.DataObject) -> dict:
    """A random mix of forced plan fields, placements, site counts and targets."""
    kw: dict = {"placement": data.draw(st.sampled_from(["contiguous", "round_robin"]))}
    if data.draw(st.booleans()):
        kw["block"] = (
            data.draw(st.sampled_from([1, 2, 4])),
            data.draw(st.sampled_from([1, 2, 4])),
            data.draw(st.sampled_from([1, 2])),
        )
    if data.draw(st.booleans()):
        kw["sub_blocks"] = data.draw(st.sampled_from([(1, 1), (1, 2), (2, 1), (2, 2)]))
    if data.draw(st.booleans()):
        kw["sites"] = data.draw(st.sampled_from([1, 2, 3, 7, 500]))  # 500: more sites than items
    return kw


def evaluate_gemm(data: st.DataObject, prec: str, lo: int, hi: int) -> None:
    m, n, k = (data.draw(st.integers(1, 300), label=d) for d in "mnk")
    kw = build_kwargs(data)
    p = spatialc.build(spatialc.gemm(m, n, k, prec), data.draw(st.sampled_from(TARGETS)), **kw)
    a, b = operands(np.random.default_rng(m * 7919 + n * 31 + k), m, n, k, lo, hi)
    c = spatialc.evaluate(p, {"A": a, "B": b})
    assert c.shape == (m, n)
    assert c.dtype == (np.int32 if prec == "int8" else np.float32)  # int8's int32 sums: K ≤ 300 keeps them in range
    np.testing.assert_array_equal(c, a @ b)


# ---- equal to numpy ---------------------------------------------------------------------------------------


@settings(**SMALL)
@given(st.data())
def test_int8_equals_numpy_exactly(data):
    evaluate_gemm(data, "int8", -128, 128)


@settings(**SMALL)
@given(st.data())
def test_integer_valued_fp16_equals_numpy_exactly(data):
    evaluate_gemm(data, "fp16", -8, 9)  # sums stay below 2^24: exact in float32


@settings(**SMALL)
@given(st.data())
def test_integer_valued_bf16_equals_numpy_exactly(data):
    evaluate_gemm(data, "bf16", -8, 9)


@pytest.mark.parametrize(
    "prec, rounding",
    [("fp16", lambda x: x.astype(np.float16).astype(np.float64)), ("bf16", lambda x: np.vectorize(bf16_reference)(x))],
)
def test_real_valued_fp16_bf16_within_tolerance(prec, rounding):
    rng = np.random.default_rng(5)
    m, n, k = 70, 45, 130
    a, b = rng.standard_normal((m, k)) * 3, rng.standard_normal((k, n)) / 7
    c = spatialc.evaluate(spatialc.build(spatialc.gemm(m, n, k, prec), "sm_90"), {"A": a, "B": b})
    ra, rb = rounding(a), rounding(b)
    ref = ra @ rb
    assert np.all(np.abs(c - ref) <= 2.0**-23 * np.abs(ref) + 2.0**-40 * (np.abs(ra) @ np.abs(rb)))
    assert not np.array_equal(ra, a)  # the inputs really were rounded


def test_int8_edge_values_and_padding():
    # Extreme products everywhere, shapes that pad every tile grid, a forced block wider than the matrix.
    m, n, k = 17, 33, 49
    a, b = np.full((m, k), -128), np.full((k, n), -128)
    p = spatialc.build(spatialc.gemm(m, n, k), "sm_80", block=(4, 4, 2), sub_blocks=(2, 2))
    c = spatialc.evaluate(p, {"A": a.astype(np.int8), "B": b.astype(np.int8)})
    assert c.dtype == np.int32 and np.all(c == 128 * 128 * k)


def test_the_benchmark_shape_sums_exactly():
    rng = np.random.default_rng(0)
    a, b = operands(rng, 256, 192, 1024, -128, 128)
    p = spatialc.build(spatialc.gemm(256, 192, 1024), "sm_90")
    np.testing.assert_array_equal(spatialc.evaluate(p, {"A": a.astype(np.int8), "B": b.astype(np.int8)}), a @ b)


def test_a_json_round_trip_runs_the_same():
    p = spatialc.build(spatialc.gemm(40, 50, 60), "sm_86", sites=3)
    a, b = operands(np.random.default_rng(1), 40, 50, 60, -128, 128)
    q = spatialc.from_json(spatialc.to_json(p))
    np.testing.assert_array_equal(spatialc.evaluate(q, {"A": a, "B": b}), a @ b)


def reader_k_reversed(p):
    """The reader walks K backwards: no page run is a rectangle, so the products are gathered tile by tile."""
    (item_loop,) = program_of(p, "reader").ops
    k_loop = item_loop.body[0]
    steps = p.plan.k_steps

    def backwards(read: ReadTiles) -> ReadTiles:
        k_stride = dict(read.at.steps)[LV_K]
        at = TileAddr(
            read.at.base + (steps - 1) * k_stride, tuple((v, -s if v == LV_K else s) for v, s in read.at.steps)
        )
        return dataclasses.replace(read, at=at)

    body = tuple(backwards(op) if isinstance(op, ReadTiles) else op for op in k_loop.body)
    return with_engine(p, "reader", (dataclasses.replace(item_loop, body=(dataclasses.replace(k_loop, body=body),)),))


def test_products_of_scattered_pages_are_gathered_right():
    p = reader_k_reversed(one_site(m=50, n=40, k=90, depth=2))
    a, b = operands(np.random.default_rng(10), 50, 40, 90, -128, 128)
    np.testing.assert_array_equal(spatialc.evaluate(p, {"A": a, "B": b}), a @ b)


def test_a_tile_written_twice_keeps_the_last_write():
    p = one_site()
    (item_loop,) = program_of(p, "writer").ops
    wait, write, pop = item_loop.body
    twice = with_engine(p, "writer", (dataclasses.replace(item_loop, body=(wait, write, write, pop)),))
    a, b = operands(np.random.default_rng(11), 40, 20, 100, -128, 128)
    np.testing.assert_array_equal(spatialc.evaluate(twice, {"A": a, "B": b}), a @ b)


def test_split_k_packs_the_second_half_onto_the_first():
    p = one_site(k=128)  # 8 K steps
    (item_loop,) = program_of(p, "compute").ops
    acquire, k_loop, reserve, pack, push, release = item_loop.body
    half = dataclasses.replace(k_loop, count=Const(4))
    body = (
        acquire,
        half,
        reserve,
        pack,
        release,
        acquire,
        half,
        dataclasses.replace(pack, accumulate=True),
        push,
        release,
    )
    split = with_engine(p, "compute", (dataclasses.replace(item_loop, body=body),))
    a, b = operands(np.random.default_rng(12), 40, 20, 128, -128, 128)
    np.testing.assert_array_equal(spatialc.evaluate(split, {"A": a, "B": b}), a @ b)


def test_reading_a_tensor_after_writing_it_sees_the_write():
    # After writing C, the writer copies C's tile 0 onto tile 3 through a ring of its own.
    p = one_site(m=32, n=32, k=48)
    x = BufferId(9)
    c = p.tensor_named("C").id
    copy = (
        Reserve(x),
        ReadTiles(c, TileAddr(0), 1, 1, 2, 1, x),
        Push(x),
        Wait(x),
        WriteTiles(x, c, TileAddr(3), 1, 1, 2, 1),
        Pop(x),
    )
    p = p.evolve(buffers=(*p.buffers, Buffer(x, "X", Interm(1, 1))))
    p = with_engine(p, "writer", (*program_of(p, "writer").ops, *copy))
    a, b = operands(np.random.default_rng(13), 32, 32, 48, -128, 128)
    want = a @ b
    want[16:, 16:] = want[:16, :16]
    np.testing.assert_array_equal(spatialc.evaluate(p, {"A": a, "B": b}), want)


# ---- rounding ---------------------------------------------------------------------------------------------


def rne_reference(x: float, mant_bits: int, min_exp: int, max_value: float) -> float:
    """Round-to-nearest-even of x to a binary format, in exact rational arithmetic (independent of numpy)."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    exact = Fraction(x)
    e = max(math.frexp(abs(x))[1] - 1, min_exp)
    spacing = Fraction(2) ** (e - mant_bits)
    q, rem = divmod(abs(exact), spacing)
    if rem > spacing / 2 or (rem == spacing / 2 and q % 2 == 1):
        q += 1
    value = float(q * spacing)
    if value > max_value:
        value = math.inf
    return math.copysign(value, x)


def bf16_reference(x: float) -> float:
    return rne_reference(x, 7, -126, BF16_MAX)


def fp16_reference(x: float) -> float:
    return rne_reference(x, 10, -14, 65504.0)


BF16_CASES = [
    (1 + 2**-8, 1.0),  # a tie: to the even neighbour below
    (1 + 3 * 2**-8, 1 + 2**-6),  # a tie: to the even neighbour above
    (-(1 + 3 * 2**-8), -(1 + 2**-6)),
    (1 + 2**-8 + 2**-30, 1 + 2**-7),  # through float32 this would tie and round down: no double rounding
    ((2 - 2**-8) * 2.0**127, math.inf),  # the midpoint above the largest value overflows
    ((2 - 2**-8) * 2.0**127 * (1 - 2**-50), BF16_MAX),
    (2.0**-134, 0.0),  # half the smallest subnormal: a tie, to zero
    (3 * 2.0**-134, 2.0**-132),
    (2.0**-133, 2.0**-133),
    (1e300, math.inf),
    (-1e300, -math.inf),
]

FP16_CASES = [
    (1 + 2**-11, 1.0),
    (1 + 3 * 2**-11, 1 + 2**-9),
    (1 + 2**-11 + 2**-40, 1 + 2**-10),  # via float32 this would tie and round down
    (65519.99, 65504.0),
    (65520.0, math.inf),
    (2.0**-25, 0.0),  # half the smallest subnormal
    (3 * 2.0**-25, 2.0**-23),
]


@pytest.mark.parametrize("x, want", BF16_CASES)
def test_bf16_rounds_to_nearest_even(x, want):
    got = float(round_bf16(np.array([x]))[0])
    assert got == want == bf16_reference(x)


@pytest.mark.parametrize("x, want", FP16_CASES)
def test_fp16_rounds_to_nearest_even(x, want):
    got = float(round_fp16(np.array([x]))[0])
    assert got == want == fp16_reference(x)


def test_rounding_keeps_signed_zero_inf_and_nan():
    got = round_bf16(np.array([-0.0, math.inf, -math.inf, math.nan]))
    assert math.copysign(1, got[0]) == -1 and got[1] == math.inf and got[2] == -math.inf and math.isnan(got[3])


def test_rounding_agrees_with_the_exact_reference_near_ties():
    rng = np.random.default_rng(3)
    # Values on and next to the midpoints of both formats' grids, over many binades.
    base = np.ldexp(rng.integers(2**10, 2**11, 400).astype(np.float64), rng.integers(-150, 120, 400) - 10)
    xs = np.concatenate(
        [
            base * (1 + 2.0**-8),
            base * (1 + 2.0**-11),
            np.nextafter(base * (1 + 2.0**-8), 0),
            rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300),
        ]
    )
    xs = np.concatenate([xs, -xs])
    np.testing.assert_array_equal(round_bf16(xs), [bf16_reference(x) for x in xs])
    small = xs[np.abs(xs) < 1e6]
    np.testing.assert_array_equal(round_fp16(small), [fp16_reference(x) for x in small])


# ---- flow control and deadlock ----------------------------------------------------------------------------


def one_site(m=40, n=20, k=100, **kw):
    """A one-site int8 GEMM with 1-tile pages (K steps = ceil(k / 16))."""
    kw.setdefault("depth", 3)
    return spatialc.build(spatialc.gemm(m, n, k), "sm_86", block=(1, 1, 1), sub_blocks=(1, 1), sites=1, **kw)


def with_engine(p, engine: str, ops):
    """p with one engine's program (on every site) replaced."""
    progs = tuple(dataclasses.replace(g, ops=ops) if g.engine.value == engine else g for g in p.schedule.programs)
    return p.evolve(schedule=Schedule(progs))


def program_of(p, engine: str, site: int = 0):
    return next(g for g in p.schedule.programs if g.engine.value == engine and int(g.site) == site)


def with_depth(p, name: str, depth: int):
    bufs = tuple(
        dataclasses.replace(b, kind=Fifo(depth, b.kind.page_tiles)) if b.name == name else b for b in p.buffers
    )
    return p.evolve(buffers=bufs)


def reads_two_a_pages_per_b(p):
    """The reader pushes two A pages before their two B pages; the compute engine still takes (A, B) pairs.
    So the A ring needs two pages: with one, the reader waits for space the compute engine frees only after a B
    page it is waiting for."""
    (item_loop,) = program_of(p, "reader").ops
    k_loop = item_loop.body[0]
    _, read_a, _, _, read_b, _ = k_loop.body

    def halves(read: ReadTiles, k_stride: int) -> tuple[ReadTiles, ReadTiles]:
        steps = tuple((v, s * 2 if v == LV_K else s) for v, s in read.at.steps)
        return (
            dataclasses.replace(read, at=TileAddr(read.at.base, steps)),
            dataclasses.replace(read, at=TileAddr(read.at.base + k_stride, steps)),
        )

    (a0, a1), (b0, b1) = halves(read_a, 1), halves(read_b, p.tensors[1].tiles[1])
    a, b = read_a.into, read_b.into
    body = (Reserve(a), a0, Push(a), Reserve(a), a1, Push(a), Reserve(b), b0, Push(b), Reserve(b), b1, Push(b))
    half = dataclasses.replace(k_loop, count=Const(k_loop.count.n // 2), body=body)
    return with_engine(p, "reader", (dataclasses.replace(item_loop, body=(half,)),))


def test_a_ring_one_page_too_shallow_deadlocks_and_the_error_names_each_engine():
    p = reads_two_a_pages_per_b(one_site(k=128))  # 8 K steps
    with pytest.raises(DeadlockError) as err:
        spatialc.evaluate(with_depth(p, "A_ring", 1), {"A": np.ones((40, 128)), "B": np.ones((128, 20))})
    assert set(err.value.blocked) == {
        (0, "reader", "Reserve A_ring"),
        (0, "compute", "Wait B_ring"),
        (0, "writer", "Wait C_ring"),
    }
    text = str(err.value)
    assert "site 0 reader: Reserve A_ring — A_ring: needs 1 free page(s), but 1 of 1 are held (1 published" in text
    assert "site 0 compute: Wait B_ring — B_ring: 0 of 1 pages published" in text


def test_the_same_program_with_two_pages_runs_and_is_right():
    p = reads_two_a_pages_per_b(one_site(k=128))
    a, b = operands(np.random.default_rng(2), 40, 20, 128, -128, 128)
    for depth in (2, 3):
        np.testing.assert_array_equal(spatialc.evaluate(with_depth(p, "A_ring", depth), {"A": a, "B": b}), a @ b)


def test_a_consumer_waiting_on_a_ring_its_producer_fills_only_later_deadlocks():
    p = one_site(k=160)  # 10 K steps, ring depth 3
    (item_loop,) = program_of(p, "reader").ops
    k_loop = item_loop.body[0]
    ra, rb = (dataclasses.replace(k_loop, body=k_loop.body[:3]), dataclasses.replace(k_loop, body=k_loop.body[3:]))
    broken = with_engine(p, "reader", (dataclasses.replace(item_loop, body=(ra, rb)),))  # all A, then all B
    with pytest.raises(DeadlockError) as err:
        spatialc.evaluate(broken, {"A": np.ones((40, 160)), "B": np.ones((160, 20))})
    assert (0, "reader", "Reserve A_ring") in err.value.blocked
    assert (0, "compute", "Wait B_ring") in err.value.blocked
    assert "A_ring: needs 1 free page(s), but 3 of 3 are held (3 published, 0 reserved)" in str(err.value)


def test_a_push_of_pages_never_reserved_is_a_flow_error():
    p = one_site()
    (item_loop,) = program_of(p, "reader").ops
    k_loop = item_loop.body[0]
    broken = dataclasses.replace(k_loop, body=k_loop.body[1:])  # ReadTiles and Push without the Reserve
    with pytest.raises(EvalError, match=r"site 0 reader: `ReadTiles A.*`: writes A_ring but holds no reserved"):
        spatialc.evaluate(
            with_engine(p, "reader", (dataclasses.replace(item_loop, body=(broken,)),)),
            {"A": np.ones((40, 100)), "B": np.ones((100, 20))},
        )


def test_two_engines_producing_one_ring_are_refused():
    p = one_site()
    with pytest.raises(EvalError, match="A_ring at site 0 has two producer engines, reader and writer"):
        spatialc.evaluate(
            with_engine(p, "writer", program_of(p, "reader").ops), {"A": np.ones((40, 100)), "B": np.ones((100, 20))}
        )


# ---- trace ------------------------------------------------------------------------------------------------


def test_trace_spans_and_ring_occupancy():
    # A compute engine slower than its reader (16 tile products per step against 4 + 4 tiles read) fills the
    # operand rings; at the end they drain.
    p = spatialc.build(spatialc.gemm(64, 64, 256), "sm_90", block=(4, 4, 1), sub_blocks=(1, 1), sites=1, depth=3)
    a, b = operands(np.random.default_rng(4), 64, 64, 256, -128, 128)
    c, trace = spatialc.evaluate(p, {"A": a, "B": b}, trace=True)
    np.testing.assert_array_equal(c, a @ b)
    assert trace.spans and all(s.start < s.end for s in trace.spans)
    for engine in ("reader", "compute", "writer"):
        spans = trace.engine(0, engine)
        assert all(x.end <= y.start for x, y in zip(spans, spans[1:], strict=False))  # one op at a time
    for ring in trace.rings:
        assert all(s.reserved >= 0 and s.published >= 0 and s.occupied <= ring.depth for s in ring.samples)
        assert [s.tick for s in ring.samples] == sorted(s.tick for s in ring.samples)
    a_ring = trace.ring(0, "A_ring")
    occupied = [s.occupied for s in a_ring.samples]
    assert max(occupied) == a_ring.depth == 3  # filled
    assert occupied[-1] == 0 and a_ring.samples[-1].published == 0  # drained
    # The compute engine's multiply waits for data, never the other way round once the ring is full.
    mm = [s for s in trace.engine(0, "compute") if s.op.startswith("Compute")]
    assert len(mm) == 16 and all(s.end - s.start >= 16 for s in mm)


def test_trace_ticks_follow_the_data():
    p = one_site(k=32)
    _, trace = spatialc.evaluate(p, {"A": np.ones((40, 32)), "B": np.ones((32, 20))}, trace=True)
    pushes = [s.end for s in trace.engine(0, "reader") if s.op == "Push A_ring"]
    waits = [s.end for s in trace.engine(0, "compute") if s.op == "Wait A_ring"]
    assert len(pushes) == len(waits) and all(w > p for p, w in zip(pushes, waits, strict=True))


# ---- inputs and refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"A": np.ones((4, 5))}, "needs tensor B"),
        ({"A": np.ones((4, 5)), "B": np.ones((6, 3))}, r"tensor B: expected shape \(5, 3\), got \(6, 3\)"),
        ({"A": np.ones((4, 5)), "B": np.ones((5, 3)), "bias": np.ones(3)}, "no input or parameter tensor named bias"),
        ({"A": np.full((4, 5), 0.5), "B": np.ones((5, 3))}, "A is int8 but holds values that are not whole"),
        ({"A": np.full((4, 5), 128), "B": np.ones((5, 3))}, r"A is int8 but holds values outside -128\.\.127"),
        ({"A": np.full((4, 5), "x"), "B": np.ones((5, 3))}, "tensor A: expected numbers"),
    ],
)
def test_bad_inputs_are_typed_errors(inputs, message):
    p = spatialc.build(spatialc.gemm(4, 3, 5), "sm_90")
    with pytest.raises(InputError, match=message):
        spatialc.evaluate(p, inputs)


def test_an_unscheduled_program_is_refused():
    with pytest.raises(NotReady, match="no placement and no schedule"):
        spatialc.evaluate(spatialc.gemm(4, 3, 5), {"A": np.ones((4, 5)), "B": np.ones((5, 3))})


def test_an_op_the_interpreter_does_not_run_is_refused_by_name():
    p = one_site()
    compute = program_of(p, "compute").ops
    generic = tuple(
        dataclasses.replace(
            op,
            body=tuple(
                dataclasses.replace(
                    o,
                    body=tuple(
                        dataclasses.replace(x, op=Generic("softmax")) if isinstance(x, Compute) else x for x in o.body
                    ),
                )
                if isinstance(o, Loop)
                else o
                for o in op.body
            ),
        )
        for op in compute
    )
    with pytest.raises(UnsupportedOp, match=r"site 0 compute: `Compute .*`: the interpreter does not run Generic"):
        spatialc.evaluate(with_engine(p, "compute", generic), {"A": np.ones((40, 100)), "B": np.ones((100, 20))})


def test_an_elementwise_stage_with_two_inputs_is_refused():
    p = one_site()
    compute = program_of(p, "compute").ops
    relu = tuple(
        dataclasses.replace(
            op,
            body=tuple(
                dataclasses.replace(
                    o, body=tuple(dataclasses.replace(x, op=Relu()) if isinstance(x, Compute) else x for x in o.body)
                )
                if isinstance(o, Loop)
                else o
                for o in op.body
            ),
        )
        for op in compute
    )
    said = r"`Compute relu \(A_ring, B_ring\) acc acc`: an elementwise stage reads the rings its expression names \(1\)"
    with pytest.raises(EvalError, match=said):
        spatialc.evaluate(with_engine(p, "compute", relu), {"A": np.ones((40, 100)), "B": np.ones((100, 20))})


def test_an_address_outside_the_tensor_is_refused():
    p = one_site()
    (item_loop,) = program_of(p, "reader").ops
    k_loop = item_loop.body[0]
    read = k_loop.body[1]
    far = dataclasses.replace(read, at=dataclasses.replace(read.at, base=1000))
    body = (k_loop.body[0], far, *k_loop.body[2:])
    broken = with_engine(p, "reader", (dataclasses.replace(item_loop, body=(dataclasses.replace(k_loop, body=body),)),))
    with pytest.raises(
        AddressError,
        match=r"site 0 reader: `ReadTiles A\[1000 \+ .*tiles 1000\.\.1000 of A are outside"
        r" its 3x7 tile grid",
    ):
        spatialc.evaluate(broken, {"A": np.ones((40, 100)), "B": np.ones((100, 20))})
    assert issubclass(AddressError, SpatialError)


# ---- data-dependent trips, semaphores, multicast, barriers -------------------------------------------------


def with_trip_k(p):
    """The K loops of reader and compute counted by element 0 of a parameter tensor `ktrip`."""
    tid = TensorId(9)
    trip = Trip(tid, 0, 64)
    ktrip = Tensor(tid, "ktrip", TensorRole.PARAMETER, (1, 1), (1, 1), DType.INT32)

    def retrip(op):
        if isinstance(op, Loop):
            count = trip if op.var == LV_K else op.count
            return dataclasses.replace(op, count=count, body=tuple(retrip(o) for o in op.body))
        return op

    progs = tuple(dataclasses.replace(g, ops=tuple(retrip(o) for o in g.ops)) for g in p.schedule.programs)
    return p.evolve(tensors=(*p.tensors, ktrip), schedule=Schedule(progs))


def test_a_trip_count_read_from_a_parameter_tensor():
    p = with_trip_k(one_site(k=128))  # 8 K steps
    a, b = operands(np.random.default_rng(6), 40, 20, 128, -128, 128)
    np.testing.assert_array_equal(spatialc.evaluate(p, {"A": a, "B": b, "ktrip": [[8]]}), a @ b)
    np.testing.assert_array_equal(spatialc.evaluate(p, {"A": a, "B": b, "ktrip": [[3]]}), a[:, :48] @ b[:48])
    for bad in (65, -1):
        with pytest.raises(TripError, match=f"trip count is {bad}, not a whole number in 0..64"):
            spatialc.evaluate(p, {"A": a, "B": b, "ktrip": [[bad]]})
    with pytest.raises(InputError, match="needs tensor ktrip"):
        spatialc.evaluate(p, {"A": a, "B": b})


def test_semaphores_hand_off_between_engines():
    p = one_site().evolve(semaphores=(Semaphore(SemId(0), "packed"),))
    writer = program_of(p, "writer").ops
    compute = program_of(p, "compute").ops
    (w_loop,), (c_loop,) = writer, compute
    # The compute engine counts packed items; the writer waits for each count before its Wait.
    c_body = (*c_loop.body, SemInc(SemId(0), Site(0)))
    w_body = tuple(SemWait(SemId(0), i + 1) for i in range(1)) + w_loop.body
    handoff = with_engine(
        with_engine(p, "compute", (dataclasses.replace(c_loop, body=c_body),)),
        "writer",
        (dataclasses.replace(w_loop, body=w_body),),
    )
    a, b = operands(np.random.default_rng(7), 40, 20, 100, -128, 128)
    np.testing.assert_array_equal(spatialc.evaluate(handoff, {"A": a, "B": b}), a @ b)
    stuck = with_engine(p, "writer", (SemWait(SemId(0), 1), *writer))  # nobody ever increments it
    with pytest.raises(DeadlockError, match=r"site 0 writer: SemWait sem0 >= 1 — packed at site 0 is 0"):
        spatialc.evaluate(stuck, {"A": a, "B": b})


def multicast_b(m: int = 32, k: int = 64):
    """Two sites, one item each, sharing their B strip: site 0 reads it and multicasts it to site 1, which never
    reads B. Site 1 says it has a page ready (sem `ready` on site 0); site 0 sends and sets `valid` on both."""
    p = spatialc.build(spatialc.gemm(m, 16, k), "sm_90", block=(1, 1, 1), sub_blocks=(1, 1), sites=2)
    group, ready, valid = GroupId(0), SemId(0), SemId(1)
    p = p.evolve(
        placement=dataclasses.replace(p.placement, groups=(Group(group, (Site(0), Site(1))),)),
        semaphores=(Semaphore(ready, "ready"), Semaphore(valid, "valid")),
    )
    (k_loop,) = program_of(p, "reader").ops
    ra, read_a, pa, rb, read_b, pb = k_loop.body
    sender = (
        ra,
        read_a,
        pa,
        rb,
        read_b,
        SemWait(ready, 1),
        SemSet(ready, 0),
        McastSend(rb.buf, group),
        McastSetValid(valid, group, 1),
        pb,
    )
    receiver = (ra, read_a, pa, rb, SemInc(ready, Site(0)), SemWait(valid, 1), SemSet(valid, 0), pb)
    progs = []
    for g in p.schedule.programs:
        if g.engine.value == "reader":
            g = dataclasses.replace(g, ops=(dataclasses.replace(k_loop, body=sender if g.site == 0 else receiver),))
        progs.append(g)
    return p.evolve(schedule=Schedule(tuple(progs)))


def test_multicast_feeds_a_site_that_never_reads_b():
    p = multicast_b()
    a, b = operands(np.random.default_rng(8), 32, 16, 64, -128, 128)
    np.testing.assert_array_equal(spatialc.evaluate(p, {"A": a, "B": b}), a @ b)
    _, trace = spatialc.evaluate(p, {"A": a, "B": b}, trace=True)
    sends = [s for s in trace.engine(0, "reader") if s.op.startswith("McastSend")]
    assert len(sends) == 4


def test_barriers_rendezvous_and_a_lone_barrier_deadlocks():
    p = multicast_b()
    a, b = operands(np.random.default_rng(9), 32, 16, 64, -128, 128)

    def with_barrier(sites):
        progs = tuple(
            dataclasses.replace(g, ops=(*g.ops, Barrier(GroupId(0))))
            if g.engine.value == "writer" and int(g.site) in sites
            else g
            for g in p.schedule.programs
        )
        return p.evolve(schedule=Schedule(progs))

    np.testing.assert_array_equal(spatialc.evaluate(with_barrier({0, 1}), {"A": a, "B": b}), a @ b)
    with pytest.raises(DeadlockError, match=r"site 0 writer: Barrier group0 — group 0: sites 1 have not arrived"):
        spatialc.evaluate(with_barrier({0}), {"A": a, "B": b})


def test_bf16_rounding_on_the_bits_agrees_with_rounding_by_scaling_for_every_kind_of_float64():
    from spatialc.numerics.narrow import _round_bf16_core, _round_bf16_scaled

    rng = np.random.default_rng(11)
    xs = np.concatenate(
        [
            rng.integers(0, 2**64, 200_000, dtype=np.uint64).view(np.float64),  # every exponent, NaN payloads
            rng.standard_normal(50_000) * 2.0**-130,  # bf16's subnormals, and rounding up into its normals
            (2 * np.arange(1, 50_001) + 1) * 2.0**-8,  # exact ties
            [BF16_MAX, np.nextafter(BF16_MAX, np.inf), (2 - 2**-8) * 2.0**127, np.nextafter((2 - 2**-8) * 2.0**127, 0)],
            [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308, 2.0**-126],
        ]
    )
    xs = np.concatenate([xs, -xs])
    with np.errstate(all="ignore"):
        bits, scaled = _round_bf16_core(xs), _round_bf16_scaled(xs)
    assert np.array_equal(bits, scaled, equal_nan=True)
    assert np.array_equal(np.signbit(bits), np.signbit(scaled))


def test_an_operand_read_in_place_gives_what_a_copied_one_gives_and_stays_the_callers():
    from spatialc.interp.values import Store

    p = spatialc.build(spatialc.gemm(256, 256, 256, "bf16"), "sm_90")  # whole blocks: the stores are unpadded
    rng = np.random.default_rng(5)
    a = spatialc.inputs.round_bf16(rng.standard_normal((256, 256))).astype(np.float32)
    b = spatialc.inputs.round_bf16(rng.standard_normal((256, 256))).astype(np.float32)
    kept = (a.copy(), b.copy())
    adopted = []
    real = Store.adopt
    spy = lambda self, given: adopted.append(real(self, given)) or adopted[-1]  # noqa: E731
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Store, "adopt", spy)
        c = spatialc.evaluate(p, {"A": a, "B": b})
    assert adopted == [True, True]  # both read in place, no copy
    copied = spatialc.evaluate(p, {"A": np.asfortranarray(a), "B": np.asfortranarray(b)})  # not C order: copied
    assert np.array_equal(c, copied)
    assert np.array_equal(a, kept[0]) and np.array_equal(b, kept[1]) and a.flags.writeable and b.flags.writeable


def test_fp16_inputs_are_float16_arrays_taken_as_they_are_and_rounded_once():
    from spatialc.cli.report import _normal
    from spatialc.inputs import operand_values
    from spatialc.ir.nodes import DType

    given = np.arange(-8, 8, dtype=np.float16) / 3
    assert operand_values("A", given, DType.FP16) is given  # float16 holds every fp16 value: no copy, no rounding
    made = _normal(np.random.default_rng(9), (300, 70), "A", DType.FP16)
    draws = np.random.default_rng(9).standard_normal((300, 70))
    assert made.dtype == np.float16 and np.array_equal(made.astype(np.float64), round_fp16(draws))


def test_the_ledger_counts_the_rounded_copy_of_a_float32_operand_that_is_not_bf16():
    from spatialc.interp.evaluate import memory_ledger

    p = spatialc.build(spatialc.gemm(256, 256, 256, "bf16"), "sm_90")
    rng = np.random.default_rng(0)
    raw = {k: rng.standard_normal((256, 256), dtype=np.float32) for k in "AB"}  # not bf16 values: rounded, a copy
    ledger = memory_ledger(p, inputs=raw)
    assert ledger["A as checked"] == ledger["B as checked"] == 256 * 256 * 4
    assert round_bf16(1.00390625).shape == ()  # a 0-d value stays 0-d

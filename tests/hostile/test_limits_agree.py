"""What verify accepts a saved file's reader accepts, and the other way round: the IR's list limits (ir/ops.py
MAX_OP_LIST, MAX_ADDR_STEPS) held by both; a scale's bound that the frontend and verify state alike; and the two
GELU forms named apart."""

from __future__ import annotations

import dataclasses

import pytest

import spatialc
from spatialc import lang
from spatialc.errors import ProgramError
from spatialc.ir.ops import MAX_OP_LIST, Loop, Wait
from spatialc.numerics.narrow import FLOAT32_MAX
from spatialc.passes.verify import VerifyError

STEPS = 210  # a K loop unrolled by hand: 1,260 ops in the ITEM loop's body, past the reader's first limit (1,024)


def unrolled():
    k = 64 * STEPS

    @lang.program(target="sm_90", precision="bf16", name="unrolled")
    def gemm(p, m=32, n=64, k=k):
        A, B, C = p.input("A", m, k), p.input("B", k, n), p.output("C", m, n)
        a_ring = p.ring("A_ring", depth=2, tiles=8, layout="swizzled")
        b_ring = p.ring("B_ring", depth=2, tiles=16, layout="swizzled")
        acc, c_ring = p.accumulator("acc", tiles=8), p.ring("C_ring", depth=2, tiles=8)
        p.read("read_A", A, a_ring)
        p.read("read_B", B, b_ring)
        mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4))
        p.write("write_C", c_ring, C)
        p.plan(block=(2, 4, 4), grid=(1, 1), k_tiles=k // 16, depth=2)
        p.place([[0]], kind="grouped", band=1)
        a_cols, b_cols, c_cols = k // 16, n // 16, n // 16

        @p.reader
        def read(e):
            for item in e.items():
                for kk in range(STEPS):
                    with a_ring.reserve() as page:
                        page.read(A, 2 * a_cols * item.y + 4 * kk, 2, 4)
                    with b_ring.reserve() as page:
                        page.read(B, 4 * b_cols * kk + 4 * item.x, 4, 4)

        @p.compute
        def multiply(e):
            for _ in e.items():
                acc.acquire()
                for _kk in range(STEPS):
                    a, b = a_ring.wait(), b_ring.wait()
                    acc.matmul(mm, a, b)
                    a.pop()
                    b.pop()
                with c_ring.reserve() as page:
                    acc.pack(page)
                acc.release()

        @p.writer
        def write(e):
            for item in e.items():
                with c_ring.wait() as page:
                    page.write(C, 2 * c_cols * item.y + 4 * item.x, 2, 4)

    return gemm()


def test_a_program_unrolled_by_hand_is_read_back_as_written():
    p = unrolled()
    longest = max(len(op.body) for q in p.schedule.programs for op in q.ops if isinstance(op, Loop))
    assert 1024 < longest <= MAX_OP_LIST
    again = spatialc.from_json(spatialc.to_json(p))
    assert spatialc.to_json(spatialc.verify(again)) == spatialc.to_json(p)


def test_verify_refuses_an_op_list_the_reader_would_refuse():
    p = spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90")
    q = p.schedule.programs[0]
    long = dataclasses.replace(q, ops=(*q.ops, *(Wait(q.ops[0].body[0].buf),) * MAX_OP_LIST))  # type: ignore[union-attr]
    edited = p.evolve(schedule=dataclasses.replace(p.schedule, programs=(long, *p.schedule.programs[1:])))
    with pytest.raises(VerifyError, match=f"ops; a program or loop body holds at most {MAX_OP_LIST}"):
        spatialc.verify(edited)


@pytest.mark.parametrize("scale", [3.4028235e38, 1e39])
def test_a_scale_past_float32_is_the_frontends_refusal_not_rule_1s(scale):
    with pytest.raises(ProgramError, match="scale is a finite number > 0"):
        spatialc.attention(1, 2, 64, 64, 64, scale=scale)


def test_the_largest_float32_scale_builds():
    spatialc.build(spatialc.attention(1, 2, 64, 64, 64, scale=FLOAT32_MAX))


def test_the_two_gelu_forms_are_named_apart():
    names = {
        form: spatialc.gemm(64, 64, 64, "bf16", epilogue=[spatialc.activation(form)]).name
        for form in ("gelu_tanh", "gelu_erf")
    }
    assert names["gelu_tanh"] != names["gelu_erf"] and names["gelu_erf"].endswith("gelu_erf"), names

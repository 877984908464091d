"""A W4A16 GEMM written by hand in spatialc.lang: the dequant prologue is an elementwise stage of a Dequant op
(`p.elementwise`) and the compute engine applies it page by page (`e.compute`, its rows and columns given as the
loop's and the item's tile addresses). Its engines are examples/gemm_by_hand.py's (`engines`), B read into the
ring the dequant stage empties. Verified by rule 8 and equal to the reference; the same program with the scale read
one K step late is refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc import lang
from spatialc.errors import SemanticError
from spatialc.ir.ops import Dequant, Precision, WeightFormat
from spatialc.numerics.reference import reference

from .w4_inputs import w4_inputs

M, N, K, G = 32, 64, 256, 64


def by_hand():
    """examples/gemm_by_hand.py, as a module."""
    path = Path(__file__).resolve().parents[2] / "examples" / "gemm_by_hand.py"
    spec = importlib.util.spec_from_file_location("gemm_by_hand", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def w4_gemm(late: int = 0):
    @lang.program(target="sm_90", precision="bf16", name="w4_by_hand")
    def w4(p: lang.Builder):
        A = p.input("A", M, K)
        B = p.input("B", K, N, dtype="int4")
        scale = p.parameter("scale", K // G, N, dtype="bf16")
        zeros = p.parameter("zeros", K // G, N, dtype="int4")
        C = p.output("C", M, N)
        a_ring = p.ring("A_ring", depth=2, tiles=2 * 4, layout="swizzled")
        bq_ring = p.ring("Bq_ring", depth=2, tiles=4 * 4)
        b_ring = p.ring("B_ring", depth=2, tiles=4 * 4, layout="swizzled", kind="interm")
        acc = p.accumulator("acc", tiles=2 * 4)
        c_ring = p.ring("C_ring", depth=2, tiles=2 * 4)
        op = Dequant(WeightFormat.INT4, Precision.BF16, G, scale.id, zeros.id)
        p.read("read_A", A, a_ring)
        p.read("read_B", B, bq_ring)
        dq = p.elementwise("dequant_B", op, bq_ring, b_ring)
        mm = p.matmul("matmul", a_ring, b_ring, c_ring, block=(2, 4, 4))
        p.write("write_C", c_ring, C)
        grid = (M // 32, N // 64)
        p.plan(block=(2, 4, 4), grid=grid, k_tiles=K // 16, depth=2)
        p.place([list(range(grid[0] * grid[1]))])

        def dequantize(e: lang.Engine, kk, item):
            with bq_ring.wait() as q, b_ring.reserve() as d:
                e.compute(Dequant(op.weights, op.operand, G, op.scale, op.zero, 4 * kk + late, 4 * item.x, 4), q, d)

        by_hand().engines(p, mm, A, B, C, a_ring, b_ring, acc, c_ring, n=N, k=K, b_read=bq_ring, dequant=dequantize)
        del dq

    return w4()


def test_a_hand_written_w4a16_gemm_is_verified_and_exact():
    p = w4_gemm()
    assert p.verified
    x = w4_inputs(p, seed=2)
    assert np.array_equal(spatialc.evaluate(p, x), reference(p, x))


def test_its_scale_read_one_group_late_is_refused():
    with pytest.raises(SemanticError, match=r"gets scale and zero point tile row \d+, not its own row \d+"):
        w4_gemm(late=4)

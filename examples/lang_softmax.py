"""The softmax of each row, written by hand: out = exp(x − max(x)) / Σ exp(x − max(x)), in three passes over a row.

It declares what `spatialc.build(spatialc.softmax(64, 128, "bf16"), "sm_90", block=(2, 4, 1), sites=2)` builds, op
for op (tests/lang/test_rows.py checks they are equal): each site takes a band of 2 tile rows and walks it a page of
2 × 4 tiles at a time, three times — folding each row's max into a row accumulator, then the sum of exp(x − max)
into another, then writing exp(x − max) / sum. A row reduction's accumulator is acquired (each row at its op's
identity), reduced into a page at a time, and packed into a ring as a row vector — one value a row — that the maps
after it read whole.

    python examples/lang_softmax.py      # verifies it, runs it in the interpreter against numpy
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

import spatialc
from spatialc import ew, lang


@lang.program(target="sm_90", precision="bf16", name="softmax_64x128_bf16")
def softmax(p: lang.Builder, m: int = 64, n: int = 128):
    x = p.input("x", m, n)
    out = p.output("out", m, n)
    bh, bw = 2, 4  # a band of 2 tile rows, read 4 tile columns a page
    steps, cols = n // (16 * bw), n // 16  # pages a row, tiles a row

    # Rings: x is read once a pass, each pass through a ring of its own; a row vector is one page of a tile column.
    x0 = p.ring("x0_ring", depth=2, tiles=bh * bw)
    peak = p.ring("row_max_ring", depth=1, tiles=bh, kind="interm")
    x1 = p.ring("x1_ring", depth=2, tiles=bh * bw)
    exps = p.ring("exp_ring", depth=2, tiles=bh * bw, kind="interm")
    total = p.ring("row_sum_ring", depth=1, tiles=bh, kind="interm")
    x2 = p.ring("x2_ring", depth=2, tiles=bh * bw)
    quotient = p.ring("normalise_ring", depth=2, tiles=bh * bw, kind="interm")
    max_acc = p.accumulator("row_max_acc", tiles=bh)
    sum_acc = p.accumulator("row_sum_acc", tiles=bh)

    # What the program computes: a map reads a reduction's ring as a row vector (m below: each row's max).
    p.read("read_x0", x, x0)
    row_max = p.reduce("row_max", "max", x0, peak)
    p.read("read_x1", x, x1)
    exp = p.map("exp", lambda v, m: ew.exp(v - m), [x1, peak], exps)
    row_sum = p.reduce("row_sum", "sum", exps, total)
    p.read("read_x2", x, x2)
    normalise = p.map("normalise", lambda v, m, s: ew.exp(v - m) / s, [x2, peak, total], quotient)
    p.write("write_out", quotient, out)

    # A GEMM plan read for rows: a block of bh rows by the whole row, reduced bw tiles a step; one item a band.
    p.plan(block=(bh, steps * bw, bw), grid=(m // (16 * bh), 1), k_tiles=cols, depth=2)
    p.place([[0], [1]], kind="contiguous")

    @p.reader
    def read(e: lang.Engine):
        for ring in (x0, x1, x2):  # a Python loop: three passes, unrolled
            for k in e.range(steps, "k"):
                with ring.reserve() as page:
                    page.read(x, bh * cols * e.item.y + bw * k, bh, bw)

    @p.compute
    def compute(e: lang.Engine):
        max_acc.acquire()
        for k in e.range(steps, "k"):
            with x0.wait() as page:
                max_acc.reduce(row_max, page, at=bw * k, width=bw)
        with peak.reserve() as page:
            max_acc.pack(page)
        max_acc.release()
        m = peak.wait()  # held to the end: the later passes read it
        sum_acc.acquire()
        for k in e.range(steps, "k"):
            with x1.wait() as v, exps.reserve() as page:
                e.map(exp, [v, m], page, at=bw * k, width=bw)
            with exps.wait() as page:
                sum_acc.reduce(row_sum, page, at=bw * k, width=bw)
        with total.reserve() as page:
            sum_acc.pack(page)
        sum_acc.release()
        s = total.wait()
        for k in e.range(steps, "k"):
            with x2.wait() as v, quotient.reserve() as page:
                e.map(normalise, [v, m, s], page, at=bw * k, width=bw)
        m.pop()
        s.pop()

    @p.writer
    def write(e: lang.Engine):
        for k in e.range(steps, "k"):
            with quotient.wait() as page:
                page.write(out, bh * cols * e.item.y + bw * k, bh, bw)


if __name__ == "__main__":
    program = softmax()
    rng = np.random.default_rng(0)
    x = 3 * rng.standard_normal((64, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)  # normal values are not bf16 values
        got = spatialc.evaluate(program, {"x": x})
    xb = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    want = np.exp(xb - xb.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    err = float(np.max(np.abs(got - want) / want))
    print(f"{program.name}: verified; the interpreter's softmax is numpy's within {err:.1e} (relative)")

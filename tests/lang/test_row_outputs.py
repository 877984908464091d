"""Row programs of several outputs, or of a row vector alone, written in spatialc.lang: fused add + RMSNorm (two
`p.write`s: out and residual_out) and a row absmax (an m × 1 output and nothing of the rows' shape) — equal to what
spatialc.rmsnorm(residual=True) and spatialc.row_reduce build, run by the interpreter against numpy, and printed by
`spatialc show --python` as lang source that traces back to the same program."""

from __future__ import annotations

import types
import warnings

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc import ew, lang

EPS = 1e-6
M, N = 48, 200  # 3 bands of one tile row; 13 tile columns of values, padded to 4 pages of 4


@lang.program(target="sm_90", precision="bf16", name="rmsnorm_residual_48x200_bf16")
def fused_add_rmsnorm(p: lang.Builder):
    """h = x + residual, out = h · rsqrt(Σh²/n + eps) · weight and residual_out = h: what
    `spatialc.rmsnorm(48, 200, residual=True)` builds with block=(1, 4, 1), sites=2. Each of the two passes reads x
    and residual and adds them; in the last, two maps read each page of h (waited for once, popped after both) — the
    scaling into out, and a copy into residual_out (the writer pops what it writes)."""
    x = p.input("x", M, N, tiles=(3, 16))
    residual = p.input("residual", M, N, tiles=(3, 16))
    p.parameter("weight", 1, N, tiles=(1, 16))
    out = p.output("out", M, N, tiles=(3, 16))
    residual_out = p.output("residual_out", M, N, dtype="bf16", tiles=(3, 16))

    def rings(i: int):
        """Pass i's rings: its pages of x and of residual, and of h = x + residual."""
        kept = p.ring(f"x{i}_ring", depth=2, tiles=4), p.ring(f"residual{i}_ring", depth=2, tiles=4)
        return (*kept, p.ring(f"add{i}_ring", depth=2, tiles=4, kind="interm"))

    def added(i: int):
        """Pass i's reads of x and residual, and its map h = x + residual."""
        p.read(f"read_x{i}", x, xs[i])
        p.read(f"read_residual{i}", residual, rs[i])
        return p.map(f"add{i}", lambda a, b: a + b, [xs[i], rs[i]], hs[i])

    first = rings(0)
    sumsq = p.ring("row_sumsq_ring", depth=1, tiles=1, kind="interm")
    xs, rs, hs = zip(first, rings(1), strict=True)
    scaled = p.ring("scale_ring", depth=2, tiles=4, kind="interm")
    copied = p.ring("residual_copy_ring", depth=2, tiles=4, kind="interm")
    acc = p.accumulator("row_sumsq_acc", tiles=1)
    adds = [added(0)]
    row_sumsq = p.reduce("row_sumsq", "sumsq", hs[0], sumsq)
    adds.append(added(1))
    w = ew.col("weight")
    scale = p.map("scale", lambda h, s: h * ew.rsqrt(s / float(N) + EPS) * w, [hs[1], sumsq], scaled)
    p.write("write_out", scaled, out)
    copy = p.map("residual_copy", lambda h: h, hs[1], copied)  # h's pages feed two maps
    p.write("write_residual", copied, residual_out)  # a second output: the rows' h, in x's type
    p.plan(block=(1, 16, 4), grid=(3, 1), k_tiles=16, depth=2)
    p.place([[0, 1], [2]], kind="contiguous")

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for i in range(2):  # one pass for the sum of squares, one for both outputs
                for k in e.range(4, "k"):
                    for ring, tensor in ((xs[i], x), (rs[i], residual)):
                        with ring.reserve() as page:
                            page.read(tensor, 16 * item.y + 4 * k, 1, 4)

    def add(e: lang.Engine, i: int):
        """h = x + residual for pass i's page, into add{i}_ring; x's page popped first, as the schedule pops."""
        a, b = xs[i].wait(), rs[i].wait()
        with hs[i].reserve() as page:
            e.map(adds[i], [a, b], page)
        a.pop()
        b.pop()

    @p.compute
    def compute(e: lang.Engine):
        for _ in e.items():
            acc.acquire()
            for k in e.range(4, "k"):
                add(e, 0)
                with hs[0].wait() as h:
                    acc.reduce(row_sumsq, h, at=4 * k, width=4)
            with sumsq.reserve() as page:
                acc.pack(page)
            acc.release()
            s = sumsq.wait()
            for k in e.range(4, "k"):
                add(e, 1)
                with hs[1].wait() as h:  # one page of h, read by both maps
                    with scaled.reserve() as page:
                        e.map(scale, [h, s], page, at=4 * k, width=4)
                    with copied.reserve() as page:
                        e.map(copy, h, page)
            s.pop()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            for k in e.range(4, "k"):
                for ring, tensor in ((scaled, out), (copied, residual_out)):
                    with ring.wait() as page:
                        page.write(tensor, 16 * item.y + 4 * k, 1, 4)


@lang.program(target="sm_90", precision="bf16", name="row_absmax_48x200_bf16")
def row_absmax(p: lang.Builder):
    """out[i] = max |x[i, :]| (an fp8 quantiser's per-token scale) into an m × 1 output, the program's only one: what
    `spatialc.row_reduce(48, 200, "absmax")` builds with block=(1, 4, 1), sites=2."""
    x = p.input("x", M, N, tiles=(3, 16))
    out = p.output("out", M, 1)
    pages = p.ring("x0_ring", depth=2, tiles=4)
    amax = p.ring("row_absmax_ring", depth=1, tiles=1, kind="interm")
    acc = p.accumulator("row_absmax_acc", tiles=1)
    p.read("read_x0", x, pages)
    reduced = p.reduce("row_absmax", "absmax", pages, amax)
    p.write("write_out", amax, out)  # a row vector written: one tile a band
    p.plan(block=(1, 16, 4), grid=(3, 1), k_tiles=16, depth=2)
    p.place([[0, 1], [2]], kind="contiguous")

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for k in e.range(4, "k"):
                with pages.reserve() as page:
                    page.read(x, 16 * item.y + 4 * k, 1, 4)

    @p.compute
    def compute(e: lang.Engine):
        for _ in e.items():
            acc.acquire()
            for k in e.range(4, "k"):
                with pages.wait() as page:
                    acc.reduce(reduced, page, at=4 * k, width=4)
            with amax.reserve() as page:
                acc.pack(page)
            acc.release()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with amax.wait() as page:
                page.write(out, item.y, 1, 1)


def bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float64)


def evaluated(program, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)  # normal values are not bf16 values
        got = spatialc.evaluate(program, inputs)
        ok, how = spatialc.tolerance(program).check(got, inputs)
    assert ok, how
    return got


def test_fused_add_rmsnorm_written_by_hand_is_the_built_one_and_writes_both_outputs():
    traced = fused_add_rmsnorm()
    built = spatialc.build(spatialc.rmsnorm(M, N, "bf16", eps=EPS, residual=True), "sm_90", block=(1, 4, 1), sites=2)
    assert traced.verified and traced == built
    rng = np.random.default_rng(1)
    x, r, w = rng.standard_normal((M, N)), rng.standard_normal((M, N)), rng.standard_normal(N)
    got = evaluated(traced, {"x": x, "residual": r, "weight": w})
    h = (bf16(x) + bf16(r)).astype(np.float32).astype(np.float64)
    want = h / np.sqrt((h**2).mean(axis=1, keepdims=True) + EPS) * w.astype(np.float32)
    assert sorted(got) == ["out", "residual_out"]
    assert np.allclose(got["out"], want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(got["residual_out"], bf16(h))


def test_a_row_absmax_written_by_hand_is_the_built_one_and_numpys():
    traced = row_absmax()
    built = spatialc.build(spatialc.row_reduce(M, N, "absmax", "bf16"), "sm_90", block=(1, 4, 1), sites=2)
    assert traced.verified and traced == built
    x = 3 * np.random.default_rng(2).standard_normal((M, N))
    got = evaluated(traced, {"x": x})
    assert got.shape == (M, 1) and np.array_equal(got, np.abs(bf16(x)).max(axis=1, keepdims=True))


@pytest.mark.parametrize(
    "program",
    [
        pytest.param(lambda: spatialc.rmsnorm(40, 70, "fp16", residual=True, weight=False, out="fp16"), id="fused"),
        pytest.param(lambda: spatialc.row_reduce(40, 70, "mean"), id="row-mean"),
        pytest.param(lambda: spatialc.row_reduce(100, 300, "absmax"), id="row-absmax"),
    ],
)
@pytest.mark.parametrize("form", ["general", "persistent"])
def test_show_python_prints_several_outputs_or_a_row_vector_alone_as_source_that_traces_back(
    program, form, tmp_path, capsys
):
    from spatialc.cli import main

    built = spatialc.build(program(), "sm_90", sites=2, form=form)
    saved = tmp_path / "p.json"
    saved.write_text(spatialc.to_json(built))
    assert main(["show", "--python", str(saved)]) == 0
    source = capsys.readouterr().out
    writes = sum(f'p.write("{s.name}"' in source for s in built.stages)
    assert writes == len([t for t in built.tensors if t.role.value == "output"]) and ".reduce(row_" in source
    module = types.ModuleType("shown")
    exec(compile(source, "shown.py", "exec"), module.__dict__)
    assert module.program() == built

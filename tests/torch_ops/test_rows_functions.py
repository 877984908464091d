"""spatialc.torch's rms_norm, layer_norm, softmax and log_softmax: the row programs called as torch's functions, on
x of any leading shape, bf16 / fp16 / float32, against torch's own functions (the CPU path: the interpreter); fused add
+ RMSNorm's two outputs; torch.compile(fullgraph=True) through them; bad input in one line."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402

bf16 = torch.bfloat16


def _close(got, want, dtype):
    tol = {bf16: 2e-2, torch.float16: 2e-3, torch.float32: 2e-6}[dtype]
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol), (got.float() - want.float()).abs().max()


@pytest.mark.parametrize("dtype", [bf16, torch.float16, torch.float32])
def test_rms_norm_is_torchs_over_any_leading_shape(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, generator=gen).to(dtype)
    w = (torch.rand(40, generator=gen) + 0.5).to(bf16)  # a bf16 model's weight: computed with as float32
    want = F.rms_norm(x.float(), (40,), w.float(), 1e-5).to(dtype)
    _close(sct.rms_norm(x, w, 1e-5), want, dtype)
    _close(sct.rms_norm(x, None, 1e-5), F.rms_norm(x.float(), (40,), None, 1e-5).to(dtype), dtype)


def test_a_single_row_of_one_axis_is_normalised_as_torch_does():
    x, w = torch.randn(24, generator=torch.Generator().manual_seed(5)), torch.rand(24) + 0.5
    _close(sct.rms_norm(x, w), F.rms_norm(x, (24,), w, 1e-6), torch.float32)


def test_fused_add_rms_norm_returns_the_normalised_sum_and_the_sum():
    gen = torch.Generator().manual_seed(1)
    x, r = (torch.randn(4, 5, 24, generator=gen).to(bf16) for _ in range(2))
    w = torch.rand(24, generator=gen) + 0.5
    out, h = sct.rms_norm(x, w, 1e-6, residual=r)
    s = x.float() + r.float()
    assert torch.equal(h, s.to(bf16)) and h.shape == x.shape
    _close(out, F.rms_norm(s, (24,), w, 1e-6).to(bf16), bf16)


def test_torchs_calling_form_with_the_normalised_shape_second_is_taken_as_it_is():
    """rms_norm and layer_norm stand in for F.rms_norm and F.layer_norm unchanged: the shape second (a tuple, a list,
    an int, a torch.Size, or by name), rms_norm's eps left out being torch's (float32's machine epsilon)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 32, generator=gen).to(bf16)
    w, b = torch.rand(32, generator=gen) + 0.5, torch.randn(32, generator=gen)
    mine = sct.rms_norm(x, w, 1e-5)
    for shape in ((32,), [32], 32, torch.Size([32])):
        assert torch.equal(sct.rms_norm(x, shape, w, 1e-5), mine)
    assert torch.equal(sct.rms_norm(x, normalized_shape=(32,), weight=w, eps=1e-5), mine)
    # eps left out: what torch's own gives x as it is (bf16 here), eps=None alike; rows this small (mean square
    # ~1e-6) tell float32's epsilon (2^-23) from bf16's (2^-7) and from spatialc's own default of 1e-6
    tiny = (x * 1e-3).to(bf16)
    for eps in ({}, {"eps": None}):
        _close(sct.rms_norm(tiny, (32,), w, **eps), F.rms_norm(tiny, (32,), w.to(bf16), **eps), bf16)
    assert not torch.equal(sct.rms_norm(tiny, (32,), w), sct.rms_norm(tiny, w))
    assert torch.equal(sct.layer_norm(x, (32,), w, b, 1e-5), sct.layer_norm(x, w, b, 1e-5))
    _close(sct.layer_norm(x, (32,), w, b), F.layer_norm(x.float(), (32,), w, b).to(bf16), bf16)
    assert torch.equal(sct.layer_norm(x, normalized_shape=32, bias=b), sct.layer_norm(x, None, b))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda x, w: sct.rms_norm(x, (4, 32), w),
            r"normalized_shape is \(4, 32\); .* last axis alone, so pass \(32,\)",
        ),
        (lambda x, w: sct.layer_norm(x, (16,), w), r"normalized_shape is \(16,\); .* so pass \(32,\)"),
        (lambda x, w: sct.rms_norm(x, (32,), w, 1e-5, 7), "takes x, the normalised shape, then at most weight, eps; 3"),
        (lambda x, w: sct.rms_norm(x, w, 1e-5, 7), "takes x, then at most weight, eps; 3 more arguments given"),
        (lambda x, w: sct.layer_norm(x, (32,), w, weight=w), "weight given twice, by place and by name"),
        (lambda x, w: sct.rms_norm(x, (32,), normalized_shape=(32,)), "normalized_shape given twice, by place and"),
    ],
)
def test_a_torch_form_call_the_programs_cannot_take_is_one_line(call, message):
    x, w = torch.randn(2, 32).to(bf16), torch.ones(32)
    with pytest.raises(spatialc.InputError, match=message):
        call(x, w)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_takes_torchs_dtype_the_input_cast_first_and_the_result_in_it(kind):
    mine, theirs = getattr(sct, kind), getattr(torch, kind)
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(4))
    _close(mine(x.to(bf16), -1, torch.float32), theirs(x.to(bf16), -1, dtype=torch.float32), torch.float32)
    got = mine(x, dim=-1, dtype=bf16)  # float32 x rounded to bf16 first, as torch does
    assert torch.equal(got, mine(x.to(bf16), -1))
    _close(got, theirs(x, -1, dtype=bf16), bf16)
    with pytest.raises(spatialc.InputError, match="dtype torch.bfloat16 and out_dtype torch.float16: give one"):
        mine(x, -1, bf16, out_dtype=torch.float16)
    with pytest.raises(spatialc.InputError, match="dtype is 'bf16'; pass torch.bfloat16, float16 or float32"):
        mine(x, -1, "bf16")


def test_layer_norm_and_its_stats_are_torchs():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 33, generator=gen).to(torch.float16)
    w, b = torch.randn(33, generator=gen), torch.randn(33, generator=gen)
    out, mean, rstd = sct.layer_norm(x, w, b, 1e-5, stats=True)
    _close(out, F.layer_norm(x.float(), (33,), w, b, 1e-5).to(torch.float16), torch.float16)
    want = torch.native_layer_norm(x.float(), (33,), w, b, 1e-5)
    assert torch.allclose(mean, want[1], atol=1e-6) and torch.allclose(rstd, want[2], rtol=1e-5)
    assert mean.shape == (6, 1) and mean.dtype == torch.float32


@pytest.mark.parametrize("online", [False, True])
def test_softmax_and_log_softmax_are_torchs(online):
    x = torch.randn(3, 7, 50, generator=torch.Generator().manual_seed(3)) * 4
    _close(sct.softmax(x, -1, online=online), torch.softmax(x, -1), torch.float32)
    _close(sct.log_softmax(x, 2, online=online), torch.log_softmax(x, -1), torch.float32)
    xb = x.to(bf16)
    _close(sct.softmax(xb, out_dtype=torch.float32), torch.softmax(xb.float(), -1), torch.float32)


def test_torch_compile_traces_through_them():
    def f(x, w, r):
        out, h = sct.rms_norm(x, w, 1e-6, residual=r)
        return sct.softmax(out.float()) + h.float()

    gen = torch.Generator().manual_seed(4)
    x, r = (torch.randn(2, 16, generator=gen).to(bf16) for _ in range(2))
    w = torch.rand(16, generator=gen)
    eager = f(x, w, r)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, r)  # a graph break raises
    assert torch.equal(eager, compiled)


def test_torch_compile_traces_through_torchs_calling_form():
    def f(x, w, b):
        return sct.rms_norm(x, (16,), w) + sct.layer_norm(x, torch.Size([16]), None, b, 1e-5)

    gen = torch.Generator().manual_seed(6)
    x, w, b = torch.randn(3, 16, generator=gen).to(bf16), torch.rand(16, generator=gen), torch.randn(16, generator=gen)
    assert torch.equal(f(x, w, b), torch.compile(f, fullgraph=True, backend="eager")(x, w, b))


def test_an_empty_batch_gives_empty_outputs():
    x = torch.empty(0, 8, dtype=bf16)
    assert sct.rms_norm(x, None).shape == (0, 8) and sct.softmax(x).shape == (0, 8)
    out, mean, rstd = sct.layer_norm(x, stats=True)
    assert out.shape == (0, 8) and mean.shape == (0, 1)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: sct.rms_norm([1.0, 2.0]), spatialc.InputError, "x is a list; pass a torch tensor"),
        (lambda: sct.rms_norm(torch.ones(2, 4, dtype=torch.int32)), spatialc.InputError, "pass bfloat16, float16"),
        (lambda: sct.rms_norm(torch.ones(2, 0)), spatialc.InputError, "a last axis of at least 1 value"),
        (lambda: sct.rms_norm(torch.ones(2, 4), torch.ones(5)), spatialc.InputError, r"weight is \(5\); x's rows"),
        (lambda: sct.rms_norm(torch.ones(2, 4), eps=-1), spatialc.ProgramError, "eps is a finite number ≥ 0"),
        (
            lambda: sct.rms_norm(torch.ones(2, 4), residual=torch.ones(2, 4, dtype=bf16)),
            spatialc.InputError,
            "residual is .* it is x's shape and dtype",
        ),
        (lambda: sct.softmax(torch.ones(2, 4), 0), spatialc.InputError, "dim is 0; spatialc reduces the last axis"),
        (lambda: sct.softmax(torch.ones(2, 4), out_dtype=torch.int8), spatialc.ProgramError, "out_dtype is"),
    ],
)
def test_bad_input_is_one_line(call, error, words):
    with pytest.raises(error, match=words):
        call()

"""spatialc.torch.attention: SDPA's calling convention over spatialc.attention's op — the CPU result against
torch's float32 attention of the same bf16 / fp16 inputs within the program's stated bound (causal or not, grouped
heads, odd lengths, one head), the causal mask's alignment, once per shape, torch.compile and torch.export, bad
input as one line, the error a gradient gets (no autograd yet), and the CUDA path's wiring through a numpy stand-in
for the GPU (no GPU has run it)."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402
from spatialc.errors import ProgramError  # noqa: E402
from spatialc.inputs import InputError  # noqa: E402

F = torch.nn.functional
bf16, fp16 = torch.bfloat16, torch.float16

# torch's float32 attention of the rounded inputs is itself a float32 computation: its own error, a few float32
# ulps of values of order one, is far below this and far below the bound (2^-8 or 2^-11 of |O|).
SDPA_SLACK = 1e-5


def qkv(b, h, hk, sq, skv, d, dtype=bf16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = (2 * torch.randn(b, h, sq, d, generator=gen)).to(dtype)  # scores spread, so the running max moves
    k, v = (torch.randn(b, hk, skv, d, generator=gen).to(dtype) for _ in range(2))
    return q, k, v


def lower_right(sq, skv):
    return torch.ones(sq, skv, dtype=torch.bool).tril(diagonal=skv - sq)


def torch_attention(q, k, v, mask):
    """float32 torch: SDPA's O (grouped heads by enable_gqa) and the row log-sum-exp of its scores."""
    q, k, v = q.float(), k.float(), v.float()
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    s = q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, -torch.inf)
    return o, torch.logsumexp(s, -1)


def bound(o_dtype, causal, q, k, v):
    """spatialc's bound for this call's program (the one attention built at these sizes), per element of O and
    LSE, shaped as attention returns them."""
    op = sct.attention_op("bf16" if q.dtype == bf16 else "fp16", causal=causal, out=sct._ATTENTION_OUT[o_dtype])
    g, gkv = q.shape[0] * q.shape[1], k.shape[0] * k.shape[1]
    (entry,) = [e for e in op.compiled() if e.sizes == (g, q.shape[2], k.shape[2], q.shape[3], gkv)]
    flat = {n: t.float().reshape(-1, *t.shape[2:]).numpy() for n, t in (("q", q), ("k", k), ("v", v))}
    got = spatialc.tolerance(entry.program).bound(flat)
    return torch.from_numpy(got["o"]).reshape(q.shape), torch.from_numpy(got["lse"]).reshape(q.shape[:3])


CASES = [
    # (batch, heads, kv_heads, seq_q, seq_kv, head_dim), causal, dtype, out_dtype
    ((2, 4, 4, 16, 16, 32), False, bf16, None),
    ((1, 4, 2, 17, 23, 24), True, bf16, torch.float32),  # grouped heads, odd lengths, seq_q < seq_kv
    ((2, 2, 1, 9, 9, 16), True, fp16, None),  # one KV head
    ((1, 1, 1, 5, 40, 8), False, fp16, torch.float32),  # one head in all: the op's group axis of one
]


@pytest.mark.parametrize(("shape", "causal", "dtype", "out_dtype"), CASES)
def test_cpu_result_is_torchs_float32_attention_within_the_stated_bound(shape, causal, dtype, out_dtype):
    b, h, hk, sq, skv, d = shape
    q, k, v = qkv(*shape, dtype=dtype)
    o, lse = sct.attention(q, k, v, causal=causal, out_dtype=out_dtype, return_lse=True)
    assert (o.shape, o.dtype) == ((b, h, sq, d), out_dtype or dtype)
    assert (lse.shape, lse.dtype) == ((b, h, sq), torch.float32)
    assert torch.equal(sct.attention(q, k, v, causal=causal, out_dtype=out_dtype), o)
    want_o, want_lse = torch_attention(q, k, v, lower_right(sq, skv) if causal else None)
    if causal and sq == skv:  # SDPA's own causal flag is the same mask where the lengths agree
        assert torch.allclose(F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                                              enable_gqa=True), want_o, rtol=0, atol=1e-6)  # fmt: skip
    bo, blse = bound(out_dtype or dtype, causal, q, k, v)
    err = (o.double() - want_o.double()).abs()
    assert (err <= bo + SDPA_SLACK).all(), (err - bo).max()
    assert ((lse.double() - want_lse.double()).abs() <= blse + SDPA_SLACK).all()
    assert (err / bo).max() > 0.1  # P's rounding (and O's) uses 30–60% of it: the comparison is no formality


def test_causal_is_aligned_bottom_right_not_as_sdpas_is_causal_where_lengths_differ():
    q, k, v = qkv(1, 2, 2, 6, 11, 16, seed=1)
    o = sct.attention(q, k, v, causal=True, out_dtype=torch.float32)
    bo, _ = bound(torch.float32, True, q, k, v)
    right, _ = torch_attention(q, k, v, lower_right(6, 11))
    left = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert ((o - right).abs() <= bo + SDPA_SLACK).all()
    assert ((o - left).abs() > bo + SDPA_SLACK).any()


def test_built_once_per_shape_and_one_op_per_set_of_options():
    op = sct.attention_op("bf16", causal=True, scale=0.25, out="bf16")  # the op of bf16 q, k and v: O in bf16
    assert op is sct.attention_op("bf16", causal=True, scale=0.25, out="bf16")
    assert op.name == "spatialc::attention_bf16_causal_scale_0x1_0000000000000pm2_bf16"
    assert op.schema == "(Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor)"
    q, k, v = qkv(2, 2, 1, 8, 8, 16)
    first = sct.attention(q, k, v, causal=True, scale=0.25)
    again = sct.attention(q.reshape(1, 4, 8, 16), k.reshape(1, 2, 8, 16), v.reshape(1, 2, 8, 16), causal=True,
                          scale=0.25)  # fmt: skip
    # batch folds into the heads: (2, 2) heads over (2, 1) KV heads is the program of (1, 4) over (1, 2)
    assert [e.sizes for e in op.compiled()] == [(4, 8, 8, 16, 2)]
    assert torch.equal(first.reshape(1, 4, 8, 16), again)


class SelfAttention(torch.nn.Module):
    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4).to(bf16)
        return sct.attention(q, k, v, causal=True).transpose(1, 2).reshape(b, s, dim)


def test_compiles_whole_and_equals_eager():
    torch.manual_seed(0)
    model, x = SelfAttention(), torch.randn(2, 12, 32)
    with torch.no_grad():
        eager = model(x)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)  # fullgraph: a graph break raises
    assert compiled.dtype == bf16 and torch.equal(compiled, eager)
    with torch.no_grad():  # symbolic sizes: the shape checks become guards, the op's fake shapes follow them
        torch._dynamo.reset()
        dynamic = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
        for length in (7, 20):
            y = torch.randn(2, length, 32)
            assert torch.equal(dynamic(y), model(y))


def test_torch_export_keeps_the_op():
    torch.manual_seed(0)
    model, x = SelfAttention(), torch.randn(1, 10, 32)
    with torch.no_grad():
        exported = torch.export.export(model, (x,))
        called = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
        assert [c for c in called if c.startswith("spatialc.")] == ["spatialc.attention_bf16_causal_bf16.default"]
        assert torch.equal(exported.module()(x), model(x))


def test_opcheck():
    op = sct.attention_op("fp16")
    q, k, v = qkv(1, 2, 1, 8, 12, 16, dtype=fp16)
    result = torch.library.opcheck(op._def, tuple(t.reshape(-1, *t.shape[2:]) for t in (q, k, v)))
    assert set(result.values()) == {"SUCCESS"}, result


q0, k0, v0 = qkv(1, 4, 2, 8, 8, 16)


def test_an_empty_batch_or_query_gives_an_empty_o_as_sdpa():
    # Bug: an empty batch (or no query row) was refused, where SDPA gives an empty O.
    for q, k, v in ((q0[:0], k0[:0], v0[:0]), (q0[:, :, :0], k0, v0)):
        o, lse = sct.attention(q, k, v, causal=True, out_dtype=torch.float16, return_lse=True)
        assert (o.shape, o.dtype, lse.shape, lse.dtype) == ((*q.shape,), torch.float16, (*q.shape[:3],), torch.float32)
    assert sct.attention(q0[:0], k0[:0], v0[:0]).dtype == torch.bfloat16


BAD = [
    ((q0.float(), k0, v0), {}, InputError, "q, k and v are float32, bfloat16, bfloat16; pass all three bfloat16"),
    ((q0, k0.half(), v0.half()), {}, InputError, "pass all three bfloat16 or all three float16"),
    ((q0[0], k0, v0), {}, InputError, "q is (4, 8, 16); it takes (batch, heads, seq, head_dim)"),
    ((q0, k0, v0[:, :, :4]), {}, InputError, "do not fit"),
    ((q0, k0[:, :, :, :8], v0[:, :, :, :8]), {}, InputError, "do not fit"),
    ((q0[:, :3], k0, v0), {}, InputError, "kv_heads dividing heads"),
    ((q0, k0[:, :, :5], v0[:, :, :5]), {"causal": True}, InputError, "seq_q (8) > seq_kv (5)"),
    ((q0, k0.float().numpy(), v0), {}, InputError, "k is a ndarray; pass a torch tensor"),
    ((q0[:, :0], k0[:, :0], v0[:, :0]), {}, InputError, "q is (1, 0, 8, 16), its heads 0; only batch and seq_q"),
    ((q0, k0[:, :0], v0[:, :0]), {}, InputError, "k is (1, 0, 8, 16), its kv_heads 0"),
    ((q0, k0[:, :, :0], v0[:, :, :0]), {"causal": True}, InputError, "k is (1, 2, 0, 16), its seq_kv 0"),
    ((q0, k0, v0[:, :, :0]), {}, InputError, "v is (1, 2, 0, 16), its seq_kv 0"),
    ((q0[..., :0], k0[..., :0], v0[..., :0]), {}, InputError, "q is (1, 4, 8, 0), its head_dim 0"),
    ((q0, k0, v0), {"out_dtype": torch.int8}, ProgramError, "out_dtype is torch.float32, bfloat16 or float16"),
    ((q0, k0, v0), {"scale": -1.0}, ProgramError, "scale is a finite number > 0"),
    ((q0, k0, v0), {"scale": "0.5"}, ProgramError, "scale is a finite number > 0 or None"),
    (qkv(1, 1, 1, 2, 2, 264), {}, ProgramError, "head_dim is at most 256, not 264"),
]


@pytest.mark.parametrize(("args", "options", "error", "message"), BAD)
def test_bad_input_is_one_typed_line(args, options, error, message):
    with pytest.raises(error, match=re.escape(message)) as raised:
        sct.attention(*args, **options)
    assert "\n" not in str(raised.value)


def test_a_gradient_through_it_is_a_clear_error():
    q, k, v = qkv(1, 2, 2, 8, 8, 16)
    o = sct.attention(q.requires_grad_(), k, v)  # the forward runs
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        o.float().sum().backward()


def test_the_cpu_result_is_the_interpreters():
    # what the op returns is spatialc.evaluate's result of the folded program, reshaped and nothing else
    q, k, v = qkv(2, 2, 1, 7, 9, 8)
    o, lse = sct.attention(q, k, v, out_dtype=torch.float32, return_lse=True)
    p = spatialc.build(spatialc.attention(2, 2, 7, 9, 8, kv_heads=1), "sm_90")
    got = spatialc.evaluate(p, {n: t.float().numpy() for n, t in (("q", q), ("k", k), ("v", v))})
    assert np.array_equal(o.reshape(4, 7, 8).numpy(), got["o"])
    assert np.array_equal(lse.reshape(4, 7, 1).numpy(), got["lse"])


@pytest.mark.parametrize("plant", [False, True])
@pytest.mark.parametrize("shape", [(1, 4, 2, 17, 23, 24), (1, 1, 1, 5, 40, 8)])
def test_gpu_path_gives_o_and_lse_shaped_as_the_fake_does(monkeypatch, cuda_stand_in, shape, plant):
    """The CUDA branch's wiring (SpatialOp._launch → launch_entry → run_prepared) for the grouped tensors of
    attention, with CPU tensors and a numpy device that computes the program head by head; `plant` stores O's
    heads in reverse order, which the result must show (it does only where there are two heads or more)."""
    from tests.stand_in import StandInDevice, reference_kernel

    reversed_o = (lambda outs: {**outs, "o": outs["o"][::-1]}) if plant else None  # O's heads in reverse order

    b, h, hk, sq, skv, d = shape
    op = sct.attention_op("fp16", causal=True)
    q, k, v = (t.reshape(-1, *t.shape[2:]) for t in qkv(*shape, dtype=fp16, seed=2))
    built = op._entry((b * h, sq, skv, d, b * hk), "cuda:0")
    entry = sct.Compiled(built.sizes, built.device, built.program, built.source, built.seconds)  # loaded afresh
    monkeypatch.setattr(
        sct.family,
        "_gpu_device",
        lambda: StandInDevice(spatialc.lower(entry.program), reference_kernel(entry.program, reversed_o)),
    )
    o, lse = op._launch(entry, {"q": q, "k": k, "v": v}, torch.device("cuda:0"))
    assert [(tuple(t.shape), t.dtype) for t in (o, lse)] == [
        ((b * h, sq, d), torch.float32),
        ((b * h, sq, 1), torch.float32),
    ]
    flat = {"q": q.float().numpy(), "k": k.float().numpy(), "v": v.float().numpy()}
    as_program = {
        n: t.numpy().reshape(sct._shape_of(entry.program.tensor_named(n))) for n, t in (("o", o), ("lse", lse))
    }
    ok, how = spatialc.tolerance(entry.program, kernel=True).check(as_program, flat)
    assert ok != (plant and h > 1), how

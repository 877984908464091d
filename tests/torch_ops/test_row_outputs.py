"""spatialc.torch.op of the row programs of several outputs or of a row vector alone: fused add + RMSNorm
(spatialc.rmsnorm(residual=True)) returns (out, residual_out) as vLLM's fused_add_rms_norm computes them, and
spatialc.row_reduce returns its m × 1 output — on the CPU path (the interpreter), against torch's own arithmetic."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402

bf16 = torch.bfloat16
EPS = 1e-6

FUSED = sct.op(
    lambda m, n: spatialc.rmsnorm(m, n, "bf16", eps=EPS, residual=True), "test_fused_add_rms", disk_cache=False
)


def operands(m=20, n=72, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(m, n, generator=gen).to(bf16) for _ in range(2))
    return x, r, torch.rand(n, generator=gen) + 0.5


def test_fused_add_rmsnorm_returns_out_and_residual_out_as_vllm_computes_them():
    assert FUSED.schema == "(Tensor x, Tensor residual, Tensor weight) -> (Tensor, Tensor)"
    x, r, w = operands()
    out, residual_out = FUSED(x, r, w)
    assert (out.shape, out.dtype) == ((20, 72), torch.float32)
    assert (residual_out.shape, residual_out.dtype) == ((20, 72), bf16)
    h = x.float() + r.float()  # vLLM's fused_add_rms_norm: the sum in float32, stored back in the input's type
    want = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w
    assert torch.equal(residual_out, h.to(bf16))
    [program] = [e.program for e in FUSED.compiled()]
    given = {"x": x, "residual": r, "weight": w[None]}
    ok, how = spatialc.tolerance(program).check(
        {"out": want.numpy(), "residual_out": residual_out.float().numpy()}, given
    )
    assert ok, how
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)


def test_fused_add_rmsnorm_refuses_a_residual_of_another_type_in_one_line():
    x, r, w = operands()
    with pytest.raises(spatialc.InputError, match="residual is float16; this op takes bfloat16"):
        FUSED(x, r.half(), w)


@pytest.mark.parametrize(
    ("op", "torchs"),
    [
        ("absmax", lambda x: x.abs().amax(-1, keepdim=True)),
        ("max", lambda x: x.amax(-1, keepdim=True)),
        ("sum", lambda x: x.sum(-1, keepdim=True)),
        ("mean", lambda x: x.mean(-1, keepdim=True)),
    ],
)
def test_row_reduce_returns_its_m_by_1_output_as_torch_reduces(op, torchs):
    reduce = sct.op(lambda m, n: spatialc.row_reduce(m, n, op, "bf16"), f"test_row_{op}", disk_cache=False)
    assert reduce.schema == "(Tensor x) -> Tensor" and [s.axes for s in reduce.outputs] == [("m", 1)]
    x, _, _ = operands(33, 150, seed=1)
    got = reduce(x)
    assert (got.shape, got.dtype) == ((33, 1), torch.float32)
    want = torchs(x.float())
    if op in ("absmax", "max"):
        assert torch.equal(got, want)  # a max of bf16 values is one of them: exact
    else:
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["fused", "absmax"])
def test_gpu_path_reads_back_outputs_of_two_types_or_a_row_vector_alone(monkeypatch, cuda_stand_in, which):
    """The CUDA branch's wiring (SpatialOp._launch → launch_entry → run_prepared) with CPU tensors and a numpy device
    that computes the program: residual_out comes back in bf16 beside out's float32; a row absmax's m × 1 output
    comes back alone. (No GPU has run it.)"""
    from tests.stand_in import StandInDevice, reference_kernel

    if which == "fused":
        family = sct.op(lambda m, n: spatialc.rmsnorm(m, n, "bf16", residual=True), "test_fused_gpu", disk_cache=False)
        x, r, w = operands(40, 72, seed=3)
        given = {"x": x, "residual": r, "weight": w[None]}
    else:
        family = sct.op(lambda m, n: spatialc.row_reduce(m, n, "absmax"), "test_absmax_gpu", disk_cache=False)
        x, _, _ = operands(40, 72, seed=3)
        given = {"x": x}
    entry = family._entry((40, 72), "cuda:0")
    device = StandInDevice(spatialc.lower(entry.program), reference_kernel(entry.program))
    monkeypatch.setattr(sct.family, "_gpu_device", lambda: device)
    got = family._launch(entry, given, torch.device("cuda:0"))
    if which == "fused":
        assert [(tuple(t.shape), t.dtype) for t in got] == [((40, 72), torch.float32), ((40, 72), bf16)]
        h = x.float() + r.float()
        assert torch.equal(got[1], h.to(bf16))
        ok, how = spatialc.tolerance(entry.program, kernel=True).check(
            {"out": got[0], "residual_out": got[1].float()}, given
        )
        assert ok, how
    else:
        assert (tuple(got.shape), got.dtype) == ((40, 1), torch.float32)
        assert torch.equal(got, x.float().abs().amax(-1, keepdim=True))

"""spatialc.torch.op of a program of several outputs (LayerNorm's out, mean and rstd): a tuple of tensors in the
program's order — its fake shapes, opcheck, the CPU path against torch's native_layer_norm, torch.compile, the CUDA
path's wiring (through a numpy stand-in for the GPU), and the clear error a gradient gets (the op has no autograd)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402

bf16 = torch.bfloat16

LN = sct.op(lambda m, n: spatialc.layernorm(m, n, "bf16"), "test_layernorm", disk_cache=False)


def operands(m=20, n=72, seed=0, dtype=bf16):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(m, n, generator=gen) + 1).to(dtype)
    return x, torch.rand(n, generator=gen) + 0.5, torch.randn(n, generator=gen)


def named(x, w, b):
    return {"x": x, "weight": w[None], "bias": b[None]}


def test_signature_and_fake_shapes_in_the_programs_order():
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert LN.schema == "(Tensor x, Tensor weight, Tensor bias) -> (Tensor, Tensor, Tensor)"
    assert [(s.name, s.axes, s.dtype) for s in LN.outputs] == [
        ("out", ("m", "n"), torch.float32),
        ("mean", ("m", 1), torch.float32),
        ("rstd", ("m", 1), torch.float32),
    ]
    fresh = sct.op(lambda m, n: spatialc.layernorm(m, n, "fp16", out="bf16"), "test_layernorm_fake")
    with FakeTensorMode():
        got = fresh(torch.empty(300, 100, dtype=torch.float16), torch.empty(100), torch.empty(100))
    assert [(tuple(t.shape), t.dtype) for t in got] == [
        ((300, 100), bf16),
        ((300, 1), torch.float32),
        ((300, 1), torch.float32),
    ]
    assert fresh.compiled() == []  # nothing built for a fake call


def test_cpu_results_are_the_interpreters_and_torchs_within_the_programs_tolerance():
    x, w, b = operands()
    out, mean, rstd = LN(x, w, b)
    [program] = [e.program for e in LN.compiled() if e.sizes == (20, 72)]
    want = spatialc.evaluate(program, named(x, w, b))
    assert list(want) == ["out", "mean", "rstd"]
    for name, got in zip(want, (out, mean, rstd), strict=True):
        np.testing.assert_array_equal(got.numpy(), want[name], err_msg=name)
    tol = spatialc.tolerance(program)
    ok, how = tol.check({"out": out.numpy(), "mean": mean.numpy(), "rstd": rstd.numpy()}, named(x, w, b))
    assert ok, how
    # torch's own LayerNorm of the same (bf16) values, in float32: its mean and rstd are m×1 too.
    t_out, t_mean, t_rstd = torch.ops.aten.native_layer_norm(x.float(), [72], w, b, 1e-5)
    assert t_mean.shape == mean.shape == (20, 1) and t_rstd.shape == rstd.shape == (20, 1)
    torchs = {"out": t_out.numpy(), "mean": t_mean.numpy(), "rstd": t_rstd.numpy()}
    ok, how = tol.check(torchs, named(x, w, b))
    assert ok, how
    f_out = torch.nn.functional.layer_norm(x.float(), [72], w, b, 1e-5)
    assert tol.check({**torchs, "out": f_out.numpy()}, named(x, w, b))[0]
    # the check tells the outputs apart: mean's values given as rstd's fail it
    assert not tol.check({**torchs, "rstd": t_mean.numpy()}, named(x, w, b))[0]


def test_opcheck():
    result = torch.library.opcheck(LN._def, operands(16, 40, seed=1))
    assert set(result.values()) == {"SUCCESS"}, result


def test_compiles_whole_and_equals_eager():
    def norm_then_scale(x, w, b):
        out, mean, rstd = LN(x, w, b)
        return out * rstd, mean

    args = operands(seed=2)
    eager = norm_then_scale(*args)
    torch._dynamo.reset()
    compiled = torch.compile(norm_then_scale, fullgraph=True, backend="aot_eager")(*args)
    assert all(torch.equal(c, e) for c, e in zip(compiled, eager, strict=True))


def test_a_gradient_through_it_is_a_clear_error():
    x, w, b = operands()
    out, _, _ = LN(x, w.requires_grad_(), b)
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        out.sum().backward()


def test_weight_and_bias_are_taken_1d_or_2d_and_a_scalar_is_told_both():
    x, w, b = operands()
    assert all(torch.equal(o1, o2) for o1, o2 in zip(LN(x, w, b), LN(x, w[None], b[None]), strict=True))
    with pytest.raises(spatialc.InputError) as e:
        LN(x, w, b[0])
    assert "bias has 0 dimension(s) (); it takes 1 (its columns) or 2 (one row of them)" in str(e.value)


@pytest.mark.parametrize("swap", [False, True])
def test_gpu_path_reads_each_output_back_in_order(monkeypatch, cuda_stand_in, swap):
    """The CUDA branch's wiring (SpatialOp._launch → launch_entry → run_prepared), with CPU tensors and a numpy
    device that computes the program and stores each output in its own buffer; `swap` stores mean in rstd's buffer
    and rstd in mean's, which the result shows. (No GPU has run it.)"""
    from tests.runtime.test_launch import swapped_mean_and_rstd
    from tests.stand_in import StandInDevice, reference_kernel

    op = sct.op(lambda m, n: spatialc.layernorm(m, n, "fp16"), f"test_layernorm_gpu_{swap}", disk_cache=False)
    x, w, b = operands(40, 72, seed=3, dtype=torch.float16)
    entry = op._entry((40, 72), "cuda:0")
    devices = []

    def device():
        edit = swapped_mean_and_rstd if swap else None
        devices.append(StandInDevice(spatialc.lower(entry.program), reference_kernel(entry.program, edit)))
        return devices[-1]

    monkeypatch.setattr(sct.family, "_gpu_device", device)
    got = op._launch(entry, named(x, w, b), torch.device("cuda:0"))
    assert isinstance(got, tuple) and [(tuple(t.shape), t.dtype) for t in got] == [
        ((40, 72), torch.float32),
        ((40, 1), torch.float32),
        ((40, 1), torch.float32),
    ]
    ok, how = spatialc.tolerance(entry.program, kernel=True).check(
        dict(zip(("out", "mean", "rstd"), got, strict=True)), named(x, w, b)
    )
    assert ok != swap, how

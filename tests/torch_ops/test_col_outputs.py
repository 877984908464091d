"""spatialc.torch.op of a column reduction (spatialc.col_reduce): its 1 × n output as torch's x.sum(0, keepdim=True),
x.amax(0, keepdim=True) give it — on the CPU path (the interpreter), and through the CUDA branch's wiring with a
stand-in device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402

bf16 = torch.bfloat16


def x_of(m: int, n: int, seed: int = 0):
    return torch.randn(m, n, generator=torch.Generator().manual_seed(seed)).to(bf16)


@pytest.mark.parametrize(
    ("op", "torchs"),
    [
        ("sum", lambda x: x.sum(0, keepdim=True)),
        ("max", lambda x: x.amax(0, keepdim=True)),
        ("absmax", lambda x: x.abs().amax(0, keepdim=True)),
        ("mean", lambda x: x.mean(0, keepdim=True)),
    ],
)
def test_col_reduce_returns_its_1_by_n_output_as_torch_reduces(op, torchs):
    reduce = sct.op(lambda m, n: spatialc.col_reduce(m, n, op, "bf16"), f"test_col_{op}", disk_cache=False)
    assert reduce.schema == "(Tensor x) -> Tensor" and [s.axes for s in reduce.outputs] == [(1, "n")]
    for m, n in ((33, 150), (70, 20)):  # two sizes: a program each
        x = x_of(m, n, seed=m)
        got = reduce(x)
        assert (got.shape, got.dtype) == ((1, n), torch.float32)
        want = torchs(x.float())
        if op in ("absmax", "max"):
            assert torch.equal(got, want)  # a max of bf16 values is one of them: exact
        else:
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gpu_path_reads_back_a_column_vector(monkeypatch, cuda_stand_in):
    """The CUDA branch's wiring (SpatialOp._launch → launch_entry → run_prepared) with CPU tensors and a numpy device
    that computes the program: the 1 × n output comes back alone. (No GPU has run it.)"""
    from tests.stand_in import StandInDevice, reference_kernel

    family = sct.op(lambda m, n: spatialc.col_reduce(m, n, "max"), "test_col_max_gpu", disk_cache=False)
    x = x_of(40, 72, seed=3)
    entry = family._entry((40, 72), "cuda:0")
    device = StandInDevice(spatialc.lower(entry.program), reference_kernel(entry.program))
    monkeypatch.setattr(sct.family, "_gpu_device", lambda: device)
    got = family._launch(entry, {"x": x}, torch.device("cuda:0"))
    assert (tuple(got.shape), got.dtype) == ((1, 72), torch.float32)
    assert torch.equal(got, x.float().amax(0, keepdim=True))

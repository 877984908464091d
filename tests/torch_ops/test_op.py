"""spatialc.torch.op: a program family as a torch custom op — its fake shapes, opcheck, the cache, the CPU path,
the CUDA path's wiring (through a numpy stand-in for the GPU) and one-line errors for hostile inputs."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402
from spatialc import ew  # noqa: E402
from spatialc.inputs import InputError  # noqa: E402
from spatialc.runtime import launch  # noqa: E402
from tests.stand_in import StandInDevice, product  # noqa: E402

bf16 = torch.bfloat16


def relu_layer(m, n, k):
    return spatialc.gemm(m, n, k, "bf16", epilogue=[spatialc.bias(), spatialc.relu()])


LAYER = sct.op(relu_layer, "test_op_relu_layer", disk_cache=False)
x, g = ew.inputs(2)
SWIGLU = sct.op(lambda m, n: spatialc.elementwise(ew.silu(g) * x, m, n, "bf16", names=("x", "gate")), "test_swiglu")


def operands(m=32, n=64, k=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(bf16)
    b = torch.randn(k, n, generator=gen).to(bf16)
    return a, b, torch.randn(n, generator=gen)


def test_signature_read_off_the_family():
    assert LAYER.params == ("m", "n", "k")
    assert [(s.name, s.axes, s.dtype) for s in LAYER.slots] == [
        ("A", ("m", "k"), bf16),
        ("B", ("k", "n"), bf16),
        ("bias", (1, "n"), torch.float32),
    ]
    assert LAYER.schema == "(Tensor A, Tensor B, Tensor bias) -> Tensor"
    assert torch.ops.spatialc.test_op_relu_layer.default is not None


def test_fake_gives_shapes_and_dtype_without_building():
    from torch._subclasses.fake_tensor import FakeTensorMode

    fresh = sct.op(relu_layer, "test_op_fake_only")
    with FakeTensorMode():
        a, b = torch.empty(300, 100, dtype=bf16), torch.empty(100, 200, dtype=bf16)
        c = fresh(a, b, torch.empty(200))
    assert (tuple(c.shape), c.dtype) == ((300, 200), torch.float32)
    assert fresh.compiled() == []  # nothing built for a fake call
    with FakeTensorMode():
        s = SWIGLU(torch.empty(7, 9, dtype=bf16), torch.empty(7, 9, dtype=bf16))
    assert (tuple(s.shape), s.dtype) == ((7, 9), torch.float32)


def test_cpu_result_is_the_interpreters_within_the_programs_tolerance():
    a, b, bias = operands()
    c = LAYER(a, b, bias)
    [program] = [e.program for e in LAYER.compiled() if e.sizes == (32, 64, 48)]
    np.testing.assert_array_equal(c.numpy(), spatialc.evaluate(program, {"A": a, "B": b, "bias": bias[None]}))
    ok, how = spatialc.tolerance(program).check(c.numpy(), {"A": a, "B": b, "bias": bias[None]})
    assert ok, how
    assert torch.allclose(c, torch.relu(a.float() @ b.float() + bias), atol=1e-4, rtol=1e-4)


def test_elementwise_family():
    gen = torch.Generator().manual_seed(1)
    xs, gs = (torch.randn(20, 40, generator=gen).to(bf16) for _ in range(2))
    out = SWIGLU(xs, gs)
    assert torch.allclose(out, torch.nn.functional.silu(gs.float()) * xs.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("which", ["layer", "swiglu"])
def test_opcheck(which):
    if which == "layer":
        op, args = LAYER, operands(32, 32, 16)
    else:
        op, args = SWIGLU, (torch.randn(16, 24).to(bf16), torch.randn(16, 24).to(bf16))
    result = torch.library.opcheck(op._def, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_gemm_op_with_autograd():
    op = sct.gemm_op("bf16", bias=True, activation="relu")
    a, b, bias = operands(16, 32, 16)
    args = (a.requires_grad_(), b.requires_grad_(), bias.requires_grad_())
    result = torch.library.opcheck(op._def, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_built_once_per_shape(monkeypatch, caplog):
    builds = []
    real = spatialc.api.build
    monkeypatch.setattr(spatialc.api, "build", lambda p, *a, **k: builds.append(p.name) or real(p, *a, **k))
    op = sct.op(relu_layer, "test_op_once", disk_cache=False)
    with caplog.at_level(logging.INFO, logger="spatialc.torch"):
        for _ in range(3):
            op(*operands(32, 64, 48))
        op(*operands(16, 64, 48))
    assert builds == ["gemm_32x64x48_bf16_bias_relu", "gemm_16x64x48_bf16_bias_relu"]
    assert [(e.sizes, e.device, e.source) for e in op.compiled()] == [
        ((32, 64, 48), "cpu", "built"),
        ((16, 64, 48), "cpu", "built"),
    ]
    said = [r.getMessage() for r in caplog.records if r.name == "spatialc.torch"]
    assert len(said) == 2 and "gemm_32x64x48_bf16_bias_relu 32x64x48 on cpu: built in" in said[0]


def test_disk_cache_keeps_built_programs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path))
    first = sct.op(relu_layer, "test_op_disk_first")
    c1 = first(*operands())
    [kept] = (tmp_path / "torch").glob("*.json")
    second = sct.op(relu_layer, "test_op_disk_second")
    assert torch.equal(second(*operands()), c1)
    assert [e.source for e in first.compiled()] == ["built"]
    assert [e.source for e in second.compiled()] == ["disk"]
    assert second.compiled()[0].program == first.compiled()[0].program
    kept.write_text('{"damaged": ')  # a damaged entry is built again, not trusted
    third = sct.op(relu_layer, "test_op_disk_third")
    assert torch.equal(third(*operands()), c1)
    assert [e.source for e in third.compiled()] == ["built"]


def test_gpu_path_lowers_and_loads_once_then_launches(monkeypatch):
    """The CUDA branch's wiring, with CPU tensors and a numpy device: lowered and prepared at the first call of a
    shape, launched on each, the result a torch tensor within the kernel's tolerance. (No GPU has run it.)"""
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(32, 48, generator=gen).half()
    b = torch.randn(48, 64, generator=gen).half()
    bias = torch.randn(64, generator=gen)
    program = spatialc.build(spatialc.gemm(32, 64, 48, "fp16", epilogue=[spatialc.bias()]))
    device = StandInDevice(spatialc.lower(program), product)  # a numpy GPU, counting the kernels it loads
    entry = sct.Compiled((32, 64, 48), "cuda:0", program, "built", 0.0)
    named = {"A": a, "B": b, "bias": bias[None]}
    c1 = sct.launch_entry(entry, named, device)
    c2 = sct.launch_entry(entry, named, device)
    assert device.loads == 1 and len(device.launches) == 2
    assert isinstance(entry.prepared, launch.Prepared)
    assert isinstance(c1, torch.Tensor) and c1.dtype == torch.float32 and torch.equal(c1, c2)
    ok, how = spatialc.tolerance(program, kernel=True).check(c1.numpy(), named)
    assert ok, how


def one_line(e):
    text = str(e.value)
    assert "\n" not in text and text.startswith("spatialc::"), text
    return text


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda a, b, c: (a.float(), b, c), "A is float32; this op takes bfloat16"),
        (lambda a, b, c: (a, b, c.to(bf16)), "bias is bfloat16; this op takes float32"),
        (lambda a, b, c: (a, b[:40].contiguous(), c), "B is (40, 64); at these sizes it must be (48, 64)"),
        (lambda a, b, c: (a, b, c[:10]), "bias is (1, 10); at these sizes it must be (1, 64)"),
        (lambda a, b, c: (a[0], b, c), "A has 1 dimension(s) (48); it takes 2"),
        (lambda a, b, c: (a[None], b, c), "A has 3 dimension(s)"),
        (lambda a, b, c: (a, b, c[0]), "bias has 0 dimension(s) (); it takes 1 (its columns) or 2 (one row of them)"),
        (lambda a, b, c: (a, b, c[None, None]), "bias has 3 dimension(s) (1, 1, 64); it takes 1 (its columns) or 2"),
        (lambda a, b, c: (a, b.t().contiguous().t(), c), "B is not contiguous (strides (1, 48))"),
        (lambda a, b, c: (a[:, :24].contiguous(), b, c), "B is (48, 64); at these sizes it must be (24, 64)"),
    ],
)
def test_hostile_inputs_get_one_line_input_errors(make, says):
    with pytest.raises(InputError) as e:
        LAYER(*make(*operands()))
    assert says in one_line(e)


def test_a_size_the_family_refuses_is_its_one_line_error():
    a, b, bias = operands()
    with pytest.raises(spatialc.ProgramError) as e:
        LAYER(a[:0], b, bias)
    assert "m must be a whole number" in str(e.value) and "\n" not in str(e.value)


def test_a_bias_row_is_taken_as_1d_or_2d():
    a, b, bias = operands()
    assert torch.equal(LAYER(a, b, bias), LAYER(a, b, bias[None]))


@pytest.mark.parametrize(
    ("builder", "name", "says"),
    [
        (42, "bad_callable", "takes a function from sizes to a program"),
        (lambda *sizes: spatialc.gemm(*sizes), "bad_varargs", "sizes by position"),
        (lambda m: np.zeros(m), "bad_returns", "the builder returned a ndarray"),
        (lambda m: spatialc.build(spatialc.gemm(m, m, m)).evolve(verified=False), "bad_built", "verify it first"),
        (lambda m, n: spatialc.gemm(m, m, m), "bad_unread", "size n is no axis of an input tensor"),
        (lambda m: spatialc.gemm(m, 2 * m, m), "bad_axis", "is not made of the family's sizes"),
        (relu_layer, "bad name!", "an op's name is"),
        (relu_layer, "test_op_relu_layer", "already defined in this process"),
    ],
)
def test_hostile_families_get_one_line_program_errors(builder, name, says):
    with pytest.raises(spatialc.ProgramError) as e:
        sct.op(builder, name)
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "probes",
    [((32, 64), (64, 128)), ((32, 32, 64), (64, 128, 192)), ((32, 64, 128), (32, 128, 192)), "sizes"],
)
def test_probes_that_cannot_tell_sizes_apart_are_refused(probes):
    with pytest.raises(spatialc.ProgramError, match="probes are two tuples of 3 sizes") as e:
        sct.op(relu_layer, "bad_probes", probes=probes)
    assert "\n" not in str(e.value)


def test_a_program_written_by_hand_is_a_family_with_probes_it_takes():
    """examples/gemm_by_hand.py takes multiples of its block: the default probes (33, 50, …) do not fit it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "gemm_by_hand.py"
    spec = importlib.util.spec_from_file_location("gemm_by_hand", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    op = sct.op(lambda m, n, k: module.gemm(m=m, n=n, k=k), "test_by_hand", probes=((32, 64, 128), (64, 128, 192)))
    assert op.schema == "(Tensor A, Tensor B) -> Tensor"
    a, b, _ = operands(64, 64, 128)
    c = op(a, b)
    assert [(e.sizes, e.source) for e in op.compiled()] == [((64, 64, 128), "built")]
    ok, how = spatialc.tolerance(op.compiled()[0].program).check(c.numpy(), {"A": a, "B": b})
    assert ok, how


def test_row_and_grouped_families():
    softmax = sct.op(lambda m, n: spatialc.softmax(m, n, "bf16"), "test_softmax")
    xs = torch.randn(20, 70).to(bf16)
    assert torch.allclose(softmax(xs), torch.softmax(xs.float(), -1), atol=1e-6)
    moe = sct.op(lambda g, r, n, k: spatialc.grouped_gemm(g, r, n, k, "bf16"), "test_grouped")
    assert [s.axes for s in moe.slots] == [("g", "r", "k"), ("g", "k", "n"), (1, "g")]
    a, b = torch.randn(3, 20, 32).to(bf16), torch.randn(3, 32, 16).to(bf16)
    c = moe(a, b, torch.tensor([20, 5, 0], dtype=torch.int32))
    assert c.shape == (3, 20, 16)
    assert torch.allclose(c[1, :5], a[1, :5].float() @ b[1].float(), atol=1e-4) and not c[1, 5:].any()


def test_gemm_op_refuses_what_it_cannot_compute():
    for kwargs, says in [
        ({"precision": "fp8"}, "precision is one of bf16, fp16, int8"),
        ({"activation": "softplus"}, "unknown activation 'softplus'"),
        ({"precision": "int8", "activation": "silu"}, "an int8 GEMM's epilogue is exact integer arithmetic"),
    ]:
        with pytest.raises(spatialc.ProgramError, match=says):
            sct.gemm_op(**kwargs)
    assert sct.gemm_op("bf16", bias=True) is sct.gemm_op("bf16", bias=True)


def test_int8_gemm_is_exact():
    op = sct.gemm_op("int8", bias=True, activation="relu")
    gen = torch.Generator().manual_seed(4)
    a = torch.randint(-128, 128, (20, 40), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (40, 24), dtype=torch.int8, generator=gen)
    bias = torch.randint(-1000, 1000, (24,), dtype=torch.int32, generator=gen)
    c = op(a, b, bias)
    assert c.dtype == torch.int64
    assert torch.equal(c, torch.relu(a.long() @ b.long() + bias))


def test_devices_spatialc_cannot_run_on_are_one_line_errors():
    """The device check itself (this machine has no second device to call the op with)."""
    from types import SimpleNamespace

    on = [SimpleNamespace(device=torch.device(d)) for d in ("cpu", "meta", "cpu")]
    with pytest.raises(InputError) as e:
        LAYER._device(tuple(on))
    assert "tensors on cpu and meta; pass them on one" in one_line(e)
    with pytest.raises(InputError) as e:
        LAYER._device((on[1],))
    assert "spatialc runs on cpu (its interpreter) and cuda; these are on meta" in one_line(e)
    assert LAYER._device((on[0], on[2])) == torch.device("cpu")

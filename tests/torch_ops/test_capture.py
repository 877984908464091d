"""spatialc.torch ops inside CUDA-graph capture: the first call of a shape must come before capture (a warm-up);
a captured call reads nothing back to the host (no value checks, no flag read after the launch) and takes its
memory from torch's allocator. No GPU here: the CUDA branch runs with CPU tensors and a numpy stand-in device, and
"capturing" is what the test says; a check that reads back is made to fail loudly while it is said."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spatialc  # noqa: E402
import spatialc.torch as sct  # noqa: E402
from spatialc import inputs  # noqa: E402
from spatialc.inputs import InputError  # noqa: E402
from spatialc.runtime import launch, prepared, tilize  # noqa: E402
from spatialc.runtime.tilize import LaunchError  # noqa: E402


def gemm_family(precision):
    return lambda m, n, k: spatialc.gemm(m, n, k, precision)


def stand_in(monkeypatch, op, sizes):
    """The op's entry at `sizes` and a numpy device that multiplies A and B (tests/stand_in.py's), taking torch bf16
    and fp8 as their bits, as CupyDevice.upload does."""
    from tests.stand_in import StandInDevice, product

    entry = op._entry(sizes, "cuda:0")
    device = StandInDevice(spatialc.lower(entry.program), product)
    monkeypatch.setattr(sct.family, "_gpu_device", lambda: device)
    return entry, device


HOST_READS = (
    (launch, "check_values"),
    (launch, "warn_if_rounded"),
    (launch, "check_row_counts"),
    (tilize, "_to_int"),
    (prepared.Prepared, "check"),
)


ORIGINALS = {(owner, name): getattr(owner, name) for owner, name in HOST_READS}


def watch_host_reads(monkeypatch, *, forbid):
    """Each check that reads values back to the host, counted — or, with `forbid`, made an error."""
    calls = []
    for (owner, name), original in ORIGINALS.items():

        def wrapped(*args, _name=name, _original=original, **kwargs):
            if forbid:
                raise AssertionError(f"{_name} read values back to the host inside capture")
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)
    return calls


def int8_operands(m, n, k, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8),
        torch.randint(-128, 128, (k, n), generator=gen, dtype=torch.int8),
    )


def test_the_first_call_of_a_shape_inside_capture_is_a_one_line_error(monkeypatch, cuda_stand_in):
    op = sct.op(gemm_family("int8"), "test_capture_cold", disk_cache=False)
    entry, device = stand_in(monkeypatch, op, (32, 48, 64))
    cuda_stand_in.capturing = True
    a, b = int8_operands(32, 48, 64)
    with pytest.raises(InputError) as e:
        op._launch(entry, {"A": a, "B": b}, torch.device("cuda:0"))
    text = str(e.value)
    assert "\n" not in text and "warm-up" in text and "32x48x64" in text, text
    assert device.launches == [] and entry.prepared is None


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_a_captured_call_reads_nothing_back_and_launches_as_the_warm_up_did(monkeypatch, cuda_stand_in, precision):
    """The warm-up runs every check that applies (counted); inside capture the same call, with every host read made
    an error, launches once more with the same buffers' contents and gives the same result."""
    m, n, k = 32, 48, 64
    op = sct.op(gemm_family(precision), f"test_capture_{precision}", disk_cache=False)
    entry, device = stand_in(monkeypatch, op, (m, n, k))
    if precision == "int8":
        a, b = int8_operands(m, n, k)
    else:
        gen = torch.Generator().manual_seed(7)
        a, b = torch.randn(m, k, generator=gen).bfloat16(), torch.randn(k, n, generator=gen).bfloat16()
    named = {"A": a, "B": b}
    checks = watch_host_reads(monkeypatch, forbid=False)
    warm = op._launch(entry, named, torch.device("cuda:0"))
    assert "check" in checks, checks  # a bf16 tensor for bf16 operands has nothing to check (the last test)
    assert ("check_values" in checks) == ("_to_int" in checks) == (precision == "int8"), checks
    watch_host_reads(monkeypatch, forbid=True)
    cuda_stand_in.capturing = True
    captured = op._launch(entry, named, torch.device("cuda:0"))
    assert len(device.launches) == 2
    for before, after in zip(device.launches[0][4], device.launches[1][4], strict=True):
        assert np.array_equal(before, after, equal_nan=True)
    assert torch.equal(warm, captured)
    ok, how = spatialc.tolerance(entry.program, kernel=True).check(captured.float().numpy(), named)
    assert ok, how


def test_fp8_tensors_inside_capture_go_as_their_bits_and_other_values_are_refused(monkeypatch, cuda_stand_in):
    """A torch e4m3 tensor for an e4m3 operand goes to the kernel as its own bits (nothing read back: capturable);
    float32 values for it would be rounded to e4m3 through the host (no GPU array library has fp8): refused inside
    capture by one line, converted outside it."""
    from spatialc.runtime.tilize import untilize

    op = sct.op(gemm_family("e4m3"), "test_capture_fp8", disk_cache=False)
    entry, device = stand_in(monkeypatch, op, (32, 48, 64))
    gen = torch.Generator().manual_seed(4)
    a = (torch.randn(32, 64, generator=gen) * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(64, 48, generator=gen) * 8).to(torch.float8_e4m3fn)
    op._launch(entry, {"A": a, "B": b}, torch.device("cuda:0"))  # the warm-up
    watch_host_reads(monkeypatch, forbid=True)
    cuda_stand_in.capturing = True
    op._launch(entry, {"A": a, "B": b}, torch.device("cuda:0"))
    arg_a = entry.prepared.args[0]
    for launched in device.launches:
        tiled = untilize(launched[4][0], arg_a.tiles, arg_a.elems, np, order=arg_a.order)
        assert np.array_equal(tiled, a.view(torch.uint8).numpy())
    values = {"A": a.float().numpy(), "B": b.float().numpy()}
    with pytest.raises(LaunchError) as e:
        launch.run_prepared(entry.prepared, entry.artifact, checked=False, **values)
    text = str(e.value)
    assert "\n" not in text and text.startswith("A: converting") and "CUDA-graph capture" in text, text
    watch_host_reads(monkeypatch, forbid=False)
    launch.run_prepared(entry.prepared, entry.artifact, **values)  # outside capture: converted, as before
    assert np.array_equal(device.launches[-1][4][0], device.launches[0][4][0])


def test_unchecked_int8_conversion_rounds_as_the_checked_one_and_never_reads_back():
    x = np.array([-3.5, -0.5, 0.5, 1.5, 2.5, 127.0], dtype=np.float32)
    assert np.array_equal(tilize.quantize(x, "int8", np), tilize.quantize(x, "int8", np, checked=False))
    with pytest.raises(LaunchError):
        tilize.quantize(np.array([300.0]), "int8", np)
    tilize.quantize(np.array([300.0]), "int8", np, checked=False)  # no range read: as a cast, inside a graph


def test_cupy_memory_comes_from_torch_and_is_owned_by_its_tensor():
    """The allocator handed to CuPy: torch's `empty` gives the bytes (the graph's pool inside capture), CuPy's
    pointer holds the tensor, so the block lives exactly as long as CuPy's array."""
    made = []

    def empty(size, dtype):
        made.append(torch.empty(size, dtype=dtype))
        return made[-1]

    cupy = SimpleNamespace(
        cuda=SimpleNamespace(
            UnownedMemory=lambda ptr, size, owner: SimpleNamespace(ptr=ptr, size=size, owner=owner),
            MemoryPointer=lambda mem, offset: SimpleNamespace(mem=mem, offset=offset),
        )
    )
    p = sct.family.torch_allocation(4096, empty=empty, cupy=cupy)
    assert p.offset == 0 and p.mem.size == 4096 and p.mem.owner is made[0]
    assert p.mem.ptr == made[0].data_ptr() and made[0].dtype == torch.uint8 and made[0].numel() == 4096
    zero = sct.family.torch_allocation(0, empty=empty, cupy=cupy)
    assert zero.mem.size == 0 and made[1].numel() == 1  # torch gives no address for an empty tensor


def test_a_tensor_already_of_the_operand_type_is_checked_by_nothing(monkeypatch, cuda_stand_in):
    """Outside capture too: a bf16 tensor for a bf16 operand cannot be out of range or rounded, so a call makes no
    pass over its values (each would be a kernel and a read back to the host on a GPU, every call) — while int8
    operands, whose ranges the program's types may not hold, are still checked."""
    op = sct.op(gemm_family("bf16"), "test_capture_exact", disk_cache=False)
    entry, device = stand_in(monkeypatch, op, (32, 48, 64))
    gen = torch.Generator().manual_seed(9)
    named = {"A": torch.randn(32, 64, generator=gen).bfloat16(), "B": torch.randn(64, 48, generator=gen).bfloat16()}
    calls = watch_host_reads(monkeypatch, forbid=False)
    c = op._launch(entry, named, torch.device("cuda:0"))
    assert [x for x in calls if x != "check"] == [], calls
    ok, how = spatialc.tolerance(entry.program, kernel=True).check(c.float().numpy(), named)
    assert ok, how
    monkeypatch.setattr(inputs, "_WARNED", set())  # said once a process: another test may have said it
    a32 = {"A": named["A"].float().numpy(), "B": named["B"].float().numpy()}  # float32 in: checked as before
    launch.run_with(device, spatialc.lower(entry.program), **a32)
    assert "check_values" in calls and "warn_if_rounded" in calls, calls


def test_a_kernels_workspace_is_made_when_it_is_prepared_not_first_inside_a_graph(monkeypatch, cuda_stand_in):
    """A split-K kernel's partial sums live in a workspace kept with the prepared kernel: made when it is prepared
    (the warm-up, from the model's pool), even where that call fails after preparing — never first inside capture,
    from the graph's pool, which a later eager call would outlive."""
    op = sct.op(
        lambda m, n, k: spatialc.gemm(m, n, k, "int8"), "test_capture_split", disk_cache=False, options={"split_k": 2}
    )
    entry, device = stand_in(monkeypatch, op, (32, 48, 512))
    device.sms, device.occupancy = 132, lambda kernel, block, smem: 1  # its sites wait on each other: resident
    device.launch_cooperative = device.launch
    assert any(a.role == "workspace" for a in launch.kernel_args(spatialc.lower(entry.program).launch))

    def fail(*args, **kwargs):
        raise InputError("the warm-up's inputs were refused")

    monkeypatch.setattr(launch, "run_prepared", fail)
    a, b = int8_operands(32, 48, 512)
    with pytest.raises(InputError):
        op._launch(entry, {"A": a, "B": b}, torch.device("cuda:0"))
    assert entry.prepared is not None and entry.prepared.spaces

"""Run a lowered kernel on a GPU from Python: numpy, torch or CuPy arrays in, the same library out.

Why CuPy, and nvcc to a cubin. CuPy is the smallest library that can load a cubin, set a kernel's dynamic
shared-memory limit, launch it with raw pointers and do the tilize/untilize array math on the device; torch cannot
load a module, and cuda-python would need us to pack kernel arguments by hand. The kernel text itself goes through
`nvcc -cubin` for the device's own architecture — the same compiler the compile-only tests use, and one that takes
the kernel's host headers (`<cstdio>`, `<vector>`, …) that NVRTC lacks — and the cubin is cached on disk under its
source hash. When nvcc is missing we fall back to NVRTC through CuPy, minus those host headers. Torch, when present,
only wraps inputs and results (through DLPack, without copies).

Errors: `GpuUnavailable` (no CuPy, no driver, no GPU), `LaunchError` (arguments the kernel cannot take),
`KernelBuildError` (nvcc or NVRTC refused the text); each is one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..inputs import (
    check_row_counts,
    check_values,
    host_array,
    rounding_watched,
    warn_if_rounded,
)
from . import nvcc
from .arguments import Arg, bind, kernel_args, library_of, result_library  # noqa: F401 — named here as before
from .cuda_driver import (  # noqa: F401 — named here as before: spatialc.runtime.launch.encode_tensor_map, …
    TENSOR_MAP_DTYPE,
    LaunchConfig,
    driver_library,
    encode_tensor_map,
    max_active_clusters,
)
from .cupy_device import CupyDevice, cupy_function, function_handle, needs_smem_attribute  # noqa: F401
from .discover import (  # noqa: F401 — named here as before: spatialc.runtime.launch.require_cupy, …
    INSTALL_CUPY,
    NO_DEVICE,
    GpuUnavailable,
    cuda_device_present,
    require_cupy,
)
from .nvcc import (  # the compile half, named here as before: spatialc.runtime.launch.compile_cubin, …
    KernelBuildError,
    PtxasInfo,
    check_entry_registers,
    compile_cubin,
    kernel_ptxas,
    kernel_symbol,
    parse_ptxas,
)
from .prepared import (  # noqa: F401 — named here as before: spatialc.runtime.launch.Prepared, …
    Device,
    Prepared,
    check_clusters,
    check_resident,
    not_resident,
    residency_unknown,
)
from .tilize import BYTE_ELEMS, FP8_ELEMS, LaunchError, bf16_to_float32, fp8_values, quantize, work_list
from .w4_args import HostBytes

__all__ = [
    "GpuUnavailable",
    "KernelBuildError",
    "LaunchError",
    "Prepared",
    "PtxasInfo",
    "check_entry_registers",
    "compile_cubin",
    "kernel_ptxas",
    "kernel_symbol",
    "parse_ptxas",
    "prepare",
    "run",
    "run_prepared",
    "run_with",
]


def prepare(artifact: Any, device: Any | None = None) -> Prepared:
    """Compile (or fetch from the cache) and load `artifact.kernel_cu` on `device` (default: the CuPy GPU)."""
    device = device if device is not None else cupy_device()
    args = kernel_args(artifact.launch)
    ls = artifact.launch
    arch = getattr(device, "arch", None)
    cc = arch.removeprefix("sm_").rstrip("a") if isinstance(arch, str) else ""
    if getattr(ls, "cluster", 1) > 1 and cc.isdigit() and int(cc) < 90:
        raise LaunchError(
            f"this kernel runs its multicast groups as thread-block clusters of {ls.cluster} sites, which need sm_90;"
            f" this device is {arch}"
        )
    if getattr(ls, "tensor_maps", ()) and isinstance(arch, str) and arch != "sm_90":
        raise LaunchError(
            f"this kernel was printed for sm_90a (TMA, wgmma, setmaxnreg: H100 / H200); this device is {arch}"
        )
    kernel = device.load(artifact.kernel_cu, ls.kernel_name, ls.dyn_smem)
    cubin_of = getattr(device, "cubin_of", None)  # the cubin it loaded (compiled here, or prepared), where it says
    if getattr(artifact.budget, "regs_entry", 0) and cubin_of is not None:
        # Before any launch: what ptxas gave the very cubin the device loaded (none from NVRTC: nothing to check).
        path = cubin_of(artifact.kernel_cu)
        info = None if path is None else nvcc.kernel_ptxas(path, ls.kernel_name)
        nvcc.check_entry_registers(artifact.budget, info)
    if not getattr(ls, "items", 0):  # printed before kernels took their work list as an argument
        return Prepared(device, kernel, ls, args, ls.grid)
    sms = getattr(device, "sms", None)  # the sites follow the device's multiprocessors, by the placement's rule
    grid, work = work_list(ls, sms)
    init = device.xp.asarray(ls.sync, dtype=device.xp.int32) if getattr(ls, "sync", ()) else None
    if getattr(ls, "cooperative", False):
        check_resident(device, kernel, ls, grid)
    held = check_clusters(device, kernel, ls, grid) if getattr(ls, "cluster", 1) > 1 else None
    sync = None if init is None else init.copy()
    return Prepared(device, kernel, ls, args, grid, device.xp.asarray(work), sync, init, clusters_held=held)


def run(artifact: Any, *operands: Any, **params: Any) -> Any:
    """C = the artifact's kernel on its inputs — by position in the kernel's order (A, B; a map's x0, x1, …), or by
    name — and named parameter tensors (a bias, a map's column vectors), run on the GPU.

    Inputs are converted to the operand type (round-to-nearest-even), tiled and zero-padded on the device; the
    output buffer is poisoned before the launch, so an element the kernel misses reads NaN (or the most negative
    integer). numpy in → numpy out; torch or CuPy in → the same library out (torch on the inputs' device). A kernel
    of several outputs (LayerNorm's out, mean and rstd) gives a dict name → array, as `spatialc.evaluate` does."""
    return run_with(cupy_device(), artifact, *operands, **params)


def run_with(device: Any, artifact: Any, *operands: Any, **params: Any) -> Any:
    """`run` on a given device (tests pass a numpy stand-in)."""
    bound, library = bound_operands(artifact, operands, params)
    return launch_bound(prepare(artifact, device), bound, library)


def run_prepared(prep: Prepared, artifact: Any, *operands: Any, checked: bool = True, **params: Any) -> Any:
    """`run` with the kernel `prepare(artifact, device)` loaded before: nothing is compiled or loaded again (a caller
    that launches one kernel many times, as spatialc.torch's ops do, keeps the Prepared).

    `checked=False` leaves out every check that reads values back to the host (the inputs' ranges and rounding, a
    grouped GEMM's row counts, a data-read trip count's flag after the launch): what a call inside CUDA-graph capture
    needs, where nothing may wait for the device; the launch, its copies and its allocations are the same."""
    bound, library = bound_operands(artifact, operands, params, checked=checked)
    return launch_bound(prep, bound, library, checked=checked)


def bound_operands(
    artifact: Any, operands: Sequence[Any], params: Mapping[str, Any], *, checked: bool = True
) -> tuple[list[tuple[Arg, Any]], str]:
    """The kernel's arguments paired with the caller's arrays (`bind`), a grouped GEMM's row counts checked on the
    host (unless not `checked`), and the library the result comes back in; nothing is launched or compiled."""
    args = kernel_args(artifact.launch)
    on_host = [a for a in args if a.elem in BYTE_ELEMS and a.role == "input"]
    if on_host and not checked:
        raise LaunchError(_through_host(on_host, "4-bit or e8m0 values are laid out in bytes on the host"))
    bound = bind(args, operands, params)
    limits = dict(getattr(artifact.launch, "row_counts", ()))
    if limits and checked:  # a grouped GEMM's row counts, checked on the host before anything is launched
        check_row_counts(limits, {x.name: host_array(x.name, v) for x, v in bound if x.name in limits})
    return bound, result_library(bound)


def launch_bound(prep: Prepared, bound: Sequence[tuple[Arg, Any]], library: str, *, checked: bool = True) -> Any:
    """Upload, tilize, launch once on the device's current stream, and read C back in `library`'s arrays: a kernel
    of several outputs (LayerNorm's out, mean and rstd) gives a dict name → array, in parameter order, as
    `spatialc.evaluate` and `spatialc.emulate` do. Not `checked`: no value is read back to the host (see
    `run_prepared`)."""
    buffers, outs = uploaded(prep, bound, checked=checked)
    prep.run(buffers)
    if checked:
        prep.check()
    like = [v.given if isinstance(v, HostBytes) else v for _, v in bound if v is not None]
    got = {name: _downloaded(prep, name, buf, library, like) for name, buf in outs.items()}
    return got if len(got) > 1 else next(iter(got.values()))


def uploaded(
    prep: Prepared, bound: Sequence[tuple[Arg, Any]], *, checked: bool = True
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(the kernel's arguments, its output buffers by name): the buffers in parameter order — inputs converted
    (checked unless not `checked`) and tiled on the device, 4-bit ones as the bytes made on the host, outputs
    poisoned — then the work list and sync words (`Prepared.extra`): what a launch takes (`prep.run` adds the
    tensor maps), and what a caller that times the kernel alone (bench/w4a16_rows.py) launches again and again."""
    device = prep.device
    buffers, outs = [], {}
    for arg, value in bound:
        if arg.role == "output":
            outs[arg.name] = prep.output_buffer(name=arg.name)
            buffers.append(outs[arg.name])
            continue
        if arg.role == "workspace":
            buffers.append(prep.workspaces()[arg.name])
            continue
        if isinstance(value, HostBytes):  # 4-bit weights, zero points, e8m0 scales: laid out on the host already
            buffers.append(device.upload(value.storage)[0])
            continue
        x, held = device.upload(value)
        buffers.append(prep.tiled(arg, _converted(arg, x, held, device.xp, checked)))
    return (*buffers, *prep.extra()), outs


def _downloaded(prep: Prepared, name: str, out: Any, library: str, like: Sequence[Any]) -> Any:
    """The output `name`'s logical values read back from its tiled buffer `out`, in `library`'s arrays."""
    device = prep.device
    c = prep.result(out, name)
    if prep.output_arg(name).elem != "bfloat16":
        return device.download(c, library, like)
    if library != "torch":  # numpy and CuPy have no bfloat16: its values, exactly, as float32
        return device.download(bf16_to_float32(c, device.xp), library, like)
    return device.download(c.view(device.xp.int16), library, like).view(_torch_bf16())


def _torch_bf16() -> Any:
    import torch

    return torch.bfloat16


def _converted(arg: Arg, x: Any, held: bool | str, xp: Any, checked: bool = True) -> Any:
    """`x` (on the device) checked by the rules of `spatialc.inputs` (if `checked`) and converted to `arg`'s storage
    type. `held` is what the device's upload says `x`'s bits are: True bf16's, an fp8 type's name, else False."""
    dtype = arg.spec.dtype
    fp8_in = held if isinstance(held, str) else None  # torch fp8, as its bits
    if fp8_in == arg.elem:  # the operand's own type: its bits go as they are, nothing to check or convert
        return x.view(xp.uint8)
    if not checked:
        if fp8_in or arg.elem in FP8_ELEMS:  # fp8 values read, or rounded to fp8, on the host (tilize.fp8_*)
            raise LaunchError(_through_host([arg], FP8_THROUGH_HOST))
        return quantize(x, arg.elem, xp, name=arg.name, bf16_in=held is True, checked=False)
    if fp8_in:
        x, held = fp8_values(x, fp8_in, xp), False  # their values (exact), converted as any other floats
    is_bf16 = held is True
    if _holds_its_type(arg, x, is_bf16):  # nothing can be out of range or rounded: no pass over the values
        return quantize(x, arg.elem, xp, name=arg.name, bf16_in=is_bf16)
    values = bf16_to_float32(x.view(xp.uint16), xp) if is_bf16 else x  # torch bf16 arrives as its bits
    check_values(arg.name, values, dtype, xp)
    q = quantize(x, arg.elem, xp, name=arg.name, bf16_in=is_bf16)
    if rounding_watched(dtype):
        if arg.elem in FP8_ELEMS:
            floats = fp8_values(q, arg.elem, xp)
        else:
            floats = q.astype(xp.float32) if arg.elem in ("float16", "float32") else bf16_to_float32(q, xp)
        warn_if_rounded(dtype, values, floats, xp)
    return q


FP8_THROUGH_HOST = (
    "converting values to an fp8 type goes through the host (no GPU array library has fp8; a tensor of the"
    " operand's own fp8 type goes as its bits)"
)


def _through_host(args: Sequence[Arg], why: str) -> str:
    """The one line refusing, inside CUDA-graph capture, arguments whose values must go through the host."""
    names = ", ".join(a.name for a in args)
    return f"{names}: {why}, which a call inside CUDA-graph capture cannot wait for; run it outside the graph"


def _holds_its_type(arg: Arg, x: Any, is_bf16: bool) -> bool:
    """Whether `x` already holds values of `arg`'s floating element type (torch bf16 for a bf16 operand, fp16 for
    fp16, float32 for float32): then no value can be out of its range or rounded, and a call checks none — no
    kernel and no read back to the host for what could not fail."""
    if is_bf16:
        return arg.elem == "bfloat16"
    return arg.elem in ("float16", "float32") and str(x.dtype) == arg.elem


# ---- the CuPy device ---------------------------------------------------------------------------------------


def cupy_device() -> CupyDevice:
    """The GPU through CuPy, or GpuUnavailable with the reason in one line."""
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = CupyDevice(require_cupy())
    return _DEVICE


_DEVICE: CupyDevice | None = None

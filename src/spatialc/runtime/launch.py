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

import ctypes
import hashlib
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import SpatialError
from ..inputs import (
    InputError,
    TensorSpec,
    check_row_counts,
    check_values,
    host_array,
    match_names,
    rounding_watched,
    shaped,
    warn_if_rounded,
)
from . import nvcc
from .nvcc import (  # the compile half, named here as before: spatialc.runtime.launch.compile_cubin, …
    KernelBuildError,
    PtxasInfo,
    check_entry_registers,
    compile_cubin,
    kernel_ptxas,
    kernel_symbol,
    parse_ptxas,
)
from .tilize import (
    FP8_ELEMS,
    ORDERS,
    TILE,
    LaunchError,
    bf16_to_float32,
    check_tiles,
    element_type,
    fp8_values,
    poison_value,
    quantize,
    storage_dtype,
    tensor_spec,
    tilize,
    untilize,
    work_list,
)

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


class GpuUnavailable(SpatialError, RuntimeError):
    """No GPU to run on: CuPy missing, no driver, or no device."""


# ---- what a kernel's arguments are -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arg:
    """One kernel parameter and its element / storage types."""

    name: str
    role: str
    elems: tuple[int, int]
    tiles: tuple[int, int]
    elem: str  # int8, float16, bfloat16, int64, float32, …
    storage: str  # the device array's dtype (bf16 → uint16)
    order: str = "row"  # KernelParam.order: "row" / "col" inside each tile; "rows" / "cols" a padded matrix
    groups: int = 1  # a grouped tensor's arrays are (groups, *elems)
    heads: bool = False  # an attention's Q, K or V: (batch, heads, *elems) too (KernelParam.heads)

    @property
    def spec(self) -> TensorSpec:
        """What `spatialc.inputs` checks this argument's array against."""
        return tensor_spec(self.name, self.role, self.elem, self.elems, self.groups, self.heads)


def kernel_args(launch: Any) -> list[Arg]:
    """The launch's parameters with their element types resolved, in launch order."""
    out = []
    for p in launch.params:
        if p.role not in ("input", "output", "parameter", "workspace"):
            raise LaunchError(
                f"kernel parameter {p.name} has role {p.role!r}; expected input, output, parameter or workspace"
            )
        elem = element_type(p.c_type)
        order = getattr(p, "order", "row")
        if order not in ORDERS:
            raise LaunchError(
                f"kernel parameter {p.name} has order {order!r}; expected 'row' or 'col' (tiled), 'rows' or 'cols'"
            )
        groups, heads = int(getattr(p, "groups", 1)), bool(getattr(p, "heads", False))
        out.append(Arg(p.name, p.role, tuple(p.elems), tuple(p.tiles), elem, storage_dtype(elem), order, groups, heads))
    if not any(a.role == "output" for a in out):
        raise LaunchError("the launcher runs kernels with at least one output; this one has none")
    if not any(a.role == "input" for a in out):
        raise LaunchError("the launcher runs kernels with at least one input")
    return out


def bind(args: Sequence[Arg], operands: Sequence[Any], params: Mapping[str, Any]) -> list[tuple[Arg, Any]]:
    """Pair each input/parameter Arg with the caller's array (output Args get None): `operands` are the inputs in
    the kernel's order (A, B; an MLP's X, W1, W2; a map's x0, x1, …), `params` any tensor by name. Names and shapes
    are checked with `spatialc.inputs` (InputError), without moving any array off its device."""
    inputs = [x.name for x in args if x.role == "input"]
    if len(operands) > len(inputs):
        raise InputError(
            f"{len(operands)} arrays given by position, but this kernel has {len(inputs)} input(s): {', '.join(inputs)}"
        )
    given = {name: x for name, x in zip(inputs, operands, strict=False) if x is not None}
    twice = sorted(set(given) & set(params))
    if twice:
        raise InputError(f"{', '.join(twice)} given twice: by position and by name")
    values = {**given, **params}
    match_names("this kernel", [x.spec for x in args if x.role not in ("output", "workspace")], values)
    bound: list[tuple[Arg, Any]] = []
    for x in args:
        if x.role in ("output", "workspace"):  # the launcher makes them
            bound.append((x, None))
            continue
        library_of(x.name, values[x.name])
        value = shaped(x.spec, values[x.name])
        if isinstance(value, np.ndarray) and value.dtype.kind == "V":  # ml_dtypes (float8, bfloat16): no device array
            value = host_array(x.name, value)  # library has them; their values, exactly (fp8 goes up as its bytes)
        if x.groups > 1:  # each group on its own share of the stacked grid
            check_tiles(x.name, tuple(value.shape[1:]), (x.tiles[0] // x.groups, x.tiles[1]))
        else:
            check_tiles(x.name, tuple(value.shape), x.tiles)
        bound.append((x, value))
    return bound


def library_of(name: str, x: Any) -> str:
    """`numpy`, `torch` or `cupy`: the library an argument comes from (lists and scalars count as numpy)."""
    root = type(x).__module__.split(".")[0]
    if root in ("torch", "cupy", "numpy"):
        return root
    if isinstance(x, list | tuple | int | float):
        return "numpy"
    raise InputError(f"{name} is a {type(x).__name__}; pass a numpy, torch or CuPy array")


def result_library(bound: Sequence[tuple[Arg, Any]]) -> str:
    """The library the result comes back in: the arguments' one non-numpy library, else numpy."""
    libs = {library_of(arg.name, v) for arg, v in bound if v is not None} - {"numpy"}
    if len(libs) > 1:
        raise InputError(f"arguments mix {' and '.join(sorted(libs))} arrays; pass one library's")
    return libs.pop() if libs else "numpy"


# ---- the device --------------------------------------------------------------------------------------------


class Device(Protocol):
    """What the launcher needs of a GPU; CupyDevice is the real one, tests pass a numpy stand-in."""

    xp: Any

    def upload(self, x: Any) -> tuple[Any, bool]:  # (device array, holds bf16 bits)
        ...

    def download(self, x: Any, library: str, like: Sequence[Any]) -> Any: ...

    def load(self, kernel_cu: str, kernel_name: str, dyn_smem: int) -> Any: ...

    def launch(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple[Any, ...]) -> None: ...

    # A cooperative launch (every block resident at once) goes through `launch_cooperative`, which a device that
    # runs such kernels has (CupyDevice does).


@dataclass
class Prepared:
    """A loaded kernel and its argument contract: tilize operands, poison an output, launch, read C back."""

    device: Any
    kernel: Any
    launch_spec: Any
    args: list[Arg]
    grid: int = 0  # the blocks to launch: one per site the device runs
    work: Any = None  # the work list on the device, the kernel's last argument (None: a kernel printed without one)
    sync: Any = None  # sites that hand over to each other: their sync words, set before each launch, passed last
    # … set from this copy of their initial values, made on the device once: a device-to-device copy is captured
    # into a CUDA graph as it is, where one from the host goes through a staging buffer CuPy recycles after capture.
    sync_init: Any = None
    spaces: dict[str, Any] | None = None  # each workspace tensor's device buffer (split-K's partial sums)
    encoded: dict[tuple[int, Any], Any] = field(default_factory=dict)  # tensor maps by (index, buffer address)
    clusters_held: int | None = None  # a cluster kernel's clusters the device holds at once (None: not asked)

    @property
    def xp(self) -> Any:
        return self.device.xp

    @property
    def outputs(self) -> list[Arg]:
        """The kernel's outputs in parameter order (LayerNorm's out, mean and rstd; most kernels' one C)."""
        return [a for a in self.args if a.role == "output"]

    @property
    def output(self) -> Arg:
        """The first output: a kernel of one output's C."""
        return self.outputs[0]

    def output_arg(self, name: str | None = None) -> Arg:
        """The output `name` (None: the first)."""
        if name is None:
            return self.output
        found = next((a for a in self.outputs if a.name == name), None)
        if found is None:
            raise LaunchError(f"this kernel has no output {name!r}; its outputs: {', '.join(self.output_names)}")
        return found

    @property
    def output_names(self) -> list[str]:
        return [a.name for a in self.outputs]

    def tiled(self, arg: Arg, x: Any) -> Any:
        """The device-side tiled copy of `x`, already in `arg`'s storage dtype."""
        return tilize(x, arg.tiles, self.xp, _tile(self.launch_spec), arg.order, arg.groups)

    def output_buffer(self, poison: bool = True, name: str | None = None) -> Any:
        """A tiled buffer for the output `name` (None: the first), filled with a value no result can take when
        `poison`."""
        out = self.output_arg(name)
        rt, ct = out.tiles
        tr, tc = _tile(self.launch_spec)
        buf = self.xp.empty(rt * ct * tr * tc, dtype=out.storage)
        if poison:
            buf.fill(poison_value(out.storage))
        return buf

    def output_buffers(self, poison: bool = True) -> dict[str, Any]:
        """A tiled buffer for every output, by name (`output_buffer` of each)."""
        return {a.name: self.output_buffer(poison, a.name) for a in self.outputs}

    def order(self, inputs: Sequence[Any], out: Any, params: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
        """Tiled buffers in the kernel's parameter order: `out` the output's buffer, or a dict of every output's by
        name (`output_buffers`; a kernel of several outputs takes only that)."""
        it, params, spaces = iter(inputs), params or {}, self.workspaces()
        outs = out if isinstance(out, Mapping) else None
        if outs is None and len(self.outputs) > 1:
            raise LaunchError(f"this kernel has {len(self.outputs)} outputs: pass a buffer for each, by name")
        tensors = tuple(
            (out if outs is None else outs[a.name])
            if a.role == "output"
            else next(it)
            if a.role == "input"
            else spaces[a.name]
            if a.role == "workspace"
            else params[a.name]
            for a in self.args
        )
        extra = tuple(x for x in (self.work, self.sync) if x is not None)
        return (*tensors, *extra)

    def workspaces(self) -> dict[str, Any]:
        """The workspace buffers, made (zeroed) at first use and kept: the kernel writes every element it reads."""
        if self.spaces is None:
            tr, tc = _tile(self.launch_spec)
            self.spaces = {
                a.name: self.xp.zeros(a.tiles[0] * a.tiles[1] * tr * tc, dtype=a.storage)
                for a in self.args
                if a.role == "workspace"
            }
        return self.spaces

    def run(self, args: tuple[Any, ...]) -> None:
        """Launch once (asynchronously) with buffers in parameter order; a kernel whose sites wait on each other has
        its sync words set (arrival counts to 0, semaphores to their initial values) and is launched cooperatively;
        an sm_90a kernel gets its tensor maps, encoded over these buffers, after them."""
        ls = self.launch_spec
        args = (*args, *self.tensor_maps(args))
        if self.sync is not None:
            self.xp.copyto(self.sync, self.sync_init)  # on the device: a graph's every replay resets them
        if not getattr(ls, "cooperative", False):
            self.device.launch(self.kernel, self.grid or ls.grid, ls.block, ls.dyn_smem, args)
            return
        cooperative = getattr(self.device, "launch_cooperative", None)
        if cooperative is None:
            raise LaunchError("this device cannot launch a kernel whose sites wait on each other (cooperatively)")
        try:
            cooperative(self.kernel, self.grid, ls.block, ls.dyn_smem, args)
        except Exception as e:
            if "COOPERATIVE_LAUNCH_TOO_LARGE" in str(e).upper().replace(" ", "_"):
                raise LaunchError(not_resident(self.grid, getattr(self.device, "sms", None))) from None
            raise

    def tensor_maps(self, args: tuple[Any, ...]) -> list[Any]:
        """The kernel's TMA tensor maps (`Launch.tensor_maps`) over the tensor buffers among `args`, encoded by the
        device (its `tensor_map(buffer, dims, strides, box, elem, swizzle)`), in parameter order. A map depends on
        nothing but its buffer's address, so one encoded over a device buffer is kept for later launches on it (the
        GPU check's timed loops launch on the same buffers again and again)."""
        maps = getattr(self.launch_spec, "tensor_maps", ())
        if not maps:
            return []
        encode = getattr(self.device, "tensor_map", None)
        if encode is None:
            raise LaunchError("this device cannot encode the TMA tensor maps an sm_90a kernel takes")
        out = []
        for m in maps:
            at = m.tensor  # its parameter's position
            arg = self.args[at]
            elem = self.xp.dtype(arg.storage).itemsize
            ptr = getattr(getattr(args[at], "data", None), "ptr", None)  # a CuPy buffer's device address
            key = (m.index, ptr)
            if ptr is None or key not in self.encoded:
                dims, strides, box = m.geometry(arg.tiles, elem)
                self.encoded[key] = encode(args[at], dims, strides, box, elem, m.swizzle)
            out.append(self.encoded[key])
        return out

    def check(self) -> None:
        """After a launch (it waits for it): LaunchError when a loop count read from data was beyond its bound."""
        at = getattr(self.launch_spec, "trip_error", -1)
        if self.sync is None or at < 0:
            return
        flag, count = (int(x) for x in self.sync[at : at + 2].tolist())
        if flag:
            raise LaunchError(f"a loop count read from data is {count}, beyond its bound; the loop ran no times")

    def result(self, out: Any, name: str | None = None) -> Any:
        """The logical values of the output `name`'s tiled buffer (None: the first output's; still on the device)."""
        o = self.output_arg(name)
        return untilize(out, o.tiles, o.elems, self.xp, _tile(self.launch_spec), o.order, o.groups)


def _tile(launch: Any) -> tuple[int, int]:
    return tuple(getattr(launch, "tile", TILE))  # type: ignore[return-value]


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


def check_clusters(device: Any, kernel: Any, ls: Any, grid: int) -> int | None:
    """The clusters of a cluster kernel the device holds at once (the driver's answer; None where it gives none),
    or LaunchError when the kernel launches more: its sites are placed for one wave, and the clusters past what the
    device holds would run after the others finish, a second wave that nearly doubles the time."""
    ask = getattr(device, "clusters_at_once", None)
    held = None if ask is None else ask(kernel, grid, ls.block, ls.dyn_smem)
    launched = grid // ls.cluster
    if held is not None and launched > held:
        raise LaunchError(
            f"this kernel launches {launched} thread-block clusters of {ls.cluster} sites, and this device holds"
            f" {held} at once (cuOccupancyMaxActiveClusters): the rest would wait for a second wave; build it over"
            f" sites={held * ls.cluster} (--sites {held * ls.cluster})"
        )
    return held


def check_resident(device: Any, kernel: Any, ls: Any, grid: int) -> None:
    """LaunchError unless every one of `grid` blocks of a kernel whose sites wait on each other is known to be
    resident at once. Where the device cannot say how many it holds, the launch is refused rather than risked: CUDA
    itself may refuse an oversized cooperative grid, but CuPy shrinks it (with a warning), and the sites left out
    are waited for forever."""
    if getattr(device, "launch_cooperative", None) is None:
        raise LaunchError("this device cannot launch a kernel whose sites wait on each other (cooperatively)")
    occupancy = getattr(device, "occupancy", None)  # blocks of this kernel one multiprocessor holds
    sms = getattr(device, "sms", None)
    per_sm = None if occupancy is None or sms is None else occupancy(kernel, ls.block, ls.dyn_smem)
    if per_sm is None:
        raise LaunchError(residency_unknown(grid))
    if sms * per_sm < grid:
        raise LaunchError(not_resident(grid, sms, per_sm))


def residency_unknown(sites: int) -> str:
    """Why a kernel whose sites wait on each other is not launched where the device cannot say what it holds."""
    return (
        f"the {sites} sites of this kernel wait on each other, so all must be resident at once, and this device"
        " does not say how many of its blocks it holds (no occupancy answer): refused rather than risk a hang"
    )


def not_resident(sites: int, sms: int | None, per_sm: int | None = None) -> str:
    """Why a kernel whose sites wait on each other cannot run here."""
    held = f"{sms * per_sm} ({sms} SMs x {per_sm} blocks)" if sms is not None and per_sm is not None else "fewer"
    return (
        f"the {sites} sites of this kernel wait on each other, so all must be resident at once; this device holds"
        f" {held}: place the program over fewer sites"
    )


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


def run_prepared(prep: Prepared, artifact: Any, *operands: Any, **params: Any) -> Any:
    """`run` with the kernel `prepare(artifact, device)` loaded before: nothing is compiled or loaded again (a caller
    that launches one kernel many times, as spatialc.torch's ops do, keeps the Prepared)."""
    bound, library = bound_operands(artifact, operands, params)
    return launch_bound(prep, bound, library)


def bound_operands(
    artifact: Any, operands: Sequence[Any], params: Mapping[str, Any]
) -> tuple[list[tuple[Arg, Any]], str]:
    """The kernel's arguments paired with the caller's arrays (`bind`), a grouped GEMM's row counts checked on the
    host, and the library the result comes back in; nothing is launched or compiled."""
    args = kernel_args(artifact.launch)
    bound = bind(args, operands, params)
    limits = dict(getattr(artifact.launch, "row_counts", ()))
    if limits:  # a grouped GEMM's row counts, checked on the host before anything is launched
        check_row_counts(limits, {x.name: host_array(x.name, v) for x, v in bound if x.name in limits})
    return bound, result_library(bound)


def launch_bound(prep: Prepared, bound: Sequence[tuple[Arg, Any]], library: str) -> Any:
    """Upload, tilize, launch once on the device's current stream, and read C back in `library`'s arrays: a kernel
    of several outputs (LayerNorm's out, mean and rstd) gives a dict name → array, in parameter order, as
    `spatialc.evaluate` and `spatialc.emulate` do."""
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
        x, is_bf16 = device.upload(value)
        buffers.append(prep.tiled(arg, _converted(arg, x, is_bf16, device.xp)))
    prep.run(tuple(buffers))
    prep.check()
    like = [v for _, v in bound if v is not None]
    got = {name: _downloaded(prep, name, buf, library, like) for name, buf in outs.items()}
    return got if len(got) > 1 else next(iter(got.values()))


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


def _converted(arg: Arg, x: Any, is_bf16: bool, xp: Any) -> Any:
    """`x` (on the device) checked by the rules of `spatialc.inputs` and converted to `arg`'s storage type."""
    dtype = arg.spec.dtype
    values = bf16_to_float32(x.view(xp.uint16), xp) if is_bf16 else x  # torch bf16 arrives as its bits
    check_values(arg.name, values, dtype, xp)
    q = quantize(x, arg.elem, xp, name=arg.name, bf16_in=is_bf16)
    if rounding_watched(dtype):
        if arg.elem in FP8_ELEMS:
            floats = fp8_values(q, arg.elem, xp)
        else:
            floats = q.astype(xp.float32) if arg.elem == "float16" else bf16_to_float32(q, xp)
        warn_if_rounded(dtype, values, floats, xp)
    return q


def needs_smem_attribute(dyn_smem: int) -> bool:
    """Whether to raise the kernel's dynamic shared-memory limit to `dyn_smem` before launching.

    The contract asks for it above 48 KiB (and `Launch.smem_opt_in` when static + dynamic pass 48 KiB); we set it
    for any dynamic block, which is harmless where it is not needed and covers a lowering that forgot the flag."""
    return dyn_smem > 0


# ---- the CuPy device ---------------------------------------------------------------------------------------


def cupy_device() -> CupyDevice:
    """The GPU through CuPy, or GpuUnavailable with the reason in one line."""
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = CupyDevice(require_cupy())
    return _DEVICE


_DEVICE: CupyDevice | None = None


NO_DEVICE = "no CUDA device found"  # GpuUnavailable's reason on a machine without one


# CuPy comes built for one CUDA major version: the one the driver runs, which `nvidia-smi` shows.
INSTALL_CUPY = "pip install 'spatialc[cuda12]' or 'spatialc[cuda13]', the CUDA nvidia-smi shows"


def require_cupy() -> Any:
    """The cupy module, once it has found a GPU; GpuUnavailable (one line) otherwise.

    The reason names what to fix: "no CUDA device found" on a machine without one (asked of the driver without
    CuPy, see `cuda_device_present`), and CuPy's absence or failure only where there may be a device to use."""
    try:
        import cupy
    except ImportError:
        raise _unavailable(f"CuPy is not installed ({INSTALL_CUPY})") from None
    except Exception as e:  # a broken CUDA install fails inside CuPy's import
        raise _unavailable(f"CuPy did not load ({_one_line(e)})") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise _unavailable(f"the CUDA driver did not answer ({_one_line(e)})") from None
    if count < 1:
        raise GpuUnavailable(f"no GPU: {NO_DEVICE} (the CUDA driver sees none)")
    return cupy


def _unavailable(why: str) -> GpuUnavailable:
    """GpuUnavailable: "no CUDA device found" when the probes find none, else `why` (CuPy's part of the story)."""
    present = cuda_device_present()
    if present is False:
        return GpuUnavailable(f"no GPU: {NO_DEVICE}")
    if present is None and why.startswith("CuPy is not installed"):
        return GpuUnavailable(f"no GPU: CuPy is not installed ({INSTALL_CUPY}, if this machine has a GPU)")
    return GpuUnavailable(f"no GPU: {why}")


def cuda_device_present() -> bool | None:
    """Whether this machine has a CUDA device, asked without CuPy: True as soon as one probe sees a device, False
    when a probe could look and saw none, None when none could tell (not Linux, or an answer it does not know)."""
    seen: bool | None = None
    for probe in DEVICE_PROBES:
        found = probe()
        if found:
            return True
        if found is False:
            seen = False
    return seen


NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # the NVIDIA kernel driver's folder per GPU (Linux)
NVIDIA_SMI_TIMEOUT_S = 5.0
CUDA_ERROR_NO_DEVICE = 100


def _probe_proc() -> bool | None:
    """The kernel driver's list of GPUs: a folder per device. Without the folder, no answer (not Linux, no driver
    loaded, a container that hides it); the other probes decide."""
    try:
        return any(NVIDIA_GPUS.iterdir()) if NVIDIA_GPUS.is_dir() else None
    except OSError:
        return None


def _probe_driver() -> bool | None:
    """The CUDA driver library itself: cuInit, then cuDeviceGetCount. No library: no device CUDA could use."""
    names = {"linux": ("libcuda.so.1", "libcuda.so"), "win32": ("nvcuda.dll",)}.get(sys.platform)
    if names is None:
        return None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return False
    try:
        status = lib.cuInit(0)
        if status != 0:
            return False if status == CUDA_ERROR_NO_DEVICE else None
        count = ctypes.c_int(0)
        return count.value > 0 if lib.cuDeviceGetCount(ctypes.byref(count)) == 0 else None
    except (AttributeError, OSError):
        return None


def _probe_nvidia_smi() -> bool | None:
    """`nvidia-smi -L`, where it is on PATH: a `GPU i: …` line per device; no such line (or a driver it cannot
    reach) means none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return any(line.startswith("GPU ") for line in done.stdout.splitlines())


# Cheapest first; the first that sees a device ends the search.
DEVICE_PROBES: tuple[Callable[[], bool | None], ...] = (_probe_proc, _probe_driver, _probe_nvidia_smi)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


# cuda.h's enumerators, by value (CUtensorMapDataType, …Swizzle, …L2promotion): the element size's type (the bits
# move unchanged, so an unsigned integer type of the width does), the swizzles by span, 128-byte L2 promotion.
TMA_DATA_TYPE = {1: 0, 2: 1, 4: 2, 8: 4}  # CU_TENSOR_MAP_DATA_TYPE_UINT8, _UINT16, _UINT32, _UINT64: by element size
TMA_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # a span in bytes → CU_TENSOR_MAP_SWIZZLE_NONE, _32B, _64B, _128B
TMA_L2_128B = 2
TENSOR_MAP_DTYPE = np.dtype([("opaque", np.uint64, (16,))], align=True)  # 128 bytes


class LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig: a 1-D grid of 1-D blocks on the default stream, no launch attributes (a cluster
    kernel's size comes from its own __cluster_dims__)."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("numAttrs", ctypes.c_uint),
    ]


def max_active_clusters(lib: Any, function: int, grid: int, block: int, dyn_smem: int) -> int | None:
    """cuOccupancyMaxActiveClusters through `lib` (libcuda or a stand-in): how many clusters of the kernel
    `function` (a CUfunction) the device holds at once; None where the driver refuses to say."""
    count = ctypes.c_int(0)
    config = LaunchConfig(grid, 1, 1, block, 1, 1, dyn_smem, None, None, 0)
    code = lib.cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(function), ctypes.byref(config))
    return int(count.value) if code == 0 else None


def driver_library() -> Any:
    """libcuda, where cuTensorMapEncodeTiled lives (the CUDA runtime CuPy loads has no binding for it)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GpuUnavailable(f"the CUDA driver library could not be loaded ({e})") from None


def encode_tensor_map(
    lib: Any, address: int, dims: Sequence[int], strides: Sequence[int], box: Sequence[int], elem: int, swizzle: int
) -> Any:
    """cuTensorMapEncodeTiled through `lib` (libcuda or a stand-in): the map as a structured scalar, or
    LaunchError with the driver's code."""
    rank = len(dims)
    raw = np.zeros(32, dtype=np.uint64)  # room to place the 128-byte map on the 64 bytes the driver requires
    start = (-raw.ctypes.data % 64) // 8
    out = raw[start : start + 16]
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    code = lib.cuTensorMapEncodeTiled(
        ctypes.c_void_p(out.ctypes.data),
        ctypes.c_int(TMA_DATA_TYPE[elem]),
        u32(rank),
        ctypes.c_void_p(address),
        (u64 * rank)(*dims),
        (u64 * (rank - 1))(*strides),
        (u32 * rank)(*box),
        (u32 * rank)(*([1] * rank)),
        ctypes.c_int(0),  # CU_TENSOR_MAP_INTERLEAVE_NONE
        ctypes.c_int(TMA_SWIZZLE[swizzle]),
        ctypes.c_int(TMA_L2_128B),
        ctypes.c_int(0),  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
    )
    if code != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled refused a tensor map (CUresult {code}): dims {tuple(dims)}")
    return np.frombuffer(out.tobytes(), dtype=TENSOR_MAP_DTYPE)[0]


# The start of the warning CuPy gives (cupy/cuda/function.pyx, _launch) when it cuts a cooperative grid to what it
# counts as resident instead of refusing it.
CUPY_SHRINKS = "The grid size will be reduced"


def cupy_function(kernel: Any) -> Any:
    """The cupy.cuda.Function behind a kernel CuPy loaded: a RawModule's get_function gives a RawKernel, whose call
    passes its own `enable_cooperative_groups` (False unless the module was made with it), so a cooperative launch
    must go to the Function underneath, which takes the flag per call."""
    return getattr(kernel, "kernel", kernel)


def function_handle(kernel: Any) -> int:
    """The CUfunction of a kernel CuPy loaded: a Function's `ptr`, or that of a RawKernel's `kernel` (a RawModule's
    get_function gives the latter), which the driver's occupancy questions take."""
    ptr = getattr(kernel, "ptr", None)
    if ptr is None:
        ptr = kernel.kernel.ptr
    return int(ptr)


class CupyDevice:
    """The current CUDA device, driven through CuPy."""

    def __init__(self, cupy: Any):
        self.cp = cupy
        self.xp = cupy
        self._kernels: dict[tuple[int, str], Any] = {}

    @property
    def sms(self) -> int:
        """The device's multiprocessors: the sites a kernel that follows the device runs are as many blocks as fit."""
        return int(self.cp.cuda.Device().attributes["MultiProcessorCount"])

    @property
    def arch(self) -> str:
        return f"sm_{self.cp.cuda.Device().compute_capability}"

    def upload(self, x: Any) -> tuple[Any, bool]:
        """A CuPy view or copy of `x` on the device; torch bf16 comes as its bits."""
        root = type(x).__module__.split(".")[0]
        if root == "cupy":
            return x, False
        if root == "torch":
            import torch

            t = x.detach()
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # no DLPack or numpy type: their values, exactly
                t = t.float()
            is_bf16 = t.dtype == torch.bfloat16
            if is_bf16:
                t = t.view(torch.int16)
            if t.device.type != "cuda":
                return self.cp.asarray(t.cpu().numpy()), is_bf16
            return self.cp.from_dlpack(t.contiguous()), is_bf16
        return self.cp.asarray(x), False

    def download(self, x: Any, library: str, like: Sequence[Any]) -> Any:
        """`x` as an array of `library`: numpy copies to the host, torch wraps by DLPack (on the inputs' device)."""
        if library == "cupy":
            return x
        if library == "numpy":
            return self.cp.asnumpy(x)
        import torch

        t = torch.from_dlpack(x)
        devices = {v.device for v in like if type(v).__module__.split(".")[0] == "torch"}
        if devices and all(d.type != "cuda" for d in devices):
            t = t.cpu()
        return t

    def load(self, kernel_cu: str, kernel_name: str, dyn_smem: int) -> Any:
        """The launchable kernel of `kernel_cu`, compiled once per source text and device."""
        dev = self.cp.cuda.runtime.getDevice()
        key = (dev, hashlib.sha256(kernel_cu.encode()).hexdigest())
        if key not in self._kernels:
            kernel = self._compile(kernel_cu, kernel_name)
            if needs_smem_attribute(dyn_smem):
                kernel.max_dynamic_shared_size_bytes = dyn_smem
            self._kernels[key] = kernel
        return self._kernels[key]

    def _arch_of(self, kernel_cu: str) -> str:
        """The target a kernel text builds for here: the sm_90a form's (TMA tensor maps, wgmma) for the
        architecture-specific one only."""
        return self.arch + "a" if self.arch == "sm_90" and "CUtensorMap" in kernel_cu else self.arch

    def cubin_of(self, kernel_cu: str) -> Path | None:
        """The cubin `load` compiled `kernel_cu` to (None: NVRTC built it, or it was never loaded)."""
        return nvcc.cached_cubin(kernel_cu, self._arch_of(kernel_cu))

    def _compile(self, kernel_cu: str, kernel_name: str) -> Any:
        if nvcc.find_nvcc() is None:
            try:
                module = self.cp.RawModule(
                    code=nvcc.nvrtc_source(kernel_cu), options=("-std=c++17",), name_expressions=[kernel_name]
                )
                return module.get_function(kernel_name)
            except Exception as e:
                raise KernelBuildError(f"NVRTC failed (no nvcc on PATH): {nvcc.first_error(str(e))}") from None
        path = nvcc.compile_cubin(kernel_cu, self._arch_of(kernel_cu))
        symbol = nvcc.kernel_symbol(path.read_bytes(), kernel_name)
        return self.cp.RawModule(path=str(path)).get_function(symbol)

    def launch(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple[Any, ...]) -> None:
        kernel((grid,), (block,), args, shared_mem=dyn_smem)

    def tensor_map(
        self, buffer: Any, dims: Sequence[int], strides: Sequence[int], box: Sequence[int], elem: int, swizzle: int
    ) -> Any:
        """A CUtensorMap over `buffer`, passed by value: cuTensorMapEncodeTiled of the driver (libcuda, through
        ctypes), its 128 bytes as a numpy structured scalar, which CuPy passes to a kernel as they are."""
        return encode_tensor_map(driver_library(), int(buffer.data.ptr), dims, strides, box, elem, swizzle)

    def clusters_at_once(self, kernel: Any, grid: int, block: int, dyn_smem: int) -> int | None:
        """Thread-block clusters of a cluster kernel the device holds at once, asked of the driver (CuPy has no
        binding for it); None where it cannot say."""
        try:
            return max_active_clusters(driver_library(), function_handle(kernel), grid, block, dyn_smem)
        except Exception:
            return None

    def occupancy(self, kernel: Any, block: int, dyn_smem: int) -> int | None:
        """Blocks of `kernel` one multiprocessor holds at once (None where CuPy cannot say)."""
        try:
            occupancy = self.cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor
            return int(occupancy(function_handle(kernel), block, dyn_smem))
        except Exception:
            return None

    def launch_cooperative(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple[Any, ...]) -> None:
        """Every block resident at once (cudaLaunchCooperativeKernel), or LaunchError before anything is launched.

        CuPy does not refuse a grid larger than the device holds: it warns and launches fewer blocks, whose work list
        then leaves sites out that the others wait for. So the grid is checked here first, and CuPy's warning, should
        its own count still disagree, is made the error it should be."""
        per_sm = self.occupancy(kernel, block, dyn_smem)
        if per_sm is None:
            raise LaunchError(residency_unknown(grid))
        if self.sms * per_sm < grid:
            raise LaunchError(not_resident(grid, self.sms, per_sm))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=CUPY_SHRINKS, category=UserWarning)
            try:
                cupy_function(kernel)((grid,), (block,), args, shared_mem=dyn_smem, enable_cooperative_groups=True)
            except UserWarning as e:
                raise LaunchError(f"{not_resident(grid, self.sms)} (CuPy: {_one_line(e)})") from None

"""The current CUDA device driven through CuPy (`CupyDevice`): upload and download, compile and load a kernel
(nvcc to a cubin, NVRTC without nvcc), launch it plainly or cooperatively, encode its tensor maps."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import nvcc
from .cuda_driver import driver_library, encode_tensor_map, max_active_clusters
from .discover import _one_line
from .nvcc import KernelBuildError
from .prepared import not_resident, residency_unknown
from .tilize import LaunchError


def needs_smem_attribute(dyn_smem: int) -> bool:
    """Whether to raise the kernel's dynamic shared-memory limit to `dyn_smem` before launching.

    The contract asks for it above 48 KiB (and `Launch.smem_opt_in` when static + dynamic pass 48 KiB); we set it
    for any dynamic block, which is harmless where it is not needed and covers a lowering that forgot the flag."""
    return dyn_smem > 0


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

    def upload(self, x: Any) -> tuple[Any, bool | str]:
        """A CuPy view or copy of `x` on the device, and what its bits hold where CuPy has no type for it: True for
        torch bf16 (as int16), "float8_e4m3fn" / "float8_e5m2" for torch's fp8 (as uint8), else False."""
        root = type(x).__module__.split(".")[0]
        if root == "cupy":
            return x, False
        if root == "torch":
            import torch

            t = x.detach()
            held: bool | str = False
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # no DLPack or numpy type: their bits
                held = "float8_e4m3fn" if t.dtype == torch.float8_e4m3fn else "float8_e5m2"
                t = t.view(torch.uint8)
            elif t.dtype == torch.bfloat16:
                held, t = True, t.view(torch.int16)
            if t.device.type != "cuda":
                return self.cp.asarray(t.cpu().numpy()), held
            return self.cp.from_dlpack(t.contiguous()), held
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

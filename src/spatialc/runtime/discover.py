"""Finding a GPU: CuPy loaded and a device seen, or `GpuUnavailable` with the reason in one line. Whether the machine
has a CUDA device at all is asked of the driver without CuPy (the probes), so the reason names what to fix."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import SpatialError


class GpuUnavailable(SpatialError, RuntimeError):
    """No GPU to run on: CuPy missing, no driver, or no device."""


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

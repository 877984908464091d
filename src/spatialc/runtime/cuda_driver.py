"""The CUDA driver's calls CuPy has no binding for, through ctypes: TMA tensor-map encoding and the occupancy of
thread-block clusters."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from .discover import GpuUnavailable
from .tilize import LaunchError

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

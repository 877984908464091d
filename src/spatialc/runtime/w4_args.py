"""A W4A16 kernel's 4-bit arguments from Python: the caller's weights, zero points and e8m0 scales checked on the host
as every spatialc entry point checks them (`numerics.w4.input_values`: packed uint8 bytes in `pack_int4`'s order,
ml_dtypes int4 / uint4 / float4_e2m1fn arrays, or numbers of the format; anything else is one InputError line), and
laid out in the bytes the kernel reads — exactly what the host program's `w4_host.cuh` writes:

    packed weights  two 4-bit codes a byte along K, tiled: tile (ti, tj) of 16 × 16 values is the 128 bytes at
                    (ti · cols_t + tj) · 128, byte `tile_byte(r / 2, c)` of it holding row r of column c (low nibble
                    for even r, high for odd) — the order in which lane L of a warp finds its four mma.sync B
                    registers' bytes in 32-bit word L; the padding is code 0 (the value 0 of every format)
    zero points     one value a byte (int4 as its two's complement), tiled as any tensor
    e8m0 scales     one code e + 127 a byte, tiled as any tensor (padding: code 0)

The bytes are made on the host (a 4-bit array has no device type in any library) and go up as uint8."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..inputs import TensorSpec
from ..ir.nodes import DType
from .tilize import TILE, tilize

# The kernel's C types of packed weights (lower/cuda/common/dequant.cuh's typedefs): two values a byte.
PACKED_C_TYPES = ("spatialc_int4x2", "spatialc_uint4x2", "spatialc_e2m1x2")
PACKED_TILE = (TILE[0] // 2, TILE[1])  # a tile of packed weights: 8 rows of bytes (16 of K) × 16 columns


@dataclass(frozen=True, slots=True)
class HostBytes:
    """A 4-bit argument made ready on the host: `storage` the flat uint8 bytes the kernel reads, `given` the
    caller's array (its library decides the result's, as any argument's does)."""

    storage: np.ndarray
    given: Any


def is_packed_c(c_type: str) -> bool:
    """Whether a kernel parameter of C type `c_type` holds packed 4-bit weights (two a byte)."""
    return any(word in PACKED_C_TYPES for word in c_type.replace("*", " ").split())


def host_bytes(spec: TensorSpec, tiles: tuple[int, int], packed: bool, value: Any) -> HostBytes:
    """`value` for the 4-bit or e8m0 tensor `spec` (tiles its kernel parameter's grid; `packed` its weights
    packed two a byte) as the bytes the kernel reads; InputError (one line) for what is not the tensor's."""
    from ..numerics import w4

    x = w4.input_values(spec, value)  # float64 values of the type, checked (shape, range, exactness)
    if packed:
        return HostBytes(packed_tiles(w4.codes(x, spec.dtype), tiles), value)
    if spec.dtype == DType.E8M0:
        stored = (np.log2(x).astype(np.int64) + 127).astype(np.uint8)  # powers of two, checked: exact
    else:
        stored = x.astype(np.int8).view(np.uint8)  # zero points: int4's two's complement in a signed char
    return HostBytes(tilize(stored, tiles, np, groups=spec.groups), value)  # (grouped: MXFP8's scales, each group's)


def tile_byte(p: int, c: int) -> int:
    """Where the byte of rows 2p, 2p + 1 (p = 0 … 7) of column c (0 … 15) lies in its tile's 128 bytes: word
    L = 4 (c mod 8) + p mod 4 holds lane L's B registers' bytes — rows 2t, 2t + 1 of column n, rows 2t + 8, 2t + 9,
    then the same of column n + 8 (t = L mod 4, n = L / 4), mma.sync m16n8k16's B fragment (w4_host.cuh's
    spatialc_w4_tile_byte)."""
    return 16 * (c % 8) + 4 * (p % 4) + 2 * (c // 8) + p // 4


# Byte b of a tile in this layout is byte TILE_ORDER[b] (= p · 16 + c) of the tile's bytes row-major.
TILE_ORDER = np.argsort([tile_byte(p, c) for p in range(8) for c in range(16)])


def packed_tiles(codes: Any, tiles: tuple[int, int], xp: Any = np) -> Any:
    """K × N 4-bit `codes` (uint8, 0 … 15) packed two a byte along K and tiled on the grid `tiles` of 16 × 16
    values (the module's layout; `w4_host.cuh`'s `spatialc_tilize_w4` is the host program's copy), on `xp` (numpy;
    CuPy where the codes are on the device already: the GPU check's W4A16 rows)."""
    rows, cols = tiles[0] * TILE[0], tiles[1] * TILE[1]
    padded = xp.zeros((rows, cols), xp.uint8)
    padded[: codes.shape[0], : codes.shape[1]] = codes
    pairs = (padded[0::2] | (padded[1::2] << 4)).astype(xp.uint8)  # byte (i, j): rows 2i (low), 2i + 1 (high)
    row_major = tilize(pairs, tiles, xp, PACKED_TILE).reshape(-1, PACKED_TILE[0] * PACKED_TILE[1])
    return xp.ascontiguousarray(row_major[:, xp.asarray(TILE_ORDER)]).reshape(-1)

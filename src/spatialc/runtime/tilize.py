"""Array math of the GPU launch, written once for any numpy-compatible array module `xp` (numpy here, CuPy on a GPU).

The tiled layout (DESIGN §2): a tensor of `tiles = (rows_t, cols_t)` 16×16 tiles is one flat run where tile
`(ti, tj)` starts at `(ti * cols_t + tj) * 256` and is row-major inside (column-major for order "col": the K-major B
of an int8 kernel); the tile grid may be larger than the
logical shape needs, and the padding is zero. The operands of the sm_90a form, which its copy engine loads as
matrices, are not tiled: order "rows" is the padded matrix row-major, "cols" its transpose row-major (the K-major B
of an int8 kernel). Operand rounding is round-to-nearest-even, done so that a float64
input is rounded once (not first to float32 and then again), and bf16 is kept as its 16 raw bits in a uint16
array because CuPy has no bfloat16 type.

`tilize_array` / `untilize_array` are the public `spatialc.tilize` / `spatialc.untilize`: the same layout for a
caller who launches `kernel.cu` from their own code (docs/kernel-abi.md, "Launching kernel.cu yourself").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SpatialError
from ..inputs import InputError, TensorSpec
from ..ir.nodes import DType, TileOrder

TILE = (16, 16)
TILE_ORDERS = tuple(o.value for o in TileOrder)  # inside a tile: "row"-major, or "col"umn-major
MATRIX_ORDERS = ("rows", "cols")  # not tiled: the padded matrix row-major, or its transpose
ORDERS = TILE_ORDERS + MATRIX_ORDERS

# Pointee C types of kernel parameters (docs/kernel-abi.md §4, §6) → the element type of the logical tensor.
C_TYPES = {
    "signed char": "int8",
    "int8_t": "int8",
    "char": "int8",
    "unsigned char": "uint8",
    "__half": "float16",
    "half": "float16",
    "__nv_bfloat16": "bfloat16",
    "nv_bfloat16": "bfloat16",
    "__nv_fp8_e4m3": "float8_e4m3fn",
    "__nv_fp8_e5m2": "float8_e5m2",
    "int": "int32",
    "int32_t": "int32",
    "long long": "int64",
    "long long int": "int64",
    "int64_t": "int64",
    "float": "float32",
    "double": "float64",
    # A W4A16 GEMM's (lower/cuda/common/dequant.cuh's typedefs): packed weights, two a byte along K, and zero points
    # and e8m0 scales a byte each — their element types, which spatialc.inputs takes as it takes them everywhere.
    "spatialc_int4x2": "int4",
    "spatialc_uint4x2": "uint4",
    "spatialc_e2m1x2": "float4_e2m1fn",
    "spatialc_int4": "int4",
    "spatialc_uint4": "uint4",
    "spatialc_e8m0": "float8_e8m0fnu",
}
# The element types a spatialc tensor can have, as the launcher names them.
ELEMENT_DTYPES = {
    "int8": DType.INT8,
    "int32": DType.INT32,
    "int64": DType.INT64,
    "float16": DType.FP16,
    "bfloat16": DType.BF16,
    "float8_e4m3fn": DType.E4M3,
    "float8_e5m2": DType.E5M2,
    "float32": DType.FLOAT32,
    "int4": DType.INT4,
    "uint4": DType.UINT4,
    "float4_e2m1fn": DType.E2M1,
    "float8_e8m0fnu": DType.E8M0,
}
BYTE_ELEMS = ("int4", "uint4", "float4_e2m1fn", "float8_e8m0fnu")  # held in bytes (4-bit weights packed two a byte)
FP8_ELEMS = ("float8_e4m3fn", "float8_e5m2")  # ml_dtypes' names; on the device their bits, in uint8
INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


class LaunchError(SpatialError, ValueError):
    """Arguments a kernel cannot take: a wrong shape, an unconvertible dtype, values outside the operand's range."""


def element_type(c_type: str) -> str:
    """The element type (`int8`, `float16`, `bfloat16`, …) of a parameter's C type, qualifiers ignored."""
    words = c_type.replace("*", " ").split()
    core = " ".join(w for w in words if w not in ("const", "volatile", "__restrict__", "__restrict", "restrict"))
    try:
        return C_TYPES[core]
    except KeyError:
        raise LaunchError(
            f"kernel parameter type {c_type!r} is not one the launcher knows ({', '.join(C_TYPES)})"
        ) from None


def work_list(launch: Any, sms: int | None = None) -> tuple[int, Any]:
    """(blocks to launch, the int32 work list to pass last) for a device of `sms` multiprocessors: `launch` is an
    artifact's `Launch` or the dict of its launch.json. None for `sms` keeps the grid the plan expected."""
    if isinstance(launch, Mapping):
        from ..lower.artifact import Launch

        fields = {f: launch[f] for f in ("kernel_name", "grid", "block", "dyn_smem") if f in launch}
        extra = {f: launch[f] for f in ("items", "placement", "per_sm", "band", "cluster") if f in launch}
        if "item_grid" in launch:
            extra["item_grid"] = tuple(launch["item_grid"])
        launch = Launch(**fields, params=(), **extra, work=tuple(launch.get("work", ())))
    if not launch.items and not launch.work:
        raise LaunchError("this launch has no work list: its kernel was printed before kernels took one")
    try:
        work = launch.work_list(sms)
    except ValueError as e:  # a placement rule without what it needs (a grouped one without its grid or band)
        raise LaunchError(f"this launch's work list cannot be made: {e}") from None
    sites = launch.sites(sms)
    check_clusters(work, sites, launch.cluster)
    return sites, np.asarray(work, dtype=np.int32)


def check_clusters(work: Any, sites: int, cluster: int) -> None:
    """Refuse a work list that leaves a site of a busy thread-block cluster idle: its peers multicast into it and
    wait for its arrivals item by item, so they would wait for ever (a cluster wholly idle leaves together)."""
    if cluster <= 1:
        return
    if sites % cluster:
        raise LaunchError(f"this launch has {sites} sites, not a whole number of clusters of {cluster}")
    counts = [int(n) for n in work[sites : 2 * sites]]
    for first in range(0, sites, cluster):
        mine = counts[first : first + cluster]
        if any(mine) and len(set(mine)) > 1:
            raise LaunchError(
                f"cluster {first // cluster} (sites {first}-{first + cluster - 1}) has {', '.join(map(str, mine))}"
                " items: the sites of a multicast cluster go through their items in step (a page one loads, its peers"
                " receive), so one with fewer would leave the others waiting for it (give each the same number)"
            )


def launch_specs(launch: Any) -> list[TensorSpec]:
    """The input and parameter tensors of a launch contract, as `spatialc.inputs` checks them."""
    taken = [p for p in launch.params if p.role in ("input", "parameter")]
    return [
        tensor_spec(p.name, p.role, element_type(p.c_type), p.elems, getattr(p, "groups", 1), takes_heads(p))
        for p in taken
    ]


def takes_heads(param: Any) -> bool:
    """Whether a kernel parameter is an attention's Q, K or V (`KernelParam.heads`; a launch.json written before it
    has none)."""
    return bool(getattr(param, "heads", False))


def tensor_spec(name: str, role: str, elem: str, elems: Any, groups: int = 1, heads: bool = False) -> TensorSpec:
    """One kernel parameter of element type `elem` as a TensorSpec; LaunchError for a type no tensor has."""
    if elem not in ELEMENT_DTYPES:
        raise LaunchError(f"kernel parameter {name} holds {elem}, an element type no spatialc tensor has")
    return TensorSpec(name, role, (int(elems[0]), int(elems[1])), ELEMENT_DTYPES[elem], int(groups), bool(heads))


def storage_dtype(elem: str) -> str:
    """The array dtype that holds `elem` on the device: bf16 lives as raw bits in uint16, the 8-bit floats in uint8
    (neither CuPy nor numpy has them), as do 4-bit weights (packed two a byte), their zero points and e8m0 scales."""
    return "uint16" if elem == "bfloat16" else "uint8" if elem in FP8_ELEMS + BYTE_ELEMS else elem


# ---- the tiled layout --------------------------------------------------------------------------------------


def tile_offset(i: int, j: int, cols_t: int, tile: tuple[int, int] = TILE, order: str = "row") -> int:
    """Flat index of element (i, j) in the tiled layout: the definition the array versions are tested against."""
    tr, tc = tile
    inside = (i % tr) * tc + j % tc if order == "row" else (j % tc) * tr + i % tr
    return ((i // tr) * cols_t + j // tc) * (tr * tc) + inside


def check_tiles(name: str, shape: tuple[int, ...], tiles: tuple[int, int], tile: tuple[int, int] = TILE) -> None:
    """Refuse a logical shape that does not fit the padded tile grid."""
    need = (math.ceil(shape[0] / tile[0]), math.ceil(shape[1] / tile[1]))
    if need[0] > tiles[0] or need[1] > tiles[1]:
        raise LaunchError(
            f"{name} of shape {tuple(shape)} needs {need[0]}×{need[1]} tiles; the kernel has {tiles[0]}×{tiles[1]}"
        )


def tilize(
    x: Any, tiles: tuple[int, int], xp: Any, tile: tuple[int, int] = TILE, order: str = "row", groups: int = 1
) -> Any:
    """The flat tiled form of the 2-D array `x`, zero-padded to the `tiles` grid, each tile in `order`; of a grouped
    tensor's (groups, rows, cols) array, each group on its own tiles[0] / groups rows of tiles, one after another.

    An `x` that already is the padded matrix is not zero-filled and copied first: where the order lays it out as it
    lies (order "rows" of a C-order `x`, or "row" of one tile column) the result is `x` itself, flattened (a view —
    callers that hand it on keep `x` unchanged: the kernel's inputs are const), else one transposing copy."""
    if groups > 1:
        part = (tiles[0] // groups, tiles[1])
        return xp.concatenate([tilize(x[g], part, xp, tile, order) for g in range(groups)])
    check_tiles("array", x.shape, tiles, tile)
    (rt, ct), (tr, tc) = tiles, tile
    if tuple(x.shape) == (rt * tr, ct * tc):
        padded = x
    else:
        padded = xp.zeros((rt * tr, ct * tc), dtype=x.dtype)
        padded[: x.shape[0], : x.shape[1]] = x
    if order in MATRIX_ORDERS:
        return xp.ascontiguousarray(padded if order == "rows" else padded.T).reshape(-1)
    axes = (0, 2, 1, 3) if order == "row" else (0, 2, 3, 1)
    return xp.ascontiguousarray(padded.reshape(rt, tr, ct, tc).transpose(*axes)).reshape(-1)


def untilize(
    flat: Any,
    tiles: tuple[int, int],
    shape: tuple[int, int],
    xp: Any,
    tile: tuple[int, int] = TILE,
    order: str = "row",
    groups: int = 1,
) -> Any:
    """The logical `shape` corner of the flat tiled array `flat` (tiles in `order`), row-major; of a grouped
    tensor's, (groups, *shape), each group from its own run of tiles."""
    if groups > 1:
        part = (tiles[0] // groups, tiles[1])
        size = part[0] * part[1] * tile[0] * tile[1]
        if flat.size != size * groups:
            raise LaunchError(
                f"a tiled buffer of {tiles[0]}×{tiles[1]} tiles holds {size * groups} elements, not {flat.size}"
            )
        return xp.stack(
            [untilize(flat[g * size : (g + 1) * size], part, shape, xp, tile, order) for g in range(groups)]
        )
    (rt, ct), (tr, tc) = tiles, tile
    if flat.size != rt * ct * tr * tc:
        raise LaunchError(f"a tiled buffer of {rt}×{ct} tiles holds {rt * ct * tr * tc} elements, not {flat.size}")
    check_tiles("result", shape, tiles, tile)
    if order == "rows":
        grid = flat.reshape(rt * tr, ct * tc)
    elif order == "cols":
        grid = flat.reshape(ct * tc, rt * tr).T
    elif order == "row":
        grid = flat.reshape(rt, ct, tr, tc).transpose(0, 2, 1, 3)
    else:
        grid = flat.reshape(rt, ct, tc, tr).transpose(0, 3, 1, 2)
    grid = grid.reshape(rt * tr, ct * tc)
    return xp.ascontiguousarray(grid[: shape[0], : shape[1]])


# ---- the public helpers: numpy in, numpy out -----------------------------------------------------------------


def tilize_array(
    array: Any, tile: tuple[int, int] = TILE, grid: tuple[int, int] | None = None, order: str = "row"
) -> Any:
    """`spatialc.tilize`: the flat tiled copy of the 2-D numpy `array`, zero-padded to `grid` (rows_t, cols_t) tiles
    (default: the smallest grid that holds it; a kernel parameter's is `artifact.launch.params[i].tiles`).

    Tile (ti, tj) is the contiguous run at (ti * cols_t + tj) * tile_elems, row-major inside — column-major for
    `order="col"`; `order="rows"` is not tiled but the padded array row-major, `"cols"` its transpose (the sm_90a
    form's operands). A kernel parameter's order is `artifact.launch.params[i].order`; the dtype is kept.
    InputError for a non-array, an array that is not 2-D, a bad tile or order, or a grid smaller than the array
    needs."""
    x = _numpy_array("tilize", array)
    if x.ndim != 2:
        raise InputError(
            f"tilize takes a 2-D array, not a {x.ndim}-D one of shape {x.shape}"
            + (
                "; a vector is one row (a bias, a column scale: array.reshape(1, -1)) or one column (a row scale:"
                " array.reshape(-1, 1))"
                if x.ndim == 1
                else ""
            )
        )
    tile = _pair("tile", tile, least=1)
    grid = _grid_for("array", x.shape, tile, grid)
    flat = tilize(x, grid, np, tile, _order(order))
    return flat.copy() if np.shares_memory(flat, x) else flat  # a copy, as it says: never a view of the caller's


def untilize_array(
    tiled: Any,
    shape: tuple[int, int],
    tile: tuple[int, int] = TILE,
    grid: tuple[int, int] | None = None,
    order: str = "row",
) -> Any:
    """`spatialc.untilize`: the logical `shape` (rows, cols) corner of the flat tiled numpy array `tiled`, as a new
    row-major array; `grid` is the tile grid `tiled` holds (default: the smallest that holds `shape`; a kernel's
    output has `artifact.launch.params[i].tiles`, which may be larger). The inverse of `tilize`.

    InputError for a non-array, a `tiled` that is not 1-D, a bad shape or tile, or a size that is not the grid's."""
    flat = _numpy_array("untilize", tiled)
    if flat.ndim != 1:
        raise InputError(f"untilize takes the flat (1-D) tiled buffer, not a {flat.ndim}-D array of shape {flat.shape}")
    shape, tile = _pair("shape", shape, least=0), _pair("tile", tile, least=1)
    grid = _grid_for("shape", shape, tile, grid)
    holds = grid[0] * grid[1] * tile[0] * tile[1]
    if flat.size != holds:
        raise InputError(
            f"a tiled buffer of {grid[0]}×{grid[1]} tiles of {tile[0]}×{tile[1]} holds {holds} elements, not "
            f"{flat.size}; pass grid=(rows_t, cols_t) — a kernel parameter's is artifact.launch.params[i].tiles"
        )
    out = untilize(flat, grid, shape, np, tile, _order(order))
    return out.copy() if np.may_share_memory(out, flat) else out


def smallest_grid(shape: tuple[int, int], tile: tuple[int, int] = TILE) -> tuple[int, int]:
    """The fewest (rows_t, cols_t) tiles that hold a `shape` array."""
    return (math.ceil(shape[0] / tile[0]), math.ceil(shape[1] / tile[1]))


def _order(order: Any) -> str:
    if order not in ORDERS:
        raise InputError(
            f"order must be 'row' or 'col' (inside each tile), or 'rows' or 'cols' (a padded matrix), not {order!r}"
        )
    return str(order)


def _numpy_array(func: str, x: Any) -> Any:
    if not isinstance(x, np.ndarray):
        raise InputError(f"{func} takes a numpy array, not a {type(x).__name__}; convert it first (np.asarray)")
    return x


def _pair(what: str, value: Any, least: int) -> tuple[int, int]:
    """`value` as two whole numbers ≥ `least`, or InputError."""
    ok = isinstance(value, tuple | list) and len(value) == 2
    ok = ok and all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= least for v in value)
    if not ok:
        kind = "positive" if least > 0 else "non-negative"
        raise InputError(f"{what} must be two {kind} whole numbers (rows, cols), not {value!r}")
    return (int(value[0]), int(value[1]))


def _grid_for(what: str, shape: tuple[int, ...], tile: tuple[int, int], grid: Any) -> tuple[int, int]:
    """The given grid (checked to hold `shape`) or the smallest that does."""
    need = smallest_grid((shape[0], shape[1]), tile)
    if grid is None:
        return need
    grid = _pair("grid", grid, least=0)
    if grid[0] < need[0] or grid[1] < need[1]:
        raise InputError(
            f"grid {grid[0]}×{grid[1]} is too small: {what} of shape {tuple(shape)} needs {need[0]}×{need[1]} tiles "
            f"of {tile[0]}×{tile[1]}"
        )
    return grid


# ---- operand rounding --------------------------------------------------------------------------------------


def float32_round_to_odd(x: Any, xp: Any) -> Any:
    """float64 → float32 rounded to odd, so that a second rounding to a format of ≤ 22 bits is exactly the one
    round-to-nearest-even from float64 (float32 keeps ≥ 2 bits more than fp16 and bf16)."""
    with _quiet(xp):
        t = x.astype(xp.float32)
    back = t.astype(xp.float64)
    inexact = (back != x) & xp.isfinite(t)
    bits = t.view(xp.uint32)
    # Of the two float32 neighbours around x exactly one is odd; step to it when round-to-nearest picked the even.
    toward_x = xp.where(xp.abs(back) > xp.abs(x), bits - xp.uint32(1), bits + xp.uint32(1))
    fix = inexact & ((bits & xp.uint32(1)) == 0)
    return xp.where(fix, toward_x, bits).astype(xp.uint32).view(xp.float32)


def bf16_bits(x32: Any, xp: Any) -> Any:
    """The bfloat16 bits (uint16) of float32 `x32`, round-to-nearest-even; NaN stays a (quiet) NaN."""
    u = x32.view(xp.uint32)
    with _quiet(xp):
        rounded = (u + xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1))) >> xp.uint32(16)
    nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return xp.where(nan, (u >> xp.uint32(16)) | xp.uint32(0x0040), rounded).astype(xp.uint16)


def bf16_to_float32(bits: Any, xp: Any) -> Any:
    """The float32 value of bfloat16 bits (exact)."""
    return (bits.astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def fp8_bits(x: Any, elem: str, xp: Any) -> Any:
    """The bits (uint8) of `x` rounded to the 8-bit float `elem` once, nearest even, as ml_dtypes rounds (on the host:
    no GPU array library has these types). The caller has refused e4m3 values past its range (`check_values`)."""
    import ml_dtypes

    host = x.get() if hasattr(x, "get") else np.asarray(x)
    kind = np.dtype(host.dtype).kind
    wide = host if kind == "f" else host.astype(np.float64)  # integers: exact in float64 as far as they are checked
    with np.errstate(over="ignore", invalid="ignore"):
        bits = wide.astype(getattr(ml_dtypes, elem)).view(np.uint8)
    return xp.asarray(bits)


def fp8_values(bits: Any, elem: str, xp: Any) -> Any:
    """The float32 values (exact) of 8-bit float `bits` (uint8)."""
    import ml_dtypes

    host = bits.get() if hasattr(bits, "get") else np.asarray(bits)
    return xp.asarray(host.view(getattr(ml_dtypes, elem)).astype(np.float32))


def quantize(x: Any, elem: str, xp: Any, *, name: str = "array", bf16_in: bool = False, checked: bool = True) -> Any:
    """`x` converted to element type `elem` in its storage dtype; floats round to nearest even, integers are
    range-checked (not when `checked` is False: nothing is then read back to the host, as inside CUDA-graph capture,
    and an integer out of range wraps as a cast does). `bf16_in` says `x` already holds bfloat16 bits."""
    if bf16_in:
        if elem == "bfloat16":  # the bits as they are: a view, no copy (int16 and uint16 bits are the same)
            return x.view(xp.uint16) if xp.dtype(x.dtype).itemsize == 2 else x.astype(xp.uint16)
        x = bf16_to_float32(x.view(xp.uint16), xp)
    kind = xp.dtype(x.dtype).kind
    if kind not in "biuf":
        raise LaunchError(f"{name} has dtype {x.dtype}; give integers or real floats")
    if elem in INT_RANGE:
        return _to_int(x, elem, xp, name) if checked else (xp.rint(x) if kind == "f" else x).astype(elem)
    narrow = elem in ("float16", "bfloat16")
    if narrow and x.dtype != xp.float16 and x.dtype != xp.float32:
        x = float32_round_to_odd(x.astype(xp.float64), xp)  # then one rounding below equals one from float64
    if elem in ("float16", "float32", "float64"):
        with _quiet(xp):
            return x.astype(elem)
    if elem == "bfloat16":
        return bf16_bits(x.astype(xp.float32), xp)
    if elem in FP8_ELEMS:
        return fp8_bits(x, elem, xp)
    if elem in BYTE_ELEMS:
        raise LaunchError(  # the launcher lays these out on the host (runtime/w4_args.py), never here
            f"{name} holds {elem} values, which are laid out as bytes on the host (runtime/w4_args.py), not converted"
        )
    raise LaunchError(f"no conversion to element type {elem!r}")


def _to_int(x: Any, elem: str, xp: Any, name: str) -> Any:
    lo, hi = INT_RANGE[elem]
    if xp.dtype(x.dtype).kind == "f":
        if x.size and not bool(xp.all(xp.isfinite(x))):
            raise LaunchError(f"{name} holds NaN or infinity; an {elem} operand cannot")
        x = xp.rint(x)  # round half to even
    if x.size:
        got_lo, got_hi = x.min().item(), x.max().item()
        if got_lo < lo or got_hi > hi:
            raise LaunchError(f"{name} holds values in [{got_lo:g}, {got_hi:g}], outside {elem}'s [{lo}, {hi}]")
    return x.astype(elem)


# ---- poisoning ---------------------------------------------------------------------------------------------


def poison_value(storage: str) -> float | int:
    """A value no kernel result can hold: NaN for floats, the most negative integer for integers.

    (An int32 GEMM result reaches -2^31 only past K = 131072 int8 steps; an int64 one never.)"""
    if storage.startswith("float"):
        return float("nan")
    if storage == "uint16":
        return 0xFFFF  # bf16 bits of a NaN
    return INT_RANGE[storage][0]


def unwritten(buf: Any, storage: str, xp: Any) -> int:
    """How many elements of `buf` still hold the poison."""
    if storage.startswith("float"):
        return int(xp.count_nonzero(xp.isnan(buf)))
    return int(xp.count_nonzero(buf == poison_value(storage)))


class _quiet:
    """numpy warns on overflowing casts and wrapping unsigned adds, which these functions mean to do."""

    def __init__(self, xp: Any):
        self._ctx = xp.errstate(over="ignore", invalid="ignore") if hasattr(xp, "errstate") else None

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)

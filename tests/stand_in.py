"""One GPU stand-in for the tests of the launcher's path: device memory is numpy arrays, the "kernel" numpy code.

`StandInDevice` has what `spatialc.runtime.launch` asks of a GPU (`prepared.Device`: upload, download, load,
launch), uploading torch tensors as `CupyDevice.upload` does (bf16 and fp8 as their bits, said so). Each launch's
arguments are checked against the kernel's signature (`signature`) and recorded, copied as the kernel was given them
(`launches`: (kernel, grid, block, dyn_smem, args)); then `kernel(device, args)` runs: a test's numpy model of the
kernel, reading and writing the buffers in `args` (None: the kernel writes nothing). The variations the tests need
are parameters (`arch`, `sms`) and small subclasses: `CooperativeStandIn` (holds `per_sm` blocks on each
multiprocessor, launches cooperatively), `MapStandIn` (encodes an sm_90a kernel's tensor maps: it records each and
gives a token in its place) and `TmaStandIn` (encodes them as `CupyDevice` does, through `encode_tensor_map`, with
`StandInDriver` for libcuda; `map_fields`, `tma_load` and `tma_store` are the copy engine of a kernel that reads
through them). Kernels shared by several tests: `product` (C = A @ B of the decoded operands, plus a bias row) and
`reference_kernel` (the program's numpy reference).
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from spatialc.runtime import launch as L
from spatialc.runtime.cuda_driver import encode_tensor_map
from spatialc.runtime.tilize import FP8_ELEMS, bf16_to_float32, fp8_values, quantize, tilize, untilize

Kernel = Callable[["StandInDevice", tuple], None]


class StandInDevice:
    """A GPU on numpy (see the module's docstring); `art` the artifact whose kernel it runs."""

    xp = np

    def __init__(
        self, art: Any = None, kernel: Kernel | None = None, *, arch: str | None = None, sms: int | None = None
    ):
        self.args = L.kernel_args(art.launch) if art is not None else []
        self.spec = art.launch if art is not None else None
        self.kernel = kernel
        if arch is not None:  # (a device without them: the launcher asks with getattr)
            self.arch = arch
        if sms is not None:
            self.sms = sms
        self.launches: list[tuple] = []
        self.uploads: list[np.dtype] = []
        self.downloads: list[str] = []
        self.loads = 0

    def upload(self, x: Any) -> tuple[np.ndarray, bool | str]:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            t, held = x.detach().cpu(), False
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # their bits, as CupyDevice.upload gives them
                held, t = str(t.dtype).removeprefix("torch."), t.view(torch.uint8)
            elif t.dtype == torch.bfloat16:
                held, t = True, t.view(torch.int16)
            x = t.numpy()
        else:
            held = False
        self.uploads.append(np.asarray(x).dtype)
        return np.asarray(x).view(np.ndarray), held

    def download(self, x: Any, library: str, like: Any) -> Any:
        """`x` as CupyDevice.download gives it: a torch tensor for torch (whose bf16 output the launcher views as
        torch.bfloat16), the array itself otherwise."""
        self.downloads.append(library)
        if library == "torch":
            import torch

            return torch.from_numpy(np.ascontiguousarray(x))
        return x

    def load(self, kernel_cu: str, kernel_name: str, dyn_smem: int) -> Any:
        self.loads += 1
        self.kernel_cu = kernel_cu
        return ("kernel", kernel_name, dyn_smem)

    def launch(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple) -> None:
        if self.spec is not None:
            signature(self.spec, args)
        self.launches.append((kernel, grid, block, dyn_smem, [None if a is None else a.copy() for a in args]))
        if self.kernel is not None:
            self.kernel(self, args)

    def given(self, name: str, launch: int = -1) -> Any:
        """The buffer the kernel parameter `name` was given at launch `launch`, as it was before the kernel ran."""
        return self.launches[launch][4][[a.name for a in self.args].index(name)]

    def tensors(self, args: tuple) -> dict[str, tuple[L.Arg, Any]]:
        """The kernel's tensor parameters by name: (its Arg, its buffer among `args`)."""
        return {a.name: (a, args[i]) for i, a in enumerate(self.args)}


def signature(spec: Any, args: tuple) -> None:
    """AssertionError unless `args` are what the printed kernel takes (docs/kernel-abi.md): a buffer for each of
    `spec.params`, then the int32 work list (a kernel of items), then the int32 sync words (one that has them),
    then one tensor map for each of `spec.tensor_maps`."""
    items, sync = bool(getattr(spec, "items", 0)), bool(getattr(spec, "items", 0) and getattr(spec, "sync", ()))
    n = len(spec.params)
    want = n + items + sync + len(getattr(spec, "tensor_maps", ()))
    assert len(args) == want, f"the kernel takes {want} arguments (tensors, work list, sync words, maps): {len(args)}"
    for at, what in ((n, "work list"), (n + 1, "sync words"))[: items + sync]:
        assert args[at].dtype == np.int32 and args[at].ndim == 1, f"argument {at}, the {what}, is {args[at].dtype}"


class CooperativeStandIn(StandInDevice):
    """A stand-in that launches cooperatively, holding `per_sm` blocks on each of its `sms` multiprocessors;
    `cooperative` keeps each such launch's grid and last argument (the sync words)."""

    def __init__(self, art: Any, kernel: Kernel | None = None, *, sms: int, per_sm: int | None, **kw: Any):
        super().__init__(art, kernel, sms=sms, **kw)
        self.per_sm, self.cooperative = per_sm, []

    def occupancy(self, kernel: Any, block: int, dyn_smem: int) -> int | None:
        return self.per_sm

    def launch_cooperative(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple) -> None:
        self.cooperative.append((grid, args[-1].copy()))
        self.launch(kernel, grid, block, dyn_smem, args)


class MapStandIn(StandInDevice):
    """A stand-in that encodes an sm_90a kernel's tensor maps: `maps` keeps what each was asked for (its buffer
    copied), and the map passed is a token, 1000 + its number, that tells them apart."""

    def __init__(self, art: Any, kernel: Kernel | None = None, **kw: Any):
        super().__init__(art, kernel, **{"arch": "sm_90", **kw})
        self.maps: list[tuple] = []

    def tensor_map(self, buffer: Any, dims: Any, strides: Any, box: Any, elem: int, swizzle: int) -> Any:
        self.maps.append((buffer.copy(), dims, strides, box, elem, swizzle))
        return np.array([1000 + len(self.maps) - 1])


# ---- kernels -------------------------------------------------------------------------------------------------------


def values(arg: L.Arg, buf: Any, shape: tuple[int, int] | None = None) -> np.ndarray:
    """The values (float64; int64 for int8) of `arg`'s tiled buffer `buf`, cut to `shape` (default: the padded
    grid's, per group), decoded by its element type."""
    shape = shape or (arg.tiles[0] // arg.groups * 16, arg.tiles[1] * 16)
    x = untilize(buf, arg.tiles, shape, np, order=arg.order, groups=arg.groups)
    if arg.elem == "bfloat16":
        return bf16_to_float32(x, np).astype(np.float64)
    if arg.elem in FP8_ELEMS:
        return fp8_values(x, arg.elem, np).astype(np.float64)
    if arg.elem == "float8_e8m0fnu":
        return 2.0 ** (x.astype(np.float64) - 127)
    return x.astype(np.int64 if arg.storage == "int8" else np.float64)


def store(arg: L.Arg, buf: Any, c: np.ndarray) -> None:
    """`c` (float64 or integers) stored into the output `arg`'s tiled buffer `buf`, rounded to its element type."""
    stored = quantize(c, arg.elem, np) if arg.elem == "bfloat16" else c.astype(arg.storage)
    buf[:] = tilize(stored, arg.tiles, np, order=arg.order, groups=arg.groups)


def product(dev: StandInDevice, args: tuple) -> None:
    """C = A @ B (each group's, of a grouped GEMM) of the first two inputs' values, plus the `bias` row if given."""
    by = dev.tensors(args)
    a, b = [by[x.name] for x in dev.args if x.role == "input"][:2]
    c = values(*a) @ values(*b)
    if "bias" in by:  # one value per column
        c = c + values(*by["bias"])[0]
    store(*next(by[x.name] for x in dev.args if x.role == "output"), c)


def reference_kernel(program: Any, edit: Callable[[dict], dict] | None = None) -> Kernel:
    """A kernel that computes `program` by the numpy reference from every input and parameter it is given and stores
    each output in its own buffer, in its element type; `edit` (a planted fault) changes the outputs, each shaped
    (groups, *elems), before they are stored."""
    from spatialc.numerics.reference import reference

    def kernel(dev: StandInDevice, args: tuple) -> None:
        got = {}
        for a, buf in dev.tensors(args).values():
            if a.role in ("input", "parameter"):
                x = values(a, buf, a.elems).astype(np.float32)
                got[a.name] = x if a.role == "input" else x.reshape(-1)
        ref, outs = reference(program, got), {}
        if not isinstance(ref, dict):  # a program of one output: its array
            ref = {next(a.name for a in dev.args if a.role == "output"): ref}
        for a in dev.args:
            if a.role == "output":
                v = np.asarray(ref[a.name])
                stored = quantize(v, a.elem, np) if a.elem == "bfloat16" else v.astype(a.storage)  # bf16: its bits
                outs[a.name] = stored.reshape(a.groups, *a.elems)
        outs = edit(outs) if edit is not None else outs
        for a, buf in dev.tensors(args).values():
            if a.role == "output":
                x = outs[a.name] if a.groups > 1 else outs[a.name][0]
                buf[:] = tilize(x, a.tiles, np, order=a.order, groups=a.groups)

    return kernel


# ---- TMA tensor maps: a stand-in driver and the copy engine's boxes -------------------------------------------------

# The emulator's CUtensorMap fields (runtime/emu/emu_hopper.h, TensorMapFields) in its 128 bytes: magic, element size,
# rank, swizzle span; base; dims[5]; byte strides[5] (stride[0] the element size); box[5]; the allocation's end.
MAP_FIELDS = "<4I Q 5Q 5Q 5H 6x Q"
MAP_MAGIC = 0x590A7A9
TYPE_SIZES = (1, 2, 4, 4, 8, 8, 2, 4, 8, 2)  # CUtensorMapDataType → element size, as the emulated encoder has them


class StandInDriver:
    """libcuda's cuTensorMapEncodeTiled for `cuda_driver.encode_tensor_map` (which calls it through ctypes, as on a
    GPU): the driver's documented refusals, as the emulated encoder (emu_runtime.h's encode_tiled) makes them, and
    the map's fields written in the emulator's layout (`MAP_FIELDS`) for a stand-in kernel to decode."""

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, dims, strides, box, unit, inter, swz, l2, oob):  # noqa: N802
        rank, elem = rank.value, TYPE_SIZES[dtype.value] if 0 <= dtype.value < 10 else 0
        if not elem or not 1 <= rank <= 5 or not address.value or address.value % 16 or inter.value:
            return 1  # CUDA_ERROR_INVALID_VALUE
        span = 0 if swz.value == 0 else 16 << swz.value
        sizes = [list(dims)[:rank], list(box)[:rank], list(strides)[: rank - 1]]
        if any(not 0 < d <= 1 << 32 for d in sizes[0]) or any(not 0 < b <= 256 for b in sizes[1]):
            return 1
        if any(s % 16 or s >= 1 << 40 for s in sizes[2]) or list(unit)[:rank] != [1] * rank:
            return 1
        if (sizes[1][0] * elem) % 16 or (span and sizes[1][0] * elem > span):
            return 1
        pad = lambda xs: [*xs, *[0] * (5 - len(xs))]  # noqa: E731
        fields = struct.pack(
            MAP_FIELDS, MAP_MAGIC, elem, rank, span, address.value, *pad(sizes[0]), *pad([elem, *sizes[2]]),
            *pad(sizes[1]), 0,
        )  # fmt: skip
        ctypes.memmove(out.value, fields, 128)
        return 0


class TmaStandIn(MapStandIn):
    """A stand-in that encodes tensor maps as `CupyDevice.tensor_map` does — `cuda_driver.encode_tensor_map` over
    the buffer's address — with `StandInDriver` for libcuda: the kernel gets the 128 bytes, in the emulator's layout."""

    driver = StandInDriver()

    def tensor_map(self, buffer: Any, dims: Any, strides: Any, box: Any, elem: int, swizzle: int) -> Any:
        super().tensor_map(buffer, dims, strides, box, elem, swizzle)
        return encode_tensor_map(self.driver, buffer.ctypes.data, dims, strides, box, elem, swizzle)


def map_fields(m: Any) -> dict[str, Any]:
    """A tensor map's fields, decoded from its 128 bytes (`StandInDriver`'s layout); AssertionError for what is not
    a map (a token, bytes of another layout)."""
    raw = np.asarray(m).tobytes()
    assert len(raw) == 128, f"a tensor map is 128 bytes, not {len(raw)}"
    magic, elem, rank, swizzle, base, *rest = struct.unpack(MAP_FIELDS, raw)
    assert magic == MAP_MAGIC, "not a tensor map the stand-in driver encoded"
    dims, strides, box = rest[0:5][:rank], rest[5:10][:rank], rest[10:15][:rank]
    return {"elem": elem, "rank": rank, "swizzle": swizzle, "base": base, "dims": dims, "strides": strides, "box": box}


def box_bytes(f: dict[str, Any]) -> int:
    """The bytes one box of map `f` moves (what the full barrier's transaction count must say for a load)."""
    return int(np.prod(f["box"])) * f["elem"]


def _box_at(f: dict[str, Any], args: tuple, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the bytes of the kernel buffer the 2-D map `f` lies over, each box element's byte offsets in it (rows,
    columns, bytes), which elements lie inside the tensor): AssertionError where the base is in no buffer or an
    element inside the tensor lies past its buffer's end."""
    assert f["rank"] == 2, "the stand-in's copy engine moves 2-D boxes"
    base = f["base"]
    mem = next(
        (a for a in args if isinstance(a, np.ndarray) and a.dtype.kind != "V" and a.nbytes and
         a.ctypes.data <= base < a.ctypes.data + a.nbytes),
        None,
    )  # fmt: skip
    assert mem is not None, f"the tensor map's base {base:#x} lies in none of the kernel's buffers"
    rows, cols = np.arange(f["box"][1])[:, None] + c1, np.arange(f["box"][0])[None, :] + c0
    inside = (rows < f["dims"][1]) & (cols < f["dims"][0])
    at = base - mem.ctypes.data + rows * f["strides"][1] + cols * f["elem"]
    at = at[..., None] + np.arange(f["elem"])
    assert (at[inside] < mem.nbytes).all(), "a box element inside the tensor lies past its buffer's end"
    return mem.reshape(-1).view(np.uint8), at, inside


def tma_load(f: dict[str, Any], args: tuple, c0: int, c1: int) -> np.ndarray:
    """The bytes a TMA load of map `f`'s box at coordinates (c0 columns, c1 rows) lands, row by row (the tensor's
    elements; zeros outside it), as uint8 (box rows, box columns × element size)."""
    mem, at, inside = _box_at(f, args, c0, c1)
    out = np.zeros(at.shape, np.uint8)
    out[inside] = mem[at[inside]]
    return out.reshape(at.shape[0], -1)


def tma_store(f: dict[str, Any], args: tuple, c0: int, c1: int, data: np.ndarray) -> None:
    """A TMA store of `data` (the box's bytes, row by row) through map `f` at (c0, c1): the elements inside the
    tensor written, the rest dropped."""
    mem, at, inside = _box_at(f, args, c0, c1)
    assert data.size == at.size, f"the store reads {at.size} bytes of shared memory; {data.size} were staged"
    mem[at[inside]] = data.reshape(at.shape)[inside]

"""`spatialc.run` of a W4A16 kernel in the sm_90a form (issue 34) on a stand-in GPU: the launcher's whole path for it
— the 4-bit bytes laid out on the host, A tiled as TMA's matrix, the work list, the TMA tensor maps encoded through
`cuda_driver.encode_tensor_map` over each buffer's address (a stand-in libcuda writes the emulator's map layout) —
up to the kernel call, and a stand-in kernel that decodes what it is given as the printed kernel reads it: its sites'
items from the work list, each A page by a TMA box load through the map's base, sizes, byte stride and box (checked
against the full barrier's transaction count the kernel text announces), each packed B page, scale and zero point
from their buffers by the layout's formula (docs/kernel-abi.md), C stored box by box through C's map. It equals the
interpreter bit for bit on exact inputs; a map with a wrong box, stride or base, or weights packed in the wrong
nibble order, shows."""

from __future__ import annotations

import re

import numpy as np
import pytest

import spatialc
from spatialc.lower.artifact import TensorMap
from spatialc.numerics import w4
from spatialc.runtime import launch as L
from spatialc.runtime import w4_args
from spatialc.runtime.tilize import bf16_to_float32

from ..stand_in import TmaStandIn, box_bytes, map_fields, tma_load, tma_store
from .w4_inputs import w4_inputs, w4_program

CASES = {  # (weights, precision, (M, N, K), gemm keywords)
    "int4-zeros-bf16": ("int4", "bf16", (37, 64, 256), {"group": 128, "zeros": True}),
    "mxfp4-bf16": ("mxfp4", "bf16", (16, 48, 160), {}),
    "uint4-f32-scales-fp16": ("uint4", "fp16", (64, 72, 192), {"group": 64, "scale_type": "float32"}),
}


def tiled_values(arg, buf, rows: int) -> np.ndarray:
    """The first `rows` rows of a tiled scale or zero-point buffer, read element by element by the tile formula:
    (g, j) at ((g / 16) · cols_t + j / 16) · 256 + (g mod 16) · 16 + j mod 16, decoded by the element type."""
    g, j = np.arange(rows)[:, None], np.arange(arg.elems[1])[None, :]
    at = ((g // 16) * arg.tiles[1] + j // 16) * 256 + (g % 16) * 16 + j % 16
    raw = buf.reshape(-1)[at]
    match arg.elem:
        case "bfloat16":
            return bf16_to_float32(raw, np).astype(np.float64)
        case "float8_e8m0fnu":
            return 2.0 ** (raw.astype(np.float64) - 127)
        case "int4":
            return raw.view(np.int8).astype(np.float64)
        case _:
            return raw.astype(np.float64)  # uint4 zero points (a byte each), float32 or fp16 scales as stored


def packed_values(arg, buf, fmt: str) -> np.ndarray:
    """All K_pad × N_pad weights of packed `buf` by the layout's formula: the byte of rows 2p, 2p + 1 of column c of
    tile (ti, tj) at (ti · cols_t + tj) · 128 + 16 (c mod 8) + 4 (p mod 4) + 2 (c / 8) + p / 4, the even row low."""
    i, j = np.arange(arg.tiles[0] * 16)[:, None], np.arange(arg.tiles[1] * 16)[None, :]
    p, c = (i % 16) // 2, j % 16
    byte = buf[((i // 16) * arg.tiles[1] + j // 16) * 128 + 16 * (c % 8) + 4 * (p % 4) + 2 * (c // 8) + p // 4]
    code = np.where(i % 2 == 1, byte >> 4, byte & 15).astype(np.uint8)
    return w4.from_codes(code, w4.format_dtype(fmt)).astype(np.float64)


def text_number(text: str, pattern: str) -> int:
    found = re.search(pattern, text)
    assert found is not None, f"the kernel text has no {pattern!r}"
    return int(found.group(1))


def hopper_w4_kernel(p, fmt):
    """The sm_90a W4A16 kernel on numpy, reading its arguments as the printed kernel does (see the module's
    docstring); its block is the program's plan, its map numbers, A's transaction count and output chunk the
    kernel text's."""
    block = p.plans[0].block
    bm, bn, bk = block.osh * 16, block.osw * 16, block.ibw * 16
    steps = -(-p.plans[0].k_tiles // block.ibw)

    def kernel(dev, args):
        text, grid = dev.kernel_cu, dev.launches[-1][1]
        by, n = dev.tensors(args), len(dev.args)
        maps = [map_fields(m) for m in args[n + 1 :]]  # after the tensors and the work list (no sync words here)
        a_map = maps[text_number(text, r"spatialc_tma_load_2d\([^;]*&spatialc_tmap_(\d+)")]
        c_map = maps[text_number(text, r"spatialc_tma_store_2d\(&spatialc_tmap_(\d+)")]
        announced = text_number(text, r"arrive_expect_tx\(&full_\d+\[[^\]]*\], (\d+)u\);[^\n]*\n\s*spatialc_tma_load")
        assert announced == bm * bk * 2, "the model's A page is not the kernel's"
        assert box_bytes(a_map) == announced, (
            f"A's box brings {box_bytes(a_map)} bytes; the barrier waits for {announced}"
        )
        weights = dequantised(by, fmt)
        across, chunk = text_number(text, r"item_x = item_id % (\d+);"), text_number(text, r"#define OUT_CHUNK (\d+)")
        work = args[n]
        for site in range(grid):
            for item in work[2 * grid + work[site] : 2 * grid + work[site] + work[grid + site]]:
                y, x = divmod(int(item), across)
                acc = np.zeros((bm, bn))
                for k in range(steps):
                    page = tma_load(a_map, args, k * bk, y * bm).reshape(-1).view(np.uint16).reshape(bm, bk)
                    a = bf16_to_float32(page, np) if by["A"][0].elem == "bfloat16" else page.view(np.float16)
                    acc += a.astype(np.float64) @ weights[k * bk : (k + 1) * bk, x * bn : (x + 1) * bn]
                for wg in range(bm // 64):  # each consumer warpgroup's 64 rows, `chunk` tile columns a box
                    for q0 in range(0, bn // 16, chunk):
                        staged = acc[wg * 64 : wg * 64 + 64, q0 * 16 : (q0 + chunk) * 16].astype(np.float32)
                        tma_store(c_map, args, x * bn + q0 * 16, y * bm + wg * 64, staged.view(np.uint8))

    return kernel


def dequantised(by, fmt: str) -> np.ndarray:
    """B's K_pad × N_pad dequantised weights (numerics.w4's definition) from the packed bytes, scales and zeros."""
    kb, b = by["B"]
    (k, n), (ks, s) = kb.elems, by["scale"]
    q = packed_values(kb, b, fmt)
    scale = tiled_values(ks, s, ks.elems[0])
    zero = tiled_values(*by["zeros"], ks.elems[0]) if "zeros" in by else None
    operand = "bf16" if by["A"][0].elem == "bfloat16" else "fp16"
    out = np.zeros_like(q)
    out[:k, :n] = w4.dequant_matrix(q[:k, :n], scale, zero, k // ks.elems[0], operand)
    return out


@pytest.fixture(scope="module")
def built():
    out = {}
    for name, (fmt, prec, (m, n, k), kw) in CASES.items():
        p = w4_program(m, n, k, fmt, prec, target="sm_90a", form="sm90a", **kw)
        art = spatialc.lower(p, form="sm90a")
        assert art.budget.form == "sm90a" and art.launch.tensor_maps and art.launch.items
        out[name] = (p, art, fmt)
    return out


def run(p, art, fmt, x, sms=132):
    dev = TmaStandIn(art, hopper_w4_kernel(p, fmt), sms=sms)
    return L.run_with(dev, art, **x), dev


@pytest.mark.parametrize("case", CASES)
def test_run_of_the_sm90a_form_equals_the_interpreter(built, case):
    p, art, fmt = built[case]
    x = w4_inputs(p, seed=21, exact=True)  # small integers and powers of two: every sum exact
    c, dev = run(p, art, fmt, x, sms=1 if case == "mxfp4-bf16" else 132)  # (one site running every item)
    assert np.array_equal(c, spatialc.evaluate(p, x))
    ((_, grid, block, smem, args),) = dev.launches
    assert (block, smem) == (art.launch.block, art.launch.dyn_smem) and args[2].dtype == np.float32
    assert np.isnan(args[2]).all()  # C poisoned before the launch: every element the kernel's stores wrote
    assert [a.dtype for a in args[-len(art.launch.tensor_maps) :]] == [L.TENSOR_MAP_DTYPE] * len(art.launch.tensor_maps)


def planted(monkeypatch, fault):
    """The launcher with one fault planted: a map's box or byte stride, its base, the work list, the nibble order."""
    geometry = TensorMap.geometry

    def edited(self, tiles, elem):
        dims, strides, box = geometry(self, tiles, elem)
        if self.tensor == 0 and fault == "A's box half as wide, twice as tall":
            return dims, strides, (box[0] // 2, box[1] * 2)  # the bytes the barrier waits for, in another shape
        if self.tensor == 0 and fault == "A's box a tile row short":
            return dims, strides, (box[0], box[1] - 16)
        if self.tensor == 0 and fault == "A's rows a stride short":
            return dims, (strides[0] - 128,), box
        if self.tensor != 0 and fault == "C's box half as wide":
            return dims, strides, (box[0] // 2, box[1])
        return dims, strides, box

    monkeypatch.setattr(TensorMap, "geometry", edited)
    if fault == "a map over a copy of its buffer":
        encode = TmaStandIn.tensor_map
        monkeypatch.setattr(TmaStandIn, "tensor_map", lambda self, buf, *a: encode(self, buf.copy(), *a))
    if fault == "site 0's items left out":
        work_list = L.work_list

        def edited_work(ls, sms):
            grid, work = work_list(ls, sms)
            work[grid] = 0  # site 0 runs no item
            return grid, work

        monkeypatch.setattr(L, "work_list", edited_work)
    if fault == "nibbles exchanged":
        packed = w4_args.packed_tiles
        monkeypatch.setattr(w4_args, "packed_tiles", lambda *a, **k: (b := packed(*a, **k)) >> 4 | b << 4)


FAULTS = {  # the fault → what stops the stand-in kernel (None: it runs, and C differs)
    "A's box half as wide, twice as tall": None,
    "A's box a tile row short": "the barrier waits for 16384",
    "A's rows a stride short": None,
    "C's box half as wide": "the store reads 4096 bytes of shared memory; 8192 were staged",
    "a map over a copy of its buffer": "lies in none of the kernel's buffers",
    "site 0's items left out": None,
    "nibbles exchanged": None,
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_planted_fault_in_the_launchers_path_shows(built, monkeypatch, fault):
    """Each fault makes C differ from the interpreter's, or stops the stand-in kernel where the GPU would hang or
    read what it should not (a box the barrier does not wait for, a map over no kernel buffer, a store of other
    bytes than were staged): never a C that passes."""
    p, art, fmt = built["int4-zeros-bf16"]
    x = w4_inputs(p, seed=22, exact=True)
    want = spatialc.evaluate(p, x)
    assert np.array_equal(run(p, art, fmt, x)[0], want)  # the same run, unplanted
    planted(monkeypatch, fault)
    if FAULTS[fault] is not None:
        with pytest.raises(AssertionError, match=re.escape(FAULTS[fault])):
            run(p, art, fmt, x)
        return
    c, _ = run(p, art, fmt, x)
    assert not np.array_equal(c, want, equal_nan=True)

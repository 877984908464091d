"""What a W4A16 row's check needs, made where it is cheapest (gpucheck/w4rows.py says what the rows measure).

The host work of one 14336² row — the weights dequantised in float64, the float64 reference C and its bound — took
9–53 s on a CPU machine, more than twelve rows can spend of a 240 s budget. So on the GPU run:

- the reference C and each element's bound (`spatialc.tolerance(program, kernel=True).against(inputs)`: small at
  M ≤ 64) are made by `--prepare`, beside the cubins, one file a row (`save`), and loaded on the run (`load`). A
  file is used only when its key — the SHA-256 of the program's text, the seed and the format of this file — and the
  CRC-32 of the inputs it was made from match the run's own (a stale or mismatched file is not used; the row then
  computes them on the host, and its note says so and how long that took);
- the dequantised weights that torch's baseline multiplies, and the float64 product every contestant's error is
  measured against, are made on the device (`dequant_bits`: the bf16 bits of `numerics.w4.dequant`, bit for bit —
  the tests hold them to it on numpy — from the packed bytes, scales and zero points uploaded once).

The reference is C's bf16 values, stored as float32 (exact); the bound as float32 rounded up (never tighter than the
float64 bound: at most 2^-24 of it looser).
"""

from __future__ import annotations

import hashlib
import io
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..files import write_whole

FORMAT = 1  # this file's layout: a change makes every saved file stale
PREFIX = "w4ref-"


def key_of(program: Any, seed: int) -> str:
    """The SHA-256 naming a row's saved reference: its program's text (the shape, format, C's type and plan), the
    seed and FORMAT."""
    from ..ir.printer import program_text

    return hashlib.sha256(f"{FORMAT}\n{seed}\n{program_text(program)}".encode()).hexdigest()


def inputs_crc(given: dict[str, Any]) -> int:
    """The CRC-32 of the inputs by name (their bytes and shapes, in name order): a saved file made from other inputs
    (the drawing changed since) is not used."""
    crc = 0
    for name in sorted(given):
        x = np.ascontiguousarray(given[name])
        crc = zlib.crc32(f"{name} {x.dtype} {x.shape}".encode(), crc)
        crc = zlib.crc32(x.view(np.uint8).reshape(-1), crc)
    return crc


def path_of(folder: str | Path, key: str) -> Path:
    return Path(folder) / f"{PREFIX}{key[:24]}.npz"


def save(folder: str | Path, program: Any, seed: int, given: dict[str, Any]) -> Path:
    """Compute the row's reference C and bound on the host and save them under the row's key (`--prepare`)."""
    import spatialc

    reference, bound = spatialc.tolerance(program, kernel=True).against(given)
    ref32 = np.asarray(reference, np.float32)
    if not np.array_equal(ref32.astype(np.float64), reference):  # C's type is bf16: its values fit float32 exactly
        raise ValueError(f"the reference of {program.name} does not hold float32 values; not saved")
    bound32 = np.asarray(bound, np.float32)
    low = bound32.astype(np.float64) < bound
    bound32[low] = np.nextafter(bound32[low], np.float32(np.inf))  # rounded up: never tighter than the bound
    key = key_of(program, seed)
    path = path_of(folder, key)
    data = io.BytesIO()
    np.savez_compressed(data, key=np.array(key), crc=np.array(inputs_crc(given), np.int64), ref=ref32, bound=bound32)
    write_whole(path, data.getvalue())  # whole or not at all
    return path


def load(folder: str | Path | None, program: Any, seed: int, given: dict[str, Any]) -> tuple[Any, str]:
    """((reference, bound) as float64, '') from the row's saved file, or (None, why not)."""
    if folder is None:
        return None, "no prepared folder"
    key = key_of(program, seed)
    path = path_of(folder, key)
    if not path.is_file():
        return None, f"none prepared ({path.name} absent: prepare again)"
    try:
        with np.load(path) as data:
            saved_key, crc = str(data["key"]), int(data["crc"])
            ref, bound = data["ref"].astype(np.float64), data["bound"].astype(np.float64)
    except (OSError, ValueError, KeyError) as e:
        return None, f"{path.name} unreadable: {e}"
    if saved_key != key:
        return None, f"{path.name} is another row's (its key differs)"
    if crc != inputs_crc(given):
        return None, f"{path.name} was made from other inputs (prepare again)"
    c = program.output_tensor()
    if ref.shape != tuple(c.elems) or bound.shape != ref.shape:
        return None, f"{path.name} holds {ref.shape}, C is {tuple(c.elems)}"
    return (ref, bound), ""


# ---- on the device -----------------------------------------------------------------------------------------------


def dequant_bits(given: dict[str, Any], program: Any, xp: Any) -> Any:
    """The dequantised K × N weights as bf16 bits (uint16) on `xp` (CuPy on the device; numpy in the tests), from
    the packed bytes, scales and zero points of `given`: `numerics.w4.dequant`'s round_bf16(f32(s) × f32(q − z)), the
    codes' values read from its own `from_codes`."""
    from ..ir.nodes import DType
    from ..numerics.w4 import from_codes
    from ..runtime.tilize import bf16_bits

    b = program.tensor_named("B")
    k, n = b.elems
    group = k // program.tensor_named("scale").elems[0]
    table = xp.asarray(np.asarray(from_codes(np.arange(16, dtype=np.uint8), b.dtype), np.float32))
    packed = xp.asarray(given["B"])
    q = xp.empty((k, n), dtype=xp.uint8)
    q[0::2], q[1::2] = packed & 0xF, packed >> 4
    v = table[q].reshape(k // group, group, n)  # each code's value, exact in float32
    if "zeros" in given:
        v = v - xp.asarray(np.asarray(given["zeros"], np.float32))[:, None, :]  # |q − z| ≤ 15: exact
    scale = xp.asarray(np.asarray(given["scale"], np.float32))  # bf16 or e8m0 values: exact in float32
    if b.dtype not in (DType.INT4, DType.UINT4, DType.E2M1):
        raise ValueError(f"{b.dtype} is not a 4-bit weight type")
    return bf16_bits((v * scale[:, None, :]).reshape(k, n).astype(xp.float32), xp)

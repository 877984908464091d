"""`spatialc.run` of a W4A16 kernel (issue 34): the launcher takes the weights as every entry point does (packed
uint8 bytes in `pack_int4`'s order, ml_dtypes int4 / uint4 / float4_e2m1fn arrays, or numbers of the format) and
lays out the bytes the kernel reads exactly as the host program does — the same bytes as `w4_host.cuh` and
`host.cuh`, compiled with g++, write for the same values — and a stand-in device that decodes those bytes by the
layout's formula element by element computes what the interpreter does, bit for bit. Hostile inputs are one typed
line each, before anything is launched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.numerics import w4
from spatialc.runtime import launch as L
from spatialc.runtime.tilize import bf16_to_float32, quantize, tilize, untilize

from ..stand_in import StandInDevice
from .w4_inputs import w4_inputs, w4_program

COMMON = Path(spatialc.__file__).parent / "lower" / "cuda" / "common"
CASES = {
    "int4-zeros-bf16": ("int4", "bf16", (37, 40, 256), {"group": 128, "zeros": True}),
    "uint4-f32-scales-fp16": ("uint4", "fp16", (33, 72, 192), {"group": 64, "scale_type": "float32"}),
    "mxfp4-bf16": ("mxfp4", "bf16", (16, 48, 160), {}),
    "uint4-zeros-ragged": ("uint4", "bf16", (5, 24, 48), {"group": 16, "zeros": True}),
}
# the sm_90a form's 4-bit specs, compared with the general form's (its run on a stand-in: test_w4_sm90a_run.py)
SM90A_CASES = {
    "int4-zeros-bf16": ("int4", (37, 64, 256), {"group": 128, "zeros": True}),
    "mxfp4-bf16": ("mxfp4", (16, 64, 256), {}),
}


def packed_value(buf: np.ndarray, i: int, j: int, cols_t: int, fmt: str) -> float:
    """Element (i, j) of packed weights `buf`, read by the layout's formula (docs/kernel-abi.md: tile (ti, tj) at
    (ti · cols_t + tj) · 128, the byte of rows 2p, 2p + 1 of column c at 16 (c mod 8) + 4 (p mod 4) + 2 (c / 8) +
    p / 4 of it, the even row low)."""
    p, c = (i % 16) // 2, j % 16
    byte = int(buf[((i // 16) * cols_t + j // 16) * 128 + 16 * (c % 8) + 4 * (p % 4) + 2 * (c // 8) + p // 4])
    code = byte >> 4 if i % 2 else byte & 15
    return float(w4.from_codes(np.array([code], np.uint8), w4.format_dtype(fmt)).astype(np.float64)[0])


def w4_kernel(fmt):
    """A stand-in kernel on numpy: it decodes the 4-bit arguments' bytes element by element, dequantises with
    numerics.w4.dequant, and computes C = A @ B in float64 (exact inputs: exact), stored as the kernel's C."""

    def kernel(dev, args):
        by = dev.tensors(args)
        (ka, a), (kb, b), (kc, c) = by["A"], by["B"], by["C"]
        (k, n), m = kb.elems, ka.elems[0]
        q = np.array([[packed_value(b, i, j, kb.tiles[1], fmt) for j in range(n)] for i in range(k)])
        ks, s = by["scale"]
        scale = untilize(s, ks.tiles, ks.elems, np)
        if ks.elem == "bfloat16":
            scale = bf16_to_float32(scale, np)
        elif ks.elem == "float8_e8m0fnu":
            scale = 2.0 ** (scale.astype(np.float64) - 127)
        zero = None
        if "zeros" in by:
            kz, z = by["zeros"]
            zero = untilize(z, kz.tiles, kz.elems, np)
            zero = zero.view(np.int8) if kz.elem == "int4" else zero
        group = k // ks.elems[0]
        operand = "bf16" if ka.elem == "bfloat16" else "fp16"
        d = w4.dequant_matrix(
            q, scale.astype(np.float64), None if zero is None else zero.astype(np.float64), group, operand
        )
        av = untilize(a, ka.tiles, ka.elems, np)
        av = bf16_to_float32(av, np) if ka.elem == "bfloat16" else av
        prod = av.astype(np.float64) @ d
        stored = quantize(prod, kc.elem, np) if kc.elem == "bfloat16" else prod.astype(kc.storage)
        c[:] = tilize(stored, kc.tiles, np, order=kc.order)
        assert m == kc.elems[0]

    return kernel


@pytest.fixture(scope="module")
def built():
    out = {}
    for name, (fmt, prec, (m, n, k), kw) in CASES.items():
        p = w4_program(m, n, k, fmt, prec, **kw)
        out[name] = (p, spatialc.lower(p), fmt)
    return out


@pytest.mark.parametrize("case", CASES)
def test_run_equals_the_interpreter_for_each_way_of_giving_the_weights(built, case):
    p, art, fmt = built[case]
    x = w4_inputs(p, seed=11, exact=True, packed=False)  # small integers and powers of two: every sum exact
    want = spatialc.evaluate(p, x)
    k = p.tensor_named("B").elems[0]
    ways = {"values": x["B"], "ml_dtypes": x["B"].astype(w4.ml_type(w4.format_dtype(fmt)))}
    if k % 2 == 0:
        ways["packed"] = spatialc.pack_int4(x["B"], fmt)
    for how, b in ways.items():
        dev = StandInDevice(art, w4_kernel(fmt))
        c = L.run_with(dev, art, **dict(x, B=b))
        assert np.array_equal(c, want), how
        assert np.dtype(np.uint8) in dev.uploads  # the 4-bit bytes went up as uint8


def host_program_bytes(tmp_path: Path, values: np.ndarray, tiles: tuple[int, int], how: str, fmt: int = 0):
    """The bytes `w4_host.cuh` / `host.cuh` (compiled with g++) write for `values` on the grid `tiles`: `how` is
    w4 (packed weights of format `fmt`), e8m0 (scales) or plain (zero points, one a byte)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    rows, cols = values.shape
    call = {
        "w4": f"std::vector<unsigned char> t({tiles[0] * tiles[1] * 128});"
        f" spatialc_tilize_w4(x, {rows}, {cols}, {tiles[1]}, t, {fmt});",
        "e8m0": f"std::vector<unsigned char> t({tiles[0] * tiles[1] * 256});"
        f" spatialc_tilize(x, {rows}, {cols}, {tiles[1]}, t, false, spatialc_e8m0_of());",
        "plain": f"std::vector<signed char> t({tiles[0] * tiles[1] * 256});"
        f" spatialc_tilize(x, {rows}, {cols}, {tiles[1]}, t);",
    }[how]
    doubles = ", ".join(repr(float(v)) for v in values.ravel())
    src = (
        "#include <cstdio>\n#include <vector>\n"
        f'#include "{COMMON / "host.cuh"}"\n#include "{COMMON / "w4_host.cuh"}"\n'
        f"int main() {{ std::vector<double> x = {{{doubles}}}; {call}\n"
        ' for (size_t i = 0; i < t.size(); ++i) printf("%u\\n", (unsigned)(unsigned char)t[i]); return 0; }\n'
    )
    (tmp_path / f"{how}.cpp").write_text(src)
    exe = tmp_path / how
    subprocess.run([cxx, "-std=c++17", "-O1", "-o", str(exe), str(tmp_path / f"{how}.cpp")], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return np.array([int(v) for v in out.split()], np.uint8)


@pytest.mark.emulation
def test_the_launchers_bytes_are_the_host_programs(built, tmp_path):
    from spatialc.runtime.w4_args import host_bytes

    rng = np.random.default_rng(12)
    for name in ("int4-zeros-bf16", "mxfp4-bf16", "uint4-zeros-ragged"):
        p, art, fmt = built[name]
        args = {a.name: a for a in L.kernel_args(art.launch)}
        x = w4_inputs(p, seed=int(rng.integers(1 << 30)), exact=True, packed=False)
        for tname in [t for t in ("B", "scale", "zeros") if t in x]:
            arg = args[tname]
            if arg.elem in ("bfloat16", "float16", "float32"):
                continue  # an ordinary operand, tiled as any
            got = host_bytes(arg.spec, arg.tiles, arg.packed, x[tname]).storage
            how = "w4" if arg.packed else "e8m0" if arg.elem == "float8_e8m0fnu" else "plain"
            fmt_no = {"int4": 0, "uint4": 1, "mxfp4": 2}[fmt]
            want = host_program_bytes(tmp_path, np.asarray(x[tname], np.float64), arg.tiles, how, fmt_no)
            assert got.dtype == np.uint8 and np.array_equal(got, want), (name, tname)


def test_the_sm90a_forms_4_bit_arguments_are_laid_out_as_the_general_forms():
    """The launcher lays out B, its scales and zero points by their specs alone (`host_bytes`, tested above against
    the host program for any tile grid): the sm_90a form's specs are the general form's but for the grid's padding
    (each plan pads to its own block), so its bytes are the host program's too; A and C are TMA's matrices there."""
    for name, (fmt, (m, n, k), kw) in SM90A_CASES.items():
        arts = {
            form: spatialc.lower(w4_program(m, n, k, fmt, "bf16", target=target, form=form, **kw), form=form)
            for form, target in (("general", "sm_90"), ("sm90a", "sm_90a"))
        }
        specs = {
            form: {a.name: (a.elem, a.elems, a.order, a.packed) for a in L.kernel_args(art.launch)}
            for form, art in arts.items()
        }
        assert specs["sm90a"]["A"][2] == "rows" != specs["general"]["A"][2]  # A a matrix there, tiles here …
        for t in [t for t in ("B", "scale", "zeros") if t in specs["sm90a"]]:
            assert specs["sm90a"][t] == specs["general"][t], (name, t)  # … the 4-bit tensors alike


HOSTILE = {
    "a value past int4": (lambda b: np.where(b == b.max(), 8, b), r"tensor B is int4 but B\[\d+, \d+\] = 8 is not"),
    "a fraction": (lambda b: b + 0.5, r"tensor B is int4 but .* is not one of its whole numbers in -8\.\.7"),
    "the wrong shape": (lambda b: b[:, :-1], r"tensor B: expected shape \(256, 40\)"),
    "packed bytes of the wrong shape": (
        lambda b: spatialc.pack_int4(b, "int4")[:-1],
        r"tensor B: expected shape \(256, 40\)",
    ),
    "uint4 weights past int4's range": (
        lambda b: (b + 8).astype(ml_dtypes.uint4),
        r"tensor B is int4 but B\[\d+, \d+\] = (8|9|1\d) is not one of its whole numbers",
    ),
    "e2m1 weights for int4": (
        lambda b: np.full(b.shape, 0.5).astype(ml_dtypes.float4_e2m1fn),
        r"tensor B is int4 but B\[0, 0\] = 0\.5 is not",
    ),
    "complex numbers": (lambda b: b.astype(np.complex64), r"tensor B: expected numbers, got an array of complex64"),
    "strings": (lambda b: b.astype(str), r"tensor B: expected numbers"),
}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_weights_are_one_typed_line_before_any_launch(built, hostile):
    p, art, fmt = built["int4-zeros-bf16"]
    x = w4_inputs(p, seed=13, exact=True, packed=False)
    edit, says = HOSTILE[hostile]
    dev = StandInDevice(art, w4_kernel(fmt))
    with pytest.raises(spatialc.InputError, match=says) as e:
        L.run_with(dev, art, **dict(x, B=edit(x["B"])))
    assert "\n" not in str(e.value) and not dev.uploads


def test_a_zero_point_or_e8m0_scale_out_of_range_is_one_typed_line(built):
    p, art, fmt = built["int4-zeros-bf16"]
    x = w4_inputs(p, seed=14, exact=True, packed=False)
    with pytest.raises(spatialc.InputError, match=r"tensor zeros is int4 but zeros\[\d+, \d+\] = 9"):
        L.run_with(StandInDevice(art, w4_kernel(fmt)), art, **dict(x, zeros=np.full_like(x["zeros"], 9)))
    p, art, fmt = built["mxfp4-bf16"]
    x = w4_inputs(p, seed=14, exact=True, packed=False)
    with pytest.raises(spatialc.InputError, match=r"tensor scale is e8m0 but .* is not one of its powers of two"):
        L.run_with(StandInDevice(art, w4_kernel(fmt)), art, **dict(x, scale=x["scale"] * 3))


def test_inside_cuda_graph_capture_the_host_laid_bytes_are_refused_before_anything_is_bound(built, monkeypatch):
    """The 4-bit bytes are made on the host (`runtime/w4_args.py`), which a call inside capture (`checked=False`)
    cannot wait for: one line naming the tensors, before any value is read."""
    art = built["int4-zeros-bf16"][1]
    monkeypatch.setattr(L, "bind", lambda *a, **k: pytest.fail("bound inside capture"))
    with pytest.raises(L.LaunchError) as e:
        L.bound_operands(art, (), {}, checked=False)
    text = str(e.value)
    assert "\n" not in text and text.startswith("B") and "CUDA-graph capture" in text, text

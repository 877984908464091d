"""4-bit weights (W4A16): their formats, how they are packed, and the one definition of their dequantisation.

Formats (`spatialc.gemm(..., weights=...)`):

    int4   GPTQ / AWQ signed: q ∈ −8 … 7, a scale per (group of `group` rows of K, column), a zero point optional
    uint4  the same unsigned: q ∈ 0 … 15 (zero points usually 8, or per group)
    mxfp4  OCP MX: q a float4_e2m1fn value (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}), a float8_e8m0fnu scale 2^e per 32 of K

Packing. Two values a byte, packed along K: byte (i, j) of the packed (K/2) × N uint8 array holds B[2i, j] in its
low nibble (bits 0–3) and B[2i + 1, j] in its high nibble (bits 4–7) — the even row first. The tensor cores' B
operand (mma.sync m16n8k16) holds two consecutive K values of one column in each 32-bit register, so one byte
becomes one bf16x2 / half2 register with no shuffle across columns. A nibble is the value's two's complement
(int4), the value (uint4), or its e2m1 code (sign bit 3, exponent bits 2–1, fraction bit 0) — ml_dtypes' own
encoding of each type (`np.asarray(x, ml_dtypes.int4).view(np.uint8) & 0xF`).

Dequantisation (`dequant`, the one definition the interpreter, the reference and verify's formulas read):

    d[k, j] = round_op( f32( f32(s[g, j]) × f32(q[k, j] − z[g, j]) ) ),  g = k // group

q − z is an exact integer (|q − z| ≤ 15), exact in float32; the float32 product is exact for bf16, fp16 and e8m0
scales (at most 11 + 4 significant bits) and rounded to nearest even for a float32 scale; `round_op` is one more
round-to-nearest-even, to the operand type (bf16 or fp16; fp16 overflows to ±inf). For mxfp4 z = 0 and q is the
e2m1 value. This is what a kernel computes in float32 registers before it converts to the operand type, so the
dequantised operand is bit-exact, and the GEMM's tolerance is the bf16 / fp16 GEMM's on those operands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ProgramError
from ..ir.nodes import DType

# The frontend's names for the formats → the stored element type of B.
WEIGHT_FORMATS = {"int4": DType.INT4, "uint4": DType.UINT4, "mxfp4": DType.E2M1}
MX_GROUP = 32  # MXFP4's scale block along K (OCP MX v1.0)
FOUR_BIT_RANGE = {DType.INT4: (-8, 7), DType.UINT4: (0, 15)}
E2M1_MAX = 6.0
E8M0_EXPONENTS = (-127, 127)  # 2^e for these e; the code 0xFF is NaN
PACKED = (DType.INT4, DType.UINT4, DType.E2M1)  # the 4-bit element types, stored two a byte
ML_NAMES = {DType.INT4: "int4", DType.UINT4: "uint4", DType.E2M1: "float4_e2m1fn", DType.E8M0: "float8_e8m0fnu"}


def ml_type(dtype: DType) -> Any:
    """ml_dtypes' scalar type of a 4-bit or e8m0 element type (ml_dtypes is imported on first use: `import spatialc`
    does not load it)."""
    import ml_dtypes

    return getattr(ml_dtypes, ML_NAMES[dtype])


def format_of(np_dtype: Any) -> DType | None:
    """The 4-bit element type an array's dtype is (ml_dtypes int4, uint4, float4_e2m1fn), or None."""
    if np.dtype(np_dtype).kind != "V" or np.dtype(np_dtype).name not in ML_NAMES.values():
        return None
    return next((d for d in PACKED if np.dtype(ml_type(d)) == np.dtype(np_dtype)), None)


class PackError(ProgramError):
    """Values that `pack_int4` / `unpack_int4` cannot pack or unpack as asked."""


def format_dtype(weights: object) -> DType:
    """The stored element type of a weight format name (int4, uint4, mxfp4), or PackError naming the choices."""
    if isinstance(weights, DType) and weights in PACKED:
        return weights
    if isinstance(weights, str) and weights.lower() in WEIGHT_FORMATS:
        return WEIGHT_FORMATS[weights.lower()]
    raise PackError(f"unknown weight format {weights!r}; use one of {', '.join(WEIGHT_FORMATS)}")


def codes(values: np.ndarray, dtype: DType) -> np.ndarray:
    """The 4-bit codes (uint8, 0 … 15) of `values`, exact values of `dtype` (float64 or ml_dtypes)."""
    return np.asarray(values).astype(ml_type(dtype)).view(np.uint8) & 0xF


def from_codes(c: np.ndarray, dtype: DType) -> np.ndarray:
    """The values (as ml_dtypes `dtype`) of 4-bit codes: int4's sign-extended, the others as they are."""
    c = np.asarray(c, np.uint8) & 0xF
    if dtype == DType.INT4:
        return (c.astype(np.int8) - ((c & 8) << 1).astype(np.int8)).astype(ml_type(DType.INT4))
    return c.view(ml_type(dtype))


def pack_int4(w: Any, weights: str | None = None) -> np.ndarray:
    """B (K × N, K even) packed two a byte along K: byte (i, j) = code(B[2i, j]) | code(B[2i+1, j]) << 4.

    `w` is an ml_dtypes int4 / uint4 / float4_e2m1fn array (its format is its dtype), or numbers of the format
    `weights` names (int4, uint4, mxfp4): whole numbers in range for int4 / uint4, exact e2m1 values for mxfp4 —
    anything else is refused, never rounded here."""
    arr = np.asarray(w)
    found = format_of(arr.dtype)
    if found is None:
        if weights is None:
            raise PackError(
                f"pack_int4 takes an ml_dtypes int4 / uint4 / float4_e2m1fn array, or weights=; not {arr.dtype}"
            )
        dtype = format_dtype(weights)
        arr = exact_values("w", arr, dtype, PackError)
    else:
        dtype = found
    if weights is not None and format_dtype(weights) != dtype:
        raise PackError(f"the array holds {arr.dtype}, not the {weights} weights= names")
    if arr.ndim != 2 or arr.shape[0] % 2:
        raise PackError(f"pack_int4 packs a K × N matrix of even K along K; got shape {arr.shape}")
    c = codes(arr, dtype)
    return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: Any, weights: str) -> np.ndarray:
    """The K × N ml_dtypes array of the format `weights` names that `pack_int4` packed into `packed` ((K/2) × N
    uint8): row 2i from the low nibbles of row i, row 2i + 1 from the high ones."""
    dtype = format_dtype(weights)
    arr = np.asarray(packed)
    if arr.dtype != np.uint8 or arr.ndim != 2:
        raise PackError(f"unpack_int4 takes a 2-D uint8 array of packed bytes, not {arr.dtype} of shape {arr.shape}")
    out = np.empty((2 * arr.shape[0], arr.shape[1]), np.uint8)
    out[0::2], out[1::2] = arr & 0xF, arr >> 4
    return from_codes(out, dtype)


def exact_values(name: str, arr: np.ndarray, dtype: DType, error: type[Exception]) -> np.ndarray:
    """`arr` as float64 values of the 4-bit `dtype` or the e8m0 scale type, or `error` naming what is not one.
    Nothing is rounded: a 4-bit grid is too coarse for a silent rounding to be what anyone meant."""
    if np.dtype(arr.dtype).kind not in "biuf" and format_of(arr.dtype) is None:
        raise error(f"tensor {name}: expected numbers, got an array of {arr.dtype}")
    x = np.asarray(arr).astype(np.float64)
    if dtype in FOUR_BIT_RANGE:
        lo, hi = FOUR_BIT_RANGE[dtype]
        bad = ~((x == np.trunc(x)) & (x >= lo) & (x <= hi))
        what = f"whole numbers in {lo}..{hi}"
    elif dtype == DType.E2M1:
        bad = ~np.isfinite(x) | (np.abs(x) > E2M1_MAX)
        bad[~bad] = x[~bad].astype(ml_type(DType.E2M1)).astype(np.float64) != x[~bad]
        what = "float4_e2m1fn values (±0, 0.5, 1, 1.5, 2, 3, 4, 6)"
    else:
        lo, hi = E8M0_EXPONENTS
        with np.errstate(divide="ignore"):
            e = np.log2(np.where(x > 0, x, np.nan))
        bad = ~((x > 0) & np.isfinite(x) & (e == np.trunc(e)) & (e >= lo) & (e <= hi))
        what = f"powers of two 2^{lo} … 2^{hi} (float8_e8m0fnu)"
    if bad.any():
        at = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
        raise error(f"tensor {name} is {dtype.value} but {name}{list(at)} = {x[at]:g} is not one of its {what}")
    return x


def dequant(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, operand: str) -> np.ndarray:
    """round_op(f32(f32(s) × f32(q − z))) element by element (the arrays broadcast), as float64: the module's one
    definition of a dequantised weight. q, s and z are float64 values of their types; `operand` is bf16 or fp16."""
    from .narrow import round_bf16, round_fp16

    diff = np.asarray(q, np.float64) - (0.0 if zero is None else np.asarray(zero, np.float64))
    with np.errstate(over="ignore"):
        prod = np.asarray(scale, np.float64).astype(np.float32) * diff.astype(np.float32)
    return round_bf16(prod) if operand == "bf16" else round_fp16(prod)


def dequant_matrix(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, group: int, operand: str) -> np.ndarray:
    """The dequantised K × N operand of weights `q` (K × N values), scales and zero points ((K / group) × N)."""
    rows = np.arange(q.shape[0]) // group
    return dequant(q, scale[rows], None if zero is None else zero[rows], operand)


def input_values(spec: Any, value: Any) -> np.ndarray:
    """An input of a 4-bit or e8m0 tensor as float64 values of its type, or InputError: the K × N values (an
    ml_dtypes array as it is, or numbers), or for a 4-bit tensor of even rows its packed (rows / 2) × N uint8 bytes
    (`pack_int4`'s order), told apart by the shape; numpy, torch or CuPy arrays alike."""
    from ..inputs import InputError, _an_array, host_array, shaped

    rows, cols = spec.elems
    arr = host_array(spec.name, _an_array(spec, value))  # torch (uint8, float8_e8m0fnu), CuPy, lists: as numpy
    if (
        spec.dtype in PACKED
        and arr.dtype == np.uint8
        and spec.groups == 1
        and rows % 2 == 0
        and arr.shape == (rows // 2, cols)
    ):
        arr = unpack_int4(arr, spec.dtype)
    return exact_values(spec.name, np.asarray(shaped(spec, arr)), spec.dtype, InputError)


def w4_operand(p: Any, op: Any, weights: Any, inputs: Any) -> np.ndarray:
    """The dequantised K × N operand of a W4A16 program `p`: its weights tensor `weights`, scales and zero points
    (`op`, a Dequant) as `inputs` give them (checked and rounded as every input is), dequantised by
    `dequant_matrix`."""
    from ..inputs import check_inputs, specs_of

    wanted = [t.name for t in (p.tensor(weights), p.tensor(op.scale))] + (
        [p.tensor(op.zero).name] if op.zero is not None else []
    )
    specs = [s for s in specs_of(p) if s.name in wanted]
    got = check_inputs(p.name, specs, {name: inputs[name] for name in wanted if name in inputs})  # (one missing: said)
    q, s, *z = (np.asarray(got[name], np.float64) for name in wanted)
    return dequant_matrix(q, s, z[0] if z else None, op.group, op.operand.value)


def random_inputs(p: Any, rng: np.random.Generator, operands: bool = True) -> dict[str, np.ndarray]:
    """Random weights (packed), scales and zero points of a W4A16 program `p` (none for other programs): weights
    uniform over their format's values, int4 / uint4 scales uniform in [0.005, 0.02) (about what a layer's weights
    of unit variance give), e8m0 scales 2^-4 … 2^1, zero points uniform over the weights' range. Without `operands`,
    no weights (an input: nothing will multiply them), only the scales and zero points."""
    from ..ir.nodes import ComputeStage, ReadStage
    from ..ir.ops import Dequant

    out: dict[str, np.ndarray] = {}
    for s in p.stages:
        if not (isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Dequant)):
            continue
        op = s.kind.op
        read = next(r for r in p.stages if isinstance(r.kind, ReadStage) and s.ins[0] in r.outs)
        w, sc = p.tensor(read.kind.tensor), p.tensor(op.scale)
        if operands:
            out[w.name] = random_weights(w.elems, w.dtype, op.weights.value, rng)
        if sc.dtype == DType.E8M0:
            out[sc.name] = 2.0 ** rng.integers(-4, 2, sc.elems)
        else:
            from ..inputs import operand_values  # values of the scale type already: nothing is rounded on the way in

            out[sc.name] = operand_values(sc.name, rng.uniform(0.005, 0.02, sc.elems), sc.dtype)
        if op.zero is not None:
            z = p.tensor(op.zero)
            lo, hi = FOUR_BIT_RANGE[z.dtype]
            out[z.name] = rng.integers(lo, hi + 1, z.elems).astype(np.int8)
    return out


WEIGHT_CHUNK = 1 << 20  # values drawn at once: a whole K × N draw of int64 or float64 would take 8 bytes a weight


def random_weights(shape: tuple[int, int], dtype: DType, weights: str, rng: np.random.Generator) -> np.ndarray:
    """K × N random weights of a 4-bit format, packed (`pack_int4`; as values where K is odd): int4 / uint4 uniform
    over their whole numbers, e2m1 a value of ±{0, 0.5, …, 6} uniformly. Drawn a block of rows at a time, the same
    values as one draw of the whole (the generator fills row-major), so what is held at once is the packed bytes, a
    block's values and, for e2m1, a byte a weight (its magnitudes, all drawn before its signs)."""
    k, n = shape
    rows = k if k % 2 else max(2, WEIGHT_CHUNK // max(n, 1) // 2 * 2)  # even, so a block packs by itself
    blocks = [(r, min(r + rows, k)) for r in range(0, k, rows)]
    index = np.empty((k, n) if dtype == DType.E2M1 else (0, n), np.uint8)
    for r0, r1 in blocks if dtype == DType.E2M1 else ():  # e2m1: every magnitude is drawn before any sign
        index[r0:r1] = rng.integers(0, 8, (r1 - r0, n))

    def draw(r0: int, r1: int) -> np.ndarray:
        """Rows r0 … r1 − 1 of the weights, as values."""
        if dtype == DType.E2M1:
            return np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])[index[r0:r1]] * rng.choice([-1, 1], (r1 - r0, n))
        lo, hi = FOUR_BIT_RANGE[dtype]
        return rng.integers(lo, hi + 1, (r1 - r0, n))

    if k % 2:
        return draw(0, k)
    out = np.empty((k // 2, n), np.uint8)
    for r0, r1 in blocks:
        out[r0 // 2 : r1 // 2] = pack_int4(draw(r0, r1), weights)
    return out

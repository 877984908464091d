"""Block-scaled 8-bit float GEMMs: the one definition of a scale per group along K, of the promotion, of the
reference and of the bound (the interpreter, the reference and verify's rule 8 all read this module).

C = Σ_g (A_g · B_g) · sa[i, g] · sb[g, j]: K is cut into steps of PROMOTION_K = 128 elements; the product of a step
(its partial sum, the tensor core's accumulator) is multiplied by each row's scale of A and each column's scale of
B for that step's K group, and added to the float32 accumulator — DeepGEMM's promotion. A scale tensor holds one
float32 value per block of `outer` × `k` elements of its operand (`ops.KScale`): A's of element (i, k) is
sa[i // outer, k // k_block], B's of (k, j) is sb[k // k_block, j // outer]. A step lies within one K group of
each operand (`k` is a multiple of 128, or all of K). A grouped GEMM's (a mixture-of-experts layer, DeepGEMM's
grouped fp8 kernels): each group g has scale tensors of its own, sa[g] and sb[g] of the shapes above, and
C[g] = Σ_s (A[g]_s · B[g]_s) · sa[g][i, s] · sb[g][s, j] — a group's products take no other group's scale.

Rounding of each stage, in the reference (and the interpreter, which runs the same operations in the same order):
- the partial sum of a step: exact in float64 for e4m3 (products of two e4m3 values have 8 significant bits and lie
  in 2^-18 … 2^17.6; 128 of them sum to within 2^25: 43 bits), and for e5m2 while a step's products span less than
  2^45 (their 6 significant bits, 53 in all); past that one float64 rounding (2^-53 relative);
- sa · sb: exact (two float32 values: 24 + 24 significant bits, within float64's exponent range);
- partial · (sa · sb): one float64 rounding; the sum over the steps: one float64 rounding a step, in K order.
So the reference is within (G + 1) · 2^-53 of Σ_g |partial_g · sa · sb| of the exact value: far below the kernel's
float32 bound (`ulps`).

The kernel (`tolerance`): each step's partial sum in float32 (a K step of 128 products: 128 + 1 float32 roundings
of |A_g|·|B_g| at most), then sa · sb, · partial and + accumulator in float32 (3 more roundings of the step's
promoted magnitude, and the accumulator's sum over G steps: G more). In float32 ulps (2^-23, twice the unit
roundoff) of M = Σ_g |sa[i, g]| · |sb[g, j]| · (|A_g| @ |B_g|): 128 + G + 4, with G = ⌈K / 128⌉ — the bf16 and fp8
GEMMs' K + 4 at G = K / 128 groups of one term each, and at K = 4096 about 164 ulps (2 · 10^-5 relative).

The sm_90a form's kernel (Hopper's 8-bit float wgmma, whose sums keep about 13 fraction bits: `numerics.tolerance`)
makes each group's partial sum in the tensor core: the 128 / 32 = 4 k32 wgmma of a group each lose up to
FP8_WGMMA_STEP float32 ulps of the group's |A_g|·|B_g|, and no more, since the promotion takes the partial out into
float32 registers every 128 elements. So its bound adds 4 · FP8_WGMMA_STEP ulps of M whatever K is (2^-10: 0.1%),
where the unpromoted wgmma kernel's grows with K (3.2% at K = 4096): the promotion is what bounds it. (The host
emulation sums exact products in float32, inside either bound.)

OCP MX for 8-bit floats (MXFP8, `scales="mx"`): one float8_e8m0fnu scale 2^e per MX_K = 32 consecutive elements of
K, A's per row (sa[i, g], layout 1x32) and B's per column (sb[g, j], 32x1) — scale tensors of element type e8m0,
whose values are powers of two (`numerics.w4.values_of` defines the type, as for MXFP4's weights). The promotion
interval is then the group: C = Σ_g (A_g · B_g) · sa[i, g] · sb[g, j] with a step of 32, one k32 MMA (`promotion_k`).
Every stage above holds: a step's partial sum is exact in float64 (32 products), sa · sb is a power of two (exact
wherever it lies in float64's range: 2^-254 … 2^254), the promotion one rounding. The kernel's bound is the same
formula with 32 for 128: 32 + ⌈K / 32⌉ + 4 ulps of M (164 at K = 4096). The kernel never forms sa · sb in float32
(2^(ca + cb − 254) reaches 2^±254, past float32's range where the promoted partial sum need not be): it adds the
codes' exponents as integers and applies the power of two exactly, one rounding in the fused multiply-add
(lower/cuda/common/mx_promote.cuh), so the bound holds at every code 0 … 254 while M stays in float32's range (past
it the RangeWarning says so, as for any kernel; below float32's normal range the bound's absolute term, the smallest
normal float32, covers the subnormal roundings). The step is read from the layouts (`step_of`: their narrower
group, at most 128), which verify's rule 8 holds to the scales' element type.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir.nodes import DType
from ..ir.ops import BlockScales, KScale
from .w4 import MX_GROUP

PROMOTION_K = 128  # K elements a step promotes: DeepGEMM's BLOCK_K, and the K group of its 1x128 / 128x128 scales
PROMOTION_TILES = 8  # the same in 16-element tiles: a block-scaled plan's K step (ibw)
MX_K = MX_GROUP  # OCP MX's block along K: one e8m0 scale per 32 elements of each row of A and each column of B
MX_LAYOUTS = ("1x32", "32x1")  # A's and B's scale layouts of `scales="mx"` (spatialc/blockscaled.py)


def scale_shape(scale: KScale, outer: int, k: int) -> tuple[int, int]:
    """(blocks along the operand's outer axis, blocks along K) of a scale tensor for an operand of `outer` rows of A
    (or columns of B) and `k` elements of K; A's tensor is stored so, B's transposed ((K blocks, column blocks))."""
    return math.ceil(outer / scale.outer), math.ceil(k / scale.k)


def is_mx(p: Any) -> bool:
    """Whether program `p` is block-scaled the OCP MX way: its scale tensors hold e8m0 values (`scales="mx"`)."""
    scales = program_scales(p)
    return scales is not None and p.tensor(scales.a.tensor).dtype == DType.E8M0


def promotion_k(p: Any) -> int:
    """K elements a step of block-scaled program `p` promotes, read from its layouts (`step_of`): MX_K for MX
    scales, PROMOTION_K for DeepGEMM's."""
    scales = program_scales(p)
    return PROMOTION_K if scales is None else step_of(scales)


def step_of(scales: BlockScales) -> int:
    """The promotion interval of `scales`: their narrower group along K, at most PROMOTION_K — the one place it is
    read from, so that the interpreter, the bound, the planner and the printers take the step of the layouts that
    verify proved (whose rule 8 takes groups below PROMOTION_K only of e8m0 scales, and those only of MX_K, and
    other groups only of whole steps of PROMOTION_K or of all of K, so that no step spans two groups:
    `passes.verify.blockscale.check_scale_types`)."""
    return min(scales.a.k, scales.b.k, PROMOTION_K)


def kernel_ulps(k: int, wgmma_step: int = 0, wgmma_k: int = 32, step: int = PROMOTION_K) -> int:
    """The kernel's bound in float32 ulps of M (the module docstring): `step` + G + 4 for G = ⌈K / step⌉ steps
    (step 128, or MX_K for MX scales), and where each k32 instruction's sum loses `wgmma_step` ulps (Hopper's 8-bit
    float wgmma) step / `wgmma_k` of them a group."""
    return step + math.ceil(k / step) + 4 + (step // wgmma_k) * wgmma_step


def row_values(sa: np.ndarray, scale: KScale, rows: np.ndarray, k0: int) -> np.ndarray:
    """A's scale of each of `rows` (indices of A's rows) at K element `k0`, as float64: sa[i // outer, k0 // k]; a
    row past the tensor's (a padding row, whose products are zero) 0."""
    return _picked(np.asarray(sa, np.float64), rows // scale.outer, np.full(rows.shape, k0 // scale.k))


def col_values(sb: np.ndarray, scale: KScale, cols: np.ndarray, k0: int) -> np.ndarray:
    """B's scale of each of `cols` (indices of B's columns) at K element `k0`: sb[k0 // k, j // outer]; past the
    tensor's columns 0."""
    return _picked(np.asarray(sb, np.float64), np.full(cols.shape, k0 // scale.k), cols // scale.outer)


def _picked(t: np.ndarray, r: np.ndarray, c: np.ndarray) -> np.ndarray:
    inside = (r < t.shape[0]) & (c < t.shape[1])
    return np.where(inside, t[np.minimum(r, t.shape[0] - 1), np.minimum(c, t.shape[1] - 1)], 0.0)


def promote(partial: np.ndarray, sa_rows: np.ndarray, sb_cols: np.ndarray) -> np.ndarray:
    """A step's partial sum (rows × cols, float64) promoted: partial · (sa · sb), each row's sa and each column's sb
    (sa · sb exact in float64, the product one rounding)."""
    return partial * (sa_rows[:, None] * sb_cols[None, :])


def blockscaled_sum(
    a: np.ndarray,
    b: np.ndarray,
    sa: np.ndarray,
    sb: np.ndarray,
    scales: BlockScales,
    matmul: Any,
    step: int = PROMOTION_K,
    rows: Any = None,
) -> np.ndarray:
    """C = Σ over the steps of `step` (128, or MX_K) along K of promote(A_g @ B_g, sa, sb), in float64, steps in K
    order; `matmul` is the interpreter's float64 product (`interp.values.matmul`), so the interpreter's page
    products are the same. A may be a sample of A's rows, `rows` (their indices, which pick their scales)."""
    m, k = a.shape
    n = b.shape[1]
    rows, cols = _rows(m, rows), np.arange(n)
    out = np.zeros((m, n))
    for k0 in range(0, k, step):
        partial = matmul(a[:, k0 : k0 + step], b[k0 : k0 + step])
        out += promote(partial, row_values(sa, scales.a, rows, k0), col_values(sb, scales.b, cols, k0))
    return out


def magnitude(
    a: np.ndarray,
    b: np.ndarray,
    sa: np.ndarray,
    sb: np.ndarray,
    scales: BlockScales,
    matmul: Any,
    step: int = PROMOTION_K,
    rows: Any = None,
):
    """M = Σ_g |sa| · |sb| · (|A_g| @ |B_g|): what the bound's ulps are of."""
    return blockscaled_sum(np.abs(a), np.abs(b), np.abs(sa), np.abs(sb), scales, matmul, step, rows)


def _rows(m: int, rows: Any) -> np.ndarray:
    """The indices of A's `m` rows given: all of them, or the sample `rows` (`spatialc.evaluate(rows=...)`)."""
    return np.arange(m) if rows is None else np.asarray(rows)


def program_scales(p: Any) -> BlockScales | None:
    """The block scales of program `p`'s one matmul stage (None: not block-scaled)."""
    for s in p.stages:
        scales = getattr(getattr(s.kind, "op", None), "scales", None)
        if scales is not None:
            return scales
    return None


def scale_values(p: Any, scales: BlockScales, inputs: Any) -> tuple[np.ndarray, np.ndarray]:
    """The two scale tensors' values as given, each read as its tensor's type (float32: bf16 and float8_e8m0fnu
    exactly, other floats rounded to nearest even) — what the interpreter's stores hold."""
    from ..inputs import InputError, host_array, match_names, operand_values, shaped, specs_of
    from .w4 import exact_values

    names = [p.tensor(s.tensor).name for s in (scales.a, scales.b)]
    specs = [spec for spec in specs_of(p) if spec.name in names]
    out = []  # each of the shape evaluate takes (a grouped GEMM's: a matrix a group), or InputError as it says
    for spec, value in match_names(p.name, specs, {n: inputs[n] for n in names if n in inputs}):
        given = shaped(spec, host_array(spec.name, value))
        if spec.dtype == DType.E8M0:  # MX's e8m0 scales: powers of two taken exactly (numerics/w4.py's definition)
            values = exact_values(spec.name, given, spec.dtype, InputError)
        else:
            values = operand_values(spec.name, given, spec.dtype)
        out.append(np.asarray(values, np.float64).reshape(spec.shape))
    return out[0], out[1]


def program_sum(
    p: Any, a: np.ndarray, b: np.ndarray, inputs: Any, matmul: Any, rows: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """(the block-scaled sum C before its epilogue, M of the bound) of program `p`, from A and B rounded to the
    operand type (`reference.rounded_operands`); A may be a sample of its rows (in each group), `rows`."""
    scales = program_scales(p)
    assert scales is not None
    sa, sb = scale_values(p, scales, inputs)
    step = promotion_k(p)
    if a.ndim == 3:  # a grouped GEMM's (G, rows, K) @ (G, K, N): each group with its own scales
        sums = [program_sum_of(a[g], b[g], sa[g], sb[g], scales, matmul, step, rows) for g in range(a.shape[0])]
        return np.stack([x for x, _ in sums]), np.stack([m for _, m in sums])
    return program_sum_of(a, b, sa, sb, scales, matmul, step, rows)


def scale_products_past(p: Any, a: np.ndarray, b: np.ndarray, inputs: Any, rows: Any = None) -> np.ndarray | None:
    """Where (C's elements, each group's for a grouped GEMM) a kernel's float32 product sa · sb of some step is not
    the exact one within one rounding: ±inf past float32's largest value (inf · 0 is NaN where a group's partial sum
    is 0), or fewer bits in its subnormal range — so the kernel bound, which counts one rounding of sa · sb, does not
    hold there (`tolerance`'s range). None for MX scales, whose kernel never forms sa · sb (the module docstring)."""
    scales = program_scales(p)
    if scales is None or is_mx(p):
        return None
    sa, sb = scale_values(p, scales, inputs)
    rows, k, n = _rows(a.shape[-2], rows), a.shape[-1], b.shape[-1]  # (A and B as `program_sum` takes them)
    if a.ndim == 3:  # a grouped GEMM's: each group's own
        return np.stack([_inexact_products(sa[g], sb[g], scales, rows, n, k) for g in range(a.shape[0])])
    return _inexact_products(sa, sb, scales, rows, n, k)


def _inexact_products(sa: np.ndarray, sb: np.ndarray, scales: BlockScales, rows: Any, n: int, k: int) -> np.ndarray:
    cols = np.arange(n)
    out = np.zeros((len(rows), n), dtype=bool)
    for k0 in range(0, k, step_of(scales)):
        ra, cb = row_values(sa, scales.a, rows, k0), col_values(sb, scales.b, cols, k0)
        exact = ra[:, None] * cb[None, :]  # exact in float64: two float32 values
        with np.errstate(over="ignore", invalid="ignore"):
            f32 = ra.astype(np.float32)[:, None] * cb.astype(np.float32)[None, :]  # IEEE float32, subnormals kept
            out |= np.isfinite(exact) & ~(np.abs(f32 - exact) <= 2.0**-24 * np.abs(exact))
    return out


def program_sum_of(
    a: np.ndarray,
    b: np.ndarray,
    sa: np.ndarray,
    sb: np.ndarray,
    scales: BlockScales,
    matmul: Any,
    step: int = PROMOTION_K,
    rows: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(the block-scaled sum, M of the bound) of one product: one group's of a grouped GEMM (A `rows` of it)."""
    return (
        blockscaled_sum(a, b, sa, sb, scales, matmul, step, rows),
        magnitude(a, b, sa, sb, scales, matmul, step, rows),
    )

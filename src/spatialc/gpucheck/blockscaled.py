"""The GPU check's block-scaled fp8 rows (issue 34 item 2's measurement): `fp8bs:KIND:SIZE`, the e4m3 GEMM of
DeepGEMM's scales — one per row of A and 128 of K ("1x128"), one per 128 of K and 128 columns of B ("128x128") —
C = Σ_g (A_g · B_g) · scale_a[i, g] · scale_b[g, j // 128], stored in bf16 (`numerics/blockscale.py` defines it).

Every form that prints it for the device's target is a contestant (on sm_90 the persistent kernel and its general
form, mma.sync k32 with each 128 of K promoted from partial fragments; the sm_90a form refuses it, said in its
place), built as the GEMM rows are with `scales=LAYOUTS`, each checked against the float64 reference within the
GEMM rows' tolerance of bf16 and timed both ways; FLOPs 2·M·N·K. A and B are drawn as the fp8 rows' are (uniform in
±1, rounded once to the kind); the scales uniform in SCALE_RANGE, float32.

torch's contestants: `torch._scaled_mm` with per-tensor scales of 1.0 (cuBLASLt's plain fp8 GEMM: the bar the
issue sets, checked against A·B), and — where torch has it (2.9 and later on sm_90: cuBLAS 12.9's block scaling) —
with the same blockwise scales (scale_a (M, K/128) and scale_b (K/128, N/128), both outer-dim-major as aten asks),
checked against the row's own C. A torch that refuses the blockwise call is said in that contestant ("failed: …").

MXFP8 rows, `fp8mx:KIND:SIZE` (`case.mx`): the same GEMM with OCP MX's scales (`scales="mx"`: an e8m0 scale 2^e per
32 of K, A's per row and B's per column; C = Σ_g (A_g · B_g) · sa[i, g] · sb[g, j] with 32-wide groups), printed by
the persistent and general forms (the sm_90a form refuses it: its line stands in its place). The scales are drawn as
powers of two 2^e, e uniform in MX_EXPONENTS, held as float32 values and given to the kernel as e8m0 codes
(`cuda.kernel_tensors`). The same torch contestants: per-tensor `_scaled_mm` (the bar, against A·B); the blockwise
call takes 1x128 / 128x128 float32 scales, not these (torch's MX `_scaled_mm` runs on sm_100 and later), so it is
said n/a. Each form's C is held to `spatialc.tolerance(program, kernel=True)`'s bound on every element besides the
GEMM rows' bar (`tolerance_bound`: the bound's formula on the device, from the float64 sum and its magnitude).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .fp8 import SCALE_RANGE, SCALED_TENSOR, TORCH_DTYPE

PREFIX = "fp8bs"
MX_PREFIX = "fp8mx"  # MXFP8: OCP MX's e8m0 scales, one per 32 of K (`scales="mx"`)
LAYOUTS = ("1x128", "128x128")  # A's and B's scale layouts (spatialc/blockscaled.py)
MX = "mx"  # the MX rows' `scales=` (spatialc/blockscaled.py)
GROUP = 128  # K elements a scale covers (and B's columns)
MX_GROUP = 32  # K elements an MX scale covers (B's: one column)
MX_EXPONENTS = (-3, 2)  # an MX row's scales 2^e, e drawn uniformly from these (both ends in)
BLOCKWISE = "torch._scaled_mm (blockwise 1x128, 128x128 scales)"
CONTESTANTS = (SCALED_TENSOR, BLOCKWISE)
BLOCKWISE_TORCH = (2, 9)  # the first torch whose _scaled_mm takes block scales


def parse_blockscaled(text: str) -> tuple[str, tuple[int, int, int], bool, int] | None:
    """`fp8bs:e4m3:4096` → ('e4m3', (4096, 4096, 4096), False, 1), `fp8mx:e4m3:4096` the same with True (MX's
    scales), `fp8bs:e4m3:g8:512x4096x7168` → ('e4m3', (512, 4096, 7168), False, 8) (a grouped GEMM of 8 groups of at
    most 512 rows: groupedbs.py); None for a size without either prefix."""
    from ..errors import SpatialError
    from .sizes import parse_grouped, parse_size

    head, colon, rest = text.partition(":")
    if not colon or head.lower() not in (PREFIX, MX_PREFIX):
        return None
    kind, _, dims = rest.partition(":")
    if kind.lower() not in TORCH_DTYPE or not dims:
        raise SpatialError(f"size {text!r} is not {head.lower()}:KIND:SIZE with KIND one of {', '.join(TORCH_DTYPE)}")
    grouped = parse_grouped(dims) if head.lower() == PREFIX else None
    if grouped is not None:
        return kind.lower(), grouped[1], False, grouped[0]
    return kind.lower(), parse_size(dims), head.lower() == MX_PREFIX, 1


def scales_of(case: Any) -> Any:
    """The row's `scales=` for spatialc.gemm: DeepGEMM's layouts, or "mx"."""
    return MX if case.mx else LAYOUTS


def scale_shapes(case: Any) -> dict[str, tuple[int, int]]:
    """The two scale tensors' shapes, by name."""
    groups = math.ceil(case.k / (MX_GROUP if case.mx else GROUP))
    return {"scale_a": (case.m, groups), "scale_b": (groups, case.n if case.mx else math.ceil(case.n / GROUP))}


def more_inputs(case: Any, random: Callable[[tuple[int, int], float, float], Any]) -> dict[str, Any]:
    """One set of the scales, by name, each drawn as float32 by `random(shape, lo, hi)`: uniform in SCALE_RANGE, or
    an MX row's powers of two 2^e, e uniform over MX_EXPONENTS (exact in float32, and e8m0 values)."""
    if case.mx:
        lo, hi = MX_EXPONENTS
        return {name: 2.0 ** (random(shape, lo, hi + 1) // 1) for name, shape in scale_shapes(case).items()}
    return {name: random(shape, *SCALE_RANGE) for name, shape in scale_shapes(case).items()}


def reference(a: Any, b: Any, more: dict[str, Any], xp: Any) -> Any:
    """The block-scaled sum in float64 from A's and B's float64 values and the scales' (`more`), on `xp` (CuPy on the
    device, numpy in the tests): each group of K's product (128 wide, an MX row's 32) times its rows' and column
    blocks' scales (the group and the block of columns read from the scales' shapes)."""
    m, k = a.shape
    n = b.shape[1]
    sa, sb = more["scale_a"], more["scale_b"]
    group, block = math.ceil(k / sa.shape[1]), math.ceil(n / sb.shape[1])
    out = xp.zeros((m, n), dtype=xp.float64)
    for g, k0 in enumerate(range(0, k, group)):
        cols = xp.repeat(sb[g], block)[:n]
        out += (a[:, k0 : k0 + group] @ b[k0 : k0 + group]) * (sa[:, g : g + 1] * cols[None, :])
    return out


def tolerance_bound(tolerance: Any, ref: Any, magnitude: Any, xp: Any) -> Any:
    """`spatialc.tolerance(program, kernel=True)`'s bound of each element of a block-scaled GEMM on `xp`: ulps of
    M = Σ_g |sa·sb|·|A_g|@|B_g| (`magnitude`: `reference` of the absolute values), 2 ulps of C's type of |C| and
    float32's smallest normal (numerics/tolerance.py's block-scaled case, its numbers read from `tolerance`), with
    the float64 sum `ref` for C's rounded value (the last term then differs by at most half an ulp of C's type of
    itself: the tests hold the two within 2^-8)."""
    from ..numerics.tolerance import EPS32, out_rounding

    return tolerance.ulps * EPS32 * magnitude + out_rounding(tolerance.out_eps, ref, xp)


def library_reference(name: str, product: Any, scaled: Any) -> Any:
    """Per-tensor scales of 1.0 compute the plain product; blockwise ones the row's own C."""
    return product if name == SCALED_TENSOR else scaled


def missing(torch: Any, name: str) -> str:
    """Why torch cannot try this contestant ('' when it can)."""
    if name != BLOCKWISE:
        return ""
    version = str(getattr(torch, "__version__", ""))
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return f"torch {version}: no blockwise _scaled_mm known (2.9 and later)"
    if (major, minor) < BLOCKWISE_TORCH:
        return f"torch {version} has no blockwise _scaled_mm (2.9 and later)"
    return ""


def refusal(name: str, case: Any) -> str:
    """Why torch._scaled_mm refuses this case ('' when it takes it)."""
    if case.mx and name == BLOCKWISE:
        return (
            "the blockwise call takes 1x128 / 128x128 float32 scales, not MX's e8m0 one per 32 of K (torch's MX "
            "_scaled_mm runs on sm_100 and later)"
        )
    if case.precision == "e5m2":
        return "torch._scaled_mm refuses two e5m2 operands (Multiplication of two Float8_e5m2 matrices)"
    side = GROUP if name == BLOCKWISE else 16
    if case.m % side or case.n % side or case.k % side:
        return f"torch._scaled_mm ({name}) needs m, n and k multiples of {side} (m={case.m}, n={case.n}, k={case.k})"
    return ""


def describe(name: str) -> str:
    scales = "blockwise float32 scales (M × K/128, K/128 × N/128)" if name == BLOCKWISE else "per-tensor scales 1.0"
    return f"B column-major, {scales}, bf16 out; end to end adds B's transposed copy and the allocation of C"


def scaled_mm(torch: Any, name: str, case: Any, a: list[Any], b: list[Any], more: list[dict[str, Any]]) -> Any:
    """The two calls of a contestant over the input sets, as `fp8.scaled_mm` gives them."""
    from .fp8 import scaled_mm as tensorwise

    if name != BLOCKWISE:
        return tensorwise(torch, name, case, a, b, more)
    dtype = getattr(torch, TORCH_DTYPE[case.precision])
    ta = [torch.from_dlpack(x).view(dtype) for x in a]
    tb = [torch.from_dlpack(x).view(dtype) for x in b]
    tb_col = [t.t().contiguous().t() for t in tb]
    outer = [  # outer-dim-major: (M, K/128) and (K/128, N/128) stored column by column
        (torch.from_dlpack(s["scale_a"]).t().contiguous().t(), torch.from_dlpack(s["scale_b"]).t().contiguous().t())
        for s in more
    ]
    c, box = torch.empty((case.m, case.n), dtype=torch.bfloat16, device="cuda"), [None]

    def kernel(i: int) -> None:
        torch._scaled_mm(ta[i], tb_col[i], outer[i][0], outer[i][1], out_dtype=torch.bfloat16, out=c)

    def e2e(i: int) -> None:
        box[0] = torch._scaled_mm(ta[i], tb[i].t().contiguous().t(), *outer[i], out_dtype=torch.bfloat16)

    return kernel, c, e2e, box

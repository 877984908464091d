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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .fp8 import SCALE_RANGE, SCALED_TENSOR, TORCH_DTYPE

PREFIX = "fp8bs"
LAYOUTS = ("1x128", "128x128")  # A's and B's scale layouts (spatialc/blockscaled.py)
GROUP = 128  # K elements a scale covers (and B's columns)
BLOCKWISE = "torch._scaled_mm (blockwise 1x128, 128x128 scales)"
CONTESTANTS = (SCALED_TENSOR, BLOCKWISE)
BLOCKWISE_TORCH = (2, 9)  # the first torch whose _scaled_mm takes block scales


def parse_blockscaled(text: str) -> tuple[str, tuple[int, int, int]] | None:
    """`fp8bs:e4m3:4096` → ('e4m3', (4096, 4096, 4096)); None for a size without the prefix."""
    from ..errors import SpatialError
    from .cases import parse_size

    head, colon, rest = text.partition(":")
    if not colon or head.lower() != PREFIX:
        return None
    kind, _, dims = rest.partition(":")
    if kind.lower() not in TORCH_DTYPE or not dims:
        raise SpatialError(f"size {text!r} is not {PREFIX}:KIND:SIZE with KIND one of {', '.join(TORCH_DTYPE)}")
    return kind.lower(), parse_size(dims)


def scale_shapes(case: Any) -> dict[str, tuple[int, int]]:
    """The two scale tensors' shapes, by name."""
    groups = math.ceil(case.k / GROUP)
    return {"scale_a": (case.m, groups), "scale_b": (groups, math.ceil(case.n / GROUP))}


def more_inputs(case: Any, random: Callable[[tuple[int, int], float, float], Any]) -> dict[str, Any]:
    """One set of the scales, by name, each drawn as float32 by `random(shape, lo, hi)`."""
    return {name: random(shape, *SCALE_RANGE) for name, shape in scale_shapes(case).items()}


def reference(a: Any, b: Any, more: dict[str, Any], xp: Any) -> Any:
    """The block-scaled sum in float64 from A's and B's float64 values and the scales' (`more`), on `xp` (CuPy on the
    device, numpy in the tests): each 128 of K's product times its rows' and column blocks' scales."""
    m, k = a.shape
    n = b.shape[1]
    sa, sb = more["scale_a"], more["scale_b"]
    out = xp.zeros((m, n), dtype=xp.float64)
    for g, k0 in enumerate(range(0, k, GROUP)):
        cols = xp.repeat(sb[g], GROUP)[:n]
        out += (a[:, k0 : k0 + GROUP] @ b[k0 : k0 + GROUP]) * (sa[:, g : g + 1] * cols[None, :])
    return out


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

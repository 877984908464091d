"""The GPU check's fp8 rows (issue 34 item 8): `fp8:KIND:SIZE`, the GEMM of 8-bit float operands (KIND `e4m3` or
`e5m2`) with per-row and per-column dequant scales in its epilogue, C = (A·B) · row_scale · col_scale, stored in bf16.

The row is an ordinary GEMM row whose precision is the fp8 kind: every form that prints fp8 GEMMs for the device's
target is a contestant (on sm_90 the persistent kernel and its general form, mma.sync k32 — which ptxas widens to
fp16 there — and the same GEMM built for sm_90a in the sm_90a form, wgmma k32), built as the GEMM rows are
(`builds._build`, with this module's epilogue), each checked against the float64 reference within the GEMM rows'
tolerance of bf16 and timed both ways; FLOPs 2·M·N·K.

A and B are drawn uniform in ±1 and rounded once to the kind (the reference multiplies the rounded values, exact in
float64); the scales uniform in SCALE_RANGE, one per row and one per column, stored as float32 (spatialc's kernel
reads them as float32, as torch's rowwise scales are).

torch's contestants are `torch._scaled_mm` (cuBLASLt's fp8 GEMM), B column-major as it requires (kernel only: B
copied so beforehand; end to end: the copy is part of the call), bf16 out: with rowwise scales (`scale_a` of shape
(M, 1), `scale_b` (1, N), float32: the row's own epilogue) and with per-tensor scales (two scalar 1.0s: the plain
product, which is what it is checked against). The fastest right one is the bar. torch refuses two e5m2 operands
(aten's "Multiplication of two Float8_e5m2 matrices is not supported"): an e5m2 row says so in each contestant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FP8_PRECISIONS = ("e4m3", "e5m2")  # the fp8 rows' (a row's precision is its operands' kind)
OUT = "bf16"  # C's type in an fp8 row, as torch._scaled_mm gives it for rowwise scales
TORCH_DTYPE = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
SCALED_ROWWISE = "torch._scaled_mm (rowwise scales)"
SCALED_TENSOR = "torch._scaled_mm (per-tensor scales)"
SCALED_MM = (SCALED_ROWWISE, SCALED_TENSOR)
EPILOGUE_TEXT = "(A·B) · row_scale · col_scale"
SCALE_RANGE = (0.5, 1.5)  # the scales' values (as fused.SCALE_RANGE)
VALUE_RANGE = (-1.0, 1.0)  # A's and B's values before their rounding to the kind


def is_fp8(precision: str) -> bool:
    return precision in FP8_PRECISIONS


def epilogue() -> list[Any]:
    """The fp8 row's epilogue: the dequant scales, in the order C meets them."""
    import spatialc

    return [spatialc.row_scale(), spatialc.col_scale()]


def parse_fp8(text: str) -> tuple[str, tuple[int, int, int]] | None:
    """`fp8:e4m3:4096` → ('e4m3', (4096, 4096, 4096)); None for a size without the prefix."""
    from ..errors import SpatialError
    from .sizes import parse_size

    head, colon, rest = text.partition(":")
    if not colon or head.lower() != "fp8":
        return None
    kind, _, dims = rest.partition(":")
    if kind.lower() not in FP8_PRECISIONS or not dims:
        raise SpatialError(f"size {text!r} is not fp8:KIND:SIZE with KIND one of {', '.join(FP8_PRECISIONS)}")
    return kind.lower(), parse_size(dims)


# ---- on the device ------------------------------------------------------------------------------------------------


def more_inputs(case: Any, random: Callable[[tuple[int, int], float, float], Any]) -> dict[str, Any]:
    """One set of the dequant scales, by name, each drawn as float32 by `random(shape, lo, hi)`."""
    return {"row_scale": random((case.m, 1), *SCALE_RANGE), "col_scale": random((1, case.n), *SCALE_RANGE)}


def reference(product: Any, more: dict[str, Any]) -> Any:
    """The scales applied in float64 to the float64 product (`more`: the scales' float64 values, by name)."""
    return product * more["row_scale"] * more["col_scale"]


def library_reference(name: str, product: Any, scaled: Any) -> Any:
    """What a library contestant of an fp8 row is checked against: per-tensor scales of 1.0 compute the plain
    product; rowwise scales the row's own C."""
    return product if name == SCALED_TENSOR else scaled


def refusal(name: str, case: Any) -> str:
    """Why torch._scaled_mm refuses this case ('' when it takes it): two e5m2 operands, or sides that are not
    multiples of 16 (cuBLASLt's fp8 layouts)."""
    if case.precision == "e5m2":
        return "torch._scaled_mm refuses two e5m2 operands (Multiplication of two Float8_e5m2 matrices)"
    if case.m % 16 or case.n % 16 or case.k % 16:
        return f"torch._scaled_mm needs m, n and k multiples of 16 (m={case.m}, n={case.n}, k={case.k})"
    return ""


def describe(name: str) -> str:
    """What a _scaled_mm contestant's two timings hold."""
    scales = "rowwise float32 scales (M×1, 1×N)" if name == SCALED_ROWWISE else "per-tensor scales 1.0 (A·B alone)"
    return (
        f"B column-major as cuBLASLt's fp8 GEMM takes it, {scales}, bf16 out, fp32 accumulation (use_fast_accum "
        "off); end to end adds B's transposed copy and the allocation of C"
    )


def scaled_mm(torch: Any, name: str, case: Any, a: list[Any], b: list[Any], more: list[dict[str, Any]]) -> Any:
    """The two calls of a _scaled_mm contestant over the input sets (CuPy arrays: A's and B's bits as uint8, the
    scales as float32), with C's tensor and the end-to-end result's box: (kernel(i), c, e2e(i), box)."""
    dtype = getattr(torch, TORCH_DTYPE[case.precision])
    ta = [torch.from_dlpack(x).view(dtype) for x in a]
    tb = [torch.from_dlpack(x).view(dtype) for x in b]
    tb_col = [t.t().contiguous().t() for t in tb]  # the same (k, n) matrix, column-major
    if name == SCALED_ROWWISE:
        sa = [torch.from_dlpack(m["row_scale"]) for m in more]
        sb = [torch.from_dlpack(m["col_scale"]) for m in more]
    else:
        one = torch.tensor(1.0, dtype=torch.float32, device="cuda")
        sa = sb = [one for _ in a]
    c, box = torch.empty((case.m, case.n), dtype=torch.bfloat16, device="cuda"), [None]

    def kernel(i: int) -> None:
        torch._scaled_mm(ta[i], tb_col[i], sa[i], sb[i], out_dtype=torch.bfloat16, out=c)

    def e2e(i: int) -> None:
        box[0] = torch._scaled_mm(ta[i], tb[i].t().contiguous().t(), sa[i], sb[i], out_dtype=torch.bfloat16)

    return kernel, c, e2e, box

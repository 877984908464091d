"""sizes: the GPU check's size strings read — `256`, `4097x513x1031`, and the prefixed kinds of row a size names
(`gG:…` grouped, `mcGYxGX:…` multicast, `map:KIND:MxN[:PRECISION]`, `fused:…`, `sweep:…`). `cases.cases_of` turns
them into cases; the fp8, block-scaled, attention and W4A16 rows read their own prefixes (fp8.py, blockscaled.py,
attnrows.py, w4rows.py) with `parse_size` for the dimensions."""

from __future__ import annotations

from ..errors import SpatialError


def parse_grouped(text: str) -> tuple[int, tuple[int, int, int]] | None:
    """`g8:4096x4096x4096` → (8, (4096, 4096, 4096)); None for a plain size."""
    if not text.lower().startswith("g"):
        return None
    head, _, rest = text[1:].partition(":")
    try:
        groups = int(head)
    except ValueError:
        raise SpatialError(f"size {text!r} is not gG:MAXROWSxNxK (a grouped GEMM)") from None
    if groups < 2 or not rest:
        raise SpatialError(f"size {text!r} is not gG:MAXROWSxNxK with at least 2 groups")
    return groups, parse_size(rest)


def parse_multicast(text: str) -> tuple[tuple[int, int], tuple[int, int, int]] | None:
    """`mc2x2:4096` → ((2, 2), (4096, 4096, 4096)); None for a size without groups."""
    if not text.lower().startswith("mc"):
        return None
    head, _, rest = text[2:].partition(":")
    parts = head.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts) or not rest:
        raise SpatialError(f"size {text!r} is not mcGYxGX:SIZE (a multicast group of GY x GX sites)")
    return (int(parts[0]), int(parts[1])), parse_size(rest)


def parse_map(text: str) -> tuple[str, tuple[int, int], str] | None:
    """`map:swiglu:4096x11008` → ('swiglu', (4096, 11008), ''); `map:softmax:4096x4096:fp32` → (…, 'fp32'): a map
    that names its precision (one of `cases.MAP_PRECISIONS`), run in it whatever the run's list; None for a size
    without the prefix."""
    from .cases import MAP_PRECISIONS
    from .maps import kinds

    head, colon, rest = text.partition(":")
    if not colon or head.lower() != "map":
        return None
    kind, _, tail = rest.partition(":")
    dims, _, precision = tail.partition(":")
    parts = dims.lower().replace("×", "x").split("x")
    if kind not in kinds() or len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise SpatialError(f"size {text!r} is not map:KIND:MxN[:PRECISION] with KIND one of {', '.join(kinds())}")
    if precision and precision.lower() not in MAP_PRECISIONS:
        takes = ", ".join(MAP_PRECISIONS)
        raise SpatialError(f"size {text!r} names precision {precision!r}; a map's is one of {takes}")
    return kind, (int(parts[0]), int(parts[1])), precision.lower()


def parse_fused(text: str) -> tuple[int, int, int] | None:
    """`fused:4096` → (4096, 4096, 4096); None for a size without the prefix."""
    head, colon, rest = text.partition(":")
    if not colon or head.lower() != "fused":
        return None
    if not rest:
        raise SpatialError(f"size {text!r} is not fused:SIZE (a GEMM with scales and a residual in its epilogue)")
    return parse_size(rest)


def parse_sweep(text: str) -> tuple[int, int, int] | None:
    """`sweep:4096` → (4096, 4096, 4096); None for a size without the prefix."""
    head, colon, rest = text.partition(":")
    if not colon or head.lower() != "sweep":
        return None
    if not rest:
        raise SpatialError(f"size {text!r} is not sweep:SIZE (each form's plans around its planner's, at one size)")
    return parse_size(rest)


def parse_size(text: str) -> tuple[int, int, int]:
    """`256` → 256³; `4097x513x1031` (or with commas) → (m, n, k)."""
    parts = text.lower().replace(",", "x").replace("×", "x").split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise SpatialError(f"size {text!r} is not N or MxNxK") from None
    if len(dims) == 1:
        dims *= 3
    if len(dims) != 3 or min(dims) < 1:
        raise SpatialError(f"size {text!r} is not N or MxNxK with positive numbers")
    return dims[0], dims[1], dims[2]

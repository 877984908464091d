"""The GPU check's block-scaled grouped rows: `fp8bs:e4m3:gG:MAXROWSxNxK`, DeepGEMM's grouped fp8 GEMM of a
mixture-of-experts layer — `grouped_gemm(G, MAXROWS, N, K, "e4m3", scales=("1x128", "128x128"), out="bf16")`: each
group g's first m_g rows of A (row counts drawn as the grouped rows draw them, `cases.grouped_sizes`) times its own
B, each 128 of K's partial product scaled by its rows' scale_a[g] and its column block's scale_b[g] (the sum
`blockscaled.reference` defines), C in bf16.

It is a grouped row (grouped.py: its general form's output poisoned first, rows below each count checked against the
float64 reference within the GEMM rows' tolerance of bf16, rows past it keeping the poison; kernel only) with the
block-scaled row's operands and scales (blockscaled.py: A and B uniform in ±1 rounded once to e4m3, the scales
uniform in SCALE_RANGE, float32, a matrix a group). Only the general form prints it (the persistent and sm_90a
forms refuse run-time row counts: their lines stand in their places).

torch's contestants, each a loop over the groups as the grouped rows' `torch.matmul` loop is (each call on its
group's rows padded up to the call's multiple — 16 rows, 128 for the blockwise call — of rows drawn beside them; only
the first m_g rows are checked): `torch._scaled_mm` with per-tensor scales of 1.0 (cuBLASLt's fp8 GEMM, the bar,
checked against each group's A·B) and, where torch has it (2.9 and later), with the group's blockwise scales (checked
against the row's own C). `torch._grouped_mm` multiplies bf16 and its fp8 sibling takes rowwise scales, not these
blocks: no such contestant.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

from ..runtime.tilize import fp8_bits
from . import blockscaled as bs
from .agreement import values64
from .cases import ELEM_OF, Case
from .fp8 import SCALE_RANGE, TORCH_DTYPE
from .grouped import GroupedRows, _References

LOOP_TENSOR = "torch._scaled_mm per group (per-tensor scales)"
LOOP_BLOCKWISE = "torch._scaled_mm per group (blockwise 1x128, 128x128 scales)"


def scale_shapes(case: Case) -> dict[str, tuple[int, int, int]]:
    """A grouped row's scale tensors' shapes: a matrix a group."""
    k_blocks = math.ceil(case.k / bs.GROUP)
    return {
        "scale_a": (case.groups, case.m, k_blocks),
        "scale_b": (case.groups, k_blocks, math.ceil(case.n / bs.GROUP)),
    }


class GroupedScaled(GroupedRows):
    """A block-scaled grouped row on the GPU runner's device (grouped.py's measurement, its hooks filled in)."""

    def libraries(self, case: Case) -> tuple[str, ...]:
        return (LOOP_TENSOR, LOOP_BLOCKWISE)

    def _operands(self, case: Case) -> tuple[Any, Any]:
        cp = self.cp
        rs = cp.random.RandomState(zlib.crc32(f"{self.r.seed} {case}".encode()))
        elem = ELEM_OF[case.precision]
        a, b = (
            fp8_bits(rs.uniform(-1.0, 1.0, size=shape, dtype=cp.float32), elem, cp)
            for shape in ((case.groups, case.m, case.k), (case.groups, case.k, case.n))
        )
        self.scales = {
            name: rs.uniform(*SCALE_RANGE, size=shape, dtype=cp.float32) for name, shape in scale_shapes(case).items()
        }
        return a, b

    def _references(self, a: Any, b: Any, sizes: Any, case: Case) -> Any:
        return _ScaledReferences(self.cp, a, b, sizes, ELEM_OF[case.precision], self.scales)

    def _params(self, prep: Any, args: dict[str, Any]) -> dict[str, Any]:
        return {name: prep.tiled(args[name], x) for name, x in self.scales.items()}

    def _library_ref(self, name: str, refs: Any, g: int) -> Any:
        return refs.plain(g) if name == LOOP_TENSOR else refs.of(g)

    def _library_elem(self, case: Case) -> str:
        return "bfloat16"

    def _library(self, name: str, case: Case, a: Any, b: Any, sizes: Any, refs: Any, deadline: Any) -> Any:
        from .cases import Contestant

        torch = self.r.torch
        why = bs.missing(torch, bs.BLOCKWISE) if torch is not None and name == LOOP_BLOCKWISE else ""
        if why:
            return Contestant(name, "cublas", note=f"unavailable: {why}")
        return super()._library(name, case, a, b, sizes, refs, deadline)

    def _make(self, name: str, case: Case, a: Any, b: Any, sizes: Any) -> tuple[Callable[[], None], Any, str]:
        """A loop of `torch._scaled_mm` over the groups, each on its rows padded to the call's multiple."""
        torch, libs = self.r.torch, self.r.libs
        dtype = getattr(torch, TORCH_DTYPE[case.precision])
        blockwise = name == LOOP_BLOCKWISE
        side = bs.GROUP if blockwise else 16
        counts = [min(case.m, side * math.ceil(int(m) / side)) for m in sizes]
        ta = torch.from_dlpack(a).view(dtype)
        tb = [torch.from_dlpack(b[g]).view(dtype).t().contiguous().t() for g in range(case.groups)]  # column-major
        if blockwise:  # outer-dim-major, as aten asks; A's the called rows' alone
            sa = [torch.from_dlpack(self.scales["scale_a"][g, :m]).t().contiguous().t() for g, m in enumerate(counts)]
            sb = [torch.from_dlpack(self.scales["scale_b"][g]).t().contiguous().t() for g in range(case.groups)]
        else:
            one = torch.tensor(1.0, dtype=torch.float32, device="cuda")
            sa = sb = [one] * case.groups
        c = torch.empty((case.groups, case.m, case.n), dtype=torch.bfloat16, device="cuda")

        def loop() -> None:
            for g, m in enumerate(counts):
                if m:
                    torch._scaled_mm(ta[g, :m], tb[g], sa[g], sb[g], out_dtype=torch.bfloat16, out=c[g, :m])

        def rows() -> Any:
            return (libs.from_torch(c[g, :m]) for g, m in enumerate(counts))

        scales = "its blockwise scales" if blockwise else "per-tensor scales 1.0"
        return loop, rows, f"a loop of {case.groups} torch._scaled_mm calls ({scales}, B column-major), into C"


class _ScaledReferences(_References):
    """Each group's block-scaled float64 sum (`blockscaled.reference`), and its plain A·B for the per-tensor call."""

    def __init__(self, cp: Any, a: Any, b: Any, sizes: Any, elem: str, scales: dict[str, Any]):
        super().__init__(cp, a, b, sizes, elem)
        self.scales, self.plains = scales, {}

    def of(self, g: int) -> Any:
        if g not in self.cache:
            m, cp = int(self.sizes[g]), self.cp
            a, b = values64(self.a[g, :m], self.elem, cp), values64(self.b[g], self.elem, cp)
            more = {"scale_a": self.scales["scale_a"][g, :m], "scale_b": self.scales["scale_b"][g]}
            self.cache[g] = bs.reference(a, b, {k: v.astype(cp.float64) for k, v in more.items()}, cp)
        return self.cache[g]

    def plain(self, g: int) -> Any:
        if g not in self.plains:
            m, cp = int(self.sizes[g]), self.cp
            self.plains[g] = cp.matmul(values64(self.a[g, :m], self.elem, cp), values64(self.b[g], self.elem, cp))
        return self.plains[g]

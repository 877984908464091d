"""A block-scaled GEMM's A scales in the sm_90a form: a TMA box a K group, landed beside A's page.

Where A's scales are one a row (`KScale.outer` 1: DeepGEMM's 1x128, and "row"), the scale tensor (rows × K groups)
is stored transposed (`KernelParam.order` "cols": groups × rows, row-major) — DeepGEMM's MN-major layout — so that
the scales of an item's rows for one K group are contiguous: one TMA box of `rows` floats (512 bytes for 128 rows).
The producer loads it with A's page into a small ring of its own, `sa_stage`, slot for slot with A's ring, on A's
full barrier: A's `expect_tx` counts its bytes too, so the consumers' Wait on A covers it and A's Pop frees it.
Where A's pages are multicast to a cluster, so is the box (the group's items share their rows), and each
receiver's `expect_tx` counts it too (`HopperPrinter.page_bytes`).
A row past the tensor's (an item's padding) is past the map's rows, and the copy engine fills it with zero — the
scale a padding row reads in every form. The promotion (`common.blockscale.promotion`) reads a lane's two rows'
scales from the slot the K step's A page is read from.

B's scales (one a 128 × 128 block: a value or two an item a group) and A scales of other layouts (one a 128-row block,
one a tensor) are too few for a box of their own (a TMA box row is at least 16 bytes): the consumers read them from
global memory, as DeepGEMM's math warps read B's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ....ir.nodes import SpatialProgram
from ....ir.ops import BlockScales, Compute, MatmulTiles
from ....numerics.blockscale import program_scales
from ...artifact import TensorMap
from .tma import param_at

if TYPE_CHECKING:
    from ..general.kernel import GeneralKernel

SCALE_ALIGN = 128  # bytes: where a TMA box without swizzle lands
SCALE_BYTES = 4  # float32 scales


@dataclass(frozen=True, slots=True)
class ScaleStage:
    """A's scales of a K group, landed by TMA beside A's page: `ring` is A's (its slots, full barrier and Pop),
    `rows` the item's rows (a box), `k` the K elements a scale covers, `map` the box's tensor map."""

    ring: int
    rows: int
    k: int
    map: TensorMap

    @property
    def bytes(self) -> int:
        """Bytes of one slot's box: what A's expect_tx adds."""
        return self.rows * SCALE_BYTES


def stage_bytes(rows: int, depth: int) -> int:
    """The most shared memory a `depth`-deep sa_stage of `rows` rows takes, with its alignment (the planner's
    reserve for a block-scaled plan)."""
    return depth * rows * SCALE_BYTES + SCALE_ALIGN


def scale_stage_bytes(p: SpatialProgram) -> int:
    """The bytes of `p`'s A-scale stage in the sm_90a form (A's depth × the item's rows), 0 where it has none."""
    scales = program_scales(p)
    if scales is None or scales.a.outer != 1 or not p.plans:
        return 0
    plan = p.plans[0]
    return plan.depth * plan.item_tiles[0] * 16 * SCALE_BYTES


def scale_stage(p: SpatialProgram, k: GeneralKernel, scales: BlockScales, index: int) -> ScaleStage | None:
    """The TMA'd A scales of `p` (map number `index`), or None where they are read from global memory."""
    if scales.a.outer != 1:
        return None
    mm = next(
        op for role in k.roles for op in role.walk() if isinstance(op, Compute) and isinstance(op.op, MatmulTiles)
    )
    rows = k.plan.item_tiles[0] * 16
    at = param_at(p, scales.a.tensor)
    # The stored matrix is groups × rows (transposed): a box of one group row and the item's rows.
    return ScaleStage(k.rings.template[mm.ins[0]], rows, scales.a.k, TensorMap(index, at, (1, rows), 0, True))

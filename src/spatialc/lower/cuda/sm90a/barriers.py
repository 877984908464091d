"""The named barriers an sm_90a kernel prints, by user, for `common/barrier_ids.check_barrier_ids`: the general
form's engines (1 + their index), each consumer warpgroup's staging boxes (`staging.OUT_BARRIER` + the warpgroup,
where the output leaves by TMA store), and the ping-pong's turns (`pingpong.PINGPONG_BARRIER` + the warpgroup). The
ids are read where they are defined, at the call, so a kernel is checked against what its printers print."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.barrier_ids import check_barrier_ids, engine_barriers
from . import pingpong, staging
from .overlap import PINGPONG

if TYPE_CHECKING:
    from .kernel import HopperKernel


def barrier_uses(hk: HopperKernel) -> dict[str, tuple[int, ...]]:
    """Each user of a named barrier in `hk`'s text and the ids it uses."""
    uses = engine_barriers(r.engine for r in hk.base.roles)
    groups = range(hk.wg.consumers)
    if hk.chunk:  # (`staging.defines`: OUT_BAR + warp / 4)
        uses["the staging boxes (OUT_BAR)"] = tuple(staging.OUT_BARRIER + g for g in groups)
    if hk.schedule == PINGPONG:
        uses["the ping-pong's turns"] = tuple(pingpong.PINGPONG_BARRIER + g for g in groups)
    return uses


def check_barriers(hk: HopperKernel) -> None:
    """Refuse `hk` where two of its named barriers' users share an id, or one is not 1 to 15 (a typed
    `BarrierClash`)."""
    check_barrier_ids(barrier_uses(hk))

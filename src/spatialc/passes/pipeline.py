"""The pass list: tile → place → schedule → verify. Each step is a pure function of the one before."""

from __future__ import annotations

from ..ir.nodes import SpatialProgram
from ..target import SpatialTarget
from .place import place
from .schedule import schedule
from .tile import tile
from .verify import verify


def build(
    program: SpatialProgram,
    target: SpatialTarget,
    *,
    block: tuple[int, int, int] | None = None,
    sub_blocks: tuple[int, int] | None = None,
    depth: int | None = None,
    sites: int | None = None,
    placement: str | None = None,
    form: str = "auto",
) -> SpatialProgram:
    """Run every pass in order and return the verified program, planned for the `form` CUDA kernel."""
    p = program.evolve(target=target.name)
    # The plan comes first: the item grid it fixes is what placement distributes.
    p = tile(p, target, block=block, sub_blocks=sub_blocks, depth=depth, form=form)
    # Placement before schedule: each site's ITEM loop count is the number of items placed on it.
    p = place(p, target, sites=sites, placement=placement, form=form)
    p = schedule(p)
    # Last, and the only pass that sets `verified`: everything after this (eval, lower) may rely on it.
    return verify(p, target)

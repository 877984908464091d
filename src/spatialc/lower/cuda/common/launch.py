"""The launch contract of a kernel printed from a verified program (`Launch`): its grid of sites, their items and work
list, its parameters and how a host language launches it."""

from __future__ import annotations

from ....inputs import row_limits
from ....ir.nodes import SpatialProgram, TensorRole
from ....ir.ops import Attention
from ....ir.worklist import RULES, launch_sites, split_items, work_table
from ....target import SpatialTarget
from ...artifact import KernelParam, Launch
from .dequant import param_c_type
from .rings import MmaTypes


def site_items(p: SpatialProgram) -> tuple[tuple[int, ...], ...]:
    """Each site's items, in blockIdx order."""
    assert p.placement is not None
    return tuple(tuple(int(i) for i in items) for _, items in p.placement.items_of_site)


def launch_for(
    p: SpatialProgram,
    target: SpatialTarget,
    kernel_name: str,
    types: MmaTypes,
    threads: int,
    dyn_smem: int,
    opt_in: bool,
    blocks_per_sm: int,
    sync: tuple[int, ...] = (),
    fixed: bool = False,
    cooperative: bool = False,
    trip_error: int = -1,
    cluster: int = 1,
) -> Launch:
    """How a host language launches a kernel printed from `p`. A placement the rules make, over as many sites as the
    target keeps resident, follows the device at launch (its multiprocessors × the blocks each holds); any other
    keeps its list. Inputs hold the operand type, the output the output tensor's type, parameters their own. A kernel
    `fixed` to its sites (they run different programs), or `cooperative` (they hand over to each other through its
    `sync` words), runs exactly its sites."""
    heads = any(isinstance(getattr(s.kind, "op", None), Attention) for s in p.stages)  # Q, K, V by (batch, heads)
    params = tuple(
        KernelParam(
            t.name,
            param_c_type(t, types.operand),
            t.role.value,
            t.elems,
            t.tiles,
            t.order.value,
            t.groups,
            heads and t.role == TensorRole.INPUT,
        )
        for t in p.tensors
    )
    placement = p.placement
    assert placement is not None and p.plans
    items = site_items(p)
    n_items = p.plans[0].items
    grid = p.plans[0].placed
    try:
        rule = split_items(n_items, len(items), placement.kind, grid, placement.band)
    except ValueError:  # no rule's kind, or a rule without its grid or band: its list is passed as it stands
        rule = None
    ruled = placement.kind in RULES and [list(i) for i in items] == rule
    follows = ruled and not (fixed or cooperative) and len(items) == launch_sites(n_items, target.units, blocks_per_sm)
    return Launch(
        kernel_name,
        len(items),
        threads,
        dyn_smem,
        params,
        (p.tile.rows, p.tile.cols),
        opt_in,
        n_items,
        placement.kind if ruled else "listed",
        blocks_per_sm if follows else 0,
        () if ruled else tuple(work_table([list(i) for i in items])),
        sync,
        cooperative,
        trip_error,
        grid if ruled else (0, 0),
        placement.band if ruled else 0,
        tuple(sorted(row_limits(p).items())),
        cluster,
    )

"""verify's rule 1 on what the interpreter and the lowering size memory and pick code by: the target, the tile, each
tensor's shape and padding, the plan, and the fields of every compute op. All of it is checked before any rule walks
an op, so no later rule (and nothing after verify) meets a tile grid, an item count or a compute op it cannot hold.
"""

from __future__ import annotations

import math

from ..errors import IllFormedError
from ..ir.nodes import Plan, SpatialProgram, Tensor, TensorRole
from ..ir.ops import ComputeOp, MatmulTiles, Precision, Requant, Scalar
from ..target import TARGETS, SpatialTarget

# The frontend's scalar ops; the interpreter, the host emulation and the kernel's epilogue know no others.
SCALAR_OPS = ("add", "mul", "max", "min")
# quantize_multiplier's ranges: a Q31 multiplier, a shift of at most 30 left or 31 right, an int8 zero point.
REQUANT_MULTIPLIER = (0, 2**31 - 1)
REQUANT_SHIFT = (-31, 30)
REQUANT_ZERO_POINT = (-128, 127)
# More items than any placement could list (the coverage rule builds a list of them).
MAX_ITEMS = 2**24
# An item's side or K step, in tiles: above what any target's shared memory can stage one K step of (about 900
# one-byte tiles), so no plan the tile pass makes is refused, yet an item — and with it a tensor's padding — is small.
MAX_ITEM_SIDE = 1024


def check_target(p: SpatialProgram, target: SpatialTarget | None = None) -> None:
    """The program names a target spatialc knows, or the one it is verified for."""
    if p.target not in TARGETS and (target is None or target.name != p.target):
        raise IllFormedError(f"the program's target is {p.target!r}; spatialc knows {', '.join(TARGETS)}")


def check_tile(p: SpatialProgram) -> None:
    """The tile has at least one row and one column."""
    if p.tile.rows < 1 or p.tile.cols < 1:
        raise IllFormedError(f"the tile must be at least 1x1 elements, not {p.tile.rows}x{p.tile.cols}")


def _positive(what: str, values: tuple[int, ...]) -> None:
    if any(v < 1 for v in values):
        shown = "x".join(map(str, values)) if len(values) > 1 else str(values[0])
        raise IllFormedError(f"{what} must be ≥ 1, not {shown}")


def check_plans(p: SpatialProgram) -> None:
    """Each plan's fields are ≥ 1, its item and K step are at most MAX_ITEM_SIDE tiles a side, its K is whole K
    steps, it has at most MAX_ITEMS items, and its grid of items is the output tensor's tile grid."""
    out = p.output_tensor()
    for i, plan in enumerate(p.plans):
        name = f"plan {i}"
        b = plan.block
        _positive(f"{name}'s block (osh x osw x ibw)", (b.osh, b.osw, b.ibw))
        _positive(f"{name}'s sub_blocks", plan.sub_blocks)
        _positive(f"{name}'s grid", plan.grid)
        _positive(f"{name}'s k_tiles", (plan.k_tiles,))
        _positive(f"{name}'s depth", (plan.depth,))
        h, w = plan.item_tiles
        if max(h, w, b.ibw) > MAX_ITEM_SIDE:
            raise IllFormedError(
                f"{name}'s items are {h}x{w} tiles with K steps of {b.ibw}; no side may exceed"
                f" {MAX_ITEM_SIDE} tiles (no target holds such an item or K step)"
            )
        if plan.k_tiles % b.ibw:
            raise IllFormedError(f"{name} has {plan.k_tiles} K tiles, not a whole number of K steps of {b.ibw}")
        if plan.items > MAX_ITEMS:
            raise IllFormedError(
                f"{name}'s grid of {plan.grid[0]}x{plan.grid[1]} items has {plan.items}; at most"
                f" {MAX_ITEMS} are allowed"
            )
        if out is None:
            raise IllFormedError(f"{name} lays out an output tensor, but the program has none")
        if out.tiles != (plan.grid[0] * h, plan.grid[1] * w):
            raise IllFormedError(
                f"{name}'s {plan.grid[0]}x{plan.grid[1]} items of {h}x{w} tiles cover"
                f" {plan.grid[0] * h}x{plan.grid[1] * w} tiles, but the output tensor {out.name} has"
                f" {out.tiles[0]}x{out.tiles[1]}"
            )


def _padding(plans: tuple[Plan, ...]) -> tuple[int, int]:
    """The most tiles whole blocks add to a tensor's rows and columns: rows are padded to whole items (A, C) or
    K steps (B), columns to whole items (B, C, a bias row) or K steps (A). None without a plan."""
    rows = max((max(q.item_tiles[0], q.block.ibw) - 1 for q in plans), default=0)
    cols = max((max(q.item_tiles[1], q.block.ibw) - 1 for q in plans), default=0)
    return rows, cols


def check_tensors(p: SpatialProgram) -> None:
    """Each tensor has elements, a tile grid that holds them, and no more padding than whole blocks add."""
    pad = _padding(p.plans)
    tile = (p.tile.rows, p.tile.cols)
    for t in p.tensors:
        _positive(f"tensor {t.name}'s elements", t.elems)
        _positive(f"tensor {t.name}'s tile grid", t.tiles)
        need = tuple(math.ceil(e / s) for e, s in zip(t.elems, tile, strict=True))
        for dim in (0, 1):
            if not need[dim] <= t.tiles[dim] <= need[dim] + pad[dim]:
                raise IllFormedError(_grid_fault(t, tile, need, pad, dim, bool(p.plans)))


def _grid_fault(
    t: Tensor, tile: tuple[int, int], need: tuple[int, ...], pad: tuple[int, int], dim: int, planned: bool
) -> str:
    side = ("rows", "columns")[dim]
    head = (
        f"tensor {t.name}: {t.elems[0]}x{t.elems[1]} elements in {tile[0]}x{tile[1]} tiles take {need[0]}x"
        f"{need[1]} tiles, but its tile grid is {t.tiles[0]}x{t.tiles[1]}"
    )
    if t.tiles[dim] < need[dim]:
        return f"{head}, too few {side} of tiles to hold it"
    if pad[dim]:
        return f"{head}; whole blocks pad at most {pad[dim]} more {side} of tiles"
    return f"{head}; {'the plan' if planned else 'a program without a plan'} pads no {side} of tiles"


def role_text(t: Tensor) -> str:
    """'the output tensor', 'an input tensor', 'a parameter tensor'."""
    texts = {TensorRole.OUTPUT: "the output tensor", TensorRole.INPUT: "an input tensor"}
    return texts.get(t.role, "a parameter tensor")


def compute_fault(op: ComputeOp, precision: Precision) -> str | None:
    """Why compute op `op` of a `precision` program cannot run, or None."""
    match op:
        case Scalar(name, value):
            if name not in SCALAR_OPS:
                return f"scalar op {name!r} is none of {', '.join(SCALAR_OPS)}"
            if not math.isfinite(value):
                return f"scalar {name} needs a finite number, not {value!r}"
            if precision == Precision.INT8 and value != int(value):
                return (
                    f"an int8 program's epilogue is integer arithmetic: scalar {name} needs a whole number, not"
                    f" {value!r}"
                )
        case Requant(multiplier, shift, zero_point):
            for what, v, (lo, hi) in (
                ("multiplier", multiplier, REQUANT_MULTIPLIER),
                ("shift", shift, REQUANT_SHIFT),
                ("zero point", zero_point, REQUANT_ZERO_POINT),
            ):
                if not lo <= v <= hi:
                    return f"a requant {what} lies in [{lo}, {hi}], not {v}"
        case MatmulTiles(block, sub_blocks, _):
            if min(block.osh, block.osw, block.ibw, *sub_blocks) < 1:
                return (
                    f"a tile matmul's block ({block.osh}x{block.osw}x{block.ibw}) and sub-blocks"
                    f" ({sub_blocks[0]}x{sub_blocks[1]}) must be ≥ 1"
                )
    return None

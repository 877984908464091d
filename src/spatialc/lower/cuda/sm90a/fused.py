"""The fused epilogue of the sm_90a form (kernel.py): whether the consumers store the matmul's output themselves from
their accumulators (`fused_output`), and whether that store can go out by TMA (`staged`)."""

from __future__ import annotations

from ....ir.ids import LV_ITEM
from ....ir.nodes import SpatialProgram
from ....ir.ops import ChoreoOp, Loop, Pop, Push, Wait, WriteTiles
from ...errors import LowerError
from ..common import epilogue
from ..common.dequant import packed_rings
from ..common.program import checked_gemm
from ..common.rings import Rings, ring_table
from ..general import kernel as general


def staged(p: SpatialProgram, store: WriteTiles) -> bool:
    """Whether the fused store can go out by TMA: a page of whole tiles in the output's row-major tile grid (a box
    of one tile row and consecutive tile columns)."""
    t = p.tensor(store.tensor)
    return (store.stride_h, store.stride_w) == (t.tiles[1], 1) and t.groups == 1


def fused_output(
    p: SpatialProgram, k: general.GeneralKernel, apart: frozenset[int] = frozenset()
) -> tuple[WriteTiles, Rings] | None:
    """The writer's store of the matmul's output (after its elementwise epilogue), where the consumers can make it
    themselves from their accumulators — a chain of stages the fused store applies, run by the compute engine at
    its item level, and a writer that only waits for each page, stores it and frees it — and the kernel's rings
    without that chain's. None otherwise (the general form's output ring and writer stay). The site classes in
    `apart` (split-K's contributors, which store partial sums instead: partials.py) are left out of the programs
    compared."""
    try:
        mm, types, integer, chain = checked_gemm(p, epilogue.EPILOGUE_OPS)
    except LowerError:
        return None  # a stage the fused store does not apply (an activation): page to page, as the general form
    last = int(p.buffer((chain[-1] if chain else mm).outs[0]).ring)
    compute, *side = k.roles
    writers = [r for r in side if any(isinstance(op, WriteTiles) for op in r.walk())]

    def printed(role: general.Role) -> set[tuple[ChoreoOp, ...]]:
        """The item bodies of its classes' programs — each ITEM loop's (a split tail's two) — but a contributor's
        (`apart`) loop over the item it stores partial sums of: its last, or its only one (split-K's)."""
        out: set[tuple[ChoreoOp, ...]] = set()
        for i, ops in enumerate(role.programs):
            loops = all(isinstance(op, Loop) and op.var == LV_ITEM for op in ops) and bool(ops)
            bodies = [op.body for op in ops] if loops else [ops]  # type: ignore[union-attr]
            out.update(bodies[:-1] if i in apart else bodies)
        return out

    bodies = printed(writers[0]) if len(writers) == 1 else set()
    if len(bodies) != 1 or not printed(compute):
        return None
    (body,) = bodies
    if len(body) != 3 or not isinstance(body[1], WriteTiles):
        return None
    wait, store, pop = body
    ring = int(p.buffer(store.src).ring)
    if not (isinstance(wait, Wait) and isinstance(pop, Pop) and ring == last):
        return None
    # The compute engine pushes the last ring at its item level, where the writer's store has its loop variables.
    # A page a stage reads beside the chain's (a residual's) is read by the fused store, which stands at that Push:
    # the schedule must pop it after, or its slot could be refilled while the consumers read it.
    beside = {int(p.buffer(b).ring) for s in chain for b in s.ins[1:]}
    for level in printed(compute):
        pushed = [i for i, op in enumerate(level) if isinstance(op, Push) and int(p.buffer(op.buf).ring) == last]
        if not pushed:
            return None
        popped = [i for i, op in enumerate(level) if isinstance(op, Pop) and int(p.buffer(op.buf).ring) in beside]
        if any(i < pushed[0] for i in popped) or len(popped) != len(beside):
            return None
    fused = tuple(int(p.buffer(b).ring) for b in (mm.outs[0], *(s.outs[0] for s in chain)))
    return store, packed_rings(p, general.epilogue_rings(p, ring_table(p, types, fused), integer))

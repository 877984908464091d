"""schedule: the standard GEMM choreography (DESIGN §2), one program per engine per site.

    reader : Loop ITEM { Loop K { Reserve A; ReadTiles A; Push A; Reserve B; ReadTiles B; Push B } }
    compute: Loop ITEM { AcquireAcc; Loop K { Wait A; Wait B; Compute Matmul; Pop A; Pop B }
                         Reserve C; PackAcc C; Push C; ReleaseAcc
                         [for each epilogue stage E_i: Wait E_i-1; Reserve E_i; Compute op; Push E_i; Pop E_i-1] }
    writer : Loop ITEM { Wait last; WriteTiles last; Pop last }

The epilogue stages run on the compute engine, after the accumulator is packed, one Interm ring each (DESIGN §2).

Every site gets the same op bodies; only the ITEM loop's count (the site's number of items) differs. When no site
holds more than one item the ITEM loop is left out: a site's only item is then implicit, and a site with no item
gets empty programs.
"""

from __future__ import annotations

from ..errors import PlanError
from ..ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LV_K, BufferId
from ..ir.nodes import Accumulator, ComputeStage, EngineProgram, ReadStage, Schedule, SpatialProgram, WriteStage
from ..ir.ops import (
    AcquireAcc,
    Bias,
    ChoreoOp,
    Compute,
    Const,
    Loop,
    PackAcc,
    Pop,
    Push,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    TileAddr,
    Wait,
    WriteTiles,
)
from .tile import matmul_stage


def engine_bodies(p: SpatialProgram) -> dict[str, tuple[ChoreoOp, ...]]:
    """The per-item body of each engine's program."""
    plan = p.plan
    if plan is None or p.placement is None:
        raise PlanError("schedule needs a tiled, placed program")
    mm = matmul_stage(p)
    a_buf, b_buf = mm.ins
    (c_buf,) = mm.outs
    acc = next(b.id for b in p.buffers if isinstance(b.kind, Accumulator))
    reads = {s.outs[0]: s.kind.tensor for s in p.stages if isinstance(s.kind, ReadStage)}
    write = next(s for s in p.stages if isinstance(s.kind, WriteStage))
    ta, tb, tc = p.tensor(reads[a_buf]), p.tensor(reads[b_buf]), p.tensor(write.kind.tensor)  # type: ignore[union-attr]
    h, w = plan.item_tiles
    ibw = plan.block.ibw
    a_cols, b_cols, c_cols = ta.tiles[1], tb.tiles[1], tc.tiles[1]
    read_a = ReadTiles(ta.id, TileAddr(0, ((LV_ITEM_Y, h * a_cols), (LV_K, ibw))), h, ibw, a_cols, 1, a_buf)
    read_b = ReadTiles(tb.id, TileAddr(0, ((LV_K, ibw * b_cols), (LV_ITEM_X, w))), ibw, w, b_cols, 1, b_buf)
    k_loop = Const(plan.k_steps)
    reader = (Loop(LV_K, k_loop, (Reserve(a_buf), read_a, Push(a_buf), Reserve(b_buf), read_b, Push(b_buf))),)
    compute = (
        AcquireAcc(acc),
        Loop(
            LV_K,
            k_loop,
            (
                Wait(a_buf),
                Wait(b_buf),
                Compute(mm.kind.op, (a_buf, b_buf), acc=acc),  # type: ignore[union-attr]
                Pop(a_buf),
                Pop(b_buf),
            ),
        ),
        Reserve(c_buf),
        PackAcc(acc, c_buf, h * w),
        Push(c_buf),
        ReleaseAcc(acc),
    )
    epilogue, last = _epilogue_ops(p, c_buf, w)
    write_c = WriteTiles(last, tc.id, TileAddr(0, ((LV_ITEM_Y, h * c_cols), (LV_ITEM_X, w))), h, w, c_cols, 1)
    writer = (Wait(last), write_c, Pop(last))
    return {"reader": reader, "compute": compute + epilogue, "writer": writer}


def _epilogue_ops(p: SpatialProgram, first: BufferId, w: int) -> tuple[tuple[ChoreoOp, ...], BufferId]:
    """The compute engine's ops for the chain of epilogue stages that starts at ring `first`, and its last ring."""
    by_input = {s.ins[0]: s for s in p.stages if isinstance(s.kind, ComputeStage) and len(s.ins) == 1}
    ops: list[ChoreoOp] = []
    cur = first
    while cur in by_input:
        stage = by_input[cur]
        op = stage.kind.op  # type: ignore[union-attr]
        if isinstance(op, Bias):
            # The page's first column is the item's first output column: tile column item_x · w of the bias row.
            op = Bias(op.tensor, TileAddr(0, ((LV_ITEM_X, w),)), w)
        (out,) = stage.outs
        ops += [Wait(cur), Reserve(out), Compute(op, (cur,), (out,)), Push(out), Pop(cur)]
        cur = out
    return tuple(ops), cur


def schedule(p: SpatialProgram) -> SpatialProgram:
    """The program with the standard GEMM schedule."""
    from ..ir.nodes import Engine

    bodies = engine_bodies(p)
    assert p.placement is not None
    item_loop = any(len(items) > 1 for _, items in p.placement.items_of_site)
    wrapped: dict[int, dict[str, tuple[ChoreoOp, ...]]] = {}
    programs = []
    for site, items in p.placement.items_of_site:
        n = len(items)
        if n not in wrapped:
            if item_loop:
                wrapped[n] = {e: (Loop(LV_ITEM, Const(n), body),) for e, body in bodies.items()}
            else:
                wrapped[n] = {e: (body if n else ()) for e, body in bodies.items()}
        for engine in (Engine.READER, Engine.COMPUTE, Engine.WRITER):
            programs.append(EngineProgram(site, engine, wrapped[n][engine.value]))
    return p.evolve(schedule=Schedule(tuple(programs)))

"""What a program moves through global memory, counted from its ops (no kernel needed): the ledger's
`global_read_bytes`, by which a multicast build is compared with the same GEMM without groups."""

from __future__ import annotations

from .nodes import DType, SpatialProgram
from .ops import ChoreoOp, Const, Loop, ReadTiles

DTYPE_BYTES = {
    DType.INT8: 1,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.FP16: 2,
    DType.BF16: 2,
    DType.FLOAT32: 4,
    DType.E4M3: 1,
    DType.E5M2: 1,
    DType.E8M0: 1,
}
DTYPE_BITS = {**{d: 8 * n for d, n in DTYPE_BYTES.items()}, DType.INT4: 4, DType.UINT4: 4, DType.E2M1: 4}  # packed


def read_bytes(p: SpatialProgram) -> dict[str, int]:
    """Tensor name → bytes every ReadTiles of every site reads of it from global memory in one run, whole tiles
    counted (a loop whose count is read at run time at its bound: an upper bound for a grouped GEMM)."""
    out: dict[str, int] = {}
    if p.schedule is None:
        return out
    tensors = {t.id: t for t in p.tensors}
    tile = p.tile.elems

    def walk(ops: tuple[ChoreoOp, ...], times: int) -> None:
        for op in ops:
            if isinstance(op, Loop):
                n = op.count.n if isinstance(op.count, Const) else op.count.bound
                walk(op.body, times * n)
            elif isinstance(op, ReadTiles):
                t = tensors[op.tensor]
                out[t.name] = out.get(t.name, 0) + times * op.block_h * op.block_w * tile * DTYPE_BITS[t.dtype] // 8

    for prog in p.schedule.programs:
        walk(prog.ops, 1)
    return out


def global_read_bytes(p: SpatialProgram) -> int:
    """Bytes all the program's reads take from global memory in one run (`read_bytes`, summed)."""
    return sum(read_bytes(p).values())

"""Rings in shared memory: one per buffer template, the table every form lays its pages out by.

A ring here has no flow control of its own: how a form keeps a slot from being refilled while it is read — the
persistent form's proof of its serialised order (`persistent.order`), the general and sm_90a forms' mbarriers —
is the form's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ....ir.ids import BufferId
from ....ir.nodes import ComputeStage, Fifo, Interm, PageLayout, ReadStage, SpatialProgram, TensorRole
from ....ir.ops import (
    ChoreoOp,
    Compute,
    MatmulTiles,
    PackAcc,
    Precision,
    ReadTiles,
    RowReduce,
    walk,
)
from ...errors import Unsupported

TILE_ELEMS = 256
# Every shared region starts on 32 bytes: cp.async moves 16-byte chunks and ldmatrix reads 16-byte rows (32 keeps
# every tile of every page on the alignment both want, and on the one WMMA would).
ALIGN = 32


def aligned(n: int) -> int:
    """`n` rounded up to a multiple of ALIGN."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True, slots=True)
class MmaTypes:
    """The C types of a precision's operand and accumulator fragments, with their sizes, and `to_operand`: what
    turns an epilogue value into an operand (float32 rounded to nearest even; an int8 program's int64 requant
    result, already in -128..127, converted exactly)."""

    operand: str
    operand_bytes: int
    acc: str
    acc_bytes: int
    to_operand: str


MMA_TYPES = {
    Precision.INT8: MmaTypes("signed char", 1, "int", 4, "(signed char)"),
    Precision.FP16: MmaTypes("__half", 2, "float", 4, "__float2half_rn"),
    Precision.BF16: MmaTypes("__nv_bfloat16", 2, "float", 4, "__float2bfloat16_rn"),
    # cuda_fp8.h's constructors round to nearest even and saturate (past ±448 / ±57344: that value; NaN stays NaN),
    # as the interpreter rounds a computed 8-bit float operand (numerics.rounding.saturated_fp8).
    Precision.E4M3: MmaTypes("__nv_fp8_e4m3", 1, "float", 4, "__nv_fp8_e4m3"),
    Precision.E5M2: MmaTypes("__nv_fp8_e5m2", 1, "float", 4, "__nv_fp8_e5m2"),
    # float32 pages: a map's or a row program's inputs only (no MMA takes them: `checked_layers` refuses a matmul of
    # them); a float32 value is one already.
    Precision.FP32: MmaTypes("float", 4, "float", 4, "(float)"),
}


@dataclass(frozen=True, slots=True)
class Ring:
    """One buffer template as a shared-memory ring of `depth` pages of `page` elements of `c_type` (OPT or ACCT)."""

    id: int
    name: str
    depth: int
    page: int
    c_type: str
    elem_bytes: int
    layout: PageLayout = PageLayout.ROW

    @property
    def bytes(self) -> int:
        """Bytes of the whole ring."""
        return self.depth * self.page * self.elem_bytes


@dataclass(frozen=True, slots=True)
class Rings:
    """The kernel's rings by template id, each buffer's template, and the templates the fused epilogue removed.

    `fused` is the chain the fused epilogue replaces, in order: the matmul's output, then the output of each
    elementwise epilogue stage; the writer stores the last. Empty when the epilogue is not fused. `direct`: rings
    whose pages go between the accumulators and global memory with no page of shared memory (the sm_90a form's
    split-K partial sums).
    """

    rings: dict[int, Ring]
    template: dict[BufferId, int]
    fused: tuple[int, ...] = ()
    names: dict[int, str] = field(default_factory=dict)
    direct: tuple[int, ...] = ()

    def kept(self, buf: BufferId) -> Ring | None:
        """The ring `buf` lives in, or None when it is part of the fused chain or direct (neither has rings)."""
        t = self.template[buf]
        return None if t in self.fused or t in self.direct else self.rings[t]

    def is_direct(self, buf: BufferId) -> bool:
        """Whether `buf`'s pages go between accumulators and global memory directly (`direct`)."""
        return self.template.get(buf, -1) in self.direct

    def is_fused(self, buf: BufferId) -> bool:
        """Whether `buf` is a ring of the fused chain: its pages are the accumulators, read out by the store."""
        return self.template.get(buf, -1) in self.fused

    def chain_step(self, buf: BufferId) -> int:
        """The position of fused `buf` in the chain (0: the matmul's output)."""
        return self.fused.index(self.template[buf])

    def name(self, buf: BufferId) -> str:
        """The template name of `buf`, for messages."""
        return self.names.get(self.template[buf], f"buffer {int(buf)}")


def ring_table(p: SpatialProgram, types: MmaTypes, fused: tuple[int, ...]) -> Rings:
    """One ring per Fifo / Interm template outside the fused chain; a compute stage's output carries accumulators,
    the rest operands — and so does a computed page a matmul reads (an MLP's hidden layer, rounded to the operand
    type where it is stored)."""
    computed = {b for s in p.stages if isinstance(s.kind, ComputeStage) for b in s.outs}
    work = {t.id for t in p.tensors if t.role == TensorRole.WORKSPACE}  # partial sums, read back as accumulators
    computed |= {b for s in p.stages if isinstance(s.kind, ReadStage) and s.kind.tensor in work for b in s.outs}
    operands = {
        b for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles) for b in s.ins
    }
    computed = {p.buffer(b).ring for b in computed} - {p.buffer(b).ring for b in operands}
    rings: dict[int, Ring] = {}
    template = {b.id: int(b.ring) for b in p.buffers}
    names = {int(b.ring): p.buffer(b.ring).name for b in p.buffers}
    for b in p.buffers:
        if not isinstance(b.kind, Fifo | Interm) or int(b.ring) in fused:
            continue
        acc = b.ring in computed
        elems = b.kind.page_tiles * p.tile.elems
        ring = Ring(
            int(b.ring),
            names[int(b.ring)],
            b.kind.depth_pages,
            elems,
            "ACCT" if acc else "OPT",
            types.acc_bytes if acc else types.operand_bytes,
            b.kind.layout,
        )
        if rings.setdefault(ring.id, ring) != ring:
            raise Unsupported(
                f"copies of ring {ring.name} with different shapes",
                "every copy of one template is one shared-memory ring in the kernel",
            )
    return Rings(rings, template, fused, names)


def epit_bytes(integer: bool) -> int:
    """Bytes of one value of an epilogue stage's ring (EPIT): long long in an integer program, float otherwise."""
    return 8 if integer else 4


def epilogue_rings(p: SpatialProgram, rings: Rings, integer: bool) -> Rings:
    """The rings an elementwise stage fills hold its values: int64 (EPIT) in an integer program, whose bias may
    leave int32, float32 in a float one — except a page a matmul reads, which holds its operands (`ring_table`)."""
    elementwise = {
        rings.template[b]
        for s in p.stages
        if isinstance(s.kind, ComputeStage) and not isinstance(s.kind.op, MatmulTiles)
        for b in s.outs
    }
    elementwise |= _online_rings(p, rings)
    table = {
        r: dataclasses.replace(ring, c_type="EPIT", elem_bytes=epit_bytes(integer))
        if r in elementwise and (ring.c_type == "ACCT" or r in _online_rings(p, rings))
        else ring
        for r, ring in rings.rings.items()
    }
    return dataclasses.replace(rings, rings=table)


def _online_rings(p: SpatialProgram, rings: Rings) -> set[int]:
    """A row program's rings that its schedule fills and no stage declares — an online softmax's running max before
    and after a page, and its rescale (`passes/rows.py`): float32 values, as the row accumulators they come from."""
    reduces = any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce) for s in p.stages)
    if p.schedule is None or not reduces:
        return set()
    declared = {rings.template[b] for s in p.stages for b in s.outs}
    filled = set()
    for prog in p.schedule.programs:
        for op in walk(prog.ops):
            if isinstance(op, PackAcc):
                filled.add(rings.template[op.to])
            elif isinstance(op, Compute):
                filled.update(rings.template[b] for b in op.outs)
    return filled - declared


def scheduled_rings(p: SpatialProgram, types: MmaTypes, ops: list[ChoreoOp], rows: frozenset[int]) -> Rings:
    """The ring table of a program whose stages do not say what its rings hold (attention: one declared stage, its
    recurrence's rings added by the planner), typed by the schedule: a ring a ReadTiles fills holds operands (OPT),
    one a fragment accumulator is packed into accumulators (ACCT), any other — a map's page, a row accumulator
    (template in `rows`) packed — float32 values (EPIT). A computed page a matmul reads stays float32, and the matmul
    rounds it to the operand type as it loads it (`TilePrinter.a_loader`): attention's P is also summed, unrounded,
    into the running sum."""
    table = ring_table(p, types, ())
    operands: set[int] = set()
    packed: set[int] = set()
    for op in ops:
        match op:
            case ReadTiles(into=buf):
                operands.add(table.template[buf])
            case PackAcc(acc=acc, to=to) if table.template[acc] not in rows:
                packed.add(table.template[to])
    typed = {}
    for r, ring in table.rings.items():
        if r in operands:
            typed[r] = dataclasses.replace(ring, c_type="OPT", elem_bytes=types.operand_bytes)
        elif r in packed:
            typed[r] = dataclasses.replace(ring, c_type="ACCT", elem_bytes=types.acc_bytes)
        else:
            typed[r] = dataclasses.replace(ring, c_type="EPIT", elem_bytes=epit_bytes(False))
    return dataclasses.replace(table, rings=typed)

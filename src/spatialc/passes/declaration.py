"""What a program declares, as the passes leave it: the part of a program that `build` keeps, so that a built
program read back from somewhere else (the torch op disk cache) can be held to the unbuilt program it claims to be
the build of. Verify proves that a program's schedule computes what its stages declare of its tensors; this says
whether those stages and tensors are the ones asked for.

The passes choose a matmul's block and sub-blocks, pad a tensor's tile grid and order its tiles, add rings, plans,
a placement and a schedule, and split-K's workspace with the stages that write, read and add its partial sums (and
the matmul's ring that feeds them): everything else of the stages and tensors they keep as it was."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..ir.ids import BufferId, TensorId
from ..ir.nodes import ComputeStage, ReadStage, SpatialProgram, Stage, StageKind, TensorRole, WriteStage
from ..ir.ops import AddPartial, BlockShape, MatmulTiles


def declaration(p: SpatialProgram) -> tuple:
    """`p`'s name, target, tile and precision, each tensor but a workspace without its tile grid and tile order, and
    each stage but split-K's, its matmul's block and sub-blocks left out, every tensor and ring named, not numbered
    (split-K's workspace and rings renumber those after them): equal for a program and its build."""
    workspace = {t.id for t in p.tensors if t.role == TensorRole.WORKSPACE}
    added = [s for s in p.stages if _split_stage(s, workspace)]
    rings = {b for s in added for b in (*s.ins, *s.outs)}
    names = {t.id: t.name for t in p.tensors}  # (ids of two kinds are equal as numbers: a dict of each)
    ring_names = {b.id: b.name for b in p.buffers}
    tensors = tuple((t.name, t.role, t.elems, t.dtype, t.groups) for t in p.tensors if t.id not in workspace)
    stages = tuple(
        (s.name, s.engine, _named(_unblocked(s.kind), names), _ring_names(s.ins, rings, ring_names))
        + (_ring_names(s.outs, rings, ring_names),)
        for s in p.stages
        if s not in added
    )
    return (p.name, p.target, p.tile, p.precision, tensors, stages)


def _split_stage(s: Stage, workspace: set[TensorId]) -> bool:
    match s.kind:
        case ReadStage(t) | WriteStage(t):
            return t in workspace
        case ComputeStage(op):
            return isinstance(op, AddPartial)
    return False


def _unblocked(kind: StageKind) -> StageKind:
    """A matmul stage without its block and sub-blocks (the planner's choice); any other stage as it is."""
    if isinstance(kind, ComputeStage) and isinstance(kind.op, MatmulTiles):
        return ComputeStage(dataclasses.replace(kind.op, block=BlockShape(0, 0, 0), sub_blocks=(0, 0)))
    return kind


def _ring_names(rings: tuple[BufferId, ...], left_out: set[BufferId], names: dict[BufferId, str]) -> tuple[str, ...]:
    return tuple(names.get(b, "") for b in rings if b not in left_out)


def _named(value: Any, names: dict[TensorId, str]) -> Any:
    """`value` (a stage's kind: ops, formulas, addresses) with each tensor id it holds as the tensor's name."""
    if isinstance(value, TensorId):
        return names.get(value, "")
    if isinstance(value, tuple):
        return tuple(_named(v, names) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(_named(getattr(value, f.name), names) for f in dataclasses.fields(value)))
    return value

"""footprint: what the planner asks of a program and of a block — the program's matmul stage and the rings its
epilogue keeps, the CUDA kernel forms a plan is made for, a block's shared memory and residency as the backend
answers them, and the page layouts of the operand rings.

`tile.py` searches plans by these figures and applies the one it chooses; `place`, `schedule`, `split` and the CUDA
backends read the same figures here.
"""

from __future__ import annotations

import functools

from ..errors import ProgramError
from ..ir.ids import TensorId
from ..ir.nodes import ComputeStage, DType, PageLayout, Plan, ReadStage, SpatialProgram
from ..ir.ops import AddPartial, BlockShape, Map, MatmulTiles, Precision
from ..ir.traffic import DTYPE_BYTES
from ..numerics.elementwise import transcendental
from ..target import SpatialTarget

# Each precision's bytes an operand element: its input tensors' element type's (a Precision is spelt as that DType).
OPERAND_BYTES = {prec: DTYPE_BYTES[DType(prec.value)] for prec in Precision}


def matmul_stage(p: SpatialProgram):
    """The program's one tile-matmul stage."""
    found = [s for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles)]
    if len(found) != 1:
        raise ProgramError(f"the tile pass plans programs with exactly one tile matmul; this one has {len(found)}")
    return found[0]


def scaled(p: SpatialProgram) -> bool:
    """Whether `p`'s matmul is block-scaled (`MatmulTiles.scales`)."""
    return any(isinstance(s.kind, ComputeStage) and getattr(s.kind.op, "scales", None) is not None for s in p.stages)


def epilogue_stages(p: SpatialProgram) -> int:
    """The program's compute stages after its matmul (its epilogue; split-K's add_partials is no part of it)."""
    return sum(1 for s in p.stages if isinstance(s.kind, ComputeStage) and not isinstance(s.kind.op, AddPartial)) - 1


def epilogue_reads(p: SpatialProgram) -> tuple[TensorId, ...]:
    """The tensors read into rings that an elementwise stage reads beside the value before it (a residual, a gate):
    each a ring of output-sized pages the reader fills once an item."""
    operands = {
        b for s in p.stages if isinstance(s.kind, ComputeStage) and not isinstance(s.kind.op, Map) for b in s.ins
    }
    extra = {b for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map) for b in s.ins[1:]}
    return tuple(
        s.kind.tensor
        for s in p.stages
        if isinstance(s.kind, ReadStage) and any(b in extra and b not in operands for b in s.outs)
    )


def has_epilogue(p: SpatialProgram) -> bool:
    """Whether the program has compute stages after its matmul."""
    return epilogue_stages(p) > 0


def fused_by_persistent(p: SpatialProgram) -> bool:
    """Whether every elementwise stage of `p` is one the persistent kernel (and the sm_90a form's fused store) applies
    from the accumulators: none that calls a library function (an activation, exp, log), which only the general form
    prints page to page, in rings of its own that a plan must hold ("auto" then plans for that form). A residual's or
    a gate's page the fused store reads from the ring the reader fills (`side_rings`)."""
    maps = [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Map)]
    return not any(transcendental(m.expr) for m in maps)


def ring_stages(p: SpatialProgram, form: str, extra: int = 0) -> int:
    """The epilogue stages a block of the `form` kernel keeps in rings of their own, plus `extra` output-sized ones
    (split-K's): none where the sm_90a form's fused store applies the chain from the accumulators (`side_rings` counts
    the rings it reads beside them). A tensor an epilogue stage reads (a residual) has a ring of output-sized pages
    too, counted as one more stage's (its operand-typed pages are no larger than a stage's values)."""
    if form == "sm90a" and fused_by_persistent(p):
        return extra
    return epilogue_stages(p) + len(epilogue_reads(p)) + extra


def side_rings(p: SpatialProgram, form: str) -> int:
    """The rings of output-sized operand pages (a residual's, a gate's) a block of the `form` kernel keeps beside a
    fused store that reads them — the persistent kernel's and the sm_90a form's — which costs nothing of the stages'
    (the persistent kernel's live in registers; the sm_90a form's `ring_stages` leaves out)."""
    return len(epilogue_reads(p)) if form in ("sm90a", "persistent") and fused_by_persistent(p) else 0


def in_panels(p: SpatialProgram) -> bool:
    """Whether `p` was planned for the sm_90a form: a page of it in swizzled panels, which only that form reads."""
    return any(getattr(b.kind, "layout", PageLayout.ROW).panels for b in p.buffers)


def fused_output(target: SpatialTarget, block: BlockShape) -> bool:
    """Whether the CUDA lowering drops the output ring (accumulators in registers, lane grid divides the block)."""
    return target.accumulator_in_registers and target.accumulator_lane_grid(block.osh, block.osw) is not None


FORMS = ("persistent", "general", "sm90a")  # the CUDA kernel forms a plan can be made for (spatialc.lower's)


def check_form(form: str, target: SpatialTarget | None = None) -> str:
    """`form` when a plan can be made for it; "auto" plans for the kernel auto prints first: the sm_90a form on a
    Hopper target, the persistent kernel elsewhere."""
    if form == "auto":
        return "sm90a" if target is not None and target.hopper else "persistent"
    if form not in FORMS:
        raise ProgramError(f"unknown form {form!r}; plan for one of auto, {', '.join(FORMS)}")
    if form == "sm90a" and target is not None and not target.hopper:
        raise ProgramError(f"form 'sm90a' uses TMA and wgmma, which target {target.name} has not; use target sm_90a")
    return form


def resources(
    target: SpatialTarget, plan: Plan, prec: Precision, form: str = "persistent", stages: int = 0, reads: int = 0
):
    """What a block of the `form` kernel for `plan` costs: (shared memory bytes, blocks resident per SM; 0 when one
    does not fit) — the backend's own answer, so the planner keeps no copy of a kernel's memory model. `stages`:
    the epilogue's stages, which the general form keeps in rings of their own; `reads`: the rings of a residual's
    pages the sm_90a form's fused store reads (`side_rings`)."""
    return block_resources(target, plan.block, plan.sub_blocks, plan.depth, prec, form, stages, reads)


@functools.lru_cache(maxsize=8192)
def block_resources(
    target: SpatialTarget,
    block: BlockShape,
    sub_blocks: tuple[int, int],
    depth: int,
    prec: Precision,
    form: str,
    stages: int,
    reads: int = 0,
) -> tuple[int, int]:
    """`resources` of a plan of this block, sub-blocks and depth, asked of the backend once: a block's shared memory
    and residency are its rings' and registers', the same for a grid of one item or of thousands and for any K
    (tests/passes/test_plan_search.py holds every backend to it), so the ~600 candidates of one build are the same
    question for every GEMM of that precision and form. An 8-bit float block is sized as int8's (`sized_as`)."""
    from ..lower.cuda.general import kernel as general
    from ..lower.cuda.persistent import kernel as persistent
    from ..lower.cuda.sm90a import plan as sm90a_plan

    backend = {"persistent": persistent, "general": general, "sm90a": sm90a_plan}[form]
    prec = sized_as(prec)
    one_item = Plan(block, sub_blocks, (1, 1), block.ibw, depth)
    if form in ("sm90a", "persistent"):  # the forms whose fused store reads a residual's ring (`side_rings`)
        return backend.plan_resources(target, one_item, prec, stages, reads)
    return backend.plan_resources(target, one_item, prec, stages)


# What every form answers an 8-bit float GEMM for a target without 8-bit float MMAs (sm_80, sm_86); a map or row
# program of 8-bit float inputs multiplies nothing and is printed for any target.
FP8_NO_MMA = (
    "8-bit float operands need the tensor cores' e4m3 / e5m2 MMA (mma.sync ... .e4m3), which sm_89 and later have:"
    " build for sm_89, sm_90 or sm_90a, or run the program with spatialc.evaluate"
)


def sized_as(prec: Precision) -> Precision:
    """The precision whose kernels a block of `prec` operands is sized by. 8-bit float operands take int8's blocks:
    the same 1-byte operand pages laid out the same way (`operand_layouts`) and read by the same loads, 4-byte
    accumulators, and k32 MMA steps (mma.sync's in the persistent and general forms, wgmma's in the sm_90a form)."""
    return Precision.INT8 if OPERAND_BYTES[prec] == 1 else prec


def smem_bytes(
    target: SpatialTarget, plan: Plan, prec: Precision, form: str = "persistent", stages: int = 0, reads: int = 0
) -> int:
    """Shared memory of a block of the `form` kernel `plan` would print."""
    return resources(target, plan, prec, form, stages, reads)[0]


def sites_per_unit(
    target: SpatialTarget, plan: Plan, prec: Precision, form: str = "persistent", stages: int = 0, reads: int = 0
) -> int:
    """Blocks of `plan`'s `form` kernel resident per SM (0: one does not fit)."""
    return resources(target, plan, prec, form, stages, reads)[1]


def operand_layouts(operand: Precision, form: str = "persistent") -> tuple[PageLayout, PageLayout]:
    """The page layouts of the A and B rings: the tensor cores' operand loads (`ldmatrix`) read 16-bit tiles
    conflict-free only swizzled, and 8-bit B only K-major, since they cannot transpose 8-bit data (the B tensor is
    stored K-major to match: its tile order follows the ring's). The sm_90a form's copy engine loads row-major
    matrices into swizzled panels, up to 128 bytes wide, which its wgmma reads (`PageLayout.panels`): A and 16-bit
    B as they are, int8 B transposed (K-major, `panels_t`). 8-bit float operands are laid out as int8's: the same
    loads read them (`sized_as`)."""
    int8 = sized_as(operand) == Precision.INT8
    if form == "sm90a":
        return (PageLayout.PANELS, PageLayout.PANELS_T) if int8 else (PageLayout.PANELS, PageLayout.PANELS)
    return (PageLayout.ROW, PageLayout.COL) if int8 else (PageLayout.SWIZZLED, PageLayout.SWIZZLED)

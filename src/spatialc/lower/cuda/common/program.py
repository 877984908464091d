"""What every CUDA backend reads of a verified program: its tile matmuls and operand types, and the checks that hold
whatever the kernel's shape (an int8 reduction that fits int32, an epilogue chain the printers spell exactly). Which
sites run which engine programs is `sites.py`; the launch contract of a kernel printed from it, `launch.py`."""

from __future__ import annotations

import math
from collections.abc import Callable

from ....errors import ProgramError
from ....ir.nodes import (
    FOUR_BIT,
    ComputeStage,
    DType,
    Fifo,
    Interm,
    PageLayout,
    Plan,
    ReadStage,
    SpatialProgram,
    Stage,
    TensorRole,
    TileOrder,
    per_op_list,
)
from ....ir.ops import (
    MATMUL_PRECISIONS,
    NO_FP32_MATMUL,
    ChoreoOp,
    Compute,
    ComputeOp,
    Dequant,
    Map,
    MatmulTiles,
    Precision,
    walk,
)
from ....numerics.epilogue import dot_range
from ....passes.attention import attention_shape
from ....passes.maps import map_shape
from ....passes.rows import row_shape
from ...errors import NeedsGeneral, TooBig, Unsupported, UnsupportedPrecision, Unverified
from . import epilogue
from .cwriter import C_TYPES
from .rings import MMA_TYPES, MmaTypes

# What the sm_90a form's refusal and auto's note (forms.PAGES_NOTE) call such programs.
MAP_PROGRAM = "a program without a tile matmul (an elementwise map)"
ROW_PROGRAM = "a program that reduces rows (softmax, RMSNorm)"
COL_PROGRAM = "a program that reduces columns (x.sum(0), a bias gradient)"
W4_PROGRAM = "a W4A16 GEMM's dequant prologue (4-bit weights)"
ATTENTION_PROGRAM = "attention (its online softmax: two matmuls a KV block beside running row maxima and sums)"


def check_printable(p: SpatialProgram, dequant: bool = False) -> None:
    """Refuse a program no backend prints: one not verified, or without its plan, placement or schedule — and a W4A16
    GEMM's dequant prologue unless the form prints it (`dequant`: the general form)."""
    if not p.verified:
        raise Unverified(p.name)
    if p.placement is None or p.schedule is None or not p.plans:
        raise Unsupported("a program without a plan, placement or schedule", "the kernel is printed from all three")
    # A kernel's block i is site i — its work list, and every site a semaphore or a multicast group names.
    sites = [int(s) for s, _ in p.placement.items_of_site]
    if sites != list(range(len(sites))):
        at = next(i for i, s in enumerate(sites) if s != i)
        raise Unsupported(
            f"a placement whose site {at} is numbered {sites[at]}",
            "the kernel runs site i as its block i: number the sites 0, 1, … in the order placed",
        )
    if not dequant and any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Dequant) for s in p.stages):
        raise NeedsGeneral(W4_PROGRAM, "this form does not print its dequant prologue yet")
    read = {s.kind.tensor for s in p.stages if isinstance(s.kind, ReadStage)}
    for t in p.tensors:
        if t.order != TileOrder.ROW and t.id not in read:
            raise Unsupported(
                f"{t.role.value} tensor {t.name} stored {t.order.value}-major",
                "only tensors read through rings into operand pages may be column-major",
            )


def all_ops(p: SpatialProgram) -> list[ChoreoOp]:
    """Every op of every engine program of every site (each op list walked once: sites share them)."""
    assert p.schedule is not None
    return [op for _, ops in per_op_list(p.schedule.programs, lambda ops: list(walk(ops))) for op in ops]


def distinct_lists(p: SpatialProgram) -> list[tuple[ChoreoOp, ...]]:
    """The engine programs' op lists, each object once, in schedule order: what depends on a list alone is found
    once for the hundreds of sites that share it."""
    assert p.schedule is not None
    return list({id(prog.ops): prog.ops for prog in p.schedule.programs}.values())


def matmul_stages(p: SpatialProgram) -> tuple[Stage, ...]:
    """The program's tile-matmul stages, in the order declared: one in a GEMM, a layer each in an MLP."""
    outs = 2 if any(t.role == TensorRole.WORKSPACE for t in p.tensors) else 1  # split-K: partial sums too
    found = tuple(s for s in p.stages if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, MatmulTiles))
    for s in found:
        if len(s.ins) != 2 or len(s.outs) != outs:
            raise Unsupported(
                f"matmul stage {s.name} with {len(s.ins)} inputs and {len(s.outs)} outputs",
                "a tile matmul reads an A and a B ring and fills one output (and split-K's partial sums)",
            )
    if not found:
        raise Unsupported("a program without a tile matmul", "the persistent kernel is a tensor-core tile GEMM")
    return found


def matmul_stage(p: SpatialProgram) -> Stage:
    """The program's first tile-matmul stage: a GEMM's one."""
    return matmul_stages(p)[0]


def logical_k(p: SpatialProgram, mm: Stage | None = None) -> int:
    """The length of matmul `mm`'s reduction (the program's first by default): the columns of its A operand's
    tensor, or where A is a page the site computes (an MLP's hidden layer) the rows of B's — the zero padding adds
    nothing — found through the stage that fills the operand's ring, not by the order tensors are listed in."""
    mm = mm or matmul_stage(p)
    for buf, axis in zip(mm.ins, (1, 0), strict=True):
        ring = p.buffer(buf).ring
        for s in p.stages:
            if isinstance(s.kind, ReadStage) and any(p.buffer(b).ring == ring for b in s.outs):
                return p.tensor(s.kind.tensor).elems[axis]
    raise Unsupported(f"matmul stage {mm.name} with neither operand read from a tensor", "K is an operand's length")


def operand_types(p: SpatialProgram, operand: Precision) -> MmaTypes:
    """The C types of `operand` values (a matmul's operands, a map program's inputs: the MMA fragment types of the
    precision); the input tensors must hold that type (4-bit weights aside: a dequant reads them, common/dequant.py)."""
    types = MMA_TYPES.get(operand)
    if types is None:
        raise UnsupportedPrecision(
            operand, "the kernels have types for int8, fp16, bf16, e4m3, e5m2 and (without a matmul) float32 only"
        )
    for t in p.tensors:
        if t.role == TensorRole.INPUT and t.dtype not in FOUR_BIT and t.dtype.value != operand.value:
            raise UnsupportedPrecision(
                t.dtype.value,
                f"input {t.name} must hold the program's {operand.value} operands: "
                "tiles are copied into the operand rings byte for byte",
            )
    out = p.output_tensor()
    if out is None:
        raise Unsupported("a program without an output tensor", "the kernel stores its result into one")
    return types  # the output's element type is `epilogue.check`'s, with or without an epilogue


def check_int8_reduction(p: SpatialProgram, mm: Stage) -> None:
    """Refuse an int8 GEMM whose int32 fragment accumulators could overflow where the IR's int64 would not.

    The largest sum a K-long int8 dot product reaches is K·128·128, every product being (−128)·(−128); the most
    negative, K·(−128)·127, is smaller in size. The logical K counts: the zero padding adds nothing. That every
    accumulator sums exactly K products — each k-tile once, whatever loops the schedule wraps around its K step — is
    what verify's rule 8 proved before this program reached the lowering.
    """
    if mm.kind.op.operand.value != "int8":  # type: ignore[union-attr]
        return
    k = logical_k(p, mm)
    need = dot_range(k)[1]
    if need > 2**31 - 1:
        raise TooBig(
            f"the largest int8 dot product over K = {k} (K·128·128) in an int32 accumulator",
            need,
            2**31 - 1,
            "int8 MMA accumulates in int32; keep K ≤ 131071 or use fp16",
        )


Layer = tuple[Stage, tuple[Stage, ...]]  # a matmul stage and its epilogue chain


def checked_layers(
    p: SpatialProgram, elementwise: Callable[[ComputeOp], bool]
) -> tuple[MmaTypes, bool, tuple[Layer, ...]]:
    """The fragment types, whether the program is int8 (exact integer epilogue), and each matmul stage with its
    epilogue chain (to the written output, or to the page the next matmul reads) — after the checks every backend
    makes: one operand type for every matmul, held by the inputs, int8 reductions that fit int32, chains of
    `elementwise` ops whose C computes what `spatialc.numerics.epilogue` defines, integer chains that stay in int64."""
    layers = tuple((mm, epilogue.chain(p, mm, elementwise)) for mm in matmul_stages(p))
    operands = {mm.kind.op.operand for mm, _ in layers}  # type: ignore[union-attr]
    if len(operands) > 1:
        raise UnsupportedPrecision(
            " and ".join(sorted(o.value for o in operands)),
            "the kernel's fragments hold one operand type: every matmul of a program multiplies the same",
        )
    first = layers[0][0].kind.op  # type: ignore[union-attr]
    assert isinstance(first, MatmulTiles)
    if first.operand not in MATMUL_PRECISIONS:
        raise UnsupportedPrecision(first.operand, NO_FP32_MATMUL)
    types = operand_types(p, first.operand)
    integer = first.operand.value == "int8"
    for mm, chain in layers:
        check_int8_reduction(p, mm)
        epilogue.check(p, chain, integer, mm)
        if integer:
            epilogue.check_int64(p, chain, dot_range(logical_k(p, mm)))
    return types, integer, layers


def checked_map(p: SpatialProgram) -> tuple[MmaTypes, bool, tuple[Stage, ...]]:
    """A program without a tile matmul (an elementwise map, `spatialc.elementwise`): the C types of its inputs (the
    precision's operand type, loaded into their rings as they are stored), whether it is int8 (exact `long long`
    arithmetic) and its Map stages, each after the maps it reads (`passes.maps.map_shape`: one an output) — after the
    checks `checked_layers` makes of an epilogue chain, of each: the table's ops, constants the values hold, column
    vectors the kernel reads, the output's type, and in an int8 program values that stay in int64 whatever the int8
    inputs and int32 column vectors."""
    try:
        stages = map_shape(p).maps
    except ProgramError as e:
        raise Unsupported("a program without a tile matmul that is no map program", str(e)) from None
    _check_row_major_pages(p)
    types = operand_types(p, p.precision)
    integer = p.precision == Precision.INT8
    for stage in stages:  # (rule 8 has refused an int8 map of another map's values: each starts from int8 pages)
        epilogue.check(p, (stage,), integer, None)
        if integer:
            epilogue.check_int64(p, (stage,), epilogue.INT8_RANGE)
    return types, integer, stages


def checked_rows(p: SpatialProgram) -> tuple[MmaTypes, tuple[Stage, ...]]:
    """A program that reduces rows (`spatialc.rows`): the C types of its inputs and its compute stages in order (row
    reductions and maps) — after the checks `checked_map` makes of its maps, and that it is a float program (the
    kernel's row accumulators are float32)."""
    if p.precision == Precision.INT8:
        raise UnsupportedPrecision(
            "int8", "a row program's reductions and maps are float arithmetic: use fp16 or bf16 (or fp32)"
        )
    shape = row_shape(p)
    for w in shape.pages:
        last = shape.producer.get(w.ins[0])
        if last is None or not isinstance(last.kind, ComputeStage) or not isinstance(last.kind.op, Map):
            raise Unsupported(
                f"a row program whose output {p.tensor(w.kind.tensor).name} is not a map's pages",  # type: ignore[union-attr]
                "its writer stores the pages of a map (a copy is the map x of its own)",
            )
    _check_row_major_pages(p)
    types = operand_types(p, p.precision)
    maps = tuple(s.kind.op for s in shape.computes if isinstance(s.kind.op, Map))  # type: ignore[union-attr]
    epilogue.check_maps(p, maps, False)  # type: ignore[arg-type]
    for t in p.tensors:  # what the kernel stores each as: float32, or rounded to nearest even by its store's conversion
        if t.role == TensorRole.OUTPUT and t.dtype not in (DType.FLOAT32, DType.FP16, DType.BF16):
            raise UnsupportedPrecision(
                t.dtype.value, f"a row program's output {t.name} holds float32, fp16 or bf16 values, as it writes them"
            )
    return types, shape.computes


def checked_attention(p: SpatialProgram) -> tuple[MmaTypes, tuple[Map, ...]]:
    """An attention program (`spatialc.attention`): the C types of its inputs (Q, K and V, the operands of both its
    matmuls) and the maps its schedule runs (each once, in the order first run) — after the checks `checked_rows`
    makes: a float program, pages laid out by rows (Q's, K's and V's as the matmuls' loads read them), maps the
    printers spell exactly."""
    if p.precision == Precision.INT8:
        raise UnsupportedPrecision("int8", "attention is float arithmetic (exp, a softmax): use fp16 or bf16")
    _check_row_major_pages(p, frozenset(p.buffer(ring).ring for _, ring in attention_shape(p).reads))
    types = operand_types(p, p.precision)
    maps = tuple(dict.fromkeys(op.op for op in all_ops(p) if isinstance(op, Compute) and isinstance(op.op, Map)))
    epilogue.check_maps(p, maps, False)
    return types, maps


def _check_row_major_pages(p: SpatialProgram, operands: frozenset = frozenset()) -> None:
    """Every ring's pages hold their tiles row by row: a map (and a row reduction) reads and writes element e of a
    page at e, as the tensors store them — but the `operands` rings, which only matmuls read (laid out for them)."""
    for b in p.buffers:
        kind = b.kind
        if isinstance(kind, Fifo | Interm) and kind.layout != PageLayout.ROW and b.ring not in operands:
            raise Unsupported(
                f"ring {b.name} laid out {kind.layout.value}",
                "a map's pages hold their tiles row by row, as the tensors store them: lay the ring out by rows",
            )


def out_c_type(p: SpatialProgram, form: str, mixed: bool = False) -> str:
    """OUT_T, the C type a kernel stores every output through (the first output's, where `mixed` lets the others
    have types of their own: `other_outputs`) — after checking that the outputs have one type otherwise (`form` names
    the kernel in the refusal)."""
    kinds = sorted({t.dtype.value for t in p.tensors if t.role == TensorRole.OUTPUT})
    if len(kinds) > 1 and not mixed:
        raise Unsupported(
            f"outputs of different element types ({', '.join(kinds)})",
            f"{form} stores this program's outputs in one type (only a row program's and attention's may differ):"
            " give them one",
        )
    out = p.output_tensor()
    if out is None:
        raise Unsupported("a program without an output tensor", "the kernel stores its result into one")
    return C_TYPES[out.dtype]


def other_outputs(p: SpatialProgram, out_type: str) -> dict[int, str]:
    """The C type of each output tensor (by id) whose elements are not OUT_T's (`out_type`): attention's LSE, float32
    beside an O of bf16 or fp16; a row program's vectors (a LayerNorm's mean and rstd), float32 beside an out of bf16
    or fp16."""
    return {
        int(t.id): C_TYPES[t.dtype] for t in p.tensors if t.role == TensorRole.OUTPUT and C_TYPES[t.dtype] != out_type
    }


def checked_gemm(
    p: SpatialProgram, elementwise: Callable[[ComputeOp], bool]
) -> tuple[Stage, MmaTypes, bool, tuple[Stage, ...]]:
    """The matmul stage of a one-matmul program, its fragment types, whether it is int8 and its epilogue chain,
    checked as `checked_layers` checks them."""
    types, integer, ((mm, chain), *_) = checked_layers(p, elementwise)
    return mm, types, integer, chain


def fragments_per_warp(plan: Plan, lanes: int, lane_grid: tuple[int, int] | None) -> int:
    """Accumulator fragments each of the `lanes` compute warps holds: a rectangle of every sub-block where the lane
    grid divides the block, else the item's tiles dealt round the warps."""
    h, w = plan.item_tiles
    if lane_grid is None:
        return math.ceil(h * w / lanes)
    rect = (plan.block.osh // lane_grid[0]) * (plan.block.osw // lane_grid[1])
    return plan.sub_blocks[0] * plan.sub_blocks[1] * rect

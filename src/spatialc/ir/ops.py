"""The choreography ops and compute ops: a closed set of frozen dataclasses, dispatched with `match`.

Semantics (DESIGN §2). A ring has one producer engine and one consumer engine per site:
`Reserve` claims free pages (blocks while the ring is full), `Push` publishes them, `Wait` blocks until that many
published pages are at the front, `Pop` frees them. Only `Reserve`, `Wait` and `SemWait` (and `Barrier`) block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum

from .ids import BufferId, GroupId, LoopVar, SemId, Site, TensorId


class Precision(StrEnum):
    """Operand precision of a tile matmul."""

    INT8 = "int8"
    FP16 = "fp16"
    BF16 = "bf16"


@dataclass(frozen=True, slots=True)
class BlockShape:
    """An accumulator block of `osh × osw` output tiles, reduced `ibw` K-tiles per step."""

    osh: int
    osw: int
    ibw: int


# ---- compute ops -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MatmulTiles:
    """acc[sub-block] += A-page × B-page for every `sh × sw` sub-block of the item (one K step)."""

    block: BlockShape
    sub_blocks: tuple[int, int]
    operand: Precision


@dataclass(frozen=True, slots=True)
class Bias:
    """Add a parameter tensor of one value per output column. The page holds rows of `width` tiles: its tile s
    covers the bias tensor's tile column `at + s mod width` (the schedule sets both from the item's position)."""

    tensor: TensorId
    at: TileAddr = field(default_factory=lambda: TileAddr(0))
    width: int = 1


@dataclass(frozen=True, slots=True)
class Relu:
    """max(x, 0)."""


@dataclass(frozen=True, slots=True)
class Requant:
    """Fixed-point requantisation to int8: multiplier (Q31) and shift, then the zero point, then a clamp."""

    multiplier: int
    shift: int
    zero_point: int


@dataclass(frozen=True, slots=True)
class Scalar:
    """An elementwise op with a constant: one of SCALAR_OPS (`add`, `mul`, `max`, `min`)."""

    op: str
    value: float


SCALAR_OPS = ("add", "mul", "max", "min")
ACTIVATIONS = ("gelu", "silu", "sigmoid", "tanh")


@dataclass(frozen=True, slots=True)
class Activation:
    """An elementwise activation by name, one of ACTIVATIONS (numerics.epilogue defines each formula)."""

    name: str


@dataclass(frozen=True, slots=True)
class Generic:
    """A compute the compiler knows only by name: no backend prints one yet (activations have an op of their own)."""

    name: str
    params: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class AddPartial:
    """acc += the front page of `ins[0]`: a partial sum of the accumulator's own output tiles over another part of
    K (split-K: a site adds the partials other sites left in a workspace tensor, in a fixed order)."""


ComputeOp = MatmulTiles | Bias | Relu | Requant | Scalar | Activation | Generic | AddPartial

# ---- addresses and loop counts -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TileAddr:
    """A flat tile index: `base + Σ stride · var` over loop variables (ITEM_Y / ITEM_X: the item's coordinates)."""

    base: int
    steps: tuple[tuple[LoopVar, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Const:
    """A loop that runs `n` times."""

    n: int


@dataclass(frozen=True, slots=True)
class Trip:
    """A loop whose count is read at run time: ceil(v / per) for v the element `index + Σ stride·var` (over `steps`,
    loop variables or item coordinates) of a parameter tensor, at most `bound`. A grouped GEMM's row blocks: v is
    the group's row count, `per` the rows of one block."""

    tensor: TensorId
    index: int
    bound: int
    per: int = 1
    steps: tuple[tuple[LoopVar, int], ...] = ()


LoopCount = Const | Trip

# ---- choreography ops --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reserve:
    buf: BufferId
    pages: int = 1


@dataclass(frozen=True, slots=True)
class Push:
    buf: BufferId
    pages: int = 1


@dataclass(frozen=True, slots=True)
class Wait:
    buf: BufferId
    pages: int = 1


@dataclass(frozen=True, slots=True)
class Pop:
    buf: BufferId
    pages: int = 1


@dataclass(frozen=True, slots=True)
class ReadTiles:
    """Copy tile `at + bh·stride_h + bw·stride_w` of `tensor` to page slot `bh·block_w + bw` of the reserved page.

    `rows_from`: a grouped tensor's rows at or past its group's row count — element g of that parameter tensor —
    are not read; the page holds zeros there."""

    tensor: TensorId
    at: TileAddr
    block_h: int
    block_w: int
    stride_h: int
    stride_w: int
    into: BufferId
    rows_from: TensorId | None = None


@dataclass(frozen=True, slots=True)
class WriteTiles:
    """The reverse of ReadTiles, from the front (waited) page of `src`; rows past `rows_from`'s count are not
    written."""

    src: BufferId
    tensor: TensorId
    at: TileAddr
    block_h: int
    block_w: int
    stride_h: int
    stride_w: int
    rows_from: TensorId | None = None


@dataclass(frozen=True, slots=True)
class AcquireAcc:
    """Zero the accumulator."""

    buf: BufferId


@dataclass(frozen=True, slots=True)
class ReleaseAcc:
    buf: BufferId


@dataclass(frozen=True, slots=True)
class Compute:
    """Apply `op` to the front pages of `ins`: a matmul accumulates into `acc`; an elementwise op writes the
    reserved page of `outs[0]`. `acc_reload` names a buffer the accumulator is spilled to and reloaded from."""

    op: ComputeOp
    ins: tuple[BufferId, ...]
    outs: tuple[BufferId, ...] = ()
    acc: BufferId | None = None
    acc_reload: BufferId | None = None


@dataclass(frozen=True, slots=True)
class PackAcc:
    """Move `tiles` accumulator tiles into the reserved page of `to` (adding to it when `accumulate`)."""

    acc: BufferId
    to: BufferId
    tiles: int
    accumulate: bool = False


@dataclass(frozen=True, slots=True)
class SemSet:
    """Set this site's copy of `sem` to `value`."""

    sem: SemId
    value: int


@dataclass(frozen=True, slots=True)
class SemInc:
    """Add `by` to site `at`'s copy of `sem`."""

    sem: SemId
    at: Site
    by: int = 1


@dataclass(frozen=True, slots=True)
class SemWait:
    """Block until this site's copy of `sem` is at least `value`."""

    sem: SemId
    value: int


@dataclass(frozen=True, slots=True)
class McastSetValid:
    """Set `sem` to `value` on every site of `group` (the multicast's 'data is there' flag)."""

    sem: SemId
    group: GroupId
    value: int = 1


@dataclass(frozen=True, slots=True)
class McastSend:
    """Copy this site's reserved page of `buf` into the reserved page of `buf` on every other site of `group`."""

    buf: BufferId
    group: GroupId


@dataclass(frozen=True, slots=True)
class Barrier:
    """Every site of `group` waits here until all have arrived."""

    group: GroupId


@dataclass(frozen=True, slots=True)
class ReadBarrier:
    """Reads issued so far have landed (a no-op where reads are synchronous)."""


@dataclass(frozen=True, slots=True)
class WriteBarrier:
    """Writes issued so far are visible (a no-op where writes are synchronous)."""


@dataclass(frozen=True, slots=True)
class Flush:
    """Writes from `buf` issued so far are visible."""

    buf: BufferId


@dataclass(frozen=True, slots=True)
class Loop:
    var: LoopVar
    count: LoopCount
    body: tuple[ChoreoOp, ...]


ChoreoOp = (
    Reserve
    | Push
    | Wait
    | Pop
    | ReadTiles
    | WriteTiles
    | AcquireAcc
    | ReleaseAcc
    | Compute
    | PackAcc
    | SemSet
    | SemInc
    | SemWait
    | McastSetValid
    | McastSend
    | Barrier
    | ReadBarrier
    | WriteBarrier
    | Flush
    | Loop
)

CHOREO_OPS: tuple[type, ...] = ChoreoOp.__args__  # type: ignore[attr-defined]
COMPUTE_OPS: tuple[type, ...] = ComputeOp.__args__  # type: ignore[attr-defined]
FLOW_OPS = (Reserve, Push, Wait, Pop)


def ring_of(op: ChoreoOp) -> BufferId | None:
    """The buffer an op is about, for an error's `buffer` field: the ring a flow op, a ReadTiles or a multicast
    send moves pages of, the ring a WriteTiles empties, a matmul's accumulator (else an elementwise op's output),
    the accumulator a PackAcc empties; None for loops, semaphores and barriers."""
    match op:
        case Reserve() | Push() | Wait() | Pop() | AcquireAcc() | ReleaseAcc() | McastSend() | Flush():
            return op.buf
        case ReadTiles():
            return op.into
        case WriteTiles():
            return op.src
        case Compute():
            return op.acc if op.acc is not None else (op.outs or op.ins or (None,))[0]
        case PackAcc():
            return op.acc
    return None


def rewrite(ops: tuple[ChoreoOp, ...], f) -> tuple[ChoreoOp, ...]:
    """`ops` with every op that is not a loop replaced by f(op), loops kept (every field) around their bodies
    rewritten the same way."""
    return tuple(dataclasses.replace(op, body=rewrite(op.body, f)) if isinstance(op, Loop) else f(op) for op in ops)


def walk(ops: tuple[ChoreoOp, ...]):
    """Every op of `ops`, loops before their bodies, depth first."""
    for op in ops:
        yield op
        if isinstance(op, Loop):
            yield from walk(op.body)

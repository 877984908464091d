"""The choreography ops and compute ops: a closed set of frozen dataclasses, dispatched with `match`.

Semantics (DESIGN §2). A ring has one producer engine and one consumer engine per site:
`Reserve` claims free pages (blocks while the ring is full), `Push` publishes them, `Wait` blocks until that many
published pages are at the front, `Pop` frees them. Only `Reserve`, `Wait` and `SemWait` (and `Barrier`) block.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from enum import StrEnum

from .ids import BufferId, GroupId, LoopVar, SemId, Site, TensorId


class Precision(StrEnum):
    """Operand precision of a program: the type of its input tensors and of a tile matmul's operands. E4M3 and E5M2
    are the two 8-bit floats (ml_dtypes' and torch's float8_e4m3fn and float8_e5m2): float operands, summed in float32
    like fp16 and bf16. FP32 (float32, spelt as the element type is) is a precision of programs with no matmul alone —
    maps and row programs, Triton's float32 vector add and softmax: no tensor-core MMA takes float32 operands, and
    spatialc rounds none to tf32 (`MATMUL_PRECISIONS`)."""

    INT8 = "int8"
    FP16 = "fp16"
    BF16 = "bf16"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    FP32 = "float32"


FP8_PRECISIONS = frozenset({Precision.E4M3, Precision.E5M2})  # the 8-bit floats: int8's pages, float sums
MATMUL_PRECISIONS = frozenset(Precision) - {Precision.FP32}  # the operand types a tile matmul takes
# Why a program with a matmul refuses float32 operands, and the fix: one line, wherever one is refused.
NO_FP32_MATMUL = (
    "a tile matmul takes no float32 operands (no tensor-core MMA multiplies float32, and spatialc rounds none to"
    " tf32 unasked): round A and B to bf16 or fp16 (precision='bf16'), with out='fp32' for a float32 result; float32"
    " is the precision of programs with no matmul (elementwise, softmax, rmsnorm, layernorm, row_reduce)"
)


@dataclass(frozen=True, slots=True)
class BlockShape:
    """An accumulator block of `osh × osw` output tiles, reduced `ibw` K-tiles per step."""

    osh: int
    osw: int
    ibw: int


# ---- compute ops -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KScale:
    """One operand's scales per group along K (a block-scaled operand; `numerics.blockscale` defines them): the
    parameter tensor `tensor` holds one float32 value per block of `outer` × `k` elements of the operand — `outer`
    of A's rows (or of B's columns), `k` along K. A's scale of element (i, k) is tensor[i // outer, k // k_block],
    B's of (k, j) tensor[k // k_block, j // outer]. DeepGEMM's: A 1 × 128, B 128 × 128; OCP MX's (MXFP8): A 1 × 32,
    B 32 × 1, the tensor's values e8m0 (`numerics.blockscale.promotion_k`)."""

    tensor: TensorId
    outer: int
    k: int


@dataclass(frozen=True, slots=True)
class BlockScales:
    """The scales a block-scaled matmul promotes each K step's product with: acc += (A-page × B-page) · sa · sb,
    sa of each row (A's scale of the step's K group), sb of each column (B's). The schedule sets where the step is:
    `rows` its page's first tile row (of A and C), `cols` its first tile column (of B and C), `k` its first K tile;
    a step lies within one K group of each operand (verify's rule 8 proves it). A grouped GEMM's (its scale tensors
    hold a matrix a group, stacked as the grouped tensors): `group` the step's group, `rows` its first tile row within
    the group; None where the program has one group."""

    a: KScale
    b: KScale
    rows: TileAddr = field(default_factory=lambda: TileAddr(0))
    cols: TileAddr = field(default_factory=lambda: TileAddr(0))
    k: TileAddr = field(default_factory=lambda: TileAddr(0))
    group: TileAddr | None = None


@dataclass(frozen=True, slots=True)
class MatmulTiles:
    """acc[sub-block] += A-page × B-page for every `sh × sw` sub-block of the item (one K step).

    `transpose_b`: the B page holds Bᵀ — `w × ibw` tiles, tile (j, k) the transpose of B's tile (k, j) — so the
    product is A · pageᵀ: attention's S = Q·Kᵀ reads K's rows as they are stored.

    `scales`: a block-scaled matmul — the step's product, a partial sum of its own, is promoted into the accumulator
    multiplied by each row's and each column's scale of the step's K group (`BlockScales`; DeepGEMM's promotion)."""

    block: BlockShape
    sub_blocks: tuple[int, int]
    operand: Precision
    transpose_b: bool = False
    scales: BlockScales | None = None


@dataclass(frozen=True, slots=True)
class Requant:
    """Fixed-point requantisation to int8: multiplier (Q31) and shift, then the zero point, then a clamp."""

    multiplier: int
    shift: int
    zero_point: int


# The epilogue names the frontend and the CLI take for the ops with a constant and for the activations (`scalar`,
# `activation` below make each a Map).
SCALAR_OPS = ("add", "mul", "max", "min")
# `gelu` is PyTorch's tanh form, as it always was here; `gelu_tanh` and `gelu_erf` ask for either form by its name.
ACTIVATIONS = ("gelu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh")
# Bare `gelu` means the tanh form in an epilogue but the erf form in the elementwise table (and torch's nn.GELU()):
# code asking an epilogue for it is warned (`warn_bare_gelu`); a saved program holding it still reads silently.
BARE_GELU_NOTE = (
    "activation 'gelu' is the tanh form here (and the erf form in the elementwise table and torch); "
    "name it 'gelu_tanh' (the same result) or 'gelu_erf' (torch's nn.GELU() default)"
)


@dataclass(frozen=True, slots=True)
class Generic:
    """A compute the compiler knows only by name: no backend prints one yet (elementwise ops are a Map)."""

    name: str
    params: tuple[float, ...] = ()


# ---- elementwise expressions (numerics.elementwise defines every op: meaning, C, error bound, integer range) -------


@dataclass(frozen=True, slots=True)
class Arg:
    """Input page `index` of the Compute (its `ins[index]`), element by element."""

    index: int


@dataclass(frozen=True, slots=True)
class RowArg:
    """Input page `index` of the Compute, a row vector (a row accumulator packed: a page of one tile column, each row's
    value in every column): each element takes its row's value. The other pages hold rows of `width` tiles (the
    schedule sets it, as a column vector's), so tile s of them is in the vector's tile row s // width."""

    index: int
    width: int = 1


@dataclass(frozen=True, slots=True)
class Lit:
    """A constant value: a float32 in a float program, an integer in an integer one."""

    value: float


class VecAxis(StrEnum):
    """Which of a page's positions a broadcast vector follows: its column (a bias, a per-channel scale) or its row (a
    per-token scale)."""

    COL = "col"
    ROW = "row"

    def __repr__(self) -> str:  # as source that makes it (`show --python` prints ops by their reprs)
        return f"VecAxis.{self.name}"


@dataclass(frozen=True, slots=True)
class Col:
    """A broadcast vector from a parameter tensor. Along `axis` COL (a bias): one value per output column, from a
    tensor of one row; the page holds rows of `width` tiles, and its tile s covers the tensor's tile column
    `at + s mod width`. Along ROW (a per-token scale): one value per output row, from a tensor of one column; the
    page's tile s covers the tensor's tile row `at + s // width`. The schedule sets `at` and `width` from the item's
    position (its first column, or its first row)."""

    tensor: TensorId
    at: TileAddr = field(default_factory=lambda: TileAddr(0))
    width: int = 1
    axis: VecAxis = VecAxis.COL


@dataclass(frozen=True, slots=True)
class Apply:
    """Op `op` of the elementwise table on `args`, with the op's constant `params` (leaky_relu's α, clamp's bounds)."""

    op: str
    args: tuple[Expr, ...]
    params: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Pos:
    """An element's own index along `axis` in its tensor's (one group's) rows or columns, as a value: a page of
    rows `width` tiles wide whose first tile row (ROW) or first tile column (COL) is `at`, its tile s at tile row
    `at + s // width` or tile column `at + s mod width`, the element's offset inside the tile added. What a mask
    compares: attention's causal mask keeps column ≤ row + (seq_kv − seq_q), its padding mask column < seq_kv."""

    axis: VecAxis
    at: TileAddr = field(default_factory=lambda: TileAddr(0))
    width: int = 1


Expr = Arg | RowArg | Lit | Col | Pos | Apply


@dataclass(frozen=True, slots=True)
class Map:
    """Each element of the reserved page of `outs[0]` is `expr` of the same element of the front pages of `ins`
    (and of the column vectors it names)."""

    expr: Expr


# The longest op list (a program, a loop's body) and address (steps) a program may hold: verify refuses more and a
# saved file's reader refuses more before decoding them, so spatialc never writes a program it cannot read back.
# Built programs hold at most ~120 ops a list (split-K 32 ways with an epilogue) and 3 steps; a `spatialc.lang`
# program unrolled by hand holds more (210 K steps unrolled: 1,260 ops in one loop body).
MAX_OP_LIST = 16384
MAX_ADDR_STEPS = 32  # a step for each loop variable in scope: 8 named ones and the nested loops verify allows
MAX_EXPR_NODES = 256  # far beyond any elementwise formula a kernel applies; more is refused, not walked
MAX_EXPR_DEPTH = 64  # ops inside ops: every reader of a formula (type checks, the interpreter, printers) recurses


def expr_size_fault(expr: object) -> str | None:
    """Why `expr` is too large to walk — more than MAX_EXPR_NODES nodes, or ops nested more than MAX_EXPR_DEPTH deep —
    found without recursion and whatever its nodes hold (their types are checked after), or None."""
    stack, seen = [(expr, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_EXPR_NODES:
            return f"an elementwise expression of more than {MAX_EXPR_NODES} nodes"
        if not isinstance(node, Apply):
            continue
        if depth > MAX_EXPR_DEPTH:
            return f"an elementwise expression of ops nested more than {MAX_EXPR_DEPTH} deep"
        if isinstance(node.args, tuple):
            stack.extend((a, depth + 1) for a in node.args[: MAX_EXPR_NODES + 1])
    return None


def relu() -> Map:
    """max(x, 0) of the one input page."""
    return Map(Apply("relu", (Arg(0),)))


def scalar(op: str, value: float) -> Map:
    """x `op` value (op one of SCALAR_OPS) of the one input page."""
    return Map(Apply(op, (Arg(0), Lit(value))))


# The activations' names as programs of earlier versions (and the frontend's epilogue list) give them: `gelu` was
# always PyTorch's tanh form, which the table calls gelu_tanh.
_NAMED_OPS = {"gelu": "gelu_tanh", "silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh"}
ACTIVATION_NAMES = {op: name for name, op in _NAMED_OPS.items()}  # gelu_tanh → "gelu", as programs name it
# and each form by its own name: the table's gelu is the erf form (nn.GELU()'s default).
ACTIVATION_OPS = {**_NAMED_OPS, "gelu_tanh": "gelu_tanh", "gelu_erf": "gelu"}


def activation(name: str) -> Map:
    """An activation by name (one of ACTIVATIONS) of the one input page."""
    return Map(Apply(ACTIVATION_OPS.get(name, name), (Arg(0),)))


def bias(tensor: TensorId, at: TileAddr | None = None, width: int = 1) -> Map:
    """x + the bias of its column, from `tensor`."""
    return Map(Apply("add", (Arg(0), Col(tensor, at if at is not None else TileAddr(0), width))))


def row_scale(tensor: TensorId, at: TileAddr | None = None, width: int = 1) -> Map:
    """x · the scale of its row, from `tensor` (one value per row: a per-token scale)."""
    vec = Col(tensor, at if at is not None else TileAddr(0), width, VecAxis.ROW)
    return Map(Apply("mul", (Arg(0), vec)))


def col_scale(tensor: TensorId, at: TileAddr | None = None, width: int = 1) -> Map:
    """x · the scale of its column, from `tensor` (one value per column: a per-channel scale)."""
    return Map(Apply("mul", (Arg(0), Col(tensor, at if at is not None else TileAddr(0), width))))


def with_operand(op: str) -> Map:
    """x0 `op` x1: the value and the same element of a second page (add: a residual, mul: a gate)."""
    return Map(Apply(op, (Arg(0), Arg(1))))


# The elementwise ops of earlier versions, by their old names, as the Maps they are now: programs written with them
# (in spatialc.lang, `e.compute(Relu(), s, d)`) still build, and mean what they meant.


def Relu() -> Map:  # noqa: N802
    """max(x, 0): `relu()`."""
    return relu()


def Scalar(op: str, value: float) -> Map:  # noqa: N802
    """x `op` value: `scalar(op, value)`."""
    return scalar(op, value)


def Activation(name: str) -> Map:  # noqa: N802
    """An activation by name: `activation(name)` (bare `gelu` warned of, as spatialc.activation does)."""
    warn_bare_gelu(name)
    return activation(name)


def warn_bare_gelu(name: str, stacklevel: int = 2) -> None:
    """A FutureWarning (shown by default) where user code asks an epilogue for bare `gelu`: BARE_GELU_NOTE, pointing
    at the line that called the function that calls this one (`stacklevel` 2)."""
    if name == "gelu":
        warnings.warn(BARE_GELU_NOTE, FutureWarning, stacklevel=stacklevel + 1)


def Bias(tensor: TensorId, at: TileAddr | None = None, width: int = 1) -> Map:  # noqa: N802
    """x + a bias: `bias(tensor, at, width)`."""
    return bias(tensor, at, width)


def row_args(expr: Expr) -> tuple[int, ...]:
    """The input pages `expr` reads as row vectors (RowArg), by index."""
    return tuple(i for i, _ in row_reads(expr))


def row_reads(expr: Expr) -> tuple[tuple[int, int], ...]:
    """(page index, width) of each row vector `expr` reads, by index."""
    found: dict[int, int] = {}
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, RowArg):
            found.setdefault(node.index, node.width)
        elif isinstance(node, Apply):
            stack.extend(node.args)
    return tuple(sorted(found.items()))


def cols(expr: Expr) -> tuple[Col, ...]:
    """The broadcast vectors `expr` reads from parameter tensors (column vectors and row vectors alike), in order."""
    match expr:
        case Col():
            return (expr,)
        case Apply(_, args):
            return tuple(c for a in args for c in cols(a))
    return ()


def positions(expr: Expr) -> tuple[TileAddr, ...]:
    """The addresses of the positions (`Pos`: a mask's rows and columns) `expr` reads, in order."""
    match expr:
        case Pos(_, at, _):
            return (at,)
        case Apply(_, args):
            return tuple(a for x in args for a in positions(x))
    return ()


def with_cols(expr: Expr, f) -> Expr:
    """`expr` with every column vector c replaced by f(c)."""
    match expr:
        case Col():
            return f(expr)
        case Apply(op, args, params):
            return Apply(op, tuple(with_cols(a, f) for a in args), params)
    return expr


def with_row_args(expr: Expr, width: int) -> Expr:
    """`expr` with every row vector read against pages of rows `width` tiles wide."""
    match expr:
        case RowArg(i):
            return RowArg(i, width)
        case Apply(op, args, params):
            return Apply(op, tuple(with_row_args(a, width) for a in args), params)
    return expr


def arg_indices(expr: Expr) -> tuple[int, ...]:
    """The input pages `expr` reads, by index, in order of first use (row vectors too)."""
    match expr:
        case Arg(i) | RowArg(i, _):
            return (i,)
        case Apply(_, args):
            seen: list[int] = []
            for a in args:
                seen += [i for i in arg_indices(a) if i not in seen]
            return tuple(seen)
    return ()


# The row reductions, each defined in numerics/reductions.py (REDUCTIONS): its meaning, identity, C and bound.
REDUCE_OPS = ("max", "min", "sum", "sumsq", "absmax")


@dataclass(frozen=True, slots=True)
class RowReduce:
    """acc[row] ⊕= `op` over the front page's elements of that row whose column is below `cols` (the row's logical
    width: padding is left out). The page is rows of `width` tiles whose first is tile column `at` of the row (the
    schedule sets both from the loop over a row's pages). The accumulator holds one value a row of the page, packed
    as a row vector: a page of one tile column, each row's value in every column."""

    op: str
    cols: int
    at: TileAddr = field(default_factory=lambda: TileAddr(0))
    width: int = 1


@dataclass(frozen=True, slots=True)
class ColReduce:
    """acc[column] ⊕= `op` over the front page's elements of that column whose row is below `rows` (the column's
    logical height: padding rows are left out). The page is rows of `width` tiles whose first tile row is `at` of the
    tensor (the schedule sets it from the loop over a column band's pages of rows). The accumulator holds one value a
    column of the page (`width` tiles), packed as a column vector: a page of one tile row, each column's value in
    every row. `numerics/reductions.py` defines each `op` (REDUCE_OPS), as for RowReduce."""

    op: str
    rows: int
    at: TileAddr = field(default_factory=lambda: TileAddr(0))
    width: int = 1


@dataclass(frozen=True, slots=True)
class ScaleAcc:
    """acc[row] ·= the row's value of the front page of `ins[0]`, a row vector (a row accumulator packed): every
    element of the accumulator's row, over all its tiles. Online softmax's rescale by α = exp(m − m′) of the output
    accumulator and of the running sum, between two KV blocks."""


@dataclass(frozen=True, slots=True)
class Attention:
    """A declaration, not a compute: O = softmax(scale · Q·Kᵀ + mask) · V and LSE = log Σ exp(scale · Q·Kᵀ + mask)
    along each row, for every head — the stage `spatialc.attention` declares, read by rule 8 and expanded by the
    attention planner (`passes/attention.py`) into the online recurrence no engine runs as one op. Q holds
    `seq_q` rows a head, K and V `seq_kv` rows a KV head; query head h reads KV head h // `group`. The mask keeps
    key column c for query row r where c < seq_kv and, `causal`, c ≤ r + seq_kv − seq_q (aligned bottom right)."""

    scale: float
    seq_q: int
    seq_kv: int
    group: int = 1
    causal: bool = False


@dataclass(frozen=True, slots=True)
class AddPartial:
    """acc += the front page of `ins[0]`: a partial sum of the accumulator's own output tiles over another part of
    K (split-K: a site adds the partials other sites left in a workspace tensor, in a fixed order)."""


class WeightFormat(StrEnum):
    """A packed 4-bit weight format (numerics/w4.py defines each: its values, its packing, its dequant)."""

    INT4 = "int4"
    UINT4 = "uint4"
    MXFP4 = "mxfp4"


@dataclass(frozen=True, slots=True)
class Dequant:
    """A W4A16 GEMM's dequant prologue: each element of the reserved page of `outs[0]` is the dequantised weight
    (`numerics.w4.dequant`, rounded to `operand`) of the same element q of the front page of `ins[0]`, a page of
    packed 4-bit weights — scale[g, j] · (q − zero[g, j]) for the element's row k of B and column j, g = k // group.
    The page holds rows of `width` tiles; its tile s lies at B's tile row `rows + s // width` and tile column
    `cols + s mod width` (the schedule sets both from the K step and the item). `scale` and `zero` are parameter
    tensors of (K / group) × N values; `zero` None is a zero point of 0 (and always so for mxfp4). `low_first`: the
    page's bytes are read with row 2i of B in the low nibble and row 2i + 1 in the high one — the order weights are
    packed in (numerics/w4.py); False reads them the other way round, which rule 8 refuses (a printer reads it)."""

    weights: WeightFormat
    operand: Precision
    group: int
    scale: TensorId
    zero: TensorId | None = None
    rows: TileAddr = field(default_factory=lambda: TileAddr(0))
    cols: TileAddr = field(default_factory=lambda: TileAddr(0))
    width: int = 1
    low_first: bool = True


ComputeOp = MatmulTiles | Map | RowReduce | ColReduce | ScaleAcc | Requant | Generic | AddPartial | Attention | Dequant

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


@dataclass(frozen=True, slots=True)
class Span:
    """A loop whose count is known per item, not read from data: min(`bound`, max(0, ceil(v / per))) for
    v = `base + Σ stride·var` over `steps` (item coordinates). A causal attention's band runs only the KV blocks at
    or left of its diagonal: v the band's last visible key + 1, `per` the keys of a block."""

    base: int
    per: int
    bound: int
    steps: tuple[tuple[LoopVar, int], ...] = ()


LoopCount = Const | Trip | Span

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
    """`body` run `count` times, `var` its index. An ITEM loop runs the site's items `first` … `first` + count − 1
    (their places in its list: a split tail's last item follows the loop over its whole ones); every other loop's
    `first` is 0."""

    var: LoopVar
    count: LoopCount
    body: tuple[ChoreoOp, ...]
    first: int = 0


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

"""The nodes of a spatial program (DESIGN §2): tensors, stages, buffers, the plan, placement and schedule."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from .ids import BufferId, GroupId, ItemId, SemId, Site, StageId, TensorId
from .ops import BlockShape, ChoreoOp, ComputeOp, Precision

T = TypeVar("T")


class TensorRole(StrEnum):
    INPUT = "input"
    OUTPUT = "output"
    PARAMETER = "parameter"
    # Written and read by the program itself, in global memory, never by the caller: split-K's partial sums. Its
    # bytes count in the ledger; evaluate, emulate and run allocate it.
    WORKSPACE = "workspace"


class DType(StrEnum):
    """Element types a tensor can hold."""

    INT8 = "int8"
    INT32 = "int32"
    INT64 = "int64"
    FP16 = "fp16"
    BF16 = "bf16"
    FLOAT32 = "float32"
    E4M3 = "e4m3"  # float8_e4m3fn: 4 exponent bits, 3 fraction bits, largest ±448, NaN but no infinity
    E5M2 = "e5m2"  # float8_e5m2: 5 exponent bits, 2 fraction bits, largest ±57344, infinities like fp16
    # 4-bit weights, stored packed two a byte (numerics/w4.py: the nibble order and the dequant), and MXFP4's scale
    INT4 = "int4"  # ml_dtypes.int4: −8 … 7
    UINT4 = "uint4"  # ml_dtypes.uint4: 0 … 15
    E2M1 = "e2m1"  # ml_dtypes.float4_e2m1fn: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no NaN or infinity
    E8M0 = "e8m0"  # ml_dtypes.float8_e8m0fnu: 2^e for e in −127 … 127 (0xFF is NaN), an MXFP4 group's scale


FP8 = frozenset({DType.E4M3, DType.E5M2})  # the 8-bit float element types (operands only: no output holds them)
FOUR_BIT = frozenset({DType.INT4, DType.UINT4, DType.E2M1})  # packed weight types, read only through a Dequant


def accumulator_dtype(precision: Precision) -> DType:
    """What a program of `precision` accumulates in, and so what its partial sums and biases hold: int32 for int8
    operands, float32 for fp16, bf16, e4m3 and e5m2."""
    return DType.INT32 if precision == Precision.INT8 else DType.FLOAT32


class TileOrder(StrEnum):
    """How a tile's elements lie in memory: row by row (the default) or column by column — K-major for a B
    operand, whose columns are K (the int8 tensor-core operand path needs B that way; DESIGN §2)."""

    ROW = "row"
    COL = "col"


class PageLayout(StrEnum):
    """How each tile of a ring's page lies in shared memory.

    `row` and `col` are the tile as its tensor stores it (TileOrder); `swizzled` is `row` with the two 16-byte
    halves of row r exchanged when bit 2 of r is set — for 16-bit operands, whose 32-byte rows would otherwise put
    rows r and r+4 of every 8×8 fragment load in the same shared-memory banks.

    The page's tiles lie in its slot order (ReadTiles' slot bh·block_w + bw) one after another. The `_cols` layouts
    (the same slots column by column) are what version-5 documents built for sm_90a hold; `from_json` lays such a
    program out again in panels, and no form reads them.

    `panels` is not made of tiles: the page is one row-major matrix (block_h·16 rows of block_w·16 elements) cut
    into panels as wide as its rows allow, up to 128 bytes (`panel_bytes`), panel after panel, each row of a panel
    `panel_bytes` long; within a panel the 16-byte chunks of each row are exchanged by the swizzle the copy engine
    and wgmma both apply (`panel_offset`). `panels_t` is the same for the page's transpose: each column of the page
    is a row of its panels (K-major: the int8 B of the sm_90a form). The sm_90a form's operands, loaded by TMA from
    row-major tensors; what the other forms' fragment loads read is tiles.
    """

    ROW = "row"
    COL = "col"
    SWIZZLED = "swizzled"
    SWIZZLED_COLS = "swizzled_cols"
    ROW_COLS = "row_cols"
    PANELS = "panels"
    PANELS_T = "panels_t"

    @property
    def note(self) -> str:
        """The layout as listings and pictures name it beside a ring: "" for plain row-major pages."""
        return {
            PageLayout.ROW: "",
            PageLayout.COL: "K-major",
            PageLayout.SWIZZLED: "swizzled",
            PageLayout.SWIZZLED_COLS: "swizzled, tiles by column",
            PageLayout.ROW_COLS: "tiles by column",
            PageLayout.PANELS: "swizzled panels",
            PageLayout.PANELS_T: "K-major, swizzled panels",
        }[self]

    @property
    def swizzled(self) -> bool:
        """Whether each tile's rows have their 16-byte halves exchanged (bit 2 of the row)."""
        return self in (PageLayout.SWIZZLED, PageLayout.SWIZZLED_COLS)

    @property
    def panels(self) -> bool:
        """Whether the page is a swizzled row-major matrix in panels (`panels`, `panels_t`), not tiles."""
        return self in (PageLayout.PANELS, PageLayout.PANELS_T)

    @property
    def order(self) -> TileOrder:
        """The tile order the page holds (a swizzle permutes 16-byte chunks within rows, not the order)."""
        return TileOrder.COL if self in (PageLayout.COL, PageLayout.PANELS_T) else TileOrder.ROW


PANEL_WIDTHS = (128, 64, 32)  # bytes: the swizzle spans of the copy engine and wgmma, widest first


def panel_bytes(row_bytes: int) -> int | None:
    """The width of a `panels` page's panels: the widest swizzle span dividing its rows' `row_bytes`; None where
    none does (rows of 16 bytes, or of an odd number of 16-byte chunks past 32)."""
    return next((w for w in PANEL_WIDTHS if row_bytes % w == 0), None)


def panel_offset(row: int, col_byte: int, rows: int, row_bytes: int) -> int:
    """The byte of a `panels` page (`rows` rows of `row_bytes`) holding row `row`'s byte `col_byte`: its panel,
    its row there, its byte in that row — with the 16-byte chunk index (offset bits 4 up) XORed with the offset's
    bits 7 up, as many bits as the panel has chunks: the copy engine's and wgmma's swizzle, which works on shared
    memory addresses and is the page's own where the page starts on 1024 bytes."""
    width = panel_bytes(row_bytes)
    if width is None:
        raise ValueError(f"rows of {row_bytes} bytes cannot be cut into swizzled panels")
    off = (col_byte // width) * rows * width + row * width + col_byte % width
    return off ^ (((off >> 7) & (width // 16 - 1)) << 4)


class Engine(StrEnum):
    """A site's engines: a reader, a compute engine, a writer — the three of a Tenstorrent core's kernels — and a
    mover, a further data-movement engine where a program needs one (a second reader or writer, a forwarder). Each
    runs its own program; nothing but rings and semaphores orders them."""

    READER = "reader"
    COMPUTE = "compute"
    WRITER = "writer"
    MOVER = "mover"


@dataclass(frozen=True, slots=True)
class Tile:
    rows: int
    cols: int

    @property
    def elems(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True, slots=True)
class Tensor:
    """Stored tiled: tile (ti, tj) is the contiguous run at (ti·cols_t + tj)·elems, row-major inside the tile
    (column-major when `order` is COL).

    `elems` is the logical (rows, cols); `tiles` is the (possibly padded, zero-filled) tile grid (rows_t, cols_t).
    """

    id: TensorId
    name: str
    role: TensorRole
    elems: tuple[int, int]
    tiles: tuple[int, int]
    dtype: DType
    order: TileOrder = TileOrder.ROW
    # A grouped tensor holds `groups` matrices of `elems` each, stacked: `tiles` is the whole grid, each group's
    # tiles[0] / groups rows of tiles after the one before (a grouped GEMM's A, B and C).
    groups: int = 1

    @property
    def group_tiles(self) -> tuple[int, int]:
        """One group's tile grid."""
        return (self.tiles[0] // self.groups, self.tiles[1])


@dataclass(frozen=True, slots=True)
class ReadStage:
    tensor: TensorId


@dataclass(frozen=True, slots=True)
class ComputeStage:
    op: ComputeOp


@dataclass(frozen=True, slots=True)
class WriteStage:
    tensor: TensorId


StageKind = ReadStage | ComputeStage | WriteStage


@dataclass(frozen=True, slots=True)
class Stage:
    id: StageId
    name: str
    kind: StageKind
    engine: Engine
    ins: tuple[BufferId, ...] = ()
    outs: tuple[BufferId, ...] = ()


@dataclass(frozen=True, slots=True)
class Fifo:
    depth_pages: int
    page_tiles: int
    layout: PageLayout = PageLayout.ROW


@dataclass(frozen=True, slots=True)
class Interm:
    depth_pages: int
    page_tiles: int
    layout: PageLayout = PageLayout.ROW


@dataclass(frozen=True, slots=True)
class Accumulator:
    tiles: int


BufferKind = Fifo | Interm | Accumulator


@dataclass(frozen=True, slots=True)
class Buffer:
    """A ring (Fifo / Interm) or an accumulator. `origin` names the template a per-site copy came from."""

    id: BufferId
    name: str
    kind: BufferKind
    origin: BufferId | None = None

    @property
    def ring(self) -> BufferId:
        """The template this buffer is a copy of (itself when it is one)."""
        return self.origin if self.origin is not None else self.id


@dataclass(frozen=True, slots=True)
class Semaphore:
    id: SemId
    name: str
    initial: int = 0


# Far beyond the handful of semaphores a program declares (each site keeps its own copy of each): more is refused.
MAX_SEMAPHORES = 1 << 12


@dataclass(frozen=True, slots=True)
class Plan:
    """Block shape, sub-blocks per item, the item grid `(ny, nx)`, K tiles (padded) and ring depth."""

    block: BlockShape
    sub_blocks: tuple[int, int]
    grid: tuple[int, int]
    k_tiles: int
    depth: int
    # A grouped GEMM: `groups` products of one shape, `grid` each. What placement distributes is then a strip per
    # group and column of items (`placed`), whose row blocks a loop counts at run time.
    groups: int = 1

    @property
    def item_tiles(self) -> tuple[int, int]:
        """Output tiles of one block of accumulators: (sh·osh, sw·osw)."""
        return (self.sub_blocks[0] * self.block.osh, self.sub_blocks[1] * self.block.osw)

    @property
    def k_steps(self) -> int:
        return self.k_tiles // self.block.ibw

    @property
    def placed(self) -> tuple[int, int]:
        """The grid of what placement distributes: the items, or (groups, columns) of a grouped GEMM's strips."""
        return (self.groups, self.grid[1]) if self.groups > 1 else self.grid

    @property
    def placed_tiles(self) -> tuple[int, int]:
        """Output tiles of one placed item: a block, or a grouped GEMM's strip (its group's rows, a block wide)."""
        h, w = self.item_tiles
        return (h * self.grid[0], w) if self.groups > 1 else (h, w)

    @property
    def items(self) -> int:
        """What placement distributes: items, or a grouped GEMM's strips."""
        return self.placed[0] * self.placed[1]


@dataclass(frozen=True, slots=True)
class Group:
    """Sites that share data by multicast."""

    id: GroupId
    sites: tuple[Site, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """Which items each site computes (any set: contiguous or strided), and the multicast groups."""

    items_of_site: tuple[tuple[Site, tuple[ItemId, ...]], ...]
    groups: tuple[Group, ...] = ()
    kind: str = "contiguous"
    band: int = 0  # a grouped placement's rows per band (ir/worklist.py); 0 for the other rules
    splits: int = 1  # sites per item: split-K places each item on `splits` sites, each reducing a part of K
    multicast: tuple[int, int] = (1, 1)  # sites per multicast group (gy, gx): passes/multicast.py
    # A split tail (passes/split.py, kind "split_tail"): the last `tail` items of the grid, row-major, are each on
    # `splits` sites, as the last item of each; every other item is on one site. 0: `splits` holds for every item.
    tail: int = 0

    def items_at(self, site: Site) -> tuple[ItemId, ...]:
        for s, items in self.items_of_site:
            if s == site:
                return items
        return ()

    @property
    def sites(self) -> tuple[Site, ...]:
        return tuple(s for s, _ in self.items_of_site)


@dataclass(frozen=True, slots=True)
class EngineProgram:
    site: Site
    engine: Engine
    ops: tuple[ChoreoOp, ...]


def per_op_list(
    programs: Iterable[EngineProgram], f: Callable[[tuple[ChoreoOp, ...]], T]
) -> list[tuple[EngineProgram, T]]:
    """(program, f(its ops)) for each program in order, f worked out once for each op list: hundreds of sites share
    a few lists (each list held while this runs, so that its id names no other)."""
    found: dict[int, tuple[tuple[ChoreoOp, ...], T]] = {}
    out = []
    for prog in programs:
        held = found.get(id(prog.ops))
        if held is None:
            held = found[id(prog.ops)] = (prog.ops, f(prog.ops))
        out.append((prog, held[1]))
    return out


@dataclass(frozen=True, slots=True)
class Schedule:
    programs: tuple[EngineProgram, ...]

    def programs_of(self, site: Site) -> tuple[EngineProgram, ...]:
        """One site's programs (a scan: over many sites, take `by_site` once)."""
        return tuple(p for p in self.programs if p.site == site)

    def by_site(self) -> dict[Site, tuple[EngineProgram, ...]]:
        """Every site's programs, in schedule order."""
        out: dict[Site, list[EngineProgram]] = {}
        for p in self.programs:
            out.setdefault(p.site, []).append(p)
        return {s: tuple(ps) for s, ps in out.items()}


@dataclass(frozen=True, slots=True)
class SpatialProgram:
    """A whole program. Passes return new values through `evolve`, which clears `verified`: only verify sets it."""

    name: str
    target: str
    tile: Tile
    precision: Precision
    tensors: tuple[Tensor, ...]
    stages: tuple[Stage, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    semaphores: tuple[Semaphore, ...] = ()
    plans: tuple[Plan, ...] = ()
    placement: Placement | None = None
    schedule: Schedule | None = None
    verified: bool = False

    def evolve(self, **changes: object) -> SpatialProgram:
        """A copy with `changes`; unverified unless `verified` is among them."""
        changes.setdefault("verified", False)
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def tensor(self, tid: TensorId) -> Tensor:
        for t in self.tensors:
            if t.id == tid:
                return t
        raise KeyError(f"no tensor {int(tid)}")

    def tensor_named(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r}")

    def buffer(self, bid: BufferId) -> Buffer:
        for b in self.buffers:
            if b.id == bid:
                return b
        raise KeyError(f"no buffer {int(bid)}")

    def stage(self, sid: StageId) -> Stage:
        for s in self.stages:
            if s.id == sid:
                return s
        raise KeyError(f"no stage {int(sid)}")

    def output_tensor(self) -> Tensor | None:
        return next((t for t in self.tensors if t.role == TensorRole.OUTPUT), None)

    @property
    def plan(self) -> Plan | None:
        """The program's plan when it has exactly one."""
        return self.plans[0] if len(self.plans) == 1 else None

"""What a backend hands back: CUDA source texts, the launch contract, the resource budget and the census."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from string import ascii_lowercase

from ..ir.worklist import launch_sites, split_items, work_table


@dataclass(frozen=True, slots=True)
class Budget:
    """Resources of a kernel, all found before any text is printed.

    `form` says which lowering printed it. The general form keeps every ring and its full / empty barriers in the
    dynamic block (`barrier_bytes` of them) and runs each engine on warps of its own (`engines`: name → warps).

    A block's shared memory is `total_bytes`; `ring_bytes` is the rings' part of it alone. In the general and the
    sm_90a form every byte is dynamic and `ring_bytes + barrier_bytes + staging_bytes + padding_bytes == dyn_bytes
    == total_bytes`."""

    ring_bytes: int  # bytes of the rings alone (not the block's shared memory: that is `total_bytes`)
    dynamic_opt_in: bool  # static + dynamic exceeds 48 KiB: cudaFuncSetAttribute is needed before the launch
    rings_dynamic: bool  # the rings left static memory (over 48 KiB) for the dynamic block
    dyn_bytes: int  # the dynamic block: the rings when they moved there (the general form: rings and barriers)
    static_bytes: int  # static __shared__ (the rings when they stayed static); what `ptxas -v` reports as smem
    regs_est: int
    blocks_per_sm: int
    threads: int
    rings: tuple[tuple[str, int], ...] = ()  # (name, bytes) of each ring the kernel keeps in shared memory
    fused: tuple[str, ...] = ()  # the program's rings the fused epilogue replaced: its pages stay in registers
    form: str = "persistent"  # persistent or general
    engines: tuple[tuple[str, int], ...] = ()  # (engine, warps) of the general form, in warp order
    barrier_bytes: int = 0  # the general form's mbarriers: a full and an empty one per ring slot
    staging_bytes: int = 0  # the sm_90a form's output staging: each consumer warp's boxes for its TMA stores
    padding_bytes: int = 0  # the sm_90a form's gaps that start each stage (and the staging) on 1024 bytes
    # Registers a thread the kernel's setmaxnreg split takes it holds at entry — its launch bounds' cap, which ptxas
    # must have given it (`nvcc.check_entry_registers`); 0: the kernel moves no registers.
    regs_entry: int = 0
    regs_ptxas: int | None = None  # registers a thread as ptxas counts them, where nvcc compiled the kernel
    spills_ptxas: int | None = None  # spill stores + loads in bytes, likewise
    # ptxas's stack frame in bytes, likewise: local memory a thread uses without spilling (the persistent kernel's
    # fused epilogue takes each fragment through the chain from a private copy of 8 words: 32 bytes)
    stack_ptxas: int | None = None
    layouts: tuple[tuple[str, str], ...] = ()  # (name, page layout) of each ring: row, col (K-major) or swizzled
    workspace_bytes: int = 0  # global memory the kernel keeps for itself: split-K's partial sums
    global_read_bytes: int = 0  # bytes its ReadTiles read from global memory in one launch (`ir.traffic`)

    @property
    def smem_bytes(self) -> int:
        """The rings' bytes under their former name (budget.json says `ring_bytes` only): not the block's shared
        memory, which is `total_bytes`."""
        return self.ring_bytes

    @property
    def total_bytes(self) -> int:
        """Shared memory of one block, static and dynamic: what the planner's `footprint.smem_bytes` counts."""
        return self.static_bytes + self.dyn_bytes

    def to_dict(self) -> dict[str, object]:
        """budget.json: every field, and the total shared memory of a block."""
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["rings"] = {name: size for name, size in self.rings}
        out["fused"] = list(self.fused)
        out["engines"] = {name: warps for name, warps in self.engines}
        out["layouts"] = {name: layout for name, layout in self.layouts}
        out["launch_bounds"] = [self.threads, self.blocks_per_sm]
        out["total_bytes"] = self.total_bytes
        return out


@dataclass(frozen=True, slots=True)
class TensorMap:
    """A TMA tensor map the sm_90a kernel takes by value (`const __grid_constant__ CUtensorMap spatialc_tmap_<index>`,
    after the work list, in index order) over the buffer of the tensor whose parameter is `Launch.params[tensor]`,
    stored as a matrix (`KernelParam.order` "rows", or "cols" where `transposed`): 2-D, its columns innermost, in
    boxes of `box` = (rows, columns) of the stored matrix, swizzled `swizzle` bytes wide (0: not; an operand page's
    panels, 32 to 128). docs/kernel-abi.md, "The sm_90a form"."""

    index: int
    tensor: int
    box: tuple[int, int]
    swizzle: int = 0
    transposed: bool = False

    def geometry(self, tiles: tuple[int, int], elem: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(dims, byte stride of the rows, box) of the map over a tensor of `tiles` (rows, columns of tiles) whose
        elements are `elem` bytes: what cuTensorMapEncodeTiled is given, by the host programs and the launcher."""
        rows_t, cols_t = tiles
        rows, cols = (cols_t * 16, rows_t * 16) if self.transposed else (rows_t * 16, cols_t * 16)
        return (cols, rows), (cols * elem,), (self.box[1], self.box[0])


def operand_files(roles: Sequence[str]) -> tuple[str | None, ...]:
    """The file `program_cu` reads each tensor from, given the tensors' roles in the order of `Launch.params`:
    a.txt, b.txt, … z.txt for the inputs in order (in27.txt, … past the 26th), p<k>.txt for the parameter at position
    k, None for an output or a workspace (the kernel makes them). Made from positions only: a tensor's name never
    becomes a path, and no two tensors share a file whatever they are called."""
    files: list[str | None] = []
    inputs = 0
    for k, role in enumerate(roles):
        if role == "input":
            inputs += 1
            files.append(f"{ascii_lowercase[inputs - 1]}.txt" if inputs <= 26 else f"in{inputs}.txt")
        else:
            files.append(f"p{k}.txt" if role == "parameter" else None)
    return tuple(files)


MATRIX_ORDERS = ("rows", "cols")  # KernelParam.order of a tensor stored as a padded matrix (transposed), not tiled


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One kernel argument: a device pointer to a tiled tensor (`tiles` = padded (rows_t, cols_t)).

    The buffer holds `tiles[0] * tiles[1]` tiles of `Launch.tile` elements each, laid out as `spatialc.tilize(x,
    grid=tiles, order=order)` lays them (`order` "col": each tile column-major, the K-major B of an int8 kernel;
    "rows": not tiled but the padded matrix row-major, "cols": its transpose row-major — the operands the sm_90a
    form's copy engine loads, and C where it stores C by TMA); the output comes back with `spatialc.untilize(buf,
    elems, grid=tiles, order=order)`. The grid may be larger than `elems` needs (the plan's items cover it), so pass
    it rather than let it default."""

    name: str  # the tensor's name in the program ("A", "B", "C", "bias")
    c_type: str  # the pointee's C type
    role: str  # input / output / parameter
    elems: tuple[int, int]  # logical (rows, cols)
    tiles: tuple[int, int]  # padded tile grid (rows_t, cols_t): the `grid` of spatialc.tilize / spatialc.untilize
    order: str = "row"  # "row" / "col": inside each tile; "rows" / "cols": a padded matrix (transposed): see above
    groups: int = 1  # a grouped tensor: `groups` matrices of `elems`, each tilized on tiles[0] / groups rows, stacked
    heads: bool = False  # an attention's Q, K or V: its array may also come as (batch, heads, *elems)


@dataclass(frozen=True, slots=True)
class Launch:
    """How to launch `kernel_cu`'s kernel from a host language (docs/kernel-abi.md, "Launching kernel.cu yourself").

    `kernel_name` is the kernel's symbol (it is declared extern "C"); launch a 1-D grid of blocks of `block` threads
    with `dyn_smem` bytes of dynamic shared memory, the arguments one device pointer per `params` entry in that order
    and last the work list (`work_list` builds it). The grid is one block per site: `sites(sms)` for a device of
    `sms` multiprocessors — `grid` is what the plan expected on its target's."""

    kernel_name: str
    grid: int
    block: int
    dyn_smem: int
    params: tuple[KernelParam, ...]
    tile: tuple[int, int] = (16, 16)
    smem_opt_in: bool = False  # set cudaFuncAttributeMaxDynamicSharedMemorySize to dyn_smem before launching
    items: int = 0  # the plan's items, 0..items-1
    placement: str = "contiguous"  # the rule that gives each site its items (ir/worklist.py)
    per_sm: int = 0  # sites per multiprocessor when the grid follows the device; 0: always `grid` sites
    work: tuple[int, ...] = ()  # a placement no rule makes: its work list as it stands (then `grid` is fixed)
    # Sites that hand over to each other (group barriers, semaphores): the kernel takes one more argument after the
    # work list, an int array the host sets to `sync` before every launch (arrival counts at 0, semaphores at their
    # initial values), and every site must be resident at once — a cooperative launch of exactly `grid` blocks,
    # refused where the device cannot hold them all.
    sync: tuple[int, ...] = ()
    cooperative: bool = False
    # A loop count read from data: words `trip_error` and `trip_error + 1` of the sync array hold, after the launch,
    # a flag and the offending count when one was outside its bound (the loop then ran no times); -1: no such loop.
    trip_error: int = -1
    # A grouped placement's item grid (the plan's rows and columns of items) and rows per band.
    item_grid: tuple[int, int] = (0, 0)
    band: int = 0
    # A grouped GEMM: each tensor of row counts (by name) and the most rows a count may give; the host refuses a
    # count outside 0 … that before launching.
    row_counts: tuple[tuple[str, int], ...] = ()
    # Multicast groups (sm_90): the kernel is compiled with __cluster_dims__(cluster, 1, 1), so every `cluster`
    # consecutive sites run as one thread-block cluster, co-scheduled, sharing shared memory; `grid` is a multiple of
    # it. Sites wait only on sites of their own cluster, so no cooperative launch is needed. 1: no clusters.
    cluster: int = 1
    # The sm_90a form: tensor maps the host encodes (cuTensorMapEncodeTiled) and passes after the work list.
    tensor_maps: tuple[TensorMap, ...] = ()

    @property
    def sync_words(self) -> int:
        """Ints of the kernel's `spatialc_sync` argument (0: it takes none)."""
        return len(self.sync)

    def sites(self, sms: int | None = None) -> int:
        """The blocks to launch on a device of `sms` multiprocessors (None, or a fixed placement: `grid`)."""
        if sms is None or not self.per_sm or self.work or self.cooperative or self.cluster > 1:
            return self.grid
        return launch_sites(self.items, sms, self.per_sm)

    def work_list(self, sms: int | None = None) -> list[int]:
        """The kernel's last argument for that launch: each site's offset into the item list, its count, the items."""
        if self.work:
            return list(self.work)
        return work_table(split_items(self.items, self.sites(sms), self.placement, self.item_grid, self.band))

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Census:
    """Count of each choreography op kind in the program, and the same counts recovered from the printed kernel.

    `rotated` counts the producer ops a software-pipelined loop prints a second time, before itself, for its first
    step (see `spatialc.lower.census`). `stages` counts the Compute ops by compute op (the matmul and each epilogue
    stage), and `printed_stages` the same from the kernel.
    """

    program: dict[str, int]
    printed: dict[str, int]
    rotated: dict[str, int] = field(default_factory=dict)
    stages: dict[str, int] = field(default_factory=dict)
    printed_stages: dict[str, int] = field(default_factory=dict)

    @property
    def agrees(self) -> bool:
        """Whether every op of the program, and every stage, has exactly one image in the kernel."""
        return self.program == self.printed and self.stages == self.printed_stages

    def to_dict(self) -> dict[str, object]:
        return {
            "program": self.program,
            "printed": self.printed,
            "rotated": self.rotated,
            "stages": self.stages,
            "printed_stages": self.printed_stages,
            "agrees": self.agrees,
        }


@dataclass(frozen=True, slots=True)
class CudaArtifact:
    target: str
    program_cu: str  # whole program: reads a.txt, b.txt, … (`operand_files`), prints C row-major, a value a line
    bench_cu: str  # whole program: deterministic inputs, prints "GOPS <value>"
    kernel_cu: str  # the kernel alone, no host main, for launching from Python
    launch: Launch
    budget: Budget
    census: Census
    general: CudaArtifact | None = None
    notes: tuple[str, ...] = field(default=())

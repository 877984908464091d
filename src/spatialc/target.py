"""Machines a program is laid out for. One definition of occupancy, asked by both the planner and the lowering.

Figures: NVIDIA CUDA C++ Programming Guide, "Compute Capabilities" → "Technical Specifications per Compute
Capability" (max resident blocks and threads per SM, 64K 32-bit registers per SM, shared memory per SM and the
per-block opt-in maximum, 48 KiB static limit, 1 KiB of shared memory reserved by the system per block), and the
SM counts of the named boards from NVIDIA's A100, GA102 (RTX 3090), AD102 (RTX 4090) and H100/H200 datasheets.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .errors import SpatialError

WARP = 32


class UnknownTarget(SpatialError, ValueError):
    """A target name spatialc does not know."""


@dataclass(frozen=True, slots=True)
class SpatialTarget:
    name: str
    board: str
    units: int  # SMs
    smem_per_unit: int  # bytes of shared memory per SM
    smem_per_site_max: int  # the per-block opt-in maximum
    smem_static_max: int  # ptxas' cap on static __shared__
    smem_reserved_per_site: int  # the system's share of each block's shared memory
    regs_per_unit: int
    regs_per_thread_max: int
    sites_per_unit_max: int  # resident blocks per SM
    threads_per_unit_max: int
    accumulator_lanes: int  # warps per block, each holding a rectangle of the accumulator block
    accumulator_in_registers: bool = True
    # Hopper's architecture-specific instructions (sm_90a: TMA, wgmma, setmaxnreg): the planner and `lower` then
    # default to the sm_90a form (lower/cuda/sm90a/kernel.py), and nvcc must be given compute_90a.
    hopper: bool = False
    # The tensor cores' 8-bit float MMA (mma.sync m16n8k32 .e4m3 / .e5m2): sm_89 (Ada) and later; ptxas refuses it
    # for sm_80 and sm_86, so spatialc.lower refuses 8-bit float programs for them.
    fp8_mma: bool = False

    @property
    def threads_per_site(self) -> int:
        return self.accumulator_lanes * WARP

    def accumulator_lane_grid(self, osh: int, osw: int) -> tuple[int, int] | None:
        """The `wm × wn` warp grid (wm·wn = lanes, wm | osh, wn | osw) whose per-warp rectangle is squarest.

        `rm + rn` fragments are loaded per K step and `rm · rn` products made from them, so for a fixed area the
        squarest rectangle loads least. None when no grid divides the block.
        """
        return _lane_grid(self.accumulator_lanes, osh, osw)

    def registers_per_thread(self, acc_tiles: int) -> int:
        """Estimate: 12 registers per thread per 16×16 accumulator fragment a warp holds, plus 52.

        A fragment's accumulators are 8 registers a thread; the operand fragments that the unrolled K step keeps
        live, the addresses and the epilogue add the rest. Calibrated with `ptxas -v` on kernels printed without
        a minimum of blocks per SM (nvcc 13, sm_80/86/90, int8/fp16/bf16, 1 to 16 fragments a warp, ibw 1 and 2,
        with and without the fused epilogue): the most any used was 61 for 1 fragment, 70 for 2, 99 for 4, 128
        for 8 and 235 for 16, all within this estimate. It matters twice: it decides the blocks per SM, and so
        the register cap `__launch_bounds__` gives ptxas, which must leave the kernel room not to spill.
        """
        return min(self.regs_per_thread_max, self.registers_needed(acc_tiles))

    def registers_needed(self, acc_tiles: int) -> int:
        """The estimate before the per-thread cap: above the cap the accumulators cannot stay in registers."""
        per_warp = max(1, math.ceil(acc_tiles / self.accumulator_lanes))
        return per_warp * 12 + 52

    def clusters_at_once(self, size: int, per_unit: int = 1) -> int | None:
        """Thread-block clusters of `size` blocks this board holds at once with `per_unit` blocks an SM (None: no
        figure, or no clusters). A cluster lives in one GPC, and GPCs hold uneven numbers of SMs, so this is less
        than SMs / size: a plan of more clusters runs the rest in a second wave. A size between two known ones is
        held as often as the larger (a subset of its blocks); `per_unit` blocks an SM hold as many layers of them."""
        known = CO_RESIDENT_CLUSTERS.get(self.board)
        if known is None or size < 2:
            return None
        fits = [n for s, n in sorted(known.items()) if s >= size]
        return fits[0] * max(1, per_unit) if fits else None

    def resident_sites_per_unit(
        self,
        smem_bytes: int,
        osh: int,
        osw: int,
        sub_blocks: tuple[int, int] = (1, 1),
        warps: int | None = None,
        registers: int | None = None,
    ) -> int:
        """Blocks of this shape resident on one SM at once (0: one does not fit — too much shared memory, or more
        accumulator fragments a warp than registers can hold, which would spill every K step). A block has `warps`
        warps (the accumulator lanes when None), each counted at the accumulator warps' registers — or at
        `registers` a thread, where the caller estimates them itself (a row program's kernel)."""
        acc_tiles = osh * osw * sub_blocks[0] * sub_blocks[1]
        need = self.registers_needed(acc_tiles) if registers is None else registers
        if smem_bytes > self.smem_per_site_max or need > self.regs_per_thread_max:
            return 0
        warps = self.accumulator_lanes if warps is None else warps
        threads = warps * WARP
        by_threads = self.threads_per_unit_max // threads
        by_smem = self.smem_per_unit // (smem_bytes + self.smem_reserved_per_site)
        regs = self.registers_per_thread(acc_tiles) if registers is None else registers
        regs_per_warp = math.ceil(regs * WARP / 256) * 256  # registers are allocated per warp in 256s
        by_regs = self.regs_per_unit // (regs_per_warp * warps)
        return max(0, min(self.sites_per_unit_max, by_threads, by_smem, by_regs))


# Clusters of each size the board holds at once with one block an SM, as cudaOccupancyMaxActiveClusters answers.
# A cluster lives in one GPC, and a GH100's GPCs hold uneven numbers of SMs (which of them are fused off differs from
# chip to chip), so this is less than SMs / size. Read on an H100 SXM (132 SMs) on 2026-12-06 by the GPU check and
# bench/cluster_occupancy.cu: 30 of 4, where 32 had been expected from the datasheet. Clusters of 2 fill whole TPCs,
# so all 66 fit. A chip that holds fewer still is caught by the launcher, which asks the driver before each launch.
# Boards without clusters (before sm_90) have no entry.
CO_RESIDENT_CLUSTERS: dict[str, dict[int, int]] = {"H100/H200": {2: 66, 4: 30, 8: 16}}

_KIB = 1024
TARGETS: dict[str, SpatialTarget] = {
    "sm_80": SpatialTarget("sm_80", "A100", 108, 164 * _KIB, 163 * _KIB, 48 * _KIB, _KIB, 65536, 255, 32, 2048, 8),
    "sm_86": SpatialTarget("sm_86", "RTX 3090", 82, 100 * _KIB, 99 * _KIB, 48 * _KIB, _KIB, 65536, 255, 16, 1536, 4),
    "sm_89": SpatialTarget(
        "sm_89", "RTX 4090", 128, 100 * _KIB, 99 * _KIB, 48 * _KIB, _KIB, 65536, 255, 24, 1536, 4, fp8_mma=True
    ),
    "sm_90": SpatialTarget(
        "sm_90", "H100/H200", 132, 228 * _KIB, 227 * _KIB, 48 * _KIB, _KIB, 65536, 255, 32, 2048, 8, fp8_mma=True
    ),
    "sm_90a": SpatialTarget(
        "sm_90a",
        "H100/H200",
        132,
        228 * _KIB,
        227 * _KIB,
        48 * _KIB,
        _KIB,
        65536,
        255,
        32,
        2048,
        8,
        hopper=True,
        fp8_mma=True,
    ),
}


def target(name: str | SpatialTarget) -> SpatialTarget:
    """The target called `name` (sm_80, sm_86, sm_89, sm_90, sm_90a)."""
    if isinstance(name, SpatialTarget):
        return name
    if not isinstance(name, str):
        raise UnknownTarget(f"a target is a name such as 'sm_90', not {name!r}; spatialc knows {', '.join(TARGETS)}")
    try:
        return TARGETS[name]
    except KeyError:
        raise UnknownTarget(f"unknown target {name!r}; spatialc knows {', '.join(TARGETS)}") from None


@functools.lru_cache(maxsize=4096)
def _lane_grid(lanes: int, osh: int, osw: int) -> tuple[int, int] | None:
    """`SpatialTarget.accumulator_lane_grid` of `lanes` warps, worked out once (the planner asks it of every plan)."""
    best: tuple[tuple[int, int], tuple[int, int]] | None = None
    for wm in range(1, lanes + 1):
        if lanes % wm:
            continue
        wn = lanes // wm
        if osh % wm or osw % wn:
            continue
        rm, rn = osh // wm, osw // wn
        key = (rm + rn, abs(rm - rn))
        if best is None or key < best[0]:
            best = (key, (wm, wn))
    return None if best is None else best[1]

"""The sm_90a kernel's text (`kernel_cu`): its preamble, the `__global__` function with a branch per engine, and its
budget. The engines' ops are printed by `printer.py` (attention's by `attention.py`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ....ir.names import plain
from ....ir.ops import AcquireAcc, ChoreoOp, McastSend, ReadTiles, walk
from ....numerics.blockscale import program_scales
from ....target import WARP, SpatialTarget
from ...artifact import Budget
from ..common.cwriter import PAIRED_GLOBAL_MACROS, Writer, inlined_lines, site_prologue
from ..common.dequant import has_dequant
from ..common.rings import TILE_ELEMS
from ..general import kernel as general
from ..general import printer as general_printer
from . import dequant as w4
from . import staging
from .attention import AttentionPrinter, declare
from .overlap import PINGPONG
from .plan import CONSUMER_REGS, PRODUCER_REGS, STORE_BUFFERS, SWIZZLED, WARPGROUP, Warpgroups, staging_bytes
from .printer import HopperPrinter
from .wgmma import wgmma_specialisations

if TYPE_CHECKING:
    from .kernel import HopperKernel

KERNEL_NAME = "spatialc_hopper"


def _consumers(wg: Warpgroups) -> str:
    """The compute engine as the kernel's first line names it."""
    if wg.consumers == 1:
        return f"one wgmma consumer warpgroup, {wg.blocks} block{'s' if wg.paired else ''} an SM"
    return "two wgmma consumer warpgroups"


def preamble(hk: HopperKernel) -> list[str]:
    k = hk.base
    types = (k.types.operand, k.integer)
    lines = general_printer.preamble(k)
    head, rest = lines[0], lines[1:]
    head = (
        f"// {plain(k.program.name)}: the sm_90a CUDA form printed by spatialc from the spatial IR; each block is one"
        f" site, its reader a TMA producer, its compute engine {_consumers(hk.wg)}."
    )
    at = rest.index("#include <cstring>") + 1
    rest = [*rest[:at], "#include <cuda.h>", "#include <cudaTypedefs.h>", *rest[at:]]
    at = rest.index("typedef " + f"{k.types.operand} OPT;")
    wgmmas = [line for n, kind in hk.wgmmas or ((hk.n, "ss"),) for line in wgmma_specialisations(n, *types, kind)]
    w4a16 = ["sm90a/dequant90.cuh"] if has_dequant(k.program) else []  # its bulk copies and panel stores
    extra = [*inlined_lines("sm90a/sm90a.cuh", *w4a16), *wgmmas, ""]
    if k.rings.direct:  # the consumers' paired stores and adds of split-K's partial sums (partials.py)
        extra += [*PAIRED_GLOBAL_MACROS.split("\n"), ""]
    if hk.schedule == PINGPONG:  # the two consumer warpgroups' turns: bar.arrive beside bar.sync
        extra += [*inlined_lines("sm90a/pingpong.cuh"), ""]
    rest = [*rest[:at], *extra, *rest[at:]]
    if hk.chunk:  # tiles of the output box each consumer warp stages for the TMA store
        at = next(i for i, line in enumerate(rest) if line.startswith("#define SMEM_OFF_"))
        rest = [*rest[:at], f"#define OUT_CHUNK {hk.chunk}", *staging.defines(hk), *rest[at:]]
    # (each multicast ring's ready barriers count its receivers: READY_COUNT_r, the general preamble's)
    return [head, *(line.replace(f"#define NTHREAD {k.threads}", f"#define NTHREAD {hk.threads}") for line in rest)]


def kernel_text(hk: HopperKernel) -> str:
    k = hk.base
    w = Writer()
    for line in preamble(hk):
        w.line(line)
    params = ", ".join(
        general_printer.kernel_params(k)
        + [f"const __grid_constant__ CUtensorMap spatialc_tmap_{m.index}" for m in hk.maps]
    )
    general_printer.class_table(k, w)
    mc = hk.multicast
    # Multicast groups are clusters of `cluster` consecutive sites: a page lands in each of its group's blocks.
    dims = f" __cluster_dims__({k.cluster}, 1, 1)" if mc is not None else ""
    w.line(f'extern "C" __global__ __launch_bounds__(NTHREAD, {hk.wg.blocks}){dims} void {KERNEL_NAME}({params})')
    with w.block():
        site_prologue(w, k.cluster if mc is not None else 1)
        w.line("extern __shared__ __align__(1024) char spatialc_dyn_smem[];")
        w.line("spatialc_check_stage_base(spatialc_dyn_smem);")
        general_printer.declare_rings(k, w)
        if hk.scales is not None:
            sa = hk.scales
            w.line(
                f"SPATIALC_DYNAMIC_RING(float, sa_stage, spatialc_dyn_smem, SMEM_OFF_SA_STAGE, DEPTH_{sa.ring}, "
                f"{sa.rows});  // A's scales of each stage's K group, with A's page"
            )
        if hk.chunk and hk.epilogue == SWIZZLED:
            staging.declare(hk, w)
        elif hk.chunk:
            boxes = hk.wg.staging_boxes
            w.line(
                f"SPATIALC_DYNAMIC_RING(OUT_T, out_stage, spatialc_dyn_smem, SMEM_OFF_OUT_STAGE, {boxes}, "
                f"OUT_CHUNK * {TILE_ELEMS});  // each consumer warp's {STORE_BUFFERS} output boxes"
            )
        for r in mc.rings if mc is not None else ():
            w.line(
                f"SPATIALC_DYNAMIC_RING(unsigned long long, ready_{r}, spatialc_dyn_smem, SMEM_OFF_READY_{r}, "
                f"DEPTH_{r}, 1);"
            )
        with w.block("if (tid == 0)"):
            general_printer.init_barriers(k, w)
            for r in mc.rings if mc is not None else ():
                with w.block(f"for (unsigned s = 0; s < DEPTH_{r}; ++s)", "// a stage free in every receiver"):
                    w.line(f"spatialc_mbar_init(&ready_{r}[s], READY_COUNT_{r});")
            w.line("spatialc_fence_barrier_init();  // the initialised barriers, before any other thread's use")
            w.line("spatialc_fence_proxy_async();  // and before the copy engine's transaction counts on them")
        w.line("__syncthreads();")
        if mc is not None:
            w.line("spatialc_cluster_sync();  // and before a peer block arrives on them or multicasts into this one")
        consumers = hk.wg.consumers * WARPGROUP
        with w.block(f"if (warp >= {consumers})", "// the producer warpgroup"):
            if hk.wg.moves_registers:  # a block of one consumer warpgroup keeps what the launch gave it
                w.line(f"spatialc_regs_dec<{PRODUCER_REGS}>();")
            for i, role in enumerate(k.roles[1:]):
                with w.block(f"{'if' if i == 0 else 'else if'} (warp == {role.first_warp})", f"// {role.engine.value}"):
                    _engine(hk, role, w)
        who = "the consumer warpgroup (two blocks an SM)" if hk.wg.paired else "the consumer warpgroups"
        with w.block("else", f"// {k.roles[0].engine.value}: {who}"):
            if hk.wg.moves_registers:
                w.line(f"spatialc_regs_inc<{CONSUMER_REGS}>();")
            _engine(hk, k.roles[0], w)
        if mc is not None:
            # Every page a peer sends this block was waited for, and every arrival it made on a peer's barrier was
            # waited for there; CUDA still asks that no block of a cluster exits while a peer may use its shared
            # memory, which this barrier makes true whatever the schedule.
            w.line("spatialc_cluster_sync();  // no block leaves while its peers may still reach its shared memory")
    if mc is not None:
        w.line(f"SPATIALC_CLUSTER_KERNEL({KERNEL_NAME}, {k.cluster})")
    return w.text()


def _engine(hk: HopperKernel, role: general.Role, w: Writer) -> None:
    """One engine's branch. The reader runs on one thread: the copy engine moves its pages."""
    k = hk.base
    w.line(f"const int etid = tid - {role.first_warp * WARP};")
    w.line("(void)etid;")
    kind = AttentionPrinter if hk.attention else w4.W4HopperPrinter if has_dequant(k.program) else HopperPrinter
    printer = kind(hk, role, w)
    printer.tensors = {int(t.id): t for t in k.program.tensors}
    printer.counters()
    if isinstance(printer, AttentionPrinter):
        declare(printer, w)
    stores = hk.chunk and role is k.roles[0]  # the consumers' fused store, through the staging boxes
    if stores and hk.odd_turns:
        w.line("unsigned boxes_out = 0;  // output boxes this warp has staged (its boxes are used in turn)")
    if any(isinstance(op, AcquireAcc) for op in role.walk()) and not hk.attention:
        w.line(f"spatialc_acc<ACCT> accf[{hk.n // 16}];")
        if program_scales(k.program) is not None:  # a K group's products, before their promotion into accf
            w.line(f"spatialc_acc<ACCT> part[{hk.n // 16}];")
    single = any(isinstance(op, ReadTiles) for op in role.walk())
    if single:
        printer.nthreads = "1"

    def body(ops: tuple[ChoreoOp, ...], index: int | None) -> None:
        printer.sends = frozenset(k.rings.template[op.buf] for op in walk(ops) if isinstance(op, McastSend))
        printer.partials = hk.partials[index] if hk.partials and index is not None else None
        printer.partials_added = 0
        if single:
            with w.block("if (etid == 0)", "// the copy engine moves the pages; one thread issues"):
                for m in hk.maps:  # every map this block's copies use (the loads' and the store's)
                    w.line(f"spatialc_prefetch_tensormap(&spatialc_tmap_{m.index});")
                general_printer._program(printer, ops)
        else:
            general_printer._program(printer, ops)
        assert not printer.deferred, "a sender's load with no send"
        assert not printer.arrived, "an arrival made with a load's expect_tx and no Push after it"

    general_printer.by_class(k, role, w, body, indexed=True)
    if stores and hk.epilogue == SWIZZLED:
        staging.last_wait(w)
    elif stores:
        # The shared memory a store reads must outlive its reading: the warp's last stores, before it ends.
        last = "if ((threadIdx.x & 31) == 0) { spatialc_bulk_wait_read<0>(); }"
        w.line(f"{last}  // the last boxes' stores have read them")


def budget_of(hk: HopperKernel, target: SpatialTarget) -> Budget:
    k = hk.base
    bud = general.budget_of(k, target)
    rings = sum(r.bytes for r in k.rings.rings.values())
    staging = staging_bytes(hk.chunk, k.out_type, hk.wg)
    return dataclasses.replace(
        bud,
        staging_bytes=staging,
        ring_bytes=rings,
        padding_bytes=k.dyn_bytes - rings - k.barrier_bytes - staging,
        dynamic_opt_in=k.dyn_bytes > target.smem_static_max,
        regs_est=hk.wg.consumer_regs(target),
        regs_entry=hk.wg.at_launch(target) if hk.wg.moves_registers else 0,
        blocks_per_sm=hk.wg.blocks,
        threads=hk.threads,
        form="sm90a",
    )

"""The sm_90a form's paired blocks (lower/cuda/sm90a/plan.py, `Warpgroups`): items of 64 rows, one consumer
warpgroup a block, two blocks an SM and no setmaxnreg — against the interpreter under emulation, in the planner's
choices and refusals, and in nvcc's registers; and the launcher's refusal of a kernel whose setmaxnreg split ptxas
did not give the registers it assumes (it would hang on the GPU)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import spatialc
import spatialc.runtime.launch as L
from spatialc.errors import PlanError
from spatialc.lower.cuda.sm90a import plan as sm90a_plan
from spatialc.lower.errors import Unsupported
from spatialc.runtime import nvcc as N
from spatialc.runtime.nvcc import KernelBuildError, PtxasInfo

from ..stand_in import MapStandIn, product
from .test_sm90a import NVCC, compiled_clean, exact_both_ways, inputs, outcome, replaced

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

TWO_A_BLOCK = "__launch_bounds__(NTHREAD, 1)"


def paired(prec: str, m: int, n: int, k: int, **kw):
    p = spatialc.build(spatialc.gemm(m, n, k, prec), "sm_90a", **kw)
    return p, spatialc.lower(p)


# ---- the plan and the kernel's shape ---------------------------------------------------------------------------


def test_items_of_64_rows_are_one_warpgroup_two_blocks_an_sm_without_setmaxnreg():
    p, art = paired("bf16", 200, 136, 100, block=(4, 8, 4))
    wg = sm90a_plan.warpgroups(p.plans[0])
    assert (wg.consumers, wg.blocks, wg.paired) == (1, 2, True)
    bud = art.budget
    assert (bud.form, bud.threads, bud.blocks_per_sm, bud.regs_est, bud.regs_entry) == ("sm90a", 256, 2, 128, 0)
    text = art.kernel_cu.split("void spatialc_hopper(")[0].splitlines()[-1] + art.kernel_cu.split("spatialc_hopper(")[1]
    assert "__launch_bounds__(NTHREAD, 2)" in text and "#define NTHREAD 256" in art.kernel_cu
    assert "spatialc_regs_inc<" not in text and "spatialc_regs_dec<" not in text  # what the launch gives, kept
    assert "if (warp >= 4)" in text  # the producer warpgroup after the one consumer warpgroup
    # Both blocks' shared memory fits an SM: each within half of it, less the system's share.
    t = spatialc.target("sm_90a")
    assert 2 * (bud.total_bytes + t.smem_reserved_per_site) <= t.smem_per_unit
    # The two-warpgroup form keeps its split, and says what ptxas must give it at entry.
    _, two = paired("bf16", 200, 136, 100, block=(8, 8, 4))
    assert (two.budget.threads, two.budget.blocks_per_sm, two.budget.regs_entry) == (384, 1, 168)
    assert TWO_A_BLOCK in two.kernel_cu and "spatialc_regs_inc<232>();" in two.kernel_cu


def test_the_planner_takes_paired_blocks_only_when_forced():
    """Its own choice stays two consumer warpgroups (the first GPU run measured paired blocks slower); its cost prices
    them all the same (the sweep's prediction): dearer than 128 × 256 items where every SM has work."""

    def rows(n, **kw):
        return spatialc.build(spatialc.gemm(n, n, n, "bf16"), "sm_90a", **kw).plans[0].item_tiles[0] * 16

    assert rows(64) == rows(256) == rows(1024) == rows(4096) == 128
    assert rows(1024, block=(4, 8, 4)) == 64
    t, prec = spatialc.target("sm_90a"), spatialc.ir.ops.Precision.BF16
    big = spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16"), "sm_90a").plans[0]
    pair = dataclasses.replace(big, block=spatialc.ir.ops.BlockShape(4, 8, 4), grid=(64, 32), depth=3)
    # Priced as the first GPU run measured them: 0.70× of 128 × 256 items at bf16 4096³ with 4 stages (0.69×, here
    # with 3: 0.93 of that) and 0.56× at 8192³ — where 0.86× had been guessed.
    assert sm90a_plan.plan_cost(t, pair, prec) / sm90a_plan.plan_cost(t, big, prec) == pytest.approx(1 / 0.644, 1e-3)
    assert sm90a_plan.paired_rate(pair, prec) == pytest.approx(0.753, abs=1e-3)
    huge = dataclasses.replace(pair, grid=(128, 64), k_tiles=512)  # 8192³: A and B 256 MiB, five L2s
    assert sm90a_plan.paired_rate(huge, prec) == pytest.approx(0.610, abs=1e-3)


def test_what_a_paired_block_cannot_hold_is_refused_with_the_reason():
    plan = spatialc.build(spatialc.gemm(256, 256, 256, "bf16"), "sm_90a", block=(4, 8, 4)).plans[0]
    wide = dataclasses.replace(plan, block=spatialc.ir.ops.BlockShape(4, 16, 4))
    # A wgmma of 256 columns holds 128 accumulators a thread: ptxas cannot fit it in the 128 registers of a paired
    # block (nvcc: "Insufficient registers (128) to compile instruction"), and setmaxnreg cannot raise its cap.
    with pytest.raises(Unsupported, match=r"items of 64 rows and 256 columns: two blocks share an SM's registers"):
        sm90a_plan.check_plan(wide, spatialc.ir.ops.Precision.BF16)
    g = spatialc.gemm(512, 512, 512, "bf16")
    with pytest.raises(PlanError, match=r"takes no plan of items of 64 rows and 256 columns"):
        spatialc.build(g, "sm_90a", form="sm90a", block=(4, 16, 4))
    # Shared memory for two blocks: each within half an SM's, less the system's kilobyte.
    with pytest.raises(PlanError, match=r"run 2 blocks an SM, each within 115712 bytes of shared memory, and it needs"):
        spatialc.build(g, "sm_90a", form="sm90a", block=(4, 8, 4), depth=5)
    with pytest.raises(PlanError, match=r"takes no plan of items of 32 rows: a consumer warpgroup holds 64 rows"):
        spatialc.build(g, "sm_90a", form="sm90a", block=(2, 4, 2))


def test_a_plan_of_two_blocks_an_sm_places_twice_the_sites():
    p, art = paired("fp16", 4096, 1024, 256, block=(4, 8, 4))
    assert p.plans[0].items == 512 and art.budget.blocks_per_sm == 2
    assert len(p.placement.items_of_site) == 2 * spatialc.target("sm_90a").units  # every resident block a site


# ---- under emulation --------------------------------------------------------------------------------------------

CASES = [
    ("bf16", (200, 136, 100), {"block": (4, 8, 4)}),  # odd sizes, 128-column items, four 16-bit K tiles a step
    ("fp16", (130, 300, 70), {"block": (4, 4, 2), "depth": 2}),
    ("int8", (129, 250, 190), {"block": (4, 8, 2), "depth": 3}),  # int8 B K-major, k32 MMAs
    ("int8", (70, 40, 96), {"block": (4, 2, 2), "depth": 1}),  # one-page rings: no group kept in flight
    ("bf16", (1, 1, 1), {"block": (4, 1, 1)}),  # one element
]


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(("prec", "shape", "kw"), CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}" for c in CASES])
def test_an_emulated_paired_kernel_equals_the_interpreter(prec, shape, kw):
    p, art = paired(prec, *shape, **kw)
    assert art.budget.form == "sm90a" and art.budget.blocks_per_sm == 2
    exact_both_ways(p, art, inputs(prec, *shape))


@needs_gxx
@pytest.mark.emulation
def test_an_emulated_paired_kernel_with_an_epilogue_and_several_items_a_site():
    from spatialc.frontend import bias, relu

    g = spatialc.gemm(256, 96, 64, "bf16", epilogue=[bias(), relu()])
    p = spatialc.build(g, "sm_90a", sites=2, block=(4, 6, 4))
    art = spatialc.lower(p)
    assert art.budget.blocks_per_sm == 2 and max(len(i) for _, i in p.placement.items_of_site) == 2
    x = inputs("bf16", 256, 96, 64) | {"bias": np.arange(96, dtype=np.float32) - 40}
    assert np.array_equal(spatialc.emulate(art, x, timeout=120), spatialc.evaluate(p, x))


@needs_gxx
@pytest.mark.emulation
def test_emulated_paired_blocks_in_clusters_multicast_exactly():
    """Clusters of two paired blocks: the shared operand lands in both by one multicast load, as for 128-row items."""
    p = spatialc.build(spatialc.gemm(256, 256, 192, "bf16"), "sm_90a", multicast=(2, 1), block=(4, 4, 2), depth=2)
    art = spatialc.lower(p)
    assert (art.budget.blocks_per_sm, art.launch.cluster) == (2, 2) and "__cluster_dims__(2, 1, 1)" in art.kernel_cu
    x = inputs("bf16", 256, 256, 192)
    assert np.array_equal(spatialc.emulate(art, x, timeout=120), spatialc.evaluate(p, x))


@needs_gxx
@pytest.mark.emulation
def test_a_paired_kernel_given_setmaxnreg_for_two_warpgroups_is_caught():
    """The two-warpgroup form's split planted in a paired block. On the GPU its launch gives 128 a thread and the
    consumers' increase to 232 would wait forever; the emulation, which counts a block's registers at launch as one
    block an SM's (248 at 256 threads), refuses the increase below what the warps hold. Either way it never runs."""
    p, art = paired("bf16", 64, 32, 64, block=(4, 2, 4))
    case = (p, art, inputs("bf16", 64, 32, 64))
    assert outcome(case, art.program_cu) == "exact"
    producer = replaced(art.program_cu, "if (warp >= 4) {", "if (warp >= 4) { spatialc_regs_dec<40>();")
    consumer = "else {  // compute: the consumer warpgroup (two blocks an SM)"
    got = outcome(case, replaced(producer, consumer, consumer + "\n spatialc_regs_inc<232>();"))
    # The emulation takes the launch as the kernel says: a block alone on its SM, 256 threads of 248 registers.
    assert got.startswith("fault") and "setmaxnreg.inc to 232" in got and "holds 248" in got, got


# ---- nvcc, ptxas and the launcher -------------------------------------------------------------------------------


def test_a_kernel_whose_entry_registers_are_not_its_splits_is_refused():
    _, art = paired("bf16", 200, 136, 100, block=(8, 8, 4))
    info = PtxasInfo("spatialc_hopper", 168)
    N.check_entry_registers(art.budget, info)  # what the split assumes: accepted
    N.check_entry_registers(art.budget, None)  # unknown: nothing to check
    with pytest.raises(KernelBuildError, match=r"ptxas gave the kernel 154 registers .* assumes 168 at entry"):
        N.check_entry_registers(art.budget, dataclasses.replace(info, registers=154))
    _, pair = paired("bf16", 200, 136, 100, block=(4, 8, 4))
    N.check_entry_registers(pair.budget, dataclasses.replace(info, registers=98))  # no split: any count


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("prec", ["bf16", "fp16", "int8"])
def test_a_paired_kernel_compiles_clean_within_its_launchs_registers(prec, tmp_path):
    _, art = paired(prec, 4096, 4096, 4096, block=(4, 8, 8 if prec == "int8" else 4), sub_blocks=(1, 1))
    assert art.budget.blocks_per_sm == 2
    instrs = compiled_clean(art, tmp_path)
    ops = Counter(i.base for i in instrs)
    assert ops["IGMMA" if prec == "int8" else "HGMMA"] >= 1 and ops["UTMALDG"] >= 2 and ops["USETMAXREG"] == 0, ops
    info = N.kernel_ptxas(N.compile_cubin(art.kernel_cu, "sm_90a", cache=tmp_path), "spatialc_hopper")
    assert info is not None and info.registers <= 128  # two blocks of 256 threads fit the file


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_ptxas_gives_the_split_its_registers_and_a_kernel_it_did_not_is_not_launched(tmp_path):
    _, art = paired("bf16", 4096, 4096, 4096)
    info = N.kernel_ptxas(N.compile_cubin(art.kernel_cu, "sm_90a", cache=tmp_path), "spatialc_hopper")
    assert info is not None and info.registers == art.budget.regs_entry == 168  # the premise the split rests on
    # Launch bounds asking two blocks an SM of a narrow kernel (a wgmma of 32 columns): ptxas gives it at most 80 a
    # thread, and the consumers' increase to 232 would wait forever. The launcher refuses the cubin the device
    # loaded (here: compiled by nvcc, as CupyDevice does) before any launch.
    _, art = paired("bf16", 256, 64, 256, block=(8, 2, 4))
    planted = dataclasses.replace(art, kernel_cu=art.kernel_cu.replace(TWO_A_BLOCK, "__launch_bounds__(NTHREAD, 2)"))
    assert planted.kernel_cu != art.kernel_cu
    dev = MapStandIn(planted, product)
    dev.load = lambda *a: "kernel"  # type: ignore[method-assign]
    dev.cubin_of = lambda text: N.compile_cubin(text, "sm_90a", cache=tmp_path)  # type: ignore[attr-defined]
    with pytest.raises(KernelBuildError, match=r"setmaxnreg.inc would wait forever on the GPU; not launched"):
        L.prepare(planted, dev)
    assert dev.launches == []


def prepared_cubin(folder, registers: int):
    """A cubin as `--prepare` leaves it, with what ptxas said of it beside it (no nvcc needed: the launcher reads
    only that)."""
    cubin = folder / "prepared.cubin"
    cubin.write_bytes(b"")
    said = {"arch": "sm_90a", "functions": {"spatialc_hopper": PtxasInfo("spatialc_hopper", registers).to_dict()}}
    N.ptxas_path(cubin).write_text(json.dumps(said))
    return cubin


@pytest.mark.parametrize("registers", [168, 80])
def test_the_launcher_checks_the_cubin_the_device_loaded_and_compiles_nothing(tmp_path, monkeypatch, registers):
    """A GPU run from prepared cubins: the check reads the prepared cubin's ptxas numbers; no nvcc runs in the row."""
    _, art = paired("bf16", 256, 64, 256, block=(8, 2, 4))
    cubin = prepared_cubin(tmp_path, registers)
    monkeypatch.setattr(N, "compile_cubin", lambda *a, **k: pytest.fail("compiled again on the GPU machine"))
    dev = MapStandIn(art, product)
    dev.load = lambda *a: "kernel"  # type: ignore[method-assign]
    dev.cubin_of = lambda text: cubin  # type: ignore[attr-defined]
    if registers == art.budget.regs_entry:
        assert L.prepare(art, dev).kernel == "kernel"
    else:
        with pytest.raises(KernelBuildError, match=r"ptxas gave the kernel 80 registers .* assumes 168 at entry"):
            L.prepare(art, dev)


def test_a_prepared_device_names_the_cubin_it_loads():
    from spatialc.gpucheck.cuda import PreparedDevice
    from spatialc.gpucheck.prepare import source_hash

    class Base:
        xp = np

        def cubin_of(self, text):
            return Path("compiled-here.cubin")

    dev = PreparedDevice(Base(), cp=None)
    dev.cubins[source_hash("prepared text")] = Path("prepared.cubin")
    assert dev.cubin_of("prepared text") == Path("prepared.cubin")
    assert dev.cubin_of("another text") == Path("compiled-here.cubin")  # not prepared: what the base device built

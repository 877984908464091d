"""W4A16 GEMMs in the persistent form (issue 34, item 6): `build(..., form="persistent")` plans the plain GEMM for the
persistent kernel and `lower(..., form="persistent")` prints it, the packed bytes copied into a ring of their own and
each lane's B fragments dequantised in registers from one 32-bit shared load a tile by the general form's own printer
(`common/dequant.py`'s DequantPrinter and fusion, `dequant.cuh`), inside the software-pipelined K loop. The host
emulation runs it equal to the interpreter bit for bit on exact inputs — int4 with zero points, a square uint4 GEMM
with float32 scales and fp16 operands, mxfp4, a block no lane grid divides, the decode shapes' plans (M = 1, 64; 16's
is 1's) at a size the emulation runs; the nibbles of a byte read the other way round or the scales of the other group,
planted in the kernel text, are caught; `spatialc.run` lays out its arguments as for the general form; nvcc -Werror
compiles the decode shape's kernel (M = 16, N = K = 4096, int4 with zero points per 128) for sm_80, sm_86 and sm_90
without spills, and its main loop in SASS has no byte loads and no shared stores; a dequant the register path cannot
take is refused by one line, and so are a fused B page read by another op and an order whose packed page is popped
before the matmul that reads it (the occupancy proof)."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

import spatialc
from spatialc.cli import main
from spatialc.ir.ops import Compute, Dequant, MatmulTiles, Pop, Wait
from spatialc.lower.cuda.common.dequant import packed_rings
from spatialc.lower.cuda.common.rings import MMA_TYPES, ring_table
from spatialc.lower.cuda.common.sites import printed_site_programs
from spatialc.lower.cuda.persistent import kernel as persistent
from spatialc.lower.cuda.persistent.merge import SerialLoop, serial_walk, serialise
from spatialc.lower.cuda.persistent.order import prove
from spatialc.lower.errors import NeedsGeneral
from spatialc.runtime import launch as L
from spatialc.runtime.nvcc import compile_cubin, find_nvcc, kernel_ptxas
from spatialc.runtime.sass import disassemble, find_cuobjdump

from ..nvcc_clean import NVCC, assert_clean, nvcc_compile, nvcc_device
from ..stand_in import StandInDevice
from .test_w4_kernels import REGISTER_PATH, emulated, needs_gxx, plant
from .test_w4_run import w4_kernel
from .test_w4_sass import census
from .w4_inputs import w4_inputs, w4_program


def decode(m: int, cc: str = "sm_90"):
    """The persistent form's plan of the decode shape M × 4096 × 4096 (int4, zero points per 128) on `cc`."""
    gemm = spatialc.gemm(m, 4096, 4096, "bf16", weights="int4", group=128, zeros=True)
    return spatialc.build(gemm, cc, form="persistent")


def at_decode_plan(m: int, fmt: str = "int4", **kw):
    """(m, n, k, fmt, prec, options): the decode plan's block, sub-blocks and depth forced on one item of K = 256 (two
    groups of 128, four K steps of the decode plans' four tiles: the pipelined loop's prologue, steady state and
    tail)."""
    plan = decode(m).plan
    n = 16 * plan.block.osw * plan.sub_blocks[1]
    forced = {"block": dataclasses.astuple(plan.block), "sub_blocks": plan.sub_blocks, "depth": plan.depth}
    return (m, n, 256, fmt, "bf16", {**({} if fmt == "mxfp4" else {"group": 128}), **forced, **kw})


CASES = {
    "int4-zeros-bf16": (37, 40, 256, "int4", "bf16", {"group": 128, "zeros": True}),
    "mxfp4-decode-m1": at_decode_plan(1, "mxfp4"),
    "int4-zeros-decode-m64": at_decode_plan(64, zeros=True),
    # no lane grid divides the block (warps take tiles in turn), a group per tile of K (a page holds two)
    "uint4-strided-g16": (40, 48, 256, "uint4", "bf16", {"group": 16, "zeros": True, "block": (1, 3, 2)}),
    "uint4-f32-scales-fp16-square": (96, 96, 96, "uint4", "fp16", {"group": 32, "scale_type": "float32"}),
}


@pytest.fixture(scope="module")
def built():
    """Each case's program, planned for the persistent form, and its persistent artifact (each emulated kernel is
    compiled once: runs share it)."""
    out = {}
    for name, (m, n, k, fmt, prec, kw) in CASES.items():
        p = w4_program(m, n, k, fmt, prec, form="persistent", **kw)
        art = spatialc.lower(p, form="persistent")
        assert art.budget.form == "persistent" and REGISTER_PATH in art.program_cu
        assert "SPATIALC_PAGE_ST(" not in art.program_cu.split('extern "C"')[1]  # no operand page is written
        out[name] = (p, art)
    return out


def test_the_decode_shapes_and_a_square_one_print_on_each_target():
    """M = 1, 16, 64 and a square 4096³ on sm_80, sm_86 and sm_90, every format: the persistent form prints each
    (its plan's B operand ring never declared: no shared memory for it)."""
    for cc in ("sm_80", "sm_86", "sm_90"):
        for m in (1, 16, 64, 4096):
            art = spatialc.lower(decode(m, cc), form="persistent")
            assert art.budget.form == "persistent" and "spatialc_w4_load_b<0, true, OPT>(" in art.program_cu
            assert "B_ring" not in dict(art.budget.rings) and "Bq_ring" in dict(art.budget.rings)
    for prec, fmt, kw in (("fp16", "uint4", {"zeros": True}), ("bf16", "mxfp4", {})):
        p = spatialc.build(spatialc.gemm(16, 4096, 4096, prec, weights=fmt, **kw), "sm_90", form="persistent")
        assert REGISTER_PATH in spatialc.lower(p, form="persistent").program_cu


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("case", CASES)
def test_the_emulated_kernel_equals_the_interpreter(built, case):
    p, art = built[case]
    exact = w4_inputs(p, seed=3, exact=True)  # small integers and powers of two: every sum exact
    assert np.array_equal(emulated(art, exact), spatialc.evaluate(p, exact))


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("fault", ["the nibbles of a byte read the other way round", "the scale of the other group"])
def test_a_fault_planted_in_the_kernel_text_is_caught(built, fault):
    p, art = built["int4-zeros-bf16"]  # K = 256: two groups of 128
    x = w4_inputs(p, seed=7, exact=True)
    c = emulated(art, x, lambda text: plant(text, fault, shared=False))
    ok, how = spatialc.tolerance(p, kernel=True).check(c, x)
    assert not ok, how


@pytest.mark.parametrize("case", ["int4-zeros-bf16", "mxfp4-decode-m1", "uint4-f32-scales-fp16-square"])
def test_run_lays_out_the_arguments_as_for_the_general_form(built, case):
    """`spatialc.run` of the persistent artifact: its launch contract is the general form's (a stand-in device that
    decodes the 4-bit arguments' bytes by the layout's formula computes what the interpreter does)."""
    p, art = built[case]
    fmt = CASES[case][3]
    x = w4_inputs(p, seed=11, exact=True, packed=False)
    assert np.array_equal(L.run_with(StandInDevice(art, w4_kernel(fmt)), art, **x), spatialc.evaluate(p, x))
    assert L.kernel_args(art.launch) == L.kernel_args(art.general.launch)


def test_auto_prints_the_general_form_and_the_persistent_one_is_asked_for():
    p = w4_program(16, 64, 256, "int4", group=128, zeros=True)
    art = spatialc.lower(p)
    assert art.budget.form == "general" and any("form='persistent'" in n for n in art.notes)
    assert spatialc.lower(p, form="persistent").budget.form == "persistent"  # a plan made for the general form
    split = spatialc.build(spatialc.gemm(16, 4096, 4096, "bf16", weights="int4", group=128, zeros=True), "sm_90")
    assert split.placement.splits > 1  # auto's decode plan: split-K, which no persistent kernel prints
    with pytest.raises(NeedsGeneral, match=r"split-K over \d sites per item.*form='general'") as e:
        spatialc.lower(split, form="persistent")
    assert "\n" not in str(e.value)


def test_a_dequant_the_register_path_cannot_take_is_one_line():
    """The K loop's Wait on A moved between the dequant and its matmul: the register fusion does not match
    (`register_fusion`), and the persistent form, which has no B page to write, refuses by one NeedsGeneral line."""
    p = w4_program(16, 64, 256, "int4", form="persistent", group=128, zeros=True)
    ops = serialise(printed_site_programs(p))

    def moved(body):
        out = [dataclasses.replace(op, body=moved(op.body)) if isinstance(op, SerialLoop) else op for op in body]
        if any(isinstance(op, Compute) and isinstance(op.op, Dequant) for op in out):
            first = next(op for op in out if isinstance(op, Wait))
            out.remove(first)
            out.insert(next(i for i, op in enumerate(out) if isinstance(op, Compute)) + 2, first)
        return tuple(out)

    rings = ring_table(p, MMA_TYPES[p.precision], ())
    assert persistent.in_registers(ops, rings)[1]  # as printed: fused
    with pytest.raises(NeedsGeneral, match=r"W4A16 GEMM's dequant prologue.*does not feed its own next matmul") as e:
        persistent.in_registers(moved(ops), rings)
    assert "\n" not in str(e.value) and "form='general'" in str(e.value)


def test_a_fused_b_page_read_by_another_op_is_one_line():
    """The fused B page (its ring replaced by the packed page's registers) read by an op outside the body the fusion
    matched — here a matmul after the K loop reading it as its A page: the persistent form has no such page to read
    and refuses by one NeedsGeneral line (`in_registers`' second check; within the body, any other op on the page
    makes `register_fusion` refuse the fusion itself, the first check)."""
    p = w4_program(16, 64, 256, "int4", form="persistent", group=128, zeros=True)
    ops = serialise(printed_site_programs(p))
    rings = ring_table(p, MMA_TYPES[p.precision], ())
    mm = next(op for op in serial_walk(ops) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles))
    planted = dataclasses.replace(mm, ins=(mm.ins[1], mm.ins[0]))  # B's page read as a matmul's A
    b = rings.name(mm.ins[1])
    assert persistent.in_registers(ops, rings)[1]  # as printed: fused, accepted
    with pytest.raises(
        NeedsGeneral, match=rf"W4A16 GEMM's dequant prologue.* whose B page {b} is also read by a Compute"
    ):
        persistent.in_registers((*ops, planted), rings)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The decode shape's persistent kernel (M = 16, N = K = 4096, int4 with a zero point per 128), planned for
    sm_80, sm_86 and sm_90 and each compiled by nvcc -Werror (ptxas -v) for its own architecture: sm_90's in host
    mode (`-c`, which covers this file's host code, gcc -Wall -Wextra -Werror), sm_80's and sm_86's device-only
    (-cubin; the same host printer at other constants)."""
    done = {}
    for cc in ("80", "86", "90"):
        art = spatialc.lower(decode(16, f"sm_{cc}"), form="persistent")
        compile_ = nvcc_compile if cc == "90" else nvcc_device
        done[cc] = (art, compile_(art.program_cu, tmp_path_factory.mktemp("w4p") / f"sm{cc}.cu", (cc,)))
    return done


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("cc", ["80", "86", "90"])
def test_nvcc_compiles_the_decode_kernel_without_spills(compiled, cc):
    log = assert_clean(compiled[cc][1], (cc,))
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log)


@pytest.mark.nvcc
@pytest.mark.skipif(find_nvcc() is None or find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
@pytest.mark.parametrize("cc", ["80", "90"])
def test_the_main_loop_has_no_byte_loads_and_no_operand_page_stores(compiled, cc):
    """test_w4_sass.py's census of the main loop: each B tile one 32-bit word load a lane and four pair conversions,
    no byte loads (LDS.U8, LDG.E.U8), no shared stores (the B page is never written; cp.async is LDGSTS)."""
    art = compiled[cc][0]
    cubin = compile_cubin(art.kernel_cu, f"sm_{cc}")
    ptx = kernel_ptxas(cubin, art.launch.kernel_name)
    assert ptx is not None and ptx.spill_stores == 0 and ptx.spill_loads == 0
    code = disassemble(cubin)
    loops = code.main_loops()
    assert loops
    for lo, hi in loops:
        c = census(code, lo, hi)
        assert c["byte loads"] == 0 and c["shared stores"] == 0, c
        tiles = c["mmas"] // 2
        assert tiles >= 1 and c["pair conversions"] == 4 * tiles and c["word loads"] >= tiles, c


def test_the_cli_prints_it_with_form_persistent(capsys, tmp_path):
    """`spatialc gemm … --weights mxfp4 --form persistent --emit`: the persistent kernel, its B fragments from packed
    pages (budget.json: no B operand ring), the general form beside it (--form sm90a: test_w4_sm90a.py)."""
    args = ["gemm", "16", "96", "256", "--precision", "bf16", "--weights", "mxfp4"]
    assert main([*args, "--form", "persistent", "--emit", str(tmp_path / "k")]) == 0, capsys.readouterr().err
    budget = json.loads((tmp_path / "k" / "budget.json").read_text())
    assert budget["form"] == "persistent" and set(budget["rings"]) == {"A_ring", "Bq_ring"}
    assert "spatialc_w4_load_b<2, true, OPT>(" in (tmp_path / "k" / "kernel.cu").read_text()
    assert (tmp_path / "k" / "general" / "kernel.cu").is_file()


def test_the_proof_follows_the_packed_page_the_matmul_reads():
    """The occupancy proof checks the fused order's packed page where the matmul reads its B fragments: the packed
    page's Pop moved back before the matmul (the slot the cp.async ahead may refill while the warps still read it) is
    refused by one NeedsGeneral line, though the B page it stands for is still waited for there."""
    p = w4_program(16, 64, 256, "int4", form="persistent", group=128, zeros=True)
    rings = packed_rings(p, ring_table(p, MMA_TYPES[p.precision], ()))
    ops, _ = persistent.in_registers(serialise(printed_site_programs(p)), rings)
    prove(rings, ops)  # as printed

    def early(body):
        out = [dataclasses.replace(op, body=early(op.body)) if isinstance(op, SerialLoop) else op for op in body]
        mm = next((i for i, op in enumerate(out) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles)), None)
        if mm is not None and isinstance(out[mm + 1], Pop):
            out.insert(mm, out.pop(mm + 1))
        return tuple(out)

    with pytest.raises(NeedsGeneral, match=r"Compute on ring Bq_ring .*its packed page unpopped") as e:
        prove(rings, early(ops))
    assert "\n" not in str(e.value)

"""The W4A16 decode kernel's main loop in SASS (issue 34, item 6: "no byte-wise gathers, the dequant off the tensor
cores' path"), compiled by nvcc for sm_80 and sm_90 at M = 16, N = K = 4096, int4 with a bf16 scale and a zero point
per 128 (and on sm_90 mxfp4, and uint4 with float32 scales and fp16 operands): the register path loads each packed
tile with one 32-bit shared load a lane (LDS, no LDS.U8), reads its scales and zero points as 32-bit words (no
LDG.E.U8), stores no operand page (no STS), and converts each pair of weights with one F2FP pack — four a tile, in
the loop beside the two HMMAs they feed. The shared path's loop has the byte loads and the page stores, so the same
checks tell the two apart."""

from __future__ import annotations

import pytest

import spatialc
from spatialc.lower.cuda.general import kernel as general
from spatialc.runtime.nvcc import compile_cubin, find_nvcc, kernel_ptxas
from spatialc.runtime.sass import MMA, Sass, disassemble, find_cuobjdump
from spatialc.target import target as get_target

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(find_nvcc() is None or find_cuobjdump() is None, reason="needs nvcc and cuobjdump"),
]


FORMATS = {  # (operand, weights, options): int4 the decode row; mxfp4's e8m0 scales and uint4's float32
    # scales and byte zero points are read through 32-bit words too
    "int4": ("bf16", "int4", {"group": 128, "zeros": True}),
    "mxfp4": ("bf16", "mxfp4", {}),
    "uint4-f32-fp16": ("fp16", "uint4", {"group": 64, "scale_type": "float32", "zeros": True}),
}


def decode_sass(cc: str, dequant: str, fmt: str = "int4") -> tuple[Sass, object]:
    prec, weights, kw = FORMATS[fmt]
    p = spatialc.build(spatialc.gemm(16, 4096, 4096, prec, weights=weights, **kw), f"sm_{cc}")
    art = general.lower(p, get_target(p.target), dequant=dequant)
    cubin = compile_cubin(art.kernel_cu, f"sm_{cc}")
    return disassemble(cubin), kernel_ptxas(cubin, art.launch.kernel_name)


def census(code: Sass, lo: int, hi: int) -> dict[str, int]:
    ops = code.ops(lo, hi)

    def count(pred) -> int:
        return sum(n for op, n in ops.items() if pred(op.split(".")))

    return {
        "byte loads": count(lambda m: m[0] in ("LDS", "LDG", "LD") and ("U8" in m or "S8" in m)),
        "shared stores": count(lambda m: m[0] == "STS"),
        "word loads": count(lambda m: m == ["LDS"] or m == ["LDS", "32"]),
        "pair conversions": count(lambda m: m[0] == "F2FP" and "PACK_AB" in m),
        "mmas": count(lambda m: m[0] in MMA),
        "ldsm": count(lambda m: m[0] == "LDSM"),
    }


# (int4's unpack checked on sm_80; sm_90 compiles the other two formats' — one compile less for CI time)
@pytest.mark.parametrize(("cc", "fmt"), [("80", "int4"), ("90", "mxfp4"), ("90", "uint4-f32-fp16")])
def test_the_register_paths_main_loop_has_no_byte_loads_and_converts_beside_the_mmas(cc, fmt):
    code, ptx = decode_sass(cc, "registers", fmt)
    assert ptx is not None and ptx.spill_stores == 0 and ptx.spill_loads == 0 and ptx.stack == 0
    loops = code.main_loops()
    assert loops
    for lo, hi in loops:
        c = census(code, lo, hi)
        assert c["byte loads"] == 0 and c["shared stores"] == 0, c
        # A B tile: one word load a lane, four pair conversions (its registers), two HMMAs with an A fragment
        # (M = 16: one a K tile, one LDSM, shared by the warp's B columns). (sm_80's ring waits poll shared memory
        # with LDS of their own.)
        tiles = c["mmas"] // 2
        assert tiles >= 1 and c["pair conversions"] == 4 * tiles, c
        assert c["ldsm"] >= 1 and tiles % c["ldsm"] == 0, c
        assert c["word loads"] == tiles if cc == "90" else c["word loads"] >= tiles, c


def test_the_shared_paths_main_loop_is_told_apart_by_the_same_checks():
    code, _ = decode_sass("90", "shared")
    seen = [census(code, lo, hi) for lo, hi in code.main_loops()]
    assert seen and all(c["byte loads"] > 0 and c["shared stores"] > 0 for c in seen), seen


def dequantisers(p) -> int:
    """How many warps dequantise each B tile of `p`'s plan along M: one per item along M and warp of the block's lane
    grid holding its column — a warp dequantises a tile once for all its rows, every sub-block's (the main loop's
    four pair conversions per B tile, above) — or each of the block's rows where no grid divides it (single tiles)."""
    plan = p.plan
    grid = get_target(p.target).accumulator_lane_grid(plan.block.osh, plan.block.osw)
    return plan.grid[0] * (grid[0] if grid else plan.block.osh * plan.sub_blocks[0])


@pytest.mark.parametrize("cc", ["80", "90"])
def test_decode_plans_dequantise_each_b_tile_once(cc):
    """The planner prices the register dequant (`tile.dequant_cost`): at M = 1, 16 and 64, N = K = 4096, one warp
    dequantises each B tile — at M ≤ 16 in blocks of one tile row (osh = 1: no padded row), at M = 64 in one item
    along M whose warps each hold a column of its four tile rows."""
    for m in (1, 16, 64):
        p = spatialc.build(spatialc.gemm(m, 4096, 4096, "bf16", weights="int4", group=128, zeros=True), f"sm_{cc}")
        assert dequantisers(p) == 1, p.plan
        assert p.plan.block.osh == 1 or m > 16, p.plan

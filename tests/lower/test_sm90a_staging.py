"""The sm_90a form's default fused store (lower/cuda/sm90a/staging.py): each consumer warpgroup stages its 64 rows
of `OUT_CHUNK` tiles in a box swizzled as wide as its rows and stores it with one TMA store — run through the host
emulation against the interpreter, with planted faults in the new staging (a wrong swizzle, a wrong stmatrix row,
the warpgroup's barrier, fence or wait left out) the emulation must catch, and the instruction counts nvcc gives it
beside the first epilogue (`epilogue="tiles"`, test_sm90a.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import spatialc
from spatialc.lower.errors import Unsupported

from .test_sm90a import EXACT, NVCC, compiled_clean, inputs, needs_gxx, outcome, replaced

SWZ = "#define OUT_SWZ(b) ((b) ^ ((((b) >> 7) & OUT_SWIZZLE) << 4))"
BARRIER = "spatialc_engine_sync(OUT_BAR + warp / 4, 128);"
WAIT = "if (elected) { spatialc_bulk_wait_read<0>(); }"
FENCE = "spatialc_fence_proxy_async();  // the thread's staged values"


def case(prec: str, shape: tuple[int, int, int], out: str | None = None, epilogue=None, **kw):
    g = spatialc.gemm(*shape, prec, **({"out": out} if out else {}), **({"epilogue": epilogue} if epilogue else {}))
    p = spatialc.build(g, "sm_90a", **kw)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and SWZ in art.kernel_cu
    x = inputs(prec, *shape)
    if epilogue:
        x |= {"bias": np.arange(shape[1], dtype=np.float32) - 40}
    return p, art, x


@pytest.fixture(scope="module")
def pairs():
    """bf16 150×200×64 into float32 C, 8×6-tile items, three on each of two sites: each warpgroup stages its 64
    rows of 6 tiles in three boxes of 2 tiles (128-byte rows) — an odd count, so the boxes' turn runs over items —
    a lane's two adjacent columns with one 8-byte store."""
    p, art, x = case("bf16", (150, 200, 64), block=(8, 6, 2), depth=2, sites=2)
    text = art.kernel_cu
    assert "#define OUT_CHUNK 2" in text and "#define OUT_BOX_ROW 128" in text and "#define OUT_SWIZZLE 7" in text
    assert "++boxes_out;" in text and "out_pair" in text
    return p, art, x


@pytest.fixture(scope="module")
def matrix():
    """fp16 150×200×64 into fp16 C in 8×8-tile items: stmatrix into boxes of 4 tiles (128-byte rows)."""
    p, art, x = case("fp16", (150, 200, 64), out="fp16", block=(8, 8, 2), depth=2)
    assert "spatialc_stmatrix_rows(" in art.kernel_cu and "#define OUT_CHUNK 4" in art.kernel_cu
    return p, art, x


def test_c_goes_out_in_a_box_of_the_warpgroups_64_rows_swizzled_as_wide_as_its_rows():
    art = spatialc.lower(spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16", out="bf16"), "sm_90a"))
    c = art.launch.tensor_maps[-1]
    assert (c.tensor, c.box, c.swizzle) == (2, (64, 64), 128)  # 64 rows of 64 bf16 columns: 128 bytes a row
    text = art.kernel_cu
    assert "spatialc_tma_store_2d(&spatialc_tmap_2, col, row, staged);" in text and text.count(BARRIER) == 1
    # The same shared memory as the first epilogue's: two warpgroups × two boxes × 64 rows × 128 bytes.
    tiles = spatialc.lower(
        spatialc.build(spatialc.gemm(4096, 4096, 4096, "bf16", out="bf16"), "sm_90a"), epilogue="tiles"
    )
    assert art.launch.dyn_smem == tiles.launch.dyn_smem and art.budget.staging_bytes == 2 * 2 * 64 * 128
    assert tiles.launch.tensor_maps[-1].box == (16, 16) and BARRIER not in tiles.kernel_cu


def test_the_epilogue_is_the_sm90a_forms_option_alone():
    p = spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90a")
    with pytest.raises(Unsupported, match="the sm_90a epilogue 'rows'"):
        spatialc.lower(p, epilogue="rows")
    q = spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90")
    with pytest.raises(Unsupported, match="epilogue='tiles' in the persistent form"):
        spatialc.lower(q, form="persistent", epilogue="tiles")


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
def test_the_swizzled_staging_equals_the_interpreter(pairs, matrix, mode):
    for c in (pairs, matrix):
        assert outcome(c, c[1].program_cu, mode) == EXACT


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(
    ("prec", "shape", "out", "kw"),
    [
        ("bf16", (100, 40, 64), "bf16", {"block": (4, 2, 2)}),  # paired blocks, boxes of 2 tiles: 64-byte rows
        ("int8", (129, 250, 190), None, {}),  # int32 C, the planner's plan
        ("bf16", (70, 48, 32), "bf16", {"block": (8, 3, 2)}),  # 3 tiles wide: boxes of 1 tile, 32-byte rows
    ],
)
def test_narrower_boxes_and_paired_blocks_equal_the_interpreter(prec, shape, out, kw):
    c = case(prec, shape, out, **kw)
    assert outcome(c, c[1].program_cu) == EXACT


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(
    ("shape", "block", "row", "swizzle"),
    [
        ((130, 256, 96), (8, 8, 2), 128, 128),  # int8 C: boxes of 8 tiles, a byte at a time at its swizzled place
        ((130, 16, 96), (8, 1, 2), 16, 0),  # one tile wide: rows of 16 bytes, which no swizzle pattern takes
    ],
)
def test_int8_c_after_requant_equals_the_interpreter(shape, block, row, swizzle):
    from spatialc.frontend import requant

    p = spatialc.build(spatialc.gemm(*shape, "int8", epilogue=[requant(0.02, zero_point=3)]), "sm_90a", block=block)
    art = spatialc.lower(p)
    assert f"#define OUT_BOX_ROW {row}" in art.kernel_cu and art.launch.tensor_maps[-1].swizzle == swizzle
    assert outcome((p, art, inputs("int8", *shape)), art.program_cu) == EXACT


@needs_gxx
@pytest.mark.emulation
def test_a_chain_into_the_swizzled_staging_equals_the_interpreter():
    from spatialc.frontend import bias, relu

    for out in ("fp16", None):  # stmatrix after the chain; one element at a time at its swizzled byte
        c = case("fp16", (150, 200, 64), out, epilogue=[bias(), relu()], block=(8, 8, 2), depth=2)
        assert outcome(c, c[1].program_cu) == EXACT


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(
    "wrong",
    [
        "#define OUT_SWZ(b) ((b) ^ ((((b) >> 8) & OUT_SWIZZLE) << 4))",  # the XOR by the wrong address bits
        "#define OUT_SWZ(b) ((b) ^ ((((b) >> 7) & 3) << 4))",  # a 64-byte pattern in a 128-byte box
        "#define OUT_SWZ(b) (b)",  # staged unswizzled into a box the copy engine reads swizzled
    ],
)
def test_a_wrong_swizzle_in_the_staging_gives_a_wrong_c(pairs, matrix, wrong):
    for c in (pairs, matrix):
        assert outcome(c, replaced(c[1].program_cu, SWZ, wrong)) == "mismatch"


@needs_gxx
@pytest.mark.emulation
def test_a_wrong_stmatrix_row_gives_a_wrong_c(matrix):
    # Matrices 1 and 2 swapped: the lane addresses rows 8–15 where it should address columns 8–15.
    text = replaced(
        matrix[1].program_cu,
        "8 * ((lane >> 3) & 1), m_col = 8 * (lane >> 4)",
        "8 * (lane >> 4), m_col = 8 * ((lane >> 3) & 1)",
    )
    assert outcome(matrix, text) == "mismatch"


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("mode", ["late", "early"])
def test_a_box_stored_before_the_whole_warpgroup_staged_it_is_a_race(pairs, matrix, mode):
    for c in (pairs, matrix):
        got = outcome(c, replaced(c[1].program_cu, BARRIER, "//"), mode)
        assert got.startswith("race"), got


@needs_gxx
@pytest.mark.emulation
def test_a_box_stored_without_the_proxy_fence_is_a_race(pairs):
    got = outcome(pairs, replaced(pairs[1].program_cu, FENCE, "//"))
    assert got.startswith("race") and "no fence.proxy.async since" in got, got


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize("wait", ["//", "if (elected) { spatialc_bulk_wait_read<1>(); }"])
def test_a_box_written_again_before_its_store_read_it_is_a_race(pairs, wait):
    got = outcome(pairs, replaced(pairs[1].program_cu, WAIT, wait))
    assert got.startswith("race") and "may still be reading" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_warpgroup_that_never_waits_for_its_last_store_is_refused_at_exit(pairs):
    last = "if ((threadIdx.x & 127) == 0) { spatialc_bulk_wait_read<0>(); }  // the last boxes' stores"
    got = outcome(pairs, replaced(pairs[1].program_cu, last, "//"))
    assert got.startswith("fault") and "never waited for (spatialc_bulk_wait_read)" in got, got


@needs_gxx
@pytest.mark.emulation
def test_a_swizzled_box_off_its_pattern_period_is_refused(pairs):
    text = replaced(
        pairs[1].program_cu,
        "spatialc_tma_store_2d(&spatialc_tmap_2, col, row, staged);",
        "spatialc_tma_store_2d(&spatialc_tmap_2, col, row, staged + 128);",
    )
    got = outcome(pairs, text)
    assert got.startswith("fault") and "not on 1024 bytes" in got, got


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize(
    ("prec", "out", "boxes", "sts"), [("bf16", "bf16", 4, ("STSM", 16)), ("int8", None, 8, ("STS", 64))]
)
def test_a_warpgroup_stores_a_box_where_a_warp_stored_a_tile(prec, out, boxes, sts, tmp_path):
    """At 4096³ (128 × 256 items), what each consumer thread's epilogue compiles to, against the first epilogue's:
    TMA stores `boxes` a warpgroup instead of 16 a warp (bf16 C: 8 an item instead of 128), the staging written by
    16 stmatrix (16-bit C) or 64 8-byte stores (int32 C) as before, and one warpgroup barrier a box."""
    g = spatialc.gemm(4096, 4096, 4096, prec, **({"out": out} if out else {}))
    p = spatialc.build(g, "sm_90a")
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    new = Counter(i.base for i in compiled_clean(spatialc.lower(p), tmp_path / "new"))
    old = Counter(i.base for i in compiled_clean(spatialc.lower(p, epilogue="tiles"), tmp_path / "old"))
    assert (new["UTMASTG"], old["UTMASTG"]) == (boxes, 16), (new, old)
    assert new[sts[0]] == old[sts[0]] == sts[1] and new["STG"] == old["STG"] == 0
    assert new["BAR"] == old["BAR"] + boxes  # (the block's barrier after the barriers' initialisation: both)

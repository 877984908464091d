"""Split-K in the sm_90a form (lower/cuda/sm90a/partials.py): the consumers store their partial sums to the workspace
from their accumulators and the owner's add them from it, with no page of shared memory between — run through the
host emulation against the interpreter, with the planted faults it must catch, and compiled where nvcc is present."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.lower.errors import Unsupported

from .test_sm90a import NVCC, compiled_clean, exact_both_ways, inputs, needs_gxx, outcome, replaced


def split(shape, splits: int, prec: str = "bf16", **kw):
    """The GEMM of `shape` split `splits` ways, planned for and printed by the sm_90a form."""
    epilogue = kw.pop("epilogue", ())
    p = spatialc.build(spatialc.gemm(*shape, prec, epilogue=epilogue), "sm_90a", split_k=splits, **kw)
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a"
    return p, art


def test_a_split_build_on_sm90a_is_printed_by_the_form_with_no_partial_pages():
    p, art = split((256, 1024, 4096), 4)
    assert p.placement is not None and p.placement.splits == 4
    names = dict(art.budget.rings)
    assert not any(name.startswith("partial_") for name in names), names  # 128 KiB of float32 each, not held
    assert art.budget.workspace_bytes > 0 and art.launch.cooperative and art.launch.sync
    text = art.kernel_cu
    assert "int* __restrict__ spatialc_sync" in text
    assert text.index("spatialc_work") < text.index("spatialc_sync") < text.index("CUtensorMap spatialc_tmap_0")
    assert "SPATIALC_GLOBAL_ST2(" in text and "SPATIALC_GLOBAL_ADD2(" in text
    assert "spatialc_grid_wait(spatialc_sync" in text and "spatialc_grid_add(spatialc_sync" in text


def test_the_owner_stores_c_through_the_fused_store():
    # The contributors' classes store partial sums: the owner's alone decides the fused store, which it keeps.
    _, art = split((128, 256, 1024), 2, block=(8, 8, 4))
    assert "spatialc_tma_store_2d(" in art.kernel_cu
    assert not any(name.startswith("C") for name, _ in art.budget.rings), art.budget.rings


CASES = [
    ("bf16", (128, 256, 1024), 2, {"block": (8, 8, 4)}),
    ("fp16", (100, 200, 1000), 3, {"block": (8, 8, 4)}),  # odd sizes, the splits' K steps unequal
    ("int8", (64, 128, 2048), 3, {"block": (4, 4, 8)}),  # items of 64 rows: one consumer warpgroup, two blocks an SM
]


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(("prec", "shape", "splits", "kw"), CASES)
def test_the_emulated_split_kernel_equals_the_interpreter(prec, shape, splits, kw):
    p, art = split(shape, splits, prec, **kw)
    exact_both_ways(p, art, inputs(prec, *shape))


@needs_gxx
@pytest.mark.emulation
def test_an_epilogue_runs_once_on_the_owner_after_the_adds():
    shape = (96, 256, 1536)
    p, art = split(shape, 3, "bf16", block=(8, 8, 4), epilogue=[spatialc.bias(), spatialc.relu()])
    x = inputs("bf16", *shape)
    x["bias"] = np.random.default_rng(3).integers(-50, 50, (1, shape[1])).astype(np.float32)
    want = spatialc.evaluate(p, x)
    assert np.array_equal(spatialc.emulate(art, x, timeout=120), want)


@pytest.fixture(scope="module")
def faulty():
    shape = (128, 256, 1024)
    p, art = split(shape, 2, block=(8, 8, 4))
    return p, art, inputs("bf16", *shape)


@needs_gxx
@pytest.mark.emulation
def test_the_unplanted_split_kernel_is_exact(faulty):
    assert outcome(faulty, faulty[1].program_cu) == "exact"


@needs_gxx
@pytest.mark.emulation
def test_a_contributor_that_raises_without_its_release_is_caught(faulty):
    text = faulty[1].program_cu
    planted = replaced(text, "__threadfence();  // visible at device scope before the raise", "// (no fence)")
    planted = re.sub(r"spatialc_grid_add\((spatialc_sync[^;]*)\);", r"spatialc_grid_add_relaxed(\1);", planted)
    assert planted != text
    got = outcome(faulty, planted)
    assert got.startswith("race") and "nothing orders that write first" in got, got


@needs_gxx
@pytest.mark.emulation
def test_an_owner_that_adds_before_its_wait_is_caught(faulty):
    text = faulty[1].program_cu
    wait = re.search(r"if \(etid == 0\) \{ spatialc_grid_wait\(spatialc_sync[^}]*\}", text)
    assert wait is not None
    got = outcome(faulty, text.replace(wait.group(0), "// (no wait)"))
    assert got.startswith("race"), got


@needs_gxx
@pytest.mark.emulation
def test_an_add_left_out_is_caught(faulty):
    text = faulty[1].program_cu
    add = re.search(r"SPATIALC_GLOBAL_ADD2\([^;]*\);", text)
    assert add is not None
    assert outcome(faulty, text.replace(add.group(0), "// (no add)")) == "mismatch"


def test_partials_moved_other_than_as_the_schedule_does_are_refused():
    """The owner's reads and adds rolled into loops over the other splits: verify follows them (tests/test_split_k.py),
    the form refuses by name rather than print the adds from ops it did not check."""
    from spatialc.ir.ids import LoopVar
    from spatialc.ir.nodes import Engine
    from spatialc.ir.ops import AddPartial, Compute, Const, Loop, Reserve, TileAddr

    from ..rewrite import edit

    p, _ = split((128, 256, 1024), 3, block=(8, 8, 4))
    j = LoopVar(9)
    out = p.output_tensor()
    assert out is not None
    rows_cols = out.tiles[0] * out.tiles[1]

    def reader(ops):
        body = ops[0].body if len(ops) == 1 and isinstance(ops[0], Loop) else ops
        first = next(i for i, o in enumerate(body) if isinstance(o, Reserve) and i > 1)
        res, read, push = body[first : first + 3]
        at = TileAddr(read.at.base, (*read.at.steps, (j, rows_cols)))
        return (*body[:first], Loop(j, Const(2), (res, dataclasses.replace(read, at=at), push)))

    def compute(ops):
        body = ops[0].body if len(ops) == 1 and isinstance(ops[0], Loop) else ops
        adds = [i for i, o in enumerate(body) if isinstance(o, Compute) and isinstance(o.op, AddPartial)]
        first = adds[0] - 1
        return (*body[:first], Loop(j, Const(2), body[first : first + 3]), *body[adds[-1] + 2 :])

    from spatialc.ir.ids import Site

    q = edit(p, Engine.READER, reader, (Site(0),))
    q = spatialc.verify(edit(q, Engine.COMPUTE, compute, (Site(0),)))
    with pytest.raises(Unsupported, match="split-K's partial sums"):
        spatialc.lower(q, form="sm90a")


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize(("prec", "shape", "splits"), [("bf16", (256, 1024, 8192), 4), ("int8", (512, 512, 32768), 3)])
def test_the_split_kernel_compiles_clean(prec, shape, splits, tmp_path):
    # (the second: the GPU check's split row; an owner of 128 × 256 int8 items spilled 624 bytes before adds_fit)
    _, art = split(shape, splits, prec)
    instrs = compiled_clean(art, tmp_path)
    ops = {i.base for i in instrs}
    assert ops & {"HGMMA", "IGMMA"} and ops & {"RED", "REDG", "ATOM", "ATOMG"}, sorted(ops)  # the wgmma, the raise


@pytest.mark.parametrize(
    ("block", "prec"), [((8, 16, 4), "bf16"), ((4, 8, 8), "int8")]
)  # 128 of 168 registers; 64 of a paired block's 128
def test_an_item_whose_owner_would_spill_its_adds_is_refused_by_name(block, prec):
    p = spatialc.build(spatialc.gemm(256, 1024, 8192, prec), "sm_90a", split_k=2, block=block, form="sm90a")
    with pytest.raises(Unsupported, match="adds of split-K's partial sums beside .* accumulator registers"):
        spatialc.lower(p, form="sm90a")


def test_an_auto_split_the_sm90a_form_cannot_add_falls_back_to_the_general_form():
    p = spatialc.build(spatialc.gemm(100, 136, 1000, "bf16"), "sm_90a", split_k=3, block=(4, 8, 4))
    assert spatialc.lower(p).budget.form == "general"


def test_4_bit_weights_split_in_the_sm90a_form():
    from ..w4a16.w4_inputs import w4_inputs

    p = spatialc.build(
        spatialc.gemm(100, 136, 1024, "bf16", weights="int4", zeros=True), "sm_90a", split_k=2, form="sm90a"
    )
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a" and "SPATIALC_GLOBAL_ADD2(" in art.kernel_cu
    if shutil.which("g++") is None:  # (no g++: the lowering is what is checked)
        return
    x = w4_inputs(p, seed=3, exact=True)
    assert np.array_equal(spatialc.emulate(art, x, timeout=120), spatialc.evaluate(p, x))


# ---- a split tail (placement="split_tail"): whole items, then a split of a tail item, in one kernel ---------------


def tailed(shape, prec: str, sites: int, block, **kw):
    p = spatialc.build(
        spatialc.gemm(*shape, prec), "sm_90a", placement="split_tail", sites=sites, block=block, form="sm90a", **kw
    )
    art = spatialc.lower(p)
    assert art.budget.form == "sm90a"
    return p, art


TAIL_CASES = [
    ("bf16", (256, 256, 1024), 3, (8, 8, 4), "late"),  # 4 items: 1 whole a site, the last split 3 ways
    ("int8", (192, 128, 2048), 5, (4, 4, 8), "early"),  # 6 items on 5 sites: the last split 5 ways, paired blocks
]


@needs_gxx
@pytest.mark.emulation
@pytest.mark.parametrize(("prec", "shape", "sites", "block", "mode"), TAIL_CASES)
def test_the_emulated_split_tail_equals_the_interpreter(prec, shape, sites, block, mode):
    p, art = tailed(shape, prec, sites, block)
    assert p.placement.tail == 1 and all(len(items) == 2 for _, items in p.placement.items_of_site)
    # the whole items and the tail's owner store C through the fused store; no C ring, no partial pages
    assert "spatialc_tma_store_2d(" in art.kernel_cu and "for (int item = n_items - 1; item < n_items" in art.kernel_cu
    assert not any(name.startswith(("C", "partial_")) for name, _ in art.budget.rings), art.budget.rings
    x = inputs(prec, *shape)
    assert np.array_equal(spatialc.emulate(art, x, mode=mode, timeout=120), spatialc.evaluate(p, x))


@needs_gxx
@pytest.mark.emulation
def test_a_tail_owner_that_adds_before_its_wait_is_caught():
    shape = (256, 256, 1024)
    p, art = tailed(shape, "bf16", 3, (8, 8, 4))
    text = art.program_cu
    wait = re.search(r"if \(etid == 0\) \{ spatialc_grid_wait\(spatialc_sync[^}]*\}", text)
    assert wait is not None
    got = outcome((p, art, inputs("bf16", *shape)), text.replace(wait.group(0), "// (no wait)"))
    assert got.startswith("race"), got


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_the_split_tail_kernel_compiles_clean(tmp_path):
    # 3072³ bf16: 576 items of 128 × 128 on 132 SMs, 4 whole waves and 48 items split 2 ways (bench/split_tail.py)
    p = spatialc.build(spatialc.gemm(3072, 3072, 3072, "bf16"), "sm_90a", placement="split_tail", form="sm90a")
    assert (p.placement.tail, p.placement.splits) == (48, 2)
    instrs = compiled_clean(spatialc.lower(p), tmp_path)
    ops = {i.base for i in instrs}
    assert "HGMMA" in ops and ops & {"RED", "REDG", "ATOM", "ATOMG"}, sorted(ops)


def test_a_split_tail_on_auto_is_the_sm90a_forms_where_it_prints():
    p = spatialc.build(spatialc.gemm(3072, 3072, 3072, "bf16"), "sm_90a", placement="split_tail")
    assert spatialc.lower(p).budget.form == "sm90a"
    # forced to a block the wgmma layout does not take: the general form's plan, printed by it
    q = spatialc.build(spatialc.gemm(384, 384, 512, "bf16"), "sm_90a", placement="split_tail", block=(2, 2, 1))
    assert spatialc.lower(q).budget.form == "general"

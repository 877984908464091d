"""GEMM epilogues with row and column scale vectors and a residual or gate tensor (issue 31), printed and run.

The general form prints them page to page (a row vector read at the element's own row, the residual's page from a ring
the reader fills); the persistent kernel and the sm_90a form apply them in their fused stores (sm_90a's before the
staging store, its residual's page landed by TMA), reading a residual's page between its ring's Wait and Pop. The host
emulation of each printed form equals the interpreter, and planted faults in the printed text are caught: a row vector
read at the wrong row, a residual at another tile row or slot, its wait dropped or its page freed early. nvcc compiles
the kernels without a warning or a spill.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from functools import cache

import numpy as np
import pytest

import spatialc
import spatialc.runtime.launch as L
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import Compute, Loop, Pop
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.errors import NeedsGeneral
from spatialc.runtime.emulate import EmulationError

from ..nvcc_clean import nvcc_run
from ..rewrite import edit
from ..stand_in import MapStandIn, product
from .test_lower_nvcc import NVCC, in_namespace, ptxas_entries

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")

# name → (precision, epilogue, m, n, k, build options, target)
CASES = {
    "bf16_all": (
        "bf16",
        # four stages: the general form's compute warps spill past that at this block, whatever the stages (an
        # epilogue of bias, relu, two scalars and silu spills 16 bytes on sm_80 too)
        lambda: [spatialc.row_scale(), spatialc.col_scale(), spatialc.residual(), spatialc.gate()],
        40,
        48,
        32,
        {"block": (1, 1, 1), "sites": 3},
        "sm_80",
    ),
    "int8_row_residual": (
        "int8",
        lambda: [spatialc.row_scale("s"), spatialc.residual("r"), spatialc.scalar("add", -5)],
        33,
        40,
        48,
        {"block": (2, 1, 1), "sites": 2},
        "sm_86",
    ),
    "persistent_scales": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.col_scale(), spatialc.relu()],
        64,
        80,
        64,
        {"sub_blocks": (1, 2)},
        "sm_80",
    ),
    "persistent_int8_row": (
        "int8",
        lambda: [spatialc.row_scale(), spatialc.bias(), spatialc.requant(0.001, 2)],
        50,
        64,
        96,
        {},
        "sm_86",
    ),
    # a residual and a gate read by the persistent kernel's fused store: two items a site, rings two pages deep
    "persistent_residual_gate": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.residual(), spatialc.gate(), spatialc.relu()],
        64,
        80,
        64,
        {"sites": 2},
        "sm_80",
    ),
    "persistent_int8_residual": (
        "int8",
        lambda: [spatialc.residual(), spatialc.gate(), spatialc.scalar("add", -5), spatialc.requant(0.001, 2)],
        50,
        64,
        96,
        {"sites": 1},
        "sm_86",
    ),
    "splitk_residual": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.residual()],
        32,
        64,
        2048,
        {"split_k": 4},
        "sm_90",
    ),
    "multicast_residual": (
        "fp16",
        lambda: [spatialc.col_scale(), spatialc.residual()],
        64,
        256,
        128,
        {"multicast": (1, 2), "block": (2, 4, 4)},
        "sm_90",
    ),
    # twelve items on one site through residual and gate rings two pages deep: every slot is refilled
    "sm90a_residual_gate": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.residual(), spatialc.gate(), spatialc.relu()],
        256,
        96,
        64,
        {"sites": 1},
        "sm_90a",
    ),
    "sm90a_int8_residual": (
        "int8",
        lambda: [spatialc.residual(), spatialc.gate(), spatialc.scalar("add", -5)],
        128,
        64,
        96,
        {},
        "sm_90a",
    ),
    # paired blocks (items of 64 rows, one consumer warpgroup, two blocks an SM), and clusters multicasting A
    "sm90a_paired_residual": (
        "bf16",
        lambda: [spatialc.residual(), spatialc.relu()],
        128,
        64,
        64,
        {"block": (4, 4, 4)},
        "sm_90a",
    ),
    "sm90a_multicast_residual": (
        "bf16",
        lambda: [spatialc.col_scale(), spatialc.residual()],
        256,
        64,
        64,
        {"multicast": (2, 1), "block": (8, 4, 4)},
        "sm_90a",
    ),
    "sm90a_int8_requant": ("int8", lambda: [spatialc.residual(), spatialc.requant(0.01, 3)], 128, 64, 64, {}, "sm_90a"),
    # an activation the fused store does not apply: the chain page to page, the residual's ring filled by TMA still
    "sm90a_residual_gelu": (
        "fp16",
        lambda: [spatialc.residual(), spatialc.activation("gelu_tanh")],
        128,
        48,
        32,
        {},
        "sm_90a",
    ),
    "sm90a_scales": (
        "bf16",
        lambda: [spatialc.row_scale(), spatialc.col_scale(), spatialc.relu()],
        128,
        96,
        64,
        {},
        "sm_90a",
    ),
}


@cache
def built(name: str) -> spatialc.SpatialProgram:
    prec, epi, m, n, k, opts, tgt = CASES[name]
    return spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=epi()), tgt, **opts)


@cache
def lowered(name: str):
    return spatialc.lower(built(name), CASES[name][-1])


def inputs(p, seed: int = 0) -> dict[str, np.ndarray]:
    """int8 operands over their range with int32 scales; small integers in a float program (exact products)."""
    rng = np.random.default_rng(seed)
    integer = p.precision.value == "int8"
    out = {}
    for t in p.tensors:
        if t.role.value == "input":
            out[t.name] = rng.integers(-128, 128, t.elems) if integer else rng.integers(-3, 4, t.elems) * 1.0
        elif t.role.value == "parameter":
            n = t.elems[0] * t.elems[1]
            out[t.name] = rng.integers(-(2**31), 2**31, n) if integer else rng.integers(-4, 5, n) * 0.5
    return out


def emulated(name: str, mutate=lambda text: text) -> tuple[np.ndarray, np.ndarray]:
    """(the emulation's C, the interpreter's C) of a case, its printed text passed through `mutate`."""
    art, ins = lowered(name), inputs(built(name), seed=len(name))
    c = spatialc.emulate(dataclasses.replace(art, program_cu=mutate(art.program_cu)), ins)
    return c, np.asarray(spatialc.evaluate(built(name), ins))


# ---- which form --------------------------------------------------------------------------------------------------


def test_auto_prints_a_residual_in_the_general_form_where_the_fused_store_cannot_hold_it_saying_why():
    art = lowered("bf16_all")  # blocks of one tile: no warp grid divides them, so no fused store
    assert art.budget.form == "general"
    assert any(
        "persistent kernel refuses" in n and "no warp grid divides the accumulator block" in n for n in art.notes
    )


def test_the_persistent_kernel_applies_scales_in_its_fused_store():
    for name in ("persistent_scales", "persistent_int8_row"):
        art = lowered(name)
        assert art.budget.form == "persistent", art.notes
        assert "(el / 16) * 16]);  // op:Compute:Map_mul_x0_row" in art.kernel_cu


def test_the_persistent_kernel_reads_a_residual_and_a_gate_in_its_fused_store_before_their_pops():
    """Auto prints the persistent kernel: the fused store stands at the chain's last Push (the WriteTiles' image),
    after the pages' waits and before their pops, reading each page at its read slot."""
    art = lowered("persistent_residual_gate")
    assert art.budget.form == "persistent" and art.notes == ()
    text = art.kernel_cu
    store = text.index("{  // op:WriteTiles")
    push = text.index("// op:Push (fused output: no ring; the store above is the WriteTiles')", store)
    wait = text.rindex("__pipeline_wait_prior(0); __syncthreads();  // op:Wait", 0, store)
    for word in ("add", "mul"):  # the residual's stage, the gate's
        page = r"\(\(float\)\*\(ring_(\d+) \+ rslot_\1 \* PAGE_\1 \+ \(bh \* 4 \+ bw\) \* 256 \+ el\)\)\)"
        read = re.search(rf"{page};  // op:Compute:Map_{word}_x0_x1", text)
        assert read is not None, word
        r = int(read.group(1))
        pop = text.index(f"rslot_{r} = (rslot_{r} + 1) % DEPTH_{r};", push)
        assert wait < store < read.start() < push < pop


def test_the_persistent_kernel_refuses_a_residual_popped_before_its_store_by_name():
    """The schedule edited to pop the residual's page right after its own stage (before the chain's last Push, where
    the store reads it): verify accepts it, and the persistent kernel's occupancy proof refuses it."""
    p = built("persistent_residual_gate")
    q = spatialc.verify(edit(p, Engine.COMPUTE, popped_early(p, "read_residual")), p.target)
    with pytest.raises(NeedsGeneral, match=r"Push on ring residual_ring.* it needs its page unpopped"):
        spatialc.lower(q, form="persistent")
    art = spatialc.lower(q)
    assert art.budget.form == "general" and any("persistent kernel refuses" in n for n in art.notes)


def popped_early(p, read: str):
    """An edit of the compute engine's ops: the page of read stage `read` popped right after the stage that reads it
    (its Push and its chain page's Pop), as the schedule once placed it, before the chain's last Push."""
    ring = next(s.outs[0] for s in p.stages if s.name == read)

    def early(ops):
        if not any(isinstance(o, Pop) and p.buffer(o.buf).ring == ring for o in ops):
            return tuple(dataclasses.replace(o, body=early(o.body)) if isinstance(o, Loop) else o for o in ops)
        pop = next(o for o in ops if isinstance(o, Pop) and p.buffer(o.buf).ring == ring)
        rest = [o for o in ops if o is not pop]
        at = next(i for i, o in enumerate(rest) if isinstance(o, Compute) and pop.buf in o.ins)
        return (*rest[: at + 3], pop, *rest[at + 3 :])

    return early


def side_ring(art, tensor: str) -> int:
    """The ring whose pages the copy engine fills with `tensor`'s tiles, by the comment on its load."""
    text = art.kernel_cu
    load = text.index(f"// the page's first tile of {tensor}")
    return int(re.search(r"&full_(\d+)\[", text[load:]).group(1))


def test_the_sm90a_form_reads_a_residual_and_a_gate_from_their_rings_before_its_staging_store():
    """Auto prints the sm_90a form (no note passing it over). The copy engine lands each page a 16 x 16 box a tile
    of the row-major tensor; the consumers wait for it, apply it in the fused store and free it after."""
    art = lowered("sm90a_residual_gate")
    assert art.budget.form == "sm90a" and art.notes == ()
    params = {q.name: q for q in art.launch.params}
    assert params["residual"].order == params["gate"].order == "rows"
    names = [art.launch.params[m.tensor].name for m in art.launch.tensor_maps]
    assert names == ["A", "B", "residual", "gate", "C"]  # the loads' maps, then the store's, last
    assert [(m.box, m.swizzle) for m in art.launch.tensor_maps[2:4]] == [((16, 16), 0)] * 2
    # C goes out a warpgroup's box at a time: 64 rows, swizzled as wide as a row's float32 bytes.
    c = art.launch.tensor_maps[4]
    assert c.box[0] == 64 and c.swizzle == c.box[1] * 4 and c.swizzle in (32, 64, 128)
    text = art.kernel_cu
    for tensor, word in (("residual", "add"), ("gate", "mul")):
        r = side_ring(art, tensor)
        wait = text.index(f"spatialc_mbar_wait(&full_{r}[wt_{r} % DEPTH_{r}], (wt_{r} / DEPTH_{r}) & 1); ++wt_{r};")
        read = text.index(f"SPATIALC_PAGE_LD(ring_{r} + ((wt_{r} - 1) % DEPTH_{r}) * PAGE_{r} + (bh * 1 + bw) * 256")
        assert text.index(f"// op:Compute:Map_{word}_x0_x1", read) < text.index("\n", read)  # the stage's image
        staged = text.index("SPATIALC_PAGE_ST((OUT_T*)(staged + OUT_SWZ(at)), (OUT_T)v);", read)
        store = text.index("spatialc_tma_store_2d(", staged)
        pop = text.index(f"spatialc_mbar_arrive(&empty_{r}[pop_{r} % DEPTH_{r}]); ++pop_{r};  // op:Pop", store)
        assert wait < read < staged < store < pop


def test_the_launcher_passes_the_residual_as_a_matrix_with_its_tensor_map():
    """`spatialc.run`'s launcher (a numpy stand-in for the GPU) stores the residual row-major, as its map reads it,
    and encodes its map over that buffer: a 16 x 16 box, unswizzled, dims {columns, rows}."""
    art = spatialc.lower(spatialc.build(spatialc.gemm(128, 48, 32, "bf16", epilogue=[spatialc.residual()]), "sm_90a"))
    assert art.budget.form == "sm90a"
    rng = np.random.default_rng(1)
    a, b, r = (rng.integers(-3, 4, shape).astype(np.float32) for shape in ((128, 32), (32, 48), (128, 48)))
    dev = MapStandIn(art, product)
    L.run_with(dev, art, a, b, r)
    args = dev.launches[0][-1]
    at = [q.name for q in art.launch.params].index("residual")
    (rows_t, cols_t) = art.launch.params[at].tiles
    stored = args[at].reshape(rows_t * 16, cols_t * 16)[:128, :48]
    assert np.array_equal(L.bf16_to_float32(stored, np), r)  # small integers: exact in bf16
    (buffer, dims, strides, box, elem, swizzle), m = next(
        (got, m) for got, m in zip(dev.maps, art.launch.tensor_maps, strict=True) if m.tensor == at
    )
    assert np.array_equal(buffer, args[at]) and (box, elem, swizzle) == ((16, 16), 2, 0)
    assert (dims, strides) == ((cols_t * 16, rows_t * 16), (cols_t * 16 * 2,))


def test_the_sm90a_form_keeps_the_chain_page_to_page_where_the_schedule_frees_a_residual_before_its_store():
    """The fused store stands where the chain's last page is pushed; a schedule that pops the residual's page before
    that (as the schedule once did, after the residual's own stage) would let the producer refill it while the
    consumers read it, so the sm_90a form prints that chain page to page instead, each page read in its turn."""
    p = spatialc.build(spatialc.gemm(128, 48, 32, "bf16", epilogue=[spatialc.residual(), spatialc.relu()]), "sm_90a")
    assert "(fused output: no ring)" in spatialc.lower(p).kernel_cu
    q = spatialc.verify(edit(p, Engine.COMPUTE, popped_early(p, "read_residual")), "sm_90a")
    art = spatialc.lower(q)
    assert art.budget.form == "sm90a" and "(fused output: no ring)" not in art.kernel_cu
    if GXX is not None:
        x = inputs(q, seed=3)
        np.testing.assert_array_equal(spatialc.emulate(art, x), spatialc.evaluate(q, x))


def test_the_sm90a_form_applies_row_and_column_vectors_before_its_staging_store():
    art = lowered("sm90a_scales")
    assert art.budget.form == "sm90a"
    text = art.kernel_cu
    row = text.index("(el / 16) * 16]);  // op:Compute:Map_mul_x0_row")  # the element's own row of its tile
    col = text.index("el % 16]);  // op:Compute:Map_mul_x0_col")
    staged = text.index("SPATIALC_PAGE_ST((OUT_T*)(staged + OUT_SWZ(at)), (OUT_T)v);", col)  # into the staging box
    assert row < col < staged < text.index("spatialc_tma_store_2d(", staged)  # and out by TMA


# ---- the host emulation against the interpreter -------------------------------------------------------------------


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize("name", list(CASES))
def test_the_emulation_equals_the_interpreter(name):
    c, want = emulated(name)
    assert c.dtype == want.dtype and c.shape == want.shape
    np.testing.assert_array_equal(c, want)


@pytest.mark.emulation
@needs_gxx
def test_a_row_vector_read_at_the_wrong_row_is_caught():
    """The row scale indexed by the element's column in its tile (el % 16) where it must be its row (el / 16)."""

    def by_column(text: str) -> str:
        old = " * 256 + (el / 16) * 16]"
        assert text.count(old) == 1
        return text.replace(old, " * 256 + (el % 16) * 16]")

    for name in ("bf16_all", "sm90a_scales"):
        c, want = emulated(name, by_column)
        assert not np.array_equal(c, want), name


@pytest.mark.emulation
@needs_gxx
def test_a_residual_read_at_another_tile_row_of_its_page_is_caught():
    """The sm_90a fused store reading the residual's page at the tile row below the element's (bh ^ 1)."""
    r = side_ring(lowered("sm90a_residual_gate"), "residual")

    def shifted(text: str) -> str:
        old = f"PAGE_{r} + (bh * 1 + bw) * 256 + el"
        assert text.count(old) == 1
        return text.replace(old, f"PAGE_{r} + ((bh ^ 1) * 1 + bw) * 256 + el")

    c, want = emulated("sm90a_residual_gate", shifted)
    assert not np.array_equal(c, want)


@pytest.mark.emulation
@needs_gxx
def test_the_persistent_kernels_residual_read_at_another_tile_row_or_slot_is_caught():
    """The persistent kernel's fused store reading the residual's page at the tile row below the element's, or
    reading it after its slot counter moved on (its Pop printed before the store: the next slot's page)."""
    text = lowered("persistent_residual_gate").program_cu
    r = int(
        re.search(
            r"\*\(ring_(\d+) \+ rslot_\d+ \* PAGE_\d+ \+ \(bh \* 4 \+ bw\) \* 256 \+ el\)\)\);  // op:Compute:"
            r"Map_add_x0_x1",
            text,
        ).group(1)
    )

    def shifted(text: str) -> str:
        old = f"PAGE_{r} + (bh * 4 + bw) * 256 + el"
        assert text.count(old) == 1
        return text.replace(old, f"PAGE_{r} + ((bh ^ 1) * 4 + bw) * 256 + el")

    def popped_first(text: str) -> str:
        pop, store = f"rslot_{r} = (rslot_{r} + 1) % DEPTH_{r};", "{  // op:WriteTiles"
        assert text.count(pop) == 1 and text.count(store) == 1
        return text.replace(pop, "").replace(store, f"{pop} {store}")

    for mutate in (shifted, popped_first):
        c, want = emulated("persistent_residual_gate", mutate)
        assert not np.array_equal(c, want), mutate.__name__


def sm90a_fault(mutate) -> str:
    """The emulation's verdict on the sm_90a residual kernel with `mutate` applied to its text: its error's kind and
    report, or "mismatch" / "exact"."""
    try:
        c, want = emulated("sm90a_residual_gate", mutate)
    except EmulationError as e:
        return f"{e.kind}: {e}"
    return "exact" if np.array_equal(c, want) else "mismatch"


@pytest.mark.emulation
@needs_gxx
def test_a_residual_read_without_its_wait_is_a_race():
    """The consumers' wait on the residual's full barrier dropped, its counter kept: they read the page with nothing
    ordering them after the copy engine's writes."""
    r = side_ring(lowered("sm90a_residual_gate"), "residual")
    wait = f"spatialc_mbar_wait(&full_{r}[wt_{r} % DEPTH_{r}], (wt_{r} / DEPTH_{r}) & 1); ++wt_{r};"

    def unwaited(text: str) -> str:
        assert text.count(wait) == 1
        return text.replace(wait, f"++wt_{r};")

    got = sm90a_fault(unwaited)
    assert got.startswith("race") and "TMA load" in got, got


@pytest.mark.emulation
@needs_gxx
def test_a_residual_page_freed_before_the_store_reads_it_is_a_race():
    """The residual's Pop moved up to right after its Wait: the producer refills the slot (twelve items, two pages)
    while the consumers still read it."""
    r = side_ring(lowered("sm90a_residual_gate"), "residual")
    wait = f"spatialc_mbar_wait(&full_{r}[wt_{r} % DEPTH_{r}], (wt_{r} / DEPTH_{r}) & 1); ++wt_{r};"
    pop = f"spatialc_mbar_arrive(&empty_{r}[pop_{r} % DEPTH_{r}]); ++pop_{r};"

    def early(text: str) -> str:
        assert text.count(wait) == 1 and text.count(pop) == 1
        return text.replace(pop, "").replace(wait, f"{wait} {pop}")

    got = sm90a_fault(early)
    assert got.startswith("race") and "TMA load" in got, got


# ---- nvcc ----------------------------------------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_kernels_compile_without_warnings_or_spills(tmp_path):
    """The general and persistent forms' kernels for sm_80, 86 and 90 in one translation unit; each sm_90a form's
    for sm_90a in one of its own (its tensor-map types come from cuda.h, which a namespace would enclose), with no
    ptxas note that it serialised or patched the wgmma (C75xx). The first unit, which holds int8_row_residual's
    program_cu, is compiled in host mode (`-c`: its host code by gcc -Wall -Wextra -Werror); the sm_90a units are
    kernel_cu texts with no host code but a stub main, compiled device-only (-cubin, tests/nvcc_clean.py)."""
    general = [
        lowered("bf16_all").kernel_cu,
        lowered("int8_row_residual").program_cu,
        lowered("persistent_scales").kernel_cu,
        lowered("persistent_int8_row").kernel_cu,
        lowered("persistent_residual_gate").kernel_cu,
        lowered("persistent_int8_residual").kernel_cu,
    ]
    units = [(("sm_80", "sm_86", "sm_90"), "".join(in_namespace(text, i, "p") for i, text in enumerate(general)))]
    sm90a = ("sm90a_scales", "sm90a_residual_gate", "sm90a_int8_residual", "sm90a_residual_gelu")
    for name in (*sm90a, "sm90a_paired_residual", "sm90a_int8_requant"):
        units.append((("sm_90a",), lowered(name).kernel_cu))
    for n, (targets, text) in enumerate(units):
        src = tmp_path / f"epi_{n}_{targets[0]}.cu"
        src.write_text("".join(f"#include <{h}>\n" for h in INCLUDES) + text + "int main() { return 0; }\n")
        ccs = [t.removeprefix("sm_") for t in targets]
        run = nvcc_run(src, ccs, host=n == 0, timeout=600, extra=("--threads", "2"))
        log = run.stdout + run.stderr
        assert run.returncode == 0, log[-6000:]
        assert "warning" not in log.lower(), log[-6000:]
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
        assert spills and not any(spills), log[-3000:]
        if targets[0] == "sm_90a":
            assert not re.findall(r"\(C75\d\d\)", log), log[-3000:]
        else:  # (ptxas_entries reads the other forms' entries, by their numbered names)
            assert len(ptxas_entries(log)) == len(general) * len(targets)

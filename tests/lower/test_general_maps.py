"""Elementwise programs (`spatialc.elementwise`, no matmul) in the general CUDA form: the form `lower` picks and the
forms that refuse them; the kernel's shape, ledger and census; nvcc for sm_80/86/90 without a warning or a spill;
the host emulation against the interpreter — bit for bit for the ops the table holds exact (ulps 0), within
`spatialc.tolerance(b, kernel=True)` for the library ones — at odd shapes, several items a site, forced blocks,
fp16 / bf16 / int8 inputs and fp16 / bf16 outputs; the launcher taking a map's tensors by name; and planted faults
(a page read from the wrong ring, a page freed or published too early, a column vector read at the wrong column)
that the emulation must catch.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.inputs import operand_values
from spatialc.ir.nodes import ComputeStage, DType, TensorRole
from spatialc.lower.census import census, stage_kind
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.errors import NeedsGeneral, Unsupported
from spatialc.runtime.emulate import EmulationRace, compile_program, run_program

from ..stand_in import StandInDevice
from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="the host emulation needs g++")


def _exprs():
    x, g, z = ew.inputs(3)
    return {
        # exact ops (ulps 0): the emulation must equal the interpreter bit for bit
        "sub": ew.x(0) - ew.x(1),
        "where_max": ew.where(x > 0, ew.max(x, g), 0.5 * g),
        "clamp_cols": ew.clamp(x, lo=-1.5, hi=2.0) + ew.relu(g) * ew.col("scale") + ew.col("bias"),
        "abs_plus_one": abs(x) + 1,
        "int8_three": ew.max(x * g - z, ew.col("bias")) * 2 + 7,
        "int8_relu": ew.relu(x) * 3 - ew.min(g, -5),
        "div_sqrt": ew.div(x, ew.square(g) + 1) + ew.sqrt(abs(x)),
        # library ops (exp, tanh, erf, …): within the tolerance's bound
        "silu_gate": ew.silu(g) * x + ew.col("bias"),
        "gelu_exp": ew.gelu(x) + ew.exp(g) * ew.tanh(x) - ew.sigmoid(g),
    }


# name → (expression, m, n, precision, output, build options, exact). Odd sizes throughout (zero padding, column
# vectors padded to whole blocks); forced blocks of several tiles, several items a site (the ITEM loop, item_x > 0:
# column vectors read at an offset), round-robin items, one element.
CASES = {
    "sub/bf16": ("sub", 70, 50, "bf16", None, {"block": (2, 4, 1), "sites": 2}, True),
    "where_max/fp16-out-fp16": ("where_max", 33, 17, "fp16", "fp16", {}, True),
    "clamp_cols/bf16-out-bf16": (
        "clamp_cols",
        45,
        70,
        "bf16",
        "bf16",
        {"block": (1, 2, 1), "sites": 3, "placement": "round_robin"},
        True,
    ),
    "abs_plus_one/fp16-one-element": ("abs_plus_one", 1, 1, "fp16", None, {}, True),
    "int8_three/int8": ("int8_three", 50, 40, "int8", None, {"block": (2, 2, 1), "sites": 2}, True),
    "int8_relu/int8-out-int32": ("int8_relu", 17, 33, "int8", "int32", {"depth": 3}, True),
    "div_sqrt/fp16": ("div_sqrt", 40, 36, "fp16", None, {"block": (2, 1, 1), "sites": 2}, True),
    "silu_gate/bf16": ("silu_gate", 100, 300, "bf16", None, {"block": (2, 4, 1), "sites": 3}, False),
    "gelu_exp/fp16-out-bf16": ("gelu_exp", 40, 24, "fp16", "bf16", {"sites": 2}, False),
}


@cache
def built(name):
    expr, m, n, prec, out, kw, _ = CASES[name]
    return spatialc.build(spatialc.elementwise(_exprs()[expr], m, n, prec, out=out), "sm_90", **kw)


@cache
def lowered(name):
    return spatialc.lower(built(name))


def inputs(p, seed=0):
    """Each input of `p` (int8 over its whole range; fp16 / bf16 normal values times 3, already of their type, a few
    exact zeros) and each column vector (distinct in every column; an int8 program's near the int32 limits, so its
    sums leave int32)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.tensors:
        if t.role == TensorRole.INPUT:
            if t.dtype == DType.INT8:
                out[t.name] = rng.integers(-128, 128, t.elems).astype(np.int8)
            else:
                x = rng.standard_normal(t.elems) * 3
                x[rng.random(t.elems) < 0.05] = 0.0
                out[t.name] = operand_values(t.name, x, t.dtype)
        elif t.role == TensorRole.PARAMETER:
            n = t.elems[1]
            if t.dtype == DType.INT32:
                out[t.name] = rng.choice([-1, 1], n) * (2**31 - 1 - rng.integers(0, 5000, n))
            else:
                out[t.name] = (rng.standard_normal(n) * 4).astype(np.float32)
    return out


def emulated(names, mutate=lambda text: text, mode="late"):
    """C of each named case through the emulation (2 at once), with its inputs."""

    def one(name):
        art, ins = lowered(name), inputs(built(name), seed=len(name))
        return spatialc.emulate(dataclasses.replace(art, program_cu=mutate(art.program_cu)), ins, mode=mode), ins

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, names))


# ---- which form ------------------------------------------------------------------------------------------------


def test_auto_prints_a_map_in_the_general_form_and_says_so():
    art = spatialc.lower(built("silu_gate/bf16"))
    assert art.budget.form == "general" and art.launch.kernel_name == "spatialc_general" and art.general is None
    (note,) = [note for note in art.notes if "an elementwise map" in note]
    assert note.startswith("the general form") and "form='persistent'" in note
    assert spatialc.lower(built("silu_gate/bf16"), form="general").kernel_cu == art.kernel_cu


def test_the_sm90a_form_refuses_a_map_naming_it_and_the_fix():
    """(The persistent form prints it: tests/lower/test_persistent_pages.py.)"""
    p = built("sub/bf16")
    with pytest.raises(Unsupported, match="sm_90a only"):
        spatialc.lower(p, form="sm90a")  # built for sm_90, which has no sm_90a instructions
    hopper = spatialc.build(spatialc.elementwise(_exprs()["sub"], 70, 50, "bf16"), "sm_90a")
    with pytest.raises(NeedsGeneral, match=r"elementwise map\) in the sm_90a form: .*wgmma.*form='general'"):
        spatialc.lower(hopper, form="sm90a")
    art = spatialc.lower(hopper)
    assert art.budget.form == "general" and art.target == "sm_90a"


# ---- the kernel and its ledger -----------------------------------------------------------------------------------


def test_a_map_kernel_moves_and_maps_pages_without_tensor_cores():
    art = lowered("silu_gate/bf16")
    text = art.kernel_cu
    # Every engine on one warp of its own, in the schedule's order; no accumulator, no compute warps, no MMA.
    assert re.findall(r"\(warp < \d+\) \{  // (\w+): warps (\d+)-(\d+)", text) == [
        ("reader", "0", "0"),
        ("compute", "1", "1"),
        ("writer", "2", "2"),
    ]
    assert art.budget.engines == (("reader", 1), ("compute", 1), ("writer", 1)) and art.launch.block == 96
    for absent in ("spatialc_mma", "spatialc_acc<", "SPATIALC_TENSOR_CORE", "typedef float ACCT", "NWARP", "PERW"):
        assert absent not in text, absent
    assert "typedef __nv_bfloat16 OPT;" in text and "typedef float EPIT;" in text and "typedef float OUT_T;" in text
    # The input rings hold bf16 as loaded, the output ring the map's float values; each barrier counts one warp.
    assert "SPATIALC_DYNAMIC_RING(OPT, ring_0," in text and "SPATIALC_DYNAMIC_RING(OPT, ring_1," in text
    assert "SPATIALC_DYNAMIC_RING(EPIT, ring_2," in text
    assert set(re.findall(r"#define \w+_COUNT_\d+ (\d+)", text)) == {"32"}
    # The map: each input page's element read as a float, the column vector at the element's own column.
    assert "const float v0 = (float)SPATIALC_PAGE_LD(ring_0 + (pop_0 % DEPTH_0) * PAGE_0 + e);" in text
    assert "const float v1 = (float)SPATIALC_PAGE_LD(ring_1 + (pop_1 % DEPTH_1) * PAGE_1 + e);" in text
    assert "spatialc_silu(v1), v0), t2[(long long)(item_x * 4 + tl % 4) * 256 + el % 16]);" in text
    bud = art.budget
    assert bud.total_bytes == bud.dyn_bytes == bud.ring_bytes + bud.barrier_bytes == art.launch.dyn_smem
    assert bud.rings == (("x0_ring", 2 * 8 * 256 * 2), ("x1_ring", 2 * 8 * 256 * 2), ("out_ring", 2 * 8 * 256 * 4))
    assert art.launch.params[2].name == "bias" and art.launch.params[2].c_type == "float"


def test_an_int8_map_computes_in_long_long_and_stores_its_output_type():
    text = lowered("int8_three/int8").kernel_cu
    assert "typedef signed char OPT;" in text and "typedef long long EPIT;" in text
    assert "typedef long long OUT_T;" in text
    assert "const long long v2 = (long long)SPATIALC_PAGE_LD(ring_2 + (pop_2 % DEPTH_2) * PAGE_2 + e);" in text
    assert "(long long)t3[" in text  # the int32 column vector, widened before any arithmetic
    assert "typedef int OUT_T;" in lowered("int8_relu/int8-out-int32").kernel_cu


@pytest.mark.parametrize("name", list(CASES))
def test_the_census_counts_the_map_once(name):
    art, p = lowered(name), built(name)
    (stage,) = [s for s in p.stages if isinstance(s.kind, ComputeStage)]
    assert art.census.agrees, art.census
    assert art.census.stages == {stage_kind(stage.kind.op): 1} == art.census.printed_stages


def test_the_census_tells_a_map_printed_twice():
    art = lowered("sub/bf16")
    line = next(x for x in art.kernel_cu.split("\n") if "// op:Compute:Map_" in x)
    twice = art.kernel_cu.replace(line, f"{line}\n{line}")
    programs = [prog.ops for prog in built("sub/bf16").schedule.programs[:3]]
    assert census(programs, art.kernel_cu).agrees and not census(programs, twice).agrees


def test_the_plan_of_a_map_is_a_block_its_general_form_holds():
    """The map planner asks the general form what a block costs (`general.map_resources`): its choice is never
    refused for shared memory, and the ledger is what it was told — on every target, for int8 (whose output ring
    holds int64 values) and bf16, two and three pages deep."""
    for tgt in ("sm_80", "sm_86", "sm_90"):
        for prec in ("int8", "bf16"):
            for depth in (None, 3):
                p = spatialc.build(spatialc.elementwise(ew.relu(ew.x(0)) + 1, 4096, 4096, prec), tgt, depth=depth)
                art = spatialc.lower(p)
                plan = p.plans[0]
                smem, per_sm = general.map_resources(spatialc.target(tgt), plan, p.precision, 1)
                assert (art.budget.total_bytes, art.budget.blocks_per_sm) == (smem, per_sm) and per_sm >= 1


def test_the_bench_program_reports_bytes_moved():
    art = lowered("silu_gate/bf16")
    moved = 2 * 100 * 300 * 2 + 300 * 4 + 100 * 300 * 4  # x0, x1 (bf16), bias and out (float32)
    assert f"const double total = {moved}.0 * ITERS;  // bytes moved" in art.bench_cu
    assert 'printf("GBPS %.1f\\n", total / ((double)ms * 1e6));' in art.bench_cu


@pytest.mark.emulation
@needs_gxx
def test_the_bench_program_runs_and_prints_gbps():
    run = run_program(compile_program(lowered("sub/bf16").bench_cu, "early"), {}, 60)
    assert re.fullmatch(r"GBPS \d+(\.\d)?\n", run.stdout), run.stdout


# ---- nvcc -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nvcc_run(tmp_path_factory):
    """Every case's kernel_cu, and an int8 and a float program_cu / bench_cu, in one translation unit compiled for
    sm_80, sm_86 and sm_90 (`-c`: the host code by gcc -Wall -Wextra -Werror too). The two cases with a program_cu
    and a bench_cu have no kernel_cu of their own there: both texts begin with it as printed."""
    d = tmp_path_factory.mktemp("nvcc_maps")
    hosts = ("int8_three/int8", "silu_gate/bf16")
    texts = [(name, "p", lowered(name).kernel_cu) for name in CASES if name not in hosts]
    for name in hosts:
        art = lowered(name)
        assert art.program_cu.startswith(art.kernel_cu) and art.bench_cu.startswith(art.kernel_cu)
        texts += [(name, "p", art.program_cu), (name, "b", art.bench_cu)]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    parts += [in_namespace(text, i, kind) for i, (_, kind, text) in enumerate(texts)]
    (d / "maps.cu").write_text("".join(parts) + "int main() { return 0; }\n")
    archs = [g for t in ("sm_80", "sm_86", "sm_90") for g in gencode(t)]
    cmd = [NVCC, "-c", "--threads", "2", "-o", str(d / "maps.o"), str(d / "maps.cu"), *archs, *FLAGS]
    return texts, subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_map_kernel_compiles_for_sm80_86_90_without_warnings_or_spills(nvcc_run):
    texts, run = nvcc_run
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert len(entries) == 3 * len(texts)
    for case, kind, arch, spill, smem in entries:
        assert spill == 0, f"{texts[case][0]} ({kind}, {arch}) spills {spill} bytes"
        assert smem == 0, f"{texts[case][0]} ({arch}): {smem} bytes of static shared memory; all of it is dynamic"


# ---- the host emulation against the interpreter ------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs():
    """Every case through the emulation in both modes: (name, mode) → (C, the inputs)."""
    if GXX is None:
        pytest.skip("g++ is not installed")
    names = list(CASES)
    out = {}
    for mode in ("late", "early"):
        out.update({(n, mode): r for n, r in zip(names, emulated(names, mode=mode), strict=True)})
    return out


@pytest.mark.emulation
def test_exact_maps_equal_the_interpreter_bit_for_bit(runs):
    for (name, mode), (c, ins) in runs.items():
        if not CASES[name][-1]:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the inputs are of their types already: nothing is rounded on the way
            want = np.asarray(spatialc.evaluate(built(name), ins))
        assert c.dtype == want.dtype and c.shape == want.shape, (name, mode)
        assert np.array_equal(c, want), (name, mode)


@pytest.mark.emulation
def test_library_maps_lie_within_the_kernel_tolerance(runs):
    for (name, mode), (c, ins) in runs.items():
        want = np.asarray(spatialc.evaluate(built(name), ins))
        ok, how = spatialc.tolerance(built(name), kernel=True).check(c, ins)
        assert ok and c.dtype == want.dtype, (name, mode, how)


@pytest.mark.emulation
def test_the_data_exercise_what_they_should(runs):
    """Outputs that vary, int8 values beyond int32 (an int32 map would have wrapped them), both branches of the
    comparison, values clamped at both bounds."""
    c8, _ = runs[("int8_three/int8", "late")]
    assert np.abs(c8).max() > 2**31 and len(np.unique(c8)) > 100
    x = runs[("where_max/fp16-out-fp16", "late")][1]["x0"]
    assert (x > 0).any() and (x < 0).any()
    x = runs[("clamp_cols/bf16-out-bf16", "late")][1]["x0"]
    assert (x < -1.5).any() and (x > 2.0).any()


# ---- the launcher takes a map's tensors by name ------------------------------------------------------------------


def sevens(dev, args):
    """A stand-in kernel that writes 7 into every element of its output."""
    next(buf for a, buf in dev.tensors(args).values() if a.role == "output")[:] = 7


def test_run_and_emulate_take_a_maps_inputs_by_name():
    from spatialc.runtime import launch as L
    from spatialc.runtime.tilize import bf16_to_float32, untilize

    art, p = lowered("silu_gate/bf16"), built("silu_gate/bf16")
    ins = inputs(p)
    params = L.kernel_args(art.launch)
    assert [(a.name, a.role, a.elem) for a in params] == [
        ("x0", "input", "bfloat16"),
        ("x1", "input", "bfloat16"),
        ("bias", "parameter", "float32"),
        ("out", "output", "float32"),
    ]
    for how in ("position", "name"):
        dev = StandInDevice(art, sevens)  # it keeps what each argument was given
        if how == "position":
            c = L.run_with(dev, art, ins["x0"], ins["x1"], bias=ins["bias"])
        else:
            c = L.run_with(dev, art, bias=ins["bias"], x1=ins["x1"], x0=ins["x0"])
        assert c.shape == (100, 300) and (c == 7).all()
        for arg, given in zip(params[:3], dev.launches[-1][4], strict=False):
            full = (arg.tiles[0] * 16, arg.tiles[1] * 16)
            got = untilize(given, arg.tiles, full, np)[: arg.elems[0], : arg.elems[1]]
            got = bf16_to_float32(got, np) if arg.storage == "uint16" else got
            assert np.array_equal(got.reshape(-1), np.asarray(ins[arg.name], np.float32).reshape(-1)), (how, arg.name)
    with pytest.raises(spatialc.InputError, match="x1"):
        L.run_with(StandInDevice(art, sevens), art, ins["x0"], bias=ins["bias"])
    with pytest.raises(spatialc.InputError, match="x1"):
        spatialc.emulate(art, {"x0": ins["x0"], "bias": ins["bias"]})


def test_the_cli_runs_a_saved_map_on_a_gpu_passing_every_tensor_by_name(tmp_path, monkeypatch, capsys):
    """`spatialc run` of a saved map: the GPU is a stand-in, and spatialc.run gets x0, x1 and bias by name (it took
    A and B by position before, which a map has not)."""
    from spatialc import api
    from spatialc.cli import main
    from spatialc.runtime import launch as L

    p = built("silu_gate/bf16")
    path = tmp_path / "map.json"
    path.write_text(spatialc.to_json(p))

    class Cupy:  # what the CLI reads of CuPy: the device's name
        class cuda:  # noqa: N801 — CuPy's names
            class runtime:  # noqa: N801
                @staticmethod
                def getDeviceProperties(i):  # noqa: N802
                    return {"name": b"Fake GPU"}

            class Device:  # noqa: N801
                id = 0

    seen = {}

    def run(art, *operands, **named):
        assert not operands and art.launch.kernel_name == "spatialc_general"
        seen.update(named)
        return spatialc.evaluate(p, named)

    monkeypatch.setattr(L, "cupy_device", lambda: types.SimpleNamespace(cp=Cupy))
    monkeypatch.setattr(api, "run", run)
    assert main(["run", str(path)]) == 0
    assert sorted(seen) == ["bias", "x0", "x1"]
    assert "on the GPU (Fake GPU): C equals" in capsys.readouterr().out


# ---- planted faults the emulation must catch ---------------------------------------------------------------------


def _planted(text, old, new, count=1):
    assert text.count(old) == count, (old, text.count(old))
    return text.replace(old, new)


@pytest.mark.emulation
@needs_gxx
def test_a_page_read_from_the_wrong_input_ring_is_caught():
    """x0 − x1 with its second page read from x0's ring: x0 − x0, which the interpreter tells from x0 − x1."""
    right = "ring_1 + (pop_1 % DEPTH_1) * PAGE_1 + e);"

    def wrong_ring(text):
        return _planted(
            text,
            f"const float v1 = (float)SPATIALC_PAGE_LD({right}",
            "const float v1 = (float)SPATIALC_PAGE_LD(ring_0 + (pop_0 % DEPTH_0) * PAGE_0 + e);",
        )

    ((c, ins),) = emulated(["sub/bf16"], wrong_ring)
    want = spatialc.evaluate(built("sub/bf16"), ins)
    assert not np.array_equal(c, want) and np.array_equal(c, np.zeros_like(c))


@pytest.mark.emulation
@needs_gxx
def test_a_column_vector_read_at_the_wrong_column_is_caught():
    """The bias indexed by the element's row in its tile (el / 16) where it must be its column (el % 16)."""

    def by_row(text):
        return _planted(text, " * 256 + el % 16]);", " * 256 + el / 16]);")

    ((c, ins),) = emulated(["silu_gate/bf16"], by_row)
    ok, how = spatialc.tolerance(built("silu_gate/bf16"), kernel=True).check(c, ins)
    assert not ok, how


@pytest.mark.emulation
@needs_gxx
@pytest.mark.parametrize("mode", ["late", "early"])
def test_a_page_freed_before_the_map_reads_it_is_a_race(mode):
    """The compute engine frees x0's page (arrives on its empty barrier) before the map reads it: the reader may
    refill the slot under the map's reads — a race the emulation reports, whatever the timing."""

    def early_pop(text):
        pop = "spatialc_mbar_arrive(&empty_0[pop_0 % DEPTH_0]); ++pop_0;  // op:Pop"
        text = _planted(text, pop, "++pop_0;  // op:Pop (its arrival moved before the map)")
        reserve = "++rsv_2;  // op:Reserve"
        return _planted(text, reserve, f"{reserve}\nspatialc_mbar_arrive(&empty_0[pop_0 % DEPTH_0]);")

    with pytest.raises(EmulationRace, match="ring_0"):
        emulated(["silu_gate/bf16"], early_pop, mode=mode)


@pytest.mark.emulation
@needs_gxx
def test_an_output_page_published_before_the_map_writes_it_is_a_race():
    """The compute engine pushes the output page before the map stores into it: the writer reads it meanwhile."""

    def early_push(text):
        push = "spatialc_mbar_arrive(&full_2[psh_2 % DEPTH_2]); ++psh_2;  // op:Push"
        text = _planted(text, push, "// op:Push (moved before the map)")
        reserve = "++rsv_2;  // op:Reserve"
        return _planted(text, reserve, f"{reserve}\n{push.replace('  // op:Push', '')}")

    with pytest.raises(EmulationRace, match="ring_2"):
        emulated(["silu_gate/bf16"], early_push)


def test_a_map_ring_laid_out_other_than_by_rows_is_refused():
    # Found by the mutation suite's layout edits: a swizzled input ring verifies (rule 3 orders tiles, not elements),
    # and the map, reading element e of a page at e, would read the swizzled halves of every tile's rows.
    from spatialc.ir.nodes import PageLayout

    x, g = ew.inputs(2)
    p = spatialc.build(spatialc.elementwise(x * g, 32, 48, "fp16"), "sm_90")
    ring = next(b for b in p.buffers if b.name == "x0_ring")
    swizzled = dataclasses.replace(ring, kind=dataclasses.replace(ring.kind, layout=PageLayout.SWIZZLED))
    q = spatialc.verify(p.evolve(buffers=tuple(swizzled if b is ring else b for b in p.buffers)))
    with pytest.raises(Unsupported, match="ring x0_ring laid out swizzled.*lay the ring out by rows"):
        spatialc.lower(q)

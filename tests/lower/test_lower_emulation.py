"""Lowered kernels run through the host emulation (runtime/emulate.py) equal numpy; and the emulation fails them
when a barrier or a wait count the lowering prints is planted wrong, so those statements are shown to matter."""

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import spatialc
from spatialc.frontend import relu
from spatialc.lower.cuda.persistent.kernel import lower
from spatialc.lower.cuda.persistent.printer import POP_PROOF
from spatialc.runtime.emulate import EmulationRace, emulate_source

pytestmark = [pytest.mark.emulation, pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")]

# (m, n, k, precision, target, build options, modes)
CASES = {
    "fused_round_robin_uneven": (
        70,
        90,
        50,
        "int8",
        "sm_86",
        {"block": (2, 4, 2), "sites": 3, "placement": "round_robin"},
        ("late", "early"),
    ),
    "strided_sub_blocks_spare_sites": (
        50,
        40,
        30,
        "fp16",
        "sm_80",
        {"block": (1, 2, 1), "sub_blocks": (2, 1), "sites": 40},
        ("late",),
    ),
    "dynamic_rings": (64, 64, 64, "bf16", "sm_90", {"block": (4, 4, 4), "depth": 4, "sites": 1}, ("early",)),
}


def inputs(m, n, k, prec, seed=1):
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 128) if prec == "int8" else (-8, 8)  # small integers: exact in fp16, bf16 and fp32 sums
    return rng.integers(lo, hi, (m, k)), rng.integers(lo, hi, (k, n))


def run(text, a, b, mode, integer):
    return emulate_source(
        text, {"a.txt": a, "b.txt": b}, (a.shape[0], b.shape[1]), np.int64 if integer else np.float32, mode=mode
    )


def test_lowered_kernels_equal_numpy_in_the_emulation():
    jobs = []
    for name, (m, n, k, prec, tgt, kw, modes) in CASES.items():
        art = lower(spatialc.build(spatialc.gemm(m, n, k, prec), tgt, **kw), spatialc.target(tgt))
        a, b = inputs(m, n, k, prec)
        jobs += [(name, mode, art.program_cu, a, b, prec == "int8") for mode in modes]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda j: run(j[2], j[3], j[4], j[1], j[5]), jobs))
    for (name, mode, _, a, b, _), c in zip(jobs, outs, strict=True):
        assert np.array_equal(c, a @ b), f"{name} ({mode}) differs from numpy"


def test_the_printed_barriers_and_wait_counts_are_needed():
    # Depth 2: the slot refilled one step ahead is the one read the step before; the step's one barrier (after its
    # waits) is what lets the refill go out, and its wait must leave nothing in flight.
    art = lower(
        spatialc.build(spatialc.gemm(48, 64, 96, "fp16"), "sm_86", block=(2, 4, 1), sites=2, depth=2),
        spatialc.target("sm_86"),
    )
    a, b = inputs(48, 64, 96, "fp16")
    text = art.program_cu
    wait_barrier = "            __syncthreads();  // op:Wait\n"
    assert text.count(wait_barrier) == 1  # the K loop's: the fused output has no ring to wait on
    no_wait_barrier = text.replace(wait_barrier, "")
    short_wait = text.replace(
        "__pipeline_wait_prior(0);  // op:Wait\n            __syncthreads",
        "__pipeline_wait_prior(1);  // op:Wait\n            __syncthreads",
    )
    assert no_wait_barrier != text and short_wait != text
    with ThreadPoolExecutor(2) as pool:
        race = pool.submit(run, no_wait_barrier, a, b, "early", False)
        # A wait that leaves step k's copies in flight: they land (late mode) at the next wait, onto the page
        # warps are reading.
        late = pool.submit(run, short_wait, a, b, "late", False)
        for result in (race, late):
            with pytest.raises(EmulationRace, match="RACE on shared ring .ring_[01]."):
                result.result()


# Rings three and four deep: the K loop's pops print no barrier (persistent.order.barrier_free_pops), and the
# emulation, in both modes, still equals the interpreter with its race check silent. (m, n, k, precision, target,
# options)
DEEP = {
    "one_tile_output_ring_d3": (48, 48, 80, "int8", "sm_86", {"block": (1, 1, 1), "depth": 3, "sites": 4}),
    "fused_relu_round_robin_d4": (
        64,
        96,
        96,
        "int8",
        "sm_86",
        {"block": (2, 2, 1), "depth": 4, "sites": 4, "placement": "round_robin", "epilogue": [relu()]},
    ),
    "sub_blocks_d3": (64, 64, 64, "fp16", "sm_86", {"block": (1, 2, 1), "sub_blocks": (2, 1), "depth": 3}),
    "eight_warps_sm90_d3": (128, 128, 96, "fp16", "sm_90", {"block": (4, 4, 1), "depth": 3, "sites": 2}),
    "eight_warps_sm90_d4_wide_k": (64, 128, 128, "bf16", "sm_90", {"block": (2, 4, 2), "depth": 4}),
}


def test_rings_three_and_four_deep_need_no_pop_barrier_in_the_emulation():
    jobs = []
    for name, (m, n, k, prec, tgt, kw) in DEEP.items():
        options = {key: v for key, v in kw.items() if key != "epilogue"}
        program = spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=kw.get("epilogue", ())), tgt, **options)
        art = lower(program, spatialc.target(tgt))
        assert POP_PROOF in art.kernel_cu and art.census.agrees, name
        a, b = inputs(m, n, k, prec, seed=len(name))
        dtype = np.int8 if prec == "int8" else np.float64
        x = {"A": a.astype(dtype), "B": b.astype(dtype)}
        jobs += [(name, mode, program, art, x) for mode in ("late", "early")]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda j: spatialc.emulate(j[3], j[4], mode=j[1]), jobs))  # EmulationRace on a race
    for (name, mode, program, _, x), c in zip(jobs, outs, strict=True):
        assert np.array_equal(c, spatialc.evaluate(program, x)), f"{name} ({mode}) differs from the interpreter"

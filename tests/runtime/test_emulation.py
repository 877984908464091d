"""The host emulation itself, on hand-written programs (tests/emu_fixtures): each behaviour the emitted kernels
rely on, and each failure it must report — before any lowering is involved."""

from __future__ import annotations

import resource
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from spatialc.errors import SpatialError
from spatialc.runtime.emu_compile import CXX_FLAGS, HEADER_DIR
from spatialc.runtime.emulate import (
    DYN_DECL,
    DYN_HOST,
    EmulationCompileError,
    EmulationDeadlock,
    EmulationError,
    EmulationFault,
    EmulationRace,
    EmulationTimeout,
    compile_program,
    emulate_source,
    format_values,
    host_source,
    run_program,
)

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++"),
]

FIXTURES = Path(__file__).parents[1] / "emu_fixtures"
PROBE = (FIXTURES / "probe.cu").read_text()
GEMM = (FIXTURES / "wmma_ring_gemm.cu").read_text()
POISON = int(np.frombuffer(b"\xcd" * 4, dtype=np.int32)[0])  # what fresh shared memory holds
BOTH = pytest.mark.parametrize("mode", ["late", "early"])


def probe(case: str, mode: str, timeout: float = 60.0, **files: np.ndarray) -> str:
    texts = {"case.txt": case + "\n", **{f"{name}.txt": format_values(v) for name, v in files.items()}}
    return run_program(compile_program(PROBE, mode), texts, timeout).stdout


def ints(text: str) -> np.ndarray:
    return np.array(text.split(), dtype=np.int64)


# ---- the rewrite ---------------------------------------------------------------------------------------------------


def test_rewrite_touches_only_the_launches_and_the_dynamic_declaration():
    text = "\n".join(
        [
            "__global__ void k(int* p) {",
            f"    {DYN_DECL}",
            "    int x = a >> 2 << 1;",
            "}",
            "k<<<GRID, NTHREAD, DYN_SMEM>>>(d0, d1);",
            "    k<<<3, 128>>>(d0);",
        ]
    )
    out = host_source(text).split("\n")
    assert out == [
        "__global__ void k(int* p) {",
        f"    {DYN_HOST}",
        "    int x = a >> 2 << 1;",
        "}",
        "::spatialc_emu::launch(k, GRID, NTHREAD, DYN_SMEM)(d0, d1);",
        "    ::spatialc_emu::launch(k, 3, 128)(d0);",
    ]


def test_rewrite_refuses_a_launch_it_cannot_read():
    with pytest.raises(EmulationFault, match="line 2: a kernel launch"):
        host_source("int main() {\n  k<float><<<1, 32>>>(p);\n}")


def test_text_g_plus_plus_refuses_is_a_compile_error_naming_the_line():
    text = PROBE.replace("out[tid] = 1;\n}", "out[tid] = undeclared_name;\n}", 1)
    line = text[: text.index("undeclared_name")].count("\n") + 1
    with pytest.raises(EmulationCompileError, match=rf"program.cpp:{line}:\d+: error: .*undeclared_name"):
        compile_program(text, "late")


def test_errors_are_spatial_errors():
    assert issubclass(EmulationRace, EmulationError) and issubclass(EmulationError, SpatialError)


# ---- a whole persistent kernel -------------------------------------------------------------------------------------


@BOTH
def test_fixture_gemm_equals_numpy(mode):
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, (64, 64))
    b = rng.integers(-128, 128, (64, 64))
    c = emulate_source(GEMM, {"a.txt": a, "b.txt": b}, (64, 64), np.int64, mode=mode)
    np.testing.assert_array_equal(c, a @ b)


# ---- threads and barriers ------------------------------------------------------------------------------------------


@BOTH
def test_threads_that_return_leave_the_barriers(mode):
    # Odd warps return first, half of warp 0 after one barrier; the rest pass three more barriers (in each of 2 blocks).
    done = ints(probe("exit", mode))
    expect = np.zeros(128, dtype=np.int64)
    expect[0:16] = 1
    expect[64:96] = 1
    np.testing.assert_array_equal(done, expect)


@BOTH
def test_copies_in_flight_land_when_their_thread_returns(mode):
    np.testing.assert_array_equal(ints(probe("exit_inflight", mode)), [11, 12, 13, 14])


def test_late_copies_land_at_the_wait_that_covers_them():
    # read before any wait; after wait_prior(1) (first group only); after wait_prior(0)
    np.testing.assert_array_equal(ints(probe("landing", "late")), [POISON, 11, POISON, 21])


def test_one_binary_serves_both_modes_each_by_its_own_name_and_the_environment_cannot_name_a_third(monkeypatch):
    """g++ runs once for a kernel text; the mode is the name's (`binary_mode`), read by the emulator from
    SPATIALC_EMU_MODE when it starts — run by hand with another name there, it stops with one line."""
    import os
    import subprocess

    late, early = compile_program(PROBE, "late"), compile_program(PROBE, "early")
    assert late != early and os.path.samefile(late, early)
    assert ints(probe("landing", "late")).tolist() != ints(probe("landing", "early")).tolist()
    env = dict(os.environ, SPATIALC_EMU_MODE="eager")
    done = subprocess.run([str(late)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 89  # the emulator's misuse status (emu_core.h), not the host code's 1 or 2
    assert done.stderr.strip() == "spatialc-emu: SPATIALC_EMU_MODE is 'eager'; use late or early"
    monkeypatch.setenv("SPATIALC_EMU_MODE", "eager")
    with pytest.raises(EmulationFault, match="SPATIALC_EMU_MODE is 'eager'"):  # a binary of no mode's name
        run_program(late.with_name(late.stem), {"case.txt": "landing\n"}, 60)


def test_early_copies_land_when_issued():
    np.testing.assert_array_equal(ints(probe("landing", "early")), [11, 11, 21, 21])


# ---- WMMA ----------------------------------------------------------------------------------------------------------


@BOTH
def test_fragment_store_writes_each_element_from_its_owner_lane(mode):
    # PTX ISA, mma.m16n8k16 accumulator: in each 16×8 half, lane l holds rows l/4 and l/4+8, columns 2(l%4)+{0,1}.
    owner = np.array([(r % 8) * 4 + (c % 8) // 2 for r in range(16) for c in range(16)])
    np.testing.assert_array_equal(ints(probe("layout", mode)), owner)


def test_late_fragment_store_is_invisible_until_the_warp_barrier():
    assert (ints(probe("layout_nosync", "late")) == POISON).all()


@BOTH
@pytest.mark.parametrize("precision", ["int8", "fp16", "bf16"])
def test_mma_accumulates_products(mode, precision):
    rng = np.random.default_rng(3)
    if precision == "int8":
        a, b = rng.integers(-128, 128, (16, 16)), rng.integers(-128, 128, (16, 16))
    else:  # small integers: exact in the operand type and in an fp32 sum
        a, b = rng.integers(-8, 9, (16, 16)).astype(float), rng.integers(-8, 9, (16, 16)).astype(float)
    c = np.array(probe(f"mma_{precision}", mode, a=a, b=b).split(), dtype=np.float64).reshape(16, 16)
    np.testing.assert_array_equal(c, 2 * (a @ b))


def test_fp16_mma_rounds_operands_like_the_gpu():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(16, 16)), rng.normal(size=(16, 16))
    c = np.array(probe("mma_fp16", "late", a=a, b=b).split(), dtype=np.float64).reshape(16, 16)
    a16, b16 = a.astype(np.float16).astype(np.float64), b.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(c, 2 * (a16 @ b16), rtol=0, atol=1e-4)  # only the fp32 sum differs


# ---- conversions ---------------------------------------------------------------------------------------------------


def _bf16_bits_of_float32(x: np.ndarray) -> np.ndarray:
    """bf16 round-to-nearest-even of float32 values, by the usual bit arithmetic (finite values)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.int64)


def test_half_and_bfloat16_round_to_nearest_even_directly_from_double():
    rng = np.random.default_rng(5)
    tricky = [1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-8 + 2.0**-40]  # above the midpoint as doubles, ties as floats
    tricky += [1 + 2.0**-11, 1 + 3 * 2.0**-11]  # exact ties: to even
    tricky += [65519.0, 65520.0, 1e6, -1e6]  # half's overflow threshold
    tricky += [2.0**-24, 2.0**-25, 3 * 2.0**-26, 1e-10, -0.0, 0.0]  # half's subnormals and underflow
    tricky += [3.0e38, 1e-40]  # bf16 near overflow, subnormal
    values = np.concatenate([tricky, rng.normal(size=64) * 10.0 ** rng.integers(-8, 8, 64)])
    out = probe("convert", "late", a=values, n=np.array([len(values)])).split("\n")
    rows = [line.split() for line in out if line]
    h_bits, bf_bits, hf_bits = (np.array([int(r[i]) for r in rows]) for i in range(3))
    with np.errstate(over="ignore"):
        as_half = values.astype(np.float16)  # numpy rounds double→half once
    np.testing.assert_array_equal(h_bits, as_half.view(np.uint16))
    np.testing.assert_array_equal([float(r[3]) for r in rows], as_half.astype(np.float64))
    assert h_bits[0] == 0x3C01 and hf_bits[0] == 0x3C00  # one rounding from double; two through float
    assert bf_bits[1] == 0x3F81  # 1 + 2^-7, not the tie-to-even 1.0 that rounding through float gives
    exact_in_float = values.astype(np.float32).astype(np.float64) == values
    finite = np.abs(values) < 3.0e38
    plain = exact_in_float & finite
    np.testing.assert_array_equal(bf_bits[plain], _bf16_bits_of_float32(values)[plain])
    assert bf_bits[len(tricky) - 2] == 0x7F62  # 3.0e38 → 0x7f62 (3.0008e38)


# ---- what the emulation reports ------------------------------------------------------------------------------------


@BOTH
def test_a_missing_barrier_is_a_race_naming_ring_slot_and_threads(mode):
    with pytest.raises(EmulationRace) as e:
        probe("race0", mode)
    msg = str(e.value)
    assert "RACE on shared ring 'race_ring' slot 1" in msg
    assert "a cp.async landing by thread" in msg and "a fragment load (load_matrix_sync) by thread" in msg
    assert e.value.status == 86


@BOTH
def test_the_barrier_removes_the_race(mode):
    out = ints(probe("race1", mode)).reshape(16, 16)
    g = (np.arange(256) % 7 - 3).reshape(16, 16)
    np.testing.assert_array_equal(out, g @ g)


@BOTH
def test_two_copies_to_the_same_bytes_race(mode):
    with pytest.raises(EmulationRace, match=r"slot 0 .*cp.async landing by thread \d.*cp.async landing by thread \d"):
        probe("race2", mode)


def test_a_refill_issued_while_the_page_is_read_races_when_it_lands_early():
    with pytest.raises(EmulationRace, match="slot 1"):
        probe("race3", "early")
    assert len(ints(probe("race3", "late"))) == 256  # landing at its wait, after the barrier: no race


def test_a_barrier_that_can_never_complete_is_a_deadlock():
    with pytest.raises(EmulationDeadlock) as e:
        probe("deadlock", "late")
    msg = str(e.value)
    assert "DEADLOCK in block 0" in msg
    assert "16 threads (0-15) __syncwarp()" in msg and "112 threads (16-127) __syncthreads()" in msg


def test_a_thread_that_never_arrives_ends_in_a_timeout():
    with pytest.raises(EmulationTimeout, match=r"TIMEOUT: no progress for 1\.0 s.*1 thread \(0\) running"):
        probe("spin", "late", timeout=2)  # stops making progress after half the wall-clock limit


def hang(case: str, timeout: float, report: str) -> tuple[float, float]:
    """Run probe `case`, which waits until the watchdog ends it with a timeout whose message matches `report`: the
    run's wall-clock seconds and the emulated process's CPU seconds (user and system)."""
    binary = compile_program(PROBE, "late")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with pytest.raises(EmulationTimeout, match=report):
        run_program(binary, {"case.txt": case + "\n"}, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def test_threads_that_all_wait_for_what_never_comes_leave_the_core_idle_until_the_timeout():
    """The CUDA threads run as fibers on one OS thread; when a whole round finds every one still waiting, nothing in
    the process can wake them, and the scheduler sleeps between rounds: a hang holds no core until the watchdog ends
    it (a scheduler that kept trying would use a core's whole second here)."""
    wall, cpu = hang("grid_hang", 2, r"no progress for 1\.0 s.*64 threads \(0-63\) waits for the count")
    assert wall >= 1.0 and cpu < 0.3 * wall, (wall, cpu)


def test_thousands_of_waiting_threads_cost_the_scheduler_no_switch_while_their_word_stays():
    """Every thread of a cooperative launch of 16384 waits for what never comes. The scheduler looks at each fiber's
    word without switching to it, and sleeps longer each idle round: the hang costs little more than starting the
    fibers (switching to every fiber each round, then a millisecond's sleep, held 90% of a core)."""
    wall, cpu = hang("grid_hang_coop", 4, r"no progress for 2\.0 s.*Threads of block 15: 1024 threads")
    assert wall >= 2.0 and cpu < 0.4 * wall, (wall, cpu)


# A header-only program of two translation units, each including the whole emulator (its functions inline).
TWO_UNITS = (
    r"""
#include <cstdio>
int helper();
__global__ void k_one(int* out) { __syncthreads(); out[threadIdx.x] = (int)threadIdx.x + 1; }
int main() {
    int* d = nullptr;
    if (cudaMalloc(&d, 64 * sizeof(int)) != cudaSuccess) return 1;
    ::spatialc_emu::launch(k_one, 1, 64)(d);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    int h[64];
    if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    printf("%d %d %d\n", h[0], h[63], helper());
    return 0;
}
""",
    r"""
__global__ void k_two(int* out) { __syncthreads(); out[threadIdx.x] = 7; }
int helper() {
    int* d = nullptr;
    if (cudaMalloc(&d, 32 * sizeof(int)) != cudaSuccess) return -1;
    ::spatialc_emu::launch(k_two, 1, 32)(d);
    if (cudaDeviceSynchronize() != cudaSuccess) return -1;
    int h[32];
    if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
    return h[31];
}
""",
)


def compile_units(tmp_path: Path, name: str, texts: list[str], extra: list[str]) -> Path:
    """`texts` compiled header-only (`extra` added to the runner's flags), each a translation unit, at once, and
    linked into one program."""
    gxx = shutil.which("g++") or "g++"
    flags = [*CXX_FLAGS, *extra, "-I", str(HEADER_DIR), "-include", "cuda_emu.h"]
    units = []
    for i, text in enumerate(texts):
        src, obj = tmp_path / f"{name}{i}.cpp", tmp_path / f"{name}{i}.o"
        src.write_text(text)
        cmd = [gxx, *flags, "-x", "c++", "-c", str(src), "-o", str(obj)]
        units.append((obj, subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)))
    for _, proc in units:
        _, err = proc.communicate()
        assert proc.returncode == 0, err[-3000:]
    exe = tmp_path / name
    done = subprocess.run(
        [gxx, *CXX_FLAGS, *(str(obj) for obj, _ in units), "-o", str(exe)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return exe


def test_the_portable_fibers_in_a_header_only_build_run_as_the_runners_build_does(tmp_path):
    """Fibers switch by a few lines of assembly on x86-64 and AArch64, by ucontext elsewhere; and a program may
    include the emulator header-only instead of linking the runner's object, in each of its translation units. Both,
    forced here, agree with the runner's build on barriers, copies landing and exits, and report a deadlock alike."""
    exe = compile_units(tmp_path, "probe", [host_source(PROBE), TWO_UNITS[1]], ["-DSPATIALC_EMU_FIBER_UCONTEXT"])
    for case in ("layout", "landing", "exit", "exit_inflight"):
        assert run_program(exe, {"case.txt": case + "\n"}).stdout == probe(case, "late"), case
    with pytest.raises(EmulationDeadlock, match=r"DEADLOCK in block 0.*16 threads \(0-15\) __syncwarp\(\)"):
        run_program(exe, {"case.txt": "deadlock\n"})


def test_a_header_only_program_of_two_translation_units_links_the_fibers_switch_once(tmp_path):
    """The emulator's functions are inline in a header-only build, so that every translation unit of a program may
    include it: the fibers' switch and entry, in assembly, link once from two units as well (the portable fibers'
    test above does the same for the ucontext entry)."""
    exe = compile_units(tmp_path, "two", list(TWO_UNITS), [])
    assert run_program(exe, {}).stdout.split() == ["1", "64", "7"]


def test_a_ring_past_the_dynamic_block_is_refused():
    with pytest.raises(EmulationFault, match=r"'dyn_ring' needs bytes \[0, 2048\) .* gave 1024 bytes"):
        probe("dyn_short", "late")


def test_a_fragment_pointer_must_be_256_bit_aligned():
    with pytest.raises(EmulationFault, match="pointer into shared ring 'odd_ring' at byte 16 of the ring, not 256-bit"):
        probe("misaligned", "late")


def test_big_dynamic_shared_memory_needs_the_attribute():
    with pytest.raises(EmulationFault, match=r"a CUDA error: .*65536 bytes of dynamic shared memory, but only 49152"):
        probe("optin_missing", "late")
    np.testing.assert_array_equal(ints(probe("optin_set", "late")), np.arange(64))


def test_static_and_dynamic_shared_memory_past_48k_need_the_attribute():
    with pytest.raises(EmulationFault, match="16384 bytes of dynamic shared memory, but only 8192"):
        probe("static_dyn_missing", "late")
    np.testing.assert_array_equal(ints(probe("static_dyn_set", "late")), np.arange(64))


def test_the_earlier_16_byte_dynamic_declaration_is_still_rewritten():
    from spatialc.runtime.emulate import DYN_DECLS, host_source

    old = "extern __shared__ __align__(16) char spatialc_dyn_smem[];"
    assert old in DYN_DECLS and old != DYN_DECL
    for decl in DYN_DECLS:
        text = host_source(f"__global__ void k() {{\n    {decl}\n}}\n")
        assert decl not in text and "spatialc_dyn_smem" in text


# A CUDA thread's leftovers in the emulator's thread-local state (an accumulator written by an ordinary instruction,
# wgmma groups never waited for): the emulator runs each block's threads as the fibers, on the stacks, of the block
# before it, and every thread must start as a fresh one would (emu_runtime.h, run_job).
FRESH = r"""
#include <cstdio>
__global__ void k_fresh(int* out) {
    out[blockIdx.x * 2] = spatialc_emu::acc_written ? 1 : 0;
    out[blockIdx.x * 2 + 1] = (int)(spatialc_emu::wgmma_open.size() + spatialc_emu::wgmma_groups.size());
    spatialc_emu::acc_written = true;
    spatialc_emu::wgmma_open.push_back([] {});
    spatialc_emu::wgmma_groups.push_back({[] {}});
}
int main() {
    int* d = nullptr;
    if (cudaMalloc(&d, 8 * sizeof(int)) != cudaSuccess) return 1;
    if (cudaMemset(d, 0x7f, 8 * sizeof(int)) != cudaSuccess) return 1;
    k_fresh<<<4, 1>>>(d);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    int h[8];
    if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    for (int i = 0; i < 8; ++i) printf("%d ", h[i]);
    printf("\n");
    return 0;
}
"""


def test_each_block_starts_from_a_fresh_threads_state_though_its_os_thread_ran_the_block_before():
    assert ints(run_program(compile_program(FRESH), {}, 60).stdout).tolist() == [0] * 8

"""The emulated wgmma's reports and values, now that its body is the runtime object's (emu_hopper_run.h): a kernel
text calls spatialc_wgmma / _kb with N, an element-type enum and B's layout, and the object runs them. Each misuse is
reported with the words and exit status the header's templates gave, in both modes; 16-bit (f16, then bf16, in two
groups retired by wait_group 1 and 0), int8 and 8-bit float wgmmas give the sums the header-only templates gave
(computed by the emulator before its wgmma moved)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from spatialc.runtime.emu_compile import compile_program

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++"),
]

PROGRAM = r"""#include <cstdio>
#include <cstdlib>
__global__ void k(int which, float* out) {
    extern __shared__ __align__(32) char spatialc_dyn_smem[];
    char* sm = spatialc_dyn_smem;
    const int t = threadIdx.x;
    __half* A = reinterpret_cast<__half*>(sm);          // 64 x 16
    __half* B = reinterpret_cast<__half*>(sm + 4096);   // 16 x 32
    signed char* A8 = reinterpret_cast<signed char*>(sm);
    signed char* B8 = reinterpret_cast<signed char*>(sm + 4096);
    if (which >= 5) {
        for (int i = t; i < 64 * 32; i += 128) A8[i] = (signed char)((i * 7) % 11 - 5);
        for (int i = t; i < 32 * 32; i += 128) B8[i] = (signed char)((i * 5) % 13 - 6);
    } else {
        for (int i = t; i < 64 * 16; i += 128) A[i] = __float2half(float((i * 7) % 11 - 5) / 4);
        for (int i = t; i < 16 * 32; i += 128) B[i] = __float2half(float((i * 5) % 13 - 6) / 8);
    }
    __syncthreads();
    if (which != 1) spatialc_fence_proxy_async();
    __syncthreads();
    unsigned long long a = spatialc_wgmma_desc(A, 128, 256, 0);
    unsigned long long b = spatialc_wgmma_desc(B, 128, 256, 0);
    if (which == 3) a |= 1ull << 49;
    if (which == 7) b = spatialc_wgmma_desc(B, 64, 1024, 3);
    float res = 0;
    if (which == 5) {
        spatialc_acc<int> d[2];
        for (auto& x : d) spatialc_acc_zero(x);
        spatialc_wgmma_fence();
        spatialc_wgmma<32, signed char, int>(d, a, b);
        spatialc_wgmma_commit();
        spatialc_wgmma_wait<0>();
        for (auto& x : d) for (int v : x.x) res += v;
    } else if (which == 6) {
        spatialc_acc<float> d[2];
        for (auto& x : d) spatialc_acc_zero(x);
        spatialc_wgmma_fence();
        spatialc_wgmma<32, __nv_fp8_e5m2, float>(d, a, b);
        spatialc_wgmma<32, __nv_fp8_e4m3, float>(d, a, b);
        spatialc_wgmma_commit();
        spatialc_wgmma_wait<0>();
        for (auto& x : d) for (float v : x.x) res += v;
    } else {
        spatialc_acc<float> d[2];
        for (auto& x : d) spatialc_acc_zero(x);
        if (which != 2) spatialc_wgmma_fence();
        if (which == 4 || which == 7) spatialc_wgmma<32, __half, float>(d, a, b);
        else spatialc_wgmma_kb<32, __half, float>(d, a, b);
        spatialc_wgmma_commit();
        spatialc_wgmma_kb<32, __nv_bfloat16, float>(d, a, b);
        spatialc_wgmma_commit();
        spatialc_wgmma_wait<1>();
        for (auto& x : d) for (float v : x.x) res += v;
        spatialc_wgmma_wait<0>();
        for (auto& x : d) for (float v : x.x) res += v;
    }
    out[blockIdx.x * 128 + t] = res;
}
int main(int argc, char** argv) {
    int which = atoi(argv[1]);
    float* d; cudaMalloc(&d, 128 * 4);
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384);
    k<<<1, 128, 16384>>>(which, d);
    cudaError_t e = cudaDeviceSynchronize();
    float h[128]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    double s = 0; for (float v : h) s += v * 1.0;
    printf("err %d sum %.9g h0 %.9g h77 %.9g\n", (int)e, s, h[0], h[77]);
}
"""

MISUSE = 89  # the emulator's misuse status (emu_core.h)
REPORTS = {
    2: "spatialc_wgmma at line 48: its accumulators were written by ordinary instructions with no"
    " spatialc_wgmma_fence() since",
    3: "spatialc_wgmma at line 48: a non-zero base offset",
    4: "spatialc_wgmma at line 47: an N-major operand without swizzle, which the emulation does not know",
}
# what the header-only templates printed (late mode retires the bf16 group only at wait_group 0)
SUMS = {
    (0, "late"): "err 0 sum 9.56251211 h0 1.75001478 h77 0.937510014",
    (0, "early"): "err 0 sum 9.56250305 h0 1.75003004 h77 0.937520027",
    (5, "late"): "err 0 sum -324 h0 171 h77 -60",
    (5, "early"): "err 0 sum -324 h0 171 h77 -60",
}


def run(which: int, mode: str) -> subprocess.CompletedProcess:
    binary = compile_program(PROGRAM, mode)
    env = dict(os.environ, SPATIALC_EMU_MODE=mode)
    return subprocess.run([str(binary), str(which)], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("mode", ["late", "early"])
def test_the_wgmma_reports_and_values_are_the_header_templates(mode):
    for which, words in REPORTS.items():
        done = run(which, mode)
        assert done.returncode == MISUSE, (which, done.stderr)
        assert done.stderr.strip() == f"spatialc-emu [{mode}]: {words}"
    for (which, m), line in SUMS.items():
        if m == mode:
            done = run(which, mode)
            assert done.returncode == 0 and done.stdout.strip() == line, (which, done.stdout, done.stderr)

// named_arrive: two groups of two warps take turns through named barriers (bar.sync on their own, bar.arrive on the
// other's: the ping-pong of lower/cuda/sm90a/pingpong.py), and the ways that goes wrong; the case in case.txt.
#include <cuda_pipeline.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef SPATIALC_SHARED_RING
#define SPATIALC_SHARED_RING(T, name, depth, page) __shared__ __align__(16) T name[(depth) * (page)]
#endif
#define SPATIALC_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "CUDA error: %s (%s)\n", cudaGetErrorString(e_), #x); exit(1); } } while (0)

enum Fault { NONE, MISSING, SWAPPED, ID16, COUNT100, ID0 };

// Group g (threads 64g …) waits on barrier 1 + g, writes its turn (the turn before it plus one: the other group's
// write, which only the barrier orders before this read), and arrives on the other group's barrier.
__global__ void k_turns(int* out, int fault)
{
    SPATIALC_SHARED_RING(int, turns, 1, 16);
    const int tid = threadIdx.x, g = tid / 64;
    const unsigned count = fault == COUNT100 ? 100u : 128u;
    if (g == 0) {
        spatialc_engine_arrive(1, count);  // the first turn is group 0's
    }
    for (int r = 0; r < 8; ++r) {
        spatialc_engine_sync(fault == ID16 ? 16u : fault == ID0 ? 0u : 1u + g, count);  // ID0: __syncthreads'
        const int k = 2 * r + g;
        if (tid % 64 == 0) {
            turns[k] = (k > 0 ? turns[k - 1] : 0) + 1;
        }
        const bool skip = fault == MISSING && g == 1 && r == 3;  // an arrival left out
        if (!skip) {
            spatialc_engine_arrive(fault == SWAPPED ? 1u + g : 2u - g, count);  // SWAPPED: its own barrier's
        }
    }
    __syncthreads();
    if (tid < 16) {
        out[tid] = turns[tid];
    }
}

int main()
{
    char which[64] = {0};
    { FILE* f = fopen("case.txt", "r"); if (!f || fscanf(f, "%63s", which) != 1) { return 2; } fclose(f); }
    const std::string c = which;
    const std::vector<std::string> names = {"ok", "missing", "swapped", "id16", "count100", "id0"};
    int fault = -1;
    for (size_t i = 0; i < names.size(); ++i) { if (c == names[i]) { fault = (int)i; } }
    if (fault < 0) { fprintf(stderr, "unknown case %s\n", which); return 2; }
    int* out = nullptr;
    SPATIALC_CHECK(cudaMalloc(&out, 16 * sizeof(int)));
    SPATIALC_CHECK(cudaMemset(out, 0, 16 * sizeof(int)));
    k_turns<<<2, 128>>>(out, fault);
    SPATIALC_CHECK(cudaDeviceSynchronize());
    std::vector<int> h(16);
    SPATIALC_CHECK(cudaMemcpy(h.data(), out, 16 * sizeof(int), cudaMemcpyDeviceToHost));
    for (int v : h) { printf("%d\n", v); }
    return 0;
}

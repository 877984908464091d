// gemm_64x64x64_fp16: a persistent CUDA kernel printed by spatialc from the spatial IR; each block is one site.
#include <cuda_pipeline.h>
#include <mma.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>

#ifndef SPATIALC_SHARED_RING
#define SPATIALC_SHARED_RING(T, name, depth, page) __shared__ __align__(32) T name[(depth) * (page)]
#define SPATIALC_DYNAMIC_RING(T, name, base, off, depth, page) T* name = reinterpret_cast<T*>((base) + (off))
#endif
#define SPATIALC_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "CUDA error: %s (%s)\n", cudaGetErrorString(e_), #x); exit(1); } } while (0)

typedef __half OPT;
typedef float ACCT;
typedef float OUT_T;
#define NTHREAD 128
#define NWARP 4
#define PERW 2
#define DEPTH_0 3
#define PAGE_0 1024
#define DEPTH_1 3
#define PAGE_1 2048
#define SMEM_OFF_EPI 0
#define DYN_SMEM 4096

extern "C" __global__ __launch_bounds__(NTHREAD, 4) void spatialc_persistent(const OPT* __restrict__ t0, const OPT* __restrict__ t1, OUT_T* __restrict__ t2, const int* __restrict__ spatialc_work)
{
    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int site = blockIdx.x;
    const int item_off = spatialc_work[site];
    const int n_items = spatialc_work[gridDim.x + site];
    const int* ITEM_LIST = spatialc_work + 2 * gridDim.x;
    if (n_items == 0) { return; }
    extern __shared__ __align__(32) char spatialc_dyn_smem[];
    SPATIALC_SHARED_RING(OPT, ring_0, DEPTH_0, PAGE_0);
    int wslot_0 = DEPTH_0 - 1, rslot_0 = 0;
    SPATIALC_SHARED_RING(OPT, ring_1, DEPTH_1, PAGE_1);
    int wslot_1 = DEPTH_1 - 1, rslot_1 = 0;
    SPATIALC_DYNAMIC_RING(ACCT, epi_scratch, spatialc_dyn_smem, SMEM_OFF_EPI, NWARP, 256);
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, ACCT> accf[PERW];
    for (int item = 0; item < n_items; ++item) {  // op:Loop x3
        const int item_id = ITEM_LIST[item_off + item];
        const int item_y = item_id / 1, item_x = item_id % 1;
        (void)item_y; (void)item_x;
        #pragma unroll
        for (int q = 0; q < PERW; ++q) {  // op:AcquireAcc
            nvcuda::wmma::fill_fragment(accf[q], 0);
        }
        // the loop over k is pipelined: step 0's copies are issued before it
        wslot_0 = (wslot_0 + 1) % DEPTH_0;  // pre:Reserve
        {  // pre:ReadTiles
            constexpr int CHUNKS = (int)(sizeof(OPT) * 256 / 16);
            static_assert(sizeof(OPT) * 256 % 16 == 0, "a tile is a whole number of 16-byte chunks");
            for (int c = tid; c < 4 * CHUNKS; c += NTHREAD) {
                const int tl = c / CHUNKS, off = c % CHUNKS;
                const long long tile = (long long)(item_y * 8) + (long long)(tl / 2) * 4 + (long long)(tl % 2);
                __pipeline_memcpy_async(reinterpret_cast<char*>(ring_0 + wslot_0 * PAGE_0 + tl * 256) + off * 16, reinterpret_cast<const char*>(t0 + tile * 256) + off * 16, 16);
            }
        }
        __pipeline_commit();  // pre:Push
        wslot_1 = (wslot_1 + 1) % DEPTH_1;  // pre:Reserve
        {  // pre:ReadTiles
            constexpr int CHUNKS = (int)(sizeof(OPT) * 256 / 16);
            static_assert(sizeof(OPT) * 256 % 16 == 0, "a tile is a whole number of 16-byte chunks");
            for (int c = tid; c < 8 * CHUNKS; c += NTHREAD) {
                const int tl = c / CHUNKS, off = c % CHUNKS;
                const long long tile = (long long)(item_x * 4) + (long long)(tl / 4) * 4 + (long long)(tl % 4);
                __pipeline_memcpy_async(reinterpret_cast<char*>(ring_1 + wslot_1 * PAGE_1 + tl * 256) + off * 16, reinterpret_cast<const char*>(t1 + tile * 256) + off * 16, 16);
            }
        }
        __pipeline_commit();  // pre:Push
        for (int k = 0; k < 2; ++k) {  // op:Loop x2
            if (k + 1 < 2) {
                wslot_0 = (wslot_0 + 1) % DEPTH_0;  // op:Reserve
                {  // op:ReadTiles
                    constexpr int CHUNKS = (int)(sizeof(OPT) * 256 / 16);
                    static_assert(sizeof(OPT) * 256 % 16 == 0, "a tile is a whole number of 16-byte chunks");
                    for (int c = tid; c < 4 * CHUNKS; c += NTHREAD) {
                        const int tl = c / CHUNKS, off = c % CHUNKS;
                        const long long tile = (long long)(item_y * 8 + (k + 1) * 2) + (long long)(tl / 2) * 4 + (long long)(tl % 2);
                        __pipeline_memcpy_async(reinterpret_cast<char*>(ring_0 + wslot_0 * PAGE_0 + tl * 256) + off * 16, reinterpret_cast<const char*>(t0 + tile * 256) + off * 16, 16);
                    }
                }
                __pipeline_commit();  // op:Push
                wslot_1 = (wslot_1 + 1) % DEPTH_1;  // op:Reserve
                {  // op:ReadTiles
                    constexpr int CHUNKS = (int)(sizeof(OPT) * 256 / 16);
                    static_assert(sizeof(OPT) * 256 % 16 == 0, "a tile is a whole number of 16-byte chunks");
                    for (int c = tid; c < 8 * CHUNKS; c += NTHREAD) {
                        const int tl = c / CHUNKS, off = c % CHUNKS;
                        const long long tile = (long long)((k + 1) * 8 + item_x * 4) + (long long)(tl / 4) * 4 + (long long)(tl % 4);
                        __pipeline_memcpy_async(reinterpret_cast<char*>(ring_1 + wslot_1 * PAGE_1 + tl * 256) + off * 16, reinterpret_cast<const char*>(t1 + tile * 256) + off * 16, 16);
                    }
                }
                __pipeline_commit();  // op:Push
            }
            else {
                __pipeline_commit();  // pad:Push
                __pipeline_commit();  // pad:Push
            }
            __pipeline_wait_prior(2);  // op:Wait
            __syncthreads();  // op:Wait
            {  // op:Compute:MatmulTiles
                const int wj = warp % 4;
                #pragma unroll
                for (int kk = 0; kk < 2; ++kk) {
                    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, OPT, nvcuda::wmma::row_major> bf[1];
                    #pragma unroll
                    for (int c = 0; c < 1; ++c) {
                        nvcuda::wmma::load_matrix_sync(bf[c], ring_1 + rslot_1 * PAGE_1 + (kk * 4 + wj) * 256, 16);
                    }
                    #pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, OPT, nvcuda::wmma::row_major> af;
                        nvcuda::wmma::load_matrix_sync(af, ring_0 + rslot_0 * PAGE_0 + ((r % 2) * 2 + kk) * 256, 16);
                        #pragma unroll
                        for (int c = 0; c < 1; ++c) {
                            const int q = r % 2;
                            nvcuda::wmma::mma_sync(accf[q], af, bf[c], accf[q]);
                        }
                    }
                }
            }
            rslot_0 = (rslot_0 + 1) % DEPTH_0;  // op:Pop
            rslot_1 = (rslot_1 + 1) % DEPTH_1;  // op:Pop (no barrier: these slots are refilled only after the next wait barrier)
        }
        // op:Reserve (fused output: no ring)
        // op:PackAcc (fused output: no ring)
        // op:Push (fused output: no ring)
        // op:ReleaseAcc (accumulators stay in registers)
        // op:Wait (fused output: no ring)
        {  // op:WriteTiles
            const int wj = warp % 4;
            const int lane = tid % 32;
            ACCT* scratch = epi_scratch + warp * 256;
            #pragma unroll
            for (int q = 0; q < PERW; ++q) {
                const int bh = q % 2, bw = wj;
                const long long tile = (long long)(item_y * 8 + item_x * 4) + (long long)bh * 4 + (long long)bw;
                nvcuda::wmma::store_matrix_sync(scratch, accf[q], 16, nvcuda::wmma::mem_row_major);
                __syncwarp();
                #pragma unroll 1
                for (int el = lane; el < 256; el += 32) {
                    t2[tile * 256 + el] = (OUT_T)scratch[el];
                }
                __syncwarp();
            }
        }
        // op:Pop (fused output: no ring)
    }
}

// Host helpers of a spatialc program: read a matrix, store it tiled (16 x 16 tiles, zero padding), read it back.
inline int spatialc_read(const char* path, std::vector<double>& v)
{
    FILE* f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 0;
    }
    for (size_t i = 0; i < v.size(); ++i) {
        if (fscanf(f, "%lf", &v[i]) != 1) {
            fprintf(stderr, "%s: expected %zu numbers, found %zu\n", path, v.size(), i);
            fclose(f);
            return 0;
        }
    }
    fclose(f);
    return 1;
}

inline size_t spatialc_tiled_index(int i, int j, int cols_t)
{
    return ((size_t)(i / 16) * (size_t)cols_t + (size_t)(j / 16)) * 256 + (size_t)(i % 16) * 16 + (size_t)(j % 16);
}

template <typename T>
inline void spatialc_tilize(const std::vector<double>& x, int rows, int cols, int cols_t, std::vector<T>& t)
{
    for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < cols; ++j) {
            t[spatialc_tiled_index(i, j, cols_t)] = (T)x[(size_t)i * cols + j];
        }
    }
}

// Deterministic, non-zero, small inputs for timing: exact in every operand type.
inline void spatialc_bench_input(std::vector<double>& v, int salt)
{
    for (size_t i = 0; i < v.size(); ++i) {
        v[i] = (double)((int)((i * 5 + (size_t)salt) % 9) + 1) * ((i % 2) ? -1.0 : 1.0);
    }
}

// The sites a launch runs: as many as the device keeps resident (its multiprocessors × per_sm blocks each) and no
// more than there are items; a kernel whose placement does not follow the device (per_sm 0) keeps its planned grid.
inline int spatialc_sites(int items, int sms, int per_sm, int planned)
{
    if (per_sm <= 0 || sms <= 0) {
        return planned;
    }
    const long long resident = (long long)sms * per_sm;
    return resident < items ? (int)resident : items;
}

// The work list of ir/worklist.py's placement rules: each site's offset into the item list, then each site's
// count, then the items — contiguous runs (the first items % sites sites one longer) or item i on site i % sites.
inline std::vector<int> spatialc_work_list(int items, int sites, int round_robin)
{
    std::vector<int> w(2 * (size_t)sites + (size_t)items);
    int* off = w.data();
    int* count = off + sites;
    int* list = count + sites;
    int at = 0;
    const int q = items / sites, r = items % sites;
    for (int s = 0; s < sites; ++s) {
        off[s] = at;
        if (round_robin) {
            for (int i = s; i < items; i += sites) {
                list[at++] = i;
            }
        } else {
            const int start = s * q + (s < r ? s : r);
            for (int i = 0; i < q + (s < r ? 1 : 0); ++i) {
                list[at++] = start + i;
            }
        }
        count[s] = at - off[s];
    }
    return w;
}

int main() {
    std::vector<double> h0((size_t)64 * 64);
    if (!spatialc_read("a.txt", h0)) { return 2; }
    std::vector<__half> x0((size_t)4 * 4 * 256);  // zero padding: value-initialised
    spatialc_tilize(h0, 64, 64, 4, x0);
    __half* d0 = nullptr;
    SPATIALC_CHECK(cudaMalloc(&d0, x0.size() * sizeof(__half)));
    SPATIALC_CHECK(cudaMemcpy(d0, x0.data(), x0.size() * sizeof(__half), cudaMemcpyHostToDevice));
    std::vector<double> h1((size_t)64 * 64);
    if (!spatialc_read("b.txt", h1)) { return 2; }
    std::vector<__half> x1((size_t)4 * 4 * 256);  // zero padding: value-initialised
    spatialc_tilize(h1, 64, 64, 4, x1);
    __half* d1 = nullptr;
    SPATIALC_CHECK(cudaMalloc(&d1, x1.size() * sizeof(__half)));
    SPATIALC_CHECK(cudaMemcpy(d1, x1.data(), x1.size() * sizeof(__half), cudaMemcpyHostToDevice));
    float* d2 = nullptr;
    SPATIALC_CHECK(cudaMalloc(&d2, (size_t)4 * 4 * 256 * sizeof(float)));
    SPATIALC_CHECK(cudaMemset(d2, 0, (size_t)4 * 4 * 256 * sizeof(float)));
    int sms = 0;
    SPATIALC_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int GRID = spatialc_sites(2, sms, 4, 2);
    std::vector<int> work = spatialc_work_list(2, GRID, 0);
    int* d_work = nullptr;
    SPATIALC_CHECK(cudaMalloc(&d_work, work.size() * sizeof(int)));
    SPATIALC_CHECK(cudaMemcpy(d_work, work.data(), work.size() * sizeof(int), cudaMemcpyHostToDevice));
    spatialc_persistent<<<GRID, 128, 4096>>>(d0, d1, d2, d_work);
    SPATIALC_CHECK(cudaGetLastError());
    SPATIALC_CHECK(cudaDeviceSynchronize());
    std::vector<float> y((size_t)4 * 4 * 256);
    SPATIALC_CHECK(cudaMemcpy(y.data(), d2, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; ++i) {
        for (int j = 0; j < 64; ++j) {
            printf("%.9g\n", (double)(float)y[spatialc_tiled_index(i, j, 4)]);
        }
    }
    SPATIALC_CHECK(cudaFree(d0));
    SPATIALC_CHECK(cudaFree(d1));
    SPATIALC_CHECK(cudaFree(d2));
    SPATIALC_CHECK(cudaFree(d_work));
    return 0;
}

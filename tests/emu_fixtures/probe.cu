// probe: one small kernel per behaviour of the host emulation, chosen by the word in case.txt.
#include <cuda_pipeline.h>
#include <mma.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>

#ifndef SPATIALC_SHARED_RING
#define SPATIALC_SHARED_RING(T, name, depth, page) __shared__ __align__(16) T name[(depth) * (page)]
#define SPATIALC_DYNAMIC_RING(T, name, base, off, depth, page) T* name = reinterpret_cast<T*>((base) + (off))
#endif
#define SPATIALC_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "CUDA error: %s (%s)\n", cudaGetErrorString(e_), #x); exit(1); } } while (0)

using namespace nvcuda;

// Odd warps return at once, lanes 16-31 of warp 0 after one barrier: the rest must still pass every barrier.
__global__ void k_exit(int* out)
{
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (warp % 2 == 1) { return; }
    __syncthreads();
    if (warp == 0 && lane >= 16) { return; }
    __syncwarp();
    __syncthreads();
    __syncthreads();
    out[tid] = 1;
}

// Thread 0 returns with a copy in flight; thread 1 reads the page after the barrier thread 0 never reaches.
__global__ void k_exit_inflight(const int* src, int* out)
{
    SPATIALC_SHARED_RING(int, exit_ring, 1, 4);
    const int tid = threadIdx.x;
    if (tid == 0) {
        __pipeline_memcpy_async(exit_ring, src, 16);
        __pipeline_commit();
        return;
    }
    __syncthreads();
    if (tid == 1) { for (int i = 0; i < 4; ++i) { out[i] = exit_ring[i]; } }
}

// Each lane fills its fragment with its lane id: the stored tile shows which lane owns each element.
__global__ void k_layout(int* out, int sync)
{
    SPATIALC_SHARED_RING(int, layout_scratch, 1, 256);
    const int lane = threadIdx.x % 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, int> f;
    wmma::fill_fragment(f, lane);
    wmma::store_matrix_sync(layout_scratch, f, 16, wmma::mem_row_major);
    if (sync) { __syncwarp(); }
    for (int e = lane; e < 256; e += 32) { out[e] = layout_scratch[e]; }
}

// Thread 0 reads a page before and after each wait: late mode lands copies at the wait, early mode at issue.
__global__ void k_landing(const int* src, int* out)
{
    SPATIALC_SHARED_RING(int, landing_ring, 2, 4);
    if (threadIdx.x == 0) {
        __pipeline_memcpy_async(&landing_ring[0], src, 16);
        __pipeline_commit();
        out[0] = landing_ring[0];
        __pipeline_memcpy_async(&landing_ring[4], src + 4, 16);
        __pipeline_commit();
        __pipeline_wait_prior(1);
        out[1] = landing_ring[0];
        out[2] = landing_ring[4];
        __pipeline_wait_prior(0);
        out[3] = landing_ring[4];
    }
}

template <class T, class A>
__device__ void mma_body(const T* a, const T* b, A* c)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bf;
    wmma::fragment<wmma::accumulator, 16, 16, 16, A> acc;
    wmma::fill_fragment(acc, 0);
    wmma::load_matrix_sync(af, a, 16);
    wmma::load_matrix_sync(bf, b, 16);
    wmma::mma_sync(acc, af, bf, acc);
    wmma::mma_sync(acc, af, bf, acc);  // twice: C = 2·A·B checks the accumulate
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}
__global__ void k_mma_int8(const signed char* a, const signed char* b, int* c) { mma_body(a, b, c); }
__global__ void k_mma_fp16(const __half* a, const __half* b, float* c) { mma_body(a, b, c); }
__global__ void k_mma_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c) { mma_body(a, b, c); }

// Threads 0-15 copy a tile into slot 1; warp 1 loads it. variant 0: no barrier between (a race); 1: a barrier
// (clean); 2: threads 0 and 1 copy the same bytes (a race); 3: thread 0 refills slot 1 while warp 1 still reads it,
// waiting only after the barrier (a race when the copy lands at issue, clean when it lands at the wait).
__global__ void k_race(const signed char* g, int* out, int variant)
{
    SPATIALC_SHARED_RING(signed char, race_ring, 2, 256);
    const int tid = threadIdx.x, warp = tid / 32;
    if (variant == 2) {
        if (tid < 2) { __pipeline_memcpy_async(race_ring, g, 16); }
        __pipeline_commit();
        __pipeline_wait_prior(0);
        return;
    }
    if (tid < 16) { __pipeline_memcpy_async(race_ring + 256 + tid * 16, g + tid * 16, 16); }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    if (variant != 0) { __syncthreads(); }
    if (variant == 3 && tid == 0) {
        __pipeline_memcpy_async(race_ring + 256, g + 256, 16);
        __pipeline_commit();
    }
    if (warp == 1) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> af;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::row_major> bf;
        wmma::fragment<wmma::accumulator, 16, 16, 16, int> acc;
        wmma::fill_fragment(acc, 0);
        wmma::load_matrix_sync(af, race_ring + 256, 16);
        wmma::load_matrix_sync(bf, race_ring + 256, 16);
        wmma::mma_sync(acc, af, bf, acc);
        wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
    }
    __syncthreads();
    __pipeline_wait_prior(0);
}

// Lanes 0-15 of warp 0 wait at the warp barrier for lanes that wait at the block barrier.
__global__ void k_deadlock(int* out)
{
    const int tid = threadIdx.x;
    if (tid < 16) { __syncwarp(); } else { __syncthreads(); }
    out[tid] = 1;
}

// Thread 0 spins forever while the others wait for it at a barrier: only the watchdog can end this.
__global__ void k_spin(int* out)
{
    if (threadIdx.x == 0) { volatile int forever = 1; while (forever) { } }
    __syncthreads();
    out[threadIdx.x] = 1;
}

// Every thread waits for a count in global memory that nothing adds to: no barrier deadlock, only the watchdog ends it.
__global__ void k_grid_hang(int* out, int* word)
{
    spatialc_grid_wait(word, 1);
    out[threadIdx.x] = 1;
}

// A ring that needs more of the dynamic block than the launch gives.
__global__ void k_dyn(int* out)
{
    extern __shared__ __align__(16) char spatialc_dyn_smem[];
    SPATIALC_DYNAMIC_RING(int, dyn_ring, spatialc_dyn_smem, 0, 2, 256);
    dyn_ring[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = dyn_ring[threadIdx.x];
}

// 40 KiB of static rings beside 16 KiB of dynamic: together past 48 KiB, so the launch needs the attribute.
__global__ void k_static_dyn(int* out)
{
    extern __shared__ __align__(16) char spatialc_dyn_smem[];
    SPATIALC_SHARED_RING(int, big_static, 10, 1024);
    SPATIALC_DYNAMIC_RING(int, small_dyn, spatialc_dyn_smem, 0, 4, 1024);
    big_static[threadIdx.x] = (int)threadIdx.x;
    small_dyn[threadIdx.x] = big_static[threadIdx.x];
    out[threadIdx.x] = small_dyn[threadIdx.x];
}

// A fragment loaded from 16 bytes into its ring: the CUDA guide wants the pointer 256-bit aligned.
__global__ void k_misaligned(int* out)
{
    SPATIALC_SHARED_RING(signed char, odd_ring, 2, 256);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> af;
    wmma::load_matrix_sync(af, odd_ring + 16, 16);
    out[threadIdx.x] = 1;
}

static std::vector<double> read_values(const char* path, size_t n)
{
    std::vector<double> v(n);
    FILE* f = fopen(path, "r");
    if (!f) { fprintf(stderr, "%s\n", path); exit(2); }
    for (size_t i = 0; i < n; ++i) { if (fscanf(f, "%lf", &v[i]) != 1) { fprintf(stderr, "%s short\n", path); exit(2); } }
    fclose(f);
    return v;
}

template <class T>
static T* device_copy(const std::vector<T>& h)
{
    T* d = nullptr;
    SPATIALC_CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    SPATIALC_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <class T>
static std::vector<T> host_copy(const T* d, size_t n)
{
    std::vector<T> h(n);
    SPATIALC_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

static int* zeros(size_t n)
{
    int* d = nullptr;
    SPATIALC_CHECK(cudaMalloc(&d, n * sizeof(int)));
    SPATIALC_CHECK(cudaMemset(d, 0, n * sizeof(int)));
    return d;
}

static void print_ints(const int* d, size_t n)
{
    for (int v : host_copy(d, n)) { printf("%d\n", v); }
}

template <class T, class A>
static void run_mma(void (*kernel)(const T*, const T*, A*))
{
    std::vector<double> a = read_values("a.txt", 256), b = read_values("b.txt", 256);
    std::vector<T> at(256), bt(256);
    for (int i = 0; i < 256; ++i) { at[i] = (T)a[i]; bt[i] = (T)b[i]; }
    T* da = device_copy(at);
    T* db = device_copy(bt);
    A* dc = nullptr;
    SPATIALC_CHECK(cudaMalloc(&dc, 256 * sizeof(A)));
    kernel<<<1, 32>>>(da, db, dc);
    SPATIALC_CHECK(cudaDeviceSynchronize());
    for (A v : host_copy(dc, 256)) { printf("%.9g\n", (double)v); }
}

int main()
{
    char which[64] = {0};
    { FILE* f = fopen("case.txt", "r"); if (!f || fscanf(f, "%63s", which) != 1) { return 2; } fclose(f); }
    const std::string c = which;
    const std::vector<int> words = {11, 12, 13, 14, 21, 22, 23, 24};
    if (c == "exit") {
        int* out = zeros(128);
        k_exit<<<2, 128>>>(out);
        SPATIALC_CHECK(cudaDeviceSynchronize());
        print_ints(out, 128);
    } else if (c == "exit_inflight") {
        int* src = device_copy(words);
        int* out = zeros(4);
        k_exit_inflight<<<1, 64>>>(src, out);
        SPATIALC_CHECK(cudaDeviceSynchronize());
        print_ints(out, 4);
    } else if (c == "layout" || c == "layout_nosync") {
        int* out = zeros(256);
        k_layout<<<1, 32>>>(out, c == "layout");
        SPATIALC_CHECK(cudaDeviceSynchronize());
        print_ints(out, 256);
    } else if (c == "landing") {
        int* src = device_copy(words);
        int* out = zeros(4);
        k_landing<<<1, 32>>>(src, out);
        SPATIALC_CHECK(cudaDeviceSynchronize());
        print_ints(out, 4);
    } else if (c == "mma_int8") {
        run_mma(k_mma_int8);
    } else if (c == "mma_fp16") {
        run_mma(k_mma_fp16);
    } else if (c == "mma_bf16") {
        run_mma(k_mma_bf16);
    } else if (c.rfind("race", 0) == 0) {
        std::vector<signed char> g(512);
        for (int i = 0; i < 512; ++i) { g[i] = (signed char)(i % 7 - 3); }
        signed char* dg = device_copy(g);
        int* out = zeros(256);
        k_race<<<1, 64>>>(dg, out, c[4] - '0');
        SPATIALC_CHECK(cudaDeviceSynchronize());
        print_ints(out, 256);
    } else if (c == "deadlock") {
        int* out = zeros(128);
        k_deadlock<<<1, 128>>>(out);
        SPATIALC_CHECK(cudaDeviceSynchronize());
    } else if (c == "spin") {
        int* out = zeros(64);
        k_spin<<<1, 64>>>(out);
        SPATIALC_CHECK(cudaDeviceSynchronize());
    } else if (c == "grid_hang") {
        int* out = zeros(64);
        int* word = zeros(1);
        k_grid_hang<<<1, 64>>>(out, word);
        SPATIALC_CHECK(cudaDeviceSynchronize());
    } else if (c == "grid_hang_coop") {  // as grid_hang, in 16384 threads of a cooperative launch
        int* out = zeros(1024);
        int* word = zeros(1);
        void* args[] = {&out, &word};
        SPATIALC_CHECK(cudaLaunchCooperativeKernel(k_grid_hang, dim3(16), dim3(1024), args));
        SPATIALC_CHECK(cudaDeviceSynchronize());
    } else if (c == "dyn_short") {
        int* out = zeros(64);
        k_dyn<<<1, 64, 1024>>>(out);
        SPATIALC_CHECK(cudaDeviceSynchronize());
    } else if (c == "optin_missing" || c == "optin_set") {
        int* out = zeros(64);
        if (c == "optin_set") { SPATIALC_CHECK(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024)); }
        k_dyn<<<1, 64, 64 * 1024>>>(out);
        SPATIALC_CHECK(cudaGetLastError());
        SPATIALC_CHECK(cudaDeviceSynchronize());
        print_ints(out, 64);
    } else if (c == "static_dyn_missing" || c == "static_dyn_set") {
        int* out = zeros(64);
        if (c == "static_dyn_set") { SPATIALC_CHECK(cudaFuncSetAttribute(k_static_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * 1024)); }
        k_static_dyn<<<1, 64, 16 * 1024>>>(out);
        SPATIALC_CHECK(cudaGetLastError());
        SPATIALC_CHECK(cudaDeviceSynchronize());
        print_ints(out, 64);
    } else if (c == "misaligned") {
        int* out = zeros(32);
        k_misaligned<<<1, 32>>>(out);
        SPATIALC_CHECK(cudaDeviceSynchronize());
    } else if (c == "convert") {
        const std::vector<double> v = read_values("a.txt", (size_t)read_values("n.txt", 1)[0]);
        for (double d : v) {
            const __half h = (__half)d;
            const __nv_bfloat16 bf = (__nv_bfloat16)d;
            const __half hf = (__half)(float)d;
            printf("%d %d %d %.17g %.17g\n", (int)h.__x, (int)bf.__x, (int)hf.__x, (double)h, (double)(float)bf);
        }
    } else {
        fprintf(stderr, "unknown case %s\n", which);
        return 2;
    }
    return 0;
}

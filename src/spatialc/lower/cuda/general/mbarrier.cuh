// The general form's synchronisation: an mbarrier (sm_80 and later) per ring slot for "full" and one for "empty",
// waited on by phase parity; a named barrier per engine; and, for sites that wait on each other, arrival counts in
// global memory. The host emulation defines SPATIALC_MBARRIER and its own versions of every function here.
#ifndef SPATIALC_MBARRIER
#define SPATIALC_MBARRIER
__device__ __forceinline__ unsigned spatialc_smem_addr(const void* p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

// `count` arrivals complete a phase.
__device__ __forceinline__ void spatialc_mbar_init(unsigned long long* bar, unsigned count)
{
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(spatialc_smem_addr(bar)), "r"(count) : "memory");
}

// One arrival, ordered after the thread's earlier shared-memory writes and reads.
__device__ __forceinline__ void spatialc_mbar_arrive(unsigned long long* bar)
{
    asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared.b64 state, [%0];\n\t}" ::"r"(spatialc_smem_addr(bar))
                 : "memory");
}

// One arrival made when every cp.async this thread issued before it has landed (the count already includes it).
__device__ __forceinline__ void spatialc_cp_async_arrive(unsigned long long* bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(spatialc_smem_addr(bar)) : "memory");
}

// Until the phase of parity `parity` has completed. On sm_90 and later by try_wait, which suspends the thread in
// hardware until the phase completes or a system time limit passes (then it tries again); before sm_90, which has no
// try_wait, by test_wait: spin a little, then back off with __nanosleep.
__device__ __forceinline__ void spatialc_mbar_wait(unsigned long long* bar, unsigned parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (;;) {
        unsigned done;
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(spatialc_smem_addr(bar)), "r"(parity)
            : "memory");
        if (done) {
            return;
        }
    }
#else
    for (int spin = 0;; ++spin) {
        unsigned done;
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(spatialc_smem_addr(bar)), "r"(parity)
            : "memory");
        if (done) {
            return;
        }
        if (spin >= 16) {
            __nanosleep(64);
        }
    }
#endif
}

// The `threads` threads of one engine meet (named barrier `id`; 0 is __syncthreads').
__device__ __forceinline__ void spatialc_engine_sync(unsigned id, unsigned threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Add `by` to a site's count (a barrier's arrivals, a semaphore): a release add at device scope, ordered after
// everything the engine's threads did before they met.
__device__ __forceinline__ void spatialc_grid_add(int* word, int by)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(word), "r"(by) : "memory");
}

// Until a site's count reaches `value`: acquire loads at device scope, backing off with __nanosleep.
__device__ __forceinline__ void spatialc_grid_wait(const int* word, int value)
{
    for (int spin = 0;; ++spin) {
        int now;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
        if (now >= value) {
            return;
        }
        if (spin >= 16) {
            __nanosleep(128);
        }
    }
}

// 16 bytes of this block's shared memory at `src` to the same place as `dst` in the shared memory of block `rank`
// of the cluster (distributed shared memory, sm_90); `site` is that block's index in the grid (the emulation's).
__device__ __forceinline__ void spatialc_dsmem_copy16(const void* src, const void* dst, int site, unsigned rank)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned a, b, c, d, remote;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "r"(spatialc_smem_addr(src))
                 : "memory");
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(spatialc_smem_addr(dst)), "r"(rank));
    asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
#elif defined(__CUDA_ARCH__)
    __trap();  // no clusters before sm_90: `lower` refuses a multicast there, so this never runs
#endif
    (void)src;
    (void)dst;
    (void)site;
    (void)rank;
}

// Thread-block clusters (sm_90; `lower` refuses them before, so the traps below never run): a multicast group's
// handshake in both forms that print one — the general form's and the sm_90a form's — on mbarriers in the blocks'
// shared memory, reached through distributed shared memory.

// One arrival on the barrier at the same place as `bar` in block `rank` of the cluster, releasing at cluster scope
// what this thread did before (its waits on its own barriers and its stores into that block's shared memory
// included): a receiver telling the sender its stage is free, or a sender that its page has landed.
__device__ __forceinline__ void spatialc_mbar_arrive_cluster(unsigned long long* bar, unsigned rank)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(spatialc_smem_addr(bar)), "r"(rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
    (void)bar;
    (void)rank;
}

// Until the phase of parity `parity` has completed, acquiring at cluster scope what the arrivals released (the
// arrivals come from other blocks of the cluster).
__device__ __forceinline__ void spatialc_mbar_wait_cluster(unsigned long long* bar, unsigned parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (;;) {
        unsigned done;
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;"
                     "\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(spatialc_smem_addr(bar)), "r"(parity)
                     : "memory");
        if (done) {
            return;
        }
    }
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
    (void)bar;
    (void)parity;
}

// Every thread of every block of the cluster meets: what each did before is released at cluster scope and acquired
// by all. After the barriers' initialisation (a peer's arrival or multicast bytes must find them initialised) and
// before a block exits (CUDA's rule for distributed shared memory: no block leaves while a peer may still use its
// shared memory).
__device__ __forceinline__ void spatialc_cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

// Barrier initialisation visible to the other threads' (the peers', and the copy engine's) first use of them.
__device__ __forceinline__ void spatialc_fence_barrier_init()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}
#endif

// A kernel whose sites run as thread-block clusters (__cluster_dims__): nothing here; the emulation runs each
// launch of it with every block at once.
#ifndef SPATIALC_CLUSTER_KERNEL
#define SPATIALC_CLUSTER_KERNEL(kernel, sites)
#endif

// A loop count read from data: `value` where it lies in 0..bound; otherwise 0 — the loop runs no times, so no access
// ever uses a count beyond its bound — with a flag and the count left in error[0], error[1] for the host to report.
__device__ __forceinline__ int spatialc_trip_per(int value, int per, int bound, int limit, int* error)
{
    // ceil(value / per) blocks of `per` rows (a grouped GEMM's row count, at most `limit`), flagged like
    // spatialc_trip
    if (value >= 0 && value <= limit) {
        const int count = value / per + (value % per != 0);
        if (count <= bound) {
            return count;
        }
    }
    error[0] = 1;
    error[1] = value;
    return 0;
}

__device__ __forceinline__ int spatialc_trip(int value, int bound, int* error)
{
    if (value >= 0 && value <= bound) {
        return value;
    }
    error[0] = 1;
    error[1] = value;
    return 0;
}

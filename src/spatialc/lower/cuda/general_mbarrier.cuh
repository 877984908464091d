// The ring barriers of the general form: an mbarrier (sm_80 and later) per ring slot for "full" and one for
// "empty", waited on by phase parity. The host emulation defines SPATIALC_MBARRIER and its own versions.
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

// Until the phase of parity `parity` has completed: spin a little, then back off with __nanosleep.
__device__ __forceinline__ void spatialc_mbar_wait(unsigned long long* bar, unsigned parity)
{
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
}
#endif

// The ping-pong's named barriers (lower/cuda/sm90a/pingpong.py): the two consumer warpgroups take turns issuing their
// matmuls. A warpgroup waits on its own barrier before issuing (bar.sync) and, once they are issued, arrives on the
// other's without waiting (bar.arrive); each barrier counts both warpgroups' threads. The host emulation defines
// SPATIALC_NAMED_ARRIVE and its own versions of both (runtime/emu/emu_mbarrier.h).
#ifndef SPATIALC_NAMED_ARRIVE
#define SPATIALC_NAMED_ARRIVE

// Arrive on named barrier `id` of `threads` threads and go on: the phase completes once they have all arrived.
__device__ __forceinline__ void spatialc_engine_arrive(unsigned id, unsigned threads)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrive on named barrier `id` of `threads` threads and wait for the phase to complete.
__device__ __forceinline__ void spatialc_engine_wait(unsigned id, unsigned threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

#endif  // SPATIALC_NAMED_ARRIVE

// The ping-pong's arrival (lower/cuda/sm90a/pingpong.py): the two consumer warpgroups take turns issuing their
// matmuls. A warpgroup waits on its own named barrier before issuing (bar.sync: the preamble's
// `spatialc_engine_sync`) and, once they are issued, arrives on the other's without waiting (bar.arrive, below); each
// barrier counts both warpgroups' threads. The host emulation defines SPATIALC_NAMED_ARRIVE and its own version
// (runtime/emu/emu_mbarrier.h), checked by the same path as its bar.sync.
#ifndef SPATIALC_NAMED_ARRIVE
#define SPATIALC_NAMED_ARRIVE

// Arrive on named barrier `id` of `threads` threads and go on: the phase completes once they have all arrived.
__device__ __forceinline__ void spatialc_engine_arrive(unsigned id, unsigned threads)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

#endif  // SPATIALC_NAMED_ARRIVE

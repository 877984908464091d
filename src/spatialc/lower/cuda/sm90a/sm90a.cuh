// The Hopper layer (sm_90a): the tensor memory accelerator's tile loads, the mbarrier transaction count they complete
// on, the asynchronous warpgroup MMA (wgmma) reading B from shared memory through a matrix descriptor, the fences
// between the generic and the async proxy, and the register split between producer and consumer warpgroups. The
// kernel text calls only these named functions; the host emulation defines SPATIALC_SM90A and implements the same
// names in C++ (runtime/emu/emu_hopper.h), so the text printed for nvcc is the text the CPU runs.
//
// The wgmma of a given width is printed beside this header by the lowering (spatialc_wgmma_<n>, one per width and
// operand type), since its accumulator list is as long as the width.
#ifndef SPATIALC_SM90A
#define SPATIALC_SM90A

// (spatialc_smem_addr, the shared-window address of a pointer, and the cluster's barriers — remote arrivals, waits
// at cluster scope, the cluster barrier, the init fence — are the mbarrier layer's: general/mbarrier.cuh.)

// Swizzled stages repeat their pattern every 1024 bytes of the shared window at most, and the copy engine and the
// MMA both swizzle by address: the dynamic block must start on such a boundary. A block that does not stops here.
__device__ __forceinline__ void spatialc_check_stage_base(const void* base)
{
    if (spatialc_smem_addr(base) & 1023u) {
        __trap();
    }
}

// The next `bytes` bytes an asynchronous copy delivers to the barrier's current phase: the phase completes only once
// every expected byte has arrived, as well as every arrival.
__device__ __forceinline__ void spatialc_mbar_expect_tx(unsigned long long* bar, unsigned bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(spatialc_smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// The producer's one arrival and the bytes its copies will deliver, announced in one instruction: the phase cannot
// complete on the arrival alone, since the bytes it adds are pending until the copy engine has delivered them. It
// releases the thread's earlier accesses, as an arrival does.
__device__ __forceinline__ void spatialc_mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(spatialc_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

// The map's descriptor fetched ahead into the cache the copy engine reads descriptors from, so that the first copy
// of it does not wait for that fetch. A hint: nothing else depends on it.
__device__ __forceinline__ void spatialc_prefetch_tensormap(const CUtensorMap* map)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// A box of a matrix (column, row: innermost first) into shared memory by the copy engine, swizzled as its tensor
// map says; its bytes are counted on `bar` when they land. The tensor map lives in the kernel's parameter space
// (__grid_constant__).
__device__ __forceinline__ void spatialc_tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                                     unsigned long long* bar)
{
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}],"
        " [%4];" ::"r"(spatialc_smem_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(spatialc_smem_addr(bar))
        : "memory");
}

// The same box into the same place of the shared memory of every block of the cluster whose rank is set in `mask`
// (bit r: rank r, this block's own included), read from global memory once; its bytes count on the barrier at the
// same place in each of those blocks, each of which announced them with its own expect_tx.
__device__ __forceinline__ void spatialc_tma_load_2d_multicast(void* dst, const CUtensorMap* map, int c0, int c1,
                                                               unsigned long long* bar, unsigned short mask)
{
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(spatialc_smem_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(spatialc_smem_addr(bar)), "h"(mask)
        : "memory");
}

// A box of this block's shared memory at `src` (laid out as the map's box, on 128 bytes) into the matrix at (column,
// row) by the copy engine, which reads `src` asynchronously: the store joins the thread's open bulk group.
__device__ __forceinline__ void spatialc_tma_store_2d(const CUtensorMap* map, int c0, int c1, const void* src)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                     reinterpret_cast<unsigned long long>(map)),
                 "r"(c0), "r"(c1), "r"(spatialc_smem_addr(src))
                 : "memory");
}

// A 16×16 tile of 16-bit values, row-major at `tile`, from the accumulator layout in which each lane holds its
// eight (v[i]: row lane/4 + 8·((i/2) mod 2), column 8·(i/4) + 2·(lane mod 4) + i mod 2): one stmatrix of four
// 8×8 matrices — (rows 0–7, 8–15) × (columns 0–7, 8–15), register j holding v[2j], v[2j+1] — each lane giving the
// address of one of their rows (lanes 8j … 8j + 7 matrix j's).
template <class T>
__device__ __forceinline__ void spatialc_stmatrix_tile(T* tile, const T (&v)[8])
{
    static_assert(sizeof(T) == 2, "stmatrix stores 16-bit values");
    const unsigned lane = threadIdx.x % 32u, j = lane / 8u;
    T* row = tile + ((lane % 8u) + 8u * (j % 2u)) * 16u + 8u * (j / 2u);
    unsigned r[4];
    memcpy(r, v, sizeof r);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(spatialc_smem_addr(row)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// Four 8×8 matrices of 16-bit values from the accumulator layout (lane l's v[2j], v[2j+1]: row l/4, columns
// 2·(l mod 4), +1 of matrix j), each row where the lane that addresses it says: lane 8j + r gives `row`, the 16 bytes
// of matrix j's row r (anywhere in shared memory on 16 bytes: a swizzled box's row chunk).
template <class T>
__device__ __forceinline__ void spatialc_stmatrix_rows(T* row, const T (&v)[8])
{
    static_assert(sizeof(T) == 2, "stmatrix stores 16-bit values");
    unsigned r[4];
    memcpy(r, v, sizeof r);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(spatialc_smem_addr(row)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// The thread's stores issued since its last commit, as one bulk group.
__device__ __forceinline__ void spatialc_bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Until at most N of the thread's committed bulk groups still read their shared-memory sources: the others' sources
// may be written again (their global writes complete before the kernel does).
template <int N>
__device__ __forceinline__ void spatialc_bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Generic-proxy writes to shared memory (the barriers' initialisation; a staged output box) made visible to the
// async proxy, which the copy engine's transaction counts and stores go through.
__device__ __forceinline__ void spatialc_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Registers move from the producer warpgroup (it only issues copies) to the consumers (they hold the accumulators).
// Every warp of a warpgroup executes the same one.
template <unsigned N>
__device__ __forceinline__ void spatialc_regs_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <unsigned N>
__device__ __forceinline__ void spatialc_regs_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// ---- wgmma ---------------------------------------------------------------------------------------------------
// A shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte units) and the swizzle
// mode (0: none, 1: 128-byte, 2: 64-byte, 3: 32-byte), as the PTX ISA's "Matrix Descriptor Format" lays them out.
__device__ __forceinline__ unsigned long long spatialc_wgmma_desc(const void* p, unsigned lbo, unsigned sbo,
                                                                  unsigned swizzle)
{
    return (unsigned long long)((spatialc_smem_addr(p) & 0x3FFFFu) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | ((unsigned long long)swizzle << 62);
}

// The accumulators' registers pinned at this point of the program, as if read and written here: the compiler may
// not move an ordinary instruction that writes them (an item's zeroing) below it, past the wgmma.fence that must
// follow such writes, nor one that reads them (the epilogue) above it, before the wgmma.wait_group that completed
// them. (Without it nvcc has been seen to sink the zeroing past the fence, and ptxas then injects a
// warpgroup.arrive of its own: warning C7519.)
__device__ __forceinline__ void spatialc_reg_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void spatialc_reg_fence(int& x) { asm volatile("" : "+r"(x)::"memory"); }
template <class T, int N>
__device__ __forceinline__ void spatialc_acc_fence(spatialc_acc<T> (&d)[N])
{
#pragma unroll
    for (int q = 0; q < N; ++q) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            spatialc_reg_fence(d[q].x[i]);
        }
    }
}

// An A fragment's registers pinned likewise (the RS form's A: attention's P), so that the packing that writes them
// stays before the wgmma.fence.
template <class T>
__device__ __forceinline__ void spatialc_frag_fence(spatialc_frag<T>& f)
{
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        asm volatile("" : "+r"(f.r[j])::"memory");
    }
}

// Before a batch of wgmma: the registers they read (accumulators, A fragments) were last written by ordinary
// instructions, which must be done first.
__device__ __forceinline__ void spatialc_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void spatialc_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Until at most N committed groups are in flight: their accumulators are written and their operands read.
template <int N>
__device__ __forceinline__ void spatialc_wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
#endif

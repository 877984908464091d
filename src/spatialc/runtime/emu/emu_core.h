// spatialc host emulation — the core: CUDA qualifiers, the mode, per-thread and per-block state, the built-in
// variables and barriers. The functions declared here are defined in emu_runtime.h.
//
// Blocks run one after another (`the_block`), except in a cooperative launch, which runs every block of the grid at
// once, each a Block of its own; `blk()` is the calling thread's.
#ifndef SPATIALC_EMU_CORE_H
#define SPATIALC_EMU_CORE_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

// Header-only by default. The runner compiles emu_runtime.h once into an object (SPATIALC_EMU_IMPLEMENTATION)
// and builds programs with SPATIALC_EMU_LINKED, which leaves these functions declared only.
#if defined(SPATIALC_EMU_LINKED)
#define SPATIALC_EMU_FN
#else
#define SPATIALC_EMU_FN inline
#endif
// The same for the runtime's variables that construct or destroy something (containers, a block's state): a program
// linked against the object declares them extern, so that its own build instantiates and runs none of their
// constructors and destructors (a fifth of a small program's g++ time); the object holds the one definition.
#if defined(SPATIALC_EMU_LINKED) && !defined(SPATIALC_EMU_IMPLEMENTATION)
#define SPATIALC_EMU_VAR extern
#elif defined(SPATIALC_EMU_LINKED)
#define SPATIALC_EMU_VAR
#else
#define SPATIALC_EMU_VAR inline
#endif

// ---- qualifiers -------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) __attribute__((aligned(n)))
// A block's threads share it; blocks run one after another, so a function-static is one block's memory.
#define __shared__ static
// `__restrict__` is g++'s own spelling already.

// ---- the mode: late (a cp.async lands at the wait that covers it) or early (it lands when issued) ----------
// Chosen when the binary runs, by SPATIALC_EMU_MODE=late|early in its environment, so one binary serves both;
// a build's -DSPATIALC_EMU_MODE=late|early gives the default where the environment names none.
#define SPATIALC_EMU_MODE_late 1
#define SPATIALC_EMU_MODE_early 2
#define SPATIALC_EMU_CAT_(a, b) a##b
#define SPATIALC_EMU_MODE_ID_(m) SPATIALC_EMU_CAT_(SPATIALC_EMU_MODE_, m)
#ifndef SPATIALC_EMU_MODE
#define SPATIALC_EMU_MODE late
#endif
#if SPATIALC_EMU_MODE_ID_(SPATIALC_EMU_MODE) == SPATIALC_EMU_MODE_late
#define SPATIALC_EMU_LATE 1
#elif SPATIALC_EMU_MODE_ID_(SPATIALC_EMU_MODE) == SPATIALC_EMU_MODE_early
#define SPATIALC_EMU_LATE 0
#else
#error "SPATIALC_EMU_MODE must be late or early"
#endif

namespace spatialc_emu {

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

constexpr int kWarp = 32;

// Exit statuses of a run the emulator ends itself (the host code uses 1 and 2).
enum ExitCode : int { kExitRace = 86, kExitDeadlock = 87, kExitTimeout = 88, kExitMisuse = 89 };

inline bool mode_is_late() {
    const char* m = std::getenv("SPATIALC_EMU_MODE");
    if (m == nullptr || *m == '\0') return SPATIALC_EMU_LATE != 0;
    if (std::strcmp(m, "late") == 0) return true;
    if (std::strcmp(m, "early") == 0) return false;
    std::fprintf(stderr, "spatialc-emu: SPATIALC_EMU_MODE is '%s'; use late or early\n", m);
    std::exit(kExitMisuse);
}
#if defined(SPATIALC_EMU_LINKED) && !defined(SPATIALC_EMU_IMPLEMENTATION)
extern const bool kLate;
#elif defined(SPATIALC_EMU_LINKED)
extern const bool kLate = mode_is_late();
#else
inline const bool kLate = mode_is_late();
#endif
inline const char* mode_name() { return kLate ? "late" : "early"; }

// A cp.async copy in flight: its source bytes are read at issue, they reach `dst` when the copy lands.
struct Copy {
    char* dst;
    unsigned char data[16];
    int size;
    int line;
};

// A plain store to global memory (a workspace's partial sum) not yet visible at device scope (late mode): it lands
// when a thread that holds it fences or releases (__threadfence, a release add) or exits. A barrier an engine's
// threads cross shares each one's stores with the others, which may then release them (PTX's cumulativity).
// A store to a peer block's shared memory (spatialc_dsmem_copy16, 16 bytes) is held the same way, and lands at its
// thread's next release at cluster scope too (an arrival on a peer's barrier: emu_cluster.h).
struct GlobalStore {
    void* dst;
    unsigned char data[16];
    int size;
    std::atomic<bool> done{false};
};
using GlobalStores = std::vector<std::shared_ptr<GlobalStore>>;

// A fragment-store element not yet visible to other lanes (late mode): it lands at the lane's next barrier.
struct PendingStore {
    void* dst;
    unsigned char data[4];
    int size;
};

// Written by its own thread only; `where` and the counters are atomics because reports read them from others.
struct ThreadState {
    int tid = 0, warp = 0, lane = 0;
    std::atomic<unsigned> bi{0};  // block barriers (__syncthreads) passed: the thread's barrier interval
    std::atomic<unsigned> wi{0};  // warp-level barriers passed (__syncwarp and __syncthreads)
    std::atomic<const char*> where{"running"};
    std::atomic<int> where_line{0};
    // Happens-before through mbarriers: the thread's own clock (ticks at each arrival) and what it has learnt of
    // every other thread's (by completing a wait); empty until it first waits.
    unsigned clk = 1;
    std::vector<unsigned> vc;
    char where_buf[192] = {0};              // `where` when it names an mbarrier wait
    std::vector<Copy> open;                 // issued, not yet committed
    std::vector<std::vector<Copy>> groups;  // committed groups, oldest first, not yet landed
    std::vector<PendingStore> stores;
    GlobalStores gstores;  // plain global stores not yet visible at device scope (late mode)
    // Clusters (sm_90a): cluster barriers passed, and what the thread has learnt of the threads of other blocks of
    // its cluster (by block, their clocks as their own block counts them) through their remote arrivals.
    unsigned cbi = 0;
    std::map<unsigned long, std::vector<unsigned>> peer_vc;
    // sm_90a: the clock at the thread's last fence.proxy.async (which ticks it): its shared-memory writes at that
    // clock or before are visible to the copy engine.
    std::atomic<unsigned> fenced_clk{0};
    std::atomic<unsigned> fenced_bi{0}, fenced_wi{0};  // its barrier intervals then: what orders the fence for others
    // Its last kFences fences (clock, barrier intervals), oldest first from n_fences - kFences: a store issued after
    // the thread has fenced again still finds the fence that covered the bytes it reads. A thread cannot run more
    // fences ahead of a store's issue than its staging takes turns, each after a barrier with the issuing thread.
    static constexpr unsigned kFences = 4;
    struct Fence {
        std::atomic<unsigned> clk{0}, bi{0}, wi{0};
    };
    Fence fences[kFences];
    std::atomic<unsigned> n_fences{0};
};

// An mbarrier (emu_mbarrier.h), or an engine's named barrier (the same arrivals, its threads waiting on each other).
struct MBar {
    unsigned count = 0, pending = 0;
    unsigned long long phase = 0;
    int waiters = 0;
    std::atomic<unsigned> gen{0};
    std::vector<Copy> async;  // copies whose arrival is counted; in late mode they land when the phase completes
    GlobalStores gacc, gdone[2];  // the arrivals' pending global stores, and each completed phase's (by parity)
    std::vector<unsigned> vc_acc;
    std::vector<unsigned> vc_done[2];  // the clock of the last completed phase of each parity
    // sm_90a: bytes the current phase still expects from the copy engine (expect_tx adds, a landing box takes away;
    // the phase completes when they and the arrivals are all in), and whether a fence.proxy.async by the thread that
    // initialised it has made the barrier visible to the copy engine.
    long long tx = 0;
    bool async_visible = false;
    int init_tid = -1, init_line = 0;
    unsigned init_bi = 0;  // the initialising thread's barrier interval: others may use it only after a __syncthreads
    int engine = -1;       // the copy engine signalling it, as a thread of the race check (nthreads + its index)
    // Clusters: the initialising thread's cluster barriers (a peer may use it only after one more); the clocks
    // remote arrivals bring, by block (the current phase's, each completed parity's); the phases completed so far
    // with bytes a peer multicast (the latest, as a phase count, and the line that sent them) and the phases some
    // thread of this block has waited through — a block must not exit before it waited for what a peer sent it.
    unsigned init_cbi = 0;
    bool cluster_visible = false;  // a fence.mbarrier_init by its initialising thread since: peers may see it
    bool peer_touched[2] = {false, false};  // the last completed phase of each parity had a peer's arrival or bytes
    std::map<unsigned long, std::vector<unsigned>> peer_acc, peer_done[2];
    // The epochs remote arrivals release (a peer block's, emu_global.h), by block: the current phase's, each completed
    // parity's — a thread passing the phase acquires them for its block, as a wait on a sync word does.
    std::map<unsigned long, unsigned> peer_epoch_acc, peer_epoch_done[2];
    bool peer_bytes = false;
    unsigned long long peer_phase = 0, waited = 0;
    int peer_line = 0;
    unsigned long peer_from = 0;
};

// Arrivals are counted under `mu`; a waiter sleeps on its barrier's generation word, outside the lock, so the
// completing thread wakes everyone with one notify and nobody queues for the lock on the way out.
struct Block {
    std::mutex mu;
    int nthreads = 0, nwarps = 0;
    int live = 0;     // threads that have not returned
    int blocked = 0;  // live threads waiting at a barrier that has not completed
    int bar_arrived = 0;
    std::atomic<unsigned> bar_gen{0};
    std::vector<int> warp_live, warp_arrived;
    std::unique_ptr<std::atomic<unsigned>[]> warp_gen;
    // Warp shuffles: each warp's lanes met so far, its meetings' generation, and each thread's posted value.
    std::vector<int> shfl_arrived;
    std::unique_ptr<std::atomic<unsigned>[]> shfl_gen;
    std::vector<unsigned long long> shfl_slot;
    std::unique_ptr<ThreadState[]> threads;
    unsigned long block_linear = 0;
    char* dyn = nullptr;  // its dynamic shared memory (null: the one block at a time uses `dyn_base`)
    std::map<const void*, std::unique_ptr<MBar>> mbars;  // by address: mbarriers in its shared memory
    std::map<unsigned, std::unique_ptr<MBar>> named;     // by id: its engines' named barriers
    std::vector<int> regs;  // each warp's registers a thread after setmaxnreg (empty: the block never used it)
    bool in_cluster = false;  // its threads crossed a cluster barrier: a peer may wake them (deadlock is cluster-wide)
    bool exited = false;      // every thread returned: its shared memory is gone
    // TMA stores whose shared-memory reads are in flight (source, bytes, issuing thread, line), under shadow_mu: a
    // write there before the issuing thread waited for them is a race.
    struct StoreRead {
        const char* src;
        size_t bytes;
        int tid, line;
    };
    std::vector<StoreRead> store_reads;
    std::atomic<int> n_store_reads{0};  // its size, for a look without the lock
};

inline thread_local ThreadState* self = nullptr;
SPATIALC_EMU_VAR Block the_block;
inline thread_local Block* cur_block = &the_block;
inline Block& blk() { return *cur_block; }
inline std::atomic<unsigned long> progress{0};  // barrier completions, exits, blocks: what the watchdog watches
inline std::atomic<bool> in_launch{false};

// One report on stderr, then the process ends at once: the kernel's other threads may be blocked forever.
[[noreturn]] SPATIALC_EMU_FN void fatal(int code, const std::string& what);
[[noreturn]] SPATIALC_EMU_FN void outside_kernel(const char* what);
SPATIALC_EMU_FN void block_barrier(int line);
// A plain store of `size` bytes to global memory (SPATIALC_GLOBAL_ST): at once in early mode, pending in late mode.
SPATIALC_EMU_FN void global_store(void* dst, const void* value, int size, int line);
SPATIALC_EMU_FN void hold_store(ThreadState& t, void* dst, const void* value, int size);
// The calling thread's pending global stores (and those a barrier shared with it) become visible.
SPATIALC_EMU_FN void release_stores();
// __threadfence: a release of the calling thread's block that its later atomic adds publish (emu_global.h).
SPATIALC_EMU_FN void fence_epoch();
SPATIALC_EMU_FN void warp_barrier(unsigned mask, int line);
// A shuffle's exchange: the calling lane posts `value` and gets the value lane `lane` of its warp posted (with
// `by_xor`, lane this lane ^ `lane`).
SPATIALC_EMU_FN unsigned long long warp_shuffle(unsigned mask, unsigned long long value, int lane, bool by_xor,
                                                int width, int line);

inline ThreadState& me(const char* what) {
    if (!self) outside_kernel(what);
    return *self;
}

}  // namespace spatialc_emu

// ---- CUDA built-in variables and barriers -----------------------------------------------------------------
using spatialc_emu::dim3;
using spatialc_emu::uint3;

inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};
inline dim3 gridDim{1, 1, 1};
constexpr int warpSize = spatialc_emu::kWarp;

inline void __syncthreads(int line = __builtin_LINE()) { spatialc_emu::block_barrier(line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
    spatialc_emu::warp_barrier(mask, line);
}
// __shfl_sync and __shfl_xor_sync of a value of at most 8 bytes, over the whole warp (a full mask, width 32).
template <class T>
inline T spatialc_emu_shuffle(unsigned mask, T var, int lane, bool by_xor, int width, int line) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    unsigned long long bits = 0;
    std::memcpy(&bits, &var, sizeof(T));
    bits = spatialc_emu::warp_shuffle(mask, bits, lane, by_xor, width, line);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, int line = __builtin_LINE()) {
    return spatialc_emu_shuffle(mask, var, src_lane, false, width, line);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, int line = __builtin_LINE()) {
    return spatialc_emu_shuffle(mask, var, lane_mask, true, width, line);
}
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence() {
    spatialc_emu::release_stores();
    spatialc_emu::fence_epoch();
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

#endif  // SPATIALC_EMU_CORE_H

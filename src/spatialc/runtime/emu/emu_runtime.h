// spatialc host emulation — the definitions behind the declarations of the other headers: barriers, thread exit,
// deadlock reports, the watchdog, shared regions and the race check, cp.async, progress lines, the launch.
//
// Included by cuda_emu.h (header-only use) or compiled once on its own with SPATIALC_EMU_IMPLEMENTATION and
// SPATIALC_EMU_LINKED (what the runner does: every program then links the same object).
#ifndef SPATIALC_EMU_RUNTIME_H
#define SPATIALC_EMU_RUNTIME_H

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <unistd.h>

#include "emu_host.h"
#include "emu_mbarrier.h"
#include "emu_hopper.h"
#include "emu_global_run.h"  // global memory's definitions: the tensors, epochs, the checks
#include "emu_hopper_run.h"  // the wgmma's definitions

namespace spatialc_emu {

SPATIALC_EMU_FN void wait_word(std::atomic<unsigned>& word, unsigned seen);  // (fibers, below)

// ---- reports ----------------------------------------------------------------------------------------------------

[[noreturn]] SPATIALC_EMU_FN void fatal(int code, const std::string& what) {
    static std::mutex once;
    once.lock();  // never unlocked: a second reporter waits here until _exit
    std::fprintf(stderr, "spatialc-emu [%s]: %s\n", mode_name(), what.c_str());
    std::fflush(stderr);
    _exit(code);
}

[[noreturn]] SPATIALC_EMU_FN void outside_kernel(const char* what) {
    fatal(kExitMisuse, std::string(what) + " called outside a kernel thread");
}

// "96 threads (0-95) __syncthreads() at line 120 after 4 block barriers; 32 threads (96-127) ..."
SPATIALC_EMU_FN std::string describe_threads(Block& b) {
    struct Group {
        std::string where;
        int line;
        unsigned bi;
        std::vector<int> tids;
    };
    std::vector<Group> groups;
    for (int i = 0; i < b.nthreads; ++i) {
        const ThreadState& t = b.threads[i];
        const std::string where = t.where.load();
        const int line = t.where_line.load();
        const unsigned bi = t.bi.load();
        auto it = std::find_if(groups.begin(), groups.end(),
                               [&](const Group& g) { return g.where == where && g.line == line && g.bi == bi; });
        if (it == groups.end()) {
            groups.push_back({where, line, bi, {}});
            it = groups.end() - 1;
        }
        it->tids.push_back(t.tid);
    }
    std::string out;
    for (const Group& g : groups) {
        if (!out.empty()) out += "; ";
        out += std::to_string(g.tids.size()) + (g.tids.size() == 1 ? " thread (" : " threads (");
        for (size_t i = 0; i < g.tids.size();) {  // ids as runs: 0-31,64-95
            size_t j = i;
            while (j + 1 < g.tids.size() && g.tids[j + 1] == g.tids[j] + 1) ++j;
            if (i) out += ",";
            out += std::to_string(g.tids[i]);
            if (j > i) out += "-" + std::to_string(g.tids[j]);
            i = j + 1;
        }
        out += ") " + g.where;
        if (g.line) out += " at line " + std::to_string(g.line);
        out += " after " + std::to_string(g.bi) + " block barriers";
    }
    return out;
}

SPATIALC_EMU_FN std::string describe_mbarriers(Block& b);

// The blocks of `b`'s cluster, `b` first (just `b` outside a cluster launch, or before its threads crossed a cluster
// barrier: until then no peer can reach its barriers).
SPATIALC_EMU_FN std::vector<Block*> cluster_of(Block& b);
SPATIALC_EMU_FN unsigned long cluster_size();  // blocks per cluster of the running launch (0: none)
SPATIALC_EMU_FN void cluster_leave(Block& b);
SPATIALC_EMU_FN void check_exit(Block& b);
SPATIALC_EMU_FN void prepare_clusters(unsigned long nblocks, int threads);

[[noreturn]] SPATIALC_EMU_FN void deadlock(Block& b) {
    const std::vector<Block*> blocks = cluster_of(b);
    if (blocks.size() == 1)
        fatal(kExitDeadlock, "DEADLOCK in block " + std::to_string(b.block_linear) +
                                 ": every live thread waits at a barrier that can never complete: " +
                                 describe_threads(b) + describe_mbarriers(b));
    // Every block of the cluster is stuck (`stuck` checked it): their states no longer change.
    std::string all;
    for (Block* o : blocks)
        all += " Block " + std::to_string(o->block_linear) + ": " +
               (o->live ? describe_threads(*o) + describe_mbarriers(*o) : std::string("exited")) + ".";
    fatal(kExitDeadlock, "DEADLOCK in the cluster of block " + std::to_string(b.block_linear) +
                             ": every live thread of its blocks waits at a barrier that can never complete." + all);
}

// With `b`'s lock held, once every live thread of `b` waits: whether nothing can wake them — always outside a
// cluster; in one, when every other block of the cluster has exited or waits too (a peer's arrival, multicast bytes
// or cluster barrier could wake `b`). A peer whose lock is busy is running: not stuck (its last thread to wait will
// look again).
SPATIALC_EMU_FN bool stuck(Block& b) {
    for (Block* o : cluster_of(b)) {
        if (o == &b) continue;
        if (!o->mu.try_lock()) return false;
        const bool waits = o->live == 0 || o->blocked == o->live;
        o->mu.unlock();
        if (!waits) return false;
    }
    return true;
}

// ---- barriers -----------------------------------------------------------------------------------------------------

// Make every pending fragment store of `t` visible (late mode).
SPATIALC_EMU_FN void apply_stores(ThreadState& t) {
    for (const PendingStore& s : t.stores) std::memcpy(s.dst, s.data, (size_t)s.size);
    t.stores.clear();
}

// ---- plain global stores: visible at device scope only once released (late mode) -----------------------------------

SPATIALC_EMU_FN void global_store(void* dst, const void* value, int size, int line) {
    ThreadState& t = me("SPATIALC_GLOBAL_ST");
    if (size < 1 || size > 8) fatal(kExitMisuse, "SPATIALC_GLOBAL_ST of " + std::to_string(size) + " bytes");
    global_write(dst, (size_t)size, "a store (SPATIALC_GLOBAL_ST)", line);
    hold_store(t, dst, value, size);
}

// A store to global memory (or a peer's shared memory) by `t`: at once in early mode, else held until released.
SPATIALC_EMU_FN void hold_store(ThreadState& t, void* dst, const void* value, int size) {
    if (!kLate) {
        std::memcpy(dst, value, (size_t)size);
        return;
    }
    auto s = std::make_shared<GlobalStore>();
    s->dst = dst;
    s->size = size;
    std::memcpy(s->data, value, (size_t)size);
    t.gstores.push_back(std::move(s));
}

inline std::mutex land_mu;  // a store lands whole before any holder's release goes on (`done` set after the copy)

SPATIALC_EMU_FN void land_stores(const GlobalStores& stores) {
    std::lock_guard<std::mutex> lk(land_mu);
    for (const auto& s : stores)
        if (!s->done.load(std::memory_order_relaxed)) {
            std::memcpy(s->dst, s->data, (size_t)s->size);
            s->done.store(true, std::memory_order_release);
        }
}

// The stores `t` holds land (each once, whichever thread holding it gets there first).
SPATIALC_EMU_FN void release_stores_of(ThreadState& t) {
    if (t.gstores.empty()) return;
    land_stores(t.gstores);
    t.gstores.clear();
}

// `from`'s stores that have not landed, added to `into` (what a barrier shares).
SPATIALC_EMU_FN void share_stores(GlobalStores& into, const GlobalStores& from) {
    for (const auto& s : from)
        if (!s->done.load(std::memory_order_acquire)) into.push_back(s);
}

SPATIALC_EMU_FN void release_stores() { release_stores_of(me("__threadfence")); }

// What threads still held when they returned: visible once the launch is over (not before another block of it reads).
inline std::mutex exit_stores_mu;
inline GlobalStores exit_stores;

SPATIALC_EMU_FN void keep_until_launch_ends(ThreadState& t) {
    std::lock_guard<std::mutex> lk(exit_stores_mu);
    exit_stores.insert(exit_stores.end(), t.gstores.begin(), t.gstores.end());
    t.gstores.clear();
}

// The exit stores into [base, base + n) land now (a block's shared memory, before it is freed).
SPATIALC_EMU_FN void land_exit_stores_in(const char* base, size_t n) {
    std::lock_guard<std::mutex> lk(exit_stores_mu);
    GlobalStores in, rest;
    for (const auto& s : exit_stores) {
        const char* d = static_cast<const char*>(s->dst);
        (d >= base && d < base + n ? in : rest).push_back(s);
    }
    land_stores(in);
    exit_stores = std::move(rest);
}

SPATIALC_EMU_FN void release_exit_stores() {
    std::lock_guard<std::mutex> lk(exit_stores_mu);
    land_stores(exit_stores);
    exit_stores.clear();
}

// With the lock held, by the thread whose arrival (or return) completes the barrier.
SPATIALC_EMU_FN void complete_block_barrier(Block& b, int waiters) {
    GlobalStores all;  // every thread's pending global stores, now every thread's to release
    for (int i = 0; i < b.nthreads; ++i) share_stores(all, b.threads[i].gstores);
    for (int i = 0; i < b.nthreads; ++i) {
        apply_stores(b.threads[i]);
        if (!all.empty()) b.threads[i].gstores = all;
    }
    b.blocked -= waiters;
    b.bar_arrived = 0;
    b.bar_gen.fetch_add(1, std::memory_order_release);
    b.bar_gen.notify_all();
    progress.fetch_add(1, std::memory_order_relaxed);
}

SPATIALC_EMU_FN void complete_warp_barrier(Block& b, int w, int waiters) {
    const int lo = w * kWarp, hi = std::min(b.nthreads, lo + kWarp);
    for (int i = lo; i < hi; ++i) apply_stores(b.threads[i]);
    b.blocked -= waiters;
    b.warp_arrived[(size_t)w] = 0;
    b.warp_gen[w].fetch_add(1, std::memory_order_release);
    b.warp_gen[w].notify_all();
    progress.fetch_add(1, std::memory_order_relaxed);
}

// Until `gen` moves on from `seen`: a few yields first (the last arrivals are usually runnable), then sleep.
SPATIALC_EMU_FN void await_generation(std::atomic<unsigned>& gen, unsigned seen) { wait_word(gen, seen); }

SPATIALC_EMU_FN void block_barrier(int line) {
    ThreadState& t = me("__syncthreads()");
    Block& b = blk();
    std::unique_lock<std::mutex> lk(b.mu);
    t.where = "__syncthreads()";
    t.where_line = line;
    if (++b.bar_arrived == b.live) {
        complete_block_barrier(b, b.bar_arrived - 1);
    } else {
        if (++b.blocked == b.live && stuck(b)) deadlock(b);
        const unsigned seen = b.bar_gen.load(std::memory_order_relaxed);
        lk.unlock();
        await_generation(b.bar_gen, seen);
    }
    t.bi.fetch_add(1, std::memory_order_relaxed);
    t.wi.fetch_add(1, std::memory_order_relaxed);
    t.where = "running";
}

SPATIALC_EMU_FN void warp_barrier(unsigned mask, int line) {
    ThreadState& t = me("__syncwarp()");
    if (mask != 0xffffffffu)
        fatal(kExitMisuse, "__syncwarp with a partial mask is not emulated (line " + std::to_string(line) + ")");
    Block& b = blk();
    const size_t w = (size_t)t.warp;
    std::unique_lock<std::mutex> lk(b.mu);
    t.where = "__syncwarp()";
    t.where_line = line;
    if (++b.warp_arrived[w] == b.warp_live[w]) {
        complete_warp_barrier(b, (int)w, b.warp_arrived[w] - 1);
    } else {
        if (++b.blocked == b.live && stuck(b)) deadlock(b);
        const unsigned seen = b.warp_gen[w].load(std::memory_order_relaxed);
        lk.unlock();
        await_generation(b.warp_gen[w], seen);
    }
    t.wi.fetch_add(1, std::memory_order_relaxed);
    t.where = "running";
}

// ---- warp shuffles -------------------------------------------------------------------------------------------------

// Until every lane of the calling thread's warp has come here as often: one meeting of a shuffle. Unlike __syncwarp
// it orders no memory access (the lanes' barrier intervals stay as they were) and lands no pending store: a shuffle
// moves registers, and a kernel that relied on one to order its shared-memory accesses would race on the GPU.
SPATIALC_EMU_FN void shuffle_meet(ThreadState& t, int line) {
    Block& b = blk();
    const size_t w = (size_t)t.warp;
    std::unique_lock<std::mutex> lk(b.mu);
    if (b.warp_live[w] != kWarp)
        fatal(kExitMisuse, "a shuffle of all 32 lanes (line " + std::to_string(line) + ") in a warp of " +
                               std::to_string(b.warp_live[w]) + " live lanes");
    t.where = "__shfl_sync()";
    t.where_line = line;
    if (++b.shfl_arrived[w] == kWarp) {
        b.blocked -= kWarp - 1;
        b.shfl_arrived[w] = 0;
        b.shfl_gen[w].fetch_add(1, std::memory_order_release);
        b.shfl_gen[w].notify_all();
        progress.fetch_add(1, std::memory_order_relaxed);
    } else {
        if (++b.blocked == b.live && stuck(b)) deadlock(b);
        const unsigned seen = b.shfl_gen[w].load(std::memory_order_relaxed);
        lk.unlock();
        await_generation(b.shfl_gen[w], seen);
    }
    t.where = "running";
}

SPATIALC_EMU_FN unsigned long long warp_shuffle(unsigned mask, unsigned long long value, int lane, bool by_xor,
                                                int width, int line) {
    ThreadState& t = me("__shfl_sync()");
    if (mask != 0xffffffffu || width != kWarp)
        fatal(kExitMisuse, "a shuffle with a partial mask or a width other than 32 is not emulated (line " +
                               std::to_string(line) + ")");
    Block& b = blk();
    const int first = t.warp * kWarp;
    b.shfl_slot[(size_t)(first + t.lane)] = value;
    shuffle_meet(t, line);  // every lane has posted its value
    const int from = (by_xor ? t.lane ^ lane : lane) & (kWarp - 1);  // a lane out of range is taken modulo 32
    const unsigned long long got = b.shfl_slot[(size_t)(first + from)];
    shuffle_meet(t, line);  // and read its source's before any lane posts its next
    return got;
}

// ---- shared regions and the race check -----------------------------------------------------------------------------

constexpr int kMaxRegions = 8192;  // a cooperative launch registers every block's dynamic rings
inline Region* regions[kMaxRegions];
inline std::atomic<int> n_regions{0};
inline std::mutex regions_mu;  // registration
inline std::mutex shadow_mu;   // every shadow update

inline char* dyn_base = nullptr;
inline size_t dyn_capacity = 0;  // allocated (kept across launches, so ring addresses stay put)
inline size_t dyn_bytes = 0;     // what the running launch asked for

SPATIALC_EMU_FN Region* find_region(const void* p) {
    const char* c = static_cast<const char*>(p);
    const int n = n_regions.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
        Region* r = regions[i];
        if (c >= r->base && c < r->base + r->bytes) return r;
    }
    return nullptr;
}

inline const void* running_kernel = nullptr;
inline std::mutex coop_mu;                // guards coop_blocks
inline std::vector<Block*> coop_blocks;  // the blocks of a running cooperative launch (the watchdog reads them)
inline unsigned long coop_first = 0;     // the linear index of coop_blocks[0] (a cluster launch runs a cluster)

// With coop_mu held: the running block of linear index `linear`, or null.
SPATIALC_EMU_FN Block* coop_block(unsigned long linear) {
    return linear >= coop_first && linear - coop_first < coop_blocks.size() ? coop_blocks[linear - coop_first]
                                                                            : nullptr;
}

SPATIALC_EMU_FN void register_region(const char* name, void* base, size_t elem, size_t depth, size_t page,
                                     bool dynamic) {
    std::lock_guard<std::mutex> lk(regions_mu);
    const int n = n_regions.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i)
        if (regions[i]->base == base && std::strcmp(regions[i]->name, name) == 0) return;
    if (n == kMaxRegions) fatal(kExitMisuse, "more than " + std::to_string(kMaxRegions) + " shared regions registered");
    Region* r = new Region{};
    std::snprintf(r->name, sizeof r->name, "%s", name);
    r->base = static_cast<char*>(base);
    r->elem = elem;
    r->depth = depth;
    r->page = page;
    r->bytes = elem * depth * page;
    r->dynamic = dynamic;
    r->origin = dynamic ? dynamic_shared() : r->base;
    r->owner = blk().dyn ? &blk() : nullptr;
    r->kernel = running_kernel;
    r->shadow.assign(r->bytes, ByteShadow{});
    regions[n] = r;
    n_regions.store(n + 1, std::memory_order_release);
}

SPATIALC_EMU_FN char* dynamic_shared() { return blk().dyn ? blk().dyn : dyn_base; }

SPATIALC_EMU_FN void prepare_dynamic(size_t bytes) {
    if (bytes > dyn_capacity || !dyn_base) {
        std::free(dyn_base);
        // On 1024 bytes, as the sm_90a form's swizzled stages need (and check): the GPU's dynamic block is there too.
        dyn_capacity = std::max<size_t>(1024, (bytes + 1023) & ~size_t(1023));
        dyn_base = static_cast<char*>(std::aligned_alloc(1024, dyn_capacity));
    }
    dyn_bytes = bytes;
}

SPATIALC_EMU_FN void check_dynamic_ring(const char* name, char* base, size_t off, size_t bytes) {
    if (base != dynamic_shared() || off + bytes > dyn_bytes)
        fatal(kExitMisuse, std::string("shared ring '") + name + "' needs bytes [" + std::to_string(off) + ", " +
                               std::to_string(off + bytes) + ") of the dynamic block, but the launch gave " +
                               std::to_string(dyn_bytes) + " bytes");
    if (off % 16)
        fatal(kExitMisuse, std::string("shared ring '") + name + "' starts at offset " + std::to_string(off) +
                               " of the dynamic block, not a multiple of 16");
}

// Every block starts with fresh (garbage) shared memory and no recorded accesses.
SPATIALC_EMU_FN void reset_shared_for_block() {
    const int n = n_regions.load();
    for (int i = 0; i < n; ++i) {
        std::fill(regions[i]->shadow.begin(), regions[i]->shadow.end(), ByteShadow{});
        std::memset(regions[i]->base, kPoison, regions[i]->bytes);
    }
    if (dynamic_shared() && dyn_bytes) std::memset(dynamic_shared(), kPoison, dyn_bytes);
}

// Whether the earlier access `a` and the access `b` that thread `t` makes now race.
SPATIALC_EMU_FN bool conflicts(const Access& a, const Access& b, const ThreadState& t) {
    if (a.tid < 0 || b.tid < 0) return false;
    // Two blocks' accesses (a peer's dsmem store and the receiver's own): ordered only by b's block having acquired a
    // release of a's made after a (emu_global.h).
    if (a.blk >= 0 && b.blk >= 0 && a.blk != b.blk)
        return known_epoch((unsigned long)b.blk, (unsigned long)a.blk) <= a.gep;
    if (a.tid == b.tid || a.bi != b.bi) return false;
    const bool same_warp = a.tid / kWarp == b.tid / kWarp;
    if (same_warp && a.wi != b.wi) return false;
    return !((size_t)a.tid < t.vc.size() && t.vc[(size_t)a.tid] >= a.clk);  // an mbarrier phase between them
}

SPATIALC_EMU_FN std::string who(const Access& a) {
    const char* what = a.kind == AccessKind::cp_async     ? "a cp.async landing"
                       : a.kind == AccessKind::frag_load  ? "a fragment load (load_matrix_sync)"
                       : a.kind == AccessKind::frag_store ? "a fragment store (store_matrix_sync)"
                       : a.kind == AccessKind::ldmatrix   ? "a fragment load (ldmatrix)"
                       : a.kind == AccessKind::acc_store  ? "an accumulator store (spatialc_store_acc)"
                       : a.kind == AccessKind::page_load  ? "a page load"
                       : a.kind == AccessKind::page_store ? "a page store"
                       : a.kind == AccessKind::tma        ? "a TMA load landing (the copy engine)"
                       : a.kind == AccessKind::wgmma      ? "a wgmma operand read (retired at wait_group)"
                       : a.kind == AccessKind::tma_store  ? "a TMA store's read (retired at wait_group.read)"
                       : a.kind == AccessKind::dsmem      ? "a distributed shared memory store (spatialc_dsmem_copy16)"
                                                          : "an access";
    if (a.kind == AccessKind::tma) return std::string(what) + " issued at line " + std::to_string(a.line);
    return std::string(what) + " by thread " + std::to_string(a.tid) + " (warp " + std::to_string(a.tid / kWarp) +
           ", lane " + std::to_string(a.tid % kWarp) + ")" +
           (a.blk >= 0 ? " of block " + std::to_string(a.blk) : std::string()) + " at line " + std::to_string(a.line);
}

[[noreturn]] SPATIALC_EMU_FN void race(const Region& r, size_t off, const Access& earlier, const Access& now) {
    const size_t page_bytes = r.page * r.elem;
    const size_t slot = page_bytes ? off / page_bytes : 0;
    if (earlier.blk >= 0 && now.blk >= 0 && earlier.blk != now.blk)
        fatal(kExitRace, "RACE between blocks on shared ring '" + std::string(r.name) + "' slot " +
                             std::to_string(slot) + " of block " +
                             std::to_string(r.owner ? static_cast<const Block*>(r.owner)->block_linear
                                                    : blk().block_linear) +
                             " (byte " + std::to_string(page_bytes ? off % page_bytes : off) + " of the page): " +
                             who(earlier) + " and " + who(now) + " touch the same bytes, and block " +
                             std::to_string(now.blk) + " acquired no release of block " + std::to_string(earlier.blk) +
                             " made after the first (a wait for the valid or ready flag missing?)");
    fatal(kExitRace, "RACE on shared ring '" + std::string(r.name) + "' slot " + std::to_string(slot) + " (byte " +
                         std::to_string(page_bytes ? off % page_bytes : off) + " of the page; depth " +
                         std::to_string(r.depth) + "; block " +
                         std::to_string(r.owner ? static_cast<const Block*>(r.owner)->block_linear
                                                : blk().block_linear) +
                         "): " +
                         who(earlier) + " and " + who(now) +
                         " touch the same bytes with no __syncthreads() between them (both after " +
                         std::to_string(now.bi) + " block barriers) and no mbarrier phase ordering them");
}

SPATIALC_EMU_FN void track_bytes(Region& r, size_t off, size_t n, bool write, const Access& a, const ThreadState& t) {
    for (size_t i = 0; i < n; ++i) {
        ByteShadow& s = r.shadow[off + i];
        if (conflicts(s.w, a, t)) race(r, off + i, s.w, a);
        if (write) {
            if (conflicts(s.r0, a, t)) race(r, off + i, s.r0, a);
            if (conflicts(s.r1, a, t)) race(r, off + i, s.r1, a);
            s.w = a;
            s.r0 = s.r1 = Access{};
        } else if (s.r0.tid < 0 || s.r0.tid == a.tid || s.r0.bi != a.bi) {
            s.r0 = a;
        } else {
            s.r1 = a;  // readers of two different threads: one of them differs from any later writer
        }
    }
}

// The calling thread's access now, of `kind`, at `line`.
inline Access access_now(AccessKind kind, int line) {
    const ThreadState& t = *self;
    const unsigned long b = blk().block_linear;
    return Access{t.tid, t.bi.load(std::memory_order_relaxed), t.wi.load(std::memory_order_relaxed), line, kind, t.clk,
                  (long)b, block_epoch(b)};
}

// `each(region, offset)` for every pointer of an access `a` of `size` bytes that lands in a registered shared region,
// under the shadow lock; an access past a region's end is a misuse.
template <class Each>
void each_tracked(const void* const* ptrs, int count, size_t size, const Access& a, Each&& each) {
    std::lock_guard<std::mutex> lk(shadow_mu);
    for (int k = 0; k < count; ++k) {
        Region* r = find_region(ptrs[k]);
        if (!r) continue;
        const size_t off = (size_t)(static_cast<const char*>(ptrs[k]) - r->base);
        if (off + size > r->bytes)
            fatal(kExitMisuse, who(a) + " runs past the end of shared ring '" + r->name + "'");
        each(*r, off);
    }
}

// A write into the source of a TMA store still in flight (its group not yet waited for by its issuing thread).
SPATIALC_EMU_FN void check_store_reads(const void* const* ptrs, int count, size_t size, const Access& a) {
    std::lock_guard<std::mutex> lk(shadow_mu);
    for (const Block::StoreRead& s : blk().store_reads)
        for (int k = 0; k < count; ++k) {
            const char* p = static_cast<const char*>(ptrs[k]);
            if (p + size > s.src && p < s.src + s.bytes)
                fatal(kExitRace, "RACE: " + who(a) + " writes shared memory the TMA store issued at line " +
                                     std::to_string(s.line) + " by thread " + std::to_string(s.tid) +
                                     " may still be reading (no spatialc_bulk_wait_read has retired it)");
        }
}

SPATIALC_EMU_FN void track(const void* const* ptrs, int count, size_t size, bool write, AccessKind kind, int line) {
    const Access a = access_now(kind, line);
    if (write && blk().n_store_reads.load(std::memory_order_acquire)) check_store_reads(ptrs, count, size, a);
    each_tracked(ptrs, count, size, a, [&](Region& r, size_t off) { track_bytes(r, off, size, write, a, *self); });
}

SPATIALC_EMU_FN void check_wmma_pointer(const void* p, unsigned ldm, size_t elem, const char* what, int line) {
    if ((ldm * elem) % 16)
        fatal(kExitMisuse, std::string(what) + " at line " + std::to_string(line) + ": leading dimension " +
                               std::to_string(ldm) + " is not a multiple of 16 bytes");
    const Region* r = find_region(p);
    if (!r) return;
    const char* origin = r->origin;
    const size_t off = (size_t)(static_cast<const char*>(p) - origin);
    if (off % 32)
        fatal(kExitMisuse, std::string(what) + " at line " + std::to_string(line) + ": pointer into shared ring '" +
                               r->name + "' at byte " + std::to_string(off) + " of " +
                               (r->dynamic ? "the dynamic block" : "the ring") + ", not 256-bit aligned");
}

// ldmatrix reads shared memory only, from 16-byte aligned rows (emu_mma.h).
SPATIALC_EMU_FN void check_ldsm(const void* tile, const char* what, int line) {
    const Region* r = find_region(tile);
    if (!r)
        fatal(kExitMisuse, std::string(what) + " at line " + std::to_string(line) +
                               ": the tile is not in a shared ring (ldmatrix reads shared memory only)");
    if ((size_t)(static_cast<const char*>(tile) - r->origin) % 16)
        fatal(kExitMisuse, std::string(what) + " at line " + std::to_string(line) + ": tile in shared ring '" +
                               r->name + "' is not 16-byte aligned");
}

// ---- cp.async ---------------------------------------------------------------------------------------------------------

SPATIALC_EMU_FN void land(const Copy& c) {
    const void* p = c.dst;
    track(&p, 1, (size_t)c.size, true, AccessKind::cp_async, c.line);
    std::memcpy(c.dst, c.data, (size_t)c.size);
}

SPATIALC_EMU_FN void pipeline_copy(void* dst, const void* src, size_t size, size_t zfill, int line) {
    ThreadState& t = me("__pipeline_memcpy_async");
    if ((size != 4 && size != 8 && size != 16) || zfill > size || reinterpret_cast<uintptr_t>(dst) % size ||
        reinterpret_cast<uintptr_t>(src) % size)
        fatal(kExitMisuse, "__pipeline_memcpy_async at line " + std::to_string(line) + ": " + std::to_string(size) +
                               " bytes, zero-fill " + std::to_string(zfill) +
                               " (4, 8 or 16 bytes, source and destination aligned to it)");
    global_read(src, size - zfill, "a cp.async read (__pipeline_memcpy_async)", line);
    Copy c{static_cast<char*>(dst), {}, (int)size, line};
    std::memcpy(c.data, src, size - zfill);
    std::memset(c.data + (size - zfill), 0, zfill);
    if (kLate)
        t.open.push_back(c);
    else
        land(c);
}

SPATIALC_EMU_FN void pipeline_commit() {
    ThreadState& t = me("__pipeline_commit");
    t.groups.push_back(std::move(t.open));
    t.open.clear();
}

SPATIALC_EMU_FN void pipeline_wait(size_t prior) {
    ThreadState& t = me("__pipeline_wait_prior");
    size_t landed = 0;
    for (; t.groups.size() - landed > prior; ++landed)
        for (const Copy& c : t.groups[landed]) land(c);
    t.groups.erase(t.groups.begin(), t.groups.begin() + (std::ptrdiff_t)landed);
}

// ---- mbarriers ------------------------------------------------------------------------------------------------------

SPATIALC_EMU_FN void join(std::vector<unsigned>& into, const std::vector<unsigned>& from) {
    if (into.size() < from.size()) into.resize(from.size(), 0);
    for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

// "full_1[2]": the ring region and slot an mbarrier lives in, or its address.
SPATIALC_EMU_FN std::string mbar_name(const void* bar) {
    const Region* r = find_region(bar);
    if (!r) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "mbarrier at %p", bar);
        return buf;
    }
    const size_t off = (size_t)(static_cast<const char*>(bar) - r->base);
    return std::string(r->name) + "[" + std::to_string(off / 8) + "]";
}

SPATIALC_EMU_FN std::string describe_mbarriers(Block& b) {
    std::string out;
    for (const auto& [id, m] : b.named)
        if (m->waiters)
            out += "; named barrier " + std::to_string(id) + " has " + std::to_string(m->count - m->pending) +
                   " of " + std::to_string(m->count) + " threads";
    for (const auto& [bar, m] : b.mbars) {
        if (!m->waiters) continue;
        out += "; " + mbar_name(bar) + " in phase " + std::to_string(m->phase) + " (parity " +
               std::to_string(m->phase & 1) + ") has " + std::to_string(m->count - m->pending) + " of " +
               std::to_string(m->count) + " arrivals";
        if (m->tx > 0) out += " and waits for " + std::to_string(m->tx) + " more bytes of TMA loads (expect_tx)";
    }
    return out;
}

SPATIALC_EMU_FN MBar& find_mbar_in(Block& b, const void* bar, const char* what, int line) {
    auto it = b.mbars.find(bar);
    if (it == b.mbars.end())
        fatal(kExitMisuse, std::string(what) + " at line " + std::to_string(line) + " on " + mbar_name(bar) +
                               ", which spatialc_mbar_init never initialised in block " +
                               std::to_string(b.block_linear));
    return *it->second;
}

SPATIALC_EMU_FN MBar& find_mbar(const void* bar, const char* what, int line) {
    auto it = blk().mbars.find(bar);
    if (it == blk().mbars.end())
        fatal(kExitMisuse, std::string(what) + " at line " + std::to_string(line) + " on " + mbar_name(bar) +
                               ", which spatialc_mbar_init never initialised in this block");
    const MBar& m = *it->second;
    if (self && self->tid != m.init_tid && self->bi.load(std::memory_order_relaxed) <= m.init_bi)
        fatal(kExitRace, "RACE: " + std::string(what) + " at line " + std::to_string(line) + " by thread " +
                             std::to_string(self->tid) + " uses " + mbar_name(bar) + ", which thread " +
                             std::to_string(m.init_tid) + " initialised at line " + std::to_string(m.init_line) +
                             " with no __syncthreads() between them");
    return *it->second;
}

SPATIALC_EMU_FN void mbar_init(void* bar, unsigned count, int line) {
    me("spatialc_mbar_init");
    if (reinterpret_cast<uintptr_t>(bar) % 8)
        fatal(kExitMisuse, "spatialc_mbar_init at line " + std::to_string(line) + ": an mbarrier is 8-byte aligned");
    if (count == 0 || count >= (1u << 20))
        fatal(kExitMisuse, "spatialc_mbar_init at line " + std::to_string(line) + ": arrival count " +
                               std::to_string(count) + " (1 to 2^20 - 1)");
    std::lock_guard<std::mutex> lk(blk().mu);
    auto& m = blk().mbars[bar];
    m.reset(new MBar{});
    m->count = m->pending = count;
    m->init_tid = self->tid;
    m->init_line = line;
    m->init_bi = self->bi.load(std::memory_order_relaxed);
    m->init_cbi = self->cbi;
    m->engine = blk().nthreads + (int)blk().mbars.size() - 1;
}

// With the block's lock held, by the arrival that completes the phase.
SPATIALC_EMU_FN void complete_mbar(Block& b, MBar& m) {
    for (const Copy& c : m.async) std::memcpy(c.dst, c.data, (size_t)c.size);
    m.async.clear();
    m.gdone[m.phase & 1] = std::move(m.gacc);
    m.gacc.clear();
    m.vc_done[m.phase & 1] = std::move(m.vc_acc);
    m.vc_acc.clear();
    m.peer_done[m.phase & 1] = std::move(m.peer_acc);
    m.peer_acc.clear();
    m.peer_epoch_done[m.phase & 1] = std::move(m.peer_epoch_acc);
    m.peer_epoch_acc.clear();
    m.peer_touched[m.phase & 1] = !m.peer_done[m.phase & 1].empty() || m.peer_bytes;
    ++m.phase;
    if (m.peer_bytes) m.peer_phase = m.phase;
    m.peer_bytes = false;
    m.pending = m.count;
    b.blocked -= m.waiters;
    m.waiters = 0;
    m.gen.fetch_add(1, std::memory_order_release);
    m.gen.notify_all();
    progress.fetch_add(1, std::memory_order_relaxed);
}

// With the lock held, once every arrival is in: the phase completes if every expected byte has landed too.
SPATIALC_EMU_FN void settle_mbar(Block& b, MBar& m) {
    if (m.tx < 0)
        fatal(kExitMisuse, "an mbarrier phase received " + std::to_string(-m.tx) +
                               " bytes of TMA loads more than its expect_tx announced");
    if (m.tx == 0) complete_mbar(b, m);
}

SPATIALC_EMU_FN void arrive_locked(ThreadState& t, MBar& m) {
    apply_stores(t);  // an arrival releases: the thread's fragment stores are visible to whoever waits on the phase
    share_stores(m.gacc, t.gstores);  // its global ones it shares, still pending
    join(m.vc_acc, t.vc);
    if (m.vc_acc.size() <= (size_t)t.tid) m.vc_acc.resize((size_t)t.tid + 1, 0);
    m.vc_acc[(size_t)t.tid] = std::max(m.vc_acc[(size_t)t.tid], t.clk);
    ++t.clk;  // what this thread does from now on is not ordered by this arrival
    if (m.pending == 0)
        fatal(kExitMisuse, "an arrival on an mbarrier whose phase has all its arrivals (thread " +
                               std::to_string(t.tid) + "): the barrier was initialised with too small a count");
    if (--m.pending == 0) settle_mbar(blk(), m);
}

SPATIALC_EMU_FN void mbar_arrive(void* bar, int line) {
    ThreadState& t = me("spatialc_mbar_arrive");
    std::lock_guard<std::mutex> lk(blk().mu);
    arrive_locked(t, find_mbar(bar, "spatialc_mbar_arrive", line));
}

SPATIALC_EMU_FN void mbar_cp_async_arrive(void* bar, int line) {
    ThreadState& t = me("spatialc_cp_async_arrive");
    std::vector<Copy> copies;
    for (auto& g : t.groups) copies.insert(copies.end(), g.begin(), g.end());
    copies.insert(copies.end(), t.open.begin(), t.open.end());
    t.groups.clear();
    t.open.clear();
    for (const Copy& c : copies) {  // the copy may land at any time from now: checked as this thread's write now
        const void* p = c.dst;
        track(&p, 1, (size_t)c.size, true, AccessKind::cp_async, c.line);
    }
    std::lock_guard<std::mutex> lk(blk().mu);
    MBar& m = find_mbar(bar, "spatialc_cp_async_arrive", line);
    m.async.insert(m.async.end(), copies.begin(), copies.end());
    arrive_locked(t, m);
}

// With the lock held: wait, counted as blocked, until `m` completes the phase it is in (`t.where` says what for).
SPATIALC_EMU_FN void sleep_through_phase(Block& b, MBar& m, std::unique_lock<std::mutex>& lk) {
    const unsigned long long phase = m.phase;
    ++m.waiters;
    if (++b.blocked == b.live && stuck(b)) deadlock(b);
    while (m.phase == phase) {
        const unsigned seen = m.gen.load(std::memory_order_relaxed);
        lk.unlock();
        await_generation(m.gen, seen);
        lk.lock();
    }
}

// What a thread learns by passing a completed phase of `parity`: the clocks of every arrival in it.
SPATIALC_EMU_FN void learn(ThreadState& t, Block& b, const MBar& m, unsigned parity) {
    if (t.vc.size() < (size_t)b.nthreads) t.vc.resize((size_t)b.nthreads, 0);
    join(t.vc, m.vc_done[parity & 1]);
    for (const auto& [from, vc] : m.peer_done[parity & 1]) join(t.peer_vc[from], vc);
    for (const auto& [from, e] : m.peer_epoch_done[parity & 1]) learn_epoch(b.block_linear, from, e);
    share_stores(t.gstores, m.gdone[parity & 1]);  // it may release them now
    t.where = "running";
}

SPATIALC_EMU_FN void mbar_wait(void* bar, unsigned parity, int line, bool cluster) {
    ThreadState& t = me("spatialc_mbar_wait");
    Block& b = blk();
    std::unique_lock<std::mutex> lk(b.mu);
    MBar& m = find_mbar(bar, "spatialc_mbar_wait", line);
    while ((m.phase & 1) == (parity & 1)) {
        std::snprintf(t.where_buf, sizeof t.where_buf, "waits on %s for phase %llu (parity %u) to complete",
                      mbar_name(bar).c_str(), m.phase, parity & 1);
        t.where = t.where_buf;
        t.where_line = line;
        sleep_through_phase(b, m, lk);
    }
    m.waited = std::max(m.waited, m.phase);  // the thread passed phase m.phase - 1
    if (!cluster && m.peer_touched[parity & 1])
        fatal(kExitRace, "RACE between blocks: spatialc_mbar_wait at line " + std::to_string(line) + " passes a "
                         "phase of " + mbar_name(bar) + " that a peer block completed (its arrival or its multicast "
                         "bytes), acquiring at CTA scope only: what the peer wrote is not ordered before this thread's "
                         "reads (wait at cluster scope: spatialc_mbar_wait_cluster)");
    learn(t, b, m, parity);
}

// ---- sm_90a: tensor maps, TMA loads and transaction counts (emu_hopper.h) -------------------------------------------

SPATIALC_EMU_FN void track_async_read(const void* const* ptrs, int count, size_t size, AccessKind kind, int line,
                                      const std::vector<unsigned>& known) {
    const Access a = access_now(kind, line);
    ThreadState then;  // the thread as it was when it issued the read: only its knowledge of the others matters
    then.vc = known;
    each_tracked(ptrs, count, size, a, [&](Region& r, size_t off) {
        for (size_t i = 0; i < size; ++i)  // the write a read issued then could have missed
            if (conflicts(r.shadow[off + i].w, a, then)) race(r, off + i, r.shadow[off + i].w, a);
        track_bytes(r, off, size, false, a, *self);
    });
}

SPATIALC_EMU_FN CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                      const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
    // The driver's own refusals (cuTensorMapEncodeTiled's documented requirements), so a map the GPU would refuse
    // is refused here too.
    static const uint32_t sizes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2};
    if (!map || (unsigned)type > 9 || rank < 1 || rank > 5 || !base || reinterpret_cast<uintptr_t>(base) % 16 ||
        interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    TensorMapFields f{};
    f.magic = kTensorMapMagic;
    f.elem = sizes[type];
    f.rank = rank;
    f.swizzle = swizzle == CU_TENSOR_MAP_SWIZZLE_NONE ? 0 : 16u << (unsigned)swizzle;
    f.base = static_cast<const char*>(base);
    f.stride[0] = f.elem;
    for (cuuint32_t i = 0; i < rank; ++i) {
        if (dims[i] == 0 || dims[i] > (1ull << 32) || box[i] == 0 || box[i] > 256 || element_strides[i] != 1)
            return CUDA_ERROR_INVALID_VALUE;
        f.dim[i] = dims[i];
        f.box[i] = (uint16_t)box[i];
        if (i > 0) {
            if (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40)) return CUDA_ERROR_INVALID_VALUE;
            f.stride[i] = strides[i - 1];
        }
    }
    if ((box[0] * f.elem) % 16 || (f.swizzle && box[0] * f.elem > f.swizzle)) return CUDA_ERROR_INVALID_VALUE;
    {
        std::lock_guard<std::mutex> lk(allocations_mu);
        auto it = allocations.upper_bound(f.base);
        if (it != allocations.begin() && f.base < (--it)->first + it->second) f.end = it->first + it->second;
    }
    std::memset(map, 0, sizeof *map);
    std::memcpy(map, &f, sizeof f);
    return CUDA_SUCCESS;
}

// With the block's lock held: a barrier the copy engine signals must be visible to the async proxy.
SPATIALC_EMU_FN void check_async_visible(const void* bar, const MBar& m, const char* what, int line) {
    if (!m.async_visible)
        fatal(kExitRace, "RACE between the proxies: " + std::string(what) + " at line " + std::to_string(line) +
                             " signals " + mbar_name(bar) + " through the copy engine (the async proxy), but no "
                             "fence.proxy.async followed its initialisation at line " + std::to_string(m.init_line) +
                             " by thread " + std::to_string(m.init_tid) + ": the copy engine may see it uninitialised");
}

SPATIALC_EMU_FN void mbar_expect_tx(void* bar, unsigned bytes, int line) {
    me("spatialc_mbar_expect_tx");
    std::lock_guard<std::mutex> lk(blk().mu);
    MBar& m = find_mbar(bar, "spatialc_mbar_expect_tx", line);
    check_async_visible(bar, m, "spatialc_mbar_expect_tx", line);
    m.tx += bytes;
}

// The bytes added and the arrival made under one hold of the lock, as the one instruction does: no landing can come
// between them.
SPATIALC_EMU_FN void mbar_arrive_expect_tx(void* bar, unsigned bytes, int line) {
    ThreadState& t = me("spatialc_mbar_arrive_expect_tx");
    std::lock_guard<std::mutex> lk(blk().mu);
    MBar& m = find_mbar(bar, "spatialc_mbar_arrive_expect_tx", line);
    check_async_visible(bar, m, "spatialc_mbar_arrive_expect_tx", line);
    m.tx += bytes;
    arrive_locked(t, m);
}

// fence.mbarrier_init.release.cluster: the barriers this thread initialised become visible to the cluster's other
// blocks (after a cluster barrier), which may then arrive on them or complete their transactions.
SPATIALC_EMU_FN void fence_barrier_init() {
    ThreadState& t = me("spatialc_fence_barrier_init");
    std::lock_guard<std::mutex> lk(blk().mu);
    for (auto& [bar, m] : blk().mbars)
        if (m->init_tid == t.tid) m->cluster_visible = true;
}

// A peer block's use of barrier `m` of block `o`: only after its initialisation was fenced for the cluster and a
// cluster barrier followed (else the peer may find it uninitialised).
SPATIALC_EMU_FN void check_peer_use(const ThreadState& t, Block& o, const void* bar, const MBar& m,
                                    const std::string& where, const char* does) {
    const std::string head = "RACE between blocks: " + where + " " + does + " " + mbar_name(bar) + " of block " +
                             std::to_string(o.block_linear) + ", initialised at line " + std::to_string(m.init_line);
    if (!m.cluster_visible)
        fatal(kExitRace, head + " with no fence.mbarrier_init after it (spatialc_fence_barrier_init): the "
                                "initialisation need not be visible to the peer");
    if (t.cbi <= m.init_cbi)
        fatal(kExitRace, head + " with no cluster barrier since (spatialc_cluster_sync): it may be uninitialised");
}

SPATIALC_EMU_FN void fence_proxy_async(int) {
    ThreadState& t = me("spatialc_fence_proxy_async");
    std::lock_guard<std::mutex> lk(blk().mu);
    for (auto& [bar, m] : blk().mbars)
        if (m->init_tid == t.tid) m->async_visible = true;
    t.fenced_bi.store(t.bi.load(std::memory_order_relaxed), std::memory_order_relaxed);
    t.fenced_wi.store(t.wi.load(std::memory_order_relaxed), std::memory_order_relaxed);
    t.fenced_clk.store(t.clk, std::memory_order_release);  // what it wrote so far; its next writes come after
    const unsigned n = t.n_fences.load(std::memory_order_relaxed);
    ThreadState::Fence& f = t.fences[n % ThreadState::kFences];
    f.clk.store(t.clk, std::memory_order_relaxed);
    f.bi.store(t.bi.load(std::memory_order_relaxed), std::memory_order_relaxed);
    f.wi.store(t.wi.load(std::memory_order_relaxed), std::memory_order_relaxed);
    t.n_fences.store(n + 1, std::memory_order_release);
    ++t.clk;
}

// ---- sm_90a: TMA stores from shared memory, in bulk groups -----------------------------------------------------

// A box of shared memory a TMA store reads when its group is waited for (late mode) or at once (early mode).
struct BulkStore {
    TensorMapFields f;
    int coords[5];
    const char* src;
    int line;
    std::vector<unsigned> known;  // the issuing thread's clocks when it issued the store
};
inline thread_local std::vector<BulkStore> bulk_open;
inline thread_local std::vector<std::vector<BulkStore>> bulk_groups;

// The copy engine reads the box (checked as a read the issuing thread may make any time from its issue on) and
// writes the elements inside the tensor to global memory.
SPATIALC_EMU_FN void run_bulk_store(const BulkStore& s) {
    const TensorMapFields& f = s.f;
    size_t n = f.elem;
    for (uint32_t i = 0; i < f.rank; ++i) n *= f.box[i];
    std::vector<const void*> chunks;
    for (size_t off = 0; off < n; off += 16) chunks.push_back(s.src + off);
    track_async_read(chunks.data(), (int)chunks.size(), 16, AccessKind::tma_store, s.line, s.known);
    uint32_t idx[5] = {0, 0, 0, 0, 0};
    for (size_t e = 0; e * f.elem < n; ++e) {
        bool inside = true;
        size_t dst = 0;
        for (uint32_t d = 0; d < f.rank; ++d) {
            const long long c = (long long)s.coords[d] + idx[d];
            if (c < 0 || (uint64_t)c >= f.dim[d]) inside = false;
            else dst += (size_t)c * f.stride[d];
        }
        if (inside) {
            if (f.end && f.base + dst + f.elem > f.end)
                fatal(kExitMisuse, "spatialc_tma_store at line " + std::to_string(s.line) + ": the box writes past "
                                   "the end of the tensor's allocation");
            global_write(f.base + dst, f.elem, "a TMA store (spatialc_tma_store)", s.line);
            // A swizzled box is read as it would have been landed by a load of the same map: by address.
            uintptr_t a = reinterpret_cast<uintptr_t>(s.src) + e * f.elem;
            if (f.swizzle) a ^= ((a >> 7) & (f.swizzle / 16 - 1)) << 4;
            std::memcpy(const_cast<char*>(f.base) + dst, reinterpret_cast<const char*>(a), f.elem);
        }
        for (uint32_t d = 0; d < f.rank && ++idx[d] == f.box[d]; ++d) idx[d] = 0;
    }
}

// A read through the async proxy (a TMA store's copy engine, a wgmma's operand) of shared-memory bytes the thread
// `w` wrote: that writer must have fenced (fence.proxy.async) since the write, and a fence of its since the write
// must come before the reader's issue — the reader's own, one a warp or block barrier separates from it, or one an
// mbarrier phase (a named barrier's too) the reader waited on carried. Any of its fences since the write will do: one
// ordered before the issue orders the first. The caller holds shadow_mu.
SPATIALC_EMU_FN void check_proxy_fenced(const Access& w, const ThreadState& t, const std::string& where,
                                        const char* reader, const char* order) {
    const ThreadState& writer = blk().threads[w.tid];
    if (w.clk > writer.fenced_clk.load(std::memory_order_acquire))
        fatal(kExitRace, "RACE between the proxies: " + where + " reads shared-memory bytes that " + who(w) +
                             " wrote with no fence.proxy.async since: " + reader + " may read them stale");
    bool ordered = w.tid == t.tid;
    const unsigned n_f = writer.n_fences.load(std::memory_order_acquire);
    for (unsigned i = n_f > ThreadState::kFences ? n_f - ThreadState::kFences : 0; i < n_f && !ordered; ++i) {
        const ThreadState::Fence& f = writer.fences[i % ThreadState::kFences];
        const unsigned clk = f.clk.load(std::memory_order_relaxed);
        if (clk < w.clk) continue;
        ordered = (w.tid / kWarp == t.tid / kWarp &&
                   f.wi.load(std::memory_order_relaxed) < t.wi.load(std::memory_order_relaxed)) ||
                  f.bi.load(std::memory_order_relaxed) < t.bi.load(std::memory_order_relaxed) ||
                  ((size_t)w.tid < t.vc.size() && t.vc[(size_t)w.tid] > clk);
    }
    if (!ordered)
        fatal(kExitRace, "RACE between the proxies: " + where + " reads shared-memory bytes that " + who(w) +
                             " wrote and fenced (fence.proxy.async), but nothing orders that fence before " + order);
}

SPATIALC_EMU_FN void tma_store(const CUtensorMap* map, const int* coords, int rank, const void* src, int line) {
    ThreadState& t = me("spatialc_tma_store");
    const std::string where = "spatialc_tma_store_" + std::to_string(rank) + "d at line " + std::to_string(line);
    BulkStore s;
    std::memcpy(&s.f, map, sizeof s.f);
    if (s.f.magic != kTensorMapMagic) fatal(kExitMisuse, where + ": not a tensor map cuTensorMapEncodeTiled made");
    if ((int)s.f.rank != rank)
        fatal(kExitMisuse, where + ": a map of rank " + std::to_string(s.f.rank) + " used with " +
                               std::to_string(rank) + " coordinates");
    std::copy(coords, coords + rank, s.coords);
    s.src = static_cast<const char*>(src);
    s.line = line;
    s.known = t.vc;
    if (!find_region(src)) fatal(kExitMisuse, where + ": the source is not in a shared ring");
    if (reinterpret_cast<uintptr_t>(src) % 128) fatal(kExitMisuse, where + ": the source is not on 128 bytes");
    if (s.f.swizzle && reinterpret_cast<uintptr_t>(src) % (8 * s.f.swizzle))
        fatal(kExitMisuse, where + ": a box swizzled " + std::to_string(s.f.swizzle) + " bytes wide not on " +
                               std::to_string(8 * s.f.swizzle) + " bytes");
    // The copy engine reads through the async proxy: every byte's last writer must have fenced since writing it.
    size_t n = s.f.elem;
    for (uint32_t i = 0; i < s.f.rank; ++i) n *= s.f.box[i];
    {
        std::lock_guard<std::mutex> lk(shadow_mu);
        for (size_t off = 0; off < n; ++off) {
            Region* r = find_region(s.src + off);
            if (!r) fatal(kExitMisuse, where + ": the box runs past its shared ring");
            const Access& w = r->shadow[(size_t)(s.src + off - r->base)].w;
            if (w.tid < 0 || w.tid >= blk().nthreads || w.kind == AccessKind::tma) continue;
            check_proxy_fenced(w, t, where, "the copy engine",
                               "the store's issue (a __syncwarp / __syncthreads after it)");
        }
    }
    if (!kLate) run_bulk_store(s);
    {
        std::lock_guard<std::mutex> lk(shadow_mu);
        blk().store_reads.push_back({s.src, n, t.tid, line});
        blk().n_store_reads.fetch_add(1, std::memory_order_release);
    }
    bulk_open.push_back(std::move(s));
}

SPATIALC_EMU_FN void bulk_commit() {
    me("spatialc_bulk_commit");
    if (!bulk_open.empty()) bulk_groups.push_back(std::move(bulk_open));
    bulk_open.clear();
}

SPATIALC_EMU_FN void bulk_wait_read(size_t n) {
    me("spatialc_bulk_wait_read");
    while (bulk_groups.size() > n) {
        for (const BulkStore& s : bulk_groups.front()) {
            if (kLate) run_bulk_store(s);
            std::lock_guard<std::mutex> lk(shadow_mu);
            auto& reads = blk().store_reads;
            const int tid = self->tid;
            reads.erase(std::find_if(reads.begin(), reads.end(),
                                     [&](const Block::StoreRead& r) { return r.src == s.src && r.tid == tid; }));
            blk().n_store_reads.fetch_sub(1, std::memory_order_release);
        }
        bulk_groups.erase(bulk_groups.begin());
    }
}

// A returning thread must have waited for its stores' reads: the shared memory they read may be gone after.
SPATIALC_EMU_FN void check_bulk_at_exit(const ThreadState& t) {
    const BulkStore* left = !bulk_open.empty() ? &bulk_open.front()
                            : !bulk_groups.empty() ? &bulk_groups.front().front()
                                                   : nullptr;
    if (left)
        fatal(kExitMisuse, "thread " + std::to_string(t.tid) + " returns with the TMA store of line " +
                               std::to_string(left->line) + (bulk_open.empty() ? "" : " never committed and") +
                               " never waited for (spatialc_bulk_wait_read): its shared-memory source may be gone "
                               "before the copy engine read it");
}

// The bytes a TMA load of `map` at `coords` lands at `dst`, in place (swizzled by address as the copy engine does,
// which for a destination on the pattern's period is the same at that offset of any block), after the checks every
// load makes.
SPATIALC_EMU_FN std::vector<char> tma_box(void* dst, const CUtensorMap* map, const int* coords, int rank,
                                          const std::string& where) {
    TensorMapFields f;
    std::memcpy(&f, map, sizeof f);
    if (f.magic != kTensorMapMagic) fatal(kExitMisuse, where + ": not a tensor map cuTensorMapEncodeTiled made");
    if ((int)f.rank != rank)
        fatal(kExitMisuse, where + ": a map of rank " + std::to_string(f.rank) + " used with " +
                               std::to_string(rank) + " coordinates");
    const uintptr_t at = reinterpret_cast<uintptr_t>(dst);
    // The destination: shared memory, 128-byte aligned; a swizzled box on the pattern's period (8 rows of its span).
    if (!find_region(dst)) fatal(kExitMisuse, where + ": the destination is not in a shared ring");
    if (at % 128 || (f.swizzle && at % (8 * f.swizzle)))
        fatal(kExitMisuse, where + ": the destination is not aligned to " +
                               std::to_string(f.swizzle ? 8 * f.swizzle : 128) + " bytes");
    size_t n = f.elem;
    for (uint32_t i = 0; i < f.rank; ++i) n *= f.box[i];
    std::vector<char> image(n);
    uint32_t idx[5] = {0, 0, 0, 0, 0};
    for (size_t e = 0; e * f.elem < n; ++e) {
        bool inside = true;
        size_t src = 0;
        for (uint32_t d = 0; d < f.rank; ++d) {
            const long long c = (long long)coords[d] + idx[d];
            if (c < 0 || (uint64_t)c >= f.dim[d]) inside = false;
            else src += (size_t)c * f.stride[d];
        }
        if (inside && f.end && f.base + src + f.elem > f.end)
            fatal(kExitMisuse, where + ": the box reads past the end of the tensor's allocation (the map's "
                                       "dimensions and strides describe more than was allocated)");
        uintptr_t a = at + e * f.elem;
        if (f.swizzle) a ^= ((a >> 7) & (f.swizzle / 16 - 1)) << 4;
        char* p = image.data() + (a - at);
        if (inside) std::memcpy(p, f.base + src, f.elem);
        else std::memset(p, 0, f.elem);
        for (uint32_t d = 0; d < f.rank && ++idx[d] == f.box[d]; ++d) idx[d] = 0;
    }
    return image;
}

// A box landing at `dst` in block `b`, counted on its barrier `bar` there. The copy engine writes, not the issuing
// thread: its write is checked now (it may land any time before the phase completes) as a thread of its own — one
// per barrier — whose clock is that phase's number, and only that barrier's completed phase publishes it. Waiting on
// another barrier (one the issuing thread arrives on later) orders nothing. `knows` is what the issuing thread knew
// of `b`'s threads: its own clocks in its own block, what remote arrivals told it in a peer.
SPATIALC_EMU_FN void land_box(Block& b, char* dst, const std::vector<char>& image, void* bar, const ThreadState& knows,
                              bool peer, int line, const std::string& where) {
    ThreadState& t = *self;
    std::unique_lock<std::mutex> lk(b.mu);
    if (b.exited)
        fatal(kExitMisuse, where + ": block " + std::to_string(blk().block_linear) + " multicasts into block " +
                               std::to_string(b.block_linear) + ", which has exited (its shared memory is gone; "
                               "a block must wait for every page a peer sends it before it exits)");
    MBar& m = find_mbar_in(b, bar, where.c_str(), line);
    check_async_visible(bar, m, where.c_str(), line);
    if (peer) check_peer_use(t, b, bar, m, where, "signals");
    const unsigned clk = (unsigned)m.phase + 1;
    const int engine = m.engine;
    lk.unlock();
    const Access a{engine, t.bi.load(std::memory_order_relaxed), 0, line, AccessKind::tma, clk};
    std::vector<const void*> written;
    for (size_t off = 0; off < image.size(); off += 16) written.push_back(dst + off);
    each_tracked(written.data(), (int)written.size(), 16, a,
                 [&](Region& r, size_t off) { track_bytes(r, off, 16, true, a, knows); });
    std::memcpy(dst, image.data(), image.size());
    lk.lock();
    if (m.vc_acc.size() <= (size_t)engine) m.vc_acc.resize((size_t)engine + 1, 0);
    m.vc_acc[(size_t)engine] = std::max(m.vc_acc[(size_t)engine], clk);
    m.tx -= (long long)image.size();
    if (peer) {
        m.peer_bytes = true;
        m.peer_line = line;
        m.peer_from = blk().block_linear;
    }
    if (m.pending == 0) settle_mbar(b, m);
}

SPATIALC_EMU_FN void tma_load(void* dst, const CUtensorMap* map, const int* coords, int rank, void* bar, int line) {
    ThreadState& t = me("spatialc_tma_load");
    const std::string where = "spatialc_tma_load_" + std::to_string(rank) + "d at line " + std::to_string(line);
    const std::vector<char> image = tma_box(dst, map, coords, rank, where);
    land_box(blk(), static_cast<char*>(dst), image, bar, t, false, line, where);
}

// A bulk copy (cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes): 16-byte aligned ends and a size
// of whole 16-byte chunks, as the PTX ISA asks; its bytes read from one launch tensor and landed as a TMA box's.
SPATIALC_EMU_FN void bulk_load(void* dst, const void* src, unsigned bytes, void* bar, int line) {
    ThreadState& t = me("spatialc_bulk_load");
    const std::string where = "spatialc_bulk_load at line " + std::to_string(line);
    if (bytes == 0 || bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
        fatal(kExitMisuse, where + ": a bulk copy's ends and size are multiples of 16 bytes");
    if (!find_region(dst)) fatal(kExitMisuse, where + ": the destination is not in a shared ring");
    global_read(src, bytes, "a bulk copy (spatialc_bulk_load)", line);
    std::vector<char> image(bytes);
    std::memcpy(image.data(), src, bytes);
    land_box(blk(), static_cast<char*>(dst), image, bar, t, false, line, where);
}

SPATIALC_EMU_FN void check_proxy_read(const void* const* ptrs, int count, size_t size, const std::string& where) {
    ThreadState& t = *self;
    std::lock_guard<std::mutex> lk(shadow_mu);
    for (int i = 0; i < count; ++i)
        for (size_t off = 0; off < size; ++off) {
            const char* p = static_cast<const char*>(ptrs[i]) + off;
            Region* r = find_region(p);
            if (!r) continue;  // (the read's own checks say where it lies)
            const Access& w = r->shadow[(size_t)(p - r->base)].w;
            if (w.tid < 0 || w.tid >= blk().nthreads || w.kind == AccessKind::tma) continue;
            check_proxy_fenced(w, t, where, "the async proxy",
                               "the read's issue (a barrier the writer arrived on after it, waited for here)");
        }
}

// ---- named barriers (bar.sync id, threads; bar.arrive id, threads) ------------------------------------------------

// The PTX ISA's barrier{.cta}: sixteen barriers a CTA, 0 being __syncthreads' own (the emulation tracks that one
// apart, `block_barrier`, so a named use of 0 is refused: on a GPU it would meet __syncthreads' arrivals), each phase
// completing once `threads` threads (a multiple of the warp size, the same for every use of the phase) have arrived
// by bar.sync or bar.arrive; bar.arrive does not wait, and an arrival releases what the thread did before it to the
// threads that pass the phase by bar.sync. A phase of arrivals like an mbarrier's, counted a thread at a time: a
// warp some of whose lanes do not arrive leaves the phase short and hangs, where the hardware marks the warp's
// arrival for its live lanes — stricter, never laxer. A thread may arrive twice in one phase (bar.arrive, then
// bar.sync on the same barrier: both count, as on a GPU — FlashAttention-3's first warpgroup gives itself the first
// turn so). A phase left part-way at the block's exit is no error: the hardware's barriers go with the block (the
// ping-pong's last arrival is such a one). An engine's barrier (`spatialc_engine_sync`, its threads meeting) and the
// ping-pong's turns (`spatialc_engine_arrive` beside it) are the same two instructions, checked by one path.

// With the lock held: the named barrier `id` of `threads` threads for `what`, checked as the PTX ISA states.
SPATIALC_EMU_FN MBar& named_barrier(Block& b, unsigned id, unsigned threads, const char* what, int line) {
    const std::string at = std::string(what) + " at line " + std::to_string(line);
    if (id >= 16) fatal(kExitMisuse, at + ": barrier " + std::to_string(id) + " (a CTA has barriers 0 to 15)");
    if (id == 0)
        fatal(kExitMisuse, at + ": barrier 0, which is __syncthreads' (named barriers are 1 to 15)");
    if (threads == 0 || threads % kWarp || (int)threads > b.nthreads)
        fatal(kExitMisuse, at + ": " + std::to_string(threads) + " threads (a multiple of 32, at most the block's)");
    auto& slot = b.named[id];
    if (!slot) slot.reset(new MBar{});
    MBar& m = *slot;
    if (m.pending == m.count) m.count = m.pending = threads;  // no thread there yet
    if (m.count != threads)
        fatal(kExitMisuse, at + ": barrier " + std::to_string(id) + " is used with " + std::to_string(threads) +
                               " and " + std::to_string(m.count) + " threads at once");
    return m;
}

// bar.sync: arrive on the named barrier and wait for its phase to complete.
SPATIALC_EMU_FN void engine_sync(unsigned id, unsigned threads, int line) {
    ThreadState& t = me("spatialc_engine_sync");
    Block& b = blk();
    std::unique_lock<std::mutex> lk(b.mu);
    MBar& m = named_barrier(b, id, threads, "spatialc_engine_sync", line);
    const unsigned long long phase = m.phase;
    arrive_locked(t, m);
    if (m.phase == phase) {
        std::snprintf(t.where_buf, sizeof t.where_buf, "waits at named barrier %u (bar.sync)", id);
        t.where = t.where_buf;
        t.where_line = line;
        sleep_through_phase(b, m, lk);
    }
    learn(t, b, m, (unsigned)(phase & 1));
}

// bar.arrive: arrive on the named barrier and go on.
SPATIALC_EMU_FN void engine_arrive(unsigned id, unsigned threads, int line) {
    ThreadState& t = me("spatialc_engine_arrive");
    Block& b = blk();
    std::lock_guard<std::mutex> lk(b.mu);
    MBar& m = named_barrier(b, id, threads, "spatialc_engine_arrive", line);
    arrive_locked(t, m);  // and goes on
}

// ---- sites that wait on each other: arrival counts in global memory --------------------------------------------------

inline std::atomic<unsigned> grid_gen{0};  // moves at every arrival: what a site waiting on another sleeps on

SPATIALC_EMU_FN void grid_add(int* word, int by, int) {
    ThreadState& t = me("spatialc_grid_add");
    release_stores_of(t);  // a release add: what the thread holds lands first
    {
        std::lock_guard<std::mutex> lk(sync_mu);  // its block's new epoch, published on the word with the add
        publish(word, release_epoch());
        std::atomic_ref<int>(*word).fetch_add(by, std::memory_order_release);
    }
    grid_gen.fetch_add(1, std::memory_order_release);
    grid_gen.notify_all();
    progress.fetch_add(1, std::memory_order_relaxed);
}

SPATIALC_EMU_FN void grid_add_relaxed(int* word, int by) {
    me("spatialc_grid_add_relaxed");  // releases nothing: the thread's pending stores stay pending
    {
        std::lock_guard<std::mutex> lk(sync_mu);  // publishes only what a __threadfence released
        publish(word, fenced_epoch());
        std::atomic_ref<int>(*word).fetch_add(by, std::memory_order_relaxed);
    }
    grid_gen.fetch_add(1, std::memory_order_release);
    grid_gen.notify_all();
    progress.fetch_add(1, std::memory_order_relaxed);
}

// A waiting thread is not "blocked" for its block's deadlock check: another block may yet release it. A grid that
// never moves again is the watchdog's to report, naming what each thread waits for.
SPATIALC_EMU_FN void grid_wait(const int* word, int value, int line) {
    ThreadState& t = me("spatialc_grid_wait");
    std::atomic_ref<int> w(*const_cast<int*>(word));
    for (;;) {
        const unsigned seen = grid_gen.load(std::memory_order_acquire);
        const int now = w.load(std::memory_order_acquire);
        if (now >= value) break;
        std::snprintf(t.where_buf, sizeof t.where_buf,
                      "waits for the count at global %p to reach %d (it is %d)", static_cast<const void*>(word),
                      value, now);
        t.where = t.where_buf;
        t.where_line = line;
        wait_word(grid_gen, seen);
    }
    {
        std::lock_guard<std::mutex> lk(sync_mu);  // the acquire: its block learns the releases published on the word
        acquire_from(word);
    }
    t.where = "running";
}

// ---- thread exit --------------------------------------------------------------------------------------------------------

// A returning thread leaves every barrier's count, and its leaving may complete one. Copies it has in flight
// still land. Its pending fragment stores stay pending until a barrier of its warp or block completes, or the
// block ends, so whether another lane sees them never depends on when this one happened to return.
SPATIALC_EMU_FN void check_bulk_at_exit(const ThreadState& t);

SPATIALC_EMU_FN void thread_exit() {
    ThreadState& t = *self;
    check_bulk_at_exit(t);
    keep_until_launch_ends(t);  // the kernel's end makes every store visible
    for (auto& g : t.groups)
        for (const Copy& c : g) land(c);
    for (const Copy& c : t.open) land(c);
    t.groups.clear();
    t.open.clear();
    Block& b = blk();
    cluster_leave(b);
    bool gone = false;
    {
        std::lock_guard<std::mutex> lk(b.mu);
        t.where = "returned";
        const size_t w = (size_t)t.warp;
        if (--b.live == 0) check_exit(b);
        gone = b.live == 0;
        --b.warp_live[w];
        progress.fetch_add(1, std::memory_order_relaxed);
        if (b.bar_arrived > 0 && b.bar_arrived == b.live) complete_block_barrier(b, b.bar_arrived);
        if (b.warp_arrived[w] > 0 && b.warp_arrived[w] == b.warp_live[w])
            complete_warp_barrier(b, (int)w, b.warp_arrived[w]);
        if (b.live > 0 && b.blocked == b.live && stuck(b)) deadlock(b);
    }
    if (!gone) return;
    // The block has gone: a peer whose threads all wait may have been waiting for it alone.
    for (Block* o : cluster_of(b)) {
        if (o == &b) continue;
        std::lock_guard<std::mutex> lk(o->mu);
        if (o->live > 0 && o->blocked == o->live && stuck(*o)) deadlock(*o);
    }
}

// ---- the watchdog: a wall-clock limit on the whole run, and one on a launch that stops making progress -----------

SPATIALC_EMU_FN double env_seconds(const char* name, double dflt) {
    const char* v = std::getenv(name);
    if (!v || !*v) return dflt;
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    return (end && *end == 0 && d > 0) ? d : dflt;
}

SPATIALC_EMU_FN void watch(double limit, double stall) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    auto last_change = t0;
    unsigned long last = progress.load();
    for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const auto now = clock::now();
        const unsigned long p = progress.load();
        if (p != last || !in_launch.load()) {
            last = p;
            last_change = now;
        }
        const double ran = std::chrono::duration<double>(now - t0).count();
        const double idle = std::chrono::duration<double>(now - last_change).count();
        if (ran <= limit && idle <= stall) continue;
        std::string state;
        if (in_launch.load()) {
            std::lock_guard<std::mutex> lk(coop_mu);
            std::vector<Block*> running = coop_blocks;
            if (running.empty()) running.push_back(&the_block);
            for (Block* b : running) {
                if (!b->mu.try_lock()) continue;
                state += " Threads of block " + std::to_string(b->block_linear) + ": " + describe_threads(*b) +
                         describe_mbarriers(*b) + ".";
                b->mu.unlock();
            }
        }
        char when[64];
        if (idle > stall && in_launch.load() && cluster_size() > 1) {
            // A cluster whose every block has exited or waits: the block-by-block check can miss it when two
            // blocks' last threads go to sleep at once (each saw the other busy).
            std::lock_guard<std::mutex> lk(coop_mu);
            bool all = !coop_blocks.empty();
            for (Block* b : coop_blocks) all = all && (b->live == 0 || b->blocked == b->live);
            if (all)
                for (Block* b : coop_blocks)
                    if (b->live > 0) {
                        coop_mu.unlock();  // deadlock() looks the cluster up itself (and never returns)
                        deadlock(*b);
                    }
        }
        if (idle > stall) {
            std::snprintf(when, sizeof when, "no progress for %.1f s", stall);
            fatal(kExitTimeout, std::string("TIMEOUT: ") + when +
                                    " (no barrier completed and no thread returned; SPATIALC_EMU_STALL_S): a thread "
                                    "spins forever or waits for something no barrier provides." + state);
        }
        std::snprintf(when, sizeof when, "%.1f s", limit);
        fatal(kExitTimeout, std::string("TIMEOUT: the run passed its wall-clock limit of ") + when +
                                " (SPATIALC_EMU_TIMEOUT_S)." + state);
    }
}

SPATIALC_EMU_FN void start_watchdog() {
    static std::once_flag once;
    std::call_once(once, [] {
        const double limit = env_seconds("SPATIALC_EMU_TIMEOUT_S", 120.0);
        const double stall = env_seconds("SPATIALC_EMU_STALL_S", std::min(limit / 2, 30.0));
        std::thread(watch, limit, stall).detach();
    });
}

// ---- progress: blocks done, for a runner that asks (SPATIALC_EMU_PROGRESS) ------------------------------------------

// `spatialc-emu progress <done> <total>` on stderr: the blocks of the running launch done so far. The first and the
// last line of a launch always come; the others at most once per SPATIALC_EMU_PROGRESS_S seconds (0.2, may be 0).
SPATIALC_EMU_FN void report_blocks(unsigned long done, unsigned long total) {
    static const bool on = [] {
        const char* v = std::getenv("SPATIALC_EMU_PROGRESS");
        return v && *v && std::strcmp(v, "0") != 0;
    }();
    if (!on) return;
    static const double every = [] {
        const char* v = std::getenv("SPATIALC_EMU_PROGRESS_S");
        char* end = nullptr;
        const double d = v && *v ? std::strtod(v, &end) : -1.0;
        return (end && *end == 0 && d >= 0) ? d : 0.2;
    }();
    using clock = std::chrono::steady_clock;
    static clock::time_point last{};
    const auto now = clock::now();
    if (done != 0 && done != total && std::chrono::duration<double>(now - last).count() < every) return;
    last = now;
    std::fprintf(stderr, "spatialc-emu progress %lu %lu\n", done, total);
    std::fflush(stderr);
}

// ---- the launch -----------------------------------------------------------------------------------------------------------

inline std::map<const void*, int> max_dynamic_smem;  // cudaFuncSetAttribute, per kernel
constexpr size_t kDynamicDefault = 48 * 1024;         // static + dynamic beyond this needs the attribute

SPATIALC_EMU_FN cudaError_t fail(cudaError_t e, const std::string& why) {
    std::fprintf(stderr, "spatialc-emu [%s]: %s\n", mode_name(), why.c_str());
    last_error = e;
    sticky_error = e;
    return e;
}

SPATIALC_EMU_FN void set_max_dynamic_smem(const void* kernel, int bytes) { max_dynamic_smem[kernel] = bytes; }

// ---- cooperative launches (emu_host.h) ------------------------------------------------------------------------------

SPATIALC_EMU_FN cudaError_t cooperative_fits(dim3 grid, dim3 block, size_t smem) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const long long held = (long long)sms * blocks_per_sm((int)(block.x * block.y * block.z), smem);
    if ((long long)grid.x * grid.y * grid.z > held)
        return fail(cudaErrorCooperativeLaunchTooLarge, "cooperative launch refused: " +
                                                            std::to_string(grid.x * grid.y * grid.z) +
                                                            " blocks, and the device holds " + std::to_string(held) +
                                                            " at once");
    return cudaSuccess;
}

// ---- device memory (emu_host.h) ------------------------------------------------------------------------------------

}  // namespace spatialc_emu

SPATIALC_EMU_FN cudaError_t cudaMalloc(void** p, size_t n) {
    const size_t rounded = (n + 255) & ~size_t(255);
    const size_t back = std::max(spatialc_emu::kRedZone, rounded);
    char* raw = static_cast<char*>(std::aligned_alloc(256, spatialc_emu::kRedZone + rounded + back));
    if (!raw) return spatialc_emu::fail(cudaErrorMemoryAllocation, "cudaMalloc failed");
    *p = raw + spatialc_emu::kRedZone;
    std::lock_guard<std::mutex> lk(spatialc_emu::allocations_mu);
    spatialc_emu::allocations[static_cast<const char*>(*p)] = n;
    return cudaSuccess;
}
SPATIALC_EMU_FN cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(spatialc_emu::allocations_mu);
        spatialc_emu::allocations.erase(static_cast<const char*>(p));
    }
    std::free(static_cast<char*>(p) - spatialc_emu::kRedZone);
    return cudaSuccess;
}

namespace spatialc_emu {

// ---- setmaxnreg (emu_hopper.h) -----------------------------------------------------------------------------------

constexpr int kRegisterFile = 65536;  // 32-bit registers of one SM, which one block of the sm_90a form holds alone

SPATIALC_EMU_FN void setmaxnreg(unsigned n, bool inc, int line) {
    ThreadState& t = me("spatialc_regs_inc/dec");
    if (t.lane != 0) return;  // one warp's instruction: its lane 0 speaks for it
    Block& b = blk();
    std::lock_guard<std::mutex> lk(b.mu);
    if (b.regs.empty())  // what __launch_bounds__(threads, 1) leaves each thread, in whole multiples of 8
        b.regs.assign((size_t)b.nwarps, std::min(255, kRegisterFile / b.nthreads) / 8 * 8);
    int& now = b.regs[(size_t)t.warp];
    if (inc ? (int)n < now : (int)n > now)
        fatal(kExitMisuse, std::string("setmaxnreg.") + (inc ? "inc" : "dec") + " to " + std::to_string(n) +
                               " at line " + std::to_string(line) + " by warp " + std::to_string(t.warp) +
                               ", which holds " + std::to_string(now) + " registers a thread: undefined");
    now = (int)n;
}

// At the block's end: every warp of a warpgroup ran the same setmaxnreg (.sync.aligned), and the counts they hold
// fit the register file — else an increase would have waited forever for registers no warp gave back.
SPATIALC_EMU_FN void check_registers(const Block& b) {
    if (b.regs.empty()) return;
    long total = 0;
    for (size_t w = 0; w < b.regs.size(); ++w) {
        total += (long)b.regs[w] * kWarp;
        if (b.regs[w] != b.regs[w / 4 * 4])
            fatal(kExitMisuse, "setmaxnreg: warps " + std::to_string(w / 4 * 4) + " and " + std::to_string(w) +
                                   " of one warpgroup hold " + std::to_string(b.regs[w / 4 * 4]) + " and " +
                                   std::to_string(b.regs[w]) + " registers a thread: each warpgroup runs one");
    }
    if (total > kRegisterFile)
        fatal(kExitDeadlock, "setmaxnreg: the block's warps would hold " + std::to_string(total) +
                                 " registers, more than the " + std::to_string(kRegisterFile) +
                                 " of the file: on the GPU the increase waits forever");
}

SPATIALC_EMU_FN void reset_block(Block& b, int n, unsigned long linear) {
    b.mbars.clear();
    b.regs.clear();
    b.named.clear();
    b.nthreads = n;
    b.nwarps = (n + kWarp - 1) / kWarp;
    b.live = n;
    b.blocked = 0;
    b.bar_arrived = 0;
    b.block_linear = linear;
    b.in_cluster = b.exited = false;
    b.store_reads.clear();
    b.n_store_reads.store(0);
    b.warp_live.assign((size_t)b.nwarps, 0);
    b.warp_arrived.assign((size_t)b.nwarps, 0);
    b.shfl_arrived.assign((size_t)b.nwarps, 0);
    b.shfl_gen.reset(new std::atomic<unsigned>[(size_t)b.nwarps]);
    for (int w = 0; w < b.nwarps; ++w) b.shfl_gen[w].store(0);
    b.shfl_slot.assign((size_t)b.nwarps * kWarp, 0);
    b.warp_gen.reset(new std::atomic<unsigned>[(size_t)b.nwarps]);
    for (int w = 0; w < b.nwarps; ++w) b.warp_gen[w].store(0);
    b.threads.reset(new ThreadState[(size_t)n]);
    for (int i = 0; i < n; ++i) {
        ThreadState& t = b.threads[i];
        t.tid = i;
        t.warp = i / kWarp;
        t.lane = i % kWarp;
        ++b.warp_live[(size_t)t.warp];
    }
}

// ---- fibers: the CUDA threads of what runs at once, on one OS thread -------------------------------------------
// Each CUDA thread of a block (of every block, in a cooperative or cluster launch) is a fiber: its own stack, run
// on the launching OS thread until it must wait (a barrier, a shuffle, an mbarrier phase, a count in global memory:
// every wait goes through `wait_word`), then the next fiber runs. An OS thread per CUDA thread switched through the
// kernel scheduler on every wait: with hundreds of threads on two cores, a run spent four fifths of its time in
// the kernel, yielding. Waits the kernel text makes all go through the emulator's functions (emu_mbarrier.h, …), so
// a fiber never spins: a text that polled plain memory written by another thread would hang (the watchdog reports
// where each thread is). A fiber's thread-locals (`self`, `threadIdx`, …) are swapped in when it runs.
struct ThreadJob {
    Block* b;
    uint3 at;
    void (*body)(void*);
    void* ctx;
    dim3 block;
    int i;
};

SPATIALC_EMU_FN void run_job(const ThreadJob& j) {
    acc_written = false;  // what a new thread starts with
    wgmma_open.clear();
    wgmma_groups.clear();
    bulk_open.clear();
    bulk_groups.clear();
    cur_block = j.b;
    self = &j.b->threads[j.i];
    blockIdx = j.at;
    const unsigned i = (unsigned)j.i;
    threadIdx = uint3{i % j.block.x, (i / j.block.x) % j.block.y, i / (j.block.x * j.block.y)};
    self->where = "running";
    j.body(j.ctx);
    thread_exit();
}

}  // namespace spatialc_emu

#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(SPATIALC_EMU_FIBER_UCONTEXT)
#define SPATIALC_EMU_FIBER_ASM 1
// spatialc_emu_switch(&from, to): saves the callee-saved registers and the floating-point control words on the
// current stack, stores the stack pointer in *from, and resumes the stack `to` points into, as a return from its
// own call of spatialc_emu_switch (or, for a new fiber, into spatialc_emu_fiber_entry). Both are weak, as the
// C++ entry is inline: a header-only program of several translation units defines them in each, and links.
extern "C" void spatialc_emu_switch(void** from, void* to);
extern "C" void spatialc_emu_fiber_entry();
#if defined(__x86_64__)
asm(R"(
    .text
    .weak spatialc_emu_switch
    .type spatialc_emu_switch, @function
spatialc_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size spatialc_emu_switch, .-spatialc_emu_switch

    .weak spatialc_emu_fiber_entry
    .type spatialc_emu_fiber_entry, @function
spatialc_emu_fiber_entry:
    movq %rbx, %rdi
    call spatialc_emu_fiber_main
    ud2
    .size spatialc_emu_fiber_entry, .-spatialc_emu_fiber_entry
)");
#else
asm(R"(
    .text
    .weak spatialc_emu_switch
    .type spatialc_emu_switch, %function
spatialc_emu_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mrs x9, fpcr
    str x9, [sp, #160]
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    ldr x9, [sp, #160]
    msr fpcr, x9
    add sp, sp, #176
    ret
    .size spatialc_emu_switch, .-spatialc_emu_switch

    .weak spatialc_emu_fiber_entry
    .type spatialc_emu_fiber_entry, %function
spatialc_emu_fiber_entry:
    mov x0, x19
    bl spatialc_emu_fiber_main
    brk #0
    .size spatialc_emu_fiber_entry, .-spatialc_emu_fiber_entry
)");
#endif
#else
#define SPATIALC_EMU_FIBER_ASM 0
#include <ucontext.h>
#endif

#include <sys/mman.h>

namespace spatialc_emu {

struct Fiber {
    ThreadJob job{};
    char* stack = nullptr;  // its mapping: a guard page, then the stack
    bool done = false;
    // The word it waits on and the value it saw there (`wait_word`; none while it runs): the scheduler looks at it
    // before switching to the fiber, which would only look too and yield again.
    const std::atomic<unsigned>* word = nullptr;
    unsigned seen = 0;
#if SPATIALC_EMU_FIBER_ASM
    void* sp = nullptr;  // where it was switched out (or, before it first runs, its prepared first frame)
#else
    ucontext_t uc;
#endif
    // The CUDA thread's thread-locals while another fiber runs (the OS thread's own while it runs).
    ThreadState* self = nullptr;
    Block* block = nullptr;
    uint3 thread{0, 0, 0}, at{0, 0, 0};
    bool acc_written = false;
    std::vector<std::function<void()>> wgmma_open;
    std::vector<std::vector<std::function<void()>>> wgmma_groups;
    std::vector<BulkStore> bulk_open;
    std::vector<std::vector<BulkStore>> bulk_groups;
};

// 8 MiB a stack, as a thread's; the pages are taken only as the stack grows, and kept for the next launch.
constexpr size_t kFiberStack = size_t(8) << 20;
constexpr size_t kGuard = 64 << 10;

struct Fibers {
    std::vector<std::unique_ptr<Fiber>> all;  // kept from launch to launch, with their stacks
    Fiber* running = nullptr;
    unsigned long moves = 0;  // fibers that got further since the scheduler last looked (a wait reached, a return)
#if SPATIALC_EMU_FIBER_ASM
    void* home = nullptr;  // the scheduler's stack, while a fiber runs
#else
    ucontext_t home;
#endif
};

inline Fibers& fibers() {
    static Fibers* f = new Fibers;  // never destroyed: `fatal` may end the process from inside a fiber
    return *f;
}

SPATIALC_EMU_FN void swap_locals(Fiber& f) {
    std::swap(self, f.self);
    std::swap(cur_block, f.block);
    std::swap(threadIdx, f.thread);
    std::swap(blockIdx, f.at);
    std::swap(acc_written, f.acc_written);
    wgmma_open.swap(f.wgmma_open);
    wgmma_groups.swap(f.wgmma_groups);
    bulk_open.swap(f.bulk_open);
    bulk_groups.swap(f.bulk_groups);
}

// Back to the scheduler, from the running fiber.
SPATIALC_EMU_FN void fiber_yield() {
    Fibers& fs = fibers();
    Fiber& f = *fs.running;
#if SPATIALC_EMU_FIBER_ASM
    spatialc_emu_switch(&f.sp, fs.home);
#else
    swapcontext(&f.uc, &fs.home);
#endif
}

SPATIALC_EMU_FN void fiber_body(Fiber* f) {
    run_job(f->job);
    f->done = true;
    ++fibers().moves;
    fiber_yield();  // never resumed
    std::abort();
}

SPATIALC_EMU_FN bool in_fiber() { return fibers().running != nullptr; }

}  // namespace spatialc_emu

// Called from the assembly (or through makecontext) only, hence `used`: emitted where inline, once a program.
#if SPATIALC_EMU_FIBER_ASM
extern "C" SPATIALC_EMU_FN __attribute__((used)) void spatialc_emu_fiber_main(spatialc_emu::Fiber* f) {
    spatialc_emu::fiber_body(f);
}
#else
extern "C" SPATIALC_EMU_FN __attribute__((used)) void spatialc_emu_fiber_start(unsigned lo, unsigned hi) {
    spatialc_emu::fiber_body(reinterpret_cast<spatialc_emu::Fiber*>(uintptr_t(lo) | (uintptr_t(hi) << 32)));
}
#endif

namespace spatialc_emu {

// Until `word` moves on from `seen`. A fiber lets the others run meanwhile; another thread (none of the kernel's)
// sleeps.
SPATIALC_EMU_FN void wait_word(std::atomic<unsigned>& word, unsigned seen) {
    if (word.load(std::memory_order_acquire) != seen) return;
    if (!in_fiber()) {
        while (word.load(std::memory_order_acquire) == seen) word.wait(seen, std::memory_order_acquire);
        return;
    }
    Fibers& fs = fibers();
    Fiber& f = *fs.running;
    ++fs.moves;  // it got as far as this wait
    f.word = &word;
    f.seen = seen;
    do fiber_yield();
    while (word.load(std::memory_order_acquire) == seen);
    f.word = nullptr;
}

SPATIALC_EMU_FN void prepare_fiber(Fiber& f, const ThreadJob& job) {
    f.job = job;
    f.done = false;
    f.word = nullptr;
    // What the watchdog says of it until it runs (a thread that never waits keeps the others from their first turn).
    job.b->threads[job.i].where = "not yet run (a thread runs until it waits)";
    if (!f.stack) {
        void* m = mmap(nullptr, kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) fatal(kExitMisuse, "the emulation could not map a stack for a CUDA thread");
        f.stack = static_cast<char*>(m);
        if (mprotect(f.stack, kGuard, PROT_NONE) != 0)  // an overflow faults here instead of writing into a neighbour
            fatal(kExitMisuse, "the emulation could not guard a CUDA thread's stack (the process's memory maps?)");
    }
#if SPATIALC_EMU_FIBER_ASM
    // The first frame spatialc_emu_switch resumes: the saved registers (the fiber in rbx / x19), the control words
    // as they are now, and the entry as the return address, on a 16-byte aligned stack.
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + kFiberStack) & ~uintptr_t(15);
#if defined(__x86_64__)
    uint64_t* sp = reinterpret_cast<uint64_t*>(top - 24);
    sp[0] = reinterpret_cast<uint64_t>(&spatialc_emu_fiber_entry);  // its `ret` leaves rsp 16-aligned, for its call
    uint64_t* frame = sp - 7;  // control words, r15, r14, r13, r12, rbx, rbp
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    std::memset(frame, 0, 7 * sizeof(uint64_t));
    std::memcpy(&frame[0], &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(&frame[0]) + 4, &fpucw, 2);
    frame[5] = reinterpret_cast<uint64_t>(&f);  // rbx
    f.sp = frame;
#else
    uint64_t* frame = reinterpret_cast<uint64_t*>(top - 176 - 16);
    std::memset(frame, 0, 176);
    uint64_t fpcr;
    asm volatile("mrs %0, fpcr" : "=r"(fpcr));
    frame[0] = reinterpret_cast<uint64_t>(&f);                         // x19
    frame[11] = reinterpret_cast<uint64_t>(&spatialc_emu_fiber_entry);  // x30
    frame[20] = fpcr;
    f.sp = frame;
#endif
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack + kGuard;
    f.uc.uc_stack.ss_size = kFiberStack - kGuard;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, reinterpret_cast<void (*)()>(&spatialc_emu_fiber_start), 2,
                (unsigned)(reinterpret_cast<uintptr_t>(&f) & 0xffffffffu),
                (unsigned)(reinterpret_cast<uintptr_t>(&f) >> 32));
#endif
}

// Run `jobs`, each a CUDA thread, as fibers until every one has returned. Fibers take turns in order; a turn ends at
// a wait. When a whole round finds every fiber still waiting, nothing here can change what they wait for (a
// deadlock the block's check did not see, or a wait on a block that is not running): the scheduler then sleeps
// between rounds, longer each time (a round over thousands of fibers is not free), and the watchdog reports the
// stall.
SPATIALC_EMU_FN void run_threads(const std::vector<ThreadJob>& jobs) {
    Fibers& fs = fibers();
    while (fs.all.size() < jobs.size()) fs.all.emplace_back(new Fiber);
    const size_t n = jobs.size();
    for (size_t k = 0; k < n; ++k) prepare_fiber(*fs.all[k], jobs[k]);
    std::vector<Fiber*> live;
    live.reserve(n);
    for (size_t k = 0; k < n; ++k) live.push_back(fs.all[k].get());
    int idle_rounds = 0;
    while (!live.empty()) {
        const unsigned long before = fs.moves;
        size_t kept = 0;
        for (Fiber* f : live) {
            // Switching to a fiber whose word has not moved costs its stack's cache lines and the swap of its
            // thread-locals, to learn nothing: with thousands of fibers waiting (the blocks of a cooperative launch
            // waiting on one), that was most of a round, and a hang kept a core busy however long it slept between.
            if (f->word && f->word->load(std::memory_order_acquire) == f->seen) {
                live[kept++] = f;
                continue;
            }
            swap_locals(*f);
            fs.running = f;
#if SPATIALC_EMU_FIBER_ASM
            spatialc_emu_switch(&fs.home, f->sp);
#else
            swapcontext(&fs.home, &f->uc);
#endif
            fs.running = nullptr;
            swap_locals(*f);
            if (!f->done) live[kept++] = f;
        }
        live.resize(kept);
        if (fs.moves != before) {
            idle_rounds = 0;
        } else if (++idle_rounds > 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1 << std::min(idle_rounds - 3, 6)));
        }
    }
}

// The jobs of block `b` (block index `at`): one a CUDA thread, appended to `jobs`.
SPATIALC_EMU_FN void block_jobs(Block& b, uint3 at, void (*body)(void*), void* ctx, dim3 block,
                                std::vector<ThreadJob>& jobs) {
    for (int i = 0; i < b.nthreads; ++i) jobs.push_back(ThreadJob{&b, at, body, ctx, block, i});
}

SPATIALC_EMU_FN void run_block(void (*body)(void*), void* ctx, dim3 block, uint3 at, unsigned long linear) {
    Block& b = the_block;
    const int n = (int)(block.x * block.y * block.z);
    reset_block(b, n, linear);
    reset_shared_for_block();
    std::vector<ThreadJob> jobs;
    jobs.reserve((size_t)n);
    block_jobs(b, at, body, ctx, block, jobs);
    run_threads(jobs);
    for (int i = 0; i < n; ++i) apply_stores(b.threads[i]);
    check_registers(b);
    progress.fetch_add(1, std::memory_order_relaxed);
}

// A cooperative launch: blocks first … first + nblocks - 1 (in blockIdx order) at once — every block, or one
// cluster's — each with its own dynamic shared memory, so that blocks waiting on each other can all make progress.
// Their shared regions are forgotten when they end.
SPATIALC_EMU_FN void run_blocks_at_once(void (*body)(void*), void* ctx, dim3 grid, dim3 block, size_t smem,
                                        unsigned long first, unsigned long nblocks) {
    const int n = (int)(block.x * block.y * block.z);
    std::vector<std::unique_ptr<Block>> blocks;
    for (unsigned long i = 0; i < nblocks; ++i) {
        blocks.emplace_back(new Block);
        Block& b = *blocks.back();
        reset_block(b, n, first + i);
        b.dyn = static_cast<char*>(std::aligned_alloc(1024, std::max<size_t>(1024, (smem + 1023) & ~size_t(1023))));
        std::memset(b.dyn, kPoison, smem);
    }
    {
        std::lock_guard<std::mutex> lk(coop_mu);
        coop_first = first;
        for (auto& b : blocks) coop_blocks.push_back(b.get());
    }
    blocks_at_once(first, nblocks);
    std::vector<ThreadJob> jobs;
    jobs.reserve((size_t)n * nblocks);
    for (unsigned long i = 0; i < nblocks; ++i) {
        const unsigned long linear = first + i;
        const uint3 at{(unsigned)(linear % grid.x), (unsigned)(linear / grid.x % grid.y),
                       (unsigned)(linear / ((unsigned long)grid.x * grid.y))};
        block_jobs(*blocks[i], at, body, ctx, block, jobs);
    }
    run_threads(jobs);
    for (auto& b : blocks) check_registers(*b);
    {
        std::lock_guard<std::mutex> lk(coop_mu);
        coop_blocks.clear();
    }
    std::lock_guard<std::mutex> lk(regions_mu);
    int kept = 0;
    const int count = n_regions.load();
    for (int i = 0; i < count; ++i) {
        if (regions[i]->owner) {
            delete regions[i];
            continue;
        }
        regions[kept++] = regions[i];
    }
    n_regions.store(kept);
    for (auto& b : blocks) {
        for (int i = 0; i < n; ++i) apply_stores(b->threads[i]);
        land_exit_stores_in(b->dyn, smem);  // stores into its shared memory that threads held when they returned
        std::free(b->dyn);
    }
    progress.fetch_add(nblocks, std::memory_order_relaxed);
}

// Dynamic shared memory a launch may use: the attribute when set, else what 48 KiB leaves beside the kernel's
// static rings (known once a launch has registered them).
SPATIALC_EMU_FN size_t dynamic_allowed(const void* kernel) {
    auto it = max_dynamic_smem.find(kernel);
    if (it != max_dynamic_smem.end()) return (size_t)it->second;
    size_t fixed = 0;
    const int n = n_regions.load();
    for (int i = 0; i < n; ++i)
        if (regions[i]->kernel == kernel && !regions[i]->dynamic) fixed += regions[i]->bytes;
    return fixed < kDynamicDefault ? kDynamicDefault - fixed : 0;
}

SPATIALC_EMU_FN cudaError_t refuse_dynamic(size_t smem, const void* kernel) {
    return fail(cudaErrorInvalidValue,
                "launch refused: " + std::to_string(smem) + " bytes of dynamic shared memory, but only " +
                    std::to_string(dynamic_allowed(kernel)) +
                    " without cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) (48 KiB less the "
                    "static shared memory), or more than the attribute set");
}

// SPATIALC_CLUSTER_KERNEL, per kernel: filled by static initialisers of the program, which may run before this
// file's own, hence a function's static.
inline std::map<const void*, int>& cluster_sites() {
    static std::map<const void*, int> sites;
    return sites;
}

SPATIALC_EMU_FN bool set_cluster(const void* kernel, int sites) {
    cluster_sites()[kernel] = sites;
    return true;
}

// 16 bytes of this block's shared memory into a peer's (st.shared::cluster): checked against the receiver's shared
// memory as this thread's write now — the store may land any time from its issue until this thread releases
// (late mode: it lands then; early mode: at once) — ordered against the receiver's own accesses and against the
// last store a peer made there only by the handshake in global memory (emu_global.h's epochs): the receiver must
// have acquired a release of this block made after the store before it reads the page (the wait for the valid
// flag), and this block one of the receiver's made after its readers were done and after the last store there
// (the wait for ready).
SPATIALC_EMU_FN void dsmem_copy(const void* src, const void* dst, int site, unsigned rank, size_t n, int line) {
    const void* q = src;
    track(&q, 1, n, false, AccessKind::page_load, line);
    Block& me = blk();
    const auto size = cluster_sites().find(running_kernel);
    const unsigned long cluster = size == cluster_sites().end() ? 0 : (unsigned long)size->second;
    if (!cluster || (unsigned long)site / cluster != me.block_linear / cluster || rank != (unsigned long)site % cluster)
        fatal(kExitMisuse, "distributed shared memory store at line " + std::to_string(line) + " from block " +
                               std::to_string(me.block_linear) + " to site " + std::to_string(site) + " as rank " +
                               std::to_string(rank) + ": not that site's rank in this block's cluster of " +
                               std::to_string(cluster));
    Block* other = nullptr;
    {
        std::lock_guard<std::mutex> lk(coop_mu);
        if (me.dyn && site >= 0) other = coop_block((unsigned long)site);
    }
    if (!other || !other->dyn)
        fatal(kExitMisuse, "distributed shared memory store at line " + std::to_string(line) + " to site " +
                               std::to_string(site) + ", which is not a block of this launch running at once");
    char* to = other->dyn + (static_cast<const char*>(dst) - me.dyn);
    check_dsmem_target(*other, to, n, line);
    Access a = access_now(AccessKind::dsmem, line);
    a.rep = block_epoch(other->block_linear);
    const void* p = to;
    each_tracked(&p, 1, n, a, [&](Region& r, size_t off) {
        for (size_t i = 0; i < n; ++i) {
            const Access& w = r.shadow[off + i].w;
            if (w.kind == AccessKind::dsmem && known_epoch(me.block_linear, other->block_linear) <= w.rep)
                fatal(kExitRace, "RACE between blocks on shared ring '" + std::string(r.name) + "' of block " +
                                     std::to_string(other->block_linear) + ": " + who(a) + " stores over " + who(w) +
                                     ", and block " + std::to_string(me.block_linear) + " acquired no release of "
                                     "block " + std::to_string(other->block_linear) + " made after that (the wait for "
                                     "the receiver's ready flag missing?): the page may not have been read yet");
        }
        track_bytes(r, off, n, true, a, *self);
    });
    hold_store(*self, to, src, (int)n);
}

// The receiver of a dsmem store must be running, with the ring declared (its threads declare their rings before they
// signal a sender; a store before that is ordered after nothing the receiver did, and one after it exited was never
// waited for): else a race.
SPATIALC_EMU_FN void check_dsmem_target(Block& other, const char* to, size_t n, int line) {
    {
        std::lock_guard<std::mutex> lk(other.mu);
        if (other.exited)  // it did not wait for this store: nothing ordered its end after it
            fatal(kExitRace, "RACE between blocks: distributed shared memory store at line " + std::to_string(line) +
                                 " into block " + std::to_string(other.block_linear) +
                                 ", which has exited (its shared memory is gone): nothing made it wait for the store "
                                 "(its wait for the valid flag missing?)");
    }
    const Region* r = find_region(to);
    if (!r || to + n > r->base + r->bytes)
        fatal(kExitRace, "RACE between blocks: distributed shared memory store at line " + std::to_string(line) +
                             " by thread " + std::to_string(self->tid) + " of block " +
                             std::to_string(blk().block_linear) + " into block " +
                             std::to_string(other.block_linear) +
                             "'s shared memory outside any ring it has declared yet: nothing orders it after the "
                             "receiver's start (the wait for its ready flag missing?)");
}

SPATIALC_EMU_FN void run_grid(void (*body)(void*), void* ctx, dim3 grid, dim3 block, size_t smem,
                              const void* kernel, bool cooperative) {
    if (cluster_sites().count(kernel)) cooperative = true;  // a cluster's blocks wait on each other: all at once
    const unsigned long nthreads = (unsigned long)block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        fail(cudaErrorInvalidConfiguration, "launch refused: " + std::to_string(nthreads) + " threads per block");
        return;
    }
    if (smem > dynamic_allowed(kernel)) {
        refuse_dynamic(smem, kernel);
        return;
    }
    start_watchdog();
    prepare_dynamic(smem);
    reset_epochs((unsigned long)grid.x * grid.y * grid.z);
    gridDim = grid;
    blockDim = block;
    running_kernel = kernel;
    in_launch = true;
    const unsigned long nblocks = (unsigned long)grid.x * grid.y * grid.z;
    report_blocks(0, nblocks);
    unsigned long linear = 0;
    const unsigned long cluster = cluster_size();
    if (cluster > 1 && nblocks % cluster) {
        fail(cudaErrorInvalidConfiguration, "launch refused: a grid of " + std::to_string(nblocks) +
                                                " blocks is not a whole number of clusters of " +
                                                std::to_string(cluster));
        in_launch = false;
        return;
    }
    if (cluster > 1) {  // a cluster's blocks wait only on each other: one cluster at a time
        prepare_clusters(nblocks, (int)nthreads);
        for (unsigned long first = 0; first < nblocks; first += cluster) {
            run_blocks_at_once(body, ctx, grid, block, smem, first, std::min(cluster, nblocks - first));
            report_blocks(std::min(first + cluster, nblocks), nblocks);
        }
    } else if (cooperative) {
        run_blocks_at_once(body, ctx, grid, block, smem, 0, nblocks);
        report_blocks(nblocks, nblocks);
    } else {
        for (unsigned z = 0; z < grid.z; ++z)
            for (unsigned y = 0; y < grid.y; ++y)
                for (unsigned x = 0; x < grid.x; ++x, ++linear) {
                    run_block(body, ctx, block, uint3{x, y, z}, linear);
                    report_blocks(linear + 1, nblocks);
                }
    }
    release_exit_stores();
    in_launch = false;
    // A kernel's static rings are only known once it has run: a GPU would have refused this launch up front.
    if (smem > dynamic_allowed(kernel)) refuse_dynamic(smem, kernel);
}

}  // namespace spatialc_emu

#include "emu_cluster.h"

#endif  // SPATIALC_EMU_RUNTIME_H

// spatialc host emulation — thread-block clusters of the sm_90a form (lower/cuda/sm90a/sm90a.cuh): the cluster barrier,
// arrivals on a peer block's mbarrier, and TMA loads multicast into several blocks' shared memory. Definitions,
// included at the end of emu_runtime.h.
//
// The blocks of a cluster run at once (a cluster kernel is launched like a cooperative one). What is emulated
// because correctness depends on it:
// - a peer may use a block's barrier only after a cluster barrier that followed its initialisation (otherwise it
//   may find it uninitialised: a race);
// - a remote arrival releases what the arriving thread knew — its own block's clocks — and a thread that waits
//   through the phase learns them, so a multicast into a peer is race-checked against what the issuing thread
//   knew of that peer's threads: a stage refilled before its readers in the peer released it is a race;
// - a multicast box lands in every block of its mask, at the same offset, and counts on the barrier at the same
//   offset there; a block that has exited cannot receive it, and a block must not exit while a phase of its
//   barriers still expects bytes or completed with bytes a peer sent that none of its threads waited for: on a GPU
//   those bytes may land after the block is gone;
// - the cluster barrier waits for every live thread of the cluster's blocks and orders everything before it; a
//   block whose threads all wait is deadlocked only when every other block of its cluster has exited or waits too.
#ifndef SPATIALC_EMU_CLUSTER_H
#define SPATIALC_EMU_CLUSTER_H

namespace spatialc_emu {

struct ClusterBar {
    std::mutex mu;  // taken before any of its blocks' locks
    int live = 0, arrived = 0;
    std::vector<int> waiting;  // by rank: the block's threads waiting at the barrier
    std::atomic<unsigned> gen{0};
};
inline std::vector<std::unique_ptr<ClusterBar>> cluster_bars;  // the running launch's, by cluster

SPATIALC_EMU_FN unsigned long cluster_size() {
    const auto it = cluster_sites().find(running_kernel);
    return it == cluster_sites().end() ? 0 : (unsigned long)it->second;
}

// Before a cluster launch starts its blocks: one barrier per cluster, every thread of its blocks live.
SPATIALC_EMU_FN void prepare_clusters(unsigned long nblocks, int threads) {
    cluster_bars.clear();
    const unsigned long c = cluster_size();
    if (c < 2) return;
    for (unsigned long i = 0; i < nblocks / c; ++i) {
        cluster_bars.emplace_back(new ClusterBar);
        cluster_bars.back()->live = (int)c * threads;
        cluster_bars.back()->waiting.assign(c, 0);
    }
}

SPATIALC_EMU_FN std::vector<Block*> cluster_of(Block& b) {
    const unsigned long c = cluster_size();
    if (c < 2 || !b.in_cluster) return {&b};
    std::vector<Block*> out{&b};
    std::lock_guard<std::mutex> lk(coop_mu);
    const unsigned long first = b.block_linear / c * c;
    for (unsigned long i = first; i < first + c; ++i) {
        Block* o = coop_block(i);
        if (o && o != &b) out.push_back(o);
    }
    return out;
}

// Block `rank` of the calling block's cluster.
SPATIALC_EMU_FN Block& peer(Block& b, unsigned rank, const std::string& where) {
    const unsigned long c = cluster_size();
    if (c < 2 || !b.dyn) fatal(kExitMisuse, where + ": the kernel is not launched as thread-block clusters");
    if (rank >= c)
        fatal(kExitMisuse, where + ": rank " + std::to_string(rank) + " of a cluster of " + std::to_string(c));
    std::lock_guard<std::mutex> lk(coop_mu);
    Block* o = coop_block(b.block_linear / c * c + rank);
    if (!o) fatal(kExitMisuse, where + ": rank " + std::to_string(rank) + " is not running");
    return *o;
}

// With the cluster's lock held: release every waiter.
SPATIALC_EMU_FN void complete_cluster(ClusterBar& cb, unsigned long first) {
    for (size_t i = 0; i < cb.waiting.size(); ++i) {
        if (!cb.waiting[i]) continue;
        Block* o;
        {
            std::lock_guard<std::mutex> lk(coop_mu);
            o = coop_block(first + i);
        }
        std::lock_guard<std::mutex> lk(o->mu);
        for (int k = 0; k < o->nthreads; ++k) apply_stores(o->threads[k]);
        o->blocked -= cb.waiting[i];
        cb.waiting[i] = 0;
    }
    cluster_release(first, cb.waiting.size());  // it orders global memory too: every block learns the others' epochs
    cb.arrived = 0;
    cb.gen.fetch_add(1, std::memory_order_release);
    cb.gen.notify_all();
    progress.fetch_add(1, std::memory_order_relaxed);
}

SPATIALC_EMU_FN void cluster_sync(int line) {
    ThreadState& t = me("spatialc_cluster_sync");
    Block& b = blk();
    const unsigned long c = cluster_size();
    if (c < 2 || cluster_bars.empty())
        fatal(kExitMisuse, "spatialc_cluster_sync at line " + std::to_string(line) +
                               ": the kernel is not launched as thread-block clusters (__cluster_dims__)");
    ClusterBar& cb = *cluster_bars[b.block_linear / c];
    std::unique_lock<std::mutex> ck(cb.mu);
    {
        std::lock_guard<std::mutex> lk(b.mu);
        b.in_cluster = true;
        t.where = "waits at the cluster barrier (spatialc_cluster_sync)";
        t.where_line = line;
    }
    const unsigned seen = cb.gen.load(std::memory_order_relaxed);
    if (++cb.arrived == cb.live) {
        complete_cluster(cb, b.block_linear / c * c);
    } else {
        ++cb.waiting[b.block_linear % c];
        {
            std::lock_guard<std::mutex> lk(b.mu);
            if (++b.blocked == b.live && stuck(b)) deadlock(b);
        }
        ck.unlock();
        await_generation(cb.gen, seen);
    }
    // Everything before the barrier, in every block of the cluster, is ordered before everything after it.
    t.bi.fetch_add(1, std::memory_order_relaxed);
    t.wi.fetch_add(1, std::memory_order_relaxed);
    ++t.cbi;
    t.where = "running";
}

// A returning thread of a cluster launch: the cluster barrier no longer waits for it (before its block's lock).
SPATIALC_EMU_FN void cluster_leave(Block& b) {
    const unsigned long c = cluster_size();
    if (c < 2 || cluster_bars.empty()) return;
    ClusterBar& cb = *cluster_bars[b.block_linear / c];
    std::lock_guard<std::mutex> ck(cb.mu);
    --cb.live;
    if (cb.arrived > 0 && cb.arrived == cb.live) complete_cluster(cb, b.block_linear / c * c);
}

// With `b`'s lock held, as its last thread returns: nothing may still be on its way into its shared memory.
SPATIALC_EMU_FN void check_exit(Block& b) {
    b.exited = true;
    for (const auto& [bar, m] : b.mbars) {
        const std::string who = "block " + std::to_string(b.block_linear) + " exits while " + mbar_name(bar);
        if (m->tx > 0)
            fatal(kExitMisuse, who + " still expects " + std::to_string(m->tx) +
                                   " bytes of TMA loads (expect_tx) — its own or a peer's multicast, still on "
                                   "their way: they would land in shared memory that is gone");
        if (m->peer_phase > m->waited)
            fatal(kExitMisuse, who + " completed its phase " + std::to_string(m->peer_phase - 1) +
                                   " with bytes block " + std::to_string(m->peer_from) + " multicast into it (line " +
                                   std::to_string(m->peer_line) + "), which no thread of the block waited for: on a "
                                   "GPU they may land after the block has exited");
    }
}

// The stores `t` holds into the shared memory of a block of its cluster (spatialc_dsmem_copy16) land: a release at
// cluster scope makes them visible there. Its stores to global memory stay held until a release at device scope.
SPATIALC_EMU_FN void release_cluster_stores(ThreadState& t, Block& b, const std::string& where) {
    if (t.gstores.empty()) return;
    GlobalStores land, keep;
    const unsigned long c = cluster_size();
    for (const auto& s : t.gstores) {
        const char* to = static_cast<const char*>(s->dst);
        bool shared = false;
        for (unsigned r = 0; r < c && !shared; ++r) {
            const Block& o = peer(b, r, where);
            shared = o.dyn && to >= o.dyn && to < o.dyn + dyn_bytes;
        }
        (shared ? land : keep).push_back(s);
    }
    land_stores(land);
    t.gstores = std::move(keep);
}

// One arrival on the barrier at `bar`'s place in block `rank`, releasing at cluster scope: the arriving thread's
// stores into the cluster's shared memory land first, its clocks travel with the arrival (what it knew of its own
// block's threads), and so does a new epoch of its block (what its block did so far, for the race check of stores
// between blocks: emu_global.h), which a thread passing the phase acquires.
SPATIALC_EMU_FN void mbar_arrive_cluster(void* bar, unsigned rank, int line) {
    ThreadState& t = me("spatialc_mbar_arrive_cluster");
    Block& b = blk();
    const std::string where = "spatialc_mbar_arrive_cluster at line " + std::to_string(line);
    Block& o = peer(b, rank, where);
    if (&o == &b) {
        mbar_arrive(bar, line);
        return;
    }
    void* at = o.dyn + (static_cast<char*>(bar) - b.dyn);
    apply_stores(t);
    release_cluster_stores(t, b, where);
    const unsigned epoch = release_epoch();
    std::lock_guard<std::mutex> lk(o.mu);
    if (o.exited)
        fatal(kExitMisuse, where + ": block " + std::to_string(b.block_linear) + " arrives on a barrier of block " +
                               std::to_string(o.block_linear) + ", which has exited");
    MBar& m = find_mbar_in(o, at, where.c_str(), line);
    check_peer_use(t, o, at, m, where, "arrives on");
    std::vector<unsigned>& vc = m.peer_acc[b.block_linear];
    join(vc, t.vc);
    if (vc.size() <= (size_t)t.tid) vc.resize((size_t)t.tid + 1, 0);
    vc[(size_t)t.tid] = std::max(vc[(size_t)t.tid], t.clk);
    ++t.clk;
    unsigned& released = m.peer_epoch_acc[b.block_linear];
    released = std::max(released, epoch);
    if (m.pending == 0)
        fatal(kExitMisuse, where + ": an arrival on a phase that has all its arrivals (" + mbar_name(at) + ")");
    if (--m.pending == 0) settle_mbar(o, m);
}

SPATIALC_EMU_FN void tma_load_multicast(void* dst, const CUtensorMap* map, const int* coords, int rank, void* bar,
                                        unsigned mask, int line) {
    ThreadState& t = me("spatialc_tma_load_multicast");
    Block& b = blk();
    const std::string where = "spatialc_tma_load_" + std::to_string(rank) + "d_multicast at line " +
                              std::to_string(line);
    const unsigned long c = cluster_size();
    if (c < 2 || !b.dyn) fatal(kExitMisuse, where + ": the kernel is not launched as thread-block clusters");
    if (mask == 0 || (mask >> c))
        fatal(kExitMisuse, where + ": block mask " + std::to_string(mask) + " names no rank, or ranks past the "
                                   "cluster of " + std::to_string(c));
    const std::vector<char> image = tma_box(dst, map, coords, rank, where);
    for (unsigned r = 0; r < c; ++r) {
        if (!(mask >> r & 1u)) continue;
        Block& o = peer(b, r, where);
        if (&o == &b) {
            land_box(b, static_cast<char*>(dst), image, bar, t, false, line, where);
            continue;
        }
        ThreadState knows;  // what the issuing thread learnt of the peer's threads
        knows.vc = t.peer_vc[o.block_linear];
        char* at = o.dyn + (static_cast<char*>(dst) - b.dyn);
        land_box(o, at, image, o.dyn + (static_cast<char*>(bar) - b.dyn), knows, true, line, where);
    }
}

}  // namespace spatialc_emu

#endif  // SPATIALC_EMU_CLUSTER_H

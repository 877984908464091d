// spatialc host emulation — the definitions of emu_global.h: block epochs and what blocks know of each other's, the
// tensors a launch is bound to, their poison and the bounds and race checks of global accesses. Included by
// emu_runtime.h.
#ifndef SPATIALC_EMU_GLOBAL_RUN_H
#define SPATIALC_EMU_GLOBAL_RUN_H

#include <cctype>
#include <climits>
#include <cstdint>

namespace spatialc_emu {

// ---- epochs: the releases of each block, and what each block running at once has acquired of the others' ----------

inline std::unique_ptr<std::atomic<unsigned>[]> epochs;  // by block of the running launch
inline std::unique_ptr<std::atomic<unsigned>[]> fenced;  // by block: its epoch at its latest __threadfence
inline unsigned long n_epochs = 0;
inline std::unique_ptr<std::atomic<unsigned>[]> known;  // known[(x - first) * n + (y - first)], blocks run at once
inline unsigned long known_first = 0, known_n = 0;
inline std::mutex sync_mu;                                                    // published, and the adds themselves
inline std::map<const void*, std::map<unsigned long, unsigned>> published;  // by sync word: block → latest epoch

SPATIALC_EMU_FN void reset_epochs(unsigned long nblocks) {
    epochs.reset(new std::atomic<unsigned>[nblocks]);
    fenced.reset(new std::atomic<unsigned>[nblocks]);
    for (unsigned long i = 0; i < nblocks; ++i) epochs[i].store(0), fenced[i].store(0);
    n_epochs = nblocks;
    known.reset();
    known_first = known_n = 0;
    std::lock_guard<std::mutex> lk(sync_mu);
    published.clear();
}

SPATIALC_EMU_FN void blocks_at_once(unsigned long first, unsigned long n) {
    known.reset(new std::atomic<unsigned>[n * n]);
    for (unsigned long i = 0; i < n * n; ++i) known[i].store(0);
    known_first = first;
    known_n = n;
}

SPATIALC_EMU_FN unsigned block_epoch(unsigned long b) {
    return b < n_epochs ? epochs[b].load(std::memory_order_acquire) : 0;
}

SPATIALC_EMU_FN std::atomic<unsigned>* known_slot(unsigned long knower, unsigned long of) {
    if (knower < known_first || of < known_first || knower - known_first >= known_n || of - known_first >= known_n)
        return nullptr;
    return &known[(knower - known_first) * known_n + (of - known_first)];
}

SPATIALC_EMU_FN unsigned known_epoch(unsigned long knower, unsigned long of) {
    if (knower == of) return UINT_MAX;
    std::atomic<unsigned>* k = known_slot(knower, of);
    return k ? k->load(std::memory_order_acquire) : 0;
}

SPATIALC_EMU_FN void learn_epoch(unsigned long knower, unsigned long of, unsigned e) {
    std::atomic<unsigned>* k = known_slot(knower, of);
    if (!k) return;
    unsigned now = k->load(std::memory_order_relaxed);
    while (now < e && !k->compare_exchange_weak(now, e, std::memory_order_acq_rel)) {
    }
}

SPATIALC_EMU_FN unsigned release_epoch() {
    const unsigned long b = blk().block_linear;
    return b < n_epochs ? epochs[b].fetch_add(1, std::memory_order_acq_rel) + 1 : 0;
}

// A fence releases for the block's later atomic adds (the existing late mode makes a fenced store visible to every
// thread at once, so the fence of any thread of the block counts: lenient, never a report on a correct kernel).
SPATIALC_EMU_FN void fence_epoch() {
    const unsigned long b = blk().block_linear;
    if (!self || b >= n_epochs) return;
    const unsigned e = release_epoch();
    unsigned now = fenced[b].load(std::memory_order_relaxed);
    while (now < e && !fenced[b].compare_exchange_weak(now, e, std::memory_order_acq_rel)) {
    }
}

// What a relaxed add by the calling thread's block publishes: its latest fence (0, nothing, if none).
SPATIALC_EMU_FN unsigned fenced_epoch() {
    const unsigned long b = blk().block_linear;
    return b < n_epochs ? fenced[b].load(std::memory_order_acquire) : 0;
}

SPATIALC_EMU_FN void cluster_release(unsigned long first, unsigned long n) {
    std::vector<unsigned> now(n);
    for (unsigned long i = 0; i < n; ++i)
        now[i] = first + i < n_epochs ? epochs[first + i].fetch_add(1, std::memory_order_acq_rel) + 1 : 0;
    for (unsigned long x = 0; x < n; ++x)
        for (unsigned long y = 0; y < n; ++y) learn_epoch(first + x, first + y, now[y]);
}

// With sync_mu held: an add by the calling thread to `word` publishes epoch `e` of its block (0: nothing).
SPATIALC_EMU_FN void publish(const void* word, unsigned e) {
    if (!e) return;
    unsigned& at = published[word][blk().block_linear];
    at = std::max(at, e);
}

// With sync_mu held: an acquire that read `word` learns every release published on it so far.
SPATIALC_EMU_FN void acquire_from(const void* word) {
    const auto it = published.find(word);
    if (it == published.end()) return;
    for (const auto& [from, e] : it->second) learn_epoch(blk().block_linear, from, e);
}

// ---- the tensors of the launch ------------------------------------------------------------------------------------

enum class GRole : unsigned char { input, output, workspace, other };

struct GWrite {  // 16 bytes an element (what emulate.emulation_bytes counts)
    int block = -1, tid = -1, line = 0;
    unsigned epoch = 0;
};

struct GTensor {
    std::string name;
    GRole role = GRole::other;
    bool writable = false;
    const char* base = nullptr;
    size_t bytes = 0, elem = 1, rz_back = 0;
    bool tiled = false;          // 16 × 16 tiles of 256 elements, one after another (else a plain matrix)
    std::vector<GWrite> shadow;  // by element, for the tensors the kernel writes
};

// What the runner says of each tensor argument, from SPATIALC_EMU_TENSORS: `hexname,role,elem,hexpoison,tiled;…`.
struct TensorSpec {
    std::string name;
    GRole role = GRole::other;
    size_t elem = 1;
    bool tiled = false;
    std::vector<unsigned char> poison;
};

inline std::vector<GTensor> gtensors;  // the running launch's
inline std::mutex global_mu;          // every global shadow update

SPATIALC_EMU_FN std::vector<unsigned char> unhex(const std::string& s) {
    std::vector<unsigned char> out;
    for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back((unsigned char)std::stoul(s.substr(i, 2), nullptr, 16));
    return out;
}

SPATIALC_EMU_FN std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out(1);
    for (char c : s) {
        if (c == sep) out.emplace_back();
        else out.back() += c;
    }
    return out;
}

SPATIALC_EMU_FN const std::vector<TensorSpec>& tensor_specs() {
    static const std::vector<TensorSpec> specs = [] {
        std::vector<TensorSpec> out;
        const char* v = std::getenv("SPATIALC_EMU_TENSORS");
        if (!v || !*v) return out;
        for (const std::string& entry : split(v, ';')) {
            const std::vector<std::string> f = split(entry, ',');
            if (f.size() != 5) continue;
            TensorSpec s;
            for (unsigned char c : unhex(f[0])) s.name += std::isalnum(c) || c == '_' ? (char)c : '?';
            s.role = f[1] == "input" || f[1] == "parameter" ? GRole::input
                     : f[1] == "output"                     ? GRole::output
                     : f[1] == "workspace"                  ? GRole::workspace
                                                            : GRole::other;
            s.elem = std::max<size_t>(1, std::strtoul(f[2].c_str(), nullptr, 10));
            s.poison = unhex(f[3]);
            s.tiled = f[4] == "1";
            out.push_back(std::move(s));
        }
        return out;
    }();
    return specs;
}

// The allocation `p` points into: its start and size (false: none).
SPATIALC_EMU_FN bool allocation_of(const void* p, const char*& start, size_t& n) {
    std::lock_guard<std::mutex> lk(allocations_mu);
    auto it = allocations.upper_bound(static_cast<const char*>(p));
    if (it == allocations.begin()) return false;
    --it;
    start = it->first;
    n = it->second;
    return static_cast<const char*>(p) < start + n;
}

SPATIALC_EMU_FN GTensor bound_tensor(size_t i, const void* p, bool writable, const char* start, size_t n) {
    const std::vector<TensorSpec>& specs = tensor_specs();
    GTensor g;
    g.base = start;
    g.bytes = n;
    g.rz_back = std::max(kRedZone, (n + 255) & ~size_t(255));
    g.writable = writable;
    if (i < specs.size()) {
        g.name = specs[i].name;
        g.role = specs[i].role;
        g.elem = specs[i].elem;
        g.tiled = specs[i].tiled;
        const std::vector<unsigned char>& poison = specs[i].poison;
        const bool written = g.role == GRole::output || g.role == GRole::workspace;
        if (written && !poison.empty())  // as spatialc.run fills C on a GPU: an element nobody writes shows
            for (size_t b = 0; b < n; ++b) const_cast<char*>(start)[b] = (char)poison[b % poison.size()];
    } else {
        g.name = "argument " + std::to_string(i);
        g.role = writable ? GRole::other : GRole::input;
    }
    (void)p;
    const bool shadowed = g.role == GRole::output || g.role == GRole::workspace || (specs.empty() && writable);
    if (shadowed) g.shadow.assign((n + g.elem - 1) / g.elem, GWrite{});
    return g;
}

SPATIALC_EMU_FN void bind_globals(const void* const* args, const bool* writable, size_t n_args) {
    std::lock_guard<std::mutex> lk(global_mu);
    gtensors.clear();
    for (size_t i = 0; i < n_args; ++i) {
        const char* start = nullptr;
        size_t n = 0;
        if (!args[i] || !allocation_of(args[i], start, n)) continue;
        if (std::any_of(gtensors.begin(), gtensors.end(), [&](const GTensor& g) { return g.base == start; }))
            continue;  // one allocation passed twice: its first name
        gtensors.push_back(bound_tensor(i, args[i], writable[i], start, n));
    }
}

// ---- the checks ---------------------------------------------------------------------------------------------------

// "a store (SPATIALC_OUT_ST) at line 512 by thread 161 (warp 5, lane 1) of block 3"
SPATIALC_EMU_FN std::string global_who(const char* what, int line) {
    const ThreadState& t = *self;
    return std::string(what) + " at line " + std::to_string(line) + " by thread " + std::to_string(t.tid) +
           " (warp " + std::to_string(t.warp) + ", lane " + std::to_string(t.lane) + ") of block " +
           std::to_string(blk().block_linear);
}

[[noreturn]] SPATIALC_EMU_FN void out_of_bounds(const GTensor& g, const char* p, size_t n, const char* what,
                                                int line) {
    const long long from = (long long)(p - g.base), to = from + (long long)n;
    const std::string where = from < 0 ? std::to_string(-from) + " bytes before its start"
                                       : std::to_string(to - (long long)g.bytes) + " bytes past its end";
    fatal(kExitMisuse, "OUT OF BOUNDS: " + global_who(what, line) + " touches bytes [" + std::to_string(from) + ", " +
                           std::to_string(to) + ") of global tensor '" + g.name + "', whose allocation holds " +
                           std::to_string(g.bytes) + " bytes: " + where);
}

// The bound tensor that holds [p, p + n): null for memory no tensor of the launch is near (a __device__ table); a
// report for an access that runs out of its tensor or lands in a red zone.
SPATIALC_EMU_FN GTensor* tensor_at(const void* at, size_t n, const char* what, int line) {
    const char* p = static_cast<const char*>(at);
    for (GTensor& g : gtensors) {
        if (p >= g.base && p < g.base + g.bytes) {
            if (p + n > g.base + g.bytes) out_of_bounds(g, p, n, what, line);
            return &g;
        }
        if ((p < g.base && p + kRedZone >= g.base) || (p >= g.base + g.bytes && p < g.base + g.bytes + g.rz_back))
            out_of_bounds(g, p, n, what, line);
    }
    return nullptr;
}

SPATIALC_EMU_FN std::string element_of(const GTensor& g, size_t e) {
    std::string s = "element " + std::to_string(e) + " of global tensor '" + g.name + "'";
    if (g.tiled)
        s += " (tile " + std::to_string(e / 256) + ", its element " + std::to_string(e % 256) + ")";
    return s;
}

SPATIALC_EMU_FN std::string writer_of(const GWrite& w) {
    return "block " + std::to_string(w.block) + " (thread " + std::to_string(w.tid) + " at line " +
           std::to_string(w.line) + ")";
}

[[noreturn]] SPATIALC_EMU_FN void unordered(const GTensor& g, size_t e, const GWrite& w, const char* what, int line,
                                            const char* does) {
    fatal(kExitRace, "RACE between blocks on " + element_of(g, e) + ": " + global_who(what, line) + " " + does +
                         " what " + writer_of(w) + " wrote, and nothing orders that write first: block " +
                         std::to_string(blk().block_linear) + " acquired no release of block " +
                         std::to_string(w.block) + " made after it (a wait on the sync word missing, or a relaxed "
                         "add where a release is needed)");
}

SPATIALC_EMU_FN void paired_alignment(const void* p, size_t n, const char* what, int line) {
    if (reinterpret_cast<uintptr_t>(p) % n != 0)
        fatal(kExitMisuse, "MISALIGNED: " + global_who(what, line) + " of " +
                               std::to_string(n) + " bytes at an address that is not a multiple of " +
                               std::to_string(n) + " (a GPU faults on it)");
}

SPATIALC_EMU_FN void global_write(const void* p, size_t n, const char* what, int line) {
    me(what);
    std::lock_guard<std::mutex> lk(global_mu);
    GTensor* g = tensor_at(p, n, what, line);
    if (!g) return;
    if (!g->writable || g->role == GRole::input)
        fatal(kExitMisuse, global_who(what, line) + " writes global tensor '" + g->name + "', an input of the kernel");
    if (g->shadow.empty()) return;
    const unsigned long me_b = blk().block_linear;
    const size_t off = (size_t)(static_cast<const char*>(p) - g->base);
    for (size_t e = off / g->elem; e <= (off + n - 1) / g->elem; ++e) {
        GWrite& w = g->shadow[e];
        if (w.block >= 0 && g->role == GRole::output)
            fatal(kExitRace, "RACE on " + element_of(*g, e) + ": " + global_who(what, line) +
                                 " writes it again after " + writer_of(w) + ": every element of an output is written "
                                 "once");
        if (w.block >= 0 && (unsigned long)w.block != me_b && known_epoch(me_b, (unsigned long)w.block) <= w.epoch)
            unordered(*g, e, w, what, line, "overwrites");
        w = GWrite{(int)me_b, self->tid, line, block_epoch(me_b)};
    }
}

SPATIALC_EMU_FN void global_read(const void* p, size_t n, const char* what, int line) {
    if (n == 0) return;
    me(what);
    std::lock_guard<std::mutex> lk(global_mu);
    GTensor* g = tensor_at(p, n, what, line);
    if (!g || g->shadow.empty()) return;
    const unsigned long me_b = blk().block_linear;
    const size_t off = (size_t)(static_cast<const char*>(p) - g->base);
    for (size_t e = off / g->elem; e <= (off + n - 1) / g->elem; ++e) {
        const GWrite& w = g->shadow[e];
        if (w.block < 0 && g->role == GRole::workspace)
            fatal(kExitRace, "RACE between blocks on " + element_of(*g, e) + ": " + global_who(what, line) +
                                 " reads it before any block of the launch wrote it (a wait for the block that "
                                 "writes it missing?): a kernel writes every workspace element it reads");
        if (w.block >= 0 && (unsigned long)w.block != me_b && known_epoch(me_b, (unsigned long)w.block) <= w.epoch)
            unordered(*g, e, w, what, line, "reads");
    }
}

}  // namespace spatialc_emu

#endif  // SPATIALC_EMU_GLOBAL_RUN_H

// spatialc host emulation — global memory: the tensors a launch is given, poisoned, bounds-checked and race-checked,
// and the order between blocks that release and acquire (sync words, cluster barriers). Definitions in
// emu_global_run.h, which emu_runtime.h includes.
//
// Every pointer argument of a launch is bound to the cudaMalloc allocation it points to (cudaMalloc keeps red zones
// around each one, so an access a little outside lands in none). The runner names each argument
// (SPATIALC_EMU_TENSORS: name, role, element size, poison); an output or workspace is filled with its poison before
// the launch, as spatialc.run fills the output on a GPU, so an element the kernel never writes shows in C.
//
// Every global access the emulator sees — cp.async sources, TMA boxes, the kernel's stores (SPATIALC_OUT_ST,
// SPATIALC_GLOBAL_ST) and TMA stores — must lie inside its tensor's allocation, and every store and every read of
// an output or workspace is checked against the writes before it in the launch:
// - an output element is written once (verify's rule 8: every element once, the rows past a group's count never);
// - a block may read, or write again, what another block wrote only after it acquired a release of that block made
//   after the write; a workspace element read before any block wrote it means a wait is missing.
// What orders blocks is counted per block: each block's releases are numbered (its epoch: a release add, a
// __threadfence, a cluster barrier), a write or a shared-memory access records the epoch of its block then, and a
// block learns another's epoch by an acquire that reads a release of it — an acquire wait on a sync word learns every
// release published on that word so far (a release add publishes a new epoch; a relaxed add publishes the latest
// __threadfence of its block, and nothing where none fenced: a fence then a relaxed add releases, a bare relaxed add
// does not). Whatever one thread of a block acquired the whole block is taken to
// know, so this check misses an order missing inside the acquiring block (a thread that reads before its engine's
// barrier with the acquiring thread); it never reports a correct kernel, whatever order the threads run in, and a
// missing acquire or release between blocks is reported on every run.
#ifndef SPATIALC_EMU_GLOBAL_H
#define SPATIALC_EMU_GLOBAL_H

#include <string>
#include <type_traits>
#include <vector>

#include "emu_core.h"

namespace spatialc_emu {

// Red zones around each allocation: in front, and behind at least as long as the allocation itself.
constexpr size_t kRedZone = 4096;

// The epoch of block `b` now (its releases so far), and what block `knower` knows of `of`'s (all for itself).
SPATIALC_EMU_FN unsigned block_epoch(unsigned long b);
SPATIALC_EMU_FN unsigned known_epoch(unsigned long knower, unsigned long of);
// A release by the calling thread's block: its new epoch.
SPATIALC_EMU_FN unsigned release_epoch();
// Blocks first … first + n - 1 run at once: they may learn each other's epochs (others never can).
SPATIALC_EMU_FN void blocks_at_once(unsigned long first, unsigned long n);
// Every block of a cluster learns every other's epoch (a cluster barrier: release and acquire at cluster scope).
SPATIALC_EMU_FN void cluster_release(unsigned long first, unsigned long n);

// The launch's `n` arguments, in order: each one's pointer (null for other arguments) and whether it points to
// non-const data: bound, poisoned, checked.
SPATIALC_EMU_FN void bind_globals(const void* const* args, const bool* writable, size_t n);
// A read or write of `n` bytes at `p` in global memory by the calling thread (`what` at `line` names it in a report).
SPATIALC_EMU_FN void global_read(const void* p, size_t n, const char* what, int line);
SPATIALC_EMU_FN void global_write(const void* p, size_t n, const char* what, int line);

template <class T>
const void* pointer_arg(const T& v) {
    if constexpr (std::is_pointer_v<T>) return static_cast<const void*>(v);
    return nullptr;
}
template <class T>
bool writable_arg() {
    if constexpr (std::is_pointer_v<T>) return !std::is_const_v<std::remove_pointer_t<T>>;
    return false;
}

// A launch's arguments bound before it runs (arrays, not vectors, so that a program's build instantiates no more
// than this function; one element more than the arguments, so that a kernel of none has arrays too).
template <class... A>
void bind_args(const A&... args) {
    const void* const pointers[] = {pointer_arg(args)..., nullptr};
    const bool writable[] = {writable_arg<A>()..., false};
    bind_globals(pointers, writable, sizeof...(A));
}

// A plain store to an output (SPATIALC_OUT_ST): checked, then made at once (nobody in the launch reads it).
template <class T, class V>
void out_store(T* p, V v, int line) {
    global_write(p, sizeof(T), "a store (SPATIALC_OUT_ST)", line);
    *p = static_cast<T>(v);
}

// A paired store to an output (SPATIALC_OUT_ST2): two adjacent elements as one store of twice their width, which a
// GPU makes only at an address aligned to both (else a misaligned-address fault): refused there, as the GPU would.
SPATIALC_EMU_FN void paired_alignment(const void* p, size_t n, const char* what, int line);

template <class T, class V>
void out_store2(T* p, V a, V b, int line) {
    const char* what = "a paired store (SPATIALC_OUT_ST2)";
    paired_alignment(p, 2 * sizeof(T), what, line);
    global_write(p, 2 * sizeof(T), what, line);
    p[0] = static_cast<T>(a);
    p[1] = static_cast<T>(b);
}

// Two adjacent accumulator elements as one 8-byte store to global memory another site reads in this launch
// (SPATIALC_GLOBAL_ST2), held as SPATIALC_GLOBAL_ST's store is; and loaded from it and added to two registers as one
// load (SPATIALC_GLOBAL_ADD2), checked as a cp.async source is against the writes before it, so a read not ordered
// after its write is reported. Both aligned as the GPU needs them, as a paired output store is.
template <class T>
void global_store2(T* p, T a, T b, int line) {
    static_assert(sizeof(T) == 4, "a pair of 4-byte accumulators");
    paired_alignment(p, 8, "a paired store (SPATIALC_GLOBAL_ST2)", line);
    const T pair[2] = {a, b};
    global_store(p, pair, 8, line);
}

template <class T>
void global_add2(const T* p, T& a, T& b, int line) {
    static_assert(sizeof(T) == 4, "a pair of 4-byte accumulators");
    const char* what = "a paired load (SPATIALC_GLOBAL_ADD2)";
    paired_alignment(p, 8, what, line);
    global_read(p, 8, what, line);
    a += p[0];
    b += p[1];
}

}  // namespace spatialc_emu

#define SPATIALC_OUT_ST(p, v) ::spatialc_emu::out_store((p), (v), __LINE__)
#define SPATIALC_OUT_ST2(p, a, b) ::spatialc_emu::out_store2((p), (a), (b), __LINE__)
#define SPATIALC_GLOBAL_ST2(p, a, b) ::spatialc_emu::global_store2((p), (a), (b), __LINE__)
#define SPATIALC_GLOBAL_ADD2(p, a, b) ::spatialc_emu::global_add2((p), (a), (b), __LINE__)

#endif  // SPATIALC_EMU_GLOBAL_H

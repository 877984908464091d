// spatialc host emulation — shared memory: the rings the kernel registers (SPATIALC_SHARED_RING /
// SPATIALC_DYNAMIC_RING), the dynamic block, and the race check on every access that passes through the
// emulator (cp.async landings, fragment loads, fragment stores).
//
// A race is two threads touching the same bytes in the same barrier interval (the count of __syncthreads a
// thread has passed), at least one of them writing; accesses of two lanes of one warp separated by a __syncwarp
// are ordered too, and so are two accesses an mbarrier orders (the first thread arrived after its access, the
// second completed a wait on that phase before its own: vector clocks, emu_mbarrier.h). Intervals are counted, not timed, so a missing barrier is reported on every run whatever
// order the threads happened to run in.
#ifndef SPATIALC_EMU_SHARED_H
#define SPATIALC_EMU_SHARED_H

#include "emu_core.h"

namespace spatialc_emu {

enum class AccessKind : unsigned char {
    none, cp_async, frag_load, frag_store, ldmatrix, acc_store, page_load, page_store, tma, wgmma, tma_store, dsmem
};

struct Access {
    int tid = -1;
    unsigned bi = 0, wi = 0;
    int line = 0;
    AccessKind kind = AccessKind::none;
    unsigned clk = 0;  // the thread's mbarrier clock at the access
    // The accessing thread's block, and its epoch then (emu_global.h): what orders accesses of two blocks — a store
    // into a peer's shared memory (dsmem) and that peer's own accesses. A dsmem store also keeps `rep`, the
    // receiving block's epoch then: the next store to those bytes needs a release of the receiver made after it.
    long blk = -1;
    unsigned gep = 0, rep = 0;
};

// Who last wrote one byte, and up to two distinct threads that read it since.
struct ByteShadow {
    Access w, r0, r1;
};

struct Region {
    char name[64];
    char* base;
    size_t bytes, elem, depth, page;  // depth in pages, page in elements, as the kernel declares them
    bool dynamic;                     // carved out of the dynamic block (else a static __shared__ array)
    const char* origin;               // where alignment is counted from: the dynamic block's start, or `base`
    const void* owner;                // the Block of a cooperative launch whose dynamic block it is (else null)
    const void* kernel;               // the kernel whose launch registered it
    std::vector<ByteShadow> shadow;
};

// Fresh shared memory holds garbage on a GPU: poison it so a read of a page nobody wrote is a wrong answer.
constexpr unsigned char kPoison = 0xCD;

SPATIALC_EMU_FN void register_region(const char* name, void* base, size_t elem, size_t depth, size_t page,
                                     bool dynamic);
SPATIALC_EMU_FN char* dynamic_shared();
// The registered shared region holding `p`, or null.
SPATIALC_EMU_FN Region* find_region(const void* p);
SPATIALC_EMU_FN void check_dynamic_ring(const char* name, char* base, size_t off, size_t bytes);
// Record that the calling thread wrote (or read) `size` bytes at each of `ptrs`; report the first conflict.
SPATIALC_EMU_FN void track(const void* const* ptrs, int count, size_t size, bool write, AccessKind kind, int line);
// A WMMA load or store's pointer and leading dimension, as the CUDA guide requires them: the pointer 256-bit
// aligned (checked within shared memory, where the GPU's layout is known: from the dynamic block's start, or
// from a static ring's), the leading dimension a multiple of 16 bytes.
SPATIALC_EMU_FN void check_wmma_pointer(const void* p, unsigned ldm, size_t elem, const char* what, int line);

// A static ring is registered once, when its declaration first runs; every block poisons it afresh.
template <class T>
bool register_static_ring(const char* name, T* base, size_t depth, size_t page) {
    std::memset(static_cast<void*>(base), kPoison, sizeof(T) * depth * page);
    register_region(name, base, sizeof(T), depth, page, false);
    return true;
}

template <class T>
T* dynamic_ring(const char* name, char* base, size_t off, size_t depth, size_t page) {
    check_dynamic_ring(name, base, off, sizeof(T) * depth * page);
    T* p = reinterpret_cast<T*>(base + off);
    register_region(name, p, sizeof(T), depth, page, true);
    return p;
}

// The general form's plain page accesses (kernel-abi.md, "The general form"), each checked like a fragment's.
template <class T>
T page_load(const T* p, int line) {
    const void* q = p;
    track(&q, 1, sizeof(T), false, AccessKind::page_load, line);
    return *p;
}
template <class T, class V>
void page_store(T* p, V v, int line) {
    const void* q = p;
    track(&q, 1, sizeof(T), true, AccessKind::page_store, line);
    *p = static_cast<T>(v);
}

// A plain store to global memory another site reads in the same launch (a workspace's partial sums), visible at
// device scope only once released (late mode: emu_core.h's GlobalStore).
template <class T, class V>
void global_store_value(T* p, V v, int line) {
    const T x = static_cast<T>(v);
    ::spatialc_emu::global_store(p, &x, (int)sizeof(T), line);
}

}  // namespace spatialc_emu

#define SPATIALC_GLOBAL_ST(p, v) ::spatialc_emu::global_store_value((p), (v), __LINE__)
#define SPATIALC_PAGE_LD(p) ::spatialc_emu::page_load((p), __LINE__)
#define SPATIALC_PAGE_ST(p, v) ::spatialc_emu::page_store((p), (v), __LINE__)

// The kernel's ring declarations (kernel-abi.md §2), registering each region for the race reports.
#define SPATIALC_SHARED_RING(T, name, depth, page)                      \
    __shared__ __align__(16) T name[(depth) * (page)];                  \
    [[maybe_unused]] static const bool spatialc_emu_registered_##name = \
        ::spatialc_emu::register_static_ring<T>(#name, name, (depth), (page))
#define SPATIALC_DYNAMIC_RING(T, name, base, off, depth, page) \
    T* name = ::spatialc_emu::dynamic_ring<T>(#name, (base), (off), (depth), (page))

#endif  // SPATIALC_EMU_SHARED_H

// spatialc host emulation — the general form's synchronisation (lower/cuda/general/mbarrier.cuh): mbarriers, as its
// rings use them; an engine's named barrier; counts in global memory (barrier arrivals, semaphores) for sites that
// hand over to each other.
//
// An mbarrier counts arrivals; the one that completes a phase flips its parity and wakes every waiter. A waiter
// names the parity of the phase it waits for and passes at once if that phase is already complete. Arrivals
// carry happens-before: the barrier joins each arriving thread's vector clock, and a thread that completes a
// wait joins the phase's clock, so the race check orders what the phase orders and nothing else.
//
// cp.async copies a thread hands to a barrier (cp.async.mbarrier.arrive.noinc) are checked as its writes when it
// hands them over; in late mode they land when the phase completes, in early mode they landed when issued. Late
// mode is stricter than the hardware: a thread's next cp.async arrive, on any barrier, also waits for its earlier
// copies, so a page one phase's waiters read may be there sooner on a GPU — a kernel that relied on that would fail
// here; none spatialc prints does. A thread blocked in a wait counts as blocked for the deadlock check, and a
// deadlock report lists every barrier someone waits on, with its phase and the arrivals it still lacks.
#ifndef SPATIALC_EMU_MBARRIER_H
#define SPATIALC_EMU_MBARRIER_H

#include "emu_shared.h"

namespace spatialc_emu {

SPATIALC_EMU_FN void mbar_init(void* bar, unsigned count, int line);
SPATIALC_EMU_FN void mbar_arrive(void* bar, int line);
SPATIALC_EMU_FN void mbar_cp_async_arrive(void* bar, int line);
// `cluster`: acquiring at cluster scope (spatialc_mbar_wait_cluster), as a phase a peer block completed needs.
SPATIALC_EMU_FN void mbar_wait(void* bar, unsigned parity, int line, bool cluster = false);
// Named barriers (emu_runtime.h): bar.sync, which waits for the phase, and bar.arrive, which does not.
SPATIALC_EMU_FN void engine_sync(unsigned id, unsigned threads, int line);
SPATIALC_EMU_FN void engine_arrive(unsigned id, unsigned threads, int line);
SPATIALC_EMU_FN void grid_add(int* word, int by, int line);
SPATIALC_EMU_FN void grid_wait(const int* word, int value, int line);
SPATIALC_EMU_FN void grid_add_relaxed(int* word, int by);  // (planted faults only: see spatialc_grid_add_relaxed)
// Distributed shared memory (multicast pages): `n` bytes at `src` in this block's dynamic shared memory to the
// same place as `dst` in block `site`'s, which must be rank `rank` of this block's cluster (what mapa is given).
SPATIALC_EMU_FN void dsmem_copy(const void* src, const void* dst, int site, unsigned rank, size_t n, int line);
SPATIALC_EMU_FN void check_dsmem_target(Block& other, const char* to, size_t n, int line);
// A cluster kernel (SPATIALC_CLUSTER_KERNEL): its launches run every block at once.
SPATIALC_EMU_FN bool set_cluster(const void* kernel, int sites);

}  // namespace spatialc_emu

// The kernel text's ring barrier helpers, defined here instead of by the text (it checks SPATIALC_MBARRIER).
#define SPATIALC_MBARRIER
inline void spatialc_mbar_init(unsigned long long* bar, unsigned count, int line = __builtin_LINE()) {
    spatialc_emu::mbar_init(bar, count, line);
}
inline void spatialc_mbar_arrive(unsigned long long* bar, int line = __builtin_LINE()) {
    spatialc_emu::mbar_arrive(bar, line);
}
inline void spatialc_cp_async_arrive(unsigned long long* bar, int line = __builtin_LINE()) {
    spatialc_emu::mbar_cp_async_arrive(bar, line);
}
inline void spatialc_mbar_wait(unsigned long long* bar, unsigned parity, int line = __builtin_LINE()) {
    spatialc_emu::mbar_wait(bar, parity, line);
}
inline void spatialc_engine_sync(unsigned id, unsigned threads, int line = __builtin_LINE()) {
    spatialc_emu::engine_sync(id, threads, line);
}
// The ping-pong's named barriers (lower/cuda/sm90a/pingpong.cuh, which checks SPATIALC_NAMED_ARRIVE).
#define SPATIALC_NAMED_ARRIVE
inline void spatialc_engine_arrive(unsigned id, unsigned threads, int line = __builtin_LINE()) {
    spatialc_emu::engine_arrive(id, threads, line);
}
inline void spatialc_grid_add(int* word, int by, int line = __builtin_LINE()) {
    spatialc_emu::grid_add(word, by, line);
}
// Not in the kernel texts: a relaxed add, which releases nothing — for tests that plant a missing release.
inline void spatialc_grid_add_relaxed(int* word, int by) { spatialc_emu::grid_add_relaxed(word, by); }
inline void spatialc_grid_wait(const int* word, int value, int line = __builtin_LINE()) {
    spatialc_emu::grid_wait(word, value, line);
}
inline void spatialc_dsmem_copy16(const void* src, const void* dst, int site, unsigned rank,
                                  int line = __builtin_LINE()) {
    spatialc_emu::dsmem_copy(src, dst, site, rank, 16, line);
}
inline void __nanosleep(unsigned) {}
#define SPATIALC_CLUSTER_KERNEL(kernel, sites)                     \
    [[maybe_unused]] static const bool spatialc_emu_cluster_##kernel = \
        ::spatialc_emu::set_cluster(reinterpret_cast<const void*>(&kernel), (sites));

#endif  // SPATIALC_EMU_MBARRIER_H

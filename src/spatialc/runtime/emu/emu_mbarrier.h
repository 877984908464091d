// spatialc host emulation — mbarriers, as the general form's rings use them (lower/cuda/general_mbarrier.cuh).
//
// An mbarrier counts arrivals; the one that completes a phase flips its parity and wakes every waiter. A waiter
// names the parity of the phase it waits for and passes at once if that phase is already complete. Arrivals
// carry happens-before: the barrier joins each arriving thread's vector clock, and a thread that completes a
// wait joins the phase's clock, so the race check orders what the phase orders and nothing else.
//
// cp.async copies a thread hands to a barrier (cp.async.mbarrier.arrive.noinc) are checked as its writes when it
// hands them over; in late mode they land when the phase completes (the latest a GPU may land them), in early
// mode they landed when issued. A thread blocked in a wait counts as blocked for the deadlock check, and a
// deadlock report lists every barrier someone waits on, with its phase and the arrivals it still lacks.
#ifndef SPATIALC_EMU_MBARRIER_H
#define SPATIALC_EMU_MBARRIER_H

#include "emu_shared.h"

namespace spatialc_emu {

SPATIALC_EMU_FN void mbar_init(void* bar, unsigned count, int line);
SPATIALC_EMU_FN void mbar_arrive(void* bar, int line);
SPATIALC_EMU_FN void mbar_cp_async_arrive(void* bar, int line);
SPATIALC_EMU_FN void mbar_wait(void* bar, unsigned parity, int line);

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
inline void __nanosleep(unsigned) {}

#endif  // SPATIALC_EMU_MBARRIER_H

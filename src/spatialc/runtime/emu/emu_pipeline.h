// spatialc host emulation — the cuda_pipeline primitives (cp.async).
//
// Each thread keeps its own copies: issued copies join the open group, __pipeline_commit closes it, and
// __pipeline_wait_prior(n) completes every committed group but the newest n. In late mode a copy reaches shared
// memory only then (a thread's wait completes only its own copies; the barrier after it publishes them), in
// early mode at issue. The source is read at issue either way.
#ifndef SPATIALC_EMU_PIPELINE_H
#define SPATIALC_EMU_PIPELINE_H

#include "emu_shared.h"

namespace spatialc_emu {

SPATIALC_EMU_FN void pipeline_copy(void* dst, const void* src, size_t size, size_t zfill, int line);
SPATIALC_EMU_FN void pipeline_commit();
SPATIALC_EMU_FN void pipeline_wait(size_t prior);

}  // namespace spatialc_emu

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t size, size_t zfill = 0,
                                    int line = __builtin_LINE()) {
    spatialc_emu::pipeline_copy(dst, src, size, zfill, line);
}
inline void __pipeline_commit() { spatialc_emu::pipeline_commit(); }
inline void __pipeline_wait_prior(size_t prior) { spatialc_emu::pipeline_wait(prior); }

#endif  // SPATIALC_EMU_PIPELINE_H

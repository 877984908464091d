// spatialc host emulation of CUDA: makes the exact text of an emitted program compile with g++ and run on the
// CPU (docs/kernel-abi.md). Run with SPATIALC_EMU_MODE=late|early in the environment; see emu_*.h for each part.
#ifndef SPATIALC_CUDA_EMU_H
#define SPATIALC_CUDA_EMU_H

#include "emu_core.h"      // qualifiers, thread and block state, built-in variables, barriers
#include "emu_shared.h"    // rings, dynamic shared memory, race check
#include "emu_global.h"    // the launch's tensors in global memory: poison, bounds, races between blocks
#include "emu_half.h"      // __half, __nv_bfloat16
#include "emu_pipeline.h"  // __pipeline_memcpy_async / commit / wait_prior
#include "emu_mbarrier.h"  // the general form's ring barriers
#include "emu_wmma.h"      // nvcuda::wmma
#include "emu_mma.h"       // the tensor-core layer: ldmatrix, mma.sync, accumulator stores
#include "emu_host.h"      // runtime API, launch
#include "emu_hopper.h"    // sm_90a: tensor maps, TMA loads, transaction counts, wgmma
#include "emu_instances.h"  // the templates above for the usual element types, compiled once

// The definitions, unless they come from a separately compiled object (see emu_core.h).
#if !defined(SPATIALC_EMU_LINKED) || defined(SPATIALC_EMU_IMPLEMENTATION)
#include "emu_runtime.h"
#endif

#endif  // SPATIALC_CUDA_EMU_H

// spatialc host emulation — the headers' templates, instantiated once for the element types programs use.
//
// A program linked against the runtime object (SPATIALC_EMU_LINKED) declares these instantiations `extern template`,
// so that its build compiles none of their bodies and calls the object's copies, which the object's own build
// (SPATIALC_EMU_IMPLEMENTATION) defines here: a general-form program otherwise compiled its own ldmatrix loads and
// MMAs, a fifth of its g++ time. Another element type, or another pair of types, is instantiated by the program as
// before. Header-only use (neither macro) declares nothing here.
#ifndef SPATIALC_EMU_INSTANCES_H
#define SPATIALC_EMU_INSTANCES_H

#include "emu_half.h"
#include "emu_mma.h"
#include "emu_shared.h"

#if defined(SPATIALC_EMU_LINKED) && !defined(SPATIALC_EMU_IMPLEMENTATION)
#define SPATIALC_EMU_INSTANCE extern template
#elif defined(SPATIALC_EMU_LINKED)
#define SPATIALC_EMU_INSTANCE template
#endif

#ifdef SPATIALC_EMU_INSTANCE

// Each element type's shared-memory rings and plain page accesses (emu_shared.h).
#define SPATIALC_EMU_PAGE_INSTANCES(T)                                                                       \
    namespace spatialc_emu {                                                                                 \
    SPATIALC_EMU_INSTANCE T* dynamic_ring<T>(const char*, char*, size_t, size_t, size_t);                    \
    SPATIALC_EMU_INSTANCE T page_load<T>(const T*, int);                                                     \
    SPATIALC_EMU_INSTANCE void page_store<T, T>(T*, T, int);                                                 \
    }
SPATIALC_EMU_PAGE_INSTANCES(float)
SPATIALC_EMU_PAGE_INSTANCES(int)
SPATIALC_EMU_PAGE_INSTANCES(unsigned long long)
SPATIALC_EMU_PAGE_INSTANCES(signed char)
SPATIALC_EMU_PAGE_INSTANCES(unsigned char)
SPATIALC_EMU_PAGE_INSTANCES(__half)
SPATIALC_EMU_PAGE_INSTANCES(__nv_bfloat16)
SPATIALC_EMU_PAGE_INSTANCES(__nv_fp8_e4m3)
SPATIALC_EMU_PAGE_INSTANCES(__nv_fp8_e5m2)
#undef SPATIALC_EMU_PAGE_INSTANCES

// The tensor-core layer (emu_mma.h): loads of 16-bit operands, their MMA, and what moves their fragments.
#define SPATIALC_EMU_MMA16_INSTANCES(T)                                                                      \
    namespace spatialc_emu {                                                                                 \
    SPATIALC_EMU_INSTANCE void load_a16<T>(spatialc_frag<T>&, const T*, bool, const char*, int);              \
    SPATIALC_EMU_INSTANCE void load_b16<T>(spatialc_frag<T>&, const T*, bool, bool, const char*, int);        \
    SPATIALC_EMU_INSTANCE void mma<T, float>(spatialc_acc<float>&, const spatialc_frag<T>&,                  \
                                             const spatialc_frag<T>&, int, const char*);                     \
    }                                                                                                        \
    SPATIALC_EMU_INSTANCE void spatialc_load_a_float<T>(spatialc_frag<T>&, const float*, int);                \
    SPATIALC_EMU_INSTANCE void spatialc_load_a_acc<T>(spatialc_frag<T>&, const float*, int);                  \
    SPATIALC_EMU_INSTANCE void spatialc_b_from_regs<T>(spatialc_frag<T>&, const unsigned (&)[4], int);
SPATIALC_EMU_MMA16_INSTANCES(__half)
SPATIALC_EMU_MMA16_INSTANCES(__nv_bfloat16)
#undef SPATIALC_EMU_MMA16_INSTANCES

// 8-bit operands: int8 into int32, the 8-bit floats into float32.
namespace spatialc_emu {
SPATIALC_EMU_INSTANCE void load_int8<signed char>(spatialc_frag<signed char>&, const signed char* const*, int, bool,
                                                  const char*, int);
SPATIALC_EMU_INSTANCE void load_int8<__nv_fp8_e4m3>(spatialc_frag<__nv_fp8_e4m3>&, const __nv_fp8_e4m3* const*, int,
                                                    bool, const char*, int);
SPATIALC_EMU_INSTANCE void load_int8<__nv_fp8_e5m2>(spatialc_frag<__nv_fp8_e5m2>&, const __nv_fp8_e5m2* const*, int,
                                                    bool, const char*, int);
SPATIALC_EMU_INSTANCE void mma<signed char, int>(spatialc_acc<int>&, const spatialc_frag<signed char>&,
                                                 const spatialc_frag<signed char>&, int, const char*);
SPATIALC_EMU_INSTANCE void mma<__nv_fp8_e4m3, float>(spatialc_acc<float>&, const spatialc_frag<__nv_fp8_e4m3>&,
                                                     const spatialc_frag<__nv_fp8_e4m3>&, int, const char*);
SPATIALC_EMU_INSTANCE void mma<__nv_fp8_e5m2, float>(spatialc_acc<float>&, const spatialc_frag<__nv_fp8_e5m2>&,
                                                     const spatialc_frag<__nv_fp8_e5m2>&, int, const char*);
}  // namespace spatialc_emu

// Accumulator tiles to and from shared memory.
SPATIALC_EMU_INSTANCE void spatialc_store_acc<float>(float*, const spatialc_acc<float>&, int);
SPATIALC_EMU_INSTANCE void spatialc_store_acc<int>(int*, const spatialc_acc<int>&, int);
SPATIALC_EMU_INSTANCE void spatialc_add_acc<float>(spatialc_acc<float>&, const float*, int);
SPATIALC_EMU_INSTANCE void spatialc_add_acc<int>(spatialc_acc<int>&, const int*, int);

#undef SPATIALC_EMU_INSTANCE
#endif  // SPATIALC_EMU_INSTANCE

#endif  // SPATIALC_EMU_INSTANCES_H

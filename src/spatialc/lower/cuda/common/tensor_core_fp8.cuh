// 8-bit float operands (e4m3, e5m2; cuda_fp8.h's __nv_fp8_e4m3, __nv_fp8_e5m2), inlined after tensor_core.cuh in a
// kernel that multiplies them. Their pages are laid out as int8's (A row-major, B K-major) and ldmatrix moves bytes,
// so a fragment is int8's, register for register: int8's loads fill it. The MMA is sm_89's
// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (or .e5m2), float32 accumulators; one K tile (k16) runs it with
// the upper 16 k of both operands zero, so that only PTX ISA 8.4's k32 shape is needed. The host emulation defines
// SPATIALC_TENSOR_CORE_FP8 and the same functions (emu_mma.h).
#ifndef SPATIALC_TENSOR_CORE_FP8
#define SPATIALC_TENSOR_CORE_FP8

__device__ __forceinline__ void spatialc_mma_fp8(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                 unsigned b0, unsigned b1, const __nv_fp8_e4m3*)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void spatialc_mma_fp8(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                 unsigned b0, unsigned b1, const __nv_fp8_e5m2*)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// An 8-bit float fragment as int8's (the same four registers), and its pages' bytes as int8's.
template <class T>
__device__ __forceinline__ spatialc_frag<signed char>& spatialc_bytes(spatialc_frag<T>& f)
{
    return *reinterpret_cast<spatialc_frag<signed char>*>(&f);
}

template <class T>
__device__ __forceinline__ const signed char* spatialc_bytes(const T* tile)
{
    return reinterpret_cast<const signed char*>(tile);
}

// Loads (int8's) and MMAs of one 8-bit float type: k32 over two K tiles, k16 over one (a0 a1 / b0 of each half
// loaded, the registers of k 16-31 zero).
#define SPATIALC_FP8_OPERAND(T)                                                                                   \
    __device__ __forceinline__ void spatialc_load_a2(spatialc_frag<T>& f, const T* t0, const T* t1)              \
    {                                                                                                             \
        spatialc_load_a2(spatialc_bytes(f), spatialc_bytes(t0), spatialc_bytes(t1));                              \
    }                                                                                                             \
    __device__ __forceinline__ void spatialc_load_b2(spatialc_frag<T>& f, const T* t0, const T* t1)              \
    {                                                                                                             \
        spatialc_load_b2(spatialc_bytes(f), spatialc_bytes(t0), spatialc_bytes(t1));                              \
    }                                                                                                             \
    __device__ __forceinline__ void spatialc_load_a(spatialc_frag<T>& f, const T* tile)                          \
    {                                                                                                             \
        spatialc_load_a(spatialc_bytes(f), spatialc_bytes(tile));                                                 \
    }                                                                                                             \
    __device__ __forceinline__ void spatialc_load_b(spatialc_frag<T>& f, const T* tile)                          \
    {                                                                                                             \
        spatialc_load_b(spatialc_bytes(f), spatialc_bytes(tile));                                                 \
    }                                                                                                             \
    __device__ __forceinline__ void spatialc_mma2(spatialc_acc<float>& d, const spatialc_frag<T>& a,             \
                                                  const spatialc_frag<T>& b)                                      \
    {                                                                                                             \
        float(&lo)[4] = *reinterpret_cast<float(*)[4]>(&d.x[0]);                                                  \
        float(&hi)[4] = *reinterpret_cast<float(*)[4]>(&d.x[4]);                                                  \
        spatialc_mma_fp8(lo, a.r[0], a.r[1], a.r[2], a.r[3], b.r[0], b.r[1], static_cast<const T*>(nullptr));     \
        spatialc_mma_fp8(hi, a.r[0], a.r[1], a.r[2], a.r[3], b.r[2], b.r[3], static_cast<const T*>(nullptr));     \
    }                                                                                                             \
    __device__ __forceinline__ void spatialc_mma(spatialc_acc<float>& d, const spatialc_frag<T>& a,              \
                                                 const spatialc_frag<T>& b)                                       \
    {                                                                                                             \
        float(&lo)[4] = *reinterpret_cast<float(*)[4]>(&d.x[0]);                                                  \
        float(&hi)[4] = *reinterpret_cast<float(*)[4]>(&d.x[4]);                                                  \
        spatialc_mma_fp8(lo, a.r[0], a.r[1], 0u, 0u, b.r[0], 0u, static_cast<const T*>(nullptr));                 \
        spatialc_mma_fp8(hi, a.r[0], a.r[1], 0u, 0u, b.r[2], 0u, static_cast<const T*>(nullptr));                 \
    }

SPATIALC_FP8_OPERAND(__nv_fp8_e4m3)
SPATIALC_FP8_OPERAND(__nv_fp8_e5m2)
#undef SPATIALC_FP8_OPERAND

#endif  // SPATIALC_TENSOR_CORE_FP8

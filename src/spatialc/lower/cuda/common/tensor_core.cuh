// The tensor-core layer: one 16×16 tile's operand fragment loaded from shared memory with ldmatrix, the MMA that
// multiplies a pair into a 16×16 accumulator held as registers (two m16n8 halves), and the accumulator's store.
// Every lane of the warp calls each function with the same tile pointers; the function works out its own row
// address. The host emulation defines SPATIALC_TENSOR_CORE and implements the same functions in C++ with the
// hardware's fragment layouts (emu_mma.h), so this kernel text runs on the CPU too.
//
// Page layouts (kernel-abi.md, "Page layouts"): a 16-bit tile is row-major with the two 16-byte halves of row r
// exchanged when bit 2 of r is set (swizzled: every 8×8 matrix of a load then spans all 32 banks once); an 8-bit A
// tile is row-major, an 8-bit B tile column-major (K-major), since ldmatrix cannot transpose 8-bit data.
#ifndef SPATIALC_TENSOR_CORE
#define SPATIALC_TENSOR_CORE

template <class T>
struct spatialc_frag {
    unsigned r[4];  // 16-bit: A 16×16 (a0..a3) or B 16×16 (b0, b1 of columns 0-7, then of 8-15); int8: the k32 pair
};
template <class T>
struct spatialc_acc {
    T x[8];  // columns 0-7: x[0..3] (c0..c3 of the first m16n8 half); columns 8-15: x[4..7]
};

__device__ __forceinline__ unsigned spatialc_lane() { return threadIdx.x & 31u; }

// The element offset of 16-byte chunk `half` (0 or 1) of row `row` in a swizzled 16-bit tile.
__device__ __forceinline__ unsigned spatialc_swizzled(unsigned row, unsigned half)
{
    return row * 16u + ((half ^ ((row >> 2) & 1u)) << 3);
}

__device__ __forceinline__ void spatialc_ldsm_x4(unsigned (&r)[4], const void* row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(row)));
}

__device__ __forceinline__ void spatialc_ldsm_x4_trans(unsigned (&r)[4], const void* row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(row)));
}

__device__ __forceinline__ void spatialc_ldsm_x2(unsigned& r0, unsigned& r1, const void* row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1)
                 : "r"((unsigned)__cvta_generic_to_shared(row)));
}

// ---- 16-bit operands: one 16×16 tile, swizzled ----------------------------------------------------------------
// Lane j names row (j % 8) + 8 ((j / 8) % 2), half j / 16: matrices 0..3 are rows 0-7 / 8-15 of half 0, then of
// half 1 — A's a0..a3, and, transposed, B's b0 b1 for columns 0-7 and b0 b1 for columns 8-15.
template <class T>
__device__ __forceinline__ void spatialc_load_a(spatialc_frag<T>& f, const T* tile)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4(f.r, tile + spatialc_swizzled((j & 7u) + ((j >> 3) & 1u) * 8u, j >> 4));
}

template <class T>
__device__ __forceinline__ void spatialc_load_b(spatialc_frag<T>& f, const T* tile)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4_trans(f.r, tile + spatialc_swizzled((j & 7u) + ((j >> 3) & 1u) * 8u, j >> 4));
}

__device__ __forceinline__ void spatialc_mma_half(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                                  const __half*)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void spatialc_mma_half(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                                  const __nv_bfloat16*)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a·b over one 16×16×16 step.
template <class T>
__device__ __forceinline__ void spatialc_mma(spatialc_acc<float>& d, const spatialc_frag<T>& a,
                                             const spatialc_frag<T>& b)
{
    float(&lo)[4] = *reinterpret_cast<float(*)[4]>(&d.x[0]);
    float(&hi)[4] = *reinterpret_cast<float(*)[4]>(&d.x[4]);
    spatialc_mma_half(lo, a.r, b.r[0], b.r[1], static_cast<const T*>(nullptr));
    spatialc_mma_half(hi, a.r, b.r[2], b.r[3], static_cast<const T*>(nullptr));
}

// ---- 8-bit operands: A row-major, B K-major; a K step of 32 (two tiles) or 16 (one) ----------------------------
// A, k32: lane j names row j % 16 of tile j / 16 (matrices: rows 0-7, 8-15 of the first tile, then of the second).
__device__ __forceinline__ void spatialc_load_a2(spatialc_frag<signed char>& f, const signed char* t0,
                                                 const signed char* t1)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4(f.r, (j < 16u ? t0 : t1) + (j & 15u) * 16u);
}

// B, k32 (K-major tiles: row n holds column n's 16 k): matrices are columns 0-7 of the first tile, of the second,
// then columns 8-15 of each — b0 b1 of the first m16n8 half, then of the second.
__device__ __forceinline__ void spatialc_load_b2(spatialc_frag<signed char>& f, const signed char* t0,
                                                 const signed char* t1)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4(f.r, ((j >> 3) & 1u ? t1 : t0) + ((j & 7u) + (j >> 4) * 8u) * 16u);
}

// One tile each (k16): A's rows 0-15 (a0, a1), B's columns 0-15 (b0 of each half), from lanes 0-15's addresses.
__device__ __forceinline__ void spatialc_load_a(spatialc_frag<signed char>& f, const signed char* tile)
{
    spatialc_ldsm_x2(f.r[0], f.r[1], tile + (spatialc_lane() & 15u) * 16u);
}

__device__ __forceinline__ void spatialc_load_b(spatialc_frag<signed char>& f, const signed char* tile)
{
    spatialc_ldsm_x2(f.r[0], f.r[2], tile + (spatialc_lane() & 15u) * 16u);
}

// d += a·b over 16×16×32 (int32 accumulators wrap as the hardware's do; the lowering proves they never need to).
__device__ __forceinline__ void spatialc_mma2(spatialc_acc<int>& d, const spatialc_frag<signed char>& a,
                                              const spatialc_frag<signed char>& b)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};"
                     : "+r"(d.x[4 * h]), "+r"(d.x[4 * h + 1]), "+r"(d.x[4 * h + 2]), "+r"(d.x[4 * h + 3])
                     : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[2 * h]), "r"(b.r[2 * h + 1]));
    }
}

// d += a·b over 16×16×16.
__device__ __forceinline__ void spatialc_mma(spatialc_acc<int>& d, const spatialc_frag<signed char>& a,
                                             const spatialc_frag<signed char>& b)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                     "{%0, %1, %2, %3};"
                     : "+r"(d.x[4 * h]), "+r"(d.x[4 * h + 1]), "+r"(d.x[4 * h + 2]), "+r"(d.x[4 * h + 3])
                     : "r"(a.r[0]), "r"(a.r[1]), "r"(b.r[2 * h]));
    }
}

// ---- accumulators ----------------------------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void spatialc_acc_zero(spatialc_acc<T>& d)
{
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        d.x[i] = T(0);
    }
}

// Element i of the lane's accumulator: row (lane / 4) + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2.
// Stored row-major into a 16×16 tile, two adjacent elements at a time.
template <class T>
__device__ __forceinline__ void spatialc_store_acc(T* tile, const spatialc_acc<T>& d)
{
    const unsigned lane = spatialc_lane(), g = lane >> 2, c = 2u * (lane & 3u);
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
        const unsigned row = g + 8u * ((i >> 1) & 1), col = 8u * (i >> 2) + c;
        tile[row * 16u + col] = d.x[i];
        tile[row * 16u + col + 1u] = d.x[i + 1];
    }
}

// The reverse of the store, added: each lane adds its elements of a row-major 16×16 tile to its accumulator
// (split-K's partial sums, which reach the owner as pages of the layout the store writes).
template <class T>
__device__ __forceinline__ void spatialc_add_acc(spatialc_acc<T>& d, const T* tile)
{
    const unsigned lane = spatialc_lane(), g = lane >> 2, c = 2u * (lane & 3u);
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
        const unsigned row = g + 8u * ((i >> 1) & 1), col = 8u * (i >> 2) + c;
        d.x[i] += tile[row * 16u + col];
        d.x[i + 1] += tile[row * 16u + col + 1u];
    }
}
#endif

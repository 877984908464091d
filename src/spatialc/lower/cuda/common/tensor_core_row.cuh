// The 16-bit loads beyond a GEMM's swizzled A and B: A, B or Bᵀ from plain row-major tiles (a page an engine computed,
// an MLP's hidden activations, whose elementwise stores keep the accumulator's rows as they are; a tensor's tiles as
// stored), A from float32 values rounded as they are loaded (attention's P) and Bᵀ from swizzled tiles (attention's
// K); inlined after tensor_core.cuh where a kernel reads such a page. Rows r and r + 4 of each 8×8 matrix then share banks (two-way conflicts), which a page read once per
// hidden step affords. The host emulation defines SPATIALC_TENSOR_CORE_ROW and the same function (emu_mma.h).
#ifndef SPATIALC_TENSOR_CORE_ROW
#define SPATIALC_TENSOR_CORE_ROW

// Lane j names row (j % 8) + 8 ((j / 8) % 2), half j / 16, as spatialc_load_a does, without the swizzle.
template <class T>
__device__ __forceinline__ void spatialc_load_a_row(spatialc_frag<T>& f, const T* tile)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4(f.r, tile + ((j & 7u) + ((j >> 3) & 1u) * 8u) * 16u + (j >> 4) * 8u);
}

// B from a plain row-major tile (a tensor's tiles as stored: attention's V), transposed by the load as
// spatialc_load_b's is: lane j names k row (j % 8) + 8 ((j / 8) % 2), column half j / 16.
template <class T>
__device__ __forceinline__ void spatialc_load_b_row(spatialc_frag<T>& f, const T* tile)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4_trans(f.r, tile + ((j & 7u) + ((j >> 3) & 1u) * 8u) * 16u + (j >> 4) * 8u);
}

// Bᵀ's swizzled tile (K-major B: tile row n holds column n's 16 k — attention's K), the mma's column-major B fragment
// as it stands, so the load does not transpose: lane j names tile row (j % 8) + 8 (j / 16), k half (j / 8) % 2.
template <class T>
__device__ __forceinline__ void spatialc_load_bt(spatialc_frag<T>& f, const T* tile)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4(f.r, tile + spatialc_swizzled((j & 7u) + (j >> 4) * 8u, (j >> 3) & 1u));
}

// B from a plain row-major tile of Bᵀ (K-major B: tile row n holds column n's 16 k — attention's K, whose rows are
// the columns of Kᵀ), which is the mma's column-major B fragment as it stands, so the load does not transpose:
// lane j names tile row (j % 8) + 8 (j / 16), k half (j / 8) % 2 — matrices b0 b1 of columns 0-7, then of 8-15.
template <class T>
__device__ __forceinline__ void spatialc_load_bt_row(spatialc_frag<T>& f, const T* tile)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4(f.r, tile + ((j & 7u) + (j >> 4) * 8u) * 16u + ((j >> 3) & 1u) * 8u);
}

// Two floats rounded to nearest even into one register of a 16-bit fragment (the lower column in the low half).
__device__ __forceinline__ unsigned spatialc_pack2(float lo, float hi, const __nv_bfloat16*)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

__device__ __forceinline__ unsigned spatialc_pack2(float lo, float hi, const __half*)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// A from a plain row-major tile of float32 values an engine computed and other ops read as they are (attention's P,
// which the running sum adds unrounded): each lane loads the eight values of its fragment — a0..a3, rows lane / 4
// and + 8, columns 2 (lane % 4), + 1 and + 8, + 9 — and rounds them to the operand type, as the interpreter rounds a
// computed page where a matmul reads it.
template <class T>
__device__ __forceinline__ void spatialc_load_a_float(spatialc_frag<T>& f, const float* tile)
{
    const unsigned j = spatialc_lane(), g = j >> 2, c = 2u * (j & 3u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 v = *reinterpret_cast<const float2*>(tile + (g + 8u * (i & 1)) * 16u + c + 8u * (i >> 1));
        f.r[i] = spatialc_pack2(v.x, v.y, static_cast<const T*>(nullptr));
    }
}

// A from the float32 accumulator fragment a lane holds of a register ring (attention's P kept in registers,
// registers.py): its eight values x[0..7] — rows lane / 4 and + 8, columns 2 (lane % 4), + 1 and + 8, + 9, as
// spatialc_acc lays them out — are A's a0..a7 in order (mma.m16n8k16's fragment layouts), packed two by two and
// rounded to nearest even, as spatialc_load_a_float rounds a float32 page.
template <class T>
__device__ __forceinline__ void spatialc_load_a_acc(spatialc_frag<T>& f, const float* x)
{
#pragma unroll
    for (int j = 0; j < 4; ++j) f.r[j] = spatialc_pack2(x[2 * j], x[2 * j + 1], static_cast<const T*>(nullptr));
}

#endif  // SPATIALC_TENSOR_CORE_ROW

// 16-bit fragments from plain row-major tiles: A from a page an engine computed (an MLP's hidden activations, attention's
// P), whose elementwise stores keep the accumulator's rows as they are, and A, B or Bᵀ from a tensor's tiles as
// stored (attention's Q, V and K); inlined after tensor_core.cuh where a kernel has such a page. Rows r and r + 4 of each 8×8 matrix then share banks (two-way conflicts), which a page read once per
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

// B from a plain row-major tile of Bᵀ (K-major B: tile row n holds column n's 16 k — attention's K, whose rows are
// the columns of Kᵀ), which is the mma's column-major B fragment as it stands, so the load does not transpose:
// lane j names tile row (j % 8) + 8 (j / 16), k half (j / 8) % 2 — matrices b0 b1 of columns 0-7, then of 8-15.
template <class T>
__device__ __forceinline__ void spatialc_load_bt_row(spatialc_frag<T>& f, const T* tile)
{
    const unsigned j = spatialc_lane();
    spatialc_ldsm_x4(f.r, tile + ((j & 7u) + (j >> 4) * 8u) * 16u + ((j >> 3) & 1u) * 8u);
}

#endif  // SPATIALC_TENSOR_CORE_ROW

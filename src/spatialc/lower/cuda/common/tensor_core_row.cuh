// 16-bit A fragments from plain row-major tiles: a page an engine computed (an MLP's hidden activations), whose
// elementwise stores keep the accumulator's rows as they are; inlined after tensor_core.cuh where a kernel has such
// a page. Rows r and r + 4 of each 8×8 matrix then share banks (two-way conflicts), which a page read once per
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

#endif  // SPATIALC_TENSOR_CORE_ROW

// The sm_90a form's W4A16 layer (sm90a/dequant.py): the packed page's bulk copies and the consumers' stores of the
// dequantised weights into B's operand page of N-major swizzled panels, which wgmma then reads from shared memory.
// The weights themselves are dequantised by common/dequant.cuh (spatialc_w4_regs: the register path's one text).

#ifndef SPATIALC_SM90A_EMULATED
// `bytes` contiguous bytes of global memory (a row of a packed page's tiles) into shared memory by the copy engine,
// counted on `bar` when they land: cp.async.bulk needs no tensor map; its ends and size are multiples of 16 bytes.
__device__ __forceinline__ void spatialc_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     spatialc_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(spatialc_smem_addr(bar))
                 : "memory");
}
#endif

// The byte of element (k, j) of a B page of N-major panels WIDTH bytes wide, PANEL bytes each: its panel, its row
// there, its byte in that row, the 16-byte chunk index XORed with the offset's bits 7 up — ir/nodes.py's
// panel_offset, the copy engine's and wgmma's swizzle for a page on its pattern's period.
template <unsigned WIDTH, unsigned PANEL>
__device__ __forceinline__ unsigned spatialc_panel_byte(unsigned k, unsigned j)
{
    const unsigned off = (j / (WIDTH / 2u)) * PANEL + k * WIDTH + (j % (WIDTH / 2u)) * 2u;
    return off ^ (((off >> 7) & (WIDTH / 16u - 1u)) << 4);
}

// The four registers spatialc_w4_regs made of a packed tile's word `lane` (rows k0, k0 + 1 | k0 + 8, k0 + 9 of
// columns j0 | j0 + 8, each register the even row in its low half) stored, a value at a time, where B's panels hold
// them: eight 16-bit stores (N-major: a register's two rows are a panel row apart).
template <unsigned WIDTH, unsigned PANEL, class T>
__device__ __forceinline__ void spatialc_w4_store_panels(char* page, const unsigned (&r)[4], unsigned k0, unsigned j0)
{
#pragma unroll
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned k = k0 + 8u * (i & 1u), j = j0 + 8u * (i >> 1);
        T v[2];
        memcpy(&v, &r[i], 4);
        SPATIALC_PAGE_ST(reinterpret_cast<T*>(page + spatialc_panel_byte<WIDTH, PANEL>(k, j)), v[0]);
        SPATIALC_PAGE_ST(reinterpret_cast<T*>(page + spatialc_panel_byte<WIDTH, PANEL>(k + 1u, j)), v[1]);
    }
}

// A byte and a 16-bit value of a stage of scales or zero points the copy engine landed beside a packed page, read
// through the aligned 32-bit word that holds it (no byte loads), as a page load.
__device__ __forceinline__ unsigned spatialc_w4_stage_byte(const unsigned char* stage, unsigned at)
{
    const unsigned w = SPATIALC_PAGE_LD(reinterpret_cast<const unsigned*>(stage) + at / 4u);
    return (w >> (8u * (at % 4u))) & 255u;
}

__device__ __forceinline__ unsigned spatialc_w4_stage_half(const unsigned char* stage, unsigned at)
{
    const unsigned w = SPATIALC_PAGE_LD(reinterpret_cast<const unsigned*>(stage) + at / 2u);
    return (w >> (16u * (at % 2u))) & 65535u;
}

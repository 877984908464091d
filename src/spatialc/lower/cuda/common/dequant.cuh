// A W4A16 GEMM's dequantisation (numerics/w4.py, `dequant`): the one C text every CUDA form that prints the dequant
// prologue inlines, the same under nvcc and the host emulation (cuda_bf16.h / cuda_fp16.h come before it).
//
//     d = round_op( f32( f32(scale) * f32(q - zero) ) )
//
// q is a 4-bit code's value: int4 sign-extended, uint4 as it is, e2m1 by its 16-entry table; q - zero is an exact
// integer (|q - zero| <= 15), exact in float32, and so is e2m1's value; the one float32 multiply rounds to nearest
// even (exact for bf16, fp16 and e8m0 scales), and the conversion to the operand type is one more rounding to
// nearest even (fp16 overflows to +-inf). Nothing here may be contracted into a fused operation: there is none to
// contract (one multiply, then a conversion).

// The element types of the kernel's 4-bit tensors (lower/cuda/common/dequant.py; runtime/tilize.py names them back).
typedef unsigned char spatialc_int4x2;   // a byte of two int4 values: B[2i, j] in its low nibble, B[2i + 1, j] high
typedef unsigned char spatialc_uint4x2;  // the same of uint4 values
typedef unsigned char spatialc_e2m1x2;   // the same of float4_e2m1fn codes
typedef signed char spatialc_int4;       // one int4 value a byte (zero points)
typedef unsigned char spatialc_uint4;    // one uint4 value a byte (zero points)
typedef unsigned char spatialc_e8m0;     // a float8_e8m0fnu scale's code

// The value of a 4-bit code (its low four bits) of each format.
__device__ __forceinline__ float spatialc_w4_int4(unsigned code)
{
    return (float)((int)(code & 15u) - (int)((code & 8u) << 1));  // two's complement: 8..15 are -8..-1
}

__device__ __forceinline__ float spatialc_w4_uint4(unsigned code)
{
    return (float)(code & 15u);
}

// float4_e2m1fn: sign bit 3, exponent bits 2-1 (bias 1), fraction bit 0; no inf or NaN.
__device__ __forceinline__ float spatialc_w4_e2m1(unsigned code)
{
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = mag[code & 7u];
    return (code & 8u) ? -v : v;
}

// A float8_e8m0fnu scale: code c is 2^(c - 127) (c = 0 is 2^-127, a float32 subnormal; 255 is NaN), built from
// its bits so that it is exact with no library call.
__device__ __forceinline__ float spatialc_e8m0_value(unsigned char code)
{
    const unsigned bits = code == 255u ? 0x7fc00000u : code == 0u ? 0x00400000u : (unsigned)code << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// The dequantised weight in float32 (before the operand's rounding): f32(scale) * f32(q - zero).
__device__ __forceinline__ float spatialc_dequant_f32(float q, float scale, float zero)
{
    return scale * (q - zero);
}

// ... rounded to the operand type, nearest even.
__device__ __forceinline__ __nv_bfloat16 spatialc_dequant_bf16(float q, float scale, float zero)
{
    return __float2bfloat16_rn(spatialc_dequant_f32(q, scale, zero));
}

__device__ __forceinline__ __half spatialc_dequant_fp16(float q, float scale, float zero)
{
    return __float2half_rn(spatialc_dequant_f32(q, scale, zero));
}

// ---- the register path: a tile of packed weights straight into mma.sync's B fragment ------------------------------
// Lane L of the warp loads 32-bit word L of the tile (w4_host.cuh's spatialc_w4_tile_byte lays the bytes out so):
// byte 0 holds rows 2t, 2t + 1 of column n, byte 1 rows 2t + 8, 2t + 9, bytes 2 and 3 the same of column n + 8
// (t = L % 4, n = L / 4) — its B registers b0, b1 of columns 0-7, then of 8-15, each two consecutive K values of one
// column. Every weight is dequantised in float32 registers exactly as above, and each pair is rounded to the operand
// type into one 32-bit register (the even row in the low half): no shared-memory operand page, no byte loads.
//
// The value of a code in float32 without a conversion instruction: int4 / uint4 as 2^23 + code (the code ORed into
// the mantissa of 2^23; int4's code XOR 8 is q + 8), so that one subtraction of 2^23 + z (+ 8) leaves q - z exactly
// (both below 2^24, their difference a small integer: exact);
// e2m1's three magnitude bits placed at the top of a float32's exponent and fraction (bits 24-22) are its value
// times 2^-126 (a subnormal for exponent 0), undone by one exact multiply.

__device__ __forceinline__ float spatialc_w4_bits_f32(unsigned bits)
{
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// The 4-bit code at nibble `i` (0..7) of word w.
__device__ __forceinline__ unsigned spatialc_w4_nibble(unsigned w, unsigned i)
{
    return (w >> (4u * i)) & 15u;
}

// FORMAT 0 int4, 1 uint4: q - zero from the code (int4's already XORed with 8: q + 8), given bias = 2^23 + zero
// (+ 8 for int4: spatialc_w4_bias). FORMAT 2 e2m1: its value (zero 0).
template <int FORMAT>
__device__ __forceinline__ float spatialc_w4_centred(unsigned code, float bias)
{
    if (FORMAT == 2) {
        const float raw = spatialc_w4_bits_f32(((code & 8u) << 28) | ((code & 7u) << 22));
        return raw * 8.50705917302346159e37f;  // 2^126: exact
    }
    return spatialc_w4_bits_f32(0x4b000000u | code) - bias;
}

// 2^23 + zero (+ 8 for int4) from the zero point's integer value, built from its bits (no conversion instruction):
// int4's zero + 8 and uint4's zero lie in 0..15, so this is the float 2^23 + that, exactly.
template <int FORMAT>
__device__ __forceinline__ float spatialc_w4_bias(int zero)
{
    return FORMAT == 2 ? 0.0f : spatialc_w4_bits_f32(0x4b000000u + (unsigned)((FORMAT == 0 ? 8 : 0) + zero));
}

// Two float32 values rounded to the operand type into one register, `lo` in the low half.
__device__ __forceinline__ unsigned spatialc_w4_pair(float lo, float hi, const __nv_bfloat16*)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // one cvt.rn.bf16x2.f32
#else
    const __nv_bfloat16 v[2] = {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
#endif
    unsigned r;
    memcpy(&r, &v, 4);
    return r;
}

__device__ __forceinline__ unsigned spatialc_w4_pair(float lo, float hi, const __half*)
{
#if defined(__CUDA_ARCH__)
    const __half2 v = __floats2half2_rn(lo, hi);
#else
    const __half v[2] = {__float2half_rn(lo), __float2half_rn(hi)};
#endif
    unsigned r;
    memcpy(&r, &v, 4);
    return r;
}

// Lane's four B registers from its packed word w: scale s0 / s1 and bias b0 / b1 (spatialc_w4_bias of the zero point)
// of columns n and n + 8. LOW_FIRST: the even row in a byte's low nibble (pack_int4's order).
template <int FORMAT, bool LOW_FIRST, class T>
__device__ __forceinline__ void spatialc_w4_regs(unsigned (&r)[4], unsigned w, float s0, float s1, float b0, float b1)
{
    const unsigned v = FORMAT == 0 ? w ^ 0x88888888u : w;  // int4: each code XOR 8 is q + 8, all eight at once
#pragma unroll
    for (unsigned i = 0; i < 4; ++i) {
        const float s = i < 2 ? s0 : s1, b = i < 2 ? b0 : b1;
        const unsigned even = spatialc_w4_nibble(v, 2u * i + (LOW_FIRST ? 0u : 1u));
        const unsigned odd = spatialc_w4_nibble(v, 2u * i + (LOW_FIRST ? 1u : 0u));
        const float lo = s * spatialc_w4_centred<FORMAT>(even, b);
        const float hi = s * spatialc_w4_centred<FORMAT>(odd, b);
        r[i] = spatialc_w4_pair(lo, hi, static_cast<const T*>(nullptr));
    }
}

// A byte and a 16-bit element of a tensor in global memory, read through the aligned 32-bit word that holds it (the
// register path's scales and zero points: no byte-wise loads in the main loop).
__device__ __forceinline__ unsigned spatialc_w4_byte_at(const void* base, size_t at)
{
    const unsigned w = *(reinterpret_cast<const unsigned*>(base) + at / 4);
    return (w >> (8u * (unsigned)(at % 4))) & 255u;
}

__device__ __forceinline__ unsigned spatialc_w4_half_at(const void* base, size_t at)
{
    const unsigned w = *(reinterpret_cast<const unsigned*>(base) + at / 2);
    return (w >> (16u * (unsigned)(at % 2))) & 65535u;
}

// A bf16 or fp16 scale's value from its bits, exactly.
__device__ __forceinline__ float spatialc_w4_scale16(unsigned bits, const __nv_bfloat16*)
{
    return spatialc_w4_bits_f32(bits << 16);
}

__device__ __forceinline__ float spatialc_w4_scale16(unsigned bits, const __half*)
{
    const unsigned short u = (unsigned short)bits;
    __half h;
    memcpy(&h, &u, 2);
    return __half2float(h);
}

#ifdef SPATIALC_TENSOR_CORE  // the fragments of the tensor-core layer (printed before this text, or the emulation's)
#ifndef SPATIALC_B_FROM_REGS  // the host emulation has its own (emu_mma.h): its fragments hold whole tiles
#define SPATIALC_B_FROM_REGS 1
template <class T>
__device__ __forceinline__ void spatialc_b_from_regs(spatialc_frag<T>& f, const unsigned (&r)[4])
{
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f.r[i] = r[i];
    }
}
#endif

// B's fragment of one 16 x 16 tile of packed weights in shared memory, dequantised in registers (spatialc_w4_regs):
// one aligned 32-bit load a lane.
template <int FORMAT, bool LOW_FIRST, class T>
__device__ __forceinline__ void spatialc_w4_load_b(spatialc_frag<T>& f, const unsigned char* tile, float s0, float s1,
                                                   float b0, float b1)
{
    const unsigned w = SPATIALC_PAGE_LD(reinterpret_cast<const unsigned*>(tile) + (threadIdx.x & 31u));
    unsigned r[4];
    spatialc_w4_regs<FORMAT, LOW_FIRST, T>(r, w, s0, s1, b0, b1);
    spatialc_b_from_regs(f, r);
}
#endif  // SPATIALC_TENSOR_CORE

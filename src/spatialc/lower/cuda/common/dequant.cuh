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

// An MXFP8 GEMM's promotion (numerics/blockscale.py, `promote`; lower/cuda/common/blockscale.py prints the calls):
//
//     acc + part · 2^(ca − 127) · 2^(cb − 127)
//
// for the float8_e8m0fnu codes ca (A's scale of the row) and cb (B's of the column), 0 … 254. Their product is
// 2^e, e = ca + cb − 254 in −254 … 254: far past float32's exponents, though part · 2^e may lie inside them (a
// scale of 2^127 on a partial sum of 2^-20, or 2^-127 · 2^-24 on one of 2^22). So the exponents are combined as
// integers, never as a float32 product of the two scales (which overflows to inf — inf · 0 = NaN on an all-zero
// group — or underflows to 0): 2^e is split into 2^(e − c) · 2^c with c the part of e inside float32's normal range
// (−126 … 127), part · 2^(e − c) is exact (a power of two times a normal float32, whose product is a normal float32
// wherever part · 2^e is not past float32's range: it lies between part and part · 2^e), and the one fused
// multiply-add rounds once, as the interpreter's promotion does. Where e is inside the range, e − c = 0 and this is
// fmaf(part, 2^e, acc), the float32 scales' promotion. Each power of two is built from its bits (2^-127 and 2^-128
// are subnormals): exact, with no library call.

__device__ __forceinline__ float spatialc_mx_pow2(int x)  // 2^x for x in -128 ... 127
{
    const unsigned bits = x >= -126 ? (unsigned)(x + 127) << 23 : 0x00400000u >> (-127 - x);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

__device__ __forceinline__ float spatialc_mx_promote(float part, int ca, int cb, float acc)
{
    const int e = ca + cb - 254;
    const int c = e < -126 ? -126 : (e > 127 ? 127 : e);
    return fmaf(part * spatialc_mx_pow2(e - c), spatialc_mx_pow2(c), acc);
}

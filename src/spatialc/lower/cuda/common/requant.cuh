// Requantisation's device function (lower/cuda/common/epilogue.py): the same text under nvcc and the host emulation;
// the elementwise ops' are in elementwise.cuh.

// numerics.quant.requantize of one value: saturate to int32; times 2^left, saturated to int32; the saturating
// rounding doubling high multiply by the Q31 multiplier; a rounding divide by 2^right (ties away from zero); plus
// the zero point, clamped to int8. The lowering checks 0 <= multiplier < 2^31 and -31 <= shift <= 30, so no
// product below leaves int64.
__device__ __forceinline__ long long spatialc_requant(long long x, long long multiplier, int shift,
                                                     long long zero_point)
{
    const long long lo = -2147483647LL - 1, hi = 2147483647LL;
    const int left = shift > 0 ? shift : 0, right = shift > 0 ? 0 : -shift;
    long long v = x < lo ? lo : x > hi ? hi : x;
    v = v * (1LL << left);
    v = v < lo ? lo : v > hi ? hi : v;
    long long q = hi;
    if (v != lo || multiplier != lo) {
        const long long ab = v * multiplier;
        const long long nudge = ab >= 0 ? (1LL << 30) : 1 - (1LL << 30);
        q = (ab + nudge) / (1LL << 31);  // C++ division truncates toward zero, as the high multiply does
    }
    if (right > 0) {
        const long long mask = (1LL << right) - 1;
        const long long threshold = (mask >> 1) + (q < 0 ? 1 : 0);
        q = (q >> right) + ((q & mask) > threshold ? 1 : 0);  // >> of a negative is arithmetic (C++20, nvcc)
    }
    q = q + zero_point;
    return q < -128 ? -128 : q > 127 ? 127 : q;
}

// The float ops of the elementwise table (spatialc/numerics/elementwise.py), one device function each where its C is
// more than an expression: the same text under nvcc and the host emulation. Each computes what the table's meaning
// says: float64 of the float32 operands, rounded once to float32. +, -, *, / and sqrt are the _rn intrinsics on the
// GPU (never contracted into a fused multiply-add) and plain operators on the host (g++ -ffp-contract=off), each
// correctly rounded as numpy's float64 arithmetic rounded once is; double arithmetic rounded once to float is too.
// log, tanh, erf and pow come from CUDA's library (or the host's), within 2 double ulps of numpy's; exp and exp2 are
// float32 arithmetic of their own (below), the same bits on both.
#include <cmath>
#include <cstring>

__device__ __forceinline__ float spatialc_fadd(float x, float y)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(x, y);
#else
    return x + y;
#endif
}

__device__ __forceinline__ float spatialc_fsub(float x, float y)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(x, y);
#else
    return x - y;
#endif
}

__device__ __forceinline__ float spatialc_fmul(float x, float y)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(x, y);
#else
    return x * y;
#endif
}

__device__ __forceinline__ float spatialc_div(float x, float y)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(x, y);
#else
    return x / y;
#endif
}

__device__ __forceinline__ double spatialc_dadd(double x, double y)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(x, y);
#else
    return x + y;
#endif
}

__device__ __forceinline__ double spatialc_dmul(double x, double y)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(x, y);
#else
    return x * y;
#endif
}

__device__ __forceinline__ double spatialc_ddiv(double x, double y)
{
#ifdef __CUDA_ARCH__
    return __ddiv_rn(x, y);
#else
    return x / y;
#endif
}

__device__ __forceinline__ double spatialc_dsqrt(double x)
{
#ifdef __CUDA_ARCH__
    return __dsqrt_rn(x);
#else
    return std::sqrt(x);
#endif
}

// NaN goes through max and min as numpy's maximum / minimum let it (a bare comparison would drop it).
__device__ __forceinline__ float spatialc_max(float x, float y) { return x > y || x != x ? x : y; }
__device__ __forceinline__ float spatialc_min(float x, float y) { return x < y || x != x ? x : y; }
__device__ __forceinline__ float spatialc_relu(float x) { return x > 0.0f || x != x ? x : 0.0f; }
__device__ __forceinline__ float spatialc_abs(float x) { return x < 0.0f ? -x : x == 0.0f ? 0.0f : x; }

__device__ __forceinline__ float spatialc_leaky_relu(float x, double alpha)
{
    return x > 0.0f || x != x ? x : (float)spatialc_dmul(alpha, (double)x);
}

// numpy's minimum(maximum(x, lo), hi), whose maximum and minimum each take their second operand on a tie: a -0 at a
// bound of +0 (or a +0 at one of -0) comes out as the bound's zero, as the interpreter's does.
__device__ __forceinline__ float spatialc_clamp(float x, double lo, double hi)
{
    const double v = x;
    const double m = v > lo ? v : lo;
    return x != x ? x : (float)(m < hi ? m : hi);
}

__device__ __forceinline__ float spatialc_sqrt(float x) { return (float)spatialc_dsqrt((double)x); }
__device__ __forceinline__ float spatialc_rsqrt(float x) { return (float)spatialc_ddiv(1.0, spatialc_dsqrt((double)x)); }
__device__ __forceinline__ float spatialc_recip(float x) { return (float)spatialc_ddiv(1.0, (double)x); }
// exp and exp2 in float32 arithmetic alone, each step one IEEE rounding (the _rn intrinsics and fused multiply-adds
// on the GPU, the same operations on the host), so the GPU and the host emulation give the same bits; no float64
// (a GPU runs float64 at a fraction of float32's rate, and attention's softmax is one exp a score). x = k·ln 2 + r
// with k the nearest integer to x·log2 e and r ∈ [−ln 2 / 2, ln 2 / 2] (the reduction exact: ln 2's high part has
// 16 bits and |k| ≤ 151), e^r by a degree-7 polynomial (Cephes' minimax coefficients), then times 2^k as two
// exact powers of two so that only the last product rounds, also into the subnormal range. The table's bound for
// both (numerics/elementwise.py: 2 ulps) is met by every float32 input: bench/exp_ulps.py tries them all.
__device__ __forceinline__ float spatialc_ffma(float a, float b, float c)
{
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

// 2^k for a normal float's exponent k, from its bits.
__device__ __forceinline__ float spatialc_pow2i(int k)
{
#ifdef __CUDA_ARCH__
    return __int_as_float((k + 127) << 23);
#else
    const unsigned bits = (unsigned)(k + 127) << 23;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

// y · 2^k for |k| ≤ 151: 2^(k/2) and 2^(k − k/2) are normal floats and y · 2^(k/2) is exact for y ∈ [0.7, 1.5].
__device__ __forceinline__ float spatialc_scale2(float y, int k)
{
    const int h = k / 2;
    return spatialc_fmul(spatialc_fmul(y, spatialc_pow2i(h)), spatialc_pow2i(k - h));
}

__device__ __forceinline__ float spatialc_exp(float x)
{
    if (!(x > -104.0f)) {
        return x != x ? x : 0.0f;  // e^x < 2^-150 below −104: rounds to +0
    }
    if (x > 89.0f) {
        return INFINITY;
    }
    const float k = rintf(spatialc_fmul(x, 1.44269504088896341f));
    float r = spatialc_ffma(k, -0.693145751953125f, x);  // ln 2's high 16 bits: k · it is exact, as is x − it
    r = spatialc_ffma(k, -1.42860682030941723e-6f, r);  // ln 2's next 24 bits
    float p = 1.9875691500e-4f;
    p = spatialc_ffma(p, r, 1.3981999507e-3f);
    p = spatialc_ffma(p, r, 8.3334519073e-3f);
    p = spatialc_ffma(p, r, 4.1665795894e-2f);
    p = spatialc_ffma(p, r, 1.6666665459e-1f);
    p = spatialc_ffma(p, r, 5.0000001201e-1f);
    const float y = spatialc_fadd(spatialc_ffma(p, spatialc_fmul(r, r), r), 1.0f);
    return spatialc_scale2(y, (int)k);
}

__device__ __forceinline__ float spatialc_exp2(float x)
{
    if (!(x > -151.0f)) {
        return x != x ? x : 0.0f;  // 2^x < 2^-150 below −151 (and 2^-150 itself rounds to +0, to even)
    }
    if (x > 129.0f) {
        return INFINITY;
    }
    const float k = rintf(x);
    const float r = spatialc_fsub(x, k);  // exact: |r| ≤ 1/2
    float p = 1.535336188319500e-4f;
    p = spatialc_ffma(p, r, 1.339887440266574e-3f);
    p = spatialc_ffma(p, r, 9.618437357674640e-3f);
    p = spatialc_ffma(p, r, 5.550332471162809e-2f);
    p = spatialc_ffma(p, r, 2.402264791363012e-1f);
    p = spatialc_ffma(p, r, 6.931472028550421e-1f);
    const float y = spatialc_ffma(p, r, 1.0f);
    return spatialc_scale2(y, (int)k);
}
__device__ __forceinline__ float spatialc_log(float x) { return (float)log((double)x); }
__device__ __forceinline__ float spatialc_log2(float x) { return (float)log2((double)x); }
__device__ __forceinline__ float spatialc_tanh(float x) { return (float)tanh((double)x); }
__device__ __forceinline__ float spatialc_pow(float x, float y) { return (float)pow((double)x, (double)y); }

__device__ __forceinline__ float spatialc_sigmoid(float x)
{
    return (float)spatialc_ddiv(1.0, spatialc_dadd(1.0, exp(-(double)x)));
}

__device__ __forceinline__ float spatialc_silu(float x)
{
    const double v = x;
    return (float)spatialc_ddiv(v, spatialc_dadd(1.0, exp(-v)));
}

// PyTorch's gelu: 0.5 x (1 + erf(x / sqrt(2))).
__device__ __forceinline__ float spatialc_gelu(float x)
{
    const double v = x;
    const double inner = spatialc_dmul(v, 0.7071067811865475);
    return (float)spatialc_dmul(spatialc_dmul(0.5, v), spatialc_dadd(1.0, erf(inner)));
}

// PyTorch's gelu, approximate="tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float spatialc_gelu_tanh(float x)
{
    const double v = x;
    const double cube = spatialc_dmul(spatialc_dmul(v, v), v);
    const double inner = spatialc_dmul(0.7978845608028654, spatialc_dadd(v, spatialc_dmul(0.044715, cube)));
    return (float)spatialc_dmul(spatialc_dmul(0.5, v), spatialc_dadd(1.0, tanh(inner)));
}

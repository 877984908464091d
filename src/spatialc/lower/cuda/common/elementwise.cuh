// The float ops of the elementwise table (spatialc/numerics/elementwise.py), one device function each where its C is
// more than an expression: the same text under nvcc and the host emulation. Each computes what the table's meaning
// says: float64 of the float32 operands, rounded once to float32. +, -, *, / and sqrt are the _rn intrinsics on the
// GPU (never contracted into a fused multiply-add) and plain operators on the host (g++ -ffp-contract=off), each
// correctly rounded as numpy's float64 arithmetic rounded once is; double arithmetic rounded once to float is too.
// exp, log, tanh, erf and pow come from CUDA's library (or the host's), within 2 double ulps of numpy's.
#include <cmath>

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
__device__ __forceinline__ float spatialc_exp(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float spatialc_exp2(float x) { return (float)exp2((double)x); }
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

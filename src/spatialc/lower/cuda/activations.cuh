// The activations of the general form's epilogue (spatialc.numerics.epilogue.ACTIVATION_FORMULAS): each in double
// from the float32 value, with numpy's operations in numpy's order and none contracted into a fused multiply-add, then
// rounded once to float32. Only tanh and exp are another library's (CUDA's, or the host's in the emulation).
#include <cmath>

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

// PyTorch's gelu, approximate="tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float spatialc_gelu(float x)
{
    const double v = x;
    const double cube = spatialc_dmul(spatialc_dmul(v, v), v);
    const double inner = spatialc_dmul(0.7978845608028654, spatialc_dadd(v, spatialc_dmul(0.044715, cube)));
    return (float)spatialc_dmul(spatialc_dmul(0.5, v), spatialc_dadd(1.0, tanh(inner)));
}

__device__ __forceinline__ float spatialc_silu(float x)
{
    const double v = x;
    return (float)(v / spatialc_dadd(1.0, exp(-v)));
}

__device__ __forceinline__ float spatialc_sigmoid(float x)
{
    const double v = x;
    return (float)(1.0 / spatialc_dadd(1.0, exp(-v)));
}

__device__ __forceinline__ float spatialc_tanh(float x)
{
    return (float)tanh((double)x);
}

// spatialc host emulation — __half and __nv_bfloat16: storage types with round-to-nearest-even conversions from
// float and directly from double (one rounding, never double rounding through float), exact ones back.
#ifndef SPATIALC_EMU_HALF_H
#define SPATIALC_EMU_HALF_H

#include <cmath>
#include <cstdint>

namespace spatialc_emu {

// Round `x` to the binary format with `mant` fraction bits and `expb` exponent bits, nearest-even; its bits.
inline uint16_t round_to_format(double x, int mant, int expb) {
    const int bias = (1 << (expb - 1)) - 1;
    const uint16_t sign = std::signbit(x) ? uint16_t(1u << (mant + expb)) : uint16_t(0);
    const uint16_t inf = uint16_t(((1u << expb) - 1) << mant);
    if (std::isnan(x)) return uint16_t(0x7fffu >> (15 - mant - expb));  // a quiet NaN of the format
    const double a = std::fabs(x);
    if (std::isinf(a)) return sign | inf;
    if (a == 0.0) return sign;
    const int emin = 1 - bias;  // exponent of the smallest normal
    const int e = std::ilogb(a);
    const int quantum_exp = (e < emin ? emin : e) - mant;  // weight of the last fraction bit at this scale
    // a / 2^q is exact (a power-of-two scale of a double); nearbyint rounds it ties-to-even.
    const double q = std::nearbyint(std::ldexp(a, -quantum_exp));
    const double v = std::ldexp(q, quantum_exp);
    if (v < std::ldexp(1.0, emin))  // subnormal (or rounded to zero)
        return sign | uint16_t(q);
    const int ev = std::ilogb(v);  // rounding may have carried into the next binade
    if (ev + bias >= (1 << expb) - 1) return sign | inf;
    const uint32_t frac = uint32_t(std::ldexp(v, mant - ev)) - (1u << mant);
    return sign | uint16_t((uint32_t(ev + bias) << mant) | frac);
}

inline double decode_format(uint16_t bits, int mant, int expb) {
    const int bias = (1 << (expb - 1)) - 1;
    const bool neg = (bits >> (mant + expb)) & 1u;
    const int ef = (bits >> mant) & ((1 << expb) - 1);
    const uint32_t frac = bits & ((1u << mant) - 1);
    double v;
    if (ef == (1 << expb) - 1)
        v = frac ? NAN : INFINITY;
    else if (ef == 0)
        v = std::ldexp(double(frac), 1 - bias - mant);
    else
        v = std::ldexp(double(frac | (1u << mant)), ef - bias - mant);
    return neg ? -v : v;
}

template <int Mant, int Expb>
struct Small {
    unsigned short __x;
    Small() = default;
    Small(double d) : __x(round_to_format(d, Mant, Expb)) {}
    Small(float f) : __x(round_to_format(double(f), Mant, Expb)) {}
    Small(int i) : __x(round_to_format(double(i), Mant, Expb)) {}
    Small(long long i) : __x(round_to_format(double(i), Mant, Expb)) {}
    Small(unsigned u) : __x(round_to_format(double(u), Mant, Expb)) {}
    operator float() const { return float(decode_format(__x, Mant, Expb)); }  // exact: every value fits a float
    explicit operator double() const { return decode_format(__x, Mant, Expb); }
    static Small from_bits(unsigned short b) {
        Small s;
        s.__x = b;
        return s;
    }
};

}  // namespace spatialc_emu

typedef spatialc_emu::Small<10, 5> __half;
typedef spatialc_emu::Small<7, 8> __nv_bfloat16;
typedef __half half;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return float(h); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }

#endif  // SPATIALC_EMU_HALF_H

// spatialc host emulation — __half and __nv_bfloat16: storage types with round-to-nearest-even conversions from
// float and directly from double (one rounding, never double rounding through float), exact ones back; and the 8-bit
// floats of cuda_fp8.h, __nv_fp8_e4m3 and __nv_fp8_e5m2, converted as CUDA's constructors convert (saturating).
#ifndef SPATIALC_EMU_HALF_H
#define SPATIALC_EMU_HALF_H

#include <cmath>
#include <cstdint>
#include <cstring>

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

// The float of a normal number of a narrow format (`ef` its biased exponent, neither 0 nor the top one where the top
// is reserved), from its bits: exact, and the value decode_format gives — the format's exponents and fraction fit a
// float's. The emulated tensor cores decode every operand, so this path is the common one.
template <int Mant, int Expb>
inline float decode_normal(uint32_t neg, int ef, uint32_t frac) {
    static_assert(Mant <= 23 && Expb <= 8, "a format a float holds exactly");
    constexpr int bias = (1 << (Expb - 1)) - 1;
    const uint32_t bits = (neg << 31) | (uint32_t(ef - bias + 127) << 23) | (frac << (23 - Mant));
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// A narrow format's bits as a float, exactly: normal numbers built directly, the rest (zeros, subnormals, infinities
// and NaNs) by decode_format.
template <int Mant, int Expb>
inline float decode_float(uint32_t bits) {
    const int ef = (bits >> Mant) & ((1 << Expb) - 1);
    if (ef != 0 && ef != (1 << Expb) - 1)
        return decode_normal<Mant, Expb>((bits >> (Mant + Expb)) & 1u, ef, bits & ((1u << Mant) - 1));
    return float(decode_format(uint16_t(bits), Mant, Expb));
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
    operator float() const { return decode_float<Mant, Expb>(__x); }  // exact: every value fits a float
    explicit operator double() const { return decode_float<Mant, Expb>(__x); }
    static Small from_bits(unsigned short b) {
        Small s;
        s.__x = b;
        return s;
    }
};

// The largest finite value of an 8-bit float: e4m3fn (`fn`) spends its top exponent on normal numbers, all but the
// NaN pattern S.1111.111 (448); e5m2 keeps IEEE's infinities (57344).
constexpr double fp8_max(int mant, int expb, bool fn) {
    const int bias = (1 << (expb - 1)) - 1, top = (1 << expb) - (fn ? 1 : 2);
    const double frac = fn ? double((1 << (mant + 1)) - 2) : double((1 << (mant + 1)) - 1);  // 1.110b, 1.11b
    double v = frac;
    for (int e = 0; e < top - bias - mant; ++e) v *= 2.0;
    return v;
}

// `x` rounded to nearest even into the 8-bit float, saturating: past the largest value (infinities included) it is
// ±that value, NaN stays NaN (0x7f) — what cuda_fp8.h's constructors do (__NV_SATFINITE, cvt.rn.satfinite).
inline uint8_t round_fp8(double x, int mant, int expb, bool fn) {
    const int bias = (1 << (expb - 1)) - 1, emin = 1 - bias;
    const uint8_t sign = std::signbit(x) ? uint8_t(0x80) : uint8_t(0);
    if (std::isnan(x)) return 0x7f;
    const double top = fp8_max(mant, expb, fn);
    const double a = std::fmin(std::fabs(x), top);  // the largest value is one: rounding cannot pass it
    if (a == 0.0) return sign;
    const int e = std::ilogb(a) < emin ? emin : std::ilogb(a);
    const double q = std::nearbyint(std::ldexp(a, mant - e));  // exact scale; nearbyint rounds ties to even
    const double v = std::ldexp(q, e - mant);
    if (v < std::ldexp(1.0, emin)) return uint8_t(sign | uint8_t(q));  // subnormal (or zero)
    const int ev = std::ilogb(v);  // rounding may have carried into the next binade
    const uint32_t frac = uint32_t(std::ldexp(v, mant - ev)) - (1u << mant);
    return uint8_t(sign | ((uint32_t(ev + bias) << mant) | frac));
}

inline double decode_fp8(uint8_t bits, int mant, int expb, bool fn) {
    if (!fn) return decode_format(bits, mant, expb);  // e5m2: IEEE's rules, infinities and NaNs included
    if ((bits & 0x7f) == 0x7f) return NAN;
    const int bias = (1 << (expb - 1)) - 1;
    const int ef = (bits >> mant) & ((1 << expb) - 1);
    const uint32_t frac = bits & ((1u << mant) - 1);
    const double v = ef == 0 ? std::ldexp(double(frac), 1 - bias - mant)
                             : std::ldexp(double(frac | (1u << mant)), ef - bias - mant);
    return (bits & 0x80) ? -v : v;
}

// One byte, as cuda_fp8.h's types: conversions in are explicit and saturate, the one out (to float) is exact.
template <int Mant, int Expb, bool Fn>
struct Fp8 {
    unsigned char __x;
    Fp8() = default;
    explicit Fp8(double d) : __x(round_fp8(d, Mant, Expb, Fn)) {}
    explicit Fp8(float f) : __x(round_fp8(double(f), Mant, Expb, Fn)) {}
    explicit operator float() const {  // exact; e4m3fn's top exponent holds normal numbers, all but its NaN
        const int ef = (__x >> Mant) & ((1 << Expb) - 1);
        if (ef != 0 && (Fn ? (__x & 0x7f) != 0x7f : ef != (1 << Expb) - 1))
            return decode_normal<Mant, Expb>(__x >> 7, ef, __x & ((1u << Mant) - 1));
        return float(decode_fp8(__x, Mant, Expb, Fn));
    }
    explicit operator double() const { return double(float(*this)); }
};

}  // namespace spatialc_emu

typedef spatialc_emu::Fp8<3, 4, true> __nv_fp8_e4m3;
typedef spatialc_emu::Fp8<2, 5, false> __nv_fp8_e5m2;

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

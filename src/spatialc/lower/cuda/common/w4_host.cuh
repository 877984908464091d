// The host program's storage of a W4A16 GEMM's 4-bit tensors (lower/cuda/common/dequant.py): the values it reads,
// packed and tiled as the kernel reads them.
#include <cmath>

// The 4-bit code of value v of `format` (0 int4, 1 uint4, 2 float4_e2m1fn): int4's two's complement, uint4's value,
// e2m1's sign and magnitude code. The inputs were checked to be values of the format (spatialc.inputs); a value
// that is not one (timing inputs) takes some code, never a read out of bounds.
inline unsigned spatialc_w4_code(double v, int format)
{
    if (format != 2) {
        return (unsigned)((long long)v) & 15u;
    }
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    unsigned code = 0;
    for (unsigned i = 0; i < 8; ++i) {
        if (std::fabs(v) == mag[i]) {
            code = i;
        }
    }
    return code | (std::signbit(v) ? 8u : 0u);
}

// Where the byte of rows 2p, 2p + 1 (p = 0..7) of column c (0..15) lies in its tile's 128 bytes: lane
// L = 4 (c % 8) + p % 4 of a warp reads 32-bit word L, which holds its four B registers' bytes in mma.sync's order
// (rows 2t, 2t + 1 of column n; rows 2t + 8, 2t + 9; the same of column n + 8; t = L % 4, n = L / 4): dequant.cuh's
// spatialc_w4_load_b reads a tile with one aligned 32-bit load a lane (lower/cuda/common/dequant.py).
inline size_t spatialc_w4_tile_byte(int p, int c)
{
    return (size_t)(16 * (c % 8) + 4 * (p % 4) + 2 * (c / 8) + p / 4);
}

// B (rows × cols values) packed two a byte along K and tiled: tile (ti, tj) of 16 × 16 values is 128 bytes at
// (ti * cols_t + tj) * 128, byte spatialc_w4_tile_byte(r % 16 / 2, c % 16) holding row r of column c in its low
// nibble for even r, its high nibble for odd r.
template <typename T>
inline void spatialc_tilize_w4(const std::vector<double>& x, int rows, int cols, int cols_t, std::vector<T>& t,
                               int format)
{
    for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < cols; ++j) {
            const size_t at = ((size_t)(i / 16) * cols_t + j / 16) * 128 + spatialc_w4_tile_byte((i % 16) / 2, j % 16);
            const unsigned code = spatialc_w4_code(x[(size_t)i * cols + j], format);
            t[at] = (T)(t[at] | (i % 2 ? code << 4 : code));
        }
    }
}

// A float8_e8m0fnu scale (a power of two 2^-127 … 2^127) as its code e + 127.
inline unsigned char spatialc_e8m0_code(double x)
{
    const double v = std::fabs(x);  // (checked positive; timing inputs: any sign)
    const int e = v > 0.0 && std::isfinite(v) ? std::ilogb(v) : 128;
    return (unsigned char)(e < -127 ? 0 : e > 127 ? 255 : e + 127);
}

// float8_e8m0fnu scales as their codes, tiled as any tensor (host.cuh's spatialc_tilize and spatialc_tilize_groups
// with this as their `value`).
struct spatialc_e8m0_of {
    unsigned char operator()(double v) const { return spatialc_e8m0_code(v); }
};

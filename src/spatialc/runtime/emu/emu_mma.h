// spatialc host emulation — the kernels' tensor-core layer (lower/cuda/common/tensor_core.cuh, tensor_core_fp8.cuh):
// ldmatrix operand loads from swizzled, row-major or K-major tiles, mma.sync m16n8k16 (fp16, bf16, int8) and m16n8k32
// (int8, e4m3, e5m2), accumulator stores.
//
// Each lane receives what the hardware gives it: ldmatrix row addresses are worked out for every lane from the one
// tile pointer all lanes pass, and a lane's load is recorded as reads of exactly the bytes its registers receive
// (so a race on them is reported like any other). As with WMMA (emu_wmma.h), an operand fragment also keeps the
// whole tile as the lane saw it when it loaded, so the multiply needs no exchange between lanes; the accumulator
// is the lane's own eight elements in the hardware's m16n8 layout, and the kernel text may index it as such. In
// late mode an accumulator store's writes become visible at the lane's next __syncwarp / __syncthreads.
#ifndef SPATIALC_EMU_MMA_H
#define SPATIALC_EMU_MMA_H

#include <cstdint>
#include <string>
#include <type_traits>

#include "emu_half.h"
#include "emu_shared.h"

#define SPATIALC_TENSOR_CORE 1
#define SPATIALC_TENSOR_CORE_ROW 1  // tensor_core_row.cuh's loads, below
#define SPATIALC_TENSOR_CORE_FP8 1  // tensor_core_fp8.cuh's loads and MMAs, below

template <class T>
struct spatialc_frag {
    // A: 16 rows × kd k-elements (row-major, stride 32); B: kd k-elements × 16 columns (row-major, stride 16).
    T v[16 * 32];
    int kd = 0;
};

template <class T>
struct spatialc_acc {
    // Registers hold garbage until written: a kernel that accumulates into ones it never zeroed reads this.
    T x[8];
    spatialc_acc() {
        for (T& e : x) std::memset(static_cast<void*>(&e), 0xCD, sizeof(T));
    }
};

namespace spatialc_emu {

// Whether the calling thread wrote accumulators with ordinary instructions since its last wgmma fence.
inline thread_local bool acc_written = false;

// The element offset of 16-byte chunk `half` of row `row` in a swizzled 16-bit tile (as tensor_core.cuh).
constexpr unsigned swizzled(unsigned row, unsigned half) { return row * 16u + ((half ^ ((row >> 2) & 1u)) << 3); }

// Row and column of accumulator element i of `lane` (m16n8 halves: columns 0-7, then 8-15).
constexpr int acc_row(int lane, int i) { return lane / 4 + 8 * ((i >> 1) & 1); }
constexpr int acc_col(int lane, int i) { return 8 * (i >> 2) + 2 * (lane % 4) + (i & 1); }

// ldmatrix reads shared memory only, from 16-byte aligned rows.
SPATIALC_EMU_FN void check_ldsm(const void* tile, const char* what, int line);

inline int lane_of(const char* what) { return me(what).lane; }

}  // namespace spatialc_emu

// ---- 16-bit operands ------------------------------------------------------------------------------------------
namespace spatialc_emu {

// The element offset of 16-byte chunk `half` of row `row` in a 16-bit tile, swizzled or plain row-major.
constexpr unsigned chunk(bool swz, unsigned row, unsigned half) {
    return swz ? swizzled(row, half) : row * 16u + half * 8u;
}

template <class T>
[[gnu::noinline]] void load_a16(spatialc_frag<T>& f, const T* tile, bool swz, const char* what, int line) {
    static_assert(sizeof(T) == 2, "16-bit operands");
    const int l = lane_of(what);
    check_ldsm(tile, what, line);
    f.kd = 16;
    for (int r = 0; r < 16; ++r)
        for (int k = 0; k < 16; ++k) f.v[r * 32 + k] = tile[chunk(swz, r, k / 8) + k % 8];
    // Matrix i of the x4 load is rows 0-7 / 8-15 of half i / 2; the lane gets row l / 4, elements 2 (l % 4), +1.
    const void* mine[4];
    for (int i = 0; i < 4; ++i) mine[i] = tile + chunk(swz, l / 4 + 8 * (i & 1), i >> 1) + 2 * (l % 4);
    track(mine, 4, 4, false, AccessKind::ldmatrix, line);
}

}  // namespace spatialc_emu

template <class T>
void spatialc_load_a(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_a16(f, tile, true, "spatialc_load_a", line);
}

// A from a plain row-major tile (a page an engine computed).
template <class T>
void spatialc_load_a_row(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_a16(f, tile, false, "spatialc_load_a_row", line);
}

// A from a plain row-major tile of float32 values, each rounded to nearest even to the operand type as it is loaded
// (tensor_core_row.cuh): the lane reads its own eight, two adjacent columns at a time.
template <class T>
[[gnu::noinline]] void spatialc_load_a_float(spatialc_frag<T>& f, const float* tile, int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    static_assert(sizeof(T) == 2, "16-bit operands");
    const int l = lane_of("spatialc_load_a_float");
    check_ldsm(tile, "spatialc_load_a_float", line);
    f.kd = 16;
    for (int r = 0; r < 16; ++r)
        for (int k = 0; k < 16; ++k) f.v[r * 32 + k] = T(tile[r * 16 + k]);
    const void* mine[4];
    for (int i = 0; i < 4; ++i) mine[i] = tile + (l / 4 + 8 * (i & 1)) * 16 + 2 * (l % 4) + 8 * (i >> 1);
    track(mine, 4, 8, false, AccessKind::page_load, line);
}

namespace spatialc_emu {

// B (k rows × 16 columns) from a 16-bit tile: row-major B, transposed by the load (swizzled or plain), or — `kmajor` —
// a plain row-major tile of Bᵀ (tile row n holds column n's k), which the load does not transpose.
template <class T>
[[gnu::noinline]] void load_b16(spatialc_frag<T>& f, const T* tile, bool swz, bool kmajor, const char* what, int line) {
    static_assert(sizeof(T) == 2, "16-bit operands");
    const int l = lane_of(what);
    check_ldsm(tile, what, line);
    f.kd = 16;
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 16; ++n)
            f.v[k * 16 + n] = kmajor ? tile[chunk(swz, n, k / 8) + k % 8] : tile[chunk(swz, k, n / 8) + n % 8];
    if (kmajor) {
        // Matrix i is tile rows (columns n) 0-7 / 8-15 (i / 2), k half i % 2; the lane gets row l / 4, elements
        // 2 (l % 4), +1 — as an A load's.
        const void* mine[4];
        for (int i = 0; i < 4; ++i) mine[i] = tile + chunk(swz, l / 4 + 8 * (i >> 1), i & 1) + 2 * (l % 4);
        track(mine, 4, 4, false, AccessKind::ldmatrix, line);
        return;
    }
    // Transposed: from matrix i (k rows 0-7 / 8-15 of column half i / 2) the lane gets column l / 4 of k rows
    // 2 (l % 4) and 2 (l % 4) + 1.
    const void* mine[8];
    for (int i = 0; i < 4; ++i)
        for (int e = 0; e < 2; ++e) mine[2 * i + e] = tile + chunk(swz, 2 * (l % 4) + e + 8 * (i & 1), i >> 1) + l / 4;
    track(mine, 8, 2, false, AccessKind::ldmatrix, line);
}

}  // namespace spatialc_emu

// B from a plain row-major tile (tensor_core_row.cuh).
template <class T>
void spatialc_load_b_row(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_b16(f, tile, false, false, "spatialc_load_b_row", line);
}

// Bᵀ's plain row-major tile: a K-major B (tensor_core_row.cuh).
template <class T>
void spatialc_load_bt_row(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_b16(f, tile, false, true, "spatialc_load_bt_row", line);
}

template <class T>
void spatialc_load_b(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_b16(f, tile, true, false, "spatialc_load_b", line);
}

// Bᵀ's swizzled tile: a K-major B (tensor_core.cuh).
template <class T>
void spatialc_load_bt(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_b16(f, tile, true, true, "spatialc_load_bt", line);
}

// ---- 8-bit operands (int8, e4m3, e5m2): A row-major, B K-major --------------------------------------------------
namespace spatialc_emu {

// `tiles` k-tiles of A (rows g, g+8 of each: 4 bytes at 4 (l % 4)) or of K-major B (columns g, g+8 likewise).
template <class T>
[[gnu::noinline]] void load_int8(spatialc_frag<T>& f, const T* const* t, int tiles, bool is_a, const char* what,
                                 int line) {
    static_assert(sizeof(T) == 1, "8-bit operands");
    const int l = lane_of(what);
    f.kd = 16 * tiles;
    const void* mine[4];
    int n = 0;
    for (int s = 0; s < tiles; ++s) {
        check_ldsm(t[s], what, line);
        for (int r = 0; r < 16; ++r)
            for (int k = 0; k < 16; ++k) {
                // A: tile row r is row r, column k is k; B (K-major): tile row r is column n = r, column k is k.
                if (is_a)
                    f.v[r * 32 + 16 * s + k] = t[s][r * 16 + k];
                else
                    f.v[(16 * s + k) * 16 + r] = t[s][r * 16 + k];
            }
        for (int h = 0; h < 2; ++h) mine[n++] = t[s] + (l / 4 + 8 * h) * 16 + 4 * (l % 4);
    }
    track(mine, n, 4, false, AccessKind::ldmatrix, line);
}

}  // namespace spatialc_emu

inline void spatialc_load_a2(spatialc_frag<signed char>& f, const signed char* t0, const signed char* t1,
                             int line = __builtin_LINE()) {
    const signed char* t[2] = {t0, t1};
    spatialc_emu::load_int8(f, t, 2, true, "spatialc_load_a2", line);
}
inline void spatialc_load_b2(spatialc_frag<signed char>& f, const signed char* t0, const signed char* t1,
                             int line = __builtin_LINE()) {
    const signed char* t[2] = {t0, t1};
    spatialc_emu::load_int8(f, t, 2, false, "spatialc_load_b2", line);
}
inline void spatialc_load_a(spatialc_frag<signed char>& f, const signed char* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_int8(f, &tile, 1, true, "spatialc_load_a", line);
}
inline void spatialc_load_b(spatialc_frag<signed char>& f, const signed char* tile, int line = __builtin_LINE()) {
    spatialc_emu::load_int8(f, &tile, 1, false, "spatialc_load_b", line);
}

// 8-bit floats: the bytes int8's loads move, in the same registers (tensor_core_fp8.cuh).
#define SPATIALC_EMU_FP8_LOADS(T)                                                                           \
    inline void spatialc_load_a2(spatialc_frag<T>& f, const T* t0, const T* t1, int line = __builtin_LINE()) { \
        const T* t[2] = {t0, t1};                                                                           \
        spatialc_emu::load_int8(f, t, 2, true, "spatialc_load_a2", line);                                   \
    }                                                                                                       \
    inline void spatialc_load_b2(spatialc_frag<T>& f, const T* t0, const T* t1, int line = __builtin_LINE()) { \
        const T* t[2] = {t0, t1};                                                                           \
        spatialc_emu::load_int8(f, t, 2, false, "spatialc_load_b2", line);                                  \
    }                                                                                                       \
    inline void spatialc_load_a(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {           \
        spatialc_emu::load_int8(f, &tile, 1, true, "spatialc_load_a", line);                                \
    }                                                                                                       \
    inline void spatialc_load_b(spatialc_frag<T>& f, const T* tile, int line = __builtin_LINE()) {           \
        spatialc_emu::load_int8(f, &tile, 1, false, "spatialc_load_b", line);                               \
    }
SPATIALC_EMU_FP8_LOADS(__nv_fp8_e4m3)
SPATIALC_EMU_FP8_LOADS(__nv_fp8_e5m2)
#undef SPATIALC_EMU_FP8_LOADS

// ---- the multiply: the lane's own eight accumulator elements ------------------------------------------------------
namespace spatialc_emu {

template <class T, class A>
[[gnu::noinline]] void mma(spatialc_acc<A>& d, const spatialc_frag<T>& a, const spatialc_frag<T>& b, int kd,
                           const char* what) {
    const int l = lane_of(what);
    if (a.kd != kd || b.kd != kd)
        fatal(kExitMisuse, std::string(what) + ": operands of " + std::to_string(a.kd) + " and " +
                               std::to_string(b.kd) + " k-elements for a step of " + std::to_string(kd));
    for (int i = 0; i < 8; ++i) {
        const int r = acc_row(l, i), c = acc_col(l, i);
        if constexpr (std::is_same_v<A, int>) {
            // int32 accumulation wraps like the hardware's (the lowering proves it never needs to).
            uint32_t acc = (uint32_t)d.x[i];
            for (int k = 0; k < kd; ++k) acc += (uint32_t)((int)a.v[r * 32 + k] * (int)b.v[k * 16 + c]);
            d.x[i] = (int)acc;
        } else {
            float acc = d.x[i];
            for (int k = 0; k < kd; ++k) acc += float(a.v[r * 32 + k]) * float(b.v[k * 16 + c]);
            d.x[i] = acc;
        }
    }
}

}  // namespace spatialc_emu

template <class T>
inline void spatialc_mma(spatialc_acc<float>& d, const spatialc_frag<T>& a, const spatialc_frag<T>& b) {
    static_assert(sizeof(T) == 2, "16-bit operands accumulate in float");
    spatialc_emu::mma(d, a, b, 16, "spatialc_mma");
}
inline void spatialc_mma(spatialc_acc<int>& d, const spatialc_frag<signed char>& a,
                         const spatialc_frag<signed char>& b) {
    spatialc_emu::mma(d, a, b, 16, "spatialc_mma");
}
inline void spatialc_mma2(spatialc_acc<int>& d, const spatialc_frag<signed char>& a,
                          const spatialc_frag<signed char>& b) {
    spatialc_emu::mma(d, a, b, 32, "spatialc_mma2");
}

// 8-bit floats: each value decoded exactly to float, each product exact in float32 (at most 4 × 4 significant bits),
// the products added to the float32 accumulator one k after another, as for 16-bit operands. One tile (k16) is the
// k32 MMA with the upper 16 k zero in both operands (tensor_core_fp8.cuh): 0 · 0 added changes no sum.
#define SPATIALC_EMU_FP8_MMA(T)                                                                             \
    inline void spatialc_mma(spatialc_acc<float>& d, const spatialc_frag<T>& a, const spatialc_frag<T>& b) {  \
        spatialc_emu::mma(d, a, b, 16, "spatialc_mma");                                                     \
    }                                                                                                       \
    inline void spatialc_mma2(spatialc_acc<float>& d, const spatialc_frag<T>& a, const spatialc_frag<T>& b) { \
        spatialc_emu::mma(d, a, b, 32, "spatialc_mma2");                                                    \
    }
SPATIALC_EMU_FP8_MMA(__nv_fp8_e4m3)
SPATIALC_EMU_FP8_MMA(__nv_fp8_e5m2)
#undef SPATIALC_EMU_FP8_MMA

// A from the float32 accumulator fragment each lane holds of a register ring (tensor_core_row.cuh): lane l's x[i] is
// row acc_row(l, i), column acc_col(l, i) of the tile, rounded to T as the hardware's pack rounds it; the warp's values
// are gathered by shuffles (two floats a shuffle), the way lanes exchange registers.
template <class T>
[[gnu::noinline]] void spatialc_load_a_acc(spatialc_frag<T>& f, const float* x, int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    static_assert(sizeof(T) == 2, "16-bit operands");
    f.kd = 16;
    for (int src = 0; src < 32; ++src)
        for (int i = 0; i < 8; i += 2) {
            struct pair { float lo, hi; };
            const pair v = __shfl_sync(0xffffffffu, pair{x[i], x[i + 1]}, src, 32, line);
            f.v[acc_row(src, i) * 32 + acc_col(src, i)] = T(v.lo);
            f.v[acc_row(src, i + 1) * 32 + acc_col(src, i + 1)] = T(v.hi);
        }
}

// ---- accumulators -------------------------------------------------------------------------------------------------
template <class T>
inline void spatialc_acc_zero(spatialc_acc<T>& d) {
    for (T& e : d.x) e = T(0);
    spatialc_emu::acc_written = true;  // by an ordinary instruction: a wgmma must be fenced from it (emu_hopper.h)
}

template <class T>
[[gnu::noinline]] void spatialc_store_acc(T* tile, const spatialc_acc<T>& d, int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    ThreadState& t = me("spatialc_store_acc");
    const void* mine[8];
    for (int i = 0; i < 8; ++i) {
        T* dst = tile + acc_row(t.lane, i) * 16 + acc_col(t.lane, i);
        mine[i] = dst;
        if (kLate) {
            PendingStore s{dst, {}, (int)sizeof(T)};
            std::memcpy(s.data, &d.x[i], sizeof(T));
            t.stores.push_back(s);
        } else {
            *dst = d.x[i];
        }
    }
    track(mine, 8, sizeof(T), true, AccessKind::acc_store, line);
}

template <class T>
[[gnu::noinline]] void spatialc_add_acc(spatialc_acc<T>& d, const T* tile, int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    ThreadState& t = me("spatialc_add_acc");
    const void* mine[8];
    for (int i = 0; i < 8; ++i) {
        const T* src = tile + acc_row(t.lane, i) * 16 + acc_col(t.lane, i);
        mine[i] = src;
        d.x[i] += *src;
    }
    track(mine, 8, sizeof(T), false, AccessKind::page_load, line);
}

// B's 16 x 16 fragment from the four registers each lane computed in mma.sync's B layout (lane l: b0 b1 of column
// l / 4 — rows 2 (l % 4), +1 and 2 (l % 4) + 8, +9 — then the same of column l / 4 + 8, the low half the lower row):
// a W4A16 kernel's weights dequantised in registers (dequant.cuh's spatialc_w4_load_b). The warp's registers are
// gathered by shuffles (two registers a shuffle), the way lanes exchange them.
#define SPATIALC_B_FROM_REGS 1
template <class T>
[[gnu::noinline]] void spatialc_b_from_regs(spatialc_frag<T>& f, const unsigned (&r)[4], int line = __builtin_LINE()) {
    static_assert(sizeof(T) == 2, "16-bit operands");
    f.kd = 16;
    for (int src = 0; src < 32; ++src)
        for (int i = 0; i < 4; i += 2) {
            const unsigned long long two = __shfl_sync(0xffffffffu, (unsigned long long)r[i] | ((unsigned long long)r[i + 1] << 32), src, 32, line);
            for (int h = 0; h < 2; ++h) {
                const int reg = i + h, n = src / 4 + 8 * (reg >> 1), k = 2 * (src % 4) + 8 * (reg & 1);
                const unsigned bits = (unsigned)(two >> (32 * h));
                f.v[k * 16 + n] = T::from_bits((unsigned short)(bits & 0xffffu));
                f.v[(k + 1) * 16 + n] = T::from_bits((unsigned short)(bits >> 16));
            }
        }
}

#endif  // SPATIALC_EMU_MMA_H

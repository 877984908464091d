// spatialc host emulation — nvcuda::wmma, shape 16×16×16: int8 (signed char) → int32, fp16 / bf16 → fp32.
//
// Each lane owns the elements the hardware gives it (the mma.m16n8k16 fragment layouts of the PTX ISA, the
// 16×16 tile taken as two 16×8 halves): a load is recorded as reads of the lane's own elements, the multiply
// computes the lane's own accumulator elements, and a store writes each element from the lane that owns it. A
// lane's operand fragment keeps the whole tile as that lane saw it when it loaded. In late mode a store's writes
// become visible when the lane's next __syncwarp / __syncthreads completes (or its block ends), so a reader that
// skips that barrier sees the memory as it was, on every run.
#ifndef SPATIALC_EMU_WMMA_H
#define SPATIALC_EMU_WMMA_H

#include <type_traits>

#include "emu_half.h"
#include "emu_shared.h"

namespace spatialc_emu {

// Accumulator (16×16 = two 16×8 halves): lane l holds rows l/4 and l/4+8, columns 2(l%4) and 2(l%4)+1 of each.
constexpr int acc_owner(int r, int c) { return (r % 8) * 4 + (c % 8) / 2; }
// Operands: a 32-bit register packs `per` consecutive k-elements (2 of 16 bits, 4 of 8 bits); lane l holds rows
// l/4, l/4+8 of A and column l/4 of each 8-wide half of B, and k-elements per·(l%4) … of each 4·per-wide group.
constexpr int a_owner(int r, int k, int per) { return (r % 8) * 4 + (k % (4 * per)) / per; }
constexpr int b_owner(int k, int n, int per) { return (n % 8) * 4 + (k % (4 * per)) / per; }

}  // namespace spatialc_emu

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has WMMA shape 16x16x16 only");

public:
    static constexpr int num_elements = 256;
    using element_type = T;
    T x[256];  // row-major 16×16; for an accumulator only the calling lane's own elements are meaningful
};

template <class Use, class T, class L, class V>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, const V& v) {
    const T t = static_cast<T>(v);
    for (T& e : f.x) e = t;
}

namespace detail {

template <class T>
constexpr int per_register() {
    return sizeof(T) == 1 ? 4 : 2;
}

template <class Use, class T, class L>
[[gnu::noinline]] void load_operand(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm, int line) {
    using namespace spatialc_emu;
    const ThreadState& t = me("load_matrix_sync");
    check_wmma_pointer(p, ldm, sizeof(T), "load_matrix_sync", line);
    constexpr bool col = std::is_same_v<L, col_major>;
    constexpr bool is_a = std::is_same_v<Use, matrix_a>;
    constexpr int per = per_register<T>();
    const void* mine[8];
    int n = 0;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            const T* src = col ? p + (size_t)c * ldm + r : p + (size_t)r * ldm + c;
            f.x[r * 16 + c] = *src;
            const int owner = is_a ? a_owner(r, c, per) : b_owner(r, c, per);
            if (owner == t.lane) mine[n++] = src;
        }
    track(mine, n, sizeof(T), false, AccessKind::frag_load, line);
}

}  // namespace detail

template <class T, class L>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, L>& f, const T* p, unsigned ldm,
                             int line = __builtin_LINE()) {
    detail::load_operand(f, p, ldm, line);
}

template <class T, class L>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, L>& f, const T* p, unsigned ldm,
                             int line = __builtin_LINE()) {
    detail::load_operand(f, p, ldm, line);
}

template <class T>
[[gnu::noinline]] void load_matrix_sync(fragment<accumulator, 16, 16, 16, T>& f, const T* p, unsigned ldm,
                                        layout_t layout, int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    const ThreadState& t = me("load_matrix_sync");
    check_wmma_pointer(p, ldm, sizeof(T), "load_matrix_sync", line);
    const void* mine[8];
    int n = 0;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
            const T* src = layout == mem_row_major ? p + (size_t)r * ldm + c : p + (size_t)c * ldm + r;
            f.x[r * 16 + c] = *src;
            if (acc_owner(r, c) == t.lane) mine[n++] = src;
        }
    track(mine, n, sizeof(T), false, AccessKind::frag_load, line);
}

// d = a·b + c over the calling lane's own accumulator elements (d may be c).
template <class TA, class TC, class LA, class LB>
[[gnu::noinline]] void mma_sync(fragment<accumulator, 16, 16, 16, TC>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, TA, LB>& b, const fragment<accumulator, 16, 16, 16, TC>& c) {
    const int lane = spatialc_emu::me("mma_sync").lane;
    const int g = lane / 4, tq = lane % 4;
    for (int rh = 0; rh < 2; ++rh)
        for (int ch = 0; ch < 4; ++ch) {
            const int r = g + 8 * rh, col = 2 * tq + (ch & 1) + 8 * (ch >> 1);
            if constexpr (std::is_same_v<TC, int>) {
                // int32 accumulation wraps like the hardware's (the lowering proves it never needs to).
                uint32_t acc = (uint32_t)c.x[r * 16 + col];
                for (int k = 0; k < 16; ++k)
                    acc += (uint32_t)((int)a.x[r * 16 + k] * (int)b.x[k * 16 + col]);
                d.x[r * 16 + col] = (int)acc;
            } else {
                float acc = c.x[r * 16 + col];
                for (int k = 0; k < 16; ++k) acc += float(a.x[r * 16 + k]) * float(b.x[k * 16 + col]);
                d.x[r * 16 + col] = acc;
            }
        }
}

template <class T>
[[gnu::noinline]] void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ldm,
                                         layout_t layout, int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    ThreadState& t = me("store_matrix_sync");
    check_wmma_pointer(p, ldm, sizeof(T), "store_matrix_sync", line);
    const int g = t.lane / 4, tq = t.lane % 4;
    const void* mine[8];
    int n = 0;
    for (int rh = 0; rh < 2; ++rh)
        for (int ch = 0; ch < 4; ++ch) {
            const int r = g + 8 * rh, col = 2 * tq + (ch & 1) + 8 * (ch >> 1);
            T* dst = layout == mem_row_major ? p + (size_t)r * ldm + col : p + (size_t)col * ldm + r;
            mine[n++] = dst;
            if (kLate) {
                PendingStore s{dst, {}, (int)sizeof(T)};
                std::memcpy(s.data, &f.x[r * 16 + col], sizeof(T));
                t.stores.push_back(s);
            } else {
                *dst = f.x[r * 16 + col];
            }
        }
    track(mine, n, sizeof(T), true, AccessKind::frag_store, line);
}

}  // namespace wmma
}  // namespace nvcuda

#endif  // SPATIALC_EMU_WMMA_H

// spatialc host emulation — the definitions of emu_hopper.h's wgmma: the operand bytes a shared-memory matrix
// descriptor names, the products of one instruction, the proxy check at its issue, and the groups that hold it until
// its wait_group in late mode. Included by emu_runtime.h, so that a program's build compiles none of it.
#ifndef SPATIALC_EMU_HOPPER_RUN_H
#define SPATIALC_EMU_HOPPER_RUN_H

#include "emu_hopper.h"

namespace spatialc_emu {

SPATIALC_EMU_FN std::string at_line(const char* what, int line) {
    return std::string(what) + " at line " + std::to_string(line);
}
SPATIALC_EMU_FN void misuse_at(const char* what, int line, const char* why) {
    fatal(kExitMisuse, at_line(what, line) + ": " + why);
}

// The byte holding element (k, n) of an operand — (k, m) of A, (k, n) of B: `mn_major` (16-bit B, transposed: N
// contiguous) or K-major, in the canonical layout of the descriptor's swizzle mode, then swizzled by address like
// the copy engine's stores.
SPATIALC_EMU_FN const char* wgmma_byte(const char* start, unsigned long long desc, int k, int n, int elem,
                                       bool mn_major, int line) {
    const size_t lbo = ((desc >> 16) & 0x3FFFu) << 4, sbo = ((desc >> 32) & 0x3FFFu) << 4;
    const unsigned mode = (unsigned)(desc >> 62);
    const int per = 16 / elem;  // elements in a 16-byte chunk
    size_t off;
    if (((desc >> 49) & 7u) != 0) fatal(kExitMisuse, at_line("spatialc_wgmma", line) + ": a non-zero base offset");
    const unsigned span = mode == 1 ? 8 : mode == 2 ? 4 : mode == 3 ? 2 : 1;  // 16-byte chunks a swizzle permutes
    const size_t row = 16 * span;  // bytes of a swizzled row: a panel's width
    if (mn_major && mode != 0)  // rows of K, N contiguous: the next panel of N at LBO, the next 8 rows of K at SBO
        off = (size_t)(n % (row / elem)) * elem + (size_t)(n / (row / elem)) * lbo + (size_t)(k % 8) * row +
              (size_t)(k / 8) * sbo;
    else if (!mn_major && mode == 0)  // core matrices of 8 rows × 16 bytes; the next 8 rows at SBO, next K chunk LBO
        off = (size_t)(n % 8) * 16 + (size_t)(n / 8) * sbo + (size_t)(k % per) * elem + (size_t)(k / per) * lbo;
    else if (!mn_major)  // rows of N (or M), K contiguous within the swizzled row; the next 8 rows at SBO
        off = (size_t)(n % 8) * row + (size_t)(n / 8) * sbo + (size_t)(k % per) * elem + (size_t)(k / per) * 16;
    else
        fatal(kExitMisuse, at_line("spatialc_wgmma", line) + ": an N-major operand without swizzle, which the"
                                                             " emulation does not know");
    uintptr_t a = reinterpret_cast<uintptr_t>(start) + off;
    a ^= ((a >> 7) & (span - 1)) << 4;
    return reinterpret_cast<const char*>(a);
}

// The shared-memory operand a descriptor names: its start, found from the descriptor's 14-bit window address.
SPATIALC_EMU_FN const char* wgmma_start(unsigned long long desc) {
    const uintptr_t low = reinterpret_cast<uintptr_t>(dynamic_shared()) & 0x3FFFFu;  // the block's place in the window
    return dynamic_shared() + ((((desc & 0x3FFFu) << 4) - low) & 0x3FFFFu);
}

// One wgmma of the lane: its eight accumulator elements of every 16-column tile, over the K of one instruction. The
// lane's rows are its warp's 16 of the warpgroup's 64 (warp w of the warpgroup: rows 16w …). Float operands (16-bit;
// the 8-bit floats, e4m3 and e5m2, decoded exactly by their types' conversion) multiply exactly in float32 — 8-bit
// products have at most 8 significant bits, 16-bit ones 22 — and are added to the accumulator one k after another,
// each sum rounded to float32 (nearest even): not the hardware's order or, for the 8-bit floats, its precision (the
// tensor core keeps fewer bits of their sums: docs/numerics.md), both of which the kernel's bound covers.
// `BMN`: B is MN-major (16-bit B of a GEMM and attention's V, imm-trans-b 1), else K-major (8-bit B; attention's K,
// imm-trans-b 0). `N`: the instruction's N.
template <class T, class A, bool BMN>
void wgmma_run(spatialc_acc<A>* d, int N, unsigned long long a_desc, unsigned long long b_desc, int warp_in_group,
               int lane, int line, const std::vector<unsigned>* known) {
    constexpr int kd = sizeof(T) == 1 ? 32 : 16;
    constexpr int elem = (int)sizeof(T);
    constexpr bool b_mn_major = BMN;
    static_assert(!BMN || sizeof(T) == 2, "the PTX ISA transposes 16-bit operands only");
    const char* a_start = wgmma_start(a_desc);
    const char* b_start = wgmma_start(b_desc);
    static thread_local std::vector<const void*> reads;
    reads.clear();
    for (int c = 0; c < N / 16; ++c)
        for (int i = 0; i < 8; ++i) {
            const int r = 16 * warp_in_group + acc_row(lane, i), col = 16 * c + acc_col(lane, i);
            auto a_at = [&](int k) {
                return *reinterpret_cast<const T*>(wgmma_byte(a_start, a_desc, k, r, elem, false, line));
            };
            auto b_at = [&](int k) {
                return *reinterpret_cast<const T*>(wgmma_byte(b_start, b_desc, k, col, elem, b_mn_major, line));
            };
            if constexpr (std::is_same_v<A, int>) {
                uint32_t acc = (uint32_t)d[c].x[i];  // int32 accumulation wraps like the hardware's
                for (int k = 0; k < kd; ++k) acc += (uint32_t)((int)a_at(k) * (int)b_at(k));
                d[c].x[i] = (int)acc;
            } else {
                float acc = d[c].x[i];
                for (int k = 0; k < kd; ++k) acc += float(a_at(k)) * float(b_at(k));
                d[c].x[i] = acc;
            }
        }
    if (lane == 0) {  // the warp's reads, checked once: its 16 rows of A and the whole of B
        for (int k = 0; k < kd; ++k) {
            for (int r = 0; r < 16; ++r)
                reads.push_back(wgmma_byte(a_start, a_desc, k, 16 * warp_in_group + r, elem, false, line));
            for (int n = 0; n < N; ++n) reads.push_back(wgmma_byte(b_start, b_desc, k, n, elem, b_mn_major, line));
        }
        if (known)
            track_async_read(reads.data(), (int)reads.size(), sizeof(T), AccessKind::wgmma, line, *known);
        else
            track(reads.data(), (int)reads.size(), sizeof(T), false, AccessKind::wgmma, line);
    }
}

// The bytes a wgmma of the warp reads (its 16 rows of A, the whole of B), checked at its issue to have been written
// by the copy engine or handed over to the async proxy (check_proxy_read): a page the threads wrote needs its
// writers' fence.proxy.async ordered before the wgmma.
SPATIALC_EMU_FN void wgmma_proxy_check(int N, int elem, bool b_mn_major, unsigned long long a_desc,
                                       unsigned long long b_desc, int warp_in_group, int line) {
    const int kd = elem == 1 ? 32 : 16;
    const char* a_start = wgmma_start(a_desc);
    const char* b_start = wgmma_start(b_desc);
    static thread_local std::vector<const void*> reads;
    reads.clear();
    for (int k = 0; k < kd; ++k) {
        for (int r = 0; r < 16; ++r)
            reads.push_back(wgmma_byte(a_start, a_desc, k, 16 * warp_in_group + r, elem, false, line));
        for (int n = 0; n < N; ++n) reads.push_back(wgmma_byte(b_start, b_desc, k, n, elem, b_mn_major, line));
    }
    check_proxy_read(reads.data(), (int)reads.size(), (size_t)elem, at_line("spatialc_wgmma", line));
}

// One wgmma of the lane with A from registers (the RS form): A is the warp's 16 rows × 16 k of the fragment its lanes
// hold (`a`, gathered as the lanes' registers lie: row acc_row, k acc_col of each lane's eight values, as
// mma.m16n8k16's A), B from shared memory through its descriptor, MN-major (imm-trans-b 1) or K-major. The sums as
// wgmma_run's. The registers a lane gave must hold the same values when the group retires (the PTX ISA: they may not
// be written before wgmma.wait_group), which `live` — the lane's fragment now — is checked against.
template <class T, bool BMN>
void wgmma_rs_run(spatialc_acc<float>* d, int N, const spatialc_frag<T>& a, const spatialc_frag<T>* live,
                  unsigned long long b_desc, int lane, int line, const std::vector<unsigned>* known) {
    static_assert(sizeof(T) == 2, "an A fragment in registers of 16-bit values");
    if (live && std::memcmp(live->v, a.v, sizeof a.v) != 0)
        fatal(kExitMisuse, at_line("spatialc_wgmma_rs", line) + ": its A registers were written before the"
                                                                " wait_group that retires it");
    const char* b_start = wgmma_start(b_desc);
    for (int c = 0; c < N / 16; ++c)
        for (int i = 0; i < 8; ++i) {
            const int r = acc_row(lane, i), col = 16 * c + acc_col(lane, i);
            float acc = d[c].x[i];
            for (int k = 0; k < 16; ++k)
                acc += float(a.v[r * 32 + k]) *
                       float(*reinterpret_cast<const T*>(wgmma_byte(b_start, b_desc, k, col, 2, BMN, line)));
            d[c].x[i] = acc;
        }
    if (lane == 0) {  // the warp's reads of B, checked once
        static thread_local std::vector<const void*> reads;
        reads.clear();
        for (int k = 0; k < 16; ++k)
            for (int n = 0; n < N; ++n) reads.push_back(wgmma_byte(b_start, b_desc, k, n, 2, BMN, line));
        if (known)
            track_async_read(reads.data(), (int)reads.size(), sizeof(T), AccessKind::wgmma, line, *known);
        else
            track(reads.data(), (int)reads.size(), sizeof(T), false, AccessKind::wgmma, line);
    }
}

// wgmma_run of the element type, accumulator type and B layout `elem` and `b_mn_major` name.
SPATIALC_EMU_FN void wgmma_run_of(void* acc, int n, WgmmaElem elem, bool b_mn_major, unsigned long long a,
                                  unsigned long long b, int warp, int lane, int line,
                                  const std::vector<unsigned>* known) {
    auto* f = static_cast<spatialc_acc<float>*>(acc);
    switch (elem) {
        case WgmmaElem::f16:
            if (b_mn_major) return wgmma_run<__half, float, true>(f, n, a, b, warp, lane, line, known);
            return wgmma_run<__half, float, false>(f, n, a, b, warp, lane, line, known);
        case WgmmaElem::bf16:
            if (b_mn_major) return wgmma_run<__nv_bfloat16, float, true>(f, n, a, b, warp, lane, line, known);
            return wgmma_run<__nv_bfloat16, float, false>(f, n, a, b, warp, lane, line, known);
        case WgmmaElem::e4m3: return wgmma_run<__nv_fp8_e4m3, float, false>(f, n, a, b, warp, lane, line, known);
        case WgmmaElem::e5m2: return wgmma_run<__nv_fp8_e5m2, float, false>(f, n, a, b, warp, lane, line, known);
        case WgmmaElem::s8:
            return wgmma_run<signed char, int, false>(static_cast<spatialc_acc<int>*>(acc), n, a, b, warp, lane, line,
                                                      known);
    }
}

SPATIALC_EMU_FN int wgmma_elem_size(WgmmaElem elem) {
    return elem == WgmmaElem::f16 || elem == WgmmaElem::bf16 ? 2 : 1;
}

SPATIALC_EMU_FN void wgmma_ss(void* acc, int n, WgmmaElem elem, bool b_mn_major, unsigned long long a,
                              unsigned long long b, int line) {
    const ThreadState& t = me("spatialc_wgmma");
    const int warp = t.warp % 4, lane = t.lane;
    if (acc_written)  // the PTX ISA: undefined unless wgmma.fence orders those writes before the wgmma
        fatal(kExitMisuse, at_line("spatialc_wgmma", line) + ": its accumulators were written by ordinary "
                                                             "instructions with no spatialc_wgmma_fence() since");
    if (lane == 0)  // (one warp's reads, checked once)
        wgmma_proxy_check(n, wgmma_elem_size(elem), b_mn_major, a, b, warp, line);
    if (!kLate) {
        wgmma_run_of(acc, n, elem, b_mn_major, a, b, warp, lane, line, nullptr);
        return;
    }
    // Run at its wait_group, its reads checked against what the thread knew when it issued it.
    wgmma_open.push_back([acc, n, elem, b_mn_major, a, b, warp, lane, line, known = t.vc] {
        wgmma_run_of(acc, n, elem, b_mn_major, a, b, warp, lane, line, &known);
    });
}

template <class T>
void wgmma_rs_issue(spatialc_acc<float>* acc, int n, const spatialc_frag<T>& a, unsigned long long b, int line) {
    const ThreadState& t = me("spatialc_wgmma_rs");
    const int lane = t.lane;
    if (a.kd != 16) fatal(kExitMisuse, at_line("spatialc_wgmma_rs", line) + ": an A fragment never loaded");
    if (acc_written)
        fatal(kExitMisuse, at_line("spatialc_wgmma_rs", line) + ": its accumulators were written by ordinary "
                                                                "instructions with no spatialc_wgmma_fence() since");
    if (!kLate) {
        wgmma_rs_run<T, true>(acc, n, a, nullptr, b, lane, line, nullptr);
        return;
    }
    wgmma_open.push_back([acc, n, copy = a, live = &a, b, lane, line, known = t.vc] {
        wgmma_rs_run<T, true>(acc, n, copy, live, b, lane, line, &known);
    });
}

SPATIALC_EMU_FN void wgmma_rs(spatialc_acc<float>* acc, int n, WgmmaElem elem, const void* frag,
                              unsigned long long b, int line) {
    if (elem == WgmmaElem::f16)
        wgmma_rs_issue(acc, n, *static_cast<const spatialc_frag<__half>*>(frag), b, line);
    else
        wgmma_rs_issue(acc, n, *static_cast<const spatialc_frag<__nv_bfloat16>*>(frag), b, line);
}

SPATIALC_EMU_FN void wgmma_zero(spatialc_acc<float>* acc, int tiles) {
    auto fresh = [acc, tiles] {
        for (int c = 0; c < tiles; ++c)
            for (float& e : acc[c].x) e = 0.0f;
    };
    if (kLate)
        wgmma_open.push_back(fresh);
    else
        fresh();
}

SPATIALC_EMU_FN void wgmma_commit() {
    if (!wgmma_open.empty()) wgmma_groups.push_back(std::move(wgmma_open));
    wgmma_open.clear();
}

SPATIALC_EMU_FN void wgmma_wait(size_t n, int line) {
    while (wgmma_groups.size() > n) {
        for (auto& run : wgmma_groups.front()) run();
        wgmma_groups.erase(wgmma_groups.begin());
    }
    warp_barrier(0xffffffffu, line);
}

}  // namespace spatialc_emu

#endif  // SPATIALC_EMU_HOPPER_RUN_H

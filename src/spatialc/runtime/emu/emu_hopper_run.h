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

// The shared-memory operand a descriptor names: its start, found from the descriptor's 14-bit window address.
SPATIALC_EMU_FN const char* wgmma_start(unsigned long long desc) {
    const uintptr_t low = reinterpret_cast<uintptr_t>(dynamic_shared()) & 0x3FFFFu;  // the block's place in the window
    return dynamic_shared() + ((((desc & 0x3FFFu) << 4) - low) & 0x3FFFFu);
}

// An operand's shared-memory matrix descriptor, read once: `at(k, n)` is the byte holding element (k, n) — (k, m) of
// A, (k, n) of B: `mn_major` (16-bit B, transposed: N contiguous) or K-major, in the canonical layout of the
// descriptor's swizzle mode, then swizzled by address like the copy engine's stores. What the emulation does not know
// (a non-zero base offset; an N-major operand without swizzle) ends the run when the operand is read.
struct WgmmaOperand {
    const char* start;
    size_t lbo, sbo, row;  // leading and stride byte offsets; a swizzled row's bytes (a panel's width)
    unsigned mode, span;   // swizzle mode; the 16-byte chunks it permutes
    int elem, per;         // element bytes; elements in a 16-byte chunk
    bool mn_major;

    const char* at(int k, int n) const {
        size_t off;
        if (mn_major)  // rows of K, N contiguous: the next panel of N at LBO, the next 8 rows of K at SBO
            off = (size_t)(n % (row / elem)) * elem + (size_t)(n / (row / elem)) * lbo + (size_t)(k % 8) * row +
                  (size_t)(k / 8) * sbo;
        else if (mode == 0)  // core matrices of 8 rows × 16 bytes; the next 8 rows at SBO, next K chunk at LBO
            off = (size_t)(n % 8) * 16 + (size_t)(n / 8) * sbo + (size_t)(k % per) * elem + (size_t)(k / per) * lbo;
        else  // rows of N (or M), K contiguous within the swizzled row; the next 8 rows at SBO
            off = (size_t)(n % 8) * row + (size_t)(n / 8) * sbo + (size_t)(k % per) * elem + (size_t)(k / per) * 16;
        uintptr_t a = reinterpret_cast<uintptr_t>(start) + off;
        a ^= ((a >> 7) & (span - 1)) << 4;
        return reinterpret_cast<const char*>(a);
    }
};

SPATIALC_EMU_FN WgmmaOperand wgmma_operand(unsigned long long desc, int elem, bool mn_major, int line) {
    WgmmaOperand o;
    o.start = wgmma_start(desc);
    o.lbo = ((desc >> 16) & 0x3FFFu) << 4;
    o.sbo = ((desc >> 32) & 0x3FFFu) << 4;
    o.mode = (unsigned)(desc >> 62);
    o.span = o.mode == 1 ? 8 : o.mode == 2 ? 4 : o.mode == 3 ? 2 : 1;
    o.row = 16 * o.span;
    o.elem = elem;
    o.per = 16 / elem;
    o.mn_major = mn_major;
    if (((desc >> 49) & 7u) != 0) fatal(kExitMisuse, at_line("spatialc_wgmma", line) + ": a non-zero base offset");
    if (mn_major && o.mode == 0)
        fatal(kExitMisuse, at_line("spatialc_wgmma", line) + ": an N-major operand without swizzle, which the"
                                                             " emulation does not know");
    return o;
}

// The bytes a warp's wgmma reads — its 16 rows of A (`a`, or none where A is in registers) and the whole of B — into
// `reads`, in the order the checks name them.
SPATIALC_EMU_FN void wgmma_reads(std::vector<const void*>& reads, const WgmmaOperand* a, const WgmmaOperand& b,
                                 int kd, int n_cols, int warp_in_group) {
    reads.clear();
    for (int k = 0; k < kd; ++k) {
        if (a)
            for (int r = 0; r < 16; ++r) reads.push_back(a->at(k, 16 * warp_in_group + r));
        for (int n = 0; n < n_cols; ++n) reads.push_back(b.at(k, n));
    }
}

// A warp's wgmma reads (wgmma_reads) tracked as it retires: against what the issuing thread knew (`known`, late
// mode), else as plain reads at issue.
SPATIALC_EMU_FN void wgmma_track(const WgmmaOperand* a, const WgmmaOperand& b, int kd, int n_cols, int warp_in_group,
                                 size_t elem, int line, const std::vector<unsigned>* known) {
    static thread_local std::vector<const void*> reads;
    wgmma_reads(reads, a, b, kd, n_cols, warp_in_group);
    if (known)
        track_async_read(reads.data(), (int)reads.size(), elem, AccessKind::wgmma, line, *known);
    else
        track(reads.data(), (int)reads.size(), elem, false, AccessKind::wgmma, line);
}

// The operand values a lane's eight accumulator elements multiply, read once for each distinct row (or column):
// `key(i)` is element i's row or column, `read(key, k)` the value at k; element i's values are `val[of[i]]`.
template <class V, int KD, class Key, class Read>
void lane_values(V (&val)[8][KD], int (&of)[8], Key key, Read read) {
    int keys[8], n = 0;
    for (int i = 0; i < 8; ++i) {
        const int x = key(i);
        int j = 0;
        while (j < n && keys[j] != x) ++j;
        if (j == n) {
            keys[n++] = x;
            for (int k = 0; k < KD; ++k) val[j][k] = read(x, k);
        }
        of[i] = j;
    }
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
    static_assert(!BMN || sizeof(T) == 2, "the PTX ISA transposes 16-bit operands only");
    using V = std::conditional_t<std::is_same_v<A, int>, int, float>;  // an operand's value: exact either way
    const WgmmaOperand a_op = wgmma_operand(a_desc, elem, false, line), b_op = wgmma_operand(b_desc, elem, BMN, line);
    // The lane's values of A (its two rows) and of B (its columns of a 16-column tile), each read once, then
    // multiplied and added in the order of k as before.
    V a_val[8][kd], b_val[8][kd];
    int a_of[8], b_of[8];
    lane_values(
        a_val, a_of, [&](int i) { return 16 * warp_in_group + acc_row(lane, i); },
        [&](int r, int k) { return V(*reinterpret_cast<const T*>(a_op.at(k, r))); });
    for (int c = 0; c < N / 16; ++c) {
        lane_values(
            b_val, b_of, [&](int i) { return 16 * c + acc_col(lane, i); },
            [&](int col, int k) { return V(*reinterpret_cast<const T*>(b_op.at(k, col))); });
        for (int i = 0; i < 8; ++i) {
            const V* av = a_val[a_of[i]];
            const V* bv = b_val[b_of[i]];
            if constexpr (std::is_same_v<A, int>) {
                uint32_t acc = (uint32_t)d[c].x[i];  // int32 accumulation wraps like the hardware's
                for (int k = 0; k < kd; ++k) acc += (uint32_t)(av[k] * bv[k]);
                d[c].x[i] = (int)acc;
            } else {
                float acc = d[c].x[i];
                for (int k = 0; k < kd; ++k) acc += av[k] * bv[k];
                d[c].x[i] = acc;
            }
        }
    }
    if (lane == 0)  // the warp's reads, checked once: its 16 rows of A and the whole of B
        wgmma_track(&a_op, b_op, kd, N, warp_in_group, sizeof(T), line, known);
}

// The bytes a wgmma of the warp reads (its 16 rows of A, the whole of B), checked at its issue to have been written
// by the copy engine or handed over to the async proxy (check_proxy_read): a page the threads wrote needs its
// writers' fence.proxy.async ordered before the wgmma.
SPATIALC_EMU_FN void wgmma_proxy_check(int N, int elem, bool b_mn_major, unsigned long long a_desc,
                                       unsigned long long b_desc, int warp_in_group, int line) {
    const int kd = elem == 1 ? 32 : 16;
    const WgmmaOperand a = wgmma_operand(a_desc, elem, false, line), b = wgmma_operand(b_desc, elem, b_mn_major, line);
    static thread_local std::vector<const void*> reads;
    wgmma_reads(reads, &a, b, kd, N, warp_in_group);
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
    const WgmmaOperand b_op = wgmma_operand(b_desc, 2, BMN, line);
    float b_val[8][16];
    int b_of[8];
    for (int c = 0; c < N / 16; ++c) {
        lane_values(
            b_val, b_of, [&](int i) { return 16 * c + acc_col(lane, i); },
            [&](int col, int k) { return float(*reinterpret_cast<const T*>(b_op.at(k, col))); });
        for (int i = 0; i < 8; ++i) {
            const int r = acc_row(lane, i);
            const float* bv = b_val[b_of[i]];
            float acc = d[c].x[i];
            for (int k = 0; k < 16; ++k) acc += float(a.v[r * 32 + k]) * bv[k];
            d[c].x[i] = acc;
        }
    }
    if (lane == 0)  // the warp's reads of B, checked once
        wgmma_track(nullptr, b_op, 16, N, 0, sizeof(T), line, known);
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

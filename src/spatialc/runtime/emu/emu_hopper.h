// spatialc host emulation — the sm_90a layer (lower/cuda/sm90a/sm90a.cuh): tensor maps and TMA tile loads, mbarrier
// transaction counts, the asynchronous warpgroup MMA (wgmma) with shared-memory matrix descriptors, and the fences
// between the generic and the async proxy. Together with cuda.h / cudaTypedefs.h here, the host programs' tensor-map
// encoding through the driver entry point.
//
// What is emulated because correctness depends on it:
// - a TMA load copies its box element by element from the tensor map's strides, zero where a coordinate is past the
//   tensor, and swizzles 16-byte chunks by shared-memory address bits as the hardware does (32, 64, 128 bytes); its
//   bytes count on the barrier's transaction count (the phase waits for them), and its writes are checked for races
//   as the issuing thread's, ordered before whoever waits on the phase;
// - a barrier a peer block of the cluster arrives on or multicasts into must have been fenced for the cluster
//   (fence.mbarrier_init by the thread that initialised it) and a cluster barrier must lie between, and a thread
//   passing a phase a peer completed must wait at cluster scope, or the run stops with a race report;
// - a barrier the copy engine signals must have been made visible to the async proxy (fence.proxy.async after its
//   initialisation, as the CUDA programming guide's TMA example does; whether fence.mbarrier_init alone suffices is
//   not settled by the documentation, so the emulation asks for the stronger fence), or the run stops with a race
//   report; a phase that gets more bytes than announced is a misuse, one that gets fewer never completes and the
//   deadlock report says how many bytes it still waits for;
// - a TMA box's bytes are written by the copy engine, a thread of its own for the race check (one per barrier),
//   ordered before whoever completes a wait on the phase they complete on and nothing else; a box reading past the
//   cudaMalloc allocation its map was made over is refused;
// - accumulators are garbage until written (spatialc_acc poisons them), and a wgmma after ordinary writes to them
//   (spatialc_acc_zero) needs a wgmma fence in between;
// - setmaxnreg: a decrease above (an increase below) what the warp holds is a misuse; at the block's end every warp
//   of a warpgroup must hold the same count and the counts must fit the register file, else the increase would
//   have waited forever on the GPU;
// - a wgmma reads A and B through their descriptors (start address, leading and stride byte offsets, swizzle) in
//   the canonical layouts of the PTX ISA — A K-major, 16-bit B N-major (transposed) or K-major (attention's K), 8-bit
//   B K-major; or A from the warp's registers (the RS form: attention's P, whose registers must hold until the
//   group retires) — and in late mode
//   runs only at the wait_group that retires its group (which the warp's lanes pass together, as .sync.aligned
//   says): its accumulators are not written before that, and its
//   shared-memory reads are checked there against what the thread knew when it issued the wgmma — the hardware may
//   read at any time in between — so a slot released before the wait, or refilled in between, is a race, and
//   reading accumulators early gives stale values. In early mode it runs when issued;
// - a wgmma's operand bytes that threads wrote (a W4A16 GEMM's dequantised B page) must have been handed to the async
//   proxy: each writer's fence.proxy.async after its write, ordered before the wgmma's issue by a barrier the issuing
//   thread waited on (check_proxy_read), else the run stops with a race report;
// - a bulk copy (cp.async.bulk, no tensor map: a W4A16 GEMM's packed rows, scales and zero points) reads one launch
//   tensor and lands as a TMA box does, counted on its barrier.
#ifndef SPATIALC_EMU_HOPPER_H
#define SPATIALC_EMU_HOPPER_H

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "emu_host.h"
#include "emu_mbarrier.h"
#include "emu_mma.h"

#define SPATIALC_SM90A 1
#define SPATIALC_SM90A_EMULATED 1
#define __grid_constant__

// ---- cuda.h's tensor maps ------------------------------------------------------------------------------------
typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
enum CUtensorMapDataType {
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
    CU_TENSOR_MAP_DATA_TYPE_UINT16,
    CU_TENSOR_MAP_DATA_TYPE_UINT32,
    CU_TENSOR_MAP_DATA_TYPE_INT32,
    CU_TENSOR_MAP_DATA_TYPE_UINT64,
    CU_TENSOR_MAP_DATA_TYPE_INT64,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
};
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0, CU_TENSOR_MAP_INTERLEAVE_16B, CU_TENSOR_MAP_INTERLEAVE_32B };
enum CUtensorMapSwizzle {
    CU_TENSOR_MAP_SWIZZLE_NONE = 0,
    CU_TENSOR_MAP_SWIZZLE_32B,
    CU_TENSOR_MAP_SWIZZLE_64B,
    CU_TENSOR_MAP_SWIZZLE_128B,
};
enum CUtensorMapL2promotion {
    CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
    CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
};
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA };
struct alignas(64) CUtensorMap {
    unsigned long long opaque[16];
};
typedef CUresult (*PFN_cuTensorMapEncodeTiled_v12000)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                                      const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                                      const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                                      CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2,
};
constexpr unsigned long long cudaEnableDefault = 0;

namespace spatialc_emu {

// What the emulated encoder keeps in a CUtensorMap's 128 opaque bytes.
struct TensorMapFields {
    uint32_t magic, elem, rank, swizzle;  // swizzle: the span in bytes (0: none)
    const char* base;
    uint64_t dim[5], stride[5];  // stride[0] is the element size; the others the caller's, in bytes
    uint16_t box[5];  // at most 256 each
    const char* end;  // the end of the cudaMalloc allocation holding `base` (null: not one)
};
static_assert(sizeof(TensorMapFields) <= sizeof(CUtensorMap), "a tensor map holds its fields");
constexpr uint32_t kTensorMapMagic = 0x590a7a9u;

SPATIALC_EMU_FN CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                      const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
SPATIALC_EMU_FN void mbar_expect_tx(void* bar, unsigned bytes, int line);
SPATIALC_EMU_FN void mbar_arrive_expect_tx(void* bar, unsigned bytes, int line);
SPATIALC_EMU_FN void tma_load(void* dst, const CUtensorMap* map, const int* coords, int rank, void* bar, int line);
SPATIALC_EMU_FN void fence_proxy_async(int line);
SPATIALC_EMU_FN void fence_barrier_init();
// Clusters (emu_cluster.h): the cluster barrier, an arrival on a peer block's barrier, a multicast box.
SPATIALC_EMU_FN void cluster_sync(int line);
// TMA stores (emu_runtime.h): a box of shared memory into a tensor, read by the copy engine in late mode only when
// its bulk group is waited for.
SPATIALC_EMU_FN void tma_store(const CUtensorMap* map, const int* coords, int rank, const void* src, int line);
SPATIALC_EMU_FN void bulk_commit();
SPATIALC_EMU_FN void bulk_wait_read(size_t n);
SPATIALC_EMU_FN void mbar_arrive_cluster(void* bar, unsigned rank, int line);
SPATIALC_EMU_FN void tma_load_multicast(void* dst, const CUtensorMap* map, const int* coords, int rank, void* bar,
                                        unsigned mask, int line);
// setmaxnreg by the calling warp (lane 0 speaks for it); the block's end checks each warpgroup ran the same one and
// the counts fit the register file.
SPATIALC_EMU_FN void setmaxnreg(unsigned n, bool inc, int line);
// A W4A16 GEMM's packed page (sm90a/dequant.py): `bytes` contiguous bytes of global memory into shared memory by
// the copy engine (cp.async.bulk, no tensor map), counted on `bar` as a TMA box's are (emu_runtime.h).
SPATIALC_EMU_FN void bulk_load(void* dst, const void* src, unsigned bytes, void* bar, int line);
// The async proxy reading shared memory the threads wrote (a wgmma's operand page a W4A16 GEMM's consumers
// dequantised into): every byte's last writer must have made a fence.proxy.async since the write, and that fence
// must be ordered before the read's issue (its own, or one a barrier carried), else the run stops with a race report.
SPATIALC_EMU_FN void check_proxy_read(const void* const* ptrs, int count, size_t size, const std::string& where);
// An asynchronous read (a wgmma's operands) made now, at its retirement, by the calling thread, which may have
// happened at any time since its issue: checked against the writes the thread `known` of when it issued it (its
// vector clock then), so a write that landed in between is a race; recorded as a read made now.
SPATIALC_EMU_FN void track_async_read(const void* const* ptrs, int count, size_t size, AccessKind kind, int line,
                                      const std::vector<unsigned>& known);

// ---- wgmma ------------------------------------------------------------------------------------------------------
// The calling thread's wgmma not yet retired: issued since the last commit, then committed groups, oldest first.
SPATIALC_EMU_VAR thread_local std::vector<std::function<void()>> wgmma_open;
SPATIALC_EMU_VAR thread_local std::vector<std::vector<std::function<void()>>> wgmma_groups;

inline std::string at_line(const char* what, int line) { return std::string(what) + " at line " + std::to_string(line); }

// The byte holding element (k, n) of an operand — (k, m) of A, (k, n) of B: `mn_major` (16-bit B, transposed: N
// contiguous) or K-major, in the canonical layout of the descriptor's swizzle mode, then swizzled by address like
// the copy engine's stores.
inline const char* wgmma_byte(const char* start, unsigned long long desc, int k, int n, int elem, bool mn_major,
                                int line) {
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
inline const char* wgmma_start(unsigned long long desc) {
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
// imm-trans-b 0).
template <int N, class T, class A, bool BMN = sizeof(T) == 2>
void wgmma_run(spatialc_acc<A>* d, unsigned long long a_desc, unsigned long long b_desc, int warp_in_group, int lane,
               int line, const std::vector<unsigned>* known = nullptr) {
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
template <int N, class T, bool BMN>
void wgmma_proxy_check(unsigned long long a_desc, unsigned long long b_desc, int warp_in_group, int line) {
    constexpr int kd = sizeof(T) == 1 ? 32 : 16;
    constexpr int elem = (int)sizeof(T);
    const char* a_start = wgmma_start(a_desc);
    const char* b_start = wgmma_start(b_desc);
    static thread_local std::vector<const void*> reads;
    reads.clear();
    for (int k = 0; k < kd; ++k) {
        for (int r = 0; r < 16; ++r)
            reads.push_back(wgmma_byte(a_start, a_desc, k, 16 * warp_in_group + r, elem, false, line));
        for (int n = 0; n < N; ++n) reads.push_back(wgmma_byte(b_start, b_desc, k, n, elem, BMN, line));
    }
    check_proxy_read(reads.data(), (int)reads.size(), sizeof(T), at_line("spatialc_wgmma", line));
}

// One wgmma of the lane with A from registers (the RS form): A is the warp's 16 rows × 16 k of the fragment its lanes
// hold (`a`, gathered as the lanes' registers lie: row acc_row, k acc_col of each lane's eight values, as
// mma.m16n8k16's A), B from shared memory through its descriptor, MN-major (imm-trans-b 1) or K-major. The sums as
// wgmma_run's. The registers a lane gave must hold the same values when the group retires (the PTX ISA: they may not
// be written before wgmma.wait_group), which `live` — the lane's fragment now — is checked against.
template <int N, class T, bool BMN>
void wgmma_rs_run(spatialc_acc<float>* d, const spatialc_frag<T>& a, const spatialc_frag<T>* live,
                  unsigned long long b_desc, int lane, int line, const std::vector<unsigned>* known = nullptr) {
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

}  // namespace spatialc_emu

inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
    const bool known = std::string(symbol) == "cuTensorMapEncodeTiled";
    *fn = known ? reinterpret_cast<void*>(&spatialc_emu::encode_tiled) : nullptr;
    if (found) *found = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

// ---- the kernel text's sm_90a layer -----------------------------------------------------------------------------
inline void __trap() { spatialc_emu::fatal(spatialc_emu::kExitMisuse, "the kernel trapped (__trap)"); }

inline void spatialc_check_stage_base(const void* base, int line = __builtin_LINE()) {
    if (reinterpret_cast<uintptr_t>(base) % 1024)
        spatialc_emu::fatal(spatialc_emu::kExitMisuse,
                            spatialc_emu::at_line("spatialc_check_stage_base", line) +
                                ": the dynamic block does not start on 1024 bytes, which swizzled stages need");
}
inline void spatialc_mbar_expect_tx(unsigned long long* bar, unsigned bytes, int line = __builtin_LINE()) {
    spatialc_emu::mbar_expect_tx(bar, bytes, line);
}
inline void spatialc_mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes, int line = __builtin_LINE()) {
    spatialc_emu::mbar_arrive_expect_tx(bar, bytes, line);
}
// Only a hint on the GPU; here the map is checked to be one.
inline void spatialc_prefetch_tensormap(const CUtensorMap* map, int line = __builtin_LINE()) {
    spatialc_emu::TensorMapFields f;
    std::memcpy(&f, map, sizeof f);
    if (f.magic != spatialc_emu::kTensorMapMagic)
        spatialc_emu::fatal(spatialc_emu::kExitMisuse, spatialc_emu::at_line("spatialc_prefetch_tensormap", line) +
                                                           ": not a tensor map cuTensorMapEncodeTiled made");
}
inline void spatialc_tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, unsigned long long* bar,
                                 int line = __builtin_LINE()) {
    const int c[2] = {c0, c1};
    spatialc_emu::tma_load(dst, map, c, 2, bar, line);
}
inline void spatialc_tma_load_2d_multicast(void* dst, const CUtensorMap* map, int c0, int c1, unsigned long long* bar,
                                           unsigned short mask, int line = __builtin_LINE()) {
    const int c[2] = {c0, c1};
    spatialc_emu::tma_load_multicast(dst, map, c, 2, bar, mask, line);
}
inline void spatialc_mbar_arrive_cluster(unsigned long long* bar, unsigned rank, int line = __builtin_LINE()) {
    spatialc_emu::mbar_arrive_cluster(bar, rank, line);
}
inline void spatialc_mbar_wait_cluster(unsigned long long* bar, unsigned parity, int line = __builtin_LINE()) {
    spatialc_emu::mbar_wait(bar, parity, line, true);  // what remote arrivals released is learnt as any phase's
}
inline void spatialc_cluster_sync(int line = __builtin_LINE()) { spatialc_emu::cluster_sync(line); }
inline void spatialc_tma_store_2d(const CUtensorMap* map, int c0, int c1, const void* src, int line = __builtin_LINE()) {
    const int c[2] = {c0, c1};
    spatialc_emu::tma_store(map, c, 2, src, line);
}
inline void spatialc_bulk_commit() { spatialc_emu::bulk_commit(); }
inline void spatialc_bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar,
                              int line = __builtin_LINE()) {
    spatialc_emu::bulk_load(dst, src, bytes, bar, line);
}
// stmatrix, lane by lane: each lane's eight values land where the four 8×8 matrices put them (its own elements of
// the tile), recorded as its stores.
template <class T>
inline void spatialc_stmatrix_tile(T* tile, const T (&v)[8], int line = __builtin_LINE()) {
    static_assert(sizeof(T) == 2, "stmatrix stores 16-bit values");
    using namespace spatialc_emu;
    const ThreadState& t = me("spatialc_stmatrix_tile");
    for (int i = 0; i < 8; ++i) page_store(tile + acc_row(t.lane, i) * 16 + acc_col(t.lane, i), v[i], line);
}
// stmatrix as the instruction defines it: the rows' addresses are the lanes' (lane 8j + r: matrix j's row r), so
// each lane learns the four it writes to from the lanes that give them (a shuffle), then writes its two values of
// each matrix at its columns of that row, recorded as its stores.
template <class T>
inline void spatialc_stmatrix_rows(T* row, const T (&v)[8], int line = __builtin_LINE()) {
    static_assert(sizeof(T) == 2, "stmatrix stores 16-bit values");
    using namespace spatialc_emu;
    const ThreadState& t = me("spatialc_stmatrix_rows");
    if (reinterpret_cast<uintptr_t>(row) % 16)
        fatal(kExitMisuse, at_line("spatialc_stmatrix_rows", line) + ": a matrix row not on 16 bytes");
    for (int j = 0; j < 4; ++j) {
        T* at = __shfl_sync(0xffffffffu, row, 8 * j + t.lane / 4, 32, line);
        page_store(at + 2 * (t.lane % 4), v[2 * j], line);
        page_store(at + 2 * (t.lane % 4) + 1, v[2 * j + 1], line);
    }
}
template <int N>
inline void spatialc_bulk_wait_read() {
    spatialc_emu::bulk_wait_read((size_t)N);
}
inline void spatialc_fence_proxy_async(int line = __builtin_LINE()) { spatialc_emu::fence_proxy_async(line); }
inline void spatialc_fence_barrier_init() { spatialc_emu::fence_barrier_init(); }
template <unsigned N>
inline void spatialc_regs_dec(int line = __builtin_LINE()) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24 to 256 registers, a multiple of 8");
    spatialc_emu::setmaxnreg(N, false, line);
}
template <unsigned N>
inline void spatialc_regs_inc(int line = __builtin_LINE()) {
    static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes 24 to 256 registers, a multiple of 8");
    spatialc_emu::setmaxnreg(N, true, line);
}

// As the hardware encodes it; the start address is the offset in the 256 KiB shared window (here: from the dynamic
// block, whose low bits match), so an emulated descriptor is checked bit for bit like a real one.
inline unsigned long long spatialc_wgmma_desc(const void* p, unsigned lbo, unsigned sbo, unsigned swizzle,
                                              int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    const char* base = dynamic_shared();
    const char* q = static_cast<const char*>(p);
    if (!base || q < base || (size_t)(q - base) >= (1u << 18))
        fatal(kExitMisuse, at_line("spatialc_wgmma_desc", line) + ": the operand is not in the dynamic block");
    const uintptr_t addr = reinterpret_cast<uintptr_t>(q) & 0x3FFFFu;
    if (addr % 16 || lbo % 16 || sbo % 16 || (lbo >> 4) > 0x3FFFu || (sbo >> 4) > 0x3FFFu || swizzle > 3)
        fatal(kExitMisuse, at_line("spatialc_wgmma_desc", line) + ": address, leading or stride offset not a multiple"
                                                                  " of 16 bytes, or past 14 bits, or a swizzle mode"
                                                                  " past 3");
    return (unsigned long long)(addr >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | ((unsigned long long)swizzle << 62);
}
// Only an ordering constraint for the compiler on the GPU; here every statement runs in program order already.
template <class T, int N>
inline void spatialc_acc_fence(spatialc_acc<T> (&)[N]) {}
inline void spatialc_wgmma_fence() { spatialc_emu::acc_written = false; }
inline void spatialc_wgmma_commit() {
    using namespace spatialc_emu;
    if (!wgmma_open.empty()) wgmma_groups.push_back(std::move(wgmma_open));
    wgmma_open.clear();
}
// wgmma.wait_group is .sync.aligned: the warp's lanes execute it together, so when any lane is past it, every lane's
// retired groups have run — the lanes meet here, after retiring their own.
template <int N>
inline void spatialc_wgmma_wait(int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    while (wgmma_groups.size() > (size_t)N) {
        for (auto& run : wgmma_groups.front()) run();
        wgmma_groups.erase(wgmma_groups.begin());
    }
    warp_barrier(0xffffffffu, line);
}
template <int N, class T, class A, bool BMN = sizeof(T) == 2>
void spatialc_wgmma_ss(spatialc_acc<A> (&d)[N / 16], unsigned long long a, unsigned long long b, int line) {
    using namespace spatialc_emu;
    static_assert(N % 16 == 0 && N >= 16 && N <= 256, "a wgmma is 16 to 256 columns wide here");
    static_assert(std::is_same_v<T, signed char> ? std::is_same_v<A, int> : std::is_same_v<A, float>,
                  "int8 into int32, the floats (16- and 8-bit) into float32");
    const ThreadState& t = me("spatialc_wgmma");
    const int warp = t.warp % 4, lane = t.lane;
    if (acc_written)  // the PTX ISA: undefined unless wgmma.fence orders those writes before the wgmma
        fatal(kExitMisuse, at_line("spatialc_wgmma", line) + ": its accumulators were written by ordinary "
                                                             "instructions with no spatialc_wgmma_fence() since");
    if (lane == 0) wgmma_proxy_check<N, T, BMN>(a, b, warp, line);  // (one warp's reads, checked once)
    spatialc_acc<A>* acc = d;
    if (!kLate) {
        wgmma_run<N, T, A, BMN>(acc, a, b, warp, lane, line);
        return;
    }
    // Run at its wait_group, its reads checked against what the thread knew when it issued it.
    wgmma_open.push_back([acc, a, b, warp, lane, line, known = t.vc] {
        wgmma_run<N, T, A, BMN>(acc, a, b, warp, lane, line, &known);
    });
}
// Both operands from shared memory: B MN-major for 16-bit values (a GEMM's B), K-major for 8-bit ones.
template <int N, class T, class A>
void spatialc_wgmma(spatialc_acc<A> (&d)[N / 16], unsigned long long a, unsigned long long b,
                    int line = __builtin_LINE()) {
    spatialc_wgmma_ss<N, T, A>(d, a, b, line);
}
// Both from shared memory, 16-bit B K-major (imm-trans-b 0: attention's K, whose rows are S's columns).
template <int N, class T, class A>
void spatialc_wgmma_kb(spatialc_acc<A> (&d)[N / 16], unsigned long long a, unsigned long long b,
                       int line = __builtin_LINE()) {
    static_assert(sizeof(T) == 2, "16-bit operands");
    spatialc_wgmma_ss<N, T, A, false>(d, a, b, line);
}
// A from the warp's registers (an A fragment, `spatialc_load_a_acc`'s), B from shared memory MN-major (imm-trans-b 1:
// attention's V). The fragment is taken as issued; at retirement the lane's registers must still hold it.
template <int N, class T, class A>
void spatialc_wgmma_rs(spatialc_acc<A> (&d)[N / 16], const spatialc_frag<T>& a, unsigned long long b,
                       int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    static_assert(N % 16 == 0 && N >= 16 && N <= 256, "a wgmma is 16 to 256 columns wide here");
    static_assert(sizeof(T) == 2 && std::is_same_v<A, float>, "16-bit A in registers, into float32");
    const ThreadState& t = me("spatialc_wgmma_rs");
    const int lane = t.lane;
    if (a.kd != 16) fatal(kExitMisuse, at_line("spatialc_wgmma_rs", line) + ": an A fragment never loaded");
    if (acc_written)
        fatal(kExitMisuse, at_line("spatialc_wgmma_rs", line) + ": its accumulators were written by ordinary "
                                                                "instructions with no spatialc_wgmma_fence() since");
    spatialc_acc<A>* acc = d;
    if (!kLate) {
        wgmma_rs_run<N, T, true>(acc, a, nullptr, b, lane, line);
        return;
    }
    wgmma_open.push_back([acc, copy = a, live = &a, b, lane, line, known = t.vc] {
        wgmma_rs_run<N, T, true>(acc, copy, live, b, lane, line, &known);
    });
}
// ---- block-scaled 8-bit floats: a wgmma with scale-d an operand ------------------------------------------------
// scale_d 0: D = A · B, the accumulators not read (a block-scaled K group's first wgmma into its fresh partials, as
// the PTX ISA's scale-d predicate says); 1: D += A · B. The accumulators are zeroed when the wgmma runs — in late
// mode at the wait_group that retires its group, in the same group, before its products — so a promotion that reads
// them before the group retires reads the previous group's partials (or the poison of never-written registers).
template <int N, class T, class A>
void spatialc_wgmma_sd(spatialc_acc<A> (&d)[N / 16], unsigned long long a, unsigned long long b, int scale_d,
                       int line = __builtin_LINE()) {
    using namespace spatialc_emu;
    static_assert(sizeof(T) == 1 && !std::is_same_v<T, signed char>, "the 8-bit floats' block-scaled GEMM");
    if (!scale_d) {
        spatialc_acc<A>* acc = d;
        auto fresh = [acc] {
            for (int c = 0; c < N / 16; ++c)
                for (A& e : acc[c].x) e = A(0);
        };
        if (kLate)
            wgmma_open.push_back(fresh);
        else
            fresh();
    }
    spatialc_wgmma_ss<N, T, A, false>(d, a, b, line);
}
// The A fragment's registers pinned (sm90a.cuh): only a compiler ordering on the GPU.
template <class T>
inline void spatialc_frag_fence(spatialc_frag<T>&) {}

#endif  // SPATIALC_EMU_HOPPER_H

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

// "what at line 12", the start of a report. misuse_at ends the run with "what at line 12: why".
SPATIALC_EMU_FN std::string at_line(const char* what, int line);
[[noreturn]] SPATIALC_EMU_FN void misuse_at(const char* what, int line, const char* why);

// The kernel text's wgmma templates (below) check their operand types and pass them on to these functions, which
// emu_hopper_run.h defines: a program's build then compiles no emulated wgmma of its own (they were a third of an
// sm_90a program's g++ time), only a call. `n` is the instruction's N; `acc` the lane's n / 16 accumulators, of
// floats, or of ints for int8.
enum class WgmmaElem : unsigned char { f16, bf16, e4m3, e5m2, s8 };
template <class T>
constexpr WgmmaElem wgmma_elem() {
    if constexpr (std::is_same_v<T, __half>) return WgmmaElem::f16;
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) return WgmmaElem::bf16;
    else if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) return WgmmaElem::e4m3;
    else if constexpr (std::is_same_v<T, __nv_fp8_e5m2>) return WgmmaElem::e5m2;
    else {
        static_assert(std::is_same_v<T, signed char>, "a wgmma of 16-bit floats, 8-bit floats or int8");
        return WgmmaElem::s8;
    }
}
// Both operands from shared memory; `b_mn_major`: B MN-major (imm-trans-b 1), else K-major.
SPATIALC_EMU_FN void wgmma_ss(void* acc, int n, WgmmaElem elem, bool b_mn_major, unsigned long long a,
                              unsigned long long b, int line);
// A from the warp's registers (`frag`: the lane's spatialc_frag of `elem`), B from shared memory MN-major.
SPATIALC_EMU_FN void wgmma_rs(spatialc_acc<float>* acc, int n, WgmmaElem elem, const void* frag,
                              unsigned long long b, int line);
// scale-d 0: the lane's `tiles` accumulators zeroed when the wgmma issued next runs (at once in early mode).
SPATIALC_EMU_FN void wgmma_zero(spatialc_acc<float>* acc, int tiles);
SPATIALC_EMU_FN void wgmma_commit();
// wgmma.wait_group n: the calling thread's groups but the newest `n` run, then its warp's lanes meet.
SPATIALC_EMU_FN void wgmma_wait(size_t n, int line);

}  // namespace spatialc_emu

inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
    const bool known = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    *fn = known ? reinterpret_cast<void*>(&spatialc_emu::encode_tiled) : nullptr;
    if (found) *found = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

// ---- the kernel text's sm_90a layer -----------------------------------------------------------------------------
inline void __trap() { spatialc_emu::fatal(spatialc_emu::kExitMisuse, "the kernel trapped (__trap)"); }

inline void spatialc_check_stage_base(const void* base, int line = __builtin_LINE()) {
    if (reinterpret_cast<uintptr_t>(base) % 1024)
        spatialc_emu::misuse_at("spatialc_check_stage_base", line,
                                "the dynamic block does not start on 1024 bytes, which swizzled stages need");
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
        spatialc_emu::misuse_at("spatialc_prefetch_tensormap", line, "not a tensor map cuTensorMapEncodeTiled made");
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
        misuse_at("spatialc_stmatrix_rows", line, "a matrix row not on 16 bytes");
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
        misuse_at("spatialc_wgmma_desc", line, "the operand is not in the dynamic block");
    const uintptr_t addr = reinterpret_cast<uintptr_t>(q) & 0x3FFFFu;
    if (addr % 16 || lbo % 16 || sbo % 16 || (lbo >> 4) > 0x3FFFu || (sbo >> 4) > 0x3FFFu || swizzle > 3)
        misuse_at("spatialc_wgmma_desc", line,
                  "address, leading or stride offset not a multiple of 16 bytes, or past 14 bits, or a swizzle mode"
                  " past 3");
    return (unsigned long long)(addr >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | ((unsigned long long)swizzle << 62);
}
// Only an ordering constraint for the compiler on the GPU; here every statement runs in program order already.
template <class T, int N>
inline void spatialc_acc_fence(spatialc_acc<T> (&)[N]) {}
inline void spatialc_wgmma_fence() { spatialc_emu::acc_written = false; }
inline void spatialc_wgmma_commit() { spatialc_emu::wgmma_commit(); }
// wgmma.wait_group is .sync.aligned: the warp's lanes execute it together, so when any lane is past it, every lane's
// retired groups have run — the lanes meet there, after retiring their own.
template <int N>
inline void spatialc_wgmma_wait(int line = __builtin_LINE()) {
    spatialc_emu::wgmma_wait((size_t)N, line);
}
template <int N, class T, class A, bool BMN = sizeof(T) == 2>
void spatialc_wgmma_ss(spatialc_acc<A> (&d)[N / 16], unsigned long long a, unsigned long long b, int line) {
    static_assert(N % 16 == 0 && N >= 16 && N <= 256, "a wgmma is 16 to 256 columns wide here");
    static_assert(std::is_same_v<T, signed char> ? std::is_same_v<A, int> : std::is_same_v<A, float>,
                  "int8 into int32, the floats (16- and 8-bit) into float32");
    static_assert(!BMN || sizeof(T) == 2, "the PTX ISA transposes 16-bit operands only");
    spatialc_emu::wgmma_ss(d, N, spatialc_emu::wgmma_elem<T>(), BMN, a, b, line);
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
    static_assert(N % 16 == 0 && N >= 16 && N <= 256, "a wgmma is 16 to 256 columns wide here");
    static_assert(sizeof(T) == 2 && std::is_same_v<A, float>, "16-bit A in registers, into float32");
    spatialc_emu::wgmma_rs(d, N, spatialc_emu::wgmma_elem<T>(), &a, b, line);
}
// ---- block-scaled 8-bit floats: a wgmma with scale-d an operand ------------------------------------------------
// scale_d 0: D = A · B, the accumulators not read (a block-scaled K group's first wgmma into its fresh partials, as
// the PTX ISA's scale-d predicate says); 1: D += A · B. The accumulators are zeroed when the wgmma runs — in late
// mode at the wait_group that retires its group, in the same group, before its products — so a promotion that reads
// them before the group retires reads the previous group's partials (or the poison of never-written registers).
template <int N, class T, class A>
void spatialc_wgmma_sd(spatialc_acc<A> (&d)[N / 16], unsigned long long a, unsigned long long b, int scale_d,
                       int line = __builtin_LINE()) {
    static_assert(sizeof(T) == 1 && !std::is_same_v<T, signed char>, "the 8-bit floats' block-scaled GEMM");
    static_assert(std::is_same_v<A, float>, "8-bit floats into float32");
    if (!scale_d) {
        spatialc_emu::wgmma_zero(d, N / 16);
    }
    spatialc_wgmma_ss<N, T, A, false>(d, a, b, line);
}
// The A fragment's registers pinned (sm90a.cuh): only a compiler ordering on the GPU.
template <class T>
inline void spatialc_frag_fence(spatialc_frag<T>&) {}

#endif  // SPATIALC_EMU_HOPPER_H

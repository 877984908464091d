// spatialc host emulation — the CUDA runtime the emitted hosts call, and the launch: blocks one after another,
// each CUDA thread a fiber (emu_runtime.h).
//
// The runner rewrites `k<<<grid, block[, smem]>>>(args);` into `::spatialc_emu::launch(k, grid, block[, smem])(args);`
// and the dynamic shared declaration into `char* spatialc_dyn_smem = ::spatialc_emu::dynamic_shared();`.
#ifndef SPATIALC_EMU_HOST_H
#define SPATIALC_EMU_HOST_H

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emu_global.h"
#include "emu_pipeline.h"

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorLaunchFailure = 719,
    cudaErrorCooperativeLaunchTooLarge = 720,
};
typedef cudaError_t cudaError;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
};

struct CUevent_st {
    std::chrono::steady_clock::time_point at;
};
typedef CUevent_st* cudaEvent_t;
typedef struct CUstream_st* cudaStream_t;

namespace spatialc_emu {

inline cudaError_t last_error = cudaSuccess;    // cleared by cudaGetLastError
inline cudaError_t sticky_error = cudaSuccess;  // what cudaDeviceSynchronize reports

// Report on stderr, and make cudaGetLastError and cudaDeviceSynchronize return `e`.
SPATIALC_EMU_FN cudaError_t fail(cudaError_t e, const std::string& why);
SPATIALC_EMU_FN void set_max_dynamic_smem(const void* kernel, int bytes);
// Run `body(ctx)` once per CUDA thread: the grid's blocks one after another, each block's threads at once.
SPATIALC_EMU_FN void run_grid(void (*body)(void*), void* ctx, dim3 grid, dim3 block, size_t smem, const void* kernel,
                              bool cooperative = false);

// Run `kernel` on the grid with `params`, the launch's arguments already converted to the kernel's parameter types
// (as a call converts them): bound to their tensors first (emu_global.h), then each CUDA thread calls the kernel with
// a copy. The parameters are held in a lambda's captures and run through a plain function pointer, not a std::tuple
// and std::apply: a launch is instantiated in every program, and those were a tenth of a program's g++ time.
template <class... P>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, bool cooperative, P... params) {
    bind_args<P...>(params...);
    auto call = [kernel, params...] { kernel(params...); };
    run_grid([](void* c) { (*static_cast<decltype(call)*>(c))(); }, &call, grid, block, smem,
             reinterpret_cast<const void*>(kernel), cooperative);
}

template <class... P>
struct Launch {
    void (*kernel)(P...);
    dim3 grid, block;
    size_t smem;

    template <class... A>
    void operator()(A&&... args) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        launch_kernel<P...>(kernel, grid, block, smem, false, std::forward<A>(args)...);
    }
};

template <class... P>
Launch<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) {
    return Launch<P...>{kernel, grid, block, smem};
}

// cudaLaunchCooperativeKernel: the arguments come as pointers to each, the blocks run all at once.
template <class... P, size_t... I>
void launch_cooperative(void (*kernel)(P...), dim3 grid, dim3 block, void** args, size_t smem,
                        std::index_sequence<I...>) {
    launch_kernel<P...>(kernel, grid, block, smem, true, *static_cast<std::remove_reference_t<P>*>(args[I])...);
}

// Whether the device holds a cooperative launch's blocks all at once (cudaSuccess), else the error, reported.
SPATIALC_EMU_FN cudaError_t cooperative_fits(dim3 grid, dim3 block, size_t smem);

// Blocks of a kernel one emulated multiprocessor holds: an H100's limits (2048 threads, 228 KiB of shared memory,
// 1 KiB reserved a block, at most 32 blocks).
inline int blocks_per_sm(int block_threads, size_t smem) {
    int n = 32;
    if (block_threads > 0) n = std::min(n, 2048 / block_threads);
    return std::min<int>(n, (int)((228 * 1024) / (smem + 1024)));
}

}  // namespace spatialc_emu

// ---- the runtime API (device memory is host memory) --------------------------------------------------------

namespace spatialc_emu {
// Device allocations by start, with their sizes: what a TMA box may read (emu_hopper.h checks it).
SPATIALC_EMU_VAR std::map<const char*, size_t> allocations;
inline std::mutex allocations_mu;
}  // namespace spatialc_emu

// Each allocation sits between red zones (kRedZone in front, as much as itself behind, at least kRedZone) that no
// other allocation uses: an access just outside a tensor lands in no tensor, and emu_global.h reports it.
// Defined in emu_runtime.h: the allocations' map is the runtime's, and a program's build instantiates none of it.
SPATIALC_EMU_FN cudaError_t cudaMalloc(void** p, size_t n);
template <class T>
cudaError_t cudaMalloc(T** p, size_t n) {
    return cudaMalloc(reinterpret_cast<void**>(p), n);
}
SPATIALC_EMU_FN cudaError_t cudaFree(void* p);
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
    std::memmove(dst, src, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t = nullptr) {
    return cudaMemcpy(dst, src, n, kind);  // launches finish before they return: every stream is in order already
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    std::memset(p, v, n);
    return cudaSuccess;
}
template <class F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
        spatialc_emu::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), value);
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return spatialc_emu::sticky_error; }
inline cudaError_t cudaGetLastError() {
    const cudaError_t e = spatialc_emu::last_error;
    spatialc_emu::last_error = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() { return spatialc_emu::last_error; }
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
// The emulated device has SPATIALC_EMU_SMS multiprocessors (132, an H100 / H200's, when unset): a kernel that follows
// the device's multiprocessor count then runs with as many sites as it would on that GPU.
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
    if (attr == cudaDevAttrComputeCapabilityMajor) {  // an H100 / H200: sm_90, with thread-block clusters
        *value = 9;
        return cudaSuccess;
    }
    if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
    const char* v = std::getenv("SPATIALC_EMU_SMS");
    const int sms = v ? std::atoi(v) : 132;
    *value = sms > 0 ? sms : 132;
    return cudaSuccess;
}
template <class... P>
cudaError_t cudaLaunchCooperativeKernel(void (*kernel)(P...), dim3 grid, dim3 block, void** args, size_t smem = 0,
                                        cudaStream_t = nullptr) {
    if (const cudaError_t e = spatialc_emu::cooperative_fits(grid, block, smem); e != cudaSuccess) return e;
    spatialc_emu::launch_cooperative(kernel, grid, block, args, smem, std::index_sequence_for<P...>{});
    return spatialc_emu::last_error;
}
template <class F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, F* kernel, int block_threads, size_t smem) {
    (void)kernel;
    *n = spatialc_emu::blocks_per_sm(block_threads, smem);
    return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorLaunchFailure: return "unspecified launch failure";
        case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch";
    }
    return "unknown error";
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
    *e = new CUevent_st{std::chrono::steady_clock::now()};
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = nullptr) {
    e->at = std::chrono::steady_clock::now();
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}

#endif  // SPATIALC_EMU_HOST_H

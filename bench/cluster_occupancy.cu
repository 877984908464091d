// How many thread-block clusters of each size the device holds at once, as the driver answers
// (cudaOccupancyMaxActiveClusters), for blocks shaped like spatialc's large-size kernels: one block an SM.
// A cluster lives in one GPC and GPCs hold uneven numbers of SMs, so the answer is a property of the chip
// (its floorsweeping), not only of the board: target.CO_RESIDENT_CLUSTERS is read off this program's output.
// Build: nvcc -arch=sm_90 -o cluster_occupancy bench/cluster_occupancy.cu   Run on the GPU: ./cluster_occupancy
#include <cstdio>
#include <cuda_runtime.h>

__global__ void spatialc_probe() {}

static int check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::printf("%s: %s\n", what, cudaGetErrorString(e));
        return 1;
    }
    return 0;
}

int main() {
    cudaDeviceProp prop;
    if (check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    if (check(cudaFuncSetAttribute(spatialc_probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "non-portable"))
        return 1;
    const int shapes[][2] = {{384, 230400}, {320, 229568}, {256, 115712}};  // threads, dynamic shared memory
    for (const auto& shape : shapes) {
        if (check(cudaFuncSetAttribute(spatialc_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, shape[1]), "smem"))
            return 1;
        std::printf("block %d threads, %d B dynamic shared memory:", shape[0], shape[1]);
        for (int size = 1; size <= 16; size *= 2) {
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = size;
            attr.val.clusterDim.y = 1;
            attr.val.clusterDim.z = 1;
            cudaLaunchConfig_t config = {};
            config.gridDim = dim3(size * 64, 1, 1);
            config.blockDim = dim3(shape[0], 1, 1);
            config.dynamicSmemBytes = shape[1];
            config.attrs = &attr;
            config.numAttrs = 1;
            int clusters = -1;
            cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, spatialc_probe, &config);
            if (e == cudaSuccess)
                std::printf(" %d of %d,", clusters, size);
            else
                std::printf(" size %d: %s,", size, cudaGetErrorString(e));
        }
        std::printf("\n");
    }
    return 0;
}
